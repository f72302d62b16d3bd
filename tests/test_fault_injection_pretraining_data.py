"""Fault injection on create_pretraining_data: signals, kill -9, a full disk (issue 10).

The real CLI runs as a subprocess (2 workers, a corpus that takes a few seconds) and is
interrupted: SIGTERM, SIGINT and kill -9 once each at a known moment (its temporaries and
workers exist), then at seeded random moments. Each time:

* only the previous good output or a complete new one exists under final names (records
  and summary together), byte-compared with uninterrupted runs;
* nothing matches the glob `NAME*` but records (temporaries are hidden `.NAME.tmp-*`;
  after SIGTERM/SIGINT none at all; after kill -9 the next run removes them);
* no process of the run is left: the workers listed before the signal are gone, and
  nothing of the run's session still runs;
* a rerun succeeds and equals the reference.

A full disk: a real one (a small tmpfs in a private mount namespace, where the machine
allows it; skipped otherwise) and an injected ENOSPC (the CLI's `open` wrapped so that
writes to one output fail), which always runs: a clear error naming the file, exit 1,
earlier outputs unchanged, nothing half-written.
"""

import errno
import glob
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import write_vocab
from tests.test_fault_injection_runners import _no_process_left

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ["the", "a", "of", "and", "to", "in", "is", "was", "it", "he", "she", "on", "cat",
         "dog", "sat", "mat", "ran", "far", "away", "home", "big", "red", "cats", "unaffable"]
FLAGS = ["--max_seq_length=64", "--max_predictions_per_seq=10", "--dupe_factor=3",
         "--num_workers=2", "--chunk_size_mb=0.25", "--progress_seconds=0.2"]
# Summary keys that measure the run or name where it wrote, not what it wrote.
RUN_KEYS = ("seconds", "mb_per_second", "instances_per_second", "output_files",
            "summary_file")

pytestmark = pytest.mark.slow


def _env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)


def _write_corpus(path, megabytes, seed):
    rng = random.Random(seed)
    docs, size = [], 0
    while size < megabytes * 1e6:
        doc = "\n".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 20))) + " ."
                        for _ in range(rng.randint(1, 10)))
        docs.append(doc)
        size += len(doc) + 2
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A corpus that takes 2 workers a few seconds (3 MB: 12 chunks, 6 a worker, ~1.5 s
    of work on a fast 2-core machine after a ~0.5 s start; the signals at a known moment
    come once the workers and the temporary exist, 20 ms polls, and the random moments
    are fractions of the measured run time), and the vocab."""
    d = tmp_path_factory.mktemp("fault_cpd")
    return {"corpus": _write_corpus(d / "corpus.txt", 3, 1),
            "small": _write_corpus(d / "small.txt", 0.15, 2),
            "vocab": write_vocab(d / "vocab.txt")}


def _args(data, output, seed=7, corpus="corpus"):
    return [f"--input_file={data[corpus]}", f"--output_file={output}",
            f"--vocab_file={data['vocab']}", f"--random_seed={seed}", *FLAGS]


# The CLI as `python -m` runs it, but with Ctrl-C raising KeyboardInterrupt: a shell's
# background jobs (and so, often, test runners) start with SIGINT ignored, and Python
# keeps an ignored SIGINT ignored; a user's terminal does not.
_CLI = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "sys.argv[0] = 'create_pretraining_data'; "
        "runpy.run_module('data_prep.create_pretraining_data', run_name='__main__')")


def _start(args, log):
    return subprocess.Popen([sys.executable, "-c", _CLI, *args], cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)


def _wait(proc, timeout):
    """The run's exit status; a run that hangs is killed (its whole session) and fails."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"the run did not end within {timeout} s of its signal") from None


