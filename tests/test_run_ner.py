"""run_ner.py end to end on a tiny model, plus the pieces it adds to modeling/.

Data: a synthetic CoNLL-2003-layout set (4 columns, IOB1, -DOCSTART- lines) that a tiny
model learns: names from a fixed list are PER, places LOC; dev and test each hold a sentence
longer than a window (max_seq_length 16). Fine-tuning runs through the real CLI from a
TF1-layout checkpoint with --document_context and two seeds (--keep_best_checkpoint);
eval_results.txt is checked against conlleval recomputed from dev_predictions.txt by
seqeval (default mode), every word of the input against the prediction files, and the
predictions against an independent forward pass one window at a time. The feature-based
mode runs through the CLI under MirroredStrategy over 2 CPU devices in bfloat16: the
encoder's weights in every checkpoint are the initial checkpoint's. Prediction-only runs
and bad input run in this process through `run_ner.run`.
"""

import json
import os
import random
import sys

import numpy as np
import pytest
import tensorflow as tf
from seqeval import metrics as seqeval

from tests import forkserver
from tests import test_loop_support as S
from tests.clis import call_main
from tests.conftest import TINY_VOCAB, write_vocab

SEQ = 16
PEOPLE = ["dog", "cat"]
PLACES = ["home", "mat"]
OTHER = ["the", "a", "sat", "ran", "on", "in", "big", "red", "far", "away", "and", "to"]
LABELS = ["O", "I-LOC", "I-PER"]  # sorted, O first: what the runner infers


def _sentence(rng, length=None):
    """(word, tag) pairs: entities of one or two words, never two entities side by side."""
    out, target = [], length or rng.randint(4, 9)
    while len(out) < target:
        r = rng.random()
        if r < 0.2 and (not out or out[-1][1] == "O"):
            out += [(rng.choice(PEOPLE), "I-PER") for _ in range(rng.randint(1, 2))]
        elif r < 0.35 and (not out or out[-1][1] == "O"):
            out.append((rng.choice(PLACES), "I-LOC"))
        else:
            out.append((rng.choice(OTHER), "O"))
    return out[:target]


def write_conll(path, rng, documents, per_document, long_sentence=False, tags=True):
    with open(path, "w", encoding="utf-8") as f:
        for d in range(documents):
            f.write("-DOCSTART- -X- -X- O\n\n")
            for i in range(per_document):
                length = 32 if long_sentence and d == 0 and i == 1 else None
                for word, tag in _sentence(rng, length):
                    f.write(f"{word} NN I-NP {tag}\n" if tags else f"{word}\n")
                f.write("\n")
    return str(path)


def read_predictions(path):
    """Sentences of (word, gold, predicted); a -DOCSTART- line is a one-token sentence."""
    sentences, current = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                if current:
                    sentences.append(current)
                current = []
                continue
            current.append(tuple(line.split(" ")))
    assert not current, "the file must end with a blank line"
    return sentences


def read_conll_words(path):
    """Sentences of (word, tag) of an input file, -DOCSTART- lines as ("-DOCSTART-", "O")."""
    sentences, current = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            cols = line.split()
            if not cols:
                if current:
                    sentences.append(current)
                current = []
            elif cols[0] == "-DOCSTART-":
                sentences.append([("-DOCSTART-", "O")])
            else:
                current.append((cols[0], cols[-1] if len(cols) > 1 else "O"))
    if current:
        sentences.append(current)
    return sentences


def read_results(path):
    with open(path) as f:
        return {k: float(v) for k, v in (line.rstrip("\n").split(" = ") for line in f)}


