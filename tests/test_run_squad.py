"""run_squad.py end to end on a tiny model: SQuAD v1.1 through the real CLI (train + predict +
official metrics), v2.0 through `run_squad.run` in this process; the written files' layouts,
eval_results.json against squad_metrics recomputed from predictions.json, prediction-only
runs from the trained checkpoint (resume and --init_checkpoint), and flag / file errors.

The SQuAD files are written here in the official layout, with contexts long enough for
several windows (max_seq_length 64, doc_stride 32, max_query_length 16).
"""

import json
import os
import random

import numpy as np
import pytest

from tests import test_loop_support as S
from tests.clis import call_main
from tests.conftest import write_vocab

SEQ, STRIDE, QUERY = 64, 32, 16
COLORS = ["red", "blue", "green", "black", "white", "brown"]
ANIMALS = ["cat", "dog", "horse", "bird", "fox", "goat"]
PLACES = ["Oslo", "the old barn", "a small house", "Paris, France", "the river (north)",
          "Zurich"]
FILLER = ["the", "sun", "rose", "over", "hills", "and", "people", "walked", "slowly", "to",
          "market", "while", "children", "played", "near", "water", "every", "day", "in",
          "summer", "rain", "fell", "on", "roofs", "quiet", "town", "evening"]


def _filler(rng):
    return " ".join(rng.choice(FILLER) for _ in range(rng.randint(5, 9))).capitalize() + "."


def _paragraph(rng, qid_prefix, n_facts=2, long=False, impossible=0, dev=False):
    """A context with `n_facts` "The <color> <animal> lives in <place>." sentences hidden
    among filler (long: about 150 words, i.e. several windows) and its questions."""
    n_filler = rng.randint(14, 20) if long else rng.randint(1, 3)
    sentences = [_filler(rng) for _ in range(n_filler)]
    pairs = rng.sample([(c, a) for c in COLORS for a in ANIMALS], n_facts + impossible)
    facts = []
    for color, animal in pairs[:n_facts]:
        place = rng.choice(PLACES)
        facts.append((color, animal, place))
        sentences.insert(rng.randint(0, len(sentences)),
                         f"The {color} {animal} lives in {place}.")
    context = " ".join(sentences)
    qas = []
    for i, (color, animal, place) in enumerate(facts):
        start = context.index(f"The {color} {animal} lives in ") + len(
            f"The {color} {animal} lives in ")
        answers = [{"text": place, "answer_start": start}]
        if dev:  # several gold answers, as in the dev sets
            answers.append({"text": f"in {place}", "answer_start": start - 3})
        qa = {"id": f"{qid_prefix}_{i}", "question": f"Where does the {color} {animal} live?",
              "answers": answers}
        if impossible:
            qa["is_impossible"] = False
        qas.append(qa)
    for j, (color, animal) in enumerate(pairs[n_facts:]):
        qa = {"id": f"{qid_prefix}_na{j}", "question": f"Where does the {color} {animal} live?",
              "answers": [], "is_impossible": True}
        if dev:
            qa["plausible_answers"] = [{"text": facts[0][2], "answer_start": context.index(
                facts[0][2])}]
        qas.append(qa)
    return {"context": context, "qas": qas}


def write_squad(path, rng, version, n_paragraphs, dev=False):
    v2 = version == "v2.0"
    paragraphs = [
        _paragraph(rng, f"{'d' if dev else 't'}{k}", long=k % 2 == 0,
                   impossible=int(v2), dev=dev)
        for k in range(n_paragraphs)]
    data = {"version": version if v2 else "1.1",
            "data": [{"title": "Animals", "paragraphs": paragraphs}]}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    return str(path)


def _vocab_tokens():
    from data_prep import tokenization

    text = " ".join(FILLER + COLORS + ANIMALS + PLACES + [
        "The lives in Where does live ? . , ( )"])
    words = sorted(set(tokenization.basic_tokenize(text, True)))
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("squad")
    rng = random.Random(0)
    tokens = _vocab_tokens()
    return {
        "root": root,
        "vocab": write_vocab(root / "vocab.txt", tokens),
        # One layer: no test here checks learning or anything layer by layer (the scores
        # are recomputed from the predictions), and a run's cost is mostly tracing its graph.
        "config": S.write_config(root / "bert_config.json", vocab_size=len(tokens),
                                 num_hidden_layers=1),
        "train_v1": write_squad(root / "train-v1.1.json", rng, "1.1", 8),
        "dev_v1": write_squad(root / "dev-v1.1.json", rng, "1.1", 4, dev=True),
        "train_v2": write_squad(root / "train-v2.0.json", rng, "v2.0", 6),
        "dev_v2": write_squad(root / "dev-v2.0.json", rng, "v2.0", 3, dev=True),
    }


