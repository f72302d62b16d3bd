"""Owns writing a model as a checkpoint of another kind: Google's TF1 layout, a Hugging Face directory, and ``convert`` between any two kinds."""

from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np
import tensorflow as tf
from absl import logging

from data_prep import fileio
from modeling.checkpoints import sentence_transformers
from modeling.checkpoints.common import HF, KINDS, OURS, TF1, CheckpointError
from modeling.checkpoints.loading import (checkpoint_has_next_sentence_head,
                                          checkpoint_has_pretraining_heads, config_for,
                                          load_pretrained, resolve, vocab_for)
from modeling.checkpoints.names import weight_table
from modeling.checkpoints.ours import save_ours, write_checkpoint_files
from modeling.config import BertConfig
from modeling.encoder import BertEncoder


def tf1_arrays(model) -> dict:
    """Name -> numpy array of ``model`` in the original TF1 layout."""
    return _external_arrays(model, TF1)


def _external_arrays(model, kind: str) -> dict:
    values = {}
    arrays = {}
    for entry in weight_table(model):
        key = id(entry.variable)
        if key not in values:
            values[key] = np.asarray(entry.variable.numpy())
        arrays[entry.name(kind)] = entry.from_keras(values[key], kind).astype(np.float32)
    return arrays


def _warn_if_causal(config: BertConfig, kind: str, out_dir: str) -> None:
    """Warns, naming ``out_dir``, what another ecosystem's code makes of a left-to-right
    (``causal_attention``) model written in its layout: the weights are exact, but that
    code does not compute what this project does with them."""
    if not config.causal_attention:
        return
    if kind == HF:
        caveat = ("a left-to-right model (causal_attention), written with \"is_decoder\": "
                  "true; Hugging Face's BertPooler reads the FIRST token ([CLS], which under "
                  "causal attention has seen only itself) where this project reads the last "
                  "real token: pooler_output and the heads on it (e.g. "
                  "BertForSequenceClassification) differ from ours there")
    else:
        caveat = ("a left-to-right model: bert_config.json keeps \"causal_attention\": true, "
                  "which this project reads; Google's modeling.py ignores the key and runs "
                  "this model with bidirectional attention")
    logging.warning("%s: %s", out_dir, caveat)


def export_tf1_checkpoint(model, config: BertConfig, out_dir: str, *,
                          vocab_file: Optional[str] = None, texts: Optional[dict] = None) -> str:
    """Writes ``model`` as Google's layout: ``bert_model.ckpt.*`` + ``bert_config.json``
    (+ ``texts``: {file name: text}, in the same set).

    The checkpoint holds exactly the original variable names and shapes, so
    ``tf.train.load_checkpoint`` and the original code's ``init_from_checkpoint`` read it.
    A left-to-right model is written with a warning (``_warn_if_causal``).

    Returns:
      The checkpoint prefix ``out_dir/bert_model.ckpt``.
    """
    arrays = tf1_arrays(model)
    names = sorted(arrays)

    def save(prefix):
        tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names,
                          shape_and_slices=[""] * len(names),
                          tensors=[tf.constant(arrays[n]) for n in names])

    prefix = write_checkpoint_files(out_dir, "bert_model.ckpt", save,
                                    {**(texts or {}), "bert_config.json": config.to_json_string()},
                                    vocab_file)
    _warn_if_causal(config, TF1, out_dir)
    return prefix


def export_hf_checkpoint(model, config: BertConfig, out_dir: str, *,
                         vocab_file: Optional[str] = None, texts: Optional[dict] = None) -> str:
    """Writes ``model`` as a Hugging Face directory: ``model.safetensors`` + ``config.json``
    (+ ``texts``: {file name: text}, in the same set).

    The GELU form is kept ("gelu_exact" -> "gelu", "gelu_tanh" -> "gelu_new"). A
    left-to-right model is written with a warning (``_warn_if_causal``).

    Returns:
      The path of ``model.safetensors``.
    """
    from safetensors.numpy import save

    path = os.path.join(out_dir, "model.safetensors")
    vocab = [os.path.join(out_dir, "vocab.txt")] if vocab_file else []
    config_path = os.path.join(out_dir, "config.json")
    texts = {os.path.join(out_dir, name): text for name, text in (texts or {}).items()}
    texts[config_path] = json.dumps(config.to_hf_dict(), indent=2, sort_keys=True) + "\n"
    # One set: a failure or an interruption leaves the previous files, never new weights
    # beside an old config.
    with fileio.AtomicOutputs([path] + vocab + list(texts)) as out:
        with out.open(path, "wb") as f:
            f.write(save(_external_arrays(model, HF), metadata={"format": "pt"}))
        for name, text in texts.items():
            with out.open(name, "w", newline="\n") as f:
                f.write(text)
        if vocab_file:
            out.copy(vocab_file, vocab[0])
    _warn_if_causal(config, HF, out_dir)
    return path


# --------------------------------------------------------------------------- conversion

EXPORTERS = {TF1: export_tf1_checkpoint, HF: export_hf_checkpoint}


