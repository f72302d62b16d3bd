"""BertEmbeddings: word + position + token-type embeddings, LayerNorm, dropout (Keras 3 layer)."""

from __future__ import annotations

import keras
from keras import ops

from modeling.config import LAYER_NORM_EPSILON
from modeling.transformer import Dropout, LayerNorm


@keras.saving.register_keras_serializable(package="bert")
class BertEmbeddings(keras.layers.Layer):
    """The input embeddings of BERT.

    Sums the word embedding of each token, the learned absolute position embedding and
    the token-type (segment) embedding, then applies LayerNorm and dropout, as the
    original ``embedding_postprocessor``.

    The tables are float32 variables that are *not* autocast: rows are gathered first and
    only the gathered rows are cast to the compute dtype (the word table is also the
    masked-LM output projection, see ``heads.MaskedLMHead``).

    Args:
      vocab_size, hidden_size, max_position_embeddings, type_vocab_size: table sizes.
      initializer_range: stddev of the truncated-normal initializer of the tables.
      dropout_rate: dropout after the LayerNorm.
      layer_norm_epsilon: LayerNorm epsilon (BERT: 1e-12).
      use_one_hot_embeddings: look words up as one_hot(ids) @ table, the original's TPU
        path (`--use_one_hot_embeddings`): the same numbers, a matmul instead of a gather.
    """

    def __init__(self, vocab_size, hidden_size, max_position_embeddings, type_vocab_size,
                 initializer_range=0.02, dropout_rate=0.1,
                 layer_norm_epsilon=LAYER_NORM_EPSILON, use_one_hot_embeddings=False,
                 **kwargs):
        super().__init__(**kwargs)
        self.use_one_hot_embeddings = bool(use_one_hot_embeddings)
        self.vocab_size = int(vocab_size)
        self.hidden_size = int(hidden_size)
        self.max_position_embeddings = int(max_position_embeddings)
        self.type_vocab_size = int(type_vocab_size)
        self.initializer_range = float(initializer_range)
        self.dropout_rate = float(dropout_rate)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.layer_norm = LayerNorm(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="layer_norm")
        self.dropout = Dropout(self.dropout_rate, dtype=self.dtype_policy,
                                            name="dropout")

    def build(self, input_shape=None):
        init = keras.initializers.TruncatedNormal(stddev=self.initializer_range)
        self.word_embeddings = self.add_weight(
            name="word_embeddings", shape=(self.vocab_size, self.hidden_size),
            initializer=init, autocast=False)
        self.position_embeddings = self.add_weight(
            name="position_embeddings", shape=(self.max_position_embeddings, self.hidden_size),
            initializer=init, autocast=False)
        self.token_type_embeddings = self.add_weight(
            name="token_type_embeddings", shape=(self.type_vocab_size, self.hidden_size),
            initializer=init, autocast=False)
        self.layer_norm.build((None, None, self.hidden_size))
        self.built = True

    def call(self, input_ids, segment_ids, training=None):
        """Embeds token ids.

        Args:
          input_ids: int32 [batch, seq_length].
          segment_ids: int32 [batch, seq_length], values < type_vocab_size.
          training: enables dropout.

        Returns:
          [batch, seq_length, hidden] in the compute dtype.
        """
        seq_length = ops.shape(input_ids)[1]
        if self.use_one_hot_embeddings:
            one_hot = ops.one_hot(input_ids, self.vocab_size, dtype=self.word_embeddings.dtype)
            words = ops.matmul(one_hot, self.word_embeddings)
        else:
            words = ops.take(self.word_embeddings, input_ids, axis=0)
        types = ops.take(self.token_type_embeddings, segment_ids, axis=0)
        positions = self.position_embeddings[:seq_length]
        x = words + types + positions[None, :, :]
        x = self.layer_norm(x)
        x = ops.cast(x, self.compute_dtype)
        return self.dropout(x, training=training)

    def compute_output_shape(self, input_ids_shape, segment_ids_shape=None):
        return tuple(input_ids_shape) + (self.hidden_size,)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size,
            max_position_embeddings=self.max_position_embeddings,
            type_vocab_size=self.type_vocab_size, initializer_range=self.initializer_range,
            dropout_rate=self.dropout_rate, layer_norm_epsilon=self.layer_norm_epsilon,
            use_one_hot_embeddings=self.use_one_hot_embeddings)
        return config
