"""Checkpoint I/O for the network: the TF1 / Hugging Face name table, ``load_pretrained``, exports.

Three kinds of checkpoint are read by one entry point, ``load_pretrained(path, model)``:

* ``"tf1"``: Google's original layout (``bert_model.ckpt`` prefix, or a directory holding
  it), read with ``tf.train.load_checkpoint`` through ``weight_table``;
* ``"hf"``: a Hugging Face BERT directory (``config.json`` + ``model.safetensors``), read
  with the ``safetensors`` numpy API (no PyTorch);
* ``"ours"``: a ``tf.train.Checkpoint(model=..., optimizer=..., step=...)`` written by this
  project (prefix, or a directory with a ``checkpoint`` state file).

``weight_table(model)`` is the single list that maps every Keras weight (or a column
block of one: the fused query/key/value kernel) to its original TF1 name and its
Hugging Face name, with the transposes each layout needs. ``export_tf1_checkpoint`` and
``export_hf_checkpoint`` write a model back through the same table.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Callable, Optional

import numpy as np
import tensorflow as tf

from modeling.config import BertConfig
from modeling.encoder import BertEncoder

TF1, HF, OURS = "tf1", "hf", "ours"
KINDS = (TF1, HF, OURS)

# Checkpoint entries that are not model weights: step counters and optimizer slots.
_TF1_IGNORED = re.compile(
    r"(^global_step$|^good_steps$|^loss_scale$|/adam_[mv]$|/lamb_[mv]$|/Adam(_\d+)?$"
    r"|^beta[12]_power|/Momentum$|/ExponentialMovingAverage$)")
# Buffers and tied duplicates that Hugging Face files may hold.
_HF_IGNORED = re.compile(
    r"(position_ids$|^cls\.predictions\.decoder\.(weight|bias)$)")


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model (lists what is missing, unexpected, mismatched)."""


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


