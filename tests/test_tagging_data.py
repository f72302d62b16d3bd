"""tasks.tagging.data: the CoNLL reader (formats and bad input), labels and tag schemes,
first-piece label alignment, windows of long sentences (no word lost, SQuAD's max-context
rule), document context, the TFRecord cache and the prediction files."""

import json

import numpy as np
import pytest

from data_prep import tokenization
from tasks.common.windows import doc_spans_for
from tasks.tagging import data as D
from tasks.tagging import metrics as M
from tasks.tagging.task import stitch_predictions
from tests.conftest import write_vocab

CONLL2003 = """-DOCSTART- -X- -X- O

EU NNP B-NP I-ORG
rejects VBZ B-VP O
German JJ B-NP I-MISC
call NN I-NP O
. . O O

Peter NNP B-NP I-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP B-NP I-LOC
1996-08-22 CD I-NP O
"""


def write(tmp_path, name, text, encoding="utf-8"):
    path = tmp_path / name
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    vocab = write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")
    return tokenization.FullTokenizer(vocab, do_lower_case=True)


# --- reading ----------------------------------------------------------------------------


def test_reads_conll2003_with_documents(tmp_path):
    conll = D.read_conll(write(tmp_path, "eng.train", CONLL2003))
    assert conll.num_columns == 4 and conll.has_tags
    kinds = [type(item).__name__ for item in conll.items]
    assert kinds == ["DocumentStart", "Sentence", "Sentence", "DocumentStart", "Sentence"]
    first, second, third = conll.sentences
    assert first.words == ("EU", "rejects", "German", "call", ".")
    assert first.tags == ("I-ORG", "O", "I-MISC", "O", "O")  # the LAST column
    assert (first.line, second.line, third.line) == (3, 9, 14)
    assert (first.document, second.document, third.document) == (1, 1, 2)
    assert conll.num_words == 9


def test_tabs_crlf_bom_and_repeated_blank_lines(tmp_path):
    text = "\ufeffa\tO\r\nb \t B-PER\r\n\r\n\r\n\r\nc O  \r\n"
    conll = D.read_conll(write(tmp_path, "x.txt", text))
    assert [s.words for s in conll.sentences] == [("a", "b"), ("c",)]
    assert [s.tags for s in conll.sentences] == [("O", "B-PER"), ("O",)]


def test_a_file_without_tags_reads_as_O_when_allowed(tmp_path):
    path = write(tmp_path, "test.txt", "-DOCSTART-\n\nPeter\nsat\n\nhome\n")
    conll = D.read_conll(path, require_tags=False)
    assert not conll.has_tags and conll.sentences[0].tags == ("O", "O")
    with pytest.raises(D.DataFormatError, match=r"test.txt:3: one column"):
        D.read_conll(path)


def test_wrong_column_count_names_file_and_line(tmp_path):
    path = write(tmp_path, "dev.txt", "-DOCSTART- -X- O\n\na NN O\nb NN O\n\nc O\n")
    with pytest.raises(D.DataFormatError,
                       match=r"dev.txt:6: 2 columns, but the first word line \(3\) has 3"):
        D.read_conll(path)


def test_invalid_utf8_and_empty_files(tmp_path):
    path = write(tmp_path, "latin.txt", "a O\nM\u00fcller I-PER\n", encoding="latin-1")
    with pytest.raises(D.DataFormatError, match=r"latin.txt:2: not valid UTF-8"):
        D.read_conll(path)
    for text in ("", "\n\n", "-DOCSTART- -X- -X- O\n\n"):
        with pytest.raises(D.DataFormatError, match="no sentences"):
            D.read_conll(write(tmp_path, "empty.txt", text))


def test_split_file_names(tmp_path):
    for name in ("eng.train", "valid.txt", "eng.testb"):
        write(tmp_path, name, "a O\n")
    assert D.find_split_file(str(tmp_path), "train").endswith("eng.train")
    assert D.find_split_file(str(tmp_path), "dev").endswith("valid.txt")
    assert D.find_split_file(str(tmp_path), "test").endswith("eng.testb")
    write(tmp_path, "dev.txt", "a O\n")  # ours first
    assert D.find_split_file(str(tmp_path), "dev").endswith("dev.txt")
    with pytest.raises(D.DataFormatError, match="no train file; looked for train.txt, "
                                                "eng.train"):
        D.find_split_file(str(tmp_path / "missing"), "train")


