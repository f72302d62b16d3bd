"""checkpoints.convert and the convert_checkpoint.py CLI: tf1 -> hf -> ours -> tf1 is lossless."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import write_vocab
from modeling import checkpoints
from tests.clis import call_main
from test_modeling_reference import run_original_graph, tiny_config_dict, tiny_inputs


@pytest.fixture(scope="module")
def google_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("google")
    config = tiny_config_dict(hidden_act="gelu")
    run_original_graph(config, tiny_inputs(config), save_to=str(directory / "bert_model.ckpt"),
                       seed=2, optimizer_slots=True)
    (directory / "bert_config.json").write_text(json.dumps(config))
    write_vocab(directory / "vocab.txt")
    return directory


def _tf1_arrays(prefix):
    reader = tf.train.load_checkpoint(prefix)
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()
            if n != "global_step" and not n.endswith(("adam_m", "adam_v"))}


def test_round_trip_through_every_format(google_dir, tmp_path):
    hf = checkpoints.convert(str(google_dir), str(tmp_path / "hf"), "hf")
    assert hf.endswith("model.safetensors")
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_config["hidden_act"] == "gelu_new"  # Google's "gelu" is the tanh form.
    assert (tmp_path / "hf" / "vocab.txt").exists()
    ours = checkpoints.convert(str(tmp_path / "hf"), str(tmp_path / "ours"), "ours")
    assert checkpoints.resolve(str(tmp_path / "ours")) == ("ours", ours)
    back = checkpoints.convert(str(tmp_path / "ours"), str(tmp_path / "tf1"), "tf1")
    original = _tf1_arrays(str(google_dir / "bert_model.ckpt"))
    converted = _tf1_arrays(back)
    assert sorted(original) == sorted(converted)
    for name, value in original.items():
        np.testing.assert_array_equal(converted[name], value, err_msg=name)
    assert json.loads((tmp_path / "tf1" / "bert_config.json").read_text())["hidden_act"] == "gelu"


def test_encoder_only_conversion_and_missing_config(google_dir, tmp_path):
    prefix = checkpoints.convert(str(google_dir), str(tmp_path / "enc"), "tf1", model="encoder",
                                 partial=True)
    assert not any(n.startswith("cls/") for n, _ in tf.train.list_variables(prefix))
    os.remove(tmp_path / "enc" / "bert_config.json")
    with pytest.raises(checkpoints.CheckpointError, match="no bert_config.json"):
        checkpoints.convert(str(tmp_path / "enc"), str(tmp_path / "x"), "hf")


def test_cli(google_dir, tmp_path):
    result = call_main("convert_checkpoint", input=google_dir / "bert_model.ckpt",
                       output_dir=tmp_path / "hf", output_format="hf")
    assert result.code == 0, result.stderr[-3000:]
    assert "model.safetensors" in result.stdout
    assert (tmp_path / "hf" / "config.json").exists()


def test_cli_refuses_a_pickle_with_a_clear_error(tmp_path):
    source = tmp_path / "torch"
    source.mkdir()
    (source / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not unpickled")
    result = call_main("convert_checkpoint", input=source, output_dir=tmp_path / "out",
                       output_format="hf")
    assert result.code == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert f"convert_checkpoint.py: error: {source / 'pytorch_model.bin'} is a PyTorch " \
           "pickle" in result.stderr
    assert not (tmp_path / "out").exists()
