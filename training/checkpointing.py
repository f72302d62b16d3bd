"""Owns training checkpoints: what is saved, where each worker writes, and safe resumption.

The object graph is `tf.train.Checkpoint(model=model, optimizer=optimizer, step=global_step,
rng=Checkpoint(states=[...]))` (plus `loss_scale=Checkpoint(dynamic_scale, step_counter)`
when training in float16, and `input=Checkpoint(iterator, identity)`, the position of the
training input, once training starts: `input_position`), written by a
`tf.train.CheckpointManager` as `output_dir/ckpt-<step>.{index,data-*}`. `rng` holds the
states of the model's Keras seed generators (dropout): Keras does not put them in a
`tf.train.Checkpoint` of the model, and a resumed run must draw the dropout masks the
uninterrupted run would have drawn.

Crash safety: a checkpoint's files are complete before the manager rewrites the small
`checkpoint` state file, and that file is replaced atomically (write + rename), so a process
killed at any moment leaves `latest_checkpoint` naming a complete checkpoint. After each
save the chief `fsync`s the new files, the state file and the directory (TensorFlow syncs
nothing), so a power cut can damage at most a save in progress. `restore_latest` still
falls back to older checkpoints if the newest cannot be read (a damaged disk, a copy
interrupted by hand), and to the `ckpt-<N>.index` files on disk, newest first, when the
state file itself is empty or unreadable (a power cut before TensorFlow's unsynced
rename reached the disk); `CheckpointSaver` then rewrites the state file from them.

A run that diverged moves the checkpoints whose weights led there into
`output_dir/diverged/` (`set_aside`, called by `training.loop`), so that a rerun resumes
the newest sound one.

Multi-worker: every worker must call `save` (the save may involve collectives); only the
chief writes into `output_dir`, the others into a temporary directory that is deleted after
each save, as TensorFlow's multi-worker guide prescribes.

A save killed midway (kill -9, a preempted VM) leaves TensorFlow's temporaries: the
`<prefix>_temp/` folder the shards are written into before they are merged (the size of
a checkpoint: hundreds of MB for BERT-base), a `checkpoint.tmp<hex>` state file, and our
non-chief `workertemp_*` folders. Nothing of TensorFlow removes them later;
`remove_killed_save_leftovers` does, for the next run that owns the directory.
"""

from __future__ import annotations

import json
import os
import re

import tensorflow as tf
from absl import logging

from data_prep import fileio, lifecycle
from data_prep.cli import UserError


def make_checkpoint(model, optimizer, step, loss_scale_optimizer=None) -> tf.train.Checkpoint:
    """The checkpoint object graph used by every runner (see module docstring)."""
    objects = {"model": model, "optimizer": optimizer, "step": step}
    states = seed_generator_states(model)
    if states:
        objects["rng"] = tf.train.Checkpoint(states=states)
    if loss_scale_optimizer is not None:
        # Only the scale's own state: the wrapper also tracks the model's variables, which
        # would take over their checkpoint names (see modeling.optimization).
        objects["loss_scale"] = tf.train.Checkpoint(
            dynamic_scale=_tf_variable(loss_scale_optimizer.dynamic_scale),
            step_counter=_tf_variable(loss_scale_optimizer.step_counter))
    return tf.train.Checkpoint(**objects)


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
        self.manager = tf.train.CheckpointManager(
            checkpoint, self._write_dir, max_to_keep=max_to_keep if is_chief else 1)

    def save(self, step: int) -> str | None:
        """Saves at `step`; returns the chief's checkpoint path (None on other workers).

        Ctrl-C, SIGTERM and SIGHUP are held while the checkpoint is written: the run stops
        right after it, with the checkpoint complete, never in the middle of TensorFlow's
        save (which, cut there, fails with an unrelated error instead of a clean exit).
        """
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
    for path in tf.io.gfile.glob(prefix + ".*") + [os.path.join(directory, "checkpoint")]:
        if tf.io.gfile.exists(path):
            fileio.sync(path)
    fileio.sync_directory(directory)


_CHECKPOINT_INDEX = re.compile(r"ckpt-(\d+)\.index")


def checkpoints_on_disk(directory: str) -> list[str]:
    """Prefixes of the `ckpt-<N>` checkpoints whose index file is in `directory`, newest
    (largest N) first; what a run can resume from when the state file is unreadable."""
    if not tf.io.gfile.isdir(directory):
        return []
    found = []
    for name in tf.io.gfile.listdir(directory):
        match = _CHECKPOINT_INDEX.fullmatch(name.rstrip("/"))
        if match:
            found.append((int(match.group(1)), os.path.join(directory, f"ckpt-{match.group(1)}")))
    return [path for _, path in sorted(found, reverse=True)]


def remove_checkpoints(directory: str) -> list[str]:
    """Removes the `ckpt-<N>` checkpoints of `directory` (their files on disk) and the
    state file naming them, the state file last; returns the paths removed. For a run that
    must start over (`training.finetuning`); call it only while owning the directory."""
    removed = []
    for prefix in checkpoints_on_disk(directory):
        for path in sorted(tf.io.gfile.glob(prefix + ".*"), key=lambda p: p.endswith(".index")):
            tf.io.gfile.remove(path)  # the index last: what a kill leaves is still found
            removed.append(path)
    state_file = os.path.join(directory, "checkpoint")
    if tf.io.gfile.exists(state_file):
        tf.io.gfile.remove(state_file)
        removed.append(state_file)
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
    return state, None


