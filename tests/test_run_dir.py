"""A run's output_dir belongs to one run (training/output_claim.py) and degenerate work is refused
(training/finetuning.py): the issue-10 regressions, each checked through the real runner.

Unit level: the lock (live holder refused, a dead holder's lock taken over, another host's
lock refused), the identity (differences named). Runner level (run_classifier.run in this
process, a tiny model): another label list or another bert_config in a trained output_dir
is refused and its checkpoints stay byte for byte; a second concurrent run is refused;
fewer examples than one batch is an error, not a 0-step success; a header-only dev.tsv is
refused before any training; eval without any weights is refused.

Issue 22: a run refused by any check (its init checkpoint, its feature layers, its data)
claims nothing: no identity or model files, and the directory it created is gone, so the
rightful run then gets it; the next owner of a directory removes what killed checkpoint
saves left (exactly TensorFlow's names, and a real save killed with SIGKILL); checkpoints
whose files were moved are not called another model's.

The trained classifier and pretraining directories are tests/test_relative_paths.py's
first runs of those runners (`first_run`: built once per session), read here on copies.
"""

import dataclasses
import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from tests import test_loop_support as S
from tests.conftest import write_vocab
from training import output_claim


def _holder(tmp_path, **fields):
    record = {"host": socket.gethostname(), "pid": os.getpid(), "started": "then",
              "command": "run_x.py"}
    record.update(fields)
    (tmp_path / output_claim.LOCK_FILE).write_text(json.dumps(record))


def test_a_live_holder_is_refused_and_named(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _holder(tmp_path, pid=sleeper.pid, command="run_pretraining.py --x")
        with pytest.raises(output_claim.RunDirError,
                           match=rf"in use by another run \(pid {sleeper.pid} .*run_pretraining"):
            output_claim.claim(str(tmp_path), {"a": 1})
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_dead_holders_lock_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _holder(tmp_path, pid=dead.pid)
    claimed = output_claim.claim(str(tmp_path), {"a": 1})
    lock = json.loads((tmp_path / output_claim.LOCK_FILE).read_text())
    assert lock["pid"] == os.getpid()
    claimed.release()
    assert not (tmp_path / output_claim.LOCK_FILE).exists()


def test_another_hosts_lock_is_refused_with_the_way_out(tmp_path):
    _holder(tmp_path, host="elsewhere", pid=1)
    with pytest.raises(output_claim.RunDirError, match=r"another host .*delete .*\.run\.lock"):
        output_claim.claim(str(tmp_path), {"a": 1})


def _claim_and_commit(directory, identity):
    """A run's whole use of a directory: claim, commit, release."""
    claimed = output_claim.claim(str(directory), identity)
    claimed.commit()
    claimed.release()


def test_identity_differences_are_named(tmp_path):
    _claim_and_commit(tmp_path, {"task": "cola", "labels": ["0", "1"],
                                 "bert_config": {"hidden_size": 32}})
    _claim_and_commit(tmp_path, {"task": "cola", "labels": ("0", "1"),
                                 "bert_config": {"hidden_size": 32}})  # same
    with pytest.raises(output_claim.RunDirError) as info:
        output_claim.claim(str(tmp_path), {"task": "cola", "labels": ["1", "0"],
                                      "bert_config": {"hidden_size": 64}})
    message = str(info.value)
    assert "bert_config.hidden_size: 32 there, 64 now" in message
    assert "labels: ['0', '1'] there, ['1', '0'] now" in message
    assert not (tmp_path / output_claim.LOCK_FILE).exists()  # a refused claim keeps no lock
    # No checkpoint there (a run that failed before its first save): said, not "overwritten".
    assert "It saved no checkpoint" in message and "would be overwritten" not in message
    assert f"delete {tmp_path / output_claim.IDENTITY_FILE}" in message


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

    # The files of tests/test_relative_paths.py's classifier case (one layer: no refusal
    # depends on the depth), whose first run is `trained`.
    return {"root": root, "vocab": write_vocab(root / "vocab.txt"),
            "config": S.write_config(root / "bert_config.json", vocab_size=len(TINY_VOCAB),
                                     num_hidden_layers=1),
            "data": _custom_data(root / "data")}


def _cfg(env, out, labels=("neg", "pos"), **overrides):
    import run_classifier as rc
    from tasks.classification import processors
    from training.execution import RuntimeConfig

    values = dict(task_name="custom", data_dir=env["data"], vocab_file=env["vocab"],
                  bert_config_file=env["config"], output_dir=str(out), max_seq_length=16,
                  do_train=True, do_eval=True, do_predict=False, train_batch_size=4,
                  eval_batch_size=4, predict_batch_size=4, learning_rate=1e-3,
                  num_train_epochs=1.0, save_checkpoints_steps=3, iterations_per_loop=3,
                  custom=processors.CustomDataConfig(text_a_column="text", label_column="label",
                                             labels=tuple(labels)),
                  runtime=RuntimeConfig("one_device", seed=1))
    values.update(overrides)
    return rc.COMMAND.settings(**values)


def _snapshot(directory):
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))
            if name.startswith("ckpt-") or name == "checkpoint"}


