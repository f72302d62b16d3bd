"""Measures where the in-graph tokenizer differs from the exact pure-Python one.

The findings are summarised in docs/tokenization.md; these tests keep that page honest.
"""

import random
import unicodedata

import pytest
import tensorflow as tf
import tensorflow_text as tf_text

from data_prep import tf_tokenization, tokenization
# The adversarial corpus and its vocab are the tokenizer tests' module fixtures.
from test_tokenization import SEED, WORDS, corpus, vocab_file  # noqa: F401

# Characters assigned in Unicode 15/16 whose canonical decomposition tensorflow-text's
# ICU knows but Python 3.11's Unicode 14.0 database does not (lower-case mode only).
NEWER_UNICODE_DECOMPOSITIONS = {
    0x105C9, 0x105E4, 0x11383, 0x11385, 0x1138E, 0x11391, 0x113C5, 0x113C7, 0x113C8,
    *range(0x16121, 0x16129), 0x16D68, 0x16D69, 0x16D6A,
}
# Case properties: tf.strings.lower knows Unicode 13, Python 3.11 Unicode 14. Where
# Unicode 14 made a character cased or case-ignorable (Vithkuqi, Latin Extended-F/G,
# Znamenny, Kana Extended-B, new Arabic marks, ...), a capital sigma beside it gets a
# different final-sigma decision (ς vs σ) in lower-case mode. About 300 code points.




def _prose(n_lines=300):
    rng = random.Random(SEED + 3)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 25))]
        lines.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ", said he."]))
    return lines


def _tokens(tokenizer, lines):
    return tokenizer.ids_to_tokens(tokenizer.tokenize(tf.constant(lines)))


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_in_graph_matches_python_on_adversarial_corpus(corpus, vocab_file, do_lower_case):
    python = tokenization.FullTokenizer(vocab_file, do_lower_case)
    graph = tf_tokenization.BertInGraphTokenizer(vocab_file, do_lower_case)
    got = _tokens(graph, corpus)
    differing = [(line, python.tokenize(line), g) for line, g in zip(corpus, got)
                 if python.tokenize(line) != g]
    assert differing == []
    prose = _prose()
    assert _tokens(graph, prose) == [python.tokenize(line) for line in prose]


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_stock_tensorflow_text_differs_but_agrees_on_prose(corpus, vocab_file, do_lower_case):
    """Why we do not use tf_text.BertTokenizer as is: measured, by known classes."""
    python = tokenization.FullTokenizer(vocab_file, do_lower_case)
    tokens = list(python.vocab)
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        tokens, tf.range(len(tokens), dtype=tf.int64)), default_value=-1)
    stock = tf_text.BertTokenizer(table, lower_case=do_lower_case, token_out_type=tf.int64)

    def run(lines):
        ids = stock.tokenize(tf.constant(lines)).merge_dims(1, 2).to_list()
        return [[tokens[i] for i in row] for row in ids]

    prose = _prose()
    assert run(prose) == [python.tokenize(line) for line in prose]
    differing = sum(python.tokenize(line) != got for line, got in zip(corpus, run(corpus)))
    assert differing > 300, differing
    # Known classes: control characters split words instead of vanishing; U+FFFD is kept;
    # a word limit of 100 bytes instead of 200 characters.
    known = ["a\x01b", "a\x7fb", "a\ufffdb", "ж" * 80]
    if do_lower_case:  # NFKC case folding, no final sigma
        known += ["\ufb01x", "\uff21\uff22", "\u2026", "ΟΔΥΣΣΕΥΣ"]
    else:  # format characters split words, some Unicode spaces do not
        known += ["a\u200bb", "a\u00a0b"]
    graph = tf_tokenization.BertInGraphTokenizer(vocab_file, do_lower_case)
    expected = [python.tokenize(line) for line in known]
    stock_got = run(known)
    assert [e != s for e, s in zip(expected, stock_got)] == [True] * len(known), (
        list(zip(known, expected, stock_got)))
    assert _tokens(graph, known) == expected


