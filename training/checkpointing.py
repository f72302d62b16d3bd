"""Owns training checkpoints: what is saved, where each worker writes, and safe resumption.

The object graph is `tf.train.Checkpoint(model=model, optimizer=Checkpoint(variables=[...]),
step=global_step, rng=Checkpoint(states=[...]))` (plus `loss_scale=Checkpoint(dynamic_scale,
step_counter)` when training in float16, and `input=Checkpoint(iterator, identity)`, the
position of the training input, once training starts: `input_position`, and
`divergence=Checkpoint(start, steps, recent)`, the loop's divergence check), written by a
`tf.train.CheckpointManager` as `output_dir/ckpt-<step>.{index,data-*}`. `rng` holds the
states of the model's Keras seed generators (dropout): Keras does not put them in a
`tf.train.Checkpoint` of the model, and a resumed run must draw the dropout masks the
uninterrupted run would have drawn. `optimizer` holds the optimizer's variables (its step
count and moments, `optimizer_state`), not the Keras optimizer, which also tracks the model's
variables: a checkpoint names each variable by its shortest path, which would then be
"optimizer/_trainable_variables/N" instead of "model/encoder/...", and the checkpoint's keys
would stop being the names `modeling.checkpoints` reads.

Crash safety: a checkpoint's files are complete before the manager rewrites the small
`checkpoint` state file, and that file is replaced atomically (write + rename), so a process
killed at any moment leaves `latest_checkpoint` naming a complete checkpoint. After each
save the chief `fsync`s the new files, the state file and the directory (TensorFlow syncs
nothing), so a power cut can damage at most a save in progress. `restore_latest` still
falls back to older checkpoints if the newest cannot be read (a damaged disk, a copy
interrupted by hand), and to the `ckpt-<N>.index` files on disk, newest first, when the
state file itself is empty or unreadable (a power cut before TensorFlow's unsynced
rename reached the disk); `CheckpointSaver` then rewrites the state file from them.

A run acts only on its own checkpoints (`own_checkpoints`): those `training.run_files`
records (the saver records each name before saving it). A `ckpt-<N>` in the directory
that is not (a user's, e.g. the `--init_checkpoint` copied there) is never restored,
overwritten, rotated, moved or removed: a run whose own saves would reuse its name is
refused at its start (`check_no_foreign`). Its state file lists only those; a
`checkpoint` file naming others (copied from another run, edited by hand) or none at all
is not used, and a run that recorded no checkpoint refuses it (`check_state_file`)
rather than let its saves replace it and the CheckpointManager's rotation delete what it
names. A run that diverged moves its checkpoints whose weights led there into a new
numbered folder `output_dir/diverged/<n>/` (`set_aside`, called by `training.loop`), so
that a rerun resumes the newest sound one; they leave the record, kept for the user.

Multi-worker: every worker must call `save` (the save may involve collectives); only the
chief writes into `output_dir`, the others into a temporary directory that is deleted after
each save, as TensorFlow's multi-worker guide prescribes.

A save killed midway (kill -9, a preempted VM) leaves TensorFlow's temporaries: the
`<prefix>_temp/` folder the shards are written into before they are merged (the size of
a checkpoint: hundreds of MB for BERT-base), a `checkpoint.tmp<hex>` state file, and our
non-chief `workertemp_<task>_<id>/` folders. Nothing of TensorFlow removes them later;
`remove_killed_save_leftovers` does, for the next run that owns the directory, by the
names the run recorded (never a pattern over the directory), and each non-chief worker
removes its own `workertemp_` folder when its saver is made.
"""

from __future__ import annotations

import json
import os
import re
from typing import Sequence

import tensorflow as tf
from absl import logging

from data_prep import fileio, lifecycle
from data_prep.cli import UserError
from training import run_files