def weight_table(model) -> list:
    """Every weight of ``model`` with its TF1 and Hugging Face names.

    Supports ``BertEncoder`` and the task models of ``modeling.models``. Task heads use the
    names of the original scripts: ``cls/predictions/*`` and ``cls/seq_relationship/*``
    (run_pretraining), ``output_weights`` / ``output_bias`` (run_classifier; also used for
    token tagging), ``cls/squad/*`` (run_squad); Hugging Face: ``cls.*``, ``classifier.*``,
    ``qa_outputs.*``.
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
        table += _logits_head(model.next_sentence, "cls/seq_relationship", "cls.seq_relationship")
    elif isinstance(model, models.BertClassifier):
        table += _logits_head(model.classifier, "", "classifier")
    elif isinstance(model, models.BertSpanLabeler):
        table += _logits_head(model.span, "cls/squad", "qa_outputs")
    elif isinstance(model, models.BertTokenTagger):
        table += _logits_head(model.tagger, "", "classifier")
    else:
        raise TypeError(f"no checkpoint table for {type(model).__name__}")
    return table


# --------------------------------------------------------------------------- reports


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

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def describe(self, limit: int = 20) -> str:
        lines = [f"{self.kind} checkpoint {self.path}: {len(self.loaded)} tensors loaded"]
        for label, names in (("missing from the checkpoint", self.missing),
                             ("unexpected in the checkpoint", self.unexpected),
                             ("shape mismatch", self.mismatched)):
            if names:
                shown = ", ".join(names[:limit])
                more = f" ... (+{len(names) - limit} more)" if len(names) > limit else ""
                lines.append(f"  {len(names)} {label}: {shown}{more}")
        return "\n".join(lines)

    __str__ = describe


def _fail_if_needed(report: LoadReport, partial: bool) -> None:
    if report.mismatched or (not partial and not report.ok):
        hint = ("" if partial or report.mismatched
                else "\n  (pass partial=True to load only the matching weights)")
        raise CheckpointError(report.describe() + hint)


# --------------------------------------------------------------------------- readers


class _NamedReader:
    """Name -> numpy array access to a TF1 checkpoint or a safetensors file."""

    def __init__(self, shapes: dict, get: Callable[[str], np.ndarray]):
        self.shapes = shapes
        self.get = get


def _tf1_reader(prefix: str) -> _NamedReader:
    reader = tf.train.load_checkpoint(prefix)
    shapes = {k: tuple(v) for k, v in reader.get_variable_to_shape_map().items()}
    return _NamedReader(shapes, reader.get_tensor)


def _hf_reader(path: str) -> _NamedReader:
    from safetensors import safe_open

    handle = safe_open(path, framework="np")
    names = list(handle.keys())
    # Shapes without reading data: get_slice exposes them.
    shapes = {k: tuple(handle.get_slice(k).get_shape()) for k in names}
    has_prefix = any(k.startswith("bert.") for k in names)
    aliases = {}
    for k in names:
        # Older files name LayerNorm parameters gamma/beta; bare BertModel files lack "bert.".
        canonical = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
            "LayerNorm.beta", "LayerNorm.bias")
        if not has_prefix and not re.match(r"^(cls|classifier|qa_outputs)\.", canonical):
            canonical = "bert." + canonical
        aliases[canonical] = k
    return _NamedReader({c: shapes[k] for c, k in aliases.items()},
                        lambda c: np.asarray(handle.get_tensor(aliases[c])))


def _load_by_table(model, reader: _NamedReader, kind: str, path: str, partial: bool,
                   ignored: re.Pattern) -> LoadReport:
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
            report.mismatched.append(f"{name}: checkpoint {list(found)} vs model {list(expected)}")
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
    _fail_if_needed(report, partial)
    for var, value in updates.values():
        var.assign(value.astype(np.dtype(var.dtype)))
    return report


# --------------------------------------------------------------------------- our checkpoints

_ATTR_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def _trackable_variables(root, prefix: str) -> dict:
    """Object path -> variable, as tf.train.Checkpoint names them (no attribute suffix)."""
    out, seen = {}, set()

    def walk(obj, path):
        for name, child in tf.train.TrackableView(obj).children(obj).items():
            if id(child) in seen:
                continue
            seen.add(id(child))
            key = f"{path}/{name}"
            if isinstance(child, tf.Variable) or (hasattr(child, "path")
                                                  and hasattr(child, "assign")):
                out[key] = child
            else:
                walk(child, key)

    walk(root, prefix)
    return out


def _stored_variables(prefix: str) -> tuple:
    """Reads a tf.train.Checkpoint's object graph.

    Returns:
      ({object path under the root, e.g. "model/encoder/pooler/bias": shape}, [other
      top-level objects such as "optimizer", "step"]). Paths follow the object graph, so a
      variable that the checkpoint stores under an optimizer key is still found by its
      model path.
    """
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    reader = tf.train.load_checkpoint(prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    shapes = reader.get_variable_to_shape_map()
    found, seen = {}, set()

    def walk(node_id, path):
        if node_id in seen:
            return
        seen.add(node_id)
        node = graph.nodes[node_id]
        for attribute in node.attributes:
            if attribute.name == "VARIABLE_VALUE":
                found[path] = tuple(shapes[attribute.checkpoint_key])
        for child in node.children:
            walk(child.node_id, f"{path}/{child.local_name}")

    others = []
    for child in graph.nodes[0].children:
        if child.local_name == "model":
            walk(child.node_id, "model")
        else:
            others.append(child.local_name)
    return found, others


def _load_ours(prefix: str, model, partial: bool) -> LoadReport:
    report = LoadReport(kind=OURS, path=prefix)
    stored, others = _stored_variables(prefix)
    report.ignored.extend(others)
    target = model
    # A task model's checkpoint into a bare encoder, or an encoder's into a task model.
    if isinstance(model, BertEncoder) and any(k.startswith("model/encoder/") for k in stored):
        target = tf.Module()
        target.encoder = model
    elif (not isinstance(model, BertEncoder)
          and not any(k.startswith("model/encoder/") for k in stored)
          and any(k.startswith("model/embeddings/") for k in stored)):
        target = model.encoder
    expected = _trackable_variables(target, "model")
    for key, var in expected.items():
        if key not in stored:
            report.missing.append(key)
        elif stored[key] != tuple(var.shape):
            report.mismatched.append(
                f"{key}: checkpoint {list(stored[key])} vs model {list(var.shape)}")
        else:
            report.loaded.append(key)
    report.unexpected.extend(k for k in sorted(stored) if k not in expected)
    _fail_if_needed(report, partial)
    # Matching was checked above on the object graph; optimizer, step etc. stay unread.
    tf.train.Checkpoint(model=target).restore(prefix).expect_partial()
    return report


# --------------------------------------------------------------------------- detection


def _is_prefix(path: str) -> bool:
    return tf.io.gfile.exists(path + ".index")


def resolve(path: str) -> tuple:
    """Finds what ``path`` holds: returns (kind, file-or-prefix).

    Accepts a TF1 or tf.train.Checkpoint prefix, a directory with ``bert_model.ckpt*``, a
    directory with a ``checkpoint`` state file, a Hugging Face directory
    (``model.safetensors``) or a ``.safetensors`` file.
    """
    path = os.fspath(path)
    if path.endswith(".safetensors") and tf.io.gfile.exists(path):
        return HF, path
    if tf.io.gfile.isdir(path):
        st = os.path.join(path, "model.safetensors")
        if tf.io.gfile.exists(st):
            return HF, st
        google = os.path.join(path, "bert_model.ckpt")
        if _is_prefix(google):
            return TF1, google
        latest = tf.train.latest_checkpoint(path)
        if latest:
            return _prefix_kind(latest), latest
        if tf.io.gfile.glob(os.path.join(path, "*.safetensors")):
            raise CheckpointError(f"{path}: sharded safetensors are not supported; "
                                  "expected a single model.safetensors")
        raise CheckpointError(
            f"{path}: no checkpoint found (expected bert_model.ckpt.index, model.safetensors "
            "or a 'checkpoint' state file)")
    if _is_prefix(path):
        return _prefix_kind(path), path
    raise CheckpointError(f"{path}: not a checkpoint prefix (no {path}.index), "
                          "directory or .safetensors file")


def _prefix_kind(prefix: str) -> str:
    names = [n for n, _ in tf.train.list_variables(prefix)]
    if "_CHECKPOINTABLE_OBJECT_GRAPH" in names and any(n.endswith(_ATTR_SUFFIX) for n in names):
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


def checkpoint_has_pretraining_heads(path: str) -> bool:
    kind, location = resolve(path)
    if kind == HF:
        names = _hf_reader(location).shapes
        return "cls.predictions.bias" in names
    names = [n for n, _ in tf.train.list_variables(location)]
    if kind == TF1:
        return "cls/predictions/output_bias" in names
    return any(n.startswith("model/masked_lm/") for n in names)


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
        return _load_by_table(model, _tf1_reader(location), TF1, location, partial, _TF1_IGNORED)
    if kind == HF:
        return _load_by_table(model, _hf_reader(location), HF, location, partial, _HF_IGNORED)
    if kind == OURS:
        return _load_ours(location, model, partial)
    raise ValueError(f"unknown checkpoint kind {kind!r}; expected one of {KINDS}")


# --------------------------------------------------------------------------- exports


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


def export_tf1_checkpoint(model, config: BertConfig, out_dir: str, *,
                          vocab_file: Optional[str] = None) -> str:
    """Writes ``model`` as Google's layout: ``bert_model.ckpt.*`` + ``bert_config.json``.

    The checkpoint holds exactly the original variable names and shapes, so
    ``tf.train.load_checkpoint`` and the original code's ``init_from_checkpoint`` read it.

    Returns:
      The checkpoint prefix ``out_dir/bert_model.ckpt``.
    """
    tf.io.gfile.makedirs(out_dir)
    prefix = os.path.join(out_dir, "bert_model.ckpt")
    arrays = tf1_arrays(model)
    names = sorted(arrays)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(arrays[n]) for n in names])
    _write_checkpoint_state(out_dir, prefix)
    config.to_json_file(os.path.join(out_dir, "bert_config.json"))
    if vocab_file:
        tf.io.gfile.copy(vocab_file, os.path.join(out_dir, "vocab.txt"), overwrite=True)
    return prefix


def export_hf_checkpoint(model, config: BertConfig, out_dir: str, *,
                         vocab_file: Optional[str] = None) -> str:
    """Writes ``model`` as a Hugging Face directory: ``model.safetensors`` + ``config.json``.

    The GELU form is kept ("gelu_exact" -> "gelu", "gelu_tanh" -> "gelu_new").

    Returns:
      The path of ``model.safetensors``.
    """
    from safetensors.numpy import save_file

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model.safetensors")
    save_file(_external_arrays(model, HF), path, metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config.to_hf_dict(), f, indent=2, sort_keys=True)
        f.write("\n")
    if vocab_file:
        tf.io.gfile.copy(vocab_file, os.path.join(out_dir, "vocab.txt"), overwrite=True)
    return path


def _write_checkpoint_state(out_dir: str, prefix: str) -> None:
    """Writes the ``checkpoint`` state file so ``tf.train.latest_checkpoint`` finds ``prefix``."""
    name = os.path.basename(prefix)
    with tf.io.gfile.GFile(os.path.join(out_dir, "checkpoint"), "w") as f:
        f.write(f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')


def save_ours(model, out_dir: str, config: Optional[BertConfig] = None) -> str:
    """Writes ``tf.train.Checkpoint(model=model)`` as ``out_dir/ckpt`` (+ bert_config.json)."""
    tf.io.gfile.makedirs(out_dir)
    prefix = tf.train.Checkpoint(model=model).write(os.path.join(out_dir, "ckpt"))
    _write_checkpoint_state(out_dir, prefix)
    if config is not None:
        config.to_json_file(os.path.join(out_dir, "bert_config.json"))
    return prefix


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
      config: the network's config; default: the config file beside the input.
      input_kind: force the input kind (default: detected).
      vocab_file: copied into ``output_dir``; default: ``vocab.txt`` beside the input.
      model: "encoder", "pretrainer" or "auto" (pretrainer when the input has the
        masked-LM head).
      partial: tolerate unexpected input tensors (e.g. a fine-tuned classifier's head).

    Returns:
      The written checkpoint (prefix or file).
    """
    from modeling.models import BertPretrainer

    if output_kind not in KINDS:
        raise ValueError(f"output kind {output_kind!r} is not one of {KINDS}")
    _, location = resolve(input_path)
    config = config or config_for(input_path)
    if config is None:
        raise CheckpointError(f"{input_path}: no bert_config.json / config.json beside the "
                              "checkpoint; pass the config explicitly")
    if model == "auto":
        model = "pretrainer" if checkpoint_has_pretraining_heads(input_path) else "encoder"
    network = BertPretrainer(config) if model == "pretrainer" else BertEncoder(config)
    report = load_pretrained(input_path, network, partial=partial, kind=input_kind)
    if report.missing:
        raise CheckpointError(report.describe())
    if vocab_file is None:
        beside = os.path.join(os.path.dirname(location), "vocab.txt")
        vocab_file = beside if tf.io.gfile.exists(beside) else None
    if output_kind == OURS:
        prefix = save_ours(network, output_dir, config)
        if vocab_file:
            tf.io.gfile.copy(vocab_file, os.path.join(output_dir, "vocab.txt"), overwrite=True)
        return prefix
    return EXPORTERS[output_kind](network, config, output_dir, vocab_file=vocab_file)
