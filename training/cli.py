"""Owns which errors a training runner reports as bad input; the shell itself is `data_prep.cli`.

Runners (run_*.py, glue_submission.py) call `run_cli` from their `main(argv)`; nothing
below the runners imports this module.
"""

from __future__ import annotations

from typing import Callable

from data_prep import cli as shell


def run_errors() -> tuple:
    """The errors a training run reports in one line: bad flags, data, records,
    checkpoints and outputs (ValueError and its kin: every family's format error, the
    output and checkpoint errors), a missing file, an output_dir another run owns, and
    absl's flag errors raised while the flags become a config (`flags.ValidationError`:
    repeated --seeds, a grid where one value is taken, ...)."""
    from training.output_claim import RunDirError

    return (ValueError, FileNotFoundError, RunDirError)


def run_cli(work: Callable[[], object], program: str) -> int:
    """`data_prep.cli.run_main` with the runners' errors (`run_errors`)."""
    return shell.run_main(work, program, run_errors())
