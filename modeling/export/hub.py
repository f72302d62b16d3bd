"""Owns the TF Hub export: a reusable, fine-tunable BERT encoder SavedModel and its preprocessor SavedModel (registers at import).

``--model_type=hub`` writes ``DIR/encoder`` and ``DIR/preprocessor`` following TF Hub's
"Common SavedModel APIs for text: Transformer encoders" and the Reusable SavedModel API
(https://www.tensorflow.org/hub/common_saved_model_apis/text,
https://www.tensorflow.org/hub/reusable_saved_models), as Hub's
``bert_en_uncased_L-12_H-768_A-12`` + ``bert_en_uncased_preprocess/3`` pair:

Encoder (``DIR/encoder``), the loaded object ``encoder``:
  * ``encoder(inputs, training=False)``: ``inputs`` a dict of int32 [batch, seq]
    ``input_word_ids``, ``input_mask``, ``input_type_ids``; returns ``pooled_output``
    [batch, hidden], ``sequence_output`` [batch, seq, hidden], ``encoder_outputs`` (a
    LIST of num_hidden_layers [batch, seq, hidden] tensors) and ``default`` (=
    pooled_output), all float32. ``training=True`` turns dropout on.
  * ``encoder.variables``, ``encoder.trainable_variables``,
    ``encoder.regularization_losses`` (empty: BERT has no regularizer; weight decay is
    the optimizer's), so ``hub.KerasLayer(DIR/encoder, trainable=True)`` fine-tunes it.
  * ``encoder.vocab_file`` (asset) and ``encoder.do_lower_case``, as Hub's BERT encoders.

Preprocessor (``DIR/preprocessor``), the loaded object ``preprocessor``:
  * ``preprocessor(sentences)``: [batch] strings -> the three int32 [batch, seq_length]
    encoder inputs (one segment; seq_length = the export's max_seq_length, 128 by default);
  * ``preprocessor.tokenize(sentences)``: -> int32 RaggedTensor [batch, (words),
    (pieces)]; ``preprocessor.tokenize.get_special_tokens_dict()``: ``vocab_size``,
    ``start_of_sequence_id``, ``end_of_segment_id``, ``padding_id``, ``mask_id``;
  * ``preprocessor.bert_pack_inputs(segments, seq_length=...)``: a list of one or two
    tokenized segments (int32 RaggedTensors of ragged rank 1 or 2) -> the three int32
    [batch, seq_length] tensors. ``[CLS] a [SEP] (b [SEP])``, segment ids 0/1, zero
    padding; over-long pairs trimmed to prefixes of about equal length (Hub's round-robin
    trimming, which equals the original's ``_truncate_seq_pair``).

Tokenization is this project's in-graph tokenizer (``data_prep.tf_tokenization``), which
reproduces the original's (see docs/tokenization.md for the measured corner cases).
"""

from __future__ import annotations

import dataclasses
import os
from typing import ClassVar

import tensorflow as tf

from modeling.export import families, registry, serving
from modeling.export.metadata import ExportError, write_marker
from modeling.encoder import BertEncoder

ENCODER_DIR = "encoder"
PREPROCESSOR_DIR = "preprocessor"
HUB_INPUTS = ("input_word_ids", "input_mask", "input_type_ids")
_OUR_INPUTS = ("input_ids", "input_mask", "segment_ids")


def hub_input_specs():
    """The encoder's input dict: int32 [batch, seq] tensors named as TF Hub's."""
    return {k: tf.TensorSpec([None, None], tf.int32, name=k) for k in HUB_INPUTS}


class HubEncoder(tf.Module):
    """The encoder's reusable SavedModel object. TF Hub's interface wants ``variables`` and
    ``trainable_variables`` as saved attributes: the class attributes below shadow
    ``tf.Module``'s read-only properties of those names, so the instance holds them.

    Args:
      encoder: a ``BertEncoder`` with its weights.
      vocab_file, do_lower_case: recorded for users who tokenize themselves.
    """

    variables = None
    trainable_variables = None

    def __init__(self, encoder: BertEncoder, vocab_file: str, do_lower_case: bool):
        super().__init__()
        self.encoder = encoder
        self.variables = list(encoder.variables)
        self.trainable_variables = list(encoder.trainable_variables)
        self.regularization_losses = []
        self.vocab_file = tf.saved_model.Asset(vocab_file)
        self.do_lower_case = tf.Variable(do_lower_case, trainable=False, name="do_lower_case")

        @tf.function(autograph=False)
        def call(inputs, training=False):
            # Run on the request's width (its longest row), not the preprocessor's
            # seq_length; the outputs come back at the width passed (zeros where only
            # padding was cut), as TF Hub's interface has them.
            width = tf.shape(inputs["input_word_ids"])[1]
            features = serving.trim_to_request(
                {ours: inputs[hub] for ours, hub in zip(_OUR_INPUTS, HUB_INPUTS)})
            out = encoder(features, training=training)
            pooled = tf.cast(out["pooled_output"], tf.float32)
            return {"pooled_output": pooled, "default": pooled,
                    "sequence_output": serving.pad_positions(
                        tf.cast(out["sequence_output"], tf.float32), width),
                    "encoder_outputs": [serving.pad_positions(tf.cast(x, tf.float32), width)
                                        for x in out["encoder_outputs"]]}

        for training in (False, True):
            call.get_concrete_function(hub_input_specs(), training=training)
        self.__call__ = call


