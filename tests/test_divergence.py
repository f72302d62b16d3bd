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


def test_nan_gradients_set_a_checkpoint_aside_and_ctrl_c_in_the_last_save_says_so(
        data, strategy, tmp_path):  # noqa: F811
    """ckpt-10's weights give NaN gradients at step 11: a rerun from it would fail there
    forever, so it is moved into diverged/ and the error names ckpt-5. The rerun resumes
    ckpt-5 and, with the poison gone, trains to the end, where a Ctrl-C arrives while its
    last checkpoint (ckpt-20) is written: the checkpoint is complete, and the run stops
    with the line every other stop prints (before: exit 130 and no word)."""
    import logging
    import signal

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
    assert glob.glob(str(tmp_path / "diverged" / "1" / "ckpt-10.index"))
    # A rerun resumes ckpt-5 and, with the poison gone, trains to the end (ckpt-20).
    _, again = _make(strategy, tmp_path, steps=20, save=5, ipl=5)
    assert again.restore_or_initialize() == 5
    manager = again.saver.manager
    save = manager.save

    def interrupted_save(*args, **kwargs):
        if kwargs.get("checkpoint_number") == 20:  # the last save
            os.kill(os.getpid(), signal.SIGINT)  # held until the save is complete
        return save(*args, **kwargs)
    manager.save = interrupted_save
    make, identity = _input(data, again)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("absl").addHandler(handler)
    # Ctrl-C as a terminal gives it (a background test run starts with SIGINT ignored).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as stopped:
            again.train(make, input_identity=identity)
    finally:
        signal.signal(signal.SIGINT, previous)
        logging.getLogger("absl").removeHandler(handler)
    assert stopped.value.code == 130
    said = [r.getMessage() for r in records if r.getMessage().startswith("Stopping at step")]
    assert said == [f"Stopping at step 20 on signal 2: saved {tmp_path / 'ckpt-20'}; a "
                    "restart with the same command resumes from step 20"]
    assert _steps(tmp_path)[-1] == 20  # complete: a resume finds it


def _pretraining(data, out, **flags):  # noqa: F811
    """run_pretraining's command line in this process (`call_main`): its Result."""
    from tests.clis import call_main

    values = dict(input_file=data["pattern"], bert_config_file=data["config"],
                  output_dir=str(out), max_seq_length=S.SEQ, max_predictions_per_seq=S.PREDS,
                  train_batch_size=8, learning_rate=1e-3, num_train_steps=10,
                  num_warmup_steps=0, iterations_per_loop=5, log_steps=5,
                  save_checkpoints_steps=5, do_train="true", seed=1)
    return call_main("run_pretraining", [f"--{k}={v}" for k, v in {**values, **flags}.items()])


def _pretrain(data, out, **flags):  # noqa: F811
    """run_pretraining's main in this process; returns its error line or None."""
    result = _pretraining(data, out, **flags)
    return None if result.code == 0 else result.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def config(data, tmp_path_factory):  # noqa: F811
    """The records and a one-layer config (in a folder of this module's: the records'
    folder is shared, read only)."""
    return dict(data, config=S.write_config(
        tmp_path_factory.mktemp("divergence") / "divergence_config.json", vocab_size=120))


@pytest.fixture(scope="module")
def absurd_then_sane(config, tmp_path_factory):
    """The issue's run (--learning_rate=1e3, a checkpoint every 5 steps) and then, in the
    same folder, a sane 10-step run (ckpt-5, ckpt-10): (the folder, read only: a test
    resuming it works on a copy; the absurd run's error line; the checkpoint files it
    left; the steps a resume would have found after it)."""
    out = tmp_path_factory.mktemp("sane_run")
    message = _pretrain(config, out, learning_rate=1e3, num_train_steps=60)
    left, steps = glob.glob(str(out / "ckpt-*")), _steps(out)
    assert _pretrain(config, out, num_train_steps=10) is None
    assert _steps(out) == [5, 10]
    return out, message, left, steps


@pytest.fixture(scope="module")
def sane_run(absurd_then_sane):
    """The sane run's folder (ckpt-5, ckpt-10; read only)."""
    return absurd_then_sane[0]


def test_an_absurd_learning_rate_stops_before_any_exploded_checkpoint(absurd_then_sane):
    """The issue's run: --learning_rate=1e3, a checkpoint every 5 steps. Before the fix it
    saved ckpt-5 and ckpt-10 with weights of 1e7 and 1e11 and stopped at step 14, and a
    rerun at a sane rate resumed them and failed forever. Now it leaves no checkpoint and
    a sane rerun in its folder trains on (to step 10: the fixture)."""
    _, message, left, steps = absurd_then_sane
    assert message and "training diverged" in message, message
    assert "No checkpoint before it is left" in message and "starts over" in message
    assert "Traceback" not in message and "\n" not in message
    assert steps == [] and left == []


