"""A run's output_dir belongs to one run (training/run_dir.py) and degenerate work is refused
(training/finetuning.py): the issue-10 regressions, each checked through the real runner.

Unit level: the lock (live holder refused, a dead holder's lock taken over, another host's
lock refused), the identity (differences named). Runner level (run_classifier.run in this
process, a tiny model): another label list or another bert_config in a trained output_dir
is refused and its checkpoints stay byte for byte; a second concurrent run is refused;
fewer examples than one batch is an error, not a 0-step success; a header-only dev.tsv is
refused before any training; eval without any weights is refused.
"""

import json
import os
import socket
import subprocess
import sys

import pytest

from tests import test_loop_support as S
from tests.conftest import write_vocab
from training import run_dir


def _holder(tmp_path, **fields):
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": "then",
              "command": "run_x.py"}
    record.update(fields)
    (tmp_path / run_dir.LOCK_FILE).write_text(json.dumps(record))


def test_a_live_holder_is_refused_and_named(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _holder(tmp_path, pid=sleeper.pid, command="run_pretraining.py --x")
        with pytest.raises(run_dir.RunDirError,
                           match=rf"in use by another run \(pid {sleeper.pid} .*run_pretraining"):
            run_dir.claim(str(tmp_path), {"a": 1})
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_dead_holders_lock_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _holder(tmp_path, pid=dead.pid)
    claimed = run_dir.claim(str(tmp_path), {"a": 1})
    lock = json.loads((tmp_path / run_dir.LOCK_FILE).read_text())
    assert lock["pid"] == os.getpid()
    claimed.release()
    assert not (tmp_path / run_dir.LOCK_FILE).exists()


def test_another_hosts_lock_is_refused_with_the_way_out(tmp_path):
    _holder(tmp_path, host="elsewhere", pid=1)
    with pytest.raises(run_dir.RunDirError, match=r"another host .*delete .*\.run\.lock"):
        run_dir.claim(str(tmp_path), {"a": 1})


def test_identity_differences_are_named(tmp_path):
    run_dir.claim(str(tmp_path), {"task": "cola", "labels": ["0", "1"],
                                  "bert_config": {"hidden_size": 32}}).release()
    run_dir.claim(str(tmp_path), {"task": "cola", "labels": ("0", "1"),
                                  "bert_config": {"hidden_size": 32}}).release()  # same
    with pytest.raises(run_dir.RunDirError) as info:
        run_dir.claim(str(tmp_path), {"task": "cola", "labels": ["1", "0"],
                                      "bert_config": {"hidden_size": 64}})
    message = str(info.value)
    assert "bert_config.hidden_size: 32 there, 64 now" in message
    assert "labels: ['0', '1'] there, ['1', '0'] now" in message
    assert not (tmp_path / run_dir.LOCK_FILE).exists()  # a refused claim keeps no lock


# --------------------------------------------------------------------- runner level


def _custom_data(directory, n_train=12, n_dev=4, dev_rows=True, labels=("neg", "pos")):
    directory.mkdir(parents=True, exist_ok=True)
    rows = [(f"the {'cat' if i % 2 else 'dog'} sat on the mat .", labels[i % 2])
            for i in range(n_train)]
    for split, n in (("train", n_train), ("dev", n_dev), ("test", n_dev)):
        lines = ["text\tlabel"]
        if split == "train" or dev_rows:
            lines += [f"{t}\t{lab}" for t, lab in rows[:n]]
        (directory / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(directory)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("run_dir")
    from tests.conftest import TINY_VOCAB

    return {"root": root, "vocab": write_vocab(root / "vocab.txt"),
            "config": S.write_config(root / "bert_config.json", vocab_size=len(TINY_VOCAB)),
            "data": _custom_data(root / "data")}


def _cfg(env, out, labels=("neg", "pos"), **overrides):
    import run_classifier as rc
    from tasks.classification import data as cd
    from training import flags as common_flags

    values = dict(task_name="custom", data_dir=env["data"], vocab_file=env["vocab"],
                  bert_config_file=env["config"], output_dir=str(out), max_seq_length=16,
                  do_train=True, do_eval=True, do_predict=False, train_batch_size=4,
                  eval_batch_size=4, predict_batch_size=4, learning_rate=1e-3,
                  num_train_epochs=1.0, save_checkpoints_steps=3, iterations_per_loop=3,
                  custom=cd.CustomDataConfig(text_a_column="text", label_column="label",
                                             labels=tuple(labels)),
                  runtime=common_flags.RuntimeConfig("one_device", seed=1))
    values.update(overrides)
    return rc.make_run(**values)


def _snapshot(directory):
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))
            if name.startswith("ckpt-") or name == "checkpoint"}


@pytest.fixture(scope="module")
def trained(env):
    import run_classifier as rc

    out = env["root"] / "trained"
    rc.run(_cfg(env, out))
    return out


