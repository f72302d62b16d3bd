"""Pretraining instances from raw text: documents, segment packing, NSP pairs, masking.

The algorithm is Google's `create_pretraining_data.py`, step for step and random draw for
random draw: given the same documents and a `random.Random` in the same state, the
functions here produce exactly the original's instances (tests compare them). What
differs is the representation and the scale:

* tokens are vocabulary ids from the moment a line is tokenized, and `[CLS]`/`[SEP]`
  are known by position, so nothing is looked up twice;
* an instance is A's and B's windows (offsets) over the chunk's flat token list
  (`CompactInstances`), built by one inlined loop (`create_compact_instances`), so
  truncating a multi-megabyte line is linear, not quadratic, and nothing is copied;
* masking is either drawn exactly as the original (one Python draw per candidate
  position) or, by default in the pipeline, vectorised with numpy for a whole chunk
  (`mask_vectorized`: the same rules and distribution, other draws);
* a chunk's records are serialised at once with numpy (`CompactSerializer`, byte-
  identical to the per-instance `InstanceSerializer`) and TFRecord-framed
  (`features.frame_concatenated`);
* the corpus is processed in chunks (`plan_chunks`): byte ranges of the input files cut
  at document boundaries, each read, tokenized, turned into instances and serialised
  independently (`process_chunk`) with its own random generators (`chunk_rng`,
  `chunk_masking_rng`), so chunks run in parallel processes and memory does not grow
  with the corpus.

No TensorFlow here (worker processes never import it); numpy only. Randomness is always
an injected generator.
"""

from __future__ import annotations

import dataclasses
import random
import struct
from typing import Callable, List, Optional, Sequence

import numpy as np

from data_prep import features, fileio, tokenization

MIN_MAX_SEQ_LENGTH = 5  # [CLS] A [SEP] B [SEP] with A and B of at least one token each.


class InputError(ValueError):
    """Bad input text: the message names the file, line and byte offset."""


class ConfigError(ValueError):
    """An invalid generation setting: the message names the flag."""


@dataclasses.dataclass(frozen=True)
class PretrainingConfig:
    """Generation settings; field names are the original's flag names."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    do_whole_word_mask: bool = False

    def validate(self) -> None:
        """Raises ConfigError naming the offending flag and the accepted range."""
        if self.max_seq_length < MIN_MAX_SEQ_LENGTH:
            raise ConfigError(
                f"--max_seq_length={self.max_seq_length} is too small: it must be at least "
                f"{MIN_MAX_SEQ_LENGTH} to hold [CLS] A [SEP] B [SEP] with one token in each "
                f"of A and B")
        if self.max_predictions_per_seq < 1:
            raise ConfigError(
                f"--max_predictions_per_seq={self.max_predictions_per_seq} must be at least 1")
        if self.max_predictions_per_seq > self.max_seq_length:
            raise ConfigError(
                f"--max_predictions_per_seq={self.max_predictions_per_seq} is larger than "
                f"--max_seq_length={self.max_seq_length}: at most "
                f"{self.max_seq_length - 3} tokens of a sequence can be masked")
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise ConfigError(f"--masked_lm_prob={self.masked_lm_prob} must be in (0, 1]")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError(f"--short_seq_prob={self.short_seq_prob} must be in [0, 1]")
        if self.dupe_factor < 1:
            raise ConfigError(f"--dupe_factor={self.dupe_factor} must be at least 1")


@dataclasses.dataclass(frozen=True)
class MaskingVocab:
    """What masking needs from the vocabulary, as ids."""

    cls_id: int
    sep_id: int
    mask_id: int
    # The original draws a random replacement from `list(vocab.keys())`: every distinct
    # token (special and [unused] ones included), mapped to its id.
    replacement_ids: tuple
    # is_continuation[id] == 1 for `##` pieces (whole-word masking joins them to the word).
    is_continuation: bytes

    @classmethod
    def from_vocab(cls, vocab) -> "MaskingVocab":
        size = max(vocab.values()) + 1
        continuation = bytearray(size)
        for token, token_id in vocab.items():
            if token.startswith("##"):
                continuation[token_id] = 1
        return cls(cls_id=vocab["[CLS]"], sep_id=vocab["[SEP]"], mask_id=vocab["[MASK]"],
                   replacement_ids=tuple(vocab.values()), is_continuation=bytes(continuation))


class Instance:
    """One training pair: `[CLS] A [SEP] B [SEP]` as ids, masking already applied."""

    __slots__ = ("input_ids", "num_tokens_a", "masked_lm_positions", "masked_lm_ids",
                 "is_random_next")

    def __init__(self, input_ids, num_tokens_a, masked_lm_positions, masked_lm_ids,
                 is_random_next):
        self.input_ids = input_ids
        self.num_tokens_a = num_tokens_a
        self.masked_lm_positions = masked_lm_positions
        self.masked_lm_ids = masked_lm_ids
        self.is_random_next = is_random_next

    @property
    def segment_ids(self) -> List[int]:
        first = self.num_tokens_a + 2
        return [0] * first + [1] * (len(self.input_ids) - first)

    def to_features(self) -> dict:
        """Unpadded feature values, named as in `features.PRETRAINING`."""
        n = len(self.input_ids)
        k = len(self.masked_lm_positions)
        return {
            "input_ids": self.input_ids,
            "input_mask": [1] * n,
            "segment_ids": self.segment_ids,
            "masked_lm_positions": self.masked_lm_positions,
            "masked_lm_ids": self.masked_lm_ids,
            "masked_lm_weights": [1.0] * k,
            "next_sentence_labels": [1 if self.is_random_next else 0],
        }


@dataclasses.dataclass
class Stats:
    """Counts behind the run summary; chunks' stats add up."""

    input_bytes: int = 0
    lines: int = 0
    empty_token_lines: int = 0  # non-blank lines that tokenize to nothing (skipped)
    documents: int = 0
    split_documents: int = 0  # documents cut at a chunk boundary (no blank line in reach)
    instances: int = 0
    tokens: int = 0  # real tokens, [CLS]/[SEP] included
    short_instances: int = 0  # fewer tokens than max_seq_length
    random_next: int = 0
    masked: int = 0
    masked_as_mask: int = 0
    masked_kept: int = 0
    masked_random: int = 0

    def add(self, other: "Stats") -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def count_instance(self, instance: Instance, max_seq_length: int) -> None:
        n = len(instance.input_ids)
        self.instances += 1
        self.tokens += n
        self.short_instances += n < max_seq_length
        self.random_next += instance.is_random_next
        self.masked += len(instance.masked_lm_positions)

    def summary(self) -> dict:
        """Counts plus the derived shares (None where undefined)."""

        def share(num, den):
            return round(num / den, 6) if den else None

        out = dataclasses.asdict(self)
        out.update(
            masked_fraction=share(self.masked, self.tokens),
            random_next_share=share(self.random_next, self.instances),
            short_instance_share=share(self.short_instances, self.instances),
            mean_tokens_per_instance=share(self.tokens, self.instances),
            mask_token_share=share(self.masked_as_mask, self.masked),
            kept_token_share=share(self.masked_kept, self.masked),
            random_token_share=share(self.masked_random, self.masked),
        )
        return out


