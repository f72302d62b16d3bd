"""The BERT paper's pretraining studies on the model side: Table 5's objectives (No NSP,
left-to-right LM, + BiLSTM), Table 6's perplexity, the causal encoder option through its
config, losses, loop figures and run_pretraining's refusals (in-process); the runners end
to end (pretraining, SQuAD fine-tuning with a BiLSTM, export) in the slow tests.
"""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from modeling import losses
from modeling.config import BertConfig, ConfigError
from modeling.encoder import BertEncoder
from modeling.models import BertPretrainer, BertSpanLabeler
from tests import test_loop_support as S
from tests.clis import call_main
from training import pretraining, trainer_setup
from tests.test_loop_support import read_eval_results

GOOGLE_KEYS = ["attention_probs_dropout_prob", "hidden_act", "hidden_dropout_prob",
               "hidden_size", "initializer_range", "intermediate_size",
               "max_position_embeddings", "num_attention_heads", "num_hidden_layers",
               "type_vocab_size", "vocab_size"]


def tiny(causal=False, **changes):
    return BertConfig(**dict(S.tiny_config_dict(vocab_size=60), causal_attention=causal,
                             **changes))


def batch(seed=0, length=12, real=(12, 8)):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 60, size=(len(real), length)).astype(np.int32)
    mask = np.zeros_like(ids)
    for row, n in enumerate(real):
        mask[row, :n] = 1
    ids = ids * mask
    return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)}


# ------------------------------------------------------------------ the causal encoder


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_a_causal_encoder_reads_only_the_left(causal):
    """Changing the tokens after position i leaves every output at positions <= i as it
    was with causal_attention, and changes them without (the test can fail)."""
    keras.utils.set_random_seed(1)
    encoder = BertEncoder(tiny(causal))
    inputs = batch()
    changed = {k: v.copy() for k, v in inputs.items()}
    i = 5
    changed["input_ids"][:, i + 1:] = np.where(inputs["input_mask"][:, i + 1:] > 0,
                                               (inputs["input_ids"][:, i + 1:] + 7) % 55 + 5, 0)
    a, b = encoder(inputs)["sequence_output"], encoder(changed)["sequence_output"]
    left = np.abs(a[:, :i + 1] - b[:, :i + 1]).max()
    assert np.abs(a[:, i + 1:] - b[:, i + 1:]).max() > 1e-3
    if causal:
        assert left == 0.0
    else:
        assert left > 1e-3


def test_a_causal_encoder_pools_the_last_real_token():
    """[CLS] sees only itself under a left-only mask: the pooler reads the last real
    token instead (the only one that has seen the whole input); padding changes nothing."""
    keras.utils.set_random_seed(2)
    encoder = BertEncoder(tiny(True))
    inputs = batch(real=(12, 8))
    out = encoder(inputs)
    sequence = out["sequence_output"].numpy()
    expected = np.tanh(np.stack([sequence[0, 11], sequence[1, 7]])
                       @ encoder.pooler.kernel.numpy() + encoder.pooler.bias.numpy())
    np.testing.assert_allclose(out["pooled_output"].numpy(), expected, rtol=1e-5, atol=1e-6)
    longer = {k: np.pad(v, [(0, 0), (0, 4)]) for k, v in inputs.items()}
    np.testing.assert_allclose(encoder(longer)["pooled_output"].numpy(),
                               out["pooled_output"].numpy(), rtol=1e-5, atol=1e-6)


def test_the_causal_key_is_written_only_when_true(tmp_path):
    """A default bert_config.json keeps exactly Google's keys (byte for byte the file it
    was); causal_attention: true is written, read back, kept in Keras configs and mapped
    to Hugging Face's is_decoder; a non-boolean value is refused naming the key."""
    default = tiny()
    assert sorted(json.loads(default.to_json_string())) == GOOGLE_KEYS
    assert "causal_attention" not in BertEncoder(default).get_config()["config"]
    causal = tiny(True)
    path = tmp_path / "bert_config.json"
    causal.to_json_file(str(path))
    assert json.loads(path.read_text())["causal_attention"] is True
    assert BertConfig.from_json_file(str(path)) == causal
    assert BertEncoder.from_config(BertEncoder(causal).get_config()).config == causal
    hf = causal.to_hf_dict()
    assert hf["is_decoder"] is True and "causal_attention" not in hf
    assert BertConfig.from_hf_config(hf) == causal
    assert "is_decoder" not in default.to_hf_dict()
    with pytest.raises(ConfigError, match="causal_attention"):
        BertConfig.from_dict(dict(default.to_dict(), causal_attention="yes"))


