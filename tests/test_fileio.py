"""data_prep.fileio (temporaries, output checks, all-or-nothing sets) and data_prep.lifecycle."""

import glob
import os
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