@pytest.fixture(scope="module")
def first_runs(tmp_path_factory):
    """kind -> tests/test_relative_paths.py's folder of that runner's first run (built once
    per session: read only)."""
    from tests.test_relative_paths import first_run

    return lambda kind: first_run(tmp_path_factory, kind)


@pytest.fixture(scope="module")
def trained(env, first_runs, tmp_path_factory):
    """A trained classifier run's output_dir (no eval: its checkpoints are what count): a
    copy of tests/test_relative_paths.py's first classifier run, whose files are env's."""
    import shutil

    folder = first_runs("classifier")
    assert (folder / "bert_config.json").read_text() == pathlib.Path(env["config"]).read_text()
    assert (folder / "vocab.txt").read_text() == pathlib.Path(env["vocab"]).read_text()
    assert S.tree(folder / "data") == S.tree(env["root"] / "data")
    out = tmp_path_factory.mktemp("trained") / "trained"
    shutil.copytree(folder / "run1", out)
    return out


def test_another_label_order_in_a_trained_dir_is_refused(env, trained):
    import run_classifier as rc

    before = _snapshot(trained)
    assert any(name.startswith("ckpt-") for name in before)
    with pytest.raises(output_claim.RunDirError, match=r"labels: \['neg', 'pos'\] there"):
        rc.run(_cfg(env, trained, labels=("pos", "neg")))
    assert _snapshot(trained) == before


def test_another_bert_config_in_a_trained_dir_is_refused(env, trained, tmp_path):
    import run_classifier as rc
    from tests.conftest import TINY_VOCAB

    before = _snapshot(trained)
    bigger = S.write_config(tmp_path / "bert_config.json", vocab_size=len(TINY_VOCAB) + 1,
                            num_hidden_layers=1)
    vocab = write_vocab(tmp_path / "vocab.txt", TINY_VOCAB + ["extra"])  # fits the config
    with pytest.raises(output_claim.RunDirError, match=r"bert_config.vocab_size"):
        rc.run(_cfg(env, trained, bert_config_file=bigger, vocab_file=vocab))
    assert _snapshot(trained) == before


def test_checkpoints_of_another_model_without_an_identity_are_refused(env, trained,
                                                                      tmp_path):
    """Another run's checkpoints and state file copied by hand into a directory, without
    its identity or record: the state file is not this run's (its saves would replace it,
    its rotation delete what it names), refused before anything is written."""
    import shutil

    import run_classifier as rc
    from training.checkpointing import StateFileError

    copy = tmp_path / "old"
    shutil.copytree(trained, copy)
    for name in (output_claim.IDENTITY_FILE, "run_results.json", "run_files.json",
                 "export_metadata.json"):  # (another label list's: refused by name first)
        os.remove(copy / name)
    before = _snapshot(copy)
    with pytest.raises(StateFileError, match=f"{copy / 'checkpoint'} is not a checkpoint "
                                             "state file of this run .it lists "):
        rc.run(_cfg(env, copy, labels=("neg", "pos", "meh")))
    assert _snapshot(copy) == before


