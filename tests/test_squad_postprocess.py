"""SQuAD post-processing (tasks/squad/data.py part 4): oracle logits and Google's original code.

* Oracle: logits peaking at the gold start/end sub-tokens, in the window that scores the
  answer's start (max context), must give back every gold answer text exactly (EM 100),
  for answers in later windows, at window edges, with punctuation, accents and numbers,
  cased and uncased; v2.0 unanswerable questions peak at [CLS] and must predict "".
* Fidelity: Google's read_squad_examples / convert_examples_to_features / FeatureWriter /
  write_predictions run on the same data and logits in a child process (the original's
  modules need a `tensorflow.contrib` stand-in and define absl flags that would clash
  with other original modules loaded in the test process); features, TFRecords and all
  three JSON files must be identical.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tasks.squad import data as squad
from tasks.squad import postprocess
from tasks.squad import metrics as squad_metrics
from tests.test_squad_data import (
    QUESTION_WORDS, SENTENCES, SHORT_CONTEXT, basic_pieces, make_tokenizer, qa, squad_json,
    write_json,
)

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def long_contexts():
    """Two long contexts (the sentences in two orders) and the short one."""
    first = " ".join(SENTENCES)
    second = "  ".join(SENTENCES[6:] + SENTENCES[:6])  # double spaces too
    return [first, second]


def oracle_questions(context, prefix, every=1, max_words=3):
    """Questions whose answers are runs of 1..max_words basic pieces of `context`."""
    pieces = basic_pieces(context)
    qas = []
    for i in range(0, len(pieces), every):
        length = 1 + (i % max_words)
        if i + length > len(pieces):
            continue
        start, end = pieces[i][0], pieces[i + length - 1][1]
        if not squad_metrics.normalize_answer(context[start:end]):
            continue  # "." or "the" alone normalise to "" (F1 0 in v1.1); not real answers
        qas.append(qa(f"{prefix}-{i}", f"What is {i} {length}?", context,
                      context[start:end], start=start))
    return qas


def oracle_logits(features, examples, train_features, rng, null_for=()):
    """Start/end logits with the gold span at +10 in the window that scores its start.

    `train_features` are the training windows of the same examples (they carry the gold
    positions). Questions in `null_for` get their peak at [CLS] in every window instead.
    Returns (unique_ids, start [N, L], end [N, L], chosen feature per qas_id).
    """
    seq = len(features[0].input_ids)
    start = rng.uniform(-1, 1, size=(len(features), seq)).astype(np.float32)
    end = rng.uniform(-1, 1, size=(len(features), seq)).astype(np.float32)
    chosen = {}
    for row, (f, t) in enumerate(zip(features, train_features, strict=True)):
        assert f.unique_id == t.unique_id
        qid = examples[f.example_index].qas_id
        if qid in null_for:
            start[row, 0] = end[row, 0] = 10.0
            continue
        start[row, 0] = end[row, 0] = -10.0
        if t.start_position and f.token_is_max_context[t.start_position]:
            assert qid not in chosen
            start[row, t.start_position] = end[row, t.end_position] = 10.0
            chosen[qid] = (f, t.start_position, t.end_position)
    return np.array([f.unique_id for f in features]), start, end, chosen


def build(tmp_path, data, do_lower_case, config, version_2=False):
    """Tokenizer, prediction examples/features and the matching training features."""
    texts = [p["context"] for a in data["data"] for p in a["paragraphs"]]
    texts += [q["question"] for a in data["data"] for p in a["paragraphs"] for q in p["qas"]]
    tokenizer, vocab_file = make_tokenizer(tmp_path, texts + [QUESTION_WORDS], do_lower_case)
    path = write_json(tmp_path, data)
    examples, _ = squad.read_squad_examples(path, is_training=False)
    train_examples, skipped = squad.read_squad_examples(
        path, is_training=True, version_2_with_negative=version_2)
    assert skipped == [] and len(train_examples) == len(examples)
    features = squad.convert_examples_to_features(examples, tokenizer, config, is_training=False)
    train_features = squad.convert_examples_to_features(
        train_examples, tokenizer, config, is_training=True)
    return examples, features, train_features, path, vocab_file


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_oracle_logits_recover_every_gold_answer(tmp_path, do_lower_case):
    contexts = long_contexts()
    paragraphs = [(c, oracle_questions(c, f"c{k}")) for k, c in enumerate(contexts)]
    paragraphs[0][1].extend(
        qa(f"x{k}", "What is this?", contexts[0], answer) for k, answer in enumerate(
            ["1,234 guests", "10:30 a.m.", "$4.2 billion", "(8,848.86 m)", "O'Neill's",
             "U.S. Department", "crème brûlée", "\"the Smith-Jones effect\"", "97/100"]))
    paragraphs.append((SHORT_CONTEXT, oracle_questions(SHORT_CONTEXT, "short")))
    data = squad_json(paragraphs)
    config = squad.WindowConfig(max_seq_length=64, doc_stride=24, max_query_length=12)
    examples, features, train_features, path, _ = build(tmp_path, data, do_lower_case, config)
    ids, start, end, chosen = oracle_logits(
        features, examples, train_features, np.random.default_rng(0))
    assert len(chosen) == len(examples)  # every answer is predictable from some window

    out = tmp_path / "out"
    result, paths = postprocess.write_predictions(
        examples, features, (ids, start, end),
        postprocess.PostprocessConfig(do_lower_case=do_lower_case), str(out))
    predictions = json.loads(open(paths["predictions.json"], encoding="utf-8").read())
    gold = {q["id"]: q["answers"][0]["text"] for _, qas in paragraphs for q in qas}
    # Answers are rebuilt from whitespace-split words, so runs of spaces inside an answer
    # come back as one space (as in the original); everything else is exact.
    wrong = {k: (predictions[k], v) for k, v in gold.items()
             if predictions[k] != " ".join(v.split())}
    assert not wrong
    assert sorted(os.listdir(out)) == ["nbest_predictions.json", "predictions.json"]
    assert squad_metrics.evaluate(data, predictions) == {"exact_match": 100.0, "f1": 100.0}

    # The cases the issue names are really covered.
    windows = {f.doc_span_index for f, _, _ in chosen.values()}
    assert {1, 2, 3} <= windows
    at_last_token = [f for f, s, e in chosen.values()
                     if e == len(f.tokens) - 2 and f.doc_span_index > 0]
    # A window's first token has no left context, so only the first window scores it.
    at_first_token = [f for f, s, e in chosen.values() if s == min(f.token_to_orig_map)]
    assert at_last_token and at_first_token
    assert {f.doc_span_index for f in at_first_token} == {0}
    for needle in ("1895", "km²", "Brontë", "Zürich", "São", "Kraków", "Über", "Élodie"):
        assert any(needle in v for v in gold.values()), needle
    split = [v for v in gold.values() if len(v) > 6 and " " not in v]
    assert split  # long words are several WordPieces
    top = result.nbest[examples[0].qas_id][0]
    assert top["text"] == gold[examples[0].qas_id] and top["probability"] > 0.99


def test_v2_oracle_scores_unanswerable_questions_at_cls(tmp_path):
    context = " ".join(SENTENCES)
    qas = oracle_questions(context, "pos", every=7)
    qas += [qa(f"neg-{k}", f"What is not here {k}?", impossible=True) for k in range(6)]
    short = [qa("s-pos", "Who sat?", SHORT_CONTEXT, "cat"), qa("s-neg", "Why?", impossible=True)]
    data = squad_json([(context, qas), (SHORT_CONTEXT, short)], version="v2.0")
    config = squad.WindowConfig(max_seq_length=64, doc_stride=24, max_query_length=12)
    examples, features, train_features, _, _ = build(tmp_path, data, True, config, version_2=True)
    negatives = {q["id"] for q in qas + short if q.get("is_impossible")}
    ids, start, end, chosen = oracle_logits(
        features, examples, train_features, np.random.default_rng(1), null_for=negatives)
    assert len(chosen) + len(negatives) == len(examples)
    cfg = postprocess.PostprocessConfig(version_2_with_negative=True)
    result, paths = postprocess.write_predictions(examples, features, (ids, start, end), cfg,
                                            str(tmp_path / "out"))
    assert set(paths) == {"predictions.json", "nbest_predictions.json", "null_odds.json"}
    for q in qas + short:
        expected = "" if q["id"] in negatives else q["answers"][0]["text"]
        assert result.predictions[q["id"]] == expected, q["id"]
        assert (result.null_odds[q["id"]] > 0) == (q["id"] in negatives)
        assert any(e["text"] == "" for e in result.nbest[q["id"]])
    scores = squad_metrics.evaluate(data, result.predictions, result.null_odds)
    assert scores["exact"] == scores["f1"] == 100.0
    assert scores["HasAns_exact"] == scores["NoAns_exact"] == 100.0
    assert scores["NoAns_total"] == len(negatives)
    assert scores["best_exact"] == 100.0


# ---------------------------------------------------------------------------------------
# Fidelity: the very same files as Google's run_squad.py

REFERENCE_SCRIPT = textwrap.dedent(r'''
    import json, sys, types
    import numpy as np
    # modeling.py imports tensorflow.contrib.layers at module level; post-processing never
    # uses it.
    contrib = types.ModuleType("tensorflow.contrib")
    contrib.layers = types.ModuleType("tensorflow.contrib.layers")
    sys.modules["tensorflow.contrib"] = contrib
    sys.modules["tensorflow.contrib.layers"] = contrib.layers
    sys.path.insert(0, sys.argv[2])
    from original_bert import original_module
    from absl import flags
    run_squad = original_module("run_squad")
    tokenization = original_module("tokenization")
    FLAGS = flags.FLAGS

    for job in json.load(open(sys.argv[1])):
        FLAGS.version_2_with_negative = job["version_2"]
        FLAGS.verbose_logging = False
        tokenizer = tokenization.FullTokenizer(
            job["vocab_file"], do_lower_case=job["do_lower_case"])
        dump = {}
        for is_training in (False, True):
            examples = run_squad.read_squad_examples(job["data_file"], is_training=is_training)
            writer = run_squad.FeatureWriter(job["record_file"][is_training], is_training)
            features = []
            def keep(f):
                features.append(f)
                writer.process_feature(f)
            run_squad.convert_examples_to_features(
                examples, tokenizer, job["max_seq_length"], job["doc_stride"],
                job["max_query_length"], is_training, keep)
            writer.close()
            dump[str(is_training)] = [{
                "unique_id": f.unique_id, "example_index": f.example_index,
                "doc_span_index": f.doc_span_index, "tokens": f.tokens,
                "token_to_orig_map": sorted(f.token_to_orig_map.items()),
                "token_is_max_context": sorted(f.token_is_max_context.items()),
                "input_ids": f.input_ids, "input_mask": f.input_mask,
                "segment_ids": f.segment_ids, "start_position": f.start_position,
                "end_position": f.end_position, "is_impossible": bool(f.is_impossible),
            } for f in features]
            if not is_training:
                eval_examples, eval_features = examples, features
        json.dump(dump, open(job["feature_dump"], "w"))
        FLAGS.verbose_logging = False
        final = [run_squad.get_final_text(p, o, lower) for p, o, lower in job["final_text_cases"]]
        json.dump(final, open(job["final_text_dump"], "w"))
        for case in job["cases"]:
            logits = np.load(case["logits"])
            results = [run_squad.RawResult(unique_id=int(u),
                                           start_logits=[float(x) for x in s],
                                           end_logits=[float(x) for x in e])
                       for u, s, e in zip(logits["ids"], logits["start"], logits["end"])]
            FLAGS.null_score_diff_threshold = case["threshold"]
            out = case["out_dir"]
            run_squad.write_predictions(
                eval_examples, eval_features, results, case["n_best_size"],
                case["max_answer_length"], job["do_lower_case"], out + "/predictions.json",
                out + "/nbest_predictions.json", out + "/null_odds.json")
''')


def run_reference(tmp_path, jobs):
    """Runs the original on every job in one child process (TensorFlow loads once)."""
    job_file = tmp_path / "jobs.json"
    job_file.write_text(json.dumps(jobs))
    script = tmp_path / "reference.py"
    script.write_text(REFERENCE_SCRIPT)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(script), str(job_file), TESTS_DIR],
                          check=False, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]


def fidelity_data():
    contexts = long_contexts()
    paragraphs = [(contexts[0], oracle_questions(contexts[0], "a", every=5)),
                  (contexts[1], oracle_questions(contexts[1], "b", every=9)),
                  (SHORT_CONTEXT, [qa("s1", "Who sat?", SHORT_CONTEXT, "cat"),
                                   qa("s2", "When?", SHORT_CONTEXT, "1999")])]
    return paragraphs


def final_text_cases(rng, count=400):
    """(pred_text, orig_text, do_lower_case) triples hitting every branch of get_final_text:
    aligned spans, prefixes/suffixes cut off, not found, length mismatch (NFD, control
    characters), spans starting or ending on a space, empty predictions."""
    words = ["Zürich", "(1895-1943).", "O'Neill's", "café", "Zu\u0308rich", "a\u200bb", "U.S.",
             "km²", "$4.2", "\"quoted\"", "Brontë,", "x", "ÉLODIE", "日本語", "end."]
    from data_prep import reference_tokenization

    cases = []
    for _ in range(count):
        n = int(rng.integers(1, 5))
        orig = " ".join(rng.choice(words, size=n))
        lower = bool(rng.integers(0, 2))
        toks = reference_tokenization.BasicTokenizer(do_lower_case=lower).tokenize(orig)
        tok_text = " ".join(toks)
        kind = int(rng.integers(0, 4))
        if kind == 0 and toks:
            i = int(rng.integers(0, len(toks)))
            j = int(rng.integers(i, len(toks)))
            pred = " ".join(toks[i:j + 1])
        elif kind == 1 and tok_text:
            i = int(rng.integers(0, len(tok_text)))
            j = int(rng.integers(i, len(tok_text) + 1))
            pred = tok_text[i:j]  # arbitrary cut, possibly on spaces or empty
        elif kind == 2:
            pred = str(rng.choice(["zurich", "steve", "", " ", "1895 -"]))
        else:
            pred = tok_text.upper() if lower else tok_text
        cases.append((pred, orig, lower))
    return cases


def logit_cases(features, rng):
    """Random logits of several kinds: plain, coarse (many exact ties), peaked."""
    n, seq = len(features), len(features[0].input_ids)
    # Like a trained model, padding scores low, but not so low that it never reaches the
    # top n (the original ranks all positions, then drops invalid ones).
    padding = np.arange(seq)[None, :] >= np.array([len(f.tokens) for f in features])[:, None]
    shift = np.where(padding, -3.0, 0.0)[None]
    plain = (rng.normal(size=(2, n, seq)) + shift).astype(np.float32)
    coarse = np.round(rng.normal(size=(2, n, seq)) * 2 + shift).astype(np.float32)
    peaked = ((rng.normal(size=(2, n, seq)) + shift) * 4).astype(np.float32)
    return {"plain": plain, "coarse": coarse, "peaked": peaked}


FIDELITY_SETTINGS = [(False, True), (True, False)]  # (version_2, do_lower_case)


def prepare_fidelity(tmp_path, version_2, do_lower_case):
    """Our features and prediction files for one setting, and the job for the original."""
    paragraphs = fidelity_data()
    if version_2:
        paragraphs[2][1].append(qa("s3", "Why?", impossible=True))
        paragraphs[0][1].append(qa("a-neg", "Where is the moon?", impossible=True))
        for _, qas in paragraphs:
            for q in qas:
                q.setdefault("is_impossible", False)
    data = squad_json(paragraphs, version="v2.0" if version_2 else "1.1")
    config = squad.WindowConfig(max_seq_length=64, doc_stride=20, max_query_length=10)
    examples, features, train_features, data_file, vocab_file = build(
        tmp_path, data, do_lower_case, config, version_2=version_2)

    cases, ours = [], {}
    # (n_best_size, max_answer_length, null_score_diff_threshold). Tiny n-best and length
    # leave v1.1 questions with no span at all (the "empty" answer); in v2.0 the original
    # cannot handle that, so v2.0 uses milder settings.
    settings = [(20, 30, 0.0), (8, 5, 1.5) if version_2 else (3, 3, 0.0), (5, 8, -2.0)]
    ids = np.array([f.unique_id for f in features])
    for case_index, (n_best, max_len, threshold) in enumerate(settings):
        cfg = postprocess.PostprocessConfig(
            n_best_size=n_best, max_answer_length=max_len, do_lower_case=do_lower_case,
            version_2_with_negative=version_2, null_score_diff_threshold=threshold)
        for seed in range(20):
            name, logits = list(logit_cases(features, np.random.default_rng(seed)).items())[
                case_index]
            result = postprocess.compute_predictions(examples, features, (ids, *logits), cfg)
            # In v2.0 the original fails when no span survives for a question: avoid that.
            if all(v != 1e6 for v in result.null_odds.values()):
                break
        else:
            pytest.fail("no logits found that the original can post-process")
        if not version_2 and case_index == 1:
            assert "empty" in result.predictions.values()
        logits_file = str(tmp_path / f"{name}.npz")
        np.savez(logits_file, ids=ids, start=logits[0], end=logits[1])
        ref_dir = tmp_path / f"ref-{name}"
        ref_dir.mkdir()
        cases.append({"logits": logits_file, "out_dir": str(ref_dir), "n_best_size": n_best,
                      "max_answer_length": max_len, "threshold": threshold})
        _, ours[name] = postprocess.write_predictions(
            examples, features, (ids, logits[0], logits[1]), cfg, str(tmp_path / f"ours-{name}"))

    final_cases = final_text_cases(np.random.default_rng(11))
    records = {False: str(tmp_path / "ref_eval.tf_record"),
               True: str(tmp_path / "ref_train.tf_record")}
    job = {
        "version_2": version_2, "do_lower_case": do_lower_case, "vocab_file": vocab_file,
        "data_file": data_file, "max_seq_length": 64, "doc_stride": 20, "max_query_length": 10,
        "record_file": [records[False], records[True]],
        "feature_dump": str(tmp_path / "ref_features.json"), "cases": cases,
        "final_text_cases": final_cases, "final_text_dump": str(tmp_path / "ref_final.json"),
    }
    state = dict(examples=examples, features=features, train_features=train_features,
                 cases=cases, ours=ours, final_cases=final_cases, records=records)
    return state, job


@pytest.fixture(scope="module")
def fidelity_runs(tmp_path_factory):
    runs, jobs = {}, []
    for version_2, do_lower_case in FIDELITY_SETTINGS:
        tmp = tmp_path_factory.mktemp(f"fidelity-{int(version_2)}{int(do_lower_case)}")
        state, job = prepare_fidelity(tmp, version_2, do_lower_case)
        runs[version_2, do_lower_case] = (tmp, state)
        jobs.append(job)
    run_reference(tmp_path_factory.mktemp("reference"), jobs)
    return runs


@pytest.mark.parametrize("version_2, do_lower_case", FIDELITY_SETTINGS)
def test_same_features_records_and_predictions_as_the_original(
        fidelity_runs, version_2, do_lower_case):
    import tensorflow as tf

    tmp_path, state = fidelity_runs[version_2, do_lower_case]
    examples, features, train_features = (
        state["examples"], state["features"], state["train_features"])
    cases, ours, final_cases, records = (
        state["cases"], state["ours"], state["final_cases"], state["records"])
    ref_final = json.loads((tmp_path / "ref_final.json").read_text())
    ours_final = [postprocess.get_final_text(p, o, lower) for p, o, lower in final_cases]
    assert ours_final == ref_final

    # Features, prediction and training.
    dump = json.loads((tmp_path / "ref_features.json").read_text())
    for is_training, mine in ((False, features), (True, train_features)):
        ref = dump[str(is_training)]
        assert len(ref) == len(mine)
        for r, f in zip(ref, mine):
            got = {
                "unique_id": f.unique_id, "example_index": f.example_index,
                "doc_span_index": f.doc_span_index, "tokens": f.tokens,
                "token_to_orig_map": [list(x) for x in sorted(f.token_to_orig_map.items())],
                "token_is_max_context": [list(x) for x in sorted(f.token_is_max_context.items())],
                "input_ids": f.input_ids, "input_mask": f.input_mask,
                "segment_ids": f.segment_ids, "start_position": f.start_position,
                "end_position": f.end_position, "is_impossible": bool(f.is_impossible),
            }
            assert got == r
        # TFRecords: the same tf.train.Example contents, record by record.
        ours_file = str(tmp_path / f"ours_{is_training}.tf_record")
        squad.write_squad_tfrecord(mine, ours_file, is_training)
        def contents(path):
            out = []
            for raw in tf.data.TFRecordDataset(path):
                ex = tf.train.Example.FromString(raw.numpy())
                out.append({k: list(v.int64_list.value) for k, v in ex.features.feature.items()})
            return out
        assert contents(ours_file) == contents(records[is_training])
    assert any(f.start_position for f in train_features)

    # Post-processing: byte-identical files.
    for case, name in zip(cases, ours):
        names = ["predictions.json", "nbest_predictions.json"] + (
            ["null_odds.json"] if version_2 else [])
        assert sorted(ours[name]) == sorted(names)
        for file_name in names:
            ref_text = open(os.path.join(case["out_dir"], file_name), encoding="utf-8").read()
            our_text = open(ours[name][file_name], encoding="utf-8").read()
            assert our_text == ref_text, (name, file_name)
        predictions = json.loads(open(ours[name]["predictions.json"]).read())
        assert len(predictions) == len(examples)


def test_get_final_text_alignment_and_fallbacks():
    # Extra characters of the word dropped, case and accents from the original.
    assert postprocess.get_final_text("steve smith", "Steve Smith's", True) == "Steve Smith"
    assert postprocess.get_final_text("zurich", "(Zürich),", True) == "Zürich"
    assert postprocess.get_final_text("Zürich", "(Zürich),", False) == "Zürich"
    # Not found, or lengths differ after tokenization: the original words come back.
    assert postprocess.get_final_text("geneva", "(Zürich),", True) == "(Zürich),"
    decomposed = "Zu\u0308rich"  # NFD: accent stripping shortens it
    assert postprocess.get_final_text("zurich", decomposed, True) == decomposed


def test_missing_logits_and_empty_candidates(tmp_path):
    data = squad_json([(SHORT_CONTEXT, [qa("q", "Who?", SHORT_CONTEXT, "cat")])])
    config = squad.WindowConfig(max_seq_length=32, doc_stride=8, max_query_length=8)
    examples, features, _, _, _ = build(tmp_path, data, True, config)
    with pytest.raises(KeyError, match="no logits for feature unique_id 1000000000"):
        postprocess.compute_predictions(examples, features, (np.zeros(0, np.int64),
                                                             np.zeros((0, 32)), np.zeros((0, 32))))
    # All top logits on the question: no valid span; v1.1 answers "empty" as the original.
    start = np.zeros((1, 32), np.float32)
    start[0, :3] = 5
    ids = np.array([features[0].unique_id])
    cfg = postprocess.PostprocessConfig(n_best_size=3)
    result = postprocess.compute_predictions(examples, features, (ids, start, start), cfg)
    assert result.predictions == {"q": "empty"}
    cfg2 = postprocess.PostprocessConfig(n_best_size=3, version_2_with_negative=True)
    result = postprocess.compute_predictions(examples, features, (ids, start, start), cfg2)
    assert result.predictions == {"q": ""} and result.null_odds["q"] > 0
