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
"""

from __future__ import annotations

import os

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


def checkpoints_newest_first(directory: str) -> list[str]:
    """Checkpoint prefixes listed in `directory`'s state file, newest first."""
    state = tf.train.get_checkpoint_state(directory)
    if state is None:
        return []
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    if state.model_checkpoint_path and state.model_checkpoint_path not in paths:
        paths.append(state.model_checkpoint_path)
    paths = [p if os.path.isabs(p) or "://" in p else os.path.join(directory, p) for p in paths]
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
        raise CheckpointRestoreError(
            f"{directory} holds {len(paths)} checkpoint(s) that do not fit this model (newest "
            f"{path}: {first_line}). They belong to another run or are damaged; refusing to "
            "train over them: choose another output directory, or move them away")
    return None
