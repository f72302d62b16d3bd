"""Exact resume in-process (issue 24): the input position and the dropout generators are
checkpointed, a resumed run trains on the batches (and draws the masks) of the run it
continues, a stop signal checkpoints the current step, non-finite gradients stop the run,
and an unreadable checkpoint state file (a power cut) still resumes.

Records come from the real `data_prep.create_pretraining_data` CLI (module fixture); the
CLIs killed with SIGKILL/SIGTERM are in tests/test_exact_resume_runners.py (slow). A
killed and resumed run with dynamic masking is the runners' test's (under MirroredStrategy);
its input position here is `test_the_input_position_is_exact_for_each_pipeline`'s.
"""

import os
import random
import signal
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from data_prep import lifecycle
from modeling import optimization
from modeling.config import BertConfig
from modeling.models import BertPretrainer
from tests import test_loop_support as S
from tests.test_bucketing import _records as bucketing_records
from training import checkpointing, distribution, dynamic_masking, input_pipeline, pretraining
from training.loop import TrainingLoop
from training.settings import LoopConfig


@pytest.fixture(scope="module")
def data(pretraining_records):
    """Masked pretraining records of the CLI and their vocab (conftest: read only)."""
    return pretraining_records


@pytest.fixture(scope="module")
def strategy():
    """One device (the CPU)."""
    return distribution.get_strategy("one_device")


def _make(strategy, output_dir, *, steps=12, batch=8, accumulation=1, save=4, ipl=1,
          model_seed=3):
    """(model, TrainingLoop of the pretraining task) of a tiny one-layer BERT (what these
    tests prove does not depend on the depth) with dropout 0.1, seeded by `model_seed`."""
    keras.utils.set_random_seed(model_seed)  # the same initial weights and dropout seeds
    with strategy.scope():
        model = BertPretrainer(BertConfig(**S.tiny_config_dict(vocab_size=120, dropout=0.1,
                                                               num_hidden_layers=1)))
        pretraining.build_pretraining_model(model, S.SEQ, S.PREDS)
        opt = optimization.create_optimizer(optimization.OptimizerConfig(
            learning_rate=1e-3, num_train_steps=steps, num_warmup_steps=2))
    cfg = LoopConfig(output_dir=str(output_dir), num_train_steps=steps,
                          train_batch_size=batch, iterations_per_loop=ipl,
                          save_checkpoints_steps=save, log_steps=1,
                          gradient_accumulation_steps=accumulation)
    return model, TrainingLoop(strategy, model, opt, cfg, pretraining.PretrainingTask())


def _input(data, trainer, *, batch=8, seed=1):
    """(dataset_fn, input identity) of the (static masks) pretraining input, seeded as a
    runner does."""
    seed = trainer.input_seed(seed)
    config = input_pipeline.PretrainingInputConfig(
        (data["pattern"],), S.SEQ, S.PREDS, seed=seed, shuffle_buffer=50)

    def make(ctx):
        return input_pipeline.pretraining_dataset(
            config, batch_size=ctx.get_per_replica_batch_size(batch), is_training=True,
            input_context=ctx)
    return make, input_pipeline.pretraining_input_identity(config, batch)


def _losses(history):
    """{step: loss} of a loop's progress records."""
    return {h["step"]: h["loss"] for h in history}


def _variables(path, prefixes=("model/", "optimizer/", "rng/")):
    """{name: value} of a checkpoint's tensors under `prefixes`."""
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.startswith(prefixes)}


@pytest.fixture(scope="module")
def unmasked(data, tmp_path_factory):
    """Unmasked records (create_pretraining_data --dynamic_masking) of the same corpus
    (built once per session: test_loop_support.unmasked_records)."""
    return dict(data, unmasked=S.unmasked_records(tmp_path_factory, data))


@pytest.fixture(scope="module")
def trained(data, strategy, tmp_path_factory):
    """One unseeded run of 40 steps, a checkpoint every 10, dropout on, gradient
    accumulation over 2 micro-batches, one step per call (a loss per step) (read only: a
    test that resumes it works on `_copy`): {"dir", "identity" of its input, "seed" it
    drew, "losses" {step: loss}}. The uninterrupted run that
    test_a_killed_and_resumed_run_equals_the_uninterrupted_one resumes a copy of."""
    out = tmp_path_factory.mktemp("trained")
    _, trainer = _make(strategy, out, steps=40, save=10, accumulation=2)
    trainer.restore_or_initialize()
    make, identity = _input(data, trainer, seed=None)
    assert isinstance(identity["seed"], int)
    losses = _losses(trainer.train(make, input_identity=identity))
    assert sorted(losses) == list(range(1, 41))
    return {"dir": out, "identity": identity, "seed": identity["seed"], "losses": losses}


