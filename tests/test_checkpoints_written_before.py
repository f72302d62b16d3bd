"""Checkpoints and saved Keras configs written before the task models shared their code still load.

Each task model's variables are stored under its attribute names (`model/classifier/dense/
_kernel`, `model/tagger/...`): the names below are the ones every earlier version wrote.
The test writes a checkpoint with exactly those names (a tree of plain `tf.Module`s, no model
class involved) and restores it into today's models, every variable consumed and equal; and
today's `get_config` is the one earlier versions saved.
"""

import numpy as np
import pytest
import tensorflow as tf

from modeling import models
from modeling.config import BertConfig

CONFIG = dict(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=48, hidden_act="gelu_tanh", hidden_dropout_prob=0.1,
              attention_probs_dropout_prob=0.1, max_position_embeddings=32, type_vocab_size=2,
              initializer_range=0.02)
H, I, V, P, T = 32, 48, 40, 32, 2  # hidden, intermediate, vocab, positions, token types

ENCODER = [
    ("encoder/embeddings/layer_norm/beta", [H]),
    ("encoder/embeddings/layer_norm/gamma", [H]),
    ("encoder/embeddings/position_embeddings", [P, H]),
    ("encoder/embeddings/token_type_embeddings", [T, H]),
    ("encoder/embeddings/word_embeddings", [V, H]),
    ("encoder/pooler/_kernel", [H, H]),
    ("encoder/pooler/bias", [H]),
] + [(f"encoder/transformer_layer_{i}/{name}", shape) for i in range(2) for name, shape in (
    ("attention_layer_norm/beta", [H]), ("attention_layer_norm/gamma", [H]),
    ("attention_output/bias", [H]), ("attention_output/kernel", [H, H]),
    ("intermediate/bias", [I]), ("intermediate/kernel", [H, I]),
    ("output_dense/bias", [H]), ("output_dense/kernel", [I, H]),
    ("output_layer_norm/beta", [H]), ("output_layer_norm/gamma", [H]),
    ("query_key_value/bias", [3 * H]), ("query_key_value/kernel", [H, 3 * H]))]


def _dense(scope, inputs, outputs):
    return [(f"{scope}/dense/_kernel", [inputs, outputs]), (f"{scope}/dense/bias", [outputs])]


def _bilstm(i, inputs, units):
    return [(f"bilstm_{i}/{side}_layer/cell/{name}", shape)
            for side in ("backward", "forward") for name, shape in (
                ("bias", [4 * units]), ("kernel", [inputs, 4 * units]),
                ("recurrent_kernel", [units, 4 * units]))]


# model name -> (constructor, the head's variables as earlier versions named them, the
# saved config's keys beyond "name", "trainable", "dtype" and "config").
MODELS = {
    "bert_pretrainer": (lambda c: models.BertPretrainer(c), [
        ("masked_lm/layer_norm/beta", [H]), ("masked_lm/layer_norm/gamma", [H]),
        ("masked_lm/output_bias", [V]), ("masked_lm/transform/bias", [H]),
        ("masked_lm/transform/kernel", [H, H])] + _dense("next_sentence", H, 2), {}),
    "bert_classifier": (lambda c: models.BertClassifier(c, 3), _dense("classifier", H, 3),
                        {"num_labels": 3, "dropout_rate": 0.1}),
    "bert_multiple_choice": (lambda c: models.BertMultipleChoice(c, dropout_rate=0.2),
                             _dense("classifier", H, 1), {"dropout_rate": 0.2}),
    "bert_span_labeler": (lambda c: models.BertSpanLabeler(c), _dense("span", H, 2), {}),
    "bert_token_tagger": (lambda c: models.BertTokenTagger(c, 5), _dense("tagger", H, 5),
                          {"num_labels": 5, "dropout_rate": 0.1}),
    "bert_feature_tagger": (
        lambda c: models.BertFeatureTagger(c, 5, feature_layers="weighted_sum_all",
                                           lstm_units=4),
        _bilstm(0, H, 4) + _bilstm(1, 8, 4) + [("mix/gamma", []), ("mix/mix_weights", [2])]
        + _dense("output_layer", 8, 5),
        {"num_labels": 5, "feature_layers": "weighted_sum_all", "lstm_units": 4,
         "lstm_layers": 2, "dropout_rate": 0.1}),
}


