"""The serving SavedModel: reloaded with only tensorflow + tensorflow-text, equal to the
Python path (FullTokenizer + the Keras model) on raw strings; export_saved_model.py errors."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import TINY_VOCAB, run_isolated, write_vocab
from data_prep.tokenization import FullTokenizer
from modeling.export import families, registry, serving, writer
from modeling.export.metadata import ExportError, ExportMetadata, write_export_metadata
from modeling.config import BertConfig
from modeling.encoder import BertEncoder
from modeling.models import BertClassifier, BertSpanLabeler
from modeling.optimization import OptimizerConfig, create_optimizer
from tasks.classification.data import InputExample, convert_single_example
from tasks import register_serving_families
from training import checkpointing
from tests.clis import call_main

# The families register as their modules are imported (export_saved_model.py does this).
register_serving_families()

# Enough non-Latin pieces that Greek, CJK and Arabic give real ids, not only [UNK]; the
# sigma pieces and U+1DF00 show the one measured in-graph difference (final sigma).
VOCAB = TINY_VOCAB + ["κ", "##α", "##λ", "##η", "##μ", "##ε", "##ρ", "你", "好", "世", "界",
                      "م", "##ر", "##ح", "##ب", "##ا", "α", "##σ", "##ς", "##\U0001DF00"]
LABELS = ["neg", "neutral", "pos"]
SEQ = 32
LONG = " ".join(["the big red dog ran far away home"] * 40)  # ~320 tokens: truncated
TEXTS = ["The cat sat on the mat.", "", LONG, "Καλημέρα κόσμε", "你好，世界",
         "مرحبا بالعالم", "unaffable dogs! \U0001F600", "a" * 250, "\u200b\x01 \t"]
PAIRS = ["A dog ran far away.", "the mat", "short", LONG, "", "你好", "مرحبا", "Καλη", ""]
# The documented difference: U+1DF00 is a lower-case letter since Unicode 14 (Python 3.11)
# but not for tf.strings.lower, so Python lowers the capital sigma before it to σ (not
# final) and the graph to ς.
SIGMA_CASE = "ΑΣ\U0001DF00"
SQUAD_QUESTIONS = ["who sat?", "", LONG, "你好"]
SQUAD_CONTEXTS = ["The cat sat on the mat far away.", "the dog", LONG + " the end.", ""]
DOC_STRIDE = 16
N_BEST = 10
LONG_CONTEXT_WINDOWS = 800  # the served SQuAD export's limit: the long-context tests'

SERVE_SCRIPT = textwrap.dedent("""
    import json, sys
    import tensorflow_text  # noqa: F401  (registers the ops the graph uses)
    import tensorflow as tf
    import numpy as np
    args = json.load(open(sys.argv[1], encoding="utf-8"))
    out = {}
    for name, spec in args.items():
        # An export a script before this one loaded (LOADED: {dir: loaded}) is served from
        # that load: one load of each export per process.
        loaded = globals().get("LOADED", {}).get(spec["dir"]) or tf.saved_model.load(
            spec["dir"])
        for sig, inputs in spec["calls"].items():
            fn = loaded.signatures[sig]
            feed = {k: tf.constant(v, tf.string if np.asarray(v).dtype.kind in "UO"
                                   else tf.int32) for k, v in inputs.items()}
            for key, value in fn(**feed).items():
                out[f"{name}/{sig}/{key}"] = value.numpy()
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in
                    ("modeling", "data_prep", "training", "tasks"))
    out["leaked"] = np.array(leaked, dtype=object)
    np.savez(sys.argv[2], **out)
