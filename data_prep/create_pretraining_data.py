"""CLI: raw text -> masked-LM / next-sentence TFRecords, streaming, in parallel.

    python -m data_prep.create_pretraining_data \\
        --input_file='corpus/*.txt' --output_file=out/train.tfrecord \\
        --vocab_file=vocab.txt --max_seq_length=128 --max_predictions_per_seq=20

Every flag of Google's create_pretraining_data.py, same names, meanings and defaults,
plus --num_workers, --num_output_shards, --gzip, --chunk_size_mb,
--shuffle_buffer_size, --exact_draws, --dynamic_masking. The corpus is cut into chunks
of documents that worker processes turn into framed TFRecord bytes (`pretraining_data.process_chunk`);
this process writes them in chunk order, so the output depends on the seed and the
input, never on the number of workers. No process imports TensorFlow. See
docs/create_pretraining_data.md.

Outputs are all-or-nothing as a set: the records and the summary
(`DIR/_NAME.summary.json` beside the first output `DIR/NAME`, so that the glob
`DIR/NAME*` matches records only) are written under hidden temporaries
(`fileio.AtomicOutputs`) and renamed into place only when all are complete. On an
error, Ctrl-C or SIGTERM the temporaries are removed, the workers stopped, and earlier
outputs stay as they were; workers die with this process even on `kill -9`
(`lifecycle.init_worker_process`), and the hidden temporaries such a kill leaves are
removed by the next run with the same outputs.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import json
import multiprocessing
import os
import random
import re
import sys
import time

# By name: `concurrent.futures.process` is only loaded once a pool is created, so naming
# it as an attribute in an `except` clause fails with AttributeError in a run without one.
from concurrent.futures.process import BrokenProcessPool

import numpy as np

# Loaded now rather than by `np.random`'s lazy import inside the main loop: a Ctrl-C or
# SIGTERM that arrives while an extension module initialises is lost.
import numpy.random
from absl import app, flags, logging

from data_prep import fileio, lifecycle, pretraining_data, shared_results, tokenization

FLAGS = flags.FLAGS

# --- The original's flags (same names and defaults). ---
flags.DEFINE_string("input_file", None,
                    "Input raw text file(s): comma-separated list of files or globs. One "
                    "sentence per line, blank lines between documents, UTF-8.")
flags.DEFINE_string("output_file", None,
                    "Output TFRecord file(s), comma-separated; instances are spread "
                    "round-robin over them.")
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

# --- Ours. ---
flags.DEFINE_integer("num_workers", None,
                     "Worker processes (default: all available cores). The output does not "
                     "depend on it.")
flags.DEFINE_integer("num_output_shards", 1,
                     "Split each output file into this many shards named "
                     "NAME-00000-of-0000N (1: no split, NAME as given).")
flags.DEFINE_bool("gzip", False, "Write GZIP-compressed TFRecords "
                  "(read them with compression_type='GZIP').")
flags.DEFINE_float("chunk_size_mb", 0.0,
                   "Megabytes of input text per chunk, the unit of parallel work and the "
                   "pool random next sentences are drawn from. 0: automatic (the input "
                   "size / 16, between 0.25 and 2 MB).")
flags.DEFINE_integer("shuffle_buffer_size", 200_000,
                     "Instances held in the output shuffle buffer that mixes chunks.")
flags.DEFINE_float("progress_seconds", 5.0, "Seconds between progress lines on stderr.")
flags.DEFINE_bool("exact_draws", False,
                  "Draw every random number as the original does (Python's random, in the "
                  "original's order), so that a corpus within one chunk gives exactly the "
                  "original's records; about 1.5x the CPU time. Otherwise masking is drawn with "
                  "numpy for a whole chunk at once: the same distribution, other draws.")
flags.DEFINE_bool("dynamic_masking", False,
                  "Write the next-sentence pairs unmasked (input_ids, input_mask, segment_ids, "
                  "next_sentence_labels), for run_pretraining.py to mask on the fly with a "
                  "fresh mask every epoch (RoBERTa's dynamic masking). One copy of the pairs "
                  "unless --dupe_factor is given; the masking flags (--masked_lm_prob, "
                  "--max_predictions_per_seq, --do_whole_word_mask) then belong to "
                  "run_pretraining.py.")

MIN_AUTO_CHUNK = 256 * 1024
MAX_AUTO_CHUNK = 2 * 1024 * 1024
# The summary beside the first output DIR/NAME is DIR/_NAME.summary.json (summary_path_for).
SUMMARY_PREFIX = "_"
SUMMARY_SUFFIX = ".summary.json"
# Lines longer than this many bytes per position of an instance are warned about: a line
# is one sentence, of which an instance keeps at most max_seq_length tokens.
LONG_LINE_BYTES_PER_POSITION = 100


class CliError(Exception):
    """A problem with the command line or the files it names; exit status 1."""


def _positive(name, minimum=1):
    flags.register_validator(
        name, lambda v: v is None or v >= minimum,
        message=f"--{name} must be at least {minimum}")


_positive("num_workers")
_positive("num_output_shards")
_positive("shuffle_buffer_size", 0)
_positive("chunk_size_mb", 0)


def expand_inputs(patterns: str) -> list:
    """Files matching each comma-separated glob, in order (each glob sorted).

    As with the original's `tf.gfile.Glob`, `*` also matches hidden names; `fileio`
    temporaries (of a run in progress or killed) never match, and directories are not
    read.
    """
    files = []
    for pattern in (p.strip() for p in patterns.split(",")):
        if not pattern:
            continue
        if fileio.is_url(pattern):
            raise CliError(f"--input_file: {pattern!r}: only local files are read (the "
                           "workers do not use TensorFlow's file systems); copy the corpus "
                           "to a local disk first")
        found = fileio.glob(pattern)
        matches = [m for m in found if fileio.isfile(m)]
        if not matches:
            directories = [m.rstrip("/") for m in found if fileio.isdir(m)]
            if directories:
                raise CliError(
                    f"--input_file: {pattern!r} is a directory ({directories[0]}), not a "
                    "text file; to read the files in it, pass a glob such as "
                    f"--input_file='{directories[0]}/*.txt'")
            raise CliError(f"--input_file: {pattern!r} matches no file")
        files.extend(matches)
    if not files:
        raise CliError("--input_file names no file")
    return files


def find_long_lines(path: str, limit: int, block_bytes: int = 1 << 24) -> list:
    """(line number, bytes) of every line of `path` longer than `limit` bytes.

    Reads the file in blocks and finds the line ends with numpy (about 2 GB/s; splitting
    each block into Python bytes objects took 4x as long), so the check costs little next
    to tokenizing the same text, which it runs beside.
    """
    found, line, current = [], 1, 0  # current: bytes of the line being read so far
    with fileio.open_file(path, "rb") as f:
        while True:
            block = f.read(block_bytes)
            if not block:
                break
            ends = np.flatnonzero(np.frombuffer(block, np.uint8) == ord("\n"))
            if not len(ends):
                current += len(block)
                continue
            first = current + int(ends[0])  # the line that began before this block
            if first > limit:
                found.append((line, first))
            inner = np.diff(ends) - 1  # lines between two line ends of this block
            found.extend((line + 1 + k, int(inner[k]))
                         for k in np.flatnonzero(inner > limit).tolist())
            line += len(ends)
            current = len(block) - 1 - int(ends[-1])
    if current > limit:
        found.append((line, current))
    return found


def warn_long_lines(input_files, max_seq_length: int) -> int:
    """Warns, per file, about lines far longer than one instance; returns their number.

    As in the original, a line is one sentence, and an instance keeps at most
    max_seq_length tokens of it (the pair is trimmed): the rest of such a line never
    reaches the output. The records stay the original's; the warning tells the user that
    the file is probably not one sentence per line.
    """
    limit = LONG_LINE_BYTES_PER_POSITION * max_seq_length
    total = 0
    for path in input_files:
        long_lines = find_long_lines(path, limit)
        if not long_lines:
            continue
        total += len(long_lines)
        line, size = long_lines[0]
        longest = max(long_lines, key=lambda item: item[1])
        logging.warning(
            "%s:%d: a line of %s; %d line(s) of this file exceed %d bytes (the longest: "
            "line %d, %s). A line is one sentence, and an instance keeps at most "
            "--max_seq_length=%d tokens of it: the rest of such a line is dropped, as in "
            "the original. Is the file one sentence per line, with \\n line ends?",
            path, line, _size_text(size), len(long_lines), limit, longest[0],
            _size_text(longest[1]), max_seq_length)
    return total


def _size_text(size: int) -> str:
    return f"{size / 1e6:.2f} MB" if size >= 10_000 else f"{size} bytes"


def output_paths(output_file: str, num_shards: int) -> list:
    """Physical files, ordered so that instance i goes to paths[i % len(paths)] and
    consecutive instances go round-robin over the given output files first."""
    names = [p.strip() for p in output_file.split(",") if p.strip()]
    if not names:
        raise CliError("--output_file names no file")
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
    the same output twice, an output that is a directory, an output in a directory that
    does not exist, a URL (this CLI writes local files), and output names whose glob
    `NAME*` would match the summary file.
    """
    named = [("--output_file", p) for p in outputs] + [("--output_file (summary)",
                                                        summary_path)]
    for flag, path in named:
        if fileio.is_url(path):
            raise CliError(f"{flag}: {path!r}: only local files are written; write them "
                           "locally and copy them to their destination")
        directory = os.path.dirname(path) or "."
        if not fileio.isdir(directory):
            raise CliError(f"--output_file: cannot write {path!r}: the directory "
                           f"{directory!r} does not exist")
    try:
        fileio.check_outputs(named, [("--input_file", f) for f in input_files]
                             + [("--vocab_file", vocab_file)])
    except fileio.OutputError as err:
        raise CliError(str(err)) from None
    summary_dir, summary_name = os.path.split(summary_path)
    for path in outputs:
        directory, name = os.path.split(path)
        if summary_name.startswith(name) and fileio.same_path(directory or ".",
                                                                summary_dir or "."):
            raise CliError(f"--output_file: the glob {path}* would match the summary file "
                           f"{summary_path}; choose output names that do not start with "
                           f"{SUMMARY_PREFIX!r}")


