"""In-graph BERT tokenization (tensorflow-text): strings -> WordPiece ids -> model inputs.

For serving and batch speed. The stock `tensorflow_text.BertTokenizer` and
`FastBertTokenizer` differ from the original on hundreds of adversarial lines (NFKC case
folding, their own punctuation/whitespace/control tables, a byte instead of character
word limit). This module instead rebuilds the original's basic tokenization from in-graph
regex passes whose character classes are generated from the same Python predicates as
`data_prep.tokenization` (so they cannot drift), then runs `FastWordpieceTokenizer` on
the resulting words. What still differs is measured in tests/test_tf_tokenization.py and
listed in docs/tokenization.md; CLIs use the pure-Python tokenizer, which is exact.
"""

from __future__ import annotations

import functools
import unicodedata

import tensorflow as tf
import tensorflow_text as tf_text

from data_prep import reference_tokenization, tokenization

# FastWordpieceTokenizer's limit on a vocab token's UTF-8 length (suffix indicator excluded).
_FAST_WORDPIECE_MAX_TOKEN_BYTES = 256


def _re2_class(code_points) -> str:
    """An RE2 character class body for a sorted iterable of code points (\\x{...} ranges)."""
    parts = []
    start = previous = None
    for cp in code_points:
        if previous is not None and cp == previous + 1:
            previous = cp
            continue
        if start is not None:
            parts.append((start, previous))
        start = previous = cp
    if start is not None:
        parts.append((start, previous))
    return "".join(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}"
                   for a, b in parts)


class _GraphPatterns:
    """RE2 patterns for each step of the original's basic tokenization."""

    def __init__(self):
        drop, to_space, punct, chinese, marks = [], [], [], [], []
        for cp in range(0x110000):
            if 0xD800 <= cp <= 0xDFFF:  # not representable in UTF-8 strings
                continue
            char = chr(cp)
            category = unicodedata.category(char)
            if reference_tokenization.is_chinese_char(cp):
                chinese.append(cp)
            # Unassigned, private-use and other letters (98% of code points): no control,
            # space, punctuation or mark among them. Skipping them makes a process's first
            # in-graph tokenizer (an export) about 3x faster to build.
            if category in ("Cn", "Co", "Lo"):
                continue
            mapped = tokenization.clean_value(cp)
            if mapped is None:
                drop.append(cp)
            elif mapped == " " and char != " ":
                to_space.append(cp)
            if reference_tokenization.is_punctuation(char):
                punct.append(cp)
            if category == "Mn":
                marks.append(cp)
        self.drop = f"[{_re2_class(drop)}]"
        self.to_space = f"[{_re2_class(to_space)}]"
        self.chinese = f"([{_re2_class(chinese)}])"
        self.marks = f"[{_re2_class(marks)}]"
        self.punctuation = f"([{_re2_class(punct)}])"


@functools.lru_cache(maxsize=1)
def _graph_patterns() -> _GraphPatterns:
    return _GraphPatterns()


