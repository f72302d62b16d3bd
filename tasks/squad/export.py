"""Owns the SQuAD serving signatures: question + context -> the original's best answer span, with a bounded, linear cost per request (registers at import).

The ``squad`` family of ``modeling.export`` (see its docstring for the registry and the
signatures every family shares). Signatures:

* ``serving_default``: ``question``, ``context`` [batch] -> per example: ``answer_text``
  string [batch], ``score``, ``answer_start`` / ``answer_end`` (context WordPiece
  positions, -1 when no span is valid), ``null_score``; per window (the original's
  doc_stride windows, leading dimension [windows]): ``window_example_index``,
  ``window_doc_start``, ``window_answer_text``, ``window_score``,
  ``window_answer_start`` / ``window_answer_end`` (positions in the window),
  ``window_null_score``, ``window_start_logits`` / ``window_end_logits`` [windows, seq];
* ``preprocess``: the same inputs -> int32 ``input_ids``, ``input_mask``, ``segment_ids``
  [windows, seq] + ``window_example_index``, ``window_doc_start`` [windows];
* ``serving_tokenized``: the three int32 tensors -> ``start_logits``, ``end_logits``.

Cost of a request: every intermediate is at most [windows, seq, k] with k one of 3 (the
max-context candidates), ``max_answer_length`` or the model's own sizes, and the context is
tokenized once (windows index into it, never copy it): memory and time grow linearly with
the context's length. An example whose context needs more than
``SquadServingConfig.max_context_windows`` windows is refused with InvalidArgumentError.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import tensorflow as tf

from data_prep.tf_tokenization import pack_segments
from modeling.export import families, registry, serving
from modeling.export.metadata import ExportError
from modeling.export.serving import max_context
from tasks.squad.task import MODEL_TYPE, SquadExportMetadata


@dataclasses.dataclass(frozen=True)
class SquadServingConfig(families.ServingConfig):
    """``--model_type=squad``'s settings (``run_squad.py``'s flags of the same names).

    Attributes:
      max_query_length: question tokens kept.
      max_answer_length: longest answer span in tokens.
      doc_stride: tokens between the starts of consecutive context windows.
      n_best_size: a span's start and end must be among the window's n_best_size
        highest start / end logits (the original's candidate filter).
      max_context_windows: most windows one example's context may need; a longer context
        is refused by the graph with an error instead of unbounded memory.
      bilstm_units: the model's BiLSTM between encoder and span layer (run_squad.py
        --bilstm_units; 0: none).
    """

    max_query_length: int = 64
    max_answer_length: int = 30
    doc_stride: int = 128
    n_best_size: int = 20
    max_context_windows: int = 64
    bilstm_units: int = 0

    model_type: ClassVar[str] = MODEL_TYPE
    omitted_at_default: ClassVar[dict] = {"bilstm_units": 0}


class SquadServing(families.ServingFamily):
    """``--model_type=squad``: a fine-tuned ``BertSpanLabeler``."""

    model_type = MODEL_TYPE
    config_class = SquadServingConfig
    weights_description = "a fine-tuned SQuAD model (run_squad.py output)"
    flags = (
        families.FamilyFlag("max_query_length", "integer", 64, "question tokens kept; "
                            "default: the run's metadata, else 64."),
        families.FamilyFlag("max_answer_length", "integer", 30, "longest answer in tokens; "
                            "default: the run's metadata, else 30."),
        families.FamilyFlag("n_best_size", "integer", 20, "candidate starts / ends per "
                            "window (the original's filter before picking the best span); "
                            "default: the run's metadata, else 20."),
        families.FamilyFlag("doc_stride", "integer", 128, "tokens between the starts of "
                            "consecutive windows of a long context; default: the run's "
                            "metadata, else 128."),
        families.FamilyFlag("max_context_windows", "integer", 64, "most windows one "
                            "context may need; a longer one is refused with an error "
                            "(bounded memory per request)."),
        families.FamilyFlag("bilstm_units", "integer", 0, "the run's --bilstm_units (a "
                            "BiLSTM under the span layer; 0: none); default: the run's "
                            "metadata."),
    )
    default_max_seq_length = 384
    # The run's settings that the export takes (explicit flags override them).
    RUN_SETTINGS = ("max_query_length", "doc_stride", "max_answer_length", "n_best_size",
                    "bilstm_units")

    metadata_class = SquadExportMetadata

    def config_fields(self, metadata):
        # 0: metadata written before the run recorded the setting.
        return {name: getattr(metadata, name) for name in self.RUN_SETTINGS
                if getattr(metadata, name, 0) > 0}

    def validate(self, config):
        if config.max_seq_length < config.max_query_length + 4:
            raise ExportError(
                f"max_seq_length={config.max_seq_length} leaves no room for the context "
                f"after max_query_length={config.max_query_length}")
        if config.bilstm_units < 0:
            raise ExportError(f"bilstm_units={config.bilstm_units} must not be "
                              "negative (0: no BiLSTM)")
        if min(config.doc_stride, config.n_best_size, config.max_answer_length,
               config.max_context_windows) < 1:
            raise ExportError(
                f"doc_stride={config.doc_stride}, n_best_size={config.n_best_size}, "
                f"max_answer_length={config.max_answer_length} and max_context_windows="
                f"{config.max_context_windows} must be positive")

    def build_model(self, config, bert_config, dtype_policy):
        from modeling.models import BertSpanLabeler

        return BertSpanLabeler(bert_config, bilstm_units=config.bilstm_units,
                               dtype=dtype_policy)

    def check_model(self, model, config):
        from modeling.models import BertSpanLabeler

        families.expect_model(model, BertSpanLabeler, config)
        if model.bilstm_units != config.bilstm_units:
            raise ExportError(
                f"the SQuAD model has bilstm_units={model.bilstm_units}; the settings say "
                f"{config.bilstm_units}")

    def signatures(self, module):
        def serve(question, context):
            return _squad(module, question, context)

        def preprocess(question, context):
            features, windows = pack_squad(module, question, context)
            return {**features,
                    "window_example_index": tf.cast(windows["example"], tf.int32),
                    "window_doc_start": tf.cast(windows["doc_start"], tf.int32)}

        strings = {"question": serving.string_spec("question"),
                   "context": serving.string_spec("context")}
        return {
            "serving_default": tf.function(serve, autograph=False).get_concrete_function(**strings),
            "preprocess": tf.function(preprocess, autograph=False).get_concrete_function(**strings),
            "serving_tokenized": tf.function(
                lambda **f: _span_logits_ids(module, f),
                autograph=False).get_concrete_function(
                    **serving.ids_specs()),
        }


FAMILY = registry.register(SquadServing())


def pack_squad(module, question, context):
    """The original's SQuAD windows: [CLS] question [SEP] context window [SEP].

    The question is cut to max_query_length tokens; the context is covered by windows
    of max_seq_length - 3 - len(question) tokens, each starting doc_stride tokens after
    the previous one, the last ending at the context's last token
    (``tasks.squad.data.doc_spans_for``). An empty context gives one window with no
    context tokens. Each window's tokens are gathered from the one tokenized context by
    index, so the cost is linear in the context's length.

    Args:
      module: the ``ServingModule``.
      question, context: [batch] strings.

    Returns:
      (features, windows): features are int32 [windows, seq], seq the longest window's
      length (``serving.trim_to_request``); windows is a dict of
      [windows] int64 tensors: example (row of the input batch), index (of the window
      within its example), doc_start (first context token of the window, in context
      sub-tokens), context_start (its position in the window), context_length, and the
      example's stride, span (tokens of a full window), doc_length (context sub-tokens)
      and num_windows.

    Raises (when run):
      InvalidArgumentError if an example needs more than max_context_windows windows.
    """
    c = module.config
    tok = module.tokenizer
    q = tok.tokenize(question)[:, :c.max_query_length]
    ctx = tok.tokenize(context)
    len_q = q.row_lengths()
    span = c.max_seq_length - 3 - len_q                       # context tokens per window
    stride = tf.minimum(tf.cast(c.doc_stride, tf.int64), span)
    window, windows = serving.token_windows(
        ctx, span, stride, c.max_context_windows, what="a context",
        settings=f"doc_stride={c.doc_stride}, max_seq_length={c.max_seq_length}",
        advice="split the context or export with a larger --max_context_windows")
    example = windows["example"]
    input_ids, input_mask, segment_ids = pack_segments(
        [tf.gather(q, example), window], tok.cls_id, tok.sep_id, c.max_seq_length)
    # The request's longest window, not max_seq_length: the windows themselves are the
    # original's (max_seq_length sets their span), only their padding is cut.
    features = serving.trim_to_request({"input_ids": tf.cast(input_ids, tf.int32),
                                        "input_mask": tf.cast(input_mask, tf.int32),
                                        "segment_ids": tf.cast(segment_ids, tf.int32)})
    windows.update(context_start=tf.gather(len_q, example) + 2,
                   context_length=windows["length"])
    return features, windows



def _in_top_k(logits, k):
    """[batch, seq] bool: among the k highest of each row (ties: the lower index, like the
    original's stable sort)."""
    top = tf.math.top_k(logits, k=k).indices
    hit = tf.equal(tf.range(tf.shape(logits)[1])[None, :, None], top[:, None, :])
    return tf.reduce_any(hit, axis=-1)


def _span_logits(module, features):
    out = module.model_outputs(features)
    return {"start_logits": tf.cast(out["start_logits"], tf.float32),
            "end_logits": tf.cast(out["end_logits"], tf.float32)}


def _span_logits_ids(module, features):
    """``serving_tokenized``: the logits on the request's width, returned at the width
    the caller passed (0 at the positions cut as padding)."""
    width = tf.shape(features["input_ids"])[1]
    out = _span_logits(module, serving.trim_to_request(features))
    return {name: serving.pad_positions(value, width) for name, value in out.items()}


def best_span(module, features, windows):
    """The original's best prediction per window: (start, end) among the window's
    n_best_size highest start and end logits, both on context tokens, the start in
    its max-context window, end >= start, at most max_answer_length tokens; scored
    start_logit + end_logit. Candidates are laid out [windows, start, end - start], only
    the max_answer_length ends that can be valid for each start."""
    c = module.config
    out = _span_logits(module, features)
    start, end = out["start_logits"], out["end_logits"]
    seq = tf.shape(start)[1]
    pos = tf.range(seq, dtype=tf.int64)[tf.newaxis, :]
    first, count = windows["context_start"], windows["context_length"]
    in_context = (pos >= first[:, None]) & (pos < (first + count)[:, None])
    top = tf.minimum(c.n_best_size, seq)
    ok_start = in_context & _in_top_k(start, top) & max_context(windows, pos)
    ok_end = in_context & _in_top_k(end, top)
    offsets = min(c.max_answer_length, c.max_seq_length)
    end_pos = tf.range(seq)[:, None] + tf.range(offsets)[None, :]      # [start, offset]
    inside = end_pos < seq
    end_pos = tf.minimum(end_pos, seq - 1)
    valid = (ok_start[:, :, None] & tf.gather(ok_end, end_pos, axis=1)
             & inside[None, :, :])
    scores = start[:, :, None] + tf.gather(end, end_pos, axis=1)
    neg = tf.fill(tf.shape(scores), tf.constant(-np.inf, tf.float32))
    flat = tf.reshape(tf.where(valid, scores, neg), [tf.shape(start)[0], -1])
    # Row-major over (start, offset) is (start, end) order: ties break as before.
    best = tf.argmax(flat, axis=-1, output_type=tf.int32)
    has_answer = tf.reduce_any(valid, axis=[1, 2])
    best_start = tf.where(has_answer, best // offsets, -1)
    best_end = tf.where(has_answer, best // offsets + best % offsets, -1)
    score = tf.where(has_answer, tf.reduce_max(flat, axis=-1), -np.inf)
    out.update(answer_start=best_start, answer_end=best_end, score=score,
               null_score=start[:, 0] + end[:, 0],
               answer_text=_span_text(module, features["input_ids"], best_start, best_end))
    return out


def _span_text(module, input_ids, first, last):
    """WordPieces first..last joined as the original's tok_text (" ##" and "##" removed)."""
    pos = tf.range(tf.shape(input_ids)[1])[tf.newaxis, :]
    keep = (pos >= first[:, None]) & (pos <= last[:, None])
    vocab = tf.constant(module.vocab_tokens, tf.string)
    tokens = tf.ragged.boolean_mask(tf.gather(vocab, input_ids), keep)
    text = tf.strings.reduce_join(tokens, axis=-1, separator=" ")
    text = tf.strings.regex_replace(text, " ##", "")
    text = tf.strings.regex_replace(text, "##", "")
    return tf.strings.strip(tf.strings.regex_replace(text, " +", " "))


def _squad(module, question, context):
    """Best span per window, then per example (the window with the best score)."""
    features, windows = pack_squad(module, question, context)
    best = best_span(module, features, windows)
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
