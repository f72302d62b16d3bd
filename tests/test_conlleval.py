"""tasks.tagging.metrics: conlleval's chunk rules on hand-made cases, and against seqeval.

seqeval (a test-only dependency) in its DEFAULT mode is an independent implementation of
conlleval's rules (its `strict` mode is not, and is not used here). The perl script itself
is not part of this repository; when the environment variable CONLLEVAL_PL names a copy,
`test_report_equals_the_perl_script` compares our report with its output byte for byte.
"""

import os
import random
import subprocess

import pytest
from seqeval import metrics as seqeval
from seqeval.metrics.sequence_labeling import get_entities

from tasks.tagging import metrics as M


def counts_of(*sentences):
    """Counts for sentences given as strings of 'gold/pred' tokens."""
    return M.evaluate([[tuple(token.split("/")) for token in s.split()] for s in sentences])


# --- tag splitting and chunk decoding --------------------------------------------------


def test_split_tag_at_the_first_hyphen():
    assert M.split_tag("B-PER") == ("B", "PER")
    assert M.split_tag("I-ORG-X") == ("I", "ORG-X")  # conlleval 2004: types may have hyphens
    assert M.split_tag("O") == ("O", "")
    assert M.split_tag("B-0") == ("B", "")  # the perl's truth test makes "0" empty


def test_iob1_decoding():
    # IOB1 (CoNLL-2003 as shipped): I- everywhere, B- only between two chunks of one type.
    tags = ["I-PER", "I-PER", "B-PER", "I-PER", "O", "I-LOC", "O", "I-ORG"]
    assert M.chunks(tags) == [("PER", 0, 1), ("PER", 2, 3), ("LOC", 5, 5), ("ORG", 7, 7)]


def test_iob2_decoding():
    tags = ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "I-LOC", "I-LOC"]
    assert M.chunks(tags) == [("PER", 0, 1), ("PER", 2, 2), ("LOC", 4, 6)]


def test_iob1_and_iob2_spellings_of_the_same_chunks_score_100_f1():
    gold = ["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "O"]  # IOB1
    pred = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "O"]  # IOB2, same chunks
    assert M.chunks(gold) == M.chunks(pred)
    c = M.evaluate([list(zip(gold, pred))])
    assert (c.correct_chunks, c.gold_chunks, c.predicted_chunks) == (3, 3, 3)
    assert c.figures()["f1"] == 1.0
    assert c.figures()["accuracy"] == pytest.approx(4 / 6)  # tags differ, chunks do not


def test_type_change_starts_a_new_chunk():
    assert M.chunks(["I-PER", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 1)]
    assert M.chunks(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 2)]


def test_adjacent_chunks():
    assert M.chunks(["B-PER", "B-PER"]) == [("PER", 0, 0), ("PER", 1, 1)]
    assert M.chunks(["I-PER", "B-PER"]) == [("PER", 0, 0), ("PER", 1, 1)]
    # IOBES: the perl would merge S-PER S-PER into one chunk; seqeval's rules do not.
    assert M.chunks(["S-PER", "S-PER"]) == [("PER", 0, 0), ("PER", 1, 1)]
    assert M.chunks(["B-PER", "E-PER", "B-PER", "E-PER"]) == [("PER", 0, 1), ("PER", 2, 3)]
    assert M.chunks(["B-PER", "I-PER", "E-PER", "S-LOC", "O"]) == [("PER", 0, 2),
                                                                     ("LOC", 3, 3)]


def test_ioe_decoding_follows_the_perl():
    # IOE1: E- marks a chunk's end only before a chunk of the same type.
    assert M.chunks(["I-NP", "E-NP", "I-NP", "O"]) == [("NP", 0, 1), ("NP", 2, 2)]


def test_sentence_boundary_ends_a_chunk():
    c = counts_of("I-PER/I-PER", "I-PER/I-PER")
    assert (c.gold_chunks, c.predicted_chunks, c.correct_chunks) == (2, 2, 2)
    # The same four tags in one sentence would be one chunk each side.
    c = counts_of("I-PER/I-PER I-PER/I-PER")
    assert (c.gold_chunks, c.correct_chunks) == (1, 1)


# --- what counts as correct ------------------------------------------------------------


def test_chunk_counts_only_when_type_start_and_end_match():
    # Predicted chunk too short, too long, shifted, wrong type: none correct.
    c = counts_of("B-PER/B-PER I-PER/O O/O", "B-PER/B-PER O/I-PER", "O/B-PER B-PER/I-PER",
                  "B-PER/B-LOC")
    assert c.gold_chunks == 4 and c.predicted_chunks == 4 and c.correct_chunks == 0
    f = c.figures(types=("PER", "LOC"))
    assert f["precision"] == f["recall"] == f["f1"] == 0.0
    assert f["precision_LOC"] == 0.0 and f["recall_LOC"] == 0.0  # 1 predicted, 0 gold


def test_micro_average_and_per_type_figures():
    # gold: PER, LOC, PER, ORG; predicted: PER (right), LOC (right), PER (wrong end), MISC
    c = counts_of("B-PER/B-PER O/O B-LOC/B-LOC", "I-PER/I-PER I-PER/O O/O B-ORG/B-MISC")
    assert (c.gold_chunks, c.predicted_chunks, c.correct_chunks) == (4, 4, 2)
    f = c.figures()
    assert f["precision"] == 0.5 and f["recall"] == 0.5 and f["f1"] == 0.5
    assert f["precision_PER"] == 0.5 and f["recall_PER"] == 0.5
    assert f["f1_LOC"] == 1.0
    assert f["recall_ORG"] == 0.0 and f["precision_MISC"] == 0.0
    assert f["accuracy"] == pytest.approx(5 / 7)
    assert M.evaluate([]).figures() == {"precision": 0.0, "recall": 0.0, "f1": 0.0,
                                        "accuracy": 0.0}


