"""The TF Hub export (--model_type=hub): the encoder and preprocessor SavedModels, loaded
in a fresh process with tf.saved_model.load and with tensorflow_hub, equal the Python path
(our BertEncoder + FullTokenizer) and fine-tune through hub.KerasLayer(trainable=True); the
encoder runs a short request on its width and answers at the preprocessor's seq_length.

tensorflow_hub (test-only) builds hub.KerasLayer on tf_keras (Keras 2), which it imports
beside Keras 3 when tf.keras is Keras 3: the serving process below uses only tensorflow,
tensorflow_text, tensorflow_hub and tf_keras, never this project's code."""

import json
import os
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO_ROOT, run_isolated, write_vocab
from data_prep.tokenization import FullTokenizer
from modeling.export import serving, writer
from modeling.export.hub import HUB_INPUTS
from modeling.export.metadata import ExportMetadata, write_export_metadata
from modeling.config import BertConfig
from modeling.models import BertClassifier
from test_export import LONG, PAIRS, TEXTS, VOCAB, _save_like_training, python_features
from test_export_width import SHORT
from tests.clis import call_main

HIDDEN, LAYERS = 32, 2
PAIR_SEQ = 24  # short enough that the pairs are trimmed on one side or both

USE_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow_text  # noqa: F401  (registers the ops the graph uses)
    import tensorflow as tf
    import tensorflow_hub as hub
    import tf_keras

    args = json.load(open(sys.argv[1], encoding="utf-8"))
    texts, pairs = tf.constant(args["texts"]), tf.constant(args["pairs"])
    out = {}

    pre = tf.saved_model.load(args["preprocessor"])
    inputs = pre(texts)
    for key, value in inputs.items():
        out[f"call/{key}"] = value.numpy()
    tokens = pre.tokenize(texts)
    out["tokenize/ragged_rank"] = np.array(tokens.ragged_rank)
    out["tokenize/dtype"] = np.array(tokens.dtype.name)
    out["tokenize/ids"] = np.array(json.dumps(tokens.to_list()))
    out["special"] = np.array(json.dumps(
        {k: int(v) for k, v in pre.tokenize.get_special_tokens_dict().items()}))
    packed = pre.bert_pack_inputs([tokens, pre.tokenize(pairs)],
                                  seq_length=tf.constant(args["pair_seq"]))
    for key, value in packed.items():
        out[f"pack/{key}"] = value.numpy()
    # The Keras route of the Hub docs: tokenize and pack as layers, seq_length as argument.
    tokenize = hub.KerasLayer(pre.tokenize)
    pack = hub.KerasLayer(pre.bert_pack_inputs, arguments=dict(seq_length=args["pair_seq"]))
    for key, value in pack([tokenize(texts), tokenize(pairs)]).items():
        out[f"keras_pack/{key}"] = value.numpy()
    for key, value in hub.KerasLayer(args["preprocessor"])(texts).items():
        out[f"keras_call/{key}"] = value.numpy()

    encoder = tf.saved_model.load(args["encoder"])
    for mode in ("load", "hub"):
        model = encoder if mode == "load" else hub.load(args["encoder"])
        result = model(inputs, training=False)
        out[f"{mode}/keys"] = np.array(sorted(result))
        out[f"{mode}/pooled_output"] = result["pooled_output"].numpy()
        out[f"{mode}/default"] = result["default"].numpy()
        out[f"{mode}/sequence_output"] = result["sequence_output"].numpy()
        out[f"{mode}/encoder_outputs_is_list"] = np.array(
            isinstance(result["encoder_outputs"], list))
        out[f"{mode}/encoder_outputs"] = np.stack(
            [x.numpy() for x in result["encoder_outputs"]], axis=1)
    # A short request: the encoder runs on its width, answers at the preprocessor's.
    short = pre(tf.constant(args["short"]))
    for key, value in short.items():
        out[f"short/{key}"] = value.numpy()
    result = encoder(short, training=False)
    for key in ("pooled_output", "sequence_output"):
        out[f"short/{key}"] = result[key].numpy()
    out["short/encoder_outputs"] = np.stack([x.numpy() for x in result["encoder_outputs"]], 1)
    out["attributes"] = np.array([len(encoder.variables), len(encoder.trainable_variables),
                                  len(encoder.regularization_losses)])
    same = encoder(inputs, training=False)["pooled_output"]
    out["inference_repeatable"] = np.array(np.array_equal(same, out["load/pooled_output"]))
    train_a = encoder(inputs, training=True)["pooled_output"]
    train_b = encoder(inputs, training=True)["pooled_output"]
    out["dropout_changes_training_calls"] = np.array(
        float(tf.reduce_max(tf.abs(train_a - train_b))))

    # One fine-tuning step through hub.KerasLayer(trainable=True) in a tf_keras model.
    layer = hub.KerasLayer(args["encoder"], trainable=True)
    feeds = {k: tf_keras.Input(shape=(None,), dtype=tf.int32, name=k) for k in inputs}
    logits = tf_keras.layers.Dense(2, name="head")(layer(feeds)["pooled_output"])
    model = tf_keras.Model(feeds, logits)
    labels = tf.constant([i % 2 for i in range(len(args["texts"]))])
    before = [v.numpy().copy() for v in layer.trainable_variables]
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels, model(inputs, training=True)))
    grads = tape.gradient(loss, model.trainable_variables)
    tf_keras.optimizers.SGD(learning_rate=0.5).apply_gradients(
        zip(grads, model.trainable_variables))
    out["finetune/loss"] = np.array(float(loss))
    out["finetune/trainable"] = np.array(len(layer.trainable_variables))
    out["finetune/changed"] = np.array(sum(
        not np.array_equal(a, v.numpy()) for a, v in zip(before, layer.trainable_variables)))
    out["finetune/no_grad"] = np.array(sum(g is None for g in grads))
    after = layer(inputs, training=False)["pooled_output"].numpy()
    out["finetune/output_moved"] = np.array(float(np.abs(after - same.numpy()).max()))
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in
                    ("modeling", "data_prep", "training", "tasks"))
    out["leaked"] = np.array(leaked, dtype=object)
    np.savez(sys.argv[2], **out)
