"""Owns classifier features: the original run_classifier's conversion, the record schema, and a split's TFRecord cache.

  1. Feature conversion with exactly the original run_classifier's rules
     (`convert_single_example`): `[CLS] a [SEP] (b [SEP])`, pair truncation from the end
     of the longer side, zero padding, label ids; padding examples for fixed batches; or
     head+tail truncation of a long single text (`head_tail`, --long_document=head_tail).
  2. The record schema (`classifier_schema`, `classifier_parse_spec`).
  3. `prepare_classifier_records`: writes a split's features as TFRecords in an output
     directory with a JSON of metadata beside them, and reuses them while the inputs and
     the settings that shape them are unchanged (`tasks.common.record_cache`).

The examples come from the readers (`tasks.classification.readers`, one per data set in
`tasks.classification.processors`). Cache metadata: docs/classifier_data.md.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from absl import logging

from data_prep import features as features_lib
from data_prep import fileio
from data_prep import tokenization
from data_prep.cli import UserError
from tasks.classification import processors
from tasks.classification.examples import DataFormatError, InputExample, PaddingInputExample
from tasks.classification.readers import TableProcessor
from tasks.common.pairs import pack_pair
from tasks.common.record_cache import CachedRecords, RecordCache, cache_key
from tasks.common.windows import DocSpan, doc_spans_for

# --long_document's modes (docs/run_classifier.md#long-documents).
LONG_DOCUMENT_MODES = ("truncate", "head_tail", "windows")
# --max_windows_per_document's default: a document of up to 8 windows (about 4 windows'
# worth of text at the default half-window stride) costs 8 encoder passes.
DEFAULT_MAX_WINDOWS = 8


@dataclasses.dataclass(frozen=True)
class ClassificationSettings:
    """The classification task's own settings (run_classifier.py's task flags).

    Attributes:
      task_name: normalised GLUE/XNLI task name or "custom".
      data_dir: the task's data directory.
      xnli_language: XNLI's language.
      custom: `tasks.classification.processors.CustomDataConfig` for task "custom".
      skip_bad_rows: skip malformed rows (counted) instead of failing on the first.
      long_document: how a text longer than max_seq_length is read: "truncate" (the
        original: its first tokens), "head_tail" (its first `head_tokens` and its last
        tokens; single-text tasks only) or "windows" (all of it, through windows pooled
        into one prediction, `modeling.models.BertDocumentClassifier`; single-text tasks
        only).
      head_tokens: head_tail's head; None: `data.default_head_tokens(max_seq_length)`.
      doc_stride: windows: tokens between window starts; None: a whole window's text
        (windows side by side).
      max_windows_per_document: windows: a text needing more is refused (file and line).
      window_pooling: windows: "max_ends", "max", "mean" or "attention" (`WINDOW_POOLINGS`).
    """

    task_name: str
    data_dir: str
    xnli_language: str = "zh"
    custom: "processors.CustomDataConfig | None" = None
    skip_bad_rows: bool = False
    long_document: str = "truncate"
    head_tokens: "int | None" = None
    doc_stride: "int | None" = None
    max_windows_per_document: int = DEFAULT_MAX_WINDOWS
    window_pooling: str = "max_ends"

# Bump when the records or the metadata change meaning: old caches are then rebuilt.
CACHE_FORMAT_VERSION = 2
# How many skipped rows the metadata JSON lists one by one (all are counted).
MAX_LISTED_BAD_ROWS = 100


@dataclasses.dataclass(frozen=True)
class InputFeatures:
    """Model inputs of one example; the lists have length max_seq_length."""

    input_ids: list[int]
    input_mask: list[int]
    segment_ids: list[int]
    label_id: int | float
    is_real_example: bool = True


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
        raise DataFormatError(f"example {example.guid}: label {example.label!r} is not in "
                              f"the label list {list(label_map)}") from None


def default_head_tokens(max_seq_length: int) -> int:
    """`--head_tokens`' default: Sun et al. (2019)'s 128 head tokens of a 510-token text
    budget, scaled to `max_seq_length` - 2."""
    return round((max_seq_length - 2) * 128 / 510)


def head_tail(tokens: list, budget: int, head_tokens: int) -> list:
    """`tokens` cut to `budget` by keeping its first `head_tokens` and its last
    `budget - head_tokens` tokens (unchanged when it fits)."""
    if len(tokens) <= budget:
        return tokens
    return tokens[:head_tokens] + tokens[len(tokens) - (budget - head_tokens):]


def _convert(example, label_map, max_seq_length: int, tokenizer, is_regression: bool,
             head_tokens: int | None = None) -> tuple[InputFeatures, int]:
    """Features of one example and its length in tokens (with [CLS]/[SEP]) before
    truncation; `head_tokens` (single texts): head+tail truncation instead of the tail cut."""
    if isinstance(example, PaddingInputExample):
        return _padding_features(max_seq_length, is_regression), 0
    tokens_a = tokenizer.tokenize(example.text_a)
    # As the original: an empty text_b, or one that tokenizes to nothing, means one segment.
    tokens_b = (tokenizer.tokenize(example.text_b) if example.text_b else None) or None
    if head_tokens is not None and tokens_b is None:
        tokens_a = head_tail(tokens_a, max_seq_length - 2, head_tokens)
    if tokens_b:
        if max_seq_length < 3:
            raise UserError(f"max_seq_length {max_seq_length} leaves no room for a pair")
        full_length = len(tokens_a) + len(tokens_b) + 3
    else:
        if max_seq_length < 2:
            raise UserError(f"max_seq_length {max_seq_length} leaves no room for [CLS] [SEP]")
        full_length = len(tokens_a) + 2
    _, input_ids, input_mask, segment_ids = pack_pair(tokens_a, tokens_b, max_seq_length,
                                                      tokenizer)
    features = InputFeatures(
        input_ids=input_ids, input_mask=input_mask, segment_ids=segment_ids,
        label_id=_label_id(example, label_map, is_regression),
        is_real_example=True)
    return features, full_length


def convert_single_example(example, label_list: Sequence[str] | None, max_seq_length: int,
                           tokenizer, *, is_regression: bool = False,
                           head_tokens: int | None = None) -> InputFeatures:
    """The features of one example, with the original run_classifier's rules.

    Args:
      example: an InputExample, or a PaddingInputExample (all zeros, is_real_example False).
      label_list: label names in id order (ignored for regression).
      max_seq_length: the padded length, [CLS] and [SEP]s included.
      tokenizer: a data_prep.tokenization.FullTokenizer (anything with tokenize and
        convert_tokens_to_ids).
      is_regression: the label is a float score.
      head_tokens: head+tail truncation (`head_tail`) of a single text, keeping this many
        head tokens; None: the original's cut from the end.
    """
    label_map = None if is_regression else {label: i for i, label in enumerate(label_list)}
    return _convert(example, label_map, max_seq_length, tokenizer, is_regression,
                    head_tokens)[0]


@dataclasses.dataclass(frozen=True)
class Windows:
    """--long_document=windows: a text read through windows of max_seq_length - 2 tokens,
    starting `doc_stride` tokens apart (`tasks.common.windows.doc_spans_for`), at most
    `max_windows` per text; the last one, when shorter, is filled with the tokens before
    it to a whole window (max_ends pooling reads it on its own)."""

    doc_stride: int
    max_windows: int


def window_record_values(example, label_map, max_seq_length: int, tokenizer,
                         is_regression: bool, windows: Windows) -> tuple[dict, int, int]:
    """(record values of the windows schema, the text's length in tokens with [CLS]/[SEP],
    its windows) of one single-text example: each window packed as the original packs a
    text (`[CLS] window [SEP]`, zero padding), then all-zero windows up to
    `windows.max_windows`. An empty text has one window ([CLS] [SEP]).

    Raises:
      UserError naming the example when the text needs more windows than
      `windows.max_windows` (`prepare_classifier_records` adds its file and line).
    """
    size = windows.max_windows * max_seq_length
    if isinstance(example, PaddingInputExample):
        zeros = [0] * size
        return ({"input_ids": zeros, "input_mask": zeros, "segment_ids": zeros,
                 "label_ids": [0.0 if is_regression else 0], "is_real_example": [0]}, 0, 0)
    tokens = tokenizer.tokenize(example.text_a)
    spans = doc_spans_for(len(tokens), max_seq_length - 2, windows.doc_stride) or [
        DocSpan(0, 0)]
    if len(spans) > windows.max_windows:
        raise UserError(
            f"example {example.guid}: its {len(tokens)} tokens need {len(spans)} windows of "
            f"max_seq_length={max_seq_length} with doc_stride={windows.doc_stride}, more "
            f"than --max_windows_per_document={windows.max_windows}")
    values = {"input_ids": [], "input_mask": [], "segment_ids": []}
    for span in spans:
        end = span.start + span.length   # filled to a whole window (serving's fill_before)
        _, ids, mask, segments = pack_pair(tokens[max(0, end - (max_seq_length - 2)):end],
                                           None, max_seq_length, tokenizer)
        values["input_ids"] += ids
        values["input_mask"] += mask
        values["segment_ids"] += segments
    for name in values:
        values[name] += [0] * (size - len(values[name]))
    values["label_ids"] = [_label_id(example, label_map, is_regression)]
    values["is_real_example"] = [1]
    return values, len(tokens) + 2, len(spans)


def pad_examples(examples: Sequence, batch_size: int) -> list:
    """`examples` followed by PaddingInputExamples up to a multiple of batch_size."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    padding = -len(examples) % batch_size
    return list(examples) + [PaddingInputExample() for _ in range(padding)]