@pytest.mark.parametrize("causal", [True, False], ids=["ltr", "bidirectional"])
def test_an_ltr_model_written_for_another_ecosystem_says_what_that_code_computes(
        causal, tmp_path, caplog):
    """Google's layout and Hugging Face's hold an LTR model's weights exactly (converted
    back, the outputs are ours), but Google's modeling.py ignores causal_attention and
    Hugging Face's pooler reads the first token: writing either warns, naming the folder; a
    bidirectional model writes without a word."""
    import logging

    from modeling import checkpoints

    keras.utils.set_random_seed(3)
    encoder = BertEncoder(tiny(causal))
    inputs = batch()
    expected = encoder(inputs)
    with caplog.at_level(logging.WARNING, logger="absl"):
        checkpoints.export_tf1_checkpoint(encoder, encoder.config, str(tmp_path / "tf1"))
        checkpoints.convert(str(tmp_path / "tf1"), str(tmp_path / "hf"), "hf")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    back = BertEncoder(BertConfig.from_config_file(str(tmp_path / "hf" / "config.json")))
    checkpoints.load_pretrained(str(tmp_path / "hf"), back)
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_allclose(back(inputs)[key].numpy(), expected[key].numpy(),
                                   rtol=1e-5, atol=1e-6, err_msg=key)
    if not causal:
        assert warnings == [] and "is_decoder" not in hf_config
        return
    assert hf_config["is_decoder"] is True
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith(f"{tmp_path / 'tf1'}: ")
    assert "Google's modeling.py ignores the key" in warnings[0]
    assert warnings[1].startswith(f"{tmp_path / 'hf'}: ")
    assert "BertPooler reads the FIRST token" in warnings[1] and "pooler_output" in warnings[1]


# -------------------------------------------------------------- objectives and losses


def test_pretrainer_heads_per_objective():
    """No NSP has no next-sentence weights or output; LTR predicts every position through
    the same tied LM head (checkpoint names cls/predictions); wrong combinations refused."""
    from modeling.checkpoints import weight_table

    inputs = dict(batch(), masked_lm_positions=np.array([[1, 2], [3, 4]], np.int32))
    full = BertPretrainer(tiny())
    no_nsp = BertPretrainer(tiny(), next_sentence_prediction=False)
    ltr = BertPretrainer(tiny(True), next_sentence_prediction=False, objective="ltr")
    assert sorted(full(inputs)) == ["masked_lm_logits", "next_sentence_logits"]
    assert sorted(no_nsp(inputs)) == ["masked_lm_logits"]
    assert len(full.weights) - len(no_nsp.weights) == 2  # the NSP dense kernel and bias
    assert ltr(inputs)["next_token_logits"].shape == (2, 12, 60)
    names = [entry.tf1_name for entry in weight_table(ltr)]
    assert "cls/predictions/output_bias" in names
    assert not any("seq_relationship" in name for name in names)
    assert not any("seq_relationship" in e.tf1_name for e in weight_table(no_nsp))
    rebuilt = BertPretrainer.from_config(ltr.get_config())
    assert (rebuilt.objective, rebuilt.next_sentence_prediction) == ("ltr", False)
    with pytest.raises(ValueError, match="causal_attention"):
        BertPretrainer(tiny(), next_sentence_prediction=False, objective="ltr")
    with pytest.raises(ValueError, match="both sides"):
        BertPretrainer(tiny(True))
    with pytest.raises(ValueError, match="no next sentence"):
        BertPretrainer(tiny(True), objective="ltr")


def test_next_token_loss_matches_numpy():
    """Position t predicts token t + 1 where both are real: mean cross-entropy over those."""
    rng = np.random.default_rng(3)
    inputs = batch(real=(12, 5))
    logits = rng.normal(size=(2, 12, 60)).astype(np.float32)
    loss, stats = losses.next_token_loss({"next_token_logits": tf.constant(logits)}, inputs)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll, correct = [], 0
    for row, n in enumerate((12, 5)):
        for t in range(n - 1):
            target = inputs["input_ids"][row, t + 1]
            nll.append(-log_probs[row, t, target])
            correct += int(np.argmax(logits[row, t]) == target)
    assert stats["lm_count"].numpy() == len(nll) == 11 + 4
    assert float(loss) == pytest.approx(np.mean(nll), rel=1e-5)
    assert float(stats["lm_nll_sum"]) == pytest.approx(np.sum(nll), rel=1e-5)
    assert stats["lm_correct_sum"].numpy() == correct


