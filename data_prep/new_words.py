"""Owns choosing the words a vocab grows by and where they go: a words file or a corpus's most token-saving words, placed in `[unused*]` slots or appended.

Words are the basic tokenizer's (`data_prep.tokenization.basic_tokenize`: cleaning,
splitting at whitespace, punctuation and CJK characters, and with `do_lower_case`
lower-casing and accent stripping), so an added word is exactly what the tokenizer
hands to WordPiece, and WordPiece, which takes the longest vocab entry first, then makes
it one token. A words file's line is refused, naming the file and line, when it is
empty, when the basic tokenizer would split it (it could never be one token), when it is
longer than the tokenizer's 200-character word limit (it would be [UNK]) or when it
repeats an earlier line (after lower-casing); a word already in the vocab is skipped and
counted. From a corpus, the words that save the most tokens are taken: frequency x
(pieces - 1) under the current vocab.

Placement: `unused` puts the words in the vocab's `[unusedN]` entries in id order
(vocab_size unchanged: the original's own advice); `append` adds them at the end, then
optionally pads the vocab with new `[unusedN]` entries to a multiple of a number (as
NVIDIA pads 30522 to 30528 for its kernels).
"""

from __future__ import annotations

import collections
import dataclasses
import re

from data_prep import cli, fileio, text_input, tokenization
from data_prep.reference_tokenization import MAX_INPUT_CHARS_PER_WORD, UNK_TOKEN

PLACEMENTS = ("unused", "append")
UNUSED = re.compile(r"^\[unused(\d+)\]$")


class NewWordsError(cli.UserError):
    """A words file, corpus or placement that cannot work (names the file, line or flag)."""


@dataclasses.dataclass(frozen=True)
class Chosen:
    """The words to add, in order, and those skipped because the vocab has them."""

    words: list
    known: list


@dataclasses.dataclass(frozen=True)
class VocabPlan:
    """The grown vocab.

    Attributes:
      tokens: every token, in id order (line order of vocab.txt).
      ids: added word -> its id.
      pads: ids of the `[unusedN]` entries appended to reach a multiple.
    """

    tokens: list
    ids: dict
    pads: list


def read_words_file(path: str, tokenizer: tokenization.FullTokenizer) -> Chosen:
    """The words of a file with one word per line, as the tokenizer's basic step gives them.

    Raises:
      NewWordsError: naming the file and line of an empty line, a line the basic tokenizer
        splits, a word over the 200-character limit or a repeated word; a file without words.
      text_input.InputError: the file is not UTF-8 (file, line, byte offset).
    """
    with fileio.open_file(path, "rb") as f:
        text = text_input.decode_utf8(f.read(), path)
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the file's last newline
    seen, words, known = {}, [], []
    for number, line in enumerate(lines, start=1):
        where = f"{path}:{number}"
        found = tokenization.basic_tokenize(line, tokenizer.do_lower_case)
        if not found:
            raise NewWordsError(f"{where}: empty line; the file holds one word per line")
        if len(found) > 1:
            raise NewWordsError(
                f"{where}: {line.strip()!r} is {len(found)} words to the tokenizer "
                f"({' '.join(found)}): it splits at whitespace, punctuation and CJK "
                "characters, so this could never be one token; one word per line")
        word = found[0]
        if len(word) > MAX_INPUT_CHARS_PER_WORD:
            raise NewWordsError(f"{where}: a word of {len(word)} characters; the tokenizer "
                                f"makes words over {MAX_INPUT_CHARS_PER_WORD} characters "
                                "[UNK]")
        if word in seen:
            raise NewWordsError(f"{where}: {word!r} repeats line {seen[word]}"
                                + (" (after lower-casing)" if word != line.strip() else ""))
        seen[word] = number
        (known if word in tokenizer.vocab else words).append(word)
    if not seen:
        raise NewWordsError(f"{path}: no words (one word per line)")
    return Chosen(words, known)


