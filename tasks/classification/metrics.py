"""Official GLUE metrics per task and the GLUE result/submission file writers (numpy only).

Degenerate cases (documented in docs/classifier_data.md and tested):
  * Matthews correlation is 0.0 when either the labels or the predictions take a single
    value (sklearn's convention).
  * Binary F1 is 0.0 when there are no positives in labels and predictions (sklearn's
    default `zero_division`).
  * Pearson and Spearman are nan when either input is constant, has fewer than two
    values, or contains nan/inf (scipy returns nan for constant input too). A nan metric
    means "undefined", e.g. a regressor that predicts one constant score.
  * Every metric raises ValueError on empty inputs or inputs of different lengths.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from data_prep.cli import UserError


# Canonical task names and the spellings accepted for them.
_TASK_ALIASES = {
    "cola": "cola",
    "sst-2": "sst-2", "sst2": "sst-2", "sst_2": "sst-2", "sst": "sst-2",
    "mrpc": "mrpc",
    "sts-b": "sts-b", "stsb": "sts-b", "sts_b": "sts-b", "sts": "sts-b",
    "qqp": "qqp",
    "mnli": "mnli", "mnli-m": "mnli", "mnli_m": "mnli", "mnli-matched": "mnli",
    "mnli_matched": "mnli",
    "mnli-mm": "mnli-mm", "mnli_mm": "mnli-mm", "mnli-mismatched": "mnli-mm",
    "mnli_mismatched": "mnli-mm",
    "qnli": "qnli",
    "rte": "rte",
    "wnli": "wnli",
    "ax": "ax", "diagnostic": "ax",
    "xnli": "xnli",
    "custom": "custom",
}

REGRESSION_TASKS = frozenset({"sts-b"})

# File names the GLUE server expects in a submission zip, per canonical task.
GLUE_SUBMISSION_FILE_NAMES = {
    "cola": "CoLA.tsv",
    "sst-2": "SST-2.tsv",
    "mrpc": "MRPC.tsv",
    "sts-b": "STS-B.tsv",
    "qqp": "QQP.tsv",
    "mnli": "MNLI-m.tsv",
    "mnli-mm": "MNLI-mm.tsv",
    "qnli": "QNLI.tsv",
    "rte": "RTE.tsv",
    "wnli": "WNLI.tsv",
    "ax": "AX.tsv",
}

# The metric that ranks checkpoints (and the GLUE leaderboard's score) per task.
PRIMARY_METRIC = {
    "cola": "mcc",
    "mrpc": "acc_and_f1",
    "qqp": "acc_and_f1",
    "sts-b": "pearson_and_spearman",
}


def normalize_task_name(task_name: str) -> str:
    """Returns the canonical lower-case task name ("STS-B" -> "sts-b", "SST2" -> "sst-2")."""
    key = str(task_name).strip().lower()
    if key not in _TASK_ALIASES:
        known = sorted(set(_TASK_ALIASES.values()))
        raise UserError(f"unknown task name {task_name!r}; expected one of {known}")
    return _TASK_ALIASES[key]


def primary_metric_name(task_name: str, is_regression: bool = False) -> str:
    """The metric used to pick the best checkpoint for `task_name`."""
    task = normalize_task_name(task_name)
    if task == "custom" and is_regression:
        return "pearson_and_spearman"
    return PRIMARY_METRIC.get(task, "accuracy")


def _pair(labels, predictions) -> tuple[np.ndarray, np.ndarray]:
    y_true = np.asarray(labels).reshape(-1)
    y_pred = np.asarray(predictions).reshape(-1)
    if y_true.shape != y_pred.shape:
        raise ValueError(
            f"labels and predictions differ in length: {y_true.size} vs {y_pred.size}")
    if y_true.size == 0:
        raise ValueError("metrics of an empty set of examples are undefined")
    return y_true, y_pred


def accuracy(labels, predictions) -> float:
    """Fraction of predictions equal to the labels."""
    y_true, y_pred = _pair(labels, predictions)
    return float(np.mean(y_true == y_pred))


def f1_score(labels, predictions, positive_label=1) -> float:
    """Binary F1 of class `positive_label`: 2*tp / (2*tp + fp + fn); 0.0 when that is 0/0."""
    y_true, y_pred = _pair(labels, predictions)
    true_pos = y_true == positive_label
    pred_pos = y_pred == positive_label
    tp = int(np.sum(true_pos & pred_pos))
    fp = int(np.sum(~true_pos & pred_pos))
    fn = int(np.sum(true_pos & ~pred_pos))
    denominator = 2 * tp + fp + fn
    return 0.0 if denominator == 0 else 2.0 * tp / denominator


def matthews_corrcoef(labels, predictions) -> float:
    """Matthews correlation (multiclass form, Gorodkin 2004); 0.0 for a constant side."""
    y_true, y_pred = _pair(labels, predictions)
    classes, encoded = np.unique(np.concatenate([y_true, y_pred]), return_inverse=True)
    n = y_true.size
    k = classes.size
    confusion = np.zeros((k, k), dtype=np.float64)
    np.add.at(confusion, (encoded[:n], encoded[n:]), 1.0)
    true_sums = confusion.sum(axis=1)
    pred_sums = confusion.sum(axis=0)
    correct = np.trace(confusion)
    total = float(n)
    cov_true_pred = correct * total - np.dot(true_sums, pred_sums)
    cov_pred_pred = total * total - np.dot(pred_sums, pred_sums)
    cov_true_true = total * total - np.dot(true_sums, true_sums)
    if cov_pred_pred * cov_true_true == 0:
        return 0.0
    return float(cov_true_pred / math.sqrt(cov_true_true * cov_pred_pred))


def _correlation_inputs(x, y) -> tuple[np.ndarray, np.ndarray] | None:
    """float64 copies, or None where the correlation is undefined (nan)."""
    a, b = _pair(x, y)
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    if a.size < 2 or not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return None
    if np.all(a == a[0]) or np.all(b == b[0]):
        return None
    return a, b


def _pearson_of(a: np.ndarray, b: np.ndarray) -> float:
    da = a - a.mean()
    db = b - b.mean()
    denominator = math.sqrt(float(np.dot(da, da)) * float(np.dot(db, db)))
    if denominator == 0.0:
        return float("nan")
    return float(np.clip(np.dot(da, db) / denominator, -1.0, 1.0))


def pearson_correlation(x, y) -> float:
    """Pearson's r; nan when undefined (constant input, fewer than 2 values, nan/inf)."""
    pair = _correlation_inputs(x, y)
    return float("nan") if pair is None else _pearson_of(*pair)


