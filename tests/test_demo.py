"""demo.py, the main job: stage mechanics (fast) and the whole --quick run (slow)."""

import gzip
import json
import os
import struct
import subprocess
import sys

import pytest

import demo
from demo_lib import reports, stages as demo_stages

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_fake_tfrecords(path, payloads, compress=False):
    """TFRecord framing (length, CRC, data, CRC) with zero CRCs: enough to count records."""
    opener = gzip.open if compress else open
    with opener(path, "wb") as writer:
        for payload in payloads:
            writer.write(struct.pack("<Q", len(payload)) + b"\0" * 4 + payload + b"\0" * 4)


@pytest.mark.parametrize("compress", [False, True])
def test_count_tfrecords(tmp_path, compress):
    path = str(tmp_path / ("x.tfrecord" + (".gz" if compress else "")))
    _write_fake_tfrecords(path, [b"a" * n for n in (0, 1, 70000, 5)], compress)
    assert reports.count_tfrecords(path) == 4


def test_count_tfrecords_reports_truncation(tmp_path):
    path = tmp_path / "x.tfrecord"
    _write_fake_tfrecords(path, [b"abc"])
    path.write_bytes(path.read_bytes() + b"\x01\x02")
    with pytest.raises(demo_stages.StageError, match="truncated"):
        reports.count_tfrecords(str(path))


def _settings(tmp_path, **overrides):
    values = {"output_dir": str(tmp_path), "corpus_mb": 0.1, "vocab_size": 500,
              "dupe_factor": 1, "corpus_shards": 1, "max_seq_length": 64,
              "max_predictions_per_seq": 10, "num_workers": 0, "random_seed": 1, "quick": True}
    values.update(overrides)
    return demo.Settings(**values)


def pretraining_output(stages):
    return dict(stages[2].flags)["output_file"]


def test_stages_run_the_real_clis_with_real_flags(tmp_path):
    stages = demo.build_stages(_settings(tmp_path, num_workers=2))
    assert [s.module for s in stages] == [
        "data_prep.sample_corpus", "data_prep.build_vocab", "data_prep.create_pretraining_data",
        "run_pretraining.py", "data_prep.sample_corpus", "run_classifier.py",
        "export_saved_model.py", "predict_saved_model.py"]
    assert all(stage.is_available() for stage in stages)
    training = dict(stages[3].flags)
    assert training["input_file"] == pretraining_output(stages) + "*"  # records only
    for key in ("bert_config_file", "output_dir", "do_train", "do_eval", "num_train_steps",
                "max_seq_length", "max_predictions_per_seq"):
        assert key in training
    pretraining = dict(stages[2].flags)
    assert pretraining["vocab_file"] == str(tmp_path / "vocab.txt")
    assert pretraining["max_seq_length"] == 64 and pretraining["num_workers"] == 2
    for key in ("input_file", "output_file", "do_lower_case", "max_predictions_per_seq",
                "dupe_factor", "random_seed"):
        assert key in pretraining
    argv = stages[1].argv("python")
    assert argv[:3] == ["python", "-m", "data_prep.build_vocab"]
    assert "--vocab_size=500" in argv


def test_classifier_export_and_predict_stages_chain(tmp_path):
    stages = {s.name: s for s in demo.build_stages(_settings(tmp_path))}
    data = dict(stages["classifier_data"].flags)
    assert data["classification_dir"] == str(tmp_path / "classifier_data")
    assert data["classification_label"] == "kind"
    classifier = dict(stages["classifier"].flags)
    assert classifier["task_name"] == "custom"
    assert classifier["data_dir"] == data["classification_dir"]
    assert (classifier["text_a_column"], classifier["label_column"]) == ("sentence", "label")
    assert classifier["init_checkpoint"] == dict(stages["pretraining"].flags)["output_dir"]
    assert classifier["bert_config_file"] == str(tmp_path / "bert_config.json")
    assert classifier["vocab_file"] == str(tmp_path / "vocab.txt")
    for key in ("do_train", "do_eval", "do_predict"):
        assert classifier[key] == "true"
    export = dict(stages["export"].flags)
    assert export["model_type"] == "classifier"
    assert export["init_checkpoint"] == classifier["output_dir"] == str(tmp_path / "classifier")
    assert export["export_dir"] == str(tmp_path / "export" / "classifier")
    predict = stages["predict"]
    assert dict(predict.flags)["export_dir"] == export["export_dir"]
    assert [v for k, v in predict.flags if k == "text"] == list(demo.PREDICT_TEXTS)


