"""The classification task as the loop and the runner see it: loss, dataset, eval and predict outputs.

`classifier_task` is the loop's task object (`tasks.common.classifier_task.ClassifierTask`,
the original run_classifier's loss, with the task's official metrics), and
`ClassificationFamily` is what
`training.finetuning.run` needs: the splits of a GLUE/XNLI/custom task (MNLI: both dev
and test sets), the model, `eval_results.txt` figures (the original's keys, plus the
official metrics) and `test_results.tsv` + the GLUE submission file, written together.
"""

from __future__ import annotations

import dataclasses
import functools

import tensorflow as tf

from data_prep.cli import UserError
from modeling.export.metadata import ExportMetadata
from tasks.classification import data, metrics, processors
from tasks.classification.data import LONG_DOCUMENT_MODES, ClassificationSettings
from tasks.common.classifier_task import ClassifierTask, test_results_text
from training import finetuning, input_pipeline

# The serving family (tasks.classification.export) that exports a classification run.
MODEL_TYPE = "classifier"


def classifier_task(task_name: str, num_labels: int, is_regression: bool = False
                    ) -> ClassifierTask:
    """The loop's task of a classification run: its dev figures are `task_name`'s official
    metrics (`metrics.task_metrics`)."""
    return ClassifierTask(num_labels, is_regression, task_metrics=functools.partial(
        metrics.task_metrics, task_name, is_regression=is_regression))


# MNLI is evaluated and predicted on both its matched and mismatched sets: split -> suffix
# of the result files.
_EVAL_SPLITS = {"mnli": (("dev_matched", ""), ("dev_mismatched", "_mm"))}
_PREDICT_SPLITS = {"mnli": (("test_matched", ""), ("test_mismatched", "_mm"))}


@dataclasses.dataclass(frozen=True)
class ClassificationExportMetadata(ExportMetadata):
    """`export_metadata.json` of a classification run: the shared fields plus how the run
    read long texts, so that its export serves what it predicted. The fields of a mode
    are written only for that mode (a truncate run's file is as before).
    """

    long_document: str = "truncate"
    head_tokens: int = 0
    doc_stride: int = 0
    max_windows_per_document: int = 0
    window_pooling: str = ""

    def to_json(self) -> str:
        import json

        data = json.loads(super().to_json())
        mode_fields = {"head_tail": ("long_document", "head_tokens"),
                       "windows": ("long_document", "doc_stride", "max_windows_per_document",
                                   "window_pooling")}.get(self.long_document, ())
        for name in ("long_document", "head_tokens", "doc_stride",
                     "max_windows_per_document", "window_pooling"):
            if name not in mode_fields:
                del data[name]
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


