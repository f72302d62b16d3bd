"""Checkpoint I/O for the network: the TF1 / Hugging Face name table, ``load_pretrained``, exports.

Three kinds of checkpoint are read by one entry point, ``load_pretrained(path, model)``:

* ``"tf1"``: Google's original layout (``bert_model.ckpt`` prefix, or a directory holding
  it), read with ``tf.train.load_checkpoint`` through ``weight_table``;
* ``"hf"``: a Hugging Face BERT directory (``config.json`` + ``model.safetensors``, or
  shards listed by ``model.safetensors.index.json``), read with the ``safetensors``
  package (no PyTorch). PyTorch pickles (``pytorch_model.bin``, ``.pt``) are refused with
  the way to convert them: nothing is ever unpickled;
* ``"ours"``: a ``tf.train.Checkpoint(model=..., optimizer=..., step=...)`` written by this
  project (prefix, or a directory with a ``checkpoint`` state file).

``weight_table(model)`` is the single list that maps every Keras weight (or a column
block of one: the fused query/key/value kernel) to its original TF1 name and its
Hugging Face name, with the transposes each layout needs. ``export_tf1_checkpoint`` and
``export_hf_checkpoint`` write a model back through the same table.

A file that cannot be read (a garbage ``.index``, a truncated ``.data-*`` shard, a damaged
``.safetensors``, a missing shard) raises ``CheckpointError`` naming the file and what is
wrong, never a bare TensorFlow or safetensors exception.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError

from data_prep import fileio
from modeling.config import BertConfig
from modeling.encoder import BertEncoder

TF1, HF, OURS = "tf1", "hf", "ours"
KINDS = (TF1, HF, OURS)
# Hugging Face's index of a sharded checkpoint: {"weight_map": {tensor name: shard file}}.
HF_INDEX = "model.safetensors.index.json"

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


def _feature_tagger_head(model) -> list:
    """The feature-based tagger's head (no original counterpart): names of our own,
    ``feature_tagger/...`` (TF1) and ``feature_tagger....`` (Hugging Face), no transposes."""
    parts = []
    if model.mix is not None:
        parts += [("mix/mix_weights", model.mix.mix_weights), ("mix/gamma", model.mix.gamma)]
    for i, bilstm in enumerate(model.bilstm_layers):
        for direction, layer in (("forward", bilstm.forward_layer),
                                 ("backward", bilstm.backward_layer)):
            cell = layer.cell
            for name in ("kernel", "recurrent_kernel", "bias"):
                parts.append((f"bilstm_{i}/{direction}/{name}", getattr(cell, name)))
    parts += [("dense/kernel", model.output_layer.dense.kernel),
              ("dense/bias", model.output_layer.dense.bias)]
    return [WeightEntry(var, f"feature_tagger/{name}",
                        "feature_tagger." + name.replace("/", "."))
            for name, var in parts]


def weight_table(model) -> list:
    """Every weight of ``model`` with its TF1 and Hugging Face names.

    Supports ``BertEncoder`` and the task models of ``modeling.models``. Task heads use the
    names of the original scripts: ``cls/predictions/*`` and ``cls/seq_relationship/*``
    (run_pretraining), ``output_weights`` / ``output_bias`` (run_classifier; also used for
    token tagging), ``cls/squad/*`` (run_squad); Hugging Face: ``cls.*``, ``classifier.*``,
    ``qa_outputs.*``. The feature-based tagger's BiLSTM head has no original: it is
    ``feature_tagger/*`` (``feature_tagger.*``).
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
    elif isinstance(model, (models.BertClassifier, models.BertMultipleChoice)):
        table += _logits_head(model.classifier, "", "classifier")
    elif isinstance(model, models.BertSpanLabeler):
        table += _logits_head(model.span, "cls/squad", "qa_outputs")
    elif isinstance(model, models.BertTokenTagger):
        table += _logits_head(model.tagger, "", "classifier")
    elif isinstance(model, models.BertFeatureTagger):
        table += _feature_tagger_head(model)
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
    with _reading(prefix, "index"):
        reader = checkpoint_reader(prefix)
        shapes = {k: tuple(v) for k, v in reader.get_variable_to_shape_map().items()}

    def get(name):
        with _reading(prefix, "data"):
            return reader.get_tensor(name)
    return _NamedReader(shapes, get)


@contextlib.contextmanager
def _reading(prefix: str, part: str):
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


# Magic numbers of PyTorch's formats: a zip archive (torch.save since 1.6), a bare pickle
# stream (protocol 2-5), the legacy format's magic number is itself a pickle.
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle")


def _looks_like_pickle(path: str) -> bool:
    """True when the file starts like a PyTorch zip archive or a pickle (never unpickled)."""
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            head = f.read(4)
    except (tf.errors.OpError, OSError):
        return False
    pickled = len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5  # PROTO opcode
    return head.startswith(_ZIP_MAGIC) or pickled


def pickle_refusal(path: str) -> CheckpointError:
    """The error for a PyTorch pickle (``pytorch_model.bin`` ...): why, and how to convert."""
    return CheckpointError(
        f"{path} is a PyTorch pickle file (pytorch_model.bin, .pt, .pth). This project never "
        "unpickles files: loading a pickle can run arbitrary code. Convert it to safetensors "
        "first, in a Python with torch and transformers:\n"
        "    from transformers import AutoModel\n"
        "    AutoModel.from_pretrained(\"IN_DIR\").save_pretrained(\"OUT_DIR\", "
        "safe_serialization=True)\n"
        "(use the class that holds your heads, e.g. BertForPreTraining, to keep them), then "
        "pass OUT_DIR (model.safetensors or model.safetensors.index.json + shards).")


class _SafetensorsFile:
    """One ``.safetensors`` file: tensor names and shapes from its header, tensors on demand.

    Local files are memory-mapped by ``safetensors``; files on gs:// and other filesystems
    of ``tf.io.gfile`` are read whole (object stores cannot be mapped). bfloat16 tensors
    come as ``ml_dtypes.bfloat16`` arrays (TensorFlow registers the type with numpy). A
    damaged file raises a CheckpointError naming it.
    """

    def __init__(self, path: str):
        from safetensors import SafetensorError, safe_open
        from safetensors.numpy import load

        self.path = path
        try:
            if "://" in path:
                with tf.io.gfile.GFile(path, "rb") as f:
                    tensors = load(f.read())
                self.shapes = {k: tuple(v.shape) for k, v in tensors.items()}
                self._get = tensors.__getitem__
            else:
                handle = safe_open(path, framework="np")
                self.shapes = {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}
                self._get = handle.get_tensor
        except SafetensorError as err:
            hint = (" It looks like a PyTorch pickle: " + str(pickle_refusal(path))
                    if _looks_like_pickle(path) else "")
            raise CheckpointError(f"{path}: not a valid safetensors file ({err}).{hint}") from None

    def get(self, name: str) -> np.ndarray:
        return np.asarray(self._get(name))


def _sharded_tensors(index_path: str) -> dict:
    """Tensor name -> its shard, from a ``*.safetensors.index.json`` and the shards beside it.

    Every shard the index names must exist and hold the tensors the index maps to it.
    """
    try:
        with tf.io.gfile.GFile(index_path, "rb") as f:
            index = json.loads(f.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{index_path}: not a JSON safetensors index ({err})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if (not isinstance(weight_map, dict) or not weight_map
            or not all(isinstance(k, str) and isinstance(v, str)
                       for k, v in weight_map.items())):
        raise CheckpointError(f"{index_path}: expected a JSON object whose \"weight_map\" maps "
                              "each tensor name to its shard file")
    directory = os.path.dirname(index_path)
    by_shard = {}
    for name, shard in weight_map.items():
        by_shard.setdefault(shard, []).append(name)
    shards = {}
    for shard, names in sorted(by_shard.items()):
        if shard in ("", ".", "..") or shard != os.path.basename(shard) or "\\" in shard:
            raise CheckpointError(f"{index_path}: shard {shard!r} (of tensor {names[0]}) is "
                                  "not a file name in the index's directory")
        path = os.path.join(directory, shard)
        if not tf.io.gfile.exists(path):
            raise CheckpointError(f"{index_path}: shard {shard} is missing (it should hold "
                                  f"{len(names)} tensors, e.g. {names[0]}); expected {path}")
        shards[shard] = _SafetensorsFile(path)
        absent = [n for n in names if n not in shards[shard].shapes]
        if absent:
            raise CheckpointError(
                f"{index_path}: tensor {absent[0]} is mapped to shard {shard}, which does not "
                f"hold it ({len(absent)} such tensor{'s' if len(absent) > 1 else ''})")
    return {name: shards[shard] for name, shard in weight_map.items()}


def _hf_reader(location: str) -> _NamedReader:
    """A Hugging Face ``.safetensors`` file, or a sharded one through its ``.index.json``."""
    if location.endswith(".json"):
        files = _sharded_tensors(location)
    else:
        single = _SafetensorsFile(location)
        files = dict.fromkeys(single.shapes, single)
    names = list(files)
    has_prefix = any(k.startswith("bert.") for k in names)
    aliases = {}
    for k in names:
        # Older files name LayerNorm parameters gamma/beta; bare BertModel files lack "bert.".
        canonical = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
            "LayerNorm.beta", "LayerNorm.bias")
        if not has_prefix and not re.match(r"^(cls|classifier|qa_outputs)\.", canonical):
            canonical = "bert." + canonical
        aliases[canonical] = k
    return _NamedReader({c: files[k].shapes[k] for c, k in aliases.items()},
                        lambda c: files[aliases[c]].get(aliases[c]))


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

    with _reading(prefix, "index"):
        reader = checkpoint_reader(prefix)
        shapes = reader.get_variable_to_shape_map()
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    with _reading(prefix, "data"):
        graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
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
    with _reading(prefix, "data"):
        tf.train.Checkpoint(model=target).restore(prefix).expect_partial()
    return report


# --------------------------------------------------------------------------- detection


def _is_prefix(path: str) -> bool:
    return tf.io.gfile.exists(path + ".index")


def resolve(path: str) -> tuple:
    """Finds what ``path`` holds: returns (kind, file-or-prefix).

    Accepts a TF1 or tf.train.Checkpoint prefix, a directory with ``bert_model.ckpt*``, a
    directory with a ``checkpoint`` state file, a Hugging Face directory
    (``model.safetensors``, or ``model.safetensors.index.json`` with its shards), a
    ``.safetensors`` file or a ``.safetensors.index.json``. PyTorch pickles
    (``pytorch_model.bin``, ``.pt``, ``.pth``) are refused, never unpickled.
    """
    path = os.fspath(path)
    if path.endswith((".safetensors", ".safetensors.index.json")) and tf.io.gfile.exists(path):
        return HF, path
    if tf.io.gfile.isdir(path):
        return _resolve_directory(path)
    if _is_prefix(path):
        return _prefix_kind(path), path
    if tf.io.gfile.exists(path) and (path.endswith(_PICKLE_SUFFIXES)
                                     or _looks_like_pickle(path)):
        raise pickle_refusal(path)
    raise CheckpointError(f"{path}: not a checkpoint prefix (no {path}.index), "
                          "directory or .safetensors file")


def checkpoint_reader(prefix: str):
    """A reader of the checkpoint at `prefix` (not a directory).

    `tf.train.load_checkpoint` first asks whether the path is a directory, and some
    filesystems answer yes for a bare prefix (ram:// does when `prefix.index` exists), so
    the prefix is opened directly.
    """
    return tf.compat.v1.train.NewCheckpointReader(prefix)


def _resolve_directory(path: str) -> tuple:
    for name in ("model.safetensors", HF_INDEX):
        if tf.io.gfile.exists(os.path.join(path, name)):
            return HF, os.path.join(path, name)
    google = os.path.join(path, "bert_model.ckpt")
    if _is_prefix(google):
        return TF1, google
    latest = tf.train.latest_checkpoint(path)
    if latest:
        return _prefix_kind(latest), latest
    names = sorted(tf.io.gfile.listdir(path))
    pickles = [n for n in names if n.endswith(_PICKLE_SUFFIXES) or n.endswith(".bin.index.json")]
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


def _prefix_kind(prefix: str) -> str:
    with _reading(prefix, "index"):
        names = list(checkpoint_reader(prefix).get_variable_to_shape_map())
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
    with _reading(location, "index"):
        names = list(checkpoint_reader(location).get_variable_to_shape_map())
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
        fileio.copy_file(vocab_file, os.path.join(out_dir, "vocab.txt"))
    return prefix


def export_hf_checkpoint(model, config: BertConfig, out_dir: str, *,
                         vocab_file: Optional[str] = None) -> str:
    """Writes ``model`` as a Hugging Face directory: ``model.safetensors`` + ``config.json``.

    The GELU form is kept ("gelu_exact" -> "gelu", "gelu_tanh" -> "gelu_new").

    Returns:
      The path of ``model.safetensors``.
    """
    from safetensors.numpy import save

    tf.io.gfile.makedirs(out_dir)
    path = os.path.join(out_dir, "model.safetensors")
    fileio.write_bytes(path, save(_external_arrays(model, HF), metadata={"format": "pt"}))
    fileio.write_text(os.path.join(out_dir, "config.json"),
                      json.dumps(config.to_hf_dict(), indent=2, sort_keys=True) + "\n")
    if vocab_file:
        fileio.copy_file(vocab_file, os.path.join(out_dir, "vocab.txt"))
    return path


def _write_checkpoint_state(out_dir: str, prefix: str) -> None:
    """Writes the ``checkpoint`` state file so ``tf.train.latest_checkpoint`` finds ``prefix``."""
    name = os.path.basename(prefix)
    fileio.write_text(os.path.join(out_dir, "checkpoint"),
                      f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')


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
            fileio.copy_file(vocab_file, os.path.join(output_dir, "vocab.txt"))
        return prefix
    return EXPORTERS[output_kind](network, config, output_dir, vocab_file=vocab_file)
