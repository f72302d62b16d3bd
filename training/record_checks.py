"""Owns the checks of a run's TFRecord files: which files, their first records, the record that broke a pipeline.

Before any graph is built, the first record of every file is checked (its kind, its
feature lengths, its ids: `check_pretraining_files`, `check_record_kind`, `id_limits`),
so a wrong `max_seq_length`, a mix of masked and unmasked records or records of another
vocab is a one-line error naming the file instead of a crash deep inside a step. What
only a later record shows (a damaged record, an id beyond the model's tables, another
length) fails inside tf.data with no file name (`check_ids` puts the id check in the
pipeline); `naming_bad_records` then finds the record and names its file. The pipelines
themselves are `training.input_pipeline`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf
from absl import logging

from data_prep import features, fileio
from data_prep.cli import UserError
from training import dynamic_masking


# Summaries create_pretraining_data writes beside its records (`_NAME.summary.json`, which
# `NAME*` does not match), skipped wherever a wider glob such as `DIR/*` finds them.
NOT_RECORDS_SUFFIX = ".summary.json"


def _not_records(path: str) -> bool:
    """Summaries and temporaries (of a run in progress, or killed) are never records."""
    return path.endswith(NOT_RECORDS_SUFFIX) or fileio.is_temporary(path)


def list_files(patterns: Sequence[str], flag: str = "--input_file") -> list[str]:
    """Expands globs with tf.io.gfile (works on gs://); errors naming `flag` when nothing
    matches.

    Summary JSON files that create_pretraining_data writes beside its output, the
    temporaries of a writer (running, or killed) and folders are skipped (with a log
    line), so `--input_file=out.tfrecord*` or `DIR/*` reads just the records; a pattern
    that names a directory itself is refused (RecordFileError naming `flag`).
    """
    files = []
    for pattern in patterns:
        if not any(char in pattern for char in "*?[") and tf.io.gfile.isdir(pattern):
            raise RecordFileError(f"{flag}={pattern} is a directory; pass its record files, "
                                  f"e.g. {flag}='{pattern.rstrip('/')}/*.tfrecord'")
        matched = sorted(tf.io.gfile.glob(pattern))
        # A wider glob (DIR/*) may match folders too: they hold no records of their own.
        skipped = [path for path in matched if _not_records(path) or tf.io.gfile.isdir(path)]
        matched = [path for path in matched if path not in skipped]
        if skipped:
            logging.info("%s %r: skipping %d summary, temporary or folder path(s), e.g. %s",
                         flag, pattern, len(skipped), skipped[0])
        if not matched:
            raise UserError(f"{flag} pattern {pattern!r} matches no file")
        files.extend(matched)
    return files


def record_summaries(files: Sequence[str]) -> dict:
    """{summary path: its JSON} of the create_pretraining_data (or Beam) summaries beside
    `files` that list any of them among their `output_files`: what the records were made
    with (`config.next_sentence_prediction`, `dynamic_masking`, ...). Records without a
    summary (written elsewhere, or copied without it) give none; an unreadable summary is
    skipped with a warning (it only informs checks)."""
    import json

    names = {fileio.basename(path) for path in files}
    found = {}
    for directory in sorted({fileio.parent_dir(path) for path in files}):
        for path in fileio.glob(f"{directory}/*{NOT_RECORDS_SUFFIX}"):
            try:
                summary = json.loads(fileio.read_text(path))
                outputs = {fileio.basename(str(o)) for o in summary.get("output_files") or ()}
            except (ValueError, OSError, tf.errors.OpError, AttributeError, TypeError) as err:
                logging.warning("%s: not a readable records summary (%s); skipped", path, err)
                continue
            if outputs & names:
                found[path] = summary
    return found


class RecordFileError(UserError):
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


@dataclasses.dataclass(frozen=True)
class IdLimit:
    """Ids of `feature` must be below `bound`, a size of the model or of a vocab.

    Attributes:
      source: the bound and where it comes from, for messages ("vocab_size=30522 of
        --bert_config_file=bert_config.json").
      hint: what to do about a record beyond it.
    """

    feature: str
    bound: int
    source: str
    hint: str = ""


def id_limits(*, vocab_size: int | None = None, type_vocab_size: int | None = None,
              masking: dynamic_masking.DynamicMasking | None = None,
              bert_config_file: str | None = None) -> tuple:
    """The `IdLimit`s of the records a model with these tables reads (None: unchecked);
    with `masking`, input_ids must also be ids of its vocab (it draws from it)."""
    config = f"--bert_config_file={bert_config_file}" if bert_config_file else \
        "bert_config.json"
    limits = []
    if vocab_size is not None:
        for feature in ("input_ids", "masked_lm_ids"):  # the tokens, and the masked ones
            limits.append(IdLimit(
                feature, int(vocab_size), f"vocab_size={vocab_size} of {config}",
                "the records were made with another vocab.txt than the model's"))
    if masking is not None:
        size = len(masking.vocab.is_continuation)
        vocab = f"--vocab_file={masking.vocab_file}" if masking.vocab_file else "the vocab"
        limits.append(IdLimit(
            "input_ids", size, f"the {size} tokens of {vocab}",
            "the records were made with another vocab: pass the vocab.txt they were made "
            "with"))
    if type_vocab_size is not None:
        limits.append(IdLimit("segment_ids", int(type_vocab_size),
                              f"type_vocab_size={type_vocab_size} of {config}",
                              "the model has no segment embedding for it"))
    return tuple(limits)


# Where TensorFlow's errors inside tf.data come from a record that does not fit: our id
# check (`check_ids`) and parse_example on another length.
_ID_CHECK_MARK = " holds an id >= "
_PARSE_ERRORS = ("Can't parse serialized Example", "values != expected")


@contextlib.contextmanager
def naming_bad_records(patterns: Sequence[str], compression: str = "auto", *,
                       limits: Sequence[IdLimit] = (), lengths: Mapping | None = None):
    """Turns errors TensorFlow raises inside tf.data with no file name into a
    RecordFileError naming the file, the record and what is wrong with it.

    DataLossError ("corrupted record at 12345"): a damaged or truncated file. An id check
    failing (`limits`) or parse_example failing on another length (`lengths`: feature ->
    (length, flag)): the files are read again, on the host, to find the first such record.

    Args:
      patterns: the globs the failing pipeline reads.
      limits: the `IdLimit`s the pipeline checks.
      lengths: each feature's expected length and the flag that sets it (pretraining's
        `record_lengths`); None: lengths not checked.
    """
    try:
        yield
    except tf.errors.OutOfRangeError as err:
        # A training input read a whole pass of its files without a record (emptied
        # since the run checked them): it ends rather than look for one forever.
        raise RecordFileError(f"{_no_record(list_files(patterns))}; they held records when "
                              "the run started") from err
    except tf.errors.DataLossError as err:
        files = list_files(patterns)
        logging.error("Damaged TFRecord data; scanning %d file(s) to find it", len(files))
        found = find_damaged_record(files, compression)
        if found is None:
            # Every record reads from its file's start: the reader was somewhere else, at
            # the position a resumed run restored (or in a file being rewritten).
            at = re.search(r"corrupted record at (\d+)", str(err))
            changed = _split_inside_a_record(files, int(at.group(1)), compression) if at \
                else []
            named = changed or files
            raise RecordFileError(
                f"{_listed(named)}: every record reads from the start, but reading on from where "
                f"the run was failed ({_reason(err)}): "
                f"{'the file' if len(named) == 1 else 'a file'} changed since the "
                "checkpoint whose input position this run resumed from (other records "
                "under the same name and size), or while it was read; put back the "
                "records the run was trained on, or start a new --output_dir with "
                "--init_checkpoint=<that checkpoint>") from err
        path, index, message = found
        raise RecordFileError(
            f"{path}: TFRecord data is damaged or truncated at record {index} ({message}); "
            "regenerate or remove this file") from err
    except tf.errors.InvalidArgumentError as err:
        text = str(err)
        if _ID_CHECK_MARK not in text and not any(m in text for m in _PARSE_ERRORS):
            raise
        files = list_files(patterns)
        logging.error("A record does not fit the model; scanning %d file(s) to find it",
                      len(files))
        found = find_bad_record(files, compression, limits=limits, lengths=lengths)
        if found is None:
            raise
        path, index, message = found
        raise RecordFileError(f"{path}: record {index} {message}") from None


def _split_inside_a_record(files: Sequence[str], offset: int, compression: str) -> list:
    """The uncompressed files in which byte `offset` falls inside a record: where a reader
    that went on from `offset` (a saved position) met other records than it read there."""
    out = []
    for path in files:
        if compression_of(path, compression) or offset >= fileio.getsize(path):
            continue
        start, boundary = 0, offset == 0
        for batch in tf.data.TFRecordDataset(path).batch(4096):
            # A record's frame: its length (8 bytes) and CRC (4), the data, its CRC (4).
            ends = start + np.cumsum(tf.strings.length(batch).numpy().astype(np.int64) + 16)
            boundary = boundary or offset in ends
            start = int(ends[-1])
            if start >= offset:
                break
        if not boundary:
            out.append(path)
    return out


def _reason(err: tf.errors.OpError) -> str:
    """The line of a TensorFlow error that says what failed (not "Graph execution error:",
    nor the function node it failed in)."""
    lines = [re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", line).strip()
             for line in str(err.message).splitlines()]
    lines = [line for line in lines if line and line != "Graph execution error:"]
    return lines[0] if lines else type(err).__name__


def find_bad_record(files: Sequence[str], compression: str = "auto", *,
                    limits: Sequence[IdLimit] = (), lengths: Mapping | None = None):
    """(path, record index, what is wrong) of the first record with a feature of another
    length than `lengths` says or an id at or beyond a limit; None if every record fits."""
    lengths = dict(lengths or {})
    names = {limit.feature for limit in limits} | set(lengths)
    spec = {name: tf.io.RaggedFeature(tf.float32 if name == "masked_lm_weights" else tf.int64)
            for name in sorted(names)}
    if not spec:
        return None
    for path in files:
        start = 0
        dataset = tf.data.TFRecordDataset(path, compression_type=compression_of(
            path, compression)).batch(4096)
        for batch in dataset:
            parsed = tf.io.parse_example(batch, spec)
            problems = []  # (row, message)
            for name, (length, flag) in lengths.items():
                found = parsed[name].row_lengths().numpy()
                for row in np.nonzero(found != length)[0][:1]:
                    problems.append((row, _length_message(name, int(found[row]), length,
                                                          flag)))
            for limit in limits:
                values = parsed[limit.feature]
                largest = tf.reduce_max(values, axis=1).numpy() if values.shape[0] else []
                for row in np.nonzero(np.asarray(largest) >= limit.bound)[0][:1]:
                    problems.append((row, (
                        f"has {limit.feature} id {int(largest[row])}, beyond {limit.source}"
                        + (f"; {limit.hint}" if limit.hint else ""))))
            if problems:
                row, message = min(problems, key=lambda p: p[0])
                return path, start + int(row), message
            start += int(batch.shape[0])
    return None


def _length_message(name: str, found: int, expected: int, flag: str | None) -> str:
    """What is wrong with a feature of another length, and which flag fixes it."""
    if not flag:
        return f"has {name} of length {found}, {expected} expected"
    return (f"has {name} of length {found} but {flag} expects {expected}; pass the {flag} "
            "the records were created with (every file of one run needs the same)")


def compression_of(path: str, compression: str = "auto") -> str:
    """The TFRecord compression type for `path` ("GZIP", "ZLIB" or "")."""
    if compression and compression.lower() != "auto":
        return "" if compression.upper() == "NONE" else compression.upper()
    return "GZIP" if path.endswith((".gz", ".gzip")) else ""


def record_lengths(schema, max_seq_length: int, max_predictions_per_seq: int,
                   flag_prefix: str = "") -> dict:
    """Feature -> (its length in the records of `schema`, the flag that sets it: `--` +
    `flag_prefix` + max_seq_length or max_predictions_per_seq, e.g. phase 2's
    `--phase2_max_seq_length`)."""
    sizes = {"max_seq_length": max_seq_length,
             "max_predictions_per_seq": max_predictions_per_seq}
    return {f.name: (f.resolve_length(sizes),
                     f"--{flag_prefix}{f.length}" if isinstance(f.length, str) else None)
            for f in schema.features}


def _schema_of(example) -> "features.RecordSchema":
    """Masked (`features.PRETRAINING`) or unmasked records, from one record's features."""
    return features.PRETRAINING if "masked_lm_positions" in example.features.feature \
        else features.PRETRAINING_UNMASKED


def _check_example(path: str, example, schema, max_seq_length: int,
                   max_predictions_per_seq: int, limits: Sequence[IdLimit] = (),
                   flag_prefix: str = "") -> None:
    """Raises RecordFileError naming `path` when its first record lacks a feature of
    `schema`, has another length than the flags say (`record_lengths`), or an id beyond
    `limits`."""
    feature_map = example.features.feature
    for name, (length, flag) in record_lengths(schema, max_seq_length, max_predictions_per_seq,
                                               flag_prefix).items():
        if name not in feature_map:
            raise RecordFileError(f"{path}: first record has no feature {name!r}; found "
                                  f"{sorted(feature_map)}")
        feature = feature_map[name]
        found = len(feature.float_list.value) if name == "masked_lm_weights" else len(
            feature.int64_list.value)
        if found != length:
            raise RecordFileError(f"{path}: first record "
                                  + _length_message(name, found, length, flag))
    for limit in limits:
        if limit.feature not in feature_map:
            continue
        values = feature_map[limit.feature].int64_list.value
        if values and max(values) >= limit.bound:
            raise RecordFileError(
                f"{path}: first record has {limit.feature} id {max(values)}, beyond "
                f"{limit.source}" + (f"; {limit.hint}" if limit.hint else ""))


def _first_record(path: str, compression: str):
    """The first record of `path` as a `tf.train.Example` (None: an empty file)."""
    dataset = tf.data.TFRecordDataset(path, compression_type=compression_of(path, compression))
    try:
        raw = next(iter(dataset.take(1)), None)
    except tf.errors.DataLossError as err:
        raise RecordFileError(
            f"{path}: not a readable TFRecord file (compression="
            f"{compression_of(path, compression)!r}): {err}") from err
    return None if raw is None else tf.train.Example.FromString(raw.numpy())


def _first_records(files: Sequence[str], compression: str) -> dict:
    """path -> serialized first record (absent: an empty file), read in parallel: a corpus
    of a thousand shards on a bucket is a thousand round trips."""
    out = {}
    by_type: dict = {}
    for path in files:
        by_type.setdefault(compression_of(path, compression), []).append(path)
    for comp, group in by_type.items():
        dataset = tf.data.Dataset.from_tensor_slices(tf.constant(group)).interleave(
            _first_of(comp), cycle_length=min(16, len(group)),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
        try:
            for path, record in dataset:
                out[path.numpy().decode("utf-8")] = record.numpy()
        except tf.errors.DataLossError:
            for path in group:  # one by one, to name the file
                example = _first_record(path, compression)
                if example is not None:
                    out[path] = example.SerializeToString()
    return out


def _first_of(compression: str):
    """file name -> a dataset of (file name, its first record) (none for an empty file)."""
    def first(path):
        return tf.data.TFRecordDataset(path, compression_type=compression).take(1).map(
            lambda record: (path, record))
    return first


def check_pretraining_files(files: Sequence[str], max_seq_length: int,
                            max_predictions_per_seq: int, compression: str = "auto",
                            limits: Sequence[IdLimit] = (), flag_prefix: str = ""):
    """The record kind of every file, from its first record; raises RecordFileError when
    no file holds a record (nothing to train or evaluate on), naming a file whose first
    record does not fit the flags (lengths, ids beyond `limits`), or one file of each kind
    when masked and unmasked records are mixed (the masked ones would be masked again,
    silently). `flag_prefix`: the flags named are `--{flag_prefix}input_file` and the like
    (phase 2's: "phase2_")."""
    records = _first_records(files, compression)
    if not records:
        raise RecordFileError(f"--{flag_prefix}input_file: {_no_record(files)}")
    kinds = {}
    for path in files:
        if path in records:
            kinds[path] = _schema_of(tf.train.Example.FromString(records[path]))
    masked = [path for path, schema in kinds.items() if schema is features.PRETRAINING]
    unmasked = [path for path, schema in kinds.items()
                if schema is features.PRETRAINING_UNMASKED]
    if masked and unmasked:
        raise RecordFileError(
            f"the input files mix masked records ({masked[0]}"
            f"{f' and {len(masked) - 1} more' if len(masked) > 1 else ''}) and unmasked ones "
            f"({unmasked[0]}{f' and {len(unmasked) - 1} more' if len(unmasked) > 1 else ''}"
            ", create_pretraining_data --dynamic_masking); a run reads one kind: make them "
            f"all the same way or pass only one kind in --{flag_prefix}input_file")
    for path, schema in kinds.items():
        _check_example(path, tf.train.Example.FromString(records[path]), schema,
                       max_seq_length, max_predictions_per_seq, limits, flag_prefix)
    return next(iter(kinds.values()), None)


def _listed(files: Sequence[str]) -> str:
    """Files for a message: the first three, and how many more."""
    return ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")


def _no_record(files: Sequence[str]) -> str:
    """What to say of input files none of which holds a record."""
    return (f"no record to read: {_listed(files)} {'holds' if len(files) == 1 else 'hold'} "
            "no TFRecord (empty)")


def check_record_kind(schema, masking, path: str, read_unmasked: bool = False) -> None:
    """Unmasked records need `masking` (or `read_unmasked`: the left-to-right LM reads them
    as they are); masked ones must not get it (it would be ignored), and cannot be read
    unmasked."""
    if read_unmasked:
        if schema is features.PRETRAINING:
            raise dynamic_masking.DynamicMaskingError(
                f"{path}: the records are masked, and --objective=ltr predicts every token "
                "of unmasked text: make its records with create_pretraining_data "
                "--next_sentence_prediction=false --dynamic_masking")
        return
    if schema is features.PRETRAINING_UNMASKED and masking is None:
        raise dynamic_masking.DynamicMaskingError(
            f"{path}: the records are unmasked (create_pretraining_data --dynamic_masking); "
            "masking them on the fly needs --vocab_file (the vocab they were made with)")
    if schema is features.PRETRAINING and masking is not None:
        raise dynamic_masking.DynamicMaskingError(
            f"{path}: the records are already masked; --vocab_file, --masked_lm_prob, "
            "--do_whole_word_mask, --mask_token_rate and --random_token_rate are for "
            "unmasked records (create_pretraining_data --dynamic_masking) only")


def limits_of(config) -> tuple:
    """The `IdLimit`s of a records config (its model's tables; masking's vocab)."""
    return id_limits(vocab_size=config.vocab_size, type_vocab_size=config.type_vocab_size,
                     masking=getattr(config, "masking", None))


def check_ids(example, config):
    """Fails on ids the model's tables (or masking's vocab) do not have, naming the feature
    and the size (`naming_bad_records` then names the file)."""
    checks = []
    for limit in limits_of(config):
        if limit.feature not in example:
            continue
        values = example[limit.feature]
        checks.append(tf.debugging.assert_less(
            values, tf.constant(limit.bound, values.dtype),
            message=f"{limit.feature}{_ID_CHECK_MARK}{limit.source}: the records "
                    f"{list(config.input_patterns)[:2]}" + (f"; {limit.hint}" if limit.hint
                                                            else "")))
    if not checks:
        return example
    with tf.control_dependencies(checks):
        return {name: tf.identity(t) for name, t in example.items()}
