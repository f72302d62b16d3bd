"""The official SQuAD v1.1 and v2.0 evaluation: answer normalisation, EM, token F1, thresholds.

Behaviour follows the official evaluation scripts (evaluate-v1.1.py, evaluate-v2.0.py):

* normalisation: lower-case, drop `string.punctuation` characters, drop the whole words
  a / an / the, collapse whitespace;
* v1.1: exact match and token F1, each the maximum over the gold answers, reported as
  `exact_match` and `f1` in percent;
* v2.0: a question without gold answers has the single gold answer "" (F1 of two empty
  token lists is 1, of one empty list 0); totals `exact`/`f1`/`total`, the `HasAns_*` and
  `NoAns_*` splits, and with no-answer probabilities (`null_odds.json`) the best threshold
  search `best_exact(_thresh)`, `best_f1(_thresh)`.

Two deliberate differences: a question with no prediction scores 0 and is counted in the
totals in both versions (the v2.0 script leaves it out of `total` and then fails on the
HasAns/NoAns splits); a warning names how many were missing. A v1.1 question whose
`answers` is empty has nothing to be scored against (evaluate-v1.1.py fails on it with
"max() arg is an empty sequence"): it is left out of the scores with a warning naming it,
and the figures then also give `total` (the questions scored) and
`skipped_without_answers`.
"""

from __future__ import annotations

import collections
import json
import re
import string
from typing import Mapping

from absl import logging