def _run_config(env, out, **overrides):
    import run_squad

    return run_squad.COMMAND.settings(**_run_values(env, out, **overrides))


def _run_values(env, out, **overrides):
    """`_run_config`'s settings as keyword arguments named as the flags."""
    from training.execution import RuntimeConfig

    values = dict(vocab_file=env["vocab"], bert_config_file=env["config"], output_dir=str(out),
                  max_seq_length=SEQ, doc_stride=STRIDE, max_query_length=QUERY,
                  train_batch_size=4, predict_batch_size=4, learning_rate=3e-3,
                  num_train_epochs=8.0, save_checkpoints_steps=12, iterations_per_loop=6,
                  log_steps=6, runtime=RuntimeConfig("one_device", seed=1))
    values.update(overrides)
    return values


@pytest.fixture(scope="module")
def v1_cli(env):
    """SQuAD v1.1: train + predict through the real command line (in this process)."""
    out = env["root"] / "out_v1"
    flags = dict(vocab_file=env["vocab"], bert_config_file=env["config"], output_dir=out,
                 train_file=env["train_v1"], predict_file=env["dev_v1"], do_train="true",
                 do_predict="true", max_seq_length=SEQ, doc_stride=STRIDE,
                 max_query_length=QUERY, train_batch_size=4, predict_batch_size=4,
                 learning_rate=3e-3, num_train_epochs=12.0, save_checkpoints_steps=12,
                 iterations_per_loop=6, log_steps=6, seed=3, n_best_size=5,
                 distribution_strategy="one_device")
    result = call_main("run_squad", cwd=S.REPO_ROOT, **flags)
    log = result.stdout + result.stderr + result.log
    assert result.code == 0, log[-4000:]
    return {"dir": str(out), "log": log, "stdout": result.stdout}


@pytest.fixture(scope="module")
def v2_run(env):
    """SQuAD v2.0: train + predict (every window padded to max_seq_length) through
    `run_squad.run` in this process; ``nbest``: its n-best lists as written."""
    import run_squad

    cfg = _run_config(env, env["root"] / "out_v2", train_file=env["train_v2"],
                      predict_file=env["dev_v2"], do_train=True, do_predict=True,
                      version_2_with_negative=True, num_train_epochs=6.0)
    result = run_squad.run(cfg)
    return {"cfg": cfg, "dir": cfg.finetuning.output_dir, "result": result,
            "nbest": _load(os.path.join(cfg.finetuning.output_dir, "nbest_predictions.json"))}


@pytest.fixture(scope="module")
def from_init(env, v2_run):
    """Prediction only, in a fresh dir, from --init_checkpoint=<the v2 run's dir>, with
    length buckets and another batch size (8) than the run's."""
    import run_squad

    out = env["root"] / "from_init"
    result = run_squad.run(_run_config(env, out, predict_file=env["dev_v2"],
                                       do_predict=True, version_2_with_negative=True,
                                       init_checkpoint=v2_run["dir"], predict_batch_size=8,
                                       bucket_boundaries=(16, 32, SEQ)))
    return {"result": result, "nbest": _load(out / "nbest_predictions.json")}


def _assert_same_nbest(got, want, atol):
    """The same questions, answer texts in the same order and start logits within `atol`."""
    assert list(got) == list(want)
    for qid, entries in want.items():
        assert [e["text"] for e in got[qid]] == [e["text"] for e in entries]
        np.testing.assert_allclose([e["start_logit"] for e in got[qid]],
                                   [e["start_logit"] for e in entries], atol=atol)


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _question_ids(path):
    return [qa["id"] for article in _load(path)["data"] for p in article["paragraphs"]
            for qa in p["qas"]]


