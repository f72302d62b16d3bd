"""What a pretraining run writes, used as a user uses it (issue 30): a tiny left-to-right
(`--objective=ltr`) and a No NSP run of `run_pretraining.main` in this process (shared
with test_pretraining_objectives: its `studies_runs`), converted
to every checkpoint format and used as `--init_checkpoint` with a config of the other
attention direction; and the runner's refusals of what it would ignore, misread or
report from nothing (flags checked in-process, before any work).
"""

import json
import logging
import math
import re

import numpy as np
import pytest
from absl import flags

from modeling import checkpoints
from modeling.checkpoints import loading
from modeling.config import BertConfig
from modeling.models import BertPretrainer
from tests import test_loop_support as S
from tests.clis import call_main
from training import pretraining, trainer_setup
from tests.test_loop_support import read_eval_results

# The flags of the runs refused before any work (the runs read:
# test_pretraining_objectives.studies_runs).
RUN_FLAGS = dict(max_seq_length=S.SEQ, train_batch_size=8, eval_batch_size=8,
                 num_train_steps=4, num_warmup_steps=1, iterations_per_loop=2, log_steps=2,
                 save_checkpoints_steps=4, max_eval_steps=2, seed=1, learning_rate=1e-3,
                 do_train="true", do_eval="true", distribution_strategy="one_device")


def pretrain(**values):
    """run_pretraining.main in this process: bad input raises SystemExit(message)."""
    import run_pretraining

    argv = ["run_pretraining.py"] + [f"--{key}={value}" for key, value in values.items()]
    try:
        flags.FLAGS(argv)
        run_pretraining.main(argv)
    finally:
        flags.FLAGS.unparse_flags()


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """create_pretraining_data's records without next-sentence pairs, unmasked (for the
    LTR LM) and masked (for the masked LM alone), masked records with pairs, a tiny
    config, and the two runs of them: test_pretraining_objectives.studies_runs (built
    once per session, shared with test_pretraining_objectives; read only)."""
    from tests.test_pretraining_objectives import studies_runs

    runs = studies_runs(tmp_path_factory)
    return dict(runs, pairs=runs["masked_pairs"])


@pytest.fixture(scope="module")
def ltr_run(records):
    """A tiny `--objective=ltr` run of run_pretraining.main in this process, on the
    unmasked records (test_pretraining_objectives.studies_flags: 6 steps, one checkpoint)."""
    return records["ltr"]


@pytest.fixture(scope="module")
def no_nsp_run(records):
    """A tiny `--next_sentence_prediction=false` run of run_pretraining.main in this
    process, on the masked records (test_pretraining_objectives.studies_flags)."""
    return records["no_nsp"]


def _weights(path, config, **objective):
    """{weight path: value} of a pretrainer with `objective`'s heads loaded, strictly,
    from the checkpoint at `path` (every weight it has, nothing more)."""
    model = BertPretrainer(config, **objective)
    pretraining.build_pretraining_model(model, S.SEQ, S.PREDS)
    checkpoints.load_pretrained(str(path), model)
    return {weight.path.split("/", 1)[1]: weight.numpy() for weight in model.weights}


def _assert_same(found, expected):
    assert sorted(found) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(found[name], value, err_msg=name)


# ------------------------------------------------------------- convert_checkpoint


@pytest.mark.parametrize("kind", ["tf1", "hf", "ours"])
def test_an_ltr_run_converts_to_every_format_keeping_its_direction(ltr_run, records,
                                                                   tmp_path, kind, caplog):
    """The LTR run's output (encoder and LM head, no NSP) converts exactly; the written
    config says left-to-right (bert_config.json's causal_attention, HF's is_decoder), and
    Google's and Hugging Face's layouts warn what their code computes differently."""
    ltr = {"objective": "ltr", "next_sentence_prediction": False}
    config = BertConfig.from_json_file(str(ltr_run / "bert_config.json"))
    assert config.causal_attention
    out = tmp_path / kind
    with caplog.at_level(logging.WARNING, logger="absl"):
        checkpoints.convert(str(ltr_run), str(out), kind)
    written = checkpoints.config_for(str(out))
    assert written == config
    _assert_same(_weights(out, written, **ltr), _weights(ltr_run, config, **ltr))
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and "left-to-right model" in r.getMessage()]
    assert len(warnings) == (0 if kind == "ours" else 1), warnings
    assert all(w.startswith(f"{out}: ") for w in warnings)
    # Used to fine-tune with a bidirectional config, any of them is refused naming both.
    with pytest.raises(ValueError, match=rf"--init_checkpoint={out} is a left-to-right .*"
                                         rf"--bert_config_file=plain.json makes a "
                                         "bidirectional encoder"):
        trainer_setup.check_attention_of(str(out), BertConfig.from_json_file(records["config"]),
                                "plain.json")


