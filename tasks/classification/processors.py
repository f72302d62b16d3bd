"""Owns the reader of every classification data set: the GLUE tasks, XNLI, your own tables (`CustomDataConfig`), by name (`get_processor`).

Each is a `tasks.classification.readers.TableProcessor` with one `TableLayout` per split,
the original run_classifier's files, columns and labels.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from data_prep.cli import UserError
from tasks.classification.metrics import normalize_task_name
from tasks.classification.readers import Column, TableLayout, TableProcessor

MNLI_LABELS = ("contradiction", "entailment", "neutral")
BINARY_LABELS = ("0", "1")
ENTAILMENT_LABELS = ("entailment", "not_entailment")


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
      labels: label names in id order, each once; None infers them from train (sorted,
        numerically when all are integers).
      is_regression: labels are float scores (`labels` must then be None).
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
            raise UserError(f"--delimiter must be one character, got {self.delimiter!r}")
        object.__setattr__(self, "delimiter", delimiter)
        quotechar = self.quotechar
        if quotechar == "auto":
            quotechar = '"' if delimiter == "," else None
        object.__setattr__(self, "quotechar", quotechar or None)
        if isinstance(self.labels, str):
            labels = tuple(label.strip() for label in self.labels.split(","))
            object.__setattr__(self, "labels", labels if self.labels.strip() else None)
        elif self.labels is not None:
            object.__setattr__(self, "labels", tuple(str(x) for x in self.labels) or None)
        if self.labels is not None:
            self._check_labels()
        if self.text_b_column == "":
            object.__setattr__(self, "text_b_column", None)

    def _check_labels(self) -> None:
        """Refuses (UserError) label names a run would mis-read: a list given for a
        regression (no labels to name), an empty name (`pos,,neg`), or a name given twice
        (a head with a class no label maps to)."""
        if self.is_regression:
            raise UserError(f"--label_list={','.join(self.labels)} with --is_regression: "
                            "regression has no labels; drop --label_list")
        if not all(label.strip() for label in self.labels):
            raise UserError(f"--label_list={','.join(self.labels)}: empty label names")
        repeated = sorted({label for label in self.labels if self.labels.count(label) > 1})
        if repeated:
            raise UserError(f"--label_list repeats {repeated}")


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