# ---------------------------------------------------------------------------------------
# Instance creation (the original's algorithm).


def truncate_seq_pair(len_a: int, len_b: int, max_num_tokens: int, rng: random.Random):
    """Trims A and B one token at a time, from the longer (B on a tie), front or back.

    Returns the kept windows `(a_start, a_end, b_start, b_end)`; one coin flip per
    removed token, as the original, but on offsets so the cost is linear.
    """
    a_start, a_end, b_start, b_end = 0, len_a, 0, len_b
    flip = rng.random
    excess = len_a + len_b - max_num_tokens
    while excess > 0:
        if a_end - a_start > b_end - b_start:
            if flip() < 0.5:
                a_start += 1
            else:
                a_end -= 1
        else:
            if flip() < 0.5:
                b_start += 1
            else:
                b_end -= 1
        excess -= 1
    return a_start, a_end, b_start, b_end


def _window(segments: Sequence[Sequence[int]], start: int, end: int) -> List[int]:
    """Tokens [start, end) of the concatenation of `segments`, copying only those."""
    out: List[int] = []
    pos = 0
    for segment in segments:
        seg_end = pos + len(segment)
        if seg_end > start:
            out.extend(segment[max(start - pos, 0):end - pos])
        pos = seg_end
        if pos >= end:
            break
    return out


_BIT_LENGTHS = [n.bit_length() for n in range(4097)]


def shuffle(items: list, rng: random.Random) -> None:
    """`rng.shuffle(items)`: the same permutation from the same random draws, faster.

    The hot loop of masking; inlines CPython's Fisher-Yates with rejection sampling
    (`_randbelow_with_getrandbits`). Other generator types use their own `shuffle`.
    """
    if type(rng) is not random.Random:
        rng.shuffle(items)
        return
    getrandbits = rng.getrandbits
    bits = _BIT_LENGTHS if len(items) < len(_BIT_LENGTHS) else \
        [n.bit_length() for n in range(len(items) + 1)]
    for i in range(len(items) - 1, 0, -1):
        k = bits[i + 1]
        j = getrandbits(k)
        while j > i:
            j = getrandbits(k)
        items[i], items[j] = items[j], items[i]


def create_masked_lm_predictions(input_ids: List[int], num_tokens_a: int,
                                 config: PretrainingConfig, vocab: MaskingVocab,
                                 rng: random.Random, stats: Optional[Stats] = None):
    """Masks `input_ids` (`[CLS] A [SEP] B [SEP]`) in place.

    Returns (masked_lm_positions, masked_lm_ids), sorted by position.
    """
    n = len(input_ids)
    sep_a = num_tokens_a + 1
    if config.do_whole_word_mask:
        # A `##` piece joins the previous candidate word, even across A's [SEP] (the
        # original skips special tokens without closing the group).
        continuation = vocab.is_continuation
        candidates = []
        for i in range(1, n - 1):
            if i == sep_a:
                continue
            if candidates and continuation[input_ids[i]]:
                candidates[-1].append(i)
            else:
                candidates.append([i])
    else:
        candidates = list(range(1, sep_a))
        candidates.extend(range(sep_a + 1, n - 1))
    shuffle(candidates, rng)

    num_to_predict = min(config.max_predictions_per_seq,
                         max(1, int(round(n * config.masked_lm_prob))))
    if not config.do_whole_word_mask:
        chosen = candidates[:num_to_predict]
    else:
        chosen = []
        for group in candidates:
            if len(chosen) >= num_to_predict:
                break
            # A word that would exceed the count is skipped, not cut.
            if len(chosen) + len(group) > num_to_predict:
                continue
            chosen.extend(group)

    draw = rng.random
    replacements = vocab.replacement_ids
    last_replacement = len(replacements) - 1
    originals = {}
    as_mask = kept = replaced = 0
    for index in chosen:
        originals[index] = input_ids[index]
        if draw() < 0.8:
            input_ids[index] = vocab.mask_id
            as_mask += 1
        elif draw() < 0.5:
            kept += 1
        else:
            input_ids[index] = replacements[rng.randint(0, last_replacement)]
            replaced += 1
    if stats is not None:
        stats.masked_as_mask += as_mask
        stats.masked_kept += kept
        stats.masked_random += replaced
    positions = sorted(originals)
    return positions, [originals[p] for p in positions]


def create_instances_from_document(documents: Sequence[Sequence[Sequence[int]]],
                                   document_index: int, config: PretrainingConfig,
                                   vocab: MaskingVocab, rng: random.Random,
                                   stats: Optional[Stats] = None) -> List[Instance]:
    """All instances of one document in one dupe pass.

    `documents[d][s]` is segment (sentence) s of document d, as non-empty id lists.
    """
    document = documents[document_index]
    max_num_tokens = config.max_seq_length - 3
    # Drawn once per document and pass, not per instance.
    target_seq_length = max_num_tokens
    if rng.random() < config.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances = []
    chunk: list = []
    chunk_length = 0
    i = 0
    last = len(document) - 1
    while i <= last:
        segment = document[i]
        chunk.append(segment)
        chunk_length += len(segment)
        if i == last or chunk_length >= target_seq_length:
            a_end = 1
            if len(chunk) >= 2:
                a_end = rng.randint(1, len(chunk) - 1)
            a_segments = chunk[:a_end]
            len_a = sum(map(len, a_segments))

            if len(chunk) == 1 or rng.random() < 0.5:
                is_random_next = True
                target_b_length = target_seq_length - len_a
                for _ in range(10):
                    random_index = rng.randint(0, len(documents) - 1)
                    if random_index != document_index:
                        break
                random_document = documents[random_index]
                random_start = rng.randint(0, len(random_document) - 1)
                b_segments = []
                len_b = 0
                for j in range(random_start, len(random_document)):
                    b_segments.append(random_document[j])
                    len_b += len(random_document[j])
                    if len_b >= target_b_length:
                        break
                # The chunk's segments after A were not used: go back and reuse them.
                i -= len(chunk) - a_end
            else:
                is_random_next = False
                b_segments = chunk[a_end:]
                len_b = chunk_length - len_a

            a_lo, a_hi, b_lo, b_hi = truncate_seq_pair(len_a, len_b, max_num_tokens, rng)
            tokens_a = _window(a_segments, a_lo, a_hi)
            tokens_b = _window(b_segments, b_lo, b_hi)
            input_ids = [vocab.cls_id]
            input_ids += tokens_a
            input_ids.append(vocab.sep_id)
            input_ids += tokens_b
            input_ids.append(vocab.sep_id)
            positions, labels = create_masked_lm_predictions(
                input_ids, len(tokens_a), config, vocab, rng, stats)
            instance = Instance(input_ids, len(tokens_a), positions, labels, is_random_next)
            if stats is not None:
                stats.count_instance(instance, config.max_seq_length)
            instances.append(instance)
            chunk = []
            chunk_length = 0
        i += 1
    return instances


