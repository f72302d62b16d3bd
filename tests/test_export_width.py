"""Every serving family runs the encoder on the request's longest row, not max_seq_length
(issue 25), with outputs equal to the padded computation's (today's) on every position it
returns. The reference: for squad and tagger, whose post-processing is in the graph, the
same signatures on the same request with one more row last that fills max_seq_length (the
whole request then runs at max_seq_length; the outputs are example-major, so the request's
rows come first); for classifier, encoder and multiple_choice, the Keras model called
eagerly on the Python path's features at max_seq_length (their heads only softmax /
argmax the logits). Tokenized signatures return the caller's width (zeros where only
padding was cut). (The hub encoder's: test_export_hub, on its export.)"""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import write_vocab
from data_prep.tokenization import FullTokenizer
from modeling.export import families, serving
from modeling.encoder import BertEncoder
from modeling.models import BertClassifier, BertMultipleChoice, BertSpanLabeler
from tasks.tagging.task import build_tagging_model
from test_export import VOCAB, python_features
from test_export import _config as _two_layers
from test_export_multiple_choice import _python_features as choice_features

SEQ = 64
SHORT = ["The cat sat on the mat.", "", "你好", "dogs! \U0001F600 ran far away home"]
PAIRS = ["A dog ran.", "the mat", "", "Καλημέρα"]
QUESTIONS = ["who sat?", "", "where did the dog run", "你好"]
CONTEXTS = ["The cat sat on the mat far away.", "the dog", "the big red dog ran home .", ""]
ENDINGS = [["ran far away.", "sat.", ""], ["the end", "Καλημέρα", "你好"],
           ["short", "a b c", "dogs"], ["x", "", "the cat sat on the mat"]]
FAMILIES = ("classifier", "encoder", "squad", "multiple_choice", "tagger")


def _config(layers=1):
    """test_export's tiny config; one layer where the depth proves nothing (the width cut
    and its padded reference are per position at any depth), two for the encoder, whose
    every layer's outputs are returned and checked."""
    return dataclasses.replace(_two_layers(), num_hidden_layers=layers)


def _model(model_type):
    keras.utils.set_random_seed(31)
    if model_type == "encoder":
        return BertEncoder(_config(layers=2))
    return {"classifier": lambda: BertClassifier(_config(), 3),
            "squad": lambda: BertSpanLabeler(_config()),
            "multiple_choice": lambda: BertMultipleChoice(_config()),
            "tagger": lambda: build_tagging_model(_config(), 3)}[model_type]()


def _settings(model_type):
    return {"classifier": dict(labels=("a", "b", "c"), text_pair=True),
            "encoder": dict(text_pair=True),
            "squad": dict(max_query_length=8, doc_stride=16, n_best_size=5,
                          max_answer_length=6),
            "tagger": dict(labels=("O", "B-X", "I-X"), doc_stride=20)}.get(model_type, {})


def _inputs(model_type, texts=SHORT):
    if model_type in ("classifier", "encoder"):
        return {"text": tf.constant(texts), "text_pair": tf.constant(PAIRS)}
    if model_type == "squad":
        return {"question": tf.constant(QUESTIONS), "context": tf.constant(CONTEXTS)}
    if model_type == "multiple_choice":
        return {"context": tf.constant(texts), "question": tf.constant(QUESTIONS),
                "endings": tf.constant(ENDINGS)}
    return {"text": tf.constant(texts)}


# A row that fills max_seq_length: many words, or (tag_words) six words of 12 pieces each.
FILLER = " ".join(["the big red dog ran far away home"] * 10)
FILLER_WORDS = ["xxxxxxxxxxxx"] * 6


def _with_filler(name, feed):
    """``feed`` (a signature's inputs) with the filler row appended."""
    if name == "tag_words":
        return {"words": tf.concat([feed["words"], [FILLER_WORDS]], 0)}
    return {k: tf.concat([v, [FILLER if k in ("text", "context") else "who"]], 0)
            for k, v in feed.items()}


def _without_filler(got, want, filler):
    """``want`` (outputs of the request with the filler row last) cut to ``got``'s rows:
    outputs are example-major, so the filler's rows are the last of each output, as every
    ``*_example_index`` shows."""
    cut = {}
    for key, value in want.items():
        rows = got[key].shape[0]
        if key.endswith("example_index"):
            assert (value[rows:] == filler).all() and (value[:rows] < filler).all(), key
        cut[key] = value[:rows]
    return cut


def _python_path(model_type, vocab):
    """The Python path's features of ``_inputs(model_type)`` at max_seq_length
    (run_classifier.py's / run_swag.py's packing)."""
    if model_type == "multiple_choice":
        return choice_features(vocab, list(zip(SHORT, QUESTIONS, ENDINGS)), SEQ)
    return python_features(FullTokenizer(vocab), SHORT, PAIRS, SEQ)


