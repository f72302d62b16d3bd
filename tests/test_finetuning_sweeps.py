"""The paper's fine-tuning protocol (issue 26, section 4): grids of learning rates, batch
sizes and epochs times --seeds, the best on dev kept; sweeps that resume after kill -9
(finished runs skipped, the interrupted one continued exactly); --keep_best_checkpoint's
best kept across a resume.

The grid flags take one value exactly as before (type, meaning) or comma-separated values
in every fine-tuning runner; run_pretraining refuses a list naming the flag. The sweep
itself runs through the real CLI on tiny MRPC data (2 learning rates x 2 seeds); its two
points with seed 1 alone run again as a process killed in the middle of its second point,
then rerun: every run's files and weights equal the uninterrupted sweep's, bit for bit.
"""

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests import test_loop_support as S
from tests.clis import call_main
from tests.conftest import TINY_VOCAB, write_vocab
from tests.test_run_classifier import write_mrpc

SEQ = 32
RUNNERS = ("run_classifier", "run_squad", "run_ner", "run_swag")
RUNNER_ARGV = {
    "run_classifier": ["--task_name=mrpc", "--data_dir=d"],
    "run_squad": ["--train_file=t.json"],
    "run_ner": ["--data_dir=d"],
    "run_swag": ["--data_dir=d"],
}


def _config_of(runner, extra):
    """The FinetuningRun `runner` builds from a valid command line plus `extra`."""
    import importlib

    from absl import flags

    module = importlib.import_module(runner)
    argv = [f"{runner}.py", "--vocab_file=v", "--bert_config_file=c", "--output_dir=o",
            "--do_train", "--do_eval", *RUNNER_ARGV[runner], *extra]
    try:
        flags.FLAGS(argv)
        return module.run_config_from_flags(flags.FLAGS).finetuning
    finally:
        flags.FLAGS.unparse_flags()


# --------------------------------------------------------------------------- the flags


@pytest.mark.parametrize("runner", RUNNERS)
def test_one_value_per_flag_is_what_it_was_and_lists_make_a_grid(runner):
    from training import finetuning

    plain = _config_of(runner, [])
    assert plain.grid is None and finetuning.grid_points(plain) == [
        finetuning.GridPoint(5e-5, 32, 3.0)]
    one = _config_of(runner, ["--learning_rate=3e-5", "--train_batch_size=16",
                              "--num_train_epochs=2"])
    assert one.grid is None
    assert (one.loop.learning_rate, one.train_batch_size, one.num_train_epochs) == (
        3e-5, 16, 2.0)
    assert (type(one.loop.learning_rate), type(one.train_batch_size),
            type(one.num_train_epochs)) == (float, int, float)
    grid = _config_of(runner, ["--learning_rate=5e-5, 3e-5", "--train_batch_size=16,32",
                               "--num_train_epochs=2"])
    assert grid.grid == finetuning.Grid((5e-5, 3e-5), (16, 32), (2.0,))
    points = finetuning.grid_points(grid)
    assert [p.name() for p in points] == ["lr5e-05_bs16_ep2.0", "lr5e-05_bs32_ep2.0",
                                          "lr3e-05_bs16_ep2.0", "lr3e-05_bs32_ep2.0"]
    # The scalar fields hold the first point (what one value would have meant).
    assert (grid.loop.learning_rate, grid.train_batch_size) == (5e-5, 16)


@pytest.mark.parametrize("value, message", [
    ("--learning_rate=abc", "could not convert string to float"),
    ("--learning_rate=5e-5,5e-5", "a value is repeated"),
    ("--train_batch_size=3.5", "invalid literal for int"),
    ("--train_batch_size=16,", "invalid literal for int"),
    ("--num_train_epochs=2,x", "could not convert string to float"),
])
def test_bad_grid_values_are_refused_naming_the_flag(value, message):
    from absl import flags

    with pytest.raises(flags.IllegalFlagValueError, match=message) as err:
        _config_of("run_classifier", [value])
    assert value.split("=")[0] in str(err.value)


@pytest.mark.parametrize("value, message", [
    ("1,,2", "'' is not an integer"), ("1,2,", "'' is not an integer"),
    ("1,x", "'x' is not an integer"), ("-1", "-1 is not a seed"),
    ("1,4294967296", "4294967296 is not a seed"), ("2,1,2", "a seed is repeated"),
])
def test_bad_seeds_are_refused_as_the_grid_flags_are_naming_the_flag(value, message):
    from absl import flags

    with pytest.raises(flags.ValidationError, match=message) as err:
        _config_of("run_classifier", [f"--seeds={value}"])
    assert str(err.value).startswith(f"--seeds={value}:")
    assert _config_of("run_classifier", ["--seeds= 3, 0 ,4294967295"]).seeds == (
        3, 0, 4294967295)


def test_run_pretraining_refuses_a_list_naming_the_flag():
    from absl import flags

    import run_pretraining

    argv = ["run_pretraining.py", "--input_file=x", "--bert_config_file=c", "--output_dir=o",
            "--do_train"]
    for extra in (["--learning_rate=1e-4,2e-4"], ["--train_batch_size=8,16"]):
        try:
            flags.FLAGS(argv + extra)
            with pytest.raises(flags.ValidationError,
                               match=f"{extra[0].split('=')[0]}=.*takes one value"):
                run_pretraining.run_config_from_flags(flags.FLAGS)
        finally:
            flags.FLAGS.unparse_flags()
    try:
        flags.FLAGS(argv + ["--learning_rate=2e-4", "--train_batch_size=8"])
        cfg = run_pretraining.run_config_from_flags(flags.FLAGS)
        assert (cfg.loop.learning_rate, cfg.train_batch_size) == (2e-4, 8)
    finally:
        flags.FLAGS.unparse_flags()


