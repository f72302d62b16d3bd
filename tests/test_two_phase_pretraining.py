"""The paper's pretraining schedule (Appendix A.2) as one run in two phases: phase 1 at a
short sequence length, phase 2 at a longer one on its own records, carrying the weights,
the optimizer state and the step across; exact resume inside either phase and at the
boundary; the position embeddings beyond phase 1's length trained in phase 2 only.

Tiny scale: phase 1 at sequence length 16, phase 2 at 32 (the paper's 128 and 512).
"""

import os
import random
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from tests import test_loop_support as S
from tests.clis import call_main
from tests.test_loop_support import read_eval_results

SHORT, LONG = (16, 3), (32, 5)  # (max_seq_length, max_predictions_per_seq) per phase
BATCH = 8


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = tmp_path_factory.mktemp("phases")
    short, vocab = S.make_records_with_cli(root / "seq16", seq=SHORT[0], preds=SHORT[1])
    long, _ = S.make_records_with_cli(root / "seq32", seq=LONG[0], preds=LONG[1], seed=2)
    config = S.write_config(root / "bert_config.json", vocab_size=120, dropout=0.1,
                            num_hidden_layers=1)  # the phases' carry-over: any depth
    return {"short": short, "long": long, "config": config, "root": root}


# ----------------------------------------------------------------- the CLI, end to end


def _flags(records, out, **changes):
    flags = {
        "input_file": records["short"], "phase2_input_file": records["long"],
        "bert_config_file": records["config"], "output_dir": str(out),
        "max_seq_length": SHORT[0], "max_predictions_per_seq": SHORT[1],
        "phase2_max_seq_length": LONG[0], "phase2_max_predictions_per_seq": LONG[1],
        "train_batch_size": BATCH, "eval_batch_size": BATCH, "learning_rate": 1e-3,
        "num_train_steps": 45, "phase1_steps": 30, "num_warmup_steps": 4,
        "iterations_per_loop": 5, "log_steps": 5, "save_checkpoints_steps": 5,
        "keep_checkpoint_max": 10, "max_eval_steps": 2, "seed": 1, "do_train": "true",
        "do_eval": "true",
    }
    flags.update(changes)
    return flags


