"""Task models = BertEncoder + a head: pretraining, classification, span labelling, token tagging.

Each model has ``.encoder`` (a ``BertEncoder``), takes the encoder's input dict (plus
``masked_lm_positions`` for pretraining) and returns a dict of float32 logits under every
dtype policy. Weights exist right after construction.
"""

from __future__ import annotations

import dataclasses

import keras

from modeling.config import LAYER_NORM_EPSILON, BertConfig
from modeling.encoder import BertEncoder, as_config
from modeling.heads import DenseLogitsHead, MaskedLMHead


class _TaskModel(keras.Model):
    """Shared wiring: the encoder, config serialisation, explicit build."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.bert_config: BertConfig = as_config(config)
        self.encoder = BertEncoder(self.bert_config, dtype=self.dtype_policy, name="encoder")

    @property
    def config(self) -> BertConfig:
        return self.bert_config

    def _encoder_inputs(self, inputs):
        return {k: inputs[k] for k in ("input_ids", "input_mask", "segment_ids")}

    def get_config(self):
        config = super().get_config()
        config["config"] = dataclasses.asdict(self.bert_config)
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)


@keras.saving.register_keras_serializable(package="bert")
class BertPretrainer(_TaskModel):
    """BERT with the original pretraining heads (masked LM tied to the word embeddings + NSP).

    Call inputs: the encoder's dict plus ``masked_lm_positions`` int32 [batch, predictions].

    Call outputs: ``masked_lm_logits`` float32 [batch, predictions, vocab_size] and
    ``next_sentence_logits`` float32 [batch, 2].
    """

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        c = self.bert_config
        self.masked_lm = MaskedLMHead(
            vocab_size=c.vocab_size, hidden_size=c.hidden_size, hidden_act=c.hidden_act,
            initializer_range=c.initializer_range, layer_norm_epsilon=LAYER_NORM_EPSILON,
            dtype=self.dtype_policy, name="masked_lm")
        self.next_sentence = DenseLogitsHead(
            2, c.hidden_size, dropout_rate=0.0, initializer_range=c.initializer_range,
            dtype=self.dtype_policy, name="next_sentence")
        self.build()

    def build(self, input_shape=None):
        if self.built:
            return
        self.masked_lm.build()
        self.next_sentence.build()
        self.built = True

    def call(self, inputs, training=None):
        outputs = self.encoder(self._encoder_inputs(inputs), training=training)
        mlm = self.masked_lm(outputs["sequence_output"], inputs["masked_lm_positions"],
                             embedding_table=self.encoder.word_embeddings)
        nsp = self.next_sentence(outputs["pooled_output"], training=training)
        return {"masked_lm_logits": mlm, "next_sentence_logits": nsp}


@keras.saving.register_keras_serializable(package="bert")
class BertClassifier(_TaskModel):
    """Sequence classifier / regressor: dropout + dense on the pooled output.

    Args:
      config: ``BertConfig``.
      num_labels: number of logits (1 for regression).
      dropout_rate: dropout before the dense layer; None means ``hidden_dropout_prob``.

    Call outputs: ``logits`` float32 [batch, num_labels].
    """

    def __init__(self, config, num_labels, dropout_rate=None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.bert_config
        self.num_labels = int(num_labels)
        self.dropout_rate = c.hidden_dropout_prob if dropout_rate is None else float(dropout_rate)
        self.classifier = DenseLogitsHead(
            self.num_labels, c.hidden_size, dropout_rate=self.dropout_rate,
            initializer_range=c.initializer_range, dtype=self.dtype_policy, name="classifier")
        self.build()

    def build(self, input_shape=None):
        if self.built:
            return
        self.classifier.build()
        self.built = True

    def call(self, inputs, training=None):
        outputs = self.encoder(self._encoder_inputs(inputs), training=training)
        return {"logits": self.classifier(outputs["pooled_output"], training=training)}

    def get_config(self):
        config = super().get_config()
        config.update(num_labels=self.num_labels, dropout_rate=self.dropout_rate)
        return config


@keras.saving.register_keras_serializable(package="bert")
class BertSpanLabeler(_TaskModel):
    """Span head (SQuAD): one dense layer giving a start and an end logit per token.

    Call outputs: ``start_logits`` and ``end_logits``, float32 [batch, seq_length].
    """

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        c = self.bert_config
        self.span = DenseLogitsHead(2, c.hidden_size, dropout_rate=0.0,
                                    initializer_range=c.initializer_range,
                                    dtype=self.dtype_policy, name="span")
        self.build()

    def build(self, input_shape=None):
        if self.built:
            return
        self.span.build()
        self.built = True

    def call(self, inputs, training=None):
        outputs = self.encoder(self._encoder_inputs(inputs), training=training)
        logits = self.span(outputs["sequence_output"], training=training)
        return {"start_logits": logits[:, :, 0], "end_logits": logits[:, :, 1]}


@keras.saving.register_keras_serializable(package="bert")
class BertTokenTagger(_TaskModel):
    """Token tagging (NER): dropout + dense on every token's vector.

    Args:
      config: ``BertConfig``.
      num_labels: tags.
      dropout_rate: None means ``hidden_dropout_prob``.

    Call outputs: ``logits`` float32 [batch, seq_length, num_labels].
    """

    def __init__(self, config, num_labels, dropout_rate=None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.bert_config
        self.num_labels = int(num_labels)
        self.dropout_rate = c.hidden_dropout_prob if dropout_rate is None else float(dropout_rate)
        self.tagger = DenseLogitsHead(
            self.num_labels, c.hidden_size, dropout_rate=self.dropout_rate,
            initializer_range=c.initializer_range, dtype=self.dtype_policy, name="tagger")
        self.build()

    def build(self, input_shape=None):
        if self.built:
            return
        self.tagger.build()
        self.built = True

    def call(self, inputs, training=None):
        outputs = self.encoder(self._encoder_inputs(inputs), training=training)
        return {"logits": self.tagger(outputs["sequence_output"], training=training)}

    def get_config(self):
        config = super().get_config()
        config.update(num_labels=self.num_labels, dropout_rate=self.dropout_rate)
        return config
