"""Owns TensorBoard summary writing (scalars) without requiring the tensorboard package.

`tf.summary.scalar` needs the tensorboard pip package at call time; writing the tensor with
the scalar plugin's metadata ourselves produces the same event records, which TensorBoard
(installed wherever the logs are viewed) displays as scalars.
"""

from __future__ import annotations

import os

import tensorflow as tf

from training import run_files

_SCALAR_METADATA = tf.compat.v1.SummaryMetadata(
    plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars"))


def writer(output_dir: str, name: str, *, enabled: bool = True):
    """A file writer in output_dir/name (a no-op writer when not enabled, e.g. non-chief);
    the event file it creates is recorded as the run's (`training.run_files`)."""
    if not enabled:
        return tf.summary.create_noop_writer()
    logdir = os.path.join(output_dir, name)
    before = set(tf.io.gfile.listdir(logdir)) if tf.io.gfile.isdir(logdir) else set()
    summary_writer = tf.summary.create_file_writer(logdir)  # creates its event file now
    run_files.add(output_dir, files=[os.path.join(name, f) for f in tf.io.gfile.listdir(logdir)
                                     if f not in before])
    return summary_writer


def write_scalars(summary_writer, values: dict, step: int):
    """Writes each float in `values` as a TensorBoard scalar at `step`."""
    with summary_writer.as_default():
        for key, value in values.items():
            tf.summary.write(key, tf.constant(float(value), tf.float32), step=step,
                             metadata=_SCALAR_METADATA)
    summary_writer.flush()
