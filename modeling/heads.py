"""Output heads on the encoder: masked LM, next sentence, classification, span, token tagging.

Every head returns float32 logits whatever the dtype policy (losses and metrics read them).
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from modeling import activations
from modeling.config import LAYER_NORM_EPSILON
from modeling.transformer import Dropout, FusedDense, LayerNorm


def _truncated_normal(stddev):
    return keras.initializers.TruncatedNormal(stddev=float(stddev))


def gather_positions(sequence, positions):
    """Picks vectors at given positions.

    Args:
      sequence: [batch, seq_length, width].
      positions: int [batch, num_positions].

    Returns:
      [batch, num_positions, width].
    """
    return ops.take_along_axis(sequence, ops.cast(positions, "int32")[:, :, None], axis=1)


@keras.saving.register_keras_serializable(package="bert")
class MaskedLMHead(keras.layers.Layer):
    """The original masked-LM head: dense + activation + LayerNorm, then the tied projection.

    The output projection is the word-embedding table (passed to ``call``), transposed,
    plus a learned ``output_bias`` [vocab_size]; only ``masked_lm_positions`` are projected
    (every position for the left-to-right LM, which reads the same head, as Hugging Face's
    ``BertLMHeadModel`` does: its weights keep the checkpoint names ``cls/predictions``).

    Args:
      vocab_size: size of the output bias.
      hidden_size: width of the transform.
      hidden_act: activation name (``config.ACTIVATIONS``).
      initializer_range: stddev of the transform's kernel initializer.
      layer_norm_epsilon: LayerNorm epsilon.
    """

    def __init__(self, vocab_size, hidden_size, hidden_act="gelu_tanh", initializer_range=0.02,
                 layer_norm_epsilon=LAYER_NORM_EPSILON, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.hidden_size = int(hidden_size)
        self.hidden_act = hidden_act
        self.initializer_range = float(initializer_range)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        activations.get(hidden_act)  # Fails early on an unknown name.
        self.transform = FusedDense(
            self.hidden_size, self.hidden_size, activation=hidden_act,
            initializer_range=self.initializer_range, dtype=self.dtype_policy, name="transform")
        self.layer_norm = LayerNorm(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name="layer_norm")

    def build(self, input_shape=None):
        self.transform.build((None, self.hidden_size))
        self.layer_norm.build((None, self.hidden_size))
        self.output_bias = self.add_weight(
            name="output_bias", shape=(self.vocab_size,), initializer="zeros", autocast=False)
        self.built = True

    def call(self, sequence_output, masked_positions, embedding_table):
        """Masked-LM logits (or, with `masked_positions` None, the logits of every
        position: the left-to-right LM's next-token predictions).

        Args:
          sequence_output: [batch, seq_length, hidden].
          masked_positions: int32 [batch, num_predictions], or None for every position.
          embedding_table: the word-embedding table [vocab_size, hidden].

        Returns:
          float32 [batch, num_predictions (or seq_length), vocab_size].
        """
        if masked_positions is None:
            shape = ops.shape(sequence_output)[:2]
            x = sequence_output
        else:
            shape = ops.shape(masked_positions)
            x = gather_positions(sequence_output, masked_positions)
        x = ops.reshape(x, (-1, self.hidden_size))
        x = self.layer_norm(self.transform(x))
        table = ops.cast(embedding_table, self.compute_dtype)
        # transpose_b, not ops.transpose(table): the table's gradient then comes out of the
        # MatMul as [vocab, hidden], without a transpose of a vocab-sized matrix per step.
        logits = tf.matmul(ops.cast(x, self.compute_dtype), table, transpose_b=True)
        logits = ops.cast(logits, "float32") + ops.cast(self.output_bias, "float32")
        return ops.reshape(logits, (shape[0], shape[1], self.vocab_size))

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                      hidden_act=self.hidden_act, initializer_range=self.initializer_range,
                      layer_norm_epsilon=self.layer_norm_epsilon)
        return config


@keras.saving.register_keras_serializable(package="bert")
class DenseLogitsHead(keras.layers.Layer):
    """Dropout then a dense layer to ``num_outputs`` float32 logits (any input rank).

    The next-sentence head (num_outputs=2, no dropout), the classifier (pooled output)
    and the span / token-tagging heads (sequence output) are this layer.

    Args:
      num_outputs: number of logits per vector.
      hidden_size: width of the input vectors.
      dropout_rate: dropout on the input (training only).
      initializer_range: stddev of the kernel initializer.
    """

    def __init__(self, num_outputs, hidden_size, dropout_rate=0.0, initializer_range=0.02,
                 **kwargs):
        super().__init__(**kwargs)
        self.num_outputs = int(num_outputs)
        self.hidden_size = int(hidden_size)
        self.dropout_rate = float(dropout_rate)
        self.initializer_range = float(initializer_range)
        self.dropout = Dropout(self.dropout_rate, dtype=self.dtype_policy,
                                            name="dropout")
        self.dense = keras.layers.Dense(
            self.num_outputs, kernel_initializer=_truncated_normal(self.initializer_range),
            dtype=self.dtype_policy, name="dense")

    def build(self, input_shape=None):
        self.dense.build((None, self.hidden_size))
        self.built = True

    def call(self, inputs, training=None):
        """inputs [..., hidden] -> float32 logits [..., num_outputs]."""
        x = self.dropout(inputs, training=training)
        if len(x.shape) > 2:  # Plain GEMM on [rows, hidden].
            lead = ops.shape(x)[:-1]
            x = ops.reshape(self.dense(ops.reshape(x, (-1, self.hidden_size))),
                            tuple(lead) + (self.num_outputs,))
        else:
            x = self.dense(x)
        return ops.cast(x, "float32")

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.num_outputs,)

    def get_config(self):
        config = super().get_config()
        config.update(num_outputs=self.num_outputs, hidden_size=self.hidden_size,
                      dropout_rate=self.dropout_rate, initializer_range=self.initializer_range)
        return config
