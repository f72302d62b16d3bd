"""Owns the serving SavedModel: raw strings in, in-graph tokenization, task outputs out.

``export_saved_model(model, config, export_dir)`` writes a TensorFlow SavedModel that
``tf.saved_model.load`` serves in a process with only ``tensorflow`` and
``tensorflow_text`` (imported first, for its ops): no project code, no Keras classes.
Tokenization is ``data_prep.tf_tokenization.BertInGraphTokenizer`` baked into the graph
with the model's own vocab (also packaged as the asset ``assets/vocab.txt``) and casing.

Signatures (all batch-first; strings are UTF-8 ``tf.string`` of shape [batch]):

* ``serving_default``: the task on raw strings.
  - classifier: ``text`` (+ ``text_pair`` for pair tasks) -> ``probabilities`` float32
    [batch, num_labels], ``label`` string [batch], ``logits``; regression -> ``score``
    float32 [batch].
  - squad: ``question``, ``context`` -> per example: ``answer_text`` string [batch],
    ``score``, ``answer_start`` / ``answer_end`` (context WordPiece positions, -1 for an
    empty context), ``null_score``; per window (the original's doc_stride windows, leading
    dimension [windows]): ``window_example_index``, ``window_doc_start``,
    ``window_answer_text``, ``window_score``, ``window_answer_start`` /
    ``window_answer_end`` (positions in the window), ``window_null_score``,
    ``window_start_logits`` / ``window_end_logits`` [windows, seq].
  - encoder: ``text`` (+ ``text_pair``) -> ``pooled_output`` [batch, hidden],
    ``sequence_output`` [batch, seq, hidden], ``encoder_outputs`` [batch, layers, seq, hidden].
* ``preprocess``: the same string inputs -> int32 ``input_ids``, ``input_mask``,
  ``segment_ids`` [batch, seq].
* ``encode``: int32 ``input_ids``/``input_mask``/``segment_ids`` -> the encoder outputs
  above (the TF Hub BERT encoder interface).
* ``serving_tokenized`` (classifier, squad): the three int32 tensors -> the task's logits
  (and probabilities / score).

All float outputs are float32, whatever the compute dtype (a ``mixed_bfloat16`` model
computes in bfloat16 and casts its outputs).

``export_metadata.json`` is the small contract between the fine-tuning runner and the
exporter (labels, task settings); see ``ExportMetadata``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from modeling.encoder import BertEncoder

MODEL_TYPES = ("classifier", "squad", "encoder")
DTYPES = ("float32", "bfloat16")
METADATA_FILE = "export_metadata.json"


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
    """

    task: str = ""
    labels: tuple = ()
    is_regression: bool = False
    do_lower_case: bool = True
    max_seq_length: int = 128
    text_pair: bool = False

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
    if tf.io.gfile.isdir(path):
        path = os.path.join(path, METADATA_FILE)
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(metadata.to_json())


def read_export_metadata(path: str) -> ExportMetadata:
    """Reads ``export_metadata.json`` (a file, or a directory holding it)."""
    if tf.io.gfile.isdir(path):
        path = os.path.join(path, METADATA_FILE)
    with tf.io.gfile.GFile(path, "r") as f:
        try:
            data = json.loads(f.read())
        except json.JSONDecodeError as err:
            raise ExportError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ExportError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return ExportMetadata.from_dict(data, source=path)


