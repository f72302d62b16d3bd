"""A diverging run (issue 30): it stops before a diverged state becomes a checkpoint, sets
aside the checkpoint whose weights led there, names the checkpoint a rerun resumes from,
and a rerun with a sane learning rate trains to the end; the loop's periods and counts
refuse 0, and a warmup longer than the run is said. In-process, real records and
checkpoints (run_pretraining's `main` with its flags)."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from tests import test_loop_support as S
from tests.test_resume import _input, _make, _poisoned_gradients, data, strategy  # noqa: F401
from training import checkpointing, loop, pretraining
from training.settings import LoopConfig


def _steps(directory):
    """Steps of the checkpoints a resume can find in `directory` (its state file)."""
    return sorted(int(p.rsplit("-", 1)[1])
                  for p in checkpointing.checkpoints_newest_first(str(directory)))


def _largest_weight(prefix):
    reader = tf.train.load_checkpoint(prefix)
    return max(float(np.abs(reader.get_tensor(name)).max())
               for name in reader.get_variable_to_shape_map() if name.startswith("model/"))


def test_nan_gradients_after_a_checkpoint_set_it_aside_and_name_the_one_before(
        data, strategy, tmp_path):  # noqa: F811
    """ckpt-10's weights give NaN gradients at step 11: a rerun from it would fail there
    forever, so it is moved into diverged/ and the error names ckpt-5."""
    _, trainer = _make(strategy, tmp_path, steps=20, save=5, ipl=5)
    trainer.restore_or_initialize()
    _poisoned_gradients(trainer, 10)  # the global step is 10 while step 11 runs
    make, identity = _input(data, trainer)
    with pytest.raises(FloatingPointError, match="at step 11") as raised:
        trainer.train(make, input_identity=identity)
    assert isinstance(raised.value, loop.TrainingDivergedError)
    message = str(raised.value)
    assert f"A rerun resumes from {tmp_path / 'ckpt-5'}" in message, message
    assert "Set aside ckpt-10" in message, message
    assert _steps(tmp_path) == [5]
    assert not glob.glob(str(tmp_path / "ckpt-10.*"))
    assert glob.glob(str(tmp_path / "diverged" / "ckpt-10.index"))
    # A rerun resumes ckpt-5 and, with the poison gone, trains to the end.
    _, again = _make(strategy, tmp_path, steps=20, save=5, ipl=5)
    assert again.restore_or_initialize() == 5
    make, identity = _input(data, again)
    again.train(make, input_identity=identity)
    assert _steps(tmp_path)[-1] == 20


def test_moving_newer_checkpoints_into_diverged_resumes_an_older_one(data, strategy,
                                                                     tmp_path):  # noqa: F811
    """The documented way to pick an older checkpoint than the one the error names."""
    _, trainer = _make(strategy, tmp_path, steps=15, save=5, ipl=5)
    trainer.restore_or_initialize()
    make, identity = _input(data, trainer)
    trainer.train(make, input_identity=identity)
    assert _steps(tmp_path) == [5, 10, 15]
    (tmp_path / "diverged").mkdir()
    for path in glob.glob(str(tmp_path / "ckpt-1[05].*")):
        os.rename(path, tmp_path / "diverged" / os.path.basename(path))
    _, again = _make(strategy, tmp_path, steps=15, save=5, ipl=5)
    assert again.restore_or_initialize() == 5


def _pretrain(data, out, **flags):  # noqa: F811
    """run_pretraining's main in this process; returns the SystemExit message or None."""
    from absl import flags as absl_flags

    import run_pretraining

    values = dict(input_file=data["pattern"], bert_config_file=data["config"],
                  output_dir=str(out), max_seq_length=S.SEQ, max_predictions_per_seq=S.PREDS,
                  train_batch_size=8, learning_rate=1e-3, num_train_steps=10,
                  num_warmup_steps=0, iterations_per_loop=5, log_steps=5,
                  save_checkpoints_steps=5, do_train="true", seed=1)
    values.update(flags)
    try:
        absl_flags.FLAGS(["run_pretraining.py"] + [f"--{k}={v}" for k, v in values.items()])
        run_pretraining.main([])
    except SystemExit as stopped:
        return str(stopped.code)
    finally:
        absl_flags.FLAGS.unparse_flags()
    return None


@pytest.fixture(scope="module")
def config(data):  # noqa: F811
    return dict(data, config=S.write_config(data["dir"] / "divergence_config.json",
                                            vocab_size=120))