def _run_until(flags, pattern):
    """Starts run_pretraining and SIGKILLs it soon after `pattern` is printed; returns
    what it printed."""
    proc = subprocess.Popen(S.runner_command(**flags), env=S.runner_env(), cwd=S.REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(180, proc.kill)
    timer.start()
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if pattern in line:
                time.sleep(random.Random(pattern).uniform(0.0, 0.2))
                os.kill(proc.pid, signal.SIGKILL)
                break
        proc.wait(timeout=30)
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, "".join(seen)[-3000:]
    return "".join(seen)


def _resumed_at(log):
    """The step a run's log says it resumed from (0: it started afresh)."""
    found = re.search(r"Resumed from \S+ at step (\d+)", log)
    return int(found.group(1)) if found else 0


def _tensor(path, name):
    return tf.train.load_checkpoint(path).get_tensor(name)


POSITIONS = "model/encoder/embeddings/position_embeddings/.ATTRIBUTES/VARIABLE_VALUE"


def _slot(path, which):
    """The Adam moment (`which`: "m" or "v") of the position table in a checkpoint."""
    names = [n for n, _ in tf.train.list_variables(path)
             if n.startswith("optimizer/variables/")]
    shape = _tensor(path, POSITIONS).shape
    found = [_tensor(path, n) for n in names if _tensor(path, n).shape == shape]
    assert len(found) == 2, names  # m then v: the only slots of this shape
    return found[0 if which == "m" else 1]


@pytest.fixture(scope="module")
def whole(records, tmp_path_factory):
    """The uninterrupted run (in this process): (its directory, its output)."""
    out = tmp_path_factory.mktemp("whole")
    rc, log = S.run_runner(**_flags(records, out))
    assert rc == 0, log[-4000:]
    return out, log


def _without_phase_two(flags):
    """`flags` of a one-phase run: no phase-2 flags."""
    return {name: value for name, value in flags.items()
            if not name.startswith("phase2_") and name != "phase1_steps"}


def _assert_same_checkpoint(path, expected_path):
    """Every tensor but the input position equal, bit for bit (optimizer slots included)."""
    reader, expected = tf.train.load_checkpoint(path), tf.train.load_checkpoint(expected_path)
    names = [n for n, _ in tf.train.list_variables(expected_path)
             if not n.startswith("input/") and "_CHECKPOINTABLE_OBJECT_GRAPH" not in n]
    assert any(n.startswith("optimizer/") for n in names)
    for name in names:
        np.testing.assert_array_equal(reader.get_tensor(name), expected.get_tensor(name),
                                      err_msg=name)


def test_phase_two_starts_at_the_boundary_and_resumes_exactly(records, whole, tmp_path):
    """Stopped at the boundary (the phase-1 checkpoint, ckpt-30) and restarted: the same
    final weights and optimizer state, bit for bit (stopped inside either phase: the test
    below). Phase 2 without saying which input came before is refused, naming it. A run
    stopped at the boundary holds what the uninterrupted one saved there (its phase 1 is
    the same steps, and a phase ends with a checkpoint): here its directory is that
    checkpoint alone (`S.stopped_at`)."""
    done, _ = whole
    out = S.stopped_at(done, 30, tmp_path / "boundary")
    refused = call_main("run_pretraining", **_without_phase_two(_flags(
        records, out, input_file=records["long"], max_seq_length=LONG[0],
        max_predictions_per_seq=LONG[1])))
    assert refused.code != 0, refused.stderr[-3000:]
    assert "max_seq_length: 16 there, 32 now" in refused.stderr, refused.stderr[-3000:]
    rc, log = S.run_runner(**_flags(records, out, do_eval="false"))
    assert rc == 0, log[-4000:]
    assert _resumed_at(log) == 30 and "phase 2 from step 30" in log, log[-4000:]
    _assert_same_checkpoint(str(out / "ckpt-45"), str(done / "ckpt-45"))


@pytest.mark.slow
def test_two_phases_in_one_run_stopped_in_each_phase_resume_exactly(records, whole,
                                                                    tmp_path):
    """One command, 30 steps at length 16 then 15 at 32: its phase-2 steps read the
    long records (eval too), rows 16-31 of the position table get no gradient in phase 1
    (Adam's moments stay exactly 0 there; only the decoupled weight decay scales them,
    as in the original) and do in phase 2 (every element), rows 32+ never; the same run
    stopped inside each phase (resumed from a phase-1 checkpoint by a process that
    crosses the boundary and is SIGKILLed inside phase 2, then from a phase-2 one before
    the end) ends with the same checkpoint, bit for bit. What a kill leaves besides the
    checkpoint it resumes from does not depend on the phase (the phase-2 kill here;
    tests/test_exact_resume_runners.py)."""
    whole, log = whole
    assert "phase 2 from step 30" in log
    steps = [s for s, _, _ in S.parse_progress(log)]
    assert steps == list(range(5, 46, 5)), steps
    results = read_eval_results(whole / "eval_results.txt")
    assert results["global_step"] == 45
    # Its eval read phase 2's records: an eval of its weights on them alone gives its figures.
    alone = _without_phase_two(_flags(
        records, tmp_path / "eval_alone", input_file=records["long"], max_seq_length=LONG[0],
        max_predictions_per_seq=LONG[1], do_train="false",
        init_checkpoint=str(whole / "ckpt-45")))
    done = call_main("run_pretraining", **alone)
    assert done.code == 0, done.stderr[-4000:]
    on_long = read_eval_results(tmp_path / "eval_alone" / "eval_results.txt")
    assert on_long.pop("global_step") == 0
    for key, value in on_long.items():
        assert results[key] == pytest.approx(value, rel=1e-6), (key, results, on_long)

    early, boundary, end = (str(whole / f"ckpt-{n}") for n in (5, 30, 45))
    for which in ("m", "v"):
        assert not _slot(boundary, which)[SHORT[0]:].any(), which
        assert _slot(boundary, which)[:SHORT[0]].any(), which
        assert _slot(end, which)[SHORT[0]:LONG[0]].all(), which
        assert not _slot(end, which)[LONG[0]:].any(), which
    before, after = _tensor(early, POSITIONS), _tensor(boundary, POSITIONS)
    ratio = after[SHORT[0]:] / before[SHORT[0]:]
    np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-5)  # decay only
    assert ratio.flat[0] < 1.0
    moved = _tensor(end, POSITIONS)[SHORT[0]:LONG[0]] / after[SHORT[0]:LONG[0]]
    assert np.ptp(moved) > 1e-2  # trained: no longer one common factor

    # Stopped inside phase 1 (after ckpt-10: what a run killed there resumes from, as
    # `S.stopped_at` holds it), resumed by a process that crosses the boundary and is
    # SIGKILLed inside phase 2 (after ckpt-35), restarted: the same end, bit for bit.
    killed = S.stopped_at(whole, 10, tmp_path / "killed")
    flags = _flags(records, killed, do_eval="false")  # compared by its checkpoint alone
    log = _run_until(flags, "ckpt-35")
    assert _resumed_at(log) == 10 and "phase 2 from step 30" in log, log[-4000:]
    rc, log = S.run_runner(**flags)
    assert rc == 0, log[-4000:]
    assert 30 < _resumed_at(log) < 45, log[-4000:]  # the kill was in phase 2
    _assert_same_checkpoint(str(killed / "ckpt-45"), end)