def repair_state_file(directory: str) -> bool:
    """Rewrites an unreadable `checkpoint` state file from the checkpoints on disk (oldest
    first, newest as the latest), with a warning; returns True when it did. A readable
    or missing state file is left alone. Call it only while owning the directory."""
    state, err = _read_state(directory)
    if err is None:
        return False
    found = checkpoints_on_disk(directory)
    state_file = os.path.join(directory, "checkpoint")
    logging.warning("%s cannot be read (%s): rebuilding it from the %d checkpoint(s) on disk%s",
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
# `file_io.atomic_write_string_to_file` writes the state file as `checkpoint.tmp<uuid hex>`;
# `CheckpointSaver` writes a non-chief worker's checkpoints in `workertemp_<task>_<id>/`.
_SHARD_TEMP_DIR = re.compile(r".+_temp")
_SHARD_TEMP_FILE = re.compile(r"part-\d+-of-\d+\.(index|data-\d+-of-\d+)(\.tempstate\d+)?")
_STATE_TEMP_FILE = re.compile(r"checkpoint\.tmp[0-9a-f]{32}")
_WORKER_TEMP_DIR = re.compile(r"workertemp_\w+_\d+")


def _killed_save_leftovers(directory: str) -> list[str]:
    """Paths under `directory` (at any depth) that only a killed checkpoint save leaves."""
    found = []
    for parent, subdirs, files in tf.io.gfile.walk(directory):
        keep = []
        for name in subdirs:
            name = name.rstrip("/")
            path = os.path.join(parent, name)
            if _WORKER_TEMP_DIR.fullmatch(name):
                found.append(path)
            elif _SHARD_TEMP_DIR.fullmatch(name) and _only_shard_temporaries(path):
                found.append(path)
            else:
                keep.append(name)
        subdirs[:] = keep  # not into what goes
        found.extend(os.path.join(parent, name) for name in files
                     if _STATE_TEMP_FILE.fullmatch(name))
    return found


def _only_shard_temporaries(path: str) -> bool:
    """True when the folder holds nothing but shard files of a save (or nothing)."""
    names = tf.io.gfile.listdir(path)
    return all(_SHARD_TEMP_FILE.fullmatch(name.rstrip("/")) for name in names)


def remove_killed_save_leftovers(directory: str) -> list[str]:
    """Removes what killed checkpoint saves left under `directory`; returns the paths.

    Call it only while owning the directory (its run lock held, `training.output_claim`): a
    live run's save in progress looks the same.
    """
    if not tf.io.gfile.isdir(directory):
        return []
    removed = []
    for path in _killed_save_leftovers(directory):
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
    is empty or unreadable (a power cut), the `ckpt-<N>` checkpoints on disk, newest
    first, with a warning."""
    state, err = _read_state(directory)
    if err is not None:
        found = checkpoints_on_disk(directory)
        logging.warning("%s cannot be read (%s); using the %d checkpoint(s) found on disk, "
                        "newest first", os.path.join(directory, "checkpoint"),
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
    """Moves the checkpoints of step `from_step` and later out of `directory` into
    `directory/diverged/` (replacing same-named ones there) and rewrites the state file
    without them, so that a rerun resumes from the newest one left (or starts over when
    none is); returns their new prefixes, oldest first. Call it only while owning the
    directory (the chief of a run that diverged: `training.loop`).

    The state file is rewritten first, then the files are moved (a kill in between leaves
    them unlisted, never listed and missing); they are kept, not deleted.
    """
    listed = checkpoints_newest_first(directory)
    moving = sorted({p for p in listed + checkpoints_on_disk(directory)
                     if _step_of(p) >= from_step}, key=_step_of)
    moving = [p for p in moving if tf.io.gfile.glob(p + ".*")]
    if not moving:
        return []
    keep = [p for p in reversed(listed) if _step_of(p) < from_step]  # oldest first
    state_file = os.path.join(directory, "checkpoint")
    with lifecycle.signals_deferred():
        if keep:
            tf.compat.v1.train.update_checkpoint_state(
                directory, keep[-1], all_model_checkpoint_paths=keep)
            fileio.sync(state_file)
        elif tf.io.gfile.exists(state_file):
            tf.io.gfile.remove(state_file)
    target = os.path.join(directory, SET_ASIDE_DIR)
    tf.io.gfile.makedirs(target)
    moved = []
    for prefix in moving:
        for path in tf.io.gfile.glob(prefix + ".*"):
            tf.io.gfile.rename(path, os.path.join(target, os.path.basename(path)),
                               overwrite=True)
        moved.append(os.path.join(target, os.path.basename(prefix)))
    fileio.sync_directory(directory)
    logging.warning("Set aside %s into %s; the newest checkpoint left: %s",
                    ", ".join(os.path.basename(p) for p in moved), target,
                    keep[-1] if keep else "none")
    return moved


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
        except (tf.errors.OpError, ValueError) as err:
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
