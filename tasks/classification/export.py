"""Owns the classifier's serving signatures: raw text (+ text_pair) -> label probabilities or a regression score.

The ``classifier`` family of ``modeling.export`` (see its docstring for the registry and
the signatures every family shares). Signatures:

* ``serving_default``: ``text`` (+ ``text_pair`` for pair tasks) -> ``probabilities``
  float32 [batch, num_labels], ``label`` string [batch] (the label names), ``logits``
  [batch, num_labels]; regression -> ``score`` float32 [batch] and ``logits`` [batch, 1];
* ``preprocess``: the same inputs -> int32 ``input_ids``, ``input_mask``, ``segment_ids``;
* ``serving_tokenized``: those three int32 tensors -> the outputs of ``serving_default``.
"""

from __future__ import annotations

import tensorflow as tf

from modeling import export


class ClassifierServing(export.ServingFamily):
    """``--model_type=classifier``: a fine-tuned ``BertClassifier``."""

    model_type = "classifier"
    weights_description = "a fine-tuned classifier (run_classifier.py output)"
    fields = ("labels", "is_regression", "text_pair")

    def claims_legacy_run(self, data):
        # run_classifier.py's metadata: the shared keys only, with labels or regression.
        return (set(data) <= export.metadata_keys(export.ExportMetadata)
                and bool(data.get("labels") or data.get("is_regression")))

    def validate(self, config):
        if not config.is_regression and len(config.labels) < 1:
            raise export.ExportError("a classifier export needs its label names (or "
                                     "is_regression)")

    def build_model(self, config, bert_config, dtype_policy):
        from modeling.models import BertClassifier

        num = 1 if config.is_regression else len(config.labels)
        return BertClassifier(bert_config, num, dtype=dtype_policy)

    def check_model(self, model, config):
        from modeling.models import BertClassifier

        export._expect_model(model, BertClassifier, config)
        want = 1 if config.is_regression else len(config.labels)
        if model.num_labels != want:
            raise export.ExportError(
                f"the classifier has {model.num_labels} outputs but "
                + ("regression needs 1" if config.is_regression
                   else f"{len(config.labels)} labels were given: {list(config.labels)}"))

    def signatures(self, module):
        def classify(features):
            return _classify(module, features)

        sigs = export.text_signatures(module, classify)
        sigs["serving_tokenized"] = tf.function(
            lambda **f: classify(f)).get_concrete_function(**export.ids_specs())
        return sigs


def _classify(module, features):
    """int32 features -> probabilities, logits and label names (or score)."""
    config = module.config
    logits = tf.cast(module.model_outputs(features)["logits"], tf.float32)
    if config.is_regression:
        return {"score": logits[:, 0], "logits": logits}
    probabilities = tf.nn.softmax(logits, axis=-1)
    labels = tf.constant(list(config.labels), tf.string)
    return {"probabilities": probabilities, "logits": logits,
            "label": tf.gather(labels, tf.argmax(probabilities, axis=-1))}


FAMILY = ClassifierServing()