def test_checkpoints_whose_files_are_gone_are_not_called_another_models(env, trained,
                                                                        tmp_path):
    """The state file names checkpoints whose files were moved: saying they "do not fit
    this model, move them away" would send the user after the wrong cause."""
    import shutil

    import run_classifier as rc
    from training.checkpointing import CheckpointRestoreError

    copy = tmp_path / "moved"
    shutil.copytree(trained, copy)
    for name in os.listdir(copy):
        if name.startswith("ckpt-"):
            os.remove(copy / name)
    with pytest.raises(CheckpointRestoreError, match=r"their files are missing .*moved or "
                                                     r"deleted.*delete .*checkpoint to start"):
        rc.run(_cfg(env, copy, do_train=False))


def test_a_second_run_while_one_runs_is_refused(env, trained):
    import run_classifier as rc

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _holder(trained, pid=sleeper.pid)
        with pytest.raises(output_claim.RunDirError, match="in use by another run"):
            rc.run(_cfg(env, trained))
    finally:
        sleeper.kill()
        sleeper.wait()
        os.remove(trained / output_claim.LOCK_FILE)


def test_fewer_examples_than_a_batch_is_an_error_not_zero_steps(env, tmp_path):
    import run_classifier as rc
    from training.finetuning import FinetuningError

    out = tmp_path / "out"
    with pytest.raises(FinetuningError, match=r"12 training example\(s\) .*"
                                              r"--train_batch_size=32 .* 0 training steps"):
        rc.run(_cfg(env, out, train_batch_size=32))
    assert not out.exists()  # a refused run leaves no directory it created


def test_a_header_only_dev_file_is_refused_before_training(env, tmp_path):
    import run_classifier as rc
    from training.finetuning import FinetuningError

    data = _custom_data(tmp_path / "data", dev_rows=False)
    out = tmp_path / "out"
    with pytest.raises(FinetuningError, match=r"--do_eval: the dev split has no examples"):
        rc.run(_cfg(env, out, data_dir=data))
    assert not out.exists()  # a refused run leaves no directory it created


def test_eval_without_any_weights_is_refused(env, tmp_path):
    import run_classifier as rc

    with pytest.raises(ValueError, match="no checkpoint in .* and no --init_checkpoint"):
        rc.run(_cfg(env, tmp_path / "out", do_train=False))


@pytest.fixture(scope="module")
def pretrained(first_runs, tmp_path_factory):
    """A 4-step pretraining run's output_dir (``out``: a copy of
    tests/test_relative_paths.py's first pretraining run) and its records (``records``)."""
    import shutil

    folder = first_runs("pretraining")
    out = tmp_path_factory.mktemp("pretrained") / "out"
    shutil.copytree(folder / "run1", out)
    return {"out": out, "records": str(folder / "data" / "records.tfrecord")}


def test_run_pretraining_refuses_another_models_dir(pretrained, tmp_path):
    """Pretraining claims its output_dir too: another bert_config is refused, the
    checkpoints stay as they were."""
    import run_pretraining
    from tests.test_bad_input_messages import _pretraining_cfg

    out = pretrained["out"]
    before = _snapshot(out)
    assert "ckpt-4.index" in before
    with pytest.raises(output_claim.RunDirError, match="bert_config.hidden_dropout_prob"):
        run_pretraining.run(_pretraining_cfg(
            [pretrained["records"]], out, S.write_config(tmp_path / "b.json", dropout=0.1,
                                                         num_hidden_layers=1),
            num_train_steps=2))
    assert _snapshot(out) == before


# --------------------------------------------------------------------------- issue 22
# A refused run claims nothing: the identity (and model files) are written only once every
# check has passed, and a directory the refused run created is gone. The next owner of a
# directory removes what a killed checkpoint save left.


