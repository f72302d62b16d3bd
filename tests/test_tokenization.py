"""Tokenization is identical to Google's original (bert-tensorflow) on adversarial text.

The adversarial corpus is generated here, deterministically, and is also used by
test_tf_tokenization.py to measure where the in-graph tokenizer differs.
"""

import functools
import random
import subprocess
import sys
import unicodedata

import pytest

from data_prep import reference_tokenization, tokenization
from original_bert import original_module
from tests.clis import call_main

SEED = 20261122

# Interesting single characters, by class.
SPACES = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Zs"] + [
    "\t", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\u2028", "\u2029",
]
CONTROLS = [chr(c) for c in list(range(0, 32)) + list(range(0x7F, 0xA0))]
FORMATS = [
    "\u200b", "\u200c", "\u200d", "\u200e", "\u200f", "\ufeff", "\u00ad", "\u061c",
    "\u180e", "\u2060", "\u2061", "\u2064", "\u206f", "\U000e0001", "\U000e0041",
    "\ufff9", "\U0001d173",
]
SPECIALS = ["\x00", "\ufffd", "\u0130", "\u1fef", "\u212a", "\u2126", "\u1e9e", "\u0345",
            "\u1fbe", "\u1fee", "\u0387", "\u037e", "\u2000", "\u2001", "\u0340", "\u0344",
            "\ufb01", "\ufb02", "\u00df", "\u0149", "\u01c5", "\u01c8", "\u03c2", "\u03a3",
            "\u1f88", "\u0390", "\ufe0f", "\u20e3", "\u3000", "\u30fb", "\u00b7", "\u2e3a"]
UNASSIGNED = ["\u0378", "\u0379", "\u0560", "\u2fff", "\ufffe", "\uffff", "\U0001fffe",
              "\U000e0080", "\U0003134b", "\U0002ebe1", "\U00030000", "\U0002ceb0"]
PRIVATE_USE = ["\ue000", "\uf8ff", "\U000f0000", "\U000ffffd", "\U00100000", "\U0010fffd"]
COMBINING = ["\u0300", "\u0301", "\u0308", "\u0323", "\u0327", "\u0331", "\u0345", "\u064b",
             "\u05b0", "\u093c", "\u094d", "\u0e31", "\u0e48", "\u1ab0", "\u20d0", "\u302a",
             "\u3099", "\U0001d165", "\U0001d167", "\u0903", "\u0488"]
CJK_RANGES = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
              (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
              # Neighbours that are *not* split by the original:
              (0x2E80, 0x2EFF), (0x2F00, 0x2FDF), (0x3000, 0x303F), (0x31C0, 0x31EF),
              (0x2CEB0, 0x2EBEF), (0x30000, 0x3134F), (0xFF00, 0xFFEF)]