""")


def _config():
    # max_position_embeddings 128: the preprocessor's default seq_length is Hub's 128.
    return BertConfig(vocab_size=len(VOCAB), hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                      num_attention_heads=2, intermediate_size=64,
                      max_position_embeddings=128, initializer_range=0.2)


@pytest.fixture(scope="module")
def hub_export(tmp_path_factory):
    """A fine-tuned classifier's run dir exported with the CLI (in this process) as --model_type=hub, then
    used from a fresh isolated process."""
    keras.utils.set_random_seed(11)
    run = tmp_path_factory.mktemp("run")
    vocab = write_vocab(run / "vocab.txt", VOCAB)
    _config().to_json_file(str(run / "bert_config.json"))
    model = BertClassifier(_config(), 3)
    _save_like_training(model, run)
    # A fine-tuning run's metadata (seq 32) must not become the preprocessor's default.
    write_export_metadata(str(run), ExportMetadata(
        labels=("a", "b", "c"), max_seq_length=32, text_pair=True))
    out = tmp_path_factory.mktemp("exports") / "hub"
    result = call_main("export_saved_model", [
        "--model_type=hub", f"--init_checkpoint={run}",
        f"--bert_config_file={run / 'bert_config.json'}", f"--vocab_file={vocab}",
        "--do_lower_case=true", f"--export_dir={out}"], cwd=REPO_ROOT)
    assert result.code == 0, (result.stderr + result.log)[-3000:]
    assert sorted(os.listdir(out)) == ["encoder", "preprocessor"]
    assert writer.export_kind(str(out)) == "hub"

    outputs = run_isolated(tmp_path_factory.mktemp("elsewhere"), USE_SCRIPT, {
        "texts": TEXTS, "pairs": PAIRS, "pair_seq": PAIR_SEQ, "short": SHORT,
        "encoder": str(out / "encoder"), "preprocessor": str(out / "preprocessor")})
    return dict(outputs=outputs, model=model, vocab=vocab, dir=out)


@pytest.mark.slow
def test_preprocessor_equals_python_tokenizer_and_packing(hub_export):
    out = hub_export["outputs"]
    assert list(out["leaked"]) == []
    tokenizer = FullTokenizer(hub_export["vocab"])
    expected = python_features(tokenizer, TEXTS, None, 128)
    hub_names = {"input_ids": "input_word_ids", "input_mask": "input_mask",
                 "segment_ids": "input_type_ids"}
    for ours, hub_name in hub_names.items():
        for route in ("call", "keras_call"):
            got = out[f"{route}/{hub_name}"]
            assert got.dtype == np.int32 and got.shape == (len(TEXTS), 128)
            np.testing.assert_array_equal(got, expected[ours], f"{route}/{hub_name}")
    # Pairs through tokenize + bert_pack_inputs(seq_length=...): the original's packing
    # and trimming (Hub's round robin is the same rule), both API routes.
    expected = python_features(tokenizer, TEXTS, PAIRS, PAIR_SEQ)
    assert expected["input_mask"][TEXTS.index(LONG)].sum() == PAIR_SEQ  # trimmed
    # Except that, as Hub's, an empty second segment keeps its [SEP] (the original's
    # classifier drops the segment: the classifier export does that).
    empty = [i for i, pair in enumerate(PAIRS) if not tokenizer.tokenize(pair)]
    assert empty
    for i in empty:
        ids = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(TEXTS[i]))[:PAIR_SEQ - 3]
        row = [VOCAB.index("[CLS]"), *ids, VOCAB.index("[SEP]"), VOCAB.index("[SEP]")]
        expected["input_ids"][i] = row + [0] * (PAIR_SEQ - len(row))
        expected["input_mask"][i] = [1] * len(row) + [0] * (PAIR_SEQ - len(row))
        expected["segment_ids"][i] = [0] * (len(row) - 1) + [1] + [0] * (PAIR_SEQ - len(row))
    for ours, hub_name in hub_names.items():
        for route in ("pack", "keras_pack"):
            np.testing.assert_array_equal(out[f"{route}/{hub_name}"], expected[ours],
                                          f"{route}/{hub_name}")
    # tokenize: int32 [batch, (words), (pieces)], the words of the original's basic
    # tokenizer, each split into WordPiece ids.
    assert int(out["tokenize/ragged_rank"]) == 2 and str(out["tokenize/dtype"]) == "int32"
    words = [[tokenizer.convert_tokens_to_ids(tokenizer.wordpiece_tokenizer.tokenize(w))
              for w in tokenizer.basic_tokenizer.tokenize(text)] for text in TEXTS]
    assert json.loads(str(out["tokenize/ids"])) == words
    vocab = {t: i for i, t in enumerate(VOCAB)}
    assert json.loads(str(out["special"])) == {
        "vocab_size": len(VOCAB), "start_of_sequence_id": vocab["[CLS]"],
        "end_of_segment_id": vocab["[SEP]"], "padding_id": vocab["[PAD]"],
        "mask_id": vocab["[MASK]"]}


@pytest.mark.slow
def test_encoder_equals_python_encoder_via_load_and_hub(hub_export):
    out, encoder = hub_export["outputs"], hub_export["model"].encoder
    features = python_features(FullTokenizer(hub_export["vocab"]), TEXTS, None, 128)
    expected = encoder({k: tf.constant(v) for k, v in features.items()}, training=False)
    layers = np.stack([x.numpy() for x in expected["encoder_outputs"]], axis=1)
    for mode in ("load", "hub"):
        assert list(out[f"{mode}/keys"]) == ["default", "encoder_outputs", "pooled_output",
                                             "sequence_output"]
        assert bool(out[f"{mode}/encoder_outputs_is_list"])
        assert out[f"{mode}/encoder_outputs"].shape == (len(TEXTS), LAYERS, 128, HIDDEN)
        for key, want in (("pooled_output", expected["pooled_output"].numpy()),
                          ("default", expected["pooled_output"].numpy()),
                          ("sequence_output", expected["sequence_output"].numpy()),
                          ("encoder_outputs", layers)):
            assert out[f"{mode}/{key}"].dtype == np.float32
            np.testing.assert_allclose(out[f"{mode}/{key}"], want, atol=1e-5, rtol=0,
                                       err_msg=f"{mode}/{key}")
    assert len(set(np.round(out["load/pooled_output"][:, 0], 5))) > 3  # depends on the text


@pytest.mark.slow
def test_encoder_is_reusable_and_fine_tunes_through_keras_layer(hub_export):
    out, encoder = hub_export["outputs"], hub_export["model"].encoder
    variables, trainable, losses = out["attributes"].tolist()
    assert trainable == len(encoder.trainable_variables) > 0
    assert variables == len(encoder.variables)  # + dropout seed states, not trainable
    assert losses == 0  # BERT has no regularizer: weight decay is the optimizer's
    # training=False is deterministic, training=True applies dropout.
    assert bool(out["inference_repeatable"])
    assert float(out["dropout_changes_training_calls"]) > 1e-3
    # One SGD step through hub.KerasLayer(trainable=True) changed every encoder weight
    # it exposes, and the encoder's outputs with them.
    assert np.isfinite(float(out["finetune/loss"]))
    assert int(out["finetune/no_grad"]) == 0
    assert int(out["finetune/changed"]) == int(out["finetune/trainable"]) == trainable
    assert float(out["finetune/output_moved"]) > 1e-4


@pytest.mark.slow
def test_hub_encoder_runs_on_the_request_width_and_answers_at_seq_length(hub_export):
    """Issue 25: the preprocessor keeps TF Hub's seq_length; the encoder cuts the padding
    inside and returns [batch, seq_length, hidden], equal to the encoder on the padded
    inputs where a token is, zeros past the request's width."""
    out, encoder = hub_export["outputs"], hub_export["model"].encoder
    inputs = {name: out[f"short/{name}"] for name in HUB_INPUTS}
    assert inputs["input_word_ids"].shape == (len(SHORT), 128)
    expected = encoder({ours: tf.constant(inputs[name]) for ours, name in zip(
        ("input_ids", "input_mask", "segment_ids"), HUB_INPUTS)}, training=False)
    longest = int(inputs["input_mask"].sum(axis=1).max())
    width = -(-longest // serving.WIDTH_MULTIPLE) * serving.WIDTH_MULTIPLE
    assert width < 128
    np.testing.assert_allclose(out["short/pooled_output"], expected["pooled_output"],
                               atol=1e-5, rtol=0)
    layers = np.moveaxis(out["short/encoder_outputs"], 1, 0)
    for g, w in [(out["short/sequence_output"], expected["sequence_output"])] + list(
            zip(layers, expected["encoder_outputs"])):
        assert g.shape == (len(SHORT), 128, HIDDEN)
        np.testing.assert_allclose(g[:, :width], w[:, :width], atol=1e-5, rtol=0)
        assert not np.asarray(g[:, width:]).any()