# --- Classifier record schema (declared with data_prep.features' types) ----------------------

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


def windows_schema(max_windows: int, max_seq_length: int, is_regression: bool = False
                   ) -> features_lib.RecordSchema:
    """--long_document=windows records: the classifier schema with each per-token feature
    holding a document's `max_windows` windows, [max_windows * max_seq_length] flat."""
    base = classifier_schema(is_regression)
    size = max_windows * max_seq_length
    return features_lib.RecordSchema(base.kind + "_windows", tuple(
        features_lib.FeatureSpec(f.name, f.dtype, size) if f.name not in SCALAR_FEATURES
        else f for f in base.features))


def windows_parse_spec(max_windows: int, max_seq_length: int, is_regression: bool = False
                       ) -> dict:
    """The windows records' parse spec: per-token features [max_windows, max_seq_length],
    label_ids and is_real_example [] (as `classifier_parse_spec`)."""
    import tensorflow as tf

    spec = classifier_parse_spec(max_seq_length, is_regression)
    for name in ("input_ids", "input_mask", "segment_ids"):
        spec[name] = tf.io.FixedLenFeature([max_windows, max_seq_length], tf.int64)
    return spec


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
    return features_lib.parse_with_spec(serialized,
                                        classifier_parse_spec(max_seq_length, is_regression))


