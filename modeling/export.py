"""Owns the serving export machinery: the metadata contract, in-graph packing, the encoder signatures, the family registry and the all-or-nothing writer.

``export_saved_model(model, config, export_dir)`` writes a TensorFlow SavedModel that
``tf.saved_model.load`` serves in a process with only ``tensorflow`` and
``tensorflow_text`` (imported first, for its ops): no project code, no Keras classes.
Tokenization is ``data_prep.tf_tokenization.BertInGraphTokenizer`` baked into the graph
with the model's own vocab (also packaged as the asset ``assets/vocab.txt``) and casing.

What each ``--model_type`` exports is a *serving family*: a ``ServingFamily`` registered
with ``register`` by the module that defines it. This module defines the generic machinery
and one family, ``encoder`` (text [+ text_pair] -> the encoder's outputs);
``modeling.hub_export`` defines ``hub`` (a TF Hub encoder + preprocessor pair, not one
SavedModel); every task package defines its own family in its ``export.py`` (its
signatures, its settings, its flags). Nothing here names a task family: a family is
known once its module is imported (``export_saved_model.py`` imports them all).

Signatures every single-SavedModel family shares (batch-first; strings are UTF-8
``tf.string`` [batch]):

* ``serving_default``: the task on raw strings (see each family's module);
* ``preprocess``: the same string inputs -> int32 ``input_ids``, ``input_mask``,
  ``segment_ids`` [batch, seq] (plus a family's extras);
* ``encode``: int32 ``input_ids``/``input_mask``/``segment_ids`` [batch, seq] (this
  project's input names) -> ``pooled_output`` [batch, hidden], ``sequence_output``
  [batch, seq, hidden], ``encoder_outputs`` [batch, layers, seq, hidden] (stacked:
  signatures cannot return lists). This is NOT the TF Hub encoder interface (other input
  names, stacked layers, no ``training`` argument): ``--model_type=hub`` exports that.

All float outputs are float32, whatever the compute dtype (a ``mixed_bfloat16`` model
computes in bfloat16 and casts its outputs).

No request is padded to ``max_seq_length``: packing truncates and windows at
``max_seq_length`` as the original, then ``trim_to_request`` cuts the padding beyond the
request's longest row (rounded up to ``WIDTH_MULTIPLE``), so ``seq`` above is the
request's width and the outputs equal the padded graph's. On ids a caller packed
(``encode``, ``serving_tokenized``) the model runs on that width and the outputs return at
the caller's (``pad_positions``: zeros where only padding was cut).

Adding a task family's export (the extension point)
---------------------------------------------------
1. Write ``<task package>/export.py`` with a ``ServingConfig`` subclass holding the
   family's own settings as fields with defaults (``model_type`` as a class attribute),
   and a ``ServingFamily`` subclass registered at import: ``FAMILY =
   export.register(YourServing())``. The family declares ``model_type``,
   ``config_class``, its command-line flags (``flags``: ``FamilyFlag`` specs, which the
   CLI defines and refuses for every other family), the ``ExportMetadata`` subclass its
   runner writes (``metadata_class``, with ``model_type=FAMILY.model_type``: the
   family's runs are refused by the others) and how its settings are chosen
   (``settings(given, metadata, max_seq_length)``: the flags given, then the run's
   metadata, then its defaults), ``validate(config)``,
   ``build_model(config, bert_config, dtype_policy)``, ``check_model(model, config)`` and
   ``signatures(module)``: concrete functions by name, built on the ``ServingModule``
   helpers (``module.pack`` for the classifier packing, ``module.model_outputs``,
   ``text_signatures``). Override ``write`` only for a layout other than one SavedModel
   (see ``modeling/hub_export.py``).
2. Nothing else changes: ``export_saved_model.py`` imports every task package's
   ``export.py``; its ``--model_type`` choices, the family flags, the weight checks, the
   overwrite rules and the atomic writer then apply.

Files: ``export_metadata.json`` is the small contract between the fine-tuning runner and
the exporter (labels, task settings; see ``ExportMetadata``). Its ``model_type`` says which
family's run it is: ``read_run_metadata`` refuses it for another family (only the families
that export the encoder every run has, ``encoder`` and ``hub``, take any run). Every export carries
its own copy with ``"model_type"`` added in ``assets.extra/export_metadata.json``: that is also the
marker by which ``--overwrite`` recognises an export this project wrote (``check_export_dir``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, ClassVar, Optional, Sequence

import numpy as np
import tensorflow as tf

from data_prep import fileio
from modeling.encoder import BertEncoder

# The registry: model_type -> its ServingFamily, filled by ``register`` as the modules
# defining families are imported.
_FAMILIES: dict = {}
DTYPES = ("float32", "bfloat16")
METADATA_FILE = "export_metadata.json"
# assets.extra/ is where SavedModel tooling keeps files that are not part of the graph.
MARKER_PATH = ("assets.extra", METADATA_FILE)
# The message of the InvalidArgumentError for an input needing too many windows (kept for
# tests and docs).
TOO_MANY_WINDOWS = "needs more context windows than max_context_windows"
# The top-level entries of a SavedModel written by tf.saved_model.save, plus our marker.
SAVED_MODEL_ENTRIES = frozenset({"saved_model.pb", "variables", "assets", "assets.extra",
                                 "fingerprint.pb"})


class ExportError(ValueError):
    """Export settings that do not fit together (says which setting and what was expected)."""


# --------------------------------------------------------------------------- contract


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
        it, a registered family); "" in metadata written before it was
        recorded, whose family ``run_model_type`` then infers.
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


def metadata_keys(cls: type) -> set:
    """The keys of an ``export_metadata.json`` of class ``cls`` (an ``ExportMetadata``)."""
    return {field.name for field in dataclasses.fields(cls)}


def write_export_metadata(path: str, metadata: ExportMetadata) -> None:
    """Writes ``metadata`` as JSON (``path`` is a file, or a directory: then METADATA_FILE)."""
    if fileio.isdir(path):
        path = os.path.join(path, METADATA_FILE)
    fileio.write_text(path, metadata.to_json())


def _metadata_json(path: str) -> tuple[str, dict]:
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


def read_export_metadata(path: str, cls: Optional[type] = None) -> ExportMetadata:
    """Reads ``export_metadata.json`` (a file, or a directory holding it) as ``cls`` (a
    family's subclass of ``ExportMetadata``, e.g. the tagger's, with its extra keys);
    by default as the class of the family that wrote it (``run_model_type``)."""
    path, data = _metadata_json(path)
    if cls is None:
        kind = run_model_type(data)
        cls = get_family(kind).metadata_class if kind in _FAMILIES else ExportMetadata
    return cls.from_dict(data, source=path)


def run_model_type(data: dict) -> Optional[str]:
    """The serving family of the run whose ``export_metadata.json`` holds ``data``.

    Its ``model_type`` when recorded; for metadata written before it was, the one family
    that ``claims_legacy_run`` it (by its task and keys), else None (unknown).
    """
    kind = data.get("model_type")
    if isinstance(kind, str) and kind:
        return kind
    claims = [name for name, family in _FAMILIES.items() if family.claims_legacy_run(data)]
    return claims[0] if len(claims) == 1 else None


def read_run_metadata(path: str, family: "ServingFamily") -> ExportMetadata:
    """A run's ``export_metadata.json`` read for an export of ``family``, refusing the
    run of another family (another head, other settings: a model that would be served
    wrongly, or not at all).

    Families that export only the encoder (``exports_any_run``) take any run's metadata,
    read as the class of the family that wrote it.

    Raises:
      ExportError naming the file, what it holds and what was asked.
    """
    path, data = _metadata_json(path)
    kind = run_model_type(data)
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


def register(family: "ServingFamily") -> "ServingFamily":
    """Adds ``family`` to the registry under its ``model_type``; returns it.

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


