"""Owns the command line both pretraining-data drivers share: flags, their checks, names.

`create_pretraining_data` (the local process pool) and `beam_pretraining_data` (Apache
Beam) take the same flags of the data and the records: the original's, with their names,
meanings and defaults, plus `--num_output_shards`, `--gzip`, `--chunk_size_mb`,
`--exact_draws`, `--dynamic_masking` and the studies of the BERT paper's Tables 5 and 8
(`--next_sentence_prediction`, `--mask_token_rate`, `--random_token_rate`). They are
defined here (`define_flags`) and read into one `DataJob` (`job_from_flags`); each
driver defines only its own further flags (the local pool's `--num_workers`,
`--shuffle_buffer_size`, `--progress_seconds`; Beam's `--pool_size_mb`), so neither
takes a flag it would ignore.

Also here, because both drivers name and check their files the same way: the input
globs (`expand_inputs`), the output shards (`output_paths`), the summary beside them
(`summary_path_for`), the refusals before any work (`check_output_names`), and the
summary's log lines. Every path may be local or any `tf.io.gfile` URL (gs://, ...).
"""

from __future__ import annotations

import dataclasses
import os

from absl import flags, logging

from data_prep import fileio, tokenization
from data_prep.cli import UserError
from data_prep.pretraining_data.config import PretrainingConfig

FLAGS = flags.FLAGS

MIN_AUTO_CHUNK = 256 * 1024
MAX_AUTO_CHUNK = 2 * 1024 * 1024
# The summary beside the first output DIR/NAME is DIR/_NAME.summary.json (summary_path_for).
SUMMARY_PREFIX = "_"
SUMMARY_SUFFIX = ".summary.json"
# Flags that only decide the masking: with --dynamic_masking nothing is masked here
# (run_pretraining.py masks, with its own flags of the first three names).
MASKING_FLAGS = ("masked_lm_prob", "max_predictions_per_seq", "do_whole_word_mask",
                 "mask_token_rate", "random_token_rate", "exact_draws")


def define_flags() -> None:
    """Defines the shared flags (called by each driver when its command starts)."""
    # --- The original's flags (same names and defaults). ---
    flags.DEFINE_string("input_file", None,
                        "Input raw text file(s): comma-separated list of files or globs "
                        "(local or gs://, any tf.io.gfile path). One sentence per line, "
                        "blank lines between documents, UTF-8.")
    flags.DEFINE_string("output_file", None,
                        "Output TFRecord file(s), comma-separated (local or gs://, any "
                        "tf.io.gfile path); instances are spread over them.")
    flags.DEFINE_string("vocab_file", None, "The vocabulary file of the BERT model.")
    flags.DEFINE_bool("do_lower_case", True,
                      "Lower-case the input (True for uncased models, False for cased).")
    flags.DEFINE_bool("do_whole_word_mask", False,
                      "Mask all WordPieces of a word together instead of each independently.")
    flags.DEFINE_integer("max_seq_length", 128, "Maximum sequence length.")
    flags.DEFINE_integer("max_predictions_per_seq", 20,
                         "Maximum number of masked LM predictions per sequence.")
    flags.DEFINE_integer("random_seed", 12345, "Random seed for data generation.")
    flags.DEFINE_integer("dupe_factor", 10,
                         "Number of times to duplicate the input data (with different masks).")
    flags.DEFINE_float("masked_lm_prob", 0.15, "Masked LM probability.")
    flags.DEFINE_float("short_seq_prob", 0.1,
                       "Probability of creating sequences shorter than the maximum length.")
    # --- Ours, in both drivers. ---
    flags.DEFINE_integer("num_output_shards", 1,
                         "Split each output file into this many shards named "
                         "NAME-00000-of-0000N (1: no split, NAME as given).")
    flags.DEFINE_bool("gzip", False, "Write GZIP-compressed TFRecords "
                      "(read them with compression_type='GZIP').")
    flags.DEFINE_float("chunk_size_mb", 0.0,
                       "Megabytes of input text per chunk, the unit of parallel work. 0: "
                       "automatic (the input size / 16, between 0.25 and 2 MB). In "
                       "create_pretraining_data a chunk is also the pool random next "
                       "sentences are drawn from (in the Beam pipeline: --pool_size_mb).")
    flags.DEFINE_bool("exact_draws", False,
                      "Draw every random number as the original does (Python's random, in "
                      "the original's order), so that a corpus within one chunk (pool) gives "
                      "exactly the original's records; about 1.5x the CPU time. Otherwise "
                      "masking is drawn with numpy for a whole chunk at once: the same "
                      "distribution, other draws.")
    flags.DEFINE_bool("dynamic_masking", False,
                      "Write the next-sentence pairs unmasked (input_ids, input_mask, "
                      "segment_ids, next_sentence_labels), for run_pretraining.py to mask on "
                      "the fly with a fresh mask every epoch (RoBERTa's dynamic masking). One "
                      "copy of the pairs unless --dupe_factor is given; the masking flags "
                      "(--masked_lm_prob, --max_predictions_per_seq, --do_whole_word_mask, "
                      "--mask_token_rate, --random_token_rate) then belong to "
                      "run_pretraining.py.")
    # --- Ours, the studies of the BERT paper (Tables 5 and 8), in both drivers. ---
    flags.DEFINE_bool("next_sentence_prediction", True,
                      "Build next-sentence pairs (B is random half the time, labelled 1). "
                      "False: no next-sentence task (the paper's 'No NSP' and 'LTR & No "
                      "NSP' models, run_pretraining.py --next_sentence_prediction=false): "
                      "B is always the text that follows A (labels all 0), and a chunk of "
                      "one sentence is one segment, [CLS] A [SEP]. With --dynamic_masking: "
                      "contiguous text for a left-to-right LM as well.")
    flags.DEFINE_float("mask_token_rate", 0.8,
                       "Of the positions chosen for prediction, the share shown as [MASK] "
                       "(keras-hub's name; the paper's Table 8 'MASK').")
    flags.DEFINE_float("random_token_rate", 0.1,
                       "Of the positions chosen for prediction, the share replaced by a "
                       "random vocabulary entry (Table 8 'RND'); the rest, 1 - "
                       "mask_token_rate - random_token_rate, keep their token ('SAME').")
    at_least("num_output_shards", 1)
    at_least("chunk_size_mb", 0)
    flags.mark_flags_as_required(["input_file", "output_file", "vocab_file"])