def make_checkpoint(model, optimizer, step, loss_scale_optimizer=None,
                    divergence=None) -> tf.train.Checkpoint:
    """The checkpoint object graph used by every runner (see module docstring);
    `divergence`: the loop's divergence check state (`training.loop`)."""
    objects = {"model": model, "optimizer": optimizer_state(optimizer), "step": step}
    if divergence is not None:
        objects["divergence"] = divergence
    states = seed_generator_states(model)
    if states:
        objects["rng"] = tf.train.Checkpoint(states=states)
    if loss_scale_optimizer is not None:
        # Only the scale's own state: the wrapper also tracks the model's variables, which
        # would take over their checkpoint names (as the optimizer, `optimizer_state`).
        objects["loss_scale"] = tf.train.Checkpoint(
            dynamic_scale=_tf_variable(loss_scale_optimizer.dynamic_scale),
            step_counter=_tf_variable(loss_scale_optimizer.step_counter))
    return tf.train.Checkpoint(**objects)


def optimizer_state(optimizer) -> tf.train.Checkpoint:
    """The built `optimizer`'s variables (step count, moments) in their order, as the
    checkpoint's `optimizer` (see module docstring)."""
    if not optimizer.built:
        raise ValueError("build the optimizer on the model's variables before checkpointing "
                         "it: an unbuilt optimizer has no moments to save")
    return tf.train.Checkpoint(variables=[_tf_variable(v) for v in optimizer.variables])


def seed_generator_states(model) -> list:
    """The state variables of the model's Keras seed generators (dropout), in the model's
    variable order (the same for the same model code, whatever the process)."""
    return [_tf_variable(v) for v in model.variables
            if v.path.rsplit("/", 1)[-1] == "seed_generator_state"]


def _tf_variable(variable):
    return getattr(variable, "value", variable) if not isinstance(variable, tf.Variable) \
        else variable


class CheckpointSaver:
    """A CheckpointManager in `directory` on the chief, in a temporary directory elsewhere."""

    def __init__(self, checkpoint: tf.train.Checkpoint, directory: str, *, is_chief: bool = True,
                 worker_tag: str = "worker_0", max_to_keep: int = 5):
        self.checkpoint = checkpoint
        self.directory = directory
        self.is_chief = is_chief
        self._write_dir = directory if is_chief else os.path.join(directory,
                                                                  f"workertemp_{worker_tag}")
        if is_chief:
            repair_state_file(directory)
        elif tf.io.gfile.exists(self._write_dir):  # this worker's, left by a killed save
            tf.io.gfile.rmtree(self._write_dir)
        self.manager = tf.train.CheckpointManager(
            checkpoint, self._write_dir, max_to_keep=max_to_keep if is_chief else 1)

    def save(self, step: int) -> str | None:
        """Saves at `step`; returns the chief's checkpoint path (None on other workers).

        Ctrl-C, SIGTERM and SIGHUP are held while the checkpoint is written: the run stops
        right after it, with the checkpoint complete, never in the middle of TensorFlow's
        save (which, cut there, fails with an unrelated error instead of a clean exit).
        """
        if self.is_chief:  # recorded first: a kill during the save leaves it the run's
            run_files.add(self.directory, checkpoints=[f"ckpt-{int(step)}"])
        with lifecycle.signals_deferred():
            path = self.manager.save(checkpoint_number=step)
        if not self.is_chief:
            tf.io.gfile.rmtree(self._write_dir)
            return None
        _sync_checkpoint(path)
        return path


def _sync_checkpoint(prefix: str) -> None:
    """fsync of a saved checkpoint's files, the state file and their directory (local
    paths; object stores have no fsync), so that a power cut cannot lose a checkpoint
    the state file already lists."""
    directory = os.path.dirname(prefix)
    for path in checkpoint_files(prefix) + [os.path.join(directory, "checkpoint")]:
        if tf.io.gfile.exists(path):
            fileio.sync(path)
    fileio.sync_directory(directory)


_CHECKPOINT_INDEX = re.compile(r"ckpt-(\d+)\.index")


def checkpoint_files(prefix: str) -> list[str]:
    """The files of the checkpoint `prefix` that are there: its `.index` and its
    `.data-NNNNN-of-NNNNN` shards, by TensorFlow's names (never another file whose name
    merely starts with the prefix, such as a user's `ckpt-6.notes.txt`)."""
    name = re.escape(os.path.basename(prefix))
    files = re.compile(name + r"\.(index|data-\d{5}-of-\d{5})")
    return [path for path in tf.io.gfile.glob(prefix + ".*")
            if files.fullmatch(os.path.basename(path))]