class _Tokenize(tf.Module):
    """``preprocessor.tokenize``: strings -> int32 [batch, (words), (pieces)]."""

    def __init__(self, tokenizer):
        super().__init__(name="tokenize")
        self.tokenizer = tokenizer
        vocab = {token: i for i, token in enumerate(tokenizer.vocab_tokens)}
        special = {"vocab_size": len(tokenizer.vocab_tokens)}
        for key, token in (("start_of_sequence_id", "[CLS]"), ("end_of_segment_id", "[SEP]"),
                           ("padding_id", "[PAD]"), ("mask_id", "[MASK]")):
            if token in vocab:
                special[key] = vocab[token]
        self.get_special_tokens_dict = tf.Module(name="get_special_tokens_dict")
        self.get_special_tokens_dict.__call__ = tf.function(
            lambda: {k: tf.constant(v, tf.int32) for k, v in special.items()},
            input_signature=[], autograph=False)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="sentences")],
                 autograph=False)
    def __call__(self, sentences):
        return tf.cast(self.tokenizer.tokenize_words(sentences), tf.int32)


class _PackInputs(tf.Module):
    """``preprocessor.bert_pack_inputs``: 1 or 2 tokenized segments -> encoder inputs."""

    def __init__(self, tokenizer, default_seq_length: int):
        super().__init__(name="bert_pack_inputs")
        self.tokenizer = tokenizer
        self.default_seq_length = default_seq_length
        for ragged_rank in (1, 2):
            for count in (1, 2):
                segments = [tf.RaggedTensorSpec([None] * (ragged_rank + 1), tf.int32,
                                                ragged_rank=ragged_rank)] * count
                self.__call__.get_concrete_function(segments)
                self.__call__.get_concrete_function(
                    segments, seq_length=tf.TensorSpec([], tf.int32))

    @tf.function(autograph=False)
    def __call__(self, inputs, seq_length=None):
        return pack(self.tokenizer, inputs,
                    self.default_seq_length if seq_length is None else seq_length)


def pack(tokenizer, inputs, seq_length):
    """Hub's ``bert_pack_inputs`` on our packing (``BertInGraphTokenizer.pack_inputs``).

    Args:
      tokenizer: the ``BertInGraphTokenizer``.
      inputs: a RaggedTensor or a list of 1 or 2, [batch, (tokens)] or [batch, (words),
        (pieces)].
      seq_length: int or scalar int32 tensor.
    Returns:
      dict of int32 [batch, seq_length]: input_word_ids, input_mask, input_type_ids.
    """
    if not isinstance(inputs, (list, tuple)):
        inputs = [inputs]
    if len(inputs) not in (1, 2):
        raise ValueError(f"bert_pack_inputs packs 1 or 2 segments, got {len(inputs)}")
    segments = [x.merge_dims(1, -1) if x.ragged_rank > 1 else x for x in inputs]
    packed = tokenizer.pack_inputs(segments[0], segments[1] if len(segments) == 2 else None,
                                   max_seq_length=seq_length)
    return {hub: packed[ours] for ours, hub in zip(_OUR_INPUTS, HUB_INPUTS)}


class HubPreprocessor(tf.Module):
    """The preprocessor's SavedModel object: ``__call__``, ``tokenize``, ``bert_pack_inputs``.

    Args:
      tokenizer: a ``BertInGraphTokenizer`` (the model's vocab and casing).
      default_seq_length: the root call's (and ``bert_pack_inputs``') sequence length.
    """

    def __init__(self, tokenizer, default_seq_length: int):
        super().__init__(name="bert_preprocess")
        self.tokenizer = tokenizer
        self.default_seq_length = default_seq_length
        self.tokenize = _Tokenize(tokenizer)
        self.bert_pack_inputs = _PackInputs(tokenizer, default_seq_length)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="sentences")],
                 autograph=False)
    def __call__(self, sentences):
        return pack(self.tokenizer, [self.tokenizer.tokenize(sentences)],
                    self.default_seq_length)


@dataclasses.dataclass(frozen=True)
class HubServingConfig(families.ServingConfig):
    """``--model_type=hub``'s settings: the common ones (``max_seq_length`` is the
    preprocessor's default ``seq_length``)."""

    model_type: ClassVar[str] = "hub"


class HubServing(families.ServingFamily):
    """``--model_type=hub``: the pretrained (or fine-tuned) encoder for TF Hub users."""

    model_type = "hub"
    config_class = HubServingConfig
    weights_description = "an encoder"
    exports_any_run = True
    # A hub preprocessor's default seq_length is TF Hub's 128, not the fine-tuning run's:
    # callers choose theirs per call (bert_pack_inputs(..., seq_length=...)).
    max_seq_length_from_run = False

    def build_model(self, config, bert_config, dtype_policy):
        return BertEncoder(bert_config, dtype=dtype_policy)

    def check_model(self, model, config):
        families.expect_model(model, BertEncoder, config)

    def signatures(self, module):
        raise ExportError("a hub export has no serving signatures: it is two "
                          "reusable SavedModels (see modeling/export/hub.py)")

    def write(self, model, config, directory, tokenizer=None):
        from data_prep.tf_tokenization import BertInGraphTokenizer

        tokenizer = tokenizer or BertInGraphTokenizer(config.vocab_file, config.do_lower_case)
        encoder_dir = os.path.join(directory, ENCODER_DIR)
        tf.saved_model.save(HubEncoder(model, config.vocab_file, config.do_lower_case),
                            encoder_dir)
        write_marker(encoder_dir, "hub_encoder", config)
        preprocessor_dir = os.path.join(directory, PREPROCESSOR_DIR)
        preprocessor = HubPreprocessor(tokenizer, config.max_seq_length)
        tf.saved_model.save(preprocessor, preprocessor_dir)
        write_marker(preprocessor_dir, "hub_preprocessor", config)


FAMILY = registry.register(HubServing())
