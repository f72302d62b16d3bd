"""The training/eval loop in-process on one device, with the real tiny BertPretrainer.

Records come from the real `data_prep.create_pretraining_data` CLI (module fixture).
"""

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from modeling import checkpoints, optimization
from modeling.config import BertConfig
from modeling.models import BertPretrainer
from tests import test_loop_support as S
from training import distribution, input_pipeline, pretraining
from training.loop import TrainingLoop
from training.settings import LoopConfig
from tests.test_loop_support import read_eval_results


@pytest.fixture(scope="module")
def records(pretraining_records):
    return pretraining_records["pattern"]


@pytest.fixture(scope="module")
def strategy():
    return distribution.get_strategy("one_device")


def _one_layer():
    """The tiny config with one layer: for the tests whose proof does not depend on the
    depth (accumulation, divergence, eval arithmetic, LAMB's updates); a tiny run's cost is
    mostly tracing its graph. The learning run (`trained`) keeps two."""
    return BertConfig(**S.tiny_config_dict(vocab_size=120, num_hidden_layers=1))


def _make(strategy, output_dir, *, steps=100, lr=1e-3, batch=16, accumulation=1, ipl=10,
          save=50, log=10, config=None, max_eval_steps=3):
    with strategy.scope():
        model = BertPretrainer(config or BertConfig(**S.tiny_config_dict(vocab_size=120)))
        pretraining.build_pretraining_model(model, S.SEQ, S.PREDS)
        opt = optimization.create_optimizer(optimization.OptimizerConfig(
            learning_rate=lr, num_train_steps=steps, num_warmup_steps=min(10, steps // 5)))
    cfg = LoopConfig(output_dir=str(output_dir), num_train_steps=steps,
                          train_batch_size=batch, eval_batch_size=8, iterations_per_loop=ipl,
                          save_checkpoints_steps=save, log_steps=log,
                          gradient_accumulation_steps=accumulation,
                          max_eval_steps=max_eval_steps)
    return model, TrainingLoop(strategy, model, opt, cfg, pretraining.PretrainingTask())


def _dataset_fn(pattern, batch, is_training, seed=1):
    cfg = input_pipeline.PretrainingInputConfig((pattern,), S.SEQ, S.PREDS, seed=seed)

    def make(ctx):
        return input_pipeline.pretraining_dataset(
            cfg, batch_size=ctx.get_per_replica_batch_size(batch), is_training=is_training,
            input_context=ctx)
    return make


@pytest.fixture(scope="module")
def trained(records, strategy, tmp_path_factory):
    out = tmp_path_factory.mktemp("trained")
    keras.utils.set_random_seed(0)
    model, trainer = _make(strategy, out)
    assert trainer.restore_or_initialize() == 0
    history = trainer.train(_dataset_fn(records, 16, True))
    return {"dir": out, "model": model, "trainer": trainer, "history": history}


def test_loss_falls_over_100_steps(trained):
    history = trained["history"]
    assert [h["step"] for h in history] == list(range(10, 101, 10))
    first, last = history[0], history[-1]
    assert last["loss"] < first["loss"] - 1.0, history
    assert last["masked_lm_accuracy"] > first["masked_lm_accuracy"]
    assert history[-1]["learning_rate"] == 0.0  # linear decay ends at 0
    assert all(h["examples_per_second"] > 0 for h in history)


def test_checkpoints_every_save_steps_with_model_optimizer_step(trained):
    out = str(trained["dir"])
    assert os.path.basename(tf.train.latest_checkpoint(out)) == "ckpt-100"
    assert sorted(os.path.basename(p)[:-6] for p in glob.glob(f"{out}/ckpt-*.index")) == [
        "ckpt-100", "ckpt-50"]
    names = [n for n, _ in tf.train.list_variables(os.path.join(out, "ckpt-100"))]
    assert any(n.startswith("model/encoder/") for n in names)
    slots = [n for n in names if n.startswith("optimizer/variables/")]
    assert len(slots) >= 2 * len(trained["model"].trainable_variables)  # m and v
    # Every model variable is named by its model path (the loader reads names).
    assert not any(n.startswith("optimizer/_trainable_variables") for n in names)
    assert "step/.ATTRIBUTES/VARIABLE_VALUE" in names
    assert int(tf.train.load_checkpoint(os.path.join(out, "ckpt-100")).get_tensor(
        "step/.ATTRIBUTES/VARIABLE_VALUE")) == 100


def test_modeling_loader_reads_our_checkpoint_strictly(trained, strategy):
    fresh = BertPretrainer(BertConfig(**S.tiny_config_dict(vocab_size=120)))
    checkpoints.load_pretrained(os.path.join(str(trained["dir"]), "ckpt-100"), fresh)
    for a, b in zip(fresh.weights, trained["model"].weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def _read_scalars(event_dir: str) -> dict:
    """{tag: [(step, value)]} from the event files in `event_dir`."""
    out = {}
    for path in sorted(glob.glob(os.path.join(event_dir, "events.out.tfevents.*"))):
        for raw in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(raw.numpy())
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((event.step,
                                                      float(tf.make_ndarray(value.tensor))))
    return out


def test_train_summaries_are_written(trained):
    scalars = _read_scalars(os.path.join(str(trained["dir"]), "train"))
    assert [s for s, _ in scalars["loss"]] == list(range(10, 101, 10))
    for key in ("masked_lm_accuracy", "next_sentence_accuracy", "learning_rate",
                "examples_per_second"):
        assert key in scalars


def _weights_after(strategy, records, out, accumulation, init):
    model, trainer = _make(strategy, out, steps=3, batch=8, accumulation=accumulation, ipl=3,
                           save=3, log=3, config=_one_layer())
    model.set_weights(init)
    trainer.train(_dataset_fn(records, 8, True, seed=5))
    return [w.numpy() for w in model.weights]


def test_gradient_accumulation_equals_the_full_batch(strategy, records, tmp_path):
    # Every record has 5 predictions, so per-micro-batch normalisation equals the full batch's.
    init_model = BertPretrainer(_one_layer())
    init = [w.numpy() for w in init_model.weights]
    full = _weights_after(strategy, records, tmp_path / "k1", 1, init)
    accumulated = _weights_after(strategy, records, tmp_path / "k2", 2, init)
    moved = 0
    for a, b, w0 in zip(full, accumulated, init):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)
        moved += not np.allclose(a, w0)
    assert moved > len(init) // 2


def test_non_finite_loss_stops_with_the_step(strategy, records, tmp_path):
    _, trainer = _make(strategy, tmp_path, steps=20, ipl=5, save=5, log=5, config=_one_layer())
    step = trainer.global_step
    real_loss = trainer.loss_fn

    def poisoned(outputs, features):
        total, stats = real_loss(outputs, features)
        bad = tf.where(step >= 6, np.nan, 0.0)  # global_step is 6 while step 7 runs
        stats = dict(stats, loss=stats["loss"] + bad)
        return total + bad, stats

    trainer.loss_fn = poisoned
    with pytest.raises(FloatingPointError, match="at step 7"):
        trainer.train(_dataset_fn(records, 16, True))
    assert os.path.basename(tf.train.latest_checkpoint(str(tmp_path))) == "ckpt-5"


def _numpy_batches(pattern, batch, steps):
    files = sorted(glob.glob(pattern))
    examples = []
    for path in files:
        for raw in tf.data.TFRecordDataset(path):
            ex = tf.train.Example.FromString(raw.numpy()).features.feature
            examples.append({k: np.array(ex[k].float_list.value if k == "masked_lm_weights"
                                         else ex[k].int64_list.value) for k in ex})
    for i in range(steps):
        chunk = examples[i * batch:(i + 1) * batch]
        yield {k: np.stack([e[k] for e in chunk]) for k in chunk[0]}


def _log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_eval_of_a_checkpoint_matches_numpy(strategy, records, tmp_path):
    source, source_loop = _make(strategy, tmp_path, config=_one_layer())
    source_loop.saver.save(0)  # "a given checkpoint": fresh weights at step 0
    model, trainer = _make(strategy, tmp_path,  # different random weights until restored
                           config=_one_layer())
    assert trainer.restore_or_initialize() == 0
    results = trainer.evaluate(_dataset_fn(records, 8, False))
    written = read_eval_results(os.path.join(str(tmp_path), "eval_results.txt"))
    assert sorted(written) == ["global_step", "loss", "masked_lm_accuracy", "masked_lm_loss",
                               "masked_lm_perplexity", "next_sentence_accuracy",
                               "next_sentence_loss"]
    with open(os.path.join(str(tmp_path), "eval_results.txt")) as f:
        assert [line.split(" = ")[0] for line in f] == sorted(written)

    batch_losses, nll_w, correct_w, weight, nsp_nll, nsp_correct, count = [], 0, 0, 0, 0, 0, 0
    for batch in _numpy_batches(records, 8, 3):
        inputs = {k: tf.constant(batch[k], tf.int32) for k in pretraining.MODEL_INPUTS}
        out = source(inputs, training=False)  # the checkpoint's own weights
        mlm_lp = _log_softmax(out["masked_lm_logits"].numpy())
        nsp_lp = _log_softmax(out["next_sentence_logits"].numpy())
        ids, w = batch["masked_lm_ids"], batch["masked_lm_weights"]
        labels = batch["next_sentence_labels"][:, 0]
        nll = -np.take_along_axis(mlm_lp, ids[..., None], -1)[..., 0]
        nsp = -nsp_lp[np.arange(len(labels)), labels]
        batch_losses.append((w * nll).sum() / (w.sum() + 1e-5) + nsp.mean())
        nll_w += (w * nll).sum()
        correct_w += (w * (mlm_lp.argmax(-1) == ids)).sum()
        weight += w.sum()
        nsp_nll += nsp.sum()
        nsp_correct += (nsp_lp.argmax(-1) == labels).sum()
        count += len(labels)
    expected = {"loss": np.mean(batch_losses), "masked_lm_loss": nll_w / weight,
                "masked_lm_accuracy": correct_w / weight,
                "masked_lm_perplexity": np.exp(nll_w / weight),  # Table 6's "LM (ppl)"
                "next_sentence_loss": nsp_nll / count, "next_sentence_accuracy":
                nsp_correct / count, "global_step": 0}
    for key, value in expected.items():
        assert results[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
        assert written[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


class _HalfPrecisionPretrainer(keras.Model):
    """A small stand-in with an explicit mixed_float16 policy (exercises loss scaling)."""

    def __init__(self, vocab=120, hidden=16):
        super().__init__(dtype="mixed_float16", name="half_pretrainer")
        self.embed = keras.layers.Embedding(vocab, hidden, dtype="mixed_float16")
        self.dense = keras.layers.Dense(hidden, activation="tanh", dtype="mixed_float16")
        self.nsp = keras.layers.Dense(2, dtype="mixed_float16")
        self.out_bias = self.add_weight(shape=(vocab,), initializer="zeros", name="bias")

    def call(self, inputs, training=None):
        x = self.dense(self.embed(inputs["input_ids"]))
        picked = tf.gather(x, inputs["masked_lm_positions"], batch_dims=1)
        table = tf.cast(self.embed.embeddings, x.dtype)
        logits = tf.matmul(picked, table, transpose_b=True)
        return {"masked_lm_logits": tf.cast(logits + self.out_bias, tf.float32),
                "next_sentence_logits": tf.cast(self.nsp(x[:, 0]), tf.float32)}


def test_float16_trains_with_dynamic_loss_scaling(strategy, records, tmp_path):
    """float16 trains with a dynamic loss scale (saved in the checkpoint); an infinite
    gradient at one step (step 3 here) is skipped, not an error, counted, and the scale
    halved."""
    with strategy.scope():
        model = _HalfPrecisionPretrainer()
        pretraining.build_pretraining_model(model, S.SEQ, S.PREDS)
        opt = optimization.create_optimizer(optimization.OptimizerConfig(
            learning_rate=1e-2, num_train_steps=30, num_warmup_steps=0))
    cfg = LoopConfig(output_dir=str(tmp_path), num_train_steps=30, train_batch_size=16,
                          iterations_per_loop=10, save_checkpoints_steps=30, log_steps=10,
                          dtype="float16")
    trainer = TrainingLoop(strategy, model, opt, cfg, pretraining.PretrainingTask())
    assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
    real = trainer.loss_fn

    def loss_fn(outputs, features):  # an infinite gradient at step 3 only, a finite loss
        total, stats = real(outputs, features)
        gate = tf.cast(tf.equal(trainer.global_step, 2), tf.float32)
        logits = tf.reduce_sum(tf.square(outputs["masked_lm_logits"]))
        poison = tf.sqrt(gate * 0.0 * logits + (1.0 - gate)) - (1.0 - gate)
        return total + poison, dict(stats, loss=stats["loss"] + poison)
    trainer.loss_fn = loss_fn
    scale = float(trainer.loss_scale_optimizer.dynamic_scale.numpy())
    history = trainer.train(_dataset_fn(records, 16, True))
    assert [h["skipped_steps"] for h in history] == [1, 0, 0]
    assert trainer.skipped_steps == 1
    assert history[0]["loss_scale"] == scale / 2
    assert history[-1]["loss"] < history[0]["loss"]
    assert all(np.isfinite(h["loss_scale"]) and h["loss_scale"] >= 1 for h in history)
    names = [n for n, _ in tf.train.list_variables(os.path.join(str(tmp_path), "ckpt-30"))]
    assert any(n.startswith("loss_scale/") for n in names)


def test_loop_requires_pre_reduced_optimizer(strategy, tmp_path):
    model = BertPretrainer(BertConfig(**S.tiny_config_dict(vocab_size=120)))
    with pytest.raises(ValueError, match="pre_reduced_gradients"):
        TrainingLoop(strategy, model, keras.optimizers.Adam(),
                     LoopConfig(output_dir=str(tmp_path)), pretraining.PretrainingTask())


def test_lamb_trains_in_the_loop(strategy, records, tmp_path):
    with strategy.scope():
        model = BertPretrainer(_one_layer())
        pretraining.build_pretraining_model(model, S.SEQ, S.PREDS)
        opt = optimization.create_optimizer(optimization.OptimizerConfig(
            optimizer="lamb", learning_rate=1e-2, num_train_steps=10, num_warmup_steps=0))
    before = [w.numpy() for w in model.trainable_weights]
    cfg = LoopConfig(output_dir=str(tmp_path), num_train_steps=10, train_batch_size=16,
                          iterations_per_loop=5, save_checkpoints_steps=10, log_steps=5)
    history = TrainingLoop(strategy, model, opt, cfg, pretraining.PretrainingTask()).train(
        _dataset_fn(records, 16, True))
    assert all(np.isfinite(h["loss"]) for h in history)
    moved = [not np.allclose(a, w.numpy()) for a, w in zip(before, model.trainable_weights)]
    assert all(moved)
    names = [n for n, _ in tf.train.list_variables(os.path.join(str(tmp_path), "ckpt-10"))]
    assert any(n.startswith("model/encoder/") for n in names)
