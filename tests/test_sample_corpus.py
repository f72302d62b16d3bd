"""The standard-library sample corpus: sentence splitting, BERT input format, determinism."""

import json
import os
import subprocess
import sys

import pytest

from data_prep import sample_corpus
from tests.clis import call_main

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, **kwargs):
    """`python args` in a fresh process (what it imports is under test)."""
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=env, check=False,
                          capture_output=True, text=True, timeout=120, **kwargs)


def _documents(path):
    """The file's documents as lists of lines; asserts the blank-line framing."""
    with open(path, encoding="utf-8", newline="") as reader:
        text = reader.read()
    assert text.endswith("\n\n"), "every document, the last included, ends with a blank line"
    assert "\n\n\n" not in text, "exactly one blank line between documents"
    assert "\r" not in text
    documents = [block.split("\n") for block in text[:-2].split("\n\n")]
    for lines in documents:
        for line in lines:
            assert line and line == line.strip() and "  " not in line, repr(line)
    return documents


class TestSplitSentences:
    def test_splits_after_terminal_punctuation_before_capital(self):
        assert sample_corpus.split_sentences("Open a file. Read it!  Is it 3? 4 lines.") == [
            "Open a file.", "Read it!", "Is it 3?", "4 lines."]

    def test_abbreviations_initials_and_lowercase_do_not_split(self):
        text = "Use e.g. Foo here, i.e. Bar. Written by J. Smith. Call os.path.join. then go."
        assert sample_corpus.split_sentences(text) == [
            "Use e.g. Foo here, i.e. Bar.", "Written by J. Smith.",
            "Call os.path.join. then go."]

    def test_closing_quotes_stay_with_their_sentence(self):
        assert sample_corpus.split_sentences('He said "stop." Then (it ended.) "Fine."') == [
            'He said "stop."', "Then (it ended.)", '"Fine."']

    def test_whitespace_is_collapsed_and_letterless_pieces_dropped(self):
        assert sample_corpus.split_sentences("  A\tb\n c.   --- 12. ") == ["A b c. --- 12."]
        assert sample_corpus.split_sentences("... 42 !") == []


class TestDocstringSentences:
    def test_drops_doctests_literal_blocks_and_underlines(self):
        doc = """Summary line.

        Details here. More details::

            code_block = 1

            still_code()

        Example
        -------
        >>> f(1)
        2

        Trailing prose.
        """
        assert sample_corpus.docstring_sentences(doc) == [
            "Summary line.", "Details here.", "More details::", "Example", "Trailing prose."]

    def test_indented_prose_after_a_sentence_is_kept(self):
        doc = "Return parts.\n\n  sep\n    The separator used."
        assert sample_corpus.docstring_sentences(doc) == [
            "Return parts.", "sep The separator used."]

    def test_empty(self):
        assert sample_corpus.docstring_sentences(None) == []
        assert sample_corpus.docstring_sentences("   \n ") == []


def test_cli_writes_bert_format_deterministically(tmp_path):
    """Two CLI runs give byte-identical shards in the original's input format."""
    outputs = []
    for name in ("a", "b"):
        out = tmp_path / name
        result = call_main("sample_corpus", [f"--output_dir={out}", "--max_documents=120",
                                             "--num_shards=2", "--max_mb=0"])
        assert result.code == 0, result.stderr
        assert "120 documents" in result.stdout
        outputs.append(out)
    files = sorted(os.listdir(outputs[0]))
    assert files == ["stdlib-00000-of-00002.txt", "stdlib-00001-of-00002.txt", "summary.json"]
    assert files == sorted(os.listdir(outputs[1]))
    for name in files[:2]:
        assert (outputs[0] / name).read_bytes() == (outputs[1] / name).read_bytes()
    documents = [d for name in files[:2] for d in _documents(outputs[0] / name)]
    assert len(documents) == 120
    assert sum(len(d) for d in documents) > 300
    summary = json.loads((outputs[0] / "summary.json").read_text())
    assert summary["documents"] == 120
    assert summary["sentences"] == sum(len(d) for d in documents)
    assert summary["bytes"] == sum(os.path.getsize(outputs[0] / n) for n in files[:2])


def test_cli_rejects_bad_settings(tmp_path):
    result = call_main("sample_corpus", output_dir=tmp_path, num_shards=0)
    assert result.code == 1
    assert "sample_corpus: error: --num_shards must be >= 1, got 0" in result.stderr


