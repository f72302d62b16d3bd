"""data_prep.fileio (temporaries, output checks, all-or-nothing sets) and data_prep.lifecycle."""

import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from data_prep import fileio, lifecycle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------ temporaries


def test_temporaries_are_hidden_beside_the_output_and_no_glob_takes_them(tmp_path):
    final = str(tmp_path / "out.tfrecord")
    temp = fileio.temporary_path(final)
    assert os.path.dirname(temp) == str(tmp_path)
    assert os.path.basename(temp).startswith(".out.tfrecord.tmp-")
    assert fileio.is_temporary(temp) and not fileio.is_temporary(final)
    assert temp != fileio.temporary_path(final)  # each call is fresh
    for path in (final, temp, str(tmp_path / ".hidden")):
        open(path, "w").close()
    assert glob.glob(final + "*") == [final]  # the original README's glob
    # fileio.glob matches hidden names like tf.io.gfile.glob, but never a temporary.
    assert fileio.glob(str(tmp_path / "*")) == sorted([final, str(tmp_path / ".hidden")])
    assert fileio.glob(str(tmp_path / ".*")) == [str(tmp_path / ".hidden")]
    # Relative names stay relative, in the same directory.
    assert os.path.dirname(fileio.temporary_path("out.tfrecord")) == ""
    assert fileio.temporary_path("./out.tfrecord").startswith("./.out.tfrecord.tmp-")


def _temporary_of_a_dead_process(final):
    """A temporary name made by a process that has ended (its pid is in the name)."""
    code = f"from data_prep import fileio; print(fileio.temporary_path({final!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True, env=dict(os.environ, PYTHONPATH=ROOT))
    return done.stdout.strip()


def test_clean_stale_temporaries_removes_only_those_of_dead_local_processes(tmp_path):
    final = str(tmp_path / "out")
    dead = _temporary_of_a_dead_process(final)
    alive = fileio.temporary_path(final)  # this process
    host = os.path.basename(dead).split(fileio.TEMP_MARK)[1].rsplit("-", 2)[0]
    other_host = dead.replace(f"{fileio.TEMP_MARK}{host}-", f"{fileio.TEMP_MARK}otherhost-")
    other_output = _temporary_of_a_dead_process(str(tmp_path / "out.more"))
    unrelated = [final, str(tmp_path / ".out.tmp-not-ours")]
    for path in [dead, alive, other_host, other_output, *unrelated]:
        open(path, "w").close()
    assert fileio.clean_stale_temporaries(final) == [dead]
    assert sorted(os.listdir(tmp_path)) == sorted(
        os.path.basename(p) for p in [alive, other_host, other_output, *unrelated])
    assert fileio.clean_stale_temporaries(str(tmp_path / "out.more")) == [other_output]


def test_a_work_directory_is_removed_after_its_block_and_a_dead_runs_by_the_next(tmp_path):
    name = str(tmp_path / "out.beam-work")
    dead = _temporary_of_a_dead_process(name)
    alive = fileio.temporary_path(name)  # a concurrent run of this process: kept
    for path in (dead, alive):
        os.makedirs(os.path.join(path, "sub"))
        open(os.path.join(path, "sub", "bucket-0"), "w").close()
    with pytest.raises(KeyboardInterrupt):
        with fileio.work_directory(name) as work:
            assert fileio.is_temporary(work) and os.path.isdir(work)
            assert not os.path.exists(dead)
            open(os.path.join(work, "bucket-1"), "w").close()
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == [os.path.basename(alive)]


# ----------------------------------------------------------------------- output checks


