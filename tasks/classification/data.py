"""Classifier data: GLUE/XNLI/custom readers, feature conversion and the TFRecord cache.

Three layers, each usable alone:
  1. Readers ("processors"): one `TableProcessor` per task, described by a `TableLayout`
     per split (file, columns, header). Rows become `InputExample`s; malformed rows raise
     `DataFormatError` naming file and 1-based line, or are skipped and counted.
  2. Feature conversion with exactly the original run_classifier's rules
     (`convert_single_example`): `[CLS] a [SEP] (b [SEP])`, pair truncation from the end
     of the longer side, zero padding, label ids; padding examples for fixed batches.
  3. `prepare_classifier_records`: writes a split's features as TFRecords in an output
     directory with a JSON of metadata beside them, and reuses them while the inputs and
     the settings that shape them are unchanged.

File layouts, bad-row behaviour and the custom processor's options: docs/classifier_data.md.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Mapping, Sequence, Union

from absl import logging

from data_prep import features as features_lib
from data_prep import fileio
from data_prep import tokenization
from tasks.classification.metrics import normalize_task_name
from tasks.common.delimited import Record, iter_records
from tasks.common.pairs import truncate_seq_pair
from tasks.common.record_cache import RecordCache, cache_key

Column = Union[int, str]

# Bump when the records or the metadata change meaning: old caches are then rebuilt.
CACHE_FORMAT_VERSION = 1
# How many skipped rows the metadata JSON lists one by one (all are counted).
MAX_LISTED_BAD_ROWS = 100

MNLI_LABELS = ("contradiction", "entailment", "neutral")
BINARY_LABELS = ("0", "1")
ENTAILMENT_LABELS = ("entailment", "not_entailment")


# --- Examples and errors ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class InputExample:
    """One example: `label` is a label name, a float score (regression) or a placeholder."""

    guid: str
    text_a: str
    text_b: str | None = None
    label: str | float | None = None


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
class InputFeatures:
    """Model inputs of one example; the lists have length max_seq_length."""

    input_ids: list[int]
    input_mask: list[int]
    segment_ids: list[int]
    label_id: int | float
    is_real_example: bool = True


@dataclasses.dataclass(frozen=True)
class BadRow:
    """A malformed row: where it is and what is wrong with it."""

    path: str
    line: int
    reason: str

    def __str__(self):
        return f"{self.path}:{self.line}: {self.reason}"


class DataFormatError(ValueError):
    """A data file is missing, malformed, or does not match its task's layout."""


@dataclasses.dataclass(frozen=True)
class SplitExamples:
    """The result of reading one split: its examples, source file and skipped rows."""

    examples: list[InputExample]
    path: str
    bad_rows: list[BadRow]


# --- Reading delimited files --------------------------------------------------------------


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


# --- Processors ---------------------------------------------------------------------------


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
            raising DataFormatError at the first one.

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

    def read(self, skip_bad_rows: bool) -> tuple[list[InputExample], list[BadRow]]:
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
                        f"{bad} (pass skip_bad_rows=True to skip such rows)") from None
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
        return InputExample(guid=guid, text_a=text_a, text_b=text_b, label=label)

    def _text(self, fields: list[str], column: int, role: str) -> str:
        text = fields[column]
        if not text.strip():
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
            return value
        if self.labels is not None and raw not in self.labels:
            raise _BadRowError(f"unknown label {raw!r} (column {column}); expected one of "
                               f"{self.processor.get_labels()}")
        return raw


class _BadRowError(Exception):
    """Internal: the current row is malformed (the message says why)."""


# --- Task registry ------------------------------------------------------------------------


def _glue_processor(name, train_dev: TableLayout, test: TableLayout, labels=None,
                    is_regression=False) -> TableProcessor:
    def for_file(layout: TableLayout, file_name: str) -> TableLayout:
        return dataclasses.replace(layout, files=(file_name,))

    layouts = {"train": for_file(train_dev, "train.tsv"), "dev": for_file(train_dev, "dev.tsv"),
               "test": for_file(test, "test.tsv")}
    return TableProcessor(name, layouts, labels=labels, is_regression=is_regression)


def _cola() -> TableProcessor:
    # train/dev: no header; source, label, original-label mark, sentence.
    train_dev = TableLayout(files=(), text_a=3, label=1, has_header=False, num_columns=4)
    test = TableLayout(files=(), text_a=1)  # header: index, sentence
    return _glue_processor("cola", train_dev, test, BINARY_LABELS)


