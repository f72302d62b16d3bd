"""Owns reading one task's delimited files into examples: a `TableLayout` per split, the `TableProcessor` that reads them.

Rows become `InputExample`s; a malformed row raises `DataFormatError` naming the file and
its 1-based line, or is skipped and counted (`skip_bad_rows`). Which task has which
layout is `tasks.classification.processors`; file layouts and bad-row behaviour:
docs/classifier_data.md.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Mapping, Sequence, Union

from absl import logging

from data_prep import fileio, tokenization
from tasks.classification.examples import BadRow, DataFormatError, InputExample, SplitExamples
from tasks.common.delimited import Record, iter_records

Column = Union[int, str]

# The largest regression score whose square (the squared-error loss) is finite in float32:
# a label of 1e20 made the loss Inf at the first step.
MAX_REGRESSION_LABEL = math.sqrt(3.4028234663852886e38)  # float32's largest finite value


@dataclasses.dataclass(frozen=True)
class TableLayout:
    """Where the fields of one split live in its delimited file.

    Columns are 0-based indices (negative counts from the end) or header names.

    Attributes:
      files: candidate paths relative to data_dir; the first that exists is read.
      text_a, text_b: the text columns (text_b None for single-sentence tasks).
      label: the label column; None for an unlabeled split (test), whose examples get the
        placeholder label (the first label, or 0.0 for regression) like the original.
      has_header: whether the first row names the columns (it is never an example).
      num_columns: the exact number of fields a row must have; None means the header's
        count, or the first row's for files without a header.
      delimiter, quotechar: as csv.reader's; quotechar None reads quotes as plain text.
      guid_column: a column whose value names the example ("<prefix>-<value>"); None uses
        the record number in the file, header included ("<prefix>-<number>").
      guid_prefix: defaults to the split name.
      filter_column, filter_value: keep only rows whose filter_column equals filter_value.
      label_aliases: (found, meant) label spellings mapped before validation.
    """

    files: tuple[str, ...]
    text_a: Column
    text_b: Column | None = None
    label: Column | None = None
    has_header: bool = True
    num_columns: int | None = None
    delimiter: str = "\t"
    quotechar: str | None = None
    guid_column: Column | None = None
    guid_prefix: str | None = None
    filter_column: Column | None = None
    filter_value: str | None = None
    label_aliases: tuple[tuple[str, str], ...] = ()


def _resolve_column(column: Column | None, header: list[str] | None, num_columns: int | None,
                    role: str, path: str) -> int | None:
    """The 0-based index of `column`, checked against the file's header and width."""
    if column is None:
        return None
    if isinstance(column, str):
        name = column.strip()
        if header is not None and name in header:
            return header.index(name)
        if name.lstrip("-").isdigit():
            column = int(name)
        else:
            where = f"header {header}" if header is not None else "a file without header"
            raise DataFormatError(f"{path}: {role} column {name!r} not found in {where}")
    if num_columns is not None and not -num_columns <= column < num_columns:
        raise DataFormatError(
            f"{path}: {role} column {column} is out of range for rows of {num_columns} columns")
    return column if num_columns is None or column >= 0 else column + num_columns


class _Columns:
    """A layout's columns resolved against one file's header."""

    def __init__(self, layout: TableLayout, header: list[str] | None, num_columns: int | None,
                 path: str):
        def resolve(column, role):
            return _resolve_column(column, header, num_columns, role, path)

        self.text_a = resolve(layout.text_a, "text_a")
        self.text_b = resolve(layout.text_b, "text_b")
        self.label = resolve(layout.label, "label")
        self.guid = resolve(layout.guid_column, "guid")
        self.filter = resolve(layout.filter_column, "filter")


def _natural_label_order(labels) -> list[str]:
    """Sorted label names; numerically when every label is an integer ("2" before "10")."""
    labels = set(labels)
    try:
        return sorted(labels, key=int)
    except ValueError:
        return sorted(labels)


