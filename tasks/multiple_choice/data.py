"""Multiple-choice data: SWAG's CSV files and your own CSV / JSON lines -> examples -> features -> cached TFRecords.

An example is a context, an optional question (SWAG's `sent2`, the start of the sentence
the endings complete) and C endings, one of them right. Each choice becomes one sequence,
`[CLS] context [SEP] question + " " + ending [SEP]` (the paper's SWAG set-up, §4.4:
"the given sentence (sentence A) and a possible continuation (sentence B)"), truncated
longest-first as the original's sentence pairs (`truncate_seq_pair`); an example's
features are [C, max_seq_length] and its label is the index of the right ending.

Formats (`ChoiceFormat`):

* SWAG "regular" CSV (`SWAG`): columns `video-id, fold-ind, startphrase, sent1, sent2,
  gold-source, ending0..ending3, label` after an unnamed index column; `test.csv` has
  no `label`. Files: `train.csv`, `val.csv`, `test.csv`.
* your own data: CSV (comma, double quotes) or JSON lines (`*.jsonl`: one object per
  line) with the context, question and ending fields you name, and a label that is the
  ending's index (or, with `label_is_text`, its text). In JSON lines one key may hold the
  list of endings. Every example of a run has the same number of choices (the first
  training example's). Files: `train.*`, `dev.*` (or `val.*`), `test.*`.

Errors name the file and line (for CSV, the line where the record starts, quoted line
breaks counted) and what is wrong: a missing column, a row with another number of fields,
a label out of range or not among the endings, an empty split, another number of choices.
"""

from __future__ import annotations

import dataclasses
import json
import os

from absl import logging

from data_prep import features as features_lib
from data_prep import fileio, tokenization
from data_prep.cli import UserError
from tasks.common.delimited import iter_records
from tasks.common.pairs import pack_pair
from tasks.common.record_cache import CachedRecords, RecordCache, cache_key

CACHE_FORMAT_VERSION = 1
SEQUENCE_FEATURES = ("input_ids", "input_mask", "segment_ids")
SPLIT_FILES = {
    "train": ("train.csv", "train.jsonl"),
    "dev": ("val.csv", "dev.csv", "val.jsonl", "dev.jsonl"),
    "test": ("test.csv", "test.jsonl"),
}


class MultipleChoiceFormatError(UserError):
    """A data file that does not fit the format; names the file and line."""


@dataclasses.dataclass(frozen=True)
class ChoiceFormat:
    """Which fields hold the parts of an example.

    Attributes:
      context: the context field (sentence A of every choice).
      question: a field prepended to every ending (sentence B = question + " " + ending);
        None: sentence B is the ending alone.
      endings: the ending fields, in choice order; in JSON lines, one field may hold a list.
      label: the label field; None: no labels (every file is a test file).
      label_is_text: the label is the text of the right ending, not its index.
    """

    context: str = "sent1"
    question: str | None = "sent2"
    endings: tuple = ("ending0", "ending1", "ending2", "ending3")
    label: str | None = "label"
    label_is_text: bool = False

    def __post_init__(self):
        if not self.context or not self.endings:
            raise ValueError("a multiple-choice format needs a context field and ending fields")


SWAG = ChoiceFormat()


@dataclasses.dataclass(frozen=True)
class MultipleChoiceSettings:
    """The task's own settings (run_swag.py's task flags)."""

    data_dir: str
    format: ChoiceFormat = SWAG
    task_name: str = "swag"

    def validate(self, run) -> None:
        """Refuses (UserError) what these settings cannot do in the modes of `run` (a
        `training.finetuning.FinetuningRun`): training or evaluating without labels."""
        if self.format.label is None and (run.do_train or run.do_eval):
            modes = " and ".join(f"--{name}" for name in ("do_train", "do_eval")
                                 if getattr(run, name))
            raise UserError(f"--label_column is required with {modes} (the right ending of "
                            "each example); only --do_predict reads files without labels")


@dataclasses.dataclass(frozen=True)
class ChoiceExample:
    """One multiple-choice example: context, question, endings, label index (None: unknown)."""

    guid: str
    context: str
    question: str
    endings: tuple
    label: int | None
    line: int = 0


def split_file(data_dir: str, split: str) -> str:
    """The file a split is read from (the first of SPLIT_FILES that exists)."""
    candidates = [os.path.join(data_dir, name) for name in SPLIT_FILES[split]]
    for path in candidates:
        if fileio.isfile(path):
            return path
    raise MultipleChoiceFormatError(f"{data_dir}: no {split} file; looked for "
                                    f"{', '.join(SPLIT_FILES[split])}")