def _checkpoint_with_names(names_and_shapes, path):
    """Writes tf.train.Checkpoint(model=...) whose variables sit at exactly these paths
    (random values); returns path -> value."""
    rng = np.random.default_rng(0)
    root = tf.Module()
    values = {}
    for name, shape in names_and_shapes:
        *scopes, leaf = name.split("/")
        node = root
        for scope in scopes:
            if not hasattr(node, scope):
                setattr(node, scope, tf.Module())
            node = getattr(node, scope)
        values[name] = rng.standard_normal(shape).astype(np.float32)
        setattr(node, leaf, tf.Variable(values[name]))
    return tf.train.Checkpoint(model=root).write(path), values


def _stored(model, path) -> dict:
    """What today's model writes: checkpoint path (without `model/`) -> value."""
    prefix, suffix = "model/", "/.ATTRIBUTES/VARIABLE_VALUE"
    written = tf.train.Checkpoint(model=model).write(path)
    reader = tf.train.load_checkpoint(written)
    return {name[len(prefix):-len(suffix)]: reader.get_tensor(name)
            for name, _ in tf.train.list_variables(written)
            if name.startswith(prefix) and name.endswith(suffix)}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_checkpoint_written_before_restores_into_todays_model(name, tmp_path):
    make, head, _ = MODELS[name]
    prefix, values = _checkpoint_with_names(ENCODER + head, str(tmp_path / "before"))
    model = make(BertConfig(**CONFIG))
    tf.train.Checkpoint(model=model).read(prefix).assert_consumed()
    # Written again, every value is back under the name it was written with: nothing
    # missing, nothing extra, nothing swapped.
    again = _stored(model, str(tmp_path / "after"))
    assert sorted(again) == sorted(values)
    for path, value in values.items():
        np.testing.assert_array_equal(again[path], value, err_msg=path)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_saved_keras_config_is_the_one_written_before(name):
    make, _, extra = MODELS[name]
    model = make(BertConfig(**CONFIG))
    config = model.get_config()
    assert config["name"].startswith(name)
    assert {k: v for k, v in config.items() if k not in ("name", "dtype")} == {
        "trainable": True, "config": CONFIG, **extra}
    assert config["dtype"]["config"] == {"name": "float32"}
    assert type(model).from_config(config).get_config() == config


# model name -> where a .keras file written before stores the head's weights (the paths of
# model.weights.h5 outside the encoder); Keras walks the model's attributes to name them.
KERAS_HEAD_WEIGHTS = {
    "bert_pretrainer": ["layers/dense_logits_head/dense/vars/0",
                        "layers/dense_logits_head/dense/vars/1",
                        "layers/masked_lm_head/layer_norm/vars/0",
                        "layers/masked_lm_head/layer_norm/vars/1",
                        "layers/masked_lm_head/transform/vars/0",
                        "layers/masked_lm_head/transform/vars/1",
                        "layers/masked_lm_head/vars/0"],
    "bert_classifier": ["classifier/dense/vars/0", "classifier/dense/vars/1"],
    "bert_multiple_choice": ["classifier/dense/vars/0", "classifier/dense/vars/1"],
    "bert_span_labeler": ["layers/dense_logits_head/dense/vars/0",
                          "layers/dense_logits_head/dense/vars/1"],
    "bert_token_tagger": ["layers/dense_logits_head/dense/vars/0",
                          "layers/dense_logits_head/dense/vars/1"],
    "bert_feature_tagger": [
        f"bilstm_{i}/{side}_layer/cell/vars/{j}" for i in range(2)
        for side in ("backward", "forward") for j in range(3)] + [
        "layers/dense_logits_head/dense/vars/0", "layers/dense_logits_head/dense/vars/1",
        "layers/scalar_mix/vars/0", "layers/scalar_mix/vars/1"],
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_keras_file_stores_the_head_where_it_did_before(name, tmp_path):
    import io
    import zipfile

    import h5py

    make, _, _ = MODELS[name]
    path = str(tmp_path / "model.keras")
    make(BertConfig(**CONFIG)).save(path)
    with zipfile.ZipFile(path) as archive:
        weights = h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r")
        found = []
        weights.visit(lambda key: found.append(key)
                      if isinstance(weights[key], h5py.Dataset) else None)
    assert sorted(k for k in found if "encoder" not in k) == sorted(KERAS_HEAD_WEIGHTS[name])
