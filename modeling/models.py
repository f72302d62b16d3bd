"""Task models = BertEncoder + a head: pretraining, classification, multiple choice, span, token tagging (fine-tuned or feature-based).

Each model has ``.encoder`` (a ``BertEncoder``), takes the encoder's input dict (plus
``masked_lm_positions`` for pretraining) and returns a dict of float32 logits under every
dtype policy. Weights exist right after construction.
"""

from __future__ import annotations

import keras
from keras import ops

from data_prep.cli import UserError
from modeling.config import LAYER_NORM_EPSILON, BertConfig
from modeling.encoder import BertEncoder, as_config
from modeling.heads import DenseLogitsHead, MaskedLMHead
from modeling.recompute import pooled_output_recomputed
from modeling.transformer import Dropout


class _TaskModel(keras.Model):
    """Shared wiring: the encoder, config serialisation, explicit build.

    Attributes:
      config_fields: the constructor arguments (besides ``config``) that ``get_config``
        saves, each stored under its own name.
      omitted_at_default: {config field: default} saved only when not at that default
        (options added later: the configs of models without them stay as written before).
    """

    config_fields: tuple = ()
    omitted_at_default: dict = {}

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.bert_config: BertConfig = as_config(config)
        self.encoder = BertEncoder(self.bert_config, dtype=self.dtype_policy, name="encoder")

    @property
    def config(self) -> BertConfig:
        return self.bert_config

    def _dropout_rate(self, dropout_rate) -> float:
        """A head's dropout: ``dropout_rate``, or the config's ``hidden_dropout_prob``."""
        return self.bert_config.hidden_dropout_prob if dropout_rate is None else float(
            dropout_rate)

    def _encoder_inputs(self, inputs):
        return {k: inputs[k] for k in ("input_ids", "input_mask", "segment_ids")}

    def get_config(self):
        config = super().get_config()
        config["config"] = self.bert_config.explicit_dict()
        config.update({name: getattr(self, name) for name in self.config_fields
                       if self.omitted_at_default.get(name, ()) != getattr(self, name)})
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)


class _DenseHeadModel(_TaskModel):
    """The encoder and one ``DenseLogitsHead`` on its pooled or sequence output.

    Attributes:
      head_name: the head's attribute and layer name, hence its checkpoint name
        (``model/<head_name>/dense/...``): fixed for good, checkpoints carry it.
      encoder_output: the encoder output the head reads ("pooled_output" [batch, hidden]
        or "sequence_output" [batch, seq_length, hidden]).
    """

    head_name: str = ""
    encoder_output: str = "pooled_output"

    def _head_width(self) -> int:
        """Width of the vectors the head reads."""
        return self.bert_config.hidden_size

    def _add_head(self, num_outputs: int, dropout_rate: float) -> None:
        """Creates the head under ``head_name`` and builds the model."""
        c = self.bert_config
        setattr(self, self.head_name, DenseLogitsHead(
            num_outputs, self._head_width(), dropout_rate=dropout_rate,
            initializer_range=c.initializer_range, dtype=self.dtype_policy,
            name=self.head_name))
        self.build()

    def _head(self) -> DenseLogitsHead:
        # A method, not a property: Keras' saving walks every attribute, and a property
        # holding the head would store its weights under "head" in .keras files.
        return getattr(self, self.head_name)

    def build(self, input_shape=None):
        if self.built:
            return
        self._head().build()
        self.built = True

    def _head_logits(self, inputs, training=None):
        """The head's float32 logits on the encoder's ``encoder_output``."""
        outputs = self.encoder(self._encoder_inputs(inputs), training=training)
        return self._head()(outputs[self.encoder_output], training=training)