def _sst2() -> TableProcessor:
    train_dev = TableLayout(files=(), text_a=0, label=1)  # header: sentence, label
    test = TableLayout(files=(), text_a=1, guid_column=0)  # header: index, sentence
    return _glue_processor("sst-2", train_dev, test, BINARY_LABELS)


def _mrpc() -> TableProcessor:
    # header: Quality, #1 ID, #2 ID, #1 String, #2 String (test: index instead of Quality)
    train_dev = TableLayout(files=(), text_a=3, text_b=4, label=0)
    test = TableLayout(files=(), text_a=3, text_b=4)
    return _glue_processor("mrpc", train_dev, test, BINARY_LABELS)


def _stsb() -> TableProcessor:
    # header: index genre filename year old_index source1 source2 sentence1 sentence2 score
    train_dev = TableLayout(files=(), text_a=7, text_b=8, label=9, guid_column=0)
    test = TableLayout(files=(), text_a=7, text_b=8, guid_column=0)
    return _glue_processor("sts-b", train_dev, test, is_regression=True)


def _qqp() -> TableProcessor:
    # header: id qid1 qid2 question1 question2 is_duplicate; test: id question1 question2
    train_dev = TableLayout(files=(), text_a=3, text_b=4, label=5, guid_column=0)
    test = TableLayout(files=(), text_a=1, text_b=2, guid_column=0)
    return _glue_processor("qqp", train_dev, test, BINARY_LABELS)


def _index_pair(name, labels) -> TableProcessor:
    # QNLI: index question sentence label; RTE/WNLI: index sentence1 sentence2 label.
    train_dev = TableLayout(files=(), text_a=1, text_b=2, label=3, guid_column=0)
    test = TableLayout(files=(), text_a=1, text_b=2, guid_column=0)
    return _glue_processor(name, train_dev, test, labels)


def _mnli(mismatched: bool = False) -> TableProcessor:
    # Columns: index promptID pairID genre sentence1_binary_parse sentence2_binary_parse
    # sentence1_parse sentence2_parse sentence1 sentence2 [label1 ... ] gold_label (last);
    # the test files stop after sentence2.
    labeled = TableLayout(files=(), text_a=8, text_b=9, label=-1, guid_column=0)
    unlabeled = TableLayout(files=(), text_a=8, text_b=9, guid_column=0)
    layouts = {
        "train": dataclasses.replace(labeled, files=("train.tsv",)),
        "dev_matched": dataclasses.replace(labeled, files=("dev_matched.tsv",)),
        "dev_mismatched": dataclasses.replace(labeled, files=("dev_mismatched.tsv",)),
        # The original names test-matched examples "test-<index>".
        "test_matched": dataclasses.replace(unlabeled, files=("test_matched.tsv",),
                                            guid_prefix="test"),
        "test_mismatched": dataclasses.replace(unlabeled, files=("test_mismatched.tsv",)),
    }
    part = "mismatched" if mismatched else "matched"
    aliases = {"dev": (f"dev_{part}", f"dev_{part}"),
               "test": (f"test_{part}", "test" if not mismatched else "test_mismatched")}
    return TableProcessor("mnli-mm" if mismatched else "mnli", layouts, labels=MNLI_LABELS,
                          split_aliases=aliases)


def _ax() -> TableProcessor:
    # GLUE diagnostic set (predicted with an MNLI model): index sentence1 sentence2.
    test = TableLayout(files=("diagnostic.tsv", "AX.tsv"), text_a=1, text_b=2, guid_column=0)
    return TableProcessor("ax", {"test": test}, labels=MNLI_LABELS)


def xnli_processor(language: str = "zh") -> TableProcessor:
    """XNLI for one language: train from the MultiNLI machine translations, dev/test from
    the XNLI-1.0 files filtered by language (gold labels kept on test)."""
    train = TableLayout(
        files=(f"multinli/multinli.train.{language}.tsv",
               f"XNLI-MT-1.0/multinli/multinli.train.{language}.tsv"),
        text_a=0, text_b=1, label=2, label_aliases=(("contradictory", "contradiction"),))

    def evaluation(split):
        # language gold_label s1_binary_parse s2_binary_parse s1_parse s2_parse sentence1
        # sentence2 promptID pairID genre label1..label5 s1_tokenized s2_tokenized match
        return TableLayout(files=(f"xnli.{split}.tsv", f"XNLI-1.0/xnli.{split}.tsv"),
                           text_a=6, text_b=7, label=1, filter_column=0, filter_value=language)

    layouts = {"train": train, "dev": evaluation("dev"), "test": evaluation("test")}
    return TableProcessor("xnli", layouts, labels=MNLI_LABELS,
                          signature={"language": language})


