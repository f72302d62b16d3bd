"""Owns what a serving family declares: settings (``ServingConfig``), flags (``FamilyFlag``), the ``ServingFamily`` base.

A family's module subclasses these and registers at import (``registry.register``); see
the package docstring (``modeling/export/__init__.py``) for the extension point.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import tensorflow as tf

from modeling.export.metadata import ExportError, ExportMetadata, write_marker
from modeling.export.registry import get_family
from modeling.export.serving import ServingModule


@dataclasses.dataclass(frozen=True)
class ServingConfig:
    """How the serving graph tokenizes: what every family's export needs.

    Each family's settings are the fields of its own subclass (its ``config_class``),
    which sets the class attribute ``model_type``; ``serving_config`` builds the one of
    a ``model_type``.

    Attributes:
      vocab_file: the model's vocab.txt (baked into the graph and copied as an asset).
      do_lower_case: tokenizer casing.
      max_seq_length: the longest window, special tokens included (hub: the
        preprocessor's default ``seq_length``).
      task: informational, written to assets.extra/export_metadata.json.
    """

    vocab_file: str
    do_lower_case: bool = True
    max_seq_length: int = 128
    task: str = ""

    model_type: ClassVar[str] = ""
    # Settings written to the export marker only when not at their default (added after
    # exports existed: the markers of exports without them keep their keys).
    omitted_at_default: ClassVar[dict] = {}

    def __post_init__(self):
        if self.max_seq_length < 3:
            raise ExportError(f"max_seq_length={self.max_seq_length} cannot hold [CLS] [SEP]")
        get_family(self.model_type).validate(self)

    @classmethod
    def settings_fields(cls) -> tuple:
        """The family's own settings: the fields beyond ``ServingConfig``'s, in order."""
        common = {field.name for field in dataclasses.fields(ServingConfig)}
        return tuple(field.name for field in dataclasses.fields(cls)
                     if field.name not in common)


def serving_config(model_type: str, vocab_file: str, do_lower_case: bool = True,
                   max_seq_length: int = 128, **settings) -> ServingConfig:
    """The ``ServingConfig`` of the family ``model_type`` (its ``config_class``).

    Args:
      settings: ``task`` and the family's own settings (``config_class`` fields).

    Raises:
      ExportError for an unknown ``model_type`` or a setting the family does not have.
    """
    cls = get_family(model_type).config_class
    unknown = sorted(set(settings) - set(cls.settings_fields()) - {"task"})
    if unknown:
        raise ExportError(f"model_type {model_type!r} has no setting {unknown} (its "
                          f"settings: {list(cls.settings_fields())})")
    return cls(vocab_file=vocab_file, do_lower_case=do_lower_case,
               max_seq_length=max_seq_length, **settings)


@dataclasses.dataclass(frozen=True)
class FamilyFlag:
    """A command-line flag of one family's settings (plain data: ``export_saved_model.py``
    defines it, refuses it for the families that do not declare it, and passes its value
    to ``ServingFamily.settings`` when given). Families declaring the same flag declare
    it alike (kind and default).

    Attributes:
      name: the flag (without ``--``); by default it sets the config field of that name.
      kind: "string", "integer", "bool" or "list" (comma separated strings).
      default: its value when not given.
      help: what it does for the family (the CLI prefixes the family's name).
    """

    name: str
    kind: str
    default: Any
    help: str


class ServingFamily:
    """What one ``--model_type`` exports (see the module docstring: the extension point).

    Attributes:
      model_type: the registry key.
      config_class: its ``ServingConfig`` subclass (the family's own settings).
      weights_description: what a checkpoint must hold, for error messages.
      flags: its ``FamilyFlag`` specs (the CLI refuses them for other families).
      metadata_class: the ``ExportMetadata`` (sub)class its fine-tuning runner writes.
      default_max_seq_length: the export's window when neither a flag nor the run sets it.
      max_seq_length_from_run: the run's ``max_seq_length`` is the export's default.
    """

    model_type = ""
    config_class: type = ServingConfig
    weights_description = ""
    flags: tuple = ()
    metadata_class: type = ExportMetadata
    default_max_seq_length = 128
    max_seq_length_from_run = True
    # Exports only the encoder, which every run has: any run's metadata is accepted.
    exports_any_run = False

    def default_fields(self, max_seq_length: int) -> dict:
        """Settings whose default for this family depends on ``max_seq_length`` (or
        differs from the config class's), used when neither the metadata nor a flag sets
        them."""
        return {}

    def config_fields(self, metadata) -> dict:
        """Settings that the run's ``export_metadata.json`` (an instance of
        ``metadata_class``) sets; flags given override them."""
        return {}

    def settings(self, given: dict, metadata, max_seq_length: int) -> dict:
        """The family's settings (``config_class`` fields) for an export.

        Precedence: a flag given, then the run's metadata (``config_fields``), then
        ``default_fields``, then the config class's defaults. A flag sets the field of
        its name; a family with flags of other names overrides this to read them.

        Args:
          given: {flag name: value} of the family's flags given on the command line.
          metadata: the run's ``export_metadata.json`` (``metadata_class``) or None.
          max_seq_length: the export's.

        Raises:
          ExportError naming the flag, for values that do not fit together.
        """
        values = dict(self.default_fields(max_seq_length))
        if metadata is not None:
            values.update(self.config_fields(metadata))
        fields = self.config_class.settings_fields()
        values.update({name: value for name, value in given.items() if name in fields})
        return values

    def weights_hint(self, message: str) -> str:
        """An extra line for a checkpoint that does not fit the model (``message``)."""
        return ""

    def validate(self, config: ServingConfig) -> None:
        """Raises ExportError for settings this family cannot serve."""

    def build_model(self, config: ServingConfig, bert_config, dtype_policy: str):
        """The (untrained) model whose weights the checkpoint provides."""
        raise NotImplementedError

    def check_model(self, model, config: ServingConfig) -> None:
        """Raises ExportError when ``model`` does not fit the family or ``config``."""
        raise NotImplementedError

    def signatures(self, module: ServingModule) -> dict:
        """The family's concrete functions by signature name (``encode`` is added)."""
        raise NotImplementedError

    def write(self, model, config: ServingConfig, directory: str, tokenizer=None) -> None:
        """Writes the export into the fresh ``directory`` (a temporary; see the writer)."""
        module = ServingModule(model, config, tokenizer=tokenizer)
        tf.saved_model.save(module, directory, signatures=module.signatures())
        write_marker(directory, config.model_type, config)


def label_names(given: dict, metadata, model_type: str, *, name_by_count: bool = False):
    """Label names in id order: ``--label_list`` if given, else the run's metadata's;
    checked against ``--num_labels`` (which, with ``name_by_count``, alone names them
    "0".."n-1").

    Raises:
      ExportError naming the flags: no labels, a count mismatch, a repeated name.
    """
    labels = tuple(given.get("label_list") or (metadata.labels if metadata else ()))
    count = given.get("num_labels")
    if count is not None:
        if labels and len(labels) != count:
            raise ExportError(f"label count mismatch: --num_labels={count} but the label "
                              f"list has {len(labels)} labels: {list(labels)}")
        if name_by_count:
            labels = labels or tuple(str(i) for i in range(count))
    if not labels:
        raise ExportError(f"a {model_type} export needs --label_list"
                          + (" or --num_labels" if name_by_count else "")
                          + " (or an export_metadata.json beside --init_checkpoint)")
    if len(set(labels)) != len(labels):
        raise ExportError(f"--label_list has repeated names: {list(labels)}")
    return labels


TEXT_PAIR_FLAG = FamilyFlag(
    "text_pair", "bool", None, "inputs are pairs (text + text_pair); default: the run's "
    "metadata, else false.")


def text_pair_setting(given: dict, metadata) -> bool:
    """``--text_pair`` if given, else the run's metadata's, else False."""
    if "text_pair" in given:
        return bool(given["text_pair"])
    return bool(metadata is not None and metadata.text_pair)


def expect_model(model, expected, config: ServingConfig) -> None:
    """Raises ExportError unless ``model`` is an ``expected`` (the family's model class)."""
    if not isinstance(model, expected):
        raise ExportError(f"model_type {config.model_type!r} needs a {expected.__name__}, got "
                          f"{type(model).__name__}")
