"""Owns the tf.data pipelines that feed pretraining and fine-tuning TFRecords to the loop.

Files are listed with `tf.io.gfile` (local paths and gs:// alike), sharded per input
pipeline (worker) through the `tf.distribute.InputContext`, read with a parallel
interleave, shuffled, repeated for training, batched per replica with `drop_remainder`
(static shapes for TPU and XLA), parsed in batches and prefetched. Before any graph is
built, the first record is checked against the expected feature lengths, so a wrong
`max_seq_length` is a one-line error instead of a shape crash deep inside a step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Sequence

import tensorflow as tf
from absl import logging

from data_prep import features, fileio
from training import dynamic_masking



@dataclasses.dataclass(frozen=True)
class PretrainingInputConfig:
    """Where the records are and what shape they have.

    Attributes:
      input_patterns: file globs (local or gs://), e.g. from a comma-separated flag.
      max_seq_length, max_predictions_per_seq: must match the records.
      compression: "auto" (GZIP when the file name ends in .gz/.gzip), "GZIP", "ZLIB" or "".
      shuffle_buffer: records held by the training shuffle buffer.
      cycle_length: files read in parallel by one input pipeline.
      seed: shuffle seed; also makes the interleave deterministic (reproducible order).
      vocab_size, type_vocab_size: the model's tables; ids outside them fail with a
        message naming the feature and the bert_config key (None: not checked).
      masking: for unmasked records (create_pretraining_data --dynamic_masking): how to
        mask them on the fly (training/dynamic_masking.py); None for masked records.
    """

    input_patterns: Sequence[str]
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    compression: str = "auto"
    shuffle_buffer: int = 1000
    cycle_length: int = 8
    seed: int | None = None
    vocab_size: int | None = None
    type_vocab_size: int | None = None
    masking: dynamic_masking.DynamicMasking | None = None


def split_patterns(value: str) -> tuple[str, ...]:
    """Splits a comma-separated list of globs, dropping blanks."""
    return tuple(p.strip() for p in value.split(",") if p.strip())


# Summaries create_pretraining_data writes beside its records: `_NAME.summary.json` now
# (which `NAME*` does not match), `NAME.summary.json` before (which it did). Either is
# skipped wherever a wider glob such as `DIR/*` finds it.
NOT_RECORDS_SUFFIX = ".summary.json"
# Temporaries of an older create_pretraining_data (`NAME.tmp-PID`); today's are hidden
# names that `fileio.is_temporary` recognises.
_LEGACY_TEMPORARY = re.compile(r".*\.tmp-\d+")


def _not_records(path: str) -> bool:
    """Summaries and temporaries (of a run in progress, or killed) are never records."""
    return (path.endswith(NOT_RECORDS_SUFFIX) or fileio.is_temporary(path)
            or _LEGACY_TEMPORARY.fullmatch(fileio.basename(path)) is not None)


def list_files(patterns: Sequence[str]) -> list[str]:
    """Expands globs with tf.io.gfile (works on gs://); errors when nothing matches.

    Summary JSON files that create_pretraining_data writes beside its output and the
    temporaries of a writer (running, or killed) are skipped (with a log line), so
    `--input_file=out.tfrecord*` or `DIR/*` reads just the records.
    """
    files = []
    for pattern in patterns:
        matched = sorted(tf.io.gfile.glob(pattern))
        skipped = [path for path in matched if _not_records(path)]
        matched = [path for path in matched if not _not_records(path)]
        if skipped:
            logging.info("input_file %r: skipping %d summary or temporary file(s), e.g. %s",
                         pattern, len(skipped), skipped[0])
        if not matched:
            raise FileNotFoundError(f"input_file pattern {pattern!r} matches no file")
        files.extend(matched)
    return files


class RecordFileError(ValueError):
    """A damaged or truncated TFRecord file; the message names the file and the record."""


def find_damaged_record(files: Sequence[str], compression: str = "auto"):
    """(path, index of the first unreadable record, TensorFlow's message), or None.

    Reads the files in order, in batches (fast), then record by record inside the batch
    that fails, so the index is exact.
    """
    for path in files:
        comp = compression_of(path, compression)
        count = 0
        try:
            for batch in tf.data.TFRecordDataset(path, compression_type=comp).batch(4096):
                count += int(batch.shape[0])
            continue
        except tf.errors.DataLossError as err:
            message = str(err).strip().splitlines()[0]
        index = count
        try:
            for _ in tf.data.TFRecordDataset(path, compression_type=comp).skip(count):
                index += 1
        except tf.errors.DataLossError as err:
            message = str(err).strip().splitlines()[0]
        return path, index, message
    return None


@contextlib.contextmanager
def naming_damaged_files(patterns: Sequence[str], compression: str = "auto"):
    """Turns TensorFlow's DataLossError ("corrupted record at 12345", no file name) raised
    while reading `patterns` into a RecordFileError naming the file and record."""
    try:
        yield
    except tf.errors.DataLossError as err:
        files = list_files(patterns)
        logging.error("Damaged TFRecord data; scanning %d file(s) to find it", len(files))
        found = find_damaged_record(files, compression)
        if found is None:
            raise RecordFileError(f"damaged TFRecord data in {list(patterns)}: "
                                  f"{str(err).strip().splitlines()[0]}") from err
        path, index, message = found
        raise RecordFileError(
            f"{path}: TFRecord data is damaged or truncated at record {index} ({message}); "
            "regenerate or remove this file") from err


def compression_of(path: str, compression: str = "auto") -> str:
    """The TFRecord compression type for `path` ("GZIP", "ZLIB" or "")."""
    if compression and compression.lower() != "auto":
        return "" if compression.upper() == "NONE" else compression.upper()
    return "GZIP" if path.endswith((".gz", ".gzip")) else ""


def check_first_record(path: str, max_seq_length: int, max_predictions_per_seq: int,
                       compression: str = "auto"):
    """The record kind of `path` from its first record's features: `features.PRETRAINING`
    (masked) or `features.PRETRAINING_UNMASKED` (create_pretraining_data
    --dynamic_masking); None for an empty file. Raises ValueError if the record is
    neither or does not have the expected lengths."""
    dataset = tf.data.TFRecordDataset(path, compression_type=compression_of(path, compression))
    try:
        raw = next(iter(dataset.take(1)), None)
    except tf.errors.DataLossError as err:
        raise ValueError(f"{path}: not a readable TFRecord file "
                         f"(compression={compression_of(path, compression)!r}): {err}") from err
    if raw is None:
        return None  # An empty file contributes nothing; nothing to check.
    example = tf.train.Example.FromString(raw.numpy())
    schema = features.PRETRAINING if "masked_lm_positions" in example.features.feature \
        else features.PRETRAINING_UNMASKED
    expected = schema.lengths(max_seq_length=max_seq_length,
                              max_predictions_per_seq=max_predictions_per_seq)
    flags = {"input_ids": "max_seq_length", "input_mask": "max_seq_length",
             "segment_ids": "max_seq_length",
             "masked_lm_positions": "max_predictions_per_seq",
             "masked_lm_ids": "max_predictions_per_seq",
             "masked_lm_weights": "max_predictions_per_seq", "next_sentence_labels": "-"}
    for name, length in expected.items():
        if name not in example.features.feature:
            raise ValueError(f"{path}: first record has no feature {name!r}; found "
                             f"{sorted(example.features.feature)}")
        feature = example.features.feature[name]
        found = len(feature.float_list.value) if name == "masked_lm_weights" else len(
            feature.int64_list.value)
        if found != length:
            raise ValueError(
                f"{path}: feature {name!r} has length {found} in the first record but "
                f"{flags[name]} expects {length}; pass the {flags[name]} the records were "
                f"created with")
    return schema


def check_record_kind(schema, masking, path: str) -> None:
    """Unmasked records need `masking`; masked ones must not get it (it would be ignored)."""
    if schema is features.PRETRAINING_UNMASKED and masking is None:
        raise dynamic_masking.DynamicMaskingError(
            f"{path}: the records are unmasked (create_pretraining_data --dynamic_masking); "
            "masking them on the fly needs --vocab_file (the vocab they were made with)")
    if schema is features.PRETRAINING and masking is not None:
        raise dynamic_masking.DynamicMaskingError(
            f"{path}: the records are already masked; --vocab_file, --masked_lm_prob and "
            "--do_whole_word_mask are for unmasked records (create_pretraining_data "
            "--dynamic_masking) only")


def _parse_batch(serialized, spec):
    parsed = tf.io.parse_example(serialized, spec)
    # int64 on disk, int32 in memory (TPUs and XLA prefer int32).
    return {name: tf.cast(t, tf.int32) if t.dtype == tf.int64 else t
            for name, t in parsed.items()}


def pretraining_dataset(config: PretrainingInputConfig, *, batch_size: int, is_training: bool,
                        input_context: tf.distribute.InputContext | None = None,
                        check: bool = True) -> tf.data.Dataset:
    """Batched pretraining features for one replica.

    Args:
      config: files and shapes.
      batch_size: the batch of ONE replica (use `input_context.get_per_replica_batch_size`).
      is_training: shuffle and repeat forever; otherwise read the files once, in order.
      input_context: from `strategy.distribute_datasets_from_function`; shards the files
        (or, with fewer files than pipelines, the records) across input pipelines.
      check: check the first file's first record against the expected lengths and
        kind (unmasked records need `config.masking`, masked ones must not get it).

    Returns:
      Dataset of dicts with int32 [batch, max_seq_length] `input_ids`, `input_mask`,
      `segment_ids`; int32 [batch, P] `masked_lm_positions`, `masked_lm_ids`; float32
      [batch, P] `masked_lm_weights`; int32 [batch, 1] `next_sentence_labels`. With
      `config.masking` the records are unmasked pairs and the masked-LM features are
      drawn for each batch (training/dynamic_masking.py).
    """
    files = list_files(config.input_patterns)
    if check:
        schema = check_first_record(files[0], config.max_seq_length,
                                    config.max_predictions_per_seq, config.compression)
        if schema is not None:
            check_record_kind(schema, config.masking, files[0])
    compression = {compression_of(f, config.compression) for f in files}
    if len(compression) > 1:
        raise ValueError(f"input files mix compressed and uncompressed records: {files[:4]}...")
    compression = compression.pop()
    deterministic = config.seed is not None or not is_training

    shards, shard_id = 1, 0
    if input_context is not None:
        shards, shard_id = input_context.num_input_pipelines, input_context.input_pipeline_id
    shard_files = shards > 1 and len(files) >= shards

    dataset = tf.data.Dataset.from_tensor_slices(tf.constant(files))
    if shard_files:
        dataset = dataset.shard(shards, shard_id)
    if is_training:
        dataset = dataset.shuffle(len(files), seed=config.seed, reshuffle_each_iteration=True)
        dataset = dataset.repeat()
    read = lambda f: tf.data.TFRecordDataset(  # noqa: E731
        f, compression_type=compression, buffer_size=8 * 1024 * 1024)
    if is_training:
        dataset = dataset.interleave(read, cycle_length=max(1, min(config.cycle_length,
                                                                   len(files))),
                                     num_parallel_calls=tf.data.AUTOTUNE,
                                     deterministic=deterministic)
    else:  # Evaluation reads the files once, in order.
        dataset = dataset.flat_map(read)
    if shards > 1 and not shard_files:
        dataset = dataset.shard(shards, shard_id)
    if is_training:
        dataset = dataset.shuffle(config.shuffle_buffer, seed=config.seed)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    schema = features.pretraining_schema(dynamic_masking=config.masking is not None)
    spec = schema.parse_spec(max_seq_length=config.max_seq_length,
                             max_predictions_per_seq=config.max_predictions_per_seq)
    dataset = dataset.map(lambda s: _check_ids(_parse_batch(s, spec), config),
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    if config.masking is not None:  # a fresh mask per batch (training/dynamic_masking.py)
        dataset = dynamic_masking.apply(dataset, config.masking, shard_id, deterministic)
    options = tf.data.Options()
    options.deterministic = deterministic
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = dataset.with_options(options)
    return dataset.prefetch(tf.data.AUTOTUNE)


# --- Fine-tuning records (each task family's schema lives in its tasks/ package) --------------


# The row number of each eval/predict example, added by `finetuning_records` so that
# predictions can be put back in input order (buckets batch examples out of order) and
# padding rows (-1) dropped.
EXAMPLE_INDEX = "example_index"
ENCODER_SEQUENCE_FEATURES = ("input_ids", "input_mask", "segment_ids")


@dataclasses.dataclass(frozen=True)
class RecordsConfig:
    """A fine-tuning split's TFRecord file(s) and how to read them.

    Attributes:
      input_patterns: file globs (e.g. a task's `prepare_*_records(...).record_file`).
      parse_spec: the `tf.io.parse_example` spec of the task's record schema.
      shuffle_buffer: training shuffle buffer (the original: 100).
      seed: shuffle seed (reproducible order).
      sequence_features: the per-token features (last axis = max_seq_length) that length
        bucketing cuts to the bucket's length.
      bucket_boundaries: padded lengths, ascending, the last one max_seq_length; each batch
        holds examples of one bucket (real length <= its boundary, > the previous one) and
        is cut to that length. Empty: every batch padded to max_seq_length (the
        original's way).
      vocab_size, type_vocab_size: the model's table sizes; an id outside them fails with
        a message naming the feature and the bert_config key (None: not checked).
    """

    input_patterns: Sequence[str]
    parse_spec: dict
    shuffle_buffer: int = 100
    seed: int | None = None
    sequence_features: Sequence[str] = ENCODER_SEQUENCE_FEATURES
    bucket_boundaries: Sequence[int] = ()
    vocab_size: int | None = None
    type_vocab_size: int | None = None


def default_bucket_boundaries(max_seq_length: int) -> tuple[int, ...]:
    """Powers of two from 16 below max_seq_length, then max_seq_length: (16, 32, 64, 128)."""
    out, length = [], 16
    while length < max_seq_length:
        out.append(length)
        length *= 2
    return tuple(out) + (int(max_seq_length),)


def bucket_batch_size(batch_size: int, length: int, max_seq_length: int) -> int:
    """Rows of an evaluation or prediction batch of length bucket `length`.

    As many tokens as a batch padded to max_seq_length holds, in whole multiples of
    `batch_size`: batch_size x (max_seq_length // length), so (16, 32, 64, 128) at 128 get
    8x, 4x, 2x and 1x the rows. Short batches of a small model leave the matmuls too
    small to run at full speed (bench/RESULTS.md, length bucketing); attention, quadratic
    in the length, costs less than in the padded batch. Each example's outputs do not depend on the rows beside it. Training keeps
    `batch_size` rows in every bucket: its batch size is an optimisation setting.
    """
    return int(batch_size) * max(1, int(max_seq_length) // int(length))


def check_bucket_boundaries(boundaries: Sequence[int], max_seq_length: int) -> tuple:
    """Sorted, unique boundaries ending at max_seq_length; ValueError naming the flag."""
    values = sorted({int(b) for b in boundaries})
    if not values or values[0] < 1 or values[-1] > max_seq_length:
        raise ValueError(f"--bucket_boundaries={','.join(map(str, boundaries))}: lengths must "
                         f"be in [1, --max_seq_length={max_seq_length}]")
    if values[-1] != max_seq_length:
        values.append(int(max_seq_length))
    return tuple(values)


def _check_ids(example, config):
    """Fails on ids the model's tables do not have, naming the feature and config key."""
    checks = []
    if config.vocab_size is not None and "input_ids" in example:
        checks.append(tf.debugging.assert_less(
            example["input_ids"], tf.constant(config.vocab_size, example["input_ids"].dtype),
            message=f"input_ids holds an id >= vocab_size={config.vocab_size} of "
                    f"bert_config.json: the records {list(config.input_patterns)[:2]} were "
                    "made with another vocab.txt"))
    if config.type_vocab_size is not None and "segment_ids" in example:
        checks.append(tf.debugging.assert_less(
            example["segment_ids"],
            tf.constant(config.type_vocab_size, example["segment_ids"].dtype),
            message=f"segment_ids holds an id >= type_vocab_size={config.type_vocab_size} "
                    "of bert_config.json"))
    if not checks:
        return example
    with tf.control_dependencies(checks):
        return {name: tf.identity(t) for name, t in example.items()}


def finetuning_records(config: RecordsConfig, *, batch_size: int, is_training: bool,
                       input_context: tf.distribute.InputContext | None = None,
                       drop_remainder: bool = True, pad_to_batch: bool = False,
                       pad_to_multiple: int | None = None) -> tf.data.Dataset:
    """One record file set -> sharded, (shuffled, repeated,) batched, parsed dicts.

    Shared by the fine-tuning tasks: their files are small, so they are sharded by record
    (not by file) across input pipelines, in the order given. Training repeats and
    shuffles; evaluation and prediction read the records once and add `example_index`
    (the row number; -1 on padding rows).

    With `config.bucket_boundaries`, each batch holds examples of one length bucket and
    its per-token features are cut to the bucket's length (attention masks make the
    padding inert: the results equal padding to max_seq_length). Training keeps a proper
    shuffle: examples are shuffled first, then each bucket fills its batch in that order,
    so buckets mix across the epoch. Evaluation and prediction batches come bucket by
    bucket, out of input order: `TrainingLoop.predict(..., order_key=EXAMPLE_INDEX)` puts
    the rows back; a bucket's batches there hold `bucket_batch_size` rows (as many tokens
    as a padded batch), `batch_size` in the longest bucket.

    Args:
      config: files, schema, shuffling, bucketing.
      batch_size: per-replica batch for training (`input_context.get_per_replica_batch_size`);
        for `TrainingLoop.predict` the GLOBAL batch.
      is_training: shuffle and repeat forever.
      input_context: shards the records across input pipelines (training).
      drop_remainder: drop a last short batch (static shapes).
      pad_to_batch: pad a last short batch (with bucketing: each bucket's last batch) with
        all-zero rows (`example_index` -1) to `batch_size` (with bucketing: the bucket's
        `bucket_batch_size`) instead.
      pad_to_multiple: with bucketing, when not training: pad each bucket's last batch only
        to a multiple of this (e.g. the number of replicas) instead of `batch_size`, so a
        small bucket does not cost a whole batch (shapes vary; off TPU only).

    Returns:
      Dataset of dicts of the schema's features (int64 on disk -> int32) plus, when not
      training, int32 [batch] `example_index`.
    """
    files = list_files(config.input_patterns)
    deterministic = config.seed is not None or not is_training
    spec = config.parse_spec
    dataset = tf.data.TFRecordDataset(files)
    if input_context is not None and input_context.num_input_pipelines > 1:
        dataset = dataset.shard(input_context.num_input_pipelines,
                                input_context.input_pipeline_id)
    if is_training:
        dataset = dataset.repeat()
        dataset = dataset.shuffle(config.shuffle_buffer, seed=config.seed)
    else:
        dataset = dataset.enumerate()
    if config.bucket_boundaries:
        dataset = _bucketed(dataset, config, batch_size, is_training,
                            drop_remainder=drop_remainder or is_training,
                            pad_to_batch=pad_to_batch and not is_training,
                            pad_to_multiple=None if is_training else pad_to_multiple,
                            deterministic=deterministic)
    else:
        dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
        dataset = dataset.map(lambda *b: _parse_rows(b, spec, config, is_training),
                              num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
        if pad_to_batch:
            dataset = dataset.map(lambda b: _pad_batch(b, batch_size))
    options = tf.data.Options()
    options.deterministic = deterministic
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


def _parse_rows(rows, spec, config, is_training, single=False):
    """(serialized,) or (index, serialized), a batch or (`single`) one record -> parsed dict
    (+ example_index when not training), ids checked against the model's tables."""
    index, serialized = (None, rows[0]) if is_training else rows
    if single:
        parsed = tf.io.parse_single_example(serialized, spec)
        out = {name: tf.cast(t, tf.int32) if t.dtype == tf.int64 else t
               for name, t in parsed.items()}
    else:
        out = _parse_batch(serialized, spec)
    if index is not None:
        out[EXAMPLE_INDEX] = tf.cast(index, tf.int32)
    return _check_ids(out, config)


def _example_length(example):
    """Real tokens of an example (for [choices, seq] inputs: its longest choice)."""
    mask = example["input_mask"]
    return tf.reduce_max(tf.reshape(tf.reduce_sum(mask, axis=-1), [-1]))


# Records parsed together before length bucketing (see `_bucketed`).
PARSE_BLOCK = 256


def _bucketed(dataset, config, batch_size, is_training, *, drop_remainder, pad_to_batch,
              deterministic, pad_to_multiple=None):
    boundaries = tf.constant(list(config.bucket_boundaries), tf.int32)
    if is_training:
        rows_per_bucket = [batch_size] * len(config.bucket_boundaries)
    else:
        rows_per_bucket = [bucket_batch_size(batch_size, length, config.bucket_boundaries[-1])
                           for length in config.bucket_boundaries]
    bucket_rows = tf.constant(rows_per_bucket, tf.int64)

    def parse_block(*rows):
        return _parse_rows(rows, config.parse_spec, config, is_training)

    def bucket(example):
        length = _example_length(example)
        index = tf.searchsorted(boundaries, tf.reshape(length, [1]), side="left")[0]
        return tf.cast(tf.minimum(index, len(config.bucket_boundaries) - 1), tf.int64)

    def cut(key, batch):
        length = tf.gather(boundaries, key)
        out = {}
        for name, t in batch.items():
            out[name] = t[..., :length] if name in config.sequence_features else t
        return out

    def batch_window(key, window):
        # Training: the int, so that drop_remainder gives a static batch dimension.
        size = batch_size if is_training else tf.gather(bucket_rows, key)
        batched = window.batch(size, drop_remainder=drop_remainder)
        if pad_to_multiple:
            batched = batched.map(lambda b: _pad_batch(b, size, pad_to_multiple))
        elif pad_to_batch:
            batched = batched.map(lambda b: _pad_batch(b, size))
        return batched.map(lambda b: cut(key, b))

    # Parsed a block of records at a time (one vectorised parse_example instead of one
    # parse_single_example per record), then split into examples again for bucketing.
    dataset = dataset.batch(PARSE_BLOCK).map(
        parse_block, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    dataset = dataset.unbatch()
    return dataset.group_by_window(bucket, batch_window,
                                   window_size_func=lambda key: tf.gather(bucket_rows, key))


def _pad_batch(batch, batch_size, multiple=None):
    """Pads a (last, short) batch with rows of zeros to `batch_size` (a static batch
    dimension when it is an int, not a tensor), or with `multiple` to the next multiple of
    it (at most `batch_size`).

    Zero rows carry no example: `example_index` is -1 on them, and a task can also drop
    them by a feature no real row has zero (SQuAD's `unique_ids` start at 1000000000;
    `is_real_example` is 1 for real rows).
    """
    out = {}
    for name, t in batch.items():
        rows = tf.shape(t, out_type=tf.int64)[0]
        target = batch_size if multiple is None else (rows + multiple - 1) // multiple * multiple
        paddings = [[0, target - rows]] + [[0, 0]] * (t.shape.rank - 1)
        padded = tf.pad(t, paddings, constant_values=-1 if name == EXAMPLE_INDEX else 0)
        static = batch_size if multiple is None and isinstance(batch_size, int) else None
        out[name] = tf.ensure_shape(padded, [static] + t.shape.as_list()[1:])
    return out


