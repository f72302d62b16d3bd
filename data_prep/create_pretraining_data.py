"""CLI: raw text -> masked-LM / next-sentence TFRecords, streaming, in parallel.

    python -m data_prep.create_pretraining_data \\
        --input_file='corpus/*.txt' --output_file=out/train.tfrecord \\
        --vocab_file=vocab.txt --max_seq_length=128 --max_predictions_per_seq=20

Every flag of Google's create_pretraining_data.py, same names, meanings and defaults,
plus --num_output_shards, --gzip, --chunk_size_mb, --exact_draws, --dynamic_masking and
the BERT paper's studies (--next_sentence_prediction, --mask_token_rate,
--random_token_rate), shared with the Beam pipeline (`pretraining_cli`), and this
driver's --num_workers, --shuffle_buffer_size, --progress_seconds. The corpus is cut into
chunks of documents that worker processes (`WorkerPool`) turn into framed TFRecord bytes
(`pretraining_data.chunks`); this process writes them in chunk order, so the output
depends on the seed and the input, never on the number of workers. See
docs/create_pretraining_data.md.

Paths are local or any `tf.io.gfile` URL (gs://, ...), as the original's. Local inputs
are read by the workers themselves; a URL input is read here, range by range as the
chunks are handed out, and its bytes go to the workers with the chunk (forked workers,
which also inherit the tokenizer, never open a URL: only TensorFlow's file systems can,
and they do not survive a fork). Records
always travel back to this process, which alone writes the outputs. With local paths
only, no process imports TensorFlow.

Outputs are all-or-nothing as a set: the records and the summary
(`DIR/_NAME.summary.json` beside the first output `DIR/NAME`, so that the glob
`DIR/NAME*` matches records only) are written under hidden temporaries
(`fileio.AtomicOutputs`; on an object store such as gs://, staged locally and uploaded
under their final names) and put in place only when all are complete. On an
error, Ctrl-C or SIGTERM the temporaries are removed, the workers killed, and earlier
outputs stay as they were; workers die with this process even on `kill -9`
(`lifecycle.init_worker_process`), and the hidden temporaries such a kill leaves are
removed by the next run with the same outputs.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import multiprocessing
import multiprocessing.connection
import os
import pickle
import random
import signal
import sys
import time
import traceback

import numpy as np

# Loaded now rather than by `np.random`'s lazy import inside the main loop: a Ctrl-C or
# SIGTERM that arrives while an extension module initialises is lost.
import numpy.random
from absl import app, flags, logging

from data_prep import cli, fileio, lifecycle, pretraining_cli
from data_prep.pretraining_data import documents
from data_prep.pretraining_data.chunks import ChunkTask, load_tokenizer, process_chunk
from data_prep.pretraining_data.stats import Stats

FLAGS = flags.FLAGS

# Lines longer than this many bytes per position of an instance are warned about: a line
# is one sentence, of which an instance keeps at most max_seq_length tokens.
LONG_LINE_BYTES_PER_POSITION = 100


def define_flags() -> None:
    """The shared flags (`pretraining_cli`) and this driver's own, when the command starts."""
    pretraining_cli.define_flags()
    flags.DEFINE_integer("num_workers", None,
                         "Worker processes (default: all available cores). The output does "
                         "not depend on it.")
    flags.DEFINE_integer("shuffle_buffer_size", 200_000,
                         "Instances held in the output shuffle buffer that mixes chunks.")
    flags.DEFINE_float("progress_seconds", 5.0, "Seconds between progress lines on stderr.")
    pretraining_cli.at_least("num_workers", 1)
    pretraining_cli.at_least("shuffle_buffer_size", 0)