def clean_legacy_temporaries(paths) -> None:
    """Removes `NAME.tmp-PID` files that earlier versions of this CLI left when killed.

    They match the glob `NAME*`; this run owns NAME, and a file is removed only when its
    process no longer runs. (Temporaries are now hidden: see `fileio.temporary_path`.)
    """
    for path in paths:
        directory, name = os.path.split(path)
        pattern = re.compile(re.escape(name) + r"(?:\.summary\.json)?\.tmp-(\d+)")
        try:
            entries = fileio.listdir(directory or ".")
        except OSError:
            continue
        for entry in entries:
            found = pattern.fullmatch(entry)
            if found and not fileio.pid_alive(int(found.group(1))):
                stale = os.path.join(directory, entry)
                try:
                    fileio.remove(stale)
                except OSError:
                    continue
                logging.warning("Removed %s, left by an interrupted run", stale)


class OutputWriteError(CliError):
    """Writing an output failed (disk full, I/O error); the message names the output."""

    def __init__(self, path: str, err: OSError):
        super().__init__(f"--output_file: cannot write {path!r}: {err.strerror or err}; "
                         "nothing was written under the final names (an earlier output "
                         "there is unchanged)")


class RecordWriters:
    """TFRecord files written to the temporaries of a `fileio.AtomicOutputs` set.

    Records arrive already framed (`features.frame_records`, byte-identical to
    `tf.io.TFRecordWriter`'s output), so writing is plain file I/O: this process never
    imports TensorFlow. GZIP output is a standard gzip stream (level 6 as TensorFlow's
    default; no name or time stamp in the header), which `compression_type="GZIP"`
    reads. An OSError (e.g. ENOSPC) becomes an `OutputWriteError` naming the output.
    """

    def __init__(self, atomic: fileio.AtomicOutputs, paths, gzip: bool):
        self.paths = list(paths)
        self.raw: list = []
        self.files: list = []
        for path in self.paths:  # Fail early, with the path, on unwritable outputs.
            try:
                self.raw.append(atomic.open(path, "wb"))
            except OSError as err:
                self.close_quietly()
                raise CliError(f"--output_file: cannot write {path!r}: "
                               f"{err.strerror or err}") from None
        if gzip:
            import gzip as gzip_module

            self.files = [gzip_module.GzipFile(filename="", mode="wb", fileobj=raw,
                                               compresslevel=6, mtime=0)
                          for raw in self.raw]
        else:
            self.files = list(self.raw)
        self.count = 0

    def _write(self, k: int, data) -> None:
        try:
            self.files[k].write(data)
        except OSError as err:
            raise OutputWriteError(self.paths[k], err) from None

    def write_records(self, records, batch=4096) -> None:
        """Framed records (bytes-like), spread round-robin over the files."""
        n = len(self.files)
        first = self.count % n
        for k in range(n):
            part = records[(k - first) % n::n] if n > 1 else records
            for lo in range(0, len(part), batch):
                self._write(k, b"".join(part[lo:lo + batch]))
        self.count += len(records)

    def write_chunk(self, result) -> None:
        """A chunk's framed records, in order."""
        if len(self.files) == 1:
            self._write(0, result.data)
            self.count += len(result.lengths)
        else:
            self.write_records(result.records())

    def close(self) -> None:
        """Flushes and closes every file (gzip trailers included)."""
        for k, f in enumerate(self.files):
            try:
                f.close()
                if f is not self.raw[k]:
                    self.raw[k].close()
            except OSError as err:
                self.close_quietly()
                raise OutputWriteError(self.paths[k], err) from None

    def close_quietly(self) -> None:
        """Closes whatever is open, ignoring errors (the run is failing anyway)."""
        for f in self.files + self.raw:
            try:
                f.close()
            except Exception:  # noqa: BLE001, S110 - best effort while failing anyway
                pass


