"""The multiple-choice task as the loop and the runner see it: loss, dataset, eval and predict outputs.

The loss is the classifier's cross-entropy with the choices as classes: softmax across an
example's C choice logits, cross-entropy on the gold index, padding rows weighted 0
(`tasks.common.classifier_task.ClassifierTask` with C labels). `MultipleChoiceFamily` is
what `training.finetuning.run` needs: train / dev / test splits, `BertMultipleChoice`,
`eval_results.txt` (`eval_accuracy`, `eval_loss`, the original-style `loss`,
`global_step`) and `test_results.tsv` (one line per test example, in input order, the C
choice probabilities tab-separated, as run_classifier's).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import tensorflow as tf
from absl import logging

from data_prep import fileio
from tasks.common.classifier_task import ClassifierTask, test_results_text
from tasks.multiple_choice import data
from tasks.multiple_choice.data import MultipleChoiceSettings
from training import finetuning, input_pipeline


class MultipleChoiceFamily(finetuning.TaskFamily):
    """Multiple choice for `training.finetuning.run` (see `training.finetuning.TaskFamily`)."""

    name = "multiple_choice"

    def __init__(self, settings: MultipleChoiceSettings, max_seq_length: int):
        self.settings = settings
        self.max_seq_length = max_seq_length
        self.num_choices = None  # known once the first split is read
        self._batch_sizes: dict = {}

    def identity(self) -> dict:
        return {"task": self.settings.task_name, "format": dataclasses.asdict(
            self.settings.format)}

    def prepare(self, run):
        from data_prep import tokenization

        tokenizer = tokenization.FullTokenizer(run.vocab_file, do_lower_case=run.do_lower_case)

        def split(name, pad):
            cached = data.prepare_records(
                self.settings.data_dir, name, run.output_dir, fmt=self.settings.format,
                vocab_file=run.vocab_file, do_lower_case=run.do_lower_case,
                max_seq_length=run.max_seq_length, num_choices=self.num_choices,
                pad_to_multiple=pad, tokenizer=tokenizer)
            self.num_choices = cached.metadata["num_choices"]
            return finetuning.Split(name, "", cached.num_examples, cached)

        prepared = finetuning.PreparedData()
        if run.do_train:
            prepared.train = split("train", None)
        if run.do_eval:
            prepared.eval_splits.append(split("dev", run.eval_batch_size))
            self._batch_sizes["dev"] = run.eval_batch_size
        if run.do_predict:
            prepared.predict_splits.append(split("test", run.predict_batch_size))
            self._batch_sizes["test"] = run.predict_batch_size
        return prepared

    def build_model(self, bert_config):
        from modeling.models import BertMultipleChoice

        return BertMultipleChoice(bert_config)

    def build_variables(self, model, max_seq_length):
        shape = [1, self.num_choices, max_seq_length]
        model({"input_ids": tf.zeros(shape, tf.int32), "input_mask": tf.ones(shape, tf.int32),
               "segment_ids": tf.zeros(shape, tf.int32)}, training=False)

    def loop_task(self):
        return ClassifierTask(self.num_choices)

    def records(self, split):
        return input_pipeline.RecordsConfig(
            (split.data.record_file,), data.parse_spec(self.num_choices, self.max_seq_length),
            sequence_features=data.SEQUENCE_FEATURES)

    def primary_metric(self) -> str:
        return "eval_accuracy"

    def _predict(self, trainer, split):
        return self.predict_outputs(trainer, split, self._batch_sizes[split.name],
                                    output_keys=("logits",),
                                    feature_keys=("label_ids", "is_real_example"))

    def evaluate(self, trainer, split, *, step, run_dir, write):
        del run_dir, write
        out = self._predict(trainer, split)
        return self.loop_task().eval_results(out["logits"], out["label_ids"],
                                             out["is_real_example"], step,
                                             batch_size=self._batch_sizes[split.name])

    def predict(self, trainer, split, *, run_dir, write):
        out = self._predict(trainer, split)
        logits = out["logits"][out["is_real_example"] > 0]
        if len(logits) != split.num_examples:
            raise RuntimeError(f"{split.data.record_file}: {len(logits)} predictions for "
                               f"{split.num_examples} examples")
        probabilities = tf.nn.softmax(tf.constant(logits, tf.float32), axis=-1).numpy()
        if not write:
            return []
        path = os.path.join(run_dir, "test_results.tsv")
        fileio.write_text(path, test_results_text(probabilities))
        labels = [e.label for e in split.data.examples]
        if all(label is not None for label in labels):
            accuracy = float(np.mean(probabilities.argmax(-1) == np.array(labels)))
            logging.info("The test file has labels: test accuracy %.4f", accuracy)
        logging.info("Wrote %d predictions to %s", len(probabilities), path)
        return [path]

    def export_metadata(self, run):
        from modeling.export.metadata import ExportMetadata
        from tasks.multiple_choice.export import FAMILY

        return ExportMetadata(task=self.settings.task_name,
                              do_lower_case=run.do_lower_case,
                              max_seq_length=run.max_seq_length,
                              model_type=FAMILY.model_type)
