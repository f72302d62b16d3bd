"""A fork server for tests that start the repository's scripts as processes nobody signals.

Each `python SCRIPT.py ...` / `python -m MODULE ...` a block runs otherwise starts Python
and imports TensorFlow again (about 3 CPU-s before any work). Here one server process
imports TensorFlow and Keras once (and runs no op, so it holds no thread a fork would
lose); every such command is a child forked from it that runs the script as
`__main__` with the command's arguments, working directory, environment and standard
streams, exits the way the script exits (atexit, flushing, exit status, a traceback on an
uncaught exception) and is reported back as its exit status.

`routed(command, env)` turns a command and environment for a real process into ones
that run it forked from this test process's server (started on first use, stopped at
exit): the command starts with a shim that passes its arguments, working directory,
environment and standard streams to the server, waits and exits as the child exited.
`shell_env(env)` puts the shim first on PATH as `python` for a shell; there anything else
than a script or `-m` (`python -`, `python -c`) runs the real interpreter. A killed shim
does not kill its child: use a real process where a test kills or signals one, where the
process is under test (a CLI's wiring, isolated serving), or where a test sets variables
that TensorFlow reads at import.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

HEADER = 8  # bytes of the request length, sent with the three file descriptors
SOCKET_VARIABLE = "BERT_TESTS_FORKSERVER"

SHIM = """#!{python} -I
import json, os, socket, sys
argv = sys.argv[1:]
if not argv or not (argv[0] == "-m" or argv[0].endswith(".py")):
    os.execv({python!r}, [{python!r}] + argv)
client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
client.connect(os.environ[{variable!r}])
request = json.dumps({{"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
socket.send_fds(client, [len(request).to_bytes({header}, "big")], [0, 1, 2])
client.sendall(request)
answer = b""
while chunk := client.recv(64):
    answer += chunk
code = int(answer or b"1")
sys.exit(code if code >= 0 else 128 - code)
"""


def _receive(connection: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = connection.recv(count - len(data))
        if not chunk:
            raise ConnectionError("the shim hung up")
        data += chunk
    return data


def _run_child(request: dict, fds: list) -> None:
    """In the forked child: become the command, then let the script's exit end the process."""
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    import runpy

    import numpy

    numpy.random.seed()  # a fresh process draws its own; a fork would share the server's

    if argv[0] == "-m":
        sys.argv = [argv[1]] + argv[2:]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
    sys.exit(0)


def serve(path: str) -> None:
    """Accepts commands on the unix socket `path` forever, a forked child for each."""
    import keras  # noqa: F401  (imported once, before the forks)
    import tensorflow  # noqa: F401

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(16)
    os.rename(path + ".tmp", path)  # the path appears once it accepts
    while True:
        connection, _ = listener.accept()
        header, fds, _, _ = socket.recv_fds(connection, HEADER, 3)
        request = json.loads(_receive(connection, int.from_bytes(header, "big")))
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            listener.close()
            connection.close()
            _run_child(request, fds)
        for fd in fds:
            os.close(fd)
        threading.Thread(target=_report, args=(pid, connection), daemon=True).start()


def _report(pid: int, connection: socket.socket) -> None:
    _, status = os.waitpid(pid, 0)
    with connection:
        connection.sendall(str(os.waitstatus_to_exitcode(status)).encode())


_SHIM: str | None = None  # this process's server's shim, once started


def _shim() -> str:
    """Starts this process's server on first use (stopped at exit); returns its shim."""
    global _SHIM
    if _SHIM is None:
        directory = tempfile.mkdtemp(prefix="forkserver-")
        path = os.path.join(directory, "forkserver.sock")
        shim = os.path.join(directory, "bin", "python")
        os.makedirs(os.path.dirname(shim))
        with open(shim, "w", encoding="utf-8") as f:
            f.write(SHIM.format(python=sys.executable, variable=SOCKET_VARIABLE,
                                header=HEADER))
        os.chmod(shim, os.stat(shim).st_mode | stat.S_IXUSR)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
                   PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("TF_CONFIG", None)
        with open(os.path.join(directory, "server.log"), "w") as log:  # not our streams
            server = subprocess.Popen([sys.executable, os.path.abspath(__file__), path],
                                      env=env, stdin=subprocess.DEVNULL, stdout=log,
                                      stderr=log)
        atexit.register(_stop, server, directory)
        deadline = time.monotonic() + 120
        while not os.path.exists(path):
            if server.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(directory, "server.log"), encoding="utf-8") as log:
                    raise RuntimeError(f"the fork server did not start (exit "
                                       f"{server.poll()}):\n{log.read()[-3000:]}")
            time.sleep(0.05)
        _SHIM = shim
    return _SHIM


def _stop(server: subprocess.Popen, directory: str) -> None:
    server.kill()
    server.wait()
    shutil.rmtree(directory, ignore_errors=True)


def _variables(env: dict) -> dict:
    shim = _shim()
    return {**env, SOCKET_VARIABLE: os.path.join(os.path.dirname(os.path.dirname(shim)),
                                                 "forkserver.sock")}


def routed(command: list, env: dict) -> tuple[list, dict]:
    """`command` ([sys.executable, SCRIPT.py | -m MODULE, ...]) and its `env`, run forked
    from this process's server instead."""
    assert command[0] == sys.executable, command[:2]
    return [_shim()] + list(command[1:]), _variables(env)


def run(command: list, env: dict, cwd: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`subprocess.run(command, ...)` to its end with its output captured, forked."""
    command, env = routed(command, env)
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


def shell_env(env: dict) -> dict:
    """`env` for a shell whose `python` commands run forked from this process's server."""
    variables = _variables(env)
    variables["PATH"] = os.path.dirname(_shim()) + os.pathsep + env.get("PATH", "")
    return variables


if __name__ == "__main__":
    serve(sys.argv[1])