def conlleval_by_seqeval(sentences, prefix="eval_"):
    """The eval_results figures recomputed from a prediction file by seqeval."""
    gold = [[t[1] for t in s] for s in sentences]
    pred = [[t[2] for t in s] for s in sentences]
    # zero_division=0: conlleval's 0 for a precision (recall) without predictions (gold).
    out = {f"{prefix}precision": seqeval.precision_score(gold, pred, zero_division=0),
           f"{prefix}recall": seqeval.recall_score(gold, pred, zero_division=0),
           f"{prefix}f1": seqeval.f1_score(gold, pred, zero_division=0),
           f"{prefix}accuracy": seqeval.accuracy_score(gold, pred)}
    report = seqeval.classification_report(gold, pred, output_dict=True, zero_division=0)
    for kind in ("PER", "LOC"):
        row = report.get(kind, {"precision": 0.0, "recall": 0.0, "f1-score": 0.0})
        out[f"{prefix}precision_{kind}"] = row["precision"]
        out[f"{prefix}recall_{kind}"] = row["recall"]
        out[f"{prefix}f1_{kind}"] = row["f1-score"]
    return out


def check_results_against_predictions(results_path, predictions_path, input_path, prefix):
    results = read_results(results_path)
    sentences = read_predictions(predictions_path)
    # Every word of the input, in order, with its gold tag as in the file.
    assert [[(t[0], t[1]) for t in s] for s in sentences] == read_conll_words(input_path)
    expected = conlleval_by_seqeval(sentences, prefix)
    assert set(results) == set(expected) | {f"{prefix}loss", "global_step"}
    for key, value in expected.items():
        assert results[key] == pytest.approx(value, abs=1e-9), key
    assert results[f"{prefix}loss"] > 0.0
    return results, sentences


# --- shared set-up ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Data, vocab, and tiny configs with TF1-layout checkpoints of random weights: 1
    layer for fine-tuning (``config``, ``tf1``: tagging these names is a word's identity,
    which one layer learns; what the fine-tuning tests prove does not depend on the depth,
    and a run's cost is mostly tracing its graph), 4 for the feature-based mode, whose
    feature layers read the last four (``feature_config``, ``feature_tf1``)."""
    import keras

    from modeling import checkpoints
    from modeling.config import BertConfig
    from modeling.models import BertPretrainer

    root = tmp_path_factory.mktemp("ner")
    rng = random.Random(0)
    data = root / "conll"
    data.mkdir()
    write_conll(data / "eng.train", rng, documents=4, per_document=15)
    write_conll(data / "eng.testa", rng, documents=2, per_document=5, long_sentence=True)
    write_conll(data / "eng.testb", rng, documents=2, per_document=5, long_sentence=True)
    vocab = write_vocab(root / "vocab.txt")
    keras.utils.set_random_seed(0)
    out = {"root": root, "data": str(data), "vocab": vocab}
    for prefix, layers in (("feature_", 4), ("", 1)):
        config_file = root / f"{prefix}bert_config.json"
        with open(config_file, "w") as f:
            json.dump({**S.tiny_config_dict(vocab_size=len(TINY_VOCAB)),
                       "num_hidden_layers": layers}, f)
        config = BertConfig.from_json_file(str(config_file))
        out.update({f"{prefix}config": str(config_file), f"{prefix}bert_config": config,
                    f"{prefix}tf1": checkpoints.export_tf1_checkpoint(
                        BertPretrainer(config), config, str(root / f"{prefix}tf1"),
                        vocab_file=vocab)})
    return out


def _argv(env, out, **flags):
    """run_ner.py's command line for the tiny data of `env` (flags replaced; None: a bool
    flag given bare; --seeds replaces --seed)."""
    values = dict(data_dir=env["data"], vocab_file=env["vocab"],
                  bert_config_file=env["config"], init_checkpoint=env["tf1"],
                  output_dir=str(out), max_seq_length=SEQ, do_train="true", do_eval="true",
                  do_predict="true", train_batch_size=4, eval_batch_size=4,
                  predict_batch_size=4, num_train_epochs=4.0, iterations_per_loop=5,
                  log_steps=5, seed=3)
    values.update(flags)
    if "seeds" in flags:
        del values["seed"]
    return [f"--{k}={v}" if v is not None else f"--{k}" for k, v in values.items()]


def run_cli(env, out, timeout=300, **flags):
    """run_ner.py with a TensorFlow runtime of its own: for a mirrored run over logical CPU
    devices, which must be configured before TensorFlow starts (tests/forkserver.py)."""
    cmd = [sys.executable, os.path.join(S.REPO_ROOT, "run_ner.py"), *_argv(env, out, **flags)]
    proc = forkserver.run(cmd, S.runner_env(), S.REPO_ROOT, timeout)
    return proc.returncode, proc.stdout + proc.stderr


def run_main(env, out, **flags):
    """run_ner.py's command in this process: its exit status and everything it wrote
    (stdout, stderr, the absl log lines)."""
    result = call_main("run_ner", _argv(env, out, **flags), cwd=S.REPO_ROOT)
    return result.code, result.stdout + result.stderr + result.log


@pytest.fixture(scope="module")
def finetuned(env):
    """The CLI run: seeds 3 and 4, the best seed's files in output_dir (``dir``); the best
    seed's best/ weights (``model``) are what the other tests read and export."""
    out = env["root"] / "finetuned"
    # 2e-3 learns the names from several random initial checkpoints (5e-3 for 90 steps
    # collapses to all-O on some: tried while writing this test). 45 steps: both seeds'
    # training accuracy is 1.0 by step 20 and their dev F1 1.0 after 30 steps (the run
    # took 90 until 2026-12-01; the steps are a small part of its time, the traces most).
    code, log = run_main(env, out, learning_rate=2e-3, num_train_epochs=3.0,
                         document_context=None, save_checkpoints_steps=1000, seeds="3,4",
                         keep_best_checkpoint=None)
    assert code == 0, log[-4000:]
    best = int(read_results(out / "seed_results.txt")["best_seed"])
    return {"dir": str(out), "log": log, "best": best,
            "model": str(out / f"seed_{best}" / "best")}


