"""bench/corpus.py, the benches' text: no line repeats, deterministic, cached, sized."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bench"))

import corpus  # noqa: E402


@pytest.fixture
def small_sources(monkeypatch, tmp_path):
    """The builder over 40 standard-library files (the full set takes minutes), with its
    cache in a temporary directory."""
    files = corpus.source_files()
    names = [name for name, _ in files]
    assert names == sorted(set(names), key=names.index), "a file is listed twice"
    assert any(n.startswith("stdlib/") for n in names[:200]), "the order mixes the sources"
    assert any(n.startswith("tensorflow/") for n in names[:200]), "the order mixes the sources"
    chosen = [item for item in files if item[0].startswith("stdlib/")][:40]
    monkeypatch.setattr(corpus, "source_files", lambda: chosen)
    monkeypatch.setenv("BERT_KERAS3_CACHE_DIR", str(tmp_path / "cache"))
    corpus.unique_text.cache_clear()  # the text is also kept in this process
    yield tmp_path
    corpus.unique_text.cache_clear()


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return [line for line in f.read().split("\n") if line]


def test_unique_corpus_repeats_no_line_and_is_cached(small_sources, monkeypatch):
    first, second = small_sources / "a.txt", small_sources / "b.txt"
    written = corpus.write_corpus(str(first), 0.05)
    assert written == os.path.getsize(first) >= 50_000
    lines = _lines(first)
    assert len(lines) > 300 and len(set(lines)) == len(lines)
    cached = os.listdir(small_sources / "cache")
    assert len(cached) == 1 and cached[0].startswith("bench-corpus-")
    corpus.unique_text.cache_clear()

    def rebuild(doc):
        raise AssertionError("the text was rebuilt instead of read from its cache file")

    monkeypatch.setattr(corpus.sample_corpus, "docstring_sentences", rebuild)
    corpus.write_corpus(str(second), 0.05)
    assert first.read_bytes() == second.read_bytes()
    assert first.read_bytes().endswith(b"\n")
    stats = corpus.describe(str(first))
    assert stats["distinct_lines"] == stats["lines"] == len(lines)


def test_repeated_corpus_holds_unique_mb_of_distinct_text(small_sources):
    path = small_sources / "r.txt"
    corpus.write_corpus(str(path), 0.1, "repeated", unique_mb=0.02)
    stats = corpus.describe(str(path))
    assert stats["bytes"] >= 100_000
    assert 20_000 <= stats["distinct_line_bytes"] < 25_000
    assert stats["lines"] > 4 * stats["distinct_lines"]


def test_asking_for_more_text_than_there_is_says_how_much_there_is(small_sources):
    with pytest.raises(ValueError, match=r"holds \d+\.\d\d MB .* 50\.00 MB were asked for"):
        corpus.write_corpus(str(small_sources / "big.txt"), 50)
    with pytest.raises(ValueError, match="corpus must be one of"):
        corpus.write_corpus(str(small_sources / "x.txt"), 0.01, "shuffled")


def test_vocab_has_bert_special_ids_and_pieces(small_sources):
    path = small_sources / "vocab.txt"
    size = corpus.write_vocab(str(path), size=2000, sample_mb=0.05)
    tokens = path.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(tokens) == size == 2000 and len(set(tokens)) == size
    assert tokens[0] == "[PAD]" and tokens[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert any(t.startswith("##") and len(t) > 3 for t in tokens)
