"""run_swag.py end to end on a tiny model: SWAG-format CSV files a tiny BERT can learn (only
the right ending says "home"), through the real CLI (train -> eval -> predict),
eval_results.txt checked against figures recomputed from test_results.tsv (the test file is
the dev file without labels), 2 mirrored replicas against one device, --seeds with the best
checkpoint, your own JSON lines, and bad input refused before training."""

import json
import os
import random
import sys

import numpy as np
import pytest

from data_prep.cli import UserError
from tests import forkserver
from tests import test_loop_support as S
from tests.clis import call_main
from tests.conftest import TINY_VOCAB, write_vocab
from tests.test_multiple_choice_data import swag_row, write_swag

pytestmark = pytest.mark.slow

NOUNS = ["cat", "dog", "mat"]
WORDS = ["the", "a", "big", "red", "far", "away", "sat", "ran", "on", "in"]


def _examples(rng, n):
    """(index, sent1, sent2, 4 endings, label): the right ending alone ends at "home"."""
    out = []
    for i in range(n):
        label = rng.randrange(4)
        sent1 = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6))) + " ."
        sent2 = f"the {rng.choice(NOUNS)}"
        endings = [f"{rng.choice(WORDS)} {'home' if k == label else rng.choice(NOUNS)} ."
                   for k in range(4)]
        out.append((i, sent1, sent2, endings, label))
    return out


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("swag")
    rng = random.Random(0)
    data = root / "swag"
    data.mkdir()
    train, dev = _examples(rng, 96), _examples(rng, 18)
    write_swag(data / "train.csv", [swag_row(*e) for e in train])
    write_swag(data / "val.csv", [swag_row(*e) for e in dev])
    write_swag(data / "test.csv", [swag_row(*e[:4]) for e in dev], labels=False)
    return {"root": root, "data": str(data), "dev_labels": [e[4] for e in dev], "dev": dev,
            "vocab": write_vocab(root / "vocab.txt"),
            # One layer everywhere: what the trained run must learn (the right ending alone
            # says "home") one layer learns (above the 0.75 accuracy bar below), and nothing here is checked
            # layer by layer; a run's (an export's, a mirrored predict's) cost is mostly
            # tracing its graph.
            "config": S.write_config(root / "bert_config.json", vocab_size=len(TINY_VOCAB),
                                     num_hidden_layers=1)}


def _argv(env, out, **overrides):
    """run_swag.py's command line for the tiny data of `env` (flags replaced)."""
    flags = dict(data_dir=env["data"], vocab_file=env["vocab"],
                 bert_config_file=env["config"], output_dir=out, do_train="true",
                 do_eval="true", do_predict="true", max_seq_length=16, train_batch_size=8,
                 eval_batch_size=4, predict_batch_size=4, learning_rate=2e-3,
                 num_train_epochs=20.0, save_checkpoints_steps=80, iterations_per_loop=40,
                 seed=1, distribution_strategy="one_device")
    flags.update(overrides)
    return [f"--{k}={v}" for k, v in flags.items()]


def _cli(env, out, **overrides):
    """run_swag.py with a TensorFlow runtime of its own: for a mirrored run over logical CPU
    devices, which must be configured before TensorFlow starts (tests/forkserver.py)."""
    cmd = [sys.executable, os.path.join(S.REPO_ROOT, "run_swag.py"), *_argv(env, out,
                                                                            **overrides)]
    return forkserver.run(cmd, S.runner_env(), S.REPO_ROOT, 400)


def _results(path):
    with open(path) as f:
        return {line.split(" = ")[0]: float(line.split(" = ")[1]) for line in f}


@pytest.fixture(scope="module")
def trained(env):
    out = env["root"] / "out"
    result = call_main("run_swag", _argv(env, out), cwd=S.REPO_ROOT)
    assert result.code == 0, (result.stdout + result.stderr + result.log)[-4000:]
    return out