@pytest.fixture(scope="module")
def feature_based(env):
    out = env["root"] / "feature_based"
    code, log = run_cli(env, out, bert_config_file=env["feature_config"],
                        init_checkpoint=env["feature_tf1"], learning_rate=5e-3,
                        feature_based=None, do_predict="false",
                        feature_layers="weighted_sum_last_four", lstm_units=16,
                        distribution_strategy="mirrored", num_cpu_devices=2, dtype="bfloat16",
                        num_train_epochs=1.0, save_checkpoints_steps=7, keep_checkpoint_max=5)
    assert code == 0, log[-4000:]
    return {"dir": str(out), "log": log}


# --- fine-tuning through the CLI ----------------------------------------------------------


@pytest.mark.slow
def test_cli_trains_and_eval_results_equal_conlleval_of_dev_predictions(env, finetuned):
    out, log = finetuned["dir"], finetuned["log"]
    assert "Initialised from" in log and "tf1 checkpoint" in log
    assert "sentences longer than one window" in log
    results, _ = check_results_against_predictions(
        os.path.join(out, "eval_results.txt"), os.path.join(out, "dev_predictions.txt"),
        os.path.join(env["data"], "eng.testa"), "eval_")
    assert results["global_step"] == 45  # 60 sentences / 4 * 3 epochs
    assert results["eval_f1"] > 0.8, results  # the tiny model learned the names
    check_results_against_predictions(
        os.path.join(out, "test_results.txt"), os.path.join(out, "test_predictions.txt"),
        os.path.join(env["data"], "eng.testb"), "test_")