def test_a_divergence_after_sound_checkpoints_keeps_them_and_names_the_newest(
        config, sane_run, tmp_path):
    """The error names ckpt-10; the documented way to pick an older checkpoint (the newer
    ones' files moved into diverged/) resumes ckpt-5, and a sane rate trains to the end."""
    import shutil

    out = tmp_path / "resumed"
    shutil.copytree(sane_run, out)  # sane: ckpt-5, ckpt-10
    sound = _largest_weight(str(out / "ckpt-10"))
    message = _pretrain(config, out, learning_rate=1e3, num_train_steps=60)
    assert message and "training diverged" in message, message
    assert f"A rerun resumes from {out / 'ckpt-10'}" in message, message
    assert _steps(out) == [5, 10]
    for step in _steps(out):  # nothing exploded is left to resume
        assert _largest_weight(str(out / f"ckpt-{step}")) <= 2 * sound
    (out / "diverged").mkdir(exist_ok=True)
    for path in glob.glob(str(out / "ckpt-10.*")):
        os.rename(path, out / "diverged" / os.path.basename(path))
    resumed = _pretraining(config, out, num_train_steps=30)
    assert resumed.code == 0, resumed.stderr[-2000:]
    assert f"Resumed from {out / 'ckpt-5'} at step 5" in resumed.log, resumed.log[-2000:]
    assert _steps(out)[-1] == 30
    assert _largest_weight(str(out / "ckpt-30")) < 100


def test_the_loss_ceiling_does_not_fire_on_a_normal_run(data, strategy, tmp_path):  # noqa: F811
    """A fresh run at a high but sane rate (1e-2, the loss first jumps, then falls) and
    every step checked: no divergence; the start is the mean of the first 10 steps, the
    recent loss their moving mean (both in the loop's state), never 1.5 x the start."""
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
        iterations_per_loop=1, save_checkpoints_steps=20, log_steps=1),
        pretraining.PretrainingTask())
    trainer.restore_or_initialize()
    make, identity = _input(data, trainer)
    history = trainer.train(make, input_identity=identity)
    assert history[-1]["step"] == 40
    losses = [h["loss"] for h in history]
    start = float(np.mean(losses[:loop.START_STEPS]))
    assert int(trainer.divergence.steps.numpy()) == loop.START_STEPS
    np.testing.assert_allclose(float(trainer.divergence.start.numpy()), start, rtol=1e-5)
    recent, highest = losses[0], 0.0
    for loss in losses[1:]:  # the moving mean the check compares
        recent = 0.9 * recent + 0.1 * loss
        highest = max(highest, recent / start)
    np.testing.assert_allclose(float(trainer.divergence.recent.numpy()), recent, rtol=1e-4)
    assert highest < 1.5 < loop.SANE_FACTOR < LoopConfig(output_dir="").divergence_factor


def _divergence_state(prefix):
    return tuple(float(checkpointing.saved_value(prefix, f"divergence/{name}"))
                 for name in ("start", "steps", "recent"))


@pytest.mark.slow
def test_a_diverging_rate_rerun_never_passes(config, tmp_path):
    """The probe's case (issue 38): a rate far too high (--learning_rate=1, warmup 40), the
    same command run again. Before: the first run stopped at step 31 (one batch over
    100 x its first loss), kept ckpt-27 (a loss 55 x a fresh one's) as sound, and the
    rerun, measuring "100 x the first loss" from that damage, ended with exit 0. Now the
    start is in every checkpoint and a kept checkpoint's recent loss was sane: the rerun
    resumes the sound checkpoint the first run kept and diverges again, each set-aside in
    a folder of its own. (The probe ran it three times: here the second run sets aside
    every checkpoint, so a third would start over from the initial weights, the first run
    again.) With --divergence_factor=0 the loss check is off: the run ends, and says it
    ended far above where it began."""
    out = tmp_path / "out"
    flags = dict(learning_rate=1.0, num_warmup_steps=40, num_train_steps=40,
                 save_checkpoints_steps=3, iterations_per_loop=3, log_steps=3)
    starts = set()
    for attempt in range(1, 3):
        result = _pretraining(config, out, **flags)
        assert result.code == 1 and "training diverged" in result.stderr, (
            attempt, result.stderr[-2000:])
        assert "--divergence_factor" in result.stderr
        assert not (out / "ckpt-40.index").exists()
        assert sorted(os.listdir(out / "diverged")) == [str(n) for n in range(1, attempt + 1)]
        kept = checkpointing.checkpoints_newest_first(str(out))
        if attempt == 1:  # a sound checkpoint kept: the rerun resumes it, not a fresh start
            assert kept, result.stderr[-2000:]
            resumed_from = kept[0]
        else:
            assert f"Resumed from {resumed_from}" in result.log, result.log[-2000:]
        for prefix in kept:
            start, steps, recent = _divergence_state(prefix)
            assert recent <= loop.SANE_FACTOR * max(start, 1.0), (prefix, recent, start)
            if steps == loop.START_STEPS:
                starts.add(start)
    assert len(starts) == 1 and starts.pop() < 30  # a fresh loss is 5.5: never the damage's
    ended = _pretraining(config, out, divergence_factor=0, **flags)
    assert ended.code == 0, ended.stderr[-2000:]
    assert "Training ended with a loss of" in ended.log and "did not learn" in ended.log


