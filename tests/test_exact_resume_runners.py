"""Interrupt anywhere, lose nothing (issue 24), through the real CLIs as subprocesses.

For run_pretraining.py (dynamic masking under MirroredStrategy over two logical CPUs) and
run_classifier.py (--long_document=windows: length buckets over documents of 1 to 3
windows), a run is stopped at seeded random moments and restarted each time: the
pretraining run by SIGKILL, then restarted with eval; the classifier run by SIGTERM,
then (resumed) by SIGKILL. It ends with the checkpoint of an uninterrupted run, bit for
bit (weights, optimizer slots, dropout generators), and every step it logged (steps run
again after a kill included) has the uninterrupted run's loss, bit for bit (float32
TensorBoard scalars). Dropout is on. A clean stop (SIGTERM) saves the step it arrived
in, exits 143 with one line saying so and no traceback, and the next run resumes there,
input position included. After every signal no process of the run is left and no
temporary is visible (after a clean stop, not even a hidden one); after the last run the
run lock is gone (tests/test_fault_injection_runners.py's checks, here on these kills).

Shared with lower layers (each proven once, where it lives): static masks, gradient
accumulation and a loop killed mid-run and resumed into other initial weights and seeds
(tests/test_resume.py::test_a_killed_and_resumed_run_equals_the_uninterrupted_one); the
input position of each pipeline (static masks, dynamic masking, length buckets over
single texts: --long_document=truncate's records) restored exactly
(tests/test_resume.py::test_the_input_position_is_exact_for_each_pipeline); a stop signal
inside one long compiled call, saved at its step
(tests/test_resume.py::test_sigterm_checkpoints_the_step_it_arrived_in_and_resumes_there);
Ctrl-C taking SIGTERM's way but for its exit status 130
(tests/test_resume.py::test_stop_requests_reach_a_compiled_loop_while_it_runs[SIGINT];
a CLI's Ctrl-C exit: tests/test_fault_injection_pretraining_data.py). Here, what only a
real process shows: the runners' wiring of these (seed, input identity, signal handling,
exit status, lock, leftovers) under real signals."""

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
    proc = subprocess.Popen(command, env=S.runner_env(), cwd=S.REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
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


def _killed_and_resumed(command, out, rng, signals, steps, max_delay=0.05, last=None):
    """Stops `command` with each of `signals` in turn (SIGKILL, or SIGTERM: a clean
    stop), each at a random moment shortly after the progress line of a random step
    (sorted, so the signals spread over the run), then runs `last` (default `command`) to
    the end. After each: no visible temporary and no process left
    (`_signal_while_training`); after a clean stop also no hidden temporary (its clean-up
    ran), exit 128 + signal, no traceback, one line saying it saved the step it arrived
    in, and the next run resumes from that checkpoint and input position. At the end no
    run lock (the killed runs' were taken over, the last released). Returns (signals that
    landed, the steps logged after the checkpoint a killed run resumes from: the ones the
    next run must run and log again)."""
    landed, lost, stopped_at = 0, set(), None
    for sig, target in zip(signals, sorted(rng.sample(range(1, steps - 1), len(signals)))):
        code, log, was_running = _signal_while_training(
            command, sig, rng.uniform(0.0, max_delay), after_step=target)
        _resumed_where_stopped(stopped_at, log)
        stopped_at = None
        assert not F._visible_temporaries(out), log[-3000:]
        if was_running:
            assert code == (-sig if sig == signal.SIGKILL else 128 + sig), log[-3000:]
            landed += 1
            latest = tf.train.latest_checkpoint(str(out))
            resumes_at = int(latest.rsplit("-", 1)[1]) if latest else 0
            logged = _losses(str(out / "train"))
            if sig != signal.SIGKILL:
                stopped_at = resumes_at
                assert resumes_at == max(logged), (resumes_at, log[-3000:])
                assert not F._hidden_temporaries(out), log[-3000:]
                assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]
                said = [line for line in log.splitlines() if "Stopping at step " in line]
                assert len(said) == 1, log[-3000:]
                assert f"Stopping at step {resumes_at} on signal {int(sig)}: saved " in said[0]
            lost |= {step for step in logged if step > resumes_at}
        else:
            assert code == 0, log[-3000:]
    code, log = _run(last or command)
    assert code == 0, log[-3000:]
    _resumed_where_stopped(stopped_at, log)
    assert not (out / ".run.lock").exists()
    return landed, lost


def _resumed_where_stopped(step, log):
    """A run after a clean stop at `step` (None: after none) resumed from its checkpoint
    and input position."""
    if step is not None:
        assert f"ckpt-{step} at step {step}" in log, log[-3000:]
        assert "Input resumes at the position" in log, log[-3000:]


# ---------------------------------------------------------------------- pretraining


@pytest.fixture(scope="module")
def data(pretraining_records, tmp_path_factory):
    """Unmasked records (--dynamic_masking, test_loop_support; read only) of the conftest
    corpus, its vocab, a config with dropout."""
    d = tmp_path_factory.mktemp("exact_resume")
    return {"vocab": pretraining_records["vocab"],
            "unmasked": S.unmasked_records(tmp_path_factory, pretraining_records),
            "config": S.write_config(d / "bert_config.json", vocab_size=120, dropout=0.1,
                                     num_hidden_layers=1)}