class ShuffleBuffer:
    """Mixes records across chunks with bounded memory (each chunk is already shuffled).

    Chunks' records are held until at least `size` have arrived; then all held records
    are written in a uniformly random order (numpy permutation) and the buffer starts
    again. A block of whole chunks, each shuffled, put in a random order, is a uniform
    shuffle of the block; records are only referenced (memoryview slices of the chunks'
    data: strings, or slots mapped by `shared_results`), never copied, until they are
    written.
    """

    def __init__(self, size: int, seed: int):
        self.size = size
        self.rng = np.random.default_rng(random.Random(f"{seed}/shuffle").getrandbits(64))
        self.records: list = []

    def push(self, result) -> list:
        """Adds a chunk's records; returns the records to write now (often none)."""
        data, pos, append = memoryview(result.data), 0, self.records.append
        for length in result.lengths:
            append(data[pos:pos + length])
            pos += length
        if len(self.records) >= self.size:
            return self.drain()
        return []

    def drain(self) -> list:
        records, self.records = self.records, []
        # map over the list's __getitem__: half the time of a list comprehension.
        return list(map(records.__getitem__, self.rng.permutation(len(records)).tolist()))


def start_workers(num_workers, vocab_file, do_lower_case):
    """A process pool (executor) for `process_chunk`, or None to work in this process;
    with it, the `shared_results.SharedResults` its results come through (None: through
    the executor's pipe).

    On Linux the workers are forked after this process has built the tokenizer (and
    imported numpy), so they inherit it, Unicode tables included, and the shared results
    file; elsewhere they are spawned clean. Each worker dies with this process, even on
    `kill -9`, and leaves Ctrl-C and SIGTERM to it (`lifecycle.init_worker_process`).
    """
    if num_workers <= 1:
        return None, None
    fork = sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
    shared = None
    if fork:
        pretraining_data.load_tokenizer(vocab_file, do_lower_case)
        tokenization.load_tables()
        shared = shared_results.SharedResults.create()
    context = multiprocessing.get_context("fork" if fork else "spawn")
    # An executor, not multiprocessing.Pool: a worker killed (e.g. by the OOM killer)
    # fails the run with BrokenProcessPool instead of hanging it.
    pool = concurrent.futures.ProcessPoolExecutor(
        num_workers, mp_context=context, initializer=lifecycle.init_worker_process,
        initargs=(os.getpid(),))
    return pool, shared


