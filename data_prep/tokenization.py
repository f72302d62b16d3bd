"""WordPiece tokenization with exactly the behaviour of Google's original BERT tokenizer.

The reference ("exact") path below is a character-by-character statement of the
original algorithm. `FullTokenizer.tokenize` uses a fast path that works on whole lines
with C-level string operations (translate tables, regexes, str.lower, NFD) built once from
the very same character predicates; `FullTokenizer.tokenize_exact` keeps the reference.
Why the two agree is argued in `_FastBasic`; tests compare both with Google's code.

Also a CLI: `python -m data_prep.tokenization --vocab_file=V --do_lower_case=true|false`
turns each stdin line (split on "\n" only) into one line of space-separated WordPieces.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import re
import sys
import unicodedata

# The original's limit on a word's length in characters before it becomes [UNK].
MAX_INPUT_CHARS_PER_WORD = 200
UNK_TOKEN = "[UNK]"
REQUIRED_SPECIAL_TOKENS = ("[UNK]", "[CLS]", "[SEP]", "[MASK]")


class VocabError(ValueError):
    """A vocabulary file is missing, unreadable or lacks required tokens."""


def convert_to_unicode(text) -> str:
    """Returns `text` as str, decoding UTF-8 bytes (invalid bytes are an error)."""
    if isinstance(text, str):
        return text
    if isinstance(text, bytes):
        return text.decode("utf-8")
    raise TypeError(f"Unsupported string type: {type(text)}")


def load_vocab(vocab_file: str) -> "collections.OrderedDict[str, int]":
    """Loads a vocab file (one token per line) into an ordered token->id dict.

    As the reference code (bert-tensorflow, reading through TensorFlow's GFile): lines end
    at "\n" only, every "\r" is dropped (GFile's readline discards it wherever it is),
    each line is then stripped, and ids are dense in order of first appearance: a
    repeated token keeps its first id and does not use up an id (logged as a warning).
    """
    vocab: collections.OrderedDict[str, int] = collections.OrderedDict()
    try:
        with open(vocab_file, "rb") as reader:
            raw = reader.read()
    except OSError as err:
        raise VocabError(f"cannot read vocab file {vocab_file!r}: {err}") from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise VocabError(f"{vocab_file}:{line}: vocab file is not valid UTF-8") from err
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


def convert_by_vocab(vocab, items):
    """Maps a sequence of tokens or ids through `vocab` (KeyError for unknown items)."""
    return [vocab[item] for item in items]


def whitespace_tokenize(text: str) -> list[str]:
    """Strips and splits on Python whitespace, as the original does."""
    text = text.strip()
    if not text:
        return []
    return text.split()


def _is_whitespace(char: str) -> bool:
    """Space, tab, newline, carriage return and Unicode category Zs."""
    if char in (" ", "\t", "\n", "\r"):
        return True
    return unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
    """Categories Cc and Cf, except tab, newline and carriage return."""
    if char in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char: str) -> bool:
    """ASCII symbol ranges (e.g. $, ^, `) and every Unicode P* category."""
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_chinese_char(cp: int) -> bool:
    """The CJK Unified Ideographs blocks the original splits into single characters."""
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


class BasicTokenizer:
    """Text cleaning, CJK splitting, optional lower-casing + accent stripping, punctuation split."""

    def __init__(self, do_lower_case: bool = True):
        self.do_lower_case = do_lower_case

    def tokenize(self, text) -> list[str]:
        text = convert_to_unicode(text)
        text = self._clean_text(text)
        text = self._tokenize_chinese_chars(text)
        split_tokens: list[str] = []
        for token in whitespace_tokenize(text):
            if self.do_lower_case:
                token = self._run_strip_accents(token.lower())
            split_tokens.extend(self._run_split_on_punc(token))
        return whitespace_tokenize(" ".join(split_tokens))

    @staticmethod
    def _run_strip_accents(text: str) -> str:
        text = unicodedata.normalize("NFD", text)
        return "".join(c for c in text if unicodedata.category(c) != "Mn")

    @staticmethod
    def _run_split_on_punc(text: str) -> list[str]:
        output: list[list[str]] = []
        start_new_word = True
        for char in text:
            if _is_punctuation(char):
                output.append([char])
                start_new_word = True
            else:
                if start_new_word:
                    output.append([])
                start_new_word = False
                output[-1].append(char)
        return ["".join(x) for x in output]

    @staticmethod
    def _tokenize_chinese_chars(text: str) -> str:
        output = []
        for char in text:
            if _is_chinese_char(ord(char)):
                output.extend((" ", char, " "))
            else:
                output.append(char)
        return "".join(output)

    @staticmethod
    def _clean_text(text: str) -> str:
        output = []
        for char in text:
            cp = ord(char)
            if cp == 0 or cp == 0xFFFD or _is_control(char):
                continue
            output.append(" " if _is_whitespace(char) else char)
        return "".join(output)


class WordpieceTokenizer:
    """Greedy longest-match-first WordPiece with `##` continuations."""

    def __init__(self, vocab, unk_token: str = UNK_TOKEN,
                 max_input_chars_per_word: int = MAX_INPUT_CHARS_PER_WORD):
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word

    def tokenize(self, text) -> list[str]:
        output_tokens: list[str] = []
        for token in whitespace_tokenize(convert_to_unicode(text)):
            output_tokens.extend(self.tokenize_word(token))
        return output_tokens

    def tokenize_word(self, word: str) -> list[str]:
        """WordPiece pieces of one whitespace-free word."""
        if len(word) > self.max_input_chars_per_word:
            return [self.unk_token]
        sub_tokens = []
        start = 0
        while start < len(word):
            end = len(word)
            cur_substr = None
            while start < end:
                substr = word[start:end]
                if start > 0:
                    substr = "##" + substr
                if substr in self.vocab:
                    cur_substr = substr
                    break
                end -= 1
            if cur_substr is None:
                return [self.unk_token]
            sub_tokens.append(cur_substr)
            start = end
        return sub_tokens


def _char_class(code_points) -> str:
    """A regex character class body ("a-z...") for a sorted iterable of code points."""
    parts = []
    run_start = previous = None
    for cp in code_points:
        if previous is not None and cp == previous + 1:
            previous = cp
            continue
        if run_start is not None:
            parts.append((run_start, previous))
        run_start = previous = cp
    if run_start is not None:
        parts.append((run_start, previous))
    return "".join(
        re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}"
        for a, b in parts
    )


class _FastBasic:
    r"""BasicTokenizer on whole lines with C-level passes, identical to the reference.

    Built once per process from the same predicates as the reference path. Why whole-line
    operations give the reference's per-token result:
    - cleaning is per character: one translate table deletes what `_clean_text` drops and
      maps to " " what it turns into a space. U+2028/U+2029 (the only Python whitespace
      left after cleaning) are mapped to " " too: str.split() splits on them either way.
    - CJK spacing is per character (a regex substitution).
    - str.lower() is per character except Final_Sigma, whose context stops at characters
      that are neither cased nor case-ignorable, such as the spaces between tokens, so
      lowering the line equals lowering each token. NFD is per character plus canonical
      reordering of combining marks, which never crosses a space (combining class 0).
      Removing Mn is per character. These run after cleaning and CJK spacing, as in the
      reference, so characters they create (U+1FEF -> "`") are classified afterwards.
    - the reference's punctuation split, " ".join and str.split() yield every punctuation
      character alone and every maximal run of other non-whitespace characters: one
      regex findall `[P]|[^P\s]+` (Python's regex `\s` is exactly str.split()'s set).
    FullTokenizer applies `clean` to the line and `split_token` to each whitespace chunk,
    which is the reference's own structure, so caching per chunk is exact.
    """

    def __init__(self):
        clean: dict[int, str | None] = {}
        punctuation, chinese, nonspacing = [], [], []
        for cp in range(0x110000):
            char = chr(cp)
            if cp == 0 or cp == 0xFFFD or _is_control(char):
                clean[cp] = None
            elif _is_whitespace(char) or char.isspace():
                if char != " ":
                    clean[cp] = " "
            if _is_punctuation(char):
                punctuation.append(cp)
            if _is_chinese_char(cp):
                chinese.append(cp)
            if unicodedata.category(char) == "Mn":
                nonspacing.append(cp)
        self.clean_table = clean
        self.ascii_clean_table = {cp: v for cp, v in clean.items() if cp < 128}
        self.strip_marks_table = dict.fromkeys(nonspacing)
        self.chinese_re = re.compile(f"[{_char_class(chinese)}]")
        punct = _char_class(punctuation)
        self.split_re = re.compile(rf"[{punct}]|[^{punct}\s]+")
        ascii_punct = _char_class(cp for cp in punctuation if cp < 128)
        self.ascii_split_re = re.compile(rf"[{ascii_punct}]|[^{ascii_punct}\s]+")

    def clean(self, text: str) -> str:
        """`_clean_text` then `_tokenize_chinese_chars` of the reference, on a whole line."""
        if text.isascii():
            # isprintable() is False exactly for the ASCII characters cleaning changes.
            return text if text.isprintable() else text.translate(self.ascii_clean_table)
        return self.chinese_re.sub(r" \g<0> ", text.translate(self.clean_table))

    def split_token(self, token: str, do_lower_case: bool) -> list[str]:
        """Lower-casing, accent stripping and punctuation split of cleaned text."""
        if do_lower_case:
            token = token.lower()
        return self.split_lowered(token, do_lower_case)

    def split_lowered(self, token: str, do_lower_case: bool) -> list[str]:
        """`split_token` for text that is already lower-cased when `do_lower_case`."""
        if token.isascii():
            if token.isalnum():  # no punctuation, no space: one word
                return [token]
            return self.ascii_split_re.findall(token)
        if do_lower_case:
            token = unicodedata.normalize("NFD", token).translate(self.strip_marks_table)
            if token.isascii():
                return self.ascii_split_re.findall(token)
        return self.split_re.findall(token)

    def tokenize(self, text: str, do_lower_case: bool) -> list[str]:
        """The reference BasicTokenizer's output for a whole line."""
        return self.split_token(self.clean(text), do_lower_case)


@functools.lru_cache(maxsize=1)
def _fast_basic() -> _FastBasic:
    return _FastBasic()


def basic_tokenize(text, do_lower_case: bool) -> list[str]:
    """BasicTokenizer's exact output for `text`, through the fast whole-line path."""
    return _fast_basic().tokenize(convert_to_unicode(text), do_lower_case)


class FullTokenizer:
    """Basic tokenization followed by WordPiece; the original's public API.

    `tokenize` is the fast path (whole-line string passes plus bounded caches of
    whitespace chunk -> WordPieces and word -> WordPieces); `tokenize_exact` is the
    character-by-character reference. Both give the original's output. The caches assume
    the vocab is not mutated after construction.
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

    def tokenize(self, text) -> list[str]:
        """WordPiece tokens of `text` (str or UTF-8 bytes), fast path.

        The reference splits cleaned text on whitespace and then handles each chunk on its
        own (lower-casing, accents, punctuation, WordPiece), so a chunk's tokens depend on
        the chunk alone and can be cached (keyed after lower-casing the whole line).
        """
        if type(text) is not str:
            text = convert_to_unicode(text)
        if not (text.isascii() and text.isprintable()):
            text = self._fast.clean(text)
        if self.do_lower_case:
            text = text.lower()  # equal to lowering each chunk (see _FastBasic)
        chunks = text.split()
        found = list(map(self._chunk_cache.get, chunks))
        if None in found:
            for index, pieces in enumerate(found):
                if pieces is None:
                    found[index] = self._chunk_pieces(chunks[index])
        return list(itertools.chain.from_iterable(found))

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


# ---------------------------------------------------------------------------------------
# CLI. Flags are defined when the CLI starts, never at import: other CLIs that import this
# module (create_pretraining_data) define flags with the same names.


def _define_flags() -> None:
    from absl import flags

    if "vocab_file" not in flags.FLAGS:
        flags.DEFINE_string("vocab_file", None, "WordPiece vocab file (one token per line).")
    if "do_lower_case" not in flags.FLAGS:
        flags.DEFINE_bool("do_lower_case", True, "Lower-case and strip accents (uncased models).")


def tokenize_stream(tokenizer: FullTokenizer, source, sink, batch_lines: int = 4096) -> int:
    r"""Writes one line of space-separated tokens to `sink` (binary) per line of `source`.

    `source` is a binary stream split on b"\n" only. Returns the number of lines. Raises
    ValueError naming the (1-based) line and byte offset of invalid UTF-8.
    """
    out: list[str] = []
    count = 0
    for count, raw in enumerate(source, start=1):
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            sink.write("".join(out).encode("utf-8"))
            raise ValueError(
                f"stdin line {count}: invalid UTF-8 at byte {err.start} of the line "
                f"({raw[err.start:err.start + 4]!r})") from err
        out.append(" ".join(tokenizer.tokenize(line)) + "\n")
        if len(out) >= batch_lines:
            sink.write("".join(out).encode("utf-8"))
            out.clear()
    sink.write("".join(out).encode("utf-8"))
    return count


def main(argv) -> int:
    from absl import flags

    FLAGS = flags.FLAGS
    if len(argv) > 1:
        sys.stderr.write(f"error: unexpected arguments {argv[1:]}; text is read from stdin\n")
        return 2
    if not FLAGS.vocab_file:
        sys.stderr.write("error: --vocab_file is required\n")
        return 2
    try:
        tokenizer = FullTokenizer(FLAGS.vocab_file, do_lower_case=FLAGS.do_lower_case)
        check_vocab(tokenizer.vocab, FLAGS.vocab_file)
    except VocabError as err:
        sys.stderr.write(f"error: --vocab_file: {err}\n")
        return 1
    try:
        tokenize_stream(tokenizer, sys.stdin.buffer, sys.stdout.buffer)
    except ValueError as err:
        sys.stdout.flush()
        sys.stderr.write(f"error: {err}\n")
        return 1
    sys.stdout.flush()
    return 0


def run() -> None:
    """Console-script entry point (`bert_tokenize`)."""
    from absl import app

    _define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