def test_a_claim_writes_nothing_until_committed(tmp_path):
    out = tmp_path / "new" / "out"
    claimed = output_claim.claim(str(out), {"a": 1})
    assert sorted(os.listdir(out)) == [output_claim.LOCK_FILE]
    claimed.release()
    assert not (tmp_path / "new").exists()  # created by the claim, removed uncommitted

    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    claimed = output_claim.claim(str(tmp_path / "kept"), {"a": 1})
    claimed.release()
    assert os.listdir(tmp_path / "kept") == ["notes.txt"]

    claimed = output_claim.claim(str(out), {"a": 1})
    claimed.commit()
    claimed.release()
    assert sorted(os.listdir(out)) == [output_claim.IDENTITY_FILE]


def test_a_run_refused_at_its_init_checkpoint_leaves_the_dir_to_the_rightful_run(env, trained,
                                                                                  tmp_path):
    """A bert_config that does not fit the --init_checkpoint (hidden 64 against 32) used to
    write its identity first, so the run with the right config was then refused."""
    import run_classifier as rc
    from modeling.checkpoints import CheckpointError
    from tests.conftest import TINY_VOCAB

    wide = S.write_config(tmp_path / "wide.json", vocab_size=len(TINY_VOCAB),
                          hidden_size=64, num_hidden_layers=1)
    out = tmp_path / "out"
    with pytest.raises(CheckpointError):
        rc.run(_cfg(env, out, bert_config_file=wide, init_checkpoint=str(trained)))
    assert not out.exists()
    result = rc.run(_cfg(env, out, init_checkpoint=str(trained)))
    assert result["runs"][0]["global_step"] > 0
    assert json.loads((out / output_claim.IDENTITY_FILE).read_text())["bert_config"][
        "hidden_size"] == 32


def test_a_run_refused_for_its_feature_layers_leaves_the_dir_to_the_rightful_run(tmp_path):
    """run_ner --feature_based with layers a 1-layer model lacks is refused when the model
    is built; the rightful run then gets the directory."""
    import random

    import run_ner
    from tests.conftest import TINY_VOCAB
    from tests.test_run_ner import write_conll
    from training.execution import RuntimeConfig

    rng = random.Random(0)
    data = tmp_path / "conll"
    data.mkdir()
    write_conll(data / "train.txt", rng, documents=2, per_document=4)
    out = tmp_path / "out"

    def cfg(layers):
        return run_ner.COMMAND.settings(
            data_dir=str(data), vocab_file=write_vocab(tmp_path / "vocab.txt"),
            bert_config_file=S.write_config(tmp_path / "bert_config.json",
                                            vocab_size=len(TINY_VOCAB), num_hidden_layers=1),
            output_dir=str(out), max_seq_length=16, do_train=True, train_batch_size=4,
            num_train_epochs=1.0, learning_rate=1e-3, feature_based=True,
            feature_layers=layers, lstm_units=8,
            runtime=RuntimeConfig("one_device", seed=1))

    with pytest.raises(ValueError, match="concat_last_four needs at least 4 hidden layers"):
        run_ner.run(cfg("concat_last_four"))
    assert not out.exists()
    run_ner.run(cfg("last_hidden"))
    assert json.loads((out / output_claim.IDENTITY_FILE).read_text())["feature_layers"] == \
        "last_hidden"


def test_a_refused_pretraining_run_leaves_the_dir_to_the_rightful_run(pretrained, tmp_path):
    import run_pretraining
    from modeling.checkpoints import CheckpointError
    from tests.test_bad_input_messages import _pretraining_cfg

    records, first = pretrained["records"], pretrained["out"]
    wide = S.write_config(tmp_path / "wide.json", hidden_size=64, num_hidden_layers=1)
    out = tmp_path / "out"
    refused = _pretraining_cfg([records], out, wide, num_train_steps=2)
    with pytest.raises(CheckpointError):  # its model does not fit the init checkpoint
        run_pretraining.run(dataclasses.replace(refused, init_checkpoint=str(first)))
    assert not out.exists()
    run_pretraining.run(_pretraining_cfg([records], out, S.write_config(
        tmp_path / "b.json", num_hidden_layers=1), num_train_steps=2))
    assert "ckpt-2.index" in os.listdir(out)