def test_check_outputs_refuses_what_would_destroy_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("precious")
    (tmp_path / "link.txt").symlink_to(tmp_path / "in.txt")
    os.link(tmp_path / "in.txt", tmp_path / "hard.txt")
    (tmp_path / "dir").mkdir()
    inputs = [("--input_file", str(tmp_path / "in.txt"))]
    refused = {
        "in.txt": "is also an input",  # relative vs absolute
        "./in.txt": "is also an input",
        str(tmp_path / "link.txt"): "is also an input",
        "hard.txt": "is also an input",
        "dir": "is a directory",
    }
    for output, message in refused.items():
        with pytest.raises(fileio.OutputError, match=message):
            fileio.check_outputs([("--output_file", output)], inputs)
    with pytest.raises(fileio.OutputError, match="named twice"):
        fileio.check_outputs([("--a", "new.txt"), ("--b", "./new.txt")], inputs)
    fileio.check_outputs([("--a", "new.txt"), ("--b", "new2.txt")], inputs)
    fileio.check_outputs([("--export_dir", "dir")], inputs, allow_directory=True)
    assert (tmp_path / "in.txt").read_text() == "precious"


# ------------------------------------------------------------------ all-or-nothing sets


def _finals(directory):
    return {name: (directory / name).read_text() for name in sorted(os.listdir(directory))}


def test_atomic_outputs_appear_together_or_not_at_all(tmp_path):
    a, b = str(tmp_path / "a.txt"), str(tmp_path / "b.json")
    with fileio.AtomicOutputs([a, b]) as out:
        with out.open(a) as f:
            f.write("records 1")
        with out.open(b) as f:
            f.write("summary 1")
        assert _finals(tmp_path).keys() == {os.path.basename(out.temp(a)),
                                            os.path.basename(out.temp(b))}
    committed = _finals(tmp_path)
    assert committed == {"a.txt": "records 1", "b.json": "summary 1"}
    for failure in (RuntimeError("boom"), KeyboardInterrupt(), SystemExit(143)):
        with pytest.raises(type(failure)):
            with fileio.AtomicOutputs([a, b]) as out:
                with out.open(a) as f:
                    f.write("records 2")  # complete, but its partner never is
                raise failure
        assert _finals(tmp_path) == committed, failure
    with pytest.raises(RuntimeError, match="never written"):
        with fileio.AtomicOutputs([a, b]) as out:
            with out.open(a) as f:
                f.write("records 3")
    assert _finals(tmp_path) == committed


def test_write_texts_writes_a_set_of_text_files_together_and_synced(tmp_path, monkeypatch):
    """The one helper for a run's result files (predictions + scores): all synced, then
    all renamed, then the directory; `\\n` line ends; a failure leaves the previous set."""
    texts = {str(tmp_path / "predictions.json"): "{}\n", str(tmp_path / "results.txt"):
             "f1 = 1.0\n"}
    calls = Syscalls(monkeypatch).calls
    fileio.write_texts(texts)
    assert [call[0] for call in calls] == ["fsync", "fsync", "rename", "rename", "fsync"]
    assert _finals(tmp_path) == {"predictions.json": "{}\n", "results.txt": "f1 = 1.0\n"}
    with pytest.raises((OSError, ValueError)):  # a file where a directory must be
        fileio.write_texts({**{path: "new" for path in texts},
                            str(tmp_path / "results.txt" / "y.txt"): "z"})
    assert _finals(tmp_path) == {"predictions.json": "{}\n", "results.txt": "f1 = 1.0\n"}


def test_atomic_outputs_remove_a_dead_runs_temporaries(tmp_path):
    final = str(tmp_path / "a.txt")
    stale = _temporary_of_a_dead_process(final)
    open(stale, "w").close()
    fileio.write_text(final, "x")
    assert os.listdir(tmp_path) == ["a.txt"]