class TableProcessor:
    """Reads the splits of one task from delimited files into InputExamples.

    Args:
      name: canonical task name ("mrpc", "mnli", "custom", ...).
      layouts: split name -> TableLayout.
      labels: the label names in id order; None to infer them from the "train" split
        (sorted, numerically when all are integers); ignored for regression.
      is_regression: labels are float scores.
      split_aliases: extra split names -> (split, guid prefix), e.g. MNLI "dev".
      signature: extra settings that change the examples (e.g. XNLI's language); part of
        the TFRecord cache key.
    """

    def __init__(self, name: str, layouts: Mapping[str, TableLayout],
                 labels: Sequence[str] | None = None, is_regression: bool = False,
                 split_aliases: Mapping[str, tuple[str, str]] | None = None,
                 signature: Mapping | None = None):
        self.name = name
        self.layouts = dict(layouts)
        self.is_regression = is_regression
        self._labels = None if labels is None or is_regression else list(labels)
        self._split_aliases = dict(split_aliases or {})
        self._signature = dict(signature or {})

    # Split names.

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self.layouts)

    def resolve_split(self, split: str) -> tuple[str, str]:
        """(split whose layout is read, guid prefix) for a split name or alias."""
        if split in self.layouts:
            return split, self.layouts[split].guid_prefix or split
        if split in self._split_aliases:
            return self._split_aliases[split]
        raise ValueError(f"task {self.name!r} has no split {split!r}; splits are "
                         f"{sorted(set(self.layouts) | set(self._split_aliases))}")

    def source_file(self, data_dir: str, split: str) -> str:
        """The file a split is read from (the first candidate that exists)."""
        layout = self.layouts[self.resolve_split(split)[0]]
        candidates = [os.path.join(data_dir, name) for name in layout.files]
        for path in candidates:
            if fileio.isfile(path):
                return path
        raise DataFormatError(f"task {self.name!r}, split {split!r}: no data file; looked for "
                              f"{candidates}")

    def signature(self) -> dict:
        """What identifies this reader in a cache key (task and its options)."""
        layouts = {split: dataclasses.asdict(layout) for split, layout in self.layouts.items()}
        return {"task": self.name, "is_regression": self.is_regression, "layouts": layouts,
                "labels": self._labels, **self._signature}

    # Labels.

    def get_labels(self, data_dir: str | None = None) -> list[str]:
        """Label names in id order ([] for regression). Inferring them needs `data_dir`."""
        if self.is_regression:
            return []
        if self._labels is None:
            if data_dir is None:
                raise ValueError(f"task {self.name!r} infers its labels from the train split: "
                                 "pass data_dir (or give the label list)")
            train = self.read_split(data_dir, "train", skip_bad_rows=True, _infer=True)
            if not train.examples:
                raise DataFormatError(f"{train.path}: no labeled rows to infer labels from")
            self._labels = _natural_label_order(e.label for e in train.examples)
            logging.info("Task %s: labels inferred from %s: %s", self.name, train.path,
                         self._labels)
        return list(self._labels)

    def _placeholder_label(self, data_dir: str):
        return 0.0 if self.is_regression else self.get_labels(data_dir)[0]

    # Reading.

    def get_train_examples(self, data_dir: str, skip_bad_rows: bool = False):
        return self.read_split(data_dir, "train", skip_bad_rows=skip_bad_rows).examples

    def get_dev_examples(self, data_dir: str, skip_bad_rows: bool = False):
        return self.read_split(data_dir, "dev", skip_bad_rows=skip_bad_rows).examples

    def get_test_examples(self, data_dir: str, skip_bad_rows: bool = False):
        return self.read_split(data_dir, "test", skip_bad_rows=skip_bad_rows).examples

    def read_split(self, data_dir: str, split: str, *, skip_bad_rows: bool = False,
                   _infer: bool = False) -> SplitExamples:
        """Reads one split.

        Args:
          data_dir: the task's directory (e.g. glue_data/MRPC).
          split: "train", "dev", "test", or a task's own split ("dev_mismatched", ...).
          skip_bad_rows: skip malformed rows (counted in the result and logged) instead of
            raising DataFormatError at the first one. Never in a test split: each of its
            rows is predicted on its own line (test_results.tsv, the GLUE files), and a
            skipped row would move every later prediction onto another row's line.

        Returns:
          SplitExamples with the examples in file order.
        """
        layout_split, guid_prefix = self.resolve_split(split)
        layout = self.layouts[layout_split]
        path = self.source_file(data_dir, split)
        labels = None
        placeholder = None
        if layout.label is None:
            placeholder = self._placeholder_label(data_dir)
        elif not self.is_regression and not _infer:
            labels = set(self.get_labels(data_dir))
        reader = _RowReader(self, layout, path, guid_prefix, labels, placeholder)
        if layout_split.startswith("test"):
            examples, bad_rows = reader.read(False, hint=(
                "--skip_bad_rows skips train and dev rows, never a test row: "
                "test_results.tsv has a line per test row; fix or remove it"))
        else:
            examples, bad_rows = reader.read(skip_bad_rows)
        if bad_rows:
            logging.warning("%s: skipped %d malformed rows, first: %s", path, len(bad_rows),
                            "; ".join(str(row) for row in bad_rows[:5]))
        return SplitExamples(examples=examples, path=path, bad_rows=bad_rows)