@dataclasses.dataclass(frozen=True)
class ServingConfig:
    """How the serving graph tokenizes and what it returns.

    Attributes:
      model_type: "classifier", "squad" or "encoder".
      vocab_file: the model's vocab.txt (baked into the graph and copied as an asset).
      do_lower_case: tokenizer casing.
      max_seq_length: padded length of every window, special tokens included.
      labels: classifier label names in id order (classification only).
      is_regression: classifier with one float output.
      text_pair: classifier/encoder inputs are pairs (``text`` + ``text_pair``).
      max_query_length: squad: question tokens kept.
      max_answer_length: squad: longest answer span in tokens.
      doc_stride: squad: tokens between the starts of consecutive context windows.
      n_best_size: squad: a span's start and end must be among the window's n_best_size
        highest start / end logits (the original's candidate filter).
      task: informational, written to assets.extra/export_metadata.json.
    """

    model_type: str
    vocab_file: str
    do_lower_case: bool = True
    max_seq_length: int = 128
    labels: tuple = ()
    is_regression: bool = False
    text_pair: bool = False
    max_query_length: int = 64
    max_answer_length: int = 30
    doc_stride: int = 128
    n_best_size: int = 20
    task: str = ""

    def __post_init__(self):
        if self.model_type not in MODEL_TYPES:
            raise ExportError(f"model_type {self.model_type!r} is not one of {MODEL_TYPES}")
        if self.model_type == "classifier" and not self.is_regression and len(self.labels) < 1:
            raise ExportError("a classifier export needs its label names (or is_regression)")
        if self.model_type == "squad" and self.max_seq_length < self.max_query_length + 4:
            raise ExportError(f"max_seq_length={self.max_seq_length} leaves no room for the "
                              f"context after max_query_length={self.max_query_length}")
        if self.doc_stride < 1 or self.n_best_size < 1 or self.max_answer_length < 1:
            raise ExportError(f"doc_stride={self.doc_stride}, n_best_size={self.n_best_size} "
                              f"and max_answer_length={self.max_answer_length} must be positive")
        if self.max_seq_length < 3:
            raise ExportError(f"max_seq_length={self.max_seq_length} cannot hold [CLS] [SEP]")


# --------------------------------------------------------------------------- reference path


def python_features(tokenizer, texts: Sequence[str], text_pairs: Optional[Sequence[str]],
                    max_seq_length: int) -> dict:
    """The Python path's model inputs (FullTokenizer + the original classifier rules).

    Args:
      tokenizer: a ``data_prep.tokenization.FullTokenizer``.
      texts, text_pairs: strings (text_pairs None for single-text).
    Returns:
      dict of int32 numpy arrays [batch, max_seq_length]: input_ids, input_mask, segment_ids.
    """
    from tasks.classification.data import InputExample, convert_single_example

    rows = []
    for i, text in enumerate(texts):
        example = InputExample(str(i), text, None if text_pairs is None else text_pairs[i],
                               label=0.0)
        rows.append(convert_single_example(example, None, max_seq_length, tokenizer,
                                           is_regression=True))
    return {name: np.asarray([getattr(r, name) for r in rows], np.int32).reshape(
        len(rows), max_seq_length) for name in ("input_ids", "input_mask", "segment_ids")}


# --------------------------------------------------------------------------- graph pieces


def _string_spec(name):
    return tf.TensorSpec([None], tf.string, name=name)


def _ids_specs():
    return {k: tf.TensorSpec([None, None], tf.int32, name=k)
            for k in ("input_ids", "input_mask", "segment_ids")}


def _in_top_k(logits, k):
    """[batch, seq] bool: among the k highest of each row (ties: the lower index, like the
    original's stable sort)."""
    top = tf.math.top_k(logits, k=k).indices
    hit = tf.equal(tf.range(tf.shape(logits)[1])[None, :, None], top[:, None, :])
    return tf.reduce_any(hit, axis=-1)