# --- labels and schemes -------------------------------------------------------------------


def test_labels_O_first_then_sorted_and_unknown_tags(tmp_path):
    conll = D.read_conll(write(tmp_path, "eng.train", CONLL2003))
    labels = D.labels_from_sentences(conll)
    assert labels == ["O", "I-LOC", "I-MISC", "I-ORG", "I-PER"]
    D.check_tags(conll, labels, "train")
    with pytest.raises(D.DataFormatError,
                       match=r"eng.train:5: tag 'I-MISC' is not in the label list"):
        D.check_tags(conll, ["O", "I-ORG", "I-PER", "I-LOC"], "--label_list")
    assert D.parse_label_list(" O, B-X ,I-X") == ("O", "B-X", "I-X")
    with pytest.raises(ValueError, match="repeats"):
        D.parse_label_list("O,B-X,O")
    with pytest.raises(ValueError, match="empty label"):
        D.parse_label_list("O,,B-X")


def sentences_of(*tag_strings):
    return [D.Sentence(tuple("w" * len(t.split())), tuple(t.split()), 0, 1)
            for t in tag_strings]


def test_detect_tag_scheme():
    iob1 = sentences_of("I-PER I-PER O B-PER", "I-LOC B-LOC")  # CoNLL-2003 as shipped
    iob2 = sentences_of("B-PER I-PER O B-PER", "B-LOC B-LOC I-LOC")
    assert D.detect_tag_scheme(["O", "B-LOC", "B-PER", "I-LOC", "I-PER"], iob1) == "IOB1"
    assert D.detect_tag_scheme(["O", "B-LOC", "B-PER", "I-LOC", "I-PER"], iob2) == "IOB2"
    assert D.detect_tag_scheme(["O", "I-PER"]) == "IOB1"
    assert D.detect_tag_scheme(["O", "B-PER", "I-PER", "E-PER", "S-PER"]) == "IOBES"
    assert D.detect_tag_scheme(["O", "I-NP", "E-NP"]) == "IOE"
    assert D.detect_tag_scheme(["NN", "VBZ", "DT"]) == "none"  # POS: not chunk tags
    assert not D.is_chunk_scheme("none") and D.is_chunk_scheme("IOB1")


# Issue 22: B-/I- chunks, a stray I- and S- tags in one file were recorded as IOBES silently.
MIXED = """Anna B-PER
Smith I-PER
met O
Oslo I-LOC
and O
IBM S-ORG
in O
New B-LOC
York E-LOC

Bob B-PER
"""


def _warnings(caplog, path):
    return [r.getMessage() for r in caplog.records
            if r.levelname == "WARNING" and str(path) in r.getMessage()]


def test_mixed_tag_schemes_are_named_by_line(tmp_path, caplog):
    conll = D.read_conll(write(tmp_path, "train.txt", MIXED))
    scheme = D.detect_tag_scheme(D.labels_from_sentences(conll), conll.sentences)
    assert scheme == "IOBES"
    assert D.tag_scheme_breaks(conll, scheme) == [
        (2, "I-PER before O (IOBES closes a chunk with E-; one word: S-)"),
        (4, "I-LOC after O (IOBES opens a chunk with B-, or S- alone) and before O "
            "(IOBES closes a chunk with E-; one word: S-)"),
        (11, "B-PER before the sentence end (IOBES closes a chunk with E-; one word: S-)"),
    ]
    with caplog.at_level("WARNING"):
        assert D.warn_tag_scheme_breaks(conll, scheme, shown=2) == 3
    (message,) = _warnings(caplog, conll.path)
    assert "3 tag(s) do not follow the IOBES scheme" in message
    assert "line 2: I-PER before O" in message and "line 4: I-LOC after O" in message
    assert "line 11" not in message and message.endswith(" ...")
    # An IOB2 file with a chunk opened by I- (a dev file of an IOB2 run).
    dev = D.read_conll(write(tmp_path, "dev.txt", "A B-PER\nB I-PER\nC O\nD I-PER\n"))
    assert D.tag_scheme_breaks(dev, "IOB2") == [
        (4, "I-PER after O (IOB2 opens every chunk with B-)")]
    # Consistent files, IOB1 (I- opens chunks), IOE, POS tags and untagged files: nothing.
    consistent = D.read_conll(write(tmp_path, "ok.txt", "A B-PER\nB E-PER\nC S-LOC\nD O\n"))
    assert D.tag_scheme_breaks(consistent, "IOBES") == []
    for scheme in ("IOB1", "IOE", "none"):
        assert D.tag_scheme_breaks(conll, scheme) == []
    words_only = D.read_conll(write(tmp_path, "test.txt", "A\nB\n"), require_tags=False)
    assert D.tag_scheme_breaks(words_only, "IOBES") == []


