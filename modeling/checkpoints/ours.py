"""Owns this project's checkpoints: ``tf.train.Checkpoint(model=..., optimizer=..., step=...)`` read by object path (partially: an encoder into a task model and back), and written."""

from __future__ import annotations

import os
from typing import Optional

import tensorflow as tf

from data_prep import fileio
from modeling.checkpoints.common import (OURS, LoadReport, checkpoint_reader, fail_if_needed,
                                         reading)
from modeling.config import BertConfig
from modeling.encoder import BertEncoder

ATTR_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


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


def stored_variables(prefix: str) -> tuple:
    """Reads a tf.train.Checkpoint's object graph.

    Returns:
      ({object path under the root, e.g. "model/encoder/pooler/bias": shape}, [other
      top-level objects such as "optimizer", "step"]). Paths follow the object graph, so a
      variable that the checkpoint stores under an optimizer key is still found by its
      model path.
    """
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    with reading(prefix, "index"):
        reader = checkpoint_reader(prefix)
        shapes = reader.get_variable_to_shape_map()
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    with reading(prefix, "data"):
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


def load_ours(prefix: str, model, partial: bool) -> LoadReport:
    """Loads one of our checkpoints into `model` by object path, after checking names and
    shapes on its object graph (a task model's encoder into a bare encoder and back)."""
    report = LoadReport(kind=OURS, path=prefix)
    stored, others = stored_variables(prefix)
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
            report.add_mismatch(key, stored[key], tuple(var.shape))
        else:
            report.loaded.append(key)
    report.unexpected.extend(k for k in sorted(stored) if k not in expected)
    fail_if_needed(report, partial)
    # Matching was checked above on the object graph; optimizer, step etc. stay unread.
    with reading(prefix, "data"):
        tf.train.Checkpoint(model=target).restore(prefix).expect_partial()
    return report


def write_checkpoint_files(out_dir: str, name: str, save, texts: Optional[dict] = None,
                           vocab_file: Optional[str] = None) -> str:
    """Writes a checkpoint and the files beside it into ``out_dir`` as ONE all-or-nothing set.

    ``save(prefix)`` writes the checkpoint (TensorFlow's ``.index`` and ``.data-*``); it
    writes them in a scratch folder (``fileio.work_directory``: beside ``out_dir``, or in
    the local temporary folder for an object store), and they become temporaries of one
    ``fileio.AtomicOutputs`` with the ``checkpoint`` state file, ``texts`` (file name ->
    text, e.g. the config) and a copy of ``vocab_file``: a conversion that fails or is
    interrupted leaves the previous files, never new weights beside an old config.

    Returns:
      The checkpoint prefix ``out_dir/name``.
    """
    prefix = os.path.join(out_dir, name)
    scratch_of = fileio.staging_name() if fileio.is_object_store(out_dir) else prefix
    with fileio.work_directory(scratch_of) as scratch:
        save(f"{scratch}/{name}")
        # Data shards first, the index (by which a reader finds a checkpoint) after them.
        written = sorted(fileio.listdir(scratch), key=lambda n: (n.endswith(".index"), n))
        state = os.path.join(out_dir, "checkpoint")
        texts = {os.path.join(out_dir, n): text for n, text in (texts or {}).items()}
        texts[state] = f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n'
        vocab = [os.path.join(out_dir, "vocab.txt")] if vocab_file else []
        with fileio.AtomicOutputs([os.path.join(out_dir, n) for n in written]
                                  + list(texts) + vocab) as out:
            for n in written:
                fileio.rename(f"{scratch}/{n}", out.temp(os.path.join(out_dir, n)))
            for path, text in texts.items():
                with out.open(path, "w", newline="\n") as f:
                    f.write(text)
            if vocab_file:
                out.copy(vocab_file, vocab[0])
    return prefix


def save_ours(model, out_dir: str, config: Optional[BertConfig] = None,
              vocab_file: Optional[str] = None, texts: Optional[dict] = None) -> str:
    """Writes ``tf.train.Checkpoint(model=model)`` as ``out_dir/ckpt`` (+ bert_config.json,
    vocab.txt, ``texts``: {file name: text}) as one all-or-nothing set
    (`write_checkpoint_files`)."""
    texts = dict(texts or {})
    if config is not None:
        texts["bert_config.json"] = config.to_json_string()
    return write_checkpoint_files(out_dir, "ckpt", tf.train.Checkpoint(model=model).write,
                                  texts, vocab_file)