_DELIMITER_NAMES = {"tab": "\t", "\\t": "\t", "comma": ",", "semicolon": ";", "pipe": "|"}


@dataclasses.dataclass(frozen=True)
class CustomDataConfig:
    """The user's own CSV/TSV data (task "custom").

    Files are data_dir/{train,dev,test}.{tsv|csv} unless `file_names` says otherwise; the
    test split is read without labels (placeholder label).

    Attributes:
      text_a_column: column of the (first) text: a header name or a 0-based index.
      label_column: column of the label (name or index).
      text_b_column: column of the second text for pair tasks, or None.
      delimiter: one character; also "tab", "\\t", "comma", "semicolon", "pipe".
      has_header: whether the first row names the columns.
      labels: label names in id order; None infers them from train (sorted, numerically
        when all are integers).
      is_regression: labels are float scores (labels is then ignored).
      quotechar: csv quote character; "auto" means '"' for comma-separated files and
        none (quotes are text) otherwise; "" or None disables quoting.
      file_names: split -> file name relative to data_dir.
    """

    text_a_column: Column
    label_column: Column
    text_b_column: Column | None = None
    delimiter: str = "\t"
    has_header: bool = True
    labels: tuple[str, ...] | None = None
    is_regression: bool = False
    quotechar: str | None = "auto"
    file_names: Mapping[str, str] | None = None

    def __post_init__(self):
        delimiter = _DELIMITER_NAMES.get(self.delimiter.lower(), self.delimiter)
        if len(delimiter) != 1:
            raise ValueError(f"delimiter must be one character, got {self.delimiter!r}")
        object.__setattr__(self, "delimiter", delimiter)
        quotechar = self.quotechar
        if quotechar == "auto":
            quotechar = '"' if delimiter == "," else None
        object.__setattr__(self, "quotechar", quotechar or None)
        if isinstance(self.labels, str):
            labels = tuple(label.strip() for label in self.labels.split(",") if label.strip())
            object.__setattr__(self, "labels", labels or None)
        elif self.labels is not None:
            object.__setattr__(self, "labels", tuple(str(x) for x in self.labels) or None)
        if self.text_b_column == "":
            object.__setattr__(self, "text_b_column", None)


def custom_processor(config: CustomDataConfig) -> TableProcessor:
    """A processor for the user's own delimited files described by `config`."""
    extension = "csv" if config.delimiter == "," else "tsv"
    names = {split: f"{split}.{extension}" for split in ("train", "dev", "test")}
    names.update(config.file_names or {})
    common = dict(text_a=config.text_a_column, text_b=config.text_b_column,
                  has_header=config.has_header, delimiter=config.delimiter,
                  quotechar=config.quotechar)
    layouts = {split: TableLayout(files=(names[split],),
                                  label=None if split == "test" else config.label_column,
                                  **common)
               for split in names}
    return TableProcessor("custom", layouts, labels=config.labels,
                          is_regression=config.is_regression)


_GLUE_FACTORIES = {
    "cola": _cola, "sst-2": _sst2, "mrpc": _mrpc, "sts-b": _stsb, "qqp": _qqp,
    "mnli": _mnli, "mnli-mm": lambda: _mnli(mismatched=True),
    "qnli": lambda: _index_pair("qnli", ENTAILMENT_LABELS),
    "rte": lambda: _index_pair("rte", ENTAILMENT_LABELS),
    "wnli": lambda: _index_pair("wnli", BINARY_LABELS),
    "ax": _ax,
}
TASK_NAMES = tuple(_GLUE_FACTORIES) + ("xnli", "custom")


def get_processor(task_name: str, *, xnli_language: str = "zh",
                  custom: CustomDataConfig | None = None) -> TableProcessor:
    """The processor of a task ("MRPC", "sts-b", "mnli-mm", "xnli", "custom", ...)."""
    task = normalize_task_name(task_name)
    if task == "xnli":
        return xnli_processor(xnli_language)
    if task == "custom":
        if custom is None:
            raise ValueError("task 'custom' needs a CustomDataConfig (custom=...)")
        return custom_processor(custom)
    return _GLUE_FACTORIES[task]()