def rank_average(values) -> np.ndarray:
    """1-based ranks; tied values share their mean rank ([10, 20, 20] -> [1, 2.5, 2.5])."""
    x = np.asarray(values).reshape(-1)
    n = x.size
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    starts_group = np.concatenate([[True], ordered[1:] != ordered[:-1]])
    group_of_sorted = np.cumsum(starts_group) - 1
    group_bounds = np.concatenate([np.flatnonzero(starts_group), [n]])
    # Positions [lo, hi) in sorted order get rank (lo + 1 + hi) / 2.
    group_rank = (group_bounds[:-1] + 1 + group_bounds[1:]) / 2.0
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = group_rank[group_of_sorted]
    return ranks


def spearman_correlation(x, y) -> float:
    """Spearman's rho: Pearson of average ranks; nan when undefined (as pearson_correlation)."""
    pair = _correlation_inputs(x, y)
    if pair is None:
        return float("nan")
    return _pearson_of(rank_average(pair[0]), rank_average(pair[1]))


def task_metrics(task_name: str, labels, predictions, *, is_regression: bool | None = None
                 ) -> dict[str, float]:
    """The official GLUE metrics of one task on dev predictions.

    Args:
      task_name: a GLUE task, "xnli", "ax" or "custom" (any spelling normalize_task_name takes).
      labels: [num_examples] gold label ids (classification) or scores (regression).
      predictions: [num_examples] predicted label ids, or scores for regression tasks.
      is_regression: only for "custom": whether the labels are scores.

    Returns:
      accuracy for every classification task; plus f1 and acc_and_f1 for MRPC and QQP;
      mcc for CoLA; pearson, spearman and pearson_and_spearman for STS-B (and custom
      regression).
    """
    task = normalize_task_name(task_name)
    regression = task in REGRESSION_TASKS or (task == "custom" and bool(is_regression))
    if regression:
        pearson = pearson_correlation(labels, predictions)
        spearman = spearman_correlation(labels, predictions)
        return {"pearson": pearson, "spearman": spearman,
                "pearson_and_spearman": (pearson + spearman) / 2.0}
    metrics = {"accuracy": accuracy(labels, predictions)}
    if task in ("mrpc", "qqp"):
        metrics["f1"] = f1_score(labels, predictions, positive_label=1)
        metrics["acc_and_f1"] = (metrics["accuracy"] + metrics["f1"]) / 2.0
    if task == "cola":
        metrics["mcc"] = matthews_corrcoef(labels, predictions)
    return metrics