def test_atomic_outputs_on_a_url_filesystem():
    """Paths with a scheme go through tf.io.gfile (TensorFlow's ram:// here)."""
    base = f"ram://fileio_test_{os.getpid()}"
    fileio.write_text(f"{base}/out.txt", "hello")
    fileio.write_bytes(f"{base}/out.bin", b"\x00\x01")
    assert fileio.read_text(f"{base}/out.txt") == "hello"
    assert fileio.glob(f"{base}/out*") == [f"{base}/out.bin", f"{base}/out.txt"]
    assert not [n for n in fileio.listdir(base) if fileio.is_temporary(n)]
    with pytest.raises(ValueError):
        with fileio.AtomicOutputs([f"{base}/out.txt"]) as out:
            with out.open(f"{base}/out.txt", "w") as f:
                f.write("half")
            raise ValueError
    assert fileio.read_text(f"{base}/out.txt") == "hello"
    assert sorted(fileio.listdir(base)) == ["out.bin", "out.txt"]


@pytest.fixture
def object_store(monkeypatch, tmp_path):
    """ram:// counted as an object store (as gs:// is), with renames there refused and the
    system's temporary folder in tmp_path/tmp; yields a fresh ram:// folder."""
    monkeypatch.setattr(fileio, "OBJECT_STORE_SCHEMES", fileio.OBJECT_STORE_SCHEMES | {"ram"})
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    rename = fileio.rename

    def no_rename_on_the_store(src, dst, overwrite=True):
        assert not (src.startswith("ram://") or dst.startswith("ram://")), (src, dst)
        return rename(src, dst, overwrite)

    monkeypatch.setattr(fileio, "rename", no_rename_on_the_store)
    # TensorFlow's ram:// appends to an existing file where an object store replaces it.
    gfile = fileio._gfile()
    copy = gfile.copy

    def replacing_copy(src, dst, overwrite=False):
        if overwrite and gfile.exists(dst):
            gfile.remove(dst)
        return copy(src, dst, overwrite=overwrite)

    monkeypatch.setattr(gfile, "copy", replacing_copy)
    return f"ram://object_store_{os.getpid()}_{len(os.listdir(tmp_path))}_{time.time_ns()}"


def test_an_object_store_gets_each_output_once_complete_under_its_final_name(
        object_store, tmp_path):
    """Outputs are written to a local stage and uploaded only when the whole set is
    complete: nothing on the store meanwhile, no temporary there, no rename there."""
    base = object_store
    fileio.write_text(f"{base}/old.txt", "previous")
    with fileio.AtomicOutputs([f"{base}/a.bin", f"{base}/b.txt"]) as out:
        with out.open(f"{base}/a.bin", "wb") as f:
            f.write(memoryview(b"\x00\x01"))
        assert out.temp(f"{base}/a.bin").startswith(str(tmp_path / "tmp") + "/.bert-staging")
        with out.open(f"{base}/b.txt", "w") as f:
            f.write("text")
        assert fileio.listdir(base) == ["old.txt"]  # nothing uploaded before the commit
    assert sorted(fileio.listdir(base)) == ["a.bin", "b.txt", "old.txt"]
    with fileio.open_file(f"{base}/a.bin", "rb") as f:
        assert f.read() == b"\x00\x01"
    assert fileio.read_text(f"{base}/b.txt") == "text"
    assert os.listdir(tmp_path / "tmp") == []  # the stage is gone


def test_an_object_store_keeps_the_previous_outputs_on_an_error(object_store, tmp_path):
    base = object_store
    fileio.write_text(f"{base}/a.txt", "previous")
    stale = fileio.temporary_path(fileio.staging_name()).replace(f"-{os.getpid()}-",
                                                                 "-999999999-")
    os.makedirs(stale)  # a killed run's stage: removed by the next run that stages
    with pytest.raises(ValueError):
        with fileio.AtomicOutputs([f"{base}/a.txt", f"{base}/b.txt"]) as out:
            for name in ("a.txt", "b.txt"):
                with out.open(f"{base}/{name}", "w") as f:
                    f.write("new")
            raise ValueError
    assert sorted(fileio.listdir(base)) == ["a.txt"]
    assert fileio.read_text(f"{base}/a.txt") == "previous"
    assert os.listdir(tmp_path / "tmp") == []


