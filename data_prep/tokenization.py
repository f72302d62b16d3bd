"""The tokenizer the tools use: vocab files and `FullTokenizer`, exactly the original's output.

`FullTokenizer.tokenize` works on whole lines with C-level string operations
(str.translate, str.lower, NFD, str.split) whose per-character tables are filled from the
reference predicates (`data_prep.reference_tokenization`) the first time a character is
seen; `FullTokenizer.tokenize_exact` runs the reference itself. Why the two agree is
argued in `_FastBasic`; tests compare both with Google's code on every code point.
The command line is `data_prep.bert_tokenize`.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import unicodedata

from data_prep.cli import UserError
from data_prep.reference_tokenization import (
    MAX_INPUT_CHARS_PER_WORD,
    UNK_TOKEN,
    BasicTokenizer,
    WordpieceTokenizer,
    convert_to_unicode,
    is_chinese_char,
    is_control,
    is_punctuation,
    is_whitespace,
)

REQUIRED_SPECIAL_TOKENS = ("[UNK]", "[CLS]", "[SEP]", "[MASK]")
# What every encoded input needs (fine-tuning, features, serving): [CLS] and [SEP] frame
# it, [UNK] stands for a word the vocab cannot spell. [MASK] is pretraining's.
ENCODING_TOKENS = ("[UNK]", "[CLS]", "[SEP]")


class VocabError(UserError):
    """A vocabulary file is missing, unreadable or lacks required tokens."""


def load_vocab(vocab_file: str) -> "collections.OrderedDict[str, int]":
    """Loads a vocab file (one token per line) into an ordered token->id dict.

    As the reference code (bert-tensorflow, reading through TensorFlow's GFile): lines end
    at "\n" only, every "\r" is dropped (GFile's readline discards it wherever it is),
    each line is then stripped, and ids are dense in order of first appearance: a
    repeated token keeps its first id and does not use up an id (logged as a warning).
    """
    vocab: collections.OrderedDict[str, int] = collections.OrderedDict()
    from data_prep import fileio

    try:
        with fileio.open_file(vocab_file, "rb") as reader:  # local, gs://, ram://, ...
            raw = reader.read()
    except Exception as err:  # noqa: BLE001 - OSError locally, tf.errors for URLs
        if not isinstance(err, OSError) and type(err).__module__.split(".")[0] != \
                "tensorflow":
            raise
        raise VocabError(f"cannot read vocab file {vocab_file!r}: {err}") from err
    from data_prep import text_input

    try:
        text = text_input.decode_utf8(raw, vocab_file)
    except text_input.InputError as err:
        raise VocabError(f"vocab file {err}") from None
    lines = text.replace("\r", "").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    duplicates = []
    for line_number, line in enumerate(lines, start=1):
        token = line.strip()
        if token in vocab:
            duplicates.append(line_number)
            continue
        vocab[token] = len(vocab)
    if duplicates:
        logging.getLogger(__name__).warning(
            "%s: %d repeated token(s) ignored (first at line %d); ids are dense in order "
            "of first appearance", vocab_file, len(duplicates), duplicates[0])
    return vocab


def check_vocab(vocab, vocab_file: str, required=REQUIRED_SPECIAL_TOKENS) -> None:
    """Raises VocabError naming the file when the vocab lacks tokens the tools need."""
    if not vocab:
        raise VocabError(f"vocab file {vocab_file!r} is empty")
    missing = [t for t in required if t not in vocab]
    if missing:
        raise VocabError(
            f"vocab file {vocab_file!r} lacks required token(s) {', '.join(missing)} "
            f"({len(vocab)} tokens read); is it a BERT vocab.txt?"
        )


def check_case(vocab, vocab_file: str, do_lower_case: bool, flag: str = "--do_lower_case") -> None:
    """Raises VocabError naming `flag` when `do_lower_case` does not fit the vocab.

    Lower-cased text never produces a token with a capital letter, so a vocab where such
    tokens are common (over 1% of the tokens outside `[...]`) was learned cased; a vocab
    with none at all among many lower-case ones was learned lower-cased, and cased text
    would reach it as [UNK] and stray pieces. (The original checked the checkpoint's
    file name against Google's releases instead; this reads the vocab itself.)
    """
    tokens = [t for t in vocab if not (t.startswith("[") and t.endswith("]"))]
    capital = [t for t in tokens if any(c.isupper() for c in t)]
    lower = sum(1 for t in tokens if any(c.islower() for c in t))
    if do_lower_case and len(capital) > 0.01 * len(tokens):
        raise VocabError(
            f"{flag}=true but vocab file {vocab_file!r} is cased: {len(capital)} of its "
            f"{len(tokens)} tokens hold capital letters (e.g. {capital[0]!r}), which "
            f"lower-cased text never produces; pass {flag}=false")
    if not do_lower_case and not capital and lower >= 100:
        raise VocabError(
            f"{flag}=false but vocab file {vocab_file!r} is uncased: none of its "
            f"{len(tokens)} tokens holds a capital letter, so capitalised words would "
            f"become [UNK] or stray pieces; pass {flag}=true")


def convert_by_vocab(vocab, items):
    """Maps a sequence of tokens or ids through `vocab` (KeyError for unknown items)."""
    return [vocab[item] for item in items]




# --- The fast path ---------------------------------------------------------------------


def clean_value(cp: int):
    """What `_clean_text` (plus Python whitespace -> " ") makes of one code point, as a
    str.translate value: None (deleted), " " (a space), or the code point (kept)."""
    char = chr(cp)
    if cp == 0 or cp == 0xFFFD or is_control(char):
        return None
    if (is_whitespace(char) or char.isspace()) and char != " ":
        return " "
    return cp


def _split_value(cp: int):
    """A punctuation character between spaces (the reference splits it off), else kept."""
    char = chr(cp)
    return f" {char} " if is_punctuation(char) else cp


def _strip_value(cp: int):
    """None for a nonspacing mark (accent stripping removes category Mn), else kept."""
    return None if unicodedata.category(chr(cp)) == "Mn" else cp


def _chinese_value(cp: int):
    """A CJK ideograph between spaces (the reference's `_tokenize_chinese_chars`)."""
    return f" {chr(cp)} " if is_chinese_char(cp) else cp


class _CharTable(dict):
    """A str.translate table filled on first sight of each code point by `rule`.

    str.translate looks each character up with `table[cp]`, which calls `__missing__`
    once per new code point; afterwards the lookup stays in C. Text holds a few thousand
    distinct characters, so this costs milliseconds where classifying all 1.1M code points
    up front cost ~0.3 s (bench/RESULTS.md).
    """

    __slots__ = ("rule",)

    def __init__(self, rule):
        super().__init__()
        self.rule = rule

    def __missing__(self, cp: int):
        value = self[cp] = self.rule(cp)
        return value


class _FastBasic:
    r"""BasicTokenizer on whole lines with C-level passes, identical to the reference.

    Its per-character tables are filled lazily from the reference predicates
    (`_CharTable`). Why whole-line operations give the reference's per-token result:
    - cleaning is per character: one translate table deletes what `_clean_text` drops and
      maps to " " what it turns into a space. U+2028/U+2029 (the only Python whitespace
      left after cleaning) are mapped to " " too: str.split() splits on them either way.
    - CJK spacing is per character (a translate table putting spaces around ideographs).
    - str.lower() is per character except Final_Sigma, whose context stops at characters
      that are neither cased nor case-ignorable, such as the spaces between tokens, so
      lowering the line equals lowering each token. NFD is per character plus canonical
      reordering of combining marks, which never crosses a space (combining class 0).
      Removing Mn is per character. These run after cleaning and CJK spacing, as in the
      reference, so characters they create (U+1FEF -> "`") are classified afterwards.
    - the reference's punctuation split, " ".join and str.split() yield every punctuation
      character alone and every maximal run of other non-whitespace characters: putting
      spaces around each punctuation character (a translate table) and str.split() give
      exactly that.
    FullTokenizer applies `clean` to the line and `split_token` to each whitespace chunk,
    which is the reference's own structure, so caching per chunk is exact.
    """

    def __init__(self):
        self.clean_table = _CharTable(clean_value)
        self.chinese_table = _CharTable(_chinese_value)
        self.split_table = _CharTable(_split_value)
        self.strip_marks_table = _CharTable(_strip_value)

    def clean(self, text: str) -> str:
        """`_clean_text` then `_tokenize_chinese_chars` of the reference, on a whole line."""
        if text.isascii():
            # isprintable() is False exactly for the ASCII characters cleaning changes.
            return text if text.isprintable() else text.translate(self.clean_table)
        return text.translate(self.clean_table).translate(self.chinese_table)

    def split_token(self, token: str, do_lower_case: bool) -> list[str]:
        """Lower-casing, accent stripping and punctuation split of cleaned text."""
        if do_lower_case:
            token = token.lower()
        return self.split_lowered(token, do_lower_case)

    def split_lowered(self, token: str, do_lower_case: bool) -> list[str]:
        """`split_token` for text that is already lower-cased when `do_lower_case`."""
        if token.isascii() and token.isalnum():  # no punctuation, no space: one word
            return [token]
        if do_lower_case and not token.isascii():
            token = unicodedata.normalize("NFD", token).translate(self.strip_marks_table)
        return token.translate(self.split_table).split()

    def tokenize(self, text: str, do_lower_case: bool) -> list[str]:
        """The reference BasicTokenizer's output for a whole line."""
        return self.split_token(self.clean(text), do_lower_case)


@functools.lru_cache(maxsize=1)
def _fast_basic() -> _FastBasic:
    return _FastBasic()


def is_blank(text: str) -> bool:
    """True when `text` has nothing the tokenizer keeps: only whitespace and characters it
    deletes (control and format characters, NUL, U+FFFD), so it tokenizes to no token."""
    return not _fast_basic().clean(text).split()


def count_words(lines, do_lower_case: bool) -> collections.Counter:
    """Counts the words `BasicTokenizer` produces on `lines`.

    Exactly `Counter(w for line in lines for w in BasicTokenizer(...).tokenize(line))`,
    but each distinct space-separated chunk is tokenized once: the basic tokenizer treats
    an ASCII space as a plain word boundary (cleaning, CJK spacing, lower-casing and
    punctuation splitting all act within a chunk), so tokenizing chunks and concatenating
    gives the same words as tokenizing the line.
    """
    chunks: collections.Counter = collections.Counter()
    for line in lines:
        chunks.update(line.split(" "))
    basic = BasicTokenizer(do_lower_case=do_lower_case)
    words: collections.Counter = collections.Counter()
    for chunk, count in chunks.items():
        for word in basic.tokenize(chunk):
            words[word] += count
    return words


def basic_tokenize(text, do_lower_case: bool) -> list[str]:
    """BasicTokenizer's exact output for `text`, through the fast whole-line path."""
    return _fast_basic().tokenize(convert_to_unicode(text), do_lower_case)


class FullTokenizer:
    """Basic tokenization followed by WordPiece; the original's public API.

    `tokenize` is the fast path (whole-line string passes plus bounded caches of
    whitespace chunk -> WordPieces and word -> WordPieces; `tokenize_to_ids` adds chunk ->
    ids); `tokenize_exact` is the character-by-character reference. Both give the
    original's output. The caches assume the vocab is not mutated after construction.
    """

    # Each cache is cleared when it reaches this size, bounding memory on huge corpora.
    MAX_CACHED_WORDS = 300_000

    def __init__(self, vocab_file: str, do_lower_case: bool = True):
        self.vocab = load_vocab(vocab_file)
        self.inv_vocab = {v: k for k, v in self.vocab.items()}
        self.do_lower_case = do_lower_case
        self.basic_tokenizer = BasicTokenizer(do_lower_case=do_lower_case)
        self.wordpiece_tokenizer = WordpieceTokenizer(vocab=self.vocab)
        self._fast = _fast_basic()
        self._max_token_chars = max((len(t) for t in self.vocab), default=0)
        # Whitespace-separated chunk of cleaned text -> its WordPieces, and word -> pieces.
        self._chunk_cache: dict[str, tuple[str, ...]] = {}
        self._word_cache: dict[str, tuple[str, ...]] = {}
        self._chunk_id_cache: dict[str, tuple[int, ...]] = {}

    def tokenize(self, text) -> list[str]:
        """WordPiece tokens of `text` (str or UTF-8 bytes), fast path.

        The reference splits cleaned text on whitespace and then handles each chunk on its
        own (lower-casing, accents, punctuation, WordPiece), so a chunk's tokens depend on
        the chunk alone and can be cached (keyed after lower-casing the whole line).
        """
        chunks = self._chunks(text)
        found = list(map(self._chunk_cache.get, chunks))
        if None in found:
            for index, pieces in enumerate(found):
                if pieces is None:
                    found[index] = self._chunk_pieces(chunks[index])
        return list(itertools.chain.from_iterable(found))

    def tokenize_to_ids(self, text) -> list[int]:
        """`convert_tokens_to_ids(tokenize(text))`, without building the token list: a
        third bounded cache maps a chunk straight to its ids (the pretraining data
        tools need only ids)."""
        chunks = self._chunks(text)
        found = list(map(self._chunk_id_cache.get, chunks))
        if None in found:
            vocab, id_cache = self.vocab, self._chunk_id_cache
            for index, ids in enumerate(found):
                if ids is None:
                    chunk = chunks[index]
                    pieces = self._chunk_cache.get(chunk)
                    if pieces is None:
                        pieces = self._chunk_pieces(chunk)
                    ids = found[index] = tuple([vocab[piece] for piece in pieces])
                    if len(id_cache) >= self.MAX_CACHED_WORDS:
                        id_cache.clear()
                    id_cache[chunk] = ids
        return list(itertools.chain.from_iterable(found))

    def _chunks(self, text) -> list[str]:
        """The whitespace-separated chunks of cleaned (and lower-cased) text: the cache
        keys of `tokenize` and `tokenize_to_ids`."""
        if type(text) is not str:
            text = convert_to_unicode(text)
        if not (text.isascii() and text.isprintable()):
            text = self._fast.clean(text)
        if self.do_lower_case:
            text = text.lower()  # equal to lowering each chunk (see _FastBasic)
        return text.split()

    def _chunk_pieces(self, chunk: str) -> tuple[str, ...]:
        if (chunk.isascii() and chunk.isalnum() and chunk in self.vocab
                and len(chunk) <= MAX_INPUT_CHARS_PER_WORD):
            return self._cache_chunk(chunk, (chunk,))  # a plain word of the vocab
        word_cache = self._word_cache
        pieces: list[str] = []
        for word in self._fast.split_lowered(chunk, self.do_lower_case):
            word_pieces = word_cache.get(word)
            if word_pieces is None:
                word_pieces = self._wordpiece_bounded(word)
                if len(word_cache) >= self.MAX_CACHED_WORDS:
                    word_cache.clear()
                word_cache[word] = word_pieces
            pieces += word_pieces
        return self._cache_chunk(chunk, tuple(pieces))

    def _cache_chunk(self, chunk: str, pieces: tuple[str, ...]) -> tuple[str, ...]:
        if len(self._chunk_cache) >= self.MAX_CACHED_WORDS:
            self._chunk_cache.clear()
        self._chunk_cache[chunk] = pieces
        return pieces

    def tokenize_exact(self, text) -> list[str]:
        """WordPiece tokens of `text` by the character-by-character reference path."""
        split_tokens = []
        for token in self.basic_tokenizer.tokenize(text):
            split_tokens.extend(self.wordpiece_tokenizer.tokenize(token))
        return split_tokens

    def _wordpiece_bounded(self, word: str) -> tuple[str, ...]:
        """Greedy longest-match-first like WordpieceTokenizer, but never trying a candidate
        longer than the longest vocab entry (no such candidate can be in the vocab)."""
        if len(word) > MAX_INPUT_CHARS_PER_WORD:
            return (UNK_TOKEN,)
        vocab = self.vocab
        if word in vocab:  # the greedy search would take the whole word first
            return (word,)
        longest = self._max_token_chars
        pieces = []
        start = 0
        while start < len(word):
            if start == 0:
                end = min(len(word), longest)
            else:
                end = min(len(word), start + max(longest - 2, 0))
            while start < end:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in vocab:
                    pieces.append(piece)
                    break
                end -= 1
            else:
                return (UNK_TOKEN,)
            start = end
        return tuple(pieces)

    def convert_tokens_to_ids(self, tokens):
        return convert_by_vocab(self.vocab, tokens)

    def convert_ids_to_tokens(self, ids):
        return convert_by_vocab(self.inv_vocab, ids)