def _check_prediction_files(out, predict_file, n_best_size, v2):
    ids = _question_ids(predict_file)
    predictions = _load(os.path.join(out, "predictions.json"))
    assert list(predictions) == ids  # every question, in file order
    assert all(isinstance(v, str) for v in predictions.values())
    nbest = _load(os.path.join(out, "nbest_predictions.json"))
    assert list(nbest) == ids
    for qid, entries in nbest.items():
        assert 1 <= len(entries) <= n_best_size + int(v2)
        for entry in entries:
            assert list(entry) == ["text", "probability", "start_logit", "end_logit"]
        probs = [e["probability"] for e in entries]
        assert abs(sum(probs) - 1.0) < 1e-6 and probs == sorted(probs, reverse=True)
        if not v2:
            assert predictions[qid] == entries[0]["text"]
    null_odds = os.path.join(out, "null_odds.json")
    assert os.path.exists(null_odds) == v2
    if v2:
        odds = _load(null_odds)
        assert list(odds) == ids and all(isinstance(v, float) for v in odds.values())
        for qid in ids:  # the threshold rule (0.0) decides between "" and the best text
            best = next(e["text"] for e in nbest[qid] if e["text"])
            assert predictions[qid] == ("" if odds[qid] > 0.0 else best)
    return predictions, nbest


@pytest.mark.slow
def test_v1_cli_trains_predicts_and_scores(v1_cli, env):
    out = v1_cli["dir"]
    meta = _load(os.path.join(out, "train.tf_record.metadata.json"))
    # The original's step count: examples (not windows) / batch * epochs.
    assert meta["num_features"] > meta["num_examples"] == 16
    assert "step 48/48" in v1_cli["log"]
    assert os.path.exists(os.path.join(out, "checkpoint"))
    dev_meta = _load(os.path.join(out, "eval.tf_record.metadata.json"))
    assert dev_meta["num_features"] > dev_meta["num_examples"]  # long contexts: windows
    _check_prediction_files(out, env["dev_v1"], 5, v2=False)
    results = _load(os.path.join(out, "eval_results.json"))
    assert sorted(results) == ["exact_match", "f1"]
    from tasks.squad import metrics as squad_metrics

    recomputed = squad_metrics.evaluate_files(env["dev_v1"],
                                              os.path.join(out, "predictions.json"))
    assert results == pytest.approx(recomputed)
    assert json.loads(v1_cli["stdout"].strip().splitlines()[-1]) == pytest.approx(results)


@pytest.mark.slow
def test_v1_output_dir_is_ready_for_export(v1_cli):
    from modeling.export import registry
    from tasks.squad import export as squad_export

    out = v1_cli["dir"]
    meta = registry.read_run_metadata(out, squad_export.FAMILY)
    assert (meta.task, meta.max_seq_length, meta.do_lower_case) == ("squad", SEQ, True)
    # What the export needs to window and answer as the run did (issue 22).
    assert (meta.model_type, meta.max_query_length, meta.doc_stride, meta.n_best_size,
            meta.max_answer_length) == ("squad", QUERY, STRIDE, 5, 30)
    assert os.path.exists(os.path.join(out, "vocab.txt"))
    assert os.path.exists(os.path.join(out, "bert_config.json"))


def _predict_cli(env, out, predict_file, init_checkpoint):
    """run_squad.py --do_predict (no training) in this process; returns its `Result`."""
    flags = dict(vocab_file=env["vocab"], bert_config_file=env["config"], output_dir=out,
                 predict_file=predict_file, init_checkpoint=init_checkpoint,
                 do_predict="true", max_seq_length=SEQ, doc_stride=STRIDE,
                 max_query_length=QUERY, predict_batch_size=4, n_best_size=5,
                 distribution_strategy="one_device")
    return call_main("run_squad", cwd=S.REPO_ROOT, **flags)