class _LabelsModel(_DenseHeadModel):
    """``num_labels`` logits per vector of ``encoder_output``, after dropout (None:
    ``hidden_dropout_prob``). Call outputs: ``logits`` float32."""

    config_fields = ("num_labels", "dropout_rate")

    def __init__(self, config, num_labels, dropout_rate=None, **kwargs):
        super().__init__(config, **kwargs)
        self.num_labels = int(num_labels)
        self.dropout_rate = self._dropout_rate(dropout_rate)
        self._add_head(self.num_labels, self.dropout_rate)

    def call(self, inputs, training=None):
        return {"logits": self._head_logits(inputs, training=training)}


# Pretraining objectives (the paper's Table 5): the masked LM, or a left-to-right LM.
OBJECTIVES = ("mlm", "ltr")


@keras.saving.register_keras_serializable(package="bert")
class BertPretrainer(_TaskModel):
    """BERT with its pretraining heads: the original's masked LM tied to the word embeddings
    + next sentence, or one of the paper's ablations (Table 5).

    Args:
      config: ``BertConfig``.
      next_sentence_prediction: the NSP head (False: "No NSP", masked LM only; the model
        then has no ``next_sentence`` weights).
      objective: "mlm" (masked LM) or "ltr" (left-to-right LM: every next token predicted,
        through the same tied LM head, from a ``causal_attention`` encoder; no NSP).

    Call inputs: the encoder's dict plus, for "mlm", ``masked_lm_positions`` int32
    [batch, predictions].

    Call outputs: "mlm": ``masked_lm_logits`` float32 [batch, predictions, vocab_size] and
    (with NSP) ``next_sentence_logits`` float32 [batch, 2]; "ltr": ``next_token_logits``
    float32 [batch, seq_length, vocab_size], position t's prediction of token t + 1.
    """

    config_fields = ("next_sentence_prediction", "objective")
    omitted_at_default = {"next_sentence_prediction": True, "objective": "mlm"}

    def __init__(self, config, next_sentence_prediction=True, objective="mlm", **kwargs):
        super().__init__(config, **kwargs)
        c = self.bert_config
        self.next_sentence_prediction = bool(next_sentence_prediction)
        self.objective = objective
        if objective not in OBJECTIVES:
            raise ValueError(f"objective={objective!r}; expected one of {OBJECTIVES}")
        if objective == "ltr" and not c.causal_attention:
            raise ValueError("objective='ltr' needs an encoder with causal_attention (a "
                             "left-to-right LM must not see the tokens it predicts)")
        if objective == "mlm" and c.causal_attention:
            raise ValueError("objective='mlm' with causal_attention: the masked LM reads "
                             "both sides of a masked token")
        if objective == "ltr" and self.next_sentence_prediction:
            raise ValueError("objective='ltr' has no next sentence prediction (the paper's "
                             "LTR & No NSP)")
        # The LM head keeps its name (checkpoints: cls/predictions) for either objective.
        self.masked_lm = MaskedLMHead(
            vocab_size=c.vocab_size, hidden_size=c.hidden_size, hidden_act=c.hidden_act,
            initializer_range=c.initializer_range, layer_norm_epsilon=LAYER_NORM_EPSILON,
            dtype=self.dtype_policy, name="masked_lm")
        self.next_sentence = None
        if self.next_sentence_prediction:
            self.next_sentence = DenseLogitsHead(
                2, c.hidden_size, dropout_rate=0.0, initializer_range=c.initializer_range,
                dtype=self.dtype_policy, name="next_sentence")
        self.build()

    def build(self, input_shape=None):
        if self.built:
            return
        self.masked_lm.build()
        if self.next_sentence is not None:
            self.next_sentence.build()
        self.built = True

    def call(self, inputs, training=None):
        outputs = self.encoder(self._encoder_inputs(inputs), training=training)
        table = self.encoder.word_embeddings
        if self.objective == "ltr":
            return {"next_token_logits": self.masked_lm(outputs["sequence_output"], None,
                                                        embedding_table=table)}
        result = {"masked_lm_logits": self.masked_lm(
            outputs["sequence_output"], inputs["masked_lm_positions"], embedding_table=table)}
        if self.next_sentence is not None:
            result["next_sentence_logits"] = self.next_sentence(outputs["pooled_output"],
                                                                training=training)
        return result


