"""Pretraining losses and statistics against numpy formulas (the original's definitions)."""

import numpy as np
import pytest
import tensorflow as tf

from modeling import losses


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.fixture
def batch():
    rng = np.random.default_rng(3)
    b, p, v = 4, 6, 11
    return {
        "mlm_logits": rng.normal(size=(b, p, v)).astype(np.float32) * 3,
        "ids": rng.integers(0, v, size=(b, p)).astype(np.int32),
        "weights": (rng.random((b, p)) < 0.7).astype(np.float32),
        "nsp_logits": rng.normal(size=(b, 2)).astype(np.float32),
        "nsp_labels": rng.integers(0, 2, size=(b, 1)).astype(np.int32),
    }


def test_masked_lm_loss_is_weighted_mean_with_epsilon(batch):
    loss, nll = losses.masked_lm_loss(batch["mlm_logits"], batch["ids"], batch["weights"])
    lp = _log_softmax(batch["mlm_logits"].astype(np.float64))
    expected_nll = -np.take_along_axis(lp, batch["ids"][..., None], -1)[..., 0]
    w = batch["weights"]
    np.testing.assert_allclose(nll.numpy(), expected_nll, rtol=1e-5)
    np.testing.assert_allclose(float(loss), (w * expected_nll).sum() / (w.sum() + 1e-5),
                               rtol=1e-5)


def test_masked_lm_loss_of_all_padding_is_zero(batch):
    loss, _ = losses.masked_lm_loss(batch["mlm_logits"], batch["ids"],
                                    np.zeros_like(batch["weights"]))
    assert float(loss) == 0.0


def test_epsilon_is_visible_with_one_prediction():
    logits = np.zeros((1, 1, 4), np.float32)  # nll = log 4
    loss, _ = losses.masked_lm_loss(logits, np.zeros((1, 1), np.int32), np.ones((1, 1)))
    np.testing.assert_allclose(float(loss), np.log(4) / (1 + 1e-5), rtol=1e-7)


def test_next_sentence_loss_is_mean_cross_entropy(batch):
    loss, per_example = losses.next_sentence_loss(batch["nsp_logits"], batch["nsp_labels"])
    lp = _log_softmax(batch["nsp_logits"].astype(np.float64))
    expected = -lp[np.arange(4), batch["nsp_labels"][:, 0]]
    np.testing.assert_allclose(per_example.numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(float(loss), expected.mean(), rtol=1e-5)


def test_pretraining_loss_is_sum_and_stats_are_sums(batch):
    outputs = {"masked_lm_logits": tf.constant(batch["mlm_logits"]),
               "next_sentence_logits": tf.constant(batch["nsp_logits"])}
    features = {"masked_lm_ids": batch["ids"], "masked_lm_weights": batch["weights"],
                "next_sentence_labels": batch["nsp_labels"]}
    total, stats = losses.pretraining_loss(outputs, features)
    mlm, nll = losses.masked_lm_loss(batch["mlm_logits"], batch["ids"], batch["weights"])
    nsp, _ = losses.next_sentence_loss(batch["nsp_logits"], batch["nsp_labels"])
    np.testing.assert_allclose(float(total), float(mlm) + float(nsp), rtol=1e-6)
    w = batch["weights"]
    correct = (batch["mlm_logits"].argmax(-1) == batch["ids"]).astype(np.float32)
    nsp_correct = (batch["nsp_logits"].argmax(-1) == batch["nsp_labels"][:, 0]).sum()
    np.testing.assert_allclose(float(stats["mlm_correct_sum"]), (w * correct).sum())
    np.testing.assert_allclose(float(stats["mlm_weight_sum"]), w.sum())
    np.testing.assert_allclose(float(stats["mlm_nll_sum"]), (w * nll.numpy()).sum(), rtol=1e-6)
    assert float(stats["nsp_correct_sum"]) == nsp_correct
    assert float(stats["nsp_count"]) == 4


def test_losses_accept_half_precision_logits(batch):
    loss32, _ = losses.masked_lm_loss(batch["mlm_logits"], batch["ids"], batch["weights"])
    loss16, _ = losses.masked_lm_loss(tf.constant(batch["mlm_logits"], tf.bfloat16),
                                      batch["ids"], batch["weights"])
    assert loss16.dtype == tf.float32
    np.testing.assert_allclose(float(loss16), float(loss32), rtol=2e-2)