""")


def python_features(tokenizer, texts, text_pairs, max_seq_length: int,
                    head_tokens: int | None = None) -> dict:
    """The Python path's model inputs (FullTokenizer + the original classifier rules): the
    reference the in-graph packing is tested against (the exports' tests share it).

    Args:
      tokenizer: a ``data_prep.tokenization.FullTokenizer``.
      texts, text_pairs: sequences of strings (text_pairs None for single texts).
      head_tokens: head+tail truncation (``--long_document=head_tail``); None: truncate.
    Returns:
      dict of int32 numpy arrays [batch, max_seq_length]: input_ids, input_mask, segment_ids.
    """
    rows = []
    for i, text in enumerate(texts):
        example = InputExample(str(i), text, None if text_pairs is None else text_pairs[i],
                               label=0.0)
        rows.append(convert_single_example(example, None, max_seq_length, tokenizer,
                                           is_regression=True, head_tokens=head_tokens))
    return {name: np.asarray([getattr(r, name) for r in rows], np.int32).reshape(
        len(rows), max_seq_length) for name in ("input_ids", "input_mask", "segment_ids")}


def _config():
    return BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64,
                      max_position_embeddings=64, initializer_range=0.2)


def _save_like_training(model, directory):
    """tf.train.Checkpoint(model, optimizer, step) through the training loop's saver."""
    optimizer = create_optimizer(OptimizerConfig(num_train_steps=10, num_warmup_steps=1))
    optimizer.build(model.trainable_variables)
    step = tf.Variable(7, dtype=tf.int64, trainable=False, name="global_step")
    saver = checkpointing.CheckpointSaver(
        checkpointing.make_checkpoint(model, optimizer, step), str(directory))
    return saver.save(7)


def _cli(*flags, cwd=None):
    """export_saved_model.py's command line, in this process (tests/clis.py)."""
    return call_main("export_saved_model", flags, cwd=cwd)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A fine-tuning output_dir as run_classifier.py leaves it: checkpoint, config, vocab,
    export_metadata.json (a 3-label pair task)."""
    keras.utils.set_random_seed(1)
    d = tmp_path_factory.mktemp("run")
    write_vocab(d / "vocab.txt", VOCAB)
    _config().to_json_file(str(d / "bert_config.json"))
    model = BertClassifier(_config(), len(LABELS))
    _save_like_training(model, d)
    write_export_metadata(str(d), ExportMetadata(
        task="toy", labels=tuple(LABELS), do_lower_case=True, max_seq_length=SEQ,
        text_pair=True))
    return d, model


@pytest.fixture(scope="module")
def served(run_dir, tmp_path_factory):
    """Exports a classifier (CLI), an encoder and a SQuAD model (library; its windows up to
    LONG_CONTEXT_WINDOWS, for the long-context tests), then serves all three from one fresh
    process with no project code on its path. That process first measures the SQuAD
    export's request memory (`MEMORY_SCRIPT`, before it loads or serves anything else)."""
    d, _ = run_dir
    out = tmp_path_factory.mktemp("exports")
    result = _cli(f"--init_checkpoint={d}", f"--export_dir={out / 'classifier'}")
    assert result.code == 0, result.stderr[-3000:]
    assert "labels=['neg', 'neutral', 'pos']" in result.stdout

    keras.utils.set_random_seed(2)
    encoder = BertEncoder(_config())
    writer.export_saved_model(encoder, families.serving_config(
        "encoder", str(d / "vocab.txt"), True, SEQ), str(out / "encoder"))
    squad = BertSpanLabeler(_config())
    writer.export_saved_model(squad, families.serving_config(
        "squad", str(d / "vocab.txt"), True, SEQ, max_query_length=8, max_answer_length=5,
        doc_stride=DOC_STRIDE, n_best_size=N_BEST,
        max_context_windows=LONG_CONTEXT_WINDOWS), str(out / "squad"))

    texts = TEXTS + [SIGMA_CASE]
    pairs = PAIRS + ["dog"]
    questions, contexts = SQUAD_QUESTIONS, SQUAD_CONTEXTS
    ids = python_features(FullTokenizer(str(d / "vocab.txt")), texts, None, SEQ)
    calls = {
        "classifier": {"dir": str(out / "classifier"), "calls": {
            "serving_default": {"text": texts, "text_pair": pairs},
            "preprocess": {"text": texts, "text_pair": pairs}}},
        "encoder": {"dir": str(out / "encoder"), "calls": {
            "serving_default": {"text": texts},
            "serving_all_layers": {"text": texts},
            "preprocess": {"text": texts},
            "encode": {k: v.tolist() for k, v in ids.items()}}},
        "squad": {"dir": str(out / "squad"), "calls": {
            "serving_default": {"question": questions, "context": contexts},
            "preprocess": {"question": questions, "context": contexts}}},
    }
    work = tmp_path_factory.mktemp("elsewhere")
    (work / "memory_args.json").write_text(json.dumps([str(out / "squad"), MEMORY_REPEATS]))
    outputs = run_isolated(work, MEMORY_SCRIPT + SERVE_SCRIPT, calls)
    memory = json.loads((work / "memory.json").read_text())
    return dict(outputs=outputs, encoder=encoder, squad=squad, vocab=str(d / "vocab.txt"),
                dirs=out, texts=texts, pairs=pairs, contexts=contexts, memory=memory)


def _python_probabilities(model, vocab, texts, pairs):
    features = python_features(FullTokenizer(vocab), texts, pairs, SEQ)
    logits = model({k: tf.constant(v) for k, v in features.items()})["logits"]
    return features, tf.nn.softmax(tf.cast(logits, tf.float32)).numpy()


@pytest.mark.slow
def test_classifier_served_from_fresh_process_equals_python_path(run_dir, served):
    _, model = run_dir
    out = served["outputs"]
    assert list(out["leaked"]) == []
    texts, pairs = served["texts"][:-1], served["pairs"][:-1]
    features, expected = _python_probabilities(model, served["vocab"], texts, pairs)
    for key, value in features.items():
        np.testing.assert_array_equal(out[f"classifier/preprocess/{key}"][:-1], value, key)
    probabilities = out["classifier/serving_default/probabilities"]
    assert probabilities.shape == (len(TEXTS) + 1, 3) and probabilities.dtype == np.float32
    np.testing.assert_allclose(probabilities[:-1], expected, atol=1e-5, rtol=0)
    assert np.abs(probabilities[:-1] - expected).max() < 1e-5
    labels = [x.decode() for x in out["classifier/serving_default/label"]]
    assert labels[:-1] == [LABELS[i] for i in expected.argmax(-1)]
    # The long text is truncated to SEQ (pair: both sides trimmed), the empty pair side
    # makes a one-segment input (as the original), the empty text is [CLS] [SEP].
    mask = out["classifier/preprocess/input_mask"]
    assert mask[2].sum() == SEQ and mask[3].sum() == SEQ
    assert out["classifier/preprocess/segment_ids"][4].max() == 0
    assert len(set(np.round(probabilities[:, 0], 6))) > 3  # the outputs do depend on the text


@pytest.mark.slow
def test_in_graph_tokenization_difference_is_the_documented_one(served):
    """docs/export.md: final sigma beside a letter new in Unicode 14 (uncased)."""
    tokenizer = FullTokenizer(served["vocab"])
    python = tokenizer.tokenize(SIGMA_CASE)
    assert python == ["α", "##σ", "##\U0001DF00"]
    graph_ids = served["outputs"]["encoder/preprocess/input_ids"][-1]
    graph = [VOCAB[i] for i in graph_ids[1:4]]
    assert graph == ["α", "##ς", "##\U0001DF00"]


@pytest.mark.slow
def test_encoder_export_equals_python_path(served):
    out, encoder = served["outputs"], served["encoder"]
    texts = served["texts"][:-1]
    features = python_features(FullTokenizer(served["vocab"]), texts, None, SEQ)
    for key, value in features.items():
        np.testing.assert_array_equal(out[f"encoder/preprocess/{key}"][:-1], value, key)
    expected = encoder({k: tf.constant(v) for k, v in features.items()})
    # Every layer only where asked for (issue 25: ~38 MB a batch of 32 for MiniLM).
    assert "encoder/serving_default/encoder_outputs" not in out
    for sig in ("serving_default", "serving_all_layers", "encode"):
        n = -1  # the last row is SIGMA_CASE, tested above
        for key in ("pooled_output", "sequence_output"):
            np.testing.assert_allclose(out[f"encoder/{sig}/{key}"][:n], expected[key].numpy(),
                                       atol=1e-5, rtol=0, err_msg=f"{sig}/{key}")
        if sig == "serving_default":
            continue
        layers = out[f"encoder/{sig}/encoder_outputs"][:n]
        assert layers.shape == (len(texts), 2, SEQ, 32)
        np.testing.assert_allclose(layers, np.stack(
            [x.numpy() for x in expected["encoder_outputs"]], axis=1), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_squad_export_equals_python_postprocessing(served):
    """Windows equal tasks.squad.data's features; on the exported logits, each example's
    best span is the one tasks.squad.postprocess.compute_predictions ranks first."""
    from tasks.squad import data as squad
    from tasks.squad import postprocess

    out = served["outputs"]
    tokenizer = FullTokenizer(served["vocab"])
    examples = [squad.SquadExample(str(i), q, squad.split_context(c)[0])
                for i, (q, c) in enumerate(zip(SQUAD_QUESTIONS, SQUAD_CONTEXTS))]
    features = list(squad.iter_features(examples, tokenizer, squad.WindowConfig(
        max_seq_length=SEQ, doc_stride=DOC_STRIDE, max_query_length=8), is_training=False))
    example = out["squad/serving_default/window_example_index"]
    np.testing.assert_array_equal(example, out["squad/preprocess/window_example_index"])
    # The empty context: one window here, none in the Python path (see docs/export.md).
    rows = [w for w in range(len(example)) if SQUAD_CONTEXTS[example[w]]]
    assert example[rows].tolist() == [f.example_index for f in features]
    assert len(features) > 6  # the long context spans several windows
    for key in ("input_ids", "input_mask", "segment_ids"):
        np.testing.assert_array_equal(out[f"squad/preprocess/{key}"][rows],
                                      [getattr(f, key) for f in features], key)
    start = out["squad/serving_default/window_start_logits"]
    end = out["squad/serving_default/window_end_logits"]
    assert start.shape == end.shape == (len(example), SEQ)
    logits = served["squad"]({k: tf.constant(out[f"squad/preprocess/{k}"])
                              for k in ("input_ids", "input_mask", "segment_ids")})
    np.testing.assert_allclose(start, logits["start_logits"].numpy(), atol=1e-5, rtol=0)

    predictions = postprocess.compute_predictions(
        examples, features, ([f.unique_id for f in features], start[rows], end[rows]),
        postprocess.PostprocessConfig(n_best_size=N_BEST, max_answer_length=5))
    found = 0
    for i, context in enumerate(SQUAD_CONTEXTS):
        best = predictions.nbest[str(i)][0]
        score = out["squad/serving_default/score"][i]
        text = out["squad/serving_default/answer_text"][i].decode()
        a, b = (out[f"squad/serving_default/answer_{k}"][i] for k in ("start", "end"))
        if best["text"] == "empty":  # no valid span (the original's placeholder)
            assert (score, text, a, b) == (-np.inf, "", -1, -1)
            continue
        found += 1
        np.testing.assert_allclose(score, best["start_logit"] + best["end_logit"], atol=1e-5)
        # tok_text vs the original's get_final_text: same characters, spacing aside.
        assert text.replace(" ", "") == best["text"].lower().replace(" ", "")
        tokens = tokenizer.tokenize(context)[a:b + 1]
        assert text == " ".join(tokens).replace(" ##", "").replace("##", "").strip()
    assert found >= 2
    null = [min(start[w, 0] + end[w, 0] for w in range(len(example)) if example[w] == i)
            for i in range(len(SQUAD_CONTEXTS))]
    np.testing.assert_allclose(out["squad/serving_default/null_score"], null, atol=1e-6)


def _windows_of(cases, offset):
    """pack_squad's window dict for examples given as (tokens, window length, stride)."""
    from tasks.squad.data import doc_spans_for

    spans = [doc_spans_for(n, span, stride) for n, span, stride in cases]

    def per_window(values):
        return tf.constant([v for v, s in zip(values, spans) for _ in s], tf.int64)

    windows = {
        "example": per_window(range(len(cases))),
        "index": tf.constant([k for s in spans for k in range(len(s))], tf.int64),
        "doc_start": tf.constant([w.start for s in spans for w in s], tf.int64),
        "context_length": tf.constant([w.length for s in spans for w in s], tf.int64),
        "stride": per_window([min(stride, span) for _, span, stride in cases]),
        "span": per_window([span for _, span, _ in cases]),
        "doc_length": per_window([n for n, _, _ in cases]),
        "num_windows": per_window([len(s) for s in spans]),
    }
    windows["context_start"] = tf.fill(tf.shape(windows["example"]),
                                       tf.constant(offset, tf.int64))
    return spans, windows


def test_max_context_rule_equals_data_prep_squad():
    """The in-graph max-context mask against squad.max_context_span_index, examples with
    different window layouts in one batch: ties, a short last window, stride 1, strides
    that do not divide the window, one window, windows as long as the stride."""
    from tasks.squad.data import max_context_span_index

    cases = [(50, 12, 5), (30, 10, 10), (9, 10, 4), (40, 13, 1), (61, 16, 7), (33, 8, 3),
             (100, 14, 6), (17, 17, 5), (18, 17, 20), (1, 5, 2), (64, 11, 11), (57, 12, 12),
             (80, 9, 4)]
    offset, seq = 3, 24
    spans, windows = _windows_of(cases, offset)
    got = serving.max_context(windows, tf.range(seq, dtype=tf.int64)[None, :]).numpy()
    row = 0
    for (n, _, _), s in zip(cases, spans):
        best = max_context_span_index(s, n)
        for k, w in enumerate(s):
            expected = [best[w.start + i] == k for i in range(w.length)]
            assert got[row, offset:offset + w.length].tolist() == expected, (n, k)
            # Positions outside the window's context are never its max-context tokens.
            assert not got[row, :offset].any() and not got[row, offset + w.length:].any()
            row += 1
    assert row > 60 and not got.all()  # the rule does exclude positions


def test_max_context_rule_random_layouts():
    """A seeded sweep of window layouts (incl. every stride up to the window length)."""
    from tasks.squad.data import max_context_span_index

    rng = np.random.default_rng(5)
    cases = []
    for _ in range(60):
        span = int(rng.integers(1, 20))
        cases.append((int(rng.integers(1, 90)), span, int(rng.integers(1, span + 3))))
    spans, windows = _windows_of(cases, 2)
    got = serving.max_context(windows, tf.range(24, dtype=tf.int64)[None, :]).numpy()
    row = 0
    for (n, _, _), s in zip(cases, spans):
        best = max_context_span_index(s, n)
        for k, w in enumerate(s):
            assert got[row, 2:2 + w.length].tolist() == [
                best[w.start + i] == k for i in range(w.length)], (n, s, k)
            row += 1


def test_bfloat16_model_exports_float32_outputs(tmp_path):
    vocab = write_vocab(tmp_path / "vocab.txt", VOCAB)
    keras.utils.set_random_seed(3)
    model = BertClassifier(_config(), 2, dtype="mixed_bfloat16")
    serving = families.serving_config("classifier", vocab, True, SEQ, labels=("no", "yes"))
    writer.export_saved_model(model, serving, str(tmp_path / "bf16"))
    loaded = tf.saved_model.load(str(tmp_path / "bf16"))
    got = loaded.signatures["serving_default"](text=tf.constant(TEXTS))
    assert got["probabilities"].dtype == tf.float32
    _, expected = _python_probabilities(model, vocab, TEXTS, None)
    # Same bfloat16 arithmetic, but graph vs eager may fuse and round differently.
    np.testing.assert_allclose(got["probabilities"].numpy(), expected, atol=1e-2, rtol=0)
    enc = loaded.signatures["encode"](**{k: tf.constant(v) for k, v in python_features(
        FullTokenizer(vocab), TEXTS, None, SEQ).items()})
    assert enc["sequence_output"].dtype == tf.float32


def test_export_is_atomic_and_refuses_to_overwrite(tmp_path):
    vocab = write_vocab(tmp_path / "vocab.txt", VOCAB)
    model = BertClassifier(_config(), 2)
    target = tmp_path / "exp"
    target.mkdir()
    (target / "keep.txt").write_text("old")
    serving = families.serving_config("classifier", vocab, True, SEQ, labels=("a", "b"))
    with pytest.raises(ExportError, match="exists and is not empty"):
        writer.export_saved_model(model, serving, str(target))
    with pytest.raises(ExportError, match="2 outputs but 3 labels"):
        writer.export_saved_model(model, families.serving_config(
            "classifier", vocab, True, SEQ, labels=("a", "b", "c")), str(tmp_path / "x"))
    assert sorted(os.listdir(tmp_path)) == ["exp", "vocab.txt"]  # no temporary left behind


def test_metadata_round_trip_and_errors(tmp_path):
    meta = ExportMetadata(task="mrpc", labels=("0", "1"), text_pair=True,
                          max_seq_length=64)
    write_export_metadata(str(tmp_path), meta)
    assert registry.read_run_metadata(str(tmp_path)) == meta
    (tmp_path / "bad.json").write_text('{"labels": ["a"], "colour": 1}')
    with pytest.raises(ExportError, match="unknown keys"):
        registry.read_run_metadata(str(tmp_path / "bad.json"))


@pytest.mark.parametrize("flags,message", [
    (["--init_checkpoint={tmp}/nothing_here"], "--init_checkpoint"),
    (["--init_checkpoint={run}", "--num_labels=2", "--label_list=a,b,c"],
     "label count mismatch"),
    (["--init_checkpoint={run}", "--label_list=a,b"], "classifier head"),
    (["--init_checkpoint={run}", "--metadata_file={tmp}/none.json"],
     "--metadata_file={tmp}/none.json: no such file"),
    (["--init_checkpoint={bare}", "--label_list=a,b,c"],
     "--bert_config_file is required: no bert_config.json / config.json beside {bare}"),
    # The run's vocab capitalised (same size): served lower-cased, as the run's metadata
    # says, no capitalised token would ever match (a train/serve skew).
    (["--init_checkpoint={run}", "--vocab_file={tmp}/cased_vocab.txt"],
     "--do_lower_case=true but vocab file"),
])
def test_cli_bad_flags_exit_non_zero(run_dir, tmp_path, flags, message):
    import shutil

    d, _ = run_dir
    bare = tmp_path / "weights_alone"  # the checkpoint without its config and metadata
    shutil.copytree(d, bare, ignore=shutil.ignore_patterns("*.json"))
    (tmp_path / "cased_vocab.txt").write_text("".join(
        (token if token.startswith("[") else token.capitalize()) + "\n"
        for token in (d / "vocab.txt").read_text().splitlines()))
    flags = [f.format(tmp=tmp_path, run=d, bare=bare) for f in flags]
    message = message.format(tmp=tmp_path, bare=bare)
    result = call_main("export_saved_model", [*flags, f"--export_dir={tmp_path / 'out'}"])
    assert result.code == 1
    assert "export_saved_model.py: error: " in result.stderr and message in result.stderr, \
        result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_cli_without_export_dir_is_refused_in_one_line(tmp_path):
    result = call_main("export_saved_model", [f"--init_checkpoint={tmp_path}"])
    assert result.code == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "export_saved_model.py: error: --export_dir is required")


# --------------------------------------------------------------------------- --overwrite


def _fake_export(path, model_type="classifier", extra=()):
    """A directory laid out like one of our exports (the marker is what is checked)."""
    (path / "variables").mkdir(parents=True)
    (path / "saved_model.pb").write_bytes(b"pb")
    (path / "assets.extra").mkdir()
    (path / "assets.extra" / "export_metadata.json").write_text(
        json.dumps({"model_type": model_type}))
    for name in extra:
        (path / name).write_text("user data")
    return str(path)


def test_overwrite_replaces_only_our_exports_never_inputs(tmp_path):
    """Issue 10: --overwrite deleted whatever --export_dir named, the checkpoint included."""
    run = tmp_path / "runs" / "mrpc"
    run.mkdir(parents=True)
    (run / "ckpt-3.index").write_text("checkpoint")
    (tmp_path / "vocabs").mkdir()
    (tmp_path / "vocabs" / "vocab.txt").write_text("[PAD]\n")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    (tmp_path / "a_file").write_text("mine")
    other_saved_model = tmp_path / "other_sm"
    other_saved_model.mkdir()
    (other_saved_model / "saved_model.pb").write_bytes(b"pb")
    ours = _fake_export(tmp_path / "ours")
    ours_plus = _fake_export(tmp_path / "ours_plus", extra=["notes.txt"])
    (tmp_path / "empty").mkdir()
    inputs = [("--init_checkpoint", str(run / "ckpt-3")),
              ("--vocab_file", str(tmp_path / "vocabs" / "vocab.txt"))]
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))

    refused = {
        str(run): "is the directory of --init_checkpoint",
        str(run.parent): "contains the directory of --init_checkpoint",
        str(tmp_path): "contains the directory of --init_checkpoint",
        str(run / "export"): "inside the checkpoint directory",
        str(tmp_path / "vocabs"): "is the directory of --vocab_file",
        str(tmp_path / "foreign"): "not an export written by this project",
        str(tmp_path / "a_file"): "is a file",
        str(other_saved_model): "not an export written by this project",
        ours_plus: "not an export written by this project",
    }
    for target, message in refused.items():
        with pytest.raises(ExportError, match=message) as err:
            writer.check_export_dir(target, overwrite=True, inputs=inputs)
        assert "--export_dir=" in str(err.value), target
    with pytest.raises(ExportError, match="previous classifier export.*--overwrite"):
        writer.check_export_dir(ours, overwrite=False, inputs=inputs)
    for target in (ours, str(tmp_path / "empty"), str(tmp_path / "new" / "dir")):
        writer.check_export_dir(target, overwrite=True, inputs=inputs)
    assert writer.export_kind(ours) == "classifier" and writer.export_kind(ours_plus) is None
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_overwrite_swaps_in_the_new_export_and_cleans_stale_temporaries(served, tmp_path):
    """--overwrite replaces a previous export with the new one whole and removes the
    temporary of a killed export. The new export is a regression head on text pairs: it
    serves score and logits, equal to the Keras model's on the Python path's features."""
    import shutil

    from data_prep import fileio

    vocab = write_vocab(tmp_path / "vocab.txt", VOCAB)
    serving = families.serving_config("classifier", vocab, True, SEQ, is_regression=True,
                                      text_pair=True)
    target = tmp_path / "exp"
    shutil.copytree(served["dirs"] / "classifier", target)  # an export of 3 labels
    keras.utils.set_random_seed(4)
    second = BertClassifier(_config(), 1)
    # A temporary left by a killed export (its process is gone): removed by the next run.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".exp{fileio.TEMP_MARK}{fileio._HOST}-{dead.pid}-0badcafe"
    stale.mkdir()
    (stale / "saved_model.pb").write_bytes(b"half")
    writer.export_saved_model(second, serving, str(target), overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["exp", "vocab.txt"]
    serve = tf.saved_model.load(str(target)).signatures["serving_default"]
    got = serve(text=tf.constant(TEXTS), text_pair=tf.constant(PAIRS))
    # the two exports are told apart (the first's 3 labels, the second's score)
    assert set(got) == {"score", "logits"} and got["score"].shape == (len(TEXTS),)
    assert served["outputs"]["classifier/serving_default/probabilities"].shape[1] == 3
    features = python_features(FullTokenizer(vocab), TEXTS, PAIRS, SEQ)
    expected = second({k: tf.constant(v) for k, v in features.items()})["logits"][:, 0]
    np.testing.assert_allclose(got["score"].numpy(), expected.numpy(), atol=1e-5, rtol=0)
    assert len(set(np.round(expected.numpy(), 5))) > 3  # the score depends on the text


def test_overwrite_refuses_a_symlinked_export_dir_and_keeps_the_link(run_dir, served,
                                                                     tmp_path):
    """Issue: --export_dir=current --overwrite, `current` a link to a previous export,
    swapped the link itself for the new export, then failed removing it (an internal
    error, status 1, with the new export committed, the user's link gone and a stray
    temporary link beside it). Now refused before any work, naming the link and where it
    points; nothing changes. The swap below the check refuses a link too."""
    import shutil

    from data_prep import fileio

    d, _ = run_dir
    real = tmp_path / "exports" / "v1"
    shutil.copytree(served["dirs"] / "classifier", real)
    link = tmp_path / "current"
    link.symlink_to(real)
    (tmp_path / "empty").mkdir()
    (tmp_path / "to_empty").symlink_to(tmp_path / "empty")
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")

    def state():
        return (sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")),
                os.readlink(link), (real / "saved_model.pb").read_bytes())

    before = state()
    result = call_main("export_saved_model", init_checkpoint=d, export_dir=link,
                       overwrite="true")
    assert result.code == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"export_saved_model.py: error: --export_dir={link} is a symbolic link to {real}; "
        f"refusing to replace a link: give the directory itself (--export_dir={real})")
    vocab = write_vocab(tmp_path / "vocab.txt", VOCAB)
    serving = families.serving_config("classifier", vocab, True, SEQ, labels=tuple(LABELS))
    for target in (link, tmp_path / "to_empty", tmp_path / "dangling"):
        for overwrite in (True, False):
            with pytest.raises(ExportError, match=f"={target} is a symbolic link to "):
                writer.export_saved_model(BertClassifier(_config(), len(LABELS)), serving,
                                          str(target), overwrite=overwrite)
    (tmp_path / "vocab.txt").unlink()
    with pytest.raises(fileio.OutputError, match=f"{link} is a symbolic link to {real}; "):
        with fileio.AtomicOutputs([str(link)], replace_directories=True) as out:
            os.makedirs(os.path.join(out.temp(str(link)), "variables"))
    assert state() == before


