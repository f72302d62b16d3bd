"""Owns encoding many sequences for training in the memory of a few: chunks whose activations the backward pass recomputes, with the forward's dropout masks.

A document model encodes every window of every document of a batch (32 documents of 23
windows: 736 sequences). Backpropagation keeps every layer's activations of every
sequence until the backward pass (about 1.8 MB per 128-token sequence and layer at hidden
384: ~8 GB for those 736 through 6 layers; docs/run_classifier.md has the figures).
`pooled_output_recomputed` keeps only each sequence's inputs and pooled output: the
forward pass encodes `chunk` sequences at a time and frees their activations, the backward
pass encodes each chunk again and backpropagates through it alone, so the activation memory
of a step is one chunk's, whatever the batch, for one more forward pass of compute.

The recomputation draws the forward's dropout masks: every dropout layer of the encoder
reads its seed from its Keras seed generator, which is given, for chunk i, the state it had
before the step plus i (as i calls of `SeedGenerator.next` would leave it), in both passes;
afterwards the generators advance past every chunk, so the next step draws new masks.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from modeling.encoder import INPUT_NAMES


def _seed_states(encoder) -> list:
    """The state variables of the encoder's dropout seed generators (the encoder's only
    state besides its weights; a layer of rate 0 has none), from Keras' public variable
    lists: a `keras.random.SeedGenerator` keeps its state as "seed_generator_state"."""
    return [v for v in encoder.non_trainable_variables if v.name == "seed_generator_state"]


def pooled_output_recomputed(encoder, inputs: dict, chunk: int, training=True,
                             max_rows=None):
    """The encoder's ``pooled_output`` of ``inputs``, ``chunk`` sequences at a time, with
    activations recomputed in the backward pass (module docstring).

    Same values and gradients as ``encoder(inputs, training)["pooled_output"]`` (dropout
    masks drawn per chunk); gradients reach the encoder's trainable weights, not the
    (integer) inputs.

    Args:
      encoder: a built ``BertEncoder``.
      inputs: int ``input_ids``, ``input_mask``, ``segment_ids`` [rows, seq].
      chunk: sequences encoded at once (the last chunk is filled with all-padding rows).
      training: the encoder's training flag (dropout).
      max_rows: a static bound on ``rows``, if known: the chunks then have static shapes
        (XLA, ``--jit_compile``, needs them).

    Returns:
      [rows, hidden] in the encoder's compute dtype.
    """
    rows = tf.shape(inputs["input_ids"])[0]
    seq = tf.shape(inputs["input_ids"])[1]
    chunks = (rows + chunk - 1) // chunk
    # Room for every chunk: static when max_rows is; rows past `rows` are all-zero padding.
    slots = -(-max_rows // chunk) if max_rows else chunks
    row = tf.range(slots * chunk)
    keep = tf.cast(row < rows, tf.int32)[:, None]
    padded = {k: tf.reshape(tf.gather(tf.cast(inputs[k], tf.int32),
                                      tf.minimum(row, tf.maximum(rows - 1, 0))) * keep,
                            [slots, chunk, seq])
              for k in INPUT_NAMES}
    hidden = encoder.bert_config.hidden_size
    weights = encoder.trainable_variables
    seeds = _seed_states(encoder)
    start = [tf.identity(seed.value) for seed in seeds]   # before this step's masks

    def encode(i, weight_values):
        """Chunk i's pooled output [chunk, hidden], from `weight_values` (tensors standing
        for `weights`) and chunk i's seeds."""
        step = tf.stack([tf.constant(0, tf.int64), tf.cast(i, tf.int64)])
        mapping = list(zip(weights, weight_values)) + [
            (seed, state + tf.cast(step, state.dtype)) for seed, state in zip(seeds, start)]
        with keras.StatelessScope(state_mapping=mapping):
            return encoder({k: v[i] for k, v in padded.items()},
                           training=training)["pooled_output"]

    @tf.custom_gradient
    def pooled(*weight_values):
        def forward(i, out):
            return i + 1, out.write(i, encode(i, weight_values))

        # One chunk at a time (parallel_iterations=1): chunks run side by side would hold
        # their activations side by side.
        _, out = tf.while_loop(lambda i, _: i < chunks, forward,
                               (tf.constant(0), tf.TensorArray(
                                   encoder.compute_dtype, size=slots,
                                   element_shape=(chunk, hidden))), parallel_iterations=1)

        def backward(upstream):
            """Sum over chunks of d(chunk's pooled)/d(weights) . upstream[chunk]."""
            def body(i, sums):
                with tf.GradientTape() as tape:
                    tape.watch(weight_values)
                    value = encode(i, weight_values)
                grads = tape.gradient(value, weight_values, output_gradients=upstream[i])
                return i + 1, [s if g is None else s + tf.convert_to_tensor(g)
                               for s, g in zip(sums, grads)]

            _, sums = tf.while_loop(lambda i, _: i < chunks, body,
                                    (tf.constant(0), [tf.zeros_like(w) for w in weight_values]),
                                    parallel_iterations=1)
            return sums

        return out.stack(), backward

    result = pooled(*[w.value for w in weights])   # [chunks, chunk, hidden]
    with tf.control_dependencies([result]):
        step = tf.stack([tf.constant(0, tf.int64), tf.cast(chunks, tf.int64)])
        for seed, state in zip(seeds, start):
            seed.assign(state + tf.cast(step, state.dtype))
    return tf.reshape(result, [slots * chunk, hidden])[:rows]