def test_predict_cli_needs_only_tensorflow_and_tensorflow_text():
    source = open(os.path.join(REPO_ROOT, "predict_saved_model.py"), encoding="utf-8").read()
    imports = {line.split()[1].split(".")[0] for line in source.splitlines()
               if line.strip().startswith(("import ", "from "))}
    assert imports <= {"__future__", "argparse", "json", "os", "signal", "sys", "threading",
                       "tensorflow", "tensorflow_text", "traceback"}, imports


def test_missing_tool_fails_with_its_hint(tmp_path, capsys):
    stage = demo.Stage("later", "a later stage", "data_prep.not_written_yet", [],
                       report=lambda: ([], {}), missing_hint="waits for issue 99")
    with pytest.raises(demo_stages.StageError, match="not found.*waits for issue 99"):
        demo.run_stage(stage, 4, 6, _settings(tmp_path))


def test_script_stages_run_repository_scripts(tmp_path):
    script = demo.Stage("later", "t", "demo.py", [("quick", "true")], report=lambda: ([], {}))
    assert script.is_available()
    argv = script.argv("python")
    assert argv[0] == "python" and argv[1].endswith("demo.py") and os.path.isfile(argv[1])
    assert argv[2:] == ["--quick=true"]
    assert not demo.Stage("x", "t", "not_there.py", [], report=lambda: ([], {})).is_available()


def test_failing_tool_reports_exit_code_log_and_message(tmp_path, capsys):
    stage = demo.Stage("vocab", "learn", "data_prep.build_vocab",
                       [("input_file", str(tmp_path / "nothing-*.txt")),
                        ("output_file", str(tmp_path / "v.txt"))],
                       report=lambda: ([], {}))
    with pytest.raises(demo_stages.StageError) as error:
        demo.run_stage(stage, 2, 3, _settings(tmp_path))
    message = str(error.value)
    assert "exit code 1" in message and "matches no file" in message
    log = tmp_path / "logs" / "2-vocab.log"
    assert log.exists() and "matches no file" in log.read_text()
    assert "matches no file" in capsys.readouterr().out  # streamed while running


def test_noise_filter():
    assert demo_stages.is_noise("I0000 00:00:1795319551.993275    8293 port.cc:153] oneDNN custom")
    assert demo_stages.is_noise("WARNING: All log messages before absl::InitializeLog() is called")
    assert not demo_stages.is_noise("I1122 03:52:31.110223 1404 build_vocab.py:379] reading 1 file")
    assert not demo_stages.is_noise("Instances written: 10")


