"""Owns the ``embedding`` serving family: raw text -> one vector per text, pooled and normalized in-graph as sentence-transformers computes it (registers at import).

Signatures (with ``preprocess`` and ``encode`` as every family, ``modeling.export``):

* ``serving_default``: ``text`` string [batch] -> ``embedding`` float32 [batch, hidden]:
  the in-graph tokenization and packing of every family (``[CLS] text [SEP]``, cut at
  ``max_seq_length``), the encoder on the request's width, the mean of the chosen
  ``layers`` at each token, pooled over the real tokens (``sentence_embedding``: cls, mean
  or max, as sentence-transformers' Pooling module; padding never counted) and, with
  ``normalize``, divided by its L2 norm (its Normalize module).

The settings come from ``--pooling``, ``--normalize`` and ``--layers``, else from a
sentence-transformers checkpoint (``run_metadata``: its modules, casing and
``max_seq_length``), else the defaults (mean, no normalization, the last layer).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from modeling.checkpoints.sentence_transformers import POOLING_MODES
from modeling.encoder import BertEncoder
from modeling.export import families, registry, serving
from modeling.export.metadata import ExportError, ExportMetadata

MODEL_TYPE = "embedding"


@dataclasses.dataclass(frozen=True)
class EmbeddingExportMetadata(ExportMetadata):
    """What a checkpoint says of its vectors (a sentence-transformers directory's modules):
    ``pooling`` (one of ``POOLING_MODES``) and ``normalize`` (L2)."""

    pooling: str = "mean"
    normalize: bool = False


def run_metadata(model) -> EmbeddingExportMetadata:
    """The export settings a sentence-transformers directory describes
    (``modeling.checkpoints.sentence_transformers.SentenceTransformersModel``)."""
    return EmbeddingExportMetadata(
        task="sentence-transformers", do_lower_case=model.do_lower_case,
        max_seq_length=model.max_seq_length, pooling=model.pooling,
        normalize=model.normalize, model_type=MODEL_TYPE)


@dataclasses.dataclass(frozen=True)
class EmbeddingServingConfig(families.ServingConfig):
    """``--model_type=embedding``'s settings.

    Attributes:
      pooling: "cls", "mean" or "max" over each text's real tokens.
      normalize: divide each vector by its L2 norm.
      layers: encoder layer indexes (-1: the last) whose mean at each token is pooled.
    """

    pooling: str = "mean"
    normalize: bool = False
    layers: tuple = (-1,)

    model_type: ClassVar[str] = MODEL_TYPE


def layer_indexes(text) -> tuple:
    """``--layers`` ("-1,-2") as a tuple of ints; ExportError naming the flag."""
    try:
        layers = tuple(int(x) for x in str(text).split(","))
    except ValueError:
        raise ExportError(f"--layers={text}: expected comma-separated integers "
                          "(e.g. -1 or -1,-2)") from None
    return layers


def sentence_embedding(tokens, input_mask, pooling: str, normalize: bool):
    """float32 [batch, hidden] from token vectors [batch, seq, hidden] and their
    ``input_mask`` [batch, seq] (1 = real token), as sentence-transformers' Pooling
    (``cls``: the first token; ``mean``: sum over real tokens / their count, at least
    1e-9; ``max``: each dimension's maximum over real tokens) and Normalize modules
    (x / max(||x||, 1e-12))."""
    tokens = tf.cast(tokens, tf.float32)
    real = tf.cast(input_mask, tf.float32)[:, :, None]
    if pooling == "cls":
        vectors = tokens[:, 0]
    elif pooling == "mean":
        vectors = (tf.reduce_sum(tokens * real, axis=1)
                   / tf.maximum(tf.reduce_sum(real, axis=1), 1e-9))
    elif pooling == "max":
        vectors = tf.reduce_max(tf.where(real > 0, tokens, float("-inf")), axis=1)
    else:
        raise ExportError(f"pooling={pooling!r} is not one of {', '.join(POOLING_MODES)}")
    if normalize:
        vectors = vectors / tf.maximum(tf.norm(vectors, axis=-1, keepdims=True), 1e-12)
    return vectors


# A request's rows run through the encoder ROWS_PER_RUN at a time, shortest first, each
# group on its own longest row: on 32 real sentences (21 WordPieces on average, the longest
# of a request ~60) a padded request holds 35% real tokens and costs MiniLM 11.7 CPU-ms per
# sentence, groups of 8 cost 6.2 (4: 6.4, 16: 7.9; bench/RESULTS.md).
ROWS_PER_RUN = 8


def by_length(fn, features: dict, width: int):
    """``fn`` (int32 features [rows, seq] -> float32 [rows, width]) on the rows of
    ``features`` in groups of ``ROWS_PER_RUN``, sorted by length (``fn`` trims each group
    to its longest row), returned in the request's order. Each row's result is its own
    (attention never crosses rows): only the padding computed changes."""
    lengths = tf.reduce_sum(tf.cast(features["input_mask"] > 0, tf.int32), axis=1)
    order = tf.argsort(lengths, stable=True)
    rows = tf.shape(order)[0]
    groups = (rows + ROWS_PER_RUN - 1) // ROWS_PER_RUN

    def run(i, done):
        picked = order[i * ROWS_PER_RUN:tf.minimum((i + 1) * ROWS_PER_RUN, rows)]
        return i + 1, done.write(i, fn({k: tf.gather(v, picked) for k, v in features.items()}))

    _, done = tf.while_loop(lambda i, _: i < groups, run, (tf.constant(0), tf.TensorArray(
        tf.float32, size=groups, infer_shape=False, element_shape=[None, width])))
    return tf.gather(tf.reshape(done.concat(), [-1, width]),
                     tf.math.invert_permutation(order))


class EmbeddingServing(families.ServingFamily):
    """``--model_type=embedding``: text -> one vector per text."""

    model_type = MODEL_TYPE
    config_class = EmbeddingServingConfig
    metadata_class = EmbeddingExportMetadata
    weights_description = "an encoder"
    exports_any_run = True
    flags = (
        families.FamilyFlag("pooling", "string", None, "cls, mean or max over each text's "
                            "tokens; default: a sentence-transformers checkpoint's Pooling "
                            "module, else mean."),
        families.FamilyFlag("normalize", "bool", None, "divide each vector by its L2 norm; "
                            "default: whether a sentence-transformers checkpoint has a "
                            "Normalize module, else false."),
        families.FamilyFlag("layers", "string", None, "comma-separated encoder layers (-1: "
                            "the last) whose mean at each token is pooled; default: -1."),
    )

    def settings(self, given, metadata, max_seq_length):
        pooling = given.get("pooling") or getattr(metadata, "pooling", "mean")
        normalize = given.get("normalize")
        if normalize is None:
            normalize = getattr(metadata, "normalize", False)
        layers = layer_indexes(given["layers"]) if given.get("layers") else (-1,)
        return {"pooling": pooling, "normalize": bool(normalize), "layers": layers}

    def validate(self, config):
        if config.pooling not in POOLING_MODES:
            raise ExportError(f"pooling={config.pooling!r} (--pooling) is not one of "
                              f"{', '.join(POOLING_MODES)}")
        if not config.layers:
            raise ExportError("layers=() (--layers): name at least one layer")

    def build_model(self, config, bert_config, dtype_policy):
        return BertEncoder(bert_config, dtype=dtype_policy)

    def check_model(self, model, config):
        families.expect_model(model, BertEncoder, config)
        count = model.config.num_hidden_layers
        for index in config.layers:
            if not -count <= index < count:
                raise ExportError(f"layers={list(config.layers)} (--layers): {index} is out "
                                  f"of range for {count} layers")

    def signatures(self, module):
        config = module.config
        hidden = module.encoder.config.hidden_size

        def vectors(features):
            """[rows, hidden] of features trimmed to their longest row."""
            features = serving.trim_to_request(features)
            layers = module.encoder(features, training=False)["encoder_outputs"]
            tokens = tf.add_n([tf.cast(layers[i], tf.float32) for i in config.layers])
            if len(config.layers) > 1:
                tokens = tokens / float(len(config.layers))
            return sentence_embedding(tokens, features["input_mask"], config.pooling,
                                      config.normalize)

        def embed(features):
            return {"embedding": by_length(vectors, features, hidden)}

        return serving.text_signatures(module, embed, text_pair=False)


FAMILY = registry.register(EmbeddingServing())