def test_an_object_store_directory_replaces_the_previous_one(object_store):
    """An export on an object store: every new file uploaded under the final name, then
    the previous export's files that the new one does not hold removed."""
    base = object_store
    for name, text in (("export/a.txt", "old a"), ("export/gone.txt", "old")):
        fileio.write_text(f"{base}/{name}", text)

    def export(replace):
        with fileio.AtomicOutputs([f"{base}/export"], replace_directories=replace) as out:
            os.makedirs(os.path.join(out.temp(f"{base}/export"), "sub"))
            for name, text in (("a.txt", "new a"), ("sub/b.txt", "new b")):
                with open(os.path.join(out.temp(f"{base}/export"), name), "w") as f:
                    f.write(text)

    with pytest.raises(fileio.OutputError, match="exists and is not replaced"):
        export(replace=False)
    assert sorted(fileio.listdir(f"{base}/export")) == ["a.txt", "gone.txt"]
    export(replace=True)
    files = sorted(f"{root}/{name}"[len(base) + 1:]
                   for root, _, names in fileio._gfile().walk(f"{base}/export")
                   for name in names)
    assert files == ["export/a.txt", "export/sub/b.txt"]
    assert fileio.read_text(f"{base}/export/a.txt") == "new a"


def test_shared_temporaries_stay_beside_the_outputs_on_an_object_store(object_store,
                                                                       monkeypatch):
    """Temporaries that other machines write (the Beam workers) must be where they all
    see them: beside the outputs on the store, copied into place."""
    base = object_store
    monkeypatch.setattr(fileio, "rename", lambda src, dst, overwrite=True:
                        fileio._gfile().rename(src, dst, overwrite=overwrite))
    with fileio.AtomicOutputs([f"{base}/a.txt"], shared_temporaries=True) as out:
        assert fileio.parent_dir(out.temp(f"{base}/a.txt")) == base
        with out.open(f"{base}/a.txt", "w") as f:
            f.write("from a worker")
    assert fileio.listdir(base) == ["a.txt"]
    assert fileio.read_text(f"{base}/a.txt") == "from a worker"


# ------------------------------------------------------------------------- durability


class Syscalls:
    """Records, in order, the fsyncs (by the path the descriptor was opened with), the
    renames and the directory exchanges that fileio makes (os patched at module level)."""

    def __init__(self, monkeypatch):
        self.calls, self._fds = [], {}
        real_open, real_fsync = os.open, os.fsync
        real_replace, real_rename, real_exchange = os.replace, os.rename, fileio._exchange

        def open_(path, flags, *args, **kwargs):
            fd = real_open(path, flags, *args, **kwargs)
            self._fds[fd] = os.path.normpath(os.fspath(path))
            return fd

        def fsync(fd):
            self.calls.append(("fsync", self._fds.get(fd, fd)))
            return real_fsync(fd)

        def renamer(real):
            def rename(src, dst, *args, **kwargs):
                self.calls.append(("rename", os.path.normpath(src), os.path.normpath(dst)))
                return real(src, dst, *args, **kwargs)
            return rename

        def exchange(a, b):
            done = real_exchange(a, b)
            if done:
                self.calls.append(("exchange", os.path.normpath(a), os.path.normpath(b)))
            return done

        monkeypatch.setattr(os, "open", open_)
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", renamer(real_replace))
        monkeypatch.setattr(os, "rename", renamer(real_rename))
        monkeypatch.setattr(fileio, "_exchange", exchange)


