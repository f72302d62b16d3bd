"""run_pretraining.py end to end: one device, mirrored over 2 logical CPUs, multi-worker
over 2 local processes, phase 2, flag errors. In this process, except where the process is
under test (logical CPUs, multi-worker). Kill -9 and resume: tests/test_exact_resume_runners.py.

Records come from the real data_prep.create_pretraining_data command.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from tests import test_loop_support as S
from tests.clis import call_main
from tests.test_loop_support import read_eval_results

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(pretraining_records, tmp_path_factory):
    d = tmp_path_factory.mktemp("pretraining_data")
    config = S.write_config(d / "bert_config.json", vocab_size=120)
    return {"pattern": pretraining_records["pattern"], "config": config, "dir": d}


def _flags(data, output_dir, **overrides):
    flags = {
        "input_file": data["pattern"], "bert_config_file": data["config"],
        "output_dir": str(output_dir), "max_seq_length": S.SEQ,
        "max_predictions_per_seq": S.PREDS, "train_batch_size": 16, "eval_batch_size": 8,
        "learning_rate": 1e-3, "num_train_steps": 100, "num_warmup_steps": 10,
        "iterations_per_loop": 10, "log_steps": 10, "save_checkpoints_steps": 50,
        "max_eval_steps": 5, "seed": 1, "do_train": "true", "do_eval": "true",
    }
    flags.update(overrides)
    return flags


@pytest.fixture(scope="module")
def one_device_run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("one_device")
    rc, log = S.run_runner(**_flags(data, out, distribution_strategy="one_device"))
    assert rc == 0, log[-4000:]
    return {"dir": out, "log": log}


def test_loss_falls_and_eval_writes_every_key(one_device_run):
    steps = S.parse_log(one_device_run["log"])
    assert [s[0] for s in steps] == list(range(10, 101, 10))
    assert steps[-1][1] < steps[0][1] - 1.0, steps
    assert "examples/s" in one_device_run["log"] and "eta" in one_device_run["log"]
    results = read_eval_results(os.path.join(one_device_run["dir"], "eval_results.txt"))
    assert sorted(results) == ["global_step", "loss", "masked_lm_accuracy", "masked_lm_loss",
                               "masked_lm_perplexity", "next_sentence_accuracy",
                               "next_sentence_loss"]
    assert results["masked_lm_perplexity"] == pytest.approx(np.exp(results["masked_lm_loss"]))
    assert results["global_step"] == 100
    assert os.path.isdir(os.path.join(one_device_run["dir"], "train"))
    assert os.path.isdir(os.path.join(one_device_run["dir"], "eval"))


def test_mirrored_over_two_cpus_matches_one_device(data, one_device_run, tmp_path):
    """The one-device run's flags (`one_device_run`: 100 steps, progress every 10, eval)
    mirrored over 2 logical CPUs: the same losses and accuracies at every progress line
    and the same eval figures. No dropout (the config's), and every record has the same
    number of predictions, so the mean of the two replicas' losses equals the loss of the
    whole global batch."""
    # The logical CPUs are configured before TensorFlow starts: the mirrored run is a
    # process of its own.
    rc, log = S.run_runner(**_flags(data, tmp_path / "mirrored",
                                    distribution_strategy="mirrored", num_cpu_devices=2),
                           process=True)
    assert rc == 0, log[-4000:]
    assert "MirroredStrategy with 2 replica(s)" in log
    one, mirrored = S.parse_log(one_device_run["log"]), S.parse_log(log)
    assert [s[0] for s in one] == [s[0] for s in mirrored] == list(range(10, 101, 10))
    np.testing.assert_allclose([s[1:] for s in mirrored], [s[1:] for s in one], rtol=1e-4)
    r1 = read_eval_results(os.path.join(one_device_run["dir"], "eval_results.txt"))
    r2 = read_eval_results(os.path.join(tmp_path / "mirrored", "eval_results.txt"))
    assert sorted(r2) == sorted(r1)
    for key in r1:
        assert r2[key] == pytest.approx(r1[key], rel=1e-4), key


def test_multi_worker_two_local_processes_train_and_checkpoint(data, tmp_path):
    out = tmp_path / "mwms"
    flags = _flags(data, out, distribution_strategy="multi_worker_mirrored",
                   num_train_steps=10, iterations_per_loop=5, log_steps=5,
                   save_checkpoints_steps=5, max_eval_steps=2)
    logs = S.run_local_workers(S.runner_command(**flags))
    # Both workers saw the same global losses; only the chief wrote the final files.
    assert S.parse_log(logs[0]) == S.parse_log(logs[1]) and len(S.parse_log(logs[0])) == 2
    assert os.path.basename(tf.train.latest_checkpoint(str(out))) == "ckpt-10"
    assert os.path.exists(out / "ckpt-5.index")
    assert not [p for p in os.listdir(out) if p.startswith("workertemp")]
    assert read_eval_results(out / "eval_results.txt")["global_step"] == 10


def test_phase_two_longer_sequences_from_phase_one(data, one_device_run, tmp_path):
    pattern, _ = S.make_records_with_cli(tmp_path / "seq64", seq=64, preds=10)
    flags = _flags(data, tmp_path / "phase2", input_file=pattern, max_seq_length=64,
                   max_predictions_per_seq=10, num_train_steps=10, iterations_per_loop=5,
                   log_steps=5, save_checkpoints_steps=10, do_eval="false",
                   init_checkpoint=os.path.join(one_device_run["dir"], "ckpt-100"))
    rc, log = S.run_runner(**flags)
    assert rc == 0, log[-4000:]
    assert "Initialised from" in log
    phase1 = read_eval_results(os.path.join(one_device_run["dir"], "eval_results.txt"))
    steps = S.parse_log(log)
    # Starts from trained weights: far below a fresh model's log(120) + log(2) ~ 5.5.
    assert steps[0][1] < phase1["loss"] + 1.0, (steps, phase1)


def test_wrong_max_seq_length_fails_fast_with_the_file(data, tmp_path):
    result = call_main("run_pretraining", **_flags(data, tmp_path, max_seq_length=64))
    assert result.code == 1
    assert "max_seq_length expects 64" in result.stderr
    assert "records.tfrecord-00000-of-00002" in result.stderr


def test_neither_train_nor_eval_is_an_error(data, tmp_path):
    result = call_main("run_pretraining",
                       **_flags(data, tmp_path, do_train="false", do_eval="false"))
    assert result.code == 1
    assert "At least one of `do_train` or `do_eval` must be True" in result.stderr