def checkpoints_on_disk(directory: str) -> list[str]:
    """Prefixes of the `ckpt-<N>` checkpoints whose index file is in `directory`, newest
    (largest N) first, whoever wrote them (`own_checkpoints`: the run's)."""
    if not tf.io.gfile.isdir(directory):
        return []
    found = []
    for name in tf.io.gfile.listdir(directory):
        match = _CHECKPOINT_INDEX.fullmatch(name.rstrip("/"))
        if match:
            found.append((int(match.group(1)), os.path.join(directory, f"ckpt-{match.group(1)}")))
    return [path for _, path in sorted(found, reverse=True)]


def own_checkpoints(directory: str) -> list[str]:
    """Prefixes of the run's own checkpoints in `directory` whose files are there, newest
    first: those `run_files` records (see the module docstring); never a `ckpt-<N>` the
    run did not write."""
    names = set(run_files.read(directory)["checkpoints"])
    return [p for p in checkpoints_on_disk(directory) if os.path.basename(p) in names]


class CheckpointCollisionError(UserError):
    """output_dir holds a checkpoint the run did not write under a name its own saves
    would take (the message names it and the way out)."""


def check_no_foreign(directory: str, after_step: int, until_step: int,
                     init_checkpoint: str | None = None) -> None:
    """Raises CheckpointCollisionError when `directory` holds a `ckpt-<N>` the run did not
    write with `after_step` < N <= `until_step`: one of its saves would overwrite it (and
    rotation then delete it). Writes nothing."""
    own = set(own_checkpoints(directory))
    foreign = [p for p in checkpoints_on_disk(directory)
               if p not in own and after_step < _step_of(p) <= until_step]
    if not foreign:
        return
    prefix = foreign[-1]
    given = " (it is --init_checkpoint)" if init_checkpoint and os.path.abspath(
        init_checkpoint.rstrip("/")) == os.path.abspath(prefix) else ""
    raise CheckpointCollisionError(
        f"{prefix} is a checkpoint this run did not write{given}, but the run saves its own "
        f"checkpoints as {os.path.join(directory, 'ckpt-<step>')} up to step {until_step}: "
        f"it would be overwritten. Move it out of {directory} (and pass its new path), or "
        "choose another output directory")


def remove_checkpoints(directory: str) -> list[str]:
    """Removes the run's own checkpoints of `directory` (`own_checkpoints`: their files)
    and the state file naming them, the state file last; returns the paths removed. For a
    run that must start over (`training.sweeps.remove_run`); call it only while owning
    the directory."""
    removed = []
    own = own_checkpoints(directory)
    for prefix in own:
        for path in sorted(checkpoint_files(prefix), key=lambda p: p.endswith(".index")):
            tf.io.gfile.remove(path)  # the index last: what a kill leaves is still found
            removed.append(path)
    state_file = os.path.join(directory, "checkpoint")
    if tf.io.gfile.exists(state_file):
        tf.io.gfile.remove(state_file)
        removed.append(state_file)
    run_files.forget(directory, checkpoints=[os.path.basename(p) for p in own])
    return removed


def _read_state(directory: str):
    """(the state file's CheckpointState or None, the error when it exists but cannot be
    parsed: empty or garbled by a power cut)."""
    try:
        state = tf.train.get_checkpoint_state(directory)
    except (ValueError, tf.errors.OpError) as err:  # empty, or no latest checkpoint named
        return None, err
    if state is None and tf.io.gfile.exists(os.path.join(directory, "checkpoint")):
        # TensorFlow logs a parse (or read) error and returns None, as for no file at all.
        return None, ValueError("not a checkpoint state (garbled)")
    if state is not None:
        # The run's state file names the run's checkpoints (TensorFlow joins relative
        # names onto the directory). One naming others' (a checkpoint elsewhere, one the
        # run did not save: copied from another run, edited by hand) is not used: the
        # run would resume from them and the CheckpointManager's rotation delete them.
        recorded = set(run_files.read(directory)["checkpoints"])
        listed = [*state.all_model_checkpoint_paths, state.model_checkpoint_path]
        foreign = [p for p in listed if p and not (
            fileio.same_path(os.path.dirname(p), directory) and os.path.basename(p) in recorded)]
        if foreign:
            return None, ValueError(f"it lists {foreign[0]}, which this run did not save "
                                    f"in {directory}")
    return state, None


