"""Interrupt anywhere, lose nothing (issue 24), through the real CLIs as subprocesses.

For run_pretraining.py (static masks with gradient accumulation on one device; dynamic
masking under MirroredStrategy over two logical CPUs) and run_classifier.py (length
buckets), a run killed with SIGKILL at seeded random moments (twice for static masks:
a resumed run killed again; once for the others; with SIGTERM instead for the classifier's
truncated texts) and restarted each time ends with the checkpoint of an uninterrupted run,
bit for bit (weights, optimizer slots, dropout generators), and every step it logged
(steps run again after a kill included) has the uninterrupted run's loss, bit for bit
(float32 TensorBoard scalars). Dropout is on. Ctrl-C mid-call saves the step it arrived in
and the restart loses no step. After every signal no process of the run is left and no
temporary is visible (after a clean stop, not even a hidden one); after the last run the
run lock is gone (tests/test_fault_injection_runners.py's checks, here on these kills)."""

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from tests import forkserver
from tests import test_fault_injection_runners as F
from tests import test_loop_support as S
from tests.clis import call_main
from tests.conftest import TINY_VOCAB, write_vocab

pytestmark = pytest.mark.slow


def _losses(event_dir):
    """{step: [every logged loss]} from the train summaries of every run in the directory
    (a SIGKILL may cut the last event: what precedes it is read)."""
    out = {}
    for path in sorted(tf.io.gfile.glob(os.path.join(event_dir, "events.out.tfevents.*"))):
        try:
            for raw in tf.data.TFRecordDataset(path):
                event = tf.compat.v1.Event.FromString(raw.numpy())
                for value in event.summary.value:
                    if value.tag == "loss":
                        out.setdefault(event.step, []).append(
                            tf.make_ndarray(value.tensor).item())
        except tf.errors.DataLossError:
            pass
    return out


def _state(prefix):
    """Every model, optimizer and dropout-generator value of a checkpoint."""
    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.startswith(("model/", "optimizer/", "rng/", "step/"))}


def _run(command, timeout=300):
    """Runs a CLI to its end, forked from one TensorFlow import (tests/forkserver.py: a
    run nobody signals needs no fresh interpreter): (exit status, output)."""
    done = forkserver.run(command, S.runner_env(), S.REPO_ROOT, timeout)
    return done.returncode, done.stdout + done.stderr


PROGRESS = re.compile(r"step (\d+)/\d+ loss ")


def _signal_while_training(command, sig, delay, after_step=1, timeout=300):
    """Starts `command`, waits for the progress line of a step >= `after_step` (or of the
    first step it runs, if it resumes past it), sleeps `delay` s and sends `sig` if it still
    runs; returns (returncode, output, landed: it was still running) once neither the run
    nor anything in its session is left."""
    # SIGINT as a terminal gives it: a test run started as a background job (or by a
    # runner that does so) ignores SIGINT, and its children would inherit that.
    proc = subprocess.Popen(command, env=S.runner_env(), cwd=S.REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines, reached = [], threading.Event()

    def drain():
        for line in proc.stdout:
            lines.append(line)
            match = PROGRESS.search(line)
            if match and int(match.group(1)) >= after_step:
                reached.set()
        reached.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        reached.wait(timeout=timeout)
        time.sleep(delay)
        landed = proc.poll() is None
        if landed:
            proc.send_signal(sig)
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=30)
    F._no_process_left(proc)
    return proc.returncode, "".join(lines), landed


def _check_exact(reference_dir, resumed_dir, steps, lost=()):
    """Same final checkpoint bit for bit, every logged loss equal to the reference's, and
    the `lost` steps (logged past the checkpoint a kill resumed from) logged again."""
    reference = _state(str(reference_dir / f"ckpt-{steps}"))
    resumed = _state(str(resumed_dir / f"ckpt-{steps}"))
    assert sorted(resumed) == sorted(reference)
    assert any(name.startswith("rng/") for name in reference)  # dropout generators saved
    for name, value in reference.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)
    expected = _losses(str(reference_dir / "train"))
    logged = _losses(str(resumed_dir / "train"))
    assert sorted(expected) == list(range(1, steps + 1))
    assert sorted(logged) == sorted(expected), (sorted(logged), sorted(expected))
    for step, values in logged.items():
        assert all(v == expected[step][0] for v in values), (step, values, expected[step])
    for step in lost:
        assert len(logged[step]) > 1, (step, "was not run again after the kill")


