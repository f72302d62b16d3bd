"""The original's per-instance formulation of pretraining instances, the tests' reference.

The library builds instances in a compact form (`data_prep.pretraining_data.instances`:
windows over a flat token list, one inlined loop) and serialises them all at once
(`records.CompactSerializer`). Here is the same algorithm as the original states it:
one `Instance` object per pair, built document by document
(`create_instances_from_document`, `truncate_seq_pair` one token at a time) and
serialised one by one (`InstanceSerializer`). Tests compare the two forms draw for draw
and byte for byte, and compare this one with Google's code.
"""

from __future__ import annotations

import random
import struct
from typing import List, Optional, Sequence

import numpy as np

from data_prep import features
from data_prep.pretraining_data.config import PretrainingConfig
from data_prep.pretraining_data.instances import CompactInstances, create_compact_instances
from data_prep.pretraining_data.masking import MaskingVocab, create_masked_lm_predictions
from data_prep.pretraining_data.stats import Stats


class Instance:
    """One training pair: `[CLS] A [SEP] B [SEP]` as ids, masking already applied (or
    `[CLS] A [SEP]`: a one-segment instance, only without the next-sentence task)."""

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


def _count_instance(stats: Stats, instance: Instance, max_seq_length: int) -> None:
    n = len(instance.input_ids)
    stats.instances += 1
    stats.tokens += n
    stats.short_instances += n < max_seq_length
    stats.random_next += instance.is_random_next
    stats.masked += len(instance.masked_lm_positions)


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

            if config.next_sentence_prediction and (len(chunk) == 1 or rng.random() < 0.5):
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
            elif len(chunk) == 1:  # no next-sentence task: one segment, [CLS] A [SEP]
                is_random_next = False
                b_segments = []
                len_b = 0
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
            if tokens_b:
                input_ids += tokens_b
                input_ids.append(vocab.sep_id)
            positions, labels = create_masked_lm_predictions(
                input_ids, len(tokens_a), config, vocab, rng, stats)
            instance = Instance(input_ids, len(tokens_a), positions, labels, is_random_next)
            if stats is not None:
                _count_instance(stats, instance, config.max_seq_length)
            instances.append(instance)
            chunk = []
            chunk_length = 0
        i += 1
    return instances


def create_training_instances(documents: list, config: PretrainingConfig,
                              vocab: MaskingVocab, rng: random.Random,
                              stats: Optional[Stats] = None,
                              masking_rng: Optional["np.random.Generator"] = None,
                              ) -> List[Instance]:
    """The original's `create_training_instances` after reading: shuffle documents (in
    place), `dupe_factor` passes over them, then shuffle the instances (see
    `create_compact_instances` for `masking_rng`)."""
    return to_instances(create_compact_instances(documents, config, vocab, rng, stats,
                                                 masking_rng), vocab)


def to_instances(compact: CompactInstances, vocab: MaskingVocab) -> List[Instance]:
    """The instances of `compact` as `Instance` objects, in their final order."""
    toks, out, offsets, pos = compact.tokens, [], [], 0
    num_masked = compact.num_masked if len(compact.num_masked) else [0] * len(compact)
    for k in num_masked:
        offsets.append(pos)
        pos += int(k)
    for t in compact.order:
        a0, la = compact.a_start[t], compact.a_len[t]
        b0, lb = compact.b_start[t], compact.b_len[t]
        ids = [vocab.cls_id, *toks[a0:a0 + la], vocab.sep_id]
        if lb:  # else a one-segment instance (no next-sentence task)
            ids += [*toks[b0:b0 + lb], vocab.sep_id]
        lo, hi = offsets[t], offsets[t] + int(num_masked[t])
        positions = [int(p) for p in compact.positions[lo:hi]]
        labels = [ids[p] for p in positions]
        for p, v in zip(positions, [int(v) for v in compact.values[lo:hi]]):
            if v >= 0:
                ids[p] = v
        out.append(Instance(ids, la, positions, labels, bool(compact.random_next[t])))
    return out


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
        encoder, packed = self.encoder, features.packed_int64
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