def test_a_file_output_is_synced_before_its_rename_and_its_directory_after(
        tmp_path, monkeypatch):
    final = str(tmp_path / "eval_results.txt")
    calls = Syscalls(monkeypatch).calls
    with fileio.AtomicOutputs([final]) as out:
        with out.open(final) as f:
            f.write("accuracy = 1\n")
        temp = out.temp(final)
    assert calls == [("fsync", temp), ("rename", temp, final), ("fsync", str(tmp_path))]
    # write_text, write_bytes and copy_file are the same set of one.
    for write in (lambda: fileio.write_text(final, "x"),
                  lambda: fileio.write_bytes(final, b"x"),
                  lambda: fileio.copy_file(final, str(tmp_path / "copy.txt"))):
        del calls[:]
        write()
        kinds = [(call[0], call[-1]) for call in calls]
        assert kinds[0][0] == "fsync" and kinds[1][0] == "rename", calls
        assert calls[0][1] == calls[1][1] and fileio.is_temporary(calls[0][1])
        assert kinds[2] == ("fsync", str(tmp_path)) and len(calls) == 3


def test_a_set_is_synced_whole_before_the_first_rename(tmp_path, monkeypatch):
    """Records in one directory, the summary in another: every file synced, then the
    renames in the given order, then each directory once."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    finals = [str(tmp_path / "a" / "r-0"), str(tmp_path / "a" / "r-1"),
              str(tmp_path / "b" / "summary.json")]
    calls = Syscalls(monkeypatch).calls
    with fileio.AtomicOutputs(finals) as out:
        for path in finals:
            with out.open(path, "wb") as f:
                f.write(b"data of " + path.encode())
        temps = [out.temp(path) for path in finals]
    assert calls == ([("fsync", t) for t in temps]
                     + [("rename", t, f) for t, f in zip(temps, finals)]
                     + [("fsync", str(tmp_path / "a")), ("fsync", str(tmp_path / "b"))])


def _write_tree(directory, marker):
    os.makedirs(os.path.join(directory, "variables"))
    for name in ("saved_model.pb", "variables/variables.index", "marker.json"):
        with open(os.path.join(directory, name), "w") as f:
            f.write(marker)


def test_a_directory_output_is_synced_file_by_file_then_each_directory(
        tmp_path, monkeypatch):
    """A SavedModel-like tree: each file, each directory after what it holds (deepest
    first), then the rename, then the parent; the same when it replaces an earlier
    export (one exchange), and the final tree is the new one."""
    final = str(tmp_path / "export")
    calls = Syscalls(monkeypatch).calls
    for marker in ("first", "second"):
        del calls[:]
        with fileio.AtomicOutputs([final], replace_directories=True) as out:
            temp = out.temp(final)
            _write_tree(temp, marker)
        files = {os.path.join(temp, name) for name in
                 ("saved_model.pb", "variables/variables.index", "marker.json")}
        syncs = [path for kind, path in calls[:-2] if kind == "fsync"]
        assert len(syncs) == len(calls) - 2 == 5, calls
        assert set(syncs[:-1]) == files | {os.path.join(temp, "variables")}
        assert syncs.index(os.path.join(temp, "variables/variables.index")) < \
            syncs.index(os.path.join(temp, "variables"))
        assert syncs[-1] == temp  # the directory itself last: its entries are durable
        step = ("rename", temp, final) if marker == "first" else ("exchange", temp, final)
        assert calls[-2:] == [step, ("fsync", str(tmp_path))]
        assert open(os.path.join(final, "marker.json")).read() == marker
    assert os.listdir(tmp_path) == ["export"]


def test_a_failed_sync_keeps_the_previous_output(tmp_path, monkeypatch):
    """fsync fails (EIO: the data did not reach the disk): nothing is renamed, the
    temporaries are removed, the previous outputs stay."""
    import errno

    a, b = str(tmp_path / "a.txt"), str(tmp_path / "b.txt")
    fileio.write_text(a, "old a")
    fileio.write_text(b, "old b")

    def failing_fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output"):
        with fileio.AtomicOutputs([a, b]) as out:
            for path in (a, b):
                with out.open(path) as f:
                    f.write("new")
    assert _finals(tmp_path) == {"a.txt": "old a", "b.txt": "old b"}


def test_url_outputs_are_not_synced(monkeypatch):
    """No fsync for tf.io.gfile paths (the file system's own guarantee applies)."""
    calls = Syscalls(monkeypatch).calls
    base = f"ram://fileio_sync_{os.getpid()}"
    fileio.write_text(f"{base}/out.txt", "hello")
    assert fileio.read_text(f"{base}/out.txt") == "hello"
    assert [c for c in calls if c[0] == "fsync"] == []


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_the_kernel_sees_fsync_before_rename_and_the_directory_after(tmp_path):
    """The same order, seen from outside the process (strace): a set of two files."""
    code = textwrap.dedent(f"""
        from data_prep import fileio
        with fileio.AtomicOutputs([{str(tmp_path / "r")!r}, {str(tmp_path / "s")!r}]) as out:
            for name in ("r", "s"):
                with out.open({str(tmp_path)!r} + "/" + name) as f:
                    f.write(name * 1000)
    """)
    trace = tmp_path / "trace.txt"
    done = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=openat,fsync,rename,renameat,renameat2",
         "-o", str(trace), sys.executable, "-c", code], cwd=ROOT, capture_output=True,
        text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    if done.returncode != 0 and "ptrace" in done.stderr:
        pytest.skip(f"strace cannot trace here: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    fds, events = {}, []
    for line in trace.read_text().splitlines():
        found = re.search(r'openat\(AT_FDCWD, "([^"]+)".* = (\d+)$', line)
        if found:
            fds[found.group(2)] = found.group(1)
        found = re.search(r"fsync\((\d+)\)\s+= 0", line)
        if found:
            events.append(("fsync", os.path.basename(fds[found.group(1)])))
        found = re.search(r'rename(?:at2?)?\(.*?"([^"]+)".*?"([^"]+)"', line)
        if found:
            events.append(("rename", os.path.basename(found.group(1)),
                           os.path.basename(found.group(2))))
    ours = [e for e in events if e[0] == "rename" or e[1] in ("r", "s", tmp_path.name)
            or fileio.is_temporary(e[1])]
    temps = [e[1] for e in ours[:2]]
    assert [e[0] for e in ours] == ["fsync", "fsync", "rename", "rename", "fsync"], ours
    assert all(fileio.is_temporary(t) for t in temps)
    assert ours[2:] == [("rename", temps[0], "r"), ("rename", temps[1], "s"),
                        ("fsync", tmp_path.name)]


# ---------------------------------------------------------------------------- lifecycle


def _python(code, **kwargs):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                          text=True, timeout=60, check=False, **kwargs)


