"""Fault injection on the long-running runners: kill -9 and SIGTERM at random moments.

For `run_classifier.py` (evaluating and predicting) and `extract_features.py`, each started
as a real subprocess on tiny data and killed (SIGKILL or SIGTERM, seeded random moments
spread over start-up and output writing), then checked:

* only the previous good state or a complete new one exists under final names: result
  files parse completely; extract_features' JSON lines are absent or byte-identical to an
  uninterrupted run's;
* no temporary is visible (hidden `.NAME.tmp-*` may remain after kill -9, none after
  SIGTERM), and no process of the run is left;
* a rerun succeeds (the lock of a killed run is recovered) and reaches the same result.

A kill counts as landed only if the run still ran (and, where a phase is named, was in that
phase) when the signal was sent, and ended with the signal's exit status; each test requires
a minimum of landed kills, or it would check nothing.

Kills while training (run_pretraining.py, run_classifier.py: SIGKILL and SIGTERM after a
checkpoint) are tests/test_exact_resume_runners.py's, with this module's checks after each
and a restart that must equal an uninterrupted run bit for bit. A runner's SIGTERM handler
comes right after its imports, before it reads a flag (`data_prep.cli.start`): before it, a
runner has written nothing (the runners' start-up kills, in their first 3 s, landed in
TensorFlow's import). extract_features' start-up kill is that moment's test.
"""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests import forkserver
from tests import test_loop_support as S
from tests.conftest import TINY_VOCAB, write_vocab

pytestmark = pytest.mark.slow

# (signal, wait for this output first or None): one kill during start-up, the others at
# random moments after the run reached its main phase. Each kind of moment once: start-up
# (before the SIGTERM handler exists: kill -9 is the one signal whose outcome does not
# depend on it), the main phase under kill -9 (no clean-up) and under SIGTERM (the
# handler's clean-up). Each run restarts in the previous one's output directory, so the
# later rounds also start over a killed run's leftovers. A second random moment of a kind
# already covered proved nothing new (and the reruns below cover the resume).
KILLS = ((signal.SIGKILL, None), (signal.SIGTERM, "MAIN"), (signal.SIGKILL, "MAIN"))


