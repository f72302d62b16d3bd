"""CLI: raw text -> masked-LM / next-sentence TFRecords, streaming, in parallel.

    python -m data_prep.create_pretraining_data \\
        --input_file='corpus/*.txt' --output_file=out/train.tfrecord \\
        --vocab_file=vocab.txt --max_seq_length=128 --max_predictions_per_seq=20

Every flag of Google's create_pretraining_data.py, same names, meanings and defaults,
plus --num_workers, --num_output_shards, --gzip, --chunk_size_mb,
--shuffle_buffer_size, --exact_draws. The corpus is cut into chunks of documents that
worker processes turn into framed TFRecord bytes (`pretraining_data.process_chunk`);
this process writes them in chunk order, so the output depends on the seed and the
input, never on the number of workers. No process imports TensorFlow. See
docs/create_pretraining_data.md.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import glob
import itertools
import json
import multiprocessing
import os
import random
import sys
import time

import numpy as np
from absl import app, flags, logging

from data_prep import pretraining_data, tokenization

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

MIN_AUTO_CHUNK = 256 * 1024
MAX_AUTO_CHUNK = 2 * 1024 * 1024


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
    """Files matching each comma-separated glob, in order (each glob sorted)."""
    files = []
    for pattern in (p.strip() for p in patterns.split(",")):
        if not pattern:
            continue
        matches = sorted(m for m in glob.glob(pattern) if os.path.isfile(m))
        if not matches:
            raise CliError(f"--input_file: {pattern!r} matches no file")
        files.extend(matches)
    if not files:
        raise CliError("--input_file names no file")
    return files


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


class AtomicRecordWriters:
    """TFRecord files over temporary names, renamed into place only on `commit`.

    Records arrive already framed (`features.frame_records`, byte-identical to
    `tf.io.TFRecordWriter`'s output), so writing is plain file I/O: this process never
    imports TensorFlow. GZIP output is a standard gzip stream (level 6 as TensorFlow's
    default; no name or time stamp in the header, so output is reproducible), which
    `compression_type="GZIP"` reads.
    """

    def __init__(self, paths, gzip):
        self.paths = paths
        self.temps = [f"{p}.tmp-{os.getpid()}" for p in paths]
        self.files = []
        for temp in self.temps:  # Fail early, with the path, on unwritable outputs.
            try:
                raw = open(temp, "wb")
            except OSError as err:
                self.abort()
                raise CliError(f"--output_file: cannot write {temp!r}: {err.strerror}") from None
            self.files.append(raw)
        if gzip:
            import gzip as gzip_module

            self.files = [gzip_module.GzipFile(filename="", mode="wb", fileobj=raw,
                                               compresslevel=6, mtime=0)
                          for raw in self.files]
        self.raw = list(self.files) if not gzip else [f.fileobj for f in self.files]
        self.count = 0

    def write_records(self, records, batch=4096) -> None:
        """Framed records (bytes-like), spread round-robin over the files."""
        files = self.files
        n = len(files)
        first = self.count % n
        for k in range(n):
            part = records[(k - first) % n::n] if n > 1 else records
            for lo in range(0, len(part), batch):
                files[k].write(b"".join(part[lo:lo + batch]))
        self.count += len(records)

    def write_chunk(self, result) -> None:
        """A chunk's framed records, in order."""
        if len(self.files) == 1:
            self.files[0].write(result.data)
            self.count += len(result.lengths)
        else:
            self.write_records(result.records())

    def commit(self) -> None:
        for f in self.files:
            f.close()
        if self.files is not self.raw:
            for f in self.raw:
                f.close()
        for temp, path in zip(self.temps, self.paths):
            os.replace(temp, path)

    def abort(self) -> None:
        for f in list(getattr(self, "files", [])) + list(getattr(self, "raw", [])):
            try:
                f.close()
            except Exception:  # noqa: BLE001 - best effort while failing anyway
                pass
        for temp in self.temps:
            if os.path.exists(temp):
                os.remove(temp)


class ShuffleBuffer:
    """Mixes records across chunks with bounded memory (each chunk is already shuffled).

    Chunks' records are held until at least `size` have arrived; then all held records
    are written in a uniformly random order (numpy permutation) and the buffer starts
    again. A block of whole chunks, each shuffled, put in a random order, is a uniform
    shuffle of the block; records are only referenced (memoryview slices of the chunks'
    strings), never copied, until they are written.
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
        return [records[i] for i in self.rng.permutation(len(records)).tolist()]


def start_workers(num_workers, vocab_file, do_lower_case):
    """A process pool (executor) for `process_chunk`, or None to work in this process.

    On Linux the workers are forked after this process has built the tokenizer (and
    imported numpy), so they inherit it (its tables take about 0.7 s to build);
    elsewhere they are spawned clean.
    """
    if num_workers <= 1:
        return None
    fork = sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
    if fork:
        pretraining_data.load_tokenizer(vocab_file, do_lower_case)
    context = multiprocessing.get_context("fork" if fork else "spawn")
    # An executor, not multiprocessing.Pool: a worker killed (e.g. by the OOM killer)
    # fails the run with BrokenProcessPool instead of hanging it.
    return concurrent.futures.ProcessPoolExecutor(num_workers, mp_context=context)


def ordered_results(tasks, pool, window):
    """`process_chunk` over the tasks, yielded in task order, with at most `window` chunks
    in flight so memory stays flat however far workers run ahead. The first window is
    submitted now, so workers start while this process goes on."""
    if pool is None:
        return (pretraining_data.process_chunk(task) for task in tasks)
    task_iter = iter(tasks)
    pending = collections.deque(
        pool.submit(pretraining_data.process_chunk, task)
        for task in itertools.islice(task_iter, window))

    def in_order():
        while pending:
            result = pending.popleft().result()
            task = next(task_iter, None)
            if task is not None:
                pending.append(pool.submit(pretraining_data.process_chunk, task))
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


def config_from_flags() -> pretraining_data.PretrainingConfig:
    config = pretraining_data.PretrainingConfig(
        max_seq_length=FLAGS.max_seq_length,
        max_predictions_per_seq=FLAGS.max_predictions_per_seq,
        masked_lm_prob=FLAGS.masked_lm_prob,
        short_seq_prob=FLAGS.short_seq_prob,
        dupe_factor=FLAGS.dupe_factor,
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
             exact_draws=False) -> dict:
    """Runs the whole job; returns the summary. Raises CliError / InputError."""
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
                                        exact_draws=exact_draws)
             for i, ranges in enumerate(chunks))
    stats = pretraining_data.Stats(split_documents=len(warnings))
    pool = start_workers(num_workers, vocab_file, do_lower_case)
    try:
        results = ordered_results(tasks, pool, window=num_workers + 2)
        writers = AtomicRecordWriters(outputs, gzip)
    except BaseException:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        raise
    # One chunk is already shuffled exactly as the original shuffles its instances.
    buffer = ShuffleBuffer(shuffle_buffer_size, seed) \
        if len(chunks) > 1 and shuffle_buffer_size > 0 else None
    progress = Progress(total_bytes, progress_seconds, start)
    try:
        for result in results:
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
        if stats.instances == 0:
            raise CliError(
                f"--input_file: no instances: the {stats.lines} line(s) of input hold no "
                f"text that tokenizes to anything ({', '.join(input_files)})")
        writers.commit()
    except BaseException:
        writers.abort()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        raise
    if pool is not None:
        pool.shutdown(wait=True)  # all work is done: reap the workers
    progress.update(stats.input_bytes, stats.instances, force=True)
    elapsed = time.monotonic() - start
    summary = stats.summary()
    summary.update(
        seconds=round(elapsed, 3),
        mb_per_second=round(total_bytes / 1e6 / elapsed, 4),
        instances_per_second=round(stats.instances / elapsed, 1),
        num_workers=num_workers,
        num_chunks=len(chunks),
        chunk_bytes=chunk_bytes,
        input_files=list(input_files),
        output_files=list(outputs),
        gzip=gzip,
        random_seed=seed,
        exact_draws=exact_draws,
        config=dataclasses.asdict(config),
    )
    return summary


def write_summary(path: str, summary: dict) -> None:
    temp = f"{path}.tmp-{os.getpid()}"
    with open(temp, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(temp, path)


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
        num_workers = FLAGS.num_workers or len(os.sched_getaffinity(0))
        summary = generate(
            config, input_files, outputs, vocab_file=FLAGS.vocab_file,
            do_lower_case=FLAGS.do_lower_case, seed=FLAGS.random_seed,
            num_workers=num_workers, gzip=FLAGS.gzip,
            chunk_bytes=int(FLAGS.chunk_size_mb * 1024 * 1024),
            shuffle_buffer_size=FLAGS.shuffle_buffer_size,
            progress_seconds=FLAGS.progress_seconds,
            exact_draws=FLAGS.exact_draws)
    except (CliError, pretraining_data.ConfigError, pretraining_data.InputError) as err:
        print(f"create_pretraining_data: error: {err}", file=sys.stderr, flush=True)
        return 1
    except concurrent.futures.process.BrokenProcessPool as err:
        print(f"create_pretraining_data: error: a worker process died ({err}); if it was "
              "killed for memory, use fewer --num_workers or a smaller --chunk_size_mb",
              file=sys.stderr, flush=True)
        return 1
    summary_path = FLAGS.output_file.split(",")[0].strip() + ".summary.json"
    summary["summary_file"] = summary_path
    write_summary(summary_path, summary)
    log_summary(summary)
    logging.info("Summary written to %s", summary_path)
    return 0


def run():
    flags.mark_flags_as_required(["input_file", "output_file", "vocab_file"])
    app.run(main)


if __name__ == "__main__":
    run()
