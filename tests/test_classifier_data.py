"""Classifier data: GLUE/XNLI/custom readers, features vs the original, TFRecord cache, bad rows."""

import ast
import collections
import csv
import functools
import json
import os
import pathlib
import types

import pytest

from tasks.classification import data as cd
from tasks.classification import examples as ce
from tasks.classification import processors
from tasks.common import pairs
from data_prep import tokenization
from data_prep.cli import UserError
from original_bert import original_module

# --- Reference: the original run_classifier's readers and conversion ---------------------

_ORIGINAL_NAMES = {
    "InputExample", "PaddingInputExample", "InputFeatures", "DataProcessor", "XnliProcessor",
    "MnliProcessor", "MrpcProcessor", "ColaProcessor", "convert_single_example",
    "file_based_convert_examples_to_features", "_truncate_seq_pair",
}


@functools.lru_cache(maxsize=None)
def original_classifier():
    """The original run_classifier's data classes and functions.

    Importing bert.run_classifier needs tensorflow.contrib (via bert.modeling) and defines
    absl flags that clash with other original modules, so only the definitions the data
    side needs are compiled from its source, against tf.compat.v1 and bert.tokenization.
    """
    import tensorflow.compat.v1 as tf1

    original_tokenization = original_module("tokenization")
    path = pathlib.Path(original_tokenization.__file__).with_name("run_classifier.py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    body = [node for node in tree.body
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in _ORIGINAL_NAMES]
    assert {node.name for node in body} == _ORIGINAL_NAMES
    namespace = {"tf": tf1, "tokenization": original_tokenization, "csv": csv, "os": os,
                 "collections": collections}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    namespace["original_tokenization"] = original_tokenization
    return types.SimpleNamespace(**namespace)


def as_tuples(examples):
    return [(e.guid, e.text_a, e.text_b, e.label) for e in examples]


# --- Tiny data directories in the GLUE layouts --------------------------------------------


def write_tsv(path, rows, header=None, bom=False):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ([("\ufeff" if bom else "") + "\t".join(header)] if header else [])
    lines += ["\t".join(str(field) for field in row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


MRPC_HEADER = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
MNLI_PREFIX = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
               "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
               "sentence2"]
XNLI_HEADER = ["language", "gold_label", "sentence1_binary_parse", "sentence2_binary_parse",
               "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "promptID",
               "pairID", "genre", "label1", "label2", "label3", "label4", "label5",
               "sentence1_tokenized", "sentence2_tokenized", "match"]
STSB_HEADER = ["index", "genre", "filename", "year", "old_index", "source1", "source2",
               "sentence1", "sentence2"]


def mnli_row(index, s1, s2, labels=()):
    return [index, 31193, f"{31193}n", "government", "( ( x ) )", "( y )", "(ROOT (S x))",
            "(ROOT (S y))", s1, s2, *labels]


def write_cola(d):
    rows = [["gj04", 1, "", "Our friends won't buy this analysis, let alone the next one."],
            ["gj04", 0, "*", 'They drank the pub "dry".'],
            ["cj99", 1, "", "The café's crème brûlée is naïve."]]
    write_tsv(d / "train.tsv", rows)
    write_tsv(d / "dev.tsv", rows[:2])
    write_tsv(d / "test.tsv", [[0, "Bill whistled past the house."], [1, 'A "quoted" one.']],
              header=["index", "sentence"])


def write_mrpc(d):
    rows = [[1, 702876, 702977, 'Amrozi accused his brother , whom he called " the witness " .',
             'Referring to him as only " the witness " , Amrozi accused his brother .'],
            [0, 2108705, 2108831, "Yucaipa owned Dominick 's before selling the chain .",
             "Yucaipa bought Dominick 's in 1995 for $ 693 million — café."]]
    write_tsv(d / "train.tsv", rows, header=MRPC_HEADER, bom=True)
    write_tsv(d / "dev.tsv", rows[::-1], header=MRPC_HEADER, bom=True)
    write_tsv(d / "test.tsv", [[0, 1089874, 1089925, "PCCW 's chief operating officer .",
                                'Current "Chief" Operating Officer .']],
              header=["index", "#1 ID", "#2 ID", "#1 String", "#2 String"])


def write_mnli(d):
    train = [mnli_row(0, "Conceptually cream skimming has two basic dimensions.",
                      'Product and "geography" are what make it work.', ["neutral", "neutral"]),
             mnli_row(1, "you know during the season i guess", "You lose the things.",
                      ["entailment", "entailment"])]
    write_tsv(d / "train.tsv", train, header=MNLI_PREFIX + ["label1", "gold_label"])
    dev_header = MNLI_PREFIX + [f"label{i}" for i in range(1, 6)] + ["gold_label"]
    dev = [mnli_row(7, "The new rights are nice enough", "Everyone really likes them.",
                    ["neutral", "entailment", "neutral", "neutral", "neutral", "neutral"]),
           mnli_row(9, "Naïve \"résumé\" text", "It is not.", ["contradiction"] * 6)]
    write_tsv(d / "dev_matched.tsv", dev, header=dev_header)
    write_tsv(d / "dev_mismatched.tsv", dev[::-1], header=dev_header)
    test = [mnli_row(0, "Hierbas, ans seco, ans dulce", "Hierbas is a name."),
            mnli_row(1, "The extinction is near", 'A "big" one.')]
    write_tsv(d / "test_matched.tsv", test, header=MNLI_PREFIX)
    write_tsv(d / "test_mismatched.tsv", test[:1], header=MNLI_PREFIX)


def xnli_row(language, label, s1, s2):
    return [language, label, "( a )", "( b )", "(ROOT a)", "(ROOT b)", s1, s2, 1, "1e", "fiction",
            label, label, label, label, label, s1, s2, "True"]


def write_xnli(d, nested=False):
    mt_dir = d / "XNLI-MT-1.0" if nested else d
    xnli_dir = d / "XNLI-1.0" if nested else d
    write_tsv(mt_dir / "multinli" / "multinli.train.de.tsv",
              [["Konzeptionell hat \"Rahm\" zwei Dimensionen .", "Produkt und Geographie .",
                "neutral"],
               ["Sie wissen , während der Saison", "Sie verlieren .", "contradictory"]],
              header=["premise", "hypo", "label"])
    rows = [xnli_row("en", "neutral", "He said, Mama, I'm home.", "He didn't say a word."),
            xnli_row("de", "contradiction", "Und er sagte: Mama, ich bin daheim.", "Kein Wort."),
            xnli_row("zh", "entailment", "他说，妈妈，我回来了。", "他说了话。"),
            xnli_row("de", "entailment", "Ich wusste nicht, was ich tun sollte.",
                     "Ich war ratlos.")]
    write_tsv(xnli_dir / "xnli.dev.tsv", rows, header=XNLI_HEADER)
    write_tsv(xnli_dir / "xnli.test.tsv", rows[::-1], header=XNLI_HEADER)


def write_sst2(d):
    rows = [["hide new secretions from the parental units ", 0],
            ['contains no wit , only "labored" gags ', 0],
            ["that loves its characters — naïve ", 1]]
    write_tsv(d / "train.tsv", rows, header=["sentence", "label"])
    write_tsv(d / "dev.tsv", rows[1:], header=["sentence", "label"])
    write_tsv(d / "test.tsv", [[0, "uneasy mishmash of styles "], [1, "a \"charming\" journey "]],
              header=["index", "sentence"])


def write_stsb(d):
    rows = [[0, "main-captions", "MSRvid", "2012test", "0001", "none", "none",
             "A plane is taking off.", "An air plane is taking off.", "5.000"],
            [1, "main-captions", "MSRvid", "2012test", "0004", "none", "none",
             'A man is playing a "large" flute.', "A man is playing a flute.", "3.800"]]
    write_tsv(d / "train.tsv", rows, header=STSB_HEADER + ["score"])
    write_tsv(d / "dev.tsv", rows[:1], header=STSB_HEADER + ["score"])
    write_tsv(d / "test.tsv", [row[:9] for row in rows], header=STSB_HEADER)


def write_qqp(d):
    rows = [[133273, 213221, 213222, 'How is the life of a "math" student?',
             "Which level of preparation is enough?", 0],
            [402555, 536040, 536041, "How do I control my horny emotions?",
             "How do you control your horniness?", 1]]
    header = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]
    write_tsv(d / "train.tsv", rows, header=header)
    write_tsv(d / "dev.tsv", rows, header=header)
    write_tsv(d / "test.tsv", [[0, "Why do rockets look white?", "Why are rockets white?"]],
              header=["id", "question1", "question2"])


