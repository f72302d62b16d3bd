"""Owns finding what a path holds and loading it: ``resolve``, ``load_pretrained`` (any kind), the config beside a checkpoint."""

from __future__ import annotations

import os
from typing import Optional

import tensorflow as tf

from modeling.checkpoints.common import (HF, HF_INDEX, KINDS, OURS, TF1, CheckpointError,
                                         LoadReport, checkpoint_reader, reading)
from modeling.checkpoints.hf import (HF_IGNORED, PICKLE_SUFFIXES, hf_reader,
                                     looks_like_pickle, pickle_refusal)
from modeling.checkpoints.names import load_by_table
from modeling.checkpoints.ours import ATTR_SUFFIX, load_ours
from modeling.checkpoints import sentence_transformers
from modeling.checkpoints.tf1 import TF1_IGNORED, tf1_reader
from modeling.config import BertConfig


def is_prefix(path: str) -> bool:
    """True when `path` is a checkpoint prefix (`path.index` exists)."""
    return tf.io.gfile.exists(path + ".index")


def resolve(path: str) -> tuple:
    """Finds what ``path`` holds: returns (kind, file-or-prefix).

    Accepts a TF1 or tf.train.Checkpoint prefix, a directory with ``bert_model.ckpt*``, a
    directory with a ``checkpoint`` state file, a Hugging Face directory
    (``model.safetensors``, or ``model.safetensors.index.json`` with its shards), a
    ``.safetensors`` file or a ``.safetensors.index.json``, or a sentence-transformers
    directory (``modules.json``: its Transformer module's weights, after its modules are
    checked by ``sentence_transformers.read``). PyTorch pickles (``pytorch_model.bin``,
    ``.pt``, ``.pth``) are refused, never unpickled.
    """
    path = os.fspath(path)
    if path.endswith((".safetensors", ".safetensors.index.json")) and tf.io.gfile.exists(path):
        return HF, path
    if tf.io.gfile.isdir(path):
        return _resolve_directory(path)
    if is_prefix(path):
        return prefix_kind(path), path
    if tf.io.gfile.exists(path) and looks_like_pickle(path):  # by its bytes, not its name
        raise pickle_refusal(path)
    raise CheckpointError(f"{path}: not a checkpoint prefix (no {path}.index), "
                          "directory or .safetensors file"
                          + (" (nor a PyTorch pickle: its bytes are neither a zip archive "
                             "nor a pickle)" if tf.io.gfile.exists(path) else ""))


def _resolve_directory(path: str) -> tuple:
    if sentence_transformers.is_sentence_transformers(path):
        return _resolve_weights(sentence_transformers.read(path).transformer_dir)
    return _resolve_weights(path)


def _resolve_weights(path: str) -> tuple:
    for name in ("model.safetensors", HF_INDEX):
        if tf.io.gfile.exists(os.path.join(path, name)):
            return HF, os.path.join(path, name)
    google = os.path.join(path, "bert_model.ckpt")
    if is_prefix(google):
        return TF1, google
    latest = tf.train.latest_checkpoint(path)
    if latest:
        return prefix_kind(latest), latest
    names = sorted(tf.io.gfile.listdir(path))
    pickles = [n for n in names if n.endswith(".bin.index.json") or (
        n.endswith(PICKLE_SUFFIXES) and looks_like_pickle(os.path.join(path, n)))]
    if pickles:
        raise pickle_refusal(os.path.join(path, pickles[0]))
    others = [n for n in names if n.endswith(".safetensors")]
    if others:
        raise CheckpointError(
            f"{path}: holds {', '.join(others[:3])} but neither model.safetensors nor "
            f"{HF_INDEX} (which lists the shards); pass the .safetensors file itself")
    state = os.path.join(path, "checkpoint")
    if "checkpoint" in names:
        raise CheckpointError(f"{state}: this checkpoint state file names no readable "
                              "checkpoint (damaged, or its checkpoints were removed)")
    raise CheckpointError(
        f"{path}: no checkpoint found (expected bert_model.ckpt.index, model.safetensors, "
        f"{HF_INDEX} or a 'checkpoint' state file)")