@keras.saving.register_keras_serializable(package="bert")
class BertClassifier(_LabelsModel):
    """Sequence classifier / regressor: dropout + dense on the pooled output.

    Args:
      config: ``BertConfig``.
      num_labels: number of logits (1 for regression).
      dropout_rate: dropout before the dense layer; None means ``hidden_dropout_prob``.

    Call outputs: ``logits`` float32 [batch, num_labels].
    """

    head_name = "classifier"
    encoder_output = "pooled_output"


# How BertDocumentClassifier pools a document's windows into one vector.
WINDOW_POOLINGS = ("max_ends", "max", "mean", "attention")
# Windows BertDocumentClassifier encodes at once in training (docs/run_classifier.md,
# memory per window).
DEFAULT_WINDOWS_PER_CHUNK = 16


@keras.saving.register_keras_serializable(package="bert")
class BertDocumentClassifier(_LabelsModel):
    """A long document's windows -> one prediction: each window's pooled output, pooled over the document's windows, then the classifier's dropout + dense.

    The windows of a document are encoded independently, [batch, windows, seq] ->
    [batch * windows, seq], and their pooled outputs combined by ``pooling``: "max_ends"
    (the first window's, the last window's and the per-feature max over all windows,
    side by side: the head reads 3 x hidden), "max" (per feature), "mean", or "attention"
    (a learned score per window, softmax over the document's windows, the weighted
    mean): one set of logits per document, so the document's label trains every window
    through the pooling (end to end). A pooling over all windows alone trains the window
    holding the evidence at a fraction of each step; "max_ends" also gives the head the
    end windows undiluted, as ``head_tail``'s one sequence (bench/RESULTS.md, Long
    documents). A window whose
    ``input_mask`` is all zero is padding: it is not encoded (a short document costs its
    own windows' passes, not ``windows``) and no pooling sees it. In training the windows
    are encoded ``windows_per_chunk`` at a time with their activations recomputed in the
    backward pass (``modeling.recompute``): a step's activation memory is one chunk's,
    whatever the batch's documents and windows, for one more forward pass.

    Args:
      config: ``BertConfig``.
      num_labels: number of logits (1 for regression).
      pooling: one of ``WINDOW_POOLINGS``.
      dropout_rate: dropout before the dense layer; None means ``hidden_dropout_prob``.
      windows_per_chunk: windows encoded at once in training (0: all of a batch's at
        once, every activation kept for the backward pass).

    Call inputs: int32 ``input_ids``, ``input_mask``, ``segment_ids`` [batch, windows, seq].

    Call outputs: ``logits`` float32 [batch, num_labels].
    """

    head_name = "classifier"
    config_fields = ("num_labels", "dropout_rate", "pooling", "windows_per_chunk")
    omitted_at_default = {"windows_per_chunk": DEFAULT_WINDOWS_PER_CHUNK}

    def __init__(self, config, num_labels, pooling="max_ends", dropout_rate=None,
                 windows_per_chunk=DEFAULT_WINDOWS_PER_CHUNK, **kwargs):
        if pooling not in WINDOW_POOLINGS:
            raise ValueError(f"pooling={pooling!r}: expected one of {WINDOW_POOLINGS}")
        if int(windows_per_chunk) < 0:
            raise ValueError(f"windows_per_chunk={windows_per_chunk} must not be negative")
        self._window_pooling = pooling  # read by _add_head, before the model is built
        self.windows_per_chunk = int(windows_per_chunk)
        super().__init__(config, num_labels, dropout_rate=dropout_rate, **kwargs)

    @property
    def pooling(self) -> str:
        return self._window_pooling

    def _head_width(self) -> int:
        return (3 if self.pooling == "max_ends" else 1) * self.bert_config.hidden_size

    def _add_head(self, num_outputs, dropout_rate):
        if self.pooling == "attention":
            c = self.bert_config
            self.window_attention = keras.layers.Dense(
                1, kernel_initializer=keras.initializers.TruncatedNormal(
                    stddev=c.initializer_range), dtype=self.dtype_policy,
                name="window_attention")
            self.window_attention.build((None, c.hidden_size))
        super()._add_head(num_outputs, dropout_rate)

    def call(self, inputs, training=None):
        shape = ops.shape(inputs["input_ids"])  # [batch, windows, seq]
        flat = {k: ops.reshape(v, (-1, shape[-1]))
                for k, v in self._encoder_inputs(inputs).items()}
        present = ops.any(ops.not_equal(flat["input_mask"], 0), axis=-1)  # [batch * windows]
        # Only present windows are encoded: a record holds max_windows windows, mostly
        # all-zero padding for short documents, which would cost a full encoder pass each.
        index = ops.nonzero(present)[0]                                   # [present]
        windows = {k: ops.take(v, index, axis=0) for k, v in flat.items()}
        if training and self.windows_per_chunk:
            static = inputs["input_ids"].shape   # XLA needs a static bound on the chunks
            bound = static[0] * static[1] if static[0] and static[1] else None
            encoded = pooled_output_recomputed(self.encoder, windows, self.windows_per_chunk,
                                               max_rows=bound)
        else:
            encoded = self.encoder(windows, training=training)["pooled_output"]
        pooled = ops.scatter(ops.expand_dims(index, -1), encoded,
                             (shape[0] * shape[1], self.bert_config.hidden_size))
        pooled = ops.reshape(pooled, (shape[0], shape[1], -1))   # [batch, windows, hidden]
        present = ops.reshape(present, (shape[0], shape[1]))     # [batch, windows]
        document = ops.cast(self._pool(pooled, present), pooled.dtype)
        return {"logits": self._head()(document, training=training)}

    def _pool(self, pooled, present):
        """[batch, head width] float32 from the windows' pooled outputs (present ones
        only: a document's windows come first, padding windows after, scattered as zeros;
        a document without windows, a padding row, pools to zeros)."""
        x = ops.cast(pooled, "float32")
        weight = ops.cast(present, "float32")[..., None]             # [batch, windows, 1]
        count = ops.sum(weight, axis=1)                               # [batch, 1]
        if self.pooling == "mean":
            return ops.sum(x * weight, axis=1) / ops.maximum(count, 1.0)
        if self.pooling in ("max", "max_ends"):
            best = ops.max(ops.where(weight > 0, x, -1e9), axis=1)
            best = ops.where(count > 0, best, 0.0)
            if self.pooling == "max":
                return best
            last = ops.maximum(ops.cast(count, "int32") - 1, 0)[:, :, None]  # [batch, 1, 1]
            return ops.concatenate(  # first, last (zeros in a padding row), max
                [x[:, 0], ops.take_along_axis(x, last, axis=1)[:, 0], best], axis=-1)
        scores = ops.cast(self.window_attention(pooled), "float32")   # [batch, windows, 1]
        scores = ops.where(weight > 0, scores, -1e9)
        return ops.sum(ops.softmax(scores, axis=1) * x * weight, axis=1)