_FULL_RUN = r"""
import json, sys
from data_prep import sample_corpus
from tests.clis import call_main
summary = sample_corpus.write_corpus(sys.argv[1], max_mb=float(sys.argv[2]), num_shards=1)
pairs = sample_corpus.labelled_sentences(max_mb=float(sys.argv[2]))
packages = sample_corpus.labelled_sentences(max_mb=0.05, label="package")
forbidden = ["antigravity", "this", "tkinter", "idlelib", "turtle", "turtledemo", "readline"]
print(json.dumps({
    "summary": json.loads(summary.to_json()),
    "pairs": pairs,
    "packages": sorted({label for _, label in packages}),
    "imported_forbidden": [m for m in forbidden if m in sys.modules],
}))
"""


@pytest.fixture(scope="module")
def full_corpus(tmp_path_factory):
    """Everything the standard library offers (max_mb large), built in a fresh process."""
    out = tmp_path_factory.mktemp("full_corpus")
    result = _run(["-c", _FULL_RUN, str(out), "100"])
    assert result.returncode == 0, result.stderr
    return out, json.loads(result.stdout)  # fails if an import printed anything


def test_whole_corpus_size_kinds_and_no_side_effect_modules(full_corpus):
    out, data = full_corpus
    summary = data["summary"]
    assert summary["bytes"] > 1_000_000, "the standard library yields over 1 MB of text"
    assert summary["modules"] > 150
    assert all(summary["kinds"][kind] > 100 for kind in sample_corpus.KINDS), summary["kinds"]
    assert data["imported_forbidden"] == []
    documents = _documents(out / "stdlib-00000-of-00001.txt")
    assert len(documents) == summary["documents"]


def test_labelled_sentences_follow_the_corpus(full_corpus):
    out, data = full_corpus
    lines = [line for d in _documents(out / "stdlib-00000-of-00001.txt") for line in d]
    pairs = data["pairs"]
    assert [sentence for sentence, _ in pairs] == lines
    assert {label for _, label in pairs} == set(sample_corpus.KINDS)
    assert len(data["packages"]) > 3 and "abc" in data["packages"]


def test_max_mb_stops_after_the_document_crossing_it(tmp_path):
    documents = list(sample_corpus.iter_limited_documents(max_mb=0.02))
    sizes = [sample_corpus.document_size(d) for d in documents]
    assert sum(sizes) >= 20_000 > sum(sizes[:-1])
    assert all(len(d.sentences) == len(d.kinds) > 0 for d in documents)
    with pytest.raises(ValueError, match="label"):
        sample_corpus.labelled_sentences(max_documents=1, label="nope")


# ---------------------------------------------------------------------------
# Classification data.


def _doc(name, module, sentences, kinds):
    return sample_corpus.Document(name, module, tuple(sentences), tuple(kinds))


def _synthetic_documents(count=400):
    """Documents whose kinds cycle, with unique sentences of 6 words (plus short ones)."""
    kinds = ["module", "class", "function", "comment"]
    documents = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        sentences = [f"Sentence {j} of document number {i} here." for j in range(1 + i % 5)]
        sentences.append("Too short.")
        documents.append(_doc(f"mod{i}.{kind}", f"pkg{i % 3}.mod{i}", sentences,
                              [kind] * len(sentences)))
    return documents


