"""Owns how every runner's `main()` ends: signals end it cleanly, bad input is one line naming what is wrong, the exit status says which.

Runners (run_*.py, export_saved_model.py, extract_features.py, convert_checkpoint.py)
call `run_cli` from their `main(argv)`; nothing below the runners imports this module.
"""

from __future__ import annotations

import sys
from typing import Callable


class FlagError(ValueError):
    """A flag value that cannot work (the message names the flag and what is wrong)."""


def run_errors() -> tuple:
    """The errors a training run reports in one line: bad flags, data, records,
    checkpoints and outputs (ValueError and its kin: every family's format error, the
    output and checkpoint errors), a missing file, an output_dir another run owns, and
    absl's flag errors raised while the flags become a config (`flags.ValidationError`:
    repeated --seeds, a grid where one value is taken, ...)."""
    from absl import flags

    from training.run_dir import RunDirError

    # FlagError is a ValueError
    return (ValueError, FileNotFoundError, RunDirError, flags.Error)


def run_cli(main_fn: Callable[[], object], program: str, errors: tuple | None = None, *,
            status: int = 1) -> None:
    """Runs `main_fn()` as a command: `program: error: <message>` and exit `status` for
    the `errors` (default `run_errors()`), anything else as Python reports it.

    SIGTERM and SIGHUP unwind like Ctrl-C (`finally` blocks and temporary outputs are
    cleaned up), and a run stopped by one exits 128 + signal even when the unwinding
    raises an error of its own (`data_prep.lifecycle`).
    """
    from data_prep import lifecycle

    reported = run_errors() if errors is None else errors
    lifecycle.exit_cleanly_on_signals()
    try:
        with lifecycle.signal_decides_exit_status():
            main_fn()
    except reported as err:
        message = f"{program}: error: {err}"
        if status == 1:
            # SystemExit(message): Python prints it and exits 1, and a caller of main()
            # in-process finds the message in the exception.
            sys.exit(message)
        print(message, file=sys.stderr, flush=True)
        sys.exit(status)