def at_least(name: str, minimum) -> None:
    """A flag validator: --name must be at least `minimum` (or unset)."""
    flags.register_validator(
        name, lambda v: v is None or v >= minimum,
        message=f"--{name} must be at least {minimum}")


@dataclasses.dataclass(frozen=True)
class DataJob:
    """What a run is asked to write, from the shared flags (see `job_from_flags`)."""

    config: PretrainingConfig
    input_files: tuple
    outputs: tuple  # physical output files (shards), in the order records go to them
    summary_path: str
    vocab_file: str
    do_lower_case: bool = True
    seed: int = 12345
    gzip: bool = False
    chunk_bytes: int = 0  # 0: automatic (`auto_chunk_bytes`)
    exact_draws: bool = False
    dynamic_masking: bool = False


def job_from_flags(values=FLAGS) -> DataJob:
    """The shared flags, checked (before any work) into a DataJob.

    Raises:
      UserError naming the flag: a bad setting, an input glob matching no
      file, an unusable vocab, an output that would destroy data (`check_output_names`).
    """
    config = config_from_flags(values)
    input_files = expand_inputs(values.input_file)
    try:
        vocab = tokenization.load_vocab(values.vocab_file)
        tokenization.check_vocab(vocab, values.vocab_file)
    except tokenization.VocabError as err:
        raise UserError(f"--vocab_file: {err}") from None
    # Text cased the other way than the vocab was learned would miss its tokens.
    tokenization.check_case(vocab, values.vocab_file, values.do_lower_case)
    outputs = output_paths(values.output_file, values.num_output_shards)
    summary_path = summary_path_for(values.output_file)
    check_output_names(outputs, summary_path, input_files, values.vocab_file)
    return DataJob(config=config, input_files=tuple(input_files), outputs=tuple(outputs),
                   summary_path=summary_path, vocab_file=values.vocab_file,
                   do_lower_case=values.do_lower_case, seed=values.random_seed,
                   gzip=values.gzip, chunk_bytes=int(values.chunk_size_mb * 1024 * 1024),
                   exact_draws=values.exact_draws, dynamic_masking=values.dynamic_masking)


def config_from_flags(values=FLAGS) -> PretrainingConfig:
    """The generation settings; with --dynamic_masking, the masking flags are refused
    and --dupe_factor defaults to 1."""
    dupe_factor = values.dupe_factor
    if values.dynamic_masking:
        given = [f"--{name}" for name in MASKING_FLAGS if values[name].present]
        if given:
            raise UserError(
                f"{', '.join(given)}: no effect with --dynamic_masking, which writes the "
                "pairs unmasked; give the masking flags to run_pretraining.py, which masks "
                "them on the fly")
        # One copy: the mask varies from epoch to epoch instead (RoBERTa); more copies
        # (other pairings and truncations) only when asked for.
        if not values["dupe_factor"].present:
            dupe_factor = 1
    config = PretrainingConfig(
        max_seq_length=values.max_seq_length,
        max_predictions_per_seq=values.max_predictions_per_seq,
        masked_lm_prob=values.masked_lm_prob,
        short_seq_prob=values.short_seq_prob,
        dupe_factor=dupe_factor,
        do_whole_word_mask=values.do_whole_word_mask,
        mask_token_rate=values.mask_token_rate,
        random_token_rate=values.random_token_rate,
        next_sentence_prediction=values.next_sentence_prediction)
    config.validate()
    if config.max_predictions_per_seq > config.max_seq_length - 3:
        logging.warning("--max_predictions_per_seq=%d: at most %d tokens of a %d-token "
                        "sequence can be masked; the rest is padding",
                        config.max_predictions_per_seq, config.max_seq_length - 3,
                        config.max_seq_length)
    return config


