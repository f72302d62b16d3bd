"""The original BERT tokenizer, character by character: the statement the fast path is held to.

A direct port of Google's `tokenization.py` (bert-tensorflow 1.0.4): text cleaning, CJK
splitting, optional lower-casing and accent stripping, punctuation split
(`BasicTokenizer`) and greedy longest-match-first WordPiece (`WordpieceTokenizer`), with
the character predicates they use. `data_prep.tokenization.FullTokenizer` is what the
tools use; its fast path is tested against this module and against Google's code.
"""

from __future__ import annotations

import unicodedata

# The original's limit on a word's length in characters before it becomes [UNK].
MAX_INPUT_CHARS_PER_WORD = 200
UNK_TOKEN = "[UNK]"


def convert_to_unicode(text) -> str:
    """Returns `text` as str, decoding UTF-8 bytes (invalid bytes are an error)."""
    if isinstance(text, str):
        return text
    if isinstance(text, bytes):
        return text.decode("utf-8")
    raise TypeError(f"Unsupported string type: {type(text)}")


def whitespace_tokenize(text: str) -> list[str]:
    """Strips and splits on Python whitespace, as the original does."""
    text = text.strip()
    if not text:
        return []
    return text.split()


def is_whitespace(char: str) -> bool:
    """Space, tab, newline, carriage return and Unicode category Zs."""
    if char in (" ", "\t", "\n", "\r"):
        return True
    return unicodedata.category(char) == "Zs"


def is_control(char: str) -> bool:
    """Categories Cc and Cf, except tab, newline and carriage return."""
    if char in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(char) in ("Cc", "Cf")


def is_punctuation(char: str) -> bool:
    """ASCII symbol ranges (e.g. $, ^, `) and every Unicode P* category."""
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def is_chinese_char(cp: int) -> bool:
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
            if is_punctuation(char):
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
            if is_chinese_char(ord(char)):
                output.extend((" ", char, " "))
            else:
                output.append(char)
        return "".join(output)

    @staticmethod
    def _clean_text(text: str) -> str:
        output = []
        for char in text:
            cp = ord(char)
            if cp == 0 or cp == 0xFFFD or is_control(char):
                continue
            output.append(" " if is_whitespace(char) else char)
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