def test_cli_learns_and_eval_results_equal_the_predictions(env, trained):
    results = _results(trained / "eval_results.txt")
    probabilities = np.loadtxt(trained / "test_results.tsv", delimiter="\t")
    labels = np.array(env["dev_labels"])
    assert probabilities.shape == (18, 4)  # every test example, in input order
    np.testing.assert_allclose(probabilities.sum(-1), 1.0, atol=1e-5)
    assert results["eval_accuracy"] == pytest.approx(
        float(np.mean(probabilities.argmax(-1) == labels)))
    nll = -np.log(probabilities[np.arange(18), labels])
    assert results["eval_loss"] == pytest.approx(nll.mean(), rel=1e-3)
    # Batches of 4 (the last one short): the original Estimator's mean of batch means.
    assert results["loss"] == pytest.approx(
        np.mean([nll[i:i + 4].mean() for i in range(0, 18, 4)]), rel=1e-3)
    assert results["global_step"] == 240
    assert results["eval_accuracy"] >= 0.75, results  # chance is 0.25


def test_exported_model_serves_the_runner_predictions_from_raw_strings(env, trained, tmp_path):
    """export_saved_model.py --model_type=multiple_choice on the run dir (config, vocab and
    metadata found beside the checkpoint), served by predict_saved_model.py (tensorflow +
    tensorflow_text only) on the test file's raw strings: the runner's test_results.tsv."""
    flags = []
    for _, sent1, sent2, endings, _ in env["dev"]:
        flags += [f"--context={sent1}", f"--question={sent2}"] + [f"--ending={e}" for e in endings]
    document, lines = S.export_and_serve("multiple_choice", trained, tmp_path, flags)
    marker = json.loads((tmp_path / "export" / "assets.extra" / "export_metadata.json")
                        .read_text())
    assert marker["model_type"] == "multiple_choice" and marker["max_seq_length"] == 16
    served = document["predictions"]
    expected = np.loadtxt(trained / "test_results.tsv", delimiter="\t")
    got = np.array([row["probabilities"] for row in served])
    assert got.shape == expected.shape == (18, 4)
    # Same weights and inputs; the runner pads to its length bucket, the export to 16:
    # float32 round-off only.
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert [row["label"] for row in served] == list(expected.argmax(-1))
    # The printed lines: the chosen index and the four probabilities.
    assert len(lines) == 18


def test_mirrored_predictions_equal_one_device(env, trained, tmp_path):
    out = tmp_path / "mirrored"
    proc = _cli(env, out, do_train="false", init_checkpoint=trained,
                distribution_strategy="mirrored", num_cpu_devices=2)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "with 2 replica(s)" in proc.stdout + proc.stderr
    np.testing.assert_allclose(np.loadtxt(out / "test_results.tsv", delimiter="\t"),
                               np.loadtxt(trained / "test_results.tsv", delimiter="\t"),
                               atol=1e-5)
    assert _results(out / "eval_results.txt")["eval_accuracy"] == _results(
        trained / "eval_results.txt")["eval_accuracy"]