def _max_context(windows, pos):
    """[windows, seq] bool: the window is the one where the token at each position has
    the most context (``tasks.squad.data.max_context_span_index``: score min(left, right)
    + 0.01 * window length, the earliest window on ties)."""
    lengths = tf.RaggedTensor.from_row_lengths(windows["context_length"],
                                               windows["num_windows"])
    starts = tf.RaggedTensor.from_row_lengths(windows["doc_start"], windows["num_windows"])
    example = windows["example"]
    s = tf.gather(starts.to_tensor(default_value=-1), example)[:, None, :]   # [w, 1, k]
    n = tf.gather(lengths.to_tensor(default_value=0), example)[:, None, :]
    doc_pos = windows["doc_start"][:, None] + pos - windows["context_start"][:, None]
    p = doc_pos[:, :, None]                                                  # [w, seq, 1]
    contains = (p >= s) & (p < s + n)
    score = (tf.cast(tf.minimum(p - s, s + n - 1 - p), tf.float64)
             + 0.01 * tf.cast(n, tf.float64))
    score = tf.where(contains, score, tf.constant(-np.inf, tf.float64))
    k = tf.shape(score, out_type=tf.int64)[2]
    is_best = contains & tf.equal(score, tf.reduce_max(score, axis=-1, keepdims=True))
    first = tf.reduce_min(tf.where(is_best, tf.range(k)[None, None, :], k), axis=-1)
    return tf.equal(first, windows["index"][:, None])


