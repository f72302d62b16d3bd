"""The official SQuAD v1.1 / v2.0 metrics (tasks/squad/metrics.py) on hand-computed cases."""

import json

import pytest

from tasks.squad import metrics as m


def dataset(questions, version="1.1"):
    """questions: list of (id, [gold texts]) -> a SQuAD JSON object."""
    return {"version": version, "data": [{"title": "t", "paragraphs": [{
        "context": "unused",
        "qas": [{"id": qid, "question": "?",
                 "answers": [{"text": t, "answer_start": 0} for t in golds]}
                for qid, golds in questions],
    }]}]}


@pytest.mark.parametrize("text, expected", [
    ("The Cat", "cat"),
    ("  a   an the  ", ""),
    ("Theater, anthem!", "theater anthem"),      # articles only as whole words
    ("the.cat", "thecat"),                         # punctuation removed before articles
    ("A-Team's (2nd) win", "ateams 2nd win"),
    ("Über  Café—“quoted”", "über café—“quoted”"),  # only ASCII string.punctuation
    ("the\tend\nthe", "end"),
    ("", ""),
])
def test_normalize_answer(text, expected):
    assert m.normalize_answer(text) == expected


def test_v1_exact_and_f1_hand_computed():
    # pred "the big red dog" -> [big, red, dog]; gold "red dog" -> [red, dog]
    # common 2: precision 2/3, recall 1 -> F1 0.8.
    assert m.f1_score_v1("the big red dog", "red dog") == pytest.approx(0.8)
    assert m.exact_match_score("The red dog.", "red dog")
    # Repeated tokens count by multiplicity: pred [a1 a1 a1], gold [a1]: P 1/3, R 1 -> 0.5.
    assert m.f1_score_v1("x x x", "x") == pytest.approx(0.5)
    # v1.1: an empty prediction scores 0, even against an answer that normalises to "".
    assert m.f1_score_v1("", "the") == 0
    assert m.exact_match_score("", "the")


def test_v1_evaluate_max_over_gold_answers_and_percentages():
    data = dataset([("q1", ["red dog", "the dog"]), ("q2", ["Paris"]), ("q3", ["1,000"]),
                    ("q4", ["blue"])])
    preds = {"q1": "dog", "q2": "paris, France", "q3": "1000"}  # q4 missing -> 0
    # q1: EM vs "the dog" 1. q2: EM 0, F1 P 1/2 R 1 -> 2/3. q3: "1000" == "1000" EM 1.
    scores = m.evaluate(data, preds)
    assert scores == pytest.approx({"exact_match": 50.0, "f1": 100 * (1 + 2 / 3 + 1) / 4})
    assert list(scores) == ["exact_match", "f1"]


def test_v1_question_without_gold_answers_is_skipped_and_named(caplog):
    """Issue 22: a v1.1 file with a question whose answers are [] crashed the scoring
    ("max() arg is an empty sequence", as evaluate-v1.1.py does)."""
    data = dataset([("q1", ["red dog"]), ("empty1", []), ("q2", ["Paris"]), ("empty2", [])])
    preds = {"q1": "red dog", "q2": "Rome", "empty1": "cat", "empty2": ""}
    with caplog.at_level("WARNING"):
        scores = m.evaluate(data, preds)
    assert scores == pytest.approx({"exact_match": 50.0, "f1": 50.0, "total": 2,
                                    "skipped_without_answers": 2})
    warning = " ".join(r.getMessage() for r in caplog.records if "no gold answer" in
                       r.getMessage())
    assert "2 question(s)" in warning and "'empty1'" in warning and "'empty2'" in warning
    assert "2 scored" in warning
    with pytest.raises(ValueError, match="no questions with gold answers"):
        m.evaluate_v1(dataset([("e", [])]), {"e": ""})


def test_v2_no_answer_scoring():
    assert m.compute_f1("", "") == 1 and m.compute_exact("", "") == 1
    assert m.compute_f1("", "something") == 0 and m.compute_f1("cat", "") == 0
    assert m.compute_f1("", "the") == 1  # "the" normalises to no tokens
    data = dataset([("has1", ["cat"]), ("has2", ["red dog"]), ("no1", []), ("no2", [])], "v2.0")
    preds = {"has1": "cat", "has2": "dog", "no1": "", "no2": "a cat"}
    scores = m.evaluate(data, preds)
    assert scores == pytest.approx({
        "exact": 50.0, "f1": 100 * (1 + 2 / 3 + 1 + 0) / 4, "total": 4,
        "HasAns_exact": 50.0, "HasAns_f1": 100 * (1 + 2 / 3) / 2, "HasAns_total": 2,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
    })
    # Gold answers that normalise to "" are dropped; none left means the answer is "".
    data2 = dataset([("q", ["the", "."])], "v2.0")
    assert m.evaluate(data2, {"q": ""})["exact"] == 100.0


