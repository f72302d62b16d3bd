"""Owns reading delimited (CSV/TSV) data files record by record, with the line each starts on.

Task readers (GLUE tables, custom tables, SWAG's CSV) turn the records into examples;
a record that cannot be decoded or parsed carries its `error` instead of stopping the read,
so the reader can name the file and line or skip and count it.
"""

from __future__ import annotations

import csv
import dataclasses
from typing import Iterator

from data_prep import fileio


@dataclasses.dataclass(frozen=True)
class Record:
    """One delimited record of a data file, with where it starts (for error messages)."""

    index: int  # 0-based record number in the file, header included (the original's `i`)
    line: int  # 1-based line where the record starts
    fields: list[str]
    error: str | None = None


def iter_records(path: str, delimiter: str, quotechar: str | None) -> Iterator[Record]:
    """Yields the records of a delimited UTF-8 file with their line numbers.

    Lines end at "\\n" only (a stray "\\r" inside a line is data, as in the original's
    reader); a leading byte-order mark is dropped; a field may be of any size (memory
    bounds it). Undecodable lines and csv errors become records with `error` set instead
    of stopping the read.
    """
    # csv refuses a field over 131,072 characters by default; here memory bounds a text, as
    # it bounds a line (--long_document=windows reads whole documents). 2**31 - 1: the
    # largest limit csv takes on every platform (a C long).
    csv.field_size_limit(2 ** 31 - 1)
    undecodable: set[int] = set()

    def lines() -> Iterator[str]:
        with fileio.open_file(path, "rb") as reader:
            for number, raw in enumerate(reader, start=1):
                if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]
                try:
                    yield raw.decode("utf-8")
                except UnicodeDecodeError:
                    undecodable.add(number)
                    yield raw.decode("utf-8", errors="replace")

    if quotechar is None:
        reader = csv.reader(lines(), delimiter=delimiter, quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(lines(), delimiter=delimiter, quotechar=quotechar)
    index = 0
    previous_end = 0
    while True:
        try:
            fields = next(reader)
            error = None
        except StopIteration:
            return
        except csv.Error as err:
            fields, error = [], f"unreadable row ({err})"
        start = previous_end + 1
        previous_end = reader.line_num
        if error is None and any(start <= n <= previous_end for n in undecodable):
            error = "invalid UTF-8"
        yield Record(index=index, line=start, fields=fields, error=error)
        index += 1
