"""Owns reading Hugging Face checkpoints: ``model.safetensors`` or shards listed by ``model.safetensors.index.json``; PyTorch pickles refused.

Read with the ``safetensors`` package (no PyTorch). PyTorch pickles (``pytorch_model.bin``,
``.pt``) are refused with the way to convert them: nothing is ever unpickled. A damaged
``.safetensors`` or a missing shard raises ``CheckpointError`` naming the file. The names
are mapped to the model by ``modeling.checkpoints.names.weight_table``.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import tensorflow as tf

from modeling.checkpoints.common import CheckpointError, NamedReader

# Buffers and tied duplicates that Hugging Face files may hold.
HF_IGNORED = re.compile(
    r"(position_ids$|^cls\.predictions\.decoder\.(weight|bias)$)")



# Magic numbers of PyTorch's formats: a zip archive (torch.save since 1.6), a bare pickle
# stream (protocol 2-5), the legacy format's magic number is itself a pickle.
_ZIP_MAGIC = b"PK\x03\x04"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle")


def looks_like_pickle(path: str) -> bool:
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
                    if looks_like_pickle(path) else "")
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


def hf_reader(location: str) -> NamedReader:
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
    return NamedReader({c: files[k].shapes[k] for c, k in aliases.items()},
                        lambda c: files[aliases[c]].get(aliases[c]))
