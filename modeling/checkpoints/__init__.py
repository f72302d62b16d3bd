"""Checkpoint I/O for the network: one entry point reads every kind, one name table maps them, exports write them back.

Three kinds of checkpoint are read by one entry point, ``load_pretrained(path, model)``
(``loading.py``, which also finds what a path holds: ``resolve``):

* ``"tf1"``: Google's original layout (``bert_model.ckpt`` prefix, or a directory holding
  it), read with ``tf.train.load_checkpoint`` (``tf1.py``) through ``weight_table``;
* ``"hf"``: a Hugging Face BERT directory (``config.json`` + ``model.safetensors``, or
  shards listed by ``model.safetensors.index.json``), read with the ``safetensors``
  package, no PyTorch (``hf.py``). PyTorch pickles (``pytorch_model.bin``, ``.pt``) are
  refused with the way to convert them: nothing is ever unpickled;
* ``"ours"``: a ``tf.train.Checkpoint(model=..., optimizer=..., step=...)`` written by this
  project (prefix, or a directory with a ``checkpoint`` state file) (``ours.py``).

``weight_table(model)`` (``names.py``) is the single list that maps every Keras weight (or
a column block of one: the fused query/key/value kernel) to its original TF1 name and its
Hugging Face name, with the transposes each layout needs. ``export_tf1_checkpoint`` and
``export_hf_checkpoint`` (``writing.py``) write a model back through the same table;
``convert`` goes from any kind to any other (``read_network`` then ``write_network``).

A file that cannot be read (a garbage ``.index``, a truncated ``.data-*`` shard, a damaged
``.safetensors``, a missing shard) raises ``CheckpointError`` (``common.py``) naming the
file and what is wrong, never a bare TensorFlow or safetensors exception.

This package's names below are its public API; the modules hold the code.
"""

from modeling.checkpoints.common import (HF, HF_INDEX, KINDS, OURS, TF1, CheckpointError,
                                         LoadReport, checkpoint_reader)
from modeling.checkpoints.hf import pickle_refusal
from modeling.checkpoints.loading import (checkpoint_has_pretraining_heads, config_for,
                                          load_pretrained, resolve, vocab_for)
from modeling.checkpoints.names import WeightEntry, weight_table
from modeling.checkpoints.ours import save_ours
from modeling.checkpoints.writing import (EXPORTERS, check_output_dir, convert,
                                          export_hf_checkpoint, export_tf1_checkpoint,
                                          read_network, tf1_arrays, write_network)

__all__ = [
    "TF1", "HF", "OURS", "KINDS", "HF_INDEX", "CheckpointError", "LoadReport",
    "checkpoint_reader", "pickle_refusal", "checkpoint_has_pretraining_heads", "config_for",
    "load_pretrained", "resolve", "vocab_for", "WeightEntry", "weight_table", "save_ours", "EXPORTERS",
    "convert", "check_output_dir", "read_network", "write_network", "export_hf_checkpoint",
    "export_tf1_checkpoint", "tf1_arrays",
]
