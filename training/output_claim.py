"""Owns a run's output_dir: one run at a time (a lock), and only runs of the same model (an identity).

A BERT run is days of accelerator time; its checkpoints must never be overwritten by a run
that cannot use them. Every runner claims its `output_dir` before any work:

* **Lock** (`output_dir/.run.lock`, JSON: host, pid, start time, command): created
  exclusively; a second run while the first is alive is refused, naming the first. A lock
  left by a crashed run (same host, process gone) is taken over with a warning; a lock of
  another host cannot be checked from here and is refused with the command to remove it.
* **Identity** (`output_dir/run_identity.json`): what makes checkpoints interchangeable:
  the `bert_config.json` contents and the runner's own keys (task, label list, ...). The
  first run writes it; a later run with a different identity is refused with the keys that
  differ and both values, instead of skipping the checkpoints and overwriting them.
  Settings that do not change the weights' meaning (batch size, learning rate, steps) are
  not part of it, so a run can be resumed with other ones.

Two steps, so that a run refused by any later check does not claim the directory: `claim`
takes the lock and compares the identity (writing nothing else) before any work; once the
run's every check has passed (flags, data, the model built, its checkpoint restored or
initialised), `RunDir.commit` writes the identity and removes what killed checkpoint saves
left (`training.checkpointing.remove_killed_save_leftovers`). A run released without a
commit removes the directory if the claim created it.

Only the chief of a multi-worker run locks and writes; every worker checks the identity.
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import socket
import sys

from data_prep import fileio
from data_prep.cli import UserError

LOCK_FILE = ".run.lock"
IDENTITY_FILE = "run_identity.json"


class RunDirError(UserError):
    """output_dir belongs to another run (alive, or of another model); the message says which."""


def _describe(lock: dict) -> str:
    return (f"pid {lock.get('pid')} on host {lock.get('host')!r}, started "
            f"{lock.get('started')}: {lock.get('command', '?')}")


def _read_json(path: str):
    try:
        return json.loads(fileio.read_text(path))
    except (ValueError, OSError):
        return None


class RunDir:
    """A claimed output_dir; release with `release()` (also at interpreter exit)."""

    def __init__(self, output_dir: str, identity: dict, *, is_chief: bool = True,
                 flag: str = "--output_dir"):
        self.output_dir = output_dir
        self.identity = _normalise(identity)
        self.is_chief = is_chief
        self.flag = flag
        self.lock_path = f"{output_dir.rstrip('/')}/{LOCK_FILE}"
        self.identity_path = f"{output_dir.rstrip('/')}/{IDENTITY_FILE}"
        self._locked = False
        self._committed = False
        self._created = None  # the outermost directory `lock` created, if any

    # ------------------------------------------------------------------------ lock
    def _try_create_lock(self) -> bool:
        record = {"host": socket.gethostname(), "pid": os.getpid(),
                  "started": datetime.datetime.now().isoformat(timespec="seconds"),
                  "command": " ".join(sys.argv)[:500]}
        text = json.dumps(record) + "\n"
        if fileio.is_url(self.lock_path):
            # Object stores have no exclusive create: check, then write (best effort).
            if fileio.exists(self.lock_path):
                return False
            fileio.write_text(self.lock_path, text)
            return True
        try:
            fd = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return True

    def lock(self) -> None:
        """Takes the lock or raises RunDirError naming the run that holds it."""
        self._created = _outermost_missing(self.output_dir)
        fileio.makedirs(self.output_dir)
        for _ in range(3):
            if self._try_create_lock():
                self._locked = True
                atexit.register(self.release)
                return
            holder = _read_json(self.lock_path) or {}
            host, pid = holder.get("host"), holder.get("pid")
            if host == socket.gethostname() and isinstance(pid, int):
                if pid == os.getpid():
                    raise RunDirError(f"{self.flag}={self.output_dir} is already claimed by "
                                      "this process")
                if fileio.pid_alive(pid):
                    raise RunDirError(
                        f"{self.flag}={self.output_dir} is in use by another run "
                        f"({_describe(holder)}); wait for it to finish or choose another "
                        f"{self.flag}")
                from absl import logging

                logging.warning("Taking over %s from a run that no longer runs (%s)",
                                self.lock_path, _describe(holder))
                fileio.remove(self.lock_path)
                continue
            if not holder:
                # Unreadable: a lock being written right now, or garbage. Refuse either way.
                raise RunDirError(f"{self.lock_path} exists but cannot be read; if no run is "
                                  f"using {self.output_dir}, delete it")
            raise RunDirError(
                f"{self.flag}={self.output_dir} is locked by a run on another host "
                f"({_describe(holder)}); if that run is gone, delete {self.lock_path}")
        raise RunDirError(f"could not take the lock {self.lock_path}")

    def release(self) -> None:
        """Gives the lock up; without a commit, also removes the directory `lock` created
        (a refused or failed run leaves nothing behind)."""
        if not self._locked:
            return
        self._locked = False
        holder = _read_json(self.lock_path) or {}
        if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            try:
                fileio.remove(self.lock_path)
            except OSError:
                pass
        if self._created and not self._committed:
            from absl import logging

            # output_dir, created by this claim and held under its lock since, is this
            # run's; a folder above it that the claim created too goes only when empty
            # (another run may have made its own output_dir in it meanwhile).
            folder = os.path.abspath(self.output_dir)
            try:
                fileio.remove(folder)
                folder = os.path.dirname(folder)
                while fileio.is_within(folder, self._created) and not fileio.listdir(folder):
                    fileio.remove(folder)
                    folder = os.path.dirname(folder)
            except OSError as err:
                logging.warning("Could not remove %s, created by this run: %s", folder, err)

    # -------------------------------------------------------------------- identity
    def _stored_identity(self):
        """The identity output_dir records (None: none yet); RunDirError if unreadable."""
        if not fileio.exists(self.identity_path):
            return None
        stored = _read_json(self.identity_path)
        if stored is None:
            raise RunDirError(f"{self.identity_path} cannot be read; it records which model "
                              f"the checkpoints in {self.output_dir} belong to")
        return stored

    def check_identity(self) -> None:
        """Raises RunDirError when output_dir holds another model's run (writes nothing)."""
        stored = self._stored_identity()
        if stored is None:
            return
        differences = identity_differences(stored, self.identity)
        if differences:
            listed = "; ".join(f"{key}: {old!r} there, {new!r} now"
                               for key, old, new in differences[:8])
            from training import checkpointing

            why = ("Its checkpoints would be overwritten" if checkpointing.checkpoints_on_disk(
                self.output_dir) else "It saved no checkpoint (it stopped before its first "
                f"save, or only evaluated), but its files are there; if it is not wanted, "
                f"delete {self.identity_path}")
            raise RunDirError(
                f"{self.flag}={self.output_dir} holds a run of another model ({listed}). "
                f"{why}; choose another {self.flag}, or delete the directory if that run is "
                "no longer wanted")

    def commit(self) -> None:
        """Takes the directory for this run, once every check of the run has passed: writes
        the identity (if new) and removes what killed checkpoint saves left (chief only;
        while locked, so never a live run's). Idempotent."""
        if self._committed:
            return
        if self.is_chief:
            from training import checkpointing

            if self._stored_identity() is None:
                fileio.write_text(self.identity_path,
                                  json.dumps(self.identity, indent=2, sort_keys=True) + "\n")
            checkpointing.remove_killed_save_leftovers(self.output_dir,
                                                       (LOCK_FILE, IDENTITY_FILE))
        self._committed = True