WORDS = (
    "the of and to in is was it he she on for with as by at from that this which be "
    "are were been have has had not but or an they we you his her their its one all "
    "would there what so up out if about who get when make can like time just him know "
    "take people into year your good some could them see other than then now look only "
    "come over think also back after use two how our work first well way even new want "
    "because any these give day most us unaffable running jumped quickly tokenization "
    "pretraining transformer BERT Google TensorFlow Keras McDonald's O'Neill don't it's "
    "e-mail state-of-the-art U.S.A. Dr. Mr. Mrs. etc. i.e. e.g. naïve café résumé"
).split()
SCRIPTS = {
    "latin": "Ça va? Où est l'hôtel Ærøskøbing Ångström façade ŒUVRE Straße STRASSE ẞ "
             "Dvořák Łódź Škoda İstanbul ıi ǅungla ǈ Ǆ ﬁnance ﬂow Zürich ĳ ĲSSEL Ⅻ ½ ² ①",
    "greek": "ΟΔΥΣΣΕΥΣ ΣΑΣ Σ ΑΣ. ΑΣ, ΑΣ' (ΑΣ) ΑΣ\u0301 ΑΣ\u0301Α ΑΣΑ ὈΔΥΣΣΕΎΣ ἄνθρωπος "
             "ᾼ ᾳ ΐ Ϊ́ ς σ Σ; ΣΣ·Σ ΑΣ\u200dΑ ΑΣ\u00adΑ",
    "cyrillic": "Съешь же ещё этих мягких французских булок, да выпей чаю. Йод ЁЛКА ї Ї ѐ",
    "arabic": "اَلْعَرَبِيَّةُ لغة جميلة، أليس كذلك؟ ﷺ ﻻ ٣٤٥ \u061cابجد",
    "hebrew": "שָׁלוֹם עולם! בְּרֵאשִׁית ״גרשיים״ ־",
    "devanagari": "नमस्ते दुनिया। क़ ड़ॉ हिन्दी॥ ०१२",
    "thai": "สวัสดีครับ ภาษาไทยไม่มีช่องว่าง ๆ ฯ",
    "hangul": "안녕하세요 세계! 한국어 각 ㄱㅏ ﾡ",
    "japanese": "こんにちは、世界。カタカナ ｶﾀｶﾅ ゔ が ぱ ー・",
    "emoji": "👍 👍🏽 👨\u200d👩\u200d👧\u200d👦 🏳️\u200d🌈 🇯🇵 1️⃣ ❤️ 🤷\u200d♀️ 🧑🏿\u200d💻 ©️ ™",
}
CODE = [
    "def f(x): return x**2  # square",
    "for (int i = 0; i < n; ++i) { a[i] += b->c[i]; }",
    '{"key": [1, 2.5e-3, null, true], "k2": "v\\"q"}',
    "SELECT * FROM t WHERE a <> 'b' AND c >= 3;",
    "$ ls -la ~/.config | grep -E '^d' && echo $HOME",
    "x = y if a else b; lambda *args, **kw: kw",
    "<div class=\"a\">&nbsp;&amp;</div>",
    "tf.keras.layers.Dense(units=64, activation='relu')(inputs)",
]
URLS = [
    "https://www.example.com/path/to/page?query=1&b=%20x#frag",
    "mailto:someone@example.org", "ftp://ftp.example.net/pub/file.tar.gz",
    "http://[2001:db8::1]:8080/index.html", "www.google.com/search?q=bert+wordpiece",
    "user.name+tag@sub.domain.co.uk", "C:\\Users\\Public\\file.txt",
]
NUMBERS = ["1,234,567.89", "3.14159", "-2.5e-10", "50%", "$5.00", "€10", "¥1000", "1/2",
           "10:30am", "2026-11-22", "+1 (555) 123-4567", "0x1F", "1st", "2nd", "٣", "৭", "Ⅻ"]


def _cjk(rng):
    lo, hi = rng.choice(CJK_RANGES)
    return chr(rng.randint(lo, hi))


def _random_code_point(rng, surrogates=False):
    while True:
        cp = rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0x7FF),
                         rng.randint(0x800, 0xFFFF), rng.randint(0x10000, 0x10FFFF),
                         rng.randint(0x10000, 0x3FFFF)])
        if surrogates or not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def _atom(rng):
    kind = rng.randrange(16)
    if kind == 0:
        return rng.choice(SPACES)
    if kind == 1:
        return rng.choice(CONTROLS + FORMATS)
    if kind == 2:
        return rng.choice(SPECIALS + UNASSIGNED + PRIVATE_USE)
    if kind == 3:
        return rng.choice(WORDS) + rng.choice(COMBINING)
    if kind == 4:
        return "".join(_cjk(rng) for _ in range(rng.randint(1, 4)))
    if kind == 5:
        return rng.choice(rng.choice(list(SCRIPTS.values())).split())
    if kind == 6:
        return rng.choice(["[MASK]", "[UNK]", "[CLS]", "[SEP]", "[PAD]", "[unused1]", "##s"])
    if kind == 7:
        return rng.choice(NUMBERS + URLS)
    if kind == 8:
        return "".join(_random_code_point(rng) for _ in range(rng.randint(1, 6)))
    if kind == 9:
        return rng.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~¡¿«»—–…‘’“”†‡§¶‰′″※⁂")
    return rng.choice(WORDS)