class LongLines:
    """The lines of one file longer than `limit` bytes, found from its bytes fed in order.

    Finds the line ends with numpy (about 2 GB/s; splitting each block into Python bytes
    objects took 4x as long), so the check costs little next to tokenizing the same text.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.found: list = []  # (line number, bytes)
        self.line = 1
        self.current = 0  # bytes of the line being read so far
        self.position = 0  # bytes fed so far

    def feed(self, block: bytes) -> None:
        """The file's next bytes."""
        self.position += len(block)
        ends = np.flatnonzero(np.frombuffer(block, np.uint8) == ord("\n"))
        if not len(ends):
            self.current += len(block)
            return
        first = self.current + int(ends[0])  # the line that began before this block
        if first > self.limit:
            self.found.append((self.line, first))
        inner = np.diff(ends) - 1  # lines between two line ends of this block
        self.found.extend((self.line + 1 + k, int(inner[k]))
                          for k in np.flatnonzero(inner > self.limit).tolist())
        self.line += len(ends)
        self.current = len(block) - 1 - int(ends[-1])

    def finish(self) -> list:
        """(line number, bytes) of every long line, the file's last line included."""
        if self.current > self.limit:
            self.found.append((self.line, self.current))
            self.current = 0
        return self.found


def find_long_lines(path: str, limit: int, block_bytes: int = 1 << 24) -> list:
    """(line number, bytes) of every line of `path` longer than `limit` bytes."""
    scan = LongLines(limit)
    with fileio.open_file(path, "rb") as f:
        for block in iter(lambda: f.read(block_bytes), b""):
            scan.feed(block)
    return scan.finish()


def long_line_limit(max_seq_length: int) -> int:
    return LONG_LINE_BYTES_PER_POSITION * max_seq_length


def warn_long_lines(path: str, long_lines: list, max_seq_length: int) -> int:
    """Warns about a file's lines far longer than one instance; returns their number.

    As in the original, a line is one sentence, and an instance keeps at most
    max_seq_length tokens of it (the pair is trimmed): the rest of such a line never
    reaches the output. The records stay the original's; the warning tells the user that
    the file is probably not one sentence per line.
    """
    if not long_lines:
        return 0
    line, size = long_lines[0]
    longest = max(long_lines, key=lambda item: item[1])
    logging.warning(
        "%s:%d: a line of %s; %d line(s) of this file exceed %d bytes (the longest: "
        "line %d, %s). A line is one sentence, and an instance keeps at most "
        "--max_seq_length=%d tokens of it: the rest of such a line is dropped, as in "
        "the original. Is the file one sentence per line, with \\n line ends?",
        path, line, _size_text(size), len(long_lines), long_line_limit(max_seq_length),
        longest[0], _size_text(longest[1]), max_seq_length)
    return len(long_lines)


def _size_text(size: int) -> str:
    return f"{size / 1e6:.2f} MB" if size >= 10_000 else f"{size} bytes"


class OutputWriteError(cli.UserError):
    """Writing an output failed (disk full, I/O error); the message names the output."""

    def __init__(self, path: str, err: OSError):
        super().__init__(f"--output_file: cannot write {path!r}: {err.strerror or err}; "
                         "nothing was written under the final names (an earlier output "
                         "there is unchanged)")


class RecordWriters:
    """TFRecord files written to the temporaries of a `fileio.AtomicOutputs` set.

    Records arrive already framed (`features.frame_concatenated`, byte-identical to
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
                raise cli.UserError(f"--output_file: cannot write {path!r}: "
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
    data), never copied, until they are written.
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


class WorkerDied(Exception):
    """A worker process ended while the run needed it (killed: by the OOM killer, kill -9)."""


class RemoteTraceback(Exception):
    """The `__cause__` of an error raised in a worker: the worker's traceback, as text."""

    def __str__(self):
        return self.args[0]


def _worker(connection, parent_pid: int) -> None:
    """A worker process: runs `process_chunk` on each task from `connection` and sends back
    (error, its traceback text, result), until None (or EOF: the parent is gone)."""
    lifecycle.init_worker_process(parent_pid)
    while True:
        try:
            task = connection.recv()
        except EOFError:
            return
        if task is None:
            return
        try:
            reply = (None, None, process_chunk(task))
        except Exception as err:  # noqa: BLE001 - raised again in the parent
            reply = (_picklable(err), traceback.format_exc(), None)
        connection.send(reply)