def test_docstart_lines_count_as_tokens_like_the_perl():
    c = M.evaluate([[("O", "O")], [("B-PER", "O")]])
    assert c.tokens == 2 and c.correct_tokens == 1


def test_report_text_in_the_perls_format():
    c = counts_of("B-PER/B-PER I-PER/I-PER O/B-LOC")
    assert M.report(c) == (
        "processed 3 tokens with 1 phrases; found: 2 phrases; correct: 1.\n"
        "accuracy:  66.67%; precision:  50.00%; recall: 100.00%; FB1:  66.67\n"
        "              LOC: precision:   0.00%; recall:   0.00%; FB1:   0.00  1\n"
        "              PER: precision: 100.00%; recall: 100.00%; FB1: 100.00  1\n")


def test_evaluate_lines_reads_the_perls_input_format():
    text = ("-DOCSTART- O O\n\nEU B-ORG B-ORG\nrejects O O\n\nPeter I-PER I-PER\n"
            "-X- O O\nBlackburn I-PER B-PER\n")
    c = M.evaluate_lines(text.splitlines(True))
    assert (c.tokens, c.gold_chunks, c.correct_chunks) == (5, 3, 3)  # -X- is a boundary
    joined = M.evaluate_lines(text.replace("-X- O O\n", "").splitlines(True))
    assert (joined.tokens, joined.gold_chunks, joined.correct_chunks) == (5, 2, 1)
    with pytest.raises(ValueError, match="line 2: unexpected number of features: 4 "
                                         r"\(3\)"):
        M.evaluate_lines(["a O O\n", "b X O O\n"])


# --- against independent implementations -----------------------------------------------


IOB_TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG-X", "I-ORG-X"]
IOBES_TAGS = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC"]


def random_corpus(rng, tags, sentences=30):
    """Gold and predicted tag sentences: arbitrary (often invalid) sequences, predictions
    agreeing with gold on about half the tokens."""
    gold, pred = [], []
    for _ in range(sentences):
        g = [rng.choice(tags) for _ in range(rng.randint(1, 12))]
        gold.append(g)
        pred.append([t if rng.random() < 0.5 else rng.choice(tags) for t in g])
    return gold, pred


@pytest.mark.parametrize("tags", [IOB_TAGS, IOBES_TAGS], ids=["iob", "iobes"])
def test_equals_seqeval_default_mode_on_random_tags(tags):
    rng = random.Random(7)
    for _ in range(150):
        gold, pred = random_corpus(rng, tags)
        ours = M.evaluate([list(zip(g, p)) for g, p in zip(gold, pred)])
        figures = ours.figures()
        assert figures["precision"] == pytest.approx(seqeval.precision_score(gold, pred),
                                                     abs=1e-12)
        assert figures["recall"] == pytest.approx(seqeval.recall_score(gold, pred), abs=1e-12)
        assert figures["f1"] == pytest.approx(seqeval.f1_score(gold, pred), abs=1e-12)
        assert figures["accuracy"] == pytest.approx(seqeval.accuracy_score(gold, pred),
                                                    abs=1e-12)
        per_type = seqeval.classification_report(gold, pred, output_dict=True,
                                                 zero_division=0)
        types = [k for k in per_type if not k.endswith(" avg")]
        assert sorted(types) == ours.types()
        for kind in types:
            assert figures[f"precision_{kind}"] == pytest.approx(
                per_type[kind]["precision"], abs=1e-12)
            assert figures[f"recall_{kind}"] == pytest.approx(per_type[kind]["recall"],
                                                              abs=1e-12)
            assert figures[f"f1_{kind}"] == pytest.approx(per_type[kind]["f1-score"],
                                                          abs=1e-12)


@pytest.mark.parametrize("tags", [IOB_TAGS, IOBES_TAGS], ids=["iob", "iobes"])
def test_chunks_agree_with_the_counting_state_machine(tags):
    """`chunks` (what a served tagger returns) decodes what `evaluate` counts: the correct
    chunks are the (type, start, end) triples both sides share."""
    rng = random.Random(11)
    for _ in range(200):
        gold, pred = random_corpus(rng, tags, sentences=1)
        g, p = gold[0], pred[0]
        c = M.evaluate([list(zip(g, p))])
        assert len(M.chunks(g)) == c.gold_chunks
        assert len(M.chunks(p)) == c.predicted_chunks
        assert len(set(M.chunks(g)) & set(M.chunks(p))) == c.correct_chunks
        assert M.chunks(g) == [(t, s, e) for t, s, e in get_entities(g)]


@pytest.mark.skipif(not os.environ.get("CONLLEVAL_PL"),
                    reason="set CONLLEVAL_PL to a copy of conlleval's perl script")
def test_report_equals_the_perl_script():
    rng = random.Random(3)
    tags = IOB_TAGS + ["E-PER", "E-LOC", ".", "[", "]", "NN", "B-0"]
    for _ in range(100):
        gold, pred = random_corpus(rng, tags, sentences=6)
        for seq in gold + pred:  # the perl ends no chunk at E- B- (seqeval does)
            for i in range(1, len(seq)):
                if seq[i - 1].startswith("E-") and seq[i].startswith("B-"):
                    seq[i] = "O"
        lines = []
        for g, p in zip(gold, pred):
            lines += [f"w{i} {a} {b}" for i, (a, b) in enumerate(zip(g, p))] + [""]
        text = "\n".join(lines) + "\n"
        perl = subprocess.run(["perl", os.environ["CONLLEVAL_PL"]], input=text,
                              capture_output=True, text=True, check=True).stdout
        assert M.report(M.evaluate_lines(text.splitlines(True))) == perl, text