def _outermost_missing(path: str) -> str | None:
    """The outermost missing directory of a local `path` (what makedirs would create), or
    None when it exists (object stores have no directories to leave behind)."""
    if fileio.is_url(path) or os.path.lexists(path):
        return None
    path = os.path.abspath(path)
    while not os.path.lexists(os.path.dirname(path)):
        path = os.path.dirname(path)
    return path


def _normalise(value):
    """JSON-shaped copy (tuples -> lists) so identities compare as they are stored."""
    return json.loads(json.dumps(value, sort_keys=True))


def identity_differences(old, new, prefix=""):
    """[(dotted key, old value, new value)] where two identity dicts differ."""
    out = []
    for key in sorted(set(old) | set(new)):
        name = f"{prefix}{key}"
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out.extend(identity_differences(a, b, name + "."))
        elif a != b:
            out.append((name, a, b))
    return out


def claim(output_dir: str, identity: dict, *, is_chief: bool = True,
          flag: str = "--output_dir") -> RunDir:
    """Locks output_dir (chief only) and checks its identity, writing nothing but the lock;
    `commit()` once the run's checks have passed (see the module docstring).

    Args:
      output_dir: the run's directory (created if missing; gs:// works, with a best-effort
        lock).
      identity: JSON-serialisable dict of what must not change between runs in this
        directory (e.g. {"bert_config": ..., "task": ..., "labels": [...]}).
      is_chief: only the chief locks and writes the identity.

    Returns:
      The claimed RunDir (commit it before writing, release it when done; it is also
      released at exit).
    """
    run_dir = RunDir(output_dir, identity, is_chief=is_chief, flag=flag)
    if is_chief:
        run_dir.lock()
    try:
        run_dir.check_identity()
    except BaseException:
        run_dir.release()
        raise
    return run_dir