class ClassificationFamily(finetuning.TaskFamily):
    """Classification for `training.finetuning.run` (see `training.finetuning.TaskFamily`)."""

    name = "classification"

    def __init__(self, settings: ClassificationSettings, max_seq_length: int):
        self.settings = settings
        self.max_seq_length = max_seq_length
        self.processor = processors.get_processor(settings.task_name,
                                            xnli_language=settings.xnli_language,
                                            custom=settings.custom)
        self.label_list = list(self.processor.get_labels(settings.data_dir))
        self.is_regression = bool(self.processor.is_regression)
        self.num_labels = 1 if self.is_regression else len(self.label_list)
        self._task = classifier_task(settings.task_name, self.num_labels, self.is_regression)
        self._batch_sizes: dict = {}
        self.head_tokens = self._head_tokens()
        self.windows = self._windows()

    def _text_pair(self) -> bool:
        return any(layout.text_b is not None for layout in self.processor.layouts.values())

    def _head_tokens(self):
        """head_tail's head (None for truncate), checked against the task and the window."""
        cfg = self.settings
        if cfg.long_document not in LONG_DOCUMENT_MODES:
            raise UserError(f"--long_document={cfg.long_document}: expected one of "
                            f"{', '.join(LONG_DOCUMENT_MODES)}")
        if cfg.long_document == "truncate":
            return None
        if self._text_pair():
            # Which side's head and tail to keep has no single good answer: refuse.
            raise UserError(f"--long_document={cfg.long_document} reads single texts; task "
                            f"{cfg.task_name} has text pairs (text_b)")
        if cfg.long_document != "head_tail":
            return None
        budget = self.max_seq_length - 2
        head = (data.default_head_tokens(self.max_seq_length) if cfg.head_tokens is None
                else cfg.head_tokens)
        if not 0 <= head <= budget:
            raise UserError(f"--head_tokens={head} must be between 0 and max_seq_length - 2 "
                            f"= {budget}")
        return head

    def _windows(self):
        """The windows mode's `data.Windows` (None in the other modes), checked."""
        from modeling.models import WINDOW_POOLINGS

        cfg = self.settings
        if cfg.long_document != "windows":
            return None
        budget = self.max_seq_length - 2
        # Default: windows side by side. Every window the evidence is not in dilutes what a
        # step learns from the one it is in (bench/RESULTS.md, Long documents), so overlap
        # costs learning speed as well as encoder passes.
        stride = budget if cfg.doc_stride is None else cfg.doc_stride
        if not 1 <= stride <= budget:
            raise UserError(f"--doc_stride={stride} must be between 1 and max_seq_length - 2 "
                            f"= {budget} (windows start doc_stride tokens apart)")
        if cfg.max_windows_per_document < 1:
            raise UserError(f"--max_windows_per_document={cfg.max_windows_per_document} "
                            "must be at least 1")
        if cfg.window_pooling not in WINDOW_POOLINGS:
            raise UserError(f"--window_pooling={cfg.window_pooling}: expected one of "
                            f"{', '.join(WINDOW_POOLINGS)}")
        return data.Windows(stride, cfg.max_windows_per_document)

    def identity(self) -> dict:
        identity = {"task": self.settings.task_name, "labels": self.label_list,
                    "is_regression": self.is_regression}
        if self.settings.long_document != "truncate":  # truncate's is as it always was
            identity["long_document"] = self.settings.long_document
            if self.windows is not None:
                identity["window_pooling"] = self.settings.window_pooling
        return identity

    def prepare(self, run):
        from data_prep import tokenization

        Split, PreparedData = finetuning.Split, finetuning.PreparedData
        cfg = self.settings
        tokenizer = tokenization.FullTokenizer(run.vocab_file, do_lower_case=run.do_lower_case)

        def split(name, suffix, pad):
            cached = data.prepare_classifier_records(
                self.processor, cfg.data_dir, name, run.output_dir,
                vocab_file=run.vocab_file, do_lower_case=run.do_lower_case,
                max_seq_length=run.max_seq_length, skip_bad_rows=cfg.skip_bad_rows,
                pad_to_multiple=pad, tokenizer=tokenizer, head_tokens=self.head_tokens,
                windows=self.windows)
            return Split(name, suffix, cached.num_examples, cached)

        prepared = PreparedData()
        if run.do_train:
            prepared.train = split("train", "", None)
        if run.do_eval:
            for name, suffix in _EVAL_SPLITS.get(cfg.task_name, (("dev", ""),)):
                prepared.eval_splits.append(split(name, suffix, run.eval_batch_size))
                self._batch_sizes[name] = run.eval_batch_size
        if run.do_predict:
            for name, suffix in _PREDICT_SPLITS.get(cfg.task_name, (("test", ""),)):
                prepared.predict_splits.append(split(name, suffix, run.predict_batch_size))
                self._batch_sizes[name] = run.predict_batch_size
        return prepared

    def build_model(self, bert_config):
        from modeling.models import BertClassifier, BertDocumentClassifier

        if self.windows is not None:
            return BertDocumentClassifier(bert_config, self.num_labels,
                                          pooling=self.settings.window_pooling)
        return BertClassifier(bert_config, self.num_labels)

    def build_variables(self, model, max_seq_length):
        if self.windows is None:
            return super().build_variables(model, max_seq_length)
        shape = [1, self.windows.max_windows, max_seq_length]
        model({"input_ids": tf.zeros(shape, tf.int32), "input_mask": tf.ones(shape, tf.int32),
               "segment_ids": tf.zeros(shape, tf.int32)}, training=False)

    def loop_task(self):
        return self._task

    def records(self, split):
        if self.windows is not None:
            # [windows, seq] per document: length bucketing cuts every window to the
            # bucket of the document's longest window.
            spec = data.windows_parse_spec(self.windows.max_windows, self.max_seq_length,
                                           self.is_regression)
        else:
            spec = data.classifier_parse_spec(self.max_seq_length, self.is_regression)
        return input_pipeline.RecordsConfig((split.data.record_file,), spec)

    def primary_metric(self) -> str:
        return "eval_" + metrics.primary_metric_name(self.settings.task_name,
                                                     self.is_regression)

    def _predict(self, trainer, split):
        """Logits, labels and is_real_example of every record, in input order."""
        return self.predict_outputs(trainer, split, self._batch_sizes[split.name],
                                    output_keys=("logits",),
                                    feature_keys=("label_ids", "is_real_example"))

    def evaluate(self, trainer, split, *, step, run_dir, write):
        del run_dir, write  # eval_results.txt is written by the driver
        out = self._predict(trainer, split)
        return self._task.eval_results(out["logits"], out["label_ids"],
                                       out["is_real_example"], step,
                                       batch_size=self._batch_sizes[split.name])

    def predict(self, trainer, split, *, run_dir, write):
        """test_results{suffix}.tsv (probabilities, or the score for regression) and, for
        GLUE tasks, the server's submission file, written together."""
        import os

        from absl import logging

        from data_prep import fileio

        out = self._predict(trainer, split)
        logits = out["logits"][out["is_real_example"] > 0]
        if self.is_regression:
            values, submission = logits, logits[:, 0]
        else:
            values = tf.nn.softmax(tf.constant(logits, tf.float32), axis=-1).numpy()
            submission = values
        if len(values) != split.num_examples:
            raise RuntimeError(f"{split.data.record_file}: {len(values)} predictions for "
                               f"{split.num_examples} examples")
        if not write:
            return []
        texts = {os.path.join(run_dir, f"test_results{split.suffix}.tsv"):
                 test_results_text(values)}
        try:
            name = metrics.glue_submission_file_name(self.settings.task_name, split.name)
        except ValueError:
            name = None  # XNLI and custom data have no GLUE server file.
        if name is not None:
            texts[os.path.join(run_dir, name)] = metrics.glue_submission_text(
                self.settings.task_name, submission,
                None if self.is_regression else self.label_list)
        fileio.write_texts(texts)
        for path in texts:
            logging.info("Wrote %d predictions (%s) to %s", len(values), split.name, path)
        return list(texts)

    def export_metadata(self, run):
        return ClassificationExportMetadata(
            task=self.settings.task_name, labels=tuple(self.label_list),
            is_regression=self.is_regression, do_lower_case=run.do_lower_case,
            max_seq_length=run.max_seq_length, text_pair=self._text_pair(),
            model_type=MODEL_TYPE, long_document=self.settings.long_document,
            head_tokens=self.head_tokens or 0,
            doc_stride=self.windows.doc_stride if self.windows else 0,
            max_windows_per_document=self.windows.max_windows if self.windows else 0,
            window_pooling=self.settings.window_pooling if self.windows else "")
