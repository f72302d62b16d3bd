"""Owns writing an export all-or-nothing: the checks first (weights, what ``--export_dir`` may replace), then the swap.

``export_kind`` recognises an export this project wrote (the only kind ``--overwrite``
replaces).
"""

from __future__ import annotations

import json
import os
from typing import Optional, Sequence

import tensorflow as tf

from data_prep import fileio
from modeling.export.families import ServingConfig
from modeling.export.metadata import MARKER_PATH, ExportError
from modeling.export.registry import get_family
from modeling.export.serving import encoder_of

# The top-level entries of a SavedModel written by tf.saved_model.save, plus our marker.
SAVED_MODEL_ENTRIES = frozenset({"saved_model.pb", "variables", "assets", "assets.extra",
                                 "fingerprint.pb"})


def export_kind(path: str) -> Optional[str]:
    """The model_type of the export this project wrote at ``path``, else None.

    An export is recognised by its marker (``assets.extra/export_metadata.json`` holding a
    ``model_type``) and by holding nothing but what the exporter writes: a SavedModel's
    entries, or for ``hub`` the ``encoder`` and ``preprocessor`` SavedModels. A directory
    with anything else in it is not an export, whatever it also holds.
    """
    if not fileio.isdir(path):
        return None
    entries = {name.rstrip("/") for name in fileio.listdir(path)}
    if entries and entries <= {"encoder", "preprocessor"}:
        kinds = {export_kind(os.path.join(path, name)) for name in entries}
        return "hub" if kinds <= {"hub_encoder", "hub_preprocessor"} else None
    if "saved_model.pb" not in entries or not entries <= SAVED_MODEL_ENTRIES:
        return None
    try:
        data = json.loads(fileio.read_text(os.path.join(path, *MARKER_PATH)))
    except (OSError, ValueError, tf.errors.OpError):
        return None
    kind = data.get("model_type") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) and kind else None


def check_export_dir(export_dir: str, *, overwrite: bool,
                     inputs: Sequence[tuple[str, str]] = ()) -> None:
    """Refuses, before any work, an ``export_dir`` whose replacement could destroy data.

    Rules: the export never replaces (or lies around) an input: not the directory of any
    input file, nor a parent of one; not the checkpoint's directory, a parent or a child of
    it (a run's output_dir belongs to its run). An existing ``export_dir`` is replaced only
    if it is empty, or is an export this project wrote (``export_kind``) and ``overwrite``
    is set; a directory with other content is never replaced.

    Args:
      export_dir: the destination.
      overwrite: replacing a previous export is allowed.
      inputs: (flag, path) of what the export reads; the flag ``--init_checkpoint`` (its
        path: a checkpoint prefix or directory) also protects the checkpoint's children.

    Raises:
      ExportError naming the flags, the paths and why.
    """
    for flag, path in inputs:
        if not path:
            continue
        directory = path if fileio.isdir(path) else fileio.parent_dir(path)
        if fileio.is_within(directory, export_dir):
            how = "is" if fileio.is_within(export_dir, directory) else "contains"
            raise ExportError(
                f"--export_dir={export_dir} {how} the directory of {flag}={path}: replacing "
                "it would delete an input; export to a directory of its own")
        if flag == "--init_checkpoint" and fileio.is_within(export_dir, directory):
            raise ExportError(
                f"--export_dir={export_dir} is inside the checkpoint directory {directory} "
                f"({flag}={path}), which belongs to its training run; export beside it")
    if not fileio.exists(export_dir):
        return
    if not fileio.isdir(export_dir):
        raise ExportError(f"--export_dir={export_dir} is a file, not a directory; refusing "
                          "to replace it")
    entries = sorted(name.rstrip("/") for name in fileio.listdir(export_dir))
    if not entries:
        return
    kind = export_kind(export_dir)
    if kind is None:
        shown = ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else "")
        raise ExportError(
            f"--export_dir={export_dir} exists and is not empty, and is not an export written "
            f"by this project (it holds: {shown}); refusing to replace it, even with "
            "--overwrite. Choose a new directory.")
    if not overwrite:
        raise ExportError(f"--export_dir={export_dir} exists and is not empty: it holds a "
                          f"previous {kind} export (pass overwrite=True / --overwrite to "
                          "replace it)")


def export_saved_model(model, config: ServingConfig, export_dir: str, *,
                       overwrite: bool = False, tokenizer=None,
                       inputs: Sequence[tuple[str, str]] = ()) -> str:
    """Writes the export of ``model`` to ``export_dir``, all-or-nothing.

    The export is written to a hidden temporary beside ``export_dir`` and swapped in only
    when complete (``fileio.AtomicOutputs``), so ``export_dir`` is absent, the previous
    export, or the complete new one; temporaries of a killed run are removed by the next.
    ``check_export_dir`` decides first whether ``export_dir`` may be replaced.

    Args:
      model: the family's model with its weights (``BertClassifier`` / ``BertSpanLabeler``
        / ``BertEncoder``).
      config: the ``ServingConfig``.
      export_dir: destination directory.
      overwrite: replace a previous export of this project.
      tokenizer: an already built ``BertInGraphTokenizer`` (optional, saves ~2 s).
      inputs: (flag, path) of the files the export was made from (checkpoint, config);
        the vocab file is always one.

    Returns:
      ``export_dir``.
    """
    family = get_family(config.model_type)
    family.check_model(model, config)
    max_pos = encoder_of(model).config.max_position_embeddings
    if config.max_seq_length > max_pos:
        raise ExportError(f"max_seq_length={config.max_seq_length} exceeds the model's "
                          f"max_position_embeddings={max_pos}")
    export_dir = export_dir if fileio.is_url(export_dir) else os.path.abspath(export_dir)
    export_dir = export_dir.rstrip("/")
    check_export_dir(export_dir, overwrite=overwrite,
                     inputs=[*inputs, ("--vocab_file", config.vocab_file)])
    with fileio.AtomicOutputs([export_dir], replace_directories=True) as out:
        family.write(model, config, out.temp(export_dir), tokenizer=tokenizer)
    return export_dir