def _make_randbelow(rng: random.Random):
    """`rng._randbelow` (what `randint`, `randrange` and `shuffle` draw with), as one
    cheap call: the same getrandbits draws (checked at import, `_INLINE_OK`)."""
    if type(rng) is not random.Random or not _INLINE_OK:
        return rng._randbelow
    getrandbits = rng.getrandbits

    def randbelow(n):
        k = n.bit_length()
        r = getrandbits(k)
        while r >= n:
            r = getrandbits(k)
        return r

    return randbelow


def _check_inline() -> bool:
    """Whether the inlined draws equal this Python's `random` (they follow CPython 3.x's
    `_randbelow_with_getrandbits`); if not, the generator's own methods are used."""
    global _INLINE_OK
    _INLINE_OK = True
    try:
        for seed in range(3):
            r1, r2 = random.Random(seed), random.Random(seed)
            randbelow = _make_randbelow(r2)
            for n in (1, 2, 3, 5, 64, 100, 1000, 4096, 10**6):
                if r1.randint(0, n - 1) != randbelow(n):
                    return False
            a, b = list(range(130)), list(range(130))
            r1.shuffle(a)
            shuffle(b, r2)
            if a != b or r1.random() != r2.random():
                return False
        return True
    finally:
        _INLINE_OK = False


_INLINE_OK = False  # set at the end of the module by _check_inline()


class CompactInstances:
    """A chunk's instances as windows over one flat token list, before serialisation.

    Instance t is `[CLS] toks[a_start:a_start+a_len] [SEP] toks[b_start:b_start+b_len]
    [SEP]` (A and B are runs of consecutive segments, trimmed at either end, so each is one
    window of the flat list), with `num_masked[t]` masked positions, ascending, in
    `positions` and the value written there in `values` (-1: the original token is kept).
    `order` is the final (shuffled) order of the instances.
    """

    __slots__ = ("tokens", "a_start", "a_len", "b_start", "b_len", "random_next",
                 "num_masked", "positions", "values", "order")

    def __init__(self, tokens):
        self.tokens = tokens
        self.a_start, self.a_len, self.b_start, self.b_len = [], [], [], []
        self.random_next, self.num_masked, self.positions, self.values = [], [], [], []
        self.order = []

    def __len__(self):
        return len(self.a_start)

    def to_instances(self, vocab: "MaskingVocab") -> List[Instance]:
        """The instances as `Instance` objects, in the final order (slow; for tests)."""
        toks, out, offsets, pos = self.tokens, [], [], 0
        num_masked = self.num_masked if len(self.num_masked) else [0] * len(self)
        for k in num_masked:
            offsets.append(pos)
            pos += int(k)
        for t in self.order:
            a0, la, b0, lb = self.a_start[t], self.a_len[t], self.b_start[t], self.b_len[t]
            ids = [vocab.cls_id, *toks[a0:a0 + la], vocab.sep_id, *toks[b0:b0 + lb],
                   vocab.sep_id]
            lo, hi = offsets[t], offsets[t] + int(num_masked[t])
            positions = [int(p) for p in self.positions[lo:hi]]
            labels = [ids[p] for p in positions]
            for p, v in zip(positions, [int(v) for v in self.values[lo:hi]]):
                if v >= 0:
                    ids[p] = v
            out.append(Instance(ids, la, positions, labels, bool(self.random_next[t])))
        return out