@pytest.mark.slow
def test_cli_predictions_equal_an_independent_forward_pass(env, finetuned):
    """One window at a time, unbucketed, from the run's checkpoint: each word's tag is the
    argmax at its first piece in the window that scores it."""
    from data_prep import tokenization
    from modeling import checkpoints
    from modeling.export.metadata import METADATA_FILE
    from modeling.models import BertTokenTagger
    from tasks.tagging import data as D
    from tasks.tagging.task import TaggingExportMetadata, model_from_metadata

    # export_metadata.json holds what rebuilding the model and decoding its tags need.
    with open(os.path.join(finetuned["model"], METADATA_FILE)) as f:
        metadata = TaggingExportMetadata.from_dict(json.load(f))
    assert (metadata.labels, metadata.tag_scheme, metadata.do_lower_case) == (
        tuple(LABELS), "IOB1", True)
    assert metadata.document_context and metadata.doc_stride == (SEQ - 2) // 2
    model = model_from_metadata(env["bert_config"], metadata)
    assert type(model) is BertTokenTagger
    assert checkpoints.load_pretrained(tf.train.latest_checkpoint(finetuned["model"]),
                                       model).ok  # strict: the head too
    conll = D.read_conll(os.path.join(env["data"], "eng.testa"))
    tokenizer = tokenization.FullTokenizer(env["vocab"], do_lower_case=True)
    config = D.WindowConfig(SEQ, document_context=True)
    tags = {}
    for window in D.sentence_windows(conll, tokenizer, LABELS, config, is_training=False):
        inputs = {k: tf.constant([getattr(window, k)], tf.int32)
                  for k in ("input_ids", "input_mask", "segment_ids")}
        logits = model(inputs, training=False)["logits"][0].numpy()
        for p in np.flatnonzero(window.label_weights):
            tags[(window.sentence_index, window.word_index[p])] = LABELS[logits[p].argmax()]
    written = [s for s in read_predictions(os.path.join(finetuned["dir"],
                                                        "dev_predictions.txt"))
               if s[0][0] != "-DOCSTART-"]
    long_sentence = max(range(len(written)), key=lambda i: len(written[i]))
    assert len(written[long_sentence]) == 32  # longer than a window, every word there
    assert [[t[2] for t in s] for s in written] == [
        [tags[(i, w)] for w in range(len(s))] for i, s in enumerate(written)]


# --- feature-based (Table 7) through the CLI ------------------------------------------------


@pytest.mark.slow
def test_cli_feature_based_trains_only_the_bilstm(env, feature_based):
    out, log = feature_based["dir"], feature_based["log"]
    assert "MirroredStrategy with 2 replica(s), dtype policy mixed_bfloat16" in log
    check_results_against_predictions(
        os.path.join(out, "eval_results.txt"), os.path.join(out, "dev_predictions.txt"),
        os.path.join(env["data"], "eng.testa"), "eval_")
    from modeling import checkpoints
    from modeling.models import BertFeatureTagger
    from tasks.tagging.task import TaggingExportMetadata, model_from_metadata

    paths = list(tf.train.get_checkpoint_state(out).all_model_checkpoint_paths)
    assert len(paths) == 3  # steps 7, 14 and 15

    with open(os.path.join(out, "export_metadata.json")) as f:
        metadata = TaggingExportMetadata.from_dict(json.load(f))
    assert (metadata.feature_based, metadata.feature_layers, metadata.lstm_units) == (
        True, "weighted_sum_last_four", 16)

    def arrays(path):  # every weight under its TF1-layout name (encoder: Google's names)
        model = model_from_metadata(env["feature_bert_config"], metadata)
        assert isinstance(model, BertFeatureTagger)
        assert checkpoints.load_pretrained(path, model).ok  # strict: the head too
        return checkpoints.tf1_arrays(model)

    init = tf.train.load_checkpoint(env["feature_tf1"])
    first, last = arrays(paths[0]), arrays(paths[-1])
    encoder = [n for n in first if n.startswith("bert/")]
    head = [n for n in first if n.startswith("feature_tagger/")]
    assert len(encoder) > 50 and len(head) == 2 + 2 * 2 * 3 + 2  # mix, 2 BiLSTMs, dense
    for name in encoder:  # frozen: exactly the initial checkpoint's values, at every step
        np.testing.assert_array_equal(first[name], init.get_tensor(name), err_msg=name)
        np.testing.assert_array_equal(last[name], init.get_tensor(name), err_msg=name)
    unchanged = [n for n in head if np.array_equal(first[n], last[n])]
    assert not unchanged, unchanged