# What TensorFlow 2.21 leaves when a save is killed (training/checkpointing.py says where
# each name comes from; test_a_killed_save_is_cleaned_up_by_the_next_owner makes one), in
# run directories whose record (training/run_files.py) names ckpt-7, ckpt-8, ckpt-9 at the
# top and ckpt-4 in a sweep's seed_3/.
LEFTOVERS = ["ckpt-7_temp/part-00000-of-00001.data-00000-of-00001.tempstate1234567",
             "ckpt-8_temp/part-00000-of-00001.index",
             "ckpt-9_temp/",
             "checkpoint.tmp" + "0123456789abcdef" * 2,
             "seed_3/ckpt-4_temp/part-00000-of-00002.data-00001-of-00002"]
REMOVED = ["ckpt-7_temp", "ckpt-8_temp", "ckpt-9_temp", "checkpoint.tmp" + "0123456789abcdef" * 2,
           "seed_3/ckpt-4_temp"]
# Look-alikes the run did not make (names it never recorded, a user's files, another
# run's directory, what lies behind a symbolic link): all kept.
NOT_LEFTOVERS = ["ckpt-3.index", "checkpoint", "notes_temp/readme.txt", "train.tf_record",
                 "seed_3/ckpt-6_temp.txt", "checkpoint.tmp-notes",
                 "ckpt-10_temp/part-00000-of-00001.index", "ckpt-7_temp.d/x",
                 "workertemp_alice_1/thesis.tex", "plots_temp/",
                 "nested_run/.run.lock", "nested_run/checkpoint.tmp" + "ab" * 16,
                 "nested_run/ckpt-7_temp/part-00000-of-00001.index",
                 "seed_3/diverged/1/ckpt-4_temp/part-00000-of-00001.index"]
OUTSIDE = ["checkpoint.tmp" + "cd" * 16, "ckpt-7_temp/part-00000-of-00001.index"]


def _make(root, names):
    """Creates each relative path under root (a folder when it ends with "/")."""
    for name in names:
        path = root / name
        if name.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")


def test_the_next_owner_removes_what_killed_saves_left_and_says_so(tmp_path, caplog):
    from training import run_files

    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    _make(out, LEFTOVERS + NOT_LEFTOVERS)
    _make(elsewhere, OUTSIDE)
    (out / "linked").symlink_to(elsewhere, target_is_directory=True)
    run_files.add(str(out), checkpoints=["ckpt-7", "ckpt-8", "ckpt-9"])
    for folder in ("seed_3", "nested_run", "linked"):
        run_files.add(str(out / folder), checkpoints=["ckpt-4", "ckpt-7"])
    claimed = output_claim.claim(str(out), {"a": 1})
    for name in LEFTOVERS:  # the claim alone removes nothing: the run may be refused
        assert (out / name).exists(), name
    with caplog.at_level("WARNING"):
        claimed.commit()
    claimed.release()
    for name in REMOVED:
        assert not (out / name).exists(), name
    for name in NOT_LEFTOVERS:
        assert (out / name).exists(), name
    for name in OUTSIDE:
        assert (elsewhere / name).exists(), name
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "a killed run did not finish" in logged
    for name in REMOVED:
        assert str(out / name) in logged, name


def test_a_non_chief_saver_removes_its_own_leftover_folder_only(tmp_path):
    """A non-chief worker writes in `workertemp_<its tag>/` (removed after each save); a
    kill leaves it, and that worker's next saver removes it, by its own name."""
    import tensorflow as tf

    from training import checkpointing

    _make(tmp_path, ["workertemp_worker_1/ckpt-5.index", "workertemp_worker_2/ckpt-5.index"])
    checkpointing.CheckpointSaver(tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path),
                                  is_chief=False, worker_tag="worker_1")
    assert not (tmp_path / "workertemp_worker_1").exists()
    assert (tmp_path / "workertemp_worker_2" / "ckpt-5.index").exists()


