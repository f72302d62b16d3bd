"""Owns how every command (data tool or runner) starts and ends: the one CLI shell.

A command module defines `main(argv)` whose body is one call:

    def main(argv):
        return cli.run_main(lambda: work(argv), "build_vocab")

and its `__main__` block (or console script) is `cli.start(main, "build_vocab")`.
What every command then shares:

* **Bad input** (`UserError` and its subclasses: what the project refuses on purpose,
  absl's flag and usage errors, and a file-system error about a path a flag names) ends
  the run with one line `prog: error: <message>` on stderr and exit status 1, no
  traceback. The line comes as `SystemExit(message)`, so an in-process caller of `main()`
  finds it in the exception. A TensorFlow or OS error whose message holds the value of a
  string flag (a gs:// path with no network or no credentials, a directory that cannot
  be created) becomes `--flag=value: <what failed>`.
* **Defects**: any other error (a ValueError of Keras, NumPy or our own code included)
  prints its traceback, then `prog: internal error (a bug, please report it with the
  traceback above): <type>: <message>`, exit status 1.
* **Signals**: SIGTERM and SIGHUP raise SystemExit(128 + signal) in the main thread and
  Ctrl-C raises KeyboardInterrupt, so `finally` blocks and `fileio.AtomicOutputs` remove
  the command's temporaries; a Ctrl-C ends with one line and status 130, a signal with
  128 + signal even when unwinding raised an error of its own (`data_prep.lifecycle`).
  A command registers nothing itself: writing through `fileio.AtomicOutputs` (or a
  `try/finally`) is what makes its temporaries go.
* **Flags**: `start` parses the absl flags before `main` runs; a flag that does not parse
  is the same one line and status 1. Commands with argparse use `ArgumentParser`.

Nothing here imports TensorFlow: a tool that never loads it pays nothing for it.
"""

from __future__ import annotations

import argparse
import re
import sys
import traceback
from typing import Callable, Mapping

from data_prep import lifecycle

INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


class UserError(ValueError):
    """Bad input the project detected on purpose: a flag, file, line or record that cannot
    work, the message naming it and what is wrong. The shell prints it in one line; every
    other error is a defect and keeps its traceback. Each module's own error kinds
    (`ConfigError`, `DataFormatError`, ...) derive from it."""


class FlagError(UserError):
    """A flag value that cannot work (the message names the flag and what is wrong)."""