def test_a_killed_and_resumed_run_equals_the_uninterrupted_one(data, strategy, trained,
                                                               tmp_path):
    """Dropout on, gradient accumulation over 2 micro-batches, an unseeded input, killed
    after step 10 (before checkpoint 20), resumed to 40 into other initial weights and
    dropout seeds, with the input seed the run drew: the same per-step losses and the same
    final weights and optimizer state, bit for bit. The killed run's directory is what
    such a run leaves: the checkpoint of step 10, which the uninterrupted run (`trained`)
    saved too (the same steps); real kills of real runs, and what a killed run leaves, are
    tests/test_exact_resume_runners.py's."""
    whole = trained["losses"]
    S.stopped_at(trained["dir"], 10, tmp_path / "resumed")
    _, resumed = _make(strategy, tmp_path / "resumed", steps=40, save=10, accumulation=2,
                       model_seed=99)  # other initial weights and dropout seeds
    assert resumed.restore_or_initialize() == 10
    make, identity = _input(data, resumed, seed=None)
    assert identity == trained["identity"]  # the seed the run drew
    after = _losses(resumed.train(make, input_identity=identity))
    assert sorted(after) == list(range(11, 41))
    for step, loss in after.items():
        assert loss == whole[step], (step, loss, whole[step])
    assert tf.train.latest_checkpoint(str(tmp_path / "resumed")).endswith("ckpt-40")
    ours = _variables(str(tmp_path / "resumed" / "ckpt-40"))
    reference = _variables(str(trained["dir"] / "ckpt-40"))
    assert sorted(ours) == sorted(reference) and any(k.startswith("rng/") for k in ours)
    assert any(k.startswith("model/") for k in ours)  # the final weights, bit for bit
    assert any(k.startswith("optimizer/") for k in ours)
    for name, value in reference.items():
        np.testing.assert_array_equal(ours[name], value, err_msg=name)


def _copy(trained, tmp_path):
    """A copy of the shared run's directory to resume."""
    import shutil

    return shutil.copytree(trained["dir"], tmp_path / "run")


def test_the_saved_input_state_is_bounded_by_the_buffers(trained):
    """The input position costs the same however far the run is: the checkpoints of steps
    10 and 40 have the same size (the iterator's state holds file offsets, counters and
    the buffers' contents, not what was read)."""
    sizes = []
    for step in (10, 40):
        prefix = str(trained["dir"] / f"ckpt-{step}")
        assert checkpointing.saved_input_identity(prefix) == trained["identity"]
        sizes.append(sum(os.path.getsize(p) for p in tf.io.gfile.glob(prefix + ".*")))
    assert abs(sizes[1] - sizes[0]) < 0.05 * sizes[0], sizes


def test_other_input_is_refused_naming_what_changed(data, strategy, trained, tmp_path):
    out, seed = _copy(trained, tmp_path), trained["seed"]
    for batch, other_seed, named in ((16, seed, "batch_size: 8 there, 16 now"),
                                     (8, seed + 1, f"seed: {seed} there, {seed + 1} now")):
        _, again = _make(strategy, out, steps=44, batch=batch, save=4)
        assert again.restore_or_initialize() == 40
        make, identity = _input(data, again, batch=batch, seed=other_seed)
        with pytest.raises(checkpointing.InputPositionError) as err:
            again.train(make, input_identity=identity)
        message = str(err.value)
        assert named in message and "ckpt-40" in message and "--init_checkpoint" in message