def write_index_pair(d, first, second, labels):
    rows = [[0, "When did the third Digimon series begin?", "Unlike the two seasons before it.",
             labels[0]],
            [1, 'Which "missile" batteries?', "The café's élan.", labels[1]]]
    header = ["index", first, second, "label"]
    write_tsv(d / "train.tsv", rows, header=header)
    write_tsv(d / "dev.tsv", rows[:1], header=header)
    write_tsv(d / "test.tsv", [[0, "What is the name?", "It is Bob."]], header=header[:3])


WRITERS = {
    "cola": write_cola, "mrpc": write_mrpc, "mnli": write_mnli, "sst-2": write_sst2,
    "sts-b": write_stsb, "qqp": write_qqp,
    "qnli": lambda d: write_index_pair(d, "question", "sentence", ["not_entailment", "entailment"]),
    "rte": lambda d: write_index_pair(d, "sentence1", "sentence2",
                                      ["entailment", "not_entailment"]),
    "wnli": lambda d: write_index_pair(d, "sentence1", "sentence2", [1, 0]),
}


# --- Readers ------------------------------------------------------------------------------


@pytest.mark.parametrize("task, processor_name", [
    ("cola", "ColaProcessor"), ("mrpc", "MrpcProcessor"), ("mnli", "MnliProcessor")])
def test_readers_equal_the_original(tmp_path, task, processor_name):
    WRITERS[task](tmp_path)
    ours = processors.get_processor(task)
    original = getattr(original_classifier(), processor_name)()
    assert ours.get_labels() == original.get_labels()
    for split in ("train", "dev", "test"):
        expected = getattr(original, f"get_{split}_examples")(str(tmp_path))
        got = getattr(ours, f"get_{split}_examples")(str(tmp_path))
        assert as_tuples(got) == as_tuples(expected), split


def test_xnli_equals_the_original_and_reads_the_distribution_layout(tmp_path):
    flat, nested = tmp_path / "flat", tmp_path / "nested"
    write_xnli(flat)
    write_xnli(nested, nested=True)
    original = original_classifier().XnliProcessor()
    original.language = "de"
    for data_dir in (flat, nested):
        ours = processors.get_processor("xnli", xnli_language="de")
        assert ours.get_labels() == original.get_labels()
        train = ours.get_train_examples(str(data_dir))
        assert as_tuples(train) == as_tuples(original.get_train_examples(str(flat)))
        assert train[1].label == "contradiction"  # "contradictory" in the MT files
        dev = ours.get_dev_examples(str(data_dir))
        assert as_tuples(dev) == as_tuples(original.get_dev_examples(str(flat)))
        assert [e.guid for e in dev] == ["dev-2", "dev-4"]
        test = ours.get_test_examples(str(data_dir))
        assert [(e.guid, e.label) for e in test] == [("test-1", "entailment"),
                                                     ("test-3", "contradiction")]
    zh = processors.get_processor("xnli", xnli_language="zh").get_dev_examples(str(flat))
    assert [(e.text_a, e.label) for e in zh] == [
        ("他说，妈妈，我回来了。", "entailment")]