def test_the_tagging_family_warns_about_each_mixed_file(tmp_path, caplog):
    """run_ner's task family: the training file when its tags give the labels, and the
    dev file against the training file's scheme."""
    import types

    from tasks.tagging.task import TaggingFamily, TaggingSettings

    (tmp_path / "data").mkdir()
    train = write(tmp_path / "data", "train.txt", MIXED)
    dev = write(tmp_path / "data", "dev.txt", "Ann B-LOC\nOslo E-LOC\nmet O\nBo I-PER\n")
    with caplog.at_level("WARNING"):
        family = TaggingFamily(TaggingSettings(str(tmp_path / "data")), 16)
    assert family.tag_scheme == "IOBES"
    (message,) = _warnings(caplog, train)
    assert "3 tag(s)" in message and "line 2: I-PER" in message
    run = types.SimpleNamespace(
        do_train=False, do_eval=True, do_predict=False, init_checkpoint=None,
        vocab_file=write_vocab(tmp_path / "vocab.txt"), do_lower_case=True,
        output_dir=str(tmp_path / "out"), max_seq_length=16, eval_batch_size=2)
    (tmp_path / "out").mkdir()
    with caplog.at_level("WARNING"):
        family.prepare(run)
    (message,) = _warnings(caplog, dev)
    assert "1 tag(s) do not follow the IOBES scheme" in message
    assert "line 4: I-PER after O" in message


# --- windows ---------------------------------------------------------------------------


def conll_of(*sentences, document_breaks=()):
    """A ConllFile from word/TAG strings; a DocumentStart before the sentence indices in
    document_breaks."""
    items, document = [], 0
    for i, text in enumerate(sentences):
        if i in document_breaks:
            items.append(D.DocumentStart(0))
            document += 1
        pairs = [token.rsplit("/", 1) for token in text.split()]
        items.append(D.Sentence(tuple(w for w, _ in pairs), tuple(t for _, t in pairs),
                                document, i))
    return D.ConllFile("mem.txt", items, 2, True)


LABELS = ["O", "B-PER", "I-PER", "I-LOC"]


def test_label_on_the_first_piece_only(tokenizer):
    conll = conll_of("unaffable/B-PER dogs/I-PER sat/O \u200d/I-LOC")
    [window] = D.sentence_windows(conll, tokenizer, LABELS, D.WindowConfig(16),
                                  is_training=True)
    pieces = tokenizer.convert_ids_to_tokens(window.input_ids[:window.input_mask.count(1)])
    # A word that tokenizes to nothing (a lone zero-width joiner) becomes [UNK].
    assert pieces == ["[CLS]", "un", "##aff", "##able", "dog", "##s", "sat", "[UNK]", "[SEP]"]
    assert window.label_weights[:9] == [0, 1, 0, 0, 1, 0, 1, 1, 0]
    assert window.label_ids[:9] == [0, 1, 0, 0, 2, 0, 0, 3, 0]
    assert window.word_index[:9] == [0, 0, 0, 0, 1, 0, 2, 3, 0]
    assert window.segment_ids == [0] * 16 and len(window.input_ids) == 16


def _best_window_by_brute_force(spans, piece):
    """SQuAD's rule, written out: the window where the piece has the most context
    (min(left, right) + 0.01 * length), the first on ties."""
    scores = [min(piece - s, s + n - 1 - piece) + 0.01 * n if s <= piece < s + n else -1
              for s, n in spans]
    return int(np.argmax(scores))