def stop_workers(pool) -> None:
    """Ends the workers now (the run failed or was interrupted): queued chunks are
    cancelled and running ones killed, not waited for; they hold nothing worth saving."""
    if pool is None:
        return
    # The executor's processes and result pipe, read before shutdown() drops them
    # (private attributes: Python offers no public way before 3.14's terminate_workers).
    processes = list((getattr(pool, "_processes", None) or {}).values())
    result_queue = getattr(pool, "_result_queue", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=10)
    # A worker killed while sending a chunk's records leaves the executor's manager thread
    # waiting for the rest of that message, and Python waits for that thread at exit:
    # forever, as this process holds the pipe's last write end. Closing it ends the wait
    # (EOF), and the manager thread winds the executor down as broken.
    writer = getattr(result_queue, "_writer", None)
    if writer is not None and not any(p.is_alive() for p in processes):
        writer.close()


def ordered_results(tasks, pool, window, shared=None):
    """`process_chunk` over the tasks, yielded in task order, with at most `window` chunks
    in flight so memory stays flat however far workers run ahead. The first window is
    submitted now, so workers start while this process goes on. With `shared`, the
    records come through its slots (a result's data is then a read-only memoryview)."""
    if pool is None:
        return (pretraining_data.process_chunk(task) for task in tasks)
    task_iter = iter(tasks)

    def submit(task):
        if shared is None:
            return pool.submit(pretraining_data.process_chunk, task), None
        slot = shared.acquire()
        return pool.submit(shared_results.process_chunk, task, slot), slot

    # The first submissions start the workers. Signals are held meanwhile: one arriving
    # while a worker is being forked would hit it before `init_worker_process` (a stray
    # KeyboardInterrupt in the child), or this process inside fork's hooks, which swallow
    # exceptions.
    with lifecycle.signals_deferred():
        pending = collections.deque(
            submit(task) for task in itertools.islice(task_iter, window))

    def in_order():
        while pending:
            future, slot = pending.popleft()
            result = future.result()
            if shared is not None:
                result = shared.receive(result[0], slot, result[1])
            task = next(task_iter, None)
            if task is not None:
                pending.append(submit(task))
            yield result

    return in_order()