@pytest.mark.slow
def test_v1_question_without_answers_is_predicted_and_left_out_of_the_scores(v1_cli, env,
                                                                             tmp_path):
    """Issue 22: a v1.1 predict file with a question whose answers are [] ended in "max()
    arg is an empty sequence" (exit 1) and no predictions.json."""
    data = _load(env["dev_v1"])
    qas = data["data"][0]["paragraphs"][1]["qas"]
    qas[0]["answers"] = []
    empty_id = qas[0]["id"]
    predict_file = tmp_path / "dev-v1.1-one-empty.json"
    predict_file.write_text(json.dumps(data), encoding="utf-8")
    out = tmp_path / "out"
    result = _predict_cli(env, out, predict_file, v1_cli["dir"])
    log = result.stdout + result.stderr + result.log
    assert result.code == 0, log[-4000:]
    ids = _question_ids(str(predict_file))
    assert list(_load(out / "predictions.json")) == ids  # every question predicted
    results = _load(out / "eval_results.json")
    assert (results["total"], results["skipped_without_answers"]) == (len(ids) - 1, 1)
    assert "no gold answer" in log and repr(empty_id) in log
    from tasks.squad import metrics as squad_metrics

    assert results == pytest.approx(squad_metrics.evaluate_files(
        str(predict_file), str(out / "predictions.json")))


@pytest.mark.slow
def test_v2_predictions_null_odds_and_metrics(v2_run, env):
    from tasks.squad import metrics as squad_metrics

    out = v2_run["dir"]
    result = v2_run["result"]
    assert result["global_step"] == result["num_train_steps"] == int(18 / 4 * 6.0)
    _check_prediction_files(out, env["dev_v2"], 20, v2=True)
    results = _load(os.path.join(out, "eval_results.json"))
    for key in ("exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
                "NoAns_exact", "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh",
                "best_f1", "best_f1_thresh"):
        assert key in results, key
    assert results["HasAns_total"] == 6 and results["NoAns_total"] == 3
    recomputed = squad_metrics.evaluate_files(env["dev_v2"],
                                              os.path.join(out, "predictions.json"),
                                              os.path.join(out, "null_odds.json"))
    assert results == pytest.approx(recomputed)
    assert result["eval"] == pytest.approx(results)


@pytest.mark.slow
def test_predict_only_from_the_trained_checkpoint(v2_run, from_init, env):
    """Resuming in the trained dir (no --do_train) and --init_checkpoint=<trained dir> in a
    fresh dir (`from_init`) both predict with the trained weights: identical answers and
    logits."""
    import run_squad

    out = v2_run["dir"]
    resumed = run_squad.run(_run_config(env, out, predict_file=env["dev_v2"],
                                        do_predict=True, version_2_with_negative=True))
    assert resumed["global_step"] == v2_run["result"]["global_step"]
    assert from_init["result"]["global_step"] == 0
    _assert_same_nbest(_load(os.path.join(out, "nbest_predictions.json")), v2_run["nbest"],
                       atol=1e-4)
    _assert_same_nbest(from_init["nbest"], v2_run["nbest"], atol=1e-4)
    assert from_init["result"]["eval"] == pytest.approx(v2_run["result"]["eval"])


@pytest.mark.slow
def test_training_resumes_from_the_last_checkpoint(v2_run, env, tmp_path):
    """More epochs in a copy of the trained dir: training continues from the last step."""
    import shutil

    import run_squad

    out = tmp_path / "resumed"
    shutil.copytree(v2_run["dir"], out)
    done = v2_run["result"]["global_step"]
    result = run_squad.run(_run_config(env, out, train_file=env["train_v2"], do_train=True,
                                       version_2_with_negative=True, num_train_epochs=8.0))
    assert result["global_step"] == result["num_train_steps"] == int(18 / 4 * 8.0) > done
    assert result["predictions"] is None and result["eval"] is None
    from modeling import checkpoints

    _, prefix = checkpoints.resolve(str(out))
    assert prefix.endswith(f"ckpt-{result['global_step']}")


@pytest.mark.slow
def test_a_v2_file_predicted_without_the_v2_flag_gets_the_v2_metrics(v2_run, env, tmp_path):
    """The v1.1 metrics cannot score unanswerable questions: the file decides, and without
    null_odds.json there is no threshold search."""
    import run_squad

    out = tmp_path / "out"
    result = run_squad.run(_run_config(env, out, predict_file=env["dev_v2"], do_predict=True,
                                       init_checkpoint=v2_run["dir"]))
    assert not os.path.exists(out / "null_odds.json")
    assert result["eval"]["NoAns_total"] == 3 and "best_f1" not in result["eval"]


