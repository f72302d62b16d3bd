"""Owns the one table that maps every Keras weight to its original TF1 name and its Hugging Face name, and loading a named checkpoint through it.

``weight_table(model)`` lists every Keras weight (or a column block of one: the fused
query/key/value kernel) with its TF1 and Hugging Face names and the transposes each layout
needs; ``load_by_table`` reads any name -> tensor file (TF1, safetensors) into a model with
it, and the exporters (``modeling.checkpoints.writing``) write through it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

import numpy as np

from modeling.checkpoints.common import TF1, LoadReport, NamedReader, fail_if_needed
from modeling.encoder import BertEncoder


@dataclasses.dataclass
class WeightEntry:
    """One checkpoint tensor and where it lives in the model.

    Attributes:
      variable: the Keras variable.
      tf1_name: name in Google's TF1 checkpoints.
      hf_name: name in Hugging Face files (with the ``bert.`` prefix for encoder weights).
      columns: (start, stop) block of the variable's last axis, or None for all of it.
      tf1_transpose: the TF1 tensor is the transpose of the Keras block.
      hf_transpose: the Hugging Face tensor is the transpose (PyTorch Linear is [out, in]).
    """

    variable: object
    tf1_name: str
    hf_name: str
    columns: Optional[tuple] = None
    tf1_transpose: bool = False
    hf_transpose: bool = False

    @property
    def shape(self) -> tuple:
        """Shape of the block in Keras layout."""
        shape = tuple(self.variable.shape)
        if self.columns is not None:
            shape = shape[:-1] + (self.columns[1] - self.columns[0],)
        return shape

    def external_shape(self, kind: str) -> tuple:
        transpose = self.tf1_transpose if kind == TF1 else self.hf_transpose
        return tuple(reversed(self.shape)) if transpose else self.shape

    def name(self, kind: str) -> str:
        return self.tf1_name if kind == TF1 else self.hf_name

    def to_keras(self, array: np.ndarray, kind: str) -> np.ndarray:
        transpose = self.tf1_transpose if kind == TF1 else self.hf_transpose
        return np.transpose(array) if transpose else array

    def from_keras(self, value: np.ndarray, kind: str) -> np.ndarray:
        if self.columns is not None:
            value = value[..., self.columns[0]:self.columns[1]]
        transpose = self.tf1_transpose if kind == TF1 else self.hf_transpose
        return np.ascontiguousarray(np.transpose(value) if transpose else value)


def _dense(layer, tf1_scope, hf_scope, columns=None):
    """Entries for a Keras Dense (kernel [in, out]) stored as TF1 kernel/bias, HF weight/bias."""
    kernel_cols = columns
    return [
        WeightEntry(layer.kernel, f"{tf1_scope}/kernel", f"{hf_scope}.weight",
                    columns=kernel_cols, hf_transpose=True),
        WeightEntry(layer.bias, f"{tf1_scope}/bias", f"{hf_scope}.bias", columns=columns),
    ]


def _layer_norm(layer, tf1_scope, hf_scope):
    return [
        WeightEntry(layer.gamma, f"{tf1_scope}/gamma", f"{hf_scope}.weight"),
        WeightEntry(layer.beta, f"{tf1_scope}/beta", f"{hf_scope}.bias"),
    ]


def _encoder_table(encoder: BertEncoder) -> list:
    emb = encoder.embeddings
    table = [
        WeightEntry(emb.word_embeddings, "bert/embeddings/word_embeddings",
                    "bert.embeddings.word_embeddings.weight"),
        WeightEntry(emb.position_embeddings, "bert/embeddings/position_embeddings",
                    "bert.embeddings.position_embeddings.weight"),
        WeightEntry(emb.token_type_embeddings, "bert/embeddings/token_type_embeddings",
                    "bert.embeddings.token_type_embeddings.weight"),
    ]
    table += _layer_norm(emb.layer_norm, "bert/embeddings/LayerNorm", "bert.embeddings.LayerNorm")
    h = encoder.bert_config.hidden_size
    for i, block in enumerate(encoder.transformer_layers):
        tf1 = f"bert/encoder/layer_{i}"
        hf = f"bert.encoder.layer.{i}"
        for j, part in enumerate(("query", "key", "value")):
            table += _dense(block.query_key_value, f"{tf1}/attention/self/{part}",
                            f"{hf}.attention.self.{part}", columns=(j * h, (j + 1) * h))
        table += _dense(block.attention_output, f"{tf1}/attention/output/dense",
                        f"{hf}.attention.output.dense")
        table += _layer_norm(block.attention_layer_norm, f"{tf1}/attention/output/LayerNorm",
                             f"{hf}.attention.output.LayerNorm")
        table += _dense(block.intermediate, f"{tf1}/intermediate/dense",
                        f"{hf}.intermediate.dense")
        table += _dense(block.output_dense, f"{tf1}/output/dense", f"{hf}.output.dense")
        table += _layer_norm(block.output_layer_norm, f"{tf1}/output/LayerNorm",
                             f"{hf}.output.LayerNorm")
    table += _dense(encoder.pooler, "bert/pooler/dense", "bert.pooler.dense")
    return table


def _logits_head(head, tf1_scope, hf_scope):
    """A DenseLogitsHead stored the original way: output_weights [outputs, hidden] + output_bias."""
    prefix = f"{tf1_scope}/" if tf1_scope else ""
    return [
        WeightEntry(head.dense.kernel, f"{prefix}output_weights", f"{hf_scope}.weight",
                    tf1_transpose=True, hf_transpose=True),
        WeightEntry(head.dense.bias, f"{prefix}output_bias", f"{hf_scope}.bias"),
    ]


def feature_tagger_head(model) -> list:
    """The feature-based tagger's head (no original counterpart): names of our own,
    ``feature_tagger/...`` (TF1) and ``feature_tagger....`` (Hugging Face), no transposes."""
    parts = []
    if model.mix is not None:
        parts += [("mix/mix_weights", model.mix.mix_weights), ("mix/gamma", model.mix.gamma)]
    for i, bilstm in enumerate(model.bilstm_layers):
        parts += _bilstm_parts(bilstm, f"bilstm_{i}")
    parts += [("dense/kernel", model.output_layer.dense.kernel),
              ("dense/bias", model.output_layer.dense.bias)]
    return _own_entries(parts, "feature_tagger")


def _bilstm_parts(bilstm, name: str) -> list:
    """(name, variable) of a Bidirectional LSTM's cells: `name/forward|backward/kernel|
    recurrent_kernel|bias`."""
    parts = []
    for direction, layer in (("forward", bilstm.forward_layer),
                             ("backward", bilstm.backward_layer)):
        cell = layer.cell
        for weight in ("kernel", "recurrent_kernel", "bias"):
            parts.append((f"{name}/{direction}/{weight}", getattr(cell, weight)))
    return parts


def _own_entries(parts, scope: str) -> list:
    """Entries of weights with no original counterpart: `scope/name` (TF1) and
    `scope.name` (Hugging Face), no transposes."""
    return [WeightEntry(var, f"{scope}/{name}", f"{scope}." + name.replace("/", "."))
            for name, var in parts]


def weight_table(model) -> list:
    """Every weight of ``model`` with its TF1 and Hugging Face names.

    Supports ``BertEncoder`` and the task models of ``modeling.models``. Task heads use the
    names of the original scripts: ``cls/predictions/*`` and ``cls/seq_relationship/*``
    (run_pretraining), ``output_weights`` / ``output_bias`` (run_classifier; also used for
    token tagging), ``cls/squad/*`` (run_squad); Hugging Face: ``cls.*``, ``classifier.*``,
    ``qa_outputs.*``. The feature-based tagger's BiLSTM head has no original: it is
    ``feature_tagger/*`` (``feature_tagger.*``); nor has SQuAD's "+ BiLSTM":
    ``squad_bilstm/*`` (``squad_bilstm.*``), nor the document classifier's attention over
    windows: ``window_attention/*`` (``window_attention.*``).
    """
    from modeling import models

    if isinstance(model, BertEncoder):
        return _encoder_table(model)
    table = _encoder_table(model.encoder)
    if isinstance(model, models.BertPretrainer):
        mlm = model.masked_lm
        table += _dense(mlm.transform, "cls/predictions/transform/dense",
                        "cls.predictions.transform.dense")
        table += _layer_norm(mlm.layer_norm, "cls/predictions/transform/LayerNorm",
                             "cls.predictions.transform.LayerNorm")
        table.append(WeightEntry(mlm.output_bias, "cls/predictions/output_bias",
                                 "cls.predictions.bias"))
        if model.next_sentence is not None:  # None: trained without NSP
            table += _logits_head(model.next_sentence, "cls/seq_relationship",
                                  "cls.seq_relationship")
    elif isinstance(model, (models.BertClassifier, models.BertMultipleChoice)):
        table += _logits_head(model.classifier, "", "classifier")
    elif isinstance(model, models.BertDocumentClassifier):
        # The classifier's head as run_classifier names it; attention pooling's window
        # scorer has no original: window_attention/* (window_attention.*).
        if model.pooling == "attention":
            layer = model.window_attention
            table += _own_entries([("kernel", layer.kernel), ("bias", layer.bias)],
                                  "window_attention")
        table += _logits_head(model.classifier, "", "classifier")
    elif isinstance(model, models.BertSpanLabeler):
        if model.bilstm is not None:  # "+ BiLSTM" (no original): squad_bilstm/...
            table += _own_entries(_bilstm_parts(model.bilstm, "bilstm"), "squad_bilstm")
        table += _logits_head(model.span, "cls/squad", "qa_outputs")
    elif isinstance(model, models.BertTokenTagger):
        table += _logits_head(model.tagger, "", "classifier")
    elif isinstance(model, models.BertFeatureTagger):
        table += feature_tagger_head(model)
    else:
        raise TypeError(f"no checkpoint table for {type(model).__name__}")
    return table


# --------------------------------------------------------------------------- loading


def load_by_table(model, reader: NamedReader, kind: str, path: str, partial: bool,
                   ignored: re.Pattern) -> LoadReport:
    """Loads a name -> tensor file (TF1, safetensors) into `model` through `weight_table`;
    names matching `ignored` (optimizer slots, buffers) are reported, not loaded."""
    report = LoadReport(kind=kind, path=path)
    table = weight_table(model)
    updates = {}  # id(variable) -> (variable, new numpy value)
    used = set()
    for entry in table:
        name = entry.name(kind)
        if name not in reader.shapes:
            report.missing.append(name)
            continue
        used.add(name)
        expected = entry.external_shape(kind)
        found = reader.shapes[name]
        if found != expected:
            report.add_mismatch(name, found, expected)
            continue
        var = entry.variable
        if id(var) not in updates:
            updates[id(var)] = (var, np.array(var.numpy()))
        value = entry.to_keras(reader.get(name), kind)
        target = updates[id(var)][1]
        if entry.columns is None:
            target[...] = value
        else:
            target[..., entry.columns[0]:entry.columns[1]] = value
        report.loaded.append(name)
    for name in sorted(reader.shapes):
        if name in used:
            continue
        (report.ignored if ignored.search(name) else report.unexpected).append(name)
    fail_if_needed(report, partial)
    for var, value in updates.values():
        var.assign(value.astype(np.dtype(var.dtype)))
    return report