# --- in-process runs: seeds, best checkpoint, predict-only, bad input ----------------------


def make(env, out, **overrides):
    import run_ner

    return run_ner.COMMAND.settings(**make_values(env, out, **overrides))


def make_values(env, out, **overrides):
    """`make`'s settings as keyword arguments named as the flags."""
    from training.execution import RuntimeConfig

    values = dict(data_dir=env["data"], vocab_file=env["vocab"],
                  bert_config_file=env["config"], output_dir=str(out), max_seq_length=SEQ,
                  do_train=True, do_eval=True, do_predict=False, train_batch_size=4,
                  eval_batch_size=4, predict_batch_size=4, learning_rate=5e-3,
                  num_train_epochs=2.0, save_checkpoints_steps=15, iterations_per_loop=5,
                  log_steps=5, runtime=RuntimeConfig("one_device", seed=1))
    values.update(overrides)
    return values


@pytest.mark.slow
def test_seeds_and_best_checkpoint_copy_the_best_dev_predictions(finetuned):
    """--seeds with --keep_best_checkpoint (the CLI run): the seed with the best dev F1 is
    named in seed_results.txt with every seed's figures, its files are output_dir's, and
    each seed kept its best weights and their figures in best/."""
    out = finetuned["dir"]
    summary = read_results(os.path.join(out, "seed_results.txt"))
    f1 = {seed: read_results(os.path.join(out, f"seed_{seed}", "eval_results.txt"))["eval_f1"]
          for seed in (3, 4)}
    assert summary["num_seeds"] == 2 and summary["best_seed"] == finetuned["best"]
    assert f1[finetuned["best"]] == max(f1.values())
    assert summary["eval_f1_seed_3"] == pytest.approx(f1[3])
    assert summary["eval_f1_mean"] == pytest.approx(np.mean(list(f1.values())))
    assert "eval_f1_PER_mean" in summary
    best_dir = os.path.join(out, f"seed_{finetuned['best']}")
    for name in ("dev_predictions.txt", "eval_results.txt", "test_predictions.txt"):
        with open(os.path.join(out, name)) as a, open(os.path.join(best_dir, name)) as b:
            assert a.read() == b.read(), name
    for seed in (3, 4):
        assert os.path.exists(os.path.join(out, f"seed_{seed}", "best", "eval_results.txt"))


@pytest.fixture(scope="module")
def predicted(env, finetuned, tmp_path_factory):
    """A prediction-only run (in this process) from the CLI run's best weights on a test
    file of words alone (no gold), sentence by sentence (no --document_context), its
    second sentence of 32 words (three windows); labels from --label_list."""
    import run_ner

    root = tmp_path_factory.mktemp("predicted")
    data = root / "raw"
    data.mkdir()
    test = write_conll(data / "test.txt", random.Random(5), 1, 4, long_sentence=True,
                       tags=False)
    out = root / "predict"
    result = run_ner.run(make(env, out, data_dir=str(data), do_train=False, do_eval=False,
                              do_predict=True, label_list=",".join(LABELS),
                              init_checkpoint=finetuned["model"], document_context=False))
    return {"data": str(data), "test": test, "out": out, "result": result}