@pytest.mark.slow
def test_a_test_file_without_answers_is_predicted_not_scored(v2_run, env, tmp_path):
    import run_squad

    data = _load(env["dev_v2"])
    for article in data["data"]:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                qa.pop("answers")
                qa.pop("is_impossible")
                qa.pop("plausible_answers", None)
    test_file = tmp_path / "test.json"
    test_file.write_text(json.dumps(data), encoding="utf-8")
    out = tmp_path / "out"
    result = run_squad.run(_run_config(env, out, predict_file=str(test_file),
                                       do_predict=True, version_2_with_negative=True,
                                       init_checkpoint=v2_run["dir"]))
    assert result["eval"] is None and not os.path.exists(out / "eval_results.json")
    assert list(_load(out / "predictions.json")) == _question_ids(env["dev_v2"])


def test_bad_predict_file_is_a_clear_error(env, tmp_path):
    import run_squad
    from tasks.squad import data as squad

    bad = tmp_path / "bad.json"
    bad.write_text('{"version": "1.1", "data": [{"title": "x", "paragraphs": [\n{"context": '
                   '"a b", "qas": [{"id": "q1", "answers": []}]}]}]}', encoding="utf-8")
    with pytest.raises(squad.SquadFormatError, match=r"bad\.json.*q1.*question"):
        run_squad.run(_run_config(env, tmp_path / "o1", predict_file=str(bad),
                                  do_predict=True))
    broken = tmp_path / "broken.json"
    broken.write_text('{"version": "1.1", "data": [\n{"title": ', encoding="utf-8")
    with pytest.raises(squad.SquadFormatError, match=r"broken\.json.*line 2"):
        run_squad.run(_run_config(env, tmp_path / "o2", predict_file=str(broken),
                                  do_predict=True))


@pytest.mark.parametrize("version", ["1.1", "v2.0"])
def test_a_question_id_used_twice_is_refused_in_train_and_predict_files(env, tmp_path,
                                                                        version):
    """Issue 22: repeated ids were silently merged; refused before any work, naming the id
    and the file."""
    import run_squad
    from tasks.squad import data as squad

    v2 = version == "v2.0"
    source = env["train_v2"] if v2 else env["train_v1"]
    data = _load(source)
    paragraphs = data["data"][0]["paragraphs"]
    repeated = paragraphs[0]["qas"][0]["id"]
    paragraphs[-1]["qas"][-1]["id"] = repeated
    bad = tmp_path / f"repeated-{version}.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    for flags in (dict(train_file=str(bad), do_train=True),
                  dict(predict_file=str(bad), do_predict=True)):
        out = tmp_path / next(iter(flags))
        with pytest.raises(squad.SquadFormatError,
                           match=rf"{bad.name}: question id '{repeated}' is used twice"):
            run_squad.run(_run_config(env, out, version_2_with_negative=v2, **flags))
        # A refused run leaves nothing: not even the output_dir it would have created.
        assert not out.exists(), sorted(os.listdir(out))


