"""GLUE metrics against hand-computed values (ties, degenerate cases) and the result writers."""

import math

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics

from tasks.classification import metrics as gm


def test_accuracy_and_input_checks():
    assert gm.accuracy([0, 1, 1, 0], np.array([0, 1, 0, 0])) == 0.75
    assert gm.accuracy(["a", "b"], ["a", "b"]) == 1.0
    with pytest.raises(ValueError, match="differ in length: 2 vs 3"):
        gm.accuracy([0, 1], [0, 1, 1])
    with pytest.raises(ValueError, match="empty"):
        gm.f1_score([], [])


def test_f1_binary_positive_class_one():
    # tp=2, fp=1, fn=1 -> 2*2 / (4 + 1 + 1)
    assert gm.f1_score([1, 1, 0, 0, 1], [1, 0, 0, 1, 1]) == pytest.approx(4 / 6)
    assert gm.f1_score([0, 0, 1], [0, 0, 0]) == 0.0  # no predicted positives
    assert gm.f1_score([0, 0], [0, 0]) == 0.0  # 0/0 -> 0.0 as sklearn
    assert gm.f1_score([1, 1], [1, 1]) == 1.0


def test_matthews_corrcoef_hand_computed_and_degenerate():
    # tp=2, tn=1, fp=1, fn=1: (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6
    assert gm.matthews_corrcoef([1, 1, 1, 0, 0], [1, 1, 0, 0, 1]) == pytest.approx(1 / 6)
    assert gm.matthews_corrcoef([0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(1.0)
    assert gm.matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    assert gm.matthews_corrcoef([0, 1, 1, 0], [1, 1, 1, 1]) == 0.0  # constant predictor
    assert gm.matthews_corrcoef([1, 1, 1], [0, 1, 0]) == 0.0  # constant labels
    # Multiclass (Gorodkin): c=4, s=6, t=p=[2,2,2] -> (24-12)/sqrt(24*24) = 0.5
    assert gm.matthews_corrcoef([0, 1, 2, 0, 1, 2], [0, 1, 1, 0, 2, 2]) == pytest.approx(0.5)


def test_pearson_hand_computed_and_degenerate():
    # dx=[-1,0,1], dy=[-4/3,-1/3,5/3]: r = 3 / sqrt(2 * 42/9)
    assert gm.pearson_correlation([1, 2, 3], [1, 2, 4]) == pytest.approx(3 / math.sqrt(84 / 9))
    assert gm.pearson_correlation([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(gm.pearson_correlation([1, 2, 3], [2.5, 2.5, 2.5]))  # constant predictor
    assert math.isnan(gm.pearson_correlation([4, 4], [1, 2]))  # constant labels
    assert math.isnan(gm.pearson_correlation([1.0], [2.0]))  # fewer than two values
    assert math.isnan(gm.pearson_correlation([1, 2, np.nan], [1, 2, 3]))


def test_rank_average_and_spearman_with_ties():
    assert gm.rank_average([10, 20, 20, 5]).tolist() == [2.0, 3.5, 3.5, 1.0]
    assert gm.rank_average([3, 3, 3]).tolist() == [2.0, 2.0, 2.0]
    # ranks x=[1,2.5,2.5,4], y=[1,3,2,4]: 4.5 / sqrt(4.5 * 5)
    assert gm.spearman_correlation([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(
        4.5 / math.sqrt(22.5))
    assert gm.spearman_correlation([1, 2, 3, 4], [1, 8, 27, 1000]) == pytest.approx(1.0)
    assert math.isnan(gm.spearman_correlation([1, 2, 3], [7, 7, 7]))


def test_against_scipy_and_sklearn():
    stats, metrics = scipy.stats, sklearn.metrics  # requirements-dev.txt
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, size=200).astype(float)
    y = x + rng.integers(-2, 3, size=200)
    assert gm.pearson_correlation(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
    assert gm.spearman_correlation(x, y) == pytest.approx(stats.spearmanr(x, y)[0])
    labels, predictions = rng.integers(0, 3, 100), rng.integers(0, 3, 100)
    assert gm.matthews_corrcoef(labels, predictions) == pytest.approx(
        metrics.matthews_corrcoef(labels, predictions))
    assert gm.f1_score(labels % 2, predictions % 2) == pytest.approx(
        metrics.f1_score(labels % 2, predictions % 2))


def test_task_metrics_official_sets():
    labels, predictions = [1, 1, 1, 0, 0], [1, 1, 0, 0, 1]
    assert gm.task_metrics("MRPC", labels, predictions) == pytest.approx(
        {"accuracy": 0.6, "f1": 2 / 3, "acc_and_f1": (0.6 + 2 / 3) / 2})
    assert set(gm.task_metrics("qqp", labels, predictions)) == {"accuracy", "f1", "acc_and_f1"}
    assert gm.task_metrics("CoLA", labels, predictions) == pytest.approx(
        {"accuracy": 0.6, "mcc": 1 / 6})
    for task in ("SST-2", "mnli", "mnli-mm", "qnli", "rte", "wnli", "xnli", "ax", "custom"):
        assert gm.task_metrics(task, labels, predictions) == {"accuracy": 0.6}
    sts = gm.task_metrics("STS-B", [1, 2, 2, 3], [1, 3, 2, 4])
    assert sts["spearman"] == pytest.approx(4.5 / math.sqrt(22.5))
    assert sts["pearson_and_spearman"] == pytest.approx((sts["pearson"] + sts["spearman"]) / 2)
    assert set(gm.task_metrics("custom", [0.1, 0.5, 0.2], [0.2, 0.4, 0.1],
                               is_regression=True)) == {"pearson", "spearman",
                                                        "pearson_and_spearman"}
    with pytest.raises(ValueError, match="unknown task name 'squad'"):
        gm.task_metrics("squad", [1], [1])


def test_primary_metric_names():
    assert gm.primary_metric_name("CoLA") == "mcc"
    assert gm.primary_metric_name("stsb") == "pearson_and_spearman"
    assert gm.primary_metric_name("mrpc") == "acc_and_f1"
    assert gm.primary_metric_name("rte") == "accuracy"
    assert gm.primary_metric_name("custom", is_regression=True) == "pearson_and_spearman"


def test_test_results_tsv_like_the_original():
    probabilities = np.array([[0.1, 0.9], [0.75, 0.25], [1 / 3, 2 / 3]], dtype=np.float32)
    # The original writes "\t".join(str(p) for p in row) per example, no header.
    from tasks.common.classifier_task import test_results_text

    assert (test_results_text(probabilities)
            == "0.1\t0.9\n0.75\t0.25\n0.33333334\t0.6666667\n")
    with pytest.raises(ValueError, match="num_classes"):
        test_results_text([0.1, 0.9])


def test_glue_submission_files():
    assert gm.glue_submission_file_name("mnli", "test_mismatched") == "MNLI-mm.tsv"
    labels = ["contradiction", "entailment", "neutral"]
    assert (gm.glue_submission_text("mnli", [[0.1, 0.2, 0.7], [0.8, 0.1, 0.1]], labels)
            == "index\tprediction\n0\tneutral\n1\tcontradiction\n")
    assert (gm.glue_submission_text("sts-b", np.array([4.25, 0.5], dtype=np.float32))
            == "index\tprediction\n0\t4.25\n1\t0.5\n")
    assert (gm.glue_submission_text("RTE", [1, 0], ["entailment", "not_entailment"],
                                    indices=[5, 6])
            == "index\tprediction\n5\tnot_entailment\n6\tentailment\n")
    with pytest.raises(ValueError, match="prediction id 2 outside"):
        gm.glue_submission_text("rte", [2], ["entailment", "not_entailment"])


def test_submission_file_names():
    expected = {"CoLA": "CoLA.tsv", "SST-2": "SST-2.tsv", "MRPC": "MRPC.tsv",
                "STS-B": "STS-B.tsv", "QQP": "QQP.tsv", "MNLI": "MNLI-m.tsv",
                "MNLI-mm": "MNLI-mm.tsv", "QNLI": "QNLI.tsv", "RTE": "RTE.tsv",
                "WNLI": "WNLI.tsv", "AX": "AX.tsv"}
    assert {task: gm.glue_submission_file_name(task) for task in expected} == expected
    assert gm.glue_submission_file_name("mnli", "test_matched") == "MNLI-m.tsv"
    with pytest.raises(ValueError, match="no GLUE submission file"):
        gm.glue_submission_file_name("xnli")


def test_format_metrics_sorted_lines():
    assert gm.format_metrics({"eval_loss": 0.5, "accuracy": 1.0}) == (
        "accuracy = 1.0\neval_loss = 0.5\n")
