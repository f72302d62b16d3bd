"""Owns token-tagging data: the CoNLL reader, labels and tag schemes, WordPiece windows and their TFRecord cache.

Three layers, each usable alone:

1. Reading (`read_conll`): one word a line, the tag in the LAST column (CoNLL-2003 has
   four: word POS chunk NER), blank lines between sentences, `-DOCSTART-` lines between
   documents (kept: they bound `--document_context` and are written back in the
   prediction files). Columns are separated by spaces or tabs. A file with one column
   (words only: a test file without gold tags) reads with the tag "O". Errors name the
   file and the 1-based line: a line whose column count differs from the file's first
   word line, invalid UTF-8, an empty file.
2. Features (`sentence_windows`): each word is WordPiece-tokenized (a word that
   tokenizes to nothing becomes `[UNK]`, so every word has a first piece); its label sits
   on its FIRST piece, later pieces get weight 0. A sentence longer than the window
   (max_seq_length - 2 pieces) is never truncated: it is cut into windows `doc_stride`
   pieces apart (`tasks.common.windows.doc_spans_for`), and at prediction each word is read
   from the window where its first piece has the most context
   (`tasks.common.windows.max_context_span_index`, SQuAD's rule). With `document_context`
   the room a window has left is filled with the neighbouring pieces of the same
   document, half before and half after (the other side takes what one side lacks);
   those context pieces carry no label.
3. `prepare_tagging_records`: a split's windows as TFRecords (schema `TAGGING_SCHEMA`)
   plus a metadata JSON, reused while the input, the vocab, the casing, the window
   settings and the labels are unchanged.

Labels (`labels_from_sentences`): the tags of the training file, "O" first, the others
sorted (byte order), unless the caller gives a list. `detect_tag_scheme` names the
scheme: IOB1, IOB2, IOBES (or IOE), or "none" for tags that are not chunk tags (POS).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
from collections.abc import Iterable, Iterator, Sequence

from absl import logging

from data_prep import features as features_lib
from data_prep import fileio
from data_prep.cli import UserError
from tasks.common.record_cache import CachedRecords, RecordCache, cache_key
from tasks.common.windows import doc_spans_for, max_context_span_index

DEFAULT_FEATURE_LAYERS = "concat_last_four"  # the paper's best feature-based row
DEFAULT_LSTM_UNITS = 768


@dataclasses.dataclass(frozen=True)
class TaggingSettings:
    """The tagging task's own settings (run_ner.py's task flags).

    Attributes:
      data_dir: train.txt / dev.txt / test.txt (or eng.train / eng.testa / eng.testb,
        valid.txt for dev).
      label_list: label names in id order; None: the training file's tags, "O" first.
      document_context: fill each window with the sentence's document neighbours.
      doc_stride: pieces between windows of a long sentence (None: half a window).
      feature_based: freeze the encoder, train a BiLSTM on its activations (Table 7).
      feature_layers: which activations (`modeling.models.FEATURE_LAYERS`).
      lstm_units: units per direction of the two BiLSTM layers.
    """

    data_dir: str
    label_list: tuple | None = None
    document_context: bool = False
    doc_stride: int | None = None
    feature_based: bool = False
    feature_layers: str = DEFAULT_FEATURE_LAYERS
    lstm_units: int = DEFAULT_LSTM_UNITS

DOCSTART = "-DOCSTART-"
OUTSIDE = "O"
UNKNOWN_PIECE = "[UNK]"
# Candidate file names per split, first match wins: ours, then CoNLL-2003's own names.
SPLIT_FILES = {
    "train": ("train.txt", "eng.train"),
    "dev": ("dev.txt", "valid.txt", "eng.testa"),
    "test": ("test.txt", "eng.testb"),
}
SCHEMES = ("IOB1", "IOB2", "IOBES", "IOE", "none")
# Bump when records or metadata change meaning: old caches are then rebuilt.
CACHE_FORMAT_VERSION = 1
# Training windows are shuffled once, with this seed, before they are written (the
# input pipeline's shuffle buffer of 100 alone would keep whole documents together).
TRAIN_SHUFFLE_SEED = 12345
_COLUMNS = re.compile(r"[ \t]+")


class DataFormatError(UserError):
    """A tagging data file is missing or malformed; the message names file and line."""


# --- 1. Reading ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sentence:
    """One sentence of a CoNLL file.

    Attributes:
      words: the first column of each line.
      tags: the last column ("O" for every word of a file without tags).
      document: 0-based document number (-DOCSTART- lines seen before the sentence).
      line: 1-based line of the first word (word i is on line `line + i`).
    """

    words: tuple
    tags: tuple
    document: int
    line: int


@dataclasses.dataclass(frozen=True)
class DocumentStart:
    """A -DOCSTART- line (1-based `line`)."""

    line: int


@dataclasses.dataclass
class ConllFile:
    """A CoNLL file as read: sentences and document starts in file order.

    Attributes:
      path: the file.
      items: `Sentence` and `DocumentStart` objects in file order.
      num_columns: columns of a word line.
      has_tags: False for a one-column file (tags read as "O").
    """

    path: str
    items: list
    num_columns: int
    has_tags: bool

    @property
    def sentences(self) -> list:
        return [item for item in self.items if isinstance(item, Sentence)]

    @property
    def num_words(self) -> int:
        return sum(len(s.words) for s in self.sentences)


def find_split_file(data_dir: str, split: str) -> str:
    """The file of a split in data_dir (train.txt/eng.train, dev.txt/valid.txt/eng.testa,
    test.txt/eng.testb: the first that exists); DataFormatError naming the candidates."""
    candidates = [os.path.join(data_dir, name) for name in SPLIT_FILES[split]]
    for path in candidates:
        if fileio.isfile(path):
            return path
    raise DataFormatError(f"--data_dir={data_dir}: no {split} file; looked for "
                          f"{', '.join(SPLIT_FILES[split])}")


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """(1-based number, text without the line end) of each line; UTF-8, BOM dropped."""
    with fileio.open_file(path, "rb") as reader:
        for number, raw in enumerate(reader, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataFormatError(f"{path}:{number}: not valid UTF-8 ({err.reason} at "
                                      f"byte {err.start}); convert the file to UTF-8 "
                                      "(e.g. iconv -f latin1 -t utf-8)") from None
            yield number, text.rstrip("\r\n")


def read_conll(path: str, *, require_tags: bool = True) -> ConllFile:
    """Reads a CoNLL-format file (see the module docstring).

    Args:
      path: the file.
      require_tags: a one-column file (words only) is an error (training and dev files
        need gold tags); otherwise it reads with the tag "O".

    Raises:
      DataFormatError naming the file and line.
    """
    items: list = []
    words: list[str] = []
    tags: list[str] = []
    first_line = 0
    document = 0
    num_columns = None
    column_line = 0

    def close_sentence():
        nonlocal words, tags
        if words:
            items.append(Sentence(tuple(words), tuple(tags), document, first_line))
            words, tags = [], []

    if not fileio.exists(path):
        raise DataFormatError(f"{path}: no such file")
    for number, text in _lines(path):
        stripped = text.strip(" \t")
        if not stripped:
            close_sentence()
            continue
        columns = _COLUMNS.split(stripped)
        if columns[0] == DOCSTART:
            close_sentence()
            items.append(DocumentStart(number))
            document += 1
            continue
        if num_columns is None:
            num_columns, column_line = len(columns), number
            if num_columns == 1 and require_tags:
                raise DataFormatError(
                    f"{path}:{number}: one column (a word and no tag); this file needs "
                    "the tag in the last column")
        elif len(columns) != num_columns:
            raise DataFormatError(
                f"{path}:{number}: {len(columns)} columns, but the first word line "
                f"({column_line}) has {num_columns}: {text!r}")
        if not words:
            first_line = number
        words.append(columns[0])
        tags.append(columns[-1] if num_columns > 1 else OUTSIDE)
    close_sentence()
    if num_columns is None:
        raise DataFormatError(f"{path}: no sentences (the file is empty or holds only "
                              "-DOCSTART- lines)")
    return ConllFile(path, items, num_columns, num_columns > 1)


# --- labels and tag schemes ------------------------------------------------------------------


def order_labels(labels: Iterable[str]) -> list[str]:
    """Label names in id order: "O" first (when present), then the others sorted."""
    labels = set(labels)
    rest = sorted(labels - {OUTSIDE})
    return ([OUTSIDE] if OUTSIDE in labels else []) + rest


def labels_from_sentences(conll: ConllFile) -> list[str]:
    """The tags of a (training) file, in `order_labels` order."""
    return order_labels(tag for s in conll.sentences for tag in s.tags)


def parse_label_list(value: str | Sequence[str]) -> tuple[str, ...]:
    """A --label_list value (comma-separated, or a sequence) as a tuple; UserError on
    blanks or repeats."""
    items = value.split(",") if isinstance(value, str) else list(value)
    labels = tuple(str(item).strip() for item in items)
    if not labels or any(not label for label in labels):
        raise UserError(f"--label_list={value!r}: empty label names")
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise UserError(f"--label_list repeats {repeated}")
    return labels


def check_tags(conll: ConllFile, label_list: Sequence[str], source: str) -> None:
    """Raises DataFormatError at the first tag of a tagged file not in `label_list`.

    Args:
      source: where the labels came from, for the message (e.g. "the training file").
    """
    if not conll.has_tags:
        return
    known = set(label_list)
    for sentence in conll.sentences:
        for offset, tag in enumerate(sentence.tags):
            if tag not in known:
                raise DataFormatError(
                    f"{conll.path}:{sentence.line + offset}: tag {tag!r} is not in the label "
                    f"list {list(label_list)} ({source}); give every tag with --label_list")


_CHUNK_TAG = re.compile(r"^([BIES])-(.+)$")


def detect_tag_scheme(label_list: Sequence[str], sentences: Sequence[Sentence] = ()) -> str:
    """The tagging scheme of a label set (and, to tell IOB1 from IOB2, the training data).

    Returns:
      "none" when some label is neither "O" nor `P-TYPE` with P in B, I, E, S (plain tags:
      POS, or anything conlleval's chunks do not describe); "IOBES" when S- or E- tags and
      B- or S- tags occur, "IOE" for E- without B-/S-; otherwise "IOB1" when a chunk in
      `sentences` starts with I- (or no data says otherwise and there is no B- tag),
      "IOB2" when every chunk starts with B-.
    """
    prefixes = set()
    for label in label_list:
        if label == OUTSIDE:
            continue
        match = _CHUNK_TAG.match(label)
        if match is None:
            return "none"
        prefixes.add(match.group(1))
    if prefixes & {"E", "S"}:
        return "IOBES" if prefixes & {"B", "S"} else "IOE"
    if "B" not in prefixes:
        return "IOB1"
    for sentence in sentences:
        previous = OUTSIDE
        for tag in sentence.tags:
            if tag.startswith("I-") and previous[2:] != tag[2:]:
                return "IOB1"  # a chunk opened by I-
            previous = tag
    return "IOB2" if sentences else "IOB1"


def _chunk_part(tag: str) -> tuple[str, str]:
    """(prefix, type) of a chunk tag ("B-PER" -> ("B", "PER")); ("O", "") otherwise."""
    match = _CHUNK_TAG.match(tag)
    return (match.group(1), match.group(2)) if match else (OUTSIDE, "")


def _scheme_breaks(tags: Sequence[str], scheme: str) -> Iterator[tuple[int, str]]:
    """(word index, what is wrong) of each tag of one sentence that `scheme` does not allow
    where it stands (IOB2, IOBES). Not checked: IOB1 and IOE, whose variants allow every
    order of their tags (and a label list alone cannot tell IOB1 from IOB2)."""
    parts = [_chunk_part(tag) for tag in tags] + [(OUTSIDE, "")]
    for i, tag in enumerate(tags):
        (prefix, kind), following = parts[i], parts[i + 1]
        previous = parts[i - 1] if i else (OUTSIDE, "")
        inside = previous[0] in ("B", "I") and previous[1] == kind
        before = tags[i - 1] if i else "the sentence start"
        after = tags[i + 1] if i + 1 < len(tags) else "the sentence end"
        problems = []
        if scheme == "IOB2" and prefix == "I" and not inside:
            problems.append(f"after {before} (IOB2 opens every chunk with B-)")
        if scheme == "IOBES" and prefix in ("I", "E") and not inside:
            problems.append(f"after {before} (IOBES opens a chunk with B-, or S- alone)")
        if scheme == "IOBES" and prefix in ("B", "I") and not (
                following[0] in ("I", "E") and following[1] == kind):
            problems.append(f"before {after} (IOBES closes a chunk with E-; one word: S-)")
        if problems:
            yield i, f"{tag} " + " and ".join(problems)


def tag_scheme_breaks(conll: ConllFile, scheme: str) -> list[tuple[int, str]]:
    """(1-based line, what is wrong) of each tag of a tagged file that does not follow
    `scheme` (the one `detect_tag_scheme` gave the labels): a file mixing schemes, e.g.
    B-/I- chunks and S- tags in one file, read as IOBES. Empty for "none", IOB1 and IOE."""
    if not conll.has_tags or scheme not in ("IOB2", "IOBES"):
        return []
    return [(sentence.line + i, what) for sentence in conll.sentences
            for i, what in _scheme_breaks(sentence.tags, scheme)]


def warn_tag_scheme_breaks(conll: ConllFile, scheme: str, shown: int = 5) -> int:
    """Logs a warning naming the file, how many tags break `scheme` and the first `shown`
    of them with their lines (`tag_scheme_breaks`); returns how many there are.

    A warning, not an error: conlleval's chunk rules still read such a file, but its
    entities (and F1) may not be what the tags meant.
    """
    breaks = tag_scheme_breaks(conll, scheme)
    if breaks:
        examples = "; ".join(f"line {line}: {what}" for line, what in breaks[:shown])
        logging.warning(
            "%s: %d tag(s) do not follow the %s scheme of the labels, as if the file mixed "
            "tag schemes; entities are read with conlleval's rules, which may not be what "
            "these tags meant. %s%s", conll.path, len(breaks), scheme, examples,
            " ..." if len(breaks) > shown else "")
    return len(breaks)


def is_chunk_scheme(scheme: str) -> bool:
    """Whether conlleval's chunk precision/recall/F1 describe this scheme."""
    return scheme != "none"


# --- 2. Features ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WindowConfig:
    """How sentences become model inputs.

    Attributes:
      max_seq_length: the padded length, [CLS] and [SEP] included (at least 3).
      doc_stride: pieces between the starts of two windows of a long sentence; None: half
        a window (max_seq_length - 2) // 2, so every piece but the first and last half
        window appears twice.
      document_context: fill each window's remaining room with the neighbouring pieces of
        the same document (the paper's "maximal document context").
    """

    max_seq_length: int = 128
    doc_stride: int | None = None
    document_context: bool = False

    def __post_init__(self):
        if self.max_seq_length < 3:
            raise UserError(f"--max_seq_length={self.max_seq_length}: a window needs at "
                            "least [CLS], one piece and [SEP] (3)")
        if self.doc_stride is not None and self.doc_stride < 1:
            raise UserError(f"--doc_stride={self.doc_stride} must be at least 1")

    @property
    def room(self) -> int:
        """Pieces a window holds."""
        return self.max_seq_length - 2

    @property
    def stride(self) -> int:
        return self.doc_stride if self.doc_stride is not None else max(1, self.room // 2)


@dataclasses.dataclass
class TaggingFeature:
    """One window's model inputs; every list has max_seq_length entries.

    `label_weights` is 1 on the first piece of each word labelled in this window: for
    training every sentence word whose first piece is in the window; for evaluation and
    prediction only the words this window scores (their max-context window), so every
    word is scored exactly once. `word_index` is the word's position in its sentence
    where `label_weights` is 1 (0 elsewhere).
    """

    sentence_index: int
    input_ids: list
    input_mask: list
    segment_ids: list
    label_ids: list
    label_weights: list
    word_index: list


class _PieceCache:
    """Word -> WordPiece ids (a word that tokenizes to nothing becomes [UNK])."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.cache: dict[str, list[int]] = {}
        self.num_unknown_words = 0
        try:
            self.unk, self.cls, self.sep = tokenizer.convert_tokens_to_ids(
                [UNKNOWN_PIECE, "[CLS]", "[SEP]"])
        except KeyError as err:
            raise DataFormatError(f"the vocab file lacks the special token {err}") from None

    def ids(self, word: str) -> list[int]:
        ids = self.cache.get(word)
        if ids is None:
            pieces = self.tokenizer.tokenize(word)
            ids = self.tokenizer.convert_tokens_to_ids(pieces) if pieces else [self.unk]
            self.cache[word] = ids
        if ids == [self.unk]:
            self.num_unknown_words += 1
        return ids


@dataclasses.dataclass
class _Tokenized:
    """A sentence's piece ids and where each word's first piece is."""

    ids: list
    first_piece: list


def _tokenize(sentence: Sentence, pieces: _PieceCache) -> _Tokenized:
    ids, first = [], []
    for word in sentence.words:
        first.append(len(ids))
        ids.extend(pieces.ids(word))
    return _Tokenized(ids, first)


def _context_sizes(room: int, before: int, after: int) -> tuple[int, int]:
    """(pieces taken before, after) to fill `room`: half each, the rest from the side that
    has more."""
    right = min(after, room - min(before, room // 2))
    left = min(before, room - right)
    return left, right


def sentence_windows(conll: ConllFile, tokenizer, label_list: Sequence[str],
                     config: WindowConfig, *, is_training: bool,
                     stats: dict | None = None) -> Iterator[TaggingFeature]:
    """The windows of every sentence of `conll`, in file order.

    Args:
      conll: the file (tags must be in `label_list` when it has tags).
      tokenizer: a `data_prep.tokenization.FullTokenizer`.
      label_list: label names in id order (a file without tags gets label id 0).
      config: window settings.
      is_training: label every word in every window holding its first piece; otherwise
        only in its max-context window.
      stats: if given, filled with counts (windows, long sentences, unknown words, ...).
    """
    label_map = {label: i for i, label in enumerate(label_list)}
    pieces = _PieceCache(tokenizer)
    sentences = conll.sentences
    tokenized = [_tokenize(s, pieces) for s in sentences]
    # Each document's pieces laid end to end, and where each sentence starts in them.
    stream_of, offset_of = {}, []
    for sentence, tok in zip(sentences, tokenized):
        key = sentence.document if config.document_context else len(offset_of)
        stream = stream_of.setdefault(key, [])
        offset_of.append((key, len(stream)))
        stream.extend(tok.ids)
    counts = {"num_windows": 0, "num_long_sentences": 0, "max_sentence_pieces": 0,
              "num_words": 0}
    for index, (sentence, tok) in enumerate(zip(sentences, tokenized)):
        key, start_in_stream = offset_of[index]
        stream = stream_of[key]
        spans = doc_spans_for(len(tok.ids), config.room, config.stride)
        best = None if is_training else max_context_span_index(spans, len(tok.ids))
        counts["num_long_sentences"] += len(spans) > 1
        counts["max_sentence_pieces"] = max(counts["max_sentence_pieces"], len(tok.ids))
        counts["num_words"] += len(sentence.words)
        for span_index, (span_start, span_length) in enumerate(spans):
            first = start_in_stream + span_start
            last = first + span_length  # exclusive
            before, after = _context_sizes(config.room - span_length, first,
                                           len(stream) - last)
            window = stream[first - before:last + after]
            n = len(window) + 2
            pad = config.max_seq_length - n
            labels = [0] * config.max_seq_length
            weights = [0] * config.max_seq_length
            word_index = [0] * config.max_seq_length
            for w, piece in enumerate(tok.first_piece):
                if not span_start <= piece < span_start + span_length:
                    continue
                if best is not None and best[piece] != span_index:
                    continue
                position = 1 + before + piece - span_start
                labels[position] = label_map[sentence.tags[w]] if conll.has_tags else 0
                weights[position] = 1
                word_index[position] = w
            counts["num_windows"] += 1
            yield TaggingFeature(
                sentence_index=index,
                input_ids=[pieces.cls] + window + [pieces.sep] + [0] * pad,
                input_mask=[1] * n + [0] * pad,
                segment_ids=[0] * config.max_seq_length,
                label_ids=labels, label_weights=weights, word_index=word_index)
    counts["num_unknown_words"] = pieces.num_unknown_words
    if stats is not None:
        stats.update(counts)


# --- 3. Records -------------------------------------------------------------------------------

_INT64 = features_lib.INT64
TAGGING_SCHEMA = features_lib.RecordSchema(
    kind="tagging",
    features=(
        features_lib.FeatureSpec("input_ids", _INT64, "max_seq_length"),
        features_lib.FeatureSpec("input_mask", _INT64, "max_seq_length"),
        features_lib.FeatureSpec("segment_ids", _INT64, "max_seq_length"),
        features_lib.FeatureSpec("label_ids", _INT64, "max_seq_length"),
        features_lib.FeatureSpec("label_weights", _INT64, "max_seq_length"),
        features_lib.FeatureSpec("word_index", _INT64, "max_seq_length"),
        features_lib.FeatureSpec("sentence_index", _INT64, 1),
    ),
)
# The per-token features (cut to a batch's length bucket with the encoder's inputs).
SEQUENCE_FEATURES = ("input_ids", "input_mask", "segment_ids", "label_ids", "label_weights",
                     "word_index")


def record_values(feature: TaggingFeature) -> dict:
    """The int64 values of one record, keyed by `TAGGING_SCHEMA`'s names."""
    values = {name: getattr(feature, name) for name in SEQUENCE_FEATURES}
    values["sentence_index"] = [feature.sentence_index]
    return values


@dataclasses.dataclass
class PreparedTagging(CachedRecords):
    """A split's records (written or reused; `tasks.common.record_cache.CachedRecords`) and
    the file they came from.

    Attributes:
      metadata: counts (num_sentences, num_words, num_windows, ...) and the cache key.
      conll: the split's file as read (what predictions are written against).
    """

    conll: ConllFile

    @property
    def num_sentences(self) -> int:
        return self.metadata["num_sentences"]


def _cache_key(conll: ConllFile, split, *, vocab_file, do_lower_case, config, label_list,
               is_training) -> dict:
    return cache_key(format_version=CACHE_FORMAT_VERSION, split=split,
                     source=fileio.fingerprint(conll.path),
                     vocab_sha256=fileio.sha256(vocab_file),
                     do_lower_case=bool(do_lower_case), window=dataclasses.asdict(config),
                     label_list=list(label_list), is_training=bool(is_training),
                     shuffle_seed=TRAIN_SHUFFLE_SEED if is_training else None)


def prepare_tagging_records(conll: ConllFile, split: str, output_dir: str, *,
                            vocab_file: str, do_lower_case: bool, config: WindowConfig,
                            label_list: Sequence[str], is_training: bool,
                            tokenizer=None) -> PreparedTagging:
    """Writes a split's windows as TFRecords in output_dir, or reuses the ones there.

    `{split}.tf_record` and `{split}.tf_record.metadata.json` (written last) are reused
    while the source file (path, size, mtime), the vocab (sha256), do_lower_case, the
    window settings, the label list and is_training are unchanged. Training windows are
    shuffled with `TRAIN_SHUFFLE_SEED` before they are written.

    Args:
      conll: the split's file, read and checked against `label_list`.
      split: "train", "dev" or "test" (the file names).
      tokenizer: an already built FullTokenizer for vocab_file/do_lower_case (optional).
    """
    from data_prep import tokenization

    cache = RecordCache.at(output_dir, f"{split}.tf_record")
    key = _cache_key(conll, split, vocab_file=vocab_file, do_lower_case=do_lower_case,
                     config=config, label_list=label_list, is_training=is_training)

    def write(writer) -> dict:
        stats: dict = {}
        windows = sentence_windows(conll, tokenizer or tokenization.FullTokenizer(
            vocab_file, do_lower_case=do_lower_case), label_list, config,
            is_training=is_training, stats=stats)
        if is_training:
            windows = list(windows)
            random.Random(TRAIN_SHUFFLE_SEED).shuffle(windows)
        encoder = TAGGING_SCHEMA.encoder(max_seq_length=config.max_seq_length)
        for feature in windows:
            writer.write(encoder.encode(record_values(feature)))
        sentences = conll.sentences
        logging.info("%s: %d sentences, %d words -> %d windows (%d sentences longer than "
                     "one window, %d words as [UNK]) in %s", conll.path, len(sentences),
                     stats["num_words"], stats["num_windows"], stats["num_long_sentences"],
                     stats["num_unknown_words"], cache.record_file)
        return {"split": split, "source_file": conll.path, "label_list": list(label_list),
                "has_tags": conll.has_tags, "num_sentences": len(sentences),
                "num_documents": sum(isinstance(i, DocumentStart) for i in conll.items),
                **stats}

    metadata, reused = cache.records(key, write)
    return PreparedTagging(cache.record_file, cache.metadata_file, metadata, reused, conll)


# --- prediction files -------------------------------------------------------------------------


def predictions_text(conll: ConllFile, predicted: Sequence[Sequence[str]]) -> str:
    """The prediction file: `word gold predicted` per word, a blank line after each sentence,
    `-DOCSTART- O O` (and a blank line) where the input had a document start: conlleval's
    input format. Gold is the file's tag ("O" for a file without tags).

    Args:
      predicted: per sentence of `conll.sentences`, the predicted tag of each word.
    """
    out = []
    sentences = iter(zip(conll.sentences, predicted))
    for item in conll.items:
        if isinstance(item, DocumentStart):
            out.append(f"{DOCSTART} {OUTSIDE} {OUTSIDE}\n\n")
            continue
        sentence, tags = next(sentences)
        if len(tags) != len(sentence.words):
            raise ValueError(f"{conll.path}:{sentence.line}: {len(tags)} predictions for "
                             f"{len(sentence.words)} words")
        out.extend(f"{w} {g} {p}\n" for w, g, p in zip(sentence.words, sentence.tags, tags))
        out.append("\n")
    return "".join(out)


def evaluation_sequence(conll: ConllFile, predicted: Sequence[Sequence[str]]) -> list:
    """What conlleval reads from `predictions_text`: per sentence (and per document start,
    a one-token sentence O/O) the (gold, predicted) pairs."""
    out = []
    sentences = iter(zip(conll.sentences, predicted))
    for item in conll.items:
        if isinstance(item, DocumentStart):
            out.append([(OUTSIDE, OUTSIDE)])
        else:
            sentence, tags = next(sentences)
            out.append(list(zip(sentence.tags, tags)))
    return out