class _RowReader:
    """Turns the rows of one file into examples following a TableLayout."""

    def __init__(self, processor: TableProcessor, layout: TableLayout, path: str,
                 guid_prefix: str, labels: set[str] | None, placeholder):
        self.processor = processor
        self.layout = layout
        self.path = path
        self.guid_prefix = guid_prefix
        self.labels = labels
        self.placeholder = placeholder
        self.aliases = dict(layout.label_aliases)
        self.columns: _Columns | None = None
        self.num_columns = layout.num_columns

    def read(self, skip_bad_rows: bool, hint: str | None = None
             ) -> tuple[list[InputExample], list[BadRow]]:
        examples: list[InputExample] = []
        bad_rows: list[BadRow] = []
        header_pending = self.layout.has_header
        for record in iter_records(self.path, self.layout.delimiter, self.layout.quotechar):
            if record.error is None and not record.fields:
                continue  # blank line
            if header_pending:
                if record.error is not None:
                    raise DataFormatError(f"{self.path}:{record.line}: header row: "
                                          f"{record.error}")
                header_pending = False
                self._start([field.strip() for field in record.fields])
                continue
            try:
                example = self._example(record)
            except _BadRowError as err:
                bad = BadRow(self.path, record.line, str(err))
                if not skip_bad_rows:
                    raise DataFormatError(
                        f"{bad} ({hint or '--skip_bad_rows skips such rows'})") from None
                bad_rows.append(bad)
                continue
            if example is not None:
                examples.append(example)
        if self.columns is None and header_pending:
            raise DataFormatError(f"{self.path}: empty file, expected a header row")
        return examples, bad_rows

    def _start(self, header: list[str] | None) -> None:
        if header is not None and self.num_columns is None:
            self.num_columns = len(header)
        self.columns = _Columns(self.layout, header, self.num_columns, self.path)

    def _example(self, record: Record) -> InputExample | None:
        if record.error is not None:
            raise _BadRowError(record.error)
        fields = record.fields
        if self.columns is None:  # headerless file: the first row fixes the width
            if self.num_columns is None:
                self.num_columns = len(fields)
            self._start(None)
        if len(fields) != self.num_columns:
            raise _BadRowError(f"expected {self.num_columns} columns, found {len(fields)}")
        columns = self.columns
        if columns.filter is not None and fields[columns.filter] != self.layout.filter_value:
            return None
        text_a = self._text(fields, columns.text_a, "text_a")
        text_b = None if columns.text_b is None else self._text(fields, columns.text_b,
                                                                "text_b")
        label = self._label(fields)
        if columns.guid is None:
            guid = f"{self.guid_prefix}-{record.index}"
        else:
            guid = f"{self.guid_prefix}-{fields[columns.guid]}"
        return InputExample(guid=guid, text_a=text_a, text_b=text_b, label=label,
                            line=record.line)

    def _text(self, fields: list[str], column: int, role: str) -> str:
        text = fields[column]
        if tokenization.is_blank(text):  # whitespace, or characters the tokenizer drops
            raise _BadRowError(f"empty {role} (column {column})")
        return text

    def _label(self, fields: list[str]):
        column = self.columns.label
        if column is None:
            return self.placeholder
        raw = fields[column].strip()
        raw = self.aliases.get(raw, raw)
        if not raw:
            raise _BadRowError(f"empty label (column {column})")
        if self.processor.is_regression:
            try:
                value = float(raw)
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                raise _BadRowError(f"label {raw!r} (column {column}) is not a finite number")
            if abs(value) > MAX_REGRESSION_LABEL:
                raise _BadRowError(
                    f"label {raw!r} (column {column}) is too large: its square (the "
                    "squared-error loss) overflows float32; scores must lie within "
                    f"+-{MAX_REGRESSION_LABEL:.3g}")
            return value
        if self.labels is not None and raw not in self.labels:
            raise _BadRowError(f"unknown label {raw!r} (column {column}); expected one of "
                               f"{self.processor.get_labels()}")
        return raw


class _BadRowError(Exception):
    """Internal: the current row is malformed (the message says why)."""
