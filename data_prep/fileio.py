"""Owns file I/O for every tool: local and URL paths, durable all-or-nothing outputs, temporaries.

* Paths with a scheme (`gs://`, `ram://`, `hdfs://`, `s3://`) go through `tf.io.gfile`;
  local paths through `os` and `open`, which behave the same for local files and cost no
  TensorFlow import (create_pretraining_data's workers never import TensorFlow).
* A temporary is named `DIR/.BASENAME.tmp-HOST-PID-HEX`: hidden, so the glob
  `BASENAME*` of the final name (the original README's `--input_file=tf_examples.tfrecord*`)
  never matches it, and recognisable (`is_temporary`), so readers skip it in a glob like
  `DIR/*` and the next run that owns the output removes the ones a killed run left behind
  (`clean_stale_temporaries`: only those of a process of this host that no longer runs).
  A run's scratch folder (`work_directory`, e.g. the Beam pipeline's
  `.NAME.beam-work.tmp-*`) is a temporary of a name of its own, cleaned the same way.
* `AtomicOutputs` writes a SET of outputs (records + summary, predictions + results, a
  SavedModel directory) under temporaries and renames them into place only when the whole
  set is complete; on any exit path (an exception, Ctrl-C, SIGTERM turned into SystemExit
  by `data_prep.lifecycle.exit_cleanly_on_signals`) the temporaries are removed and the
  previous outputs, if any, stay as they were. The renames themselves are the only window
  in which a crash (kill -9, power loss: the catchable signals are held while they run)
  leaves a mix of old and new files (they are listed in order, data first, marker files
  last). A directory that replaces an existing one (`replace_directories`)
  is swapped in with one atomic exchange on local Linux filesystems, so the final name
  always holds the old or the new directory, never neither.
* Durability (local paths). `AtomicOutputs.commit` first syncs every temporary (`sync`:
  `fsync` of a file; for a directory, of every file in it and of every directory in it,
  deepest first, itself last), and only then renames; after the renames it syncs each
  output's parent directory. So once `commit` returns, the set survives a power cut or
  an operating-system crash; before, a crash leaves the previous outputs (or, inside the
  renames' window above, data files renamed beside previous marker files), never an empty
  or partial file under a final name, as a rename of unsynced data can on ext4, XFS or
  btrfs (the rename can reach the disk before the data). SQLite syncs the same way.
  An `fsync` that fails (EIO, ENOSPC on some file systems) fails the commit before any
  rename: the temporaries are removed and the previous outputs stay. A file system that
  cannot sync a directory (EINVAL) gives its entries the durability it has.
* URL paths have no `fsync`: there the guarantee is the file system's. A file system that
  renames (HDFS, `ram://`, ...) gets temporaries beside the outputs and renames, as a
  local disk. An object store (`OBJECT_STORE_SCHEMES`: gs://, s3://, ...) cannot rename
  (a rename is a copy and a delete: the data written twice, and not atomic), but it makes
  an object visible, complete, only when its upload is closed. So there each output is
  staged under a local temporary (`staging_name`, in the system's temporary folder:
  TensorFlow's own GCS writer buffers every file it writes in a local file too) and, on
  commit, uploaded once under its final name: each object appears complete or not at all,
  and nothing is uploaded before the whole set is complete. A set (or a directory) of
  several objects can still be seen half-uploaded after a crash during the uploads, as a
  local set inside its renames. Temporaries written by other processes or machines (the
  Beam pipeline's workers: `shared_temporaries=True`) stay beside the outputs, on the
  store, and are copied into place. `ram://` is memory and is lost with the process.
* `check_outputs` refuses, before any work, an output that is also an input, two outputs
  with the same name, and an output that is an existing directory.

Which to use for what (the rule a reviewer applies to every file access in the project):

1. An OUTPUT (a file or directory a tool leaves for the user or a later run: records,
   summaries, vocabularies, configs, cached features, eval and prediction files, exports,
   converted checkpoints, the files beside checkpoints) is written only through this
   module: `write_text`, `write_texts`, `write_bytes`, `copy_file`, or `AtomicOutputs`
   for a set, also when another library writes the bytes: it writes into the set's
   temporary (`tf.io.TFRecordWriter(out.temp(path))`, `tf.saved_model.save(m,
   out.temp(dir))`, a converted checkpoint saved into a `work_directory` and renamed
   into the set's temporaries). Never `open(path, "w")`, `tf.io.gfile.GFile(path, "w")`,
   `tf.io.gfile.copy` or `rename` onto a final name: the partial file a kill leaves there
   is what this module exists to prevent. `tests/test_file_layer.py` finds such calls
   (predict_saved_model.py, which imports no project code, inlines the same steps).
2. Not outputs, written by their own protocol: the training checkpoints
   (`tf.train.CheckpointManager`; `training/checkpointing.py` prunes and sets them aside
   with `tf.io.gfile`), TensorBoard event files and logs (append streams), the run lock
   (an exclusive create, `training/run_dir.py`) and scratch space (`work_directory`).
3. Reading, listing, testing, making directories, removing what the tool owns: either
   layer. Code that already imports TensorFlow (modeling/, training/, tasks/, runners)
   may call `tf.io.gfile` directly; data_prep/ uses this module's thin wrappers
   (`open_file`, `exists`, `glob`, ...), which go to `os` for local paths so that its
   processes (create_pretraining_data's workers) never import TensorFlow. A glob that
   can meet a writer's temporaries (`DIR/*`) uses `glob` here, or drops `is_temporary`
   names, so a temporary is never read as data.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
import tempfile
import uuid
from typing import Iterable, Mapping, Sequence

from data_prep.cli import UserError

TEMP_MARK = ".tmp-"
# URL schemes of object stores: no rename (a copy and a delete), but an object appears,
# complete, only when its upload is closed (see the module docstring).
OBJECT_STORE_SCHEMES = frozenset({"gs", "s3", "az", "oss"})


class OutputError(UserError):
    """An output path that would destroy data or cannot be written; names the flag and path."""


# ------------------------------------------------------------------ local or URL paths


def is_url(path: str) -> bool:
    """True for paths with a scheme (gs://, ram://, ...) that only tf.io.gfile can open."""
    return "://" in str(path)


def is_object_store(path: str) -> bool:
    """True for a path on an object store (`OBJECT_STORE_SCHEMES`), where outputs are
    uploaded once, complete, instead of renamed."""
    return is_url(path) and str(path).split("://", 1)[0].lower() in OBJECT_STORE_SCHEMES


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def open_file(path: str, mode: str = "r", encoding: str = "utf-8", newline: str | None = None):
    """Opens `path` (local or URL) like `open`; text modes are UTF-8 by default.

    For URL paths text is read and written through `tf.io.gfile.GFile`, which (like
    `newline=""`) does not translate line endings.
    """
    path = str(path)
    if is_url(path):
        return _gfile_class()(path, mode)
    if "b" in mode:
        return open(path, mode)
    return open(path, mode, encoding=encoding, newline=newline)


def _gfile_class():
    """`tf.io.gfile.GFile` that also writes memoryviews (records sliced from a chunk's
    data), as local files do."""
    global _GFILE_CLASS
    if _GFILE_CLASS is None:
        class GFile(_gfile().GFile):
            def write(self, data):
                super().write(bytes(data) if isinstance(data, memoryview) else data)

        _GFILE_CLASS = GFile
    return _GFILE_CLASS


_GFILE_CLASS = None


def exists(path: str) -> bool:
    return _gfile().exists(path) if is_url(path) else os.path.exists(path)


def isdir(path: str) -> bool:
    return _gfile().isdir(path) if is_url(path) else os.path.isdir(path)


def isfile(path: str) -> bool:
    return exists(path) and not isdir(path)


def getsize(path: str) -> int:
    return _gfile().stat(path).length if is_url(path) else os.path.getsize(path)


def makedirs(path: str) -> None:
    if not path:
        return
    if is_url(path):
        _gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def listdir(path: str) -> list[str]:
    return _gfile().listdir(path) if is_url(path) else os.listdir(path)


def remove(path: str) -> None:
    """Removes a file or a directory tree; nothing if it does not exist."""
    if not exists(path):
        return
    if isdir(path):
        rmtree(path)
    elif is_url(path):
        _gfile().remove(path)
    else:
        os.remove(path)


def rmtree(path: str) -> None:
    if is_url(path):
        _gfile().rmtree(path)
    else:
        import shutil

        shutil.rmtree(path)


def rename(src: str, dst: str, overwrite: bool = True) -> None:
    """Renames a file (atomic on local filesystems; a copy + delete on some object stores)."""
    if is_url(src) or is_url(dst):
        _gfile().rename(src, dst, overwrite=overwrite)
    elif overwrite:
        os.replace(src, dst)
    else:
        if os.path.exists(dst):
            raise FileExistsError(errno.EEXIST, "destination exists", dst)
        os.rename(src, dst)


def glob(pattern: str) -> list[str]:
    """Sorted matches of `pattern`, temporaries of this module excluded."""
    if is_url(pattern):
        matches = _gfile().glob(pattern)
    else:
        import glob as glob_module

        # tf.io.gfile.glob matches hidden files with `*`; do the same locally so a pattern
        # means one thing everywhere, then drop our temporaries.
        matches = glob_module.glob(pattern, include_hidden=True) \
            if _glob_has_include_hidden() else glob_module.glob(pattern)
    return sorted(m for m in matches if not is_temporary(m))


def _glob_has_include_hidden() -> bool:
    import sys

    return sys.version_info >= (3, 11)


def parent_dir(path: str) -> str:
    path = str(path).rstrip("/")
    return path.rsplit("/", 1)[0] if "/" in path else "."


def basename(path: str) -> str:
    return str(path).rstrip("/").rsplit("/", 1)[-1]


def same_path(a: str, b: str) -> bool:
    """True when two paths name the same file (symlinks and relative paths resolved; for
    paths that do not exist, the resolved names are compared)."""
    if is_url(a) or is_url(b):
        return str(a).rstrip("/") == str(b).rstrip("/")
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


# ------------------------------------------------------------------------ temporaries


_HOST = socket.gethostname().replace("-", "_").replace(".", "_") or "host"


def temporary_path(final_path: str) -> str:
    """A fresh temporary beside `final_path`: DIR/.BASENAME.tmp-HOST-PID-HEX."""
    name = basename(final_path)
    directory = parent_dir(final_path)
    temp = f".{name}{TEMP_MARK}{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return temp if directory == "." and not str(final_path).startswith("./") \
        else f"{directory}/{temp}"


def is_temporary(path: str) -> bool:
    """True for a name made by `temporary_path` (readers never take these)."""
    name = basename(path)
    return name.startswith(".") and TEMP_MARK in name


def _owner(temp_name: str):
    """(host, pid) of a temporary's name, or None if it is not one of ours."""
    tail = temp_name.rsplit(TEMP_MARK, 1)[-1]
    parts = tail.split("-")
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def pid_alive(pid: int) -> bool:
    """True if a process with this id runs on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_temporaries(final_path: str) -> list[str]:
    """Removes temporaries of `final_path` left by dead processes of this host; returns them.

    A temporary whose process still runs (a concurrent writer) or that another host made
    (its process cannot be checked from here) is left alone.
    """
    directory = parent_dir(final_path)
    prefix = f".{basename(final_path)}{TEMP_MARK}"
    if not isdir(directory):
        return []
    removed = []
    for name in listdir(directory):
        name = name.rstrip("/")
        if not name.startswith(prefix):
            continue
        owner = _owner(name)
        if owner is None or owner[0] != _HOST or pid_alive(owner[1]):
            continue
        path = f"{directory}/{name}" if directory != "." else name
        try:
            remove(path)
        except OSError:
            continue
        removed.append(path)
    if removed:
        from absl import logging

        logging.warning("Removed %d temporary file(s) left by an interrupted run: %s",
                        len(removed), ", ".join(removed[:3]))
    return removed


@contextlib.contextmanager
def work_directory(name: str):
    """A fresh hidden work folder beside `name` for the block: `temporary_path(name)`.

    Scratch space of a run (the Beam pipeline's sorting buckets), not an output: never
    synced, removed when the block ends, whatever the exit. A `kill -9` leaves it behind,
    so the folders of dead processes of this host under the same `name` are removed first
    (`clean_stale_temporaries`): leftovers do not pile up run after run.
    """
    clean_stale_temporaries(name)
    path = temporary_path(name)
    makedirs(path)
    try:
        yield path
    finally:
        remove(path)


# ----------------------------------------------------------------------- output checks


def check_outputs(outputs: Sequence[tuple[str, str]], inputs: Iterable[tuple[str, str]] = (),
                  allow_directory: bool = False) -> None:
    """Refuses outputs that would destroy data, before any work.

    Args:
      outputs: (flag, path) of every file the run will write.
      inputs: (flag, path) of every file it reads.
      allow_directory: outputs that are directories (SavedModels) may exist as directories.

    Raises:
      OutputError naming the flag(s) and path: an output equal to an input, two outputs
      with the same name, an output that is an existing directory.
    """
    inputs = [(flag, path) for flag, path in inputs if path]
    seen: list[tuple[str, str]] = []
    for flag, path in outputs:
        # same_path also compares paths that do not exist yet (`out` and `./out`).
        for in_flag, in_path in inputs:
            if same_path(path, in_path):
                raise OutputError(f"{flag}={path} is also an input ({in_flag}={in_path}); "
                                  "refusing to overwrite an input")
        for other_flag, other in seen:
            if same_path(path, other):
                raise OutputError(f"{flag}: {path} is named twice as an output "
                                  f"(also by {other_flag})")
        if not allow_directory and isdir(path):
            raise OutputError(f"{flag}={path} is a directory; expected a file name")
        seen.append((flag, path))


# ------------------------------------------------------------------ all-or-nothing sets


class AtomicOutputs:
    """A set of outputs that appears completely or not at all, and durably once committed
    (see the module docstring).

    Usage:
        with AtomicOutputs(["out/a.tfrecord", "out/a.json"]) as out:
            with out.open("out/a.tfrecord", "wb") as f: ...
            writer = SomeWriter(out.temp("out/a.json"))
        # here both are in place; after an exception neither temporary remains.

    Args:
      paths: final paths, in the order they are renamed into place on commit (put marker
        or summary files last).
      replace_directories: a final path that is an existing directory (a previous export)
        is replaced by the new one; otherwise outputs are files.
      shared_temporaries: the temporaries are written by other processes or machines
        (Beam workers), so they stay beside the final paths also on an object store,
        rather than staged in this machine's temporary folder.
    """

    def __init__(self, paths: Sequence[str], replace_directories: bool = False,
                 shared_temporaries: bool = False):
        self.paths = [str(p) for p in paths]
        if len(set(self.paths)) != len(self.paths):
            raise OutputError(f"an output is named twice: {self.paths}")
        self.replace_directories = replace_directories
        # Outputs on an object store are staged locally and uploaded on commit.
        self.staged = set() if shared_temporaries else {
            p for p in self.paths if is_object_store(p)}
        self.staging = temporary_path(staging_name()) if self.staged else None
        self.temps = {p: f"{self.staging}/{i}-{basename(p)}" if p in self.staged
                      else temporary_path(p) for i, p in enumerate(self.paths)}
        self.committed = False

    def __enter__(self):
        for path in self.paths:
            makedirs(parent_dir(path))
            clean_stale_temporaries(path)
        if self.staging:
            clean_stale_temporaries(staging_name())  # a killed run's staged outputs
            makedirs(self.staging)
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None and not self.committed:
            try:
                self.commit()
            except BaseException:
                self.abort()
                raise
        elif exc_type is not None:
            self.abort()
        return False

    def temp(self, path: str) -> str:
        """The temporary to write in place of final `path`."""
        return self.temps[str(path)]

    def open(self, path: str, mode: str = "w", **kwargs):
        """Opens the temporary of `path` for writing (see `open_file`)."""
        return open_file(self.temp(path), mode, **kwargs)

    def copy(self, src: str, path: str) -> None:
        """Writes a copy of the file `src` (local or URL) as the temporary of `path`."""
        with open_file(src, "rb") as reader, self.open(path, "wb") as writer:
            for block in iter(lambda: reader.read(1 << 20), b""):
                writer.write(block)

    def commit(self) -> None:
        """Makes every temporary durable, renames them into place, then makes the names durable.

        1. Each temporary is synced (`sync`) before any rename: a final name can then only
           come to hold complete data, also after a power cut. A failure here (EIO) leaves
           every final name as it was.
        2. The renames, in the order given (data first, marker files last), with Ctrl-C,
           SIGTERM and SIGHUP held (`lifecycle.signals_deferred`): they end the run before
           the set is committed or after, never with part of it renamed.
        3. Each output's parent directory is synced (`sync_directory`), so the new names
           are on disk when this returns.

        URL paths skip 1 and 3 (no fsync there: see the module docstring); in 2 an
        output on an object store is uploaded from its local stage (`_upload`) rather
        than renamed.
        """
        from data_prep import lifecycle

        missing = [p for p in self.paths if not exists(self.temps[p])]
        if missing:
            raise RuntimeError(f"outputs were never written: {missing}")
        for path in self.paths:
            if not is_url(path):
                sync(self.temps[path])
        with lifecycle.signals_deferred():
            for path in self.paths:
                temp = self.temps[path]
                if path in self.staged:
                    _upload(temp, path, self.replace_directories)
                elif isdir(temp):
                    _replace_directory(temp, path, self.replace_directories)
                else:
                    rename(temp, path, overwrite=True)
            self.committed = True
            for directory in dict.fromkeys(parent_dir(path) for path in self.paths):
                sync_directory(directory)
        self._remove_staging()

    def abort(self) -> None:
        """Removes every temporary (best effort: called while failing anyway)."""
        for temp in self.temps.values():
            try:
                remove(temp)
            except Exception:  # noqa: BLE001
                pass
        self._remove_staging()

    def _remove_staging(self) -> None:
        if self.staging:
            try:
                remove(self.staging)
            except OSError:
                pass


def staging_name() -> str:
    """Whose temporaries are the local staging folders of outputs bound for an object
    store: `TMPDIR/.bert-staging.tmp-HOST-PID-HEX`, in the system's temporary folder."""
    return os.path.join(tempfile.gettempdir(), "bert-staging")


def _upload(local: str, final: str, replace_directory: bool) -> None:
    """Puts a staged local file or directory at `final` on an object store: every object
    written once, under its final name, by one upload that makes it visible only when
    complete (`tf.io.gfile.copy`). A directory that replaces an earlier one (an export)
    gets every new file first, then loses the earlier files it no longer holds."""
    if not os.path.isdir(local):
        _gfile().copy(local, final, overwrite=True)
        return
    earlier = set()
    if exists(final):
        if not replace_directory:
            raise OutputError(f"{final} exists and is not replaced")
        earlier = {f"{root.rstrip('/')}/{name}" for root, _, names in _gfile().walk(final)
                   for name in names}
    written = set()
    for root, _, names in os.walk(local):
        relative = os.path.relpath(root, local)
        target = final if relative == "." else f"{final}/{relative.replace(os.sep, '/')}"
        makedirs(target)
        for name in names:
            _gfile().copy(os.path.join(root, name), f"{target}/{name}", overwrite=True)
            written.add(f"{target}/{name}")
    for stale in sorted(earlier - written):
        remove(stale)


def sync(path: str) -> None:
    """Makes a written local file or directory tree durable (`fsync`); nothing for URLs.

    A file: its data and metadata. A directory (a SavedModel): every file in it and every
    directory in it, deepest first, then itself, so that its entries (the names of what it
    holds) are durable too; symbolic links are entries, not followed. Files are synced by
    path, so whoever wrote them (this process, TensorFlow's writers, another process on
    this host such as a Beam worker) does not matter: `fsync` writes the file's dirty
    pages, whichever descriptor made them.
    """
    if is_url(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        for root, _, files in os.walk(path, topdown=False):
            for name in files:
                file_path = os.path.join(root, name)
                if not os.path.islink(file_path):
                    _fsync(file_path, directory=False)
            _fsync(root, directory=True)
    else:
        _fsync(path, directory=False)


def sync_directory(path: str) -> None:
    """Makes a local directory's entries durable (names created, renamed or removed in
    it); nothing for URLs."""
    if not is_url(path):
        _fsync(path or ".", directory=True)


def _fsync(path: str, directory: bool) -> None:
    """`fsync` of one local file or directory, opened read-only by path."""
    if directory and os.name == "nt":  # Windows cannot open a directory to sync it
        return
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    except OSError as err:
        # Some file systems cannot sync a directory (EINVAL): its entries then have the
        # durability that file system gives them. A file that cannot be synced is an error.
        if not (directory and err.errno in (errno.EINVAL, errno.EBADF, errno.ENOTSUP)):
            raise
    finally:
        os.close(fd)


def _replace_directory(temp: str, final: str, allowed: bool) -> None:
    if not is_url(final) and os.path.islink(final):
        # Both ways below would replace the link itself, then fail removing it as the
        # previous directory: refused before either (callers refuse it first, by flag).
        raise OutputError(f"{final} is a symbolic link to {os.readlink(final)}; it is not "
                          "replaced (give the directory itself)")
    if not exists(final):
        rename(temp, final, overwrite=False)
        return
    if not allowed:
        raise OutputError(f"{final} exists and is not replaced")
    if _exchange(temp, final):
        # One atomic step: `final` is the new directory, `temp` now holds the previous one
        # (a kill before its removal leaves only a stale temporary, cleaned by the next run).
        remove(temp)
        return
    # No atomic exchange here (object stores, non-Linux): a kill between the two renames
    # leaves the previous directory under a temporary name.
    old = temporary_path(final)
    rename(final, old, overwrite=False)
    try:
        rename(temp, final, overwrite=False)
    except BaseException:
        rename(old, final, overwrite=False)
        raise
    remove(old)


def _exchange(a: str, b: str) -> bool:
    """Atomically swaps two local paths (Linux renameat2 RENAME_EXCHANGE); False when the
    platform or filesystem cannot, so the caller falls back to two renames."""
    if is_url(a) or is_url(b) or not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):  # glibc < 2.28 or another libc
        return False
    at_fdcwd, rename_exchange = -100, 2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), b)