def test_the_commands_refuse_a_bad_grid_in_one_line_naming_the_flag(tmp_path):
    """A runner that takes one value and a grid value that is not a number: exit 1, one
    line naming the flag (no traceback), nothing written."""
    out = tmp_path / "out"
    for argv, message in (
            (["run_pretraining.py", "--input_file=x", "--bert_config_file=c",
              f"--output_dir={out}", "--do_train", "--learning_rate=1e-4,2e-4"],
             "run_pretraining.py: error: --learning_rate=0.0001,0.0002: run_pretraining.py "
             "takes one value"),
            (["run_classifier.py", "--task_name=mrpc", "--data_dir=d", "--vocab_file=v",
              "--bert_config_file=c", f"--output_dir={out}", "--do_train", "--do_eval",
              "--learning_rate=5e-5,abc"],
             "flag --learning_rate=5e-5,abc: could not convert string to float")):
        result = call_main(argv[0][:-3], argv[1:])
        assert result.code == 1 and message in result.stderr, result.stderr[-2000:]
        assert "Traceback" not in result.stderr and not out.exists()


def test_programmatic_tuples_make_the_same_grid():
    from training import finetuning

    settings, _ = finetuning.settings_from(vocab_file="v", bert_config_file="c",
                                           output_dir="o", learning_rate=(2e-5, 3e-5),
                                           num_train_epochs=[2, 3])
    assert settings.grid == finetuning.Grid((2e-5, 3e-5), (32,), (2, 3))
    single, _ = finetuning.settings_from(vocab_file="v", bert_config_file="c",
                                         output_dir="o", learning_rate=2e-5)
    assert single.grid is None and single.loop.learning_rate == 2e-5
    with pytest.raises(finetuning.FinetuningError, match="grid.*--do_train and --do_eval"):
        finetuning.validate(dataclasses.replace(settings, do_train=True))


# ------------------------------------------------------------------ the sweep, killed


@pytest.fixture(scope="module")
def mrpc(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweeps")
    return {"root": root, "vocab": write_vocab(root / "vocab.txt"),
            "config": S.write_config(root / "bert_config.json", vocab_size=len(TINY_VOCAB),
                                        dropout=0.1),
            "data": str(write_mrpc(root / "MRPC", random.Random(0)))}


POINTS = ("lr0.002_bs4_ep1.0", "lr0.001_bs4_ep1.0")


def _sweep_command(mrpc, out, seeds="1,2"):
    """The sweep's command line: 2 learning rates x `seeds`, 6 steps a run (24 examples),
    a checkpoint (and a dev evaluation: --keep_best_checkpoint) at steps 4 and 6."""
    flags = dict(task_name="MRPC", data_dir=mrpc["data"], vocab_file=mrpc["vocab"],
                 bert_config_file=mrpc["config"], output_dir=out, max_seq_length=SEQ,
                 do_train="true", do_eval="true", do_predict="true", train_batch_size=4,
                 eval_batch_size=4, predict_batch_size=4, learning_rate="2e-3,1e-3",
                 num_train_epochs=1, seeds=seeds, keep_best_checkpoint="true",
                 save_checkpoints_steps=4, iterations_per_loop=2, log_steps=2,
                 distribution_strategy="one_device")
    return [sys.executable, os.path.join(S.REPO_ROOT, "run_classifier.py")] + [
        f"--{k}={v}" for k, v in flags.items()]


def _run(command):
    """The command in this process (the kill needs a process; a run to its end does not):
    its exit status and everything it wrote (stdout, stderr, the absl log lines)."""
    result = call_main("run_classifier", command[2:], cwd=S.REPO_ROOT)
    return result.code, result.stdout + result.stderr + result.log


def _kill_when(command, marker, timeout=600):
    """Starts `command`, SIGKILLs it as soon as a line of its output contains `marker`;
    returns (exit status, output)."""
    proc = subprocess.Popen(command, env=S.runner_env(), cwd=S.REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, seen = [], threading.Event()

    def drain():
        for line in proc.stdout:
            lines.append(line)
            if marker in line and not seen.is_set():
                proc.send_signal(signal.SIGKILL)
                seen.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=30)
    return proc.returncode, "".join(lines)


def _files(directory):
    """{relative path: bytes} of a sweep's result files (not checkpoints, summaries,
    caches or the lock)."""
    out = {}
    for root, dirs, names in os.walk(directory):
        dirs[:] = [d for d in dirs if d not in ("train", "eval")]
        for name in names:
            if name.endswith((".txt", ".tsv")) or name == "best_checkpoint.json":
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    out[os.path.relpath(path, directory)] = f.read()
    return out


def _weights(prefix):
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.startswith(("model/", "optimizer/", "rng/"))}


@pytest.fixture(scope="module")
def uninterrupted(mrpc):
    out = mrpc["root"] / "uninterrupted"
    code, log = _run(_sweep_command(mrpc, out))
    assert code == 0, log[-4000:]
    return out