def _differing_code_points(graph, do_lower_case):
    """{code point: (python words, graph words)} where the basic tokenizations differ.

    Every code point Python knows, plus one in 50 unassigned (Cn) or private-use (Co) ones
    (they share all properties for Python) and the unassigned ones ICU decomposes.
    """
    code_points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and (
        c % 50 == 0 or c in NEWER_UNICODE_DECOMPOSITIONS
        or unicodedata.category(chr(c)) not in ("Cn", "Co"))]
    fast = tokenization._fast_basic()

    def compare(cps, make):
        lines = [make(c) for c in cps]
        got = graph.basic_tokenize(tf.constant(lines, dtype=tf.string)).to_list()
        result = {}
        for c, line, words in zip(cps, lines, got):
            expected, words = fast.tokenize(line, do_lower_case), [w.decode() for w in words]
            if words != expected:
                result[c] = (expected, words)
        return result

    def probe(c):  # glued to a letter, and as final-sigma context on both sides
        return f"a{chr(c)} xΣ{chr(c)}Σ"

    chunks = [code_points[i:i + 512] for i in range(0, len(code_points), 512)]
    bad_chunks = compare(range(len(chunks)), lambda i: " ".join(map(probe, chunks[i])))
    return compare([c for i in bad_chunks for c in chunks[i]], probe)


def test_every_code_point_in_graph_vs_python(vocab_file):
    """Per character, the only differences (lower-case mode only) are Unicode 16
    decompositions and final-sigma decisions beside characters new in Unicode 14."""
    cased = _differing_code_points(tf_tokenization.BertInGraphTokenizer(vocab_file, False),
                                   False)
    assert cased == {}
    uncased = _differing_code_points(tf_tokenization.BertInGraphTokenizer(vocab_file, True),
                                     True)
    assert NEWER_UNICODE_DECOMPOSITIONS <= set(uncased)
    sigma_only = {c for c, (expected, got) in uncased.items()
                  if c not in NEWER_UNICODE_DECOMPOSITIONS}
    for c in sigma_only:
        expected, got = uncased[c]
        assert expected != got and [w.replace("ς", "σ") for w in expected] == [
            w.replace("ς", "σ") for w in got], (hex(c), expected, got)
    assert 200 < len(sigma_only) < 400, len(sigma_only)
    assert {0x10570, 0x2C2F, 0x1DF00} <= sigma_only  # Vithkuqi, Glagolitic, Latin Ext-G
    # The decomposing characters are unassigned for Python, known to tensorflow-text's ICU.
    for cp in NEWER_UNICODE_DECOMPOSITIONS:
        assert unicodedata.category(chr(cp)) == "Cn"


def test_lowercase_fixes_cover_unicode_14_letters(vocab_file):
    graph = tf_tokenization.BertInGraphTokenizer(vocab_file, True)
    text = "\u2c2f \U00010570x \ua7c0 \u0130 ΑΣ ΑΣΑ \U00010570"
    assert graph._lower(tf.constant([text])).numpy()[0].decode("utf-8") == text.lower()
    assert 0x10570 in tf_tokenization._lowercase_fixes()[0]


def test_long_vocab_tokens_fall_back_to_table_wordpiece(tmp_path):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##a", "x" * 150 + "é" * 60,
              "é", "##é", "x", "##x", ""]
    vocab = tmp_path / "v.txt"
    vocab.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    graph = tf_tokenization.BertInGraphTokenizer(str(vocab), False)
    assert isinstance(graph._wordpiece, tf_text.WordpieceTokenizer)
    python = tokenization.FullTokenizer(str(vocab), False)
    lines = ["x" * 150 + "é" * 60, "x" * 150 + "é" * 50, "a" * 200, "a" * 201, "é" * 199 + "a"]
    assert _tokens(graph, lines) == [python.tokenize(line) for line in lines]


def test_tokenize_in_tf_function_and_dataset(tiny_vocab_file):
    graph = tf_tokenization.BertInGraphTokenizer(tiny_vocab_file, True)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(texts):
        ids = graph.tokenize(texts)
        return graph.pack_inputs(ids, max_seq_length=8)

    out = serve(tf.constant(["The cat sat.", "unaffable"]))
    python = tokenization.FullTokenizer(tiny_vocab_file, True)
    expected = python.convert_tokens_to_ids(["[CLS]"] + python.tokenize("The cat sat.")
                                            + ["[SEP]"])
    assert out["input_ids"].numpy()[0].tolist() == expected + [0] * (8 - len(expected))
    assert out["input_ids"].dtype == tf.int32
    dataset = tf.data.Dataset.from_tensor_slices(["a dog ran", "home"]).batch(2).map(
        lambda t: graph.pack_inputs(graph.tokenize(t), max_seq_length=6))
    batch = next(iter(dataset))
    assert batch["input_mask"].numpy().tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]]


