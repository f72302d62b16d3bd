"""Long documents (--long_document=windows): the document classifier's cost and the windows run's resume and multi-worker equality."""

from __future__ import annotations

import io
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from modeling.config import BertConfig
from modeling.models import BertDocumentClassifier
from test_modeling_reference import tiny_config_dict


def _documents(rng, vocab_size, windows_per_document, max_windows=5, seq=8):
    """[batch, max_windows, seq] inputs: document i has windows_per_document[i] real
    windows (0: a padding row), then all-zero windows."""
    shape = (len(windows_per_document), max_windows, seq)
    ids = np.zeros(shape, np.int32)
    mask = np.zeros(shape, np.int32)
    for i, count in enumerate(windows_per_document):
        ids[i, :count] = rng.integers(5, vocab_size, size=(count, seq))
        mask[i, :count] = 1
    return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)}


def test_document_classifier_encodes_only_present_windows():
    """A batch of documents of 1, 3 and 0 windows in records of 5 costs 4 encoder rows,
    not 15, and each document's logits are those it has alone without padding windows,
    eagerly and under XLA (--jit_compile)."""
    config = BertConfig.from_dict(tiny_config_dict())
    model = BertDocumentClassifier(config, 2, pooling="attention")
    inputs = _documents(np.random.default_rng(0), config.vocab_size, [1, 3, 0])
    rows = []
    encoder_call = model.encoder.call

    def counting_call(features, training=None):
        rows.append(int(features["input_ids"].shape[0]))
        return encoder_call(features, training=training)

    model.encoder.call = counting_call
    logits = model(inputs, training=False)["logits"].numpy()
    assert rows == [4]
    for i, count in enumerate([1, 3]):
        alone = model({k: v[i:i + 1, :count] for k, v in inputs.items()}, training=False)
        np.testing.assert_allclose(alone["logits"].numpy()[0], logits[i], atol=1e-5)
    # A padding row (no window) pools to zeros: the head's bias only.
    np.testing.assert_allclose(logits[2], model.classifier.dense.bias.numpy(), atol=1e-6)
    model.encoder.call = encoder_call
    compiled = tf.function(lambda x: model(x, training=False)["logits"], jit_compile=True)
    np.testing.assert_allclose(compiled({k: tf.constant(v) for k, v in inputs.items()}),
                               logits, atol=1e-5)


def test_window_pooling_default_is_the_measured_best():
    """--window_pooling's default is max: tied with attention, far above mean, on the
    long-documents bench (bench/RESULTS.md, Long documents); flag and settings agree."""
    import run_classifier
    from tasks.classification.task import ClassificationSettings

    assert run_classifier.FLAGS["window_pooling"].default == "max"
    assert ClassificationSettings("custom", "data").window_pooling == "max"
    assert BertDocumentClassifier(BertConfig.from_dict(tiny_config_dict()), 2).pooling == "max"


@pytest.mark.slow
def test_windows_run_on_two_worker_processes(tmp_path):
    """A windows run (attention pooling, length buckets) under MultiWorkerMirroredStrategy
    on two local processes: both workers train the same global steps (same losses), the
    chief alone writes the results, and its test_results.tsv (documents split across the
    workers, padding rows without windows included) equals one process predicting from
    the same checkpoint."""
    from tests import test_loop_support as S
    from tests.clis import call_main
    from tests.test_exact_resume_runners import _classifier_command

    out = tmp_path / "mwms"
    command = _classifier_command(tmp_path, out, "windows") + [
        "--distribution_strategy=multi_worker_mirrored", "--do_predict=true",
        "--num_train_epochs=1.0", "--iterations_per_loop=4", "--log_steps=4",
        "--save_checkpoints_steps=12", "--predict_batch_size=4"]
    data = tmp_path / "data"
    (data / "test.tsv").write_text((data / "dev.tsv").read_text() + "cat\tpos\n")
    logs = S.run_local_workers(command)
    losses = [re.findall(r"step (\d+)/\d+ loss (\S+)", log) for log in logs]
    assert losses[0] == losses[1] and losses[0], logs[0][-2000:]
    assert os.path.basename(tf.train.latest_checkpoint(str(out))) == "ckpt-12"
    assert not [p for p in os.listdir(out) if p.startswith("workertemp")]
    served = (out / "test_results.tsv").read_text()
    assert len(served.splitlines()) == 9
    flags = {a.split("=", 1)[0][2:]: a.split("=", 1)[1] for a in command[2:]}
    result = call_main("run_classifier", **{**flags, "distribution_strategy": "one_device",
                                            "do_train": "false"})
    assert result.code == 0, result.stderr[-2000:]
    np.testing.assert_allclose(np.loadtxt(out / "test_results.tsv"),
                               np.loadtxt(io.StringIO(served)), atol=1e-5)