def test_sigterm_becomes_a_clean_exit_that_runs_finally_blocks():
    done = _python("""
        import os, signal, time
        from data_prep import lifecycle
        lifecycle.exit_cleanly_on_signals()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
            print("not reached")
        finally:
            print("cleaned up")
    """)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert done.stdout == "cleaned up\n"


@pytest.mark.parametrize("sig, returncode, raised", [
    (signal.SIGTERM, 128 + signal.SIGTERM, "SystemExit"),
    (signal.SIGINT, -signal.SIGINT, "KeyboardInterrupt"),
])
def test_signals_deferred_holds_a_signal_until_the_block_ends(sig, returncode, raised):
    done = _python(f"""
        import os, signal, sys, time
        from data_prep import lifecycle
        lifecycle.exit_cleanly_on_signals()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with lifecycle.signals_deferred():
                os.kill(os.getpid(), {int(sig)})
                time.sleep(0.2)
                print("block finished", flush=True)
            print("not reached")
        except BaseException as err:
            print(type(err).__name__, flush=True)
            raise
    """)
    assert done.returncode == returncode, done.stderr
    assert done.stdout == f"block finished\n{raised}\n"
    # The handlers are back: a signal after the block acts at once.
    done = _python("""
        import os, signal, time
        from data_prep import lifecycle
        lifecycle.exit_cleanly_on_signals()
        with lifecycle.signals_deferred():
            pass
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
    """)
    assert done.returncode == 128 + signal.SIGTERM


