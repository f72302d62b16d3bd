"""BertEncoder: embeddings + transformer blocks + pooler, the Keras 3 model task models wrap."""

from __future__ import annotations

import keras
from keras import ops

from modeling.config import LAYER_NORM_EPSILON, BertConfig
from modeling.embeddings import BertEmbeddings
from modeling.transformer import TransformerBlock, attention_bias_from_mask

INPUT_NAMES = ("input_ids", "input_mask", "segment_ids")


def as_config(config) -> BertConfig:
    """Accepts a BertConfig or its dict (``dataclasses.asdict`` or Google keys)."""
    if isinstance(config, BertConfig):
        return config
    return BertConfig.from_dict(config, source="model config")


@keras.saving.register_keras_serializable(package="bert")
class BertEncoder(keras.Model):
    """The BERT encoder.

    Args:
      config: a ``BertConfig`` (or its dict).
      use_one_hot_embeddings: word lookup as a one-hot matmul (the original's TPU path;
        same numbers).
      **kwargs: ``keras.Model`` arguments (``name``, ``dtype``, ...).

    Call inputs: a dict with int32 ``input_ids``, ``input_mask`` (1 = real token) and
    ``segment_ids``, each [batch, seq_length]. With the config's ``causal_attention`` a
    token attends only to itself and the tokens before it (the LTR model).

    Call outputs: a dict with
      ``sequence_output``: [batch, seq_length, hidden], the last block's output;
      ``pooled_output``: [batch, hidden], dense + tanh on the first ([CLS]) token (the
        last real token with ``causal_attention``);
      ``encoder_outputs``: list of num_hidden_layers tensors [batch, seq_length, hidden].
    They are in the compute dtype of the policy (bfloat16 / float16 under mixed policies).

    ``word_embeddings`` is the float32 word-embedding table [vocab, hidden] (tied to the
    masked-LM output projection). Weights exist right after construction.
    """

    def __init__(self, config, use_one_hot_embeddings=False, **kwargs):
        super().__init__(**kwargs)
        self.bert_config = as_config(config)
        self.use_one_hot_embeddings = bool(use_one_hot_embeddings)
        c = self.bert_config
        policy = self.dtype_policy
        self.embeddings = BertEmbeddings(
            vocab_size=c.vocab_size, hidden_size=c.hidden_size,
            max_position_embeddings=c.max_position_embeddings,
            type_vocab_size=c.type_vocab_size, initializer_range=c.initializer_range,
            dropout_rate=c.hidden_dropout_prob, layer_norm_epsilon=LAYER_NORM_EPSILON,
            use_one_hot_embeddings=self.use_one_hot_embeddings, dtype=policy,
            name="embeddings")
        # One attribute per block (not a list): tf.train.Checkpoint only tracks attributes,
        # so checkpoints name them model/encoder/transformer_layer_<i>/...
        for i in range(c.num_hidden_layers):
            setattr(self, f"transformer_layer_{i}", TransformerBlock(
                hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
                intermediate_size=c.intermediate_size, hidden_act=c.hidden_act,
                hidden_dropout_prob=c.hidden_dropout_prob,
                attention_probs_dropout_prob=c.attention_probs_dropout_prob,
                initializer_range=c.initializer_range, layer_norm_epsilon=LAYER_NORM_EPSILON,
                dtype=policy, name=f"transformer_layer_{i}"))
        self.pooler = keras.layers.Dense(
            c.hidden_size, activation="tanh",
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=c.initializer_range),
            dtype=policy, name="pooler")
        self.build()

    @property
    def config(self) -> BertConfig:
        return self.bert_config

    @property
    def transformer_layers(self) -> list:
        """The blocks, first to last."""
        return [getattr(self, f"transformer_layer_{i}")
                for i in range(self.bert_config.num_hidden_layers)]

    @property
    def word_embeddings(self):
        """The word-embedding table variable, float32 [vocab_size, hidden_size]."""
        return self.embeddings.word_embeddings

    def build(self, input_shape=None):
        if self.built:
            return
        h = self.bert_config.hidden_size
        self.embeddings.build()
        for layer in self.transformer_layers:
            layer.build((None, None, h))
        self.pooler.build((None, h))
        self.built = True

    def call(self, inputs, training=None):
        missing = [k for k in INPUT_NAMES if k not in inputs]
        if missing:
            raise KeyError(f"BertEncoder inputs lack {missing}; expected keys {INPUT_NAMES}")
        input_ids = ops.cast(inputs["input_ids"], "int32")
        segment_ids = ops.cast(inputs["segment_ids"], "int32")
        bias = attention_bias_from_mask(inputs["input_mask"],
                                        causal=self.bert_config.causal_attention)

        x = self.embeddings(input_ids, segment_ids, training=training)
        encoder_outputs = []
        for layer in self.transformer_layers:
            x = layer(x, bias, training=training)
            encoder_outputs.append(x)
        pooled = self.pooler(self._pooled_token(x, inputs["input_mask"]))
        return {"sequence_output": x, "pooled_output": pooled,
                "encoder_outputs": encoder_outputs}

    def _pooled_token(self, x, input_mask):
        """The vector the pooler reads, [batch, hidden]: the first token ([CLS]); with
        causal attention the last real one, the only token that has seen the whole input
        (as OpenAI GPT's classifier reads its last token)."""
        if not self.bert_config.causal_attention:
            return x[:, 0, :]
        last = ops.maximum(ops.sum(ops.cast(input_mask, "int32"), axis=1) - 1, 0)
        return ops.take_along_axis(x, last[:, None, None], axis=1)[:, 0, :]

    def get_config(self):
        config = super().get_config()
        # Our explicit activation names ("gelu_tanh" / "gelu_exact") keep the GELU form.
        config["config"] = self.bert_config.explicit_dict()
        config["use_one_hot_embeddings"] = self.use_one_hot_embeddings
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)