def test_overwrite_keeps_a_previous_export_holding_a_users_file(served, tmp_path):
    """Issue: --overwrite deleted a user's file put inside a previous export (notes in its
    assets.extra/), as only the top-level names were checked. An export is now what the
    exporter writes at every depth (tf.saved_model.save's files, the assets its graph
    names, the marker): anything else is named and the directory refused, even with
    --overwrite."""
    import shutil

    exp = tmp_path / "exp"
    shutil.copytree(served["dirs"] / "classifier", exp)
    hub = tmp_path / "hub"
    for part in ("encoder", "preprocessor"):
        shutil.copytree(served["dirs"] / "classifier", hub / part)
        (hub / part / "assets.extra" / "export_metadata.json").write_text(
            json.dumps({"model_type": f"hub_{part}"}))
    assert writer.export_kind(str(exp)) == "classifier"
    assert writer.export_kind(str(hub)) == "hub"
    users = [exp / "assets.extra" / "MY_NOTES.md", exp / "assets" / "notes.txt",
             exp / "variables" / "variables.data-00000-of-00001.bak",
             exp / "assets.extra" / "mine" / "plot.png", exp / "variables" / "mine" / "x",
             hub / "encoder" / "assets.extra" / "MY_NOTES.md"]
    for path in users:
        root = hub if hub in path.parents else exp
        path.parent.mkdir(exist_ok=True)
        path.write_text("how I trained this\n")
        shown = str(path.relative_to(root))
        if path.parent.name == "mine":
            shown = str(path.parent.relative_to(root))
        assert writer.export_kind(str(root)) is None, path
        with pytest.raises(ExportError, match=f"it holds: {shown}, which the exporter does "
                           "not write.*even with --overwrite"):
            writer.check_export_dir(str(root), overwrite=True)
        assert path.read_text() == "how I trained this\n"
        path.unlink()
        if path.parent.name == "mine":
            path.parent.rmdir()
    assert writer.export_kind(str(exp)) == "classifier"
    assert writer.export_kind(str(hub)) == "hub"