def test_another_models_directory_keeps_its_leftovers(tmp_path):
    _claim_and_commit(tmp_path, {"a": 1})
    _make(tmp_path, LEFTOVERS)
    with pytest.raises(output_claim.RunDirError):
        output_claim.claim(str(tmp_path), {"a": 2})
    for name in LEFTOVERS:
        assert (tmp_path / name).exists(), name


def test_a_run_removes_what_a_killed_save_left_in_its_dir(env, trained, caplog):
    """Through the runner: an eval run in a trained directory (its owner now) removes a
    killed save's shard folder."""
    import run_classifier as rc
    from training import run_files

    name = sorted(run_files.read(str(trained))["checkpoints"])[-1]  # a save it recorded
    _make(trained, [f"{name}_temp/part-00000-of-00001.index"])
    with caplog.at_level("WARNING"):
        rc.run(_cfg(env, trained, do_train=False))
    assert not (trained / f"{name}_temp").exists()
    assert f"{name}_temp" in "\n".join(r.getMessage() for r in caplog.records)


SAVER = """
import sys
import tensorflow as tf
from training import checkpointing
big = [tf.Variable(tf.zeros([32 * 1024 * 1024])) for _ in range(4)]  # 4 x 128 MB
saver = checkpointing.CheckpointSaver(tf.train.Checkpoint(v=big), sys.argv[1], max_to_keep=1)
step = 0
while True:
    step += 1
    saver.save(step)
"""


@pytest.mark.slow
def test_a_killed_save_is_cleaned_up_by_the_next_owner(tmp_path):
    """A real save killed midway (kill -9) leaves `ckpt-N_temp/`; the next run owning the
    directory removes it and keeps the complete checkpoints."""
    import signal
    import time

    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", SAVER, str(out)], env=S.runner_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    leftovers = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not leftovers:
            if os.path.exists(out / "checkpoint"):  # one complete save, then the next
                leftovers = [n for n in os.listdir(out) if n.endswith("_temp")]
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert leftovers, "no save was caught in progress"
    time.sleep(0.1)
    assert any(os.path.exists(out / n) for n in leftovers)
    complete = sorted(n for n in os.listdir(out) if n.endswith(".index"))
    claimed = output_claim.claim(str(out), {"a": 1})
    claimed.commit()
    claimed.release()
    assert not [n for n in os.listdir(out) if n.endswith("_temp")], os.listdir(out)
    assert sorted(n for n in os.listdir(out) if n.endswith(".index")) == complete


def _saved(directory, steps):
    """A run's saves in `directory` (its CheckpointSaver: recorded, then written)."""
    import tensorflow as tf

    from training import checkpointing

    saver = checkpointing.CheckpointSaver(tf.train.Checkpoint(v=tf.Variable(1.0)),
                                          str(directory))
    return [saver.save(step) for step in steps]


def test_removing_or_setting_aside_checkpoints_moves_only_their_files(tmp_path):
    """A redo removes, a divergence sets aside, the run's checkpoints by TensorFlow's file
    names (`.index`, `.data-NNNNN-of-NNNNN`): a user's `ckpt-6.index.bak` or
    `ckpt-6.notes.txt` beside them stays where it is."""
    from training import checkpointing

    mine = ["ckpt-2.notes.txt", "ckpt-4.index.bak", "ckpt-4.README"]
    _saved(tmp_path, [2, 4])
    _make(tmp_path, mine)
    moved = checkpointing.set_aside(str(tmp_path), from_step=4)
    assert moved == [str(tmp_path / "diverged" / "1" / "ckpt-4")]
    assert sorted(os.listdir(tmp_path / "diverged" / "1")) == [
        "ckpt-4.data-00000-of-00001", "ckpt-4.index"]
    removed = checkpointing.remove_checkpoints(str(tmp_path))
    assert sorted(os.path.basename(p) for p in removed) == [
        "checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index"]
    for name in mine:
        assert (tmp_path / name).read_bytes() == b"x", name