def _picklable(err: Exception) -> Exception:
    """`err` if it survives the pipe; else a RuntimeError with its type and message (an
    exception whose __init__ takes other arguments than its `args` cannot be unpickled)."""
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:  # noqa: BLE001 - any failure to pickle or unpickle
        return RuntimeError(f"{type(err).__name__}: {err}")


class WorkerPool:
    """Worker processes running `process_chunk`, made of public `multiprocessing` API only.

    Not `concurrent.futures.ProcessPoolExecutor`: stopping it at once after an error
    needed its private attributes, and its manager thread could still be closing its
    wake-up pipe at interpreter exit ("Exception ignored ... Bad file descriptor"). Not
    `multiprocessing.Pool`: a killed worker hangs it. Here there is no thread: each
    worker has a pipe of its own and gets a task only when idle; this process waits on
    the busy workers' pipes and process sentinels, so a worker that dies (its pipe reads
    as EOF, its sentinel is ready) fails the run with `WorkerDied` at once.
    """

    def __init__(self, size: int, context):
        self.size = size
        self.context = context
        self.workers: list = []  # (process, connection), once started

    @classmethod
    def for_run(cls, num_workers, vocab_file, do_lower_case):
        """The pool of a run (not started yet), or None to work in this process.

        On Linux the workers are forked after this process has built the tokenizer (and
        imported numpy), so they inherit it; elsewhere they are spawned clean.
        """
        if num_workers <= 1:
            return None
        fork = (sys.platform.startswith("linux")
                and "fork" in multiprocessing.get_all_start_methods())
        if fork:
            load_tokenizer(vocab_file, do_lower_case)
        return cls(num_workers, multiprocessing.get_context("fork" if fork else "spawn"))

    def start(self) -> None:
        """Starts the workers. Signals are held meanwhile: one arriving while a worker is
        being forked would hit it before `init_worker_process` (a stray KeyboardInterrupt in
        the child), or this process inside fork's hooks, which swallow exceptions."""
        with lifecycle.signals_deferred():
            for _ in range(self.size):
                connection, child_end = self.context.Pipe()
                process = self.context.Process(target=_worker, daemon=True,
                                               args=(child_end, os.getpid()))
                process.start()
                self.workers.append((process, connection))
                # Only the worker holds its end now: its death reads as EOF here.
                child_end.close()

    def imap(self, tasks, window):
        """`process_chunk` over the tasks, yielded in task order, with at most `window`
        tasks handed out and not yet yielded, so memory stays flat however far workers run
        ahead; the first ones go to the workers now, so they work while this process goes
        on. An error a task raised is raised here, in task order, its worker's traceback
        as its `__cause__`."""
        task_iter = iter(tasks)
        queued = collections.deque()  # (position, task) taken, waiting for an idle worker
        replies = {}  # position -> (error, traceback text, result)
        idle = list(self.workers)
        busy = {}  # connection -> (worker, position of its task)
        taken = yielded = 0

        def hand_out():
            """Takes tasks up to the window; gives queued ones to the idle workers."""
            nonlocal taken
            for task in itertools.islice(task_iter, window - (taken - yielded)):
                queued.append((taken, task))
                taken += 1
            while queued and idle:
                worker = idle.pop()
                position, task = queued.popleft()
                try:
                    worker[1].send(task)
                except OSError:  # its pipe is broken: it died idle
                    raise _died(worker[0]) from None
                busy[worker[1]] = (worker, position)

        def receive():
            """Waits for replies of busy workers (or for one of them to end)."""
            sentinels = {worker[0].sentinel: worker for worker, _ in busy.values()}
            ready = multiprocessing.connection.wait([*busy, *sentinels])
            for connection in [c for c in busy if c in ready]:  # before their sentinels:
                worker, position = busy.pop(connection)  # a reply may precede an exit
                try:
                    replies[position] = connection.recv()
                except (EOFError, OSError):  # it died before or while replying
                    raise _died(worker[0]) from None
                idle.append(worker)
            for sentinel in ready:
                if sentinel in sentinels and sentinels[sentinel][1] in busy:
                    raise _died(sentinels[sentinel][0])  # ended without a reply

        def in_order():
            nonlocal yielded
            while yielded < taken:
                while yielded not in replies:
                    receive()
                    hand_out()
                error, trace, result = replies.pop(yielded)
                if error is not None:
                    raise error from RemoteTraceback(f'\n"""\n{trace}"""')
                yielded += 1
                hand_out()
                yield result

        hand_out()
        return in_order()

    def close(self) -> None:
        """Ends the workers after a complete run: each is told to stop, exits, is joined."""
        for process, connection in self.workers:
            try:
                connection.send(None)
            except OSError:
                pass  # already gone: its work was done
        for process, _ in self.workers:
            process.join(timeout=60)
        self.kill()  # closes the pipes (and ends a worker that would not exit)

    def kill(self) -> None:
        """Ends the workers now (the run failed or was interrupted): killed, joined, their
        pipes closed; the chunks they hold are worth nothing. Signals are held meanwhile,
        so a second Ctrl-C cannot leave a worker running."""
        with lifecycle.signals_deferred():
            for process, _ in self.workers:
                if process.is_alive():
                    process.kill()
            for process, connection in self.workers:
                process.join()
                process.close()  # its sentinel
                connection.close()
            self.workers = []