@pytest.mark.slow
def test_quick_demo_end_to_end(tmp_path):
    """`demo.py --quick` through the same entry point as `make demo`, into tmp_path."""
    # Run from another folder with a relative --output_dir: paths mean what they mean there.
    output_dir = tmp_path / "demo_output"
    env = dict(os.environ, PYTHONPATH="")
    result = subprocess.run(
        [sys.executable, os.path.join(REPO_ROOT, "demo.py"), "--quick",
         "--output_dir=demo_output"], cwd=tmp_path,
        env=env, check=False, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    for marker in ("[1/8] corpus", "[2/8] vocab", "[3/8] pretraining_data",
                   "[4/8] pretraining", "[5/8] classifier_data", "[6/8] classifier",
                   "[7/8] export", "[8/8] predict", "Demo finished",
                   "Run each stage by hand", "-m data_prep.create_pretraining_data",
                   "run_classifier.py", "export_saved_model.py", "predict_saved_model.py",
                   "tensorboard --logdir demo_output"):
        assert marker in out
    assert "port.cc" not in out, "TensorFlow start-up chatter is filtered"

    summary = json.loads((output_dir / "demo_summary.json").read_text())
    assert summary["ok"] is True
    stages = summary["stages"]
    assert list(stages) == ["corpus", "vocab", "pretraining_data", "pretraining",
                            "classifier_data", "classifier", "export", "predict"]
    assert stages["corpus"]["documents"] > 100
    assert stages["vocab"]["unk_rate"] == 0.0
    assert 0.9 * 1000 <= stages["vocab"]["vocab_size"] <= 1000

    corpus_files = sorted((output_dir / "corpus").glob("*.txt"))
    assert len(corpus_files) == 2
    records = sorted((output_dir / "pretraining_data").glob("*.tfrecord*"))
    records = [p for p in records if not p.name.endswith(".json")]
    assert records
    instances = sum(reports.count_tfrecords(str(p)) for p in records)
    assert instances > 100
    pretraining = stages["pretraining_data"]
    assert pretraining["summary"]["instances"] == instances
    config = json.loads((output_dir / "bert_config.json").read_text())
    assert config["vocab_size"] == stages["vocab"]["vocab_size"]
    eval_results = stages["pretraining"]["eval_results"]
    assert eval_results["global_step"] == 20
    assert set(eval_results) >= {"loss", "masked_lm_accuracy", "masked_lm_loss",
                                 "next_sentence_accuracy", "next_sentence_loss"}
    assert eval_results == _key_values(output_dir / "pretraining" / "eval_results.txt")
    assert list((output_dir / "pretraining").glob("ckpt-20.index"))
    for index, name in enumerate(stages, start=1):
        assert (output_dir / "logs" / f"{index}-{name}.log").exists()

    # 5. classification data: balanced, headed TSVs.
    labels = stages["classifier_data"]["labels"]
    assert labels == ["class", "comment", "function", "module"]
    rows = {}
    for split in ("train", "dev", "test"):
        lines = (output_dir / "classifier_data" / f"{split}.tsv").read_text().splitlines()
        assert lines[0] == "sentence\tlabel"
        rows[split] = [line.split("\t") for line in lines[1:]]
        assert rows[split] and all(len(row) == 2 for row in rows[split])
        counts = {label: sum(row[1] == label for row in rows[split]) for label in labels}
        assert len(set(counts.values())) == 1, counts  # balanced
        assert len(rows[split]) == stages["classifier_data"]["rows"][split]
    assert not {r[0] for r in rows["train"]} & {r[0] for r in rows["test"]} - {""}

    # 6. fine-tuning: the figures the summary reports are those of the files. (At --quick
    # size the classifier stays at chance, dev loss ~ln 4: no accuracy is guaranteed, only
    # that the demo reports what the runner wrote.)
    classifier_dir = output_dir / "classifier"
    classifier = stages["classifier"]
    eval_file = _key_values(classifier_dir / "eval_results.txt")
    assert set(eval_file) >= {"eval_accuracy", "eval_loss", "global_step"}
    assert classifier["eval_results"] == eval_file
    assert f"dev accuracy {eval_file['eval_accuracy']:.1%}" in classifier["headline"]
    metadata = json.loads((classifier_dir / "export_metadata.json").read_text())
    assert metadata["labels"] == classifier["labels"] == labels
    probabilities = [[float(x) for x in line.split("\t")]
                     for line in (classifier_dir / "test_results.tsv").read_text().splitlines()]
    assert len(probabilities) == len(rows["test"]) == classifier["test_rows"]
    for row in probabilities:  # a distribution over the labels, in metadata order
        assert len(row) == len(labels) and min(row) >= 0 and abs(sum(row) - 1) < 1e-5, row
    predicted = [labels[row.index(max(row))] for row in probabilities]
    correct = sum(p == row[1] for p, row in zip(predicted, rows["test"], strict=True))
    assert classifier["test_accuracy"] == correct / len(rows["test"])

    # 7. export, in the folder the issue names.
    export_dir = output_dir / "export" / "classifier"
    assert (export_dir / "saved_model.pb").exists()
    assert (export_dir / "assets" / "vocab.txt").exists()
    assert stages["export"]["labels"] == labels

    # 8. the reloaded SavedModel's predictions, printed and in predictions.json.
    predictions = stages["predict"]["predictions"]
    written = json.loads((output_dir / "predictions.json").read_text())
    assert written["labels"] == labels
    assert [p["text"] for p in predictions] == written["inputs"]["text"] == list(
        demo.PREDICT_TEXTS)
    for prediction, row in zip(predictions, written["predictions"], strict=True):
        # The label is the most probable one, the probability its own.
        assert row["label"] == labels[row["probabilities"].index(max(row["probabilities"]))]
        assert abs(sum(row["probabilities"]) - 1) < 1e-5, row
        assert (prediction["label"], prediction["probability"]) == (
            row["label"], max(row["probabilities"]))
        assert f"{prediction['label']} (p={prediction['probability']:.2f})" in out
        assert f"-> {prediction['label']} (p=" in out  # predict_saved_model.py's own line


def _key_values(path):
    """An eval_results.txt read back independently: `key = value` lines, values as floats."""
    pairs = (line.split(" = ") for line in path.read_text(encoding="utf-8").splitlines())
    return {key: float(value) for key, value in pairs}


def test_predict_cli_rejects_missing_or_unpaired_inputs(tmp_path):
    """Argument errors stop before TensorFlow is imported (exit status 1, one line)."""
    script = os.path.join(REPO_ROOT, "predict_saved_model.py")
    for args, message in (([], "at least one --text"),
                          (["--text=a", "--text=b", "--text_pair=c"], "same number of times")):
        result = subprocess.run([sys.executable, script, f"--export_dir={tmp_path}", *args],
                                check=False, capture_output=True, text=True, timeout=60)
        assert result.returncode == 1 and message in result.stderr, result.stderr
        assert "predict_saved_model.py: error: " in result.stderr, result.stderr
