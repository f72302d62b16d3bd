"""SQuAD v1.1/v2.0 data: JSON -> examples -> windowed features -> TFRecords (answers: postprocess.py).

Three parts, in pipeline order (the fourth, logits -> answers, is `tasks.squad.postprocess`):

1. Reading (`read_squad_examples`): the official JSON, the context split on whitespace
   with a character -> word map, the answer located from `answer_start` and kept only if
   its text is recoverable from the words (otherwise skipped and counted, as Google's
   `run_squad.py` does).
2. Features (`convert_examples_to_features`): WordPiece sub-tokens, sliding windows of
   `[CLS] question [SEP] window [SEP]`, the "max context" flag per window token and the
   training start/end positions (0, i.e. [CLS], when the answer is outside the window or
   the question is unanswerable).
3. Storage: the squad TFRecord schemas (`SQUAD_TRAIN_SCHEMA`, `SQUAD_PREDICT_SCHEMA`),
   atomic TFRecord writing and a JSON sidecar for the prediction-side feature metadata.
The results are the original's, bit for bit; tests/test_squad_postprocess.py runs both.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

from absl import logging

from data_prep import features as features_lib
from data_prep import fileio
from data_prep import reference_tokenization, text_input, tokenization
from data_prep.cli import UserError
from tasks.common.record_cache import CachedRecords, RecordCache, cache_key
from tasks.common.windows import doc_spans_for, max_context_span_index

FIRST_UNIQUE_ID = 1000000000


class SquadFormatError(UserError):
    """The SQuAD JSON is malformed, lacks a field, or disagrees with the settings used."""


# ---------------------------------------------------------------------------
# 1. Reading
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class SquadExample:
    """One question over one context.

    `doc_tokens` are the whitespace-separated words of the context. For training examples
    `start_position`/`end_position` are word indices of the answer (-1 for unanswerable
    v2.0 questions); for prediction they stay None.
    """

    qas_id: str
    question_text: str
    doc_tokens: list[str]
    orig_answer_text: str | None = None
    start_position: int | None = None
    end_position: int | None = None
    is_impossible: bool = False


class SkippedQuestion(NamedTuple):
    """A training question left out because its answer cannot be found in the context."""

    qas_id: str
    reason: str


def is_whitespace(char: str) -> bool:
    """The original reader's whitespace: space, tab, CR, LF and U+202F (narrow no-break space)."""
    return char in " \t\r\n" or ord(char) == 0x202F


def split_context(text: str) -> tuple[list[str], list[int]]:
    """Splits a context into words and maps every character to its word's index.

    Whitespace characters map to the preceding word (-1 before the first word), so an
    `answer_start` on a space still lands on a word, as in the original.
    """
    doc_tokens: list[str] = []
    char_to_word_offset: list[int] = []
    prev_is_whitespace = True
    for char in text:
        if is_whitespace(char):
            prev_is_whitespace = True
        else:
            if prev_is_whitespace:
                doc_tokens.append(char)
            else:
                doc_tokens[-1] += char
            prev_is_whitespace = False
        char_to_word_offset.append(len(doc_tokens) - 1)
    return doc_tokens, char_to_word_offset


def _read_text(path: str) -> str:
    """A local or remote (gs://...) file's text; invalid UTF-8 raises
    `text_input.InputError` naming the file, line and byte offset."""
    if not fileio.exists(path):
        raise FileNotFoundError(f"{path!r} not found")
    with fileio.open_file(path, "rb") as f:
        return text_input.decode_utf8(f.read(), path)


def load_squad_json(input_file: str) -> dict:
    """Reads a SQuAD JSON file; errors name the file (and line/column for bad JSON)."""
    try:
        text = _read_text(input_file)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"SQuAD file {input_file!r} not found") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise SquadFormatError(
            f"{input_file}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})"
        ) from err


_JSON_TYPE_NAMES = {str: "a string", int: "an integer", list: "a list", dict: "an object"}