class StateFileError(UserError):
    """output_dir holds a `checkpoint` file that is not this run's state file (it cannot
    be read and the run recorded no checkpoint there): the first save would replace it."""


def check_state_file(directory: str) -> None:
    """Raises StateFileError when `directory` holds a `checkpoint` file that is not the
    run's state file: unreadable, or naming checkpoints the run did not save there
    (`_read_state`), while the run recorded no checkpoint there. Writes nothing."""
    _, err = _read_state(directory)
    if err is not None and not run_files.read(directory)["checkpoints"]:
        state_file = os.path.join(directory, "checkpoint")
        raise StateFileError(
            f"{state_file} is not a checkpoint state file of this run ({err}): its saves "
            f"would replace it. Move it out of {directory}, or choose another output "
            "directory (a checkpoint to start from goes to --init_checkpoint)")


def repair_state_file(directory: str) -> bool:
    """Rewrites an unreadable `checkpoint` state file (or one naming checkpoints the run
    did not save there) from the run's recorded checkpoints on disk (oldest first, newest
    as the latest), with a warning; returns True when it did. A sound or missing state file
    is left alone; one the run cannot have written is refused (`check_state_file`), never
    removed. Call it only while owning the directory."""
    state, err = _read_state(directory)
    if err is None:
        return False
    check_state_file(directory)
    found = own_checkpoints(directory)
    state_file = os.path.join(directory, "checkpoint")
    logging.warning("%s cannot be read (%s): rebuilding it from the run's %d checkpoint(s) "
                    "on disk%s",
                    state_file, str(err).strip().splitlines()[0] if str(err).strip() else
                    type(err).__name__, len(found), f", newest {found[0]}" if found else "")
    if not found:
        tf.io.gfile.remove(state_file)
        return True
    # (It stores the paths relative to `directory`, as CheckpointManager does.)
    tf.compat.v1.train.update_checkpoint_state(
        directory, found[0], all_model_checkpoint_paths=list(reversed(found)))
    fileio.sync(state_file)
    fileio.sync_directory(directory)
    return True


# What a killed save leaves (TensorFlow 2.21): `functional_saver` writes each shard as
# `<prefix>_temp/part-NNNNN-of-NNNNN.{index,data-NNNNN-of-NNNNN}` (through BundleWriter's
# `.tempstate<N>` names) before merging them into `<prefix>.*`;
# `file_io.atomic_write_string_to_file` writes the state file as `checkpoint.tmp<uuid hex>`.
# (A non-chief worker's `workertemp_<task>_<id>/` is removed by that worker's next saver.)
_SHARD_TEMP_FILE = re.compile(r"part-\d+-of-\d+\.(index|data-\d+-of-\d+)(\.tempstate\d+)?")
_STATE_TEMP_FILE = re.compile(r"checkpoint\.tmp[0-9a-f]{32}")


def _run_directories(directory: str, other_claims: Sequence[str]) -> list[str]:
    """`directory` and the folders below it, never through a symbolic link nor into a
    folder holding one of `other_claims` (another run's claimed directory)."""
    found = [directory]
    for name in tf.io.gfile.listdir(directory):
        path = os.path.join(directory, name.rstrip("/"))
        if (not fileio.is_url(path) and os.path.islink(path)) or not tf.io.gfile.isdir(path):
            continue
        if not any(tf.io.gfile.exists(os.path.join(path, c)) for c in other_claims):
            found += _run_directories(path, other_claims)
    return found


def _killed_save_leftovers(directory: str, other_claims: Sequence[str]) -> list[str]:
    """What killed saves of the run left, by the names its record gives: in each run
    directory (`directory` or a sweep's folder below it) holding a `training.run_files`
    record, the `<ckpt-N>_temp/` folder of each checkpoint it recorded (holding nothing
    but shard files) and the state file's `checkpoint.tmp<hex>` temporaries."""
    found = []
    for folder in _run_directories(directory, other_claims):
        recorded = run_files.read(folder)["checkpoints"]
        if not recorded:
            continue
        for name in recorded:
            path = os.path.join(folder, f"{name}_temp")
            if tf.io.gfile.isdir(path) and _only_shard_temporaries(path):
                found.append(path)
        found.extend(os.path.join(folder, name.rstrip("/"))
                     for name in tf.io.gfile.listdir(folder)
                     if _STATE_TEMP_FILE.fullmatch(name.rstrip("/")))
    return found


