"""Owns the tagger's serving signatures: raw text (or pre-split words) -> per-word tags and the entities decoded from them, in-graph (registers at import).

The ``tagger`` family of ``modeling.export`` (see its docstring for the registry and the
signatures every family shares). It serves what ``run_ner.py`` trained (a
``BertTokenTagger``, or with ``feature_based`` the ``BertFeatureTagger``), with the run's
labels, casing, ``max_seq_length``, ``doc_stride`` and tag scheme from its
``export_metadata.json`` (``tasks.tagging.task.TaggingExportMetadata``).

Words. CoNLL data is pre-tokenized (punctuation is a word of its own); raw text is split
into such words in the graph the way the original's BasicTokenizer draws word boundaries
(whitespace; each punctuation character and each CJK character alone), on the ORIGINAL
string (``BertInGraphTokenizer.split_words_with_offsets``), so every word keeps its
character offsets: code points, as Python's ``str`` indexes them, end exclusive
(``text[word_start:word_end] == word_text``). A word the original would drop entirely
(only control characters, ...) is not a word. Each word is then WordPiece-tokenized as
the training path tokenizes a CoNLL word (``tasks.tagging.data``; a pre-split word that
tokenizes to nothing is ``[UNK]``), and its tag is predicted from its FIRST piece.

Windows. A text longer than one window (``max_seq_length - 2`` pieces) is never
truncated: windows ``doc_stride`` pieces apart (``modeling.export.serving.token_windows``; the
last, shorter one filled up with the pieces before it, as context, like the Python
path's), each word read from the window where its first piece has the most context
(``modeling.export.serving.max_context``, the rule of ``tasks.tagging.data.sentence_windows``).
The cost is linear in the text's length; a text needing more than
``max_context_windows`` windows is refused with InvalidArgumentError (message holding
``modeling.export.serving.TOO_MANY_WINDOWS``). The whole text is one sequence (one CoNLL
"sentence"): entities may span what a reader would call two sentences only if the tags
say so.

Entities. Decoded from the predicted tags with conlleval's chunk rules
(``tasks.tagging.metrics.chunks``; one set of rules covers IOB1, IOB2, IOBES and IOE):
the rules are evaluated in Python on every (previous label, label) pair into two
[labels + 1, labels + 1] tables baked into the graph, so the graph cannot drift from
``metrics``. A run whose tag scheme is "none" (POS-like tags) returns no entities.

Signatures (n = entities, m = words, of the whole batch, flattened row-major: all of
example 0's, then example 1's ...; int32 indexes, float32 probabilities):

* ``serving_default``: ``text`` [batch] -> ``entity_example_index``, ``entity_type``
  (string), ``entity_text`` (string, ``text[entity_start:entity_end]``),
  ``entity_start`` / ``entity_end`` (code points, end exclusive), ``entity_word_start`` /
  ``entity_word_end`` (the example's word positions, end exclusive) [n];
  ``word_example_index``, ``word_text``, ``word_start``, ``word_end``, ``word_tag``
  (string), ``word_probability`` (of that tag) [m], ``word_probabilities`` [m, labels];
* ``tag_words``: ``words`` [batch, max_words] ("" = no word: padding) -> ``word_tag``
  [batch, max_words] ("" where no word), ``word_probability`` [batch, max_words] (0 where
  no word), and ``entity_example_index``, ``entity_type``, ``entity_text`` (the words
  joined by one space), ``entity_word_start`` / ``entity_word_end`` (positions in
  ``words``, end exclusive) [n];
* ``preprocess``: ``text`` -> int32 ``input_ids``, ``input_mask``, ``segment_ids``
  [windows, seq], ``window_example_index``, ``window_doc_start`` (first piece of the
  window, in the example's pieces) [windows], and per word ``word_example_index``,
  ``word_text``, ``word_start``, ``word_end``, ``word_window`` (the row of the window that
  scores it), ``word_window_position`` (its first piece's position there) [m];
* ``serving_tokenized``: the three int32 tensors -> ``logits`` and ``probabilities``
  float32 [windows, seq, labels] (a word's: ``[word_window, word_window_position]``).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import tensorflow as tf

from data_prep.tf_tokenization import pack_segments, substrings
from modeling.export import families, registry, serving
from modeling.export.metadata import ExportError
from tasks.tagging import data, metrics
from tasks.tagging.data import DEFAULT_FEATURE_LAYERS, DEFAULT_LSTM_UNITS
from tasks.tagging.task import MODEL_TYPE, TaggingExportMetadata, build_tagging_model


@dataclasses.dataclass(frozen=True)
class TaggerServingConfig(families.ServingConfig):
    """``--model_type=tagger``'s settings (``run_ner.py``'s, from its metadata).

    Attributes:
      labels: tag names in id order.
      tag_scheme: the tag scheme entities are decoded with (IOB1, IOB2, IOBES, IOE, or
        "none"); "" detects it from the labels.
      doc_stride: pieces between the starts of consecutive windows of a long text.
      max_context_windows: most windows one text may need; a longer text is refused by
        the graph with an error instead of unbounded memory.
      feature_based, feature_layers, lstm_units: the feature-based model (frozen encoder
        + BiLSTM) and its settings, as the run trained it.
    """

    labels: tuple = ()
    tag_scheme: str = ""
    doc_stride: int = 128
    max_context_windows: int = 64
    feature_based: bool = False
    feature_layers: str = ""
    lstm_units: int = 0

    model_type: ClassVar[str] = MODEL_TYPE


class TaggerServing(families.ServingFamily):
    """``--model_type=tagger``: a ``run_ner.py`` model (``BertTokenTagger`` or, feature
    based, ``BertFeatureTagger``)."""

    model_type = MODEL_TYPE
    config_class = TaggerServingConfig
    weights_description = "a fine-tuned token tagger (run_ner.py output)"
    flags = (
        families.FamilyFlag("label_list", "list", None, "tag names in id order (comma "
                            "separated); default: the run's metadata's labels."),
        families.FamilyFlag("num_labels", "integer", None, "outputs of the head; checked "
                            "against the label list."),
        families.FamilyFlag("doc_stride", "integer", 128, "pieces between the starts of "
                            "consecutive windows of a long text; default: the run's "
                            "metadata, else half a window (as run_ner.py)."),
        families.FamilyFlag("max_context_windows", "integer", 64, "most windows one text "
                            "may need; a longer one is refused with an error (bounded "
                            "memory per request)."),
        families.FamilyFlag("tag_scheme", "string", "", "how entities are decoded from the "
                            "tags: IOB1, IOB2, IOBES, IOE or none; default: the run's "
                            "metadata, else detected from the labels."),
        families.FamilyFlag("feature_based", "bool", False, "the run_ner.py --feature_based "
                            "model (frozen encoder + BiLSTM); default: the run's metadata."),
        families.FamilyFlag("feature_layers", "string", "", "feature-based: the run's "
                            "--feature_layers; default: the run's metadata."),
        families.FamilyFlag("lstm_units", "integer", 0, "feature-based: the run's "
                            "--lstm_units (0: 768); default: the run's metadata."),
    )
    metadata_class = TaggingExportMetadata

    def default_fields(self, max_seq_length):
        # run_ner.py's default: windows half a window apart (data.WindowConfig.stride).
        return {"doc_stride": data.WindowConfig(max_seq_length=max(3, max_seq_length)).stride}

    def settings(self, given, metadata, max_seq_length):
        values = super().settings(given, metadata, max_seq_length)
        values["labels"] = families.label_names(given, metadata, self.model_type)
        return values

    def config_fields(self, metadata):
        fields = {"tag_scheme": metadata.tag_scheme, "feature_based": metadata.feature_based,
                  "feature_layers": metadata.feature_layers,
                  "lstm_units": metadata.lstm_units}
        if metadata.doc_stride > 0:
            fields["doc_stride"] = metadata.doc_stride
        return fields

    def validate(self, config):
        from modeling.models import FEATURE_LAYERS

        labels = list(config.labels)
        if not labels:
            raise ExportError("a tagger export needs its label names (--label_list, "
                              "or the run's export_metadata.json)")
        if len(set(labels)) != len(labels):
            raise ExportError(f"the tagger's labels repeat a name: {labels}")
        if config.tag_scheme not in ("",) + data.SCHEMES:
            raise ExportError(f"tag_scheme={config.tag_scheme!r} is not one of "
                              f"{data.SCHEMES}")
        if (data.is_chunk_scheme(tag_scheme(config))
                and data.detect_tag_scheme(labels) == "none"):
            raise ExportError(
                f"tag_scheme={config.tag_scheme} but the labels {labels} are not all chunk "
                "tags (O or P-TYPE with P in B, I, E, S); use tag_scheme none")
        if config.doc_stride < 1 or config.max_context_windows < 1:
            raise ExportError(f"doc_stride={config.doc_stride} and max_context_windows="
                              f"{config.max_context_windows} must be positive")
        if config.feature_based:
            if (config.feature_layers or DEFAULT_FEATURE_LAYERS) not in FEATURE_LAYERS:
                raise ExportError(f"feature_layers={config.feature_layers!r} is not "
                                  f"one of {FEATURE_LAYERS}")
            if config.lstm_units < 0:
                raise ExportError(f"lstm_units={config.lstm_units} must not be "
                                  "negative (0: the default, 768)")

    def build_model(self, config, bert_config, dtype_policy):
        # What tasks.tagging.task.model_from_metadata builds, from the serving config.
        return build_tagging_model(
            bert_config, len(config.labels), feature_based=config.feature_based,
            feature_layers=config.feature_layers or DEFAULT_FEATURE_LAYERS,
            lstm_units=config.lstm_units or DEFAULT_LSTM_UNITS, dtype=dtype_policy)

    def check_model(self, model, config):
        from modeling.models import BertFeatureTagger, BertTokenTagger

        expected = BertFeatureTagger if config.feature_based else BertTokenTagger
        families.expect_model(model, expected, config)
        if model.num_labels != len(config.labels):
            raise ExportError(
                f"the tagger has {model.num_labels} outputs but {len(config.labels)} labels "
                f"were given: {list(config.labels)}")
        if config.feature_based:
            want = (config.feature_layers or DEFAULT_FEATURE_LAYERS,
                    config.lstm_units or DEFAULT_LSTM_UNITS)
            if (model.feature_layers, model.lstm_units) != want:
                raise ExportError(
                    f"the feature-based tagger has feature_layers={model.feature_layers}, "
                    f"lstm_units={model.lstm_units}; the settings say {want}")

    def signatures(self, module):
        tables = ChunkTables(module.config)

        def serve(text):
            return _serve_text(module, tables, text)

        def tag_words(words):
            return _serve_words(module, tables, words)

        def preprocess(text):
            words = split_text(module, text)
            features, windows, scoring = pack_words(module, words)
            return {**features,
                    "window_example_index": tf.cast(windows["example"], tf.int32),
                    "window_doc_start": tf.cast(windows["doc_start"], tf.int32),
                    **_word_outputs(words),
                    "word_window": tf.cast(scoring[:, 0], tf.int32),
                    "word_window_position": tf.cast(scoring[:, 1], tf.int32)}

        text = {"text": serving.string_spec("text")}
        return {
            "serving_default": tf.function(serve, autograph=False).get_concrete_function(**text),
            "tag_words": tf.function(tag_words, autograph=False).get_concrete_function(
                words=tf.TensorSpec([None, None], tf.string, name="words")),
            "preprocess": tf.function(preprocess, autograph=False).get_concrete_function(**text),
            "serving_tokenized": tf.function(
                lambda **f: _logits_ids(module, f),
                autograph=False).get_concrete_function(
                    **serving.ids_specs()),
        }


FAMILY = registry.register(TaggerServing())


def tag_scheme(config) -> str:
    """The scheme entities are decoded with: the config's, else detected from the labels
    (``data.detect_tag_scheme``; without data, IOB1 and IOB2 decode alike)."""
    return config.tag_scheme or data.detect_tag_scheme(list(config.labels))


class ChunkTables:
    """``metrics.start_of_chunk`` / ``end_of_chunk`` for every (previous, current) label
    pair, as bool [labels + 1, labels + 1] tables (index ``labels`` = "O": before the
    first word and after the last), plus each label's chunk type.

    For tag scheme "none" no label starts a chunk: no entities.
    """

    def __init__(self, config):
        labels = list(config.labels) + [metrics.OUTSIDE]
        parts = [metrics.split_tag(label) for label in labels]
        chunked = data.is_chunk_scheme(tag_scheme(config))
        self.outside = len(labels) - 1
        self.start = np.array([[chunked and metrics.start_of_chunk(p, c, pt, ct)
                                for c, ct in parts] for p, pt in parts], bool)
        self.end = np.array([[metrics.end_of_chunk(p, c, pt, ct) for c, ct in parts]
                             for p, pt in parts], bool)
        self.types = [kind for _, kind in parts]


def _logits(module, features):
    logits = tf.cast(module.model_outputs(features)["logits"], tf.float32)
    return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1)}


def _logits_ids(module, features):
    """``serving_tokenized``: the model on the request's width, its outputs returned at
    the width the caller passed (0 at the positions cut as padding)."""
    width = tf.shape(features["input_ids"])[1]
    out = _logits(module, serving.trim_to_request(features))
    return {name: serving.pad_positions(value, width) for name, value in out.items()}


def split_text(module, text):
    """Raw text -> the words to tag: dict of RaggedTensors [batch, (words)]: ``text``,
    ``start``, ``end`` (int64 code points) and ``pieces`` (int64 [batch, (words),
    (pieces)]); words without pieces (what the original drops) are left out."""
    tok = module.tokenizer
    words, starts, ends = tok.split_words_with_offsets(text)
    pieces = tok.tokenize_words(words.flat_values).merge_dims(1, 2)   # [m, (pieces)]
    keep = words.with_flat_values(pieces.row_lengths() > 0)
    flat_keep = keep.flat_values
    kept_pieces = tf.ragged.boolean_mask(pieces, flat_keep)
    return {"text": tf.ragged.boolean_mask(words, keep),
            "start": tf.ragged.boolean_mask(starts, keep),
            "end": tf.ragged.boolean_mask(ends, keep),
            "pieces": tf.RaggedTensor.from_row_lengths(  # one row per kept word
                kept_pieces, tf.reduce_sum(tf.cast(keep, tf.int64), axis=1), validate=False)}


def _word_outputs(words) -> dict:
    """The per-word outputs of ``serving_default`` / ``preprocess`` that need no model."""
    return {"word_example_index": tf.cast(words["text"].value_rowids(), tf.int32),
            "word_text": words["text"].flat_values,
            "word_start": tf.cast(words["start"].flat_values, tf.int32),
            "word_end": tf.cast(words["end"].flat_values, tf.int32)}


def pack_words(module, words):
    """Windows over each example's word pieces, and the window each word is read from.

    Args:
      module: the ``ServingModule``.
      words: dict with ``pieces``: int64 RaggedTensor [batch, (words), (pieces)], every
        word with at least one piece.

    Returns:
      (features, windows, scoring): int32 features [windows, seq] (``[CLS] pieces
      [SEP]``, zero padding, segment 0; a text's last window, when shorter than the
      room, also holds the pieces before it as context, as the Python path's windows);
      the ``token_windows`` dict plus ``context_start``; int64 [m, 2]: per
      word (flattened row-major) the row of its max-context window and its first piece's
      position in that window.

    Raises (when run):
      InvalidArgumentError if an example needs more than max_context_windows windows.
    """
    c = module.config
    tok = module.tokenizer
    by_word = words["pieces"]
    pieces = by_word.merge_dims(1, 2)                                  # [batch, (pieces)]
    batch = tf.shape(pieces.row_lengths(), out_type=tf.int64)[0]
    room = c.max_seq_length - 2
    span = tf.fill([batch], tf.constant(room, tf.int64))
    stride = tf.minimum(tf.cast(c.doc_stride, tf.int64), span)
    window, windows = serving.token_windows(
        pieces, span, stride, c.max_context_windows, what="a text",
        settings=f"doc_stride={c.doc_stride}, max_seq_length={c.max_seq_length}",
        advice="split the text or export with a larger --max_context_windows",
        fill_before=True)
    # Where the window's own first piece sits: after [CLS] and the context before it.
    windows["context_start"] = 1 + windows["before"]
    input_ids, input_mask, segment_ids = pack_segments(
        [window], tok.cls_id, tok.sep_id, c.max_seq_length)
    # The request's longest window, not max_seq_length (only padding is cut).
    features = serving.trim_to_request({"input_ids": tf.cast(input_ids, tf.int32),
                                        "input_mask": tf.cast(input_mask, tf.int32),
                                        "segment_ids": tf.cast(segment_ids, tf.int32)})

    # Pieces numbered over the whole batch (pieces.flat_values order): which are first
    # pieces, and of which word (every word has at least one piece).
    total = tf.shape(pieces.flat_values, out_type=tf.int64)[0]
    word_rows = by_word.values                                         # [m, (pieces)]
    first_piece = word_rows.row_splits[:-1]
    # One more entry, False: where padding positions point.
    is_first = tf.scatter_nd(first_piece[:, None],
                             tf.ones_like(first_piece, tf.bool), [total + 1])
    word_of_piece = tf.cumsum(tf.cast(is_first, tf.int64)) - 1
    # Each window position's piece in that numbering, and whether the window scores it.
    pos = tf.range(tf.shape(features["input_ids"], out_type=tf.int64)[1])[tf.newaxis, :]
    start = windows["context_start"][:, None]
    piece = (tf.gather(pieces.row_splits[:-1], windows["example"])[:, None]
             + windows["doc_start"][:, None] + pos - start)            # [windows, seq]
    inside = (pos >= start) & (pos < start + windows["length"][:, None])
    piece = tf.where(inside, piece, total)
    scored = inside & serving.max_context(windows, pos) & tf.gather(is_first, piece)
    where = tf.where(scored)                                           # [m, 2]
    word = tf.gather(word_of_piece, tf.gather_nd(piece, where))
    # Exactly one window scores each word: put the rows back in word order.
    scoring = tf.scatter_nd(word[:, None], where, tf.stack([word_rows.nrows(), 2]))
    return features, windows, scoring


def _tag(module, words):
    """Runs the model on the windows; per word (flattened) its label id, probability of
    that label and all probabilities; plus the windows."""
    features, windows, scoring = pack_words(module, words)
    out = _logits(module, features)
    logits = tf.gather_nd(out["logits"], scoring)                     # [m, labels]
    probabilities = tf.gather_nd(out["probabilities"], scoring)
    # argmax of the logits, first on ties: what the Python path takes.
    label = tf.argmax(logits, axis=-1, output_type=tf.int32)
    probability = tf.gather(probabilities, label, batch_dims=1)
    return label, probability, probabilities, windows


def decode_entities(tables: ChunkTables, labels):
    """``metrics.chunks`` on each example's predicted labels, in-graph.

    The Python loop closes the open chunk at the first position whose (previous,
    current) pair ends a chunk, and a chunk start overwrites a still open chunk. So a
    chunk that starts at word i is returned iff the first position after i where a
    chunk starts or ends is an end (a position can be both: the end comes first), within
    the example (a final "O" ends the last chunk); that end is the chunk's. Positions
    with a start or an end, in order, pair each start with the next one: linear cost.

    Args:
      labels: int32 RaggedTensor [batch, (words)] of label ids.

    Returns:
      dict of [n] tensors, entities in example then word order: ``example`` (int64),
      ``first`` and ``last`` (int64 word positions in the example, last inclusive) and
      ``type`` (string).
    """
    batch = labels.nrows()
    sentinel = tf.fill([batch, 1], tf.constant(tables.outside, labels.dtype))
    current = tf.concat([labels, sentinel], axis=1)                    # [batch, (words + 1)]
    previous = tf.concat([sentinel, labels], axis=1)
    pairs = tf.stack([previous.flat_values, current.flat_values], axis=1)
    starts = tf.gather_nd(tf.constant(tables.start), pairs)           # flat [m + batch]
    ends = tf.gather_nd(tf.constant(tables.end), pairs)
    flat_example = current.value_rowids()
    event = tf.where(starts | ends)[:, 0]                              # ascending
    at, after = event[:-1], event[1:]
    last_of_example = tf.gather(current.row_splits[1:] - 1, tf.gather(flat_example, at))
    # (No pair with a previous "O" ends a chunk, so the next example's first event is
    # never an end; the bound keeps the rule from depending on that.)
    emitted = tf.gather(starts, at) & tf.gather(ends, after) & (after <= last_of_example)
    first = tf.boolean_mask(at, emitted)                               # flat positions
    stop = tf.boolean_mask(after, emitted)                             # exclusive
    example = tf.gather(flat_example, first)
    row_start = tf.gather(current.row_splits, example)
    types = tf.constant(tables.types, tf.string)
    return {"example": example, "first": first - row_start, "last": stop - 1 - row_start,
            "type": tf.gather(types, tf.gather(current.flat_values, stop - 1))}


def _serve_text(module, tables, text):
    words = split_text(module, text)
    label, probability, probabilities, _ = _tag(module, words)
    ragged = words["text"].with_flat_values(label)
    entities = decode_entities(tables, ragged)
    # Character offsets of the entity's first and last word (flat word numbering).
    row_start = tf.gather(words["text"].row_splits, entities["example"])
    start = tf.gather(words["start"].flat_values, row_start + entities["first"])
    end = tf.gather(words["end"].flat_values, row_start + entities["last"])
    label_names = tf.constant(list(module.config.labels), tf.string)
    return {
        "entity_example_index": tf.cast(entities["example"], tf.int32),
        "entity_type": entities["type"],
        "entity_text": substrings(text, entities["example"], start, end),
        "entity_start": tf.cast(start, tf.int32),
        "entity_end": tf.cast(end, tf.int32),
        "entity_word_start": tf.cast(entities["first"], tf.int32),
        "entity_word_end": tf.cast(entities["last"] + 1, tf.int32),
        **_word_outputs(words),
        "word_tag": tf.gather(label_names, label),
        "word_probability": probability,
        "word_probabilities": probabilities,
    }


def _serve_words(module, tables, padded):
    """``tag_words``: pre-split words [batch, max_words], "" = no word."""
    present = tf.not_equal(padded, "")
    words = tf.ragged.boolean_mask(padded, present)                    # [batch, (words)]
    pieces = module.tokenizer.tokenize_words(words.flat_values).merge_dims(1, 2)
    # As the training path: a word that tokenizes to nothing is [UNK].
    unk = tf.constant(module.vocab_tokens.index("[UNK]"), tf.int64)
    empty = tf.cast(tf.equal(pieces.row_lengths(), 0), tf.int64)
    pieces = tf.concat([pieces, tf.RaggedTensor.from_row_lengths(
        tf.fill([tf.reduce_sum(empty)], unk), empty, validate=False)], axis=1)
    label, probability, _, _ = _tag(
        module, {"pieces": tf.RaggedTensor.from_row_splits(pieces, words.row_splits,
                                                           validate=False)})
    where = tf.where(present)                                          # row-major = flat
    label_names = tf.constant(list(module.config.labels), tf.string)
    word_tag = tf.tensor_scatter_nd_update(tf.fill(tf.shape(padded), ""), where,
                                           tf.gather(label_names, label))
    word_probability = tf.tensor_scatter_nd_update(
        tf.zeros(tf.shape(padded), tf.float32), where, probability)
    entities = decode_entities(tables, words.with_flat_values(label))
    # Positions in `words` of the compact word numbering.
    position = words.with_flat_values(where[:, 1])
    row_start = tf.gather(words.row_splits, entities["example"])
    first = row_start + entities["first"]
    last = row_start + entities["last"]
    joined = tf.strings.reduce_join(tf.RaggedTensor.from_row_lengths(
        tf.gather(words.flat_values, tf.ragged.range(first, last + 1).flat_values),
        last + 1 - first, validate=False), axis=1, separator=" ")
    return {"word_tag": word_tag, "word_probability": word_probability,
            "entity_example_index": tf.cast(entities["example"], tf.int32),
            "entity_type": entities["type"], "entity_text": joined,
            "entity_word_start": tf.cast(tf.gather(position.flat_values, first), tf.int32),
            "entity_word_end": tf.cast(tf.gather(position.flat_values, last) + 1, tf.int32)}
