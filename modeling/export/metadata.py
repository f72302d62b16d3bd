"""Owns the export's metadata contract: ``export_metadata.json`` (a run's, and each export's marker copy) and ``ExportError``.

``export_metadata.json`` is the small contract between a fine-tuning runner and the
exporter (labels, task settings; see ``ExportMetadata``). Its ``model_type`` says which
serving family's run it is (``registry.read_run_metadata`` refuses it for another family).
Every export carries its own copy with ``"model_type"`` added in
``assets.extra/export_metadata.json`` (``write_marker``): that is also the marker by which
``--overwrite`` recognises an export this project wrote (``writer.export_kind``).
"""

from __future__ import annotations

import dataclasses
import json
import os

from data_prep import fileio
from data_prep.cli import UserError

METADATA_FILE = "export_metadata.json"
# assets.extra/ is where SavedModel tooling keeps files that are not part of the graph.
MARKER_PATH = ("assets.extra", METADATA_FILE)


class ExportError(UserError):
    """Export settings that do not fit together (says which setting and what was expected)."""


@dataclasses.dataclass(frozen=True)
class ExportMetadata:
    """What a fine-tuning runner writes beside its checkpoint as ``export_metadata.json``.

    Attributes:
      task: task name (e.g. "mrpc", "sst-2", "custom"); informational.
      labels: label names in id order (empty for regression).
      is_regression: one float output (``score``) instead of label probabilities.
      do_lower_case: the tokenizer casing used in fine-tuning.
      max_seq_length: the fine-tuning sequence length.
      text_pair: the task takes sentence pairs (text_a + text_b).
      model_type: the serving family the run trained (the ``--model_type`` that exports
        it, a registered family); "" when unknown (metadata written by hand), which
        every family reads.
    """

    task: str = ""
    labels: tuple = ()
    is_regression: bool = False
    do_lower_case: bool = True
    max_seq_length: int = 128
    text_pair: bool = False
    model_type: str = ""

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["labels"] = list(self.labels)
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict, source: str = "metadata") -> "ExportMetadata":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ExportError(f"{source}: unknown keys {unknown}; expected a subset of "
                              f"{sorted(known)}")
        kwargs = dict(data)
        if "labels" in kwargs:
            labels = kwargs["labels"]
            if not isinstance(labels, (list, tuple)) or not all(
                    isinstance(x, str) for x in labels):
                raise ExportError(f"{source}: 'labels' must be a list of strings, got {labels!r}")
            kwargs["labels"] = tuple(labels)
        return cls(**kwargs)


def write_export_metadata(path: str, metadata: ExportMetadata) -> None:
    """Writes ``metadata`` as JSON (``path`` is a file, or a directory: then METADATA_FILE)."""
    if fileio.isdir(path):
        path = os.path.join(path, METADATA_FILE)
    fileio.write_text(path, metadata.to_json())


def read_metadata_json(path: str) -> tuple[str, dict]:
    """(the file, its JSON object) of ``export_metadata.json`` (a file, or a directory
    holding it)."""
    if fileio.isdir(path):
        path = os.path.join(path, METADATA_FILE)
    try:
        data = json.loads(fileio.read_text(path))
    except json.JSONDecodeError as err:
        raise ExportError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ExportError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return path, data


def write_marker(directory: str, model_type: str, config) -> None:
    """``assets.extra/export_metadata.json``: the settings of ``config`` (a
    ``families.ServingConfig``, or None) + ``model_type`` (our marker)."""
    data = {}
    if config is not None:
        # The contract's keys first (a family without a setting writes its default), then
        # the family's own settings.
        data = json.loads(ExportMetadata(
            task=config.task, labels=tuple(getattr(config, "labels", ())),
            is_regression=getattr(config, "is_regression", False),
            do_lower_case=config.do_lower_case, max_seq_length=config.max_seq_length,
            text_pair=getattr(config, "text_pair", False)).to_json())
        data.update({name: getattr(config, name) for name in config.settings_fields()
                     if name not in data and config.omitted_at_default.get(name, ())
                     != getattr(config, name)})
    data["model_type"] = model_type
    extra = os.path.join(directory, *MARKER_PATH[:-1])
    fileio.makedirs(extra)
    with fileio.open_file(os.path.join(extra, METADATA_FILE), "w", newline="\n") as f:
        f.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
