"""Owns what classifier data is made of: an example, the padding example, a malformed row, the format error.

Readers (`tasks.classification.readers`) make them, feature conversion
(`tasks.classification.data`) consumes them.
"""

from __future__ import annotations

import dataclasses

from data_prep.cli import UserError


@dataclasses.dataclass(frozen=True)
class InputExample:
    """One example: `label` is a label name, a float score (regression) or a placeholder;
    `line` its 1-based line in the file read (None when not read from a file; not compared)."""

    guid: str
    text_a: str
    text_b: str | None = None
    label: str | float | None = None
    line: int | None = dataclasses.field(default=None, compare=False)


class PaddingInputExample:
    """A fake example that pads a split to a whole number of fixed-size batches.

    It becomes all-zero features with is_real_example=0, which metrics must ignore.
    """

    def __eq__(self, other):
        return isinstance(other, PaddingInputExample)

    def __hash__(self):
        return hash(PaddingInputExample)

    def __repr__(self):
        return "PaddingInputExample()"


@dataclasses.dataclass(frozen=True)
class BadRow:
    """A malformed row: where it is and what is wrong with it."""

    path: str
    line: int
    reason: str

    def __str__(self):
        return f"{self.path}:{self.line}: {self.reason}"


class DataFormatError(UserError):
    """A data file is missing, malformed, or does not match its task's layout."""


@dataclasses.dataclass(frozen=True)
class SplitExamples:
    """The result of reading one split: its examples, source file and skipped rows."""

    examples: list[InputExample]
    path: str
    bad_rows: list[BadRow]