class TestClassificationRows:
    def test_balanced_split_by_document_short_and_repeated_dropped(self):
        documents = _synthetic_documents()
        documents.append(_doc("repeat", "pkg0.x", ["Sentence 0 of document number 0 here."],
                              ["topic"]))
        rows, labels, candidates, counts = sample_corpus.classification_rows(
            documents, rows_per_class=50, min_words=3)
        assert labels == ("class", "comment", "function", "module")  # topic: only a repeat
        assert sum(counts.values()) == 400
        where = {}
        for document in documents[:400]:
            split = sample_corpus.document_split(document.name)
            for sentence in document.sentences:
                where[sentence] = split
        for split in sample_corpus.SPLITS:
            per_label = [sum(y == label for _, y in rows[split]) for label in labels]
            assert len(set(per_label)) == 1, (split, per_label)  # balanced
            assert per_label[0] == min([{"train": 40, "dev": 5, "test": 5}[split]]
                                       + list(candidates[split].values()))
            for sentence, label in rows[split]:
                assert where[sentence] == split  # whole documents per split
                assert sentence != "Too short."
                assert label == sentence_kind(documents, sentence)
        all_sentences = [s for split in rows.values() for s, _ in split]
        assert len(all_sentences) == len(set(all_sentences))

    def test_deterministic_and_labels_by_module_or_package(self):
        documents = _synthetic_documents()
        first = sample_corpus.classification_rows(documents, rows_per_class=30, seed=7)
        assert first == sample_corpus.classification_rows(documents, rows_per_class=30, seed=7)
        other = sample_corpus.classification_rows(documents, rows_per_class=30, seed=8)
        assert other[0] != first[0] and other[1] == first[1]
        rows, labels, _, _ = sample_corpus.classification_rows(
            documents, label="package", rows_per_class=30)
        assert labels == ("pkg0", "pkg1", "pkg2")
        _, labels, _, _ = sample_corpus.classification_rows(
            documents, label="module", rows_per_class=30, max_classes=5)
        assert len(labels) == 5

    def test_document_split_is_stable_and_roughly_80_10_10(self):
        names = [f"module{i}.Class{i}" for i in range(5000)]
        splits = [sample_corpus.document_split(name) for name in names]
        assert splits == [sample_corpus.document_split(name) for name in names]
        share = {s: splits.count(s) / len(splits) for s in sample_corpus.SPLITS}
        assert 0.77 < share["train"] < 0.83 and 0.08 < share["dev"] < 0.12
        assert sample_corpus.document_split("x", dev_percent=0, test_percent=0) == "train"

    def test_bad_settings(self):
        with pytest.raises(ValueError, match="label"):
            sample_corpus.classification_rows([], label="nope")
        with pytest.raises(ValueError, match="rows_per_class"):
            sample_corpus.classification_rows([], rows_per_class=0)
        with pytest.raises(ValueError, match="at least 2"):
            sample_corpus.write_classification_data(
                "unused", documents=[_doc("a", "m", ["One two three four five six."],
                                          ["module"])])


def sentence_kind(documents, sentence):
    return next(kind for d in documents for s, kind in zip(d.sentences, d.kinds, strict=True)
                if s == sentence)


def test_cli_writes_classification_tsvs_deterministically(tmp_path):
    outputs = []
    for name in ("a", "b"):
        out = tmp_path / name
        result = call_main("sample_corpus", [f"--classification_dir={out}", "--max_mb=0.3",
                                             "--classification_rows_per_class=60"])
        assert result.code == 0, result.stderr
        assert "classification by kind" in result.stdout
        outputs.append(out)
    assert sorted(os.listdir(outputs[0])) == ["dev.tsv", "summary.json", "test.tsv",
                                              "train.tsv"]
    summary = json.loads((outputs[0] / "summary.json").read_text())
    assert summary["labels"] == ["class", "comment", "function", "module"]
    seen = set()
    for split in sample_corpus.SPLITS:
        data = (outputs[0] / f"{split}.tsv").read_bytes()
        assert data == (outputs[1] / f"{split}.tsv").read_bytes()
        lines = data.decode("utf-8").split("\n")
        assert lines[0] == "sentence\tlabel" and lines[-1] == ""
        rows = [line.split("\t") for line in lines[1:-1]]
        assert len(rows) == summary["rows"][split] > 0
        assert all(len(row) == 2 and len(row[0].split()) >= 5 for row in rows)
        counts = {label: sum(r[1] == label for r in rows) for label in summary["labels"]}
        assert set(counts.values()) == {summary["rows_per_label"][split]}
        assert seen.isdisjoint(r[0] for r in rows)
        seen.update(r[0] for r in rows)
    assert summary["rows_per_label"]["train"] == 48  # 80% of 60
    # The corpus and the classification data from one command; neither is required alone.
    both = tmp_path / "both"
    result = call_main("sample_corpus", [f"--output_dir={both / 'corpus'}",
                                         f"--classification_dir={both / 'cls'}",
                                         "--max_mb=0.3", "--classification_rows_per_class=60"])
    assert result.code == 0, result.stderr
    assert (both / "corpus" / "stdlib-00000-of-00001.txt").exists()
    assert (both / "cls" / "train.tsv").read_bytes() == (outputs[0] / "train.tsv").read_bytes()
    result = call_main("sample_corpus", max_mb=0.3)
    assert result.code == 1 and "--classification_dir" in result.stderr
