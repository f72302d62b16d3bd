"""build_vocab: layout of the specials, exact word counting, every character kept, the CLI."""

import collections
import json
import os
import subprocess
import sys

import pytest

from data_prep import build_vocab, reference_tokenization, sample_corpus, tokenization
from data_prep.cli import UserError
from tests.clis import call_main

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MULTILINGUAL = [
    "Café naïve résumé, ÉCOLE and Ångström.",
    "Ελληνικά κείμενα και Русский текст в корпусе.",
    "中文字符和日本語のテキスト, 한국어 문장.",
    "Tabs\tand\u00a0non-breaking spaces\u3000here; emoji \U0001f642 and \u200dZWJ.",
    "Control\x07chars and a soft\u00adhyphen, plus $^`~ symbols.",
    # A word longer than max_token_length (50) whose letter ʘ appears nowhere else.
    "A " + "ʘ" + "abcdefghij" * 6 + " word.",
    "",
]


def _read_vocab(path):
    with open(path, encoding="utf-8", newline="") as reader:
        text = reader.read()
    assert text.endswith("\n") and "\r" not in text
    return text[:-1].split("\n")


def _unk_rate(vocab_file, lines, do_lower_case):
    tokenizer = tokenization.FullTokenizer(vocab_file, do_lower_case=do_lower_case)
    pieces = [p for line in lines for p in tokenizer.tokenize(line)]
    assert pieces
    return pieces.count("[UNK]") / len(pieces)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """Two small files of real English (standard-library docs) and one multilingual file."""
    folder = tmp_path_factory.mktemp("vocab_corpus")
    documents = list(sample_corpus.iter_limited_documents(max_mb=0.04))
    for shard in range(2):
        with open(folder / f"docs-{shard}.txt", "w", encoding="utf-8") as writer:
            writer.writelines("\n".join(d.sentences) + "\n\n" for d in documents[shard::2])
    (folder / "multi.txt").write_text("\n".join(MULTILINGUAL) + "\n", encoding="utf-8")
    return folder


def _all_lines(folder):
    lines = []
    for name in sorted(os.listdir(folder)):
        with open(folder / name, encoding="utf-8") as reader:
            lines += [line.rstrip("\n") for line in reader]
    return lines