@pytest.mark.parametrize("where,message", [
    ("run", "is the directory of --init_checkpoint"),
    ("parent", "contains the directory of --init_checkpoint"),
    ("child", "inside the checkpoint directory"),
])
def test_cli_overwrite_never_touches_the_checkpoint(run_dir, where, message):
    """The issue's reproduction: --overwrite=true with --export_dir at the checkpoint."""
    d, _ = run_dir
    target = {"run": d, "parent": d.parent, "child": d / "export"}[where]
    before = sorted(os.listdir(d))
    result = call_main("export_saved_model", init_checkpoint=d, export_dir=target,
                       overwrite="true")
    assert result.code == 1, result.stderr[-2000:]
    assert message in result.stderr and "Traceback" not in result.stderr
    assert sorted(os.listdir(d)) == before


# --------------------------------------------------------------------------- SQuAD limits

# The first part of `served`'s serving process, run before it loads or serves anything
# else (what a process of its own measured): the peak RSS growth of one request to the
# SQuAD export for each context of `MEMORY_REPEATS` sentences, from memory_args.json in the
# process's folder to memory.json there ({windows: MB}).
MEMORY_REPEATS = [400, 1600]
MEMORY_SCRIPT = textwrap.dedent("""
    import json, resource
    import tensorflow_text  # noqa: F401
    import tensorflow as tf

    directory, repeats_list = json.load(open("memory_args.json", encoding="utf-8"))
    LOADED = {directory: tf.saved_model.load(directory)}  # SERVE_SCRIPT serves it after
    serve = LOADED[directory].signatures["serving_default"]
    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    serve(question=tf.constant(["who sat?"]), context=tf.constant(["the cat sat."]))
    base, growth = peak_mb(), {}
    for repeats in repeats_list:
        context = " ".join(["the cat sat on the mat far away"] * repeats)
        out = serve(question=tf.constant(["who sat?"]), context=tf.constant([context]))
        growth[int(out["window_example_index"].shape[0])] = peak_mb() - base
    json.dump(growth, open("memory.json", "w", encoding="utf-8"))
    del serve, out
""")