# --- Feature conversion -------------------------------------------------------------------


def _padding_features(max_seq_length: int, is_regression: bool) -> InputFeatures:
    zeros = [0] * max_seq_length
    return InputFeatures(input_ids=list(zeros), input_mask=list(zeros), segment_ids=list(zeros),
                         label_id=0.0 if is_regression else 0, is_real_example=False)


def _label_id(example: InputExample, label_map: Mapping[str, int] | None, is_regression: bool):
    if is_regression:
        return float(example.label)
    try:
        return label_map[example.label]
    except KeyError:
        raise ValueError(f"example {example.guid}: label {example.label!r} is not in the label "
                         f"list {list(label_map)}") from None


def _convert(example, label_map, max_seq_length: int, tokenizer, is_regression: bool
             ) -> tuple[InputFeatures, int]:
    """Features of one example and its length in tokens (with [CLS]/[SEP]) before truncation."""
    if isinstance(example, PaddingInputExample):
        return _padding_features(max_seq_length, is_regression), 0
    tokens_a = tokenizer.tokenize(example.text_a)
    # As the original: an empty text_b, or one that tokenizes to nothing, means one segment.
    tokens_b = tokenizer.tokenize(example.text_b) if example.text_b else None
    if tokens_b:
        if max_seq_length < 3:
            raise ValueError(f"max_seq_length {max_seq_length} leaves no room for a pair")
        full_length = len(tokens_a) + len(tokens_b) + 3
        truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)
    else:
        if max_seq_length < 2:
            raise ValueError(f"max_seq_length {max_seq_length} leaves no room for [CLS] [SEP]")
        full_length = len(tokens_a) + 2
        tokens_a = tokens_a[:max_seq_length - 2]
    tokens = ["[CLS]", *tokens_a, "[SEP]"]
    segment_ids = [0] * len(tokens)
    if tokens_b:
        tokens += [*tokens_b, "[SEP]"]
        segment_ids += [1] * (len(tokens_b) + 1)
    input_ids = tokenizer.convert_tokens_to_ids(tokens)
    padding = [0] * (max_seq_length - len(input_ids))
    features = InputFeatures(
        input_ids=list(input_ids) + padding,
        input_mask=[1] * len(input_ids) + padding,
        segment_ids=segment_ids + padding,
        label_id=_label_id(example, label_map, is_regression),
        is_real_example=True)
    return features, full_length


def convert_single_example(example, label_list: Sequence[str] | None, max_seq_length: int,
                           tokenizer, *, is_regression: bool = False) -> InputFeatures:
    """The features of one example, with the original run_classifier's rules.

    Args:
      example: an InputExample, or a PaddingInputExample (all zeros, is_real_example False).
      label_list: label names in id order (ignored for regression).
      max_seq_length: the padded length, [CLS] and [SEP]s included.
      tokenizer: a data_prep.tokenization.FullTokenizer (anything with tokenize and
        convert_tokens_to_ids).
      is_regression: the label is a float score.
    """
    label_map = None if is_regression else {label: i for i, label in enumerate(label_list)}
    return _convert(example, label_map, max_seq_length, tokenizer, is_regression)[0]