@pytest.mark.parametrize("stride", [None, 1, 3, 50])
def test_long_sentence_windows_lose_no_word(tokenizer, stride):
    words = ["unaffable", "cat", "dogs", "sat", "running", "mat", "red", "xyz", "far"] * 4
    tags = ["B-PER", "I-PER", "O", "I-LOC"] * 9
    conll = conll_of(" ".join(f"{w}/{t}" for w, t in zip(words, tags)))
    config = D.WindowConfig(max_seq_length=12, doc_stride=stride)  # 10 pieces a window
    pieces = sum(len(tokenizer.tokenize(w)) for w in words)
    first_piece = np.cumsum([0] + [len(tokenizer.tokenize(w)) for w in words])[:-1]
    spans = doc_spans_for(pieces, config.room, config.stride)
    assert len(spans) > 3
    scored = {}
    for window in D.sentence_windows(conll, tokenizer, LABELS, config, is_training=False):
        for position in np.flatnonzero(window.label_weights):
            word = window.word_index[position]
            assert word not in scored, "a word scored twice"
            scored[word] = window
            assert window.label_ids[position] == LABELS.index(tags[word])
    assert sorted(scored) == list(range(len(words)))  # every word, exactly once
    windows = list(D.sentence_windows(conll, tokenizer, LABELS, config, is_training=False))
    for word, window in scored.items():
        expected = _best_window_by_brute_force(spans, int(first_piece[word]))
        assert windows.index(window) == expected
    # Training labels each word in every window holding its first piece.
    training = list(D.sentence_windows(conll, tokenizer, LABELS, config, is_training=True))
    for span, window in zip(spans, training):
        inside = [w for w, p in enumerate(first_piece) if span[0] <= p < span[0] + span[1]]
        assert sorted(window.word_index[p] for p in np.flatnonzero(window.label_weights)) \
            == inside


def test_document_context_fills_from_the_same_document_only(tokenizer):
    conll = conll_of("cat/I-PER sat/O", "on/O the/O mat/I-LOC", "dog/I-PER ran/O",
                     "far/O away/O", document_breaks=(3,))
    ids = {w: tokenizer.convert_tokens_to_ids([w])[0]
           for w in ("cat", "sat", "on", "the", "mat", "dog", "ran", "far", "away")}
    with_context = list(D.sentence_windows(conll, tokenizer, LABELS,
                                           D.WindowConfig(8, document_context=True),
                                           is_training=True))
    alone = list(D.sentence_windows(conll, tokenizer, LABELS, D.WindowConfig(8),
                                    is_training=True))

    def words_of(window):
        inverse = {v: k for k, v in ids.items()}
        return [inverse.get(i, i) for i in window.input_ids[1:window.input_mask.count(1) - 1]]

    # Sentence 1 ("on the mat"): 3 pieces of room, 1 before ("sat"), 2 after ("dog ran").
    assert words_of(with_context[1]) == ["sat", "on", "the", "mat", "dog", "ran"]
    assert [with_context[1].word_index[p] for p in np.flatnonzero(
        with_context[1].label_weights)] == [0, 1, 2]
    assert np.flatnonzero(with_context[1].label_weights).tolist() == [2, 3, 4]  # [CLS] sat
    # Sentence 0 has nothing before it: the room goes to what follows.
    assert words_of(with_context[0]) == ["cat", "sat", "on", "the", "mat", "dog"]
    # Sentence 2 is the last of its document: "far away" (document 1) never joins it.
    assert words_of(with_context[2]) == ["sat", "on", "the", "mat", "dog", "ran"]
    assert words_of(with_context[3]) == ["far", "away"]
    assert [words_of(w) for w in alone] == [["cat", "sat"], ["on", "the", "mat"],
                                            ["dog", "ran"], ["far", "away"]]


def test_context_sizes_balance_both_sides():
    assert D._context_sizes(10, 100, 100) == (5, 5)
    assert D._context_sizes(10, 2, 100) == (2, 8)
    assert D._context_sizes(10, 100, 1) == (9, 1)
    assert D._context_sizes(11, 100, 100) == (5, 6)
    assert D._context_sizes(0, 100, 100) == (0, 0)