class ServingModule(tf.Module):
    """The exported object: the Keras model, the in-graph tokenizer and the signatures.

    Args:
      model: a built ``BertClassifier``, ``BertSpanLabeler`` or ``BertEncoder``.
      config: a ``ServingConfig``.
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

    # -- preprocessing ------------------------------------------------------------------

    def _pack(self, text, text_pair=None):
        """Raw strings -> int32 model inputs, the classifier rules of the original."""
        tok = self.tokenizer
        seq = self.config.max_seq_length
        ids_a = tok.tokenize(text)
        single = tok.pack_inputs(ids_a, None, max_seq_length=seq)
        if text_pair is None:
            return single
        ids_b = tok.tokenize(text_pair)
        pair = tok.pack_inputs(ids_a, ids_b, max_seq_length=seq)
        # As the original: a text_b that is empty (or tokenizes to nothing) means one segment.
        is_pair = tf.expand_dims(ids_b.row_lengths() > 0, 1)
        return {k: tf.where(is_pair, pair[k], single[k]) for k in single}

    def _pack_squad(self, question, context):
        """The original's SQuAD windows: [CLS] question [SEP] context window [SEP].

        The question is cut to max_query_length tokens; the context is covered by windows
        of max_seq_length - 3 - len(question) tokens, each starting doc_stride tokens after
        the previous one, the last ending at the context's last token (``doc_spans_for``).
        An empty context gives one window with no context tokens.

        Returns:
          (features, windows): features are int32 [windows, seq]; windows is a dict of
          [windows] int tensors: example (row of the input batch), doc_start (first
          context token of the window, in context sub-tokens), context_start (its position
          in the window) and context_length.
        """
        c = self.config
        tok = self.tokenizer
        q = tok.tokenize(question)[:, :c.max_query_length]
        ctx = tok.tokenize(context)
        len_q, len_c = q.row_lengths(), ctx.row_lengths()
        span = c.max_seq_length - 3 - len_q                       # context tokens per window
        stride = tf.minimum(tf.cast(c.doc_stride, tf.int64), span)
        extra = tf.maximum(len_c - span, 0)
        num_windows = 1 + (extra + stride - 1) // stride
        example = tf.repeat(tf.range(tf.shape(len_q, out_type=tf.int64)[0]), num_windows)
        index = tf.ragged.range(num_windows).flat_values
        doc_start = index * tf.gather(stride, example)
        length = tf.minimum(tf.gather(len_c, example) - doc_start, tf.gather(span, example))
        rows = tf.gather(ctx, example)
        pos = tf.ragged.range(rows.row_lengths())
        keep = (pos >= doc_start[:, None]) & (pos < (doc_start + length)[:, None])
        window = tf.ragged.boolean_mask(rows, keep)
        ids, segments = tf_text.combine_segments(
            [tf.gather(q, example), window], start_of_sequence_id=tok.cls_id,
            end_of_segment_id=tok.sep_id)
        input_ids, input_mask = tf_text.pad_model_inputs(ids, c.max_seq_length)
        segment_ids, _ = tf_text.pad_model_inputs(segments, c.max_seq_length)
        features = {"input_ids": tf.cast(input_ids, tf.int32),
                    "input_mask": tf.cast(input_mask, tf.int32),
                    "segment_ids": tf.cast(segment_ids, tf.int32)}
        windows = {"example": example, "doc_start": doc_start, "index": index,
                   "num_windows": num_windows,
                   "context_start": tf.gather(len_q, example) + 2, "context_length": length}
        return features, windows

    def _squad(self, question, context):
        """Best span per window, then per example (the window with the best score)."""
        features, windows = self._pack_squad(question, context)
        best = self._best_span(features, windows)
        batch = tf.shape(question)[0]
        example = windows["example"]
        # -inf (no context) as float32's lowest: unsorted_segment_max starts from it.
        score = tf.maximum(best["score"], tf.float32.min)
        top = tf.math.unsorted_segment_max(score, example, batch)
        # The first window of each example reaching its best score.
        is_top = tf.equal(score, tf.gather(top, example))
        n = tf.shape(example, out_type=tf.int64)[0]
        first = tf.math.unsorted_segment_min(
            tf.where(is_top, tf.range(n), n), example, batch)
        doc_start = tf.cast(tf.gather(windows["doc_start"], first), tf.int32)
        shift = doc_start - tf.cast(tf.gather(windows["context_start"], first), tf.int32)
        found = tf.gather(best["answer_start"], first) >= 0
        out = {
            "answer_text": tf.gather(best["answer_text"], first),
            "score": tf.gather(best["score"], first),
            "answer_start": tf.where(found, tf.gather(best["answer_start"], first) + shift, -1),
            "answer_end": tf.where(found, tf.gather(best["answer_end"], first) + shift, -1),
            "null_score": tf.math.unsorted_segment_min(best["null_score"], example, batch),
            "window_example_index": tf.cast(example, tf.int32),
            "window_doc_start": tf.cast(windows["doc_start"], tf.int32),
        }
        for key in ("answer_text", "score", "answer_start", "answer_end", "null_score",
                    "start_logits", "end_logits"):
            out[f"window_{key}"] = best[key]
        return out

    # -- heads ----------------------------------------------------------------------------

    def _encode(self, features):
        out = self.encoder(features, training=False)
        return {"pooled_output": tf.cast(out["pooled_output"], tf.float32),
                "sequence_output": tf.cast(out["sequence_output"], tf.float32),
                "encoder_outputs": tf.cast(tf.stack(out["encoder_outputs"], axis=1),
                                           tf.float32)}

    def _classify(self, features):
        logits = tf.cast(self.model(features, training=False)["logits"], tf.float32)
        if self.config.is_regression:
            return {"score": logits[:, 0], "logits": logits}
        probabilities = tf.nn.softmax(logits, axis=-1)
        labels = tf.constant(list(self.config.labels), tf.string)
        return {"probabilities": probabilities, "logits": logits,
                "label": tf.gather(labels, tf.argmax(probabilities, axis=-1))}

    def _span_logits(self, features):
        out = self.model(features, training=False)
        return {"start_logits": tf.cast(out["start_logits"], tf.float32),
                "end_logits": tf.cast(out["end_logits"], tf.float32)}

    def _best_span(self, features, windows):
        """The original's best prediction per window: (start, end) among the window's
        n_best_size highest start and end logits, both on context tokens, the start in
        its max-context window, end >= start, at most max_answer_length tokens; scored
        start_logit + end_logit."""
        out = self._span_logits(features)
        start, end = out["start_logits"], out["end_logits"]
        seq = tf.shape(start)[1]
        pos = tf.range(seq, dtype=tf.int64)[tf.newaxis, :]
        first, count = windows["context_start"], windows["context_length"]
        in_context = (pos >= first[:, None]) & (pos < (first + count)[:, None])
        top = tf.minimum(self.config.n_best_size, seq)
        ok_start = in_context & _in_top_k(start, top) & _max_context(windows, pos)
        ok_end = in_context & _in_top_k(end, top)
        length = pos[:, tf.newaxis, :] - pos[:, :, tf.newaxis]  # [1, start, end]: end - start
        valid = (ok_start[:, :, None] & ok_end[:, None, :] & (length >= 0)
                 & (length < self.config.max_answer_length))
        scores = start[:, :, None] + end[:, None, :]
        neg = tf.fill(tf.shape(scores), tf.constant(-np.inf, tf.float32))
        flat = tf.reshape(tf.where(valid, scores, neg), [tf.shape(start)[0], -1])
        best = tf.argmax(flat, axis=-1, output_type=tf.int32)
        has_answer = tf.reduce_any(valid, axis=[1, 2])
        best_start = tf.where(has_answer, best // seq, -1)
        best_end = tf.where(has_answer, best % seq, -1)
        score = tf.where(has_answer, tf.reduce_max(flat, axis=-1), -np.inf)
        out.update(answer_start=best_start, answer_end=best_end, score=score,
                   null_score=start[:, 0] + end[:, 0],
                   answer_text=self._span_text(features["input_ids"], best_start, best_end))
        return out

    def _span_text(self, input_ids, first, last):
        """WordPieces first..last joined as the original's tok_text (" ##" and "##" removed)."""
        pos = tf.range(tf.shape(input_ids)[1])[tf.newaxis, :]
        keep = (pos >= first[:, None]) & (pos <= last[:, None])
        vocab = tf.constant(self._vocab_tokens, tf.string)
        tokens = tf.ragged.boolean_mask(tf.gather(vocab, input_ids), keep)
        text = tf.strings.reduce_join(tokens, axis=-1, separator=" ")
        text = tf.strings.regex_replace(text, " ##", "")
        text = tf.strings.regex_replace(text, "##", "")
        return tf.strings.strip(tf.strings.regex_replace(text, " +", " "))

    # -- signatures ------------------------------------------------------------------------

    def signatures(self) -> dict:
        """Concrete functions by signature name (see the module docstring)."""
        c = self.config
        encode = tf.function(lambda **f: self._encode(f), input_signature=None)
        sigs = {"encode": encode.get_concrete_function(**_ids_specs())}
        if c.model_type == "squad":
            def serve(question, context):
                return self._squad(question, context)

            def preprocess(question, context):
                features, windows = self._pack_squad(question, context)
                return {**features,
                        "window_example_index": tf.cast(windows["example"], tf.int32),
                        "window_doc_start": tf.cast(windows["doc_start"], tf.int32)}

            strings = {"question": _string_spec("question"), "context": _string_spec("context")}
            sigs["serving_tokenized"] = tf.function(
                lambda **f: self._span_logits(f)).get_concrete_function(**_ids_specs())
        else:
            head = self._classify if c.model_type == "classifier" else self._encode

            if c.text_pair:
                def serve(text, text_pair):
                    return head(self._pack(text, text_pair))

                def preprocess(text, text_pair):
                    return self._pack(text, text_pair)

                strings = {"text": _string_spec("text"), "text_pair": _string_spec("text_pair")}
            else:
                def serve(text):
                    return head(self._pack(text))

                def preprocess(text):
                    return self._pack(text)

                strings = {"text": _string_spec("text")}
            if c.model_type == "classifier":
                sigs["serving_tokenized"] = tf.function(
                    lambda **f: self._classify(f)).get_concrete_function(**_ids_specs())
        sigs["serving_default"] = tf.function(serve).get_concrete_function(**strings)
        sigs["preprocess"] = tf.function(preprocess).get_concrete_function(**strings)
        return sigs


