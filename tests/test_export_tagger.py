"""The tagger export (`export_saved_model.py --model_type=tagger`): run_ner.py output
directories exported with the CLI, served from a fresh process with only tensorflow +
tensorflow-text, equal to the tagging family's Python path (`tasks.tagging.data`'s windows,
the Keras model, `tasks.tagging.task.stitch_predictions`) on the words the graph found; the
in-graph entity decoding equal to `tasks.tagging.metrics.chunks`; the word split equal to
the original BasicTokenizer's with offsets into the raw text."""

import json
import textwrap
import types
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import run_isolated, write_vocab
from original_bert import original_module
from test_export import SERVE_SCRIPT, VOCAB, _cli, _save_like_training

from data_prep.tokenization import FullTokenizer
from modeling.export import families, registry, serving
from modeling.export.metadata import (METADATA_FILE, ExportError, ExportMetadata,
                                      write_export_metadata)
from modeling.config import BertConfig
from tasks.tagging import data, metrics
from tasks.tagging import export as tagger_export
from tasks.tagging.task import TaggingExportMetadata, build_tagging_model, stitch_predictions

SEQ = 16          # 14 pieces a window: the long text needs many
DOC_STRIDE = 5
IOB2 = ("O", "B-LOC", "B-PER", "I-LOC", "I-PER")
IOBES = ("O", "B-PER", "E-PER", "I-PER", "S-LOC", "S-PER")
LONG = "the big red dog ran far away home , and the cat sat on a mat . " * 4  # 72 words
TEXTS = [
    "Angela Merkel met Emmanuel Macron in Paris.",
    "Café  Zürich\tand the   dog, ran!  e\u0301cole",       # accents, 2 spaces, tab, NFD
    "你好，世界 the cat 😀 sat 😀x!",                        # CJK, full-width comma, emoji
    "",
    LONG,
    "x\u200by \x00 a\u0085b",                               # dropped and control characters
    "   ",
]


def _config(layers=2):
    return BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=layers,
                      num_attention_heads=2, intermediate_size=64,
                      max_position_embeddings=64)


def _sharpen(model):
    """Scales the random head: logits far apart, so the argmax of the served model and of
    the Python path cannot differ by float noise (and the tags vary with the words)."""
    head = model.output_layer if hasattr(model, "output_layer") else model.tagger
    for variable in head.weights:
        variable.assign(variable * 60.0)


def _tagger(labels, seed, **kwargs):
    keras.utils.set_random_seed(seed)
    model = build_tagging_model(_config(), len(labels), **kwargs)
    _sharpen(model)
    return model


def _run_dir(directory, model, labels, scheme, **settings):
    """A run_ner.py output_dir: checkpoint, config, vocab, export_metadata.json."""
    directory.mkdir()
    write_vocab(directory / "vocab.txt", VOCAB)
    _config().to_json_file(str(directory / "bert_config.json"))
    _save_like_training(model, directory)
    write_export_metadata(str(directory), TaggingExportMetadata(
        task="tagging", labels=tuple(labels), do_lower_case=True, max_seq_length=SEQ,
        tag_scheme=scheme, doc_stride=DOC_STRIDE, **settings))
    return directory


# The feature-based run's settings given as flags (a checkpoint without
# export_metadata.json, e.g. trained elsewhere).
FEATURE_FLAGS = (f"--label_list={','.join(IOBES)}", "--do_lower_case=true",
                 f"--max_seq_length={SEQ}", "--tag_scheme=IOBES", "--feature_based",
                 "--feature_layers=weighted_sum_all", "--lstm_units=8")