def _killed_and_resumed(command, out, rng, signals, steps, max_delay=0.05):
    """Stops `command` with each of `signals` in turn (SIGKILL, or SIGTERM: a clean stop),
    each at a random moment shortly after the progress line of a random step (sorted, so
    the kills spread over the run), then runs it to the end. After each: no visible
    temporary (nor, after SIGTERM, a hidden one: its clean-up ran, and it saved the step
    it arrived in), and no process left (`_signal_while_training`); at the end no run
    lock (the killed runs' were taken over, the last released). Returns (kills that
    landed, the steps logged after the checkpoint a killed run resumes from: the ones the
    next run must run and log again)."""
    landed, lost = 0, set()
    for sig, target in zip(signals, sorted(rng.sample(range(1, steps - 1), len(signals)))):
        code, log, was_running = _signal_while_training(
            command, sig, rng.uniform(0.0, max_delay), after_step=target)
        assert not F._visible_temporaries(out), log[-3000:]
        if was_running:
            assert code == (-sig if sig == signal.SIGKILL else 128 + sig), log[-3000:]
            landed += 1
            latest = tf.train.latest_checkpoint(str(out))
            resumes_at = int(latest.rsplit("-", 1)[1]) if latest else 0
            logged = _losses(str(out / "train"))
            if sig != signal.SIGKILL:
                assert resumes_at == max(logged), (resumes_at, log[-3000:])
                assert not F._hidden_temporaries(out), log[-3000:]
            lost |= {step for step in logged if step > resumes_at}
        else:
            assert code == 0, log[-3000:]
    code, log = _run(command)
    assert code == 0, log[-3000:]
    assert not (out / ".run.lock").exists()
    return landed, lost


# ---------------------------------------------------------------------- pretraining


@pytest.fixture(scope="module")
def data(pretraining_records, tmp_path_factory):
    """Masked (conftest) and unmasked (--dynamic_masking, test_loop_support) records of one
    corpus (both read only), vocab, config."""
    d = tmp_path_factory.mktemp("exact_resume")
    pattern, vocab = pretraining_records["pattern"], pretraining_records["vocab"]
    return {"pattern": pattern, "vocab": vocab,
            "unmasked": S.unmasked_records(tmp_path_factory, pretraining_records),
            "config": S.write_config(d / "bert_config.json", vocab_size=120, dropout=0.1)}


STEPS = 30


def _pretraining(data, out, **overrides):
    """run_pretraining's command: STEPS steps, dropout, log and summary every step."""
    flags = dict(input_file=data["pattern"], bert_config_file=data["config"], output_dir=out,
                 max_seq_length=S.SEQ, max_predictions_per_seq=S.PREDS, train_batch_size=8,
                 learning_rate=1e-3, num_train_steps=STEPS, num_warmup_steps=5,
                 iterations_per_loop=1, log_steps=1, save_checkpoints_steps=5,
                 do_train="true", do_eval="false", seed=1,
                 distribution_strategy="one_device", gradient_accumulation_steps=2)
    flags.update(overrides)
    return S.runner_command(**flags)


@pytest.fixture(scope="module")
def static_reference(data, tmp_path_factory):
    """The uninterrupted static-masks run everything is compared with."""
    out = tmp_path_factory.mktemp("static_reference")
    code, log = _run(_pretraining(data, out))
    assert code == 0, log[-3000:]
    return out