def _start(cmd):
    return subprocess.Popen(cmd, env=S.runner_env(), cwd=S.REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _ended_by(sig, returncode):
    """True if `returncode` is the exit status `sig` gives: -9 for SIGKILL; for SIGTERM 143
    (the handler's clean exit) or -15 (the signal came before the handler existed)."""
    if sig == signal.SIGKILL:
        return returncode == -signal.SIGKILL
    return returncode in (128 + signal.SIGTERM, -signal.SIGTERM)


def _kill_at(proc, sig, delay, after=None, in_progress=None):
    """Sends `sig` `delay` s after the output shows `after` (None: after the start), if the
    process still runs; returns (returncode, output, landed). `landed`: the process still
    ran, `in_progress()` (if given) held just before the signal, and it ended with the
    signal's exit status."""
    lines, seen = [], threading.Event()

    def drain():
        for line in proc.stdout:
            lines.append(line)
            if after is not None and after in line:
                seen.set()
        seen.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    if after is not None:
        seen.wait(timeout=180)
    time.sleep(delay)
    killed = proc.poll() is None and (in_progress is None or in_progress())
    if proc.poll() is None:
        proc.send_signal(sig)
    proc.wait(timeout=120)
    reader.join(timeout=30)
    return proc.returncode, "".join(lines), killed and _ended_by(sig, proc.returncode)


def _no_process_left(proc):
    """Neither the process nor anything in its session still runs."""
    time.sleep(0.2)
    left = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        session = int(fields[3])
        if session == proc.pid and fields[0] != "Z":
            left.append(pid)
    assert not left, f"processes left behind: {left}"


def _visible_temporaries(directory):
    # TensorFlow's own atomic write of the checkpoint state file (`checkpoint.tmp<hex>`,
    # renamed over `checkpoint`) may remain after kill -9: no reader looks at it.
    return [name for root, _, names in os.walk(directory) for name in names
            if ".tmp" in name and not name.startswith((".", "checkpoint.tmp"))]


def _hidden_temporaries(directory):
    return [name for root, _, names in os.walk(directory) for name in names
            if name.startswith(".") and ".tmp-" in name]


def _schedule(rng, main_marker, start_up, main_phase):
    """[(signal, marker, delay)]: seeded random moments within each phase."""
    return [(sig, None, rng.uniform(0.2, start_up)) if marker is None
            else (sig, main_marker, rng.uniform(0.0, main_phase)) for sig, marker in KILLS]


def _check_interrupted(proc, sig, returncode, output, directory):
    _no_process_left(proc)
    assert not _visible_temporaries(directory), output[-2000:]
    if sig == signal.SIGTERM and returncode != 0:
        # A clean exit: 128 + SIGTERM, temporaries removed, no traceback of our own making.
        assert returncode in (143, -signal.SIGTERM), output[-3000:]
        assert not _hidden_temporaries(directory), (_hidden_temporaries(directory),
                                                    output[-2000:])


# ----------------------------------------------------------------------- classifier


def _classifier_data(directory, n=48):
    directory.mkdir(parents=True, exist_ok=True)
    rows = [f"the {'cat' if i % 2 else 'dog'} sat on a mat .\t{'pos' if i % 2 else 'neg'}"
            for i in range(n)]
    for split, k in (("train", n), ("dev", 12), ("test", 12)):
        (directory / f"{split}.tsv").write_text("text\tlabel\n" + "\n".join(rows[:k]) + "\n",
                                                encoding="utf-8")
    return str(directory)


def _phase_times(proc, markers, files, timeout=300):
    """Runs `proc` to its end; seconds from its start until each output marker was seen
    and each file existed (polled every 10 ms)."""
    start, times, lines = time.monotonic(), {}, []
    def drain():
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    while proc.poll() is None and time.monotonic() - start < timeout:
        now = time.monotonic() - start
        text = "".join(list(lines))
        for marker in markers:
            if marker in text:
                times.setdefault(marker, now)
        for path in files:
            if path.exists():
                times.setdefault(path.name, now)
        time.sleep(0.01)
    proc.wait(timeout=60)
    reader.join(timeout=30)
    return times, "".join(lines)


def test_run_classifier_survives_kills(tmp_path):
    """Kills while evaluating and while predicting (eval + predict from a checkpoint trained
    first, uninterrupted, by a run that evaluates and predicts too and times both phases).
    Kills while
    training (SIGKILL and SIGTERM, after a checkpoint, with this module's checks) are
    tests/test_exact_resume_runners.py's, whose restarts must then equal an uninterrupted
    run bit for bit."""
    root = tmp_path
    vocab = write_vocab(root / "vocab.txt")
    config = S.write_config(root / "bert_config.json", vocab_size=len(TINY_VOCAB),
                            num_hidden_layers=1)
    data = _classifier_data(root / "data")
    out = root / "out"
    flags = dict(task_name="custom", data_dir=data, vocab_file=vocab, bert_config_file=config,
                 output_dir=out, text_a_column="text", label_column="label",
                 label_list="neg,pos", do_train="true", do_eval="true", do_predict="true",
                 max_seq_length=16, train_batch_size=4, eval_batch_size=4,
                 predict_batch_size=4, num_train_epochs=300.0, learning_rate=1e-3,
                 save_checkpoints_steps=6, iterations_per_loop=3,
                 distribution_strategy="one_device", seed=2)

    def command(**overrides):
        return [sys.executable, os.path.join(S.REPO_ROOT, "run_classifier.py")] + [
            f"--{k}={v}" for k, v in dict(flags, **overrides).items()]

    def check_outputs():
        if (out / "test_results.tsv").exists():
            lines = (out / "test_results.tsv").read_text().splitlines()
            assert len(lines) == 12 and all(len(line.split("\t")) == 2 for line in lines)
        if (out / "eval_results.txt").exists():
            keys = [line.split(" = ")[0] for line in
                    (out / "eval_results.txt").read_text().splitlines()]
            assert keys == sorted(keys) and "eval_accuracy" in keys

    rng = random.Random(11)

    # The killed runs do not train: one evaluates, one predicts. Eval runs from the restore to
    # eval_results.txt, predict from "Predicting" to test_results.tsv. The uninterrupted
    # run that trains the weights they read (one epoch: 12 steps) times both (its eval
    # from its last checkpoint's save: the same evaluation of the same weights), then
    # each kill lands at a seeded moment within its phase (its output file removed first,
    # so that "in progress" is "the file is not there yet"), in its first third: on a
    # loaded machine the timed phase may last twice as long as the killed run's.
    eval_results, test_results = out / "eval_results.txt", out / "test_results.tsv"
    phases = {"eval": ("Resumed from", eval_results), "predict": ("Predicting", test_results)}
    timed_from = {"eval": "Saved checkpoint " + str(out / "ckpt-12"), "predict": "Predicting"}
    # Nobody signals this run: forked from one TensorFlow import (tests/forkserver.py).
    routed, env = forkserver.routed(command(num_train_epochs=1.0), S.runner_env())
    timed = subprocess.Popen(routed, env=env, cwd=S.REPO_ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    times, output = _phase_times(timed, list(timed_from.values()),
                                 [eval_results, test_results])
    assert timed.returncode == 0 and len(times) == 4, (times, output[-3000:])
    durations = {name: times[path.name] - times[timed_from[name]]
                 for name, (_, path) in phases.items()}
    assert min(durations.values()) > 0, (times, output[-3000:])
    landed = {name: 0 for name in phases}
    # One kill per phase, one of each signal: eval and predict compute in the same code
    # (the task's `_predict`, where a signal lands) and write their file with the same
    # all-or-nothing writer (`fileio.write_texts`), so SIGTERM's clean-up and kill -9's
    # leftovers are the same in both.
    # The run killed while predicting does not evaluate first (that would only delay the
    # moment; eval_results.txt is then the rerun's to write).
    for sig, phase in ((signal.SIGKILL, "eval"), (signal.SIGTERM, "predict")):
        marker, path = phases[phase]
        path.unlink(missing_ok=True)
        proc = _start(command(do_train="false", do_eval=str(phase == "eval").lower()))
        returncode, output, was_killed = _kill_at(
            proc, sig, rng.uniform(0.1, 0.3) * durations[phase], marker,
            in_progress=lambda path=path: not path.exists())
        landed[phase] += was_killed
        _check_interrupted(proc, sig, returncode, output, out)
        check_outputs()
    assert landed == {"eval": 1, "predict": 1}, (
        f"kills that landed mid-phase {landed} (phases {durations}): a kill that did not "
        "land checked little")
    proc = forkserver.run(command(do_train="false"), S.runner_env(), S.REPO_ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    check_outputs()
    assert (out / "test_results.tsv").exists() and (out / "eval_results.txt").exists()
    assert not (out / ".run.lock").exists()


# ------------------------------------------------------------------ extract_features


def test_extract_features_output_is_all_or_nothing(tmp_path):
    import numpy as np

    from modeling import checkpoints
    from modeling.config import BertConfig
    from modeling.encoder import BertEncoder

    vocab = write_vocab(tmp_path / "vocab.txt")
    config_path = S.write_config(tmp_path / "bert_config.json", vocab_size=len(TINY_VOCAB))
    encoder = BertEncoder(BertConfig.from_json_file(config_path))
    encoder({"input_ids": np.zeros([1, 8], np.int32), "input_mask": np.ones([1, 8], np.int32),
             "segment_ids": np.zeros([1, 8], np.int32)})
    ckpt_dir = tmp_path / "ckpt"
    checkpoints.save_ours(encoder, str(ckpt_dir))
    # 500 lines: computing them takes seconds (4 s from "Computing features" to the end
    # for 300 on a loaded 2-core Xeon, 2026-12-01), several times the main phase's latest
    # kill (0.5 s).
    lines = [f"the cat sat on the mat number {i} . ||| a dog ran far away ." for i in range(500)]
    (tmp_path / "input.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    output = tmp_path / "features" / "out.jsonl"
    cmd = [sys.executable, os.path.join(S.REPO_ROOT, "extract_features.py"),
           f"--input_file={tmp_path / 'input.txt'}", f"--output_file={output}",
           f"--init_checkpoint={ckpt_dir}", f"--bert_config_file={config_path}",
           f"--vocab_file={vocab}", "--max_seq_length=32", "--batch_size=8",
           "--layers=-1,-2"]
    reference = forkserver.run(cmd, S.runner_env(), S.REPO_ROOT)  # nobody kills it
    assert reference.returncode == 0, reference.stderr[-3000:]
    good = output.read_bytes()
    assert len(good.splitlines()) == 500 and json.loads(good.splitlines()[-1])
    output.unlink()
    rng = random.Random(12)
    killed = 0
    for sig, marker, delay in _schedule(rng, "Computing features", 3.0, 0.5):
        proc = _start(cmd)
        returncode, log, was_killed = _kill_at(proc, sig, delay, marker)
        killed += was_killed
        _check_interrupted(proc, sig, returncode, log, output.parent)
        assert not output.exists() or output.read_bytes() == good, log[-2000:]
        if output.exists():
            output.unlink()
    assert killed >= len(KILLS) - 1, "runs finished before their signal: the test checked little"
    rerun = forkserver.run(cmd, S.runner_env(), S.REPO_ROOT)
    assert rerun.returncode == 0 and output.read_bytes() == good
    assert not _hidden_temporaries(output.parent)  # the rerun cleaned up after kill -9