EXPECTED = {
    "sst-2": {
        "labels": ["0", "1"],
        "train": [("train-1", "hide new secretions from the parental units ", None, "0"),
                  ("train-2", 'contains no wit , only "labored" gags ', None, "0"),
                  ("train-3", "that loves its characters — naïve ", None, "1")],
        "test": [("test-0", "uneasy mishmash of styles ", None, "0"),
                 ("test-1", 'a "charming" journey ', None, "0")],
    },
    "sts-b": {
        "labels": [],
        "train": [("train-0", "A plane is taking off.", "An air plane is taking off.", 5.0),
                  ("train-1", 'A man is playing a "large" flute.', "A man is playing a flute.",
                   3.8)],
        "test": [("test-0", "A plane is taking off.", "An air plane is taking off.", 0.0),
                 ("test-1", 'A man is playing a "large" flute.', "A man is playing a flute.",
                  0.0)],
    },
    "qqp": {
        "labels": ["0", "1"],
        "train": [("train-133273", 'How is the life of a "math" student?',
                   "Which level of preparation is enough?", "0"),
                  ("train-402555", "How do I control my horny emotions?",
                   "How do you control your horniness?", "1")],
        "test": [("test-0", "Why do rockets look white?", "Why are rockets white?", "0")],
    },
    "qnli": {
        "labels": ["entailment", "not_entailment"],
        "train": [("train-0", "When did the third Digimon series begin?",
                   "Unlike the two seasons before it.", "not_entailment"),
                  ("train-1", 'Which "missile" batteries?', "The café's élan.", "entailment")],
        "test": [("test-0", "What is the name?", "It is Bob.", "entailment")],
    },
}
EXPECTED["rte"] = {
    "labels": ["entailment", "not_entailment"],
    "train": [(g, a, b, label) for (g, a, b, _), label in
              zip(EXPECTED["qnli"]["train"], ["entailment", "not_entailment"])],
    "test": EXPECTED["qnli"]["test"],
}
EXPECTED["wnli"] = {
    "labels": ["0", "1"],
    "train": [(g, a, b, label) for (g, a, b, _), label in zip(EXPECTED["qnli"]["train"],
                                                             ["1", "0"])],
    "test": [("test-0", "What is the name?", "It is Bob.", "0")],
}


@pytest.mark.parametrize("task", sorted(EXPECTED))
def test_glue_readers(tmp_path, task):
    WRITERS[task](tmp_path)
    processor = processors.get_processor(task.upper())
    expected = EXPECTED[task]
    assert processor.get_labels() == expected["labels"]
    assert processor.is_regression == (task == "sts-b")
    assert as_tuples(processor.get_train_examples(str(tmp_path))) == expected["train"]
    assert as_tuples(processor.get_test_examples(str(tmp_path))) == expected["test"]
    assert len(processor.get_dev_examples(str(tmp_path))) >= 1


def test_mnli_matched_and_mismatched_splits(tmp_path):
    write_mnli(tmp_path)
    matched, mismatched = processors.get_processor("mnli"), processors.get_processor("MNLI-mm")
    dev_m = matched.read_split(str(tmp_path), "dev_matched").examples
    dev_mm = matched.read_split(str(tmp_path), "dev_mismatched").examples
    assert [e.guid for e in dev_m] == ["dev_matched-7", "dev_matched-9"]
    assert [e.label for e in dev_mm] == ["contradiction", "neutral"]
    assert as_tuples(mismatched.get_dev_examples(str(tmp_path))) == as_tuples(dev_mm)
    test_mm = mismatched.get_test_examples(str(tmp_path))
    assert [(e.guid, e.label) for e in test_mm] == [("test_mismatched-0", "contradiction")]


def test_ax_diagnostic(tmp_path):
    write_tsv(tmp_path / "diagnostic.tsv", [[0, "The cat sat.", "The cat did not sit."]],
              header=["index", "sentence1", "sentence2"])
    examples = processors.get_processor("AX").get_test_examples(str(tmp_path))
    assert as_tuples(examples) == [("test-0", "The cat sat.", "The cat did not sit.",
                                    "contradiction")]


def test_missing_file_names_the_candidates(tmp_path):
    with pytest.raises(ce.DataFormatError, match="dev.tsv"):
        processors.get_processor("rte").get_dev_examples(str(tmp_path))


# --- Custom data --------------------------------------------------------------------------


def test_custom_csv_by_column_name_with_quotes_and_inferred_labels(tmp_path):
    (tmp_path / "train.csv").write_text(
        'id,review,score,extra\n1,"Good, really ""good""",10,x\n2,bad,2,y\n3,"so-so\nlong",2,z\n',
        encoding="utf-8")
    (tmp_path / "dev.csv").write_text("id,review,score,extra\n1,fine,10,x\n", encoding="utf-8")
    (tmp_path / "test.csv").write_text("id,review\n1,what now\n", encoding="utf-8")
    config = processors.CustomDataConfig(text_a_column="review", label_column="score", delimiter="comma")
    processor = processors.get_processor("custom", custom=config)
    assert processor.get_labels(str(tmp_path)) == ["2", "10"]  # numeric order
    train = processor.get_train_examples(str(tmp_path))
    assert as_tuples(train) == [("train-1", 'Good, really "good"', None, "10"),
                                ("train-2", "bad", None, "2"),
                                ("train-3", "so-so\nlong", None, "2")]
    assert processor.get_dev_examples(str(tmp_path))[0].label == "10"
    assert as_tuples(processor.get_test_examples(str(tmp_path))) == [
        ("test-1", "what now", None, "2")]