# --------------------------------------------------------------------------- export


def export_saved_model(model, config: ServingConfig, export_dir: str, *,
                       overwrite: bool = False, tokenizer=None) -> str:
    """Writes the serving SavedModel of ``model`` to ``export_dir``, atomically.

    The SavedModel is written to a temporary sibling directory and renamed into place, so
    ``export_dir`` is either absent, the previous export, or complete. With
    ``overwrite=False`` an existing non-empty ``export_dir`` is an error.

    Args:
      model: a ``BertClassifier`` / ``BertSpanLabeler`` / ``BertEncoder`` with its weights.
      config: the ``ServingConfig``.
      export_dir: destination directory.
      tokenizer: an already built ``BertInGraphTokenizer`` (optional, saves ~2 s).

    Returns:
      ``export_dir``.
    """
    _check_model(model, config)
    export_dir = os.path.abspath(export_dir) if "://" not in export_dir else export_dir
    if tf.io.gfile.exists(export_dir) and tf.io.gfile.listdir(export_dir) and not overwrite:
        raise ExportError(f"{export_dir} exists and is not empty (pass overwrite=True / "
                          "--overwrite to replace it)")
    parent = os.path.dirname(export_dir.rstrip("/"))
    tf.io.gfile.makedirs(parent)
    name = os.path.basename(export_dir.rstrip("/"))
    tmp = os.path.join(parent, f".{name}.tmp-{uuid.uuid4().hex}")
    module = ServingModule(model, config, tokenizer=tokenizer)
    try:
        tf.saved_model.save(module, tmp, signatures=module.signatures())
        extra = os.path.join(tmp, "assets.extra")
        tf.io.gfile.makedirs(extra)
        meta = ExportMetadata(task=config.task, labels=tuple(config.labels),
                              is_regression=config.is_regression,
                              do_lower_case=config.do_lower_case,
                              max_seq_length=config.max_seq_length, text_pair=config.text_pair)
        with tf.io.gfile.GFile(os.path.join(extra, METADATA_FILE), "w") as f:
            data = json.loads(meta.to_json())
            data["model_type"] = config.model_type
            f.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        _replace_dir(tmp, export_dir)
    except BaseException:
        if tf.io.gfile.exists(tmp):
            tf.io.gfile.rmtree(tmp)
        raise
    return export_dir


