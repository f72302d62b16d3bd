"""The shared loop with the classifier task: losses against numpy, training, eval figures,
and `predict` (input order, padded last batch, passed-through features)."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tasks.classification import metrics as gm
from modeling import losses, optimization
from modeling.config import BertConfig
from modeling.models import BertClassifier
from tests import test_loop_support as S
from tasks.classification import task as classification_task
from tasks.common.classifier_task import ClassifierTask
from training import distribution, loop, pretraining
from training.settings import LoopConfig

SEQ = 16
VOCAB = 40


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_classification_loss_is_the_originals_and_ignores_padding_rows():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 3)).astype(np.float32)
    labels = np.array([0, 2, 1, 1, 0, 2])
    real = np.array([1, 1, 1, 1, 0, 0])
    loss, stats = losses.classifier_loss(tf.constant(logits), tf.constant(labels),
                                         tf.constant(real))
    nll = -_log_softmax(logits)[np.arange(6), labels]
    assert float(loss) == pytest.approx(nll[:4].mean(), rel=1e-5)
    assert float(stats["loss_sum"]) == pytest.approx(nll[:4].sum(), rel=1e-5)
    assert float(stats["example_count"]) == 4
    assert float(stats["correct_sum"]) == np.sum((logits.argmax(-1) == labels)[:4])
    # Without weights: the original's reduce_mean over the batch.
    loss_all, _ = losses.classifier_loss(tf.constant(logits), tf.constant(labels))
    assert float(loss_all) == pytest.approx(nll.mean(), rel=1e-5)
    np.testing.assert_allclose(
        losses.numpy_classifier_per_example_loss(logits, labels), nll, rtol=1e-6)


def test_regression_loss_is_mean_squared_error():
    predictions = np.array([[1.0], [2.5], [0.0]], np.float32)
    targets = np.array([1.5, 2.5, 4.0], np.float32)
    loss, stats = losses.classifier_loss(tf.constant(predictions), tf.constant(targets),
                                         tf.constant([1, 1, 0]), is_regression=True)
    assert float(loss) == pytest.approx((0.25 + 0.0) / 2)
    assert float(stats["correct_sum"]) == 0.0


def _model_and_trainer(tmp_path, num_labels=2, seed=0, steps=40, lr=2e-3):
    import keras
    keras.utils.set_random_seed(seed)
    strategy = distribution.get_strategy("one_device")
    with strategy.scope():
        config = BertConfig(**S.tiny_config_dict(vocab_size=VOCAB))
        model = loop.build_encoder_model(BertClassifier(config, num_labels), SEQ)
        opt = optimization.create_optimizer(optimization.OptimizerConfig(
            learning_rate=lr, num_train_steps=steps, num_warmup_steps=4))
    cfg = LoopConfig(output_dir=str(tmp_path), num_train_steps=steps, train_batch_size=8,
                          eval_batch_size=8, iterations_per_loop=10,
                          save_checkpoints_steps=steps, log_steps=10)
    return model, loop.TrainingLoop(strategy, model, opt, cfg, ClassifierTask(num_labels))


def _features(n, seed=0):
    """Label 1 when token 7 occurs (learnable); half the rows are pairs."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(8, VOCAB, size=(n, SEQ)).astype(np.int32)
    labels = (np.arange(n) % 2).astype(np.int32)
    ids[labels == 1, 3] = 7
    ids[:, 0] = 2
    mask = np.ones((n, SEQ), np.int32)
    mask[:, SEQ - 3:] = 0
    ids[:, SEQ - 3:] = 0
    segments = np.zeros((n, SEQ), np.int32)
    segments[::2, 8:SEQ - 3] = 1
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments,
            "label_ids": labels, "is_real_example": np.ones(n, np.int32)}


def test_classifier_task_trains_in_the_shared_loop(tmp_path):
    _, trainer = _model_and_trainer(tmp_path)
    data = _features(64)

    def dataset_fn(ctx):
        ds = tf.data.Dataset.from_tensor_slices(data).repeat().shuffle(64, seed=1)
        return ds.batch(ctx.get_per_replica_batch_size(8), drop_remainder=True)

    seen = []
    history = trainer.train(dataset_fn, on_checkpoint=seen.append)
    assert [h["step"] for h in history] == [10, 20, 30, 40]
    assert history[-1]["loss"] < history[0]["loss"]
    assert history[-1]["accuracy"] > 0.8, history
    assert seen == [40]  # called after each checkpoint save
    assert os.path.exists(tmp_path / "ckpt-40.index")

    # evaluate() (statistics summed in the loop) and predict() + eval_results agree.
    eval_data = _features(24, seed=5)
    results = trainer.evaluate(lambda ctx: tf.data.Dataset.from_tensor_slices(eval_data)
                               .batch(8, drop_remainder=True), results_file=None)
    out = trainer.predict(tf.data.Dataset.from_tensor_slices(eval_data).batch(8),
                          feature_keys=("label_ids", "is_real_example"))
    figures = trainer.task.eval_results(out["logits"], out["label_ids"],
                                        out["is_real_example"], 40)
    assert results["global_step"] == figures["global_step"] == 40
    assert results["eval_accuracy"] == pytest.approx(figures["eval_accuracy"])
    assert results["eval_loss"] == pytest.approx(figures["eval_loss"], rel=1e-4)


