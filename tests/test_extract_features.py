"""extract_features.py: the original's JSON lines, checked against Google's graph and tokenizer."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT, write_vocab
from original_bert import original_module
from test_modeling_reference import (random_hf_weights, run_original_graph, tiny_config_dict,
                                     write_hf_dir)

import extract_features  # noqa: E402  (defines no flags at import)

LINES = [
    "The cat sat on the mat.",
    "the dog ran far away ||| he was big",
    "",
    "Unaffable cats want to run home, and the big red dog ran far far away from the mat!",
    "she sat ||| the cat sat on the mat and the dog ran far away, 1 2 3",
]
SEQ = 16
LAYERS = [-1, -2, 0]


def _original_features(vocab_file, lines, seq_length):
    """Tokens and ids the way Google's script builds them (original tokenizer)."""
    tokenization = original_module("tokenization")
    tokenizer = tokenization.FullTokenizer(vocab_file=vocab_file, do_lower_case=True)
    rows = []
    for line in lines:
        a, _, b = line.partition(" ||| ")
        ta = tokenizer.tokenize(a)
        tb = tokenizer.tokenize(b) if b else []
        if tb:
            while len(ta) + len(tb) > seq_length - 3:
                (ta if len(ta) > len(tb) else tb).pop()
        else:
            ta = ta[:seq_length - 2]
        tokens = ["[CLS]"] + ta + ["[SEP]"] + (tb + ["[SEP]"] if tb else [])
        types = [0] * (len(ta) + 2) + [1] * (len(tb) + 1 if tb else 0)
        rows.append((tokens, tokenizer.convert_tokens_to_ids(tokens), types))
    ids = np.zeros((len(rows), seq_length), np.int32)
    mask = np.zeros_like(ids)
    segs = np.zeros_like(ids)
    for i, (tokens, row_ids, types) in enumerate(rows):
        ids[i, :len(row_ids)] = row_ids
        mask[i, :len(row_ids)] = 1
        segs[i, :len(types)] = types
    return [r[0] for r in rows], dict(input_ids=ids, input_mask=mask, segment_ids=segs)


def _check_output(path, tokens, layers):
    lines = open(path, encoding="utf-8").read().splitlines()
    assert len(lines) == len(LINES)
    for i, line in enumerate(lines):
        record = json.loads(line)
        assert list(record) == ["linex_index", "features"]
        assert record["linex_index"] == i
        assert [f["token"] for f in record["features"]] == tokens[i]
        for position, feature in enumerate(record["features"]):
            assert list(feature) == ["token", "layers"]
            assert [layer["index"] for layer in feature["layers"]] == LAYERS
            for layer in feature["layers"]:
                values = np.array(layer["values"])
                expected = layers[layer["index"]][i, position]
                np.testing.assert_allclose(values, expected, atol=1e-4)
                assert all(v == round(v, 6) for v in layer["values"])


@pytest.fixture(scope="module")
def google_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("google_ckpt")
    config = tiny_config_dict(vocab_size=len(open(write_vocab(directory / "vocab.txt"))
                                             .read().splitlines()))
    (directory / "bert_config.json").write_text(json.dumps(config))
    inputs_dummy = dict(input_ids=np.zeros((1, SEQ), np.int32),
                        input_mask=np.ones((1, SEQ), np.int32),
                        segment_ids=np.zeros((1, SEQ), np.int32))
    run_original_graph(config, inputs_dummy, save_to=str(directory / "bert_model.ckpt"),
                       seed=4, with_heads=False)
    tokens, inputs = _original_features(str(directory / "vocab.txt"), LINES, SEQ)
    reference = run_original_graph(config, inputs, checkpoint=str(directory / "bert_model.ckpt"),
                                   with_heads=False)
    (directory / "input.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return directory, tokens, reference["layers"]


def _run(args, env_extra=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env_extra or {}))
    result = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "extract_features.py")]
                            + args, check=False, capture_output=True, text=True, env=env,
                            timeout=300,
                            cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_cli_matches_original_graph(google_dir, tmp_path, strategy):
    directory, tokens, layers = google_dir
    out = tmp_path / "out.jsonl"
    _run([f"--input_file={directory / 'input.txt'}", f"--output_file={out}",
          f"--init_checkpoint={directory / 'bert_model.ckpt'}",
          f"--bert_config_file={directory / 'bert_config.json'}",
          f"--vocab_file={directory / 'vocab.txt'}", "--layers=-1,-2,0",
          f"--max_seq_length={SEQ}", "--batch_size=2", "--do_lower_case=true",
          f"--distribution_strategy={strategy}",
          # Length buckets on mirrored, padding to max_seq_length on one device: both
          # equal the original graph.
          "--bucket_boundaries=4,8" if strategy == "mirrored" else "--bucket_by_length=false",
          "--num_cpu_devices=2" if strategy == "mirrored" else "--num_cpu_devices=0"])
    _check_output(out, tokens, layers)


@pytest.mark.parametrize("buckets", [(), (4, 8, SEQ)])
def test_in_process_from_tf1_directory_defaults(google_dir, tmp_path, buckets):
    """Config and vocab default to the checkpoint directory's files; with and without
    length buckets (lines of 3 to 16 tokens) the vectors equal the original graph's."""
    from modeling import checkpoints
    from modeling.encoder import BertEncoder
    from data_prep.tokenization import FullTokenizer

    directory, tokens, layers = google_dir
    config, vocab = extract_features._defaults_from_checkpoint(str(directory), None, None)
    assert vocab == str(directory / "vocab.txt")
    encoder = BertEncoder(config)
    checkpoints.load_pretrained(str(directory), encoder)
    features = extract_features.convert_examples(
        extract_features.read_examples(str(directory / "input.txt")), SEQ,
        FullTokenizer(vocab, do_lower_case=True))
    assert [f.tokens for f in features] == tokens
    out = tmp_path / "out.jsonl"
    with open(out, "w", encoding="utf-8") as f:
        for feature, values in extract_features.compute_layers(
                encoder, features, LAYERS, 2, bucket_boundaries=buckets, window_batches=1):
            f.write(extract_features.feature_json(feature, values, LAYERS))
    _check_output(out, tokens, layers)


def test_hf_directory_defaults(tmp_path):
    (tmp_path / "hf").mkdir()
    vocab_file = write_vocab(tmp_path / "hf" / "vocab.txt")
    config_dict = tiny_config_dict(vocab_size=len(open(vocab_file).read().splitlines()))
    write_hf_dir(tmp_path / "hf", random_hf_weights(config_dict), config_dict, "gelu")
    config, vocab = extract_features._defaults_from_checkpoint(str(tmp_path / "hf"), None, None)
    assert config.hidden_act == "gelu_exact" and vocab == vocab_file


def test_json_layout_and_rounding():
    feature = extract_features.Feature(7, ["[CLS]", "cat", "[SEP]"], [], [], [])
    values = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2) / 3.0
    line = extract_features.feature_json(feature, values, [-1, -2])
    assert line.endswith("\n")
    assert line.startswith('{"linex_index": 7, "features": [{"token": "[CLS]", "layers": '
                           '[{"index": -1, "values": [0.0, 0.333333]}, {"index": -2, '
                           '"values": [2.0, 2.333333]}]}')