def test_window_config_checks():
    with pytest.raises(ValueError, match="max_seq_length=2"):
        D.WindowConfig(2)
    with pytest.raises(ValueError, match="doc_stride=0"):
        D.WindowConfig(16, doc_stride=0)
    assert D.WindowConfig(128).stride == 63


# --- records and prediction files -------------------------------------------------------


def test_records_round_trip_and_cache(tmp_path, tokenizer):
    import tensorflow as tf

    vocab = write_vocab(tmp_path / "vocab.txt")
    conll = D.read_conll(write(tmp_path, "dev.txt", CONLL2003))
    labels = D.labels_from_sentences(conll)
    config = D.WindowConfig(max_seq_length=6, document_context=True)
    kwargs = dict(vocab_file=vocab, do_lower_case=True, config=config, label_list=labels,
                  is_training=False)
    prepared = D.prepare_tagging_records(conll, "dev", str(tmp_path / "out"), **kwargs)
    assert not prepared.reused and prepared.num_sentences == 3
    expected = list(D.sentence_windows(conll, tokenizer, labels, config, is_training=False))
    assert prepared.metadata["num_windows"] == len(expected) > 3  # long sentences split
    parse = D.TAGGING_SCHEMA.parser(max_seq_length=6)
    records = [parse(r) for r in tf.data.TFRecordDataset(prepared.record_file)]
    assert len(records) == len(expected)
    for record, feature in zip(records, expected):
        for name, values in D.record_values(feature).items():
            assert record[name].numpy().tolist() == values, name
    again = D.prepare_tagging_records(conll, "dev", str(tmp_path / "out"), **kwargs)
    assert again.reused
    changed = D.prepare_tagging_records(conll, "dev", str(tmp_path / "out"),
                                        **{**kwargs, "label_list": labels[::-1]})
    assert not changed.reused
    with open(changed.metadata_file) as f:
        meta = json.load(f)
    assert meta["label_list"] == labels[::-1]


def test_stitching_puts_each_word_back_once(tmp_path, tokenizer):
    conll = D.read_conll(write(tmp_path, "dev.txt", CONLL2003))
    labels = D.labels_from_sentences(conll)
    windows = list(D.sentence_windows(conll, tokenizer, labels, D.WindowConfig(5),
                                      is_training=False))
    seq = 5
    # Logits that point at the gold label where a window scores a word, noise elsewhere.
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(len(windows), seq, len(labels)))
    for i, w in enumerate(windows):
        for p in np.flatnonzero(w.label_weights):
            logits[i, p, w.label_ids[p]] += 20.0
    out = {"logits": logits,
           "sentence_index": np.array([[w.sentence_index] for w in windows]),
           **{k: np.array([getattr(w, k) for w in windows])
              for k in ("word_index", "label_weights", "label_ids")}}
    predicted, nll = stitch_predictions(conll, out, labels)
    assert predicted == [list(s.tags) for s in conll.sentences]
    assert nll.shape == (conll.num_words,) and (nll < 1e-3).all()
    out["label_weights"] = out["label_weights"].copy()
    out["label_weights"][0, np.flatnonzero(out["label_weights"][0])[0]] = 0
    with pytest.raises(RuntimeError, match="1 of 9 words have no prediction"):
        stitch_predictions(conll, out, labels)


def test_prediction_file_is_conllevals_input(tmp_path):
    conll = D.read_conll(write(tmp_path, "test.txt", CONLL2003))
    predicted = [["I-ORG", "O", "O", "O", "O"], ["I-PER", "B-PER"], ["I-LOC", "O"]]
    text = D.predictions_text(conll, predicted)
    assert text.splitlines()[:5] == ["-DOCSTART- O O", "", "EU I-ORG I-ORG", "rejects O O",
                                     "German I-MISC O"]
    assert text.count("-DOCSTART- O O\n\n") == 2 and text.endswith("1996-08-22 O O\n\n")
    from_text = M.evaluate_lines(text.splitlines(True))
    direct = M.evaluate(D.evaluation_sequence(conll, predicted))
    assert from_text == direct
    assert (direct.tokens, direct.gold_chunks, direct.correct_chunks) == (11, 4, 2)
    with pytest.raises(ValueError, match="1 predictions for 2 words"):
        D.predictions_text(conll, [predicted[0], ["O"], predicted[2]])