def create_compact_instances(documents: list, config: PretrainingConfig,
                             vocab: MaskingVocab, rng: random.Random,
                             stats: Optional[Stats] = None,
                             masking_rng: Optional["np.random.Generator"] = None,
                             mask: bool = True) -> CompactInstances:
    """The original's `create_training_instances` after reading, draw for draw: shuffle
    the documents (in place), `dupe_factor` passes of `create_instances_from_document`
    over them, shuffle the instances; in the compact representation.

    The hot loop of the pipeline: the same steps as `create_instances_from_document` and
    `create_masked_lm_predictions`, inlined, on offsets instead of token lists.

    With `masking_rng` (a numpy Generator), masking (not whole-word masking) is instead
    drawn afterwards for all instances at once by `mask_vectorized`: the same
    distribution, not the original's draws, and several times faster (masking is most of
    the original's random draws: a Fisher-Yates shuffle of every instance's positions).
    Either way `rng` then draws exactly what the original draws to build the instances
    (pairs, lengths, random next documents, truncation, the final shuffle), minus the
    masking draws.

    With `mask=False` nothing is masked (`num_masked`, `positions` and `values` stay
    empty): the unmasked pairs of dynamic masking (`features.PRETRAINING_UNMASKED`),
    built with exactly the draws of the masked modes' instances.
    """
    vectorized_masking = not mask or (
        masking_rng is not None and not config.do_whole_word_mask)
    shuffle(documents, rng)
    # Flat tokens: document d's segment s starts at seg_starts[d][s].
    tokens: list = []
    seg_starts, seg_lens = [], []
    for document in documents:
        starts, lens = [], []
        for segment in document:
            starts.append(len(tokens))
            lens.append(len(segment))
            tokens += segment
        seg_starts.append(starts)
        seg_lens.append(lens)
    out = CompactInstances(tokens)
    randbelow = _make_randbelow(rng)
    draw = rng.random
    flip = rng.random
    num_docs = len(documents)
    max_num_tokens = config.max_seq_length - 3
    max_seq_length = config.max_seq_length
    short_seq_prob = config.short_seq_prob
    masked_lm_prob = config.masked_lm_prob
    max_predictions = config.max_predictions_per_seq
    whole_word = config.do_whole_word_mask
    replacements = vocab.replacement_ids
    num_replacements = len(replacements)
    mask_id = vocab.mask_id
    a_start_out, a_len_out = out.a_start.append, out.a_len.append
    b_start_out, b_len_out = out.b_start.append, out.b_len.append
    random_next_out, num_masked_out = out.random_next.append, out.num_masked.append
    positions_out, values_out = out.positions.extend, out.values.extend
    getrandbits = rng.getrandbits if type(rng) is random.Random and _INLINE_OK else None
    bit_lengths = _BIT_LENGTHS
    max_inline = len(_BIT_LENGTHS) - 1
    shuffle_steps: dict = {}  # n -> [(step, bits drawn)] of a shuffle of n - 3 candidates
    as_mask = kept = replaced = n_tokens = n_short = n_random = n_masked = 0
    for _ in range(config.dupe_factor):
        for document_index in range(num_docs):
            starts = seg_starts[document_index]
            lens = seg_lens[document_index]
            target_seq_length = max_num_tokens
            if draw() < short_seq_prob:
                target_seq_length = 2 + randbelow(max_num_tokens - 1)
            first = 0  # the current chunk is segments first..i
            chunk_length = 0
            i = 0
            last = len(lens) - 1
            while i <= last:
                chunk_length += lens[i]
                if i == last or chunk_length >= target_seq_length:
                    count = i - first + 1
                    a_end = 1
                    if count >= 2:
                        a_end = 1 + randbelow(count - 1)
                    len_a = sum(lens[first:first + a_end])
                    a0 = starts[first]
                    if count == 1 or draw() < 0.5:
                        is_random_next = True
                        target_b_length = target_seq_length - len_a
                        for _ in range(10):
                            random_index = randbelow(num_docs)
                            if random_index != document_index:
                                break
                        r_lens = seg_lens[random_index]
                        random_start = randbelow(len(r_lens))
                        b0 = seg_starts[random_index][random_start]
                        len_b = 0
                        for j in range(random_start, len(r_lens)):
                            len_b += r_lens[j]
                            if len_b >= target_b_length:
                                break
                        # The chunk's segments after A were not used: go back to them.
                        i = first + a_end - 1
                    else:
                        is_random_next = False
                        b0 = starts[first + a_end]
                        len_b = chunk_length - len_a
                    # truncate_seq_pair, inlined.
                    la, lb = len_a, len_b
                    excess = la + lb - max_num_tokens
                    while excess > 0:
                        if la > lb:
                            if flip() < 0.5:
                                a0 += 1
                            la -= 1
                        else:
                            if flip() < 0.5:
                                b0 += 1
                            lb -= 1
                        excess -= 1
                    a_start_out(a0)
                    a_len_out(la)
                    b_start_out(b0)
                    b_len_out(lb)
                    random_next_out(is_random_next)
                    n = la + lb + 3
                    # create_masked_lm_predictions, inlined (whole-word masking: the
                    # general function, on the instance's ids).
                    if vectorized_masking:
                        first = i + 1
                        chunk_length = 0
                        i += 1
                        continue
                    if whole_word:
                        ids = [vocab.cls_id, *tokens[a0:a0 + la], vocab.sep_id,
                               *tokens[b0:b0 + lb], vocab.sep_id]
                        masked_before = list(ids)
                        positions, _ = create_masked_lm_predictions(ids, la, config, vocab,
                                                                    rng, stats)
                        values = [ids[p] if ids[p] != masked_before[p] else -1
                                  for p in positions]
                        k = len(positions)
                    else:
                        num_to_predict = min(max_predictions,
                                             max(1, int(round(n * masked_lm_prob))))
                        candidates = list(range(1, la + 1))
                        candidates.extend(range(la + 2, n - 1))
                        if getrandbits is not None and n < max_inline:
                            # shuffle(candidates, rng), inlined. Only the first
                            # num_to_predict are read afterwards: above them, step c
                            # just moves candidates[c] to j (its own final value unused).
                            steps = shuffle_steps.get(n)
                            if steps is None:
                                steps = shuffle_steps[n] = [
                                    (c, bit_lengths[c + 1]) for c in range(n - 4, 0, -1)]
                            for c, bits in steps:
                                j = getrandbits(bits)
                                while j > c:
                                    j = getrandbits(bits)
                                if c >= num_to_predict:
                                    candidates[j] = candidates[c]
                                else:
                                    candidates[c], candidates[j] = candidates[j], candidates[c]
                        else:
                            shuffle(candidates, rng)
                        chosen = candidates[:num_to_predict]
                        chosen.sort()
                        # The draws go in the shuffled order; the values are stored by
                        # position.
                        by_position = {}
                        for index in candidates[:num_to_predict]:
                            if draw() < 0.8:
                                by_position[index] = mask_id
                                as_mask += 1
                            elif draw() < 0.5:
                                by_position[index] = -1
                                kept += 1
                            else:
                                by_position[index] = replacements[
                                    randbelow(num_replacements)]
                                replaced += 1
                        positions = chosen
                        values = [by_position[p] for p in chosen]
                        k = len(chosen)
                    positions_out(positions)
                    values_out(values)
                    num_masked_out(k)
                    n_tokens += n
                    n_short += n < max_seq_length
                    n_random += is_random_next
                    n_masked += k
                    first = i + 1
                    chunk_length = 0
                i += 1
    if vectorized_masking:
        n_tokens, n_short, n_random = _count_vectorized(out, max_seq_length)
        if mask:
            n_masked, as_mask, kept, replaced = mask_vectorized(out, config, vocab,
                                                                masking_rng)
    order = list(range(len(out.a_start)))
    shuffle(order, rng)
    out.order = order
    if stats is not None:
        stats.instances += len(order)
        stats.tokens += n_tokens
        stats.short_instances += n_short
        stats.random_next += n_random
        stats.masked += n_masked
        stats.masked_as_mask += as_mask
        stats.masked_kept += kept
        stats.masked_random += replaced
    return out


def _count_vectorized(out: CompactInstances, max_seq_length: int):
    n = np.array(out.a_len, dtype=np.int64) + np.array(out.b_len, dtype=np.int64) + 3
    return int(n.sum()), int((n < max_seq_length).sum()), int(sum(out.random_next))