class Progress:
    """Throughput and ETA on stderr every `interval` seconds."""

    def __init__(self, total_bytes, interval, start):
        self.total = total_bytes
        self.interval = interval
        self.start = self.last = start

    def update(self, done_bytes, instances, force=False):
        now = time.monotonic()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        rate = done_bytes / elapsed
        eta = (self.total - done_bytes) / rate if rate > 0 else float("inf")
        print(f"create_pretraining_data: {done_bytes / 1e6:.1f}/{self.total / 1e6:.1f} MB "
              f"({100.0 * done_bytes / max(self.total, 1):.0f}%), {instances} instances, "
              f"{rate / 1e6:.2f} MB/s, {instances / elapsed:.0f} instances/s, "
              f"ETA {eta:.0f}s", file=sys.stderr, flush=True)


# Flags that only decide the masking: with --dynamic_masking nothing is masked here
# (run_pretraining.py masks, with its own flags of the first three names).
MASKING_FLAGS = ("masked_lm_prob", "max_predictions_per_seq", "do_whole_word_mask",
                 "exact_draws")


def config_from_flags() -> pretraining_data.PretrainingConfig:
    dupe_factor = FLAGS.dupe_factor
    if FLAGS.dynamic_masking:
        given = [f"--{name}" for name in MASKING_FLAGS if FLAGS[name].present]
        if given:
            raise CliError(
                f"{', '.join(given)}: no effect with --dynamic_masking, which writes the "
                "pairs unmasked; give the masking flags to run_pretraining.py, which masks "
                "them on the fly")
        # One copy: the mask varies from epoch to epoch instead (RoBERTa); more copies
        # (other pairings and truncations) only when asked for.
        if not FLAGS["dupe_factor"].present:
            dupe_factor = 1
    config = pretraining_data.PretrainingConfig(
        max_seq_length=FLAGS.max_seq_length,
        max_predictions_per_seq=FLAGS.max_predictions_per_seq,
        masked_lm_prob=FLAGS.masked_lm_prob,
        short_seq_prob=FLAGS.short_seq_prob,
        dupe_factor=dupe_factor,
        do_whole_word_mask=FLAGS.do_whole_word_mask)
    config.validate()
    if config.max_predictions_per_seq > config.max_seq_length - 3:
        logging.warning("--max_predictions_per_seq=%d: at most %d tokens of a %d-token "
                        "sequence can be masked; the rest is padding",
                        config.max_predictions_per_seq, config.max_seq_length - 3,
                        config.max_seq_length)
    return config