@keras.saving.register_keras_serializable(package="bert")
class BertMultipleChoice(_DenseHeadModel):
    """Multiple choice (SWAG): one logit per choice from its pooled output, compared across choices.

    The choices of an example are encoded independently, [batch, choices, seq] ->
    [batch * choices, seq]; dropout + dense(1) on each pooled output; back to [batch,
    choices]: the softmax across a row's choices is the model's distribution (the paper's
    SWAG set-up, §4.4).

    Args:
      config: ``BertConfig``.
      dropout_rate: dropout before the dense layer; None means ``hidden_dropout_prob``.

    Call inputs: int32 ``input_ids``, ``input_mask``, ``segment_ids`` [batch, choices, seq].

    Call outputs: ``logits`` float32 [batch, choices].
    """

    head_name = "classifier"
    config_fields = ("dropout_rate",)

    def __init__(self, config, dropout_rate=None, **kwargs):
        super().__init__(config, **kwargs)
        self.dropout_rate = self._dropout_rate(dropout_rate)
        self._add_head(1, self.dropout_rate)

    def call(self, inputs, training=None):
        shape = keras.ops.shape(inputs["input_ids"])  # [batch, choices, seq]
        flat = {k: keras.ops.reshape(v, (-1, shape[-1]))
                for k, v in self._encoder_inputs(inputs).items()}
        logits = self._head_logits(flat, training=training)  # [batch * choices, 1]
        return {"logits": keras.ops.reshape(logits, (shape[0], shape[1]))}