def mask_vectorized(out: CompactInstances, config: PretrainingConfig, vocab: MaskingVocab,
                    gen: "np.random.Generator", block: int = 4096):
    """Masks all instances of `out` at once (fills positions, values, num_masked) with
    the original's rules and distribution, drawn from `gen`: per instance,
    `min(max_predictions_per_seq, max(1, round(n * masked_lm_prob)))` positions (half to
    even, as Python's round), a uniformly random subset of the tokens other than
    [CLS]/[SEP] (random keys, smallest first), each then [MASK] with probability 0.8,
    kept 0.1, a uniformly random vocabulary entry 0.1. Returns (masked, as_mask, kept,
    replaced) counts."""
    la_all = np.array(out.a_len, dtype=np.int64)
    n_all = la_all + np.array(out.b_len, dtype=np.int64) + 3
    seq, preds = config.max_seq_length, config.max_predictions_per_seq
    num_all = np.minimum(preds, np.maximum(1, np.rint(n_all * config.masked_lm_prob)
                                           .astype(np.int64)))
    replacements = np.array(vocab.replacement_ids, dtype=np.int64)
    col = np.arange(seq)
    slot = np.arange(preds)
    # A key is one uint64: 63 - index_bits random bits (ties as rare as float64's), then
    # the column in the low bits (so sorting keys sorts columns by key, no argsort);
    # the top bit marks a column that is not a candidate, which sorts last.
    index_bits = max(1, (seq - 1).bit_length())
    index_mask = np.uint64((1 << index_bits) - 1)
    not_candidate = np.uint64(1 << 63)
    positions, values, counts = [], [], []
    as_mask = kept = 0
    for lo in range(0, len(n_all), block):
        la = la_all[lo:lo + block, None]
        n = n_all[lo:lo + block, None]
        rows = len(n)
        keys = gen.bit_generator.random_raw(rows * seq).reshape(rows, seq)
        keys >>= np.uint64(index_bits + 1)
        keys <<= np.uint64(index_bits)
        keys |= col.astype(np.uint64)
        candidate = (col >= 1) & (col < n - 1) & (col != la + 1)
        keys[~candidate] |= not_candidate
        if preds < seq:
            smallest = np.partition(keys, preds - 1, axis=1)[:, :preds]
            smallest.sort(axis=1)
        else:
            smallest = np.sort(keys, axis=1)
        # The first `num` by key, if they are tokens (fewer when the sequence is short).
        chosen = (slot < num_all[lo:lo + block, None]) & (smallest < not_candidate)
        smallest = (smallest & index_mask).astype(np.int64)
        ascending = np.sort(np.where(chosen, smallest, seq), axis=1)
        k = chosen.sum(axis=1)
        real = slot < k[:, None]
        u = gen.random((rows, preds))
        replacement = replacements[gen.integers(0, len(replacements), (rows, preds))]
        value = np.where(u < 0.8, vocab.mask_id, np.where(u < 0.9, -1, replacement))
        as_mask += int(((u < 0.8) & real).sum())
        kept += int(((u >= 0.8) & (u < 0.9) & real).sum())
        positions.append(ascending[real])
        values.append(value[real])
        counts.append(k)
    out.positions = np.concatenate(positions) if positions else np.zeros(0, np.int64)
    out.values = np.concatenate(values) if values else np.zeros(0, np.int64)
    out.num_masked = np.concatenate(counts) if counts else np.zeros(0, np.int64)
    masked = int(out.num_masked.sum())
    return masked, as_mask, kept, masked - as_mask - kept


def create_training_instances(documents: list, config: PretrainingConfig,
                              vocab: MaskingVocab, rng: random.Random,
                              stats: Optional[Stats] = None,
                              masking_rng: Optional["np.random.Generator"] = None,
                              ) -> List[Instance]:
    """The original's `create_training_instances` after reading: shuffle documents (in
    place), `dupe_factor` passes over them, then shuffle the instances (see
    `create_compact_instances` for `masking_rng`)."""
    return create_compact_instances(documents, config, vocab, rng, stats,
                                    masking_rng).to_instances(vocab)


# ---------------------------------------------------------------------------------------
# Reading: byte ranges of input files -> documents of id segments.


@dataclasses.dataclass(frozen=True)
class ByteRange:
    path: str
    start: int
    end: int


def line_number_at(path: str, offset: int) -> int:
    """1-based number of the line holding byte `offset` (used for error messages)."""
    count = 0
    with fileio.open_file(path, "rb") as f:
        remaining = offset
        while remaining > 0:
            block = f.read(min(remaining, 1 << 20))
            if not block:
                break
            count += block.count(b"\n")
            remaining -= len(block)
    return count + 1


def _blank(line: bytes) -> bool:
    return not line.strip()


def _find_cut(f, target: int, size: int, search_bytes: int):
    """A cut offset at or after `target`: just after a blank line if one starts within
    `search_bytes`, else at the first line start after `target`. Returns (offset, found)."""
    f.seek(target)
    f.readline()  # the rest of the line holding `target`
    fallback = f.tell()
    while f.tell() < size:
        line = f.readline()
        if _blank(line):
            return f.tell(), True
        if f.tell() - target > search_bytes:
            break
    if fallback >= size:
        return size, True
    return fallback, False


def plan_chunks(paths: Sequence[str], chunk_bytes: int,
                search_bytes: Optional[int] = None):
    """Cuts the input files into chunks of about `chunk_bytes` at document boundaries.

    A chunk is a tuple of ByteRanges (small files are packed together, large ones cut).
    Where no blank line lies within `search_bytes` (default: `chunk_bytes`) after a cut
    point, the document is cut at a line boundary instead. Returns (chunks, warnings).
    """
    search_bytes = search_bytes or chunk_bytes
    chunks, current, current_size, warnings = [], [], 0, []
    for path in paths:
        size = fileio.getsize(path)
        pos = 0
        with fileio.open_file(path, "rb") as f:
            while pos < size:
                want = chunk_bytes - current_size
                if size - pos <= want:
                    current.append(ByteRange(path, pos, size))
                    current_size += size - pos
                    break
                cut, found = _find_cut(f, pos + want, size, search_bytes)
                current.append(ByteRange(path, pos, cut))
                chunks.append(tuple(current))
                current, current_size = [], 0
                if not found:
                    warnings.append(
                        f"{path}:{line_number_at(path, cut)}: no blank line (document "
                        f"boundary) within {search_bytes / 1e6:.1f} MB after byte "
                        f"{pos + want}; the document is split into pieces here")
                pos = cut
        if current_size >= chunk_bytes:
            chunks.append(tuple(current))
            current, current_size = [], 0
    if current:
        chunks.append(tuple(current))
    return chunks, warnings