def test_pretraining_killed_at_random_moments_equals_the_uninterrupted_run(
        data, static_reference, tmp_path):
    out = tmp_path / "killed"
    # Two kills: the first resumes a run killed once, the second one resumed already (its
    # input position and dropout generators restored, then saved again). A third random
    # step would be one more of the same moment. Each kill comes at most 0.05 s after the
    # progress line of a step at least two before the last: the run is still running.
    landed, lost = _killed_and_resumed(_pretraining(data, out), out, random.Random(24),
                                       [signal.SIGKILL] * 2, STEPS)
    assert landed == 2, "the runs finished before their kill: the test checked little"
    assert lost, "every kill came right after a checkpoint: no step was run again"
    _check_exact(static_reference, out, STEPS, lost)


def test_dynamic_masking_mirrored_killed_equals_the_uninterrupted_run(data, tmp_path):
    common = dict(input_file=data["unmasked"], vocab_file=data["vocab"],
                  distribution_strategy="mirrored", num_cpu_devices=2,
                  gradient_accumulation_steps=1)
    reference = tmp_path / "reference"
    code, log = _run(_pretraining(data, reference, **common))
    assert code == 0, log[-3000:]
    assert "MirroredStrategy with 2 replica(s)" in log and "dynamic masking" in log
    out = tmp_path / "killed"
    # One kill: a resumed run killed again is the static test's (the same loop and input
    # state); here what is new is the mirrored, dynamically masked input's resume.
    landed, lost = _killed_and_resumed(_pretraining(data, out, **common), out,
                                       random.Random(25), [signal.SIGKILL], STEPS)
    assert landed == 1, "the run finished before its kill: nothing was checked"
    _check_exact(reference, out, STEPS, lost)


def test_ctrl_c_mid_call_saves_the_step_it_arrived_in_and_the_restart_loses_none(
        data, static_reference, tmp_path):
    """Calls of 15 steps, checkpoints every 1000: Ctrl-C (SIGINT) comes in the second call
    (right after the first call's progress line). The checkpoint is of the step it came in,
    exit 130, one line saying so, no KeyboardInterrupt traceback, no temporary left; the
    restart (which evaluates too) resumes there and ends with the uninterrupted run's
    checkpoint, bit for bit. SIGINT takes SIGTERM's way (a stop request the compiled loop
    reads at every step, then the checkpoint and SystemExit) but for the exit status:
    SIGTERM's 143 is the classifier test's and tests/test_fault_injection_runners.py's."""
    for attempt in range(3):  # a loaded machine may finish the call before the signal
        out = tmp_path / f"interrupted{attempt}"
        command = _pretraining(data, out, iterations_per_loop=15, log_steps=15,
                               save_checkpoints_steps=1000)
        code, log, landed = _signal_while_training(command, signal.SIGINT, 0.0)
        lines = [line for line in log.splitlines() if "Stopping at step " in line]
        if landed and lines and int(lines[0].split("Stopping at step ")[1].split()[0]) < STEPS:
            break
    else:
        pytest.fail("the signal never came before the second call's end: nothing was "
                    "checked\n" + log[-3000:])
    assert code == 128 + signal.SIGINT, log[-3000:]
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]
    assert len(lines) == 1, log[-3000:]
    stopped = int(lines[0].split("Stopping at step ")[1].split()[0])
    assert f"on signal {int(signal.SIGINT)}: saved " in lines[0], lines[0]
    assert 15 < stopped < STEPS, log[-3000:]  # inside the second (last) compiled call
    assert tf.train.latest_checkpoint(str(out)).endswith(f"ckpt-{stopped}")
    assert sorted(_losses(str(out / "train")))[-1] == stopped  # its progress was logged
    assert not F._visible_temporaries(out) and not F._hidden_temporaries(out)
    code, log = _run(_pretraining(data, out, iterations_per_loop=15, log_steps=15,
                                  save_checkpoints_steps=1000, do_eval="true",
                                  max_eval_steps=1))
    assert code == 0, log[-3000:]
    assert f"ckpt-{stopped} at step {stopped}" in log and "Input resumes at the position" in log
    reference = _state(str(static_reference / f"ckpt-{STEPS}"))
    resumed = _state(str(out / f"ckpt-{STEPS}"))
    for name, value in reference.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)
    assert S.read_eval_results(out / "eval_results.txt")["global_step"] == STEPS
    assert not (out / ".run.lock").exists()