class TestLayout:
    def test_bert_layout_has_googles_ids(self):
        tokens = build_vocab.special_tokens(100, "bert")
        assert len(tokens) == 105
        assert [tokens.index(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [
            0, 100, 101, 102, 103]
        assert tokens[1] == "[unused0]" and tokens[99] == "[unused98]"
        assert tokens[104] == "[unused99]"

    def test_bert_layout_with_few_unused_slots(self):
        assert build_vocab.special_tokens(2, "bert") == [
            "[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

    def test_compact_layout(self):
        assert build_vocab.special_tokens(2, "compact") == [
            "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]"]


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_count_words_is_exactly_the_basic_tokenizer(do_lower_case):
    lines = MULTILINGUAL + ["  Leading and  double  spaces . x\x00y \x1fz\u2028w", "a \x00b",
                            "joined\x1fby\x85controls: a\x1cb"]
    basic = reference_tokenization.BasicTokenizer(do_lower_case=do_lower_case)
    expected = collections.Counter(w for line in lines for w in basic.tokenize(line))
    assert build_vocab.count_words(lines, do_lower_case) == expected


def test_learn_vocab_keeps_every_character_and_the_target_size():
    counts = build_vocab.count_words(MULTILINGUAL * 3 + ["the cat sat on the mat"] * 20,
                                     do_lower_case=False)
    config = build_vocab.VocabConfig(vocab_size=400, num_unused=5, do_lower_case=False,
                                     min_token_count=1)
    vocab = build_vocab.learn_vocab(counts, config)
    assert len(vocab) <= 400 and len(vocab) == len(set(vocab))
    chars = {c for word in counts for c in word}
    assert chars <= set(vocab)
    for char in chars:
        assert (("##" + char) in vocab) == build_vocab.can_continue_word(char), char
    assert "ʘ" in vocab and "##ʘ" in vocab  # only ever seen inside a 61-character word
    assert "##," not in vocab and "##中" not in vocab  # can never continue a word
    assert "the" in vocab


def test_learn_vocab_rejects_too_small_sizes():
    counts = collections.Counter({"abc": 5, "xyz": 3})
    with pytest.raises(UserError, match="special tokens alone"):
        build_vocab.learn_vocab(counts, build_vocab.VocabConfig(vocab_size=50))
    with pytest.raises(UserError, match="character tokens"):
        build_vocab.learn_vocab(counts, build_vocab.VocabConfig(vocab_size=110))
    with pytest.raises(UserError, match="no words"):
        build_vocab.learn_vocab(collections.Counter(), build_vocab.VocabConfig())


def test_cli_uncased_end_to_end(corpus_dir, tmp_path):
    output = tmp_path / "out" / "vocab.txt"
    result = call_main("build_vocab", [f"--input_file={corpus_dir}/docs-*.txt,{corpus_dir}/multi.txt",
                      f"--output_file={output}", "--vocab_size=700"])
    assert result.code == 0, result.stderr
    vocab = _read_vocab(output)
    assert len(vocab) <= 700 and len(vocab) == len(set(vocab))
    assert len(vocab) > 600, "the target size is approached on this corpus"
    assert [vocab.index(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [
        0, 100, 101, 102, 103]
    assert vocab[1:100] == [f"[unused{i}]" for i in range(99)]
    assert vocab[104] == "[unused99]"
    learned = vocab[105:]
    assert not any(c.isupper() for token in learned for c in token), "uncased vocab"
    assert "e" in learned and "é" not in learned and "å" not in learned
    lines = _all_lines(corpus_dir)
    assert _unk_rate(str(output), lines, do_lower_case=True) == 0.0
    summary = json.loads((tmp_path / "out" / "vocab.txt.summary.json").read_text())
    assert summary["unk_rate"] == 0.0 and summary["vocab_size"] == len(vocab)
    assert summary["special_token_ids"]["[MASK]"] == 103
    assert "[UNK] rate 0.0000%" in result.stdout
    assert sorted(os.listdir(tmp_path / "out")) == ["vocab.txt", "vocab.txt.summary.json"]


def test_cli_cased_compact_end_to_end(corpus_dir, tmp_path):
    output = tmp_path / "vocab.txt"
    result = call_main("build_vocab", [f"--input_file={corpus_dir}/*.txt", f"--output_file={output}",
                      "--vocab_size=800", "--do_lower_case=false", "--layout=compact",
                      "--num_unused=10"])
    assert result.code == 0, result.stderr
    vocab = _read_vocab(output)
    assert vocab[:7] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]"]
    assert vocab[14] == "[unused9]"
    assert {"É", "é", "Å", "ʘ", "##ʘ", "中", "\U0001f642"} <= set(vocab)
    assert any(token[:1].isupper() and len(token) > 1 for token in vocab[15:]), "cased pieces"
    assert _unk_rate(str(output), _all_lines(corpus_dir), do_lower_case=False) == 0.0


@pytest.mark.parametrize("case", ["no_match", "empty", "invalid_utf8", "small_vocab",
                                  "small_for_chars", "unwritable"])
def test_cli_bad_input_fails_clearly(tmp_path, case):
    good = tmp_path / "good.txt"
    good.write_text("Some words here.\nMore words there.\n\n" * 5, encoding="utf-8")
    flags = {"input_file": str(good), "vocab_size": "500"}
    if case == "no_match":
        flags["input_file"] = f"{good},{tmp_path}/missing-*.txt"
        expected = "missing-*.txt' matches no file"
    elif case == "empty":
        (tmp_path / "empty.txt").write_text("\n \n\t\n", encoding="utf-8")
        flags["input_file"] = str(tmp_path / "empty.txt")
        expected = "no text in the input"
    elif case == "invalid_utf8":
        (tmp_path / "bad.txt").write_bytes(b"fine line\nanother\nbroken \xff\xfe here\n")
        flags["input_file"] = f"{good},{tmp_path}/bad.txt"
        # "fine line\n" (10 bytes), "another\n" (8), "broken " (7): offset 25.
        expected = "bad.txt:3: invalid UTF-8 at byte offset 25 (invalid start byte)"
    elif case == "small_vocab":
        flags["vocab_size"] = "100"
        expected = "--vocab_size=100 is too small: the special tokens alone take 105"
    elif case == "small_for_chars":
        flags["vocab_size"] = "110"
        expected = "--vocab_size=110 is too small"
    else:
        (tmp_path / "a_file").write_text("")
        flags["output_file"] = str(tmp_path / "a_file" / "vocab.txt")
        expected = "a_file/vocab.txt: cannot write there"
    output = tmp_path / "vocab.txt"
    flags.setdefault("output_file", str(output))
    result = call_main("build_vocab", **flags)
    assert result.code == 1
    assert "build_vocab: error: " in result.stderr and expected in result.stderr, result.stderr
    assert not output.exists()
    assert [p for p in os.listdir(tmp_path) if ".tmp" in p] == []


def test_sampling_reads_a_share_of_big_inputs(corpus_dir, tmp_path):
    config = build_vocab.VocabConfig(vocab_size=600, max_input_mb=0.01, min_token_count=1)
    summary = build_vocab.build_vocab(str(corpus_dir / "docs-*.txt"), str(tmp_path / "v.txt"),
                                      config, log=lambda message: None)
    assert 0 < summary["lines_used"] < summary["lines_read"]
    assert summary["lines_used"] < 0.5 * summary["lines_read"]
    assert summary["unk_rate"] == 0.0


def test_importing_defines_no_flags():
    code = ("import data_prep.build_vocab\nfrom absl import flags\n"
            "print(sorted(n for n in ('vocab_size', 'input_file', 'output_file', "
            "'do_lower_case', 'num_unused', 'layout') if n in flags.FLAGS))")
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                            check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