def _write_outlier_stsb(directory, rows=96):
    """STS-B-layout data whose scores are 0-1 but one row in twelve 30-40 (counts, prices:
    a sane regression whose batches' losses differ a hundredfold)."""
    import random

    rng = random.Random(0)
    directory.mkdir(parents=True, exist_ok=True)
    header = ["index", "genre", "filename", "year", "old_index", "source1", "source2",
              "sentence1", "sentence2", "score"]
    words = ["the", "cat", "dog", "sat", "on", "a", "mat", "ran", "far", "away"]
    for split, n in (("train", rows), ("dev", 12)):
        lines = ["\t".join(header)]
        for i in range(n):
            score = 30 + 10 * rng.random() if i % 12 == 5 else rng.random()
            a, b = (" ".join(rng.choice(words) for _ in range(6)) for _ in range(2))
            lines.append("\t".join([str(i), "main", "f", "2012", str(i), "none", "none", a, b,
                                    f"{score:.3f}"]))
        (directory / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return directory


@pytest.mark.slow
def test_a_regression_with_outlier_targets_trains_at_a_sane_rate(tmp_path):
    """Issue 38: scores mostly 0-1, one row in twelve at 30-40. Before, step 1 (at warmup
    rate 0) drew a batch without outliers and the next batch with one exceeded "100 x the
    first loss": the run failed at every rate. Now no batch decides: it trains."""
    import run_classifier as rc
    from tests.conftest import TINY_VOCAB, write_vocab
    from training.execution import RuntimeConfig

    cfg = rc.COMMAND.settings(
        task_name="sts-b", data_dir=str(_write_outlier_stsb(tmp_path / "STS-B")),
        vocab_file=write_vocab(tmp_path / "vocab.txt"),
        bert_config_file=S.write_config(tmp_path / "bert_config.json",
                                           vocab_size=len(TINY_VOCAB)),
        output_dir=str(tmp_path / "out"), max_seq_length=16, do_train=True,
        train_batch_size=8, learning_rate=2e-5, num_train_epochs=1.0,
        save_checkpoints_steps=100, iterations_per_loop=12, log_steps=12, seeds=(1,),
        runtime=RuntimeConfig("one_device", seed=1))  # its step 1 draws no outlier
    result = rc.run(cfg)
    assert result["best_run"]["global_step"] == 12


@pytest.mark.slow
def test_a_users_checkpoint_in_output_dir_is_never_overwritten_or_moved(config, sane_run,
                                                                        tmp_path):
    """Issue 38: a checkpoint copied into output_dir as ckpt-10 and passed as
    --init_checkpoint. Before: the run saved its own ckpt-10 over it and rotation deleted
    it; a divergence moved it into diverged/. Now a run whose saves would take its name
    is refused at the start in one line, writing nothing; one that would not trains (and
    diverges) around it; it stays, byte for byte."""
    import shutil

    out = tmp_path / "out"
    out.mkdir()
    for path in glob.glob(str(sane_run / "ckpt-10.*")):
        shutil.copy(path, out)
    (out / "notes.txt").write_text("mine\n")
    before = S.tree(out)
    user = str(out / "ckpt-10")
    refused = _pretraining(config, out, init_checkpoint=user, num_train_steps=20)
    assert refused.code == 1, refused.stderr[-2000:]
    assert (f"run_pretraining.py: error: {user} is a checkpoint this run did not write (it "
            "is --init_checkpoint)") in refused.stderr
    assert "Traceback" not in refused.stderr and S.tree(out) == before
    diverged = _pretraining(config, out, init_checkpoint=user, num_train_steps=8,
                            learning_rate=1e3, save_checkpoints_steps=1, iterations_per_loop=1)
    assert diverged.code == 1 and "training diverged" in diverged.stderr
    assert all(S.tree(out)[name] == content for name, content in before.items())
    assert not glob.glob(str(out / "diverged" / "*" / "ckpt-10.*"))
    assert _pretraining(config, out, init_checkpoint=user, num_train_steps=8).code == 0
    assert all(S.tree(out)[name] == content for name, content in before.items())


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