def test_masked_lm_alone_is_the_masked_lm_loss():
    rng = np.random.default_rng(4)
    outputs = {"masked_lm_logits": tf.constant(rng.normal(size=(2, 3, 60)), tf.float32)}
    features = {"masked_lm_ids": np.array([[5, 6, 7], [8, 9, 0]]),
                "masked_lm_weights": np.array([[1, 1, 1], [1, 1, 0]], np.float32),
                "next_sentence_labels": np.array([[0], [1]])}
    loss, stats = losses.pretraining_loss(outputs, features)
    mlm, _ = losses.masked_lm_loss(outputs["masked_lm_logits"], features["masked_lm_ids"],
                                   features["masked_lm_weights"])
    assert float(loss) == float(mlm) and sorted(stats) == sorted(pretraining.MLM_STAT_KEYS)


def test_eval_figures_per_objective():
    """Perplexity is exp of the mean loss over predicted tokens (Table 6's "LM (ppl)");
    without NSP no next-sentence figure; LTR reports next-token figures only."""
    mlm = {"loss": 6.0, "mlm_loss": 4.0, "mlm_nll_sum": 20.0, "mlm_correct_sum": 2.0,
           "mlm_weight_sum": 10.0, "steps": 2.0}
    no_nsp = pretraining.PretrainingTask(next_sentence_prediction=False)
    figures = no_nsp.metrics_from_totals(mlm, 7)
    assert sorted(figures) == ["global_step", "loss", "masked_lm_accuracy", "masked_lm_loss",
                               "masked_lm_perplexity"]
    assert figures["masked_lm_perplexity"] == pytest.approx(math.exp(2.0))
    assert [label for _, label, _ in no_nsp.progress(mlm)] == ["mlm_acc"]
    ltr = pretraining.PretrainingTask(objective="ltr")
    assert ltr.stat_keys == pretraining.LTR_STAT_KEYS and not ltr.next_sentence_prediction
    figures = ltr.metrics_from_totals({"loss": 3.0, "lm_nll_sum": 30.0, "lm_correct_sum": 5.0,
                                       "lm_count": 20.0, "steps": 1.0}, 3)
    assert figures == {"global_step": 3, "loss": 3.0, "next_token_accuracy": 0.25,
                       "next_token_loss": 1.5, "next_token_perplexity": math.exp(1.5)}
    assert sorted(ltr.model_inputs(dict(batch(), masked_lm_positions=1))) == [
        "input_ids", "input_mask", "segment_ids"]


# -------------------------------------------------------------------------- + BiLSTM


def test_span_labeler_with_a_bilstm_sees_the_right_context():
    """The "+ BiLSTM" SQuAD model on a causal encoder: a randomly initialised BiLSTM
    between encoder and span layer, so a start logit depends on later tokens (its
    backward direction) even though the encoder's outputs do not; its weights have
    checkpoint names of their own, and its Keras config rebuilds it."""
    from modeling.checkpoints import weight_table

    keras.utils.set_random_seed(5)
    model = BertSpanLabeler(tiny(True), bilstm_units=8)
    inputs = batch()
    changed = {k: v.copy() for k, v in inputs.items()}
    changed["input_ids"][0, 10] = 9 if inputs["input_ids"][0, 10] != 9 else 10
    a, b = model(inputs)["start_logits"].numpy(), model(changed)["start_logits"].numpy()
    assert np.abs(a[0, :10] - b[0, :10]).max() > 1e-6
    np.testing.assert_array_equal(a[1], b[1])
    assert [w.shape for w in model.span.weights] == [(16, 2), (2,)]
    names = [entry.tf1_name for entry in weight_table(model)]
    assert "squad_bilstm/bilstm/backward/kernel" in names
    assert BertSpanLabeler.from_config(model.get_config()).bilstm_units == 8
    assert BertSpanLabeler(tiny()).bilstm is None


# ----------------------------------------------------------- refusals before any work