def _died(process) -> WorkerDied:
    """The WorkerDied for a worker that ended (reaped here for its exit status)."""
    process.join(timeout=5)
    code = process.exitcode
    if code is not None and code < 0:
        how = "killed by " + (signal.Signals(-code).name if -code in set(signal.Signals)
                              else f"signal {-code}")
    else:
        how = f"ended with exit status {code}"
    return WorkerDied(f"worker {process.pid} {how}")


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


def generate(config, input_files, outputs, *, vocab_file, do_lower_case, seed, num_workers,
             gzip, chunk_bytes, shuffle_buffer_size, progress_seconds,
             exact_draws=False, summary_path=None, dynamic_masking=False) -> dict:
    """Runs the whole job; returns the summary. Raises cli.UserError / InputError.

    The records (and the summary, at `summary_path` unless None) are one all-or-nothing
    set: they appear under their final names only if the whole run succeeds.
    """
    start = time.monotonic()
    total_bytes = sum(fileio.getsize(f) for f in input_files)
    if total_bytes == 0:
        raise cli.UserError(f"--input_file: the input is empty ({', '.join(input_files)})")
    chunk_bytes = chunk_bytes or pretraining_cli.auto_chunk_bytes(total_bytes)
    chunks, warnings = documents.plan_chunks(input_files, chunk_bytes)
    for warning in warnings:
        logging.warning("%s", warning)
    num_workers = max(1, min(num_workers, len(chunks)))
    logging.info("%d input file(s), %.1f MB, %d chunk(s) of ~%.2f MB, %d worker(s)",
                 len(input_files), total_bytes / 1e6, len(chunks), chunk_bytes / 1e6,
                 num_workers)
    limit = long_line_limit(config.max_seq_length)
    # URL inputs are scanned for long lines as this process reads them (`chunk_tasks`).
    remote_scans = {path: LongLines(limit) for path in input_files if fileio.is_url(path)}
    tasks = chunk_tasks(chunks, remote_scans, vocab_file=vocab_file,
                        do_lower_case=do_lower_case, config=config, seed=seed,
                        exact_draws=exact_draws, dynamic_masking=dynamic_masking)
    stats = Stats(split_documents=len(warnings))
    finals = list(outputs) + ([summary_path] if summary_path else [])
    pool = WorkerPool.for_run(num_workers, vocab_file, do_lower_case)
    atomic = None
    try:
        with fileio.AtomicOutputs(finals) as atomic:
            if pool is None:
                results = map(process_chunk, tasks)
            else:
                pool.start()
                results = pool.imap(tasks, window=num_workers + 2)
            # Local files are scanned while the workers start on the first chunks (a
            # warning only).
            long_lines = sum(
                warn_long_lines(path, find_long_lines(path, limit), config.max_seq_length)
                for path in dict.fromkeys(input_files) if path not in remote_scans)
            writers = RecordWriters(atomic, outputs, gzip)
            try:
                write_all(results, writers, stats, len(chunks), shuffle_buffer_size, seed,
                          Progress(total_bytes, progress_seconds, start))
                long_lines += sum(
                    warn_long_lines(path, scan.finish(), config.max_seq_length)
                    for path, scan in remote_scans.items())
                if stats.instances == 0:
                    raise cli.UserError(
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
        if pool is not None:
            pool.kill()  # now: the chunks in flight are worth nothing
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            done = atomic is not None and atomic.committed  # a signal held over the renames
            print("create_pretraining_data: " + (
                "interrupted after the outputs were complete; they are in place" if done else
                "interrupted; no output written (earlier outputs are unchanged)"),
                file=sys.stderr, flush=True)
        raise
    if pool is not None:
        pool.close()  # all work is done: the workers exit and are reaped here
    return summary


def chunk_tasks(chunks, remote_scans: dict, **settings):
    """The chunks' tasks, in order. A range of a URL input is read here, as its task is
    handed out (workers read local files only), and scanned for long lines on the way:
    its file's bytes go by once, in order."""
    for index, ranges in enumerate(chunks):
        ranges = tuple(_loaded(byte_range, remote_scans) for byte_range in ranges)
        yield ChunkTask(index=index, ranges=ranges, **settings)


def _loaded(byte_range: documents.ByteRange, remote_scans: dict) -> documents.ByteRange:
    if byte_range.path not in remote_scans:
        return byte_range
    byte_range = documents.loaded(byte_range)
    scan = remote_scans[byte_range.path]
    if scan.position == byte_range.start:  # not a file named twice, read again
        scan.feed(byte_range.data)
    return byte_range


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
        raise cli.UserError(f"--output_file: cannot write the summary {path!r}: "
                            f"{err.strerror or err}; nothing was written under the final names "
                            "(an earlier output there is unchanged)") from None


def main(argv):
    """The command (flags parsed): `work` in the shell (`data_prep.cli`)."""
    return cli.run_main(lambda: _work(argv), "create_pretraining_data")


def _work(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    job = pretraining_cli.job_from_flags(FLAGS)
    num_workers = FLAGS.num_workers or len(os.sched_getaffinity(0))
    try:
        summary = generate(
            job.config, job.input_files, job.outputs, vocab_file=job.vocab_file,
            do_lower_case=job.do_lower_case, seed=job.seed, num_workers=num_workers,
            gzip=job.gzip, chunk_bytes=job.chunk_bytes,
            shuffle_buffer_size=FLAGS.shuffle_buffer_size,
            progress_seconds=FLAGS.progress_seconds, exact_draws=job.exact_draws,
            summary_path=job.summary_path, dynamic_masking=job.dynamic_masking)
    except WorkerDied as err:
        raise cli.UserError(f"a worker process died ({err}); if it was killed for memory, use "
                            "fewer --num_workers or a smaller --chunk_size_mb") from None
    pretraining_cli.log_summary(summary)
    logging.info("Summary written to %s", job.summary_path)


def run():
    """The command (console script `create_pretraining_data`)."""
    define_flags()
    cli.start(main, "create_pretraining_data")


if __name__ == "__main__":
    run()