@functools.lru_cache(maxsize=1)
def _lowercase_fixes() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Characters that Python lower-cases but tf.strings.lower leaves alone.

    tf.strings.lower uses an older Unicode version than Python 3.11 (Unicode 14.0): the
    Unicode 14 additions (Vithkuqi, U+2C2F, U+A7C0, ...) must be mapped beforehand. Only
    characters with a context-free, one-character lower case are candidates.
    """
    candidates = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF
                  and len(chr(cp).lower()) == 1 and chr(cp).lower() != chr(cp)
                  and cp != 0x03A3]  # capital sigma depends on context
    lowered = tf.strings.lower([chr(cp) for cp in candidates], encoding="utf-8").numpy()
    fixes = [(cp, ord(chr(cp).lower())) for cp, got in zip(candidates, lowered)
             if got.decode("utf-8") != chr(cp).lower()]
    return tuple(a for a, _ in fixes), tuple(b for _, b in fixes)


class BertInGraphTokenizer(tf.Module):
    """The original BERT tokenization as TensorFlow ops, plus packing into model inputs.

    Args:
      vocab_file: WordPiece vocab (ids as `data_prep.tokenization.load_vocab` gives them).
      do_lower_case: lower-case, NFD and strip non-spacing marks (uncased models).
      max_chars_per_word: longer words become [UNK] (the original's 200 characters).

    The first construction in a process builds the character classes from all 1.1M code
    points (1-2 s); later ones reuse them.
    """

    def __init__(self, vocab_file: str, do_lower_case: bool = True,
                 max_chars_per_word: int = reference_tokenization.MAX_INPUT_CHARS_PER_WORD,
                 name: str | None = None):
        super().__init__(name=name)
        vocab = tokenization.load_vocab(vocab_file)
        tokenization.check_vocab(vocab, vocab_file, required=tokenization.ENCODING_TOKENS)
        self.vocab_file = vocab_file
        self.do_lower_case = do_lower_case
        self.max_chars_per_word = max_chars_per_word
        self.vocab_tokens = list(vocab)  # index == id: load_vocab's ids are dense
        self.cls_id = vocab["[CLS]"]
        self.sep_id = vocab["[SEP]"]
        self._patterns = _graph_patterns()
        self._lower_fix_pattern = None
        if do_lower_case:
            sources, targets = _lowercase_fixes()
            if sources:
                self._lower_fix_pattern = f"(?s).*[{_re2_class(sources)}].*"
                self._lower_fix_table = tf.lookup.StaticHashTable(
                    tf.lookup.KeyValueTensorInitializer(
                        tf.constant(sources, tf.int32), tf.constant(targets, tf.int32)),
                    default_value=-1)
        longest_bytes = max(len(t.encode("utf-8")) for t in self.vocab_tokens)
        # The word limit is applied in characters before WordPiece, so the byte limit here
        # only has to let every <= max_chars_per_word word through (4 bytes per character).
        max_bytes = max(4 * max_chars_per_word, longest_bytes)
        if longest_bytes <= _FAST_WORDPIECE_MAX_TOKEN_BYTES:
            self._wordpiece = tf_text.FastWordpieceTokenizer(
                vocab=self.vocab_tokens, suffix_indicator="##", max_bytes_per_word=max_bytes,
                token_out_type=tf.int64, unknown_token="[UNK]", no_pretokenization=True)
        else:  # FastWordpieceTokenizer refuses such vocabs; the table-based one is slower.
            table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    self.vocab_tokens, tf.range(len(self.vocab_tokens), dtype=tf.int64)),
                default_value=-1)
            self._wordpiece = tf_text.WordpieceTokenizer(
                table, suffix_indicator="##", max_bytes_per_word=max_bytes,
                token_out_type=tf.int64, unknown_token="[UNK]")

    def basic_tokenize(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """Words of the original's BasicTokenizer: [batch] strings -> [batch, (words)]."""
        p = self._patterns
        texts = tf.convert_to_tensor(texts, dtype=tf.string)
        texts = tf.strings.regex_replace(texts, p.drop, "")
        texts = tf.strings.regex_replace(texts, p.to_space, " ")
        texts = tf.strings.regex_replace(texts, p.chinese, " \\1 ")
        if self.do_lower_case:
            texts = self._lower(texts)
            texts = tf_text.normalize_utf8(texts, "NFD")
            texts = tf.strings.regex_replace(texts, p.marks, "")
        # Cleaning mapped every Python whitespace character to " " (and lower-casing or NFD
        # create none), so splitting on ASCII whitespace is str.split() here.
        texts = tf.strings.regex_replace(texts, p.punctuation, " \\1 ")
        words = tf.strings.split(texts)
        too_long = tf.strings.length(words.flat_values, unit="UTF8_CHAR") > (
            self.max_chars_per_word)
        # A too-long word becomes the literal [UNK], which WordPiece maps to its id.
        return words.with_flat_values(tf.where(too_long, "[UNK]", words.flat_values))

    def split_words_with_offsets(self, texts):
        """The basic tokenizer's word boundaries, drawn on the raw text, with offsets.

        Splits at the original's whitespace and makes every punctuation character and
        every CJK character a word of its own, on the ORIGINAL strings: words are
        substrings of the input (not cleaned, cased or normalized), so a caller can map
        them back. Feeding a word to ``tokenize`` gives the pieces the original gives it;
        a word the original would drop entirely (only control characters, or with
        do_lower_case only combining marks) tokenizes to no pieces.

        Args:
          texts: [batch] UTF-8 strings.
        Returns:
          (words, starts, ends): RaggedTensors [batch, (words)]: the words (tf.string) and
          their int64 offsets in code points (what Python's str indexes), end exclusive.
        """
        p = self._patterns
        texts = tf.convert_to_tensor(texts, dtype=tf.string)
        # Cleaning maps every whitespace character but " " to " " (to_space); the capture
        # groups of the other classes are dropped (regex_split takes bare classes).
        whitespace = f"[ {p.to_space[1:-1]}]"
        single = f"{p.punctuation[1:-1]}|{p.chinese[1:-1]}"
        # regex_split_with_offsets stops at a NUL byte: split a copy where NUL is \x01
        # (both are dropped by cleaning, neither is a boundary), cut words from the input.
        _, begin, end = tf_text.regex_split_with_offsets(
            tf.strings.regex_replace(texts, "\\x00", "\x01"), f"{whitespace}|{single}",
            single)
        rows = begin.value_rowids()
        # Byte offsets -> code points: the number of characters starting before each
        # offset, by one search over every row's character starts laid end to end.
        _, char_starts = tf.strings.unicode_decode_with_offsets(texts, "UTF-8")
        base = tf.concat([[0], tf.cumsum(tf.cast(tf.strings.length(texts), tf.int64))], 0)
        sorted_starts = char_starts.flat_values + tf.gather(base, char_starts.value_rowids())
        first_char = tf.gather(char_starts.row_splits, rows)
        word_base = tf.gather(base, rows)

        def to_chars(offsets):
            chars = tf.searchsorted(sorted_starts, offsets.flat_values + word_base,
                                    side="left", out_type=tf.int64) - first_char
            return offsets.with_flat_values(chars)

        starts, ends = to_chars(begin), to_chars(end)
        words = substrings(texts, rows, starts.flat_values, ends.flat_values)
        return begin.with_flat_values(words), starts, ends

    def _lower(self, texts: tf.Tensor) -> tf.Tensor:
        """Python's str.lower: tf.strings.lower (which handles final sigma and U+0130 like
        Python) after mapping the characters its older Unicode tables do not lower."""
        if self._lower_fix_pattern is not None:
            texts = tf.cond(
                tf.reduce_any(tf.strings.regex_full_match(texts, self._lower_fix_pattern)),
                lambda: self._map_code_points(texts), lambda: texts)
        return tf.strings.lower(texts, encoding="utf-8")

    def _map_code_points(self, texts: tf.Tensor) -> tf.Tensor:
        code_points = tf.strings.unicode_decode(texts, "UTF-8")
        flat = code_points.flat_values
        mapped = self._lower_fix_table.lookup(flat)
        code_points = code_points.with_flat_values(tf.where(mapped >= 0, mapped, flat))
        return tf.strings.unicode_encode(code_points, "UTF-8")

    def tokenize(self, texts) -> tf.RaggedTensor:
        """WordPiece ids: [batch] UTF-8 strings -> int64 RaggedTensor [batch, (tokens)]."""
        return self.tokenize_words(texts).merge_dims(1, 2)

    def tokenize_words(self, texts) -> tf.RaggedTensor:
        """WordPiece ids grouped by the basic tokenizer's words: [batch] UTF-8 strings ->
        int64 RaggedTensor [batch, (words), (pieces)] (TF Hub's `tokenize` layout)."""
        texts = tf.convert_to_tensor(texts, dtype=tf.string)
        return self._wordpiece.tokenize(self.basic_tokenize(texts))

    def ids_to_tokens(self, ids) -> list[list[str]]:
        """Python-side helper: a RaggedTensor of ids -> lists of token strings."""
        return [[self.vocab_tokens[i] for i in row] for row in ids.to_list()]

    def pack_inputs(self, first, second=None, max_seq_length: int = 128):
        """`[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`, truncated and padded.

        Truncation follows the original's `_truncate_seq_pair` without randomness: one
        token at a time from the end of the longer segment (of B on a tie).

        Args:
          first: int RaggedTensor [batch, (tokens)] of ids (from `tokenize`).
          second: optional RaggedTensor [batch, (tokens)] for pairs.
          max_seq_length: output length, special tokens included (an int, or a scalar int
            tensor: TF Hub's `bert_pack_inputs` takes it at call time).
        Returns:
          dict of int32 [batch, max_seq_length]: input_ids, input_mask, segment_ids.
        """
        budget = max_seq_length - (3 if second is not None else 2)
        if isinstance(budget, int) and budget < 0:
            raise ValueError(f"max_seq_length={max_seq_length} cannot hold the special tokens")
        if not isinstance(budget, int):
            budget = tf.maximum(tf.cast(budget, tf.int64), 0)
        first = tf.cast(first, tf.int64)
        if second is None:
            segments, lengths = [first], [tf.minimum(first.row_lengths(), budget)]
        else:
            second = tf.cast(second, tf.int64)
            segments = [first, second]
            lengths = _truncated_pair_lengths(first.row_lengths(), second.row_lengths(), budget)
        input_ids, input_mask, segment_ids = pack_segments(
            segments, self.cls_id, self.sep_id, max_seq_length, lengths)
        return {"input_ids": tf.cast(input_ids, tf.int32),
                "input_mask": tf.cast(input_mask, tf.int32),
                "segment_ids": tf.cast(segment_ids, tf.int32)}


def pack_segments(segments, cls_id: int, sep_id: int, seq_length, lengths=None):
    """``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]`` per row, zero-padded to ``seq_length``.

    The values of tensorflow-text's ``combine_segments`` then ``pad_model_inputs`` (a row
    longer than ``seq_length`` is cut there), built as one gather per segment: their
    ragged concatenation adds shape assertions (each a ``tf.cond`` with two branch graphs)
    that were most of an export's packing time to trace (measured: 5x less here).

    Args:
      segments: 1 or 2 int64 RaggedTensors [batch, (tokens)].
      cls_id, sep_id: the special tokens' ids.
      seq_length: output length (an int or a scalar int tensor).
      lengths: optional, one int64 [batch] per segment: pack only the first
        ``lengths[i]`` (at most the row's length) tokens of row i.
    Returns:
      (input_ids, input_mask, segment_ids): int64 [batch, seq_length].
    """
    positions = tf.range(tf.cast(seq_length, tf.int64))[None, :]
    start = tf.ones_like(segments[0].row_lengths()[:, None])  # after [CLS]
    segment_ids = tf.zeros_like(start) * positions  # zeros [batch, seq_length]
    input_ids = tf.where(positions == 0, tf.constant(cls_id, tf.int64), segment_ids)
    for number, tokens in enumerate(segments):
        count = (tokens.row_lengths() if lengths is None else lengths[number])[:, None]
        # One zero after the values: where positions outside the segment read from.
        values = tf.concat([tokens.flat_values, tf.zeros([1], tf.int64)], 0)
        inside = (positions >= start) & (positions < start + count)
        index = tf.where(inside, tokens.row_splits[:-1, None] + positions - start,
                         tf.shape(values, out_type=tf.int64)[0] - 1)
        input_ids = tf.where(inside, tf.gather(values, index), input_ids)
        input_ids = tf.where(positions == start + count, tf.constant(sep_id, tf.int64),
                             input_ids)
        if number:
            segment_ids = tf.where((positions >= start) & (positions <= start + count),
                                   tf.constant(number, tf.int64), segment_ids)
        start = start + count + 1
    # Nothing was written at or after the last [SEP]: the padding is already zeros.
    return input_ids, tf.cast(positions < start, tf.int64), segment_ids


def substrings(texts, rows, starts, ends):
    """``texts[rows[i]][starts[i]:ends[i]]`` in code points (Python's slicing), in time
    and memory linear in the texts and the results: the characters are gathered from the
    decoded batch (``tf.strings.substr`` would need a copy of the whole text per slice).

    Args:
      texts: [batch] UTF-8 strings.
      rows, starts, ends: int64 [n]; 0 <= starts <= ends <= the row's length.
    Returns:
      [n] strings.
    """
    chars = tf.strings.unicode_decode(texts, "UTF-8")
    first = tf.gather(chars.row_splits, rows) + starts
    last = tf.gather(chars.row_splits, rows) + ends
    picked = tf.RaggedTensor.from_row_lengths(  # the ranges' own lengths: valid as built
        tf.gather(chars.flat_values, tf.ragged.range(first, last).flat_values), last - first,
        validate=False)
    return tf.strings.unicode_encode(picked, "UTF-8")


def _truncated_pair_lengths(len_a, len_b, budget):
    """Lengths after repeatedly dropping the last token of the longer side (B on a tie)
    until len_a + len_b <= budget; closed form of that loop. Shapes [batch]."""
    budget = tf.cast(budget, len_a.dtype)
    fits = len_a + len_b <= budget
    a_short = (len_a <= len_b) & (2 * len_a <= budget)
    b_short = (len_a > len_b) & (2 * len_b <= budget)
    half_up, half_down = (budget + 1) // 2, budget // 2
    new_a = tf.where(fits, len_a, tf.where(a_short, len_a,
                                           tf.where(b_short, budget - len_b, half_up)))
    new_b = tf.where(fits, len_b, tf.where(a_short, budget - len_a,
                                           tf.where(b_short, len_b, half_down)))
    return new_a, new_b