def test_another_label_order_in_a_trained_dir_is_refused(env, trained):
    import run_classifier as rc

    before = _snapshot(trained)
    assert any(name.startswith("ckpt-") for name in before)
    with pytest.raises(run_dir.RunDirError, match=r"labels: \['neg', 'pos'\] there"):
        rc.run(_cfg(env, trained, labels=("pos", "neg")))
    assert _snapshot(trained) == before


def test_another_bert_config_in_a_trained_dir_is_refused(env, trained, tmp_path):
    import run_classifier as rc
    from tests.conftest import TINY_VOCAB

    before = _snapshot(trained)
    bigger = S.write_config(tmp_path / "bert_config.json", vocab_size=len(TINY_VOCAB) + 1)
    with pytest.raises(run_dir.RunDirError, match=r"bert_config.vocab_size"):
        rc.run(_cfg(env, trained, bert_config_file=bigger))
    assert _snapshot(trained) == before


def test_checkpoints_of_another_model_without_an_identity_are_refused(env, trained,
                                                                      tmp_path):
    """A directory from before run identities existed: the restore itself refuses."""
    import shutil

    import run_classifier as rc
    from training.checkpointing import CheckpointRestoreError

    copy = tmp_path / "old"
    shutil.copytree(trained, copy)
    os.remove(copy / run_dir.IDENTITY_FILE)
    before = _snapshot(copy)
    with pytest.raises(CheckpointRestoreError, match="do not fit this model"):
        rc.run(_cfg(env, copy, labels=("neg", "pos", "meh")))
    assert _snapshot(copy) == before


def test_a_second_run_while_one_runs_is_refused(env, trained):
    import run_classifier as rc

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _holder(trained, pid=sleeper.pid)
        with pytest.raises(run_dir.RunDirError, match="in use by another run"):
            rc.run(_cfg(env, trained))
    finally:
        sleeper.kill()
        sleeper.wait()
        os.remove(trained / run_dir.LOCK_FILE)


def test_fewer_examples_than_a_batch_is_an_error_not_zero_steps(env, tmp_path):
    import run_classifier as rc
    from training.finetuning import FinetuningError

    out = tmp_path / "out"
    with pytest.raises(FinetuningError, match=r"12 training example\(s\) .*"
                                              r"--train_batch_size=32 .* 0 training steps"):
        rc.run(_cfg(env, out, train_batch_size=32))
    assert not any(name.startswith("ckpt-") for name in os.listdir(out))


def test_a_header_only_dev_file_is_refused_before_training(env, tmp_path):
    import run_classifier as rc
    from training.finetuning import FinetuningError

    data = _custom_data(tmp_path / "data", dev_rows=False)
    out = tmp_path / "out"
    with pytest.raises(FinetuningError, match=r"--do_eval: the dev split has no examples"):
        rc.run(_cfg(env, out, data_dir=data))
    assert not any(name.startswith("ckpt-") for name in os.listdir(out))


def test_eval_without_any_weights_is_refused(env, tmp_path):
    import run_classifier as rc

    with pytest.raises(ValueError, match="no checkpoint in .* and no --init_checkpoint"):
        rc.run(_cfg(env, tmp_path / "out", do_train=False))


def test_run_pretraining_refuses_another_models_dir(tmp_path):
    """Pretraining claims its output_dir too: another bert_config is refused, the
    checkpoints stay as they were."""
    import run_pretraining
    from modeling.optimization import OptimizerConfig
    from training import flags as common_flags
    from training.loop import LoopConfig

    records = S.write_records(tmp_path / "records.tfrecord", S.synthetic_instances(16))
    out = tmp_path / "out"

    def cfg(config_file):
        return run_pretraining.PretrainingRun(
            bert_config_file=config_file, input_patterns=(records,), output_dir=str(out),
            init_checkpoint=None, max_seq_length=S.SEQ, max_predictions_per_seq=S.PREDS,
            do_train=True, do_eval=False, train_batch_size=4, eval_batch_size=4,
            input_compression="auto", runtime=common_flags.RuntimeConfig("one_device"),
            optimizer=OptimizerConfig(learning_rate=1e-3, num_train_steps=2,
                                      num_warmup_steps=0),
            loop=LoopConfig(output_dir=str(out), num_train_steps=2, train_batch_size=4,
                            iterations_per_loop=1, save_checkpoints_steps=2))

    run_pretraining.run(cfg(S.write_config(tmp_path / "a.json")))
    before = _snapshot(out)
    assert "ckpt-2.index" in before
    with pytest.raises(run_dir.RunDirError, match="bert_config.hidden_dropout_prob"):
        run_pretraining.run(cfg(S.write_config(tmp_path / "b.json", dropout=0.1)))
    assert _snapshot(out) == before