def _read_table(path):
    with open(path, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    return [dict(zip(rows[0], row)) for row in rows[1:]]


def _results(path):
    with open(path) as f:
        return {line.split(" = ")[0]: float(line.split(" = ")[1]) for line in f}


@pytest.mark.slow
def test_grid_times_seeds_table_subdirectories_and_the_best_at_the_top(uninterrupted):
    out = uninterrupted
    table = _read_table(out / "grid_results.tsv")
    assert [(row["dir"], row["seed"]) for row in table] == [
        (f"{point}/seed_{seed}", str(seed)) for point in POINTS for seed in (1, 2)]
    assert [row["learning_rate"] for row in table] == ["0.002", "0.002", "0.001", "0.001"]
    for row in table:  # every run's dev figures, as its eval_results.txt says
        run_dir = out / row["dir"]
        figures = _results(run_dir / "eval_results.txt")
        assert float(row["eval_acc_and_f1"]) == figures["eval_acc_and_f1"]
        assert float(row["global_step"]) == figures["global_step"]
        assert (run_dir / "run_results.json").exists() and (run_dir / "best").is_dir()
        assert (run_dir / "MRPC.tsv").exists() and (run_dir / "test_results.tsv").exists()
    for point in POINTS:  # each point: its seeds' summary and its best seed's files
        assert "best_seed" in _results(out / point / "seed_results.txt")
        assert (out / point / "eval_results.txt").exists()
    best = [row for row in table if row["best"] == "1"]
    assert len(best) == 1
    scores = [float(row["eval_acc_and_f1"]) for row in table]
    assert float(best[0]["eval_acc_and_f1"]) == max(scores)
    assert table.index(best[0]) == scores.index(max(scores))  # the first of a tie
    for name in ("eval_results.txt", "test_results.tsv", "MRPC.tsv"):
        assert (out / name).read_bytes() == (out / best[0]["dir"] / name).read_bytes()
    assert not (out / "seed_results.txt").exists() and not (out / "ckpt-1.index").exists()


@pytest.mark.slow
def test_a_sweep_killed_in_its_second_point_resumes_to_the_uninterrupted_result(
        mrpc, uninterrupted):
    """The sweep's two points with seed 1 alone (each run seeded by its seed: the
    uninterrupted sweep's seed_1 runs), SIGKILLed just after its second point saved
    ckpt-4, then rerun: the first point is not run again, the second resumes; every run's
    files and weights equal the uninterrupted sweep's seed_1 run's, bit for bit, its table
    rows hold their figures and the best run's files are at the top."""
    out = mrpc["root"] / "killed"
    command = _sweep_command(mrpc, out, seeds="1")
    code, log = _kill_when(command, os.path.join(str(out), POINTS[1], "ckpt-4"))
    assert code == -signal.SIGKILL, log[-4000:]
    assert not (out / POINTS[1] / "run_results.json").exists()  # killed mid-run
    assert (out / POINTS[1] / "ckpt-4.index").exists()
    first = (out / POINTS[0] / "run_results.json").stat().st_mtime_ns

    code, log = _run(command)
    assert code == 0, log[-4000:]
    # the first point's run is not run again
    assert f"{out / POINTS[0]} finished earlier (run_results.json): skipped" in log
    assert (out / POINTS[0] / "run_results.json").stat().st_mtime_ns == first
    assert "Resumed from" in log and "Input resumes at the position saved" in log

    for point in POINTS:
        reference = uninterrupted / point / "seed_1"
        expected, found = _files(reference), _files(out / point)
        assert sorted(found) == sorted(expected), point
        for name, content in expected.items():
            assert found[name] == content, (point, name)
        reference, resumed = _weights(str(reference / "ckpt-6")), _weights(
            str(out / point / "ckpt-6"))
        assert sorted(resumed) == sorted(reference)
        for name, value in reference.items():
            np.testing.assert_array_equal(resumed[name], value, err_msg=f"{point} {name}")
        with open(out / point / "run_results.json") as f:
            assert json.load(f)["eval"]["dev"]["global_step"] in (4, 6)
    rows = {row["dir"]: row for row in _read_table(uninterrupted / "grid_results.tsv")}
    table = _read_table(out / "grid_results.tsv")
    assert [row["dir"] for row in table] == list(POINTS)
    for row in table:
        assert {k: v for k, v in row.items() if k not in ("dir", "best")} == {
            k: v for k, v in rows[f"{row['dir']}/seed_1"].items() if k not in ("dir", "best")}
    scores = [float(row["eval_acc_and_f1"]) for row in table]
    assert [row["best"] for row in table] == [
        str(int(i == scores.index(max(scores)))) for i in range(len(table))]
    best = table[scores.index(max(scores))]["dir"]
    for name in ("eval_results.txt", "test_results.tsv", "MRPC.tsv"):
        assert (out / name).read_bytes() == (out / best / name).read_bytes()


# ------------------------------------------------------- the best checkpoint, resumed


class _Interrupted(Exception):
    """Stands for a kill between a checkpoint's save and its dev evaluation."""


def _scripted_family(base, scores, interrupt_at=None):
    """A classification family whose checkpoint-selection score is `scores[step]` (the
    final evaluation keeps the real figures); evaluating step `interrupt_at` raises."""

    class Scripted(base):
        def evaluate(self, trainer, split, *, step, run_dir, write):
            results = super().evaluate(trainer, split, step=step, run_dir=run_dir,
                                       write=write)
            if write:
                return results
            if step == interrupt_at:
                raise _Interrupted(step)
            self.seen.append(step)
            return {**results, self.primary_metric(): scores[step]}

    return Scripted


@pytest.mark.slow
def test_a_resumed_run_keeps_the_better_best_checkpoint(mrpc, tmp_path):
    """Best at step 4 (0.9); the run is interrupted after saving step 8; resumed, step 8
    (0.5) and step 12 (0.4) are worse: best/ keeps step 4 and eval and predict use it."""
    import run_classifier as rc
    from tasks.classification.task import ClassificationFamily
    from training import finetuning
    from training.execution import RuntimeConfig

    out = tmp_path / "out"
    cfg = rc.COMMAND.settings(
        task_name="mrpc", data_dir=mrpc["data"], vocab_file=mrpc["vocab"],
        bert_config_file=mrpc["config"], output_dir=str(out), max_seq_length=SEQ,
        do_train=True, do_eval=True, do_predict=True, train_batch_size=4, eval_batch_size=4,
        predict_batch_size=4, learning_rate=2e-3, num_train_epochs=2.0,
        save_checkpoints_steps=4, iterations_per_loop=2, log_steps=2, seeds=(1,),
        keep_best_checkpoint=True, runtime=RuntimeConfig("one_device", seed=1))
    scores = {4: 0.9, 8: 0.5, 12: 0.4}

    first = _scripted_family(ClassificationFamily, scores, interrupt_at=8)(
        cfg.task, SEQ)
    first.seen = []
    with pytest.raises(_Interrupted):
        finetuning.run(cfg.finetuning, first)
    assert first.seen == [4] and (out / "ckpt-8.index").exists()
    with open(out / "best" / "best_checkpoint.json") as f:
        assert json.load(f) == {"metric": "eval_acc_and_f1", "score": 0.9, "step": 4}

    resumed = _scripted_family(ClassificationFamily, scores)(cfg.task, SEQ)
    resumed.seen = []
    result = finetuning.run(cfg.finetuning, resumed)
    assert resumed.seen == [8, 12]  # step 8 was saved but not compared before the kill
    with open(out / "best" / "best_checkpoint.json") as f:
        assert json.load(f)["step"] == 4
    assert _results(out / "best" / "eval_results.txt")["global_step"] == 4
    assert _results(out / "eval_results.txt")["global_step"] == 4
    assert result["best_run"]["global_step"] == 4
    assert result["best_run"]["model_dir"] == str(out / "best")
    # best/ holds step 4's weights (the training checkpoint of step 4)
    kept, trained = _weights(str(out / "best" / "ckpt")), _weights(str(out / "ckpt-4"))
    model = [name for name in kept if name.startswith("model/")]
    assert model and set(model) <= set(trained)
    for name in model:
        np.testing.assert_array_equal(kept[name], trained[name], err_msg=name)


# ----------------------------------------------------------- a grid of another family


@pytest.mark.slow
def test_a_squad_grid_keeps_the_best_predictions_and_a_rerun_reads_them_back(tmp_path):
    """run_squad: 2 learning rates, the best by dev f1 with its predictions at the top; a
    rerun skips both runs and returns the kept run's files and scores from disk."""
    import run_squad
    from tests import test_run_squad as T
    from training.execution import RuntimeConfig

    rng = random.Random(0)
    tokens = T._vocab_tokens()
    cfg = run_squad.COMMAND.settings(
        vocab_file=write_vocab(tmp_path / "vocab.txt", tokens),
        bert_config_file=S.write_config(tmp_path / "bert_config.json",
                                           vocab_size=len(tokens)),
        train_file=T.write_squad(tmp_path / "train.json", rng, "1.1", 4),
        predict_file=T.write_squad(tmp_path / "dev.json", rng, "1.1", 2, dev=True),
        output_dir=str(tmp_path / "out"), max_seq_length=T.SEQ, doc_stride=T.STRIDE,
        max_query_length=T.QUERY, do_train=True, do_eval=True, do_predict=True,
        train_batch_size=4, predict_batch_size=4, eval_batch_size=4,
        learning_rate=(3e-3, 1e-3), num_train_epochs=2.0, save_checkpoints_steps=100,
        iterations_per_loop=4, log_steps=4, runtime=RuntimeConfig("one_device", seed=1))
    out = tmp_path / "out"
    first = run_squad.run(cfg)
    table = _read_table(out / "grid_results.tsv")
    assert [row["dir"] for row in table] == ["lr0.003_bs4_ep2.0", "lr0.001_bs4_ep2.0"]
    best = [row for row in table if row["best"] == "1"]
    assert len(best) == 1 and float(best[0]["f1"]) == max(float(r["f1"]) for r in table)
    assert first["predictions"] is not None and first["eval"]["f1"] == float(best[0]["f1"])
    for name in ("predictions.json", "nbest_predictions.json", "eval_results.json"):
        assert (out / name).read_bytes() == (out / best[0]["dir"] / name).read_bytes()
    assert not (out / "ckpt-1.index").exists()

    again = run_squad.run(cfg)
    assert all(r.get("skipped") for r in again["runs"])
    assert again["predictions"] is None and again["eval"] == first["eval"]
    assert sorted(again["files"]) == sorted(first["files"])
    assert again["files"]["predictions.json"] == str(out / best[0]["dir"] / "predictions.json")
    assert _read_table(out / "grid_results.tsv") == table


# ------------------------------------------- reruns and resumes with other settings or data


def _mrpc_run(mrpc, out, data=None, **overrides):
    """A tiny MRPC run (24 training examples: 6 steps an epoch) of run_classifier."""
    import run_classifier as rc
    from training.execution import RuntimeConfig

    values = dict(task_name="mrpc", data_dir=str(data or mrpc["data"]),
                  vocab_file=mrpc["vocab"], bert_config_file=mrpc["config"],
                  output_dir=str(out), max_seq_length=SEQ, do_train=True, do_eval=True,
                  train_batch_size=4, eval_batch_size=4, learning_rate=2e-3,
                  num_train_epochs=1.0, save_checkpoints_steps=4, iterations_per_loop=2,
                  log_steps=2, seeds=(1,), runtime=RuntimeConfig("one_device", seed=1))
    values.update(overrides)
    return rc.COMMAND.settings(**values)


def test_an_unreadable_record_redoes_the_run_and_a_defect_keeps_its_traceback(tmp_path,
                                                                           monkeypatch):
    """A run_results.json that is not JSON, or JSON of another shape, "cannot be read": the
    run is done again. An error while comparing a sound record is a defect and propagates
    (it passed for an unreadable file, and the finished run was redone)."""
    from training import output_claim, sweeps

    request = {"do_train": True, "splits": ["train.tsv", "dev.tsv"],
               "hparams": {"learning_rate": 1e-3}}
    result = {"seed": 1, "global_step": 6, "num_train_steps": 6, "eval": {"dev": {}},
              "outputs": [], "model_dir": str(tmp_path)}
    path = tmp_path / sweeps.RESULTS_FILE
    for text in ("{not JSON", "[]", '{"request": []}',
                 json.dumps({"request": request, **result, "outputs": "eval_results.txt"}),
                 json.dumps({"request": {**request, "splits": "train.tsv"}, **result}),
                 json.dumps({"request": request, "outputs": [], "model_dir": "."})):
        path.write_text(text)
        assert sweeps.earlier(str(tmp_path), request) == (None, True), text
    sweeps.write_finished(str(tmp_path), request, result)
    found, redo = sweeps.earlier(str(tmp_path), request)
    assert (found["skipped"], found["global_step"], redo) == (True, 6, False)

    def defect(old, new, prefix=""):
        raise TypeError("a defect in the comparison")

    monkeypatch.setattr(output_claim, "identity_differences", defect)
    for skip in (True, False):
        with pytest.raises(TypeError, match="a defect in the comparison"):
            sweeps.earlier(str(tmp_path), request, skip=skip)


@pytest.fixture(scope="module")
def finished_kept(mrpc):
    """A finished tiny MRPC run (`_mrpc_run`'s settings: ckpt-4, ckpt-6) and a copy of it
    (read only), file times kept."""
    import shutil

    import run_classifier as rc

    out, kept = mrpc["root"] / "finished", mrpc["root"] / "finished.kept"
    rc.run(_mrpc_run(mrpc, out))
    shutil.copytree(out, kept)
    return out, kept


@pytest.fixture
def finished(finished_kept):
    """The finished run as it was, at its own path, for a test to rerun: a run's records
    are known by path, size and file time (a copy elsewhere would be other data)."""
    import shutil

    out, kept = finished_kept
    shutil.rmtree(out)
    shutil.copytree(kept, out)
    return out


@pytest.fixture(scope="module")
def other_kept(mrpc):
    """A finished tiny MRPC run outside a sweep with other data and settings than
    `_mrpc_run`'s: every train label flipped (a data folder of its own),
    --learning_rate=1e-3, --warmup_proportion=0.5 (ckpt-4, ckpt-6), and a copy of it
    (read only, file times kept). Redone on train.tsv as it was with `_mrpc_run`'s
    settings, it is the module's finished run (`finished_kept`)."""
    import shutil

    import run_classifier as rc

    data = mrpc["root"] / "other_MRPC"
    shutil.copytree(mrpc["data"], data)
    original = (data / "train.tsv").read_bytes()
    lines = original.decode().split("\n")
    lines[1:] = [("1" if line[:1] == "0" else "0") + line[1:] if line else line
                 for line in lines[1:]]
    (data / "train.tsv").write_text("\n".join(lines))
    flipped = ((data / "train.tsv").read_bytes(), (data / "train.tsv").stat().st_mtime_ns)
    out, kept = mrpc["root"] / "other", mrpc["root"] / "other.kept"
    rc.run(_mrpc_run(mrpc, out, data, learning_rate=1e-3, warmup_proportion=0.5))
    shutil.copytree(out, kept)
    return out, kept, data, flipped, original


@pytest.fixture
def other(other_kept):
    """`other_kept`'s run as it was, at its own path, with its data as it trained on them
    (train.tsv flipped, its file time too), for a test to redo: (its folder, the data
    folder, train.tsv as it was before the flip)."""
    import shutil

    out, kept, data, (flipped, mtime_ns), original = other_kept
    shutil.rmtree(out)
    shutil.copytree(kept, out)
    (data / "train.tsv").write_bytes(flipped)
    os.utime(data / "train.tsv", ns=(mtime_ns, mtime_ns))
    return out, data, original


@pytest.mark.slow
def test_a_finished_run_redone_with_other_settings_starts_from_its_initial_weights(
        mrpc, finished_kept, other, caplog):
    """A finished run rerun as a sweep's (--skip_finished: run_results.json) with another
    --warmup_proportion (here also another rate and training data: `other`) trains again
    from the start: its checkpoints and outputs equal a fresh run's with the new settings
    (the module's finished run), never the old run's final state evaluated under the new
    settings. What it removes first is what the run made, by name: the user's files
    stay."""
    import run_classifier as rc
    from training import finetuning

    out, data, original = other
    fresh = finished_kept[1]
    old = _weights(str(out / "ckpt-6"))
    # Redone from the earlier run's own checkpoint, it would remove its --init_checkpoint
    # first (then save its own ckpt-6 there): refused before anything is touched.
    before = S.tree(out)
    for init in (out / "ckpt-6", out):
        with pytest.raises(finetuning.FinetuningError,
                           match=f"--init_checkpoint={init} is {out / 'ckpt-6'}, made by "
                                 "the earlier run"):
            rc.run(_mrpc_run(mrpc, out, data, skip_finished=True, learning_rate=1e-3,
                             warmup_proportion=0.5, init_checkpoint=str(init)))
        assert S.tree(out) == before
    # The user's files beside the run's: a plot in eval/, notes in train/, a best/ the run
    # never made (it ran without --keep_best_checkpoint). Before (issue 38) the redo
    # removed eval/, train/ and best/ whole and said it removed "what the earlier run made".
    mine = {"eval/plot.png": b"png", "train/notes.txt": b"notes", "best/mine.txt": b"mine"}
    for name, content in mine.items():
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_bytes(content)
    (data / "train.tsv").write_bytes(original)
    with caplog.at_level("WARNING"):
        redone = rc.run(_mrpc_run(mrpc, out, data, skip_finished=True))
    assert not redone["best_run"].get("skipped")
    changed = [r.getMessage() for r in caplog.records
               if "finished with other settings or data (" in r.getMessage()]
    assert "warmup_proportion" in changed[-1], changed  # (before it: the refusals')
    assert {name: (out / name).read_bytes() for name in mine} == mine
    said = [r.getMessage() for r in caplog.records if "removed what the earlier run" in
            r.getMessage()]
    assert len(said) == 1 and "ckpt-6.index" in said[0] and "eval/events.out" in said[0]
    assert "kept eval/, train/ (it holds files the run did not write)" in said[0]
    assert not any(name.split("/")[-1] in said[0] for name in mine)
    expected = _weights(str(fresh / "ckpt-6"))
    found = _weights(str(out / "ckpt-6"))
    assert sorted(found) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(found[name], value, err_msg=name)
    assert any(not np.array_equal(old[name], found[name]) for name in found)
    assert (out / "eval_results.txt").read_bytes() == (fresh / "eval_results.txt").read_bytes()
    default_warmup = _mrpc_run(mrpc, out).finetuning.warmup_proportion
    assert default_warmup != 0.5  # the redo's setting, not the earlier run's
    with open(out / "run_results.json") as f:
        assert json.load(f)["request"]["warmup_proportion"] == default_warmup
    # A rerun of the same settings still skips it.
    again = rc.run(_mrpc_run(mrpc, out, data, skip_finished=True))
    assert again["best_run"].get("skipped")
    # --keep_best_checkpoint would replace the user's best/: refused, nothing written.
    before = S.tree(out)
    with pytest.raises(finetuning.FinetuningError, match="best exists but this run did "
                                                         "not make it"):
        rc.run(_mrpc_run(mrpc, out, data, skip_finished=True, keep_best_checkpoint=True))
    assert S.tree(out) == before


@pytest.mark.slow
def test_a_resume_on_other_records_or_another_length_is_refused(mrpc, finished, tmp_path):
    """Killed after ckpt-6 (here: the finished 6-step run, its run_results.json removed,
    resumed with more epochs). Resumed with another --max_seq_length (no length buckets)
    or with train.tsv edited (a label flipped: records of the same size), the saved input position
    means nothing: refused naming what changed, before anything is written. Data restored
    byte for byte: the rebuilt records hash the same and the run resumes."""
    import shutil

    import run_classifier as rc
    from training import checkpointing

    data = tmp_path / "MRPC"
    shutil.copytree(mrpc["data"], data)
    out = finished
    assert (out / "ckpt-6.index").exists() and not (out / "ckpt-8.index").exists()
    (out / "run_results.json").unlink()  # as a run killed after ckpt-6
    longer = dict(do_eval=False, num_train_epochs=2.0)

    # Refused before anything is written (issue 38: the model files were rewritten with
    # the refused settings first): the directory is as it was, but the feature caches of
    # the changed settings or data (rebuilt for them, as they describe them).
    caches = (".tf_record", ".tf_record.metadata.json")
    before = S.tree(out, skip=caches)
    with pytest.raises(checkpointing.InputPositionError,
                       match=f"max_seq_length: {SEQ} there, 16 now") as err:
        rc.run(_mrpc_run(mrpc, out, data, max_seq_length=16, **longer))
    assert "ckpt-6" in str(err.value)
    assert S.tree(out, skip=caches) == before

    original = (data / "train.tsv").read_bytes()
    lines = original.decode().split("\n")
    lines[1] = ("1" if lines[1][0] == "0" else "0") + lines[1][1:]
    (data / "train.tsv").write_text("\n".join(lines))
    with pytest.raises(checkpointing.InputPositionError, match="records_sha256: '"):
        rc.run(_mrpc_run(mrpc, out, data, **longer))
    assert S.tree(out, skip=caches) == before

    (data / "train.tsv").write_bytes(original)
    result = rc.run(_mrpc_run(mrpc, out, data, **longer))
    assert result["best_run"]["global_step"] == 12


def _diverging_family(plan):
    """A classification family whose run number i (in the order they train) has a NaN
    loss when `plan[i]`: the loop stops it as it stops a diverged run."""
    from tasks.classification.task import ClassificationFamily

    class Diverging(ClassificationFamily):
        def loop_task(self):
            import copy

            task = copy.copy(super().loop_task())  # the family's own is shared by its runs
            if plan.pop(0):
                original = task.loss_and_stats

                def nan_loss(outputs, features):
                    loss, stats = original(outputs, features)
                    return loss * float("nan"), stats
                task.loss_and_stats = nan_loss
            return task

    return Diverging


@pytest.mark.slow
def test_a_diverging_grid_point_is_recorded_as_failed_and_a_nan_dev_metric_picks_no_best(
        mrpc, tmp_path, caplog):
    """2 learning rates, the first diverges: recorded as failed (grid_results.tsv says
    why), the second trains and is kept. A rerun with the same settings tries neither
    again; a grid whose every point diverges fails naming the reason, table written.

    Issue 38, in the same sweep (--keep_best_checkpoint): a dev metric that is NaN at
    every checkpoint of the second point's run (e.g. Pearson over one label value) was
    kept as the best (score -inf in the log, nan in the file). Now NaN is never a
    candidate: a warning per checkpoint, no best/, eval and predict on the final
    weights."""
    import run_classifier as rc
    from training import finetuning

    out = tmp_path / "out"
    cfg = _mrpc_run(mrpc, out, learning_rate=(2e-3, 1e-3), keep_best_checkpoint=True)
    family = _scripted_family(_diverging_family([True, False]),
                              {4: float("nan"), 6: float("nan")})(cfg.task, SEQ)
    family.seen = []
    with caplog.at_level("WARNING"):
        result = finetuning.run(cfg.finetuning, family)
    assert result["best_point"]["learning_rate"] == 1e-3
    # The NaN dev metric (the second point's run; the first stopped at step 1).
    kept = out / "lr0.001_bs4_ep1.0"
    assert family.seen == [4, 6] and not (kept / "best").exists()
    assert caplog.text.count("is nan (undefined on this dev set") == 2
    assert "No checkpoint had a dev eval_acc_and_f1" in caplog.text and "-inf" not in caplog.text
    assert result["best_run"]["global_step"] == 6 and result["best_run"]["model_dir"] == str(kept)
    table = _read_table(out / "grid_results.tsv")
    assert [row["dir"] for row in table] == ["lr0.002_bs4_ep1.0", "lr0.001_bs4_ep1.0"]
    assert [row["best"] for row in table] == ["0", "1"]
    assert "NaN or Inf" in table[0]["failed"] and "at step 1:" in table[0]["failed"]
    assert table[0]["global_step"] == table[0]["eval_acc_and_f1"] == table[1]["failed"] == ""
    assert (out / "eval_results.txt").read_bytes() == (
        out / "lr0.001_bs4_ep1.0" / "eval_results.txt").read_bytes()
    with open(out / "lr0.002_bs4_ep1.0" / "run_results.json") as f:
        assert "NaN" in json.load(f)["failed"]

    before = (out / "grid_results.tsv").read_bytes()
    again = finetuning.run(cfg.finetuning, _diverging_family([])(cfg.task, SEQ))  # trains none
    assert all(r.get("skipped") for r in again["runs"])
    assert (out / "grid_results.tsv").read_bytes() == before

    every = tmp_path / "every"
    cfg = _mrpc_run(mrpc, every, learning_rate=(2e-3, 1e-3))
    with pytest.raises(finetuning.FinetuningError,
                       match="every run failed .*NaN or Inf"):
        finetuning.run(cfg.finetuning, _diverging_family([True, True])(cfg.task, SEQ))
    assert [row["failed"] != "" for row in _read_table(every / "grid_results.tsv")] == [
        True, True]
    del rc


# ----------------------------------------------- single runs, kinds of run, NaN metrics


@pytest.mark.slow
def test_a_finished_single_run_rerun_with_other_data_or_rate_is_done_again(
        mrpc, finished_kept, other, caplog):
    """Issue 38: a finished run outside a sweep, rerun after train.tsv was relabelled (or
    with another --learning_rate), "resumed" its last checkpoint, trained nothing and
    exited 0 with the old model. Now it is done again from its initial weights (the
    sweeps' rule): the model equals a fresh run's on the new data and rate; the log names
    each thing that changed (the training data, the rate and the warmup: every one is
    compared). The same command again resumes (evaluates, trains nothing). Here the first
    run (`other`) trained on every label flipped at --learning_rate=1e-3 and
    --warmup_proportion=0.5 and the rerun is on train.tsv as it was with `_mrpc_run`'s
    settings: the fresh run of those is the module's finished run."""
    import run_classifier as rc

    out, data, original = other
    old = _weights(str(out / "ckpt-6"))
    (data / "train.tsv").write_bytes(original)
    with caplog.at_level("WARNING"):
        rc.run(_mrpc_run(mrpc, out, data))
    assert ("finished with other settings or data (hparams.learning_rate, train, "
            "warmup_proportion)" in caplog.text), caplog.text
    redone = _weights(str(out / "ckpt-6"))
    expected = _weights(str(finished_kept[1] / "ckpt-6"))
    assert sorted(redone) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(redone[name], value, err_msg=name)
    assert any(not np.array_equal(old[name], redone[name]) for name in old)

    caplog.clear()
    with caplog.at_level("INFO", logger="absl"):
        again = rc.run(_mrpc_run(mrpc, out, data, do_predict=True))
    assert "done again" not in caplog.text and "already reaches" in caplog.text
    assert again["best_run"]["global_step"] == 6


@pytest.mark.slow
def test_a_single_run_into_a_sweeps_directory_is_refused_writing_nothing(mrpc,
                                                                         uninterrupted):
    """Issue 38: a single-value run in a finished grid's output_dir overwrote the grid's
    copies at the top while grid_results.tsv still described the grid. Refused in one
    line before any work: the directory byte for byte as it was."""
    import run_classifier as rc
    from training import finetuning

    before = S.tree(uninterrupted)
    with pytest.raises(finetuning.FinetuningError,
                       match="holds a grid sweep \\(grid_results.tsv\\): a single run"):
        rc.run(_mrpc_run(mrpc, uninterrupted, learning_rate=2e-3))
    assert S.tree(uninterrupted) == before


def test_a_best_folder_the_run_did_not_make_is_refused_and_left_as_it_is(mrpc, tmp_path):
    """--keep_best_checkpoint keeps the best checkpoint in OUTPUT_DIR/best and replaces
    what is there: a best/ the run did not record making (here a user's, in a new output
    directory) is refused before any training, naming it, and left byte for byte."""
    import run_classifier as rc

    from training import finetuning

    out = tmp_path / "out"
    (out / "best").mkdir(parents=True)
    (out / "best" / "notes.txt").write_text("mine\n")
    cfg = _mrpc_run(mrpc, out, keep_best_checkpoint=True)
    with pytest.raises(finetuning.FinetuningError,
                       match=rf"{out / 'best'} exists but this run did not make it"):
        rc.run(cfg)
    assert sorted(p.name for p in (out / "best").iterdir()) == ["notes.txt"]
    assert (out / "best" / "notes.txt").read_text() == "mine\n"
    assert not list(out.glob("ckpt-*"))


def test_a_finished_run_from_other_weights_under_the_same_path_is_done_again(mrpc, tmp_path,
                                                                           caplog):
    """A finished run's record named its --init_checkpoint by path alone: once more
    pretraining wrote a newer checkpoint into that directory (or MNLI was retrained in
    place before GLUE's AX was predicted with it), a rerun reused the results of the old
    weights. The record holds the identity of the weights file the path resolves to: the
    same weights are skipped, newer ones under the same path are done again, the log naming
    init_weights; so are other weights rewritten under the same file name."""
    import tensorflow as tf

    from training import finetuning, sweeps

    pretrained = tmp_path / "pretrained"
    saver = tf.train.CheckpointManager(tf.train.Checkpoint(w=tf.Variable([1.0])),
                                       str(pretrained), max_to_keep=None)
    saver.save()
    settings = _mrpc_run(mrpc, tmp_path / "unused", init_checkpoint=str(pretrained)).finetuning
    run = tmp_path / "run"
    run.mkdir()

    def rerun():
        return sweeps.earlier(str(run), sweeps.request(settings, None,
                                                       finetuning.PreparedData(), 1))

    sweeps.write_finished(str(run), sweeps.request(settings, None, finetuning.PreparedData(), 1),
                          {"seed": 1, "global_step": 6, "num_train_steps": 6, "eval": {},
                           "outputs": [], "model_dir": str(run)})
    assert rerun()[0]["skipped"]
    saver.save()  # more pretraining: ckpt-2 is what the same path now holds
    with caplog.at_level("WARNING"):
        assert rerun() == (None, True)
    assert "finished with other settings or data (init_weights." in caplog.text
    # The same file name rewritten with other weights (a model saved again in place).
    sweeps.write_finished(str(run), sweeps.request(settings, None, finetuning.PreparedData(), 1),
                          {"seed": 1, "global_step": 6, "num_train_steps": 6, "eval": {},
                           "outputs": [], "model_dir": str(run)})
    index = pretrained / "ckpt-2.index"
    os.utime(index, ns=(index.stat().st_atime_ns, index.stat().st_mtime_ns + 10**9))
    assert rerun() == (None, True)
    # A Hugging Face directory: its model.safetensors names the weights.
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"weights")
    from_hf = dataclasses.replace(settings, init_checkpoint=str(hf))
    weights = sweeps.request(from_hf, None, finetuning.PreparedData(), 1)["init_weights"]
    assert weights["path"] == str(hf / "model.safetensors")
    (hf / "model.safetensors").write_bytes(b"other weights")
    assert sweeps.request(from_hf, None, finetuning.PreparedData(), 1)["init_weights"] != weights
    # A run started from checkpoints in its own output_dir writes newer ones there itself.
    own = dataclasses.replace(settings, output_dir=str(pretrained))
    assert sweeps.request(own, None, finetuning.PreparedData(), 1)["init_weights"] is None


def test_a_nan_seed_is_never_the_best_and_the_warning_names_it(caplog):
    """The best seed (and grid point) is picked among numbers: a NaN one is named in a
    warning and not picked; when every one is NaN, the first is kept, with a warning."""
    import types

    from training import sweeps

    family = types.SimpleNamespace(primary_metric=lambda: "eval_pearson")
    prepared = types.SimpleNamespace(eval_splits=[types.SimpleNamespace(name="dev")])

    def runs(*values):
        return [{"seed": seed, "eval": {"dev": {"eval_pearson": value, "global_step": 3}}}
                for seed, value in enumerate(values, 1)]

    with caplog.at_level("WARNING"):
        picked = sweeps.summarise_seeds(None, family, prepared, runs(float("nan"), 0.2, 0.1),
                                        write=False)
    assert picked["best_seed"] == 2
    assert "dev eval_pearson is NaN or missing for seed 1: not a candidate" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        picked = sweeps.summarise_seeds(None, family, prepared,
                                        runs(float("nan"), float("nan")), write=False)
    assert picked["best_seed"] == 1
    assert "no seed has a dev eval_pearson to pick the best by: the first (seed 1) is kept" \
        in caplog.text
