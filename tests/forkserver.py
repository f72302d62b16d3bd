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
import contextlib
import gc
import json
import os
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

HEADER = 8  # bytes of the request length, sent with the three file descriptors
REQUEST_TIMEOUT = 30  # seconds a shim may take to send its request
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
while chunk := client.recv(4096):
    answer += chunk
if answer.startswith(b"refused"):
    sys.exit("forkserver: " + answer.decode())
code = int(answer or b"1")
sys.exit(code if code >= 0 else 128 - code)
"""


def _receive(connection: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = connection.recv(count - len(data))
        if not chunk:
            raise ConnectionError("the shim hung up mid-request")
        data += chunk
    return data


def foreign_threads() -> str | None:
    """What makes a fork unsafe here, or None: any thread of this process but the calling
    one, Python's (threading.enumerate) or native (the tasks in /proc/self/task: a
    library's pool, such as OpenBLAS's when OPENBLAS_NUM_THREADS is not 1). A forked child
    keeps only the forking thread; a lock another thread held stays locked in it forever."""
    python = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    tasks = os.listdir("/proc/self/task")
    if not python and len(tasks) == 1:
        return None
    names = []
    for task in tasks:
        with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/comm") as f:
            names.append(f.read().strip())
    return (f"{len(tasks)} threads (native names: {', '.join(names)}; Python threads "
            f"besides this one: {python or 'none'})")


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
    """Accepts commands on the unix socket `path` forever, a forked child for each.

    One thread: the children are reaped as SIGCHLD wakes the loop, not by a thread per
    child, so at each fork the server holds no thread but the forking one (checked by
    `foreign_threads` before every fork: a command is refused, with the reason, otherwise).
    A shim that hangs up (before its request is complete, or while its child runs) costs
    only its own command. The fork is at the top of the loop, outside any `try`: the
    child's exceptions and exit reach the interpreter as a script's do.
    """
    import keras  # noqa: F401  (imported once, before the forks)
    import tensorflow  # noqa: F401

    from training import input_pipeline

    # As in the test process (tests/conftest.py): a run's iterators freed at its exit
    # waited for the autotuning model thread's sleep (measured: 22 s after 20 s of reading).
    input_pipeline.AUTOTUNE_MODEL = False
    # Python's advice for a process that forks without exec (gc.freeze): what the imports
    # made (~280k objects) leaves the collector's reach, so no child walks it again in its
    # collections and at its exit, nor copies its pages by doing so (measured: 1-2 s less
    # per command; the children's own objects are collected as ever).
    gc.collect()
    gc.freeze()
    unsafe = foreign_threads()
    if unsafe is not None:  # the test that started the server fails, with this line
        sys.exit(f"forkserver: cannot fork safely: after its imports the server holds {unsafe}")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(16)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up byte does the work
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}  # pid -> its shim's connection
    os.rename(path + ".tmp", path)  # the path appears once it accepts
    while True:
        for key, _ in selector.select():
            if key.fileobj is not listener:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, 4096)
                continue
            connection, _ = listener.accept()
            request, fds = _request(connection)
            if request is None:
                connection.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                selector.close()
                for fd in (wake_read, wake_write):
                    os.close(fd)
                for other in (listener, connection, *children.values()):
                    other.close()  # a shim waits for its end until every copy is closed
                _run_child(request, fds)
            for fd in fds:
                os.close(fd)
            children[pid] = connection
        _reap(children)


def _request(connection: socket.socket) -> tuple[dict | None, list]:
    """The request on `connection` and the shim's three standard streams, or (None, [])
    when the shim hung up or sent something else (logged), or forking is unsafe (the
    shim is told why)."""
    fds = []
    try:
        connection.settimeout(REQUEST_TIMEOUT)  # a shim that stops mid-request is dropped
        header, fds, _, _ = socket.recv_fds(connection, HEADER, 3)
        if not header or len(fds) != 3:
            raise ConnectionError("the shim hung up before its request")
        header += _receive(connection, HEADER - len(header))
        request = json.loads(_receive(connection, int.from_bytes(header, "big")))
        unsafe = foreign_threads()
        if unsafe is not None:
            connection.sendall(f"refused: the fork server holds {unsafe}".encode())
            raise RuntimeError(f"refused: {unsafe}")
        return request, fds
    except (OSError, ValueError, RuntimeError) as err:
        print(f"forkserver: request dropped: {type(err).__name__}: {err}", file=sys.stderr,
              flush=True)
        for fd in fds:
            os.close(fd)
        return None, []


def _reap(children: dict) -> None:
    """Reports every child that ended to its shim (one that hung up is skipped)."""
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        connection = children.pop(pid)
        with contextlib.suppress(OSError), connection:
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
        # OPENBLAS_NUM_THREADS=1: NumPy's OpenBLAS starts no thread of its own (one fewer
        # BLAS thread in the children, whose work is TensorFlow's).
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
                   OPENBLAS_NUM_THREADS="1",
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
