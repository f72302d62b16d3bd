"""Relative paths, as most people type them (issue 22): every runner trains into a relative
--output_dir, then a second invocation in the same folder resumes from or evaluates its
checkpoint, instead of refusing its own checkpoints as "another run's" (TensorFlow's
checkpoint state already names them relative to the folder; joining the folder again gave
`cl1/cl1/ckpt-5`). The tools that read a run directory (export_saved_model.py,
extract_features.py, convert_checkpoint.py) are given it relative too.

Every command runs in its folder with relative paths only, in this process
(`tests.clis.call_main`, the working directory changed for the call); the data come from
the runners' own tests' helpers.

Each runner's first invocation is made once per session (`tests.conftest.built_once`) and
read, on a copy, both here and by tests/test_run_dir.py (the trained classifier and
pretraining directories its refusals are tried in: `first_run`).
"""

import functools
import json
import os
import random
import shutil

import pytest

from tests import test_loop_support as S
from tests import test_run_dir as run_dir_tests
from tests import test_run_ner as ner_tests
from tests import test_run_squad as squad_tests
from tests import test_run_swag as swag_tests
from tests.clis import call_main
from tests.conftest import TINY_VOCAB, built_once, write_vocab
from tests.test_multiple_choice_data import swag_row, write_swag

pytestmark = pytest.mark.slow

# Small and quick: a few steps, a checkpoint at the end of the first invocation.
QUICK = dict(train_batch_size=4, eval_batch_size=4, iterations_per_loop=2,
             save_checkpoints_steps=1000, log_steps=2, seed=1,
             distribution_strategy="one_device")


def _call(cwd, script, **flags):
    """Runs `python SCRIPT --flag=value ...` in the folder `cwd`, in this process
    (`tests.clis.call_main`); returns (exit status, its log lines, output and message)."""
    result = call_main(script[:-len(".py")], cwd=str(cwd), **flags)
    return result.code, "\n".join((result.log, result.stdout, result.stderr))


def _tiny_model(cwd, vocab_tokens=TINY_VOCAB):
    """vocab.txt and bert_config.json in cwd; their flags, relative."""
    write_vocab(cwd / "vocab.txt", vocab_tokens)
    S.write_config(cwd / "bert_config.json", vocab_size=len(vocab_tokens), num_hidden_layers=1)
    return dict(vocab_file="vocab.txt", bert_config_file="bert_config.json")


# ----------------------------------------------------------------- one case per runner
# Each returns (script, the flags of both invocations, the first's, the second's).


def _pretraining(cwd):
    (cwd / "data").mkdir()
    S.write_records(cwd / "data" / "records.tfrecord", S.synthetic_instances(32))
    S.write_config(cwd / "bert_config.json", num_hidden_layers=1)
    common = dict(input_file="data/records.tfrecord", bert_config_file="bert_config.json",
                  max_seq_length=S.SEQ, max_predictions_per_seq=S.PREDS, learning_rate=1e-3,
                  num_warmup_steps=0, max_eval_steps=2, **QUICK)
    return ("run_pretraining.py", common, dict(do_train="true", num_train_steps=4),
            dict(do_train="true", do_eval="true", num_train_steps=6))


def _classifier(cwd):
    run_dir_tests._custom_data(cwd / "data")
    common = dict(task_name="custom", data_dir="data", text_a_column="text",
                  label_column="label", max_seq_length=16, learning_rate=1e-3,
                  num_train_epochs=1.0, **_tiny_model(cwd), **QUICK)
    return ("run_classifier.py", common, dict(do_train="true"), dict(do_eval="true"))


def _squad(cwd):
    rng = random.Random(0)
    squad_tests.write_squad(cwd / "train.json", rng, "1.1", 2)
    squad_tests.write_squad(cwd / "dev.json", rng, "1.1", 1, dev=True)
    common = dict(train_file="train.json", predict_file="dev.json",
                  max_seq_length=squad_tests.SEQ, doc_stride=squad_tests.STRIDE,
                  max_query_length=squad_tests.QUERY, predict_batch_size=4,
                  learning_rate=1e-3, num_train_epochs=1.0,
                  **_tiny_model(cwd, squad_tests._vocab_tokens()), **QUICK)
    return ("run_squad.py", common, dict(do_train="true"), dict(do_predict="true"))