def test_flag_errors(env, tmp_path):
    import run_squad

    cases = [
        (dict(), "At least one of `do_train` or `do_predict`"),
        (dict(do_train=True), "`train_file` must be specified"),
        (dict(do_predict=True), "`predict_file` must be specified"),
        (dict(do_predict=True, predict_file=str(tmp_path / "nope.json")),
         "--predict_file=.*nope.json: no such file"),
        (dict(do_predict=True, predict_file=env["dev_v1"], max_query_length=61),
         "must be greater than max_query_length"),
        (dict(do_predict=True, predict_file=env["dev_v1"], max_seq_length=256),
         "only trained up to sequence length 128"),
        (dict(do_predict=True, predict_file=env["dev_v1"], vocab_file=""),
         "--vocab_file is required"),
        (dict(do_predict=True, predict_file=env["dev_v1"],
              bert_config_file=str(tmp_path / "none.json")),
         "--bert_config_file=.*none.json: no such file"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message):
            run_squad.run(_run_config(env, tmp_path / "out", **overrides))


def test_cli_error_exits_non_zero_with_the_message(env, tmp_path):
    from absl.testing import flagsaver

    import run_squad

    argv = ["run_squad.py", f"--vocab_file={env['vocab']}",
            f"--bert_config_file={env['config']}", f"--output_dir={tmp_path}",
            "--do_predict", f"--predict_file={tmp_path / 'missing.json'}",
            "--max_seq_length=64", "--max_query_length=16"]
    with flagsaver.flagsaver():
        run_squad.FLAGS(argv)
        with pytest.raises(SystemExit) as exit_info:
            run_squad.main([])
    assert "missing.json: no such file" in str(exit_info.value.code)


def test_flags_become_the_run_config():
    from absl.testing import flagsaver

    import run_squad

    argv = ["run_squad.py", "--vocab_file=v", "--bert_config_file=c", "--output_dir=o",
            "--train_file=t.json", "--predict_file=d.json", "--do_train", "--do_predict",
            "--version_2_with_negative", "--null_score_diff_threshold=-1.5",
            "--doc_stride=64", "--n_best_size=7"]
    with flagsaver.flagsaver():
        run_squad.FLAGS(argv)
        cfg = run_squad.run_config_from_flags()
    run, task = cfg.finetuning, cfg.task
    assert run.max_seq_length == 384  # the SQuAD default when --max_seq_length is absent
    assert (task.doc_stride, task.max_query_length, task.n_best_size) == (64, 64, 7)
    assert task.version_2_with_negative and task.null_score_diff_threshold == -1.5
    assert (run.train_batch_size, run.predict_batch_size) == (32, 8)
    with flagsaver.flagsaver():
        run_squad.FLAGS(argv + ["--max_seq_length=128"])
        assert run_squad.run_config_from_flags().finetuning.max_seq_length == 128


@pytest.mark.slow
def test_the_predict_records_pad_the_last_batch(v1_cli):
    from tasks.squad import data as squad_data
    from training import input_pipeline

    meta = _load(os.path.join(v1_cli["dir"], "eval.tf_record.metadata.json"))
    records = input_pipeline.RecordsConfig(
        (os.path.join(v1_cli["dir"], "eval.tf_record"),),
        squad_data.squad_schema(False).parse_spec(max_seq_length=SEQ))
    batches = list(input_pipeline.finetuning_records(
        records, batch_size=5, is_training=False, drop_remainder=False, pad_to_batch=True))
    assert all(b["input_ids"].shape == (5, SEQ) for b in batches)
    ids = np.concatenate([b["unique_ids"].numpy().reshape(-1) for b in batches])
    real = ids[ids > 0]
    assert len(real) == meta["num_features"] and len(ids) % 5 == 0
    assert list(real) == list(range(1000000000, 1000000000 + len(real)))


def test_span_loss_is_the_original_mean_of_start_and_end_cross_entropy():
    import tensorflow as tf

    from modeling import losses

    rng = np.random.default_rng(0)
    start, end = rng.normal(size=(3, 7)), rng.normal(size=(3, 7))
    sp, ep = np.array([[0], [3], [6]]), np.array([[0], [4], [6]])

    def ce(logits, pos):
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        return -np.mean(logp[np.arange(3), pos.reshape(-1)])

    loss, stats = losses.span_loss(tf.constant(start, tf.float32), tf.constant(end, tf.float32),
                                   tf.constant(sp), tf.constant(ep))
    expected = (ce(start, sp) + ce(end, ep)) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    assert float(stats["start_loss"]) == pytest.approx(ce(start, sp), rel=1e-5)
    assert float(stats["start_correct_sum"]) == float(
        (start.argmax(-1) == sp.reshape(-1)).sum())



@pytest.mark.slow
def test_bucketed_predictions_equal_padded_ones(v2_run, from_init):
    """Length buckets cut the windows' batches (`from_init`); the span logits, padded back,
    give the same n-best lists and scores as padding every window to max_seq_length (the
    v2 run's own predictions, from the same weights)."""
    _assert_same_nbest(from_init["nbest"], v2_run["nbest"], atol=1e-5)
    assert from_init["result"]["eval"] == pytest.approx(v2_run["result"]["eval"])


def test_gradient_accumulation_with_length_buckets_equals_the_whole_batch(env, tmp_path):
    """Issue 38 #11: --gradient_accumulation_steps=2 with length buckets crashed (the
    batch's length is known only at run time); two micro-batches of 2 now give the
    gradients of the batch of 4 (the loss is a mean over windows)."""
    import run_squad

    whole, accumulated, _ = S.accumulated_and_whole_gradients(
        run_squad.COMMAND, **_run_values(env, tmp_path, train_file=env["train_v1"],
                                         do_train=True, bucket_boundaries=(32, SEQ)))
    S.assert_same_gradients(whole, accumulated)
