"""Owns writing an export all-or-nothing: the checks first (weights, what ``--export_dir`` may replace), then the swap.

``export_kind`` recognises an export this project wrote (the only kind ``--overwrite``
replaces).
"""

from __future__ import annotations

import json
import os
import re
from typing import Optional, Sequence

import tensorflow as tf

from data_prep import fileio
from modeling.export.families import ServingConfig
from modeling.export.metadata import MARKER_PATH, ExportError
from modeling.export.registry import get_family
from modeling.export.serving import encoder_of

# What the exporter writes in a SavedModel directory (``families.ServingFamily.write``:
# ``tf.saved_model.save``, then ``metadata.write_marker``): two files, and three folders
# holding only files, told apart by name (variables: the index and the data shards; assets:
# the files the graph names, the vocab; assets.extra: the marker).
SAVED_MODEL_FILES = frozenset({tf.saved_model.SAVED_MODEL_FILENAME_PB, "fingerprint.pb"})
_VARIABLE_FILE = re.compile(re.escape(tf.saved_model.VARIABLES_FILENAME)
                            + r"\.(index|data-\d{5}-of-\d{5})")
HUB_PARTS = frozenset({"encoder", "preprocessor"})


def _entries(path: str) -> list:
    return sorted(name.rstrip("/") for name in fileio.listdir(path))


def _asset_files(path: str) -> frozenset:
    """The asset files the SavedModel at ``path`` names (what ``tf.saved_model.save``
    copied into its assets/); none when its saved_model.pb cannot be read."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    try:
        with fileio.open_file(os.path.join(path, tf.saved_model.SAVED_MODEL_FILENAME_PB),
                              "rb") as reader:
            saved_model.ParseFromString(reader.read())
    except (OSError, DecodeError, tf.errors.OpError):
        return frozenset()
    return frozenset(asset.filename for graph in saved_model.meta_graphs
                     for asset in graph.asset_file_def)


def foreign_entry(path: str) -> Optional[str]:
    """The first entry under the directory ``path`` (relative to it) that the exporter
    does not write, at any depth; None when there is none (the directory may still lack
    what makes it an export: ``export_kind``). A ``hub`` export is two SavedModels."""
    entries = _entries(path)
    if entries and set(entries) <= HUB_PARTS:
        for name in entries:
            inside = os.path.join(path, name)
            entry = foreign_entry(inside) if fileio.isdir(inside) else "."
            if entry:
                return name if entry == "." else f"{name}/{entry}"
        return None
    folders = {tf.saved_model.VARIABLES_DIRECTORY: _VARIABLE_FILE.fullmatch,
               MARKER_PATH[0]: {MARKER_PATH[1]}.__contains__}
    if tf.saved_model.ASSETS_DIRECTORY in entries:
        folders[tf.saved_model.ASSETS_DIRECTORY] = _asset_files(path).__contains__
    for name in entries:
        inside = os.path.join(path, name)
        if name in SAVED_MODEL_FILES and not fileio.isdir(inside):
            continue
        if name not in folders or not fileio.isdir(inside):
            return name
        for file in _entries(inside):
            if not folders[name](file) or fileio.isdir(os.path.join(inside, file)):
                return f"{name}/{file}"
    return None


def export_kind(path: str) -> Optional[str]:
    """The model_type of the export this project wrote at ``path``, else None.

    An export is recognised by its marker (``assets.extra/export_metadata.json`` holding a
    ``model_type``) and by holding nothing but what the exporter writes, at every depth
    (``foreign_entry``): a SavedModel's files, or for ``hub`` the ``encoder`` and
    ``preprocessor`` SavedModels. A directory with anything else in it (a user's notes in
    its assets.extra/) is not an export, whatever it also holds.
    """
    if not fileio.isdir(path):
        return None
    entries = _entries(path)
    if entries and set(entries) <= HUB_PARTS:
        kinds = {export_kind(os.path.join(path, name)) for name in entries}
        return "hub" if kinds <= {"hub_encoder", "hub_preprocessor"} else None
    if (tf.saved_model.SAVED_MODEL_FILENAME_PB not in entries
            or foreign_entry(path) is not None):
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
    it (a run's output_dir belongs to its run). A symbolic link is never replaced (the swap
    would replace the link, not the export it points to). An existing ``export_dir`` is
    replaced only if it is empty, or is an export this project wrote (``export_kind``) and
    ``overwrite`` is set; a directory with other content is never replaced.

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
    local = None if fileio.is_url(export_dir) else os.path.abspath(export_dir)
    if local and os.path.islink(local):
        # Swapping the new export in would replace the link, not the export it points to.
        raise ExportError(
            f"--export_dir={export_dir} is a symbolic link to {os.readlink(local)}; refusing "
            f"to replace a link: give the directory itself (--export_dir="
            f"{os.path.realpath(local)})")
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
        foreign = foreign_entry(export_dir)
        shown = (f"{foreign}, which the exporter does not write" if foreign else
                 ", ".join(entries[:5]) + (" ..." if len(entries) > 5 else ""))
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