def bilstm_layer(units: int, dtype_policy, name: str) -> keras.layers.Bidirectional:
    """A bidirectional LSTM of `units` per direction returning every position's
    [forward | backward] output (2 x units wide): the BiLSTM of the paper's feature-based
    tagger (Table 7) and of its "+ BiLSTM" fine-tuning (Table 5)."""
    return keras.layers.Bidirectional(
        keras.layers.LSTM(units, return_sequences=True, dtype=dtype_policy),
        dtype=dtype_policy, name=name)


def run_bilstm(layers, x, input_mask, training=None):
    """`x` [batch, seq, width] through the BiLSTM `layers` in turn, padding masked out
    (the backward direction starts at each row's last real token); padding rows of the
    result are zeroed. Returns [batch, seq, 2 x units]."""
    mask = ops.cast(input_mask, "bool")
    for layer in layers:
        x = layer(x, mask=mask, training=training)
    # A new tensor: Keras' attached mask stops here (the dense heads take none).
    return ops.multiply(x, ops.cast(mask, x.dtype)[:, :, None])


@keras.saving.register_keras_serializable(package="bert")
class BertSpanLabeler(_DenseHeadModel):
    """Span head (SQuAD): one dense layer giving a start and an end logit per token.

    Args:
      config: ``BertConfig``.
      bilstm_units: 0 (the original), or the units per direction of a randomly
        initialised BiLSTM between the encoder and the span layer (the paper's "+ BiLSTM"
        of Table 5, on the left-to-right model: it gives every token its right context).

    Call outputs: ``start_logits`` and ``end_logits``, float32 [batch, seq_length].
    """

    head_name = "span"
    encoder_output = "sequence_output"
    config_fields = ("bilstm_units",)
    omitted_at_default = {"bilstm_units": 0}

    def __init__(self, config, bilstm_units=0, **kwargs):
        super().__init__(config, **kwargs)
        self.bilstm_units = int(bilstm_units)
        if self.bilstm_units < 0:
            raise ValueError(f"bilstm_units={bilstm_units} must not be negative")
        self.bilstm = (bilstm_layer(self.bilstm_units, self.dtype_policy, "bilstm")
                       if self.bilstm_units else None)
        self._add_head(2, 0.0)

    def _add_head(self, num_outputs, dropout_rate):
        if self.bilstm is None:
            return super()._add_head(num_outputs, dropout_rate)
        c = self.bert_config
        self.span = DenseLogitsHead(
            num_outputs, 2 * self.bilstm_units, dropout_rate=dropout_rate,
            initializer_range=c.initializer_range, dtype=self.dtype_policy, name="span")
        self.build()

    def build(self, input_shape=None):
        if self.built:
            return
        if self.bilstm is not None:
            self.bilstm.build((None, None, self.bert_config.hidden_size))
        super().build(input_shape)

    def call(self, inputs, training=None):
        if self.bilstm is None:
            logits = self._head_logits(inputs, training=training)
        else:
            x = self.encoder(self._encoder_inputs(inputs),
                             training=training)["sequence_output"]
            x = run_bilstm([self.bilstm], x, inputs["input_mask"], training=training)
            logits = self.span(x, training=training)
        return {"start_logits": logits[:, :, 0], "end_logits": logits[:, :, 1]}


