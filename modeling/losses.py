"""Owns the original BERT loss and metric definitions (masked LM, next sentence) as tensor math.

Every function works on one replica's batch, exactly as the original computes on one TPU
core. How these per-replica values combine across replicas is the training loop's business
(see `training/loop.py` and docs/pretraining.md): the loop divides each replica's loss by the
number of replicas before gradients are summed, so that an update equals the mean of the
per-replica gradients.
"""

from __future__ import annotations

import tensorflow as tf

# The original adds this to the weight sum so an all-padding batch gives a zero loss.
MLM_WEIGHT_EPSILON = 1e-5


def masked_lm_per_example_loss(logits, label_ids):
    """Negative log-likelihood of each masked position's label.

    Args:
      logits: float [batch, max_predictions, vocab] (any float dtype; computed in float32).
      label_ids: int [batch, max_predictions].

    Returns:
      float32 [batch, max_predictions].
    """
    logits = tf.cast(logits, tf.float32)
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    label_ids = tf.cast(label_ids, tf.int32)
    picked = tf.gather(log_probs, label_ids, axis=-1, batch_dims=2)
    return -picked


def masked_lm_loss(logits, label_ids, label_weights):
    """The original masked-LM loss: sum(w * nll) / (sum(w) + 1e-5) over the batch.

    Args:
      logits: float [batch, max_predictions, vocab].
      label_ids: int [batch, max_predictions].
      label_weights: float [batch, max_predictions]; 1.0 for real predictions, 0.0 for padding.

    Returns:
      (scalar float32 loss, float32 [batch, max_predictions] per-position nll).
    """
    nll = masked_lm_per_example_loss(logits, label_ids)
    weights = tf.cast(label_weights, tf.float32)
    numerator = tf.reduce_sum(weights * nll)
    denominator = tf.reduce_sum(weights) + MLM_WEIGHT_EPSILON
    return numerator / denominator, nll


def next_sentence_per_example_loss(logits, labels):
    """Cross-entropy of the 2-way next-sentence classifier, float32 [batch]."""
    logits = tf.cast(logits, tf.float32)
    labels = tf.reshape(tf.cast(labels, tf.int32), [-1])
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    return -tf.gather(log_probs, labels, axis=-1, batch_dims=1)


def next_sentence_loss(logits, labels):
    """The original NSP loss: mean cross-entropy over the batch.

    Args:
      logits: float [batch, 2].
      labels: int [batch] or [batch, 1]; 0 = "is next", 1 = "random".

    Returns:
      (scalar float32 loss, float32 [batch] per-example loss).
    """
    per_example = next_sentence_per_example_loss(logits, labels)
    return tf.reduce_mean(per_example), per_example


def pretraining_loss(outputs, features):
    """Total pretraining loss (MLM + NSP) and the statistics the metrics need.

    Args:
      outputs: dict with `masked_lm_logits` [b, P, vocab] and `next_sentence_logits` [b, 2].
      features: dict with `masked_lm_ids`, `masked_lm_weights` [b, P], `next_sentence_labels`.

    Returns:
      (scalar loss, dict of float32 scalar sums over this batch): `loss` (the batch's total
      loss), `mlm_loss` (the batch's MLM loss), `mlm_nll_sum` (sum of w * nll),
      `mlm_correct_sum` (sum of w * correct), `mlm_weight_sum` (sum of w), `nsp_loss_sum`,
      `nsp_correct_sum`, `nsp_count`.
    """
    mlm_logits = outputs["masked_lm_logits"]
    nsp_logits = outputs["next_sentence_logits"]
    weights = tf.cast(features["masked_lm_weights"], tf.float32)
    mlm, nll = masked_lm_loss(mlm_logits, features["masked_lm_ids"], weights)
    nsp, nsp_per_example = next_sentence_loss(nsp_logits, features["next_sentence_labels"])
    total = mlm + nsp

    mlm_pred = tf.argmax(mlm_logits, axis=-1, output_type=tf.int32)
    mlm_correct = tf.cast(tf.equal(mlm_pred, tf.cast(features["masked_lm_ids"], tf.int32)),
                          tf.float32)
    nsp_labels = tf.reshape(tf.cast(features["next_sentence_labels"], tf.int32), [-1])
    nsp_pred = tf.argmax(nsp_logits, axis=-1, output_type=tf.int32)
    nsp_correct = tf.cast(tf.equal(nsp_pred, nsp_labels), tf.float32)
    stats = {
        "loss": total,
        "mlm_loss": mlm,
        "mlm_nll_sum": tf.reduce_sum(weights * nll),
        "mlm_correct_sum": tf.reduce_sum(weights * mlm_correct),
        "mlm_weight_sum": tf.reduce_sum(weights),
        "nsp_loss_sum": tf.reduce_sum(nsp_per_example),
        "nsp_correct_sum": tf.reduce_sum(nsp_correct),
        "nsp_count": tf.cast(tf.size(nsp_labels), tf.float32),
    }
    return total, stats
