"""Owns process lifetime: termination signals become clean exits, worker processes die with their parent.

A CLI that writes outputs calls `exit_cleanly_on_signals()` first: SIGTERM and SIGHUP then
raise `SystemExit(128 + signal)` in the main thread, so `finally` blocks and
`fileio.AtomicOutputs` remove temporaries exactly as for Ctrl-C (KeyboardInterrupt).
Worker processes call `die_with_parent()` in their initializer: on Linux the kernel sends
them SIGKILL when the parent dies, even by `kill -9`, so no orphan keeps running (and
holding memory) after its parent is gone.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

_INSTALLED = False


def _raise_system_exit(signum, frame):
    del frame
    # Ignore further signals while unwinding: a second SIGTERM must not interrupt clean-up.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise SystemExit(128 + signum)


def exit_cleanly_on_signals() -> None:
    """SIGTERM/SIGHUP -> SystemExit in the main thread (idempotent; no-op off the main thread)."""
    global _INSTALLED
    if _INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_system_exit)
    _INSTALLED = True


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