@keras.saving.register_keras_serializable(package="bert")
class BertTokenTagger(_LabelsModel):
    """Token tagging (NER): dropout + dense on every token's vector.

    Args:
      config: ``BertConfig``.
      num_labels: tags.
      dropout_rate: None means ``hidden_dropout_prob``.

    Call outputs: ``logits`` float32 [batch, seq_length, num_labels].
    """

    head_name = "tagger"
    encoder_output = "sequence_output"


# --- Feature-based tagging (the paper's Table 7) ------------------------------------------

# The rows of the paper's Table 7: which of the frozen encoder's activations feed the BiLSTM.
FEATURE_LAYERS = ("embeddings", "second_to_last_hidden", "last_hidden",
                  "weighted_sum_last_four", "concat_last_four", "weighted_sum_all")


@keras.saving.register_keras_serializable(package="bert")
class ScalarMix(keras.layers.Layer):
    """A learned weighted sum of layers, ELMo's scalar mix: gamma * sum_j softmax(w)_j h_j.

    The paper's "weighted sum" rows of Table 7 do not spell out the weighting; this is the
    standard one of the feature-based approach it compares with (ELMo). w starts at 0
    (an equal average), gamma at 1.

    Args:
      num_layers: how many [batch, seq, hidden] tensors are mixed.
    """

    def __init__(self, num_layers, **kwargs):
        super().__init__(**kwargs)
        self.num_layers = int(num_layers)

    def build(self, input_shape=None):
        self.mix_weights = self.add_weight(shape=(self.num_layers,), initializer="zeros",
                                           name="mix_weights")
        self.gamma = self.add_weight(shape=(), initializer="ones", name="gamma")
        self.built = True

    def call(self, layers):
        """layers: list of num_layers tensors [batch, seq, hidden] -> [batch, seq, hidden]."""
        weights = ops.cast(ops.softmax(self.mix_weights) * self.gamma, layers[0].dtype)
        return sum(weights[j] * layer for j, layer in enumerate(layers))

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers)
        return config