TokenizeIds = Callable[[str], List[int]]


def read_documents(ranges: Sequence[ByteRange], tokenize_ids: TokenizeIds,
                   stats: Optional[Stats] = None, starts: Optional[list] = None) -> list:
    """Documents of the byte ranges, read as the original reads its files.

    Lines end at "\\n"; each is stripped; a blank line ends the document; a line that
    tokenizes to nothing is skipped without ending it; empty documents are dropped.
    Invalid UTF-8 raises InputError naming the file, line and byte offset.

    With a list `starts`, the `(path, byte offset)` of each document's first kept line is
    appended to it, in order: a key of the document that does not depend on how the
    files were cut into ranges (the Beam pipeline's document ids).
    """
    stats = stats if stats is not None else Stats()
    documents: list = []
    current: list = []
    current_start = None
    for byte_range in ranges:
        with fileio.open_file(byte_range.path, "rb") as f:
            f.seek(byte_range.start)
            raw = f.read(max(0, byte_range.end - byte_range.start))
            if raw and not raw.endswith(b"\n"):
                raw += f.readline()  # a range ends at a line end (or the file's end)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            offset = byte_range.start + err.start
            raise InputError(
                f"{byte_range.path}:{line_number_at(byte_range.path, offset)}: "
                f"invalid UTF-8 at byte offset {offset} ({err.reason}); "
                f"the input must be UTF-8 text") from None
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()  # after the last "\n": not a line
        stats.lines += len(lines)
        stats.input_bytes += len(raw)
        offsets = None
        if starts is not None:  # "\n" is one byte in UTF-8: the lines of raw, 1:1
            offsets = [byte_range.start]
            for line_bytes in raw.split(b"\n")[:len(lines) - 1]:
                offsets.append(offsets[-1] + len(line_bytes) + 1)
        empty_token_lines = 0
        for number, line in enumerate(lines):
            line = line.strip()
            if not line:
                if current:
                    documents.append(current)
                    if starts is not None:
                        starts.append(current_start)
                    current = []
                continue
            ids = tokenize_ids(line)
            if ids:
                if not current and starts is not None:
                    current_start = (byte_range.path, offsets[number])
                current.append(ids)
            else:
                empty_token_lines += 1
        stats.empty_token_lines += empty_token_lines
    if current:
        documents.append(current)
        if starts is not None:
            starts.append(current_start)
    stats.documents += len(documents)
    return documents


# ---------------------------------------------------------------------------------------
# One chunk, end to end: the unit of work of a worker process.


def chunk_rng(seed: int, chunk_index: int) -> random.Random:
    """The generator of one chunk. Chunk 0 uses the seed itself, so that a corpus that
    fits in one chunk gives exactly the original's instances, in the original's order."""
    if chunk_index == 0:
        return random.Random(seed)
    return random.Random(f"{seed}/chunk/{chunk_index}")


@dataclasses.dataclass(frozen=True)
class ChunkTask:
    index: int
    ranges: tuple
    vocab_file: str
    do_lower_case: bool
    config: PretrainingConfig
    seed: int
    # Draw everything as the original does (Python's random, in its order); otherwise
    # masking is vectorised with numpy (`mask_vectorized`).
    exact_draws: bool = False
    # Write the pairs unmasked (features.PRETRAINING_UNMASKED) for masking on the fly.
    dynamic_masking: bool = False


def chunk_masking_rng(seed: int, chunk_index: int) -> "np.random.Generator":
    """The numpy generator of one chunk's vectorised masking."""
    return np.random.default_rng(
        random.Random(f"{seed}/masking/{chunk_index}").getrandbits(128))


@dataclasses.dataclass
class ChunkResult:
    index: int
    # The chunk's records in its shuffled order, already TFRecord-framed
    # (`features.frame_records`), as one string: one object to pass between processes.
    data: bytes
    lengths: list  # framed length of each record, in order
    stats: Stats

    def records(self) -> list:
        """The framed records, one string each."""
        data, out, pos = self.data, [], 0
        for length in self.lengths:
            out.append(data[pos:pos + length])
            pos += length
        return out


_TOKENIZERS: dict = {}  # per process: (vocab_file, do_lower_case) -> (tokenize_ids, MaskingVocab)


def load_tokenizer(vocab_file: str, do_lower_case: bool):
    """(tokenize_ids, MaskingVocab) for a vocab, built once per process."""
    key = (vocab_file, do_lower_case)
    if key not in _TOKENIZERS:
        tokenizer = tokenization.FullTokenizer(vocab_file=vocab_file,
                                               do_lower_case=do_lower_case)
        _TOKENIZERS[key] = (tokenizer.tokenize_to_ids,
                            MaskingVocab.from_vocab(tokenizer.vocab))
    return _TOKENIZERS[key]


_ONE_FLOAT32 = struct.pack("<f", 1.0)


class InstanceSerializer:
    """`encoder.encode(instance.to_features())`, fast: only the ids are encoded per
    instance; the map entries of the mask, segment ids, weights and label depend on a
    few lengths only and are cached."""

    def __init__(self, encoder: features.ExampleEncoder):
        self.encoder = encoder
        self._mask: dict = {}
        self._segments: dict = {}
        self._weights: dict = {}
        self._labels = {flag: encoder.entry("next_sentence_labels", bytes([flag]), 1)
                        for flag in (False, True)}

    def __call__(self, instance: Instance) -> bytes:
        encoder, packed = self.encoder, features.packed_uint
        n = len(instance.input_ids)
        first = instance.num_tokens_a + 2
        k = len(instance.masked_lm_positions)
        mask = self._mask.get(n)
        if mask is None:
            mask = self._mask[n] = encoder.entry("input_mask", b"\x01" * n, n)
        segments = self._segments.get((first, n))
        if segments is None:
            segments = self._segments[first, n] = encoder.entry(
                "segment_ids", b"\x00" * first + b"\x01" * (n - first), n)
        weights = self._weights.get(k)
        if weights is None:
            weights = self._weights[k] = encoder.entry("masked_lm_weights",
                                                       _ONE_FLOAT32 * k, k)
        return encoder.encode_entries((
            encoder.entry("input_ids", packed(instance.input_ids), n),
            mask,
            segments,
            encoder.entry("masked_lm_positions", packed(instance.masked_lm_positions), k),
            encoder.entry("masked_lm_ids", packed(instance.masked_lm_ids), k),
            weights,
            self._labels[bool(instance.is_random_next)],
        ))


