"""Owns the multiple-choice serving signatures: a context, a question and its endings as raw strings -> the choice probabilities (registers at import).

The ``multiple_choice`` family of ``modeling.export`` (see its docstring for the registry
and the signatures every family shares). Each choice is packed as ``run_swag.py`` packs it
(``tasks.multiple_choice.data.convert_example``): ``[CLS] context [SEP] question + " " +
ending [SEP]``, or ``[CLS] context [SEP] ending [SEP]`` when the question is empty, the
pair truncated longest-first (the original's ``_truncate_seq_pair``), zero padding.
Signatures:

* ``serving_default``: ``context`` string [batch], ``question`` string [batch] (SWAG's
  ``sent2``; "" for none), ``endings`` string [batch, choices] (any number of choices,
  the same for every row of a request) -> ``probabilities`` float32 [batch, choices]
  (softmax across the row's choices), ``logits`` float32 [batch, choices], ``label``
  int32 [batch] (the index of the most probable ending);
* ``preprocess``: the same inputs -> int32 ``input_ids``, ``input_mask``,
  ``segment_ids`` [batch, choices, seq];
* ``serving_tokenized``: those three int32 [batch, choices, seq] tensors -> the outputs of
  ``serving_default``.

A request costs batch x choices sequences of its longest choice's length (at most
``max_seq_length``): bounded by its size.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from modeling.export import families, registry, serving


@dataclasses.dataclass(frozen=True)
class MultipleChoiceServingConfig(families.ServingConfig):
    """``--model_type=multiple_choice``'s settings: the common ones (any number of
    choices per request)."""

    model_type: ClassVar[str] = "multiple_choice"


class MultipleChoiceServing(families.ServingFamily):
    """``--model_type=multiple_choice``: a fine-tuned ``BertMultipleChoice`` (run_swag.py)."""

    model_type = "multiple_choice"
    config_class = MultipleChoiceServingConfig
    weights_description = "a fine-tuned multiple-choice model (run_swag.py output)"

    def build_model(self, config, bert_config, dtype_policy):
        from modeling.models import BertMultipleChoice

        return BertMultipleChoice(bert_config, dtype=dtype_policy)

    def check_model(self, model, config):
        from modeling.models import BertMultipleChoice

        families.expect_model(model, BertMultipleChoice, config)

    def signatures(self, module):
        def serve(context, question, endings):
            return _choose(module, pack_choices(module, context, question, endings))

        def preprocess(context, question, endings):
            return pack_choices(module, context, question, endings)

        strings = dict(context=serving.string_spec("context"),
                       question=serving.string_spec("question"),
                       endings=tf.TensorSpec([None, None], tf.string, name="endings"))
        ids = {k: tf.TensorSpec([None, None, None], tf.int32, name=k)
               for k in ("input_ids", "input_mask", "segment_ids")}
        return {
            "serving_default": tf.function(serve, autograph=False).get_concrete_function(**strings),
            "preprocess": tf.function(preprocess, autograph=False).get_concrete_function(**strings),
            "serving_tokenized": tf.function(
                lambda **f: _choose(module, serving.trim_to_request(f)),
                autograph=False).get_concrete_function(
                    **ids),
        }


def pack_choices(module, context, question, endings):
    """Raw strings -> int32 features [batch, choices, seq], run_swag.py's packing (at
    max_seq_length), ``seq`` the request's width (``serving.trim_to_request``).

    Args:
      module: the ``serving.ServingModule`` (its tokenizer and max_seq_length).
      context, question: string [batch]; an empty question means sentence B is the ending.
      endings: string [batch, choices].
    """
    endings = tf.convert_to_tensor(endings, tf.string)
    shape = tf.shape(endings)
    batch, choices = shape[0], shape[1]
    tf.debugging.assert_equal(tf.shape(context)[0], batch,
                              message="context and endings have different batch sizes")
    tf.debugging.assert_equal(tf.shape(question)[0], batch,
                              message="question and endings have different batch sizes")
    question = tf.broadcast_to(tf.expand_dims(question, 1), shape)
    # As data.choice_texts: f"{question} {ending}" if question else ending.
    second = tf.where(question != "", tf.strings.join([question, endings], " "), endings)
    first = tf.reshape(tf.broadcast_to(tf.expand_dims(context, 1), shape), [-1])
    tok = module.tokenizer
    packed = serving.trim_to_request(tok.pack_inputs(
        tok.tokenize(first), tok.tokenize(tf.reshape(second, [-1])),
        max_seq_length=module.config.max_seq_length))
    return {k: tf.reshape(v, [batch, choices, -1]) for k, v in packed.items()}


def _choose(module, features):
    """int32 features [batch, choices, seq] -> probabilities, logits and the chosen index."""
    logits = tf.cast(module.model_outputs(features)["logits"], tf.float32)
    return {"probabilities": tf.nn.softmax(logits, axis=-1), "logits": logits,
            "label": tf.cast(tf.argmax(logits, axis=-1), tf.int32)}


FAMILY = registry.register(MultipleChoiceServing())
