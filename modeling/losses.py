"""Owns the original BERT loss definitions (masked LM, NSP, classifier, span), the left-to-right LM's and token tagging as tensor math.

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
    """Total pretraining loss (MLM + NSP, or MLM alone) and the statistics the metrics need.

    Args:
      outputs: dict with `masked_lm_logits` [b, P, vocab] and, unless the model was built
        without next sentence prediction ("No NSP"), `next_sentence_logits` [b, 2].
      features: dict with `masked_lm_ids`, `masked_lm_weights` [b, P], `next_sentence_labels`.

    Returns:
      (scalar loss, dict of float32 scalar sums over this batch): `loss` (the batch's total
      loss), `mlm_loss` (the batch's MLM loss), `mlm_nll_sum` (sum of w * nll),
      `mlm_correct_sum` (sum of w * correct), `mlm_weight_sum` (sum of w) and, with NSP,
      `nsp_loss_sum`, `nsp_correct_sum`, `nsp_count`.
    """
    mlm_logits = outputs["masked_lm_logits"]
    weights = tf.cast(features["masked_lm_weights"], tf.float32)
    mlm, nll = masked_lm_loss(mlm_logits, features["masked_lm_ids"], weights)
    mlm_pred = tf.argmax(mlm_logits, axis=-1, output_type=tf.int32)
    mlm_correct = tf.cast(tf.equal(mlm_pred, tf.cast(features["masked_lm_ids"], tf.int32)),
                          tf.float32)
    stats = {
        "loss": mlm,
        "mlm_loss": mlm,
        "mlm_nll_sum": tf.reduce_sum(weights * nll),
        "mlm_correct_sum": tf.reduce_sum(weights * mlm_correct),
        "mlm_weight_sum": tf.reduce_sum(weights),
    }
    if "next_sentence_logits" not in outputs:
        return mlm, stats
    nsp_logits = outputs["next_sentence_logits"]
    nsp, nsp_per_example = next_sentence_loss(nsp_logits, features["next_sentence_labels"])
    total = mlm + nsp
    nsp_labels = tf.reshape(tf.cast(features["next_sentence_labels"], tf.int32), [-1])
    nsp_pred = tf.argmax(nsp_logits, axis=-1, output_type=tf.int32)
    nsp_correct = tf.cast(tf.equal(nsp_pred, nsp_labels), tf.float32)
    stats.update(loss=total, nsp_loss_sum=tf.reduce_sum(nsp_per_example),
                 nsp_correct_sum=tf.reduce_sum(nsp_correct),
                 nsp_count=tf.cast(tf.size(nsp_labels), tf.float32))
    return total, stats


def next_token_loss(outputs, features):
    """The left-to-right LM's loss (the paper's "LTR & No NSP"): mean cross-entropy of
    every real next token, and its statistics.

    Position t predicts token t + 1 wherever both are real (`input_mask` 1): a sequence of
    n real tokens gives n - 1 predictions; padding predicts and is predicted nothing.

    Args:
      outputs: dict with `next_token_logits` [b, seq, vocab] (position t's distribution
        of token t + 1; the last position's is unused).
      features: dict with `input_ids`, `input_mask` [b, seq].

    Returns:
      (scalar loss = sum(nll) / max(count, 1), dict of float32 scalars): `loss`,
      `lm_nll_sum` (sum of the predicted tokens' nll), `lm_correct_sum` (argmax hits) and
      `lm_count` (predicted tokens).
    """
    logits = tf.cast(outputs["next_token_logits"], tf.float32)[:, :-1, :]
    targets = tf.cast(features["input_ids"], tf.int32)[:, 1:]
    mask = tf.cast(features["input_mask"], tf.float32)
    weights = mask[:, 1:] * mask[:, :-1]
    nll = -tf.gather(tf.nn.log_softmax(logits, axis=-1), targets, axis=-1, batch_dims=2)
    correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), targets),
                      tf.float32)
    count = tf.reduce_sum(weights)
    nll_sum = tf.reduce_sum(weights * nll)
    loss = nll_sum / tf.maximum(count, 1.0)
    return loss, {"loss": loss, "lm_nll_sum": nll_sum,
                  "lm_correct_sum": tf.reduce_sum(weights * correct), "lm_count": count}


# --- Sequence classification / regression (run_classifier) -------------------------------


def classification_per_example_loss(logits, label_ids):
    """The original run_classifier's cross-entropy: -sum(one_hot * log_softmax), float32 [batch].

    Args:
      logits: float [batch, num_labels] (computed in float32).
      label_ids: int [batch] (or [batch, 1]).
    """
    logits = tf.cast(logits, tf.float32)
    labels = tf.reshape(tf.cast(label_ids, tf.int32), [-1])
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    one_hot = tf.one_hot(labels, depth=tf.shape(logits)[-1], dtype=tf.float32)
    return -tf.reduce_sum(one_hot * log_probs, axis=-1)


def regression_per_example_loss(predictions, targets):
    """Squared error of a one-output regressor (STS-B), float32 [batch].

    Args:
      predictions: float [batch, 1] or [batch].
      targets: float [batch] (or [batch, 1]).
    """
    predictions = tf.reshape(tf.cast(predictions, tf.float32), [-1])
    targets = tf.reshape(tf.cast(targets, tf.float32), [-1])
    return tf.square(predictions - targets)


def classifier_loss(logits, label_ids, is_real_example=None, *, is_regression=False):
    """Per-replica classifier loss and the statistics the eval metrics need.

    The loss is the mean per-example loss over the batch's real examples (all of a
    training batch: the original's `reduce_mean`); padding rows (`is_real_example` 0)
    weigh nothing.

    Args:
      logits: float [batch, num_labels] ([batch, 1] for regression).
      label_ids: int [batch] label ids, or float [batch] scores for regression.
      is_real_example: [batch] 1/0 weights; None means all real.
      is_regression: squared error on the single output instead of cross-entropy.

    Returns:
      (scalar float32 loss, dict of float32 scalars): `loss` (the batch's loss),
      `loss_sum` (sum of w * per-example loss), `correct_sum` (sum of w * correct; 0 for
      regression) and `example_count` (sum of w).
    """
    if is_regression:
        per_example = regression_per_example_loss(logits, label_ids)
        correct = tf.zeros_like(per_example)
    else:
        per_example = classification_per_example_loss(logits, label_ids)
        predicted = tf.argmax(tf.cast(logits, tf.float32), axis=-1, output_type=tf.int32)
        labels = tf.reshape(tf.cast(label_ids, tf.int32), [-1])
        correct = tf.cast(tf.equal(predicted, labels), tf.float32)
    if is_real_example is None:
        weights = tf.ones_like(per_example)
    else:
        weights = tf.reshape(tf.cast(is_real_example, tf.float32), [-1])
    count = tf.reduce_sum(weights)
    loss_sum = tf.reduce_sum(weights * per_example)
    loss = loss_sum / tf.maximum(count, 1.0)
    stats = {"loss": loss, "loss_sum": loss_sum, "correct_sum": tf.reduce_sum(weights * correct),
             "example_count": count}
    return loss, stats


def numpy_classifier_per_example_loss(logits, labels, *, is_regression=False):
    """`classification_per_example_loss` / `regression_per_example_loss` in float64 numpy
    (for metrics over predictions collected on the host)."""
    import numpy as np

    logits = np.asarray(logits, np.float64)
    if is_regression:
        return (logits.reshape(-1) - np.asarray(labels, np.float64).reshape(-1)) ** 2
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    return -log_probs[np.arange(len(labels)), labels]


# --- Span labelling (run_squad) --------------------------------------------------------------


def span_position_loss(logits, positions):
    """The original run_squad's cross-entropy of one boundary (start or end), float32 [].

    -mean over the batch of sum(one_hot(position) * log_softmax(logits)).

    Args:
      logits: float [batch, seq_length] (computed in float32).
      positions: int [batch] or [batch, 1] token indices (0, i.e. [CLS], for answers outside
        the window and unanswerable questions).
    """
    logits = tf.cast(logits, tf.float32)
    positions = tf.reshape(tf.cast(positions, tf.int32), [-1])
    one_hot = tf.one_hot(positions, depth=tf.shape(logits)[-1], dtype=tf.float32)
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    return -tf.reduce_mean(tf.reduce_sum(one_hot * log_probs, axis=-1))


def span_loss(start_logits, end_logits, start_positions, end_positions):
    """The original SQuAD loss, (start loss + end loss) / 2, and its statistics.

    Args:
      start_logits, end_logits: float [batch, seq_length].
      start_positions, end_positions: int [batch] or [batch, 1].

    Returns:
      (scalar float32 loss, dict of float32 scalars): `loss`, `start_loss`, `end_loss`
      (batch means), `start_correct_sum`, `end_correct_sum` (argmax hits) and
      `example_count`.
    """
    start_loss = span_position_loss(start_logits, start_positions)
    end_loss = span_position_loss(end_logits, end_positions)
    loss = (start_loss + end_loss) / 2.0

    def correct(logits, positions):
        predicted = tf.argmax(tf.cast(logits, tf.float32), axis=-1, output_type=tf.int32)
        positions = tf.reshape(tf.cast(positions, tf.int32), [-1])
        return tf.reduce_sum(tf.cast(tf.equal(predicted, positions), tf.float32))

    stats = {"loss": loss, "start_loss": start_loss, "end_loss": end_loss,
             "start_correct_sum": correct(start_logits, start_positions),
             "end_correct_sum": correct(end_logits, end_positions),
             "example_count": tf.cast(tf.shape(start_logits)[0], tf.float32)}
    return loss, stats


# --- Token tagging (run_ner) -------------------------------------------------------------


def tagging_loss(logits, label_ids, label_weights):
    """Token-tagging loss: mean cross-entropy over the weighted positions, and its statistics.

    The paper tags a word by its first WordPiece: `label_weights` is 1 there and 0 on later
    pieces, [CLS]/[SEP], context and padding, so the loss is sum(w * nll) / sum(w)
    (0 for a batch without a labelled position).

    Args:
      logits: float [batch, seq_length, num_labels] (computed in float32).
      label_ids: int [batch, seq_length].
      label_weights: [batch, seq_length] 1/0 (int or float).

    Returns:
      (scalar float32 loss, dict of float32 scalars): `loss` (the batch's loss), `loss_sum`
      (sum of w * nll), `correct_sum` (sum of w * [argmax == label]) and `token_count`
      (sum of w).
    """
    logits = tf.cast(logits, tf.float32)
    labels = tf.cast(label_ids, tf.int32)
    weights = tf.cast(label_weights, tf.float32)
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    nll = -tf.gather(log_probs, labels, axis=-1, batch_dims=2)
    predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)
    correct = tf.cast(tf.equal(predicted, labels), tf.float32)
    count = tf.reduce_sum(weights)
    loss_sum = tf.reduce_sum(weights * nll)
    loss = loss_sum / tf.maximum(count, 1.0)
    return loss, {"loss": loss, "loss_sum": loss_sum,
                  "correct_sum": tf.reduce_sum(weights * correct), "token_count": count}