def test_custom_csv_line_numbers_with_bom_crlf_and_multiline_fields(tmp_path):
    (tmp_path / "train.csv").write_bytes(
        '\ufefftext,label\r\n"two\r\nlines",1\r\nthird line,0\r\nbad,row,here\r\n'
        .encode("utf-8"))
    config = processors.CustomDataConfig(text_a_column="text", label_column="label", delimiter=",",
                                 labels=(0, 1))
    processor = processors.get_processor("custom", custom=config)
    read = processor.read_split(str(tmp_path), "train", skip_bad_rows=True)
    assert as_tuples(read.examples) == [("train-1", "two\r\nlines", None, "1"),
                                        ("train-2", "third line", None, "0")]
    assert [(row.line, row.reason) for row in read.bad_rows] == [
        (5, "expected 2 columns, found 3")]


def test_custom_tsv_pair_by_index_without_header_and_label_list(tmp_path):
    write_tsv(tmp_path / "train.tsv", [["pos", "a \"b\"", "c"], ["neg", "d", "e"]])
    write_tsv(tmp_path / "dev.tsv", [["pos", "f", "g"], ["meh", "h", "i"]])
    config = processors.CustomDataConfig(text_a_column="1", text_b_column=2, label_column=0,
                                 has_header=False, labels="neg,pos", delimiter="\\t")
    processor = processors.get_processor("custom", custom=config)
    assert processor.get_labels() == ["neg", "pos"]
    assert as_tuples(processor.get_train_examples(str(tmp_path))) == [
        ("train-0", 'a "b"', "c", "pos"), ("train-1", "d", "e", "neg")]
    with pytest.raises(ce.DataFormatError, match=r"dev\.tsv:2: unknown label 'meh'"):
        processor.get_dev_examples(str(tmp_path))


def test_custom_regression_and_column_errors(tmp_path):
    write_tsv(tmp_path / "train.tsv", [["a b", "0.5"], ["c", "nan"], ["d", "x"]],
              header=["text", "y"])
    config = processors.CustomDataConfig(text_a_column="text", label_column="y", is_regression=True)
    read = processors.get_processor("custom", custom=config).read_split(str(tmp_path), "train",
                                                                skip_bad_rows=True)
    assert [e.label for e in read.examples] == [0.5]
    assert [(row.line, "not a finite number" in row.reason) for row in read.bad_rows] == [
        (3, True), (4, True)]
    wrong = processors.CustomDataConfig(text_a_column="sentence", label_column="y")
    with pytest.raises(ce.DataFormatError, match="'sentence' not found in header"):
        processors.get_processor("custom", custom=wrong).get_train_examples(str(tmp_path))


@pytest.mark.parametrize("settings, message", [
    (dict(delimiter="::"), "--delimiter must be one character, got '::'"),
    # A repeated label built a head with a class no label maps to (pos -> 2, neg -> 1).
    (dict(labels="pos,neg,pos"), r"^--label_list repeats \['pos'\]$"),
    (dict(labels=("b", "a", "b", "a", "c")), r"^--label_list repeats \['a', 'b'\]$"),
    # Regression has no labels: the list was parsed and then ignored.
    (dict(labels="a,b", is_regression=True),
     r"^--label_list=a,b with --is_regression: regression has no labels"),
    # An empty name was dropped without a word (run_ner refuses it).
    (dict(labels="pos,,neg"), r"^--label_list=pos,,neg: empty label names$"),
    (dict(labels=("pos", " ")), r"^--label_list=pos, : empty label names$"),
], ids=["delimiter", "repeated_label", "repeated_labels", "labels_for_regression",
        "empty_label", "blank_label"])
def test_custom_settings_are_refused_in_one_line_naming_the_flag(settings, message):
    with pytest.raises(UserError, match=message) as err:
        processors.CustomDataConfig(text_a_column="text", label_column="y", **settings)
    assert "\n" not in str(err.value)


def test_a_regression_label_whose_square_overflows_names_the_file_and_line(tmp_path):
    """Issue 38: a label of 1e20 (finite) gave "loss is NaN or Inf at step 1" naming no
    row; its square overflows float32, as -1e20's does; 1.8e19 is the largest that fits."""
    write_tsv(tmp_path / "train.tsv", [["a", "1.8e19"], ["b", "1e20"], ["c", "-1e20"]],
              header=["text", "y"])
    config = processors.CustomDataConfig(text_a_column="text", label_column="y",
                                         is_regression=True)
    processor = processors.get_processor("custom", custom=config)
    with pytest.raises(ce.DataFormatError) as err:
        processor.get_train_examples(str(tmp_path))
    assert str(err.value).startswith(
        f"{tmp_path / 'train.tsv'}:3: label '1e20' (column 1) is too large: its square (the "
        "squared-error loss) overflows float32; scores must lie within +-1.84e+19"), err.value
    read = processor.read_split(str(tmp_path), "train", skip_bad_rows=True)
    assert [e.label for e in read.examples] == [1.8e19]
    assert [row.line for row in read.bad_rows] == [3, 4]