@pytest.mark.parametrize("sig, returncode", [(signal.SIGTERM, 128 + signal.SIGTERM),
                                              (signal.SIGINT, -signal.SIGINT)])
def test_check_signals_ends_a_run_whose_signal_exception_was_swallowed(sig, returncode):
    """As an extension module's initialisation can swallow the exception a signal handler
    raises, a loop's next `check_signals` raises it again."""
    done = _python(f"""
        import os, signal, time
        from data_prep import lifecycle
        signal.signal(signal.SIGINT, signal.default_int_handler)
        lifecycle.exit_cleanly_on_signals()
        lifecycle.check_signals()  # nothing received: nothing happens
        try:
            os.kill(os.getpid(), {int(sig)})
            time.sleep(5)
        except BaseException:
            pass  # swallowed, as inside a lazy import
        print("going on", flush=True)
        lifecycle.check_signals()
        print("not reached")
    """)
    assert done.returncode == returncode, done.stderr
    assert done.stdout == "going on\n"


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux-only")
def test_a_worker_ignores_ctrl_c_and_dies_with_its_parent_even_on_kill_9(tmp_path):
    """The parent starts a worker (`init_worker_process`), which survives SIGINT; then the
    parent is killed with SIGKILL, and the kernel kills the worker too."""
    pid_file = tmp_path / "worker.pid"
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, subprocess, sys, time
        worker = subprocess.Popen([sys.executable, "-c", (
            "import os, time; from data_prep import lifecycle; "
            "lifecycle.init_worker_process({{}}); "
            "open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
        ).format(os.getpid())])
        time.sleep(120)
    """)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        os.kill(worker, signal.SIGINT)
        time.sleep(0.3)
        assert _alive(worker), "SIGINT is the parent's to handle"
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker), "the worker outlived its parent"
    finally:
        parent.kill()
        if pid_file.exists() and pid_file.read_text() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_die_with_parent_exits_if_the_parent_is_already_gone():
    done = _python("""
        import os
        from data_prep import lifecycle
        lifecycle.die_with_parent(parent_pid=os.getppid() + 10**6)
        print("not reached")
    """)
    assert done.returncode == 1 and done.stdout == ""


def test_lifecycle_calls_off_the_main_thread_change_nothing():
    import threading

    before = signal.getsignal(signal.SIGTERM)
    errors = []

    def work():
        try:
            lifecycle.exit_cleanly_on_signals()
            with lifecycle.signals_deferred():
                pass
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert errors == [] and signal.getsignal(signal.SIGTERM) is before


def test_a_stop_signal_sets_the_exit_status_even_if_unwinding_raises_another_error():
    """TensorFlow's device scopes raise RuntimeError when a signal's SystemExit cuts them;
    the run must still exit 128 + SIGTERM, as asked, not 1 like a crash."""
    code = """
        import contextlib, os, signal, time
        from data_prep import lifecycle

        @contextlib.contextmanager
        def strict_scope():  # like tf's device scope: breaks if left by an exception
            try:
                yield
            except BaseException:
                raise RuntimeError("Exiting device scope without proper scope nesting")

        lifecycle.exit_cleanly_on_signals()
        with lifecycle.signal_decides_exit_status():
            with strict_scope():
                if WRAPPED_ERROR_ONLY:
                    raise ValueError("a real bug")
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)
    """
    done = _python(code.replace("WRAPPED_ERROR_ONLY", "False"))
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert "stopping on signal 15 (RuntimeError while unwinding" in done.stderr
    # Without a signal, errors pass unchanged (traceback, exit 1).
    done = _python(code.replace("WRAPPED_ERROR_ONLY", "True"))
    assert done.returncode == 1
    assert "RuntimeError: Exiting device scope" in done.stderr