@pytest.mark.parametrize("keep", [0.5, 2.0])
def test_a_record_file_replaced_under_its_name_is_other_input(data, strategy, trained,
                                                              tmp_path, keep):
    """A shard replaced by a smaller one (the saved position may lie past its end) or a
    larger one (the position counts other records) is refused naming the file sizes, not
    resumed silently or failed inside TensorFlow. (The run's records, copied: the input
    names its files by base name, so a moved directory is the same input.)"""
    records = tmp_path / "records"
    records.mkdir()
    for path in sorted(tf.io.gfile.glob(data["pattern"])):
        tf.io.gfile.copy(path, str(records / os.path.basename(path)))
    shard = sorted(records.iterdir())[0]
    data = dict(data, pattern=str(records / "*"))
    out = _copy(trained, tmp_path)
    rows = list(tf.data.TFRecordDataset(str(shard)).as_numpy_iterator())
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for row in (rows[:len(rows) // 2] if keep < 1 else rows + rows):
            writer.write(row)
    _, again = _make(strategy, out, steps=44, save=4)
    assert again.restore_or_initialize() == 40
    make, changed = _input(data, again, seed=trained["seed"])
    assert changed["files"] == trained["identity"]["files"]
    with pytest.raises(checkpointing.InputPositionError, match=r"file_sizes: \[") as err:
        again.train(make, input_identity=changed)
    assert "ckpt-40" in str(err.value)


def test_an_unseeded_run_resumes_with_the_seed_it_drew(strategy, trained, tmp_path):
    _, again = _make(strategy, _copy(trained, tmp_path), steps=44, save=4)
    again.restore_or_initialize()
    assert again.input_seed(None) == trained["seed"]


def _poisoned_gradients(trainer, from_global_step):
    """A loss whose value stays finite but whose gradients are NaN once the global step
    reaches `from_global_step` (d sqrt(u)/du at u = 0 times a zero)."""
    real = trainer.loss_fn

    def loss_fn(outputs, features):
        total, stats = real(outputs, features)
        gate = tf.cast(trainer.global_step >= from_global_step, tf.float32)
        logits = tf.reduce_sum(tf.square(outputs["masked_lm_logits"]))
        poison = tf.sqrt(gate * 0.0 * logits + (1.0 - gate)) - (1.0 - gate)  # always 0
        return total + poison, dict(stats, loss=stats["loss"] + poison)
    trainer.loss_fn = loss_fn


def test_nan_gradients_with_a_finite_loss_stop_at_their_step(data, strategy, tmp_path):
    """Step 10 is also a checkpoint step: its NaN update must not be saved."""
    _, trainer = _make(strategy, tmp_path, steps=20, save=5, ipl=5)
    trainer.restore_or_initialize()
    _poisoned_gradients(trainer, 9)  # the global step is 9 while step 10 runs
    make, identity = _input(data, trainer)
    with pytest.raises(FloatingPointError, match="gradients are NaN or Inf .* at step 10"):
        trainer.train(make, input_identity=identity)
    assert all(np.isfinite(h["loss"]) for h in trainer.history)
    newest = tf.train.latest_checkpoint(str(tmp_path))
    assert os.path.basename(newest) == "ckpt-5"
    assert all(np.isfinite(v).all() for v in _variables(newest, ("model/",)).values())


def _send_when_handled(sig, handler_is_ours, delay):
    """Sends `sig` to this process `delay` s after `handler_is_ours()` holds (never to a
    pytest whose default action would kill it)."""
    def run():
        deadline = time.time() + 120
        while not handler_is_ours() and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(delay)
        if handler_is_ours():
            os.kill(os.getpid(), sig)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _in_stop_block(sig=signal.SIGTERM):
    """True while `sig` is handled by `lifecycle.stop_requests`."""
    handler = signal.getsignal(sig)
    return getattr(handler, "__qualname__", "").startswith("stop_requests")


def test_sigterm_checkpoints_the_step_it_arrived_in_and_resumes_there(data, strategy,
                                                                       tmp_path):
    """One compiled call of 100000 steps: SIGTERM stops it after the current step, which
    is saved (a second SIGTERM during that save changes nothing); exit status 143."""
    _, trainer = _make(strategy, tmp_path, steps=100000, save=100000, ipl=100000)
    trainer.restore_or_initialize()
    original_save = trainer.saver.manager.save

    def save(**kwargs):  # the second signal, from inside the save
        os.kill(os.getpid(), signal.SIGTERM)
        return original_save(**kwargs)
    trainer.saver.manager.save = save
    make, identity = _input(data, trainer)
    _send_when_handled(signal.SIGTERM, _in_stop_block, delay=random.uniform(1.0, 2.0))
    with pytest.raises(SystemExit) as stopped:
        trainer.train(make, input_identity=identity)
    assert stopped.value.code == 128 + signal.SIGTERM
    step = int(trainer.global_step.numpy())
    assert 0 < step < 100000
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith(f"ckpt-{step}")
    assert trainer.history[-1]["step"] == step  # logged, nothing lost
    assert checkpointing.has_input_position(str(tmp_path / f"ckpt-{step}"))
    _, resumed = _make(strategy, tmp_path, steps=step + 2, save=100000)
    assert resumed.restore_or_initialize() == step
    make, identity = _input(data, resumed)
    assert [h["step"] for h in resumed.train(make, input_identity=identity)] == [
        step + 1, step + 2]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stop_requests_reach_a_compiled_loop_while_it_runs(sig):
    """The main thread is inside one long native call when SIGTERM or Ctrl-C (SIGINT)
    comes: the watcher thread hears it at once and the call ends early; leaving the block
    unhandled exits with 128 + signal (Ctrl-C: 130, not a KeyboardInterrupt) and gives the
    signal its handler back. SIGINT as a terminal gives it: Python's handler (a test run
    started as a background job ignores SIGINT, and a block leaves an ignored one alone)."""
    flag = tf.Variable(0)

    @tf.function(autograph=False)
    def spin():
        return tf.while_loop(lambda i: (flag.read_value() == 0) & (i < 10_000_000),
                             lambda i: i + 1, [tf.constant(0)])[0]

    outside = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = signal.getsignal(sig)
        with pytest.raises(SystemExit) as stopped:
            with lifecycle.stop_requests(flag.assign) as request:
                _send_when_handled(sig, lambda: _in_stop_block(sig), delay=0.5)
                spins = int(spin())
                assert request.signal == sig and int(flag.numpy()) == sig
                assert spins < 10_000_000
        assert stopped.value.code == 128 + sig
        assert signal.getsignal(sig) == before
    finally:
        signal.signal(signal.SIGINT, outside)


def test_a_stop_request_acted_on_does_not_outlive_its_run():
    """A later run in the same process (tests, notebooks, `run()` callers) is not taken
    for a stopped one: its own error passes unchanged instead of becoming exit 143."""
    for handled in (True, False):
        with pytest.raises(SystemExit):
            with lifecycle.stop_requests() as request:
                os.kill(os.getpid(), signal.SIGTERM)
                deadline = time.monotonic() + 10
                while request.signal is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert request.signal == signal.SIGTERM
                if handled:
                    request.handled()
                    raise SystemExit(request.exit_status())
        with pytest.raises(ValueError, match="a later run's own error"):
            with lifecycle.signal_decides_exit_status():
                raise ValueError("a later run's own error")
        lifecycle.check_signals()  # nothing recorded: raises nothing


def test_an_unreadable_state_file_resumes_from_the_checkpoints_on_disk(strategy, trained,
                                                                      tmp_path):
    """A power cut can leave `checkpoint` empty: the newest readable ckpt-N of the run on
    disk is restored (with a warning) and the state file is rebuilt (when the run takes
    its saver, before its first save: a run refused before writes nothing)."""
    out = _copy(trained, tmp_path)
    for content in ("", "model_checkpoint_path: \"ckpt-40\"\ngarbage {{{"):
        (out / "checkpoint").write_text(content)
        _, again = _make(strategy, out, steps=40, save=10)
        assert again.restore_or_initialize() == 40
        assert (out / "checkpoint").read_text() == content  # nothing written yet
        assert again.saver.manager.latest_checkpoint.endswith("ckpt-40")
        assert tf.train.latest_checkpoint(str(out)).endswith("ckpt-40")
    (out / "checkpoint").write_text("")
    with open(out / "ckpt-40.index", "r+b") as f:  # the newest is damaged too
        f.truncate(10)
    assert checkpointing.checkpoints_newest_first(str(out))[0].endswith("ckpt-40")
    _, again = _make(strategy, out, steps=40, save=10)
    assert again.restore_or_initialize() == 30


def test_the_input_position_is_exact_for_each_pipeline(unmasked, tmp_path):
    """An iterator saved after k batches and restored into a new pipeline gives the
    batches the first one gives next: static and dynamic masking, length buckets."""
    spec = bucketing_records(tmp_path / "buckets.tfrecord",
                             [random.Random(i).randint(3, 32) for i in range(300)])
    masking = dynamic_masking.DynamicMasking.from_vocab_file(
        unmasked["vocab"], max_predictions_per_seq=S.PREDS, seed=5)
    pipelines = {
        "static": lambda: input_pipeline.pretraining_dataset(
            input_pipeline.PretrainingInputConfig((unmasked["pattern"],), S.SEQ, S.PREDS,
                                                  seed=5, shuffle_buffer=40),
            batch_size=8, is_training=True),
        "dynamic": lambda: input_pipeline.pretraining_dataset(
            input_pipeline.PretrainingInputConfig((unmasked["unmasked"],), S.SEQ, S.PREDS,
                                                  seed=5, shuffle_buffer=40,
                                                  masking=masking),
            batch_size=8, is_training=True),
        "buckets": lambda: input_pipeline.finetuning_records(
            input_pipeline.RecordsConfig((str(tmp_path / "buckets.tfrecord"),), spec,
                                         seed=5, bucket_boundaries=(8, 16, 32)),
            batch_size=4, is_training=True),
    }
    for name, build in pipelines.items():
        first = iter(build())
        for _ in range(25):
            next(first)
        path = tf.train.Checkpoint(it=first).save(str(tmp_path / name / "it"))
        expected = [next(first) for _ in range(60)]  # past an epoch: reshuffles, new masks
        second = iter(build())
        tf.train.Checkpoint(it=second).restore(path)
        for a, b in zip(expected, (next(second) for _ in range(60))):
            assert sorted(a) == sorted(b)
            for key in a:
                np.testing.assert_array_equal(a[key].numpy(), b[key].numpy(), err_msg=name)
