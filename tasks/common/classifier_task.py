"""Owns the loop's task for one label per example: the original run_classifier's loss, its statistics, dev figures and test_results.tsv.

Sentence classification (`tasks.classification`, with the official GLUE metrics) and
multiple choice (`tasks.multiple_choice`, the choices as classes) both train and evaluate
with it; what each family reports beyond accuracy comes in as `task_metrics`.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from modeling import losses
from training.loop import Task


def test_results_text(probabilities) -> str:
    """The original's test_results.tsv: one line per example, class probabilities
    tab-separated in input order, no header. Values are written as `str()` of their numpy
    type (float32 probabilities print like the original's).

    Args:
      probabilities: [num_examples, num_classes] (only real examples, padding removed).
    """
    array = np.asarray(probabilities)
    if array.ndim != 2:
        raise ValueError(f"probabilities must be [num_examples, num_classes], got shape "
                         f"{array.shape}")
    return "".join("\t".join(str(value) for value in row) + "\n" for row in array)


def accuracy_only(labels, predictions) -> dict:
    """The default dev figures: the fraction of predictions equal to the labels."""
    return {"accuracy": float(np.mean(np.asarray(labels).reshape(-1)
                                      == np.asarray(predictions).reshape(-1)))}


class ClassifierTask(Task):
    """Sequence classification (the original run_classifier's loss) or regression (MSE).

    Features: `input_ids`, `input_mask`, `segment_ids`, `label_ids` ([batch] int, or float
    for regression) and `is_real_example` ([batch]; padding rows weigh 0). Model outputs:
    `logits` [batch, num_labels] ([batch, 1] for regression).

    Args:
      num_labels: classes (1 for regression).
      is_regression: mean squared error on the single output instead of cross-entropy.
      task_metrics: (labels, predictions) -> {name: value} of the real rows, reported as
        `eval_<name>` (e.g. a GLUE task's official metrics); default: accuracy.
    """

    stat_keys = ("loss", "loss_sum", "correct_sum", "example_count")
    mean_keys = ("loss",)

    def __init__(self, num_labels: int, is_regression: bool = False,
                 task_metrics: Callable[..., dict] = accuracy_only):
        self.num_labels = int(num_labels)
        self.is_regression = bool(is_regression)
        self.task_metrics = task_metrics

    def loss_and_stats(self, outputs, features):
        return losses.classifier_loss(outputs["logits"], features["label_ids"],
                                      features.get("is_real_example"),
                                      is_regression=self.is_regression)

    def metrics_from_totals(self, totals, global_step):
        count = max(float(totals["example_count"]), 1.0)
        out = {"global_step": int(global_step),
               "eval_loss": float(totals["loss_sum"]) / count}
        if not self.is_regression:
            out["eval_accuracy"] = float(totals["correct_sum"]) / count
        return out

    def progress(self, totals):
        if self.is_regression:
            return []
        return [("accuracy", "acc",
                 totals["correct_sum"] / max(totals["example_count"], 1.0))]

    def eval_results(self, logits, labels, is_real, global_step: int,
                     batch_size: int | None = None) -> dict:
        """The eval_results.txt figures from dev predictions, padding rows dropped.

        `eval_loss` is the mean per-example loss over real examples (the original's
        `tf.metrics.mean(per_example_loss, weights=is_real_example)`); `loss` is the
        original Estimator's `loss`: the mean over eval batches of each batch's mean loss
        (the original on CPU/GPU evaluates unpadded batches, the last one short, so each
        batch's mean is over its real rows); then `eval_` + each of `task_metrics`
        and `global_step`.

        Args:
          batch_size: the eval batch the rows came in (rows in input order); None: one batch.
        """
        real = np.asarray(is_real).reshape(-1) > 0
        logits = np.asarray(logits, np.float64)
        labels = np.asarray(labels)
        per_example = losses.numpy_classifier_per_example_loss(
            logits[real], labels[real], is_regression=self.is_regression)
        batch_of_row = np.arange(len(real))[real] // (batch_size or max(len(real), 1))
        batch_means = [per_example[batch_of_row == b].mean() for b in np.unique(batch_of_row)]
        predictions = (logits[real][:, 0] if self.is_regression
                       else logits[real].argmax(-1))
        figures = self.task_metrics(labels[real], predictions)
        out = {f"eval_{key}": value for key, value in figures.items()}
        out["eval_loss"] = float(per_example.mean())
        out["loss"] = float(np.mean(batch_means))
        out["global_step"] = int(global_step)
        return out