def read_examples(path: str, fmt: ChoiceFormat = SWAG, *, split: str = "train",
                  num_choices: int | None = None) -> list[ChoiceExample]:
    """Reads a CSV or JSON lines file (by its extension).

    Args:
      split: "test" files may lack the label field (labels are then None).
      num_choices: the run's number of choices (None: this file's first example decides).

    Raises:
      MultipleChoiceFormatError naming the file and line.
    """
    rows = _json_rows(path) if path.endswith((".jsonl", ".json")) else _csv_rows(path, fmt)
    examples = []
    for line, row in rows:
        example = _example(path, line, row, fmt, split, len(examples))
        if num_choices is None:
            num_choices = len(example.endings)
        if len(example.endings) != num_choices:
            raise MultipleChoiceFormatError(
                f"{path}:{line}: {len(example.endings)} endings, but the examples of this "
                f"run have {num_choices}")
        examples.append(example)
    if not examples:
        raise MultipleChoiceFormatError(f"{path}: no examples")
    return examples


def _csv_rows(path, fmt):
    """(line, {column: value}) of a comma-separated file with a header."""
    records = iter_records(path, ",", '"')
    header = next(records, None)
    if header is None or header.error or not any(f.strip() for f in header.fields):
        raise MultipleChoiceFormatError(f"{path}: empty file (no header line)")
    columns = [name.strip() for name in header.fields]
    needed = [fmt.context] + ([fmt.question] if fmt.question else []) + list(fmt.endings)
    missing = [name for name in needed if name not in columns]
    if missing:
        raise MultipleChoiceFormatError(f"{path}:{header.line}: no column {missing[0]!r}; "
                                        f"the header has {columns}")
    for record in records:
        if record.error:
            raise MultipleChoiceFormatError(f"{path}:{record.line}: {record.error}")
        if not record.fields or record.fields == [""]:
            continue  # a blank line
        if len(record.fields) != len(columns):
            raise MultipleChoiceFormatError(
                f"{path}:{record.line}: {len(record.fields)} fields, the header has "
                f"{len(columns)}")
        yield record.line, dict(zip(columns, record.fields))


def _json_rows(path):
    """(line, object) of a JSON lines file."""
    with fileio.open_file(path, "rb") as reader:
        for number, raw in enumerate(reader, start=1):
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise MultipleChoiceFormatError(f"{path}:{number}: invalid UTF-8") from None
            if not text:
                continue
            try:
                row = json.loads(text)
            except ValueError as err:
                raise MultipleChoiceFormatError(f"{path}:{number}: not JSON ({err})") from None
            if not isinstance(row, dict):
                raise MultipleChoiceFormatError(f"{path}:{number}: expected a JSON object")
            yield number, row


def _field(path, line, row, name, kind="field"):
    if name not in row:
        raise MultipleChoiceFormatError(f"{path}:{line}: no {kind} {name!r}")
    value = row[name]
    if not isinstance(value, (str, int, float)):
        raise MultipleChoiceFormatError(f"{path}:{line}: {kind} {name!r} must be text, "
                                        f"found {type(value).__name__}")
    return str(value)


def _example(path, line, row, fmt: ChoiceFormat, split, index) -> ChoiceExample:
    context = _field(path, line, row, fmt.context)
    question = _field(path, line, row, fmt.question) if fmt.question else ""
    if len(fmt.endings) == 1 and isinstance(row.get(fmt.endings[0]), list):
        endings = [str(e) for e in row[fmt.endings[0]]]
    else:
        endings = [_field(path, line, row, name, "ending field") for name in fmt.endings]
    if len(endings) < 2:
        raise MultipleChoiceFormatError(f"{path}:{line}: {len(endings)} ending(s); multiple "
                                        "choice needs at least 2")
    label = None
    has_label = fmt.label is not None and fmt.label in row and str(row[fmt.label]).strip()
    if has_label:
        label = _label(path, line, str(row[fmt.label]).strip(), endings, fmt.label_is_text)
    elif split != "test" and fmt.label is not None:
        raise MultipleChoiceFormatError(f"{path}:{line}: no label ({fmt.label!r}) in a "
                                        f"{split} file")
    guid = str(row.get("", row.get("id", f"{split}-{index}")))
    return ChoiceExample(guid, context, question, tuple(endings), label, line)


def _label(path, line, value, endings, label_is_text) -> int:
    if label_is_text:
        if value not in endings:
            raise MultipleChoiceFormatError(f"{path}:{line}: label {value!r} is none of the "
                                            "endings")
        return endings.index(value)
    try:
        label = int(value)
    except ValueError:
        raise MultipleChoiceFormatError(f"{path}:{line}: label {value!r} is not an ending "
                                        "index") from None
    if not 0 <= label < len(endings):
        raise MultipleChoiceFormatError(f"{path}:{line}: label {label} out of range for "
                                        f"{len(endings)} endings")
    return label


# ------------------------------------------------------------------------ features


def choice_texts(example: ChoiceExample) -> list[tuple[str, str]]:
    """(sentence A, sentence B) of each choice: context, and question + " " + ending."""
    return [(example.context,
             f"{example.question} {ending}" if example.question else ending)
            for ending in example.endings]