def _eager(model, model_type, features):
    """Every signature's outputs as the Keras model computes them eagerly on ``features``
    (at max_seq_length), by signature name: the padded computation."""
    tensors = {k: tf.constant(v) for k, v in features.items()}
    out = serving.encoder_of(model)({k: tf.reshape(v, [-1, SEQ]) for k, v in tensors.items()},
                                    training=False)
    encoded = {"pooled_output": out["pooled_output"].numpy(),
               "sequence_output": out["sequence_output"].numpy(),
               "encoder_outputs": np.stack([x.numpy() for x in out["encoder_outputs"]], 1)}
    want = {"preprocess": features, "encode": encoded}
    if model_type == "encoder":
        lean = {k: encoded[k] for k in ("pooled_output", "sequence_output")}
        return {**want, "serving_default": lean, "serving_all_layers": encoded}
    logits = model(tensors, training=False)["logits"].numpy()
    label = logits.argmax(-1)
    label = (np.array([b"a", b"b", b"c"], object)[label] if model_type == "classifier"
             else label.astype(np.int32))
    head = {"probabilities": tf.nn.softmax(logits).numpy(), "logits": logits, "label": label}
    return {**want, "serving_default": head, "serving_tokenized": head}


def _assert_equal_where_returned(got, want, name, width):
    """``got`` equals ``want`` (today's) on every position it has; a positions axis
    shorter than today's is cut to ``width``."""
    assert got.dtype == want.dtype, name
    assert got.ndim == want.ndim, name
    cut = [axis for axis in range(got.ndim) if got.shape[axis] != want.shape[axis]]
    assert all(got.shape[a] == width and want.shape[a] == SEQ for a in cut), (
        name, got.shape, want.shape)
    want = want[tuple(slice(0, n) for n in got.shape)]
    if got.dtype.kind == "f":  # (strings and ints: equal)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=name)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return write_vocab(tmp_path_factory.mktemp("width") / "vocab.txt", VOCAB)


@pytest.fixture(scope="module")
def traced(vocab):
    """model_type -> (the family's model, its signatures), each traced once for the
    module's tests (tracing a family's signatures takes ~5-10 s)."""
    cache = {}

    def get(model_type):
        if model_type not in cache:
            model = _model(model_type)
            config = families.serving_config(model_type, vocab, True, SEQ,
                                             **_settings(model_type))
            cache[model_type] = model, serving.ServingModule(model, config).signatures()
        return cache[model_type]
    return get


@pytest.mark.slow  # every signature of a family traced: ~10-20 s each
@pytest.mark.parametrize("model_type", FAMILIES)
def test_a_short_request_runs_on_its_width_with_todays_outputs(model_type, vocab, traced):
    """Each signature of each family runs a short request on its width (the longest row
    rounded up to WIDTH_MULTIPLE, far below max_seq_length) and returns the padded
    computation's outputs on every position it has (the module docstring's reference)."""
    model, now = traced(model_type)
    inputs = _inputs(model_type)
    if model_type in ("squad", "tagger"):  # windows and post-processing in the graph
        filler = len(SHORT)  # the filler row's example index
        padded = {k: v.numpy() for k, v in now["preprocess"](
            **_with_filler("preprocess", inputs)).items()}
        assert padded["input_mask"].shape[-1] == SEQ
        if model_type == "tagger":  # tag_words' filler fills the window too
            assert now["preprocess"](text=tf.constant([" ".join(FILLER_WORDS)]))[
                "input_mask"].shape[-1] == SEQ
        ours = padded["window_example_index"] < filler
        full = {k: padded[k][ours] for k in ("input_ids", "input_mask", "segment_ids")}

        def reference(name, feed, got):
            if name in ("encode", "serving_tokenized"):  # + the filler's windows
                fed = {k: tf.concat([v, padded[k][~ours]], 0) for k, v in feed.items()}
            else:
                fed = _with_filler(name, feed)
            return _without_filler(got, {k: v.numpy() for k, v in now[name](**fed).items()},
                                   filler)
    else:
        full = _python_path(model_type, vocab)
        eager = _eager(model, model_type, full)
        assert set(now) == set(eager)

        def reference(name, feed, got):
            return eager[name]
    features = now["preprocess"](**inputs)
    mask = features["input_mask"].numpy()
    longest = int(mask.sum(axis=-1).max())
    width = mask.shape[-1]
    # The longest row, rounded up to the multiple: far below max_seq_length here.
    assert width == -(-longest // serving.WIDTH_MULTIPLE) * serving.WIDTH_MULTIPLE < SEQ, (
        width, longest)
    checked = 0
    for name in now:
        if name in ("encode", "serving_tokenized"):
            continue
        feed = inputs
        if name == "tag_words":  # pre-split words, "" = padding
            feed = {"words": tf.constant([t.split() + [""] * (6 - len(t.split()))
                                          for t in SHORT])}
        got = now[name](**feed)
        want = reference(name, feed, got)
        assert set(got) == set(want), name
        for key in got:
            _assert_equal_where_returned(got[key].numpy(), want[key], f"{name}/{key}", width)
            checked += 1
    assert checked >= 4
    # Ids a caller packed at max_seq_length: run on the request's width, returned at the
    # caller's; equal to today's where a token is, zeros where only padding was cut.
    ids = {k: tf.convert_to_tensor(full[k]) for k in ("input_ids", "input_mask", "segment_ids")}
    for name in ("encode", "serving_tokenized"):
        if name not in now:
            continue
        feed = ids
        if name == "encode":  # [rows, seq], whatever the family's features
            feed = {k: tf.reshape(v, [-1, SEQ]) for k, v in ids.items()}
        got = now[name](**feed)
        want = reference(name, feed, got)
        assert set(got) == set(want), name
        for key in got:
            g, w = got[key].numpy(), want[key]
            assert g.shape == w.shape, (name, key)
            axes = [axis for axis in range(1, g.ndim) if g.shape[axis] == SEQ]
            if not axes:
                _assert_equal_where_returned(g, w, f"{name}/{key}", width)
                continue
            head = (slice(None),) * axes[0] + (slice(0, width),)
            tail = (slice(None),) * axes[0] + (slice(width, None),)
            np.testing.assert_allclose(g[head], w[head], atol=1e-5, rtol=0,
                                       err_msg=f"{name}/{key}")
            assert not g[tail].any(), (name, key)


