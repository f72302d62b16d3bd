"""Owns the tf.data pipelines that feed pretraining and fine-tuning TFRecords to the loop.

Files are listed with `tf.io.gfile` (local paths and gs:// alike), sharded per input
pipeline (worker) through the `tf.distribute.InputContext`, read with a parallel
interleave, shuffled, repeated for training, batched per replica with `drop_remainder`
(static shapes for TPU and XLA), parsed in batches and prefetched. The checks of the
records (the first record of every file against the flags before any graph is built,
the ids inside the pipeline, the record that broke it named afterwards) are
`training.record_checks`."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import tensorflow as tf

from data_prep import features, fileio
from data_prep.cli import UserError
from training import dynamic_masking, record_checks

# tf.data's functions here are graph code as written (no Python branch on a tensor):
# AutoGraph's source rewriting of them cost a fresh process ~0.5 s before its first batch.
unconverted = tf.autograph.experimental.do_not_convert


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
      read_unmasked: the records are unmasked and read as they are, with no masking (the
        left-to-right LM predicts every token of them).
      autotune: tf.data's autotuning model (TensorFlow's default; see `_finished`).
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
    read_unmasked: bool = False
    autotune: bool = True


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
      check: check every file's first record against the expected lengths, kind
        (unmasked records need `config.masking`, masked ones must not get it) and ids
        (`record_checks.check_pretraining_files`); a runner that has checked them passes False.

    Returns:
      Dataset of dicts with int32 [batch, max_seq_length] `input_ids`, `input_mask`,
      `segment_ids`; int32 [batch, P] `masked_lm_positions`, `masked_lm_ids`; float32
      [batch, P] `masked_lm_weights`; int32 [batch, 1] `next_sentence_labels`. With
      `config.masking` the records are unmasked pairs and the masked-LM features are
      drawn for each batch (training/dynamic_masking.py); with `config.read_unmasked`
      the unmasked features alone (no masked-LM features).
    """
    files = record_checks.list_files(config.input_patterns)
    if check:
        schema = record_checks.check_pretraining_files(
            files, config.max_seq_length, config.max_predictions_per_seq,
            config.compression, limits=record_checks.limits_of(config))
        if schema is not None:
            record_checks.check_record_kind(schema, config.masking, files[0],
                                            config.read_unmasked)
    compression = {record_checks.compression_of(f, config.compression) for f in files}
    if len(compression) > 1:
        raise UserError(f"input files mix compressed and uncompressed records: {files[:4]}...")
    compression = compression.pop()
    deterministic = config.seed is not None or not is_training

    shards, shard_id = 1, 0
    if input_context is not None:
        shards, shard_id = input_context.num_input_pipelines, input_context.input_pipeline_id
    shard_files = shards > 1 and len(files) >= shards

    dataset = tf.data.Dataset.from_tensor_slices(tf.constant(files))
    if shard_files:
        dataset = dataset.shard(shards, shard_id)
    read = lambda f: tf.data.TFRecordDataset(  # noqa: E731
        f, compression_type=compression, buffer_size=8 * 1024 * 1024)
    if is_training:
        dataset = dataset.shuffle(len(files), seed=config.seed, reshuffle_each_iteration=True)
        dataset = dataset.interleave(read, cycle_length=max(1, min(config.cycle_length,
                                                                   len(files))),
                                     num_parallel_calls=tf.data.AUTOTUNE,
                                     deterministic=deterministic)
        # Whole passes over the files, repeated: a pass without a record (files emptied
        # during a run) ends the input (tf.data's repeat stops on an empty pass), where
        # file names repeated under the interleave made it look for a record forever,
        # inside the compiled training call, deaf to SIGTERM and Ctrl-C.
        dataset = dataset.repeat()
    else:  # Evaluation reads the files once, in order.
        dataset = dataset.flat_map(read)
    if shards > 1 and not shard_files:
        dataset = dataset.shard(shards, shard_id)
    if is_training:
        dataset = dataset.shuffle(config.shuffle_buffer, seed=config.seed)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    schema = features.pretraining_schema(
        dynamic_masking=config.masking is not None or config.read_unmasked)
    spec = schema.parse_spec(max_seq_length=config.max_seq_length,
                             max_predictions_per_seq=config.max_predictions_per_seq)
    parse = features.parse_with_spec
    dataset = dataset.map(unconverted(lambda s: record_checks.check_ids(parse(s, spec), config)),
                          num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    if config.masking is not None:  # a fresh mask per batch (training/dynamic_masking.py)
        dataset = dynamic_masking.apply(dataset, config.masking, shard_id, deterministic)
    return _finished(dataset, deterministic, config.autotune)


def pretraining_input_identity(config: PretrainingInputConfig, batch_size: int) -> dict:
    """What a pretraining training input is (`TrainingLoop.train`'s input_identity): what
    the saved position of its iterator means. The files by name, in order (a moved
    directory is the same input; the position counts files and records) and size (a file
    replaced under its name: a position past its end, or in other records), the GLOBAL
    batch size, the seed and every setting that changes the stream of batches."""
    masking = config.masking
    files = record_checks.list_files(config.input_patterns)
    identity = {
        "kind": "pretraining",
        "files": [fileio.basename(path) for path in files],
        "file_sizes": [fileio.getsize(path) for path in files],
        "batch_size": int(batch_size), "seed": config.seed,
        "max_seq_length": config.max_seq_length,
        "max_predictions_per_seq": config.max_predictions_per_seq,
        "shuffle_buffer": config.shuffle_buffer, "cycle_length": config.cycle_length,
        "masking": None if masking is None else {
            "masked_lm_prob": masking.masked_lm_prob,
            "do_whole_word_mask": masking.do_whole_word_mask,
            "vocab_entries": len(masking.vocab.replacement_ids),
            # Only when not the original's split: checkpoints of default runs keep the
            # identity they were saved with (and resume).
            **({} if (masking.mask_token_rate, masking.random_token_rate) == (0.8, 0.1)
               else {"mask_token_rate": masking.mask_token_rate,
                     "random_token_rate": masking.random_token_rate})},
    }
    if config.read_unmasked:
        identity["read_unmasked"] = True
    return identity


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
      autotune: tf.data's autotuning model (TensorFlow's default; see `_finished`).
    """

    input_patterns: Sequence[str]
    parse_spec: dict
    shuffle_buffer: int = 100
    seed: int | None = None
    sequence_features: Sequence[str] = ENCODER_SEQUENCE_FEATURES
    bucket_boundaries: Sequence[int] = ()
    vocab_size: int | None = None
    type_vocab_size: int | None = None
    autotune: bool = True


def records_input_identity(config: RecordsConfig, batch_size: int) -> dict:
    """What a fine-tuning training input is (`TrainingLoop.train`'s input_identity): the
    record files by name, in order, the GLOBAL batch size, the seed, the shuffle buffer,
    the length buckets and the features read."""
    return {
        "kind": "records",
        "files": [fileio.basename(path)
                  for path in record_checks.list_files(config.input_patterns)],
        "batch_size": int(batch_size), "seed": config.seed,
        "shuffle_buffer": config.shuffle_buffer,
        "bucket_boundaries": [int(b) for b in config.bucket_boundaries],
        "features": sorted(config.parse_spec),
    }


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
    files = record_checks.list_files(config.input_patterns)
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
        dataset = dataset.map(unconverted(lambda *b: _parse_rows(b, spec, config, is_training)),
                              num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
        if pad_to_batch:
            dataset = dataset.map(unconverted(lambda b: _pad_batch(b, batch_size)))
    return _finished(dataset, deterministic, config.autotune)


def _parse_rows(rows, spec, config, is_training):
    """(serialized,) or (index, serialized) of a batch -> parsed dict (int32 in memory, as
    `features.parse_with_spec` gives; + example_index when not training), ids checked
    against the model's tables."""
    index, serialized = (None, rows[0]) if is_training else rows
    out = features.parse_with_spec(serialized, spec)
    if index is not None:
        out[EXAMPLE_INDEX] = tf.cast(index, tf.int32)
    return record_checks.check_ids(out, config)


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
            batched = batched.map(unconverted(lambda b: _pad_batch(b, size, pad_to_multiple)))
        elif pad_to_batch:
            batched = batched.map(unconverted(lambda b: _pad_batch(b, size)))
        return batched.map(unconverted(lambda b: cut(key, b)))

    # Parsed a block of records at a time (one vectorised parse_example instead of one
    # parse_single_example per record), then split into examples again for bucketing.
    dataset = dataset.batch(PARSE_BLOCK).map(
        unconverted(parse_block), num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    dataset = dataset.unbatch()
    return dataset.group_by_window(
        unconverted(bucket), unconverted(batch_window),
        window_size_func=unconverted(lambda key: tf.gather(bucket_rows, key)))


# Whether this process's input pipelines may run tf.data's autotuning model at all (each
# config's `autotune`, the runners' --tf_data_autotune, decides when True). The test
# suite sets it False (tests/conftest.py): the model's thread sleeps between
# optimisations, the sleep doubling up to a minute, and an iterator's deletion waits for
# the sleep to end; tests keep iterators in fixtures and reference cycles long after
# their last read, and freeing one stalled whichever test it fell in (CPU idle).
AUTOTUNE_MODEL = True


def _finished(dataset: tf.data.Dataset, deterministic: bool,
              autotune: bool = True) -> tf.data.Dataset:
    """The options every input pipeline ends with, then a prefetch.

    Sharding is done by the builders (auto-sharding off). tf.data's autotuning model stays
    on (TensorFlow's default) unless `autotune` is False (`--tf_data_autotune=false`) or
    the process turned it off (`AUTOTUNE_MODEL`): then `AUTOTUNE` parallelism stays at
    min(16, schedulable cores), with no model thread.
    """
    options = tf.data.Options()
    options.deterministic = deterministic
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    if not (autotune and AUTOTUNE_MODEL):
        options.autotune.enabled = False
    return dataset.with_options(options).prefetch(tf.data.AUTOTUNE)


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