def test_predict_keeps_input_order_and_the_padded_last_batch(tmp_path):
    model, trainer = _model_and_trainer(tmp_path, num_labels=3, seed=1)
    data = _features(10, seed=2)
    # Pad 10 rows to 12 (batches of 4) with all-zero rows, as pad_examples does.
    padded = {k: np.concatenate([v, np.zeros((2,) + v.shape[1:], v.dtype)])
              for k, v in data.items()}
    out = trainer.predict(tf.data.Dataset.from_tensor_slices(padded).batch(4, drop_remainder=True),
                          output_keys=("logits",), feature_keys=("is_real_example", "label_ids"))
    assert sorted(out) == ["is_real_example", "label_ids", "logits"]
    assert out["logits"].shape == (12, 3) and out["logits"].dtype == np.float32
    np.testing.assert_array_equal(out["is_real_example"], [1] * 10 + [0, 0])
    np.testing.assert_array_equal(out["label_ids"][:10], data["label_ids"])
    direct = model({k: data[k] for k in ("input_ids", "input_mask", "segment_ids")},
                   training=False)["logits"].numpy()
    np.testing.assert_allclose(out["logits"][:10], direct, atol=1e-5)


def test_predict_traces_once_for_any_bucket_length_and_batch_size(tmp_path):
    """Batches of other lengths (buckets) and sizes (a short last batch) reuse one trace:
    a retrace per shape costs seconds per bucket in every evaluation."""
    model, trainer = _model_and_trainer(tmp_path, num_labels=3, seed=1)
    data = _features(10, seed=2)

    def batches():  # [4, seq], [4, seq // 2], [2, seq // 4]: three shapes, one signature
        for rows, length in ((slice(0, 4), None), (slice(4, 8), -8), (slice(8, 10), -12)):
            yield {k: (v[rows, :length] if v.ndim == 2 and k != "label_ids" else v[rows])
                   for k, v in data.items()}

    spec = {k: tf.TensorSpec([None, None] if v.ndim == 2 and k != "label_ids"
                             else [None, *v.shape[1:]], tf.as_dtype(v.dtype))
            for k, v in data.items()}
    dataset = tf.data.Dataset.from_generator(batches, output_signature=spec)
    out = trainer.predict(dataset, output_keys=("logits",))
    assert out["logits"].shape == (10, 3)
    (function,) = trainer._predict_fns.values()
    assert function.experimental_get_tracing_count() == 1
    trainer.predict(dataset, output_keys=("logits",))  # a second pass: no new trace
    assert function.experimental_get_tracing_count() == 1
    first = {k: v[:4] for k, v in data.items()}
    direct = model({k: first[k] for k in ("input_ids", "input_mask", "segment_ids")},
                   training=False)["logits"].numpy()
    np.testing.assert_allclose(out["logits"][:4], direct, atol=1e-5)


def test_eval_results_drop_padding_and_use_the_task_metrics():
    task = classification_task.classifier_task("cola", 2)
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 3.0], [9.0, -9.0]])
    labels = np.array([0, 1, 1, 1, 1])
    real = np.array([1, 1, 1, 1, 0])  # the last row is padding: it would be wrong
    got = task.eval_results(logits, labels, real, 7)
    predictions = np.array([0, 1, 0, 1])
    assert got["eval_accuracy"] == 0.75
    assert got["eval_mcc"] == pytest.approx(gm.matthews_corrcoef(labels[:4], predictions))
    nll = -_log_softmax(logits[:4])[np.arange(4), labels[:4]]
    assert got["eval_loss"] == pytest.approx(nll.mean())
    assert got["global_step"] == 7
    assert got["loss"] == pytest.approx(nll.mean())  # one batch: the same mean
    assert sorted(got) == ["eval_accuracy", "eval_loss", "eval_mcc", "global_step", "loss"]
    # Batches of 3: [0, 1, 2] and [3] (+ padding): the Estimator's mean of batch means.
    batched = task.eval_results(logits, labels, real, 7, batch_size=3)
    assert batched["loss"] == pytest.approx((nll[:3].mean() + nll[3]) / 2)
    assert batched["eval_loss"] == pytest.approx(nll.mean())
    # A constant predictor: MCC 0 (degenerate), accuracy still counted.
    constant = task.eval_results(np.tile([[0.0, 1.0]], (4, 1)), labels[:4],
                                 np.ones(4), 0)
    assert constant["eval_mcc"] == 0.0 and constant["eval_accuracy"] == 0.75
    regression = classification_task.classifier_task("sts-b", 1, True).eval_results(
        np.array([[1.0], [2.0], [3.0]]), np.array([1.5, 2.0, 2.5]), np.ones(3), 3)
    assert regression["eval_pearson"] == pytest.approx(1.0)
    assert regression["eval_loss"] == pytest.approx((0.25 + 0 + 0.25) / 3)


def test_pretraining_task_keeps_the_original_stat_keys():
    task = pretraining.PretrainingTask()
    assert task.stat_keys == pretraining.STAT_KEYS and "mlm_loss" in task.mean_keys
    figures = dict((key, value) for key, _, value in task.progress(
        {"mlm_correct_sum": 3.0, "mlm_weight_sum": 4.0, "nsp_correct_sum": 1.0,
         "nsp_count": 2.0}))
    assert figures == {"masked_lm_accuracy": 0.75, "next_sentence_accuracy": 0.5}