def is_within(path: str, directory: str) -> bool:
    """True when `path` is `directory` or lies inside it (symlinks and `..` resolved)."""
    if is_url(path) or is_url(directory):
        path, directory = str(path).rstrip("/"), str(directory).rstrip("/")
        return path == directory or path.startswith(directory + "/")
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([path, directory]) == directory


def write_text(path: str, text: str) -> None:
    """Writes a text file (UTF-8, `\\n` line ends) all-or-nothing and synced (`AtomicOutputs`)."""
    write_texts({path: text})


def write_texts(texts: Mapping[str, str]) -> None:
    """Writes several text files (path -> text; UTF-8, `\\n` line ends) as one
    all-or-nothing, synced set (`AtomicOutputs`): a run's prediction and result files
    appear together or not at all."""
    with AtomicOutputs(list(texts)) as out:
        for path, text in texts.items():
            with out.open(path, "w", newline="\n") as f:
                f.write(text)


def write_bytes(path: str, data: bytes) -> None:
    """Writes a binary file all-or-nothing and synced (`AtomicOutputs`)."""
    with AtomicOutputs([path]) as out:
        with out.open(path, "wb") as f:
            f.write(data)


def copy_file(src: str, dst: str) -> None:
    """Copies a file (local or URL, either side) to `dst` all-or-nothing and synced, as
    every output (`tf.io.gfile.copy` writes the destination in place, unsynced)."""
    with AtomicOutputs([dst]) as out:
        out.copy(src, dst)


def read_text(path: str) -> str:
    with open_file(path, "r") as f:
        return f.read()


# ------------------------------------------------------------------ input identity


def sha256(path: str) -> str:
    """Hex SHA-256 of a file's bytes (local or URL), read in 1 MiB blocks."""
    import hashlib

    digest = hashlib.sha256()
    with open_file(path, "rb") as reader:
        for block in iter(lambda: reader.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(path: str) -> dict:
    """A file's identity for cache keys: absolute path (or URL), size and mtime in ns."""
    if is_url(path):
        stat = _gfile().stat(path)
        return {"path": str(path), "size": stat.length, "mtime_ns": stat.mtime_nsec}
    stat = os.stat(path)
    return {"path": os.path.abspath(path), "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns}