def _require(mapping: Any, key: str, kind: type, where: str):
    if not isinstance(mapping, dict):
        raise SquadFormatError(f"{where}: expected a JSON object, found {type(mapping).__name__}")
    if key not in mapping:
        raise SquadFormatError(f"{where}: missing field {key!r}")
    value = mapping[key]
    # bool is an int subclass but never a valid id, offset or text.
    if not isinstance(value, kind) or isinstance(value, bool):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        expected = " or ".join(_JSON_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise SquadFormatError(
            f"{where}: field {key!r} should be {expected}, "
            f"found {type(value).__name__} {value!r:.60}"
        )
    return value


def examples_from_json(
    dataset: Mapping,
    *,
    is_training: bool,
    version_2_with_negative: bool = False,
    source: str = "SQuAD data",
) -> tuple[list[SquadExample], list[SkippedQuestion]]:
    """Turns a parsed SQuAD JSON object into examples, plus the training questions skipped.

    Prediction examples carry no answer. Training examples need exactly one answer unless
    `is_impossible` (v2.0); a question whose answer text cannot be recovered from the
    context words at `answer_start` is skipped with a warning, like the original.

    Raises:
      SquadFormatError: a missing or mistyped field, naming the question id where known;
        a question id used twice (predictions.json, the metrics and the n-best file map
        each id to one question: the second would silently replace the first).
    """
    articles = _require(dataset, "data", list, source)
    examples: list[SquadExample] = []
    skipped: list[SkippedQuestion] = []
    seen: dict[str, str] = {}  # str(id) (as a predictions.json key) -> where it was
    for a_index, article in enumerate(articles):
        a_where = f"{source}: data[{a_index}]"
        for p_index, paragraph in enumerate(_require(article, "paragraphs", list, a_where)):
            p_where = f"{a_where}.paragraphs[{p_index}]"
            context = _require(paragraph, "context", str, p_where)
            doc_tokens, char_to_word_offset = split_context(context)
            for q_index, qa in enumerate(_require(paragraph, "qas", list, p_where)):
                q_where = f"{p_where}.qas[{q_index}]"
                qas_id = _require(qa, "id", (str, int), q_where)
                check_new_question_id(qas_id, f"data[{a_index}].paragraphs[{p_index}].qas[{q_index}]",
                              seen, source)
                where = f"{source}: question id {qas_id!r}"
                question_text = _require(qa, "question", str, where)
                example = SquadExample(
                    qas_id=qas_id, question_text=question_text, doc_tokens=doc_tokens
                )
                if is_training:
                    problem = _locate_answer(
                        example, qa, char_to_word_offset, version_2_with_negative, where
                    )
                    if problem is not None:
                        logging.warning("Skipping question %r: %s", qas_id, problem)
                        skipped.append(SkippedQuestion(qas_id, problem))
                        continue
                examples.append(example)
    if skipped:
        logging.warning(
            "%s: %d of %d training question(s) skipped (answer not recoverable)",
            source, len(skipped), len(skipped) + len(examples),
        )
    return examples, skipped


def check_new_question_id(qas_id, location: str, seen: dict, source: str) -> None:
    """Raises SquadFormatError if `qas_id` was `seen` (as a JSON key: 7 and "7" are one
    id); else records its `location` (data[a].paragraphs[p].qas[q])."""
    key = str(qas_id)
    if key in seen:
        raise SquadFormatError(
            f"{source}: question id {qas_id!r} is used twice, at {seen[key]} and "
            f"{location}; question ids must be unique")
    seen[key] = location


def _locate_answer(example, qa, char_to_word_offset, version_2_with_negative, where):
    """Fills the training answer of `example`; returns why it was skipped, or None."""
    is_impossible = qa.get("is_impossible", False)
    if not isinstance(is_impossible, bool):
        raise SquadFormatError(f"{where}: 'is_impossible' should be true/false")
    if is_impossible and not version_2_with_negative:
        raise SquadFormatError(
            f"{where}: is_impossible is true but version_2_with_negative is off; "
            "pass version_2_with_negative=True (--version_2_with_negative) for SQuAD 2.0 data"
        )
    if is_impossible:
        example.is_impossible = True
        example.start_position = example.end_position = -1
        example.orig_answer_text = ""
        return None
    answers = _require(qa, "answers", list, where)
    if len(answers) != 1:
        raise SquadFormatError(
            f"{where}: for training, each answerable question needs exactly 1 answer, "
            f"found {len(answers)}"
        )
    answer_text = _require(answers[0], "text", str, f"{where} answers[0]")
    answer_offset = _require(answers[0], "answer_start", int, f"{where} answers[0]")
    if not answer_text:
        return "empty answer text"
    answer_end = answer_offset + len(answer_text) - 1
    if answer_offset < 0 or answer_end >= len(char_to_word_offset):
        return (
            f"answer_start {answer_offset} + length {len(answer_text)} lies outside the "
            f"context ({len(char_to_word_offset)} characters)"
        )
    start_position = char_to_word_offset[answer_offset]
    end_position = char_to_word_offset[answer_end]
    # The answer must be recoverable from whole words: a mismatch means a wrong
    # answer_start or Unicode the whitespace split does not see.
    actual_text = " ".join(example.doc_tokens[max(start_position, 0):end_position + 1])
    cleaned_answer = " ".join(reference_tokenization.whitespace_tokenize(answer_text))
    if start_position < 0 or cleaned_answer not in actual_text:
        return (f"answer {cleaned_answer!r} not found at answer_start {answer_offset}: "
                f"{actual_text!r}")
    example.orig_answer_text = answer_text
    example.start_position = start_position
    example.end_position = end_position
    return None


def read_squad_examples(
    input_file: str, *, is_training: bool, version_2_with_negative: bool = False
) -> tuple[list[SquadExample], list[SkippedQuestion]]:
    """Reads a SQuAD v1.1/v2.0 JSON file into examples (see `examples_from_json`)."""
    dataset = load_squad_json(input_file)
    return examples_from_json(
        dataset,
        is_training=is_training,
        version_2_with_negative=version_2_with_negative,
        source=input_file,
    )


# ---------------------------------------------------------------------------
# 2. Features
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SquadSettings:
    """SQuAD's own settings (run_squad.py's flags of the same names); TensorFlow-free, so
    that run_squad.py refuses bad flags before it loads TensorFlow."""

    train_file: str | None = None
    predict_file: str | None = None
    doc_stride: int = 128
    max_query_length: int = 64
    n_best_size: int = 20
    max_answer_length: int = 30
    verbose_logging: bool = False
    version_2_with_negative: bool = False
    null_score_diff_threshold: float = 0.0
    bilstm_units: int = 0

    def validate(self, run) -> None:
        """The original's validate_flags_or_throw for these settings and the shared ones
        of `run` (a `training.finetuning.FinetuningRun`); raises UserError."""
        if not run.do_train and not run.do_predict and not run.do_eval:
            raise UserError("At least one of `do_train` or `do_predict` must be True.")
        if run.do_train and not self.train_file:
            raise UserError("If `do_train` is True, then `train_file` must be specified.")
        if (run.do_predict or run.do_eval) and not self.predict_file:
            flag = "do_predict" if run.do_predict else "do_eval"
            raise UserError(f"If `{flag}` is True, then `predict_file` must be specified.")
        if run.max_seq_length <= self.max_query_length + 3:
            raise UserError(
                f"The max_seq_length ({run.max_seq_length}) must be greater than "
                f"max_query_length ({self.max_query_length}) + 3")
        if self.doc_stride < 1:
            raise UserError(f"--doc_stride={self.doc_stride} must be at least 1")
        if self.bilstm_units < 0:
            raise UserError(f"--bilstm_units={self.bilstm_units} must be 0 (none) or more")
        check_answer_settings(self.n_best_size, self.max_answer_length)


def check_answer_settings(n_best_size: int, max_answer_length: int) -> None:
    """The one check of answer extraction's settings (run_squad.py's flags of the same
    names), run before any work and again by `postprocess.PostprocessConfig`; raises
    UserError naming the flag."""
    for flag, value in (("n_best_size", n_best_size), ("max_answer_length", max_answer_length)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise UserError(f"--{flag}={value} must be a positive whole number")


@dataclasses.dataclass(frozen=True)
class WindowConfig:
    """How examples are cut into fixed-length model inputs."""

    max_seq_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64

    def __post_init__(self):
        if self.max_query_length < 1 or self.doc_stride < 1:
            raise SquadFormatError(
                f"max_query_length ({self.max_query_length}) and doc_stride "
                f"({self.doc_stride}) must be positive"
            )
        if self.max_seq_length <= self.max_query_length + 3:
            raise SquadFormatError(
                f"max_seq_length ({self.max_seq_length}) must be greater than "
                f"max_query_length ({self.max_query_length}) + 3"
            )


@dataclasses.dataclass
class SquadFeature:
    """One window of one example, with the maps post-processing needs.

    `token_to_orig_map` and `token_is_max_context` are keyed by position in `tokens` and
    cover exactly the window's context positions, as in the original's InputFeatures.
    Lists of ids are `max_seq_length` long; positions are None outside training.
    """

    unique_id: int
    example_index: int
    doc_span_index: int
    tokens: list[str]
    token_to_orig_map: dict[int, int]
    token_is_max_context: dict[int, bool]
    input_ids: list[int]
    input_mask: list[int]
    segment_ids: list[int]
    start_position: int | None = None
    end_position: int | None = None
    is_impossible: bool = False


def improve_answer_span(doc_tokens, input_start, input_end, tokenizer, orig_answer_text):
    """Narrows a word-level answer span to the sub-tokens that spell the answer exactly.

    The annotation is character based but was widened to whole words: "(1895-1943)."
    for the answer "1895". After WordPiece the sub-tokens "( 1895 - 1943 ) ." contain the
    exact answer, so the first (start, then longest) sub-span equal to the tokenized
    answer is taken; without one the word span stays.
    """
    tok_answer_text = " ".join(tokenizer.tokenize(orig_answer_text))
    for new_start in range(input_start, input_end + 1):
        for new_end in range(input_end, new_start - 1, -1):
            if " ".join(doc_tokens[new_start:new_end + 1]) == tok_answer_text:
                return new_start, new_end
    return input_start, input_end


def _tokenize_words(words, tokenizer):
    """Sub-tokens of the context words with maps both ways, and their ids."""
    tok_to_orig_index: list[int] = []
    orig_to_tok_index: list[int] = []
    all_doc_tokens: list[str] = []
    for i, word in enumerate(words):
        orig_to_tok_index.append(len(all_doc_tokens))
        sub_tokens = tokenizer.tokenize(word)
        tok_to_orig_index.extend([i] * len(sub_tokens))
        all_doc_tokens.extend(sub_tokens)
    return (tok_to_orig_index, orig_to_tok_index, all_doc_tokens,
            tokenizer.convert_tokens_to_ids(all_doc_tokens))


def iter_features(
    examples: Sequence[SquadExample],
    tokenizer,
    config: WindowConfig = WindowConfig(),
    *,
    is_training: bool,
    first_unique_id: int = FIRST_UNIQUE_ID,
) -> Iterator[SquadFeature]:
    """Yields the windows of every example in order, unique ids counting from `first_unique_id`."""
    unique_id = first_unique_id
    seq_len = config.max_seq_length
    cls_id, sep_id = tokenizer.convert_tokens_to_ids(["[CLS]", "[SEP]"])
    cached_words = cached_doc = None
    for example_index, example in enumerate(examples):
        query_tokens = tokenizer.tokenize(example.question_text)[: config.max_query_length]
        query_ids = tokenizer.convert_tokens_to_ids(query_tokens)

        # Questions on one paragraph share its word list: tokenize it once.
        if example.doc_tokens is not cached_words:
            cached_words = example.doc_tokens
            cached_doc = _tokenize_words(example.doc_tokens, tokenizer)
        tok_to_orig_index, orig_to_tok_index, all_doc_tokens, all_doc_ids = cached_doc

        tok_start = tok_end = None
        if is_training and not example.is_impossible:
            tok_start = orig_to_tok_index[example.start_position]
            if example.end_position < len(example.doc_tokens) - 1:
                tok_end = orig_to_tok_index[example.end_position + 1] - 1
            else:
                tok_end = len(all_doc_tokens) - 1
            tok_start, tok_end = improve_answer_span(
                all_doc_tokens, tok_start, tok_end, tokenizer, example.orig_answer_text
            )

        max_tokens_for_doc = seq_len - len(query_tokens) - 3
        spans = doc_spans_for(len(all_doc_tokens), max_tokens_for_doc, config.doc_stride)
        best_span = max_context_span_index(spans, len(all_doc_tokens))
        doc_offset = len(query_tokens) + 2

        for span_index, (span_start, span_length) in enumerate(spans):
            span_end = span_start + span_length  # exclusive
            window = all_doc_tokens[span_start:span_end]
            tokens = ["[CLS]", *query_tokens, "[SEP]", *window, "[SEP]"]
            positions = range(doc_offset, doc_offset + span_length)
            token_to_orig_map = dict(zip(positions, tok_to_orig_index[span_start:span_end]))
            token_is_max_context = {
                p: best_span[span_start + i] == span_index for i, p in enumerate(positions)
            }
            n = len(tokens)
            padding = [0] * (seq_len - n)
            input_ids = [cls_id, *query_ids, sep_id, *all_doc_ids[span_start:span_end], sep_id]
            input_ids += padding
            input_mask = [1] * n + padding
            segment_ids = [0] * doc_offset + [1] * (span_length + 1) + padding

            start_position = end_position = None
            if is_training:
                start_position = end_position = 0
                if (not example.is_impossible and tok_start >= span_start
                        and tok_end < span_end):
                    start_position = tok_start - span_start + doc_offset
                    end_position = tok_end - span_start + doc_offset

            yield SquadFeature(
                unique_id=unique_id,
                example_index=example_index,
                doc_span_index=span_index,
                tokens=tokens,
                token_to_orig_map=token_to_orig_map,
                token_is_max_context=token_is_max_context,
                input_ids=input_ids,
                input_mask=input_mask,
                segment_ids=segment_ids,
                start_position=start_position,
                end_position=end_position,
                is_impossible=example.is_impossible,
            )
            unique_id += 1


def convert_examples_to_features(
    examples: Sequence[SquadExample],
    tokenizer,
    config: WindowConfig = WindowConfig(),
    *,
    is_training: bool,
    output_fn: Callable[[SquadFeature], Any] | None = None,
) -> list[SquadFeature]:
    """All windows of all examples as a list; each is also passed to `output_fn` if given."""
    features = []
    for feature in iter_features(examples, tokenizer, config, is_training=is_training):
        if output_fn is not None:
            output_fn(feature)
        features.append(feature)
    return features


# ---------------------------------------------------------------------------
# 3. Storage: TFRecords and the prediction sidecar
# ---------------------------------------------------------------------------

# The squad TFRecord schemas, with the feature names of the original's FeatureWriter,
# declared with data_prep.features' types. Scalars have length 1, i.e. parse to shape [1]
# ([batch, 1] batched), like every schema there; the original parsed them to shape [].
SQUAD_PREDICT_SCHEMA = features_lib.RecordSchema(
    kind="squad_predict",
    features=(
        features_lib.FeatureSpec("unique_ids", features_lib.INT64, 1),
        features_lib.FeatureSpec("input_ids", features_lib.INT64, "max_seq_length"),
        features_lib.FeatureSpec("input_mask", features_lib.INT64, "max_seq_length"),
        features_lib.FeatureSpec("segment_ids", features_lib.INT64, "max_seq_length"),
    ),
)
SQUAD_TRAIN_SCHEMA = features_lib.RecordSchema(
    kind="squad_train",
    features=SQUAD_PREDICT_SCHEMA.features + (
        features_lib.FeatureSpec("start_positions", features_lib.INT64, 1),
        features_lib.FeatureSpec("end_positions", features_lib.INT64, 1),
        features_lib.FeatureSpec("is_impossible", features_lib.INT64, 1),
    ),
)


def squad_schema(is_training: bool) -> "features_lib.RecordSchema":
    """The record schema of training or prediction features."""
    return SQUAD_TRAIN_SCHEMA if is_training else SQUAD_PREDICT_SCHEMA


def squad_record_values(feature: SquadFeature, is_training: bool) -> dict[str, list[int]]:
    """The int64 values of one record, keyed by the schema's feature names."""
    values = {
        "unique_ids": [feature.unique_id],
        "input_ids": feature.input_ids,
        "input_mask": feature.input_mask,
        "segment_ids": feature.segment_ids,
    }
    if is_training:
        values["start_positions"] = [feature.start_position]
        values["end_positions"] = [feature.end_position]
        values["is_impossible"] = [int(bool(feature.is_impossible))]
    return values


class SquadRecordWriter:
    """The original's FeatureWriter: `process_feature` (it fits
    `convert_examples_to_features(output_fn=...)`) encodes a feature as a record into
    `writer` (a `tf.io.TFRecordWriter`) and counts it."""

    def __init__(self, writer, is_training: bool):
        self.writer = writer
        self.is_training = is_training
        self.num_features = 0
        self._encoder = None

    def process_feature(self, feature: SquadFeature) -> None:
        if self._encoder is None:
            self._encoder = squad_schema(self.is_training).encoder(
                max_seq_length=len(feature.input_ids))
        self.writer.write(self._encoder.encode(squad_record_values(feature, self.is_training)))
        self.num_features += 1


def write_squad_tfrecord(features: Iterable[SquadFeature], filename: str, is_training: bool) -> int:
    """Writes features to `filename`, all-or-nothing; returns how many were written."""
    import tensorflow as tf

    with fileio.AtomicOutputs([filename]) as out, \
            tf.io.TFRecordWriter(out.temp(filename)) as records:
        writer = SquadRecordWriter(records, is_training)
        for feature in features:
            writer.process_feature(feature)
    return writer.num_features


_SIDECAR_FORMAT = "squad-prediction-features/1"


def save_prediction_features(features: Sequence[SquadFeature], path: str, **metadata) -> None:
    """Writes what post-processing needs of each feature (no ids) to a JSON sidecar.

    `metadata` (e.g. the WindowConfig fields, the predict file) is stored alongside so a
    stale sidecar can be detected by the caller.
    """
    rows = []
    for f in features:
        positions = list(f.token_to_orig_map)
        first = positions[0] if positions else len(f.tokens) - 1
        rows.append({
            "unique_id": f.unique_id,
            "example_index": f.example_index,
            "doc_span_index": f.doc_span_index,
            "tokens": f.tokens,
            "doc_offset": first,
            "token_to_orig": [f.token_to_orig_map[p] for p in positions],
            "max_context": [int(f.token_is_max_context[p]) for p in positions],
        })
    payload = {"format": _SIDECAR_FORMAT, "metadata": metadata, "features": rows}
    fileio.write_text(path, json.dumps(payload, ensure_ascii=False))


def load_prediction_features(path: str) -> tuple[list[SquadFeature], dict]:
    """Reads a sidecar written by `save_prediction_features`: (features, metadata)."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "r") as reader:
        payload = json.loads(reader.read())
    if payload.get("format") != _SIDECAR_FORMAT:
        raise SquadFormatError(f"{path}: not a squad prediction-features sidecar")
    features = []
    for row in payload["features"]:
        positions = range(row["doc_offset"], row["doc_offset"] + len(row["token_to_orig"]))
        features.append(SquadFeature(
            unique_id=row["unique_id"],
            example_index=row["example_index"],
            doc_span_index=row["doc_span_index"],
            tokens=row["tokens"],
            token_to_orig_map=dict(zip(positions, row["token_to_orig"])),
            token_is_max_context={p: bool(v) for p, v in zip(positions, row["max_context"])},
            input_ids=[], input_mask=[], segment_ids=[],
        ))
    return features, payload.get("metadata", {})


# Bump when the record or sidecar contents change, to invalidate old caches (2: files
# with a repeated question id are refused, so caches made from them must be re-read).
_CACHE_FORMAT = 2


@dataclasses.dataclass
class PreparedSquad(CachedRecords):
    """What `prepare_squad_records` produced (or found cached) in output_dir
    (`tasks.common.record_cache.CachedRecords`).

    `examples` and `features` (prediction only) are what post-processing needs; the
    features carry no input ids (those are in the TFRecords).
    """

    examples: list[SquadExample] | None = None
    features: list[SquadFeature] | None = None

    @property
    def num_examples(self) -> int:
        return self.metadata["num_examples"]

    @property
    def num_features(self) -> int:
        return self.metadata["num_features"]


def prepare_squad_records(
    input_file: str,
    output_dir: str,
    *,
    vocab_file: str,
    do_lower_case: bool,
    config: WindowConfig = WindowConfig(),
    is_training: bool,
    version_2_with_negative: bool = False,
    shuffle_seed: int | None = 12345,
    tokenizer=None,
) -> PreparedSquad:
    """Reads a SQuAD file and writes its features to TFRecords in output_dir, or reuses them.

    Training writes `train.tf_record`; the examples are shuffled first with
    `random.Random(shuffle_seed)` as the original does (None keeps file order). Prediction
    writes `eval.tf_record` plus `eval_features.json` (the sidecar post-processing reads),
    and returns the examples and features. The records' `.metadata.json` keys the cache
    (`tasks.common.record_cache`): reused while the input file (path, size, mtime), the
    vocab (sha256), do_lower_case, the window settings, version_2_with_negative and the
    seed are unchanged. Everything is written to temporary names and renamed into place;
    the metadata comes last.
    """
    import random

    name = "train" if is_training else "eval"
    sidecar_file = os.path.join(output_dir, f"{name}_features.json")
    cache = RecordCache(os.path.join(output_dir, f"{name}.tf_record"),
                        () if is_training else (sidecar_file,))
    key = cache_key(
        format=_CACHE_FORMAT, source=fileio.fingerprint(input_file),
        vocab_sha256=fileio.sha256(vocab_file), do_lower_case=do_lower_case,
        window=dataclasses.asdict(config), is_training=is_training,
        version_2_with_negative=version_2_with_negative,
        shuffle_seed=shuffle_seed if is_training else None)
    examples, kept = None, []

    def write(writer) -> dict:
        nonlocal examples
        examples, skipped = read_squad_examples(
            input_file, is_training=is_training,
            version_2_with_negative=version_2_with_negative)
        if is_training and shuffle_seed is not None:
            random.Random(shuffle_seed).shuffle(examples)
        tokens = tokenizer or tokenization.FullTokenizer(vocab_file, do_lower_case=do_lower_case)
        records = SquadRecordWriter(writer, is_training)
        for feature in iter_features(examples, tokens, config, is_training=is_training):
            records.process_feature(feature)
            if not is_training:
                feature.input_ids = feature.input_mask = feature.segment_ids = []
                kept.append(feature)
        if not is_training:
            save_prediction_features(kept, sidecar_file)
        logging.info("%s: %d examples -> %d features in %s (%d skipped)", input_file,
                     len(examples), records.num_features, cache.record_file, len(skipped))
        return {"num_examples": len(examples), "num_features": records.num_features,
                "num_skipped": len(skipped), "skipped": [list(s) for s in skipped[:100]]}

    metadata, reused = cache.records(key, write)
    if is_training:
        return PreparedSquad(cache.record_file, cache.metadata_file, metadata, reused)
    if reused:
        examples, _ = read_squad_examples(
            input_file, is_training=False, version_2_with_negative=version_2_with_negative)
        kept, _ = load_prediction_features(sidecar_file)
    return PreparedSquad(cache.record_file, cache.metadata_file, metadata, reused, examples,
                         kept)