def prefix_kind(prefix: str) -> str:
    """"ours" for a tf.train.Checkpoint (object graph + attribute names), else "tf1"."""
    with reading(prefix, "index"):
        names = list(checkpoint_reader(prefix).get_variable_to_shape_map())
    if "_CHECKPOINTABLE_OBJECT_GRAPH" in names and any(n.endswith(ATTR_SUFFIX) for n in names):
        return OURS
    return TF1


def config_for(path: str) -> Optional[BertConfig]:
    """The config stored beside a checkpoint, if any: HF config.json or bert_config.json."""
    kind, location = resolve(path)
    directory = os.path.dirname(location)
    if kind == HF:
        cfg = os.path.join(directory, "config.json")
        return BertConfig.from_hf_config(cfg) if tf.io.gfile.exists(cfg) else None
    cfg = os.path.join(directory, "bert_config.json")
    return BertConfig.from_json_file(cfg) if tf.io.gfile.exists(cfg) else None


def vocab_for(path: str) -> Optional[str]:
    """The ``vocab.txt`` beside a checkpoint, if there is one (its releases ship it there)."""
    _, location = resolve(path)
    vocab = os.path.join(os.path.dirname(location), "vocab.txt")
    return vocab if tf.io.gfile.exists(vocab) else None


def checkpoint_has_pretraining_heads(path: str) -> bool:
    """True when the checkpoint at `path` holds the masked-LM head (any kind)."""
    return _has_head(path, "cls.predictions.bias", "cls/predictions/output_bias",
                     "model/masked_lm/")


def checkpoint_has_next_sentence_head(path: str) -> bool:
    """True when the checkpoint at `path` holds the next-sentence head (any kind): a
    pretraining run without it is the paper's "No NSP" or its left-to-right LM."""
    return _has_head(path, "cls.seq_relationship.bias", "cls/seq_relationship/output_bias",
                     "model/next_sentence/")


def _has_head(path: str, hf_name: str, tf1_name: str, ours_prefix: str) -> bool:
    """Whether the checkpoint at `path` has a head: its tensor by name in its kind."""
    kind, location = resolve(path)
    if kind == HF:
        return hf_name in hf_reader(location).shapes
    with reading(location, "index"):
        names = list(checkpoint_reader(location).get_variable_to_shape_map())
    if kind == TF1:
        return tf1_name in names
    return any(n.startswith(ours_prefix) for n in names)


def load_pretrained(path, model, *, partial: bool = False,
                    kind: Optional[str] = None) -> LoadReport:
    """Loads a checkpoint of any supported kind into ``model``.

    Args:
      path: TF1 prefix or directory, Hugging Face directory or ``.safetensors`` file, or a
        ``tf.train.Checkpoint`` prefix or directory written by this project.
      model: a ``BertEncoder`` or a task model of ``modeling.models``.
      partial: strict (False) fails if any model weight is missing or any checkpoint weight
        is unexpected; partial (True) loads what matches (e.g. the encoder of a pretraining
        checkpoint into a classifier). Optimizer slots and step counters are always
        ignored. Shape mismatches always fail (they mean a different config).
      kind: force one of ``KINDS`` instead of detecting it.

    Returns:
      A ``LoadReport``.

    Raises:
      CheckpointError: with the lists of missing / unexpected / mismatched names.
    """
    detected, location = resolve(path)
    kind = kind or detected
    if kind == TF1:
        return load_by_table(model, tf1_reader(location), TF1, location, partial, TF1_IGNORED)
    if kind == HF:
        return load_by_table(model, hf_reader(location), HF, location, partial, HF_IGNORED)
    if kind == OURS:
        return load_ours(location, model, partial)
    raise ValueError(f"unknown checkpoint kind {kind!r}; expected one of {KINDS}")