def test_an_absurd_learning_rate_stops_before_any_exploded_checkpoint(config, tmp_path):
    """The issue's run: --learning_rate=1e3, a checkpoint every 5 steps. Before the fix it
    saved ckpt-5 and ckpt-10 with weights of 1e7 and 1e11 and stopped at step 14, and a
    rerun at a sane rate resumed them and failed forever."""
    out = tmp_path / "fresh"
    message = _pretrain(config, out, learning_rate=1e3, num_train_steps=60)
    assert message and "training diverged" in message, message
    assert "No checkpoint before it is left" in message and "starts over" in message
    assert "Traceback" not in message and "\n" not in message
    assert _steps(out) == [] and not glob.glob(str(out / "ckpt-*"))
    assert _pretrain(config, out, num_train_steps=20) is None  # a sane rerun trains on
    assert _steps(out)[-1] == 20


def test_a_divergence_after_sound_checkpoints_keeps_them_and_names_the_newest(config,
                                                                              tmp_path):
    out = tmp_path / "resumed"
    assert _pretrain(config, out, num_train_steps=10) is None  # sane: ckpt-5, ckpt-10
    sound = _largest_weight(str(out / "ckpt-10"))
    message = _pretrain(config, out, learning_rate=1e3, num_train_steps=60)
    assert message and "training diverged" in message, message
    assert f"A rerun resumes from {out / 'ckpt-10'}" in message, message
    assert _steps(out) == [5, 10]
    for step in _steps(out):  # nothing exploded is left to resume
        assert _largest_weight(str(out / f"ckpt-{step}")) <= 2 * sound
    assert _pretrain(config, out, num_train_steps=30) is None
    assert _steps(out)[-1] == 30
    assert _largest_weight(str(out / "ckpt-30")) < 100


def test_the_loss_ceiling_does_not_fire_on_a_normal_run(data, strategy, tmp_path):  # noqa: F811
    """A fresh run at a high but sane rate (1e-2, the loss first jumps, then falls) and
    every step checked: no divergence, and the ceiling is 100 x the first loss."""
    import keras

    from modeling import optimization
    from modeling.config import BertConfig
    from modeling.models import BertPretrainer

    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = BertPretrainer(BertConfig(**S.tiny_config_dict(vocab_size=120, dropout=0.1)))
        pretraining.build_pretraining_model(model, S.SEQ, S.PREDS)
        opt = optimization.create_optimizer(optimization.OptimizerConfig(
            learning_rate=1e-2, num_train_steps=40, num_warmup_steps=0))
    trainer = loop.TrainingLoop(strategy, model, opt, LoopConfig(
        output_dir=str(tmp_path), num_train_steps=40, train_batch_size=8,
        iterations_per_loop=10, save_checkpoints_steps=20, log_steps=1),
        pretraining.PretrainingTask())
    trainer.restore_or_initialize()
    make, identity = _input(data, trainer)
    history = trainer.train(make, input_identity=identity)
    assert history[-1]["step"] == 40
    first = history[0]["loss"]
    assert float(trainer._loss_ceiling.numpy()) > 10 * first


# ------------------------------------------------------------------ loop settings


@pytest.mark.parametrize("name", ["save_checkpoints_steps", "iterations_per_loop",
                                  "log_steps", "keep_checkpoint_max"])
def test_a_loop_period_or_count_of_zero_is_refused_naming_its_flag(config, tmp_path, name):
    message = _pretrain(config, tmp_path / "out", **{name: 0})
    assert message == f"run_pretraining.py: error: --{name}=0 must be a whole number >= 1"
    assert not os.path.exists(tmp_path / "out")
    from absl import flags

    import run_classifier

    try:  # fine-tuning: refused with the flags, before its data is read
        flags.FLAGS(["run_classifier.py", "--task_name=MRPC", f"--data_dir={tmp_path}",
                     "--vocab_file=v", "--bert_config_file=c", f"--output_dir={tmp_path}/o",
                     "--do_train", f"--{name}=0"])
        with pytest.raises(SystemExit) as refused:
            run_classifier.main([])
    finally:
        flags.FLAGS.unparse_flags()
    assert str(refused.value.code) == (f"run_classifier.py: error: --{name}=0 must be a "
                                       "whole number >= 1")


def test_warmup_beyond_the_run_is_accepted_as_the_original_but_said(caplog):
    from modeling.optimization import OptimizerConfig

    with caplog.at_level("WARNING"):
        OptimizerConfig(num_train_steps=60, num_warmup_steps=10000)
    assert "--num_warmup_steps=10000 exceeds --num_train_steps=60" in caplog.text
    assert "never leaves warmup" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        OptimizerConfig(num_train_steps=60, num_warmup_steps=60)
    assert "warmup" not in caplog.text