@pytest.mark.slow
def test_predict_only_on_a_words_only_test_file(env, finetuned, predicted, tmp_path):
    """A test file with one column (no gold): predicted from the trained run's checkpoint;
    gold is "O"; labels from --label_list (no training file in that directory)."""
    import run_ner
    from tasks.tagging import data as D

    data = predicted["data"]
    with pytest.raises(D.DataFormatError, match="no train file.*give --label_list"):
        run_ner.run(make(env, tmp_path / "x", data_dir=data, do_train=False,
                         do_eval=False, do_predict=True))
    with pytest.raises(ValueError, match=r"is a tagging run whose feature_based=False, "
                                         r"feature_layers='', lstm_units=0 differ"):
        run_ner.run(make(env, tmp_path / "y", data_dir=data, do_train=False,
                         do_eval=False, do_predict=True, label_list=",".join(LABELS),
                         init_checkpoint=finetuned["model"], feature_based=True))
    assert [os.path.basename(p) for p in predicted["result"]["runs"][0]["outputs"]] == [
        "test_predictions.txt"]  # no gold: no test_results.txt
    sentences = read_predictions(predicted["out"] / "test_predictions.txt")
    assert [[(w, g) for w, g, _ in s] for s in sentences] == read_conll_words(
        predicted["test"])
    assert {p for s in sentences for _, _, p in s} <= set(LABELS)


def _bad_dir(tmp_path, env, name, edit):
    import shutil

    d = tmp_path / name
    shutil.copytree(env["data"], d)
    edit(d)
    return d


def _replace_line(path, number, text):
    lines = path.read_text(encoding="utf-8").split("\n")
    lines[number - 1] = text
    path.write_text("\n".join(lines), encoding="utf-8")


@pytest.mark.parametrize("case,edit,message", [
    ("columns", lambda d: _replace_line(d / "eng.train", 4, "dog NN I-PER"),
     r"eng.train:4: 3 columns, but the first word line \(3\) has 4"),
    ("unknown_tag", lambda d: _replace_line(d / "eng.testa", 3, "dog NN I-NP B-ORG"),
     r"eng.testa:3: tag 'B-ORG' is not in the label list"),
    ("empty_test", lambda d: (d / "eng.testb").write_text(""),
     r"eng.testb: no sentences"),
    ("missing_dev", lambda d: os.remove(d / "eng.testa"),
     r"no dev file; looked for dev.txt, valid.txt, eng.testa"),
])
def test_bad_input_fails_before_training(env, tmp_path, case, edit, message):
    import run_ner
    from tasks.tagging import data as D

    data = _bad_dir(tmp_path, env, case, edit)
    out = tmp_path / "out"
    with pytest.raises(D.DataFormatError, match=message):
        run_ner.run(make(env, out, data_dir=str(data), do_predict=True))
    assert not tf.io.gfile.glob(str(out / "ckpt-*")) and not (out / "train.tf_record").exists()


def test_cli_bad_input_exits_non_zero_naming_file_and_line(env, tmp_path):
    data = _bad_dir(tmp_path, env, "bad", lambda d: _replace_line(d / "eng.train", 4, "x O"))
    result = call_main("run_ner", _argv(env, tmp_path / "out", data_dir=str(data)))
    assert result.code == 1
    assert "run_ner.py: error:" in result.stderr, result.stderr[-2000:]
    assert "eng.train:4: 2 columns" in result.stderr, result.stderr[-2000:]
    result = call_main("run_ner", _argv(env, tmp_path / "out2", lstm_units=8))
    assert result.code == 1
    assert "--lstm_units only applies with --feature_based" in result.stderr


# --- modeling pieces: the loss, the feature-based model ------------------------------------


def test_tagging_loss_is_the_mean_over_first_pieces():
    from modeling import losses

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 7, 5)).astype(np.float32)
    labels = rng.integers(0, 5, (3, 7))
    weights = (rng.random((3, 7)) < 0.5).astype(np.int32)
    loss, stats = losses.tagging_loss(logits, labels, weights)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    assert float(loss) == pytest.approx((nll * weights).sum() / weights.sum(), rel=1e-5)
    assert float(stats["token_count"]) == weights.sum()
    correct = (logits.argmax(-1) == labels) * weights
    assert float(stats["correct_sum"]) == correct.sum()
    zero, _ = losses.tagging_loss(logits, labels, np.zeros_like(weights))
    assert float(zero) == 0.0