def _only_shard_temporaries(path: str) -> bool:
    """True when the folder holds nothing but shard files of a save (or nothing)."""
    names = tf.io.gfile.listdir(path)
    return all(_SHARD_TEMP_FILE.fullmatch(name.rstrip("/")) for name in names)


def remove_killed_save_leftovers(directory: str, other_claims: Sequence[str] = ()) -> list[str]:
    """Removes what killed checkpoint saves of the run left under `directory`
    (`_killed_save_leftovers`); returns the paths.

    Call it only while owning the directory (its run lock held, `training.output_claim`): a
    live run's save in progress looks the same. `other_claims`: the names of the files
    that mark another run's directory (never entered).
    """
    if not tf.io.gfile.isdir(directory):
        return []
    removed = []
    for path in _killed_save_leftovers(directory, other_claims):
        try:
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                tf.io.gfile.remove(path)
        except tf.errors.OpError as err:
            logging.warning("Could not remove %s, left by a killed checkpoint save: %s",
                            path, err)
            continue
        removed.append(path)
    if removed:
        logging.warning("Removed %d leftover(s) of checkpoint saves a killed run did not "
                        "finish: %s", len(removed), ", ".join(removed))
    return removed


def checkpoints_newest_first(directory: str) -> list[str]:
    """Checkpoint prefixes listed in `directory`'s state file, newest first; when that file
    is empty or unreadable (a power cut), the run's recorded `ckpt-<N>` checkpoints on disk,
    newest first, with a warning."""
    state, err = _read_state(directory)
    if err is not None:
        found = own_checkpoints(directory)
        logging.warning("%s cannot be read (%s); using the run's %d checkpoint(s) found on "
                        "disk, newest first", os.path.join(directory, "checkpoint"),
                        str(err).strip().splitlines()[0] if str(err).strip() else
                        type(err).__name__, len(found))
        return found
    if state is None:
        return []
    # TensorFlow has already joined `directory` onto the state file's relative names (a
    # relative `directory` stays relative): the paths are used as they come.
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    if state.model_checkpoint_path and state.model_checkpoint_path not in paths:
        paths.append(state.model_checkpoint_path)
    return list(reversed(paths))


SET_ASIDE_DIR = "diverged"  # checkpoints of a diverged run, out of the resume's way


def _step_of(prefix: str) -> int:
    return int(os.path.basename(prefix).rsplit("-", 1)[-1])


def set_aside(directory: str, from_step: int) -> list[str]:
    """Moves the run's own checkpoints (`own_checkpoints`) of step `from_step` and later
    into a new folder `directory/diverged/<n>/` (the first number not taken: an earlier
    set-aside is never replaced) and rewrites the state file without them, so that a
    rerun resumes from the newest one left (or starts over when none is); returns their
    new prefixes, oldest first. They leave the run's record: kept for the user, never
    touched again. Call it only while owning the directory (the chief of a run that
    diverged: `training.loop`).

    The state file is rewritten first, then the files are moved (a kill in between leaves
    them unlisted, never listed and missing); they are kept, not deleted.
    """
    own = own_checkpoints(directory)
    moving = sorted((p for p in own if _step_of(p) >= from_step), key=_step_of)
    if not moving:
        return []
    listed = checkpoints_newest_first(directory)
    keep = [p for p in reversed(listed) if _step_of(p) < from_step]  # oldest first
    state_file = os.path.join(directory, "checkpoint")
    with lifecycle.signals_deferred():
        if keep:
            tf.compat.v1.train.update_checkpoint_state(
                directory, keep[-1], all_model_checkpoint_paths=keep)
            fileio.sync(state_file)
        elif tf.io.gfile.exists(state_file):
            tf.io.gfile.remove(state_file)
    number = 1
    while tf.io.gfile.exists(os.path.join(directory, SET_ASIDE_DIR, str(number))):
        number += 1
    target = os.path.join(directory, SET_ASIDE_DIR, str(number))
    tf.io.gfile.makedirs(target)
    moved = []
    for prefix in moving:
        for path in checkpoint_files(prefix):
            tf.io.gfile.rename(path, os.path.join(target, os.path.basename(path)))
        moved.append(os.path.join(target, os.path.basename(prefix)))
    fileio.sync_directory(directory)
    run_files.forget(directory, checkpoints=[os.path.basename(p) for p in moving])
    logging.warning("Set aside %s into %s; the newest checkpoint left: %s",
                    ", ".join(os.path.basename(p) for p in moved), target,
                    keep[-1] if keep else "none")
    return moved