from data_prep import fileio
from data_prep.cli import UserError

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lower-case, strip punctuation, drop articles, collapse whitespace (official order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def get_tokens(text: str) -> list[str]:
    """Normalised answer tokens; [] for an empty answer."""
    if not text:
        return []
    return normalize_answer(text).split()


def exact_match_score(prediction: str, ground_truth: str) -> bool:
    """True when the normalised strings are equal."""
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def f1_score_v1(prediction: str, ground_truth: str) -> float:
    """v1.1 token F1: 0 when no token is shared (also when both are empty)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_tokens)
    recall = 1.0 * num_same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


def compute_exact(a_gold: str, a_pred: str) -> int:
    """v2.0 exact match as 0/1."""
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold: str, a_pred: str) -> float:
    """v2.0 token F1: if either answer has no tokens, 1 when both have none, else 0."""
    gold_toks = get_tokens(a_gold)
    pred_toks = get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def metric_max_over_ground_truths(metric_fn, prediction: str, ground_truths) -> float:
    return max(metric_fn(prediction, gt) for gt in ground_truths)


def _articles(dataset_json):
    """Accepts the whole JSON object ({"version", "data"}) or its `data` list."""
    if isinstance(dataset_json, Mapping):
        if "data" not in dataset_json:
            raise UserError("SQuAD dataset has no 'data' field")
        return dataset_json["data"]
    return dataset_json


def _questions(dataset_json):
    for article in _articles(dataset_json):
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def check_unique_ids(dataset_json, source: str = "SQuAD dataset") -> None:
    """Raises `data.SquadFormatError` naming a question id used twice in `source` (the
    scores would silently merge the two questions)."""
    from tasks.squad.data import check_new_question_id

    seen: dict = {}
    for a_index, article in enumerate(_articles(dataset_json)):
        for p_index, paragraph in enumerate(article["paragraphs"]):
            for q_index, qa in enumerate(paragraph["qas"]):
                check_new_question_id(
                    qa["id"], f"data[{a_index}].paragraphs[{p_index}].qas[{q_index}]",
                    seen, source)


def _warn_missing(missing: list[str]) -> None:
    if missing:
        logging.warning(
            "%d question(s) have no prediction and score 0 (first: %r)", len(missing), missing[0]
        )


def evaluate_v1(dataset_json, predictions: Mapping[str, str]) -> dict:
    """Official v1.1 scores: {"exact_match", "f1"} in percent.

    Questions without a gold answer are not scored (see the module docstring); when there
    are any, the result also holds `total` (questions scored) and
    `skipped_without_answers`.
    """
    f1 = exact_match = total = 0
    missing, no_answers = [], []
    for qa in _questions(dataset_json):
        ground_truths = [a["text"] for a in qa["answers"]]
        if not ground_truths:
            no_answers.append(qa["id"])
            continue
        total += 1
        if qa["id"] not in predictions:
            missing.append(qa["id"])
            continue
        prediction = predictions[qa["id"]]
        exact_match += metric_max_over_ground_truths(exact_match_score, prediction, ground_truths)
        f1 += metric_max_over_ground_truths(f1_score_v1, prediction, ground_truths)
    _warn_missing(missing)
    if no_answers:
        shown = ", ".join(repr(qid) for qid in no_answers[:10])
        logging.warning(
            "%d question(s) have no gold answer (\"answers\": []) and are not scored by the "
            "v1.1 metrics, which score answerable questions only: %s%s; %d scored",
            len(no_answers), shown, " ..." if len(no_answers) > 10 else "", total)
    if total == 0:
        raise UserError("SQuAD dataset has no questions with gold answers to score")
    scores = {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}
    if no_answers:
        scores.update(total=total, skipped_without_answers=len(no_answers))
    return scores


def get_raw_scores(dataset_json, predictions: Mapping[str, str]):
    """Per-question v2.0 exact and F1 (max over gold answers; "" when there are none)."""
    exact_scores, f1_scores = {}, {}
    missing = []
    for qa in _questions(dataset_json):
        qid = qa["id"]
        gold_answers = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])]
        if not gold_answers:
            gold_answers = [""]  # unanswerable: only the empty answer is right
        if qid not in predictions:
            missing.append(qid)
            a_pred = None
        else:
            a_pred = predictions[qid]
        if a_pred is None:
            exact_scores[qid], f1_scores[qid] = 0, 0
            continue
        exact_scores[qid] = max(compute_exact(a, a_pred) for a in gold_answers)
        f1_scores[qid] = max(compute_f1(a, a_pred) for a in gold_answers)
    _warn_missing(missing)
    return exact_scores, f1_scores


def apply_no_ans_threshold(scores, na_probs, qid_to_has_ans, na_prob_thresh):
    """Scores after answering "" wherever the no-answer probability exceeds the threshold."""
    new_scores = {}
    for qid, score in scores.items():
        if na_probs[qid] > na_prob_thresh:
            new_scores[qid] = float(not qid_to_has_ans[qid])
        else:
            new_scores[qid] = score
    return new_scores


def make_eval_dict(exact_scores, f1_scores, qid_list=None):
    if qid_list is None:
        total = len(exact_scores)
        return collections.OrderedDict([
            ("exact", 100.0 * sum(exact_scores.values()) / total),
            ("f1", 100.0 * sum(f1_scores.values()) / total),
            ("total", total),
        ])
    total = len(qid_list)
    return collections.OrderedDict([
        ("exact", 100.0 * sum(exact_scores[k] for k in qid_list) / total),
        ("f1", 100.0 * sum(f1_scores[k] for k in qid_list) / total),
        ("total", total),
    ])


def find_best_thresh(predictions, scores, na_probs, qid_to_has_ans):
    """Best score over thresholds on `na_probs`, and that threshold (official search).

    Starts from answering nothing (all no-answer questions right), then walks questions in
    increasing na_prob, switching each to its prediction, and keeps the best running total.
    """
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = best_score = num_no_ans
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if predictions.get(qid) else 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def evaluate_v2(dataset_json, predictions: Mapping[str, str], na_probs=None,
                na_prob_thresh: float = 1.0) -> dict:
    """Official v2.0 scores; with `na_probs` also the best-threshold entries."""
    qid_to_has_ans = {qa["id"]: bool(qa["answers"]) for qa in _questions(dataset_json)}
    if not qid_to_has_ans:
        raise UserError("SQuAD dataset has no questions")
    has_ans_qids = [k for k, v in qid_to_has_ans.items() if v]
    no_ans_qids = [k for k, v in qid_to_has_ans.items() if not v]
    given_na_probs = na_probs is not None
    if not given_na_probs:
        na_probs = {k: 0.0 for k in predictions}
    na_probs = dict(na_probs)
    for qid in qid_to_has_ans:  # missing entries: a question never switched to no-answer
        na_probs.setdefault(qid, 0.0)
    exact_raw, f1_raw = get_raw_scores(dataset_json, predictions)
    exact_thresh = apply_no_ans_threshold(exact_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    f1_thresh = apply_no_ans_threshold(f1_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    out = make_eval_dict(exact_thresh, f1_thresh)
    if has_ans_qids:
        for k, v in make_eval_dict(exact_thresh, f1_thresh, qid_list=has_ans_qids).items():
            out[f"HasAns_{k}"] = v
    if no_ans_qids:
        for k, v in make_eval_dict(exact_thresh, f1_thresh, qid_list=no_ans_qids).items():
            out[f"NoAns_{k}"] = v
    if given_na_probs:
        best_exact, exact_t = find_best_thresh(predictions, exact_raw, na_probs, qid_to_has_ans)
        best_f1, f1_t = find_best_thresh(predictions, f1_raw, na_probs, qid_to_has_ans)
        out["best_exact"] = best_exact
        out["best_exact_thresh"] = exact_t
        out["best_f1"] = best_f1
        out["best_f1_thresh"] = f1_t
    return dict(out)


def is_v2_dataset(dataset_json) -> bool:
    """SQuAD 2.0 when the file says so ("v2.0"), or when a question is unanswerable."""
    if isinstance(dataset_json, Mapping) and "version" in dataset_json:
        version = str(dataset_json["version"]).lstrip("v")
        if version.startswith("2"):
            return True
        if version.startswith("1"):
            return False
    return any(qa.get("is_impossible") or not qa["answers"] for qa in _questions(dataset_json))


def has_gold_answers(dataset_json) -> bool:
    """True when every question carries an `answers` list and at least one is non-empty
    (a dev set, not a test set): the predict file can then be scored."""
    seen_answer = False
    for qa in _questions(dataset_json):
        answers = qa.get("answers")
        if not isinstance(answers, list):
            return False
        seen_answer = seen_answer or bool(answers)
    return seen_answer


def evaluate(dataset_json, predictions: Mapping[str, str], na_probs=None, *,
             version_2_with_negative: bool | None = None,
             source: str = "SQuAD dataset") -> dict:
    """Official scores of `predictions` (qas_id -> text) against a SQuAD JSON object.

    Args:
      dataset_json: the parsed dataset file (or its `data` list).
      predictions: the contents of predictions.json.
      na_probs: v2.0 no-answer scores per question (null_odds.json); enables best_*.
      version_2_with_negative: force v2.0 (True) or v1.1 (False); None reads the file's
        `version` ("1.1" / "v2.0"), else v2.0 when any question has no answer.
      source: the dataset's file, for errors (a question id used twice is one).
    """
    check_unique_ids(dataset_json, source)
    v2 = is_v2_dataset(dataset_json) if version_2_with_negative is None else version_2_with_negative
    if v2:
        return evaluate_v2(dataset_json, predictions, na_probs)
    return evaluate_v1(dataset_json, predictions)


def evaluate_files(data_file: str, prediction_file: str, na_prob_file: str | None = None,
                   *, version_2_with_negative: bool | None = None) -> dict:
    """`evaluate` on files (dataset JSON, predictions.json, optional null_odds.json)."""
    def load(path):
        return json.loads(fileio.read_text(path))

    na_probs = load(na_prob_file) if na_prob_file else None
    return evaluate(load(data_file), load(prediction_file), na_probs,
                    version_2_with_negative=version_2_with_negative, source=data_file)


def eval_results_text(results: Mapping) -> str:
    """eval_results.json's contents: sorted keys, indented."""
    return json.dumps(dict(results), indent=2) + "\n"


def write_eval_results(results: Mapping, path: str) -> None:
    """Writes eval_results.json all-or-nothing."""
    fileio.write_text(path, eval_results_text(results))
