"""Long documents (--long_document=windows): the document classifier's cost and the windows run's resume and multi-worker equality."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from modeling.config import BertConfig
from modeling.models import BertDocumentClassifier
from test_modeling_reference import tiny_config_dict


def _documents(rng, vocab_size, windows_per_document, max_windows=5, seq=8):
    """[batch, max_windows, seq] inputs: document i has windows_per_document[i] real
    windows (0: a padding row), then all-zero windows."""
    shape = (len(windows_per_document), max_windows, seq)
    ids = np.zeros(shape, np.int32)
    mask = np.zeros(shape, np.int32)
    for i, count in enumerate(windows_per_document):
        ids[i, :count] = rng.integers(5, vocab_size, size=(count, seq))
        mask[i, :count] = 1
    return {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids)}


def test_document_classifier_encodes_only_present_windows():
    """A batch of documents of 1, 3 and 0 windows in records of 5 costs 4 encoder rows,
    not 15, and each document's logits are those it has alone without padding windows,
    eagerly and under XLA (--jit_compile)."""
    config = BertConfig.from_dict(tiny_config_dict())
    model = BertDocumentClassifier(config, 2, pooling="attention")
    inputs = _documents(np.random.default_rng(0), config.vocab_size, [1, 3, 0])
    rows = []
    encoder_call = model.encoder.call

    def counting_call(features, training=None):
        rows.append(int(features["input_ids"].shape[0]))
        return encoder_call(features, training=training)

    model.encoder.call = counting_call
    logits = model(inputs, training=False)["logits"].numpy()
    assert rows == [4]
    for i, count in enumerate([1, 3]):
        alone = model({k: v[i:i + 1, :count] for k, v in inputs.items()}, training=False)
        np.testing.assert_allclose(alone["logits"].numpy()[0], logits[i], atol=1e-5)
    # A padding row (no window) pools to zeros: the head's bias only.
    np.testing.assert_allclose(logits[2], model.classifier.dense.bias.numpy(), atol=1e-6)
    model.encoder.call = encoder_call
    compiled = tf.function(lambda x: model(x, training=False)["logits"], jit_compile=True)
    np.testing.assert_allclose(compiled({k: tf.constant(v) for k, v in inputs.items()}),
                               logits, atol=1e-5)