def serialize_instance(instance: Instance, encoder: features.ExampleEncoder) -> bytes:
    """One instance's tf.train.Example bytes (see InstanceSerializer for the fast path)."""
    return InstanceSerializer(encoder)(instance)


def _varints(values, np):
    """Vectorised varints of a non-negative integer array: (bytes [..., w] uint8, which
    of them are used [..., w] bool, number used [...]), w the widest varint present."""
    top = int(values.max()) if values.size else 0
    width = max(1, (top.bit_length() + 6) // 7)
    if width == 1:
        return (values.astype(np.uint8)[..., None], np.ones(values.shape + (1,), bool),
                np.ones(values.shape, dtype=np.int64))
    if width == 2:  # (vocab ids below 16,384) both bytes at once, as one uint16
        values = values.astype(np.uint16)
        more = values >= 128
        pair = (values & np.uint16(0x7F)) | (values >> np.uint16(7) << np.uint16(8))
        pair |= more.view(np.uint8).astype(np.uint16) << np.uint16(7)
        used = np.empty(values.shape + (2,), dtype=bool)
        used[..., 0] = True
        used[..., 1] = more
        return (pair.astype("<u2", copy=False).view(np.uint8).reshape(values.shape + (2,)),
                used, more.astype(np.int64) + 1)
    values = values.astype(np.uint64 if width > 4 else np.uint32)
    out = np.empty(values.shape + (width,), dtype=np.uint8)
    used = np.empty(values.shape + (width,), dtype=bool)
    nbytes = np.ones(values.shape, dtype=np.int64)
    for j in range(width):
        more = values >= (1 << (7 * (j + 1))) if j + 1 < 10 else np.zeros(values.shape, bool)
        group = (values >> (7 * j)).astype(np.uint8) & np.uint8(0x7F)
        group |= more.view(np.uint8) << np.uint8(7)
        out[..., j] = group
        used[..., j] = nbytes > j if j else True
        if j + 1 < width:
            nbytes += more
    return out, used, nbytes


def _varint_len(values, np):
    out = np.ones(values.shape, dtype=np.int64)
    for j in range(1, 10):
        out += values >= (1 << (7 * j))
    return out


class CompactSerializer:
    """`InstanceSerializer` for a whole `CompactInstances` at once, vectorised with numpy:
    the same bytes (tested), a few microseconds per instance instead of tens.

    Each instance's record is assembled as a row of byte columns (constant header bytes,
    varints with their used/unused bytes) and the used bytes of all rows, read in row
    order, are the records laid end to end. The encoder's schema decides the record kind:
    `features.PRETRAINING` (masked) or `features.PRETRAINING_UNMASKED` (the pairs only,
    for dynamic masking; the instances' masking, if any, is ignored).
    """

    BLOCK = 4096  # instances per step: bounds the memory of the byte matrices

    def __init__(self, encoder: features.ExampleEncoder, vocab: MaskingVocab):
        self.np = np
        self.encoder = encoder
        self.vocab = vocab
        self.seq = encoder.lengths["input_ids"]
        self.masked = "masked_lm_ids" in encoder.lengths
        self.preds = encoder.lengths["masked_lm_ids"] if self.masked else 0

    def _constant_entry_header(self, name, payload_len, count):
        return self.encoder.entry(name, b"\x00" * payload_len, count)[:-payload_len]

    def _variable_entry(self, name, payload, used, payload_len):
        """Pieces and total length of a map entry whose payload length varies by row."""
        np = self.np
        key_field, oneof = self.encoder.entry_key_and_tag(name)
        f_len = 1 + _varint_len(payload_len, np) + payload_len
        v_len = 1 + _varint_len(f_len, np) + f_len
        e_len = len(key_field) + 1 + _varint_len(v_len, np) + v_len
        pieces = [b"\x0a", _varints(e_len, np)[:2], key_field + b"\x12",
                  _varints(v_len, np)[:2], oneof, _varints(f_len, np)[:2], b"\x0a",
                  _varints(payload_len, np)[:2], (payload, used)]
        return pieces, 1 + _varint_len(e_len, np) + e_len

    def __call__(self, compact: CompactInstances):
        """(the records laid end to end as a uint8 array, their lengths), in the
        instances' final order."""
        np = self.np
        blocks = list(self.blocks(compact))
        if not blocks:
            return np.zeros(0, np.uint8), np.zeros(0, np.int64)
        return (np.concatenate([b[0] for b in blocks]),
                np.concatenate([b[1] for b in blocks]))

    def blocks(self, compact: CompactInstances):
        """`__call__` block by block (`BLOCK` instances each), so a caller that passes
        records on (the Beam pipeline) never holds all of them."""
        np = self.np
        if not len(compact):
            return
        tokens = np.fromiter(compact.tokens, dtype=np.int64, count=len(compact.tokens))
        if len(tokens) < 2**31 and (not len(tokens) or int(tokens.max()) < 2**31):
            tokens = tokens.astype(np.int32)
        # Windows of `seq` tokens starting anywhere from -seq to len(tokens) (zeros
        # outside): row t of an instance's A (or B) part is one window, copied whole.
        pad = np.zeros(self.seq, dtype=tokens.dtype)
        windows = np.lib.stride_tricks.sliding_window_view(
            np.concatenate([pad, tokens, pad]), self.seq)
        columns = dict(
            a_start=np.array(compact.a_start, dtype=np.int64),
            a_len=np.array(compact.a_len, dtype=np.int64),
            b_start=np.array(compact.b_start, dtype=np.int64),
            b_len=np.array(compact.b_len, dtype=np.int64),
            random_next=np.array(compact.random_next, dtype=np.uint8))
        order = np.array(compact.order, dtype=np.int64)
        if self.masked:
            num_masked = np.array(compact.num_masked, dtype=np.int64)
            mask_start = np.zeros(len(num_masked), dtype=np.int64)
            np.cumsum(num_masked[:-1], out=mask_start[1:])
            positions = np.append(np.array(compact.positions, dtype=np.int64), 0)
            values = np.append(np.array(compact.values, dtype=np.int64), 0)
        else:
            num_masked = mask_start = np.zeros(len(order), dtype=np.int64)
            positions = values = np.zeros(1, dtype=np.int64)
        for lo in range(0, len(order), self.BLOCK):
            rows = order[lo:lo + self.BLOCK]
            yield self._block({k: v[rows] for k, v in columns.items()}, num_masked[rows],
                              mask_start[rows], positions, values, windows)

    def _block(self, cols, num_masked, mask_start, positions, values, windows):
        np = self.np
        seq, preds, vocab = self.seq, self.preds, self.vocab
        rows = len(num_masked)
        row_index = np.arange(rows)
        la = cols["a_len"][:, None]
        n = (cols["a_len"] + cols["b_len"] + 3)[:, None]
        col = np.arange(seq)
        # Column c holds A's token a_start + c - 1 for c in 1..la, B's token
        # b_start + c - la - 2 for c in la+2..n-2: B's window, A's copied over it.
        ids = windows[cols["b_start"] - cols["a_len"] - 2 + seq]
        np.copyto(ids, windows[cols["a_start"] - 1 + seq], where=(col >= 1) & (col <= la))
        ids[col >= n - 1] = 0
        ids[:, 0] = vocab.cls_id
        ids[row_index, cols["a_len"] + 1] = vocab.sep_id
        ids[row_index, n[:, 0] - 1] = vocab.sep_id
        if self.masked:
            # Masking: positions, original ids, and the values written over them.
            slot = np.arange(preds)
            real = slot < num_masked[:, None]
            flat = np.where(real, mask_start[:, None] + slot, -1)
            pos = np.where(real, positions[flat], 0)
            new = values[flat]
            labels = np.where(real, ids[row_index[:, None], pos], 0)
            write = real & (new >= 0)
            ids[np.nonzero(write)[0], pos[write]] = new[write]

        pieces = []
        total = np.zeros(rows, dtype=np.int64)
        # input_ids
        payload, used, nbytes = _varints(ids, np)
        entry, size = self._variable_entry("input_ids", payload.reshape(rows, -1),
                                           used.reshape(rows, -1), nbytes.sum(axis=1))
        pieces += entry
        total += size
        # input_mask, segment_ids: one byte per value, constant headers.
        for name, payload in (
                ("input_mask", (col < n).astype(np.uint8)),
                ("segment_ids", ((col >= la + 2) & (col < n)).astype(np.uint8))):
            header = self._constant_entry_header(name, seq, seq)
            pieces += [header, (payload, None)]
            total += len(header) + seq
        if self.masked:
            # masked_lm_positions, masked_lm_ids: varints.
            for name, matrix in (("masked_lm_positions", pos), ("masked_lm_ids", labels)):
                payload, used, nbytes = _varints(matrix, np)
                entry, size = self._variable_entry(name, payload.reshape(rows, -1),
                                                   used.reshape(rows, -1),
                                                   nbytes.sum(axis=1))
                pieces += entry
                total += size
            # masked_lm_weights: float32 1.0 / 0.0.
            header = self._constant_entry_header("masked_lm_weights", 4 * preds, preds)
            weights = real.astype("<f4").view(np.uint8).reshape(rows, 4 * preds)
            pieces += [header, (weights, None)]
            total += len(header) + 4 * preds
        # next_sentence_labels
        header = self._constant_entry_header("next_sentence_labels", 1, 1)
        pieces += [header, (cols["random_next"][:, None], None)]
        total += len(header) + 1
        # The Example: field 1 (Features), length-delimited, around the entries.
        body = total
        pieces = [b"\x0a", _varints(body, np)[:2]] + pieces
        record_lengths = body + 1 + _varint_len(body, np)

        # Lay the pieces side by side in one byte matrix (constants broadcast), with the
        # matrix of which bytes are used; the used bytes in row order are the records.
        merged = []
        for piece in pieces:
            if isinstance(piece, bytes) and merged and isinstance(merged[-1], bytes):
                merged[-1] += piece
            else:
                merged.append(piece)
        widths = [len(p) if isinstance(p, bytes) else p[0].size // rows for p in merged]
        matrix = np.empty((rows, sum(widths)), dtype=np.uint8)
        used = np.ones((rows, sum(widths)), dtype=bool)
        start = 0
        for piece, width in zip(merged, widths):
            end = start + width
            if isinstance(piece, bytes):
                matrix[:, start:end] = np.frombuffer(piece, dtype=np.uint8)
            else:
                values, mask = piece
                matrix[:, start:end] = values.reshape(rows, width)
                if mask is not None:
                    used[:, start:end] = mask.reshape(rows, width)
            start = end
        return np.compress(used.ravel(), matrix.ravel()), record_lengths


def unit_instances(documents: list, config: PretrainingConfig, masking_vocab: MaskingVocab,
                   *, seed: int, index: int, exact_draws: bool = False,
                   dynamic_masking: bool = False,
                   stats: Optional[Stats] = None) -> CompactInstances:
    """The instances of one unit of work: a chunk of the local pipeline or a pool of the
    Beam pipeline, both numbered from 0, with the generators `chunk_rng(seed, index)` and
    (unless `exact_draws`) `chunk_masking_rng(seed, index)`. `documents` is shuffled in
    place. With `dynamic_masking` nothing is masked."""
    return create_compact_instances(
        documents, config, masking_vocab, chunk_rng(seed, index), stats,
        None if exact_draws or dynamic_masking else chunk_masking_rng(seed, index),
        mask=not dynamic_masking)


def record_encoder(config: PretrainingConfig, dynamic_masking: bool = False):
    """The `features.ExampleEncoder` of the records of a run (masked or unmasked kind)."""
    return features.pretraining_schema(dynamic_masking).encoder(
        max_seq_length=config.max_seq_length,
        max_predictions_per_seq=config.max_predictions_per_seq)


def process_chunk(task: ChunkTask) -> ChunkResult:
    """Reads, tokenizes, builds, serialises and frames one chunk's instances."""
    tokenize_ids, masking_vocab = load_tokenizer(task.vocab_file, task.do_lower_case)
    stats = Stats()
    documents = read_documents(task.ranges, tokenize_ids, stats)
    data, lengths = b"", []
    if documents:
        compact = unit_instances(documents, task.config, masking_vocab, seed=task.seed,
                                 index=task.index, exact_draws=task.exact_draws,
                                 dynamic_masking=task.dynamic_masking, stats=stats)
        del documents
        encoder = record_encoder(task.config, task.dynamic_masking)
        records, record_lengths = CompactSerializer(encoder, masking_vocab)(compact)
        del compact
        data, lengths = features.frame_concatenated(records, record_lengths)
    return ChunkResult(task.index, data, lengths, stats)


_INLINE_OK = _check_inline()
