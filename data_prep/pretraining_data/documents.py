"""Owns the reading of pretraining corpora: files -> chunks of byte ranges -> documents.

The corpus is cut into chunks at document boundaries (`plan_chunks`: byte ranges of the
input files, small files packed together, large ones cut just after a blank line), and
each chunk is read independently (`read_documents`), as the original reads its files:
lines end at "\\n", a blank line ends a document, a line is tokenized into ids at once.
Invalid UTF-8 raises `text_input.InputError` naming the file, line and byte offset.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence

from data_prep import fileio
from data_prep.pretraining_data.stats import Stats
from data_prep.text_input import decode_utf8, line_number_at


@dataclasses.dataclass(frozen=True)
class ByteRange:
    """Bytes [start, end) of one input file; `end` is a line start or the file's end."""

    path: str
    start: int
    end: int
    # The range's bytes, already read (`loaded`): a URL input (gs://, ...) is read by the
    # process that plans the chunks, so forked workers never open URLs (only TensorFlow's
    # file systems can, and they do not survive a fork).
    data: Optional[bytes] = dataclasses.field(default=None, repr=False, compare=False)


def read_range(byte_range: ByteRange) -> bytes:
    """The bytes of `byte_range` (its `data`, or read from its file)."""
    if byte_range.data is not None:
        return byte_range.data
    with fileio.open_file(byte_range.path, "rb") as f:
        f.seek(byte_range.start)
        raw = f.read(max(0, byte_range.end - byte_range.start))
        if raw and not raw.endswith(b"\n"):
            raw += f.readline()  # a range ends at a line end (or the file's end)
    return raw


def decode_range(byte_range: ByteRange, raw: bytes) -> str:
    """`raw`, the bytes of `byte_range`, as text; InputError names the file, line and
    byte offset of invalid UTF-8."""
    return decode_utf8(raw, byte_range.path, first_offset=byte_range.start,
                       first_line=lambda: line_number_at(byte_range.path, byte_range.start))


def loaded(byte_range: ByteRange) -> ByteRange:
    """`byte_range` with its bytes read, and checked to be UTF-8 here, where the file
    can be read again to name the line of an error."""
    raw = read_range(byte_range)
    decode_range(byte_range, raw)
    return dataclasses.replace(byte_range, data=raw)


def _blank(line: bytes) -> bool:
    return not line.strip()


def _find_cut(f, target: int, size: int, search_bytes: int):
    """A cut offset at or after `target`: just after a blank line if one starts within
    `search_bytes`, else at the first line start after `target`. Returns (offset, found)."""
    f.seek(target)
    f.readline()  # the rest of the line holding `target`
    fallback = f.tell()
    while f.tell() < size:
        line = f.readline()
        if _blank(line):
            return f.tell(), True
        if f.tell() - target > search_bytes:
            break
    if fallback >= size:
        return size, True
    return fallback, False


def plan_chunks(paths: Sequence[str], chunk_bytes: int,
                search_bytes: Optional[int] = None):
    """Cuts the input files into chunks of about `chunk_bytes` at document boundaries.

    A chunk is a tuple of ByteRanges (small files are packed together, large ones cut).
    Where no blank line lies within `search_bytes` (default: `chunk_bytes`) after a cut
    point, the document is cut at a line boundary instead. Returns (chunks, warnings).
    """
    search_bytes = search_bytes or chunk_bytes
    chunks, current, current_size, warnings = [], [], 0, []
    for path in paths:
        size = fileio.getsize(path)
        pos = 0
        with fileio.open_file(path, "rb") as f:
            while pos < size:
                want = chunk_bytes - current_size
                if size - pos <= want:
                    current.append(ByteRange(path, pos, size))
                    current_size += size - pos
                    break
                cut, found = _find_cut(f, pos + want, size, search_bytes)
                current.append(ByteRange(path, pos, cut))
                chunks.append(tuple(current))
                current, current_size = [], 0
                if not found:
                    warnings.append(
                        f"{path}:{line_number_at(path, cut)}: no blank line (document "
                        f"boundary) within {search_bytes / 1e6:.1f} MB after byte "
                        f"{pos + want}; the document is split into pieces here")
                pos = cut
        if current_size >= chunk_bytes:
            chunks.append(tuple(current))
            current, current_size = [], 0
    if current:
        chunks.append(tuple(current))
    return chunks, warnings


TokenizeIds = Callable[[str], List[int]]


def read_documents(ranges: Sequence[ByteRange], tokenize_ids: TokenizeIds,
                   stats: Optional[Stats] = None, starts: Optional[list] = None) -> list:
    """Documents of the byte ranges, read as the original reads its files.

    Lines end at "\\n"; each is stripped; a blank line ends the document; a line that
    tokenizes to nothing is skipped without ending it; empty documents are dropped.
    Invalid UTF-8 raises InputError naming the file, line and byte offset.

    With a list `starts`, the `(path, byte offset)` of each document's first kept line is
    appended to it, in order: a key of the document that does not depend on how the
    files were cut into ranges (the Beam pipeline's document ids).
    """
    stats = stats if stats is not None else Stats()
    documents: list = []
    current: list = []
    current_start = None
    for byte_range in ranges:
        raw = read_range(byte_range)
        text = decode_range(byte_range, raw)
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()  # after the last "\n": not a line
        stats.lines += len(lines)
        stats.input_bytes += len(raw)
        offsets = None
        if starts is not None:  # "\n" is one byte in UTF-8: the lines of raw, 1:1
            offsets = [byte_range.start]
            for line_bytes in raw.split(b"\n")[:len(lines) - 1]:
                offsets.append(offsets[-1] + len(line_bytes) + 1)
        empty_token_lines = 0
        for number, line in enumerate(lines):
            line = line.strip()
            if not line:
                if current:
                    documents.append(current)
                    if starts is not None:
                        starts.append(current_start)
                    current = []
                continue
            ids = tokenize_ids(line)
            if ids:
                if not current and starts is not None:
                    current_start = (byte_range.path, offsets[number])
                current.append(ids)
            else:
                empty_token_lines += 1
        stats.empty_token_lines += empty_token_lines
    if current:
        documents.append(current)
        if starts is not None:
            starts.append(current_start)
    stats.documents += len(documents)
    return documents
