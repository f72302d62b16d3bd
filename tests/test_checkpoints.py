"""modeling.checkpoints: TF1 layout (against Google's own graph), our checkpoints, exports."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from modeling import checkpoints
from modeling.checkpoints import CheckpointError, load_pretrained
from modeling.config import BertConfig
from modeling.encoder import BertEncoder
from modeling.models import BertClassifier, BertPretrainer, BertSpanLabeler
from test_modeling_reference import run_original_graph, tiny_config_dict, tiny_inputs

ATOL = 1e-5


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """A random BERT saved by the original graph (with optimizer slots), and its outputs."""
    directory = tmp_path_factory.mktemp("google")
    config = tiny_config_dict()
    inputs = tiny_inputs(config)
    prefix = str(directory / "bert_model.ckpt")
    outputs = run_original_graph(config, inputs, save_to=prefix, seed=1, optimizer_slots=True)
    (directory / "bert_config.json").write_text(json.dumps(config))
    return dict(dir=str(directory), prefix=prefix, config=config, inputs=inputs,
                outputs=outputs)


def _encoder_inputs(inputs):
    return {k: inputs[k] for k in ("input_ids", "input_mask", "segment_ids")}


def _assert_matches_original(model, original, atol=ATOL):
    inputs = original["inputs"]
    expected = original["outputs"]
    enc = model.encoder(_encoder_inputs(inputs))
    assert len(enc["encoder_outputs"]) == len(expected["layers"])
    for i, (ours, theirs) in enumerate(zip(enc["encoder_outputs"], expected["layers"])):
        np.testing.assert_allclose(np.asarray(ours), theirs, atol=atol, err_msg=f"layer {i}")
    np.testing.assert_allclose(np.asarray(enc["pooled_output"]), expected["pooled"], atol=atol)
    out = model(inputs)
    np.testing.assert_allclose(np.asarray(out["masked_lm_logits"]), expected["mlm"], atol=atol)
    np.testing.assert_allclose(np.asarray(out["next_sentence_logits"]), expected["nsp"],
                               atol=atol)


def test_tf1_checkpoint_matches_original_graph(original):
    config = BertConfig.from_json_file(original["dir"] + "/bert_config.json")
    assert config.hidden_act == "gelu_tanh"
    model = BertPretrainer(config)
    report = load_pretrained(original["dir"], model)
    assert report.kind == "tf1" and report.ok
    assert "global_step" in report.ignored
    assert any(n.endswith("/adam_m") for n in report.ignored)
    _assert_matches_original(model, original)


def test_tf1_prefix_into_classifier_is_partial(original):
    config = BertConfig.from_dict(original["config"])
    classifier = BertClassifier(config, num_labels=3)
    with pytest.raises(CheckpointError) as err:
        load_pretrained(original["prefix"], classifier)
    message = str(err.value)
    assert "missing from the checkpoint: output_weights, output_bias" in message
    assert "unexpected in the checkpoint: cls/predictions/output_bias" in message
    assert "partial=True" in message
    report = load_pretrained(original["prefix"], classifier, partial=True)
    assert report.missing == ["output_weights", "output_bias"]
    seq = classifier.encoder(_encoder_inputs(original["inputs"]))["sequence_output"]
    np.testing.assert_allclose(np.asarray(seq), original["outputs"]["layers"][-1], atol=ATOL)
    assert classifier(original["inputs"])["logits"].shape == (3, 3)


def test_strict_errors_name_missing_unexpected_and_shapes(original):
    bigger = BertConfig.from_dict(tiny_config_dict(num_hidden_layers=3))
    with pytest.raises(CheckpointError, match=r"16 missing from the checkpoint: "
                       r"bert/encoder/layer_2/attention/self/query/kernel"):
        load_pretrained(original["prefix"], BertPretrainer(bigger))
    encoder = BertEncoder(BertConfig.from_dict(original["config"]))
    with pytest.raises(CheckpointError, match=r"7 unexpected in the checkpoint: cls/"):
        load_pretrained(original["prefix"], encoder)
    other_vocab = BertConfig.from_dict(tiny_config_dict(vocab_size=120))
    with pytest.raises(CheckpointError) as err:
        load_pretrained(original["prefix"], BertPretrainer(other_vocab), partial=True)
    assert ("bert/embeddings/word_embeddings: checkpoint [99, 32] vs model [120, 32]"
            in str(err.value))
    # A failed strict load leaves the model untouched.
    before = encoder.word_embeddings.numpy().copy()
    with pytest.raises(CheckpointError):
        load_pretrained(original["prefix"], encoder)
    np.testing.assert_array_equal(encoder.word_embeddings.numpy(), before)


def test_bad_paths_are_reported(tmp_path):
    with pytest.raises(CheckpointError, match="not a checkpoint prefix"):
        load_pretrained(str(tmp_path / "nothing"), BertEncoder(BertConfig(vocab_size=10,
                                                                          hidden_size=8,
                                                                          num_hidden_layers=1,
                                                                          num_attention_heads=2,
                                                                          intermediate_size=8)))
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        checkpoints.resolve(str(tmp_path))


def test_export_tf1_has_original_names_and_original_graph_reads_it(original, tmp_path):
    config = BertConfig.from_dict(original["config"])
    model = BertPretrainer(config)
    load_pretrained(original["prefix"], model)
    prefix = checkpoints.export_tf1_checkpoint(model, config, str(tmp_path / "out"))
    exported = dict(tf.train.list_variables(prefix))
    theirs = {n: s for n, s in tf.train.list_variables(original["prefix"])
              if n != "global_step" and not n.endswith(("adam_m", "adam_v"))}
    assert exported == theirs
    assert tf.train.latest_checkpoint(str(tmp_path / "out")) == prefix
    reread = BertConfig.from_json_file(str(tmp_path / "out" / "bert_config.json"))
    assert reread == config
    # Google's graph restores our export with a plain Saver and computes the same thing.
    again = run_original_graph(original["config"], original["inputs"], checkpoint=prefix)
    for a, b in zip(again["layers"], original["outputs"]["layers"]):
        np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(again["mlm"], original["outputs"]["mlm"], atol=1e-6)


def test_our_checkpoint_with_optimizer_round_trip(original, tmp_path):
    config = BertConfig.from_dict(original["config"])
    model = BertPretrainer(config)
    load_pretrained(original["prefix"], model)
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    step = tf.Variable(7, dtype=tf.int64)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model, optimizer=optimizer, step=step),
        str(tmp_path / "train"), max_to_keep=1)
    manager.save()

    restored = BertPretrainer(config)
    report = load_pretrained(str(tmp_path / "train"), restored)
    assert report.kind == "ours" and report.ok
    assert "optimizer" in report.ignored and "step" in report.ignored
    _assert_matches_original(restored, original)

    classifier = BertClassifier(config, num_labels=2)
    with pytest.raises(CheckpointError, match="model/classifier/dense/_kernel"):
        load_pretrained(str(tmp_path / "train"), classifier)
    report = load_pretrained(str(tmp_path / "train"), classifier, partial=True)
    assert sorted(report.missing) == ["model/classifier/dense/_kernel",
                                      "model/classifier/dense/bias"]
    seq = classifier.encoder(_encoder_inputs(original["inputs"]))["sequence_output"]
    np.testing.assert_allclose(np.asarray(seq), original["outputs"]["layers"][-1], atol=ATOL)

    # A bare encoder reads the encoder part of a task model's checkpoint, and vice versa.
    encoder = BertEncoder(config)
    load_pretrained(str(tmp_path / "train"), encoder, partial=True)
    enc_prefix = checkpoints.save_ours(encoder, str(tmp_path / "enc"), config)
    span = BertSpanLabeler(config)
    report = load_pretrained(enc_prefix, span, partial=True)
    assert report.loaded and not report.unexpected
    out = span(original["inputs"])
    assert out["start_logits"].shape == (3, 16) and out["start_logits"].dtype == "float32"


def test_classifier_checkpoint_names_follow_run_classifier(tmp_path):
    config = BertConfig.from_dict(tiny_config_dict())
    model = BertClassifier(config, num_labels=3)
    prefix = checkpoints.export_tf1_checkpoint(model, config, str(tmp_path))
    shapes = dict(tf.train.list_variables(prefix))
    assert shapes["output_weights"] == [3, 32] and shapes["output_bias"] == [3]
    again = BertClassifier(config, num_labels=3)
    load_pretrained(prefix, again)
    np.testing.assert_array_equal(again.classifier.dense.kernel.numpy(),
                                  model.classifier.dense.kernel.numpy())


def test_googles_graph_runs_an_exported_ltr_model_bidirectionally(tmp_path):
    """What the TF1 export's warning says: the original's modeling.py reads the
    bert_config.json we write (with "causal_attention": true) and ignores the key, so it
    computes our bidirectional encoder on the same weights, not our left-to-right one."""
    config = BertConfig.from_dict(dict(tiny_config_dict(), causal_attention=True))
    inputs = tiny_inputs(tiny_config_dict())
    causal = BertEncoder(config)
    ours = causal(_encoder_inputs(inputs))
    prefix = checkpoints.export_tf1_checkpoint(causal, config, str(tmp_path / "ltr"))
    written = json.loads((tmp_path / "ltr" / "bert_config.json").read_text())
    assert written["causal_attention"] is True
    theirs = run_original_graph(written, inputs, checkpoint=prefix, with_heads=False)
    bidirectional = BertEncoder(BertConfig.from_dict(tiny_config_dict()))
    load_pretrained(prefix, bidirectional)
    expected = bidirectional(_encoder_inputs(inputs))["sequence_output"].numpy()
    np.testing.assert_allclose(theirs["layers"][-1], expected, atol=ATOL)
    assert np.abs(theirs["layers"][-1] - ours["sequence_output"].numpy()).max() > 1e-3
