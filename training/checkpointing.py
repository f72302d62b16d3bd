"""Owns training checkpoints: what is saved, where each worker writes, and safe resumption.

The object graph is `tf.train.Checkpoint(model=model, optimizer=optimizer, step=global_step)`
(plus `loss_scale=Checkpoint(dynamic_scale, step_counter)` when training in float16), written by a
`tf.train.CheckpointManager` as `output_dir/ckpt-<step>.{index,data-*}`.

Crash safety: a checkpoint's files are complete before the manager rewrites the small
`checkpoint` state file, and that file is replaced atomically (write + rename), so a process
killed at any moment leaves `latest_checkpoint` naming a complete checkpoint. `restore`
still falls back to older checkpoints if the newest cannot be read (a damaged disk, a
copy interrupted by hand).

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

import os
import re

import tensorflow as tf
from absl import logging

from data_prep import lifecycle


def make_checkpoint(model, optimizer, step, loss_scale_optimizer=None) -> tf.train.Checkpoint:
    """The checkpoint object graph used by every runner (see module docstring)."""
    objects = {"model": model, "optimizer": optimizer, "step": step}
    if loss_scale_optimizer is not None:
        # Only the scale's own state: the wrapper also tracks the model's variables, which
        # would take over their checkpoint names (see modeling.optimization).
        objects["loss_scale"] = tf.train.Checkpoint(
            dynamic_scale=_tf_variable(loss_scale_optimizer.dynamic_scale),
            step_counter=_tf_variable(loss_scale_optimizer.step_counter))
    return tf.train.Checkpoint(**objects)


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
        return path


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

    Call it only while owning the directory (its run lock held, `training.run_dir`): a
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
    """Checkpoint prefixes listed in `directory`'s state file, newest first."""
    state = tf.train.get_checkpoint_state(directory)
    if state is None:
        return []
    # TensorFlow has already joined `directory` onto the state file's relative names (a
    # relative `directory` stays relative): the paths are used as they come.
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    if state.model_checkpoint_path and state.model_checkpoint_path not in paths:
        paths.append(state.model_checkpoint_path)
    return list(reversed(paths))


class CheckpointRestoreError(ValueError):
    """output_dir has checkpoints but none fits the model (another run's, or all damaged)."""


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