def count_corpus_words(patterns: str, do_lower_case: bool,
                       flag: str = "--corpus") -> collections.Counter:
    """Counts the basic tokenizer's words in the files of comma-separated globs.

    Raises:
      text_input.InputError: a glob that matches no file (names `flag`), a file that is
        not UTF-8 (file, line, byte offset).
    """
    counts: collections.Counter = collections.Counter()
    for path in text_input.expand_input_files(patterns, flag):
        with fileio.open_file(path, "rb") as f:
            text = text_input.decode_utf8(f.read(), path)
        counts.update(tokenization.count_words(text.split("\n"), do_lower_case))
    return counts


def most_saving_words(counts, tokenizer: tokenization.FullTokenizer, number: int) -> Chosen:
    """The `number` words of `counts` that save the most tokens, frequency x (pieces - 1)
    under the tokenizer's vocab, most first (ties: alphabetical); fewer when fewer words
    save any (a word the vocab has, or that is [UNK], saves none)."""
    scored = []
    for word, count in counts.items():
        if word in tokenizer.vocab:
            continue
        saving = count * (len(tokenizer.tokenize(word)) - 1)
        if saving > 0:
            scored.append((-saving, word))
    scored.sort()
    return Chosen([word for _, word in scored[:number]], [])


def corpus_tokens(counts, tokenizer: tokenization.FullTokenizer) -> int:
    """The corpus's WordPiece tokens under the tokenizer's vocab, from its word counts."""
    return sum(count * len(tokenizer.tokenize(word)) for word, count in counts.items())


def place_words(tokens: list, words: list, placement: str,
                pad_to_multiple_of: int | None = None) -> VocabPlan:
    """The vocab with `words` in `[unusedN]` slots (in id order) or appended (then padded
    with new `[unusedN]` entries to a multiple of `pad_to_multiple_of`).

    Raises:
      NewWordsError: fewer `[unused*]` entries than words (both counts named), padding
        asked with unused placement.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r}; expected one of {PLACEMENTS}")
    new = list(tokens)
    if placement == "unused":
        if pad_to_multiple_of:
            raise NewWordsError("--pad_vocab_to_multiple_of pads an appended vocab; "
                                "--placement=unused keeps vocab_size as it is")
        slots = [i for i, token in enumerate(tokens) if UNUSED.match(token)]
        if len(slots) < len(words):
            raise NewWordsError(
                f"--placement=unused: {len(words)} words to add but the vocab has only "
                f"{len(slots)} [unused*] entries; add fewer words or use --placement=append")
        ids = dict(zip(words, slots))
        for word, slot in ids.items():
            new[slot] = word
        return VocabPlan(new, ids, [])
    ids = {word: len(tokens) + i for i, word in enumerate(words)}
    new += words
    pads = []
    if pad_to_multiple_of:
        numbers = [int(m.group(1)) for m in map(UNUSED.match, tokens) if m]
        next_number = max(numbers, default=-1) + 1
        while len(new) % pad_to_multiple_of:
            pads.append(len(new))
            new.append(f"[unused{next_number}]")
            next_number += 1
    return VocabPlan(new, ids, pads)


def row_sources(plan: VocabPlan, tokenizer: tokenization.FullTokenizer) -> dict:
    """New row id -> the OLD vocab's ids whose mean it starts at: a word's WordPiece pieces
    under the old vocab (none for a word that is [UNK]: the mean of every row); a pad's
    the old `[unused*]` entries (none without any)."""
    sources = {}
    for word, row in plan.ids.items():
        pieces = tokenizer.tokenize(word)
        sources[row] = () if pieces == [UNK_TOKEN] else tuple(
            tokenizer.convert_tokens_to_ids(pieces))
    unused = tuple(i for token, i in tokenizer.vocab.items() if UNUSED.match(token))
    for row in plan.pads:
        sources[row] = unused
    return sources