def test_the_convert_checkpoint_cli_converts_an_ltr_run(ltr_run, tmp_path):
    """The command a user types, in this process (its wiring as a process: test_cli):
    exit 0, the file written, the warning for Hugging Face's code."""
    out = tmp_path / "hf"
    result = call_main("convert_checkpoint", input=ltr_run, output_dir=out, output_format="hf")
    assert result.code == 0, result.stderr[-3000:]
    assert f"wrote {out / 'model.safetensors'}" in result.stdout
    assert "BertPooler reads the FIRST token" in result.log
    assert json.loads((out / "config.json").read_text())["is_decoder"] is True


def test_a_no_nsp_run_converts_without_a_next_sentence_head(no_nsp_run, records, tmp_path):
    """The masked LM alone (no NSP head) converts to every format and back exactly."""
    config = BertConfig.from_json_file(records["config"])
    mlm = {"next_sentence_prediction": False}
    expected = _weights(no_nsp_run, config, **mlm)
    source = str(no_nsp_run)
    for kind in ("hf", "tf1", "ours"):
        out = str(tmp_path / kind)
        checkpoints.convert(source, out, kind, config=config if kind == "hf" else None)
        assert not loading.checkpoint_has_next_sentence_head(out)
        _assert_same(_weights(out, config, **mlm), expected)
        source = out
    assert checkpoints.checkpoint_has_pretraining_heads(source)


# ---------------------------------------------------- the attention direction, checked


def test_an_ltr_run_records_its_direction_and_refuses_the_other(ltr_run, records):
    """Beside its checkpoints the LTR run writes its direction (bert_config.json, and
    run_identity.json); fine-tuning or extracting features from it with the plain config
    is refused naming both files; with its own config it passes."""
    import extract_features
    from data_prep.cli import UserError

    for name in ("bert_config.json", "run_identity.json"):
        saved = json.loads((ltr_run / name).read_text())
        assert saved.get("bert_config", saved)["causal_attention"] is True, name
    plain = BertConfig.from_json_file(records["config"])
    for checkpoint in (ltr_run, ltr_run / "ckpt-6"):
        with pytest.raises(UserError, match=rf"is a left-to-right .*\({ltr_run}/"
                                             r"bert_config.json\) but --bert_config_file="):
            trainer_setup.check_attention_of(str(checkpoint), plain, records["config"])
    trainer_setup.check_attention_of(str(ltr_run), BertConfig.from_json_file(
        str(ltr_run / "bert_config.json")))
    with pytest.raises(UserError, match=rf"--bert_config_file={records['config']} makes "
                                        "a bidirectional encoder"):
        extract_features._defaults_from_checkpoint(str(ltr_run), records["config"],
                                                   records["vocab"])
    config, _ = extract_features._defaults_from_checkpoint(
        str(ltr_run), str(ltr_run / "bert_config.json"), records["vocab"])
    assert config.causal_attention


def test_export_refuses_an_ltr_run_with_a_bidirectional_config(ltr_run, records, tmp_path):
    """export_saved_model.py of the LTR encoder with the plain config: one line naming
    both configs, exit 1, nothing exported."""
    export_dir = tmp_path / "export"
    result = call_main("export_saved_model", model_type="encoder", init_checkpoint=ltr_run,
                       bert_config_file=records["config"], vocab_file=records["vocab"],
                       export_dir=export_dir)
    assert result.code == 1, result.stderr[-3000:]
    assert (f"export_saved_model.py: error: --init_checkpoint={ltr_run} is a left-to-right "
            f"(causal_attention: true) model ({ltr_run}/bert_config.json) but "
            f"--bert_config_file={records['config']} makes a bidirectional encoder"
            ) in result.stderr, result.stderr[-3000:]
    assert not export_dir.exists()


# ------------------------------------------------------------ run_pretraining's flags


def test_an_eval_of_nothing_is_refused(ltr_run, records, tmp_path):
    """--max_eval_steps=0 (or less) is refused naming the flag, as the original's
    Estimator refused it, before any work; totals of no batch or no prediction give no
    figures (never loss 0 and perplexity 1)."""
    for steps in (0, -3):
        with pytest.raises(SystemExit, match=rf"--max_eval_steps={steps} must be at least 1"):
            pretrain(input_file=records["masked"], bert_config_file=records["config"],
                     output_dir=tmp_path / "out", **dict(RUN_FLAGS, max_eval_steps=steps))
    assert not (tmp_path / "out").exists()
    for task, totals in (
            (pretraining.PretrainingTask(), {"loss": 0.0, "mlm_loss": 0.0, "mlm_nll_sum": 0.0,
                                      "mlm_correct_sum": 0.0, "mlm_weight_sum": 0.0,
                                      "nsp_loss_sum": 0.0, "nsp_correct_sum": 0.0,
                                      "nsp_count": 0.0, "steps": 0.0}),
            (pretraining.PretrainingTask(objective="ltr"), {"loss": 0.0, "lm_nll_sum": 0.0,
                                                     "lm_correct_sum": 0.0, "lm_count": 0.0,
                                                     "steps": 0.0})):
        with pytest.raises(ValueError, match=r"the eval read 0 batch\(es\) with 0 "
                                             "predictions: no figures"):
            task.metrics_from_totals(totals, 4)
        with pytest.raises(ValueError, match="no figures"):  # batches, but no prediction
            task.metrics_from_totals(dict(totals, steps=2.0), 4)
    results = read_eval_results(ltr_run / "eval_results.txt")
    assert results["next_token_perplexity"] == pytest.approx(
        math.exp(results["next_token_loss"]))
    assert results["next_token_perplexity"] > 1.0


