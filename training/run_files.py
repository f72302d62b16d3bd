"""Owns the record of what a run wrote in its directory (`run_files.json`): its checkpoints and files, by name.

A run's directory may hold what the run did not write: a user's notes or plots, the
checkpoint passed as `--init_checkpoint`, another tool's output. Every clean-up acts on
this record, never on a pattern over the directory: checkpoint rotation and divergence
set-aside (`training.checkpointing`), a redone run (`training.sweeps.remove_run`). The
record lists names relative to the directory:

* `checkpoints`: the `ckpt-<N>` prefixes the run saved, each added BEFORE its save (a
  kill during the save leaves a name recorded whose files may be partial or missing,
  never files of the run unrecorded): the run's checkpoints (its `checkpoint` state
  file, the CheckpointManager's own record, lists only them);
* `files`: the other files and directories it wrote (TensorBoard event files, result
  and prediction files, `best/`, `run_results.json`), each added when written (before,
  where the name is known in advance).

Set-aside checkpoints are handed over to the user: they leave the record (and are never
touched again). The record is rewritten all-or-nothing (`data_prep.fileio`); only the
chief of a multi-worker run writes it.
"""

from __future__ import annotations

import json
import os
import re

from data_prep import fileio
from data_prep.cli import UserError

RECORD_FILE = "run_files.json"
_KINDS = ("checkpoints", "files")
_CHECKPOINT = re.compile(r"ckpt-\d+")


def _path(directory: str) -> str:
    return os.path.join(directory, RECORD_FILE)


def exists(directory: str) -> bool:
    """True when `directory` has a record (a run of this version wrote in it)."""
    return fileio.exists(_path(directory))


class RecordError(UserError):
    """The directory's run_files.json cannot be read (damaged or edited by hand)."""


def read(directory: str) -> dict:
    """{"checkpoints": [...], "files": [...]} the record lists (empty lists: no record).
    A name that is no plain path under the directory (absolute, a URL, with an empty, `.`
    or `..` part; a checkpoint not named `ckpt-<N>`: edited by hand) is dropped: nothing
    outside the run's own names is ever removed for it.

    Raises:
      RecordError when the record is not a JSON object of lists: what the run wrote is
      then unknown (never taken as nothing: its own checkpoints would look foreign).
    """
    record = {kind: [] for kind in _KINDS}
    if not exists(directory):
        return record
    path = _path(directory)
    try:
        stored = json.loads(fileio.read_text(path))
    except ValueError as err:  # not JSON, or not UTF-8
        stored = err
    if not (isinstance(stored, dict)
            and all(isinstance(stored.get(kind, []), list) for kind in _KINDS)):
        why = stored if isinstance(stored, ValueError) else "not a JSON object of lists"
        raise RecordError(
            f"{path} cannot be read ({why}): it records which checkpoints and files in "
            f"{directory} the run wrote. Restore it, or choose another output directory")
    for kind in _KINDS:
        record[kind] = [name for name in stored.get(kind, []) if _plain(name, kind)]
    return record


def _plain(name, kind: str) -> bool:
    """True for a name a run records: relative, inside the directory, no `.`/`..` part."""
    if not isinstance(name, str) or fileio.is_url(name) or os.path.isabs(name):
        return False
    if kind == "checkpoints":
        return _CHECKPOINT.fullmatch(name) is not None
    return all(part not in ("", ".", "..") for part in name.split("/"))


def _write(directory: str, record: dict) -> None:
    fileio.makedirs(directory)
    fileio.write_text(_path(directory), json.dumps(
        {kind: sorted(set(record[kind])) for kind in _KINDS}, indent=1) + "\n")


def add(directory: str, *, checkpoints=(), files=()) -> None:
    """Adds names (relative to `directory`, or paths under it) to the record."""
    record = read(directory)
    new = {"checkpoints": [_relative(p, directory) for p in checkpoints],
           "files": [_relative(p, directory) for p in files]}
    if all(set(new[kind]) <= set(record[kind]) for kind in _KINDS):
        return
    _write(directory, {kind: record[kind] + new[kind] for kind in _KINDS})


def forget(directory: str, *, checkpoints=(), files=()) -> None:
    """Drops names from the record (removed, or handed over to the user)."""
    if not exists(directory):
        return
    record = read(directory)
    gone = {"checkpoints": {_relative(p, directory) for p in checkpoints},
            "files": {_relative(p, directory) for p in files}}
    if not any(gone[kind] & set(record[kind]) for kind in _KINDS):
        return
    _write(directory, {kind: [n for n in record[kind] if n not in gone[kind]]
                       for kind in _KINDS})


def remove_record(directory: str) -> None:
    """Deletes the record itself (after what it lists has been removed)."""
    if exists(directory):
        fileio.remove(_path(directory))


def owns(directory: str, name: str) -> bool:
    """True when the record lists `name` (a file or directory) as the run's."""
    return _relative(name, directory) in read(directory)["files"]


def _relative(path: str, directory: str) -> str:
    """`path` relative to `directory` (names given relative stay as they are)."""
    path, directory = str(path).rstrip("/"), str(directory).rstrip("/")
    if not fileio.is_url(directory) and not fileio.is_url(path) and os.path.isabs(path):
        directory = os.path.abspath(directory)
    return path[len(directory) + 1:] if path.startswith(directory + "/") else path
