"""Owns input text: the files a flag's globs name, and their decoding (UTF-8 or an error naming the file, line and byte offset).

Every tool that reads text (create_pretraining_data and the Beam pipeline, build_vocab,
the tokenizer CLI, extract_features.py, the vocab loader) decodes through `decode_utf8`,
so invalid input is reported in one form everywhere:

    corpus.txt:4: invalid UTF-8 at byte offset 20 (invalid start byte); the input must
    be UTF-8 text

(the line 1-based, the offset 0-based from the start of the file or stream).
"""

from __future__ import annotations

import os
from typing import Callable, Union

from data_prep import fileio
from data_prep.cli import UserError


class InputError(UserError):
    """Bad input text: the message names the file, line and byte offset."""


def decode_utf8(data: bytes, source: str, *, first_line: Union[int, Callable[[], int]] = 1,
                first_offset: int = 0) -> str:
    """`data` decoded as UTF-8, or InputError naming where it is not.

    Args:
      data: bytes that start `first_offset` bytes into `source`, at line `first_line`.
      source: the file's path (or "stdin") as the user named it.
      first_line: the 1-based line `data` starts in, or a function giving it (called only
        on an error: finding it can mean reading the file from its start, `line_number_at`).
      first_offset: the byte offset of `data[0]` in `source`.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = first_line() if callable(first_line) else first_line
        line += data.count(b"\n", 0, err.start)
        raise InputError(f"{source}:{line}: invalid UTF-8 at byte offset "
                         f"{first_offset + err.start} ({err.reason}); the input must be "
                         "UTF-8 text") from None


def line_number_at(path: str, offset: int) -> int:
    """1-based number of the line holding byte `offset` of the file (local or URL)."""
    count = 0
    with fileio.open_file(path, "rb") as f:
        remaining = offset
        while remaining > 0:
            block = f.read(min(remaining, 1 << 20))
            if not block:
                break
            count += block.count(b"\n")
            remaining -= len(block)
    return count + 1


def expand_input_files(patterns: str | list, flag: str = "--input_file") -> list[str]:
    """Comma-separated globs (or a list of them) -> sorted unique files; every glob must
    match.

    Raises:
      InputError: naming `flag` and the pattern that matches nothing or is a directory.
    """
    patterns = patterns.split(",") if isinstance(patterns, str) else list(patterns)
    patterns = [p.strip() for p in patterns if p.strip()]
    if not patterns:
        raise InputError(f"{flag} is empty: give one or more comma-separated globs")
    files: list[str] = []
    for pattern in patterns:
        local = not fileio.is_url(pattern)
        matches = [m for m in fileio.glob(os.path.expanduser(pattern) if local else pattern)
                   if fileio.isfile(m)]
        if not matches:
            if local and os.path.isdir(os.path.expanduser(pattern)):
                raise InputError(f"{flag} {pattern!r} is a directory; give files "
                                 f"or a glob such as {os.path.join(pattern, '*.txt')!r}")
            raise InputError(f"{flag} pattern {pattern!r} matches no file")
        files.extend(sorted(matches))
    return list(dict.fromkeys(files))