def convert(input_path: str, output_dir: str, output_kind: str, *,
            config: Optional[BertConfig] = None, input_kind: Optional[str] = None,
            vocab_file: Optional[str] = None, model: str = "auto",
            partial: bool = False) -> str:
    """Converts a checkpoint between the TF1, Hugging Face and our layouts.

    Args:
      input_path: any path ``load_pretrained`` accepts.
      output_dir: directory to write (checkpoint + config [+ vocab.txt]).
      output_kind: one of ``KINDS``.
      config, input_kind, model, partial: as ``read_network``.
      vocab_file: copied into ``output_dir``; default: ``vocab.txt`` beside the input (a
        sentence-transformers input without one: written from its ``tokenizer.json``).

    A sentence-transformers input's description (pooling, normalization, casing,
    max_seq_length: ``sentence_transformers.description_files``) is written beside the
    output, which sentence-transformers then loads (``hf``) and this project reads (every
    kind).

    Returns:
      The written checkpoint (prefix or file).

    Raises:
      fileio.OutputError: ``output_dir`` is the input's own directory (refused before any
        work: the outputs would replace the input's files).
    """
    check_output_dir(input_path, output_dir, output_kind)
    described = (sentence_transformers.read(input_path)
                 if sentence_transformers.is_sentence_transformers(input_path) else None)
    network, config = read_network(input_path, config=config, input_kind=input_kind,
                                   model=model, partial=partial)
    if vocab_file is None:
        vocab_file = vocab_for(input_path)
    texts = {}
    if described:
        texts = sentence_transformers.description_files(
            described.pooling, described.normalize, described.max_seq_length,
            described.do_lower_case, config.hidden_size)
        vocab_text = (None if vocab_file else
                      sentence_transformers.vocab_from_tokenizer_json(described.transformer_dir))
        if vocab_text:
            texts["vocab.txt"] = vocab_text
    return write_network(network, config, output_dir, output_kind, vocab_file, texts)


def check_output_dir(input_path: str, output_dir: str, output_kind: str) -> None:
    """Refuses, before any work, an unknown output kind, an input that is not a checkpoint
    and an ``output_dir`` that holds the input (its files would be replaced), or a
    sentence-transformers input's directory."""
    if output_kind not in KINDS:
        raise ValueError(f"output kind {output_kind!r} is not one of {KINDS}")
    _, location = resolve(input_path)  # what is not a checkpoint is refused first
    owned = [os.path.dirname(location) or "."]
    if sentence_transformers.is_sentence_transformers(input_path):
        owned.append(sentence_transformers.read(input_path).directory)
    if any(fileio.same_path(output_dir, directory) for directory in owned):
        # The outputs (checkpoint, config, vocab.txt) would replace the input's own files.
        raise fileio.OutputError(
            f"output_dir {output_dir} holds the input checkpoint {location}; writing "
            "into it would overwrite the input: choose another directory")


def read_network(input_path: str, *, config: Optional[BertConfig] = None,
                 input_kind: Optional[str] = None, model: str = "auto",
                 partial: bool = False) -> tuple:
    """The network a checkpoint holds, loaded: (network, its config).

    Args:
      input_path: any path ``load_pretrained`` accepts.
      config: the network's config; default: the config file beside the input.
      input_kind: force the input kind (default: detected).
      model: "encoder", "pretrainer" or "auto" (pretrainer when the input has the
        masked-LM head). The pretrainer's heads are the input's: the next-sentence head
        only when it has one (the paper's "No NSP" has none), the left-to-right LM's
        objective for a `causal_attention` config (written with `_warn_if_causal`).
      partial: tolerate unexpected input tensors (e.g. a fine-tuned classifier's head).

    Raises:
      CheckpointError: no config beside the input and none given, or weights missing.
    """
    from modeling.models import BertPretrainer

    config = config or config_for(input_path)
    if config is None:
        raise CheckpointError(f"{input_path}: no bert_config.json / config.json beside the "
                              "checkpoint; pass the config explicitly")
    if model == "auto":
        model = "pretrainer" if checkpoint_has_pretraining_heads(input_path) else "encoder"
    if model == "pretrainer":
        causal = config.causal_attention  # the left-to-right LM has no NSP (Table 5)
        network = BertPretrainer(
            config, objective="ltr" if causal else "mlm",
            next_sentence_prediction=not causal and checkpoint_has_next_sentence_head(
                input_path))
    else:
        network = BertEncoder(config)
    report = load_pretrained(input_path, network, partial=partial, kind=input_kind)
    if report.missing:
        raise CheckpointError(report.describe())
    return network, config


def write_network(network, config: BertConfig, output_dir: str, output_kind: str,
                  vocab_file: Optional[str], texts: Optional[dict] = None) -> str:
    """Writes ``network`` (with ``config``, a copy of ``vocab_file`` and the text files
    ``texts``, {name: text}) as a checkpoint of ``output_kind`` in ``output_dir``,
    all-or-nothing; returns the checkpoint written."""
    if output_kind == OURS:
        return save_ours(network, output_dir, config, vocab_file, texts)
    return EXPORTERS[output_kind](network, config, output_dir, vocab_file=vocab_file,
                                  texts=texts)
