"""Keras layer contract of the encoder, heads and task models: config round trips, saving,
dtype policies, jit_compile, padding mask, dropout."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from modeling.config import BertConfig
from modeling.embeddings import BertEmbeddings
from modeling.encoder import BertEncoder
from modeling.heads import DenseLogitsHead, MaskedLMHead
from modeling.models import BertClassifier, BertPretrainer, BertSpanLabeler, BertTokenTagger
from modeling.transformer import FusedDense, TransformerBlock
from test_modeling_reference import tiny_config_dict, tiny_inputs

CONFIG = BertConfig.from_dict(tiny_config_dict())
INPUTS = tiny_inputs(tiny_config_dict())
ENCODER_INPUTS = {k: INPUTS[k] for k in ("input_ids", "input_mask", "segment_ids")}


@pytest.fixture
def policy():
    """Sets a global dtype policy for one test and always restores float32."""
    yield keras.config.set_dtype_policy
    keras.config.set_dtype_policy("float32")


@pytest.mark.parametrize("layer", [
    BertEmbeddings(99, 32, 64, 2, initializer_range=0.05, dropout_rate=0.2),
    BertEmbeddings(99, 32, 64, 2, use_one_hot_embeddings=True),
    TransformerBlock(32, 4, 64, hidden_act="gelu_exact", hidden_dropout_prob=0.3,
                     attention_probs_dropout_prob=0.2, initializer_range=0.03),
    MaskedLMHead(99, 32, hidden_act="relu", initializer_range=0.04),
    DenseLogitsHead(5, 32, dropout_rate=0.25, initializer_range=0.01),
    FusedDense(48, 32, activation="gelu_exact", initializer_range=0.07),
], ids=lambda layer: type(layer).__name__)
def test_layer_get_config_json_round_trip(layer):
    config = json.loads(json.dumps(layer.get_config()))
    clone = type(layer).from_config(config)
    assert clone.get_config() == layer.get_config()
    registered = keras.saving.get_registered_name(type(layer))
    assert registered == f"bert>{type(layer).__name__}"
    assert keras.saving.get_registered_object(registered) is type(layer)


@pytest.mark.parametrize("make", [
    lambda: BertEncoder(CONFIG),
    lambda: BertPretrainer(CONFIG),
    lambda: BertClassifier(CONFIG, num_labels=3, dropout_rate=0.2),
    lambda: BertSpanLabeler(CONFIG),
    lambda: BertTokenTagger(CONFIG, num_labels=4),
], ids=["encoder", "pretrainer", "classifier", "span", "tagger"])
def test_model_keras_file_round_trip(tmp_path, make):
    model = make()
    config = json.loads(json.dumps(model.get_config()))
    assert type(model).from_config(config).get_config() == model.get_config()
    expected = model(INPUTS)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded) is type(model)
    got = loaded(INPUTS)
    for key in expected:
        if key == "encoder_outputs":
            continue
        np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(expected[key]))


def test_gelu_form_survives_keras_file(tmp_path):
    exact = BertConfig.from_dict(tiny_config_dict(hidden_act="gelu_exact"))
    model = BertEncoder(exact)
    model.save(str(tmp_path / "m.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "m.keras"))
    assert loaded.config.hidden_act == "gelu_exact"
    assert loaded.transformer_layers[0].hidden_act == "gelu_exact"


def test_outputs_and_shapes():
    model = BertPretrainer(CONFIG)
    enc = model.encoder(ENCODER_INPUTS)
    assert enc["sequence_output"].shape == (3, 16, 32)
    assert enc["pooled_output"].shape == (3, 32)
    assert len(enc["encoder_outputs"]) == 2
    out = model(INPUTS)
    assert out["masked_lm_logits"].shape == (3, 4, 99)
    assert out["next_sentence_logits"].shape == (3, 2)
    assert model.encoder.word_embeddings.shape == (99, 32)
    assert BertTokenTagger(CONFIG, 7)(INPUTS)["logits"].shape == (3, 16, 7)


def test_one_hot_embedding_lookup_gives_the_same_numbers():
    """--use_one_hot_embeddings (the original's TPU lookup) changes the op, not the result."""
    gather = BertEncoder(CONFIG)
    one_hot = BertEncoder(CONFIG, use_one_hot_embeddings=True)
    one_hot.set_weights(gather.get_weights())
    np.testing.assert_allclose(one_hot(ENCODER_INPUTS)["sequence_output"].numpy(),
                               gather(ENCODER_INPUTS)["sequence_output"].numpy(), atol=1e-6)
    assert one_hot.get_config()["use_one_hot_embeddings"] is True


def test_padding_does_not_change_real_tokens():
    model = BertEncoder(CONFIG)
    before = model(ENCODER_INPUTS)["sequence_output"].numpy()
    changed = dict(ENCODER_INPUTS)
    ids = changed["input_ids"].copy()
    ids[changed["input_mask"] == 0] = 7  # Different tokens in the padding.
    changed["input_ids"] = ids
    after = model(changed)["sequence_output"].numpy()
    real = ENCODER_INPUTS["input_mask"].astype(bool)
    np.testing.assert_allclose(after[real], before[real], atol=1e-6)
    assert np.abs(after[~real] - before[~real]).max() > 1e-3


def test_dropout_only_in_training():
    model = BertClassifier(CONFIG, num_labels=2)
    a = model(INPUTS, training=False)["logits"].numpy()
    b = model(INPUTS, training=False)["logits"].numpy()
    np.testing.assert_array_equal(a, b)
    c = model(INPUTS, training=True)["logits"].numpy()
    assert np.abs(a - c).max() > 1e-6


def test_initializers_follow_config():
    config = BertConfig.from_dict(tiny_config_dict(initializer_range=0.5, hidden_size=64,
                                                   intermediate_size=256, vocab_size=500))
    model = BertPretrainer(config)
    kernel = model.encoder.transformer_layers[0].intermediate.kernel.numpy()
    assert 0.35 < kernel.std() < 0.5 and np.abs(kernel).max() <= 1.0 + 1e-6  # truncated at 2 sd
    assert np.all(model.masked_lm.output_bias.numpy() == 0)
    ln = model.encoder.transformer_layers[0].attention_layer_norm
    assert ln.epsilon == 1e-12


@pytest.mark.parametrize("name, tol", [("mixed_bfloat16", 0.15), ("mixed_float16", 0.02),
                                       ("float32", 0.0)])
def test_dtype_policies(policy, name, tol):
    reference = BertPretrainer(CONFIG)
    expected = reference(INPUTS)
    policy(name)
    model = BertPretrainer(CONFIG)
    model.set_weights(reference.get_weights())
    compute = keras.config.dtype_policy().compute_dtype
    enc = model.encoder(ENCODER_INPUTS)
    assert enc["sequence_output"].dtype == compute
    assert model.encoder.word_embeddings.dtype == "float32"
    out = model(INPUTS)
    for key in ("masked_lm_logits", "next_sentence_logits"):
        assert out[key].dtype == "float32"
        np.testing.assert_allclose(out[key].numpy(), expected[key].numpy(), atol=tol * 10,
                                   rtol=tol)
    classifier = BertClassifier(CONFIG, num_labels=2)
    assert classifier(INPUTS)["logits"].dtype == "float32"
    span = BertSpanLabeler(CONFIG)(INPUTS)
    assert span["start_logits"].dtype == "float32"


def test_dtype_argument_without_global_policy():
    model = BertEncoder(CONFIG, dtype="mixed_bfloat16")
    assert model.transformer_layers[1].compute_dtype == "bfloat16"
    assert model(ENCODER_INPUTS)["sequence_output"].dtype == "bfloat16"
    assert keras.config.dtype_policy().name == "float32"


def test_jit_compile_matches_eager():
    model = BertPretrainer(CONFIG)
    eager = model(INPUTS)
    compiled = tf.function(lambda x: model(x, training=False), jit_compile=True)(INPUTS)
    for key in eager:
        np.testing.assert_allclose(compiled[key].numpy(), eager[key].numpy(), atol=1e-5)


@pytest.mark.parametrize("act", ["gelu_tanh", "gelu_exact", "relu", None])
def test_fused_dense_matches_keras_dense(act):
    from modeling import activations

    layer = FusedDense(24, 16, activation=act)
    layer.build()
    x = np.random.default_rng(0).normal(size=(5, 16)).astype(np.float32)
    expected = x @ layer.kernel.numpy() + layer.bias.numpy()
    if act:
        expected = np.asarray(activations.get(act)(expected))
    np.testing.assert_allclose(np.asarray(layer(x)), expected, atol=1e-5)


def test_unknown_inputs_are_reported():
    with pytest.raises(KeyError, match="lack \\['segment_ids'\\]"):
        BertEncoder(CONFIG)({"input_ids": INPUTS["input_ids"], "input_mask": INPUTS["input_mask"]})


@pytest.mark.parametrize("pooling", ["mean", "max", "attention"])
def test_document_classifier_pools_the_real_windows_only(pooling):
    """BertDocumentClassifier: a document's logits are the head on the pooling of its
    windows' pooled outputs (mean / max / attention-weighted), all-zero padding windows
    change nothing, and the config round-trips the pooling."""
    from modeling.models import BertDocumentClassifier

    config = BertConfig.from_dict(tiny_config_dict())
    model = BertDocumentClassifier(config, 3, pooling=pooling)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, config.vocab_size, size=(1, 2, 8)).astype(np.int32)
    real = {"input_ids": ids, "input_mask": np.ones_like(ids),
            "segment_ids": np.zeros_like(ids)}
    padded = {k: np.concatenate([v, np.zeros((1, 3, 8), np.int32)], axis=1)
              for k, v in real.items()}
    logits = model(real, training=False)["logits"].numpy()
    np.testing.assert_allclose(model(padded, training=False)["logits"].numpy(), logits,
                               atol=1e-5)
    pooled = model.encoder({k: v[0] for k, v in real.items()},
                           training=False)["pooled_output"].numpy()      # [2, hidden]
    if pooling == "mean":
        document = pooled.mean(0)
    elif pooling == "max":
        document = pooled.max(0)
    else:
        scores = model.window_attention(pooled).numpy()[:, 0]
        weights = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
        document = (weights[:, None] * pooled).sum(0)
    np.testing.assert_allclose(model.classifier(document[None], training=False).numpy(),
                               logits, atol=1e-5)
    assert BertDocumentClassifier.from_config(model.get_config()).pooling == pooling
    with pytest.raises(ValueError, match="pooling='sum'"):
        BertDocumentClassifier(config, 3, pooling="sum")
