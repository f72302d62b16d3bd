"""Owns instance creation: documents -> next-sentence pairs, the original's algorithm.

`create_compact_instances` is the original's `create_training_instances` after reading,
draw for draw (document shuffle, `dupe_factor` passes of segment packing, random next
documents, truncation, masking, the final shuffle), as one inlined loop on offsets into
the chunk's flat token list: an instance is A's and B's windows over it
(`CompactInstances`), so truncating a multi-megabyte line is linear, not quadratic, and
nothing is copied. The original's per-instance formulation is kept as a reference in
tests/reference_instances.py, which the tests compare with this one.

Without the next-sentence task (`PretrainingConfig.next_sentence_prediction` False: the
paper's "No NSP" and "LTR & No NSP" models) the packing is the same, draw for draw,
except the random-next coin, which is not drawn: B is always the rest of the gathered
sentences, the text that follows A, and a single gathered sentence makes a one-segment
instance `[CLS] A [SEP]` (B empty) instead of being paired with a random document
(docs/create_pretraining_data.md, "No next-sentence prediction").
"""

from __future__ import annotations

import random
from typing import Optional

import numpy as np

from data_prep.pretraining_data.config import PretrainingConfig
from data_prep.pretraining_data.draws import chunk_masking_rng, chunk_rng, shuffle
from data_prep.pretraining_data.masking import (
    MaskingVocab,
    create_masked_lm_predictions,
    mask_vectorized,
    two_draw_thresholds,
)
from data_prep.pretraining_data.stats import Stats


class CompactInstances:
    """A chunk's instances as windows over one flat token list, before serialisation.

    Instance t is `[CLS] toks[a_start:a_start+a_len] [SEP] toks[b_start:b_start+b_len]
    [SEP]` (A and B are runs of consecutive segments, trimmed at either end, so each is one
    window of the flat list), or `[CLS] A [SEP]` where `b_len` is 0 (only without the
    next-sentence task: `next_sentence_prediction` False), with `num_masked[t]` masked
    positions, ascending, in `positions` and the value written there in `values` (-1:
    the original token is kept). `order` is the final (shuffled) order of the instances.
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


def create_compact_instances(documents: list, config: PretrainingConfig,
                             vocab: MaskingVocab, rng: random.Random,
                             stats: Optional[Stats] = None,
                             masking_rng: Optional["np.random.Generator"] = None,
                             mask: bool = True) -> CompactInstances:
    """The original's `create_training_instances` after reading, draw for draw: shuffle
    the documents (in place), `dupe_factor` passes of the original's
    `create_instances_from_document` over them, shuffle the instances; in the compact
    representation.

    The hot loop of the pipeline: the same steps as `create_instances_from_document` (its
    per-instance form is in tests/reference_instances.py) and
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

    With `config.next_sentence_prediction` False no random next is drawn (module
    docstring): B follows A, and a one-sentence chunk is a one-segment instance.
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
    randbelow = rng.randrange  # randint(a, b) is a + randrange(b - a + 1): the same draws
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
    mask_below, keep_below = two_draw_thresholds(config.mask_token_rate,
                                                 config.random_token_rate)
    nsp = config.next_sentence_prediction
    a_start_out, a_len_out = out.a_start.append, out.a_len.append
    b_start_out, b_len_out = out.b_start.append, out.b_len.append
    random_next_out, num_masked_out = out.random_next.append, out.num_masked.append
    positions_out, values_out = out.positions.extend, out.values.extend
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
                    if nsp and (count == 1 or draw() < 0.5):
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
                    elif count == 1:  # no NSP: the sentence alone, [CLS] A [SEP]
                        is_random_next = False
                        b0 = a0 + len_a
                        len_b = 0
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
                    if not lb:  # no NSP's one-segment instance: [CLS] A [SEP]
                        n -= 1
                    if whole_word:
                        ids = [vocab.cls_id, *tokens[a0:a0 + la], vocab.sep_id,
                               *tokens[b0:b0 + lb], vocab.sep_id][:n]
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
                        shuffle(candidates, rng)
                        chosen = candidates[:num_to_predict]
                        chosen.sort()
                        # The draws go in the shuffled order; the values are stored by
                        # position.
                        by_position = {}
                        for index in candidates[:num_to_predict]:
                            if draw() < mask_below:
                                by_position[index] = mask_id
                                as_mask += 1
                            elif draw() < keep_below:
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
        n_tokens, n_short, n_random = _count_vectorized(out, max_seq_length, nsp)
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


def _count_vectorized(out: CompactInstances, max_seq_length: int,
                      next_sentence_prediction: bool = True):
    """(tokens, short instances, random nexts) of `out` (counted at once when the loop
    does not mask)."""
    b_len = np.array(out.b_len, dtype=np.int64)
    n = np.array(out.a_len, dtype=np.int64) + b_len + 3
    if not next_sentence_prediction:
        n -= b_len == 0  # one segment: [CLS] A [SEP]
    return int(n.sum()), int((n < max_seq_length).sum()), int(sum(out.random_next))


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