def _replace_dir(src: str, dst: str) -> None:
    """Renames ``src`` to ``dst``; an existing ``dst`` is moved aside first, then deleted."""
    if not tf.io.gfile.exists(dst):
        tf.io.gfile.rename(src, dst)
        return
    old = f"{dst.rstrip('/')}.old-{uuid.uuid4().hex}"
    tf.io.gfile.rename(dst, old)
    tf.io.gfile.rename(src, dst)
    if "://" in old:
        tf.io.gfile.rmtree(old)
    else:
        shutil.rmtree(old, ignore_errors=True)


def _check_model(model, config: ServingConfig) -> None:
    from modeling.models import BertClassifier, BertSpanLabeler

    expected = {"classifier": BertClassifier, "squad": BertSpanLabeler,
                "encoder": BertEncoder}[config.model_type]
    if not isinstance(model, expected):
        raise ExportError(f"model_type {config.model_type!r} needs a {expected.__name__}, got "
                          f"{type(model).__name__}")
    if config.model_type == "classifier":
        want = 1 if config.is_regression else len(config.labels)
        if model.num_labels != want:
            raise ExportError(
                f"the classifier has {model.num_labels} outputs but "
                + ("regression needs 1" if config.is_regression
                   else f"{len(config.labels)} labels were given: {list(config.labels)}"))
    max_pos = (model if isinstance(model, BertEncoder) else model.encoder).config
    if config.max_seq_length > max_pos.max_position_embeddings:
        raise ExportError(f"max_seq_length={config.max_seq_length} exceeds the model's "
                          f"max_position_embeddings={max_pos.max_position_embeddings}")