def test_a_state_file_the_run_did_not_write_is_refused_and_kept(tmp_path):
    """A `checkpoint` file naming another directory's checkpoint, or one the run never
    saved, or no checkpoint state at all (a user's text file): never resumed from, never
    replaced, never rotated away; a run that recorded none of it refuses it. A run that
    did record checkpoints there gets its state file rebuilt from them instead."""
    import shutil

    import tensorflow as tf

    from training import checkpointing

    other = tmp_path / "other"
    _saved(other, [6])
    states = {
        "outside": lambda d: tf.compat.v1.train.update_checkpoint_state(
            str(d), str(other / "ckpt-6")),
        "unsaved": lambda d: (shutil.copy(other / "ckpt-6.index", d),
                              shutil.copy(other / "ckpt-6.data-00000-of-00001", d),
                              tf.compat.v1.train.update_checkpoint_state(str(d), "ckpt-6")),
        "text": lambda d: (d / "checkpoint").write_text("my checkpoint notes\n"),
    }
    before = S.tree(other)
    for name, write in states.items():
        out = tmp_path / name
        out.mkdir()
        write(out)
        kept = S.tree(out)
        with pytest.raises(checkpointing.StateFileError,
                           match=f"{out / 'checkpoint'} is not a checkpoint state file of "
                                 "this run"):
            checkpointing.check_state_file(str(out))
        with pytest.raises(checkpointing.StateFileError):
            _saved(out, [2])  # the chief's saver (its manager would read the state file)
        assert checkpointing.checkpoints_newest_first(str(out)) == []
        assert S.tree(out) == kept, name
    assert S.tree(other) == before
    # The run's own directory, its state file naming a checkpoint from elsewhere: rebuilt
    # from the run's record, the other checkpoint left alone after rotation.
    own = tmp_path / "own"
    _saved(own, [2])
    tf.compat.v1.train.update_checkpoint_state(str(own), str(other / "ckpt-6"))
    assert checkpointing.checkpoints_newest_first(str(own)) == [str(own / "ckpt-2")]
    _saved(own, [4, 5, 6, 7, 8, 9])
    assert S.tree(other) == before


def test_a_damaged_record_never_names_what_is_not_the_runs(tmp_path):
    """run_files.json edited by hand or damaged: names that are no plain path under the
    directory (`.`, `./`, `a/.`, `..`, absolute, a checkpoint not named ckpt-<N>) are
    dropped, so a redo removes nothing for them."""
    from training import run_files, sweeps

    out, outside = tmp_path / "out", tmp_path / "outside.txt"
    _make(out, ["notes.txt", "plots/a.png", "eval/events.out.tfevents.1"])
    outside.write_text("mine")
    (out / run_files.RECORD_FILE).write_text(json.dumps({
        "files": [".", "./", "plots/.", "..", "../outside.txt", str(outside), "",
                  "eval/events.out.tfevents.1"],
        "checkpoints": ["..", "../ckpt-1", "ckpt-1/..", "."]}))
    assert run_files.read(str(out)) == {"checkpoints": [],
                                        "files": ["eval/events.out.tfevents.1"]}
    sweeps.remove_run(str(out))
    assert sorted(S.tree(out)) == ["notes.txt", "plots/", "plots/a.png"]
    assert outside.read_text() == "mine"