def get_family(model_type: str) -> "ServingFamily":
    """The registered ``ServingFamily`` of ``model_type``."""
    if model_type not in _FAMILIES:
        raise ExportError(f"model_type {model_type!r} is not one of {model_types()} (a "
                          "family is known once the module defining it is imported)")
    return _FAMILIES[model_type]


# --------------------------------------------------------------------------- graph pieces


def string_spec(name):
    """A [batch] tf.string input of a signature."""
    return tf.TensorSpec([None], tf.string, name=name)


def ids_specs():
    """The three int32 [batch, seq] model inputs of ``encode`` / ``serving_tokenized``."""
    return {k: tf.TensorSpec([None, None], tf.int32, name=k)
            for k in ("input_ids", "input_mask", "segment_ids")}


# A request runs the encoder on its longest row, that length rounded up to a multiple of
# this (never beyond the window): fewer distinct shapes for the kernels' caches, at most
# 7 padding positions per row (measured in docs/export.md#request-width).
WIDTH_MULTIPLE = 8


def request_width(input_mask):
    """Scalar int32: the positions a request needs, from its ``input_mask`` [..., seq]:
    up to the last position holding a real token in any row, rounded up to
    ``WIDTH_MULTIPLE``, at least 1 and at most ``seq``."""
    seq = tf.shape(input_mask)[-1]
    used = tf.reduce_any(tf.not_equal(tf.reshape(input_mask, [-1, seq]), 0), axis=0)
    last = tf.reduce_max(tf.where(used, tf.range(1, seq + 1), 0))   # 0: no real token
    width = (tf.maximum(last, 1) + WIDTH_MULTIPLE - 1) // WIDTH_MULTIPLE * WIDTH_MULTIPLE
    return tf.minimum(width, seq)