def test_a_resume_with_another_batch_size_is_refused(data, static_reference, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(static_reference, out)
    refused = call_main("run_pretraining", _pretraining(
        data, out, num_train_steps=STEPS + 5, train_batch_size=16)[2:])
    assert refused.code != 0
    assert "batch_size: 8 there, 16 now" in refused.stderr and f"ckpt-{STEPS}" in refused.stderr, (
        refused.stderr[-3000:])


# ----------------------------------------------------------------------- classifier


def _classifier_command(root, out, long_document="truncate"):
    """run_classifier's command on custom data of varied lengths (two length buckets;
    windows: 1 to 3 windows of 14 tokens per text, 7 apart, in records of 4)."""
    rng = random.Random(3)
    words = ["the", "a", "big", "red", "far", "away", "on", "in", "to", "and"]
    data = root / "data"
    if not data.exists():
        data.mkdir(parents=True)
        rows = []
        for i in range(48):  # lengths 3..24 words: both length buckets (16, 32)
            noun = "cat" if i % 2 else "dog"
            body = [rng.choice(words) for _ in range(rng.randint(2, 23))]
            rows.append(f"{' '.join([noun] + body)} .\t{'pos' if i % 2 else 'neg'}")
        for split, k in (("train", 48), ("dev", 8)):
            (data / f"{split}.tsv").write_text("text\tlabel\n" + "\n".join(rows[:k]) + "\n",
                                               encoding="utf-8")
    vocab = write_vocab(root / "vocab.txt")
    config = S.write_config(root / "bert_config.json", vocab_size=len(TINY_VOCAB),
                            dropout=0.1)
    flags = dict(task_name="custom", data_dir=data, vocab_file=vocab, bert_config_file=config,
                 output_dir=out, text_a_column="text", label_column="label",
                 label_list="neg,pos", do_train="true", do_eval="false",
                 max_seq_length=32, train_batch_size=4, num_train_epochs=5.0,
                 learning_rate=1e-3, save_checkpoints_steps=5, iterations_per_loop=1,
                 log_steps=1, distribution_strategy="one_device", seed=2)
    if long_document == "windows":
        flags.update(long_document="windows", max_seq_length=16, doc_stride=7,
                     max_windows_per_document=4, window_pooling="attention")
    return [sys.executable, os.path.join(S.REPO_ROOT, "run_classifier.py")] + [
        f"--{k}={v}" for k, v in flags.items()]


@pytest.mark.parametrize("long_document,sig", [("truncate", signal.SIGTERM),
                                               ("windows", signal.SIGKILL)],
                         ids=["truncate", "windows"])
def test_classifier_with_length_buckets_killed_equals_the_uninterrupted_run(
        long_document, sig, tmp_path):
    reference = tmp_path / "reference"
    code, log = _run(_classifier_command(tmp_path, reference, long_document))
    assert code == 0, log[-3000:]
    steps = 60  # 48 examples / 4 x 5 epochs
    out = tmp_path / "killed"
    # One signal (at step 42, past ckpt-40): a resumed run killed again is the pretraining
    # test's; here what is new is the classifier's input (length buckets, windows), whose
    # position a restart restores from the checkpoint of the step a SIGTERM came in
    # (truncate: the clean stop, its exit status 143 and clean-up) or from the one before a
    # SIGKILL (windows: the steps past it run again).
    landed, lost = _killed_and_resumed(_classifier_command(tmp_path, out, long_document), out,
                                       random.Random(27), [sig], steps)
    assert landed == 1, "the run finished before its signal: nothing was checked"
    assert bool(lost) == (sig == signal.SIGKILL), (
        lost, "the kill came right after a checkpoint: no step was run again")
    _check_exact(reference, out, steps, lost)
