"""Long documents (--long_document=windows): the document classifier's cost and the windows run's resume and multi-worker equality."""

from __future__ import annotations

import io
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from modeling import checkpoints
from modeling.config import BertConfig
from modeling.models import WINDOW_POOLINGS, BertDocumentClassifier, BertPretrainer
from test_modeling_reference import (random_hf_weights, run_original_graph, tiny_config_dict,
                                     tiny_inputs, write_hf_dir)


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


@pytest.mark.parametrize("pooling", ["attention", "max_ends"])
def test_document_classifier_encodes_only_present_windows(pooling):
    """A batch of documents of 1, 3 and 0 windows in records of 5 costs 4 encoder rows,
    not 15, and each document's logits are those it has alone without padding windows,
    eagerly and under XLA (--jit_compile). (One layer: the windows are gathered and
    pooled outside the encoder, whose depth changes nothing here but its XLA compile.)"""
    config = BertConfig.from_dict(tiny_config_dict(num_hidden_layers=1))
    model = BertDocumentClassifier(config, 2, pooling=pooling)
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


def test_max_ends_reads_the_first_and_last_windows_beside_the_max():
    """pooling="max_ends": the head reads [first window, last window, per-feature max]
    of each document's own windows' pooled outputs (padding windows never), 3 x hidden."""
    config = BertConfig.from_dict(tiny_config_dict())
    model = BertDocumentClassifier(config, 2, pooling="max_ends")
    assert model.classifier.dense.kernel.shape == (3 * config.hidden_size, 2)
    inputs = _documents(np.random.default_rng(1), config.vocab_size, [1, 3, 5, 0])
    seen = []
    head_call = model.classifier.call

    def recording_call(x, training=None):
        seen.append(np.asarray(x))
        return head_call(x, training=training)

    model.classifier.call = recording_call
    model(inputs, training=False)
    model.classifier.call = head_call
    (document,) = seen
    for i, count in enumerate([1, 3, 5, 0]):
        flat = {k: v[i, :max(count, 1)] for k, v in inputs.items()}
        pooled = model.encoder(flat, training=False)["pooled_output"].numpy()
        want = (np.concatenate([pooled[0], pooled[-1], pooled.max(0)]) if count
                else np.zeros(3 * config.hidden_size))
        np.testing.assert_allclose(document[i], want, atol=1e-6, err_msg=f"document {i}")


def _source_arrays(kind, location):
    """name -> array of a TF1 prefix or a Hugging Face safetensors file."""
    if kind == "tf1":
        reader = tf.train.load_checkpoint(location)
        return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}
    from safetensors.numpy import load_file

    return load_file(location)