@keras.saving.register_keras_serializable(package="bert")
class BertFeatureTagger(_TaskModel):
    """The paper's feature-based tagger (Table 7): a FROZEN encoder's activations -> a
    two-layer BiLSTM -> dense, per token.

    The encoder runs in inference mode (no dropout), its outputs get no gradient and its
    variables are not trainable (`model.trainable_variables` holds only the head), so
    training leaves BERT's weights as loaded. `feature_layers` picks the activations:
    "embeddings" (the embedding layer's output), "second_to_last_hidden", "last_hidden",
    "weighted_sum_last_four" / "weighted_sum_all" (a `ScalarMix` of the last four / all
    hidden layers), "concat_last_four" (the last four hidden layers concatenated, 4 x hidden
    wide).

    Args:
      config: ``BertConfig``.
      num_labels: tags.
      feature_layers: one of ``FEATURE_LAYERS``.
      lstm_units: units per direction of each BiLSTM layer (the paper: "a two-layer
        768-dimensional BiLSTM"; we read 768 as per direction).
      lstm_layers: stacked bidirectional LSTM layers (the paper: 2).
      dropout_rate: dropout on the BiLSTM's input (the features) and on its output (before
        the dense layer); None means ``hidden_dropout_prob``. The paper does not say.

    Call outputs: ``logits`` float32 [batch, seq_length, num_labels].
    """

    config_fields = ("num_labels", "feature_layers", "lstm_units", "lstm_layers",
                     "dropout_rate")

    def __init__(self, config, num_labels, feature_layers="concat_last_four", lstm_units=768,
                 lstm_layers=2, dropout_rate=None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.bert_config
        if feature_layers not in FEATURE_LAYERS:
            raise ValueError(f"feature_layers={feature_layers!r}; expected one of "
                             f"{FEATURE_LAYERS}")
        needed = {"second_to_last_hidden": 2, "weighted_sum_last_four": 4,
                  "concat_last_four": 4}.get(feature_layers, 1)
        if c.num_hidden_layers < needed:
            raise UserError(f"--feature_layers={feature_layers} needs at least {needed} hidden "
                            f"layers; the model has {c.num_hidden_layers}")
        if int(lstm_units) < 1 or int(lstm_layers) < 1:
            raise ValueError(f"lstm_units={lstm_units} and lstm_layers={lstm_layers} must be "
                             "at least 1")
        self.num_labels = int(num_labels)
        self.feature_layers = feature_layers
        self.lstm_units = int(lstm_units)
        self.lstm_layers = int(lstm_layers)
        self.dropout_rate = self._dropout_rate(dropout_rate)
        self.encoder.trainable = False
        self.mixed_layers = {"weighted_sum_last_four": 4,
                             "weighted_sum_all": c.num_hidden_layers}.get(feature_layers, 0)
        self.mix = (ScalarMix(self.mixed_layers, dtype=self.dtype_policy, name="mix")
                    if self.mixed_layers else None)
        self.feature_dropout = Dropout(self.dropout_rate, dtype=self.dtype_policy,
                                       name="feature_dropout")
        # One attribute per layer (checkpoints name them model/bilstm_<i>/...).
        for i in range(self.lstm_layers):
            setattr(self, f"bilstm_{i}", bilstm_layer(self.lstm_units, self.dtype_policy,
                                                      f"bilstm_{i}"))
        # Not named "tagger": a BertTokenTagger checkpoint's head (other shape) must not
        # match it when such a checkpoint initialises the encoder.
        self.output_layer = DenseLogitsHead(
            self.num_labels, 2 * self.lstm_units, dropout_rate=self.dropout_rate,
            initializer_range=c.initializer_range, dtype=self.dtype_policy,
            name="output_layer")
        self.build()

    @property
    def feature_width(self) -> int:
        """Width of the features the BiLSTM reads."""
        factor = 4 if self.feature_layers == "concat_last_four" else 1
        return factor * self.bert_config.hidden_size

    @property
    def bilstm_layers(self) -> list:
        return [getattr(self, f"bilstm_{i}") for i in range(self.lstm_layers)]

    def build(self, input_shape=None):
        if self.built:
            return
        if self.mix is not None:
            self.mix.build()
        width = self.feature_width
        for layer in self.bilstm_layers:
            layer.build((None, None, width))
            width = 2 * self.lstm_units
        self.output_layer.build()
        self.built = True

    def features(self, inputs):
        """The frozen encoder's activations that feed the BiLSTM, without gradient.

        Returns:
          [batch, seq_length, feature_width] in the compute dtype.
        """
        inputs = self._encoder_inputs(inputs)
        if self.feature_layers == "embeddings":  # no need to run the transformer blocks
            x = self.encoder.embeddings(ops.cast(inputs["input_ids"], "int32"),
                                        ops.cast(inputs["segment_ids"], "int32"),
                                        training=False)
            return ops.stop_gradient(x)
        layers = [ops.stop_gradient(x)
                  for x in self.encoder(inputs, training=False)["encoder_outputs"]]
        if self.feature_layers == "second_to_last_hidden":
            return layers[-2]
        if self.feature_layers == "last_hidden":
            return layers[-1]
        if self.feature_layers == "concat_last_four":
            return ops.concatenate(layers[-4:], axis=-1)
        return self.mix(layers[-self.mixed_layers:])

    def call(self, inputs, training=None):
        x = self.feature_dropout(self.features(inputs), training=training)
        x = run_bilstm(self.bilstm_layers, x, inputs["input_mask"], training=training)
        return {"logits": self.output_layer(x, training=training)}