def test_seeds_keep_the_best_checkpoint_on_your_own_jsonl(env, tmp_path):
    """--task_name=custom on JSON lines (endings as a list, the label as text), two seeds,
    the best checkpoint: seed_results.txt and the best seed's files in output_dir."""
    import run_swag
    from tasks.multiple_choice import data
    from training.execution import RuntimeConfig

    rng = random.Random(5)
    d = tmp_path / "own"
    d.mkdir()
    for split, n in (("train", 48), ("dev", 12)):
        rows = [{"premise": s1, "q": s2, "options": e, "answer": e[label]}
                for _, s1, s2, e, label in _examples(rng, n)]
        (d / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    fmt = data.ChoiceFormat(context="premise", question="q", endings=("options",),
                            label="answer", label_is_text=True)
    out = tmp_path / "out"
    result = run_swag.run(run_swag.COMMAND.settings(
        data_dir=str(d), format=fmt, task_name="custom", vocab_file=env["vocab"],
        bert_config_file=env["config"], output_dir=str(out), max_seq_length=16,
        do_train=True, do_eval=True, train_batch_size=8, eval_batch_size=4,
        learning_rate=3e-3, num_train_epochs=2.0, save_checkpoints_steps=6, seeds=(1, 2),
        keep_best_checkpoint=True, bucket_boundaries=(8, 16),
        runtime=RuntimeConfig("one_device", seed=1)))
    summary = _results(out / "seed_results.txt")
    assert summary["best_seed"] == result["best_seed"] and summary["num_seeds"] == 2
    best = _results(out / f"seed_{result['best_seed']}" / "best" / "eval_results.txt")
    assert _results(out / "eval_results.txt")["eval_accuracy"] == best["eval_accuracy"]


CUSTOM_WITHOUT_LABELS = dict(task_name="custom", context_column="sent1",
                             ending_columns="ending0,ending1,ending2,ending3")


@pytest.mark.parametrize("train_csv, overrides, message", [
    ("sent1,sent2,ending0,ending1\nx,y,a,b\n", dict(do_eval="false", do_predict="false"),
     "train.csv:1: no column 'ending2'"),
    # No --label_column: training and evaluating on placeholder labels (all 0) ran and
    # wrote an eval_accuracy; prediction alone needs no labels.
    (None, dict(CUSTOM_WITHOUT_LABELS, do_eval="false", do_predict="false"),
     "--label_column is required with --do_train (the right ending"),
    (None, dict(CUSTOM_WITHOUT_LABELS, do_train="false"),
     "--label_column is required with --do_eval (the right ending"),
    (None, dict(CUSTOM_WITHOUT_LABELS, do_predict="false"),
     "--label_column is required with --do_train and --do_eval"),
], ids=["missing_column", "train_without_labels", "eval_without_labels",
        "train_and_eval_without_labels"])
def test_bad_input_is_refused_before_training(env, tmp_path, train_csv, overrides, message):
    data_dir = env["data"]
    if train_csv is not None:
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "train.csv").write_text(train_csv, encoding="utf-8")
        data_dir = str(tmp_path / "bad")
    result = call_main("run_swag", _argv(dict(env, data=data_dir), tmp_path / "out",
                                         **overrides))
    assert result.code == 1
    (line,) = result.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith("run_swag.py: error: ") and message in line, line
    assert not (tmp_path / "out").exists()  # a refused run leaves no directory it made


def test_predicting_alone_needs_no_label_column(env, tmp_path):
    """The check of bad input above lets --do_predict alone through without labels."""
    import run_swag
    from tasks.multiple_choice import data

    fmt = data.ChoiceFormat(context="sent1", endings=("ending0", "ending1"), label=None)
    settings = dict(data_dir=env["data"], format=fmt, task_name="custom",
                    vocab_file=env["vocab"], bert_config_file=env["config"],
                    output_dir=str(tmp_path / "out"))
    run_swag._check(run_swag.COMMAND.settings(**settings, do_predict=True))
    with pytest.raises(UserError, match="--label_column is required with --do_eval"):
        run_swag.run(run_swag.COMMAND.settings(**settings, do_eval=True, do_predict=True))
    assert not (tmp_path / "out").exists()


def test_gradient_accumulation_with_length_buckets_equals_the_whole_batch(env, tmp_path):
    """Issue 38 #11: --gradient_accumulation_steps=2 with length buckets crashed (the
    batch's length is known only at run time); two micro-batches of 4 examples ([4
    choices, length] each) now give the gradients of the batch of 8 (the loss is a mean
    over examples)."""
    import run_swag
    from training.execution import RuntimeConfig

    whole, accumulated, batch = S.accumulated_and_whole_gradients(
        run_swag.COMMAND, data_dir=env["data"], vocab_file=env["vocab"],
        bert_config_file=env["config"], output_dir=str(tmp_path), do_train=True,
        max_seq_length=16, train_batch_size=8, learning_rate=2e-3,
        bucket_boundaries=(8, 16), runtime=RuntimeConfig("one_device", seed=1))
    assert batch["input_ids"].shape[:2] == (8, 4)
    S.assert_same_gradients(whole, accumulated)
