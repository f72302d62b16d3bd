"""Owns masking on the fly: unmasked next-sentence pairs -> the masked-LM features the model
reads, inside the tf.data pipeline, with the original's masking rules.

`create_pretraining_data --dynamic_masking` writes the pairs unmasked
(`data_prep.features.PRETRAINING_UNMASKED`); `run_pretraining.py` detects such records and
masks each batch here, so every epoch sees other masks (RoBERTa's dynamic masking)
instead of the `dupe_factor` fixed masks of the original's static records. The rules are
those of the original's `create_masked_lm_predictions`
(`data_prep.pretraining_data.masking.create_masked_lm_predictions` is our port of it,
including whole-word masking):

* predictions per sequence: min(max_predictions_per_seq, max(1, round(n *
  masked_lm_prob))), n the real tokens, [CLS] and [SEP] included, rounded half to even
  (Python's round; computed in float64 as Python does);
* candidates: every real token but [CLS] and [SEP]; never padding;
* a uniformly random subset of them (the original shuffles and takes the first ones);
  with whole-word masking, words (a token and the `##` pieces after it; a piece after
  A's [SEP] joins A's last word, as in the original) in random order, each taken whole
  if it still fits in the count, else skipped;
* each chosen position: [MASK] with probability 0.8, else kept (0.5) or replaced by a
  uniformly random entry of the whole vocabulary (0.5), as the original's two draws; the
  split is `mask_token_rate` / `random_token_rate` (the paper's Table 8; the defaults
  0.8 / 0.1 give exactly the thresholds 0.8 and 0.5: `masking.two_draw_thresholds`);
* output as the static records lay it out: `masked_lm_positions` ascending, then zeros;
  `masked_lm_ids` the original tokens (zeros after); `masked_lm_weights` 1.0 then 0.0.

Randomness is stateless (`tf.random.stateless_*`), keyed by the run's seed, the input
pipeline and the batch's number in it: deterministic for a seed whatever the threads,
and different each epoch (training repeats the files, so the batch numbers go on).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from data_prep import tokenization
from data_prep.cli import UserError
from data_prep.pretraining_data.config import PretrainingConfig, check_token_rates
from data_prep.pretraining_data.masking import MaskingVocab, two_draw_thresholds


class DynamicMaskingError(UserError):
    """Unmasked records without what masking them needs, or masking flags without
    unmasked records; the message names the flag."""


@dataclasses.dataclass(frozen=True)
class DynamicMasking:
    """What masking needs: the settings and, from the vocabulary, the ids.

    Attributes:
      max_predictions_per_seq, masked_lm_prob, do_whole_word_mask: the original's flags.
      mask_token_rate, random_token_rate: of the chosen positions, the shares shown as
        [MASK] and as a random vocabulary entry (the rest keep their token).
      vocab: [CLS]/[SEP]/[MASK] ids, the replacement ids (every distinct vocab entry, as
        the original's `list(vocab.keys())`) and which ids are `##` pieces.
      seed: the run's seed (None: drawn at random when the pipeline is built).
      vocab_file: where `vocab` was read (for messages; "" when not from a file).
    """

    max_predictions_per_seq: int
    vocab: MaskingVocab
    masked_lm_prob: float = 0.15
    do_whole_word_mask: bool = False
    seed: int | None = None
    vocab_file: str = ""
    mask_token_rate: float = 0.8
    random_token_rate: float = 0.1

    @classmethod
    def from_vocab_file(cls, vocab_file: str, **settings) -> "DynamicMasking":
        vocab = tokenization.load_vocab(vocab_file)
        try:
            tokenization.check_vocab(vocab, vocab_file, required=("[CLS]", "[SEP]", "[MASK]"))
        except tokenization.VocabError as err:
            raise DynamicMaskingError(f"--vocab_file: {err}") from None
        return cls(vocab=MaskingVocab.from_vocab(vocab), vocab_file=vocab_file, **settings)

    def validate(self) -> None:
        PretrainingConfig(
            max_seq_length=max(self.max_predictions_per_seq, 5),
            max_predictions_per_seq=self.max_predictions_per_seq,
            masked_lm_prob=self.masked_lm_prob).validate()
        check_token_rates(self.mask_token_rate, self.random_token_rate)


def _round_half_even_count(n, prob):
    """round(n * prob) as Python computes it (float64 product, half to even)."""
    product = tf.cast(n, tf.float64) * tf.constant(prob, tf.float64)
    return tf.cast(tf.math.round(product), tf.int32)


def _take_in_order(sizes, valid, budget):
    """Greedy pass over groups in the given order: take a group if it still fits.

    Sequential by nature (whether a word fits depends on the words taken before it), so
    a loop over group ranks; it stops as soon as no row has both a group left and room
    (about `budget` ranks, not the sequence length).

    Args:
      sizes, valid: int32 / bool [batch, groups], in the order to consider them; the
        valid groups of a row come first.
      budget: int32 [batch], the number of predictions.

    Returns:
      bool [batch, groups]: which groups are taken.
    """
    groups = tf.shape(sizes)[1]
    sizes_t = tf.transpose(tf.pad(sizes, [[0, 0], [0, 1]]))  # a last, empty rank
    valid_t = tf.transpose(tf.pad(valid, [[0, 0], [0, 1]]))

    def more(rank, count, taken):
        return tf.reduce_any(valid_t[rank] & (count < budget))

    def step(rank, count, taken):
        take = valid_t[rank] & (count + sizes_t[rank] <= budget)
        return rank + 1, count + tf.where(take, sizes_t[rank], 0), taken.write(rank, take)

    rank, _, taken = tf.while_loop(
        more, step, (tf.constant(0), tf.zeros_like(budget),
                     tf.TensorArray(tf.bool, size=0, dynamic_size=True,
                                    element_shape=budget.shape)))
    taken = tf.concat([taken.stack(), tf.zeros([groups - rank, tf.shape(budget)[0]],
                                               tf.bool)], axis=0)
    return tf.transpose(taken)


def mask_batch(example: dict, masking: DynamicMasking, seed) -> dict:
    """Masks a batch of unmasked pairs.

    Args:
      example: int32 `input_ids`, `input_mask`, `segment_ids` [batch, seq] and
        `next_sentence_labels` [batch, 1] (the unmasked record kind, parsed).
      masking: settings and vocabulary ids.
      seed: int64 [2], the stateless seed of this batch.

    Returns:
      The features the pretraining model reads: `input_ids` (masked), `input_mask`,
      `segment_ids` [batch, seq]; `masked_lm_positions`, `masked_lm_ids` int32 and
      `masked_lm_weights` float32 [batch, max_predictions_per_seq];
      `next_sentence_labels` [batch, 1].
    """
    vocab = masking.vocab
    ids = example["input_ids"]
    seq = ids.shape[1]
    preds = masking.max_predictions_per_seq
    batch = tf.shape(ids)[0]
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=5)

    real = example["input_mask"] > 0
    candidate = real & (ids != vocab.cls_id) & (ids != vocab.sep_id)
    n = tf.reduce_sum(tf.cast(real, tf.int32), axis=1)
    budget = tf.minimum(preds, tf.maximum(1, _round_half_even_count(n, masking.masked_lm_prob)))

    if masking.do_whole_word_mask:
        pieces = tf.constant(list(vocab.is_continuation), tf.int32)
        is_piece = (tf.gather(pieces, ids) > 0) & candidate
        earlier = tf.math.cumsum(tf.cast(candidate, tf.int32), axis=1, exclusive=True) > 0
        starts = candidate & ~(is_piece & earlier)
        group = tf.math.cumsum(tf.cast(starts, tf.int32), axis=1) - 1  # [batch, seq]
        group = tf.where(candidate, group, 0)
        num_groups = tf.reduce_sum(tf.cast(starts, tf.int32), axis=1)
        rows = tf.range(batch)[:, None] * seq
        sizes = tf.reshape(tf.math.unsorted_segment_sum(
            tf.reshape(tf.cast(candidate, tf.int32), [-1]), tf.reshape(rows + group, [-1]),
            batch * seq), [batch, seq])
        exists = tf.range(seq)[None, :] < num_groups[:, None]
        keys = tf.where(exists, tf.random.stateless_uniform([batch, seq], seeds[0]), 2.0)
        order = tf.argsort(keys, axis=1, stable=True)
        taken_in_order = _take_in_order(tf.gather(sizes, order, batch_dims=1),
                                        tf.gather(exists, order, batch_dims=1), budget)
        taken = tf.gather(taken_in_order, tf.argsort(order, axis=1), batch_dims=1)
        chosen = candidate & tf.gather(taken, group, batch_dims=1)
    else:
        keys = tf.where(candidate, tf.random.stateless_uniform([batch, seq], seeds[0]), 2.0)
        rank = tf.argsort(tf.argsort(keys, axis=1, stable=True), axis=1, stable=True)
        chosen = candidate & (rank < budget[:, None])

    # Chosen positions, ascending, then `seq` (none) up to max_predictions_per_seq.
    position = tf.range(seq)[None, :]
    ordered = tf.sort(tf.where(chosen, position, seq + position), axis=1)
    if preds > seq:
        ordered = tf.pad(ordered, [[0, 0], [0, preds - seq]], constant_values=2 * seq)
    ordered = ordered[:, :preds]
    valid = ordered < seq
    positions = tf.where(valid, ordered, 0)
    labels = tf.where(valid, tf.gather(ids, positions, batch_dims=1), 0)

    # [MASK] below t1 (80%); else kept below t2 (50%) or a random vocabulary entry: the
    # original's two draws, at the rates' thresholds.
    t1, t2 = two_draw_thresholds(masking.mask_token_rate, masking.random_token_rate)
    first = tf.random.stateless_uniform([batch, preds], seeds[1])
    second = tf.random.stateless_uniform([batch, preds], seeds[2])
    replacements = tf.constant(list(vocab.replacement_ids), tf.int32)
    random_ids = tf.gather(replacements, tf.random.stateless_uniform(
        [batch, preds], seeds[3], minval=0, maxval=len(vocab.replacement_ids),
        dtype=tf.int32))
    shown = tf.where(first < t1, vocab.mask_id, tf.where(second < t2, labels, random_ids))
    hit = tf.one_hot(positions, seq, dtype=tf.int32) * tf.cast(valid, tf.int32)[:, :, None]
    covered = tf.reduce_sum(hit, axis=1) > 0  # [batch, seq]
    masked_ids = tf.where(covered, tf.reduce_sum(hit * shown[:, :, None], axis=1), ids)

    out = dict(example)
    out.update(input_ids=masked_ids, masked_lm_positions=positions, masked_lm_ids=labels,
               masked_lm_weights=tf.cast(valid, tf.float32))
    return out


def pipeline_seed(masking: DynamicMasking, input_pipeline_id: int = 0) -> int:
    """The base seed of one input pipeline (its batches are numbered from 0)."""
    import random

    base = masking.seed if masking.seed is not None else random.SystemRandom().getrandbits(62)
    return random.Random(f"{base}/masking/{input_pipeline_id}").getrandbits(62)


def apply(dataset: tf.data.Dataset, masking: DynamicMasking, input_pipeline_id: int = 0,
          deterministic: bool = True) -> tf.data.Dataset:
    """Masks every batch of a dataset of parsed unmasked batches (see `mask_batch`),
    batch k with the seed (pipeline seed, k)."""
    base = pipeline_seed(masking, input_pipeline_id)

    def masked(number, example):
        seed = tf.stack([tf.constant(base, tf.int64), number])
        return mask_batch(example, masking, seed)

    return dataset.enumerate().map(tf.autograph.experimental.do_not_convert(masked),
                                   num_parallel_calls=tf.data.AUTOTUNE,
                                   deterministic=deterministic)
