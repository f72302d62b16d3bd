"""Owns the classifier's serving signatures: raw text (+ text_pair) -> label probabilities or a regression score (registers at import).

The ``classifier`` family of ``modeling.export`` (see its docstring for the registry and
the signatures every family shares). Signatures:

* ``serving_default``: ``text`` (+ ``text_pair`` for pair tasks) -> ``probabilities``
  float32 [batch, num_labels], ``label`` string [batch] (the label names), ``logits``
  [batch, num_labels]; regression -> ``score`` float32 [batch] and ``logits`` [batch, 1];
* ``preprocess``: the same inputs -> int32 ``input_ids``, ``input_mask``, ``segment_ids``;
* ``serving_tokenized``: those three int32 tensors -> the outputs of ``serving_default``.

A run with ``--long_document=head_tail`` is served the same way: a text longer than the
window keeps its first ``head_tokens`` and its last tokens, in-graph (``head_tail_ids``).
A ``--long_document=windows`` run serves every token: each text is cut in-graph into the
run's ``doc_stride`` windows (``serving.token_windows``, the windows of
``tasks.common.windows``), the inputs of ``preprocess`` / ``serving_tokenized`` are
[batch, windows, seq] (windows: the request's most; all-zero windows pad the others), and
a text needing more than ``max_windows`` windows (the run's
``--max_windows_per_document``, or the export's ``--max_context_windows``: the model pools
any number of windows) is refused with InvalidArgumentError naming the ``text`` input and
the limit (``serving.TOO_MANY_WINDOWS``).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from modeling.export import families, registry, serving
from modeling.export.metadata import ExportError
from tasks.classification.task import MODEL_TYPE, ClassificationExportMetadata


@dataclasses.dataclass(frozen=True)
class ClassifierServingConfig(families.ServingConfig):
    """``--model_type=classifier``'s settings.

    Attributes:
      labels: label names in id order (empty for regression).
      is_regression: one float output (``score``) instead of label probabilities.
      text_pair: inputs are pairs (``text`` + ``text_pair``).
      long_document: "truncate" (the original), "head_tail" or "windows"
        (run_classifier.py's ``--long_document``).
      head_tokens: head_tail's head tokens.
      doc_stride, max_windows, window_pooling: windows' stride, most windows per text
        (the run's ``--max_windows_per_document``, or ``--max_context_windows``) and the
        model's pooling.
    """

    labels: tuple = ()
    is_regression: bool = False
    text_pair: bool = False
    long_document: str = "truncate"
    head_tokens: int = 0
    doc_stride: int = 0
    max_windows: int = 0
    window_pooling: str = ""

    model_type: ClassVar[str] = MODEL_TYPE
    omitted_at_default: ClassVar[dict] = {"long_document": "truncate", "head_tokens": 0,
                                          "doc_stride": 0, "max_windows": 0,
                                          "window_pooling": ""}


class ClassifierServing(families.ServingFamily):
    """``--model_type=classifier``: a fine-tuned ``BertClassifier`` (a windows run's:
    ``BertDocumentClassifier``)."""

    model_type = MODEL_TYPE
    config_class = ClassifierServingConfig
    metadata_class = ClassificationExportMetadata
    weights_description = "a fine-tuned classifier (run_classifier.py output)"
    flags = (
        families.FamilyFlag("label_list", "list", None, "label names in id order (comma "
                            "separated); default: the run's metadata's labels."),
        families.FamilyFlag("num_labels", "integer", None, "outputs of the head; checked "
                            "against the label list. Without a label list, labels are named "
                            "'0'..'n-1'."),
        families.FamilyFlag("is_regression", "bool", None, "one float output (score); "
                            "default: the run's metadata, else false."),
        families.TEXT_PAIR_FLAG,
        families.FamilyFlag("max_context_windows", "integer", 64, "a --long_document="
                            "windows run: most windows one text may need (a longer one is "
                            "refused with an error); default: the run's "
                            "--max_windows_per_document."),
    )

    def settings(self, given, metadata, max_seq_length):
        long_document = self._long_document_settings(metadata)
        limit = given.get("max_context_windows")
        if limit is not None:
            if long_document.get("long_document") != "windows":
                raise ExportError(
                    f"--max_context_windows={limit} applies to the export of a "
                    "--long_document=windows run (read from its export_metadata.json); "
                    "this one reads "
                    f"{long_document.get('long_document', 'truncate')} texts")
            if limit < 1:
                raise ExportError(f"--max_context_windows={limit} must be at least 1")
            long_document["max_windows"] = limit
        return {**long_document, **self._label_settings(given, metadata)}

    @staticmethod
    def _long_document_settings(metadata):
        """How the run read long texts (its metadata; "truncate" without one)."""
        mode = getattr(metadata, "long_document", "truncate")
        if mode == "head_tail":
            return {"long_document": mode, "head_tokens": metadata.head_tokens}
        if mode == "windows":
            return {"long_document": mode, "doc_stride": metadata.doc_stride,
                    "max_windows": metadata.max_windows_per_document,
                    "window_pooling": metadata.window_pooling}
        return {}

    def _label_settings(self, given, metadata):
        text_pair = families.text_pair_setting(given, metadata)
        is_regression = given.get("is_regression")
        if is_regression is None:
            is_regression = bool(metadata and metadata.is_regression)
        if is_regression:
            if given.get("num_labels") not in (None, 1):
                raise ExportError(
                    f"--num_labels={given['num_labels']} with --is_regression: a "
                    "regression head has exactly 1 output")
            if given.get("label_list"):
                # Would be parsed and ignored: a regression head has no labels.
                raise ExportError(
                    f"--label_list={','.join(given['label_list'])} with a regression head "
                    "(--is_regression, or the run's export_metadata.json): it has no "
                    "labels; pass --nois_regression to export a classifier")
            return {"labels": (), "is_regression": True, "text_pair": text_pair}
        labels = families.label_names(given, metadata, self.model_type, name_by_count=True)
        return {"labels": labels, "is_regression": False, "text_pair": text_pair}

    def weights_hint(self, message):
        if "classifier" not in message:
            return ""
        return ("\n  (the classifier head's size differs: check --label_list / "
                "--num_labels / --is_regression against the fine-tuned task)")

    def validate(self, config):
        if not config.is_regression and len(config.labels) < 1:
            raise ExportError("a classifier export needs its label names (or "
                              "is_regression)")
        from modeling.models import WINDOW_POOLINGS

        mode, budget = config.long_document, config.max_seq_length - 2
        if mode not in ("truncate", "head_tail", "windows"):
            raise ExportError(f"long_document={mode!r}: expected truncate, head_tail or "
                              "windows")
        if mode != "truncate" and config.text_pair:
            raise ExportError(f"long_document={mode} reads single texts, not pairs")
        if mode == "head_tail" and not 0 <= config.head_tokens <= budget:
            raise ExportError(f"head_tokens={config.head_tokens} must be between 0 and "
                              f"max_seq_length - 2 = {budget}")
        if mode == "windows" and (not 1 <= config.doc_stride <= budget
                                  or config.max_windows < 1
                                  or config.window_pooling not in WINDOW_POOLINGS):
            raise ExportError(
                f"long_document=windows needs 1 <= doc_stride={config.doc_stride} <= "
                f"{budget}, max_windows={config.max_windows} >= 1 and window_pooling="
                f"{config.window_pooling!r} one of {WINDOW_POOLINGS}")

    def build_model(self, config, bert_config, dtype_policy):
        from modeling.models import BertClassifier, BertDocumentClassifier

        num = 1 if config.is_regression else len(config.labels)
        if config.long_document == "windows":
            return BertDocumentClassifier(bert_config, num, pooling=config.window_pooling,
                                          dtype=dtype_policy)
        return BertClassifier(bert_config, num, dtype=dtype_policy)

    def check_model(self, model, config):
        from modeling.models import BertClassifier, BertDocumentClassifier

        windows = config.long_document == "windows"
        families.expect_model(model, BertDocumentClassifier if windows else BertClassifier,
                              config)
        if windows and model.pooling != config.window_pooling:
            raise ExportError(f"the document classifier pools its windows by "
                              f"{model.pooling!r}; the settings say {config.window_pooling!r}")
        want = 1 if config.is_regression else len(config.labels)
        if model.num_labels != want:
            raise ExportError(
                f"the classifier has {model.num_labels} outputs but "
                + ("regression needs 1" if config.is_regression
                   else f"{len(config.labels)} labels were given: {list(config.labels)}"))

    def signatures(self, module):
        def classify(features):
            return _classify(module, features)

        config = module.config
        pack = None
        specs = serving.ids_specs()
        if config.long_document == "windows":
            def pack(text):
                return pack_windows(module, text)

            # [batch, windows, seq]
            specs = {k: tf.TensorSpec([None, None, None], tf.int32, name=k) for k in specs}
        elif config.long_document == "head_tail":
            def pack(text):
                ids = head_tail_ids(module.tokenizer.tokenize(text),
                                    config.max_seq_length - 2, config.head_tokens)
                return serving.trim_to_request(module.tokenizer.pack_inputs(
                    ids, None, max_seq_length=config.max_seq_length))
        sigs = serving.text_signatures(module, classify, config.text_pair, pack=pack)
        sigs["serving_tokenized"] = tf.function(
            lambda **f: classify(serving.trim_to_request(f)),
            autograph=False).get_concrete_function(**specs)
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


def head_tail_ids(ids, budget: int, head_tokens: int):
    """``data.head_tail`` in-graph: each row of ``ids`` (RaggedTensor [batch, (tokens)])
    longer than ``budget`` keeps its first ``head_tokens`` and last ``budget - head_tokens``
    tokens, gathered by index."""
    lengths = ids.row_lengths()
    kept = tf.ragged.range(tf.minimum(lengths, budget))
    row = kept.value_rowids()
    position = kept.flat_values
    skipped = tf.gather(tf.maximum(lengths - budget, 0), row)
    source = position + tf.where(position >= head_tokens, skipped, tf.zeros_like(skipped))
    values = tf.gather(ids.flat_values, tf.gather(ids.row_splits, row) + source)
    return tf.RaggedTensor.from_row_splits(values, kept.row_splits, validate=False)


def pack_windows(module, text):
    """Raw texts [batch] -> int32 inputs [batch, windows, seq] of a windows run: each text's
    ``doc_stride`` windows of ``max_seq_length - 2`` tokens (a short last one filled with
    the tokens before it), ``[CLS] window [SEP]`` as the
    run's records (``data.window_record_values``), all-zero windows after a text's last up
    to the request's most; a text needing more than ``max_windows`` is refused."""
    config, tok = module.config, module.tokenizer
    ids = tok.tokenize(text)
    rows = tf.shape(ids.row_splits, out_type=tf.int64)[0] - 1
    span = tf.fill([rows], tf.constant(config.max_seq_length - 2, tf.int64))
    stride = tf.fill([rows], tf.constant(config.doc_stride, tf.int64))
    tokens, windows = serving.token_windows(
        ids, span, stride, config.max_windows, what="a `text` input",
        settings=f"max_seq_length={config.max_seq_length}, doc_stride={config.doc_stride}",
        advice="split the text, or export with a larger --max_context_windows",
        fill_before=True)   # a short last window filled to a whole one, as the records
    packed = tok.pack_inputs(tokens, None, max_seq_length=config.max_seq_length)
    most = tf.maximum(tf.reduce_max(windows["num_windows"]), 1)
    shape = tf.stack([rows, most, tf.constant(config.max_seq_length, tf.int64)])
    where = tf.stack([windows["example"], windows["index"]], axis=1)
    return serving.trim_to_request({name: tf.scatter_nd(where, value, shape)
                                    for name, value in packed.items()})


FAMILY = registry.register(ClassifierServing())
