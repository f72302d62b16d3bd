"""modeling.config: Google's and Hugging Face's config files, validation, GELU meaning."""

import dataclasses
import json

import pytest

from modeling.config import ACTIVATIONS, BertConfig, ConfigError

GOOGLE_BASE = {
    "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": 12,
    "type_vocab_size": 2, "vocab_size": 30522,
}


def test_google_file_round_trip_keeps_tanh_gelu(tmp_path):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(dict(GOOGLE_BASE, directionality="bidi", pooler_type="first")))
    config = BertConfig.from_json_file(str(path))
    assert config.hidden_act == "gelu_tanh"
    assert config.type_vocab_size == 2 and config.head_size == 64
    out = tmp_path / "out.json"
    config.to_json_file(str(out))
    assert json.loads(out.read_text()) == GOOGLE_BASE  # Google's own spelling comes back.
    assert BertConfig.from_json_file(str(out)) == config
    assert json.loads(config.to_json_string()) == config.to_dict()


def test_exact_gelu_is_written_explicitly():
    config = BertConfig(vocab_size=10, hidden_act="gelu_exact")
    assert config.to_dict()["hidden_act"] == "gelu_exact"
    assert BertConfig.from_dict(config.to_dict()) == config
    assert config.to_hf_dict()["hidden_act"] == "gelu"
    assert BertConfig(vocab_size=10).to_hf_dict()["hidden_act"] == "gelu_new"
    assert BertConfig.from_dict(dataclasses.asdict(config)) == config


@pytest.mark.parametrize("hf_act, ours", [
    ("gelu", "gelu_exact"), ("gelu_new", "gelu_tanh"), ("gelu_pytorch_tanh", "gelu_tanh"),
    ("relu", "relu"), ("silu", "silu"), ("tanh", "tanh")])
def test_hf_activation_meaning(hf_act, ours):
    config = BertConfig.from_hf_config(dict(GOOGLE_BASE, hidden_act=hf_act, model_type="bert"))
    assert config.hidden_act == ours
    assert config.hidden_act in ACTIVATIONS
    assert BertConfig.from_hf_config(config.to_hf_dict()) == config


def test_hf_config_file_and_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(GOOGLE_BASE, layer_norm_eps=1e-12)))
    assert BertConfig.from_hf_config(str(tmp_path)).hidden_act == "gelu_exact"
    assert BertConfig.from_hf_config(tmp_path / "config.json").vocab_size == 30522
    (tmp_path / "config.json").write_text(json.dumps(dict(GOOGLE_BASE, layer_norm_eps=1e-5)))
    with pytest.raises(ConfigError, match="layer_norm_eps 1e-05"):
        BertConfig.from_hf_config(str(tmp_path))


@pytest.mark.parametrize("changes, message", [
    (dict(hidden_size=100), r"hidden_size \(100\) is not a multiple of num_attention_heads \(12\)"),
    (dict(hidden_act="swiglu"), r"hidden_act 'swiglu' is not supported"),
    (dict(num_hidden_layers=0), r"num_hidden_layers must be positive, found 0"),
    (dict(vocab_size=-3), r"vocab_size must be positive"),
    (dict(intermediate_size=3.5), r"intermediate_size must be an int, found 3.5"),
    (dict(hidden_dropout_prob=1.0), r"hidden_dropout_prob must be a number in \[0, 1\)"),
    (dict(initializer_range=0), r"initializer_range must be a finite number > 0"),
    (dict(initializer_range=float("nan")), r"cfg.json: .*initializer_range must be a finite"),
    (dict(initializer_range=float("inf")), r"cfg.json: .*initializer_range must be a finite"),
    (dict(hidden_dropout_prob=float("nan")), r"cfg.json: .*hidden_dropout_prob must be a number"),
    (dict(attention_probs_dropout_prob=float("-inf")),
     r"cfg.json: .*attention_probs_dropout_prob must be a number"),
])
def test_validation_messages(changes, message):
    with pytest.raises(ConfigError, match=message):
        BertConfig.from_dict(dict(GOOGLE_BASE, **changes), source="cfg.json")


def test_nan_initializer_range_in_a_file_is_refused(tmp_path):
    # json reads the literal NaN; the run would otherwise fail later, blaming the learning rate.
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(dict(GOOGLE_BASE, initializer_range=float("nan"))))
    assert "NaN" in path.read_text()
    with pytest.raises(ConfigError, match=r"bert_config.json: BertConfig.initializer_range "
                                          r"must be a finite number > 0, found nan"):
        BertConfig.from_json_file(str(path))


@pytest.mark.parametrize("text, message", [
    (json.dumps(dict(GOOGLE_BASE, layer_norm_eps="abc")),
     r"layer_norm_eps must be a finite number, found 'abc'"),
    (json.dumps(dict(GOOGLE_BASE, layer_norm_eps=None)),
     r"layer_norm_eps must be a finite number, found None"),
    (json.dumps(dict(GOOGLE_BASE, layer_norm_eps=True)),
     r"layer_norm_eps must be a finite number, found True"),
    (json.dumps(dict(GOOGLE_BASE, layer_norm_eps=float("nan"))),
     r"layer_norm_eps must be a finite number, found nan"),
    (json.dumps(dict(GOOGLE_BASE, layer_norm_eps=1e-5)), r"layer_norm_eps 1e-05 differs"),
    (json.dumps([dict(GOOGLE_BASE, model_type="bert")]), r"expected a JSON object, found list"),
    ("3", r"expected a JSON object, found int"),
])
def test_bad_hf_config_files(tmp_path, text, message):
    (tmp_path / "config.json").write_text(text)
    for read in (BertConfig.from_hf_config, BertConfig.from_config_file):
        with pytest.raises(ConfigError, match=str(tmp_path / "config.json") + ": " + message):
            read(str(tmp_path / "config.json"))


def test_missing_keys_are_listed(tmp_path):
    values = dict(GOOGLE_BASE)
    del values["hidden_size"], values["type_vocab_size"]
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(values))
    with pytest.raises(ConfigError, match=r"bert_config.json: missing key\(s\) "
                                          r"\['hidden_size', 'type_vocab_size'\]"):
        BertConfig.from_json_file(str(path))
    with pytest.raises(ConfigError, match=r"missing key\(s\) \['vocab_size'\]"):
        BertConfig.from_dict({"hidden_size": 64})
    assert BertConfig.from_dict({"vocab_size": 7}).hidden_size == 768


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        BertConfig.from_json_file(str(tmp_path / "nope.json"))
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(ConfigError, match="not valid JSON"):
        BertConfig.from_json_file(str(tmp_path / "bad.json"))


def test_frozen_and_hashable():
    config = BertConfig(vocab_size=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.hidden_size = 5
    assert hash(config) == hash(BertConfig(vocab_size=10, hidden_act="gelu_tanh"))