@pytest.mark.slow
def test_squad_long_context_equals_python_and_limit_is_enforced(served):
    from tasks.squad import data as squad
    from tasks.squad import postprocess

    vocab = served["vocab"]
    serve = tf.saved_model.load(str(served["dirs"] / "squad")).signatures["serving_default"]
    context = " ".join(f"the {w} dog ran far away home" for w in ["big", "red"] * 125)
    out = serve(question=tf.constant(["who ran?"]), context=tf.constant([context]))
    tokenizer = FullTokenizer(vocab)
    examples = [squad.SquadExample("0", "who ran?", squad.split_context(context)[0])]
    features = list(squad.iter_features(examples, tokenizer, squad.WindowConfig(
        max_seq_length=SEQ, doc_stride=DOC_STRIDE, max_query_length=8), is_training=False))
    assert len(features) == out["window_example_index"].shape[0] >= 100
    start = out["window_start_logits"].numpy()
    predictions = postprocess.compute_predictions(
        examples, features, ([f.unique_id for f in features], start,
                             out["window_end_logits"].numpy()),
        postprocess.PostprocessConfig(n_best_size=N_BEST, max_answer_length=5))
    best = predictions.nbest["0"][0]
    np.testing.assert_allclose(out["score"].numpy()[0], best["start_logit"] + best["end_logit"],
                               atol=1e-5)
    text = out["answer_text"].numpy()[0].decode()
    assert text.replace(" ", "") == best["text"].lower().replace(" ", "")
    # One window more than the export's maximum: a clear error, no unbounded memory.
    too_long = " ".join(["the cat sat on the mat far away"] * 2000)
    with pytest.raises(tf.errors.InvalidArgumentError, match=serving.TOO_MANY_WINDOWS):
        serve(question=tf.constant(["who sat?", "x"]), context=tf.constant([too_long, "a"]))


