"""Owns masked-LM masking: the original's 80/10/10 rule, whole-word masking, vectorised.

* `create_masked_lm_predictions`: the original's function, draw for draw, on ids (the
  whole-word mode of the local pipeline and of dynamic masking in training uses it);
* `mask_vectorized`: the same rules and distribution for all instances of a chunk at
  once with numpy, other draws (the default of the pipelines: masking is most of the
  original's random draws);
* `two_draw_thresholds` / `one_draw_thresholds`: the [MASK] / kept / random split of
  the chosen positions (`--mask_token_rate`, `--random_token_rate`; 80/10/10 by
  default) as the thresholds of the original's two draws or of one draw; the defaults
  give exactly the original's constants (0.8 and 0.5; 0.8 and 0.9), so the default
  draws, records and statistics are the original's;
* `MaskingVocab`: what masking needs of the vocabulary, as ids.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from typing import List, Optional

import numpy as np

from data_prep.pretraining_data.config import PretrainingConfig, exact_rate
from data_prep.pretraining_data.draws import shuffle
from data_prep.pretraining_data.stats import Stats


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


@functools.lru_cache(maxsize=64)  # called per instance by whole-word masking
def two_draw_thresholds(mask_token_rate: float = 0.8,
                        random_token_rate: float = 0.1) -> tuple:
    """(t1, t2) of the original's two draws per chosen position: [MASK] if a first
    uniform draw is below t1; otherwise the token is kept if a second draw is below t2,
    else replaced by a random vocabulary entry. So P([MASK]) = t1 = mask_token_rate,
    P(kept) = (1 - t1) t2 = 1 - mask_token_rate - random_token_rate, P(random) the rest;
    with t1 = 1 the second draw is never made. Computed on the rates as decimals
    (`config.exact_rate`): the defaults give exactly the original's (0.8, 0.5)."""
    mask, random_ = exact_rate(mask_token_rate), exact_rate(random_token_rate)
    if mask >= 1:
        return 1.0, 0.0
    return float(mask), float(max(0, 1 - mask - random_) / (1 - mask))


@functools.lru_cache(maxsize=64)
def one_draw_thresholds(mask_token_rate: float = 0.8,
                        random_token_rate: float = 0.1) -> tuple:
    """(c1, c2) of one uniform draw per chosen position: [MASK] below c1, kept in
    [c1, c2), a random vocabulary entry from c2 on. The defaults give exactly (0.8, 0.9),
    the constants of the vectorised masking before the rates were flags."""
    mask, random_ = exact_rate(mask_token_rate), exact_rate(random_token_rate)
    return float(mask), float(max(mask, 1 - random_))


def create_masked_lm_predictions(input_ids: List[int], num_tokens_a: int,
                                 config: PretrainingConfig, vocab: MaskingVocab,
                                 rng: random.Random, stats: Optional[Stats] = None):
    """Masks `input_ids` (`[CLS] A [SEP] B [SEP]`, or `[CLS] A [SEP]` for the one-segment
    instances of no next-sentence task) in place: each chosen position becomes [MASK],
    stays, or becomes a random vocabulary entry with the config's `mask_token_rate` /
    `random_token_rate` (`two_draw_thresholds`: the original's two draws).

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
    mask_below, keep_below = two_draw_thresholds(config.mask_token_rate,
                                                 config.random_token_rate)
    replacements = vocab.replacement_ids
    last_replacement = len(replacements) - 1
    originals = {}
    as_mask = kept = replaced = 0
    for index in chosen:
        originals[index] = input_ids[index]
        if draw() < mask_below:
            input_ids[index] = vocab.mask_id
            as_mask += 1
        elif draw() < keep_below:
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


def mask_vectorized(out, config: PretrainingConfig, vocab: MaskingVocab,
                    gen: "np.random.Generator", block: int = 4096):
    """Masks all instances of `out` (an `instances.CompactInstances`, which imports this
    module: not named here) at once (fills positions, values, num_masked) with
    the original's rules and distribution, drawn from `gen`: per instance,
    `min(max_predictions_per_seq, max(1, round(n * masked_lm_prob)))` positions (half to
    even, as Python's round), a uniformly random subset of the tokens other than
    [CLS]/[SEP] (random keys, smallest first), each then [MASK] with probability
    `mask_token_rate` (0.8), a uniformly random vocabulary entry with
    `random_token_rate` (0.1), else kept (`one_draw_thresholds`). Returns (masked,
    as_mask, kept, replaced) counts."""
    la_all = np.array(out.a_len, dtype=np.int64)
    lb_all = np.array(out.b_len, dtype=np.int64)
    n_all = la_all + lb_all + 3
    if not config.next_sentence_prediction:
        n_all -= lb_all == 0  # one segment: [CLS] A [SEP]
    mask_below, keep_below = one_draw_thresholds(config.mask_token_rate,
                                                 config.random_token_rate)
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
        value = np.where(u < mask_below, vocab.mask_id,
                         np.where(u < keep_below, -1, replacement))
        as_mask += int(((u < mask_below) & real).sum())
        kept += int(((u >= mask_below) & (u < keep_below) & real).sum())
        positions.append(ascending[real])
        values.append(value[real])
        counts.append(k)
    out.positions = np.concatenate(positions) if positions else np.zeros(0, np.int64)
    out.values = np.concatenate(values) if values else np.zeros(0, np.int64)
    out.num_masked = np.concatenate(counts) if counts else np.zeros(0, np.int64)
    masked = int(out.num_masked.sum())
    return masked, as_mask, kept, masked - as_mask - kept