def convert_example(example: ChoiceExample | None, num_choices: int, max_seq_length: int,
                    tokenizer) -> tuple[dict, int]:
    """Record values of one example (None: an all-zero padding row) and its longest choice
    in tokens before truncation. Per-token features are flattened [num_choices * seq]."""
    size = num_choices * max_seq_length
    if example is None:
        return ({"input_ids": [0] * size, "input_mask": [0] * size, "segment_ids": [0] * size,
                 "label_ids": [0], "is_real_example": [0]}, 0)
    ids, mask, segments, longest = [], [], [], 0
    for text_a, text_b in choice_texts(example):
        tokens_a = tokenizer.tokenize(text_a)
        tokens_b = tokenizer.tokenize(text_b)
        longest = max(longest, len(tokens_a) + len(tokens_b) + 3)
        _, choice_ids, choice_mask, choice_segments = pack_pair(tokens_a, tokens_b,
                                                                max_seq_length, tokenizer)
        ids += choice_ids
        mask += choice_mask
        segments += choice_segments
    return ({"input_ids": ids, "input_mask": mask, "segment_ids": segments,
             "label_ids": [example.label if example.label is not None else 0],
             "is_real_example": [1]}, longest)


def record_schema(num_choices: int, max_seq_length: int) -> features_lib.RecordSchema:
    """The record kind: flattened [num_choices * seq] per-token features, label, is_real."""
    size = num_choices * max_seq_length
    return features_lib.RecordSchema("multiple_choice", (
        features_lib.FeatureSpec("input_ids", features_lib.INT64, size),
        features_lib.FeatureSpec("input_mask", features_lib.INT64, size),
        features_lib.FeatureSpec("segment_ids", features_lib.INT64, size),
        features_lib.FeatureSpec("label_ids", features_lib.INT64, 1),
        features_lib.FeatureSpec("is_real_example", features_lib.INT64, 1),
    ))


def parse_spec(num_choices: int, max_seq_length: int) -> dict:
    """Parse spec giving [num_choices, seq] per-token features and [] label/is_real."""
    import tensorflow as tf

    shape = [num_choices, max_seq_length]
    spec = {name: tf.io.FixedLenFeature(shape, tf.int64) for name in SEQUENCE_FEATURES}
    spec["label_ids"] = tf.io.FixedLenFeature([], tf.int64)
    spec["is_real_example"] = tf.io.FixedLenFeature([], tf.int64)
    return spec


@dataclasses.dataclass
class CachedChoices(CachedRecords):
    """A split's records (`tasks.common.record_cache.CachedRecords`) and its examples (for
    predictions)."""

    examples: list

    @property
    def num_examples(self) -> int:
        return self.metadata["num_examples"]


def prepare_records(data_dir: str, split: str, output_dir: str, *, fmt: ChoiceFormat,
                    vocab_file: str, do_lower_case: bool, max_seq_length: int,
                    num_choices: int | None = None, pad_to_multiple: int | None = None,
                    tokenizer=None) -> CachedChoices:
    """Reads a split and writes `{split}.mc.tf_record` (+ `.metadata.json`) in output_dir,
    or reuses them while the file, vocab, casing, length, format and padding are unchanged.

    Padding rows (is_real_example 0) are appended up to a multiple of `pad_to_multiple`
    (fixed-size eval batches). Written as every family's cache (`tasks.common.record_cache`):
    the records, then their metadata, each all-or-nothing.
    """
    source = split_file(data_dir, split)
    examples = read_examples(source, fmt, split=split, num_choices=num_choices)
    num_choices = len(examples[0].endings)
    cache = RecordCache.at(output_dir, f"{split}.mc.tf_record")
    key = cache_key(
        format_version=CACHE_FORMAT_VERSION, format=dataclasses.asdict(fmt),
        source=fileio.fingerprint(source), vocab_sha256=fileio.sha256(vocab_file),
        do_lower_case=bool(do_lower_case), max_seq_length=int(max_seq_length),
        num_choices=num_choices, pad_to_multiple=int(pad_to_multiple or 1))

    def write(writer) -> dict:
        tokens = tokenizer or tokenization.FullTokenizer(vocab_file, do_lower_case=do_lower_case)
        rows = list(examples)
        if pad_to_multiple:
            rows += [None] * (-len(rows) % pad_to_multiple)
        encoder = record_schema(num_choices, max_seq_length).encoder()
        longest, truncated = 0, 0
        for example in rows:
            values, length = convert_example(example, num_choices, max_seq_length, tokens)
            longest = max(longest, length)
            truncated += int(length > max_seq_length)
            writer.write(encoder.encode(values))
        logging.info("Wrote %d %s examples (%d choices, %d truncated) to %s", len(examples),
                     split, num_choices, truncated, cache.record_file)
        return {"source_file": source, "num_examples": len(examples), "num_records": len(rows),
                "num_choices": num_choices, "max_tokens_seen": longest,
                "num_truncated": truncated}

    metadata, reused = cache.records(key, write)
    return CachedChoices(cache.record_file, cache.metadata_file, metadata, reused, examples)