def _ner(cwd):
    rng = random.Random(0)
    (cwd / "conll").mkdir()
    ner_tests.write_conll(cwd / "conll" / "train.txt", rng, documents=2, per_document=4)
    ner_tests.write_conll(cwd / "conll" / "dev.txt", rng, documents=1, per_document=4)
    common = dict(data_dir="conll", max_seq_length=ner_tests.SEQ, learning_rate=1e-3,
                  num_train_epochs=1.0, **_tiny_model(cwd), **QUICK)
    return ("run_ner.py", common, dict(do_train="true"), dict(do_eval="true"))


def _swag(cwd):
    rng = random.Random(0)
    (cwd / "swag").mkdir()
    write_swag(cwd / "swag" / "train.csv", [swag_row(*e) for e in swag_tests._examples(rng, 8)])
    write_swag(cwd / "swag" / "val.csv", [swag_row(*e) for e in swag_tests._examples(rng, 4)])
    common = dict(data_dir="swag", max_seq_length=16, learning_rate=1e-3,
                  num_train_epochs=1.0, **_tiny_model(cwd), **QUICK)
    return ("run_swag.py", common, dict(do_train="true"), dict(do_eval="true"))


CASES = {"pretraining": _pretraining, "classifier": _classifier, "squad": _squad,
         "ner": _ner, "swag": _swag}


CASE_FILE = "case.json"


def _first_run(kind, cwd):
    """Fills `cwd` with `kind`'s files and its first invocation, into the relative
    `run1`."""
    script, common, first, second = CASES[kind](cwd)
    (cwd / CASE_FILE).write_text(json.dumps([script, common, first, second]))
    code, log = _call(cwd, script, output_dir="run1", **common, **first)
    assert code == 0, log[-4000:]


def first_run(tmp_path_factory, kind):
    """The folder of `kind`'s first invocation (its files, run1 and case.json), built once
    per session and shared by every worker: read it, or work on a `shutil.copytree`."""
    return built_once(tmp_path_factory, f"test_relative_paths-{kind}",
                      functools.partial(_first_run, kind))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """kind -> a copy of the runner's first invocation's folder (`first_run`), in which
    this module's tests run the next commands (made once per kind, on first use)."""
    done = {}

    def get(kind):
        if kind not in done:
            cwd = tmp_path_factory.mktemp(kind) / "cwd"
            shutil.copytree(first_run(tmp_path_factory, kind), cwd)
            script, common, _, second = json.loads((cwd / CASE_FILE).read_text())
            done[kind] = {"cwd": cwd, "script": script, "common": common, "second": second}
        return done[kind]
    return get


@pytest.mark.parametrize("kind", sorted(CASES))
def test_a_second_run_in_a_relative_output_dir_uses_the_checkpoint(trained, kind):
    run = trained(kind)
    cwd = run["cwd"]
    code, log = _call(cwd, run["script"], output_dir="run1", **run["common"], **run["second"])
    assert code == 0, log[-4000:]
    assert "do not fit this model" not in log
    assert "Resumed from run1/ckpt-" in log, log[-4000:]
    assert not os.path.exists(cwd / "run1" / "run1")
    outputs = os.listdir(cwd / "run1")
    assert [name for name in outputs if name.startswith("eval_results")
            or name == "predictions.json"], outputs


def test_export_and_extract_features_take_a_relative_run_directory(trained):
    cwd = trained("classifier")["cwd"]
    code, log = _call(cwd, "export_saved_model.py", model_type="classifier",
                     init_checkpoint="run1", export_dir="exported")
    assert code == 0, log[-4000:]
    assert os.path.exists(cwd / "exported" / "saved_model.pb")
    (cwd / "sentences.txt").write_text("the cat sat on the mat .\n", encoding="utf-8")
    code, log = _call(cwd, "extract_features.py", input_file="sentences.txt",
                     output_file="features.jsonl", vocab_file="vocab.txt",
                     bert_config_file="bert_config.json", init_checkpoint="run1",
                     layers="-1", max_seq_length=16)
    assert code == 0, log[-4000:]
    assert (cwd / "features.jsonl").read_text(encoding="utf-8").strip()


def test_convert_checkpoint_takes_a_relative_run_directory(trained):
    cwd = trained("pretraining")["cwd"]
    code, log = _call(cwd, "convert_checkpoint.py", input="run1", output_dir="google",
                     bert_config_file="bert_config.json", output_format="tf1")
    assert code == 0, log[-4000:]
    assert os.path.exists(cwd / "google" / "bert_model.ckpt.index")
