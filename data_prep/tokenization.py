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


# --- The fast path's character tables --------------------------------------------------
# The fast path needs, for every code point, the classes the reference predicates define.
# Classifying all 1.1M code points one Python call at a time took ~0.75 CPU-s, a large
# part of a short run, so the classes are computed with C-level passes over whole strings
# (`_compute_table_ranges`, ~0.3 s), kept as inclusive ranges in a small JSON cache file
# (`_table_ranges`, a few ms), and only loaded when text that is not ASCII first arrives
# (`_FastBasic.__getattr__`): ASCII needs only tables of 128 entries.

_TABLES_FORMAT = 1
_TABLE_CLASSES = ("delete", "space", "punctuation", "chinese", "nonspacing")
# The blocks of `_is_chinese_char`, as ranges (a test checks they agree on every code point).
_CJK_RANGES = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x2A6DF),
               (0x2A700, 0x2B73F), (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0x2F800, 0x2FA1F))
_ASCII_PUNCTUATION_RANGES = ((33, 47), (58, 64), (91, 96), (123, 126))
CACHE_DIR_ENV = "BERT_KERAS3_CACHE_DIR"


def _to_ranges(code_points) -> list[list[int]]:
    """Sorted code points -> inclusive [first, last] runs."""
    runs: list[list[int]] = []
    for cp in code_points:
        if runs and cp == runs[-1][1] + 1:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp])
    return runs


def _every_code_point() -> str:
    """A string of all 0x110000 code points in order (lone surrogates included)."""
    import array

    codes = array.array("I", range(0x110000))
    if codes.itemsize != 4:
        return "".join(map(chr, range(0x110000)))
    codec = "utf-32-le" if sys.byteorder == "little" else "utf-32-be"
    return codes.tobytes().decode(codec, "surrogatepass")


def _compute_table_ranges() -> dict[str, list[list[int]]]:
    """Every class `_FastBasic` needs, as inclusive code point ranges, for all code points.

    The classes, as the reference path defines them (tests compare with a loop calling the
    predicates on every code point):
      delete: what `_clean_text` drops: U+0000, U+FFFD and `_is_control` (Cc, Cf minus
        tab, newline, carriage return);
      space: what cleaning turns into " " (`_is_whitespace`), plus the rest of Python's
        whitespace (U+2028/U+2029: str.split() splits on them either way), minus " "
        itself and anything deleted;
      punctuation: `_is_punctuation` (ASCII symbol ranges and every P* category);
      chinese: `_is_chinese_char`; nonspacing: category Mn (removed by accent stripping).
    """
    everything = _every_code_point()
    # Two letters per code point, upper case then lower case, so a match of the patterns
    # below can only start at an even offset, i.e. at a code point's first letter.
    categories = "".join(map(unicodedata.category, everything))
    if len(categories) != 2 * len(everything):
        raise AssertionError("unicodedata.category returned a name that is not 2 letters")

    def having(category_pattern: str) -> set[int]:
        found: set[int] = set()
        for match in re.finditer(f"(?:{category_pattern})+", categories):
            found.update(range(match.start() // 2, match.end() // 2))
        return found

    # For str patterns `\s` is exactly str.isspace() (both are Py_UNICODE_ISSPACE).
    python_space = {match.start() for match in re.finditer(r"\s", everything)}
    delete = (having("C[cf]") - {0x09, 0x0A, 0x0D}) | {0x0000, 0xFFFD}
    space = ({0x09, 0x0A, 0x0D, 0x20} | having("Zs") | python_space) - delete - {0x20}
    punctuation = having("P[a-z]").union(
        *(range(a, b + 1) for a, b in _ASCII_PUNCTUATION_RANGES))
    return {
        "delete": _to_ranges(sorted(delete)),
        "space": _to_ranges(sorted(space)),
        "punctuation": _to_ranges(sorted(punctuation)),
        "chinese": [list(r) for r in _CJK_RANGES],
        "nonspacing": _to_ranges(sorted(having("Mn"))),
    }


@functools.cache
def _tables_cache_key() -> str:
    """Names what the tables depend on: Python's Unicode database and this code.

    The code part hashes the compiled code of the table builder and of every predicate it
    stands for, so any change to them gives another cache file.
    """
    import hashlib

    digest = hashlib.sha256()
    digest.update(f"{_TABLES_FORMAT}|{sys.version}|{_CJK_RANGES}|"
                  f"{_ASCII_PUNCTUATION_RANGES}".encode())
    for function in (_compute_table_ranges, _every_code_point, _to_ranges, _is_whitespace,
                     _is_control, _is_punctuation, _is_chinese_char):
        _digest_code(function.__code__, digest)
    return f"unicode-{unicodedata.unidata_version}-{digest.hexdigest()[:16]}"


def _digest_code(code, digest) -> None:
    """Feeds a code object's bytecode, names and constants (nested code included) to
    `digest`; unlike marshal's output, this does not vary from run to run."""
    digest.update(code.co_code)
    digest.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            _digest_code(const, digest)
        elif isinstance(const, frozenset):  # its repr's order varies with hash seeds
            digest.update(repr(sorted(map(repr, const))).encode())
        else:
            digest.update(repr(const).encode())


def tables_cache_file() -> str | None:
    """Where the tables are cached, or None when caching is off.

    `$BERT_KERAS3_CACHE_DIR` (empty: no cache), else `$XDG_CACHE_HOME/bert-keras3`, else
    `~/.cache/bert-keras3`.
    """
    import os

    directory = os.environ.get(CACHE_DIR_ENV)
    if directory is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
            os.path.expanduser("~"), ".cache")
        directory = os.path.join(base, "bert-keras3")
    if not directory:
        return None
    return os.path.join(directory, f"tokenizer-tables-{_tables_cache_key()}.json")


def _tables_payload_digest(ranges) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(ranges, sort_keys=True).encode()).hexdigest()