def saved_value(prefix: str, name: str):
    """The value of the checkpoint's variable `name` (its object path, e.g.
    "divergence/start"), or None when the checkpoint has none."""
    key = f"{name}/.ATTRIBUTES/VARIABLE_VALUE"
    reader = tf.train.load_checkpoint(prefix)
    return reader.get_tensor(key) if reader.has_tensor(key) else None


class CheckpointRestoreError(UserError):
    """output_dir has checkpoints but none fits the model (another run's, or all damaged)."""


class InputPositionError(CheckpointRestoreError):
    """The input position saved in a checkpoint does not fit this run's input (other
    files, batch size, seed or settings); the message names what changed."""


def restore_latest(checkpoint: tf.train.Checkpoint, directory: str) -> str | None:
    """Restores the newest readable checkpoint in `directory`; returns its path or None.

    None only when the directory has no checkpoint. When the newest cannot be read (a
    damaged file) an older one is used, with a warning; when none can be, this raises
    CheckpointRestoreError instead of letting training start over and overwrite them.
    """
    paths = checkpoints_newest_first(directory)
    errors = []
    for path in paths:
        try:
            checkpoint.restore(path).expect_partial()
        except (tf.errors.OpError, ValueError, IndexError) as err:  # IndexError: truncated
            logging.warning("Checkpoint %s cannot be read (%s); trying an older one.", path,
                            err)
            errors.append((path, err))
            continue
        return path
    if errors:
        path, err = errors[0]
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        state_file = os.path.join(directory, "checkpoint")
        if not any(tf.io.gfile.exists(p + ".index") for p, _ in errors):
            # Not another model's: there is nothing to move away, and nothing to overwrite.
            raise CheckpointRestoreError(
                f"{state_file} lists {len(paths)} checkpoint(s) but their files are missing "
                f"(newest {path}.index): they were moved or deleted. Put them back to resume, "
                f"or delete {state_file} to start over")
        raise CheckpointRestoreError(
            f"{directory} holds {len(paths)} checkpoint(s) that do not fit this model (newest "
            f"{path}: {first_line}). They belong to another run or are damaged; refusing to "
            "train over them: choose another output directory, or move them away")
    return None


# ---------------------------------------------------------------- input position

INPUT_KEY = "input"
_INPUT_IDENTITY_KEY = f"{INPUT_KEY}/identity/.ATTRIBUTES/VARIABLE_VALUE"


def input_position(iterator, identity: dict) -> tf.train.Checkpoint:
    """The checkpointed position of the training input: the `tf.data` iterator (its
    state: file offsets, shuffle and prefetch buffers, counters) and what the input is
    (`identity`, JSON), so that a resumed run can refuse an input it does not fit.

    Attach it as `checkpoint.input` (INPUT_KEY); once a checkpoint has been restored into
    `checkpoint`, attaching restores the iterator to the saved position (TensorFlow's
    deferred restoration), so compare `saved_input_identity` first.
    """
    with tf.device("/cpu:0"):
        variable = tf.Variable(json.dumps(identity, sort_keys=True), trainable=False,
                               dtype=tf.string, name="input_identity")
    return tf.train.Checkpoint(iterator=iterator, identity=variable)


def has_input_position(path: str) -> bool:
    """True when the checkpoint at `path` holds an input position (`input_position`)."""
    return tf.train.load_checkpoint(path).has_tensor(_INPUT_IDENTITY_KEY)


def saved_input_identity(path: str) -> dict | None:
    """The input identity saved in the checkpoint at `path` (None: no input position)."""
    reader = tf.train.load_checkpoint(path)
    if not reader.has_tensor(_INPUT_IDENTITY_KEY):
        return None
    value = reader.get_tensor(_INPUT_IDENTITY_KEY)
    return json.loads(value.decode("utf-8") if isinstance(value, bytes) else value)