def pad_examples(examples: Sequence, batch_size: int) -> list:
    """`examples` followed by PaddingInputExamples up to a multiple of batch_size."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    padding = -len(examples) % batch_size
    return list(examples) + [PaddingInputExample() for _ in range(padding)]


# --- Classifier record schema (declared with data_prep.features' types, so it can move into
# features.SCHEMAS unchanged) ---------------------------------------------------------------

# Feature names as the original's file_based_convert_examples_to_features.
CLASSIFIER_SCHEMA = features_lib.RecordSchema(
    kind="classifier",
    features=(
        features_lib.FeatureSpec("input_ids", features_lib.INT64, "max_seq_length"),
        features_lib.FeatureSpec("input_mask", features_lib.INT64, "max_seq_length"),
        features_lib.FeatureSpec("segment_ids", features_lib.INT64, "max_seq_length"),
        features_lib.FeatureSpec("label_ids", features_lib.INT64, 1),
        features_lib.FeatureSpec("is_real_example", features_lib.INT64, 1),
    ),
)
# Regression (STS-B, custom scores): the same with a float label.
CLASSIFIER_REGRESSION_SCHEMA = features_lib.RecordSchema(
    kind="classifier_regression",
    features=CLASSIFIER_SCHEMA.features[:3] + (
        features_lib.FeatureSpec("label_ids", features_lib.FLOAT32, 1),
        CLASSIFIER_SCHEMA.features[4],
    ),
)
# Features the original parses as scalars (FixedLenFeature([])), one value on disk.
SCALAR_FEATURES = ("label_ids", "is_real_example")


def classifier_schema(is_regression: bool = False) -> features_lib.RecordSchema:
    """The record schema of classification (int64 label) or regression (float label) data."""
    return CLASSIFIER_REGRESSION_SCHEMA if is_regression else CLASSIFIER_SCHEMA


def classifier_record_values(features: InputFeatures) -> dict[str, list]:
    """InputFeatures as the per-feature value lists of the classifier schema."""
    return {
        "input_ids": list(features.input_ids),
        "input_mask": list(features.input_mask),
        "segment_ids": list(features.segment_ids),
        "label_ids": [features.label_id],
        "is_real_example": [int(features.is_real_example)],
    }


def classifier_parse_spec(max_seq_length: int, is_regression: bool = False) -> dict:
    """The original's parse spec: input_ids, input_mask, segment_ids [max_seq_length] int64;
    label_ids [] int64 (float32 for regression); is_real_example [] int64."""
    import tensorflow as tf

    spec = classifier_schema(is_regression).parse_spec(max_seq_length=max_seq_length)
    for name in SCALAR_FEATURES:
        spec[name] = tf.io.FixedLenFeature([], spec[name].dtype)
    return spec


def parse_record(serialized, max_seq_length: int, is_regression: bool = False) -> dict:
    """Parses one serialized record (scalar string) or a batch (vector); int64 -> int32."""
    import tensorflow as tf

    spec = classifier_parse_spec(max_seq_length, is_regression)
    if serialized.shape.rank == 0:
        parsed = tf.io.parse_single_example(serialized, spec)
    else:
        parsed = tf.io.parse_example(serialized, spec)
    return {name: tf.cast(t, tf.int32) if t.dtype == tf.int64 else t
            for name, t in parsed.items()}


# --- TFRecord cache -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CachedSplit:
    """A split's TFRecord file, its metadata JSON and whether an existing cache was reused."""

    record_file: str
    metadata_file: str
    metadata: dict
    reused: bool

    @property
    def num_examples(self) -> int:
        """Real examples (padding excluded)."""
        return self.metadata["num_examples"]

    @property
    def num_records(self) -> int:
        """Records in the file (padding included)."""
        return self.metadata["num_records"]

    @property
    def label_list(self) -> list[str]:
        return self.metadata["label_list"]

    @property
    def is_regression(self) -> bool:
        return self.metadata["is_regression"]

    @property
    def max_seq_length(self) -> int:
        return self.metadata["max_seq_length"]

    def parse_spec(self) -> dict:
        """The tf.io.parse_example spec of the records (classifier_parse_spec)."""
        return classifier_parse_spec(self.max_seq_length, self.is_regression)


def record_file_names(output_dir: str, split: str) -> tuple[str, str]:
    """(TFRecord path, metadata JSON path) of a split in output_dir."""
    cache = RecordCache.at(output_dir, f"{split}.tf_record")
    return cache.record_file, cache.metadata_file


def _cache_key(processor: TableProcessor, split: str, source: str, *, vocab_file,
               do_lower_case, max_seq_length, label_list, skip_bad_rows, pad_to_multiple
               ) -> dict:
    return cache_key(
        format_version=CACHE_FORMAT_VERSION, processor=processor.signature(), split=split,
        source=fileio.fingerprint(source), vocab_sha256=fileio.sha256(vocab_file),
        do_lower_case=bool(do_lower_case), max_seq_length=int(max_seq_length),
        label_list=list(label_list), skip_bad_rows=bool(skip_bad_rows),
        pad_to_multiple=int(pad_to_multiple or 1))


