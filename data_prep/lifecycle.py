"""Owns process lifetime: termination signals become clean exits, worker processes die with their parent.

A CLI that writes outputs calls `exit_cleanly_on_signals()` first: SIGTERM and SIGHUP then
raise `SystemExit(128 + signal)` in the main thread, so `finally` blocks and
`fileio.AtomicOutputs` remove temporaries exactly as for Ctrl-C (KeyboardInterrupt).
`signals_deferred()` holds those signals over a short critical section (the renames that
commit a set of outputs, a checkpoint being written), so they end a run before or after it,
never inside. `stop_requests(notify)` turns them, over a long computation (a training loop),
(Ctrl-C too) into a request the work acts on at its next safe point (checkpoint, then
exit), announced at once from a helper thread even while the main thread is inside a long
native call.
`signal_decides_exit_status()` wraps a runner's work so that a run stopped by
SIGTERM/SIGHUP exits 128 + signal even when library code, cut by the signal's SystemExit,
raises an error of its own while unwinding (TensorFlow's scope checks do).
Worker processes call `die_with_parent()` in their initializer (`init_worker_process`
does that and leaves Ctrl-C and SIGTERM handling to the parent): on Linux the kernel sends
them SIGKILL when the parent dies, even by `kill -9`, so no orphan keeps running (and
holding memory) after its parent is gone.

A command ends as every Python program does (no `os._exit`): callers of its `run()`,
profilers (absl's `--profile_file`, `python -m cProfile`), coverage, `atexit` handlers
and the final flush of stdout (whose failure makes the exit status non-zero) rely on it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable

_INSTALLED = False
# Signals whose exception has been raised (see `check_signals`).
_RECEIVED: list[int] = []


def _raise_system_exit(signum, frame):
    del frame
    # Ignore further signals while unwinding: a second SIGTERM must not interrupt clean-up.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    _RECEIVED.append(signum)
    raise SystemExit(128 + signum)


def _raise_keyboard_interrupt(signum, frame):
    del frame
    _RECEIVED.append(signum)
    raise KeyboardInterrupt


def exit_cleanly_on_signals() -> None:
    """SIGTERM/SIGHUP -> SystemExit in the main thread (idempotent; no-op off the main thread).

    Ctrl-C keeps raising KeyboardInterrupt (unless SIGINT is ignored, as in background
    jobs); all three are also recorded for `check_signals`.
    """
    global _INSTALLED
    if _INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_system_exit)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
    _INSTALLED = True


def check_signals() -> None:
    """Raises again the exception of a signal that was received but did not end the run.

    Python runs a signal handler between two bytecodes of the main thread, wherever it
    is; when that is inside an extension module's initialisation (a lazy import) or a
    fork hook, the exception can be swallowed there and the run goes on. A long-running
    loop calls this at safe points (e.g. once per unit of work), so such a signal still
    ends the run, a moment later. Does nothing unless `exit_cleanly_on_signals` is active.
    """
    if _RECEIVED:
        if _RECEIVED[0] == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + _RECEIVED[0])


@contextlib.contextmanager
def signal_decides_exit_status():
    """A run that received SIGTERM/SIGHUP exits 128 + signal, whatever error its unwinding raised.

    Python raises the handler's SystemExit between any two bytecodes, also inside a
    library's context manager; some (TensorFlow's device scopes) then raise an error of
    their own on the way out, which would replace the SystemExit and make a requested
    stop look like a crash (exit 1). Here such an error is reported in one line and the
    exit status is the signal's. Errors of a run that received no signal pass unchanged.
    """
    try:
        yield
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as err:
        stopping = [s for s in _RECEIVED if s != signal.SIGINT]
        if not stopping:
            raise
        print(f"stopping on signal {stopping[0]} ({type(err).__name__} while unwinding: {err})",
              file=sys.stderr, flush=True)
        _forget(stopping)  # acted on: a later run in this process starts with no record
        raise SystemExit(128 + stopping[0]) from err


@contextlib.contextmanager
def signals_deferred():
    """Holds SIGINT, SIGTERM and SIGHUP during a short critical section (main thread only).

    A signal that arrives inside the block is acted on when the block ends, by the handler
    that was in place (KeyboardInterrupt, `exit_cleanly_on_signals`' SystemExit, or the
    default action), so a block such as the renames that commit a set of outputs is never
    cut in the middle by these signals (kill -9 still can). Off the main thread, where
    Python cannot change handlers, the block runs unprotected.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        handler = signal.getsignal(sig)
        if handler is None or handler == signal.SIG_IGN:
            continue  # installed outside Python (cannot be restored), or ignored anyway
        previous[sig] = handler
        signal.signal(sig, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pending:
            handler = previous[pending[0]]
            if callable(handler):
                handler(pending[0], None)
            else:  # SIG_DFL: take the default action now
                os.kill(os.getpid(), pending[0])


class StopRequest:
    """What `stop_requests` yields: `signal` is None until SIGTERM, SIGHUP or SIGINT
    arrives, then its number; `handled()` tells the block's exit that the work acted on it
    (the work raises its own SystemExit, e.g. after a checkpoint)."""

    def __init__(self):
        self.signal: int | None = None
        self._handled = False

    def handled(self) -> None:
        """The work has acted on the signal: leaving the block raises nothing more."""
        self._handled = True

    def exit_status(self) -> int:
        """128 + the signal, the status a run stopped by it exits with (SIGTERM's if none)."""
        return 128 + (self.signal or signal.SIGTERM)


@contextlib.contextmanager
def stop_requests(notify: Callable[[int], None] | None = None):
    """SIGTERM, SIGHUP and Ctrl-C (SIGINT) inside the block become a stop request instead
    of an exception.

    Python runs a signal handler only when the main thread gets back to the interpreter,
    so a run whose main thread is inside a long native call (a compiled training loop of
    `iterations_per_loop` steps) would hear of a SIGTERM only after that call, maybe too
    late for the notice a preempted machine gets. Here the signal number also reaches a
    helper thread at once (`signal.set_wakeup_fd`), which calls `notify(signum)`: e.g. to
    set a variable the compiled loop reads at every step. The main thread sees the
    request in the yielded `StopRequest` (its `signal`) and acts on it at a safe point.

    When the block ends normally with a request it did not mark `handled()`, the request
    ends the run then (SystemExit(128 + signal)), as `exit_cleanly_on_signals` would
    have. Ctrl-C is a request like SIGTERM (exit status 130), unless SIGINT is ignored
    (a background job). Off the main thread (where Python cannot install handlers) the
    block runs without stop requests.
    """
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    received_here: list[int] = []
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def record(signum, frame):
        """The main thread's handler: notes the request (raises nothing)."""
        del frame
        _RECEIVED.append(signum)
        received_here.append(signum)
        if request.signal is None:
            request.signal = signum

    def watch():
        """The helper thread: signal numbers from the wakeup pipe -> `notify`."""
        while True:
            data = os.read(read_fd, 64)
            if not data or 0 in data:  # the block ended
                return
            for signum in data:
                if signum in stopping:
                    if request.signal is None:
                        request.signal = signum
                    if notify is not None:
                        notify(signum)

    stopping = [signal.SIGTERM, signal.SIGHUP]
    if signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, None):
        stopping.append(signal.SIGINT)
    previous = {sig: signal.getsignal(sig) for sig in stopping}
    for sig in previous:
        signal.signal(sig, record)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    watcher = threading.Thread(target=watch, name="stop-request-watcher", daemon=True)
    watcher.start()
    try:
        yield request
    except SystemExit:
        # The request has had its effect (the work stopped on it): it must not outlive
        # the block and turn a later run's error in this process into a signal's exit.
        _forget(received_here)
        raise
    finally:
        signal.set_wakeup_fd(previous_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        os.write(write_fd, b"\0")
        watcher.join(timeout=5)
        os.close(write_fd)
        os.close(read_fd)
    _forget(received_here)
    if request.signal is not None and not request._handled:
        raise SystemExit(request.exit_status())


def _forget(signals: list[int]) -> None:
    """Removes signals a `stop_requests` block acted on from the record `check_signals` reads."""
    for signum in signals:
        if signum in _RECEIVED:
            _RECEIVED.remove(signum)


def die_with_parent(parent_pid: int | None = None) -> None:
    """Asks the kernel to SIGKILL this process when its parent exits (Linux; else a no-op).

    Args:
      parent_pid: the parent's pid as the parent saw it; if the parent is already gone
        when this runs (the race prctl cannot close), exit at once.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def init_worker_process(parent_pid: int) -> None:
    """The first thing a worker process runs (e.g. `create_pretraining_data.WorkerPool`'s).

    The worker dies with its parent (`die_with_parent`), ignores Ctrl-C (SIGINT reaches
    the whole foreground process group; the parent handles it and stops its workers) and
    takes SIGTERM/SIGHUP by default (it ends at once: a forked worker would otherwise
    inherit the parent's `exit_cleanly_on_signals` handler and report the SystemExit to
    the parent as a task's result instead of ending).
    """
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
