"""Hugging Face directories (safetensors, no PyTorch): both GELU forms vs a numpy forward pass."""

import json

import numpy as np
import pytest

from modeling import checkpoints
from modeling.checkpoints import CheckpointError, load_pretrained
from modeling.config import BertConfig
from modeling.encoder import BertEncoder
from modeling.models import BertPretrainer
from test_modeling_reference import (numpy_forward, random_hf_weights, tiny_config_dict,
                                     tiny_inputs, write_hf_dir)

ATOL = 1e-5


def _check(model, expected, inputs, with_heads=True):
    enc = model if isinstance(model, BertEncoder) else model.encoder
    out = enc({k: inputs[k] for k in ("input_ids", "input_mask", "segment_ids")})
    for i, (ours, ref) in enumerate(zip(out["encoder_outputs"], expected["layers"])):
        np.testing.assert_allclose(np.asarray(ours), ref, atol=ATOL, err_msg=f"layer {i}")
    np.testing.assert_allclose(np.asarray(out["pooled_output"]), expected["pooled"], atol=ATOL)
    if with_heads:
        heads = model(inputs)
        np.testing.assert_allclose(np.asarray(heads["masked_lm_logits"]), expected["mlm"],
                                   atol=ATOL)
        np.testing.assert_allclose(np.asarray(heads["next_sentence_logits"]), expected["nsp"],
                                   atol=ATOL)


@pytest.mark.parametrize("hf_act, form", [("gelu", "gelu_exact"), ("gelu_new", "gelu_tanh")])
def test_hf_directory_matches_numpy(tmp_path, hf_act, form):
    config_dict = tiny_config_dict()
    weights = random_hf_weights(config_dict, seed=5)
    weights["bert.embeddings.position_ids"] = np.arange(64, dtype=np.int64)[None]  # a buffer
    directory = write_hf_dir(tmp_path / "hf", weights, config_dict, hf_act)
    inputs = tiny_inputs(config_dict)
    expected = numpy_forward(weights, config_dict, inputs, form)

    config = BertConfig.from_hf_config(str(directory))
    assert config.hidden_act == form
    model = BertPretrainer(config)
    report = load_pretrained(str(directory), model)
    assert report.kind == "hf" and report.ok
    assert report.ignored == ["bert.embeddings.position_ids"]
    _check(model, expected, inputs)

    # The GELU form survives a TF1 export (bert_config.json) and an HF export.
    out = tmp_path / "tf1"
    checkpoints.export_tf1_checkpoint(model, config, str(out))
    written = json.loads((out / "bert_config.json").read_text())
    assert written["hidden_act"] == {"gelu_exact": "gelu_exact", "gelu_tanh": "gelu"}[form]
    again = BertPretrainer(BertConfig.from_json_file(str(out / "bert_config.json")))
    load_pretrained(str(out), again)
    _check(again, expected, inputs)
    hf_out = tmp_path / "hf_again"
    checkpoints.export_hf_checkpoint(again, again.config, str(hf_out))
    assert json.loads((hf_out / "config.json").read_text())["hidden_act"] == (
        {"gelu_exact": "gelu", "gelu_tanh": "gelu_new"}[form])
    third = BertPretrainer(BertConfig.from_hf_config(str(hf_out)))
    load_pretrained(str(hf_out), third)
    _check(third, expected, inputs)


def test_bare_bert_model_file_without_prefix_and_old_layer_norm_names(tmp_path):
    config_dict = tiny_config_dict()
    weights = random_hf_weights(config_dict, seed=6, with_heads=False)
    bare = {}
    for name, value in weights.items():
        name = name[len("bert."):]
        name = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta")
        bare[name] = value
    directory = write_hf_dir(tmp_path / "hf", bare, config_dict, "gelu")
    inputs = tiny_inputs(config_dict)
    expected = numpy_forward(weights, config_dict, inputs, "gelu_exact")
    config = BertConfig.from_hf_config(str(directory / "config.json"))
    encoder = BertEncoder(config)
    load_pretrained(str(directory / "model.safetensors"), encoder)
    _check(encoder, expected, inputs, with_heads=False)
    with pytest.raises(CheckpointError, match="missing from the checkpoint: cls.predictions"):
        load_pretrained(str(directory), BertPretrainer(config))


def test_hf_config_translation_errors(tmp_path):
    with pytest.raises(ValueError, match="position_embedding_type 'relative_key'"):
        BertConfig.from_hf_config(dict(vocab_size=10, position_embedding_type="relative_key"))
    with pytest.raises(ValueError, match="model_type 'roberta'"):
        BertConfig.from_hf_config(dict(vocab_size=10, model_type="roberta"))
    with pytest.raises(ValueError, match="hidden_act 'quick_gelu'"):
        BertConfig.from_hf_config(dict(vocab_size=10, hidden_act="quick_gelu"))


@pytest.mark.parametrize("config_changes, weight_changes, vocab_blamed", [
    (dict(hidden_size=64, intermediate_size=128), {}, False),  # config too wide
    (dict(vocab_size=109), dict(vocab_size=99), True),  # a grown vocab: rows differ only
])
def test_embedding_mismatch_blames_vocab_only_for_rows(tmp_path, config_changes,
                                                       weight_changes, vocab_blamed):
    config_dict = tiny_config_dict(**config_changes)
    weights = random_hf_weights(tiny_config_dict(**weight_changes), seed=7)
    directory = write_hf_dir(tmp_path / "hf", weights, config_dict, "gelu")
    model = BertPretrainer(BertConfig.from_hf_config(str(directory)))
    with pytest.raises(CheckpointError) as raised:
        load_pretrained(str(directory), model)
    message = str(raised.value)
    expected = (config_dict["vocab_size"], config_dict["hidden_size"])
    found = weights["bert.embeddings.word_embeddings.weight"].shape
    assert (f"word_embeddings.weight: checkpoint {list(found)} vs model {list(expected)}"
            in message)
    assert ("has a vocab of" in message) == vocab_blamed
    assert ("vocab_size=" in message) == vocab_blamed