def _reference_pair(a, b, max_seq_length, cls=2, sep=3):
    """The original's deterministic `_truncate_seq_pair` loop, then the packing."""
    a, b = list(a), list(b)
    while len(a) + len(b) > max_seq_length - 3:
        (a if len(a) > len(b) else b).pop()
    ids = [cls] + a + [sep] + b + [sep]
    segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    pad = max_seq_length - len(ids)
    return ids + [0] * pad, [1] * len(ids) + [0] * pad, segments + [0] * pad


def test_pack_pairs_truncates_like_the_original(tiny_vocab_file):
    graph = tf_tokenization.BertInGraphTokenizer(tiny_vocab_file, True)
    cls, sep = graph.cls_id, graph.sep_id
    firsts, seconds = [], []
    for len_a in range(0, 14):
        for len_b in range(0, 14):
            firsts.append(list(range(100, 100 + len_a)))
            seconds.append(list(range(200, 200 + len_b)))
    for max_seq_length in (3, 4, 8, 11, 16, 40):
        out = graph.pack_inputs(tf.ragged.constant(firsts, dtype=tf.int64, ragged_rank=1),
                                tf.ragged.constant(seconds, dtype=tf.int64, ragged_rank=1),
                                max_seq_length=max_seq_length)
        for i, (a, b) in enumerate(zip(firsts, seconds)):
            ids, mask, segments = _reference_pair(a, b, max_seq_length, cls, sep)
            assert out["input_ids"].numpy()[i].tolist() == ids, (a, b, max_seq_length)
            assert out["input_mask"].numpy()[i].tolist() == mask
            assert out["segment_ids"].numpy()[i].tolist() == segments
    with pytest.raises(ValueError, match="max_seq_length=2"):
        graph.pack_inputs(tf.ragged.constant([[1]]), tf.ragged.constant([[1]]), 2)


def test_pack_single_truncates_the_end(tiny_vocab_file):
    graph = tf_tokenization.BertInGraphTokenizer(tiny_vocab_file, True)
    out = graph.pack_inputs(tf.ragged.constant([[7, 8, 9, 10, 11], [7]], dtype=tf.int64), None, 5)
    c, s = graph.cls_id, graph.sep_id
    assert out["input_ids"].numpy().tolist() == [[c, 7, 8, 9, s], [c, 7, s, 0, 0]]
    assert out["segment_ids"].numpy().tolist() == [[0] * 5, [0] * 5]


def test_pack_segments_equals_tensorflow_text_combine_and_pad():
    """pack_segments gives combine_segments + pad_model_inputs' values: empty rows, rows
    cut at seq_length, partial `lengths`, one or two segments, a seq_length tensor."""
    rng = random.Random(SEED)
    for trial in range(60):
        batch, seq_length = rng.randint(1, 4), rng.randint(2, 12)
        segments = [tf.ragged.constant([[rng.randint(5, 99) for _ in range(rng.randint(0, 9))]
                                        for _ in range(batch)], tf.int64, ragged_rank=1,
                                       inner_shape=())
                    for _ in range(rng.randint(1, 2))]
        lengths = None
        if trial % 2:
            lengths = [tf.constant([rng.randint(0, n) for n in s.row_lengths().numpy()],
                                   tf.int64) for s in segments]
            kept = [tf.ragged.boolean_mask(s, tf.ragged.range(s.row_lengths())
                                           < n[:, None]) for s, n in zip(segments, lengths)]
        ids, types = tf_text.combine_segments(lengths and kept or segments, 101, 102)
        want_ids, want_mask = tf_text.pad_model_inputs(ids, seq_length)
        want_types, _ = tf_text.pad_model_inputs(types, seq_length)
        length = tf.constant(seq_length) if trial % 3 == 0 else seq_length
        got = tf_tokenization.pack_segments(segments, 101, 102, length, lengths)
        for g, w in zip(got, (want_ids, want_mask, want_types)):
            assert g.numpy().tolist() == w.numpy().tolist(), (trial, segments, lengths)


def test_vocab_without_specials_is_rejected(tmp_path):
    vocab = tmp_path / "v.txt"
    vocab.write_text("[UNK]\nthe\n", encoding="utf-8")
    with pytest.raises(tokenization.VocabError, match=r"\[CLS\], \[SEP\]"):
        tf_tokenization.BertInGraphTokenizer(str(vocab))