def test_v2_best_threshold_search_hand_computed():
    data = dataset([("h1", ["cat"]), ("h2", ["dog"]), ("h3", ["emu"]), ("n1", []), ("n2", [])],
                   "v2.0")
    preds = {"h1": "cat", "h2": "dog", "h3": "emu", "n1": "bird", "n2": ""}
    na = {"h1": -3.0, "h2": 2.0, "h3": 0.5, "n1": 1.0, "n2": -1.0}
    # Start answering nothing: 2 (n1, n2 right). Switch in na order:
    # h1(-3) +1 -> 3 @-3; n2(-1) pred "" -> +0; h3(0.5) +1 -> 4 @0.5; n1(1.0) wrong -> 3;
    # h2(2.0) +1 -> 4 (not better). Best 4/5 at threshold 0.5.
    scores = m.evaluate(data, preds, na)
    assert scores["best_exact"] == pytest.approx(80.0)
    assert scores["best_exact_thresh"] == 0.5
    assert scores["best_f1"] == pytest.approx(80.0) and scores["best_f1_thresh"] == 0.5
    # With na_probs the official script also applies na_prob_thresh 1.0: h2 (2.0 > 1.0)
    # is switched to "no answer", losing its right answer; n1 (1.0) is not above it.
    assert scores["exact"] == pytest.approx(100 * 3 / 5)
    assert scores["HasAns_exact"] == pytest.approx(100 * 2 / 3)
    # Without na_probs there are no best_* entries.
    assert "best_exact" not in m.evaluate(data, preds)


def test_best_threshold_keeps_zero_when_answering_nothing_is_best():
    data = dataset([("h1", ["cat"]), ("n1", [])], "v2.0")
    preds = {"h1": "dog", "n1": "bird"}
    scores = m.evaluate(data, preds, {"h1": 0.2, "n1": 0.1})
    assert scores["best_exact"] == 50.0 and scores["best_exact_thresh"] == 0.0


def test_version_detection_and_override():
    v1 = dataset([("q", ["cat"])])
    assert not m.is_v2_dataset(v1)
    assert m.is_v2_dataset(dataset([("q", ["cat"])], "v2.0"))
    assert m.is_v2_dataset({"data": dataset([("q", [])])["data"]})
    assert "HasAns_exact" in m.evaluate(v1, {"q": "cat"}, version_2_with_negative=True)
    assert m.evaluate(v1["data"], {"q": "cat"}) == {"exact_match": 100.0, "f1": 100.0}


def test_evaluate_files_and_write_eval_results(tmp_path):
    data = dataset([("h", ["cat"]), ("n", [])], "v2.0")
    (tmp_path / "dev.json").write_text(json.dumps(data))
    (tmp_path / "predictions.json").write_text(json.dumps({"h": "the cat", "n": ""}))
    (tmp_path / "null_odds.json").write_text(json.dumps({"h": -2.0, "n": 3.0}))
    scores = m.evaluate_files(str(tmp_path / "dev.json"), str(tmp_path / "predictions.json"),
                              str(tmp_path / "null_odds.json"))
    assert scores["exact"] == 100.0 and scores["best_f1"] == 100.0
    out = tmp_path / "out" / "eval_results.json"
    m.write_eval_results(scores, str(out))
    assert json.loads(out.read_text()) == scores
    assert sorted(p.name for p in out.parent.iterdir()) == ["eval_results.json"]


def test_a_question_id_used_twice_is_refused(tmp_path):
    """Both versions would merge (v2.0) or count twice (v1.1) a repeated id."""
    for version in ("1.1", "v2.0"):
        data = dataset([("q1", ["cat"]), ("q2", ["dog"]), ("q1", ["emu"])], version)
        with pytest.raises(ValueError, match=r"question id 'q1' is used twice, at "
                           r"data\[0\]\.paragraphs\[0\]\.qas\[0\] and .*qas\[2\]"):
            m.evaluate(data, {"q1": "cat", "q2": "dog"})
        (tmp_path / "dev.json").write_text(json.dumps(data))
        (tmp_path / "predictions.json").write_text(json.dumps({"q1": "cat", "q2": "dog"}))
        with pytest.raises(ValueError, match=r"dev\.json: question id 'q1' is used twice"):
            m.evaluate_files(str(tmp_path / "dev.json"), str(tmp_path / "predictions.json"))


def test_empty_dataset_is_an_error():
    with pytest.raises(ValueError, match="no questions"):
        m.evaluate({"version": "1.1", "data": []}, {})


def test_has_gold_answers():
    assert m.has_gold_answers(dataset([("q", ["cat"]), ("n", [])], "v2.0"))
    assert not m.has_gold_answers(dataset([("n", [])], "v2.0"))
    test_set = dataset([("q", ["cat"])])
    del test_set["data"][0]["paragraphs"][0]["qas"][0]["answers"]
    assert not m.has_gold_answers(test_set)