def test_fine_tuning_refuses_the_other_attention_direction(tmp_path):
    """An LTR checkpoint (its bert_config.json says causal) fine-tuned with a bidirectional
    config, or the reverse, is refused naming both; the same direction passes."""
    run = tmp_path / "ltr_run"
    run.mkdir()
    tiny(True).to_json_file(str(run / "bert_config.json"))
    trainer_setup.check_attention_of(str(run / "ckpt-10"), tiny(True))
    with pytest.raises(ValueError, match=r"left-to-right.*bidirectional encoder"):
        trainer_setup.check_attention_of(str(run), tiny())
    google = tmp_path / "google"
    google.mkdir()
    (google / "run_identity.json").write_text(json.dumps({"bert_config": tiny().to_dict()}))
    trainer_setup.check_attention_of(str(google / "bert_model.ckpt"), tiny())
    with pytest.raises(ValueError, match="is a bidirectional model"):
        trainer_setup.check_attention_of(str(google / "bert_model.ckpt"), tiny(True))
    trainer_setup.check_attention_of(str(tmp_path / "nothing_beside"), tiny(True))


BASE_ARGV = ["--input_file=x.tfrecord", "--bert_config_file=c", "--output_dir=o",
             "--do_train"]


def _config_from(*argv):
    """run_pretraining's run config from a command line, in this process."""
    from absl import flags

    import run_pretraining

    try:
        flags.FLAGS(["run_pretraining.py", *BASE_ARGV, *argv])
        return run_pretraining.run_config_from_flags(flags.FLAGS)
    finally:
        flags.FLAGS.unparse_flags()


@pytest.mark.parametrize("argv, message", [
    (["--objective=ltr", "--next_sentence_prediction=true"], "--next_sentence_prediction"),
    (["--objective=ltr", "--vocab_file=v"], "--vocab_file only applies with --objective=mlm "
                                            "(--objective=ltr masks nothing"),
    (["--objective=ltr", "--mask_token_rate=0.5"], "--mask_token_rate"),
    (["--mask_token_rate=0.9", "--random_token_rate=0.2"], "is more than 1"),
    (["--random_token_rate=-0.1"], "--random_token_rate=-0.1 must be a number in"),
    (["--phase2_max_seq_length=256"], "only applies with --phase2_input_file"),
    (["--phase2_input_file=y", "--num_train_steps=10", "--phase1_steps=10"],
     "--phase1_steps=10 must be"),
], ids=["ltr_nsp", "ltr_vocab", "ltr_rate", "rates_sum", "rate_range", "phase2_alone",
        "phase1_steps"])