@pytest.mark.parametrize("text", ["\x01\x02\x7f", "\u200b\ufeff", " \x00 \ufffd "])
def test_a_text_of_characters_the_tokenizer_drops_is_empty(tmp_path, tiny_vocab_file, text):
    """Issue 38: a document of control characters tokenized to nothing and was predicted,
    while a whitespace-only one was refused as empty: both are empty now, one message."""
    write_tsv(tmp_path / "train.tsv", [["a cat", "pos"], [text, "neg"], ["   ", "neg"]],
              header=["text", "label"])
    config = processors.CustomDataConfig(text_a_column="text", label_column="label")
    read = processors.get_processor("custom", custom=config).read_split(
        str(tmp_path), "train", skip_bad_rows=True)
    assert [(row.line, row.reason) for row in read.bad_rows] == [
        (3, "empty text_a (column 0)"), (4, "empty text_a (column 0)")]
    assert tokenization.FullTokenizer(tiny_vocab_file).tokenize(text) == []  # the premise


# --- Bad rows -----------------------------------------------------------------------------


def write_bad_mrpc(d):
    lines = ["\t".join(MRPC_HEADER),
             "1\t1\t2\tgood one\tgood two",
             "",  # blank lines are ignored
             "1\t1\t2\tmissing a column",
             "2\t1\t2\tunknown\tlabel",
             "0\t1\t2\t  \tempty text_a",
             "0\t1\t2\tlast good\tone"]
    (d / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with open(d / "dev.tsv", "wb") as f:
        f.write(("\t".join(MRPC_HEADER) + "\n1\t1\t2\tok\tok\n").encode())
        f.write(b"0\t1\t2\tbad \xff byte\tx\n0\t1\t2\tok\tok\n")


def test_bad_rows_raise_with_file_and_line_or_are_skipped(tmp_path):
    write_bad_mrpc(tmp_path)
    processor = processors.get_processor("mrpc")
    train_file = str(tmp_path / "train.tsv")
    with pytest.raises(ce.DataFormatError) as err:
        processor.get_train_examples(str(tmp_path))
    assert f"{train_file}:4: expected 5 columns, found 4" in str(err.value)
    read = processor.read_split(str(tmp_path), "train", skip_bad_rows=True)
    assert [e.text_a for e in read.examples] == ["good one", "last good"]
    assert [str(row) for row in read.bad_rows] == [
        f"{train_file}:4: expected 5 columns, found 4",
        f"{train_file}:5: unknown label '2' (column 0); expected one of ['0', '1']",
        f"{train_file}:6: empty text_a (column 3)"]
    dev = processor.read_split(str(tmp_path), "dev", skip_bad_rows=True)
    assert len(dev.examples) == 2
    assert [(row.line, row.reason) for row in dev.bad_rows] == [(3, "invalid UTF-8")]


@pytest.mark.parametrize("task,split", [("mrpc", "test"), ("mnli", "test_mismatched"),
                                        ("custom", "test")])
def test_test_rows_are_never_skipped(tmp_path, task, split):
    """Issue 38 #7: --skip_bad_rows on the test set dropped 2 of 11 rows, so test_results.tsv
    had 9 lines and every later prediction sat on another row's line. A test row is
    predicted on its own line, always: a bad one is an error naming its file and line,
    with --skip_bad_rows too (which still skips bad train and dev rows)."""
    rows = [[i, f"#{i}", f"#{i}", f"sentence {i} .", f"other {i} ."] for i in range(11)]
    rows[3] = rows[3][:4]  # a column short
    rows[7][3] = " "  # an empty text
    custom = None
    if task == "mnli":
        rows = [[r[0], *"pg", "fiction", "(a)", "(b)", "(A)", "(B)", *r[3:]] for r in rows]
    if task == "custom":
        custom = processors.CustomDataConfig(text_a_column=3, label_column=0,
                                             has_header=False, labels=("0", "1"))
    header = None if task == "custom" else [str(c) for c in range(len(rows[0]))]
    path = tmp_path / f"{split}.tsv"
    write_tsv(path, rows, header=header)
    processor = processors.get_processor(task, custom=custom)
    with pytest.raises(ce.DataFormatError) as err:
        processor.read_split(str(tmp_path), split, skip_bad_rows=True)
    line = 4 if task == "custom" else 5
    assert str(err.value).startswith(f"{path}:{line}: expected "), str(err.value)
    assert str(err.value).endswith("(--skip_bad_rows skips train and dev rows, never a "
                                   "test row: test_results.tsv has a line per test row; fix "
                                   "or remove it)")


def test_pair_task_with_empty_text_b_is_a_bad_row(tmp_path):
    write_tsv(tmp_path / "train.tsv", [[0, "a question?", "", "entailment"]],
              header=["index", "question", "sentence", "label"])
    with pytest.raises(ce.DataFormatError, match=r"train\.tsv:2: empty text_b"):
        processors.get_processor("qnli").get_train_examples(str(tmp_path))


# --- Feature conversion vs the original ---------------------------------------------------


PAIRS = [
    ("the cat sat on the mat", "the dog ran far away", "1"),
    ("the cat sat on the mat and the dog ran far away home", "a", "0"),  # long a
    ("a", "the cat sat on the mat and the dog ran far away home", "1"),  # long b
    ("the cat sat", "the dog ran", "0"),  # tie: b loses first
    ("unaffable cats, \"running\" home!", None, "1"),  # single, truncated
    ("the big red dog", "", "0"),  # empty text_b -> single segment
    ("Café naïve 猫 the", "\u0000\ufffd", "1"),  # text_b tokenizes to nothing
]


@pytest.mark.parametrize("max_seq_length", [5, 8, 9, 32])
def test_features_equal_the_original(tiny_vocab_file, max_seq_length):
    original = original_classifier()
    original_tokenizer = original.original_tokenization.FullTokenizer(tiny_vocab_file, True)
    tokenizer = tokenization.FullTokenizer(tiny_vocab_file, do_lower_case=True)
    label_list = ["0", "1"]
    examples = [(f"g-{i}", a, b, label) for i, (a, b, label) in enumerate(PAIRS)]
    for index, (guid, a, b, label) in enumerate(examples):
        ours = cd.convert_single_example(ce.InputExample(guid, a, b, label), label_list,
                                         max_seq_length, tokenizer)
        theirs = original.convert_single_example(
            index, original.InputExample(guid, a, b, label), label_list, max_seq_length,
            original_tokenizer)
        assert (ours.input_ids, ours.input_mask, ours.segment_ids, ours.label_id,
                ours.is_real_example) == (theirs.input_ids, theirs.input_mask,
                                          theirs.segment_ids, theirs.label_id,
                                          theirs.is_real_example), guid
    pad_ours = cd.convert_single_example(ce.PaddingInputExample(), label_list, 6, tokenizer)
    pad_theirs = original.convert_single_example(0, original.PaddingInputExample(), label_list,
                                                 6, original_tokenizer)
    assert vars(pad_theirs) == dataclass_dict(pad_ours)


def dataclass_dict(features):
    import dataclasses

    return dataclasses.asdict(features)


def test_truncation_pops_from_the_end_of_the_longer_side():
    a, b = list("abcdef"), list("xyz")
    pairs.truncate_seq_pair(a, b, 5)
    assert (a, b) == (list("abc"), list("xy"))


def test_pad_examples():
    padded = cd.pad_examples(["x"] * 5, 4)
    assert len(padded) == 8 and padded[5:] == [ce.PaddingInputExample()] * 3
    assert cd.pad_examples(["x"] * 4, 4) == ["x"] * 4


def test_regression_features_keep_the_score(tiny_vocab_file):
    tokenizer = tokenization.FullTokenizer(tiny_vocab_file)
    features = cd.convert_single_example(ce.InputExample("s", "the cat", "a dog", 3.8), None,
                                         8, tokenizer, is_regression=True)
    assert features.label_id == 3.8 and features.segment_ids == [0, 0, 0, 0, 1, 1, 1, 0]


# --- TFRecord cache -----------------------------------------------------------------------


def read_records(path):
    import tensorflow as tf

    records = []
    for raw in tf.data.TFRecordDataset(path):
        example = tf.train.Example.FromString(raw.numpy())
        records.append({name: list(feature.int64_list.value or feature.float_list.value)
                        for name, feature in example.features.feature.items()})
    return records


def test_records_equal_the_originals_file(tmp_path, tiny_vocab_file):
    data_dir = tmp_path / "MRPC"
    write_mrpc(data_dir)
    processor = processors.get_processor("mrpc")
    cached = cd.prepare_classifier_records(
        processor, str(data_dir), "train", str(tmp_path / "out"), vocab_file=tiny_vocab_file,
        do_lower_case=True, max_seq_length=16, pad_to_multiple=3)
    original = original_classifier()
    examples = original.MrpcProcessor().get_train_examples(str(data_dir))
    examples.append(original.PaddingInputExample())
    reference = str(tmp_path / "original.tf_record")
    original.file_based_convert_examples_to_features(
        examples, ["0", "1"], 16, original.original_tokenization.FullTokenizer(tiny_vocab_file),
        reference)
    assert read_records(cached.record_file) == read_records(reference)
    assert cached.record_file.endswith("train.tf_record")
    meta = json.loads(pathlib.Path(cached.metadata_file).read_text(encoding="utf-8"))
    assert meta["num_examples"] == 2 and meta["num_padding"] == 1 and meta["num_records"] == 3
    assert meta["label_list"] == ["0", "1"] and meta["label_counts"] == {"0": 1, "1": 1}
    assert meta["num_truncated"] == 2 and meta["max_tokens_seen"] > 16
    assert meta["num_bad_rows"] == 0 and not meta["is_regression"]


def test_records_parse_with_the_schema(tmp_path, tiny_vocab_file):
    import tensorflow as tf

    write_stsb(tmp_path)
    cached = cd.prepare_classifier_records(
        processors.get_processor("sts-b"), str(tmp_path), "train", str(tmp_path / "out"),
        vocab_file=tiny_vocab_file, do_lower_case=True, max_seq_length=12)
    batch = next(iter(tf.data.TFRecordDataset(cached.record_file).batch(2)))
    parsed = cd.parse_record(batch, cached.max_seq_length, cached.is_regression)
    assert parsed["input_ids"].dtype == tf.int32 and parsed["input_ids"].shape == (2, 12)
    assert parsed["label_ids"].dtype == tf.float32
    assert parsed["label_ids"].numpy().tolist() == pytest.approx([5.0, 3.8])
    assert parsed["is_real_example"].numpy().tolist() == [1, 1]
    one = cd.parse_record(next(iter(tf.data.TFRecordDataset(cached.record_file))), 12, True)
    assert one["label_ids"].shape == () and one["segment_ids"].shape == (12,)
    # The original's input_fn spec: sequences [max_seq_length], scalars [].
    spec = cd.classifier_parse_spec(12)
    assert {name: (tuple(f.shape), f.dtype) for name, f in spec.items()} == {
        "input_ids": ((12,), tf.int64), "input_mask": ((12,), tf.int64),
        "segment_ids": ((12,), tf.int64), "label_ids": ((), tf.int64),
        "is_real_example": ((), tf.int64)}


def test_cache_reuse_and_invalidation(tmp_path, tiny_vocab_file):
    data_dir = tmp_path / "CoLA"
    write_cola(data_dir)
    out = str(tmp_path / "out")
    settings = dict(vocab_file=tiny_vocab_file, do_lower_case=True, max_seq_length=16)

    def prepare(processor=None, split="train", **changes):
        return cd.prepare_classifier_records(processor or processors.get_processor("cola"),
                                             str(data_dir), split, out, **{**settings, **changes})

    first = prepare()
    assert not first.reused and first.num_examples == 3
    assert prepare().reused
    assert not prepare(max_seq_length=20).reused
    assert not prepare(do_lower_case=False).reused
    assert not prepare(pad_to_multiple=2).reused
    assert prepare(pad_to_multiple=2).reused
    # Another split sits beside it and does not disturb it.
    assert not prepare(split="dev").reused and prepare(pad_to_multiple=2).reused
    # A changed vocab file.
    other_vocab = tmp_path / "vocab2.txt"
    other_vocab.write_text(pathlib.Path(tiny_vocab_file).read_text() + "extra\n")
    assert not prepare(vocab_file=str(other_vocab)).reused
    assert prepare(vocab_file=str(other_vocab)).reused
    # A changed input file.
    with open(data_dir / "train.tsv", "a", encoding="utf-8") as f:
        f.write("gj04\t1\t\tThe dog ran.\n")
    again = prepare(vocab_file=str(other_vocab))
    assert not again.reused and again.num_examples == 4
    # A damaged record file is rebuilt.
    pathlib.Path(again.record_file).write_bytes(b"junk")
    assert not prepare(vocab_file=str(other_vocab)).reused
    leftovers = [name for name in os.listdir(out) if ".tmp-" in name]
    assert leftovers == []


def test_cache_key_includes_the_task_options(tmp_path, tiny_vocab_file):
    write_xnli(tmp_path)
    out = str(tmp_path / "out")
    settings = dict(vocab_file=tiny_vocab_file, do_lower_case=True, max_seq_length=16)
    de = cd.prepare_classifier_records(processors.get_processor("xnli", xnli_language="de"),
                                       str(tmp_path), "dev", out, **settings)
    assert de.num_examples == 2
    zh = cd.prepare_classifier_records(processors.get_processor("xnli", xnli_language="zh"),
                                       str(tmp_path), "dev", out, **settings)
    assert not zh.reused and zh.num_examples == 1


def test_skipped_rows_are_counted_in_the_metadata(tmp_path, tiny_vocab_file):
    write_bad_mrpc(tmp_path)
    cached = cd.prepare_classifier_records(
        processors.get_processor("mrpc"), str(tmp_path), "train", str(tmp_path / "out"),
        vocab_file=tiny_vocab_file, do_lower_case=True, max_seq_length=16, skip_bad_rows=True)
    assert cached.num_examples == 2 and cached.metadata["num_bad_rows"] == 3
    assert cached.metadata["bad_rows"][0].endswith("train.tsv:4: expected 5 columns, found 4")
    with pytest.raises(ce.DataFormatError, match="train.tsv:4"):
        cd.prepare_classifier_records(
            processors.get_processor("mrpc"), str(tmp_path), "train", str(tmp_path / "out"),
            vocab_file=tiny_vocab_file, do_lower_case=True, max_seq_length=16)


# --- Long documents: --long_document=head_tail -------------------------------------------


def test_head_tail_keeps_the_first_and_last_tokens(tiny_vocab_file):
    tokenizer = tokenization.FullTokenizer(tiny_vocab_file, do_lower_case=True)
    words = "the cat sat on a mat and the dog ran far away to his home in the red hut".split()
    text = " ".join(words)
    tokens = tokenizer.tokenize(text)
    assert len(tokens) > 10
    example = ce.InputExample("g", text, None, "1")
    head = cd.convert_single_example(example, ["0", "1"], 10, tokenizer, head_tokens=3)
    kept = tokens[:3] + tokens[-5:]   # 10 - [CLS] [SEP] = 8 tokens: 3 head, 5 tail
    assert head.input_ids == tokenizer.convert_tokens_to_ids(["[CLS]", *kept, "[SEP]"])
    assert head.input_mask == [1] * 10
    # head_tokens=8 (the whole budget) is the original's cut; 0 keeps only the tail.
    truncate = cd.convert_single_example(example, ["0", "1"], 10, tokenizer)
    assert cd.convert_single_example(example, ["0", "1"], 10, tokenizer,
                                      head_tokens=8) == truncate
    assert cd.head_tail(tokens, 8, 0) == tokens[-8:]
    assert cd.head_tail(tokens[:8], 8, 3) == tokens[:8]  # fits: unchanged
    assert cd.default_head_tokens(512) == 128 and cd.default_head_tokens(128) == 32


def test_long_document_truncate_records_stay_the_originals(tmp_path, tiny_vocab_file):
    """The default mode's records and cache key are the original's (no new key), and
    head_tail writes other records under another key."""
    from tasks.classification.task import ClassificationFamily, ClassificationSettings

    data_dir = tmp_path / "CoLA"
    write_cola(data_dir)
    out = str(tmp_path / "out")
    truncate = ClassificationFamily(ClassificationSettings("cola", str(data_dir)), 8)
    assert truncate.head_tokens is None
    cached = cd.prepare_classifier_records(
        processors.get_processor("cola"), str(data_dir), "train", out,
        vocab_file=tiny_vocab_file, do_lower_case=True, max_seq_length=8,
        head_tokens=truncate.head_tokens)
    original = original_classifier()
    reference = str(tmp_path / "original.tf_record")
    original.file_based_convert_examples_to_features(
        original.ColaProcessor().get_train_examples(str(data_dir)), ["0", "1"], 8,
        original.original_tokenization.FullTokenizer(tiny_vocab_file), reference)
    assert read_records(cached.record_file) == read_records(reference)
    assert cached.metadata["num_truncated"] > 0
    assert "head_tokens" not in cached.metadata["cache_key"]
    head_tail = ClassificationFamily(
        ClassificationSettings("cola", str(data_dir), long_document="head_tail"), 8)
    assert head_tail.head_tokens == cd.default_head_tokens(8) == 2
    other = cd.prepare_classifier_records(
        processors.get_processor("cola"), str(data_dir), "train", out,
        vocab_file=tiny_vocab_file, do_lower_case=True, max_seq_length=8,
        head_tokens=head_tail.head_tokens)
    assert not other.reused and other.metadata["cache_key"]["head_tokens"] == 2
    assert read_records(other.record_file) != read_records(reference)


def test_long_document_settings_are_checked(tmp_path):
    from tasks.classification.task import ClassificationFamily, ClassificationSettings

    write_cola(tmp_path / "CoLA")
    write_mrpc(tmp_path / "MRPC")

    def family(task, **settings):
        return ClassificationFamily(ClassificationSettings(task, str(tmp_path / task),
                                                           **settings), 16)

    with pytest.raises(ValueError, match="reads single texts; task MRPC has text pairs"):
        family("MRPC", long_document="head_tail")
    with pytest.raises(ValueError, match=r"--head_tokens=15 must be between 0 and .* = 14"):
        family("CoLA", long_document="head_tail", head_tokens=15)
    assert family("CoLA", long_document="head_tail", head_tokens=14).head_tokens == 14
    with pytest.raises(ValueError, match="windows reads single texts; task MRPC"):
        family("MRPC", long_document="windows")
    with pytest.raises(ValueError, match=r"--doc_stride=15 must be between 1 and .* = 14"):
        family("CoLA", long_document="windows", doc_stride=15)
    with pytest.raises(ValueError, match="--max_windows_per_document=0 must be at least 1"):
        family("CoLA", long_document="windows", max_windows_per_document=0)
    with pytest.raises(ValueError, match="--window_pooling=sum: expected one of"):
        family("CoLA", long_document="windows", window_pooling="sum")
    # Default stride: a whole window, windows side by side (overlap slows learning:
    # bench/RESULTS.md, Long documents).
    assert family("CoLA", long_document="windows").windows == cd.Windows(14, 8)


@pytest.mark.parametrize("words", [17, 18, 19])
def test_windows_records_hold_every_token_once_per_window(tiny_vocab_file, words):
    """A long text's windows (doc_stride apart, the last ending at its last token and,
    when shorter, filled with the tokens before it to a whole window), each packed
    `[CLS] window [SEP]`, then all-zero windows up to the limit."""
    tokenizer = tokenization.FullTokenizer(tiny_vocab_file, do_lower_case=True)
    text = " ".join("the cat sat on a mat and the dog ran far away to his home in the red "
                    "hut".split()[:words])
    tokens = tokenizer.tokenize(text)
    n = len(tokens)
    values, length, count = cd.window_record_values(
        ce.InputExample("g", text, None, "1"), {"0": 0, "1": 1}, 10, tokenizer, False,
        cd.Windows(doc_stride=5, max_windows=6))
    # Windows of 8 from 0, 5, 10, ... until one reaches the end; the last is the text's
    # last 8 tokens (its own start, a multiple of 5, when the text ends on a whole window).
    starts = list(range(0, n - 8, 5)) + [n - 8]
    assert length == n + 2 and count == len(starts)
    ids = [values["input_ids"][i * 10:(i + 1) * 10] for i in range(6)]
    for i, start in enumerate(starts):
        window = tokens[start:start + 8]
        assert ids[i][:len(window) + 2] == tokenizer.convert_tokens_to_ids(
            ["[CLS]", *window, "[SEP]"])
    assert ids[count:] == [[0] * 10] * (6 - count)
    assert values["label_ids"] == [1] and values["is_real_example"] == [1]
    with pytest.raises(ValueError, match=f"example g: its {n} tokens need {count} windows"):
        cd.window_record_values(ce.InputExample("g", text, None, "1"), {"0": 0, "1": 1},
                                10, tokenizer, False, cd.Windows(5, count - 1))


@pytest.mark.parametrize("mode", ["truncate", "head_tail", "windows"])
def test_a_text_over_csvs_field_limit_is_read_in_every_mode(tmp_path, tiny_vocab_file, mode):
    """Issue 38 #8: Python's csv refused a field over 131,072 characters, so such a text
    was an "unreadable row" in every mode. It is read: its first and last words reach the
    records as each mode keeps them (spaces make it long, not its tokens)."""
    from tasks.classification.task import ClassificationFamily, ClassificationSettings

    text = "the cat sat " + " " * 140_000 + " the dog ran home"
    assert len(text.encode("utf-8")) > 128 * 1024
    with open(tmp_path / "train.csv", "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows([["text", "label"], [text, "pos"], ["a mat", "neg"]])
    custom = processors.CustomDataConfig(text_a_column="text", label_column="label",
                                         delimiter="comma")
    family = ClassificationFamily(ClassificationSettings(
        "custom", str(tmp_path), custom=custom, long_document=mode), 8)
    cached = cd.prepare_classifier_records(
        family.processor, str(tmp_path), "train", str(tmp_path / "out"),
        vocab_file=tiny_vocab_file, do_lower_case=True, max_seq_length=8,
        head_tokens=family.head_tokens, windows=family.windows)
    assert cached.num_examples == 2 and not cached.metadata["num_bad_rows"]
    tokenizer = tokenization.FullTokenizer(tiny_vocab_file, do_lower_case=True)
    ids = read_records(cached.record_file)[0]["input_ids"]
    words = tokenizer.convert_ids_to_tokens([i for i in ids if i > 3])
    expected = {"truncate": ["the", "cat", "sat", "the", "dog", "ran"],
                "head_tail": ["the", "cat", "the", "dog", "ran", "home"]}
    if mode == "windows":  # every token, the overlapping ones in two windows
        assert {"cat", "home"} <= set(words)
    else:
        assert words == expected[mode]