def auto_chunk_bytes(total_bytes: int) -> int:
    """--chunk_size_mb=0: the input size / 16, between 0.25 and 2 MB."""
    return int(min(MAX_AUTO_CHUNK, max(MIN_AUTO_CHUNK, total_bytes // 16)))


def expand_inputs(patterns: str) -> list:
    """Files matching each comma-separated glob (local or URL), in order (each glob sorted).

    As with the original's `tf.gfile.Glob`, `*` also matches hidden names; `fileio`
    temporaries (of a run in progress or killed) never match, and directories are not
    read.
    """
    files = []
    for pattern in (p.strip() for p in patterns.split(",")):
        if not pattern:
            continue
        found = fileio.glob(pattern)
        matches = [m for m in found if fileio.isfile(m)]
        if not matches:
            directories = [m.rstrip("/") for m in found if fileio.isdir(m)]
            if directories:
                raise UserError(
                    f"--input_file: {pattern!r} is a directory ({directories[0]}), not a "
                    "text file; to read the files in it, pass a glob such as "
                    f"--input_file='{directories[0]}/*.txt'")
            raise UserError(f"--input_file: {pattern!r} matches no file")
        files.extend(matches)
    if not files:
        raise UserError("--input_file names no file")
    return files


def output_paths(output_file: str, num_shards: int) -> list:
    """Physical files, ordered so that instance i goes to paths[i % len(paths)] and
    consecutive instances go round-robin over the given output files first."""
    names = [p.strip() for p in output_file.split(",") if p.strip()]
    if not names:
        raise UserError("--output_file names no file")
    if num_shards == 1:
        return names
    return [f"{name}-{shard:05d}-of-{num_shards:05d}"
            for shard in range(num_shards) for name in names]


def summary_path_for(output_file: str) -> str:
    """The summary of a run whose first output is `DIR/NAME`: `DIR/_NAME.summary.json`.

    Beside the records but not extending their name, so the glob `DIR/NAME*` (the
    original README's `--input_file=tf_examples.tfrecord*`) matches records only and the
    original's `run_pretraining.py` reads what it matches. A leading `_` also marks a side
    file for Hadoop-style readers (Spark, Beam); the `.summary.json` ending is what this
    project's readers skip in wider globs such as `DIR/*`.
    """
    first = next(p.strip() for p in output_file.split(",") if p.strip())
    directory, name = os.path.split(first)
    return os.path.join(directory, SUMMARY_PREFIX + name + SUMMARY_SUFFIX)


def check_output_names(outputs, summary_path, input_files, vocab_file) -> None:
    """Refuses, before any work, outputs that would destroy data or mislead readers.

    Refused: an output that is an input (also through a glob, a relative path or a link),
    the same output twice, an output that is a directory, a local output in a directory
    that does not exist (on an object store such as gs:// directories are only name
    prefixes: nothing to check), and output names whose glob `NAME*` would match the
    summary file.
    """
    named = [("--output_file", p) for p in outputs] + [("--output_file (summary)",
                                                        summary_path)]
    for _, path in named:
        directory = os.path.dirname(path) or "."
        if not fileio.is_url(path) and not fileio.isdir(directory):
            raise UserError(f"--output_file: cannot write {path!r}: the directory "
                            f"{directory!r} does not exist")
    fileio.check_outputs(named, [("--input_file", f) for f in input_files]
                         + [("--vocab_file", vocab_file)])
    summary_dir, summary_name = os.path.split(summary_path)
    for path in outputs:
        directory, name = os.path.split(path)
        if summary_name.startswith(name) and fileio.same_path(directory or ".",
                                                                summary_dir or "."):
            raise UserError(f"--output_file: the glob {path}* would match the summary file "
                            f"{summary_path}; choose output names that do not start with "
                            f"{SUMMARY_PREFIX!r}")


def log_summary(summary: dict) -> None:
    """The run's figures in two log lines."""

    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    logging.info(
        "Wrote %d instances from %d documents (%d tokens, %.1f per instance) in %.1fs, "
        "%.2f MB/s, %.0f instances/s", summary["instances"], summary["documents"],
        summary["tokens"], summary["mean_tokens_per_instance"] or 0, summary["seconds"],
        summary["mb_per_second"], summary["instances_per_second"])
    logging.info(
        "masked %s of tokens ([MASK] %s, kept %s, random %s); random next %s; "
        "shorter than max_seq_length %s", pct(summary["masked_fraction"]),
        pct(summary["mask_token_share"]), pct(summary["kept_token_share"]),
        pct(summary["random_token_share"]), pct(summary["random_next_share"]),
        pct(summary["short_instance_share"]))