def test_feature_layers_equal_the_original_berts_activations(tmp_path):
    """The activations each Table 7 row feeds the BiLSTM, against Google's original graph
    (get_embedding_output, get_all_encoder_layers) with the same TF1 checkpoint."""
    from modeling import checkpoints
    from modeling.checkpoints import names as checkpoint_names
    from modeling.config import BertConfig
    from modeling.models import FEATURE_LAYERS, BertFeatureTagger
    from tests.test_modeling_reference import run_original_graph, tiny_config_dict, tiny_inputs

    config_dict = tiny_config_dict(num_hidden_layers=5)
    inputs = tiny_inputs(config_dict)
    prefix = str(tmp_path / "bert_model.ckpt")
    expected = run_original_graph(config_dict, inputs, save_to=prefix, with_heads=False)
    config = BertConfig.from_dict(config_dict)
    layers = expected["layers"]
    want = {"embeddings": expected["embedding"], "second_to_last_hidden": layers[-2],
            "last_hidden": layers[-1], "concat_last_four": np.concatenate(layers[-4:], -1),
            # ScalarMix starts as the plain mean (softmax of zeros, gamma 1).
            "weighted_sum_last_four": np.mean(layers[-4:], axis=0),
            "weighted_sum_all": np.mean(layers, axis=0)}
    for mode in FEATURE_LAYERS:
        model = BertFeatureTagger(config, 3, feature_layers=mode, lstm_units=4)
        report = checkpoints.load_pretrained(prefix, model, partial=True)
        assert len(report.missing) == len(checkpoint_names.feature_tagger_head(model))
        got = model.features({k: tf.constant(v) for k, v in inputs.items()}).numpy()
        assert got.shape == want[mode].shape, mode
        np.testing.assert_allclose(got, want[mode], atol=2e-5, err_msg=mode)
    mixed = BertFeatureTagger(config, 3, feature_layers="weighted_sum_all", lstm_units=4)
    checkpoints.load_pretrained(prefix, mixed, partial=True)
    mixed.mix.mix_weights.assign(np.arange(5, dtype=np.float32))
    mixed.mix.gamma.assign(2.0)
    weights = 2.0 * np.exp(np.arange(5)) / np.exp(np.arange(5)).sum()
    np.testing.assert_allclose(
        mixed.features({k: tf.constant(v) for k, v in inputs.items()}).numpy(),
        np.tensordot(weights, np.stack(layers), axes=1), atol=2e-5)
    with pytest.raises(ValueError, match="needs at least 4 hidden layers; the model has 2"):
        BertFeatureTagger(BertConfig.from_dict(tiny_config_dict()), 3)


def test_feature_tagger_offers_only_its_head_to_training_and_round_trips(tmp_path):
    """The encoder's weights are not trainable: only the head's are (that training then
    moves the head alone, its encoder staying the initial checkpoint's at every step, under
    MirroredStrategy in bfloat16: test_cli_feature_based_trains_only_the_bilstm). The
    weight table round trip (TF1 layout, strict) and the Keras config round trip."""
    from modeling import checkpoints
    from modeling.config import BertConfig
    from modeling.models import BertFeatureTagger

    config = BertConfig.from_dict(S.tiny_config_dict(dropout=0.1))
    model = BertFeatureTagger(config, 3, feature_layers="last_hidden", lstm_units=8)
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(5, 60, (4, SEQ)).astype(np.int32),
             "input_mask": np.ones((4, SEQ), np.int32),
             "segment_ids": np.zeros((4, SEQ), np.int32)}
    model(batch)
    encoder_ids = {id(v) for v in model.encoder.weights}
    assert model.encoder.weights and model.trainable_variables
    assert not any(id(v) in encoder_ids for v in model.trainable_variables)
    out = checkpoints.export_tf1_checkpoint(model, config, str(tmp_path / "tf1"))
    again = BertFeatureTagger(config, 3, feature_layers="last_hidden", lstm_units=8)
    assert checkpoints.load_pretrained(out, again).ok
    np.testing.assert_allclose(again(batch)["logits"], model(batch)["logits"], atol=1e-6)
    restored = BertFeatureTagger.from_config(model.get_config())
    assert restored.get_config() == model.get_config()
    assert not restored.encoder.trainable


