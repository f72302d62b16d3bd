"""Owns what every checkpoint reader shares: the kinds, `CheckpointError`, the load report, and naming a damaged file.

A file that cannot be read (a garbage ``.index``, a truncated ``.data-*`` shard) raises
``CheckpointError`` naming the file and what is wrong, never a bare TensorFlow exception.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError

from data_prep.cli import UserError

TF1, HF, OURS = "tf1", "hf", "ours"
KINDS = (TF1, HF, OURS)
# Hugging Face's index of a sharded checkpoint: {"weight_map": {tensor name: shard file}}.
HF_INDEX = "model.safetensors.index.json"


class CheckpointError(UserError):
    """A checkpoint that does not fit the model (lists what is missing, unexpected, mismatched)."""


@dataclasses.dataclass
class LoadReport:
    """What ``load_pretrained`` did.

    Names follow the checkpoint's scheme: TF1 names, Hugging Face names (in their
    ``bert.``-prefixed, ``LayerNorm.weight|bias`` form) or object paths of our checkpoints.
    """

    kind: str
    path: str
    loaded: list = dataclasses.field(default_factory=list)
    missing: list = dataclasses.field(default_factory=list)
    unexpected: list = dataclasses.field(default_factory=list)
    mismatched: list = dataclasses.field(default_factory=list)
    ignored: list = dataclasses.field(default_factory=list)

    vocab_rows: tuple = ()  # (checkpoint, model) rows of a mismatched word-embedding table

    def add_mismatch(self, name: str, found, expected) -> None:
        """Records a tensor whose checkpoint shape is not the model's."""
        self.mismatched.append(f"{name}: checkpoint {list(found)} vs model {list(expected)}")
        # Only a table that differs in its row count alone is a vocab mismatch; a width
        # difference is a wrong hidden_size, reported as the shape mismatch it is.
        found, expected = list(found), list(expected)
        if ("word_embeddings" in name and not self.vocab_rows and len(found) == len(expected) >= 1
                and found[0] != expected[0] and found[1:] == expected[1:]):
            self.vocab_rows = (found[0], expected[0])

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def describe(self, limit: int = 20) -> str:
        lines = [f"{self.kind} checkpoint {self.path}: {len(self.loaded)} tensors loaded"]
        if self.vocab_rows:
            rows, size = self.vocab_rows
            lines[0] = (f"{self.kind} checkpoint {self.path} has a vocab of {rows} rows (its "
                        f"word embeddings) but the config has vocab_size={size}: pass the "
                        "config written with this checkpoint (a vocab grown by "
                        "extend_vocab.py changes vocab_size)\n  " + lines[0])
        for label, names in (("missing from the checkpoint", self.missing),
                             ("unexpected in the checkpoint", self.unexpected),
                             ("shape mismatch", self.mismatched)):
            if names:
                shown = ", ".join(names[:limit])
                more = f" ... (+{len(names) - limit} more)" if len(names) > limit else ""
                lines.append(f"  {len(names)} {label}: {shown}{more}")
        return "\n".join(lines)

    __str__ = describe


def fail_if_needed(report: LoadReport, partial: bool) -> None:
    """Raises CheckpointError with the report: always on shape mismatches, and on anything
    missing or unexpected unless `partial`."""
    if report.mismatched or (not partial and not report.ok):
        hint = ("" if partial or report.mismatched
                else "\n  (pass partial=True to load only the matching weights)")
        raise CheckpointError(report.describe() + hint)


# --------------------------------------------------------------------------- readers


class NamedReader:
    """Name -> numpy array access to a TF1 checkpoint or a safetensors file."""

    def __init__(self, shapes: dict, get: Callable[[str], np.ndarray]):
        self.shapes = shapes
        self.get = get


def checkpoint_reader(prefix: str):
    """A reader of the checkpoint at `prefix` (not a directory).

    `tf.train.load_checkpoint` first asks whether the path is a directory, and some
    filesystems answer yes for a bare prefix (ram:// does when `prefix.index` exists), so
    the prefix is opened directly.
    """
    return tf.compat.v1.train.NewCheckpointReader(prefix)


@contextlib.contextmanager
def reading(prefix: str, part: str):
    """Turns TensorFlow's errors on a damaged checkpoint into a CheckpointError naming the file.

    Args:
      prefix: the checkpoint prefix.
      part: "index" (``PREFIX.index`` is being read) or "data" (``PREFIX.data-*``).
    """
    try:
        yield
    except (tf.errors.OpError, IndexError, OSError, DecodeError) as err:
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        shards = sorted(tf.io.gfile.glob(prefix + ".data-*"))
        if part == "index":
            what = f"{prefix}.index is not a readable checkpoint index"
        elif not shards:
            what = f"its data file {prefix}.data-* is missing"
        elif len(shards) == 1:
            what = f"its data file {shards[0]} is damaged or truncated"
        else:
            what = f"one of its data files {', '.join(shards)} is damaged or truncated"
        raise CheckpointError(f"checkpoint {prefix}: {what} ({detail})") from None