def trim_to_request(features: dict) -> dict:
    """int32 features [..., seq] -> the same, cut to ``request_width`` positions: only
    padding is cut, so the model's outputs on real tokens do not change."""
    width = request_width(features["input_mask"])
    return {name: value[..., :width] for name, value in features.items()}


def pad_positions(x, width, axis: int = 1):
    """``x`` zero-padded along ``axis`` (its positions) to ``width``: outputs of a trimmed
    request returned at the width the caller passed."""
    extra = width - tf.shape(x)[axis]
    paddings = [[0, 0]] * axis + [[0, extra]] + [[0, 0]] * (len(x.shape) - axis - 1)
    return tf.pad(x, paddings)


class ServingModule(tf.Module):
    """The exported object: the Keras model, the in-graph tokenizer and the signatures.

    Args:
      model: the family's built model with its weights (``BertClassifier``,
        ``BertSpanLabeler``, ``BertEncoder``, ...).
      config: a ``ServingConfig``.
      tokenizer: an already built ``BertInGraphTokenizer`` (optional).
    """

    def __init__(self, model, config: ServingConfig, tokenizer=None):
        super().__init__(name="bert_serving")
        from data_prep.tf_tokenization import BertInGraphTokenizer

        self.config = config
        self.model = model
        self.encoder = model if isinstance(model, BertEncoder) else model.encoder
        self.tokenizer = tokenizer or BertInGraphTokenizer(config.vocab_file,
                                                           config.do_lower_case)
        self.vocab_file = tf.saved_model.Asset(config.vocab_file)
        self._vocab_tokens = list(self.tokenizer.vocab_tokens)
        self.max_seq_length = tf.Variable(config.max_seq_length, trainable=False,
                                          name="max_seq_length")
        self.do_lower_case = tf.Variable(config.do_lower_case, trainable=False,
                                         name="do_lower_case")

    @property
    def vocab_tokens(self) -> list:
        """Token strings by id (index == id)."""
        return self._vocab_tokens

    def pack(self, text, text_pair=None):
        """Raw strings [batch] -> int32 model inputs [batch, seq], the classifier rules of
        the original (``[CLS] a [SEP] (b [SEP])``, pair trimming at ``max_seq_length``,
        zero padding), ``seq`` the request's width (``trim_to_request``)."""
        tok = self.tokenizer
        seq = self.config.max_seq_length
        ids_a = tok.tokenize(text)
        single = tok.pack_inputs(ids_a, None, max_seq_length=seq)
        if text_pair is None:
            return trim_to_request(single)
        ids_b = tok.tokenize(text_pair)
        pair = tok.pack_inputs(ids_a, ids_b, max_seq_length=seq)
        # As the original: a text_b that is empty (or tokenizes to nothing) means one segment.
        is_pair = tf.expand_dims(ids_b.row_lengths() > 0, 1)
        return trim_to_request({k: tf.where(is_pair, pair[k], single[k]) for k in single})

    def model_outputs(self, features):
        """The task model in inference mode on int32 features."""
        return self.model(features, training=False)

    def encode(self, features, layers: bool = True):
        """The encoder on int32 features -> float32 outputs (``encoder_outputs``: every
        layer, stacked batch-first, only if ``layers``)."""
        out = self.encoder(features, training=False)
        outputs = {"pooled_output": tf.cast(out["pooled_output"], tf.float32),
                   "sequence_output": tf.cast(out["sequence_output"], tf.float32)}
        if layers:
            outputs["encoder_outputs"] = tf.cast(tf.stack(out["encoder_outputs"], axis=1),
                                                 tf.float32)
        return outputs

    def encode_ids(self, features):
        """``encode`` on ids a caller packed: run on the request's width, the outputs
        returned at the caller's (zeros at positions cut as padding)."""
        width = tf.shape(features["input_ids"])[1]
        out = self.encode(trim_to_request(features))
        return {"pooled_output": out["pooled_output"],
                "sequence_output": pad_positions(out["sequence_output"], width),
                "encoder_outputs": pad_positions(out["encoder_outputs"], width, axis=2)}

    def signatures(self) -> dict:
        """Concrete functions by signature name: ``encode`` plus the family's."""
        encode = tf.function(lambda **f: self.encode_ids(f))
        sigs = {"encode": encode.get_concrete_function(**ids_specs())}
        sigs.update(get_family(self.config.model_type).signatures(self))
        return sigs