MAX_CONTEXT_WINDOWS = 4000  # the memory test's ~3200 windows fit


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Two run directories (fine-tuned IOB2; feature-based IOBES with a weighted sum of
    all layers) exported with the CLI, served from one fresh isolated process: the
    fine-tuned one from its run's metadata (with --max_context_windows), the feature-based
    one from a copy without metadata and its settings as flags (`FEATURE_FLAGS`). That
    process first measures the fine-tuned export's request memory (`MEMORY_SCRIPT`, before
    it loads or serves anything else)."""
    import shutil

    root = tmp_path_factory.mktemp("tagger")
    fine = _tagger(IOB2, 1)
    feature = _tagger(IOBES, 2, feature_based=True, feature_layers="weighted_sum_all",
                      lstm_units=8)
    runs = {"fine": _run_dir(root / "fine", fine, IOB2, "IOB2"),
            "feature": _run_dir(root / "feature", feature, IOBES, "IOBES",
                                feature_based=True, feature_layers="weighted_sum_all",
                                lstm_units=8)}
    bare = root / "feature_bare"
    shutil.copytree(runs["feature"], bare)
    (bare / METADATA_FILE).unlink()
    flags = {"fine": [f"--init_checkpoint={runs['fine']}",
                      f"--max_context_windows={MAX_CONTEXT_WINDOWS}"],
             "feature": [f"--init_checkpoint={bare}", *FEATURE_FLAGS,
                         f"--doc_stride={DOC_STRIDE}"]}
    # tag_words gets the original BasicTokenizer's (cased) words of each text, with ""
    # padding between and after them.
    basic = original_module("tokenization").BasicTokenizer(do_lower_case=False)
    split = [basic.tokenize(text) for text in TEXTS]
    width = 2 * max(len(words) for words in split) + 1
    padded = [[x for w in words for x in (w, "")] for words in split]
    padded = [row + [""] * (width - len(row)) for row in padded]
    calls = {}
    for name in runs:
        result = _cli("--model_type=tagger", *flags[name],
                      f"--export_dir={root / ('export_' + name)}")
        assert result.code == 0, result.stderr[-3000:]
        calls[name] = {"dir": str(root / f"export_{name}"), "calls": {
            "serving_default": {"text": TEXTS}, "preprocess": {"text": TEXTS},
            "tag_words": {"words": padded}}}
    work = tmp_path_factory.mktemp("elsewhere")
    (work / "memory_args.json").write_text(json.dumps([calls["fine"]["dir"], MEMORY_WORDS]))
    outputs = run_isolated(work, MEMORY_SCRIPT + SERVE_SCRIPT, calls)
    return {"outputs": outputs, "memory": json.loads((work / "memory.json").read_text()),
            "models": {"fine": fine, "feature": feature},
            "labels": {"fine": IOB2, "feature": IOBES}, "padded": padded, "split": split,
            "vocab": str(runs["fine"] / "vocab.txt"), "bare": bare,
            "dirs": {name: calls[name]["dir"] for name in runs}, "runs": runs}


def _decode(values):
    return [v.decode("utf-8") if isinstance(v, bytes) else v for v in values]


def _words_by_example(outputs, name, key="word_text"):
    example = outputs[f"{name}/serving_default/word_example_index"]
    values = outputs[f"{name}/serving_default/{key}"]
    values = _decode(values) if values.dtype == object else values
    return [[v for e, v in zip(example, values) if e == i] for i in range(len(TEXTS))]


def _python_path(model, labels, vocab, words_by_example, tmp_path):
    """The tagging family's prediction for the same words: a CoNLL test file with one
    sentence per (non-empty) example, its windows (tasks.tagging.data), the Keras model,
    stitch_predictions. Returns (tags per example, the windows' features)."""
    path = tmp_path / "test.txt"
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for words in words_by_example:
            if words:
                f.write("".join(f"{w}\n" for w in words) + "\n")
    conll = data.read_conll(str(path), require_tags=False)
    features = list(data.sentence_windows(
        conll, FullTokenizer(vocab, do_lower_case=True), labels,
        data.WindowConfig(max_seq_length=SEQ, doc_stride=DOC_STRIDE), is_training=False))
    inputs = {k: tf.constant([getattr(f, k) for f in features], tf.int32)
              for k in ("input_ids", "input_mask", "segment_ids")}
    out = {"logits": model(inputs, training=False)["logits"].numpy(),
           "sentence_index": np.array([[f.sentence_index] for f in features])}
    for key in ("word_index", "label_weights", "label_ids"):
        out[key] = np.array([getattr(f, key) for f in features])
    predicted, _ = stitch_predictions(conll, out, labels)
    tags = iter(predicted)
    return [next(tags) if words else [] for words in words_by_example], features


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fine", "feature"])
def test_served_tags_equal_the_python_path(served, name, tmp_path):
    out = served["outputs"]
    assert list(out["leaked"]) == []
    words = _words_by_example(out, name)
    tags, features = _python_path(served["models"][name], served["labels"][name],
                                  served["vocab"], words, tmp_path)
    assert _words_by_example(out, name, "word_tag") == tags
    assert len({t for ts in tags for t in ts}) >= 3  # the tags do depend on the words
    # The windows are the Python path's (the empty text: one empty window here, none there).
    example = out[f"{name}/preprocess/window_example_index"]
    rows = [w for w in range(len(example)) if words[example[w]]]
    sentence_of = [i for i, ws in enumerate(words) if ws]  # sentence -> example
    assert example[rows].tolist() == [sentence_of[f.sentence_index] for f in features]
    assert sum(example == TEXTS.index(LONG)) >= 10  # the long text spans many windows
    for key in ("input_ids", "input_mask", "segment_ids"):
        np.testing.assert_array_equal(out[f"{name}/preprocess/{key}"][rows],
                                      [getattr(f, key) for f in features], key)
    # Every word's scoring window and position are the ones the Python path labels.
    scored = {(f.sentence_index, f.word_index[p]): (r, p) for r, f in zip(rows, features)
              for p in range(SEQ) if f.label_weights[p]}
    word_example = out[f"{name}/preprocess/word_example_index"]
    got = list(zip(out[f"{name}/preprocess/word_window"],
                   out[f"{name}/preprocess/word_window_position"]))
    position = [sum(word_example[:i] == e) for i, e in enumerate(word_example)]
    sentence = [sentence_of.index(e) for e in word_example]
    assert [scored[(s, p)] for s, p in zip(sentence, position)] == [tuple(g) for g in got]
    # Probabilities: float32, the Keras model's softmax at each word's scoring position,
    # the tag's is the largest.
    probabilities = out[f"{name}/serving_default/word_probabilities"]
    probability = out[f"{name}/serving_default/word_probability"]
    assert probabilities.dtype == probability.dtype == np.float32
    logits = served["models"][name]({k: tf.constant(out[f"{name}/preprocess/{k}"]) for k in
                                     ("input_ids", "input_mask", "segment_ids")},
                                    training=False)["logits"]
    expected = tf.nn.softmax(tf.gather_nd(logits, np.array(got))).numpy()
    np.testing.assert_allclose(probabilities, expected, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(probabilities.max(-1), probability)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fine", "feature"])
def test_served_entities_and_offsets(served, name):
    """Entities are metrics.chunks of the served tags; text[start:end] is the word or the
    entity text (code points: accents, CJK, emoji); words are the original's split."""
    out = served["outputs"]
    prefix = f"{name}/serving_default/"
    words = _words_by_example(out, name)
    starts = _words_by_example(out, name, "word_start")
    ends = _words_by_example(out, name, "word_end")
    for i, text in enumerate(TEXTS):
        assert [text[a:b] for a, b in zip(starts[i], ends[i])] == words[i]
    # The original's (cased) BasicTokenizer: each word is one of its tokens, and together
    # they are its tokens of the text.
    basic = original_module("tokenization").BasicTokenizer(do_lower_case=False)
    assert [basic.tokenize(" ".join(w)) for w in words] == [basic.tokenize(t) for t in TEXTS]
    assert all(len(basic.tokenize(w)) == 1 for ws in words for w in ws)
    tags = _words_by_example(out, name, "word_tag")
    expected = [(i, kind, first, last) for i in range(len(TEXTS))
                for kind, first, last in metrics.chunks(tags[i])]
    example = out[prefix + "entity_example_index"].tolist()
    got = list(zip(example, _decode(out[prefix + "entity_type"]),
                   out[prefix + "entity_word_start"].tolist(),
                   (out[prefix + "entity_word_end"] - 1).tolist()))
    assert got == expected and len(got) >= 5
    for (i, _, first, last), text, start, end in zip(
            got, _decode(out[prefix + "entity_text"]), out[prefix + "entity_start"],
            out[prefix + "entity_end"]):
        assert TEXTS[i][start:end] == text
        assert (start, end) == (starts[i][first], ends[i][last])
    # tag_words on the original's words (with "" padding between them): the same tags.
    padded = served["padded"]
    word_tag = out[f"{name}/tag_words/word_tag"]
    for row, ws, ts in zip(padded, word_tag, tags):
        row_tags = _decode(ws)
        assert [t for w, t in zip(row, row_tags) if w] == ts
        assert all(t == "" for w, t in zip(row, row_tags) if not w)
    prefix = f"{name}/tag_words/"
    got_words = list(zip(out[prefix + "entity_example_index"].tolist(),
                         _decode(out[prefix + "entity_type"]),
                         (out[prefix + "entity_word_start"] // 2).tolist(),
                         ((out[prefix + "entity_word_end"] - 1) // 2).tolist()))
    assert got_words == expected
    assert _decode(out[prefix + "entity_text"]) == [
        " ".join(served["split"][i][first:last + 1]) for i, _, first, last in expected]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    return write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt", VOCAB)


def _serving_module(vocab_file, labels, scheme="IOB2", dtype=None, **config):
    """The ServingModule and chunk tables of a random tagger (signatures run eagerly)."""
    keras.utils.set_random_seed(4)
    model = build_tagging_model(_config(), len(labels), dtype=dtype)
    settings = families.serving_config("tagger", vocab_file, True, SEQ, labels=tuple(labels),
                                       tag_scheme=scheme, doc_stride=DOC_STRIDE, **config)
    module = serving.ServingModule(model, settings)
    return module, tagger_export.ChunkTables(settings)


# Label sets of each scheme, plus tags conlleval splits oddly (no type, "0" type, a hyphen
# in the type, bracket chunks, a bare prefix).
SCHEME_LABELS = {
    "IOB1": ("O", "B-LOC", "B-PER", "I-LOC", "I-PER"),
    "IOB2": ("O", "B-ORG", "B-PER", "I-ORG", "I-PER"),
    "IOBES": ("O", "B-PER", "E-PER", "I-PER", "S-LOC", "S-PER", "B-LOC", "E-LOC"),
    "IOE": ("O", "E-PER", "I-PER", "I-LOC", "E-LOC"),
    "odd": ("O", "B", "I", "B-0", "I-ORG-X", "B-ORG-X", "[", "]", "E-", "S-A", ".", "X"),
}


@pytest.mark.parametrize("scheme", sorted(SCHEME_LABELS))
def test_entity_decoding_equals_metrics_chunks(vocab_file, scheme):
    """decode_entities (the graph) == metrics.chunks on random tag sequences of every
    scheme, several sequences (with empty ones) in one batch."""
    labels = SCHEME_LABELS[scheme]
    if scheme == "odd":  # not chunk tags for the exporter's checks: the tables directly
        tables = tagger_export.ChunkTables(types.SimpleNamespace(labels=labels,
                                                                 tag_scheme="IOB2"))
    else:
        tables = tagger_export.ChunkTables(families.serving_config(
            "tagger", vocab_file, True, SEQ, labels=labels, tag_scheme=scheme))
    rng = np.random.default_rng(len(scheme))
    sequences = [rng.integers(0, len(labels), int(rng.integers(0, 12))).tolist()
                 for _ in range(300)] + [[], [0, 0]]
    got = tagger_export.decode_entities(
        tables, tf.ragged.constant(sequences, tf.int32, ragged_rank=1))
    expected = [(i, kind, first, last) for i, seq in enumerate(sequences)
                for kind, first, last in metrics.chunks([labels[t] for t in seq])]
    found = list(zip(got["example"].numpy().tolist(), _decode(got["type"].numpy()),
                     got["first"].numpy().tolist(), got["last"].numpy().tolist()))
    assert found == expected and len(expected) > 100


def test_tag_scheme_none_returns_no_entities(vocab_file):
    labels = ("NN", "VB", "DT")
    serving = families.serving_config("tagger", vocab_file, True, SEQ, labels=labels,
                                      tag_scheme="none")
    got = tagger_export.decode_entities(tagger_export.ChunkTables(serving),
                                        tf.ragged.constant([[0, 1, 2, 0]], tf.int32))
    assert got["example"].shape == (0,)
    with pytest.raises(ExportError, match="not all chunk tags"):
        families.serving_config("tagger", vocab_file, True, SEQ, labels=labels,
                                tag_scheme="IOB2")


@pytest.mark.parametrize("settings, message", [
    (dict(labels=()), "needs its label names"),
    (dict(labels=("O", "B-PER", "O")), "repeat a name"),
    (dict(tag_scheme="BIO"), "tag_scheme='BIO' is not one of"),
    (dict(doc_stride=0), "doc_stride=0 and max_context_windows=64 must be positive"),
    (dict(max_context_windows=0), "must be positive"),
    (dict(feature_based=True, feature_layers="last_two"), "feature_layers='last_two'"),
    (dict(feature_based=True, lstm_units=-1), "lstm_units=-1 must not be negative"),
])
def test_tagger_settings_that_cannot_work_are_refused(vocab_file, settings, message):
    config = dict(labels=IOB2)
    config.update(settings)
    with pytest.raises(ExportError, match=message):
        families.serving_config("tagger", vocab_file, True, SEQ, **config)


def test_bfloat16_tagger_outputs_float32_and_too_many_windows(vocab_file):
    module, tables = _serving_module(vocab_file, IOB2, dtype="mixed_bfloat16",
                                     max_context_windows=3)
    out = tagger_export._serve_text(module, tables, tf.constant(["the cat sat", ""]))
    assert out["word_probability"].dtype == tf.float32
    assert out["word_probabilities"].dtype == tf.float32
    assert _decode(out["word_text"].numpy()) == ["the", "cat", "sat"]
    # 14 pieces fit one window; each 5 more need another: 24 pieces fit 3, 25 need 4.
    tagger_export._serve_text(module, tables, tf.constant([" ".join(["the"] * 24)]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"a text {serving.TOO_MANY_WINDOWS}=3"):
        tagger_export._serve_text(module, tables, tf.constant(["a", " ".join(["the"] * 25)]))


def test_tag_words_unknown_and_empty_words(vocab_file):
    """A pre-split word that tokenizes to nothing is [UNK] (the training path); rows of
    padding only give no tags."""
    module, tables = _serving_module(vocab_file, IOB2)
    out = tagger_export._serve_words(module, tables, tf.constant(
        [["\x01", "", "cat"], ["", "", ""]]))
    tags = [_decode(row) for row in out["word_tag"].numpy()]
    assert tags[1] == ["", "", ""] and tags[0][1] == ""
    np.testing.assert_array_equal(out["word_probability"].numpy()[1], 0.0)
    label, probability, _, _ = tagger_export._tag(module, {"pieces": tf.ragged.constant(
        [[[VOCAB.index("[UNK]")], [VOCAB.index("cat")]]], tf.int64, ragged_rank=2)})
    assert [tags[0][0], tags[0][2]] == [IOB2[i] for i in label.numpy()]
    np.testing.assert_array_equal(out["word_probability"].numpy()[0][[0, 2]],
                                  probability.numpy())


@pytest.mark.slow
def test_cli_refuses_metadata_of_another_run(tmp_path):
    """A classifier run's export_metadata.json is not a tagging run's: a clear error, exit
    status 1, nothing written."""
    from modeling.models import BertClassifier

    keras.utils.set_random_seed(5)
    run = tmp_path / "classifier_run"
    run.mkdir()
    write_vocab(run / "vocab.txt", VOCAB)
    _config().to_json_file(str(run / "bert_config.json"))
    _save_like_training(BertClassifier(_config(), 2), run)
    write_export_metadata(str(run), ExportMetadata(
        task="mrpc", labels=("0", "1"), max_seq_length=SEQ, text_pair=True,
        model_type="classifier"))
    result = _cli("--model_type=tagger", f"--init_checkpoint={run}",
                  f"--export_dir={tmp_path / 'out'}")
    assert result.code == 1, result.stderr[-2000:]
    assert "task='mrpc'" in result.stderr and "run_ner.py" in result.stderr
    assert not (tmp_path / "out").exists()
    assert json.loads((run / "export_metadata.json").read_text())["task"] == "mrpc"


def test_cli_everything_explicit_without_metadata(served, tmp_path):
    """A checkpoint without export_metadata.json (e.g. trained elsewhere): the flags give
    labels, casing, length, tag scheme and the feature-based model. The served
    feature-based export is the one made from them (`served`; its tests compare it to the
    Python path), and they are the settings the run's metadata gives, from which
    `export_saved_model.build_serving_config` builds the same export. Without
    --doc_stride the windows are run_ner.py's default (half a window apart), not the
    SQuAD flag's 128; a setting of another family is refused."""
    marker = json.loads((Path(served["dirs"]["feature"]) / "assets.extra" /
                         METADATA_FILE).read_text())
    assert marker["doc_stride"] == DOC_STRIDE and marker["tag_scheme"] == "IOBES"
    assert marker["feature_based"] and marker["lstm_units"] == 8
    assert marker["feature_layers"] == "weighted_sum_all" and marker["labels"] == list(IOBES)
    assert marker["max_seq_length"] == SEQ and marker["do_lower_case"]
    given = {"label_list": list(IOBES), "tag_scheme": "IOBES", "feature_based": True,
             "feature_layers": "weighted_sum_all", "lstm_units": 8}
    family = registry.get_family("tagger")
    from_run = family.settings({}, registry.read_run_metadata(
        str(served["runs"]["feature"]), family), SEQ)
    assert family.settings({**given, "doc_stride": DOC_STRIDE}, None, SEQ) == from_run
    # The same flags but --doc_stride, no metadata: the family's settings (what the export
    # is built from) take run_ner.py's default.
    assert family.settings(given, None, SEQ)["doc_stride"] == (SEQ - 2) // 2

    explicit = ["--model_type=tagger", f"--init_checkpoint={served['bare']}", *FEATURE_FLAGS]
    result = _cli(*explicit, "--tag_scheme=BIO", f"--export_dir={tmp_path / 'no'}")
    assert result.code == 1 and "tag_scheme='BIO' is not one of" in result.stderr
    assert not (tmp_path / "no").exists()
    result = _cli(*explicit, "--n_best_size=5", f"--export_dir={tmp_path / 'no'}")
    assert result.code == 1
    assert "--n_best_size does not apply to --model_type=tagger (it is for: squad)" in \
        result.stderr
    assert not (tmp_path / "no").exists()


@pytest.mark.slow
def test_predict_saved_model_shows_entities_per_input(served, tmp_path, capsys):
    """predict_saved_model.py gathers the flattened entity_* / word_* outputs per input by
    their example index (called in this process: that the script serves with tensorflow
    + tensorflow_text only is test_predict_saved_model's)."""
    import predict_saved_model

    texts = [TEXTS[0], "", TEXTS[2]]
    out_json = tmp_path / "predictions.json"
    code = predict_saved_model.main([f"--export_dir={served['dirs']['fine']}",
                                     f"--output_json={out_json}",
                                     *[f"--text={t}" for t in texts]])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr[-3000:]
    rows = json.loads(out_json.read_text(encoding="utf-8"))["predictions"]
    out = served["outputs"]
    words, tags = _words_by_example(out, "fine"), _words_by_example(out, "fine", "word_tag")
    prefix = "fine/serving_default/"
    example = out[prefix + "entity_example_index"]
    for row, i in zip(rows, [0, 3, 2], strict=True):
        assert row["word_text"] == words[i] and row["word_tag"] == tags[i]
        assert row["entity_text"] == [t for e, t in zip(example, _decode(
            out[prefix + "entity_text"])) if e == i]
    assert rows[0]["entity_text"] and rows[1]["entity_text"] == []
    lines = stdout.strip().splitlines()
    assert len(lines) == 3 and lines[1].endswith("entities: none; tags: ")
    assert f"{rows[0]['entity_text'][0]!r} {rows[0]['entity_type'][0]}" in lines[0]


# The first part of `served`'s serving process, run before it loads or serves anything
# else (what a process of its own measured): the peak RSS growth of one request to the
# fine-tuned export for each text of `MEMORY_WORDS` words, from memory_args.json in the
# process's folder to memory.json there ({words: MB}).
MEMORY_WORDS = [4000, 16000]
MEMORY_SCRIPT = textwrap.dedent("""
    import json, resource
    import tensorflow_text  # noqa: F401
    import tensorflow as tf

    directory, words_list = json.load(open("memory_args.json", encoding="utf-8"))
    LOADED = {directory: tf.saved_model.load(directory)}  # SERVE_SCRIPT serves it after
    serve = LOADED[directory].signatures["serving_default"]
    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    serve(text=tf.constant(["the cat sat."]))
    base, growth = peak_mb(), {}
    for words in words_list:
        out = serve(text=tf.constant([" ".join(["the cat sat on the mat ."] * (words // 7))]))
        growth[int(out["word_tag"].shape[0])] = peak_mb() - base
    json.dump(growth, open("memory.json", "w", encoding="utf-8"))
    del serve, out
""")


@pytest.mark.slow
def test_request_memory_grows_linearly_with_the_text(served):
    """Peak RSS growth of one request, in a fresh process (`served`'s, measured before it
    does anything else: `MEMORY_SCRIPT`), for ~4k and ~16k words (~800 and ~3200 windows;
    the fine-tuned export allows MAX_CONTEXT_WINDOWS). A version that sliced word and
    entity texts with tf.strings.substr on a copy of the whole text per slice grew +60 MB
    and +930 MB (x15 for x4 words); the linear one +15 MB and +67 MB. The bounds (300 MB,
    and x2.5 the linear extrapolation) leave room for allocator noise and fail for the
    quadratic one."""
    growth = {int(k): v for k, v in served["memory"].items()}
    (small, g_small), (large, g_large) = sorted(growth.items())
    assert 3900 <= small <= 4000 and large >= 4 * small - 10
    assert g_large < 300, growth
    assert g_large < 2.5 * (large / small) * max(g_small, 10), growth