def prepare_classifier_records(processor: TableProcessor, data_dir: str, split: str,
                               output_dir: str, *, vocab_file: str, do_lower_case: bool,
                               max_seq_length: int, skip_bad_rows: bool = False,
                               pad_to_multiple: int | None = None, tokenizer=None
                               ) -> CachedSplit:
    """Converts a split to TFRecords in output_dir, or reuses the ones already there.

    The cache ({split}.tf_record plus {split}.tf_record.metadata.json) is reused while the
    source file (path, size, mtime), the vocab (sha256), do_lower_case, max_seq_length,
    the task and its options, the label list, skip_bad_rows and pad_to_multiple are all
    unchanged. Both files are written to temporary names and renamed into place.

    Args:
      processor: the task's processor (get_processor()).
      data_dir: the task's data directory.
      split: "train", "dev", "test" or a task-specific split ("dev_mismatched").
      output_dir: where the records go (created if missing; gs:// works).
      vocab_file, do_lower_case: the tokenizer's settings.
      max_seq_length: padded sequence length.
      skip_bad_rows: skip malformed rows (counted in the metadata) instead of failing.
      pad_to_multiple: append padding examples (is_real_example=0) up to a multiple of
        this, for fixed-size eval/predict batches.
      tokenizer: an already built FullTokenizer for vocab_file/do_lower_case (optional).

    Returns:
      CachedSplit with the paths and the metadata: label_list, is_regression,
      num_examples, num_padding, num_records, num_bad_rows, bad_rows (the first
      MAX_LISTED_BAD_ROWS as "file:line: reason"), max_tokens_seen (longest example in
      tokens with [CLS]/[SEP], before truncation), num_truncated, label_counts.
    """
    layout_split, _ = processor.resolve_split(split)
    source = processor.source_file(data_dir, split)
    label_list = processor.get_labels(data_dir)
    key = _cache_key(processor, layout_split, source, vocab_file=vocab_file,
                     do_lower_case=do_lower_case, max_seq_length=max_seq_length,
                     label_list=label_list, skip_bad_rows=skip_bad_rows,
                     pad_to_multiple=pad_to_multiple)
    cache = RecordCache.at(output_dir, f"{layout_split}.tf_record")
    record_file, metadata_file = cache.record_file, cache.metadata_file
    cached = cache.load(key)
    if cached is not None:
        logging.info("Reusing cached %s records in %s", layout_split, record_file)
        return CachedSplit(record_file, metadata_file, cached, reused=True)

    read = processor.read_split(data_dir, split, skip_bad_rows=skip_bad_rows)
    if tokenizer is None:
        tokenizer = tokenization.FullTokenizer(vocab_file, do_lower_case=do_lower_case)
    examples = pad_examples(read.examples, pad_to_multiple) if pad_to_multiple else read.examples
    cache.begin()
    stats = _write_records(examples, processor, label_list, max_seq_length, tokenizer,
                           record_file)
    metadata = cache.commit(key, {
        "task": processor.name,
        "split": layout_split,
        "source_file": source,
        "label_list": label_list,
        "is_regression": processor.is_regression,
        "max_seq_length": int(max_seq_length),
        "num_examples": len(read.examples),
        "num_padding": len(examples) - len(read.examples),
        "num_records": len(examples),
        "num_bad_rows": len(read.bad_rows),
        "bad_rows": [str(row) for row in read.bad_rows[:MAX_LISTED_BAD_ROWS]],
        **stats,
    })
    logging.info("Wrote %d %s records (%d real, %d truncated) to %s", len(examples),
                 layout_split, len(read.examples), stats["num_truncated"], record_file)
    return CachedSplit(record_file, metadata_file, metadata, reused=False)


def _write_records(examples, processor: TableProcessor, label_list, max_seq_length, tokenizer,
                   record_file: str) -> dict:
    """Writes the features of `examples` to record_file; returns length and label stats."""
    import tensorflow as tf

    is_regression = processor.is_regression
    encoder = classifier_schema(is_regression).encoder(max_seq_length=max_seq_length)
    label_map = None if is_regression else {label: i for i, label in enumerate(label_list)}
    stats = {"max_tokens_seen": 0, "num_truncated": 0}
    label_counts = {label: 0 for label in label_list}

    with fileio.AtomicOutputs([record_file]) as out, \
            tf.io.TFRecordWriter(out.temp(record_file)) as writer:
        for example in examples:
            features, length = _convert(example, label_map, max_seq_length, tokenizer,
                                        is_regression)
            if features.is_real_example:
                stats["max_tokens_seen"] = max(stats["max_tokens_seen"], length)
                stats["num_truncated"] += int(length > max_seq_length)
                if not is_regression:
                    label_counts[example.label] += 1
            writer.write(encoder.encode(classifier_record_values(features)))
    if not is_regression:
        stats["label_counts"] = label_counts
    return stats