def _parse_tables_cache(text: str, key: str):
    """The ranges of a cache file's text, or None if it is not a valid cache for `key`.

    Plain JSON, checked in full: the key, a SHA-256 of the ranges, and the shape of every
    range (sorted, disjoint, within the code space). Nothing is ever evaluated.
    """
    import json

    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        return None
    ranges = data.get("ranges")
    if not isinstance(ranges, dict) or sorted(ranges) != sorted(_TABLE_CLASSES):
        return None
    if data.get("sha256") != _tables_payload_digest(ranges):
        return None
    for runs in ranges.values():
        previous = -1
        if not isinstance(runs, list):
            return None
        for run in runs:
            if not (isinstance(run, list) and len(run) == 2
                    and all(type(x) is int for x in run)
                    and previous < run[0] <= run[1] < 0x110000):
                return None
            previous = run[1]
    return ranges


def _table_ranges() -> dict[str, list[list[int]]]:
    """The classes of `_compute_table_ranges`, from the cache file when it is valid.

    A missing, stale or corrupt cache file is (re)built and written all-or-nothing; a cache
    directory that cannot be written only costs the computation.
    """
    path = tables_cache_file()
    if path is None:
        return _compute_table_ranges()
    from data_prep import fileio

    key = _tables_cache_key()
    try:
        ranges = _parse_tables_cache(fileio.read_text(path), key)
    except (OSError, UnicodeDecodeError):
        ranges = None
    else:
        if ranges is None:
            logging.getLogger(__name__).warning(
                "%s: not a valid tokenizer table cache; rebuilding it", path)
    if ranges is not None:
        return ranges
    ranges = _compute_table_ranges()
    import json

    text = json.dumps({"key": key, "unidata_version": unicodedata.unidata_version,
                       "sha256": _tables_payload_digest(ranges), "ranges": ranges},
                      sort_keys=True)
    try:
        fileio.write_text(path, text + "\n")
    except OSError as err:
        logging.getLogger(__name__).info("tokenizer table cache not written (%s): %s",
                                         path, err)
    return ranges