def test_run_pretraining_refuses_what_cannot_be_meant(argv, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        _config_from(*argv)


def test_run_pretraining_reads_the_studies_flags():
    cfg = _config_from("--objective=ltr")
    assert (cfg.objective, cfg.next_sentence_prediction) == ("ltr", False)
    cfg = _config_from("--next_sentence_prediction=false", "--vocab_file=v",
                       "--mask_token_rate=0", "--random_token_rate=1")
    assert (cfg.next_sentence_prediction, cfg.mask_token_rate, cfg.random_token_rate) == (
        False, 0.0, 1.0)
    cfg = _config_from("--phase2_input_file=a,b", "--num_train_steps=100")
    assert cfg.phase2.input_patterns == ("a", "b") and cfg.phase2.start_step == 90
    assert (cfg.phase2.max_seq_length, cfg.phase2.max_predictions_per_seq,
            cfg.phase2.train_batch_size) == (512, 80, 32)
    assert _config_from().phase2 is None and _config_from().objective == "mlm"


# ------------------------------------------------------------ the runners, end to end


# The tiny runs of the objectives that this module and test_pretraining_outputs both
# read: built once per session (conftest `built_once`).
STUDIES_RUN_FLAGS = dict(
    max_seq_length=S.SEQ, max_predictions_per_seq=S.PREDS, train_batch_size=8,
    eval_batch_size=8, learning_rate=1e-3, num_train_steps=6, num_warmup_steps=2,
    iterations_per_loop=3, log_steps=3, save_checkpoints_steps=6, max_eval_steps=2, seed=1,
    do_train="true", do_eval="true")


def studies_flags(config, out, **changes):
    """run_pretraining's flags of a studies run (6 steps, progress at 3 and 6, one
    checkpoint, two eval batches) with `config` into `out`; an LTR run (it predicts every
    token) without --max_predictions_per_seq, which it refuses."""
    flags = dict(STUDIES_RUN_FLAGS, bert_config_file=config, output_dir=str(out))
    flags.update(changes)
    if flags.get("objective") == "ltr":
        del flags["max_predictions_per_seq"]
    return flags


def _build_studies(root):
    import pathlib

    from tests import test_run_squad
    from tests.conftest import TINY_VOCAB

    root = pathlib.Path(root)
    no_nsp = ["--next_sentence_prediction=false"]
    S.make_records_with_cli(root / "masked", extra=no_nsp)
    S.make_records_with_cli(root / "unmasked", extra=no_nsp + ["--dynamic_masking"])
    S.make_records_with_cli(root / "pairs", dupe_factor=1, extra=["--dynamic_masking"])
    S.make_records_with_cli(root / "masked_pairs", dupe_factor=1)
    config = S.write_config(root / "bert_config.json", vocab_size=max(
        len(test_run_squad._vocab_tokens()), len(TINY_VOCAB)))
    for name, changes in (
            ("ltr", dict(input_file=str(root / "unmasked" / "records.tfrecord-*"),
                         objective="ltr")),
            ("no_nsp", dict(input_file=str(root / "masked" / "records.tfrecord-*"),
                            next_sentence_prediction="false"))):
        code, log = S.run_runner(**studies_flags(config, root / name, **changes))
        assert code == 0, log[-4000:]
        (root / f"{name}.log").write_text(log, encoding="utf-8")


def studies_runs(tmp_path_factory):
    """create_pretraining_data's records without next-sentence pairs, masked and unmasked
    (--dynamic_masking), and with pairs (dupe_factor 1) unmasked and masked; a tiny config
    (vocab_size: the pretraining and the SQuAD test vocabularies both fit); and two
    run_pretraining runs of it in this process (`studies_flags`): the left-to-right LM
    (`--objective=ltr`) on the unmasked records and the masked LM alone
    (`--next_sentence_prediction=false`) on the masked ones, each with its output (LOG
    file beside it). Built once per session; read only."""
    from tests.conftest import built_once

    root = built_once(tmp_path_factory, "test_pretraining_objectives-studies",
                      _build_studies)
    glob_of = {name: str(root / name / "records.tfrecord-*")
               for name in ("masked", "unmasked", "pairs", "masked_pairs")}
    return dict(glob_of, root=root, vocab=str(root / "masked" / "vocab.txt"),
                config=str(root / "bert_config.json"), ltr=root / "ltr",
                ltr_log=(root / "ltr.log").read_text(encoding="utf-8"),
                no_nsp=root / "no_nsp",
                no_nsp_log=(root / "no_nsp.log").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    """Records made without next-sentence pairs (B always follows A), masked and unmasked
    (--dynamic_masking), and unmasked pairs, by create_pretraining_data; a config whose
    vocabulary covers both the pretraining and the SQuAD test vocabularies; the LTR run
    and the masked-LM-alone run of them (`studies_runs`: built once per session, shared
    with test_pretraining_outputs; read only)."""
    from tests import test_run_squad as Q

    return dict(studies_runs(tmp_path_factory), squad_tokens=Q._vocab_tokens())


def _pretrain_flags(studies, out, **changes):
    return studies_flags(studies["config"], out, **changes)


def _pretrain(studies, out, **changes):
    return S.run_runner(**_pretrain_flags(studies, out, **changes))


@pytest.mark.slow
def test_no_nsp_runs_report_no_next_sentence_figures(studies, tmp_path):
    """--next_sentence_prediction=false on masked records and, with dynamic masking at
    another Table 8 split, on unmasked ones: the masked LM's figures and perplexity, no
    next-sentence figure anywhere; NSP asked of records without pairs is refused naming
    the flag, and the LTR model of pair records too."""
    # The static run is the shared one (`studies_runs`: these flags on
    # the masked records); the dynamic one runs here.
    rc, log = _pretrain(studies, tmp_path / "dynamic", next_sentence_prediction="false",
                        input_file=studies["unmasked"], vocab_file=studies["vocab"],
                        mask_token_rate=1.0, random_token_rate=0.0)
    assert rc == 0, log[-4000:]
    runs_ = {"static": (studies["no_nsp"], studies["no_nsp_log"]),
             "dynamic": (tmp_path / "dynamic", log)}
    for name, (out, log) in runs_.items():
        results = read_eval_results(out / "eval_results.txt")
        assert sorted(results) == ["global_step", "loss", "masked_lm_accuracy",
                                   "masked_lm_loss", "masked_lm_perplexity"], name
        assert results["masked_lm_perplexity"] == pytest.approx(
            math.exp(results["masked_lm_loss"]))
        progress = S.parse_progress(log)
        assert [step for step, _, _ in progress] == [3, 6]
        assert all(list(accs) == ["mlm_acc"] for _, _, accs in progress), progress
        assert "nsp_acc" not in log
    result = call_main("run_pretraining", **_pretrain_flags(studies, tmp_path / "nsp",
                                                            input_file=studies["masked"]))
    assert result.code == 1, result.stderr[-3000:]
    assert "--next_sentence_prediction=false" in result.stderr, result.stderr[-3000:]
    result = call_main("run_pretraining", **_pretrain_flags(
        studies, tmp_path / "ltr_pairs", input_file=studies["pairs"], objective="ltr"))
    assert result.code == 1, result.stderr[-3000:]
    assert "--objective=ltr reads contiguous text" in result.stderr, result.stderr[-3000:]


@pytest.mark.slow
def test_ltr_model_fine_tuned_with_a_bilstm_exports_and_serves(studies, tmp_path):
    """--objective=ltr: a causal model (its bert_config.json says so beside the
    checkpoints) with next-token figures; run_squad --bilstm_units on it with that config
    (the bidirectional one is refused), the export of that run (the BiLSTM and the causal
    mask included) serves the runner's answers."""
    from tests import test_run_squad as Q
    from tests.conftest import write_vocab

    ltr, log = studies["ltr"], studies["ltr_log"]  # these flags with --objective=ltr
    saved = json.loads((ltr / "bert_config.json").read_text())
    assert saved["causal_attention"] is True
    results = read_eval_results(ltr / "eval_results.txt")
    assert sorted(results) == ["global_step", "loss", "next_token_accuracy",
                               "next_token_loss", "next_token_perplexity"]
    assert [list(accs) for _, _, accs in S.parse_progress(log)] == [["lm_acc"]] * 2

    import random

    rng = random.Random(0)
    rows = json.loads(open(studies["config"]).read())["vocab_size"]  # the table's rows
    tokens = studies["squad_tokens"]
    vocab = write_vocab(tmp_path / "vocab.txt", tokens + [
        f"[unused{i}]" for i in range(1000, 1000 + rows - len(tokens))])
    train = Q.write_squad(tmp_path / "train.json", rng, "1.1", 4)
    dev = Q.write_squad(tmp_path / "dev.json", rng, "1.1", 2, dev=True)

    def squad(out, config):
        flags = dict(vocab_file=vocab, bert_config_file=config, output_dir=out,
                     init_checkpoint=ltr, train_file=train, predict_file=dev,
                     do_train="true", do_predict="true", max_seq_length=Q.SEQ,
                     doc_stride=Q.STRIDE, max_query_length=Q.QUERY, train_batch_size=4,
                     predict_batch_size=4, learning_rate=3e-3, num_train_epochs=2.0,
                     iterations_per_loop=4, log_steps=4, seed=3, n_best_size=20,
                     bilstm_units=8, distribution_strategy="one_device")
        result = call_main("run_squad", **flags)
        return result.code, "\n".join([result.stdout, result.stderr, result.log])

    rc, log = squad(tmp_path / "refused", studies["config"])
    assert rc != 0 and "is a left-to-right (causal_attention: true) model" in log, log[-3000:]
    out = tmp_path / "squad"
    rc, log = squad(out, ltr / "bert_config.json")
    assert rc == 0, log[-4000:]
    assert json.loads((out / "bert_config.json").read_text())["causal_attention"] is True
    assert json.loads((out / "export_metadata.json").read_text())["bilstm_units"] == 8

    predictions = json.loads((out / "predictions.json").read_text())
    questions = []
    for article in json.loads(open(dev).read())["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                questions.append((qa["id"], qa["question"], paragraph["context"]))
    flags = []
    for _, question, context in questions:
        flags += [f"--question={question}", f"--context={context}"]
    document, _ = S.export_and_serve("squad", str(out), str(tmp_path), flags)
    served = [row["answer_text"] for row in document["predictions"]]
    # The export answers "" where the original's post-processing says "empty" (no
    # candidate span; docs/export.md).
    expected = [{"empty": ""}.get(predictions[qid], predictions[qid])
                for qid, _, _ in questions]
    assert served == expected, predictions
    assert any(served), predictions