@pytest.mark.parametrize("flag", ["--max_predictions_per_seq=99",
                                  "--phase2_max_predictions_per_seq=9"])
def test_ltr_refuses_the_prediction_counts_it_would_ignore(flag, records, tmp_path):
    values = dict(input_file=records["unmasked"], bert_config_file=records["config"],
                  output_dir=tmp_path / "out", objective="ltr", **RUN_FLAGS)
    if "phase2" in flag:
        values.update(phase2_input_file=records["unmasked"], num_train_steps=10)
    name, value = flag[2:].split("=")
    with pytest.raises(SystemExit, match=rf"run_pretraining.py: error: --{name} only "
                                         r"applies with --objective=mlm \(--objective=ltr "
                                         "masks nothing"):
        pretrain(**dict(values, **{name: value}))
    assert not (tmp_path / "out").exists()


def _run_config(**values):
    """run_pretraining's PretrainingRun from flags, in this process."""
    import run_pretraining

    argv = ["run_pretraining.py", "--input_file=x", "--bert_config_file=c",
            "--output_dir=o", "--do_train"] + [f"--{k}={v}" for k, v in values.items()]
    try:
        flags.FLAGS(argv)
        return run_pretraining.run_config_from_flags(flags.FLAGS)
    finally:
        flags.FLAGS.unparse_flags()


def test_phase_two_predictions_default_to_phase_one_share_of_the_tokens():
    """Not given, --phase2_max_predictions_per_seq keeps phase 1's predictions per token,
    rounded up: the original's 20 at 128 gives 80 at 512 and 20 at 128; given, it is taken."""
    for seq, preds, seq2, expected in ((128, 20, 512, 80), (128, 20, 128, 20),
                                       (128, 20, 256, 40), (32, 5, 64, 10), (32, 5, 48, 8)):
        phase2 = _run_config(phase2_input_file="y", num_train_steps=10, max_seq_length=seq,
                             max_predictions_per_seq=preds, phase2_max_seq_length=seq2).phase2
        assert phase2.max_predictions_per_seq == expected, (seq, preds, seq2)
    assert _run_config(phase2_input_file="y", num_train_steps=10,
                       phase2_max_predictions_per_seq=7).phase2.max_predictions_per_seq == 7


def _two_phases(records, tmp_path, **changes):
    values = dict(input_file=records["masked"], phase2_input_file=records["masked"],
                  bert_config_file=records["config"], output_dir=tmp_path / "out",
                  max_predictions_per_seq=S.PREDS, phase2_max_seq_length=S.SEQ,
                  next_sentence_prediction="false", **dict(RUN_FLAGS, num_train_steps=10))
    values.update(changes)
    pretrain(**values)


@pytest.mark.parametrize("changes, message", [
    ({"phase2_input_file": "{root}/nothing-*"},
     r"--phase2_input_file pattern '{root}/nothing-\*' matches no file"),
    ({"phase2_max_seq_length": 2 * S.SEQ},
     rf"first record has input_ids of length {S.SEQ} but --phase2_max_seq_length expects "
     rf"{2 * S.SEQ}; pass the --phase2_max_seq_length"),
    ({"phase2_max_predictions_per_seq": S.PREDS + 1},
     rf"of length {S.PREDS} but --phase2_max_predictions_per_seq expects {S.PREDS + 1}"),
    ({"phase2_input_file": "{unmasked}"},
     "the records of --phase2_input_file are unmasked .* but those of --input_file .* are "
     "masked: both phases must be the same kind of records"),
    ({"input_file": "{pairs}", "phase2_input_file": "{masked}"},
     r"the records of --phase2_input_file are without next-sentence pairs "
     r"\(--next_sentence_prediction=false\) but those of --input_file .* are with "
     "next-sentence pairs: both phases"),
], ids=["missing", "length", "predictions", "masked_kind", "pairs_kind"])
def test_phase_two_errors_name_the_phase_two_flags(records, tmp_path, changes, message):
    names = {"root": records["root"], "unmasked": records["unmasked"],
             "masked": records["masked"], "pairs": records["pairs"]}
    changes = {k: v.format(**names) if isinstance(v, str) else v for k, v in changes.items()}
    with pytest.raises(SystemExit) as info:
        _two_phases(records, tmp_path, **changes)
    found = str(info.value)
    assert found.startswith("run_pretraining.py: error: ") and "\n" not in found, found
    assert re.search(message.format(**{k: re.escape(str(v)) for k, v in names.items()}),
                     found), found
    assert not (tmp_path / "out").exists()