@pytest.mark.slow
def test_exported_run_serves_the_runners_tags_from_raw_text(finetuned, predicted, tmp_path,
                                                            capsys):
    """export_saved_model.py --model_type=tagger on the CLI run's directory (config, vocab,
    labels and windows from beside the checkpoint), served by predict_saved_model.py's main
    (in this process; a tagger export served by it as a process of its own, tensorflow +
    tensorflow_text only: tests/test_export_tagger.py) on each sentence of a test file as raw text:
    every word's tag equals the runner's prediction from the same checkpoint (`predicted`),
    the 32-word sentence (three windows) included; the entities are conlleval's chunks of
    those tags. The runner predicts sentence by sentence there (no --document_context), as
    the export serves one text at a time."""
    import predict_saved_model
    from tasks.tagging import metrics

    sentences = [s for s in read_predictions(predicted["out"] / "test_predictions.txt")
                 if s[0][0] != "-DOCSTART-"]
    assert max(len(s) for s in sentences) == 32
    export_dir, out_json = tmp_path / "export", tmp_path / "served.json"
    result = call_main("export_saved_model", model_type="tagger",
                       init_checkpoint=finetuned["model"], export_dir=export_dir)
    assert result.code == 0, (result.stderr + result.log)[-3000:]
    capsys.readouterr()
    assert predict_saved_model.main(
        [f"--export_dir={export_dir}", f"--output_json={out_json}"]
        + [f"--text={' '.join(w for w, _, _ in s)}" for s in sentences]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    served = json.loads(out_json.read_text(encoding="utf-8"))["predictions"]
    assert len(served) == len(sentences) == len(lines)
    for row, sentence in zip(served, sentences, strict=True):
        assert row["word_text"] == [w for w, _, _ in sentence]
        assert row["word_tag"] == [p for _, _, p in sentence]
        chunks = metrics.chunks([p for _, _, p in sentence])
        assert [(t, s, e) for t, s, e in zip(row["entity_type"], row["entity_word_start"],
                                             row["entity_word_end"], strict=True)] == [
            (kind, first, last + 1) for kind, first, last in chunks]  # end exclusive
    assert any(row["entity_type"] for row in served)  # the trained model finds names


def test_gradient_accumulation_with_length_buckets_equals_the_whole_batch(env, tmp_path):
    """Issue 38 #11: --gradient_accumulation_steps=2 with length buckets crashed (the
    batch's length is known only at run time). The loss is a mean over the tagged words
    of the batch, so micro-batches average to it when each tags as many words: sentences
    of 5 words here; two micro-batches of 2 then give the gradients of the batch of 4."""
    import run_ner

    rng = random.Random(4)
    data = tmp_path / "data"
    data.mkdir()
    with open(data / "train.txt", "w", encoding="utf-8") as f:
        for _ in range(8):
            f.write("".join(f"{word} {tag}\n" for word, tag in _sentence(rng, 5)) + "\n")
    whole, accumulated, batch = S.accumulated_and_whole_gradients(
        run_ner.COMMAND, **make_values(env, tmp_path / "out", data_dir=str(data),
                                       do_eval=False, bucket_boundaries=(8, SEQ)))
    assert batch["label_weights"].sum(axis=1).tolist() == [5] * 4
    S.assert_same_gradients(whole, accumulated)
