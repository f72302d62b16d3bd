"""Owns the in-graph pieces families build signatures on: input specs, request-width trimming, ``ServingModule``, doc-stride windows.

No request is padded to ``max_seq_length``: packing truncates and windows at
``max_seq_length`` as the original, then ``trim_to_request`` cuts the padding beyond the
request's longest row (rounded up to ``WIDTH_MULTIPLE``), so ``seq`` in the signatures is
the request's width and the outputs equal the padded graph's. On ids a caller packed
(``encode``, ``serving_tokenized``) the model runs on that width and the outputs return at
the caller's (``pad_positions``: zeros where only padding was cut).
"""

from __future__ import annotations

import types

import numpy as np
import tensorflow as tf

from modeling.encoder import BertEncoder
from modeling.export import registry

# The message of the InvalidArgumentError for an input needing too many windows (kept for
# tests and docs).
TOO_MANY_WINDOWS = "needs more context windows than max_context_windows"


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


def encoder_of(model):
    """The ``BertEncoder`` inside a task model (or the model itself)."""
    return model if isinstance(model, BertEncoder) else model.encoder


class ServingModule(tf.Module):
    """The exported object: the Keras model, the in-graph tokenizer and the signatures.

    Args:
      model: the family's built model with its weights (``BertClassifier``,
        ``BertSpanLabeler``, ``BertEncoder``, ...).
      config: a ``families.ServingConfig``.
      tokenizer: an already built ``BertInGraphTokenizer`` (optional).
    """

    def __init__(self, model, config, tokenizer=None):
        super().__init__(name="bert_serving")
        from data_prep.tf_tokenization import BertInGraphTokenizer

        self.config = config
        self.model = model
        self.encoder = encoder_of(model)
        self.tokenizer = tokenizer or BertInGraphTokenizer(config.vocab_file,
                                                           config.do_lower_case)
        self.vocab_file = tf.saved_model.Asset(config.vocab_file)
        self._vocab_tokens = list(self.tokenizer.vocab_tokens)
        self.max_seq_length = tf.Variable(config.max_seq_length, trainable=False,
                                          name="max_seq_length")
        self.do_lower_case = tf.Variable(config.do_lower_case, trainable=False,
                                         name="do_lower_case")
        # The packing, the task model and the encoder, each traced once per export and
        # called by every signature that runs it (a plain holder: not saved as
        # attributes of the SavedModel).
        self._shared = types.SimpleNamespace(
            pack=tf.function(self._pack, reduce_retracing=True, autograph=False),
            model=tf.function(lambda features: self.model(features, training=False),
                              reduce_retracing=True, autograph=False),
            encoder=tf.function(lambda features: self.encoder(features, training=False),
                                reduce_retracing=True, autograph=False))

    @property
    def vocab_tokens(self) -> list:
        """Token strings by id (index == id)."""
        return self._vocab_tokens

    def pack(self, text, text_pair=None):
        """Raw strings [batch] -> int32 model inputs [batch, seq], the classifier rules of
        the original (``[CLS] a [SEP] (b [SEP])``, pair trimming at ``max_seq_length``,
        zero padding), ``seq`` the request's width (``trim_to_request``)."""
        return self._shared.pack(text, text_pair)

    def _pack(self, text, text_pair):
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
        """The task model in inference mode on int32 features (one trace per export)."""
        return self._shared.model(features)

    def encode(self, features, layers: bool = True):
        """The encoder on int32 features -> float32 outputs (``encoder_outputs``: every
        layer, stacked batch-first, only if ``layers``)."""
        out = self._shared.encoder(features)
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
        encode = tf.function(lambda **f: self.encode_ids(f), autograph=False)
        sigs = {"encode": encode.get_concrete_function(**ids_specs())}
        sigs.update(registry.get_family(self.config.model_type).signatures(self))
        return sigs


def text_function(module: ServingModule, fn, text_pair: bool, pack=None):
    """The concrete function ``fn(pack(text[, text_pair]))`` on [batch] strings (``pack``
    by default ``module.pack``)."""
    pack = pack or module.pack
    if text_pair:
        def serve(text, text_pair):
            return fn(pack(text, text_pair))

        strings = {"text": string_spec("text"), "text_pair": string_spec("text_pair")}
    else:
        def serve(text):
            return fn(pack(text))

        strings = {"text": string_spec("text")}
    return tf.function(serve, autograph=False).get_concrete_function(**strings)


def text_signatures(module: ServingModule, head, text_pair: bool, pack=None) -> dict:
    """``serving_default`` and ``preprocess`` on ``text`` (+ ``text_pair`` for pairs):
    strings -> ``pack`` (default ``module.pack``; traced once for both) -> ``head(features)``."""
    pack = tf.function(pack, reduce_retracing=True, autograph=False) if pack else module.pack
    return {"serving_default": text_function(module, head, text_pair, pack),
            "preprocess": text_function(module, lambda features: features, text_pair, pack)}


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
    # validate=False: the lengths are those of the ranges gathered (no assertion ops).
    window = tf.RaggedTensor.from_row_lengths(
        tf.gather(tokens.flat_values,
                  tf.ragged.range(first, first + before + length).flat_values),
        before + length, validate=False)
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