def test_a_refused_run_removes_only_what_its_claim_created(tmp_path):
    """The claim created runs/a/mrpc (and runs/a); meanwhile another run made runs/a/sst.
    Released without a commit, it removes its output_dir, and runs/a only if empty."""
    claimed = output_claim.claim(str(tmp_path / "runs" / "a" / "mrpc"), {"a": 1})
    _make(tmp_path, ["runs/a/sst/ckpt-6.index", "runs/a/mrpc/train.tf_record"])
    claimed.release()
    assert sorted(S.tree(tmp_path / "runs")) == ["a/", "a/sst/", "a/sst/ckpt-6.index"]
    claimed = output_claim.claim(str(tmp_path / "new" / "b"), {"a": 1})
    claimed.release()
    assert not (tmp_path / "new").exists()


def test_a_truncated_checkpoint_falls_back_to_the_one_before(tmp_path):
    """A data file cut short (a copy interrupted by hand): TensorFlow's reader raises
    IndexError there; the restore uses the checkpoint before it, then refuses in one
    line when none is left, as for any unreadable checkpoint."""
    import tensorflow as tf

    from training import checkpointing

    _saved(tmp_path, [2, 4])
    for step in (4, 2):
        data = tmp_path / f"ckpt-{step}.data-00000-of-00001"
        data.write_bytes(data.read_bytes()[:3])
        checkpoint = tf.train.Checkpoint(v=tf.Variable(0.0))
        if step == 4:
            assert checkpointing.restore_latest(checkpoint, str(tmp_path)) == str(
                tmp_path / "ckpt-2")
        else:
            with pytest.raises(checkpointing.CheckpointRestoreError,
                               match="do not fit this model .newest .*ckpt-4"):
                checkpointing.restore_latest(checkpoint, str(tmp_path))


def test_a_damaged_record_is_refused_naming_it(env, trained, tmp_path):
    """run_files.json garbled: what the run wrote is unknown, so the run refuses in one
    line naming the record (not its own state file as someone else's), touching nothing."""
    import shutil

    import run_classifier as rc
    from training import run_files

    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    for garbage in ("garbage{", "[1, 2]", '{"checkpoints": "ckpt-6"}'):
        (copy / run_files.RECORD_FILE).write_text(garbage)
        before = _snapshot(copy)
        with pytest.raises(run_files.RecordError,
                           match=f"{copy / run_files.RECORD_FILE} cannot be read"):
            rc.run(_cfg(env, copy, do_train=False))
        assert _snapshot(copy) == before


def test_a_users_model_file_in_output_dir_is_refused_and_kept(env, tmp_path):
    """output_dir holding a vocab.txt, bert_config.json or export_metadata.json the run
    did not write and that differs from the one it would write: refused before the run
    takes the directory (only the feature caches are there, as for any refusal after the
    data is read: docs/finetuning.md), the file kept. The same file (the --vocab_file
    itself, a copy of the config in another layout) is taken as it is."""
    import run_classifier as rc
    from data_prep.cli import UserError

    for i, (name, data) in enumerate((
            ("vocab.txt", b"[PAD]\nmine\n"), ("bert_config.json", b"{}\n"),
            ("export_metadata.json", b'{"labels": ["a"]}\n'),
            ("export_metadata.json", b"my notes, not JSON\n"),  # unreadable: not the run's
            ("bert_config.json", b"\xff\xfe binary\n"))):
        out = tmp_path / f"{i}"
        out.mkdir()
        (out / name).write_bytes(data)
        with pytest.raises(UserError, match=f"{out / name} exists, was not written by this "
                                            "run and differs"):
            rc.run(_cfg(env, out, do_eval=False))
        assert (out / name).read_bytes() == data
        assert not [n for n in os.listdir(out) if n != name and not n.startswith("train.")]
    same = tmp_path / "same"
    same.mkdir()
    (same / "vocab.txt").write_bytes(pathlib.Path(env["vocab"]).read_bytes())
    config = json.loads(pathlib.Path(env["config"]).read_text())
    (same / "bert_config.json").write_text(json.dumps(config, indent=4))  # another layout
    from training import trainer_setup
    from modeling.config import BertConfig

    trainer_setup.check_model_files(str(same), BertConfig.from_json_file(env["config"]),
                                    env["vocab"], None)
