"""Owns reading Google's original TF1 checkpoints (``bert_model.ckpt``): their tensors by name, what in them is not a weight.

The names are mapped to the model by ``modeling.checkpoints.names.weight_table``.
"""

from __future__ import annotations

import re

from modeling.checkpoints.common import NamedReader, checkpoint_reader, reading

# Checkpoint entries that are not model weights: step counters and optimizer slots.
TF1_IGNORED = re.compile(
    r"(^global_step$|^good_steps$|^loss_scale$|/adam_[mv]$|/lamb_[mv]$|/Adam(_\d+)?$"
    r"|^beta[12]_power|/Momentum$|/ExponentialMovingAverage$)")


def tf1_reader(prefix: str) -> NamedReader:
    """Name -> tensor of a TF1 checkpoint; a damaged index or data file is named."""
    with reading(prefix, "index"):
        reader = checkpoint_reader(prefix)
        shapes = {k: tuple(v) for k, v in reader.get_variable_to_shape_map().items()}

    def get(name):
        with reading(prefix, "data"):
            return reader.get_tensor(name)
    return NamedReader(shapes, get)