@pytest.mark.slow
def test_squad_request_memory_grows_linearly_with_the_context(served):
    """Peak RSS growth of one request, in a fresh process (`served`'s, measured before it
    does anything else: `MEMORY_SCRIPT`), for ~200 and ~800 windows.

    The quadratic version held [windows, seq, windows] float64 tensors (and a copy of the
    whole context per window): with this script and export it grew +47 MB at 200 windows
    and +644 MB at 800 (x14 for x4 windows); the linear one +10 MB and +38 MB (x3.7). The
    bounds (300 MB, and x2.5 the linear extrapolation) leave room for allocator noise and
    fail for the quadratic version on both counts."""
    growth = {int(k): v for k, v in served["memory"].items()}
    (small, g_small), (large, g_large) = sorted(growth.items())
    assert 150 <= small <= 250 and large >= 4 * small - 10 and large <= LONG_CONTEXT_WINDOWS
    assert g_large < 300, growth
    assert g_large < 2.5 * (large / small) * max(g_small, 10), growth


def test_a_hugging_face_config_given_as_a_flag_keeps_its_exact_gelu(tmp_path):
    """export_saved_model --bert_config_file=<HF dir>/config.json reads it as Hugging
    Face's (its "gelu" is the exact form), as the runners do: the export serves what the
    encoder built from the config found beside the weights (what the export without the
    flag builds: test_sentence_embeddings exports such a directory) computes. Before, it
    was read as Google's bert_config.json, whose "gelu" is the tanh form, which computes
    other outputs here."""
    import dataclasses

    from modeling import checkpoints
    from tests.test_modeling_reference import random_hf_weights, write_hf_dir

    hf = tmp_path / "hf"
    hf.mkdir()
    vocab = write_vocab(hf / "vocab.txt", VOCAB)
    config_dict = dict(_config().to_dict(), hidden_act="gelu")
    write_hf_dir(hf, random_hf_weights(config_dict), config_dict, "gelu")
    result = call_main("export_saved_model", model_type="encoder", init_checkpoint=hf,
                       vocab_file=vocab, max_seq_length=SEQ, export_dir=tmp_path / "flag",
                       bert_config_file=hf / "config.json")
    assert result.code == 0, (result.stderr + result.log)[-3000:]
    serve = tf.saved_model.load(str(tmp_path / "flag")).signatures["serving_default"]
    served = serve(text=tf.constant(TEXTS))["pooled_output"].numpy()
    features = {k: tf.constant(v) for k, v in python_features(
        FullTokenizer(vocab), TEXTS, None, SEQ).items()}
    beside = checkpoints.config_for(str(hf))
    assert beside.hidden_act == "gelu_exact"
    pooled = {}
    for act in ("gelu_exact", "gelu_tanh"):
        encoder = BertEncoder(dataclasses.replace(beside, hidden_act=act))
        checkpoints.load_pretrained(str(hf), encoder, partial=True)
        pooled[act] = encoder(features, training=False)["pooled_output"].numpy()
    np.testing.assert_allclose(served, pooled["gelu_exact"], atol=1e-5, rtol=0)
    assert np.abs(served - pooled["gelu_tanh"]).max() > 1e-4