def adversarial_corpus(n_random=1500):
    """About 2,300 deterministic lines covering every character class of concern.

    Lines never contain "\\n" (they are joined with it for the CLI); "\\r" does occur.
    """
    rng = random.Random(SEED)
    lines = []
    for script, text in SCRIPTS.items():
        lines.append(text)
        lines.append(text.upper())
        lines.append(text.lower())
        lines.append(unicodedata.normalize("NFD", text))
        lines.append(unicodedata.normalize("NFKC", text))
    lines += CODE + URLS + [" ".join(NUMBERS)]
    for i in range(200):  # prose
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))
        lines.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "!", "?", "..."]))
    for lo, hi in CJK_RANGES:
        lines.append("".join(chr(rng.randint(lo, hi)) for _ in range(20)))
        lines.append(f"x{chr(lo)}y{chr(hi)}z {chr(lo - 1)}{chr(hi + 1)}")
    for group in (SPACES, CONTROLS, FORMATS, SPECIALS, UNASSIGNED, PRIVATE_USE, COMBINING):
        lines.append("a" + "a".join(group) + "a")
        lines.append("Σ" + " Σ".join(group) + "Σ")
        lines.append("".join(group))
        for char in group:
            lines.append(f"ab{char}cd {char}x ΑΣ{char} {char}")
    for n in (198, 199, 200, 201, 202):  # long words around the 200-character limit
        lines.append("a" * n)
        lines.append("é" * n)
        lines.append("e\u0301" * (n // 2) + "x" * (n % 2))
        lines.append("İ" * n)
        lines.append("ǅ" * n + " " + "x" * n + "." + "y" * n)
        lines.append(_cjk(rng).join(["z" * n, "w" * n]))
        lines.append("\u200b".join("q" * n) + " end")
    lines += ["", " ", "\r", "\t\r\t", "\x00", "\ufffd", "[MASK]", "[MASK]x[UNK]",
              "a\rb\rc", "line with trailing cr\r", "\u2028\u2029", "x\u2028y\u2029z"]
    for i in range(n_random):  # random mixtures of atoms
        sep = rng.choice(["", " ", " ", " ", "\t", rng.choice(SPACES)])
        lines.append(sep.join(_atom(rng) for _ in range(rng.randint(1, 25))))
    for i in range(200):  # random strings sampled from all planes
        lines.append("".join(_random_code_point(rng) for _ in range(rng.randint(1, 40))))
    return [line.replace("\n", " ") for line in lines]


def build_vocab_tokens(lines):
    """A realistic vocab learned from `lines`: frequent words, most single characters and
    most ## pieces, so WordPiece splits words, matches whole words and still emits [UNK]."""
    rng = random.Random(SEED + 1)
    words = {}
    for lower in (True, False):
        basic = reference_tokenization.BasicTokenizer(do_lower_case=lower)
        for line in lines:
            for word in basic.tokenize(line):
                words[word] = words.get(word, 0) + 1
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]"]
    chars = sorted({c for w in words for c in w})
    always = set("abcdefghijklmnopqrstuvwxyz0123456789éж")
    for char in chars:
        if char in always:
            tokens += [char, "##" + char]
        elif rng.random() < 0.9:
            tokens.append(char)
        if rng.random() < 0.85:
            tokens.append("##" + char)
    for word, count in sorted(words.items()):
        if count >= 2 and len(word) <= 40:
            tokens.append(word)
        if len(word) >= 4 and rng.random() < 0.3:
            cut = rng.randint(1, len(word) - 2)
            tokens.append(word[:cut])
            tokens.append("##" + word[cut:])
    # Real vocabs hold no huge tokens (tensorflow-text's FastWordpiece refuses > 256 bytes).
    return [t for t in dict.fromkeys(tokens) if len(t.encode("utf-8")) <= 200]


@pytest.fixture(scope="module")
def corpus():
    return adversarial_corpus()


@pytest.fixture(scope="module")
def vocab_file(corpus, tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(build_vocab_tokens(corpus)) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def original():
    return original_module("tokenization")


def _differing(expected_lines, actual_lines, corpus):
    return [(i, corpus[i], e, a) for i, (e, a) in enumerate(zip(expected_lines, actual_lines))
            if e != a]


def test_corpus_is_adversarial(corpus, vocab_file, original):
    assert len(corpus) >= 2000
    text = "".join(corpus)
    for needed in ["\u2028", "\x85", "\r", "\x00", "\ufffd", "\u0130", "\u1fef", "\u212a",
                   "\ufeff", "\u00ad", "\u200d", "[MASK]", "\U00020000", "\uf900", "\u03a3"]:
        assert needed in text, repr(needed)
    tokenizer = original.FullTokenizer(vocab_file, do_lower_case=True)
    tokens = [t for line in corpus for t in tokenizer.tokenize(line)]
    share_unk = tokens.count("[UNK]") / len(tokens)
    share_pieces = sum(t.startswith("##") for t in tokens) / len(tokens)
    # WordPiece is exercised: whole words, continuation pieces and [UNK] all occur.
    assert 0.005 < share_unk < 0.3, share_unk
    assert share_pieces > 0.05, share_pieces
    assert len(set(tokens)) > 1000


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_fast_and_exact_paths_match_original(corpus, vocab_file, original, do_lower_case):
    reference = original.FullTokenizer(vocab_file, do_lower_case=do_lower_case)
    ours = tokenization.FullTokenizer(vocab_file, do_lower_case=do_lower_case)
    expected = [reference.tokenize(line) for line in corpus]
    fast = [ours.tokenize(line) for line in corpus]
    exact = [ours.tokenize_exact(line) for line in corpus]
    assert _differing(expected, fast, corpus) == []
    assert _differing(expected, exact, corpus) == []
    # The cache must not change anything: a second pass over the corpus agrees too.
    assert [ours.tokenize(line) for line in corpus] == expected
    # Same ids through the same vocab, and straight to ids (cold, then cached chunks).
    expected_ids = [reference.convert_tokens_to_ids(t) for t in expected]
    assert [ours.convert_tokens_to_ids(t) for t in fast[:200]] == expected_ids[:200]
    for _ in range(2):
        assert [ours.tokenize_to_ids(line) for line in corpus] == expected_ids
    fresh = tokenization.FullTokenizer(vocab_file, do_lower_case=do_lower_case)
    assert [fresh.tokenize_to_ids(line) for line in corpus] == expected_ids


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_basic_tokenizer_matches_original_on_every_code_point(original, do_lower_case):
    """Every assigned code point, glued to a neighbour and between spaces, in both modes.

    Unassigned (Cn) and private-use (Co) code points all have the same properties for
    every predicate involved, so one in 50 of them is enough (this keeps the test fast).
    """
    reference = original.BasicTokenizer(do_lower_case=do_lower_case)
    fast = tokenization._fast_basic()
    code_points = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF and (
        c % 50 == 0 or unicodedata.category(chr(c)) not in ("Cn", "Co"))]
    assert len(code_points) > 140_000
    chunk = 512
    mismatches = []
    for start in range(0, len(code_points), chunk):
        part = code_points[start:start + chunk]
        line = "a" + " a".join(part) + "Σ"
        if fast.tokenize(line, do_lower_case) != reference.tokenize(line):
            mismatches.append(start)
    assert mismatches == []


# --- The fast path's character tables: filled on first sight, never written anywhere ----


def test_tables_fill_with_the_characters_seen_and_nothing_is_written(tmp_path, monkeypatch):
    """The tables hold only what the text used, and tokenizing writes no file: not in the
    user's home, not in a cache directory (the tables used to be cached in ~/.cache)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.delenv("BERT_KERAS3_CACHE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tokenization, "_fast_basic",
                        functools.lru_cache(maxsize=1)(tokenization._FastBasic))
    fast = tokenization._fast_basic()
    assert fast.tokenize("Hello, World!\x07 it's\tme", True) == [
        "hello", ",", "world", "!", "it", "'", "s", "me"]
    assert fast.tokenize("Naïve Ωmega 中文, «ok»", True) == [
        "naive", "ωmega", "中", "文", ",", "«", "ok", "»"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[UNK]\nnaive\n", encoding="utf-8")
    assert tokenization.FullTokenizer(str(vocab)).tokenize("Naïve\u00a0naïve") == [
        "naive", "naive"]
    assert ord("Ω") in fast.clean_table and ord("«") in fast.split_table
    assert len(fast.clean_table) < 100 and len(fast.split_table) < 100
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["home", "vocab.txt"]


def test_fast_equals_exact_on_random_strings(vocab_file):
    """Property test: random strings from all planes (lone surrogates included)."""
    rng = random.Random(SEED + 2)
    for do_lower_case in (True, False):
        tokenizer = tokenization.FullTokenizer(vocab_file, do_lower_case=do_lower_case)
        for _ in range(2000):
            text = "".join(
                _random_code_point(rng, surrogates=True) if rng.random() < 0.5 else _atom(rng)
                for _ in range(rng.randint(0, 30)))
            assert tokenizer.tokenize(text) == tokenizer.tokenize_exact(text), repr(text)
            assert tokenizer.tokenize_to_ids(text) == tokenizer.convert_tokens_to_ids(
                tokenizer.tokenize_exact(text)), repr(text)


@pytest.mark.parametrize("text, lower, expected", [
    ("UNwant\u00e9d,running", True, ["un", "##want", "##ed", ",", "runn", "##ing"]),
    ("ΟΔΥΣΣΕΥΣ ΑΣ.", True, ["οδυσσευς", "ας", "."]),
    ("\u1fefx", True, ["`", "x"]),
    ("a\u200bb\u00adc \x00\ufffd", False, ["abc"]),
    ("[MASK]", True, ["[", "mask", "]"]),
])
def test_known_cases_against_original(tmp_path, original, text, lower, expected):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##want", "##ed", ",",
              "runn", "##ing", "οδυσσευς", "ας", ".", "`", "x", "abc", "[", "mask", "]"]
    vocab = tmp_path / "v.txt"
    vocab.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    assert original.FullTokenizer(str(vocab), lower).tokenize(text) == expected
    ours = tokenization.FullTokenizer(str(vocab), lower)
    assert ours.tokenize(text) == expected
    assert ours.tokenize_exact(text) == expected
    assert ours.tokenize(text.encode("utf-8")) == expected


def test_long_words_and_wordpiece_bound(tmp_path, original):
    tokens = ["[UNK]", "a", "##a", "aaaa", "##aaa", "b" * 30, "c" * 201, "c" * 200, "d" * 201]
    vocab = tmp_path / "v.txt"
    vocab.write_text("\n".join(tokens), encoding="utf-8")
    ours = tokenization.FullTokenizer(str(vocab), True)
    reference = original.FullTokenizer(str(vocab), True)
    for n in list(range(0, 260, 7)) + [199, 200, 201, 202]:
        for text in ("a" * n, "b" * n, "a" * n + "b", "ab" * n, "c" * n, "d" * n):
            assert ours.tokenize(text) == reference.tokenize(text), (n, text[:10])
    assert ours.tokenize("a" * 200) == ["aaaa"] + ["##aaa"] * 65 + ["##a"]
    assert ours.tokenize("a" * 201) == ["[UNK]"]


VOCAB_FILES = {
    "crlf": b"[PAD]\r\n[UNK]\r\nthe\r\n##s\r\n",
    "trailing_spaces": b"[UNK]  \n the\t\n\xc2\xa0x\xe3\x80\x80\n",
    "blank_lines": b"[UNK]\n\n\nthe\n\n",
    "duplicates": b"[UNK]\nthe\na\nthe\n[UNK]\nb\n",
    "no_final_newline": b"[UNK]\nthe",
    "cr_inside": "[UNK]\nab\rcd\n\r\r\nx\u2028y\n".encode("utf-8"),
    "empty": b"",
}


@pytest.mark.parametrize("name", sorted(VOCAB_FILES))
def test_load_vocab_matches_original(tmp_path, original, name):
    path = tmp_path / "vocab.txt"
    path.write_bytes(VOCAB_FILES[name])
    assert list(tokenization.load_vocab(str(path)).items()) == list(
        original.load_vocab(str(path)).items())


def test_vocab_errors(tmp_path):
    with pytest.raises(tokenization.VocabError, match="cannot read"):
        tokenization.load_vocab(str(tmp_path / "missing.txt"))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"[UNK]\nok\n\xff\xfe\n")
    with pytest.raises(tokenization.VocabError, match=r"bad.txt:3: .*UTF-8"):
        tokenization.load_vocab(str(bad))
    partial = tmp_path / "partial.txt"
    partial.write_text("[UNK]\n[CLS]\nthe\n", encoding="utf-8")
    with pytest.raises(tokenization.VocabError, match=r"\[SEP\], \[MASK\]"):
        tokenization.check_vocab(tokenization.load_vocab(str(partial)), str(partial))


def test_word_cache_is_bounded(tiny_vocab_file, monkeypatch):
    tokenizer = tokenization.FullTokenizer(tiny_vocab_file, True)
    monkeypatch.setattr(tokenizer, "MAX_CACHED_WORDS", 10)
    for i in range(100):
        assert tokenizer.tokenize(f"cat{i} dog") == tokenizer.tokenize_exact(f"cat{i} dog")
        assert tokenizer.tokenize_to_ids(f"dog cat{i}") == tokenizer.convert_tokens_to_ids(
            tokenizer.tokenize_exact(f"dog cat{i}"))
    assert len(tokenizer._word_cache) <= 10 and len(tokenizer._chunk_cache) <= 10
    assert len(tokenizer._chunk_id_cache) <= 10


# --- CLI (data_prep/bert_tokenize.py) ---------------------------------------------------


def _run_cli(args, stdin: bytes):
    """bert_tokenize in this process: (status, stdout bytes, stderr text)."""
    result = call_main("bert_tokenize", args, stdin=stdin)
    return result.code, result.stdout.encode("utf-8"), result.stderr


@pytest.mark.parametrize("do_lower_case", ["true", "false"])
def test_cli_matches_original_line_by_line(corpus, vocab_file, original, do_lower_case):
    lines = corpus[:600] + ["", "a\rb", "\r", "   "]
    reference = original.FullTokenizer(vocab_file, do_lower_case=do_lower_case == "true")
    expected = "".join(" ".join(reference.tokenize(line)) + "\n" for line in lines)
    status, out, err = _run_cli(
        [f"--vocab_file={vocab_file}", f"--do_lower_case={do_lower_case}"],
        "\n".join(lines).encode("utf-8") + b"\n")
    assert status == 0, err
    assert out.decode("utf-8") == expected


def test_cli_last_line_without_newline(tiny_vocab_file):
    status, out, err = _run_cli([f"--vocab_file={tiny_vocab_file}"], b"The cat.\nsat\r on")
    assert status == 0, err
    assert out == b"the cat .\nsat on\n"


def test_cli_invalid_utf8_names_the_line(tiny_vocab_file):
    status, out, err = _run_cli([f"--vocab_file={tiny_vocab_file}"],
                                b"ok\nfine\nbad \xff byte\nmore\n")
    # ok\n (3 bytes), fine\n (5), then "bad " (4): the bad byte is at offset 12.
    assert status == 1
    assert err.startswith("bert_tokenize: error: stdin:3: invalid UTF-8 at byte offset 12 "
                          "(invalid start byte)") and err.count("\n") == 1, err
    tokenizer = tokenization.FullTokenizer(tiny_vocab_file, True)
    expected = " ".join(tokenizer.tokenize("ok")) + "\n" + " ".join(tokenizer.tokenize("fine"))
    assert out.decode() == expected + "\n"  # lines before the bad one are kept


def test_cli_bad_input_is_one_error_line(tmp_path):
    no_mask = tmp_path / "no_mask.txt"
    no_mask.write_text("[UNK]\n[CLS]\n[SEP]\nthe\n", encoding="utf-8")
    cases = [([f"--vocab_file={no_mask}"], ["[MASK]", "no_mask.txt"]),
             ([f"--vocab_file={tmp_path / 'nope.txt'}"], ["nope.txt"]),
             ([], ["--vocab_file is required"]),
             ([f"--vocab_file={no_mask}", "extra"], ["unexpected arguments ['extra']"]),
             (["--no_such_flag=1"], ["no_such_flag"])]
    for args, needles in cases:
        status, out, err = _run_cli(args, b"the\n")
        assert status == 1 and out == b"", args
        assert err.startswith("bert_tokenize: error: ") and err.count("\n") == 1, err
        assert all(needle in err for needle in needles), err


def test_cli_as_a_command(tiny_vocab_file):
    """`python -m data_prep.bert_tokenize`: the exit status of the process itself."""
    root = tokenization.__file__.rsplit("/data_prep/", 1)[0]
    command = [sys.executable, "-m", "data_prep.bert_tokenize"]
    done = subprocess.run([*command, f"--vocab_file={tiny_vocab_file}"], input=b"The cat.\n",
                          capture_output=True, timeout=60, cwd=root, check=False)
    assert (done.returncode, done.stdout) == (0, b"the cat .\n"), done.stderr.decode()
    done = subprocess.run(command, input=b"x\n", capture_output=True, timeout=60, cwd=root,
                          check=False)
    assert done.returncode == 1
    assert done.stderr == b"bert_tokenize: error: --vocab_file is required\n"


def test_importing_defines_no_flags():
    """Other CLIs import these modules and define flags with the same names."""
    code = ("from absl import flags; import data_prep.tokenization, data_prep.bert_tokenize; "
            "assert 'vocab_file' not in flags.FLAGS and 'do_lower_case' not in flags.FLAGS")
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                            timeout=60, cwd=tokenization.__file__.rsplit("/data_prep/", 1)[0])
    assert result.returncode == 0, result.stderr.decode()
