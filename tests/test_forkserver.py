"""tests/forkserver.py: a command run forked from the server behaves as the process it
replaces (arguments, working directory, environment, streams, exit status, atexit)."""

import os
import subprocess
import sys
import time

from tests import forkserver

SCRIPT = """import atexit, os, sys
atexit.register(lambda: print("atexit ran", flush=True))
print("argv", sys.argv[1:], "cwd", os.getcwd(), "X", os.environ.get("X"))
print("from stdin:", sys.stdin.read().strip(), file=sys.stderr)
if sys.argv[1] == "fail":
    raise ValueError("the script's own error")
sys.exit(int(sys.argv[1]))
"""


def test_a_forked_script_sees_its_command_and_exits_as_a_process_would(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT, encoding="utf-8")
    outcomes = []
    for argument in ("0", "3", "fail"):
        command, env = forkserver.routed([sys.executable, str(script), argument],
                                         dict(os.environ, X="y"))
        assert command[0] != sys.executable
        done = subprocess.run(command, env=env, cwd=tmp_path, input="hello",
                              capture_output=True, text=True, timeout=120)
        outcomes.append((done.returncode, done.stdout, done.stderr))
    for (code, out, err), want in zip(outcomes, (0, 3, 1)):
        assert code == want, err
        assert out.startswith("argv [") and f"cwd {tmp_path} X y" in out, out
        assert out.rstrip().endswith("atexit ran") and "from stdin: hello" in err, (out, err)
    assert "ValueError: the script's own error" in outcomes[2][2]
    assert "Traceback" not in outcomes[1][2]


def test_a_shell_python_runs_modules_forked_and_the_rest_with_the_real_interpreter(tmp_path):
    """Forked: the server is the parent, not the shell; `python -c` is the shell's child."""
    (tmp_path / "parent.py").write_text(
        "import os, sys\nprint(os.getppid() == int(sys.argv[1]))\n", encoding="utf-8")
    done = subprocess.run(
        ["bash", "-c", "python -m parent $$ && python -c 'import parent' $$ "
                       "&& python parent.py $$; true"],
        env=forkserver.shell_env(dict(os.environ)), cwd=tmp_path, capture_output=True,
        text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "False"], done.stdout


def _socket_path():
    _, env = forkserver.routed([sys.executable, "x.py"], dict(os.environ))
    return env[forkserver.SOCKET_VARIABLE]


def _echo(tmp_path, text):
    script = tmp_path / "echo.py"
    script.write_text("import sys\nprint(sys.argv[1])\n", encoding="utf-8")
    command, env = forkserver.routed([sys.executable, str(script), text], dict(os.environ))
    return subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)


def test_the_server_survives_clients_that_hang_up(tmp_path):
    """A client gone before its request is complete (no byte, half a header, a header and
    part of the request) or while its command runs costs only its own command."""
    import socket

    assert _echo(tmp_path, "first").stdout == "first\n"
    path = _socket_path()
    for sent in (None, b"\0\0\0", (1000).to_bytes(forkserver.HEADER, "big")):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(path)
        if sent is not None:
            socket.send_fds(client, [sent], [0, 1, 2])
            if len(sent) == forkserver.HEADER:
                client.sendall(b'{"argv": ["x.py"')
        client.close()
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(3)\n", encoding="utf-8")
    command, env = forkserver.routed([sys.executable, str(tmp_path / "slow.py")],
                                     dict(os.environ))
    shim = subprocess.Popen(command, env=env, cwd=tmp_path)
    time.sleep(1)
    shim.kill()  # the shim hangs up while its child runs; the server reports to no one
    shim.wait()
    time.sleep(3)
    done = _echo(tmp_path, "after")
    assert (done.returncode, done.stdout) == (0, "after\n"), done.stderr


def test_a_thread_besides_the_forking_one_makes_forking_unsafe():
    """`foreign_threads` sees a Python thread and a library's native one (OpenBLAS's pool,
    which NumPy starts at import unless OPENBLAS_NUM_THREADS=1): the server refuses to
    fork then (and the server itself is started with OPENBLAS_NUM_THREADS=1)."""
    code = ("import sys, threading, time; sys.path.insert(0, {root!r}); "
            "from tests import forkserver; {before}; print(forkserver.foreign_threads())")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outputs = {}
    for name, before, blas in [
            ("alone", "import numpy", "1"),
            ("python thread", "threading.Thread(target=time.sleep, args=(3,)).start()", "1"),
            ("native thread", "import numpy", "2")]:
        done = subprocess.run([sys.executable, "-c", code.format(root=root, before=before)],
                              env=dict(os.environ, OPENBLAS_NUM_THREADS=blas),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        outputs[name] = done.stdout.strip()
    assert outputs["alone"] == "None", outputs
    assert outputs["python thread"].startswith("2 threads") and "Thread-1" in \
        outputs["python thread"], outputs
    assert outputs["native thread"].startswith("2 threads") and \
        "besides this one: none" in outputs["native thread"], outputs


def test_a_thread_besides_the_forking_one_makes_a_fork_unsafe():
    """The check the server makes before every fork finds Python and native threads."""
    script = ("import threading, time\n"
              "from tests import forkserver\n"
              "print(forkserver.foreign_threads())\n"
              "threading.Thread(target=time.sleep, args=(3,), name='sleeper', daemon=True).start()\n"
              "print(forkserver.foreign_threads())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"),
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == "None"
    assert "2 threads" in second and "sleeper" in second, second