# --- Result files -------------------------------------------------------------------------


def glue_submission_file_name(task_name: str, split: str | None = None) -> str:
    """The file name the GLUE server expects for a task ("MRPC.tsv", "MNLI-mm.tsv", ...).

    For MNLI, `split` "test_mismatched" (or "dev_mismatched") selects MNLI-mm.tsv.
    """
    task = normalize_task_name(task_name)
    if task == "mnli" and split is not None and "mismatched" in split:
        task = "mnli-mm"
    if task not in GLUE_SUBMISSION_FILE_NAMES:
        raise ValueError(f"task {task_name!r} has no GLUE submission file; GLUE tasks are "
                         f"{sorted(GLUE_SUBMISSION_FILE_NAMES)}")
    return GLUE_SUBMISSION_FILE_NAMES[task]


def glue_submission_text(task_name: str, predictions, label_list: Sequence[str] | None = None,
                         indices: Sequence | None = None) -> str:
    """A GLUE server submission file: header "index\\tprediction", then one line per
    test example with the label name (or the score for STS-B / regression).

    Args:
      task_name: the task; STS-B (and "custom" with label_list None) writes scores.
      predictions: [num_examples] label ids or scores, or [num_examples, num_classes]
        probabilities (the arg-max is written).
      label_list: the processor's labels, mapping ids to names; None for regression.
      indices: the test set's index column; default 0..num_examples-1 (GLUE's indices).

    """
    task = normalize_task_name(task_name)
    array = np.asarray(predictions)
    regression = task in REGRESSION_TASKS or (task == "custom" and label_list is None)
    if regression:
        values = [str(value) for value in array.reshape(-1)]
    else:
        if label_list is None:
            raise ValueError(f"task {task_name!r} is a classification task: give label_list")
        ids = array.argmax(axis=-1) if array.ndim == 2 else array.reshape(-1)
        bad = [int(i) for i in ids if not 0 <= int(i) < len(label_list)]
        if bad:
            raise ValueError(f"prediction id {bad[0]} outside label_list {list(label_list)}")
        values = [str(label_list[int(i)]) for i in ids]
    if indices is None:
        indices = range(len(values))
    elif len(indices) != len(values):
        raise ValueError(f"{len(indices)} indices for {len(values)} predictions")
    lines = ["index\tprediction\n"]
    lines.extend(f"{index}\t{value}\n" for index, value in zip(indices, values))
    return "".join(lines)


def format_metrics(metrics: Mapping[str, float]) -> str:
    """Lines "key = value" in sorted key order, as the original's eval_results.txt."""
    return "".join(f"{key} = {metrics[key]}\n" for key in sorted(metrics))