# --- TFRecord cache -----------------------------------------------------------------------


@dataclasses.dataclass
class CachedSplit(CachedRecords):
    """A split's TFRecord file, its metadata JSON and whether an existing cache was reused."""

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


def _cache_key(processor: TableProcessor, split: str, source: str, *, vocab_file,
               do_lower_case, max_seq_length, label_list, skip_bad_rows, pad_to_multiple,
               head_tokens=None, windows=None) -> dict:
    # head_tokens and windows only when set: truncate's key (and cache) is the one it
    # always was.
    extra = {} if head_tokens is None else {"head_tokens": int(head_tokens)}
    if windows is not None:
        extra["windows"] = dataclasses.asdict(windows)
    return cache_key(
        format_version=CACHE_FORMAT_VERSION, processor=processor.signature(), split=split,
        source=fileio.fingerprint(source), vocab_sha256=fileio.sha256(vocab_file),
        do_lower_case=bool(do_lower_case), max_seq_length=int(max_seq_length),
        label_list=list(label_list), skip_bad_rows=bool(skip_bad_rows),
        pad_to_multiple=int(pad_to_multiple or 1), **extra)


def prepare_classifier_records(processor: TableProcessor, data_dir: str, split: str,
                               output_dir: str, *, vocab_file: str, do_lower_case: bool,
                               max_seq_length: int, skip_bad_rows: bool = False,
                               pad_to_multiple: int | None = None, tokenizer=None,
                               head_tokens: int | None = None,
                               windows: Windows | None = None) -> CachedSplit:
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
      head_tokens: head+tail truncation of single texts (`convert_single_example`).
      windows: write each single text as its windows (`window_record_values`,
        `windows_schema`) instead; the metadata adds num_windows (all real texts) and
        max_windows_seen.

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
                     pad_to_multiple=pad_to_multiple, head_tokens=head_tokens,
                     windows=windows)
    cache = RecordCache.at(output_dir, f"{layout_split}.tf_record")

    def write(writer) -> dict:
        read = processor.read_split(data_dir, split, skip_bad_rows=skip_bad_rows)
        examples = (pad_examples(read.examples, pad_to_multiple) if pad_to_multiple
                    else read.examples)
        stats = _write_records(writer, examples, processor, label_list, max_seq_length,
                               tokenizer or tokenization.FullTokenizer(
                                   vocab_file, do_lower_case=do_lower_case),
                               head_tokens, windows, source)
        logging.info("Wrote %d %s records (%d real, %d truncated) to %s", len(examples),
                     layout_split, len(read.examples), stats["num_truncated"],
                     cache.record_file)
        return {"task": processor.name, "split": layout_split, "source_file": source,
                "label_list": label_list, "is_regression": processor.is_regression,
                "max_seq_length": int(max_seq_length), "num_examples": len(read.examples),
                "num_padding": len(examples) - len(read.examples),
                "num_records": len(examples), "num_bad_rows": len(read.bad_rows),
                "bad_rows": [str(row) for row in read.bad_rows[:MAX_LISTED_BAD_ROWS]],
                **stats}

    metadata, reused = cache.records(key, write)
    return CachedSplit(cache.record_file, cache.metadata_file, metadata, reused)