def _run(args):
    done = subprocess.run([sys.executable, "-m", "data_prep.create_pretraining_data", *args],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _children(pid):
    """Pids of all descendants of `pid` (from /proc/PID/task/*/children)."""
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        for children in glob.glob(f"/proc/{parent}/task/*/children"):
            try:
                with open(children) as f:
                    kids = [int(x) for x in f.read().split()]
            except OSError:
                continue
            found += kids
            stack += kids
    return found


def _running(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _assert_gone(proc, pids, timeout=15.0):
    """The listed processes end (promptly, not when their chunk is done) and nothing of
    the run's session is left."""
    deadline = time.monotonic() + timeout
    while any(map(_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _running(p)], f"workers left running: {pids}"
    _no_process_left(proc)


def _state(directory):
    """Visible files -> content (the summary: its JSON without RUN_KEYS)."""
    state = {}
    for name in sorted(os.listdir(directory)):
        if name.startswith("."):
            continue
        with open(os.path.join(directory, name), "rb") as f:
            content = f.read()
        if name.endswith(".json"):
            summary = json.loads(content)
            content = {k: v for k, v in summary.items() if k not in RUN_KEYS}
        state[name] = content
    return state


def _hidden_temporaries(directory, pid=None):
    return [n for n in os.listdir(directory) if n.startswith(".") and ".tmp-" in n
            and (pid is None or f"-{pid}-" in n)]


def _wait_until_working(proc, directory, timeout=60.0):
    """Waits until the run has its two workers and its hidden temporary; returns the
    worker pids."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        workers = _children(proc.pid)
        if len(workers) >= 2 and _hidden_temporaries(directory, proc.pid):
            return workers
        time.sleep(0.02)
    raise AssertionError("the run never started its workers")


@pytest.fixture(scope="module")
def references(data, tmp_path_factory):
    """Uninterrupted runs: seed 7 on the corpus (the new outputs every interrupted run
    makes) and seed 6 on the small corpus (the earlier outputs a run replaces: other
    records under the same names, cheaper to make): their files (in refs[seed]["dir"]),
    their `_state`, and the time the seed-7 run takes."""
    refs = {}
    for seed, corpus in ((6, "small"), (7, "corpus")):
        out = tmp_path_factory.mktemp(f"fault_cpd_ref{seed}")
        start = time.monotonic()
        _run(_args(data, out / "train.tfrecord", seed=seed, corpus=corpus))
        refs["seconds"] = time.monotonic() - start
        refs[seed] = {"dir": out, "state": _state(out)}
    assert set(refs[7]["state"]) == {"train.tfrecord", "_train.tfrecord.summary.json"}
    assert refs[6]["state"]["train.tfrecord"] != refs[7]["state"]["train.tfrecord"]
    return refs


def _restore(directory, reference=None):
    """Leaves in `directory` only its hidden files and, if given, a reference's files."""
    for name in os.listdir(directory):
        if not name.startswith("."):
            os.remove(directory / name)
    if reference is not None:
        for name in os.listdir(reference["dir"]):
            shutil.copy(reference["dir"] / name, directory / name)


# ------------------------------------------------------------- signals at a known moment


@pytest.mark.parametrize("sig, to_group, exit_code", [
    (signal.SIGTERM, False, 128 + signal.SIGTERM),
    (signal.SIGINT, True, 130),  # Ctrl-C: the whole foreground process group
])
def test_sigterm_and_ctrl_c_stop_workers_remove_temporaries_keep_old_outputs(
        data, references, tmp_path, sig, to_group, exit_code):
    out = tmp_path / "out"
    out.mkdir()
    _restore(out, references[6])
    with open(tmp_path / "log.txt", "wb") as log:
        proc = _start(_args(data, out / "train.tfrecord", seed=7), log)
        workers = _wait_until_working(proc, out)
        if to_group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        returncode = _wait(proc, 60)
    stderr = (tmp_path / "log.txt").read_text()
    assert returncode == exit_code, stderr[-3000:]
    assert "no output written (earlier outputs are unchanged)" in stderr
    assert "Traceback" not in stderr, stderr[-3000:]
    _assert_gone(proc, workers)
    assert _state(out) == references[6]["state"]  # the earlier run's files, untouched
    assert sorted(os.listdir(out)) == sorted(references[6]["state"]), "no temporary left"


def test_kill_9_leaves_no_worker_and_nothing_the_glob_matches_and_the_next_run_cleans(
        data, references, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with open(tmp_path / "log.txt", "wb") as log:
        proc = _start(_args(data, out / "train.tfrecord"), log)
        workers = _wait_until_working(proc, out)
        proc.kill()
        _wait(proc, 60)
    _assert_gone(proc, workers)
    assert glob.glob(str(out / "train.tfrecord*")) == []
    assert _state(out) == {}
    left = _hidden_temporaries(out, proc.pid)
    assert left, "kill -9 gives no chance to clean up: its temporary stays, hidden"
    done = _run(_args(data, out / "train.tfrecord"))
    assert _hidden_temporaries(out) == [], "the next run removes a dead run's temporaries"
    assert "left by an interrupted run" in done.stderr
    assert _state(out) == references[7]["state"]


def test_a_worker_killed_by_the_oom_killer_fails_the_run_cleanly(data, references, tmp_path):
    """kill -9 of one worker (as the OOM killer does): exit 1 with a message that says so,
    the other worker stopped, no temporary, the earlier outputs unchanged."""
    out = tmp_path / "out"
    out.mkdir()
    _restore(out, references[6])
    with open(tmp_path / "log.txt", "wb") as log:
        proc = _start(_args(data, out / "train.tfrecord"), log)
        workers = _wait_until_working(proc, out)
        os.kill(workers[0], signal.SIGKILL)
        returncode = _wait(proc, 60)
    stderr = (tmp_path / "log.txt").read_text()
    assert returncode == 1, stderr[-3000:]
    assert "create_pretraining_data: error: a worker process died" in stderr
    assert "--num_workers" in stderr and "Traceback" not in stderr
    _assert_gone(proc, workers)
    assert _state(out) == references[6]["state"]
    assert sorted(os.listdir(out)) == sorted(references[6]["state"])


# --------------------------------------------------------------- random moments, repeated


# The order in which AtomicOutputs renames the set into place: data first, the summary last.
COMMIT_ORDER = ("train.tfrecord", "_train.tfrecord.summary.json")


def _old_or_new(state, old, new):
    """The earlier outputs or the new ones, each file whole. Only a kill -9 that lands
    between the commit's renames (microseconds, the catchable signals are held there) may
    leave new records beside the earlier summary, never the reverse (fileio.AtomicOutputs:
    data first, marker files last); a missing file counts as an old one when there was
    none before."""
    if state in (old, new):
        return True
    if set(state) - set(COMMIT_ORDER):
        return False
    renamed = [name in state and state[name] == new.get(name) and
               (name not in old or old[name] != new[name]) for name in COMMIT_ORDER]
    kept = [state.get(name) == old.get(name) for name in COMMIT_ORDER]
    cut = renamed.index(False) if False in renamed else len(COMMIT_ORDER)
    return all(renamed[:cut]) and all(kept[cut:])


# Rounds of the random kills: each (signal, empty directory or earlier outputs) twice, at
# moments stratified over a whole run (round k in the k-th eighth of 1.1 run times), so the
# rounds reach every part of a run, start-up to the final renames, and each (signal,
# directory) early and late in it, where 12 unstratified rounds got there by chance only.
# The moment the workers and the temporary exist is also hit on purpose by the tests
# above, with each signal.
RANDOM_ROUNDS = 8


def test_random_kills_leave_old_or_new_outputs_and_no_process(data, references, tmp_path):
    """kill -9 and SIGTERM (4 each) at seeded random moments from start-up to the final
    renames, from an empty directory and over an earlier run's outputs."""
    rng = random.Random(20261123)
    out = tmp_path / "out"
    out.mkdir()
    new = references[7]["state"]
    interrupted = 0
    for round_ in range(RANDOM_ROUNDS):
        sig = (signal.SIGKILL, signal.SIGTERM)[round_ % 2]
        earlier = references[6] if round_ % 4 >= 2 else None  # or an empty directory
        _restore(out, earlier)
        old = earlier["state"] if earlier else {}
        delay = (round_ + rng.uniform(0.0, 1.0)) / RANDOM_ROUNDS * 1.1 * references["seconds"]
        with open(tmp_path / "log.txt", "wb") as log:
            proc = _start(_args(data, out / "train.tfrecord"), log)
            deadline = time.monotonic() + delay
            workers = set()
            while time.monotonic() < deadline and proc.poll() is None:
                workers.update(_children(proc.pid))
                time.sleep(0.01)
            was_running = proc.poll() is None
            if was_running:
                proc.send_signal(sig)
            # Never a hang, even when a worker is killed while sending its records.
            returncode = _wait(proc, 30)
        interrupted += was_running and returncode != 0
        stderr = (tmp_path / "log.txt").read_text()
        _assert_gone(proc, sorted(workers))
        state = _state(out)
        assert _old_or_new(state, old, new), (round_, sig, delay, sorted(state),
                                              stderr[-2000:])
        assert [p for p in glob.glob(str(out / "train.tfrecord*"))
                if not p.endswith("train.tfrecord")] == []
        if sig == signal.SIGTERM and returncode != 0:
            # 143: a clean exit; -SIGTERM: the signal came during Python's start-up, before
            # the CLI installed its handler (nothing written yet).
            assert returncode in (128 + signal.SIGTERM, -signal.SIGTERM), (
                returncode, delay, stderr[-3000:])
            assert _hidden_temporaries(out, proc.pid) == [], stderr[-2000:]
    # At least the rounds of the run's first half (a loaded machine makes runs slower or
    # faster than the reference's, so the later ones may come after the end).
    assert interrupted >= RANDOM_ROUNDS // 2, (
        "half the runs must be interrupted, or the test checks little")
    _run(_args(data, out / "train.tfrecord"))
    assert _state(out) == new
    assert _hidden_temporaries(out) == []


# ------------------------------------------------------------------ a worker's task fails


def _bad_corpus(data, directory):
    """The small corpus twice with invalid UTF-8 between: many chunks, one bad, mid-file."""
    with open(data["small"], "rb") as f:
        text = f.read()
    bad = directory / "bad.txt"
    bad.write_bytes(text + b"\nthe \xc3( cat\n" + text)
    return str(bad), text.count(b"\n") + 2


class _TwoArgumentError(Exception):
    """An error that does not survive the pipe: unpickling calls __init__ with `args`."""

    def __init__(self, what, where):
        super().__init__(f"{what} at {where}")


def _chunk_failing(kind):
    """`process_chunk` whose fourth chunk raises a bug's error (one that pickles, or one
    that does not) or kills its worker."""
    from data_prep import create_pretraining_data as cpd

    real = cpd.process_chunk

    def process_chunk(task):
        if task.index == 3 and kind == "bug":
            raise ZeroDivisionError("a bug in a worker")
        if task.index == 3 and kind == "unpicklable":
            raise _TwoArgumentError("a bug", "chunk 3")
        if task.index == 3 and kind == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        return real(task)

    return process_chunk


@pytest.mark.parametrize("kind", ["invalid_utf8", "bug", "unpicklable", "killed"])
def test_a_failing_worker_leaves_no_process_and_no_thread(data, tmp_path, monkeypatch, kind):
    """2 workers, many chunks, one failing: in-process, `generate` raises the worker's error
    (the input error as itself; a bug's with the worker's traceback as its cause, as a
    RuntimeError naming its type if it cannot be unpickled; a killed worker as WorkerDied) and then no child process and no thread of the pool remain (the
    executor's manager thread used to outlive it: a race with the exit, which could print
    "Exception ignored ... Bad file descriptor"; the CLI's stderr is checked in
    test_create_pretraining_data_cli). Three runs: the race was not every time."""
    from data_prep import create_pretraining_data as cpd
    from data_prep.pretraining_data.config import PretrainingConfig
    from data_prep.text_input import InputError

    corpus, line = _bad_corpus(data, tmp_path)
    if kind != "invalid_utf8":
        if not sys.platform.startswith("linux"):
            pytest.skip("the failing task reaches the workers by fork")
        corpus = data["small"]
        monkeypatch.setattr(cpd, "process_chunk", _chunk_failing(kind))
    expected = {"invalid_utf8": (InputError, f"bad.txt:{line}: invalid UTF-8"),
                "bug": (ZeroDivisionError, "a bug in a worker"),
                "unpicklable": (RuntimeError, "^_TwoArgumentError: a bug at chunk 3$"),
                "killed": (cpd.WorkerDied, "killed by SIGKILL")}[kind]
    assert multiprocessing.active_children() == []
    threads = threading.active_count()
    for attempt in range(3):
        with pytest.raises(expected[0], match=expected[1]) as raised:
            cpd.generate(PretrainingConfig(max_seq_length=64, max_predictions_per_seq=10),
                         [corpus], [str(tmp_path / f"o{attempt}.tfrecord")],
                         vocab_file=data["vocab"], do_lower_case=True, seed=7, num_workers=2,
                         gzip=False, chunk_bytes=20_000, shuffle_buffer_size=1000,
                         progress_seconds=1000)
        assert multiprocessing.active_children() == [], attempt
        assert threading.active_count() == threads, (attempt, threading.enumerate())
        assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == [], "a temporary"
    if kind in ("bug", "unpicklable"):  # the worker's traceback stays visible
        cause = str(raised.value.__cause__)
        assert "Traceback" in cause and "in process_chunk" in cause, cause


# --------------------------------------------------------------------------- a full disk


# The CLI with `open` wrapped: writes to files whose name holds $DISK_FULL_MATCH fail with
# ENOSPC once $DISK_FULL_AFTER_BYTES bytes are written, as on a full disk.
_DISK_FULL = r"""
import builtins, errno, os, sys

match, budget = os.environ["DISK_FULL_MATCH"], int(os.environ["DISK_FULL_AFTER_BYTES"])
real_open = builtins.open


class DiskFull:
    def __init__(self, f):
        self.f, self.left = f, budget

    def write(self, data):
        size = len(data.encode()) if isinstance(data, str) else memoryview(data).nbytes
        if size > self.left:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.left -= size
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def open_(file, mode="r", *args, **kwargs):
    f = real_open(file, mode, *args, **kwargs)
    if any(c in mode for c in "wax") and match in os.path.basename(str(file)):
        return DiskFull(f)
    return f


builtins.open = open_
sys.argv[0] = "create_pretraining_data"
from data_prep import create_pretraining_data
create_pretraining_data.run()
"""


def _disk_full_run(args, match, after_bytes):
    return subprocess.run([sys.executable, "-c", _DISK_FULL, *args], cwd=ROOT, timeout=300,
                          env=dict(_env(), DISK_FULL_MATCH=match,
                                   DISK_FULL_AFTER_BYTES=str(after_bytes)),
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize("workers", [1, 2])
def test_disk_full_while_writing_records_names_the_file(data, tmp_path, workers):
    """A full disk while the records are written: one line naming the file, exit 1, with
    one worker or two (neither an AttributeError nor a bare OSError traceback)."""
    out = tmp_path / "out"
    out.mkdir()
    output = out / "small.tfrecord"
    _run(_args(data, output, seed=1, corpus="small"))  # an earlier good output
    earlier = _state(out)
    args = _args(data, output, corpus="small") + [f"--num_workers={workers}",
                                                  "--chunk_size_mb=0.02"]
    done = _disk_full_run(args, "small.tfrecord", 3000)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "AttributeError" not in done.stderr
    assert (f"create_pretraining_data: error: --output_file: cannot write '{output}': "
            f"{os.strerror(errno.ENOSPC)}") in done.stderr, done.stderr[-3000:]
    assert _state(out) == earlier
    assert _hidden_temporaries(out) == []


def test_disk_full_while_writing_the_summary_leaves_neither_records_nor_summary(
        data, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    output = out / "small.tfrecord"
    args = _args(data, output, corpus="small")
    _run(_args(data, output, seed=1, corpus="small"))
    earlier = _state(out)
    done = _disk_full_run(args, "summary.json", 0)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert f"cannot write the summary '{out / '_small.tfrecord.summary.json'}'" in done.stderr
    assert _state(out) == earlier, "records and summary are committed together, or neither"
    assert _hidden_temporaries(out) == []
    for name in os.listdir(out):
        assert os.path.getsize(out / name) > 0


def test_disk_full_on_a_real_small_filesystem(data, tmp_path):
    """A 256 kB tmpfs, mounted in a private mount namespace (gone with the process); the
    machine must allow `unshare -m` and `mount`, else the test is skipped."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    mount_point = tmp_path / "small_disk"
    mount_point.mkdir()
    script = ('d="$1"; shift; mount -t tmpfs -o size=256k tmpfs "$d" || exit 97; "$@"; '
              'echo "RC=$?"; echo "LEFT=[$(ls -A "$d" | tr "\\n" " ")]"')
    output = mount_point / "small.tfrecord"
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
         str(mount_point), sys.executable, "-m", "data_prep.create_pretraining_data",
         *_args(data, output, corpus="small")],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0 or "RC=" not in done.stdout:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()[-300:]}")
    assert "RC=1" in done.stdout, (done.stdout, done.stderr[-3000:])
    assert f"--output_file: cannot write '{output}': No space left on device" in done.stderr
    assert "Traceback" not in done.stderr
    assert "LEFT=[]" in done.stdout, done.stdout  # no records, no summary, no temporary