def run_main(work: Callable[[], int | None], program: str, *,
             flag_values: Mapping[str, object] | None = None) -> int:
    """Runs `work()` as the command `program`; returns its exit status.

    Args:
      work: the command's body; returns an exit status, or anything else for 0.
      program: the name the error line starts with (e.g. "run_squad.py").
      flag_values: name -> value of the command's flags, to name the flag of a path in a
        file-system error (default: absl's parsed FLAGS); read when the error happens, so
        an argparse command may fill it once it has parsed its arguments.

    Raises:
      SystemExit: `program: error: <message>` (status 1) for bad input, the traceback and
        `program: internal error ...` (status 1) for a defect, 130 after Ctrl-C, 128 +
        signal after SIGTERM/SIGHUP.
    """
    lifecycle.exit_cleanly_on_signals()
    try:
        with lifecycle.signal_decides_exit_status():
            status = work()
    except (UserError, *_absl_errors()) as err:
        sys.exit(f"{program}: error: {_one_line(err)}")
    except KeyboardInterrupt:
        print(f"{program}: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        sys.exit(INTERRUPTED)
    except Exception as err:  # noqa: BLE001 - one line if about a flag's path, else a defect
        message = path_error(err, _flag_values() if flag_values is None else flag_values)
        if message is not None:
            sys.exit(f"{program}: error: {message}")
        traceback.print_exc()
        sys.exit(f"{program}: internal error (a bug, please report it with the traceback "
                 f"above): {type(err).__name__}: {_one_line(err)}")
    return status if isinstance(status, int) else 0  # a result (a dict, a path): success


def start(main: Callable[[list], int | None], program: str, *,
          known_only: bool = False) -> None:
    """The command line: parses the absl flags (`parse_flags`), runs `main(argv)` and exits
    with its status (absl's `app.run`, which also serves --help and --helpfull).

    Args:
      known_only: leave flags this command does not define in argv (for Beam's options).
    """
    from absl import app

    lifecycle.exit_cleanly_on_signals()  # also while the flags are parsed
    app.run(main, flags_parser=lambda argv: parse_flags(argv, program, known_only=known_only))


def parse_flags(argv: list, program: str, *, known_only: bool = False) -> list:
    """absl's FLAGS(argv): the arguments left; a flag that does not parse (unknown, not of
    its type, refused by a validator) ends the run as bad input does (one line, status 1)."""
    from absl import flags

    try:
        return flags.FLAGS(argv, known_only=known_only)
    except flags.Error as err:
        sys.exit(f"{program}: error: {_one_line(err)}")


class ArgumentParser(argparse.ArgumentParser):
    """argparse for commands without absl: a bad argument is the shell's `FlagError`
    (one line, status 1) instead of argparse's usage text and status 2."""

    def error(self, message):
        raise FlagError(message)


def path_error(err: BaseException, flag_values: Mapping[str, object]) -> str | None:
    """`--flag=value: <reason>` when `err` (a TensorFlow or OS error of a file system) is
    about a path a string flag names: the flag's value (or one of its comma-separated
    parts, up to a glob's pattern) appears in the error as a path (not inside another
    path), or a path in the error leads to it (a folder above it, as creating or listing
    one reports); failing that, a path derived from it: a file beside it (a checkpoint's
    `bert_config.json` or `vocab.txt`, looked up in the checkpoint's folder). None
    otherwise."""
    text = _error_text(err)
    if text is None:
        return None
    named = [p.rstrip("/") for p in re.findall(r"(?:\w+://|/)[^\s'\",;]+", text)]
    best = {}  # tier (0: the flag's path, 1: one beside it) -> (name, part)
    for name, value in flag_values.items():
        if not isinstance(value, str) or not value:
            continue
        for part in (value, *value.split(",")):
            part = re.split(r"[*?\[]", part.strip())[0].rstrip("/")  # a glob: up to its pattern
            if len(part) < 2:
                continue
            folder = part.rpartition("/")[0]
            if (re.search(r"(?<![\w.~/:-])" + re.escape(part), text)
                    or any(len(p) > 6 and (part + "/").startswith(p + "/") for p in named)):
                tier = 0
            elif len(folder) > 6 and any(p.rpartition("/")[0] == folder for p in named):
                tier = 1
            else:
                continue
            if tier not in best or len(part) > len(best[tier][1]):
                best[tier] = (name, part)
    if not best:
        return None
    name = best[min(best)][0]
    return f"--{name}={flag_values[name]}: {text}"


# TensorFlow's errors of a file system (tf.io.gfile, a checkpoint or record reader): what an
# unreachable gs:// path, a missing file or a denied write raise. Other OpErrors are bugs.
_FILE_ERRORS = ("NotFoundError", "PermissionDeniedError", "FailedPreconditionError",
                "UnavailableError", "UnimplementedError", "AlreadyExistsError",
                "UnauthenticatedError", "DeadlineExceededError")


def _error_text(err: BaseException) -> str | None:
    """The one-line text of a TensorFlow OpError or an OSError (with its file name)."""
    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(err, tuple(getattr(tf.errors, name) for name in _FILE_ERRORS)):
        return f"{type(err).__name__}: {_one_line(err.message)}"
    if isinstance(err, OSError):
        reason = err.strerror or str(err)
        files = [f for f in (err.filename, err.filename2) if f is not None]
        return f"{type(err).__name__}: {reason}" + "".join(f": {f}" for f in files)
    return None


def _one_line(err) -> str:
    return "; ".join(line.strip() for line in str(err).strip().splitlines() if line.strip())


def _absl_errors() -> tuple:
    if "absl.flags" not in sys.modules:
        return ()
    from absl import app, flags

    return (flags.Error, app.UsageError)


def _flag_values() -> dict:
    """The parsed absl flags' values (empty when absl is not in use or not parsed)."""
    if "absl.flags" not in sys.modules:
        return {}
    from absl import flags

    if not flags.FLAGS.is_parsed():
        return {}
    return {name: flags.FLAGS[name].value for name in flags.FLAGS}