def auto_chunk_bytes(total_bytes: int) -> int:
    return int(min(MAX_AUTO_CHUNK, max(MIN_AUTO_CHUNK, total_bytes // 16)))


def generate(config, input_files, outputs, *, vocab_file, do_lower_case, seed, num_workers,
             gzip, chunk_bytes, shuffle_buffer_size, progress_seconds,
             exact_draws=False, summary_path=None, dynamic_masking=False) -> dict:
    """Runs the whole job; returns the summary. Raises CliError / InputError.

    The records (and the summary, at `summary_path` unless None) are one all-or-nothing
    set: they appear under their final names only if the whole run succeeds.
    """
    start = time.monotonic()
    total_bytes = sum(os.path.getsize(f) for f in input_files)
    if total_bytes == 0:
        raise CliError(f"--input_file: the input is empty ({', '.join(input_files)})")
    chunk_bytes = chunk_bytes or auto_chunk_bytes(total_bytes)
    chunks, warnings = pretraining_data.plan_chunks(input_files, chunk_bytes)
    for warning in warnings:
        logging.warning("%s", warning)
    num_workers = max(1, min(num_workers, len(chunks)))
    logging.info("%d input file(s), %.1f MB, %d chunk(s) of ~%.2f MB, %d worker(s)",
                 len(input_files), total_bytes / 1e6, len(chunks), chunk_bytes / 1e6,
                 num_workers)
    tasks = (pretraining_data.ChunkTask(index=i, ranges=ranges, vocab_file=vocab_file,
                                        do_lower_case=do_lower_case, config=config, seed=seed,
                                        exact_draws=exact_draws,
                                        dynamic_masking=dynamic_masking)
             for i, ranges in enumerate(chunks))
    stats = pretraining_data.Stats(split_documents=len(warnings))
    finals = list(outputs) + ([summary_path] if summary_path else [])
    clean_legacy_temporaries(finals)
    pool, shared = start_workers(num_workers, vocab_file, do_lower_case)
    atomic = None
    try:
        with fileio.AtomicOutputs(finals) as atomic:
            results = ordered_results(tasks, pool, window=num_workers + 2, shared=shared)
            # Scanned while the workers start on the first chunks (a warning only).
            long_lines = warn_long_lines(input_files, config.max_seq_length)
            writers = RecordWriters(atomic, outputs, gzip)
            try:
                write_all(results, writers, stats, len(chunks), shuffle_buffer_size, seed,
                          Progress(total_bytes, progress_seconds, start))
                if stats.instances == 0:
                    raise CliError(
                        f"--input_file: no instances: the {stats.lines} line(s) of input "
                        f"hold no text that tokenizes to anything ({', '.join(input_files)})")
                writers.close()
            except BaseException:
                writers.close_quietly()
                raise
            elapsed = time.monotonic() - start
            summary = stats.summary()
            summary.update(
                seconds=round(elapsed, 3),
                mb_per_second=round(total_bytes / 1e6 / elapsed, 4),
                instances_per_second=round(stats.instances / elapsed, 1),
                num_workers=num_workers,
                num_chunks=len(chunks),
                chunk_bytes=chunk_bytes,
                long_lines=long_lines,
                input_files=list(input_files),
                output_files=list(outputs),
                summary_file=summary_path,
                gzip=gzip,
                random_seed=seed,
                exact_draws=exact_draws,
                dynamic_masking=dynamic_masking,
                config=dataclasses.asdict(config),
            )
            if summary_path:
                write_summary(atomic, summary_path, summary)
            lifecycle.check_signals()  # the last moment to keep the earlier outputs
        # Here the records and the summary are in place together.
    except BaseException as err:
        stop_workers(pool)
        if shared is not None:
            shared.close()
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            done = atomic is not None and atomic.committed  # a signal held over the renames
            print("create_pretraining_data: " + (
                "interrupted after the outputs were complete; they are in place" if done else
                "interrupted; no output written (earlier outputs are unchanged)"),
                file=sys.stderr, flush=True)
        raise
    if pool is not None:
        pool.shutdown(wait=True)  # all work is done: the workers exit and are reaped here
    if shared is not None:
        shared.close()
    return summary


def write_all(results, writers, stats, num_chunks, shuffle_buffer_size, seed, progress):
    """Writes the chunks' records as they arrive, mixed by the shuffle buffer."""
    # One chunk is already shuffled exactly as the original shuffles its instances.
    buffer = ShuffleBuffer(shuffle_buffer_size, seed) \
        if num_chunks > 1 and shuffle_buffer_size > 0 else None
    for result in results:
        lifecycle.check_signals()  # a Ctrl-C or SIGTERM whose exception got lost
        stats.add(result.stats)
        if buffer is None:
            writers.write_chunk(result)
        else:
            ready = buffer.push(result)
            if ready:
                writers.write_records(ready)
        del result
        progress.update(stats.input_bytes, stats.instances)
    if buffer is not None:
        writers.write_records(buffer.drain())
    progress.update(stats.input_bytes, stats.instances, force=True)


def write_summary(atomic: fileio.AtomicOutputs, path: str, summary: dict) -> None:
    """Writes the summary JSON to its temporary in `atomic` (committed with the records)."""
    text = json.dumps(summary, indent=2, sort_keys=True) + "\n"
    try:
        with atomic.open(path, "w", newline="\n") as f:
            f.write(text)
    except OSError as err:
        raise CliError(f"--output_file: cannot write the summary {path!r}: "
                       f"{err.strerror or err}; nothing was written under the final names "
                       "(an earlier output there is unchanged)") from None


def log_summary(summary: dict) -> None:
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


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    try:
        config = config_from_flags()
        input_files = expand_inputs(FLAGS.input_file)
        try:
            vocab = tokenization.load_vocab(FLAGS.vocab_file)
            tokenization.check_vocab(vocab, FLAGS.vocab_file)
        except tokenization.VocabError as err:
            raise CliError(f"--vocab_file: {err}") from None
        outputs = output_paths(FLAGS.output_file, FLAGS.num_output_shards)
        summary_path = summary_path_for(FLAGS.output_file)
        check_output_names(outputs, summary_path, input_files, FLAGS.vocab_file)
        num_workers = FLAGS.num_workers or len(os.sched_getaffinity(0))
        summary = generate(
            config, input_files, outputs, vocab_file=FLAGS.vocab_file,
            do_lower_case=FLAGS.do_lower_case, seed=FLAGS.random_seed,
            num_workers=num_workers, gzip=FLAGS.gzip,
            chunk_bytes=int(FLAGS.chunk_size_mb * 1024 * 1024),
            shuffle_buffer_size=FLAGS.shuffle_buffer_size,
            progress_seconds=FLAGS.progress_seconds,
            exact_draws=FLAGS.exact_draws, summary_path=summary_path,
            dynamic_masking=FLAGS.dynamic_masking)
    except (CliError, pretraining_data.ConfigError, pretraining_data.InputError) as err:
        print(f"create_pretraining_data: error: {err}", file=sys.stderr, flush=True)
        return 1
    except BrokenProcessPool as err:
        print(f"create_pretraining_data: error: a worker process died ({err}); if it was "
              "killed for memory, use fewer --num_workers or a smaller --chunk_size_mb",
              file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:  # Ctrl-C; `generate` said what became of the outputs
        return 130
    log_summary(summary)
    logging.info("Summary written to %s", summary_path)
    return 0


def run():
    """The command: raises SystemExit with `main`'s status (`app.run`), so the run ends as
    every Python program does (`lifecycle` module docstring)."""
    lifecycle.exit_cleanly_on_signals()
    flags.mark_flags_as_required(["input_file", "output_file", "vocab_file"])
    app.run(main)


if __name__ == "__main__":
    run()