def text_function(module: ServingModule, fn, text_pair: bool):
    """The concrete function ``fn(module.pack(text[, text_pair]))`` on [batch] strings."""
    if text_pair:
        def serve(text, text_pair):
            return fn(module.pack(text, text_pair))

        strings = {"text": string_spec("text"), "text_pair": string_spec("text_pair")}
    else:
        def serve(text):
            return fn(module.pack(text))

        strings = {"text": string_spec("text")}
    return tf.function(serve).get_concrete_function(**strings)


def text_signatures(module: ServingModule, head, text_pair: bool) -> dict:
    """``serving_default`` and ``preprocess`` on ``text`` (+ ``text_pair`` for pairs):
    strings -> ``module.pack`` -> ``head(features)``."""
    return {"serving_default": text_function(module, head, text_pair),
            "preprocess": text_function(module, lambda features: features, text_pair)}


def token_windows(tokens, span, stride, max_windows: int, *, what: str, settings: str,
                  advice: str, fill_before: bool = False):
    """The original's doc-stride windows over each row of ``tokens``, built by index.

    A row of n tokens is covered by windows of at most ``span`` tokens, each starting
    ``stride`` tokens after the previous one, the last ending at the row's last token
    (the original ``run_squad.py``'s doc spans); an empty row gets one empty window. Each
    window's tokens are gathered from the row by index (never a copy of the row per
    window), so the cost is linear in the rows' lengths.

    Args:
      tokens: RaggedTensor [batch, (tokens)] (e.g. int64 WordPiece ids).
      span: int64 [batch] tokens of a full window (at least 1).
      stride: int64 [batch] tokens between window starts (1 <= stride <= span).
      max_windows: the most windows one row may need.
      what, settings, advice: the error message's subject ("a context"), the settings
        that fixed the windows ("doc_stride=128, max_seq_length=384") and what to do.
      fill_before: a window shorter than ``span`` (a row's last) also holds the tokens
        before it, up to ``span`` tokens in all, as context (as the tagger's Python
        path fills its windows); the window itself is unchanged.

    Returns:
      (window tokens RaggedTensor [windows, (tokens)], windows): a dict of int64
      [windows] tensors: example (row of ``tokens``), index (of the window within its
      row), doc_start (its first token, in the row), length (its tokens), before (tokens
      of context before doc_start in the window tokens: 0 unless ``fill_before``), and
      its row's stride, span, doc_length (tokens) and num_windows. Windows are in row
      order, then in index order.

    Raises (when run):
      InvalidArgumentError (its message holds ``TOO_MANY_WINDOWS``) if a row needs more
      than ``max_windows`` windows: bounded memory per request.
    """
    lengths = tokens.row_lengths()
    extra = tf.maximum(lengths - span, 0)
    num_windows = 1 + (extra + stride - 1) // stride
    check = tf.debugging.assert_less_equal(
        num_windows, tf.constant(max_windows, tf.int64),
        message=f"{what} {TOO_MANY_WINDOWS}={max_windows} ({settings}); {advice}")
    with tf.control_dependencies([check]):
        num_windows = tf.identity(num_windows)
    example = tf.repeat(tf.range(tf.shape(lengths, out_type=tf.int64)[0]), num_windows)
    index = tf.ragged.range(num_windows).flat_values
    doc_start = index * tf.gather(stride, example)
    length = tf.minimum(tf.gather(lengths, example) - doc_start, tf.gather(span, example))
    before = (tf.minimum(doc_start, tf.gather(span, example) - length) if fill_before
              else tf.zeros_like(length))
    first = tf.gather(tokens.row_splits[:-1], example) + doc_start - before
    window = tf.RaggedTensor.from_row_lengths(
        tf.gather(tokens.flat_values,
                  tf.ragged.range(first, first + before + length).flat_values),
        before + length)
    windows = {"example": example, "index": index, "doc_start": doc_start,
               "length": length, "before": before, "stride": tf.gather(stride, example),
               "span": tf.gather(span, example), "doc_length": tf.gather(lengths, example),
               "num_windows": tf.gather(num_windows, example)}
    return window, windows