STEPS = 20  # 4 checkpoints; the kill (seed 25: at step 13) has 3 past ckpt-10 to rerun


def _pretraining(data, out, **overrides):
    """run_pretraining's command: STEPS steps of dynamic masking under MirroredStrategy over
    two logical CPUs, dropout, log and summary every step."""
    flags = dict(input_file=data["unmasked"], vocab_file=data["vocab"],
                 bert_config_file=data["config"], output_dir=out, max_seq_length=S.SEQ,
                 max_predictions_per_seq=S.PREDS, train_batch_size=8, learning_rate=1e-3,
                 num_train_steps=STEPS, num_warmup_steps=5, iterations_per_loop=1,
                 log_steps=1, save_checkpoints_steps=5, do_train="true", do_eval="false",
                 seed=1, distribution_strategy="mirrored", num_cpu_devices=2)
    flags.update(overrides)
    return S.runner_command(**flags)


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """The uninterrupted run the killed one is compared with."""
    out = tmp_path_factory.mktemp("reference")
    code, log = _run(_pretraining(data, out))
    assert code == 0, log[-3000:]
    assert "MirroredStrategy with 2 replica(s)" in log and "dynamic masking" in log
    return out


def test_dynamic_masking_mirrored_killed_equals_the_uninterrupted_run(data, reference,
                                                                     tmp_path):
    """One SIGKILL (at step 13: the steps past ckpt-10 run again), then a restart that
    evaluates too (its eval of the last step). A resumed run stopped again is the
    classifier's."""
    out = tmp_path / "killed"
    landed, lost = _killed_and_resumed(
        _pretraining(data, out), out, random.Random(25), [signal.SIGKILL], STEPS,
        last=_pretraining(data, out, do_eval="true", max_eval_steps=1))
    assert landed == 1, "the run finished before its kill: nothing was checked"
    assert lost, "the kill came right after a checkpoint: no step was run again"
    _check_exact(reference, out, STEPS, lost)
    assert S.read_eval_results(out / "eval_results.txt")["global_step"] == STEPS


def test_a_resume_with_another_batch_size_is_refused(data, reference, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(reference, out)
    # In this process: one device (its TensorFlow has one logical CPU; the input
    # identity does not name the strategy).
    refused = call_main("run_pretraining", _pretraining(
        data, out, num_train_steps=STEPS + 5, train_batch_size=16,
        distribution_strategy="one_device", num_cpu_devices=0)[2:])
    assert refused.code != 0
    assert "batch_size: 8 there, 16 now" in refused.stderr and f"ckpt-{STEPS}" in refused.stderr, (
        refused.stderr[-3000:])


# ----------------------------------------------------------------------- classifier


def _classifier_command(root, out, long_document="truncate"):
    """run_classifier's command on custom data of varied lengths (two length buckets;
    windows: 1 to 3 windows of 14 tokens per text, 7 apart, in records of 4): 48 texts,
    2.5 epochs of batches of 4 (30 steps), a one-layer model with dropout."""
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
                            dropout=0.1, num_hidden_layers=1)
    flags = dict(task_name="custom", data_dir=data, vocab_file=vocab, bert_config_file=config,
                 output_dir=out, text_a_column="text", label_column="label",
                 label_list="neg,pos", do_train="true", do_eval="false",
                 max_seq_length=32, train_batch_size=4, num_train_epochs=2.5,
                 learning_rate=1e-3, save_checkpoints_steps=5, iterations_per_loop=1,
                 log_steps=1, distribution_strategy="one_device", seed=2)
    if long_document == "windows":
        flags.update(long_document="windows", max_seq_length=16, doc_stride=7,
                     max_windows_per_document=4, window_pooling="attention")
    return [sys.executable, os.path.join(S.REPO_ROOT, "run_classifier.py")] + [
        f"--{k}={v}" for k, v in flags.items()]


def test_classifier_with_length_buckets_stopped_and_killed_equals_the_uninterrupted_run(
        tmp_path):
    """--long_document=windows, length buckets: SIGTERM (the clean stop, exit 143, its
    clean-up, the restart from the step it came in), then SIGKILL of the resumed run (the
    steps past its checkpoint run again). Truncated texts take the same run, resume and
    signal code with another parse spec and model; their records' position (length
    buckets over single texts) is test_resume.py's `buckets` pipeline."""
    reference = tmp_path / "reference"
    code, log = _run(_classifier_command(tmp_path, reference, "windows"))
    assert code == 0, log[-3000:]
    steps = 30  # 48 examples / 4 x 2.5 epochs: 6 checkpoints
    out = tmp_path / "killed"
    # Seed 34: SIGTERM after step 12 (the clean stop saves its step, past ckpt-10), then
    # SIGKILL of the resumed run after step 17 (the steps past ckpt-15 run again), 13
    # steps and 3 checkpoints before its end: the kill lands on a fast machine too.
    landed, lost = _killed_and_resumed(_classifier_command(tmp_path, out, "windows"), out,
                                       random.Random(34), [signal.SIGTERM, signal.SIGKILL],
                                       steps)
    assert landed == 2, "a run finished before its signal: the test checked little"
    assert lost, "the kill came right after a checkpoint: no step was run again"
    _check_exact(reference, out, steps, lost)
