"""Owns the registry of serving families (``model_type`` -> family) and reading a run's metadata for one of them.

A family is known once the module defining it is imported: it registers itself at import
(``FAMILY = register(YourServing())``). ``tasks.register_serving_families()`` imports
them all (``export_saved_model.py`` and every caller serving any ``--model_type`` use
it): this package's ``encoder`` and ``hub`` modules and each task package's
``export.py``. Nothing here names a family.
"""

from __future__ import annotations

from typing import Optional

from data_prep import fileio
from modeling.export.metadata import METADATA_FILE, ExportError, ExportMetadata, read_metadata_json

# model_type -> its ServingFamily, filled by ``register`` as the modules defining families
# are imported.
_FAMILIES: dict = {}


def register(family):
    """Adds ``family`` (a ``families.ServingFamily``) under its ``model_type``; returns it.

    A family's module registers it at import (``FAMILY = register(YourServing())``).

    Raises:
      ValueError if another family class holds the ``model_type``, or the family's
      ``config_class`` names another ``model_type``.
    """
    if family.config_class.model_type != family.model_type:
        raise ValueError(f"{type(family).__name__}: config_class "
                         f"{family.config_class.__name__} has model_type "
                         f"{family.config_class.model_type!r}, not {family.model_type!r}")
    known = _FAMILIES.get(family.model_type)
    if known is not None and type(known).__qualname__ != type(family).__qualname__:
        raise ValueError(f"model_type {family.model_type!r} is registered twice: "
                         f"{type(known).__name__} and {type(family).__name__}")
    _FAMILIES[family.model_type] = family
    return family


def model_types() -> tuple:
    """The registered model types, in registration order."""
    return tuple(_FAMILIES)


def get_family(model_type: str):
    """The registered ``ServingFamily`` of ``model_type``."""
    if model_type not in _FAMILIES:
        raise ExportError(f"model_type {model_type!r} is not one of {model_types()} (a "
                          "family is known once the module defining it is imported)")
    return _FAMILIES[model_type]


def run_model_type(data: dict) -> Optional[str]:
    """The serving family recorded in a run's ``export_metadata.json`` (``data``), else
    None (metadata written by hand: unknown, read by any family)."""
    kind = data.get("model_type")
    return kind if isinstance(kind, str) and kind else None


def read_run_metadata(path: str, family=None) -> ExportMetadata:
    """A run's ``export_metadata.json`` (a file, or a directory holding it), read as the
    class of the family that wrote it; for an export of ``family``, refusing the run of
    another family (another head, other settings: a model that would be served wrongly,
    or not at all).

    Families that export only the encoder (``exports_any_run``) take any run's metadata.
    Without ``family`` (reading, not exporting) a family not registered in this process
    reads as ``ExportMetadata``.

    Raises:
      ExportError naming the file, what it holds and what was asked.
    """
    path, data = read_metadata_json(path)
    kind = run_model_type(data)
    if family is None:
        cls = _FAMILIES[kind].metadata_class if kind in _FAMILIES else ExportMetadata
        return cls.from_dict(data, source=path)
    if kind is not None and kind not in _FAMILIES:
        raise ExportError(f"{path}: model_type={kind!r} is not one of {model_types()}")
    if kind is not None and kind != family.model_type and not family.exports_any_run:
        run = get_family(kind)
        raise ExportError(
            f"{fileio.parent_dir(path) or '.'} holds {run.weights_description} "
            f"(its {METADATA_FILE}: model_type={kind!r}, task={data.get('task', '')!r}), "
            f"but --model_type={family.model_type} was asked, which exports "
            f"{family.weights_description}: export it with --model_type={kind}")
    cls = family.metadata_class
    if family.exports_any_run:
        cls = get_family(kind).metadata_class if kind is not None else ExportMetadata
    return cls.from_dict(data, source=path)