def test_a_full_window_request_keeps_max_seq_length(vocab, traced):
    """A row that fills the window: the request runs at max_seq_length, never beyond."""
    _, sigs = traced("classifier")
    long_text = " ".join(["the big red dog ran far away home"] * 20)
    features = sigs["preprocess"](text=tf.constant(["a cat", long_text]),
                                  text_pair=tf.constant(["", ""]))  # empty: one segment
    assert features["input_ids"].shape == (2, SEQ)
    python = python_features(FullTokenizer(vocab), ["a cat", long_text], None, SEQ)
    for key, value in python.items():
        np.testing.assert_array_equal(features[key].numpy(), value, key)


def test_the_encoder_returns_every_layer_only_on_request(vocab, traced):
    """serving_default: pooled + sequence outputs; serving_all_layers adds the stacked
    layers (large: [batch, layers, seq, hidden])."""
    model, sigs = traced("encoder")
    text = {"text": tf.constant(SHORT), "text_pair": tf.constant([""] * len(SHORT))}
    lean = sigs["serving_default"](**text)
    full = sigs["serving_all_layers"](**text)
    assert set(lean) == {"pooled_output", "sequence_output"}
    assert set(full) == {"pooled_output", "sequence_output", "encoder_outputs"}
    width = lean["sequence_output"].shape[1]
    assert full["encoder_outputs"].shape == (len(SHORT), 2, width, 32)
    np.testing.assert_allclose(full["encoder_outputs"][:, -1], lean["sequence_output"],
                               atol=1e-6)
    features = python_features(FullTokenizer(vocab), SHORT, None, SEQ)
    expected = model({k: tf.constant(v) for k, v in features.items()}, training=False)
    np.testing.assert_allclose(lean["sequence_output"], expected["sequence_output"][:, :width],
                               atol=1e-5, rtol=0)
    np.testing.assert_allclose(lean["pooled_output"], expected["pooled_output"], atol=1e-5,
                               rtol=0)


def test_request_width():
    mask = tf.constant([[1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                        [1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
    assert int(serving.request_width(mask)) == 16            # 9 rounded up to 8k
    assert int(serving.request_width(mask[:, :12])) == 12    # never past the window
    assert int(serving.request_width(mask[:1])) == 8
    assert int(serving.request_width(tf.zeros([0, 20], tf.int32))) == 8   # empty request
    assert int(serving.request_width(tf.zeros([2, 3, 20], tf.int32) + mask[:1])) == 8


def test_a_bfloat16_export_also_runs_on_the_request_width(vocab):
    """--dtype=bfloat16 with the padding cut: float32 outputs, the padded computation's
    values (the request with a row that fills max_seq_length) within bfloat16's rounding
    (its 8-bit mantissa; different shapes may round apart)."""
    keras.utils.set_random_seed(32)
    model = BertClassifier(_config(), 3, dtype="mixed_bfloat16")
    config = families.serving_config("classifier", vocab, True, SEQ, labels=("a", "b", "c"))
    now = serving.ServingModule(model, config).signatures()
    text = tf.constant(SHORT)
    assert now["preprocess"](text=text)["input_ids"].shape[1] < SEQ
    got = now["serving_default"](text=text)
    padded = now["serving_default"](**_with_filler("serving_default", {"text": text}))
    assert got["probabilities"].dtype == tf.float32
    np.testing.assert_allclose(got["probabilities"], padded["probabilities"][:-1], atol=1e-2,
                               rtol=0)