def _expand(ranges) -> list[int]:
    return [cp for first, last in ranges for cp in range(first, last + 1)]


def _clean_value(cp: int):
    """What `_clean_text` (plus Python whitespace -> " ") makes of one code point:
    None (deleted), " " (a space), or `...` (kept as it is)."""
    char = chr(cp)
    if cp == 0 or cp == 0xFFFD or _is_control(char):
        return None
    if (_is_whitespace(char) or char.isspace()) and char != " ":
        return " "
    return ...


class _FastBasic:
    r"""BasicTokenizer on whole lines with C-level passes, identical to the reference.

    Built once per process from the same predicates as the reference path; the tables
    for text beyond ASCII are loaded on first use (`__getattr__`, see `_table_ranges`).
    Why whole-line operations give the reference's per-token result:
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

    # Attributes for text beyond ASCII, set by `load_tables` on first use.
    _FULL_TABLES = ("clean_table", "strip_marks_table", "chinese_re", "split_re")

    def __init__(self):
        ascii_clean = {cp: _clean_value(cp) for cp in range(128)}
        self.ascii_clean_table = {cp: v for cp, v in ascii_clean.items() if v is not ...}
        ascii_punct = _char_class(cp for cp in range(128) if _is_punctuation(chr(cp)))
        self.ascii_split_re = re.compile(rf"[{ascii_punct}]|[^{ascii_punct}\s]+")

    def __getattr__(self, name):
        # Only called for attributes not set yet: the full tables, on their first use.
        if name in _FastBasic._FULL_TABLES:
            self.load_tables()
            return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def load_tables(self, ranges=None) -> None:
        """Sets the tables for all of Unicode (from `_table_ranges()` unless given)."""
        if "split_re" in self.__dict__ and ranges is None:
            return
        ranges = _table_ranges() if ranges is None else ranges
        clean: dict[int, str | None] = dict.fromkeys(_expand(ranges["delete"]))
        clean.update(dict.fromkeys(_expand(ranges["space"]), " "))
        self.clean_table = clean
        self.strip_marks_table = dict.fromkeys(_expand(ranges["nonspacing"]))
        self.chinese_re = re.compile(f"[{_char_class(_expand(ranges['chinese']))}]")
        punct = _char_class(_expand(ranges["punctuation"]))
        self.split_re = re.compile(rf"[{punct}]|[^{punct}\s]+")

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


def load_tables() -> None:
    """Loads the fast path's tables for all of Unicode now rather than on first use
    (e.g. before forking workers, which then share them)."""
    _fast_basic().load_tables()


def basic_tokenize(text, do_lower_case: bool) -> list[str]:
    """BasicTokenizer's exact output for `text`, through the fast whole-line path."""
    return _fast_basic().tokenize(convert_to_unicode(text), do_lower_case)


class FullTokenizer:
    """Basic tokenization followed by WordPiece; the original's public API.

    `tokenize` is the fast path (whole-line string passes plus bounded caches of
    whitespace chunk -> WordPieces and word -> WordPieces; `tokenize_to_ids` adds chunk ->
    ids); `tokenize_exact` is the
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
    `text_input.InputError` (a ValueError) naming the line and byte offset of invalid
    UTF-8, after writing the lines before it.
    """
    from data_prep import text_input

    out: list[str] = []
    count = offset = 0
    for count, raw in enumerate(source, start=1):
        try:
            line = text_input.decode_utf8(raw, "stdin", first_line=count, first_offset=offset)
        except text_input.InputError:
            sink.write("".join(out).encode("utf-8"))
            raise
        offset += len(raw)
        if line.endswith("\n"):
            line = line[:-1]
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