def test_document_classifier_loads_its_encoder_from_every_format(tmp_path):
    """--init_checkpoint for a windows run: Google's TF1 checkpoint (written by the
    original's own graph and Saver), a Hugging Face directory and one of ours all load
    into the document model (every pooling), encoder only: each encoder weight equals the
    source's tensor, the per-window pooled output equals the original graph's, and only
    the head (and attention pooling's window scorer) is missing. A document model's own
    TF1 export loads back strictly, logits equal."""
    config_dict = tiny_config_dict()
    inputs = tiny_inputs(config_dict)
    google = tmp_path / "google"
    google.mkdir()
    original = run_original_graph(config_dict, inputs, save_to=str(google / "bert_model.ckpt"),
                                  seed=3, optimizer_slots=True)
    hf = write_hf_dir(tmp_path / "hf", random_hf_weights(config_dict, seed=4), config_dict,
                      "gelu")
    config = BertConfig.from_dict(config_dict)
    ours = checkpoints.save_ours(BertPretrainer(config), str(tmp_path / "ours"), config)
    flat = {k: inputs[k] for k in ("input_ids", "input_mask", "segment_ids")}
    for source, kind in ((str(google), "tf1"), (str(hf), "hf"), (ours, "ours")):
        for pooling in ("max_ends", "max", "mean", "attention"):
            model = BertDocumentClassifier(config, 3, pooling=pooling)
            report = checkpoints.load_pretrained(source, model, partial=True)
            head = {"tf1": ["output_weights", "output_bias"],
                    "hf": ["classifier.weight", "classifier.bias"],
                    "ours": ["model/classifier/dense/_kernel",
                             "model/classifier/dense/bias"]}[kind]
            if pooling == "attention":
                head = head + {"tf1": ["window_attention/kernel", "window_attention/bias"],
                               "hf": ["window_attention.kernel", "window_attention.bias"],
                               "ours": ["model/window_attention/_kernel",
                                        "model/window_attention/bias"]}[kind]
            assert report.kind == kind
            assert sorted(report.missing) == sorted(head), (kind, pooling, report.missing)
            if kind == "ours":
                reference = BertPretrainer(config)
                checkpoints.load_pretrained(source, reference)
                for got, want in zip(model.encoder.weights, reference.encoder.weights):
                    np.testing.assert_array_equal(got.numpy(), want.numpy())
                continue
            arrays = _source_arrays(*checkpoints.resolve(source))
            entries = checkpoints.weight_table(model.encoder)
            for entry in entries:
                want = entry.to_keras(arrays[entry.name(kind)], kind)
                got = entry.variable.numpy()
                if entry.columns is not None:
                    got = got[..., entry.columns[0]:entry.columns[1]]
                np.testing.assert_array_equal(got, want, err_msg=entry.name(kind))
            assert len(entries) == len(report.loaded)
        if kind == "tf1":  # the windows' pooled outputs are the original graph's
            pooled = model.encoder(flat)["pooled_output"]
            np.testing.assert_allclose(pooled, original["pooled"], atol=1e-5)
    # A document model round-trips through Google's layout with its head and scorer.
    exported = checkpoints.export_tf1_checkpoint(model, config, str(tmp_path / "export"))
    again = BertDocumentClassifier(config, 3, pooling="attention")
    assert checkpoints.load_pretrained(exported, again).ok
    documents = {k: v[None] for k, v in flat.items()}   # one document of 3 windows
    np.testing.assert_allclose(again(documents)["logits"], model(documents)["logits"],
                               atol=1e-6)


def test_recomputed_chunks_have_the_values_and_gradients_of_plain_backprop():
    """modeling.recompute: 11 sequences, 4 at a time, dropout on: the pooled outputs and
    every weight's gradient equal ordinary backpropagation through the same chunks and
    dropout seeds (chunk i: each generator's state before the step plus i), in a
    tf.function as the loop runs it; the generators then stand past the last chunk, so
    the next step draws new masks."""
    import keras

    from modeling.encoder import BertEncoder
    from modeling.recompute import _seed_states, pooled_output_recomputed

    keras.utils.set_random_seed(3)
    encoder = BertEncoder(BertConfig.from_dict(tiny_config_dict(hidden_dropout_prob=0.3,
                                                                attention_probs_dropout_prob=0.3)))
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 99, size=(11, 16)).astype(np.int32)
    mask = (np.arange(16) < rng.integers(3, 17, size=(11, 1))).astype(np.int32)
    inputs = {"input_ids": ids * mask, "input_mask": mask, "segment_ids": np.zeros_like(ids)}
    encoder(inputs)
    weights = encoder.trainable_variables
    seeds = _seed_states(encoder)
    assert len(seeds) == 7   # embeddings, and 3 per layer
    start = [seed.numpy() for seed in seeds]

    def loss_of(pooled):  # any function of every pooled value
        return tf.reduce_sum(tf.sin(pooled) * tf.range(1.0, pooled.shape[-1] + 1.0))

    @tf.function
    def recomputed():
        with tf.GradientTape() as tape:
            pooled = pooled_output_recomputed(encoder, inputs, 4)
            loss = loss_of(pooled)
        return pooled, tape.gradient(loss, weights)

    pooled, grads = recomputed()
    assert [seed.numpy().tolist() for seed in seeds] == [
        (s + [0, 3]).tolist() for s in start]
    for seed, s in zip(seeds, start):
        seed.assign(s)
    with tf.GradientTape() as tape:
        parts = []
        for i in range(3):
            with keras.StatelessScope(state_mapping=[
                    (seed, s + np.array([0, i])) for seed, s in zip(seeds, start)]):
                parts.append(encoder({k: v[4 * i:4 * i + 4] for k, v in inputs.items()},
                                     training=True)["pooled_output"])
        expected = tf.concat(parts, 0)
        loss = loss_of(expected)
    np.testing.assert_allclose(pooled, expected, atol=1e-6)
    for got, want, weight in zip(grads, tape.gradient(loss, weights), weights):
        want = tf.convert_to_tensor(want)
        np.testing.assert_allclose(got, want, atol=1e-5 * float(tf.reduce_max(tf.abs(want))),
                                   err_msg=weight.path)
    # The masks differ from chunk to chunk (no two chunks share a seed).
    with keras.StatelessScope(state_mapping=[(seed, s) for seed, s in zip(seeds, start)]):
        again = encoder({k: v[4:8] for k, v in inputs.items()}, training=True)["pooled_output"]
    assert not np.allclose(again, parts[1], atol=1e-3)


