"""The multiple-choice export (--model_type=multiple_choice): its in-graph packing equals
run_swag.py's (tasks.multiple_choice.data.convert_example) on hard strings, and the reloaded
SavedModel's probabilities equal the Keras model's on the Python features. (The end-to-end
check against a real run_swag.py run's test_results.tsv is in tests/test_run_swag.py.)"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import write_vocab
from data_prep.tokenization import FullTokenizer
from modeling.export import families, writer
from modeling.export.metadata import ExportError
from modeling.models import BertClassifier, BertMultipleChoice
from tasks.multiple_choice import data
from test_export import LONG, PAIRS, TEXTS, VOCAB, _config, python_features

SEQ = 24
# Rows of (context, question, endings): empty question (sentence B = the ending alone),
# an empty ending, a long context (truncated longest-first), Greek / CJK / Arabic / emoji.
CASES = [
    (TEXTS[0], "The dog", ["ran far away.", "sat on the mat.", "", LONG]),
    (LONG, "", ["the end", "Καλημέρα", "你好，世界", "a" * 250]),
    ("", "你好", ["مرحبا بالعالم", "unaffable dogs! \U0001F600", "short", "\u200b\x01 \t"]),
    (TEXTS[3], PAIRS[1], [PAIRS[0], PAIRS[2], PAIRS[5], PAIRS[6]]),
]


def _python_features(vocab, cases, seq):
    tokenizer = FullTokenizer(vocab)
    rows = []
    for i, (context, question, endings) in enumerate(cases):
        example = data.ChoiceExample(str(i), context, question, tuple(endings), None)
        values, _ = data.convert_example(example, len(endings), seq, tokenizer)
        rows.append(values)
    return {k: np.array([r[k] for r in rows], np.int32).reshape(len(rows), -1, seq)
            for k in ("input_ids", "input_mask", "segment_ids")}


def _strings(cases):
    return dict(context=tf.constant([c for c, _, _ in cases]),
                question=tf.constant([q for _, q, _ in cases]),
                endings=tf.constant([e for _, _, e in cases]))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("mc")
    vocab = write_vocab(root / "vocab.txt", VOCAB)
    keras.utils.set_random_seed(5)
    model = BertMultipleChoice(_config())
    config = families.serving_config("multiple_choice", vocab, True, SEQ, task="swag")
    writer.export_saved_model(model, config, str(root / "export"))
    return dict(model=model, vocab=vocab, loaded=tf.saved_model.load(str(root / "export")),
                dir=root / "export")


def test_in_graph_packing_equals_run_swag_packing(exported):
    got = exported["loaded"].signatures["preprocess"](**_strings(CASES))
    expected = _python_features(exported["vocab"], CASES, SEQ)
    assert expected["input_mask"][1].sum(-1).max() == SEQ  # the long context is truncated
    for key in expected:
        assert got[key].shape == (len(CASES), 4, SEQ)
        np.testing.assert_array_equal(got[key].numpy(), expected[key], err_msg=key)


def test_served_probabilities_equal_the_keras_model(exported):
    features = _python_features(exported["vocab"], CASES, SEQ)
    logits = exported["model"]({k: tf.constant(v) for k, v in features.items()},
                               training=False)["logits"].numpy()
    signatures = exported["loaded"].signatures
    got = signatures["serving_default"](**_strings(CASES))
    assert set(got) == {"probabilities", "logits", "label"}
    np.testing.assert_allclose(got["logits"].numpy(), logits, atol=1e-5, rtol=0)
    np.testing.assert_allclose(got["probabilities"].numpy(),
                               tf.nn.softmax(logits).numpy(), atol=1e-6, rtol=0)
    assert got["label"].numpy().tolist() == logits.argmax(-1).tolist()
    tokenized = signatures["serving_tokenized"](**{k: tf.constant(v)
                                                   for k, v in features.items()})
    np.testing.assert_allclose(tokenized["logits"].numpy(), logits, atol=1e-5, rtol=0)
    # Any number of choices per request (the same within a request).
    two = [(c, q, e[:2]) for c, q, e in CASES]
    got_two = signatures["serving_default"](**_strings(two))
    assert got_two["probabilities"].shape == (len(CASES), 2)
    assert writer.export_kind(str(exported["dir"])) == "multiple_choice"


def test_a_classifier_is_not_exported_as_multiple_choice(tmp_path):
    vocab = write_vocab(tmp_path / "vocab.txt", VOCAB)
    config = families.serving_config("multiple_choice", vocab, True, SEQ)
    with pytest.raises(ExportError, match="needs a BertMultipleChoice"):
        writer.export_saved_model(BertClassifier(_config(), 2), config, str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()