def _write_records(writer, examples, processor: TableProcessor, label_list, max_seq_length,
                   tokenizer, head_tokens: int | None = None, windows: Windows | None = None,
                   source: str = "") -> dict:
    """Writes the features of `examples` with `writer` (a TFRecordWriter); returns length
    and label stats."""
    is_regression = processor.is_regression
    schema = (classifier_schema(is_regression) if windows is None
              else windows_schema(windows.max_windows, max_seq_length, is_regression))
    encoder = schema.encoder(max_seq_length=max_seq_length)
    label_map = None if is_regression else {label: i for i, label in enumerate(label_list)}
    stats = {"max_tokens_seen": 0, "num_truncated": 0}
    if windows is not None:
        stats.update(num_windows=0, max_windows_seen=0)
    label_counts = {label: 0 for label in label_list}

    for example in examples:
        if windows is None:
            features, length = _convert(example, label_map, max_seq_length, tokenizer,
                                        is_regression, head_tokens)
            real, values = features.is_real_example, classifier_record_values(features)
        else:
            try:
                values, length, count = window_record_values(
                    example, label_map, max_seq_length, tokenizer, is_regression,
                    windows)
            except UserError as err:
                line = "" if example.line is None else f":{example.line}"
                raise DataFormatError(f"{source}{line}: {err}") from None
            real = values["is_real_example"][0]
            stats["num_windows"] += count
            stats["max_windows_seen"] = max(stats["max_windows_seen"], count)
        if real:
            stats["max_tokens_seen"] = max(stats["max_tokens_seen"], length)
            stats["num_truncated"] += int(length > max_seq_length and windows is None)
            if not is_regression:
                label_counts[example.label] += 1
        writer.write(encoder.encode(values))
    if not is_regression:
        stats["label_counts"] = label_counts
    return stats