def test_document_classifier_trains_chunk_by_chunk_as_at_once():
    """Training (no dropout: same values whatever the masks): documents of 3, 1, 0 and 5
    windows encoded 2 at a time give the logits and gradients of encoding all at once,
    eagerly and under XLA (--jit_compile). (One layer: the chunks are the encoder's
    calls, whatever its depth, which changes nothing here but the XLA compile's time.)"""
    config = BertConfig.from_dict(tiny_config_dict(hidden_dropout_prob=0.0,
                                                   attention_probs_dropout_prob=0.0,
                                                   num_hidden_layers=1))
    inputs = _documents(np.random.default_rng(1), config.vocab_size, [3, 1, 0, 5])
    results = []
    for chunk, jit in ((0, False), (2, False), (2, True)):
        keras_seed(5)
        model = BertDocumentClassifier(config, 2, pooling="attention", dropout_rate=0.0,
                                       windows_per_chunk=chunk)

        def step(x):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)["logits"]
                loss = tf.reduce_sum(logits * [[1.0, -2.0]])
            return logits, tape.gradient(loss, model.trainable_variables)

        step = tf.function(step, jit_compile=True) if jit else step
        results.append(step({k: tf.constant(v) for k, v in inputs.items()}))
    (plain, plain_grads), *chunked_results = results
    for chunked, chunked_grads in chunked_results:
        np.testing.assert_allclose(chunked, plain, atol=1e-5)
        for got, want in zip(chunked_grads, plain_grads):
            want = tf.convert_to_tensor(want)
            np.testing.assert_allclose(tf.convert_to_tensor(got), want,
                                       atol=1e-5 * (1 + float(tf.reduce_max(tf.abs(want)))))


def keras_seed(seed):
    import keras

    keras.utils.set_random_seed(seed)


def test_window_pooling_default_is_the_measured_best():
    """--window_pooling's default is max_ends: from all-MiniLM-L6-v2 it learned the
    long-documents bench's ending topic at seq 64 with head_tail, where max did not (at
    the bench's defaults, seq 128 and 400 documents, it fell behind head_tail; one seed
    of two stayed at chance with the original optimizer and learned with
    --optimizer=adamw_bias_corrected; bench/RESULTS.md, Long documents; the default
    stride, a whole window: tests/test_classifier_data.py); flag, settings and model agree, and the
    flag offers the model's poolings (the runner lists them itself: its flags are
    defined without importing the model's TensorFlow)."""
    import run_classifier
    from tasks.classification.task import ClassificationSettings

    flag = run_classifier.FLAGS["window_pooling"]
    assert flag.default == "max_ends"
    assert sorted(flag.parser.enum_values) == sorted(WINDOW_POOLINGS)
    assert ClassificationSettings("custom", "data").window_pooling == "max_ends"
    assert BertDocumentClassifier(BertConfig.from_dict(tiny_config_dict()),
                                  2).pooling == "max_ends"


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