def max_context(windows, pos):
    """[windows, seq] bool: the window is the one where the token at each position has
    the most context (the original ``run_squad.py``'s ``_check_is_max_context``: score
    min(left, right) + 0.01 * window length, the earliest window on ties).

    Without comparing every window with every other: all windows but the last are full
    (``span`` tokens) and start ``stride`` apart, so among them the score of a token at
    context position p is a tent in the window start that peaks at p - (span - 1) / 2;
    its maximum (and any tie) is at one of the two full windows whose starts are nearest
    that peak. Those two and the last window are the only candidates: [windows, seq, 3].

    Args:
      windows: the dict of ``token_windows`` plus ``context_start``: [windows] int64,
        where the window's first token sits in the model input (after [CLS] and, for
        SQuAD, the question).
      pos: int64 [1, seq] positions in the model input.
    """
    p = windows["doc_start"][:, None] + pos - windows["context_start"][:, None]  # [w, seq]
    stride, span = windows["stride"][:, None], windows["span"][:, None]
    doc_length = windows["doc_length"][:, None]
    last = windows["num_windows"][:, None] - 1
    last_full = tf.maximum(last - 1, 0)
    nearest = (2 * p - span + 1) // (2 * stride)  # floor((p - (span - 1) / 2) / stride)
    candidates = tf.stack([tf.clip_by_value(nearest, 0, last_full),
                           tf.clip_by_value(nearest + 1, 0, last_full),
                           tf.broadcast_to(last, tf.shape(p))], axis=-1)    # [w, seq, 3]
    s = candidates * stride[..., None]
    n = tf.minimum(span[..., None], doc_length[..., None] - s)
    q = p[..., None]
    contains = (q >= s) & (q < s + n)
    # The original's float arithmetic, so that ties break exactly as in Python.
    score = (tf.cast(tf.minimum(q - s, s + n - 1 - q), tf.float64)
             + 0.01 * tf.cast(n, tf.float64))
    score = tf.where(contains, score, tf.constant(-np.inf, tf.float64))
    is_best = contains & tf.equal(score, tf.reduce_max(score, axis=-1, keepdims=True))
    big = tf.reduce_max(candidates) + 1
    first = tf.reduce_min(tf.where(is_best, candidates, big), axis=-1)
    return tf.equal(first, windows["index"][:, None]) & tf.reduce_any(contains, axis=-1)


# --------------------------------------------------------------------------- families


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

    def claims_legacy_run(self, data: dict) -> bool:
        """Whether an ``export_metadata.json`` without ``model_type`` (written before it
        was recorded) is, by its task and keys, this family's runner's (``run_model_type``)."""
        return False

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


@dataclasses.dataclass(frozen=True)
class EncoderServingConfig(ServingConfig):
    """``--model_type=encoder``'s settings.

    Attributes:
      text_pair: inputs are pairs (``text`` + ``text_pair``).
    """

    text_pair: bool = False

    model_type: ClassVar[str] = "encoder"


class EncoderServing(ServingFamily):
    """``--model_type=encoder``: text (+ text_pair) -> the bare encoder's outputs."""

    model_type = "encoder"
    config_class = EncoderServingConfig
    weights_description = "an encoder"
    flags = (TEXT_PAIR_FLAG,)
    exports_any_run = True

    def settings(self, given, metadata, max_seq_length):
        return {"text_pair": text_pair_setting(given, metadata)}

    def build_model(self, config, bert_config, dtype_policy):
        return BertEncoder(bert_config, dtype=dtype_policy)

    def check_model(self, model, config):
        _expect_model(model, BertEncoder, config)

    def signatures(self, module):
        text_pair = module.config.text_pair
        sigs = text_signatures(module, lambda f: module.encode(f, layers=False), text_pair)
        # Every layer's output is large (MiniLM: ~38 MB for 32 rows of 128): on request.
        sigs["serving_all_layers"] = text_function(module, module.encode, text_pair)
        return sigs


FAMILY = register(EncoderServing())


def _expect_model(model, expected, config: ServingConfig) -> None:
    if not isinstance(model, expected):
        raise ExportError(f"model_type {config.model_type!r} needs a {expected.__name__}, got "
                          f"{type(model).__name__}")


def encoder_of(model):
    """The ``BertEncoder`` inside a task model (or the model itself)."""
    return model if isinstance(model, BertEncoder) else model.encoder


# --------------------------------------------------------------------------- export


def write_marker(directory: str, model_type: str, config: Optional[ServingConfig]) -> None:
    """``assets.extra/export_metadata.json``: the settings + ``model_type`` (our marker)."""
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
