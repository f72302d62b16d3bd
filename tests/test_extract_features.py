"""extract_features.py: the original's JSON lines, checked against Google's graph and tokenizer."""

import json
import os
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT, write_vocab
from original_bert import original_module
from test_modeling_reference import (random_hf_weights, run_original_graph, tiny_config_dict,
                                     write_hf_dir)

import extract_features  # noqa: E402  (defines no flags at import)
from tasks.feature_extraction import extract  # noqa: E402
from tests.clis import call_main  # noqa: E402

LINES = [
    "The cat sat on the mat.",
    "the dog ran far away ||| he was big",
    "",
    "Unaffable cats want to run home, and the big red dog ran far far away from the mat!",
    "she sat ||| the cat sat on the mat and the dog ran far away, 1 2 3",
]
SEQ = 16
LAYERS = [-1, -2, 0]


def _original_features(vocab_file, lines, seq_length):
    """Tokens and ids the way Google's script builds them (original tokenizer)."""
    tokenization = original_module("tokenization")
    tokenizer = tokenization.FullTokenizer(vocab_file=vocab_file, do_lower_case=True)
    rows = []
    for line in lines:
        a, _, b = line.partition(" ||| ")
        ta = tokenizer.tokenize(a)
        tb = tokenizer.tokenize(b) if b else []
        if tb:
            while len(ta) + len(tb) > seq_length - 3:
                (ta if len(ta) > len(tb) else tb).pop()
        else:
            ta = ta[:seq_length - 2]
        tokens = ["[CLS]"] + ta + ["[SEP]"] + (tb + ["[SEP]"] if tb else [])
        types = [0] * (len(ta) + 2) + [1] * (len(tb) + 1 if tb else 0)
        rows.append((tokens, tokenizer.convert_tokens_to_ids(tokens), types))
    ids = np.zeros((len(rows), seq_length), np.int32)
    mask = np.zeros_like(ids)
    segs = np.zeros_like(ids)
    for i, (tokens, row_ids, types) in enumerate(rows):
        ids[i, :len(row_ids)] = row_ids
        mask[i, :len(row_ids)] = 1
        segs[i, :len(types)] = types
    return [r[0] for r in rows], dict(input_ids=ids, input_mask=mask, segment_ids=segs)


def _check_output(path, tokens, layers):
    lines = open(path, encoding="utf-8").read().splitlines()
    assert len(lines) == len(LINES)
    for i, line in enumerate(lines):
        record = json.loads(line)
        assert list(record) == ["linex_index", "features"]
        assert record["linex_index"] == i
        assert [f["token"] for f in record["features"]] == tokens[i]
        for position, feature in enumerate(record["features"]):
            assert list(feature) == ["token", "layers"]
            assert [layer["index"] for layer in feature["layers"]] == LAYERS
            for layer in feature["layers"]:
                values = np.array(layer["values"])
                expected = layers[layer["index"]][i, position]
                np.testing.assert_allclose(values, expected, atol=1e-4)
                assert all(v == round(v, 6) for v in layer["values"])


@pytest.fixture(scope="module")
def google_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("google_ckpt")
    config = tiny_config_dict(vocab_size=len(open(write_vocab(directory / "vocab.txt"))
                                             .read().splitlines()))
    (directory / "bert_config.json").write_text(json.dumps(config))
    inputs_dummy = dict(input_ids=np.zeros((1, SEQ), np.int32),
                        input_mask=np.ones((1, SEQ), np.int32),
                        segment_ids=np.zeros((1, SEQ), np.int32))
    run_original_graph(config, inputs_dummy, save_to=str(directory / "bert_model.ckpt"),
                       seed=4, with_heads=False)
    tokens, inputs = _original_features(str(directory / "vocab.txt"), LINES, SEQ)
    reference = run_original_graph(config, inputs, checkpoint=str(directory / "bert_model.ckpt"),
                                   with_heads=False)
    (directory / "input.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return directory, tokens, reference["layers"]


def _run(args, process=True):
    """extract_features.py with `args`, as a process (`process`: logical CPU devices for
    mirrored must be configured before TensorFlow starts) or in this process."""
    if not process:
        result = call_main("extract_features", args, cwd=REPO_ROOT)
        assert result.code == 0, (result.stderr + result.log)[-3000:]
        return
    from tests import forkserver  # a fresh TensorFlow runtime, not a fresh interpreter

    result = forkserver.run([sys.executable, os.path.join(REPO_ROOT, "extract_features.py")]
                            + args, dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_cli_matches_original_graph(google_dir, tmp_path, strategy):
    directory, tokens, layers = google_dir
    out = tmp_path / "out.jsonl"
    _run([f"--input_file={directory / 'input.txt'}", f"--output_file={out}",
          f"--init_checkpoint={directory / 'bert_model.ckpt'}",
          f"--bert_config_file={directory / 'bert_config.json'}",
          f"--vocab_file={directory / 'vocab.txt'}", "--layers=-1,-2,0",
          f"--max_seq_length={SEQ}", "--batch_size=2", "--do_lower_case=true",
          f"--distribution_strategy={strategy}",
          # Length buckets on mirrored, padding to max_seq_length on one device: both
          # equal the original graph.
          "--bucket_boundaries=4,8" if strategy == "mirrored" else "--bucket_by_length=false",
          "--num_cpu_devices=2" if strategy == "mirrored" else "--num_cpu_devices=0"],
         process=strategy == "mirrored")
    _check_output(out, tokens, layers)


def test_in_process_from_tf1_directory_defaults(google_dir, tmp_path):
    """Config and vocab default to the checkpoint directory's files; with length buckets
    (lines of 3 to 16 tokens) the vectors equal the original graph's. (Without buckets,
    every line padded to max_seq_length: test_cli_matches_original_graph[one_device], the
    same computation through the command line; this test ran it a second time here.)"""
    from modeling import checkpoints
    from modeling.encoder import BertEncoder
    from data_prep.tokenization import FullTokenizer

    directory, tokens, layers = google_dir
    buckets = (4, 8, SEQ)
    config, vocab = extract_features._defaults_from_checkpoint(str(directory), None, None)
    assert vocab == str(directory / "vocab.txt")
    encoder = BertEncoder(config)
    checkpoints.load_pretrained(str(directory), encoder)
    features = extract.convert_examples(
        extract_features.read_examples(str(directory / "input.txt")), SEQ,
        FullTokenizer(vocab, do_lower_case=True))
    assert [f.tokens for f in features] == tokens
    out = tmp_path / "out.jsonl"
    with open(out, "w", encoding="utf-8") as f:
        for feature, values in extract.compute_layers(
                encoder, features, LAYERS, 2, bucket_boundaries=buckets, window_batches=1):
            f.write(extract.feature_json(feature, values, LAYERS))
    _check_output(out, tokens, layers)


def test_hf_directory_defaults(tmp_path):
    (tmp_path / "hf").mkdir()
    vocab_file = write_vocab(tmp_path / "hf" / "vocab.txt")
    config_dict = tiny_config_dict(vocab_size=len(open(vocab_file).read().splitlines()))
    write_hf_dir(tmp_path / "hf", random_hf_weights(config_dict), config_dict, "gelu")
    config, vocab = extract_features._defaults_from_checkpoint(str(tmp_path / "hf"), None, None)
    assert config.hidden_act == "gelu_exact" and vocab == vocab_file


def test_json_layout_and_rounding():
    feature = extract.Feature(7, ["[CLS]", "cat", "[SEP]"], [], [], [])
    values = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2) / 3.0
    line = extract.feature_json(feature, values, [-1, -2])
    assert line.endswith("\n")
    assert line.startswith('{"linex_index": 7, "features": [{"token": "[CLS]", "layers": '
                           '[{"index": -1, "values": [0.0, 0.333333]}, {"index": -2, '
                           '"values": [2.0, 2.333333]}]}')


# ------------------------------------------------------------------------ bad input (issue 22)


def _read_error(path):
    from data_prep.text_input import InputError

    with pytest.raises(InputError) as caught:
        extract_features.read_examples(str(path))
    return str(caught.value)


def test_lines_are_read_as_the_original_reads_them(tmp_path):
    """GFile's reading: lines end at "\\n", "\\r" is dropped everywhere, lines are stripped,
    a blank line is an (empty) example, the last line may lack its "\\n"."""
    path = tmp_path / "input.txt"
    path.write_bytes(b"the c\ratx  \r\n\n  a ||| b \nlast")
    examples = extract_features.read_examples(str(path))
    assert [(e.unique_id, e.text_a, e.text_b) for e in examples] == [
        (0, "the catx", None), (1, "", None), (2, "a", "b"), (3, "last", None)]


def test_invalid_utf8_names_the_file_line_and_offset(tmp_path):
    """As create_pretraining_data reports it (same helper, same wording)."""
    path = tmp_path / "bad.txt"
    path.write_bytes("the cat\nsat ||| on\n".encode() + b"the \xff mat\n")
    message = _read_error(path)
    assert message.startswith(f"{path}:3: invalid UTF-8 at byte offset 23 (invalid start "
                              "byte)"), message


@pytest.mark.parametrize("content", [b"", b"\n", b"  \n\r\n\t\n"])
def test_no_example_is_refused(tmp_path, content):
    path = tmp_path / "input.txt"
    path.write_bytes(content)
    assert _read_error(path) == (f"--input_file={path}: no examples: the file is empty or "
                                 "holds only blank lines")


@pytest.mark.parametrize("line", ["the cat |||", "||| the cat", "a|||b", "a ||| b ||| c",
                                  "a |||b", "a ||| |||"])
def test_a_malformed_pair_names_the_file_and_line(tmp_path, line):
    path = tmp_path / "input.txt"
    path.write_text(f"the cat\n{line}\n", encoding="utf-8")
    message = _read_error(path)
    assert message.startswith(f"{path}:2: '|||' outside the pair format"), message


def test_a_directory_or_a_missing_file_is_refused(tmp_path):
    assert _read_error(tmp_path) == (f"--input_file={tmp_path} is a directory; expected a "
                                     "text file with one example per line")
    missing = tmp_path / "missing.txt"
    assert _read_error(missing) == f"--input_file={missing}: no such file"


# (input file content or None for a directory, flag overrides, expected message part)
BAD_RUNS = {
    "invalid_utf8": (b"the cat\n\xc3( sat\n", {}, "input.txt:2: invalid UTF-8 at byte offset 8"),
    "empty": (b"", {}, "input.txt: no examples: the file is empty"),
    "only_blank_lines": (b"\n \n", {}, "input.txt: no examples"),
    "directory": (None, {}, "is a directory; expected a text file"),
    "malformed_pair": (b"a ||| b\nthe cat |||\n", {}, "input.txt:2: '|||' outside the pair"),
    "missing_vocab": (b"the cat\n", {"vocab_file": "missing_vocab.txt"},
                      "error: --vocab_file: cannot read vocab file"),
    "bad_config": (b"the cat\n", {"bert_config_file": "input.txt"}, "not valid JSON"),
    "directory_config": (b"the cat\n", {"bert_config_file": "."},
                         "cannot read the config file"),
    "bad_layers": (b"the cat\n", {"layers": "-1,x"}, "--layers=-1,x: expected comma-separated"),
    "zero_batch": (b"the cat\n", {"batch_size": "0"}, "--batch_size=0: must be at least 1"),
    "doc_stride_without_windows": (b"the cat\n", {"doc_stride": "4"},
                                   "--doc_stride only applies with --long_text=windows"),
    "max_windows_without_windows": (b"the cat\n", {"max_windows_per_text": "4"},
                                    "--max_windows_per_text only applies with --long_text"),
    "zero_doc_stride": (b"the cat\n", {"long_text": "windows", "doc_stride": "0"},
                        "--doc_stride=0: must be at least 1"),
    "zero_max_windows": (b"the cat\n", {"long_text": "windows", "max_windows_per_text": "0"},
                         "--max_windows_per_text=0: must be at least 1"),
    "bad_long_text": (b"the cat\n", {"long_text": "whole"}, "--long_text"),
    "normalize_without_pooling": (b"the cat\n", {"normalize": "true"},
                                  "--normalize=true needs one vector per line: give "
                                  "--pooling=cls, mean or max"),
    "npy_without_pooling": (b"the cat\n", {"output_format": "npy"},
                            "--output_format=npy needs one vector per line"),
    "bad_pooling": (b"the cat\n", {"pooling": "sum"}, "--pooling"),
    # A cased vocab read lower-cased (the default): its capitalised tokens never match.
    "cased_vocab_lower_cased": (b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nThe\nCat\n",
                                {"vocab_file": "input.txt"},
                                "--do_lower_case=true but vocab file"),
}


@pytest.mark.parametrize("case", sorted(BAD_RUNS))
def test_cli_refuses_bad_input_with_one_line_and_writes_nothing(google_dir, tmp_path, case):
    """Exit 1, a message naming the file / line / flag, no traceback, and the output of
    an earlier run untouched (nothing else appears beside it)."""
    directory = google_dir[0]
    content, overrides, expected = BAD_RUNS[case]
    work = tmp_path / "work"
    work.mkdir()
    if content is None:
        (work / "input.txt").mkdir()
    else:
        (work / "input.txt").write_bytes(content)
    out = tmp_path / "out"
    out.mkdir()
    (out / "out.jsonl").write_text("earlier\n")
    flags = {"input_file": work / "input.txt", "output_file": out / "out.jsonl",
             "init_checkpoint": directory / "bert_model.ckpt",
             "bert_config_file": directory / "bert_config.json",
             "vocab_file": directory / "vocab.txt", "layers": "-1", "max_seq_length": SEQ}
    flags.update({k: work / v if k.endswith("_file") else v for k, v in overrides.items()})
    result = call_main("extract_features", **flags)
    assert result.code == 1, result.stderr[-3000:]
    assert expected in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert os.listdir(out) == ["out.jsonl"] and (out / "out.jsonl").read_text() == "earlier\n"


# ------------------------------------------------------------- long texts (issue 33, item 2)

LONG = ("the cat sat on the mat and the big red dog ran far away from home, she was big and "
        "he ran to the cat in the mat; it is a dog of 1 2 3 4 5 6 7 8 9.")


def _extract(directory, tmp_path, lines, name="out.jsonl", **overrides):
    """extract_features on `lines` in this process: (Result, the output's text or None)."""
    (tmp_path / "input.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / name
    flags = {"input_file": tmp_path / "input.txt", "output_file": out,
             "init_checkpoint": directory / "bert_model.ckpt",
             "bert_config_file": directory / "bert_config.json",
             "vocab_file": directory / "vocab.txt", "layers": "-1,-2,0",
             "max_seq_length": SEQ, "batch_size": 4, **overrides}
    result = call_main("extract_features", **flags)
    text = out.exists() and out.suffix != ".npy"  # (an .npy is read by its test)
    return result, out.read_text(encoding="utf-8") if text else None


def _spans_and_best(num_tokens, room, stride):
    """The windows and each token's max-context window, spelled out here (SQuAD's rule:
    min(left, right) + 0.01 * window length, the earliest window on ties)."""
    starts = [0]
    while starts[-1] + room < num_tokens:
        starts.append(starts[-1] + stride)
    spans = [(s, min(room, num_tokens - s)) for s in starts]
    best = []
    for i in range(num_tokens):
        scores = [(min(i - s, s + n - 1 - i) + 0.01 * n, -k) for k, (s, n) in
                  enumerate(spans) if s <= i < s + n]
        best.append(-max(scores)[1])
    return spans, best


def test_a_text_that_fits_is_the_same_in_both_modes(google_dir, tmp_path):
    """Single texts and pairs within --max_seq_length: --long_text=windows writes the
    same bytes as truncate (the default), which match the original graph."""
    directory, tokens, layers = google_dir
    fitting = LINES[:3]  # 7 WordPieces, a pair of 5 + 3, none
    truncated = _extract(directory, tmp_path, fitting, "truncate.jsonl")
    windowed = _extract(directory, tmp_path, fitting, "windows.jsonl", long_text="windows")
    assert truncated[0].code == 0 and windowed[0].code == 0, windowed[0].stderr[-3000:]
    assert windowed[1] == truncated[1]
    records = [json.loads(line) for line in windowed[1].splitlines()]
    assert [[f["token"] for f in r["features"]] for r in records] == tokens[:3]


def test_truncate_is_the_default_and_the_original(google_dir, tmp_path):
    """The default keeps only the first window of a long text (line 4: 26 WordPieces, 14
    kept), as the original graph does; --long_text=truncate writes the same bytes."""
    directory, tokens, layers = google_dir
    default = _extract(directory, tmp_path, LINES, "default.jsonl")
    explicit = _extract(directory, tmp_path, LINES, "truncate.jsonl", long_text="truncate")
    assert default[0].code == 0, default[0].stderr[-3000:]
    assert explicit[1] == default[1]
    _check_output(tmp_path / "default.jsonl", tokens, layers)
    assert len(tokens[3]) == SEQ


@pytest.mark.parametrize("doc_stride", [None, 10])
def test_windows_give_every_token_its_max_context_vector(google_dir, tmp_path, doc_stride):
    """Two long texts among short lines, their windows batched together in length buckets:
    each output line holds [CLS], every WordPiece once in order, [SEP]; each WordPiece's
    vectors are the encoder's on its max-context window alone, [CLS]'s from the first
    window, [SEP]'s from the last."""
    from data_prep.tokenization import FullTokenizer
    from modeling import checkpoints
    from modeling.encoder import BertEncoder

    directory = google_dir[0]
    lines = [LINES[0], LINES[3], LINES[1], LONG, ""]
    overrides = {"long_text": "windows", "bucket_boundaries": "4,8"}
    if doc_stride:
        overrides["doc_stride"] = doc_stride
    result, text = _extract(directory, tmp_path, lines, **overrides)
    assert result.code == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in text.splitlines()]
    assert [r["linex_index"] for r in records] == list(range(len(lines)))

    config, vocab = extract_features._defaults_from_checkpoint(str(directory), None, None)
    tokenizer = FullTokenizer(vocab, do_lower_case=True)
    encoder = BertEncoder(config)
    checkpoints.load_pretrained(str(directory), encoder)

    def encode(window):  # [layer, position, hidden] of "[CLS] window [SEP]" alone
        ids = np.array([tokenizer.convert_tokens_to_ids(["[CLS]", *window, "[SEP]"])],
                       np.int32)
        outputs = encoder(dict(input_ids=ids, input_mask=np.ones_like(ids),
                               segment_ids=np.zeros_like(ids)))["encoder_outputs"]
        return np.stack([np.asarray(outputs[i])[0] for i in LAYERS])

    room, stride = SEQ - 2, doc_stride or (SEQ - 2) // 2
    for line_index in (1, 3):
        pieces = tokenizer.tokenize(lines[line_index])
        features = records[line_index]["features"]
        assert [f["token"] for f in features] == ["[CLS]", *pieces, "[SEP]"]
        got = np.array([[layer["values"] for layer in f["layers"]] for f in features])
        got = got.transpose(1, 0, 2)  # [layer, position, hidden]
        spans, best = _spans_and_best(len(pieces), room, stride)
        assert len(spans) >= 3
        encoded = [encode(pieces[s:s + n]) for s, n in spans]
        np.testing.assert_allclose(got[:, 0], encoded[0][:, 0], atol=1e-4)
        np.testing.assert_allclose(got[:, -1], encoded[-1][:, -1], atol=1e-4)
        for i, k in enumerate(best):
            np.testing.assert_allclose(got[:, 1 + i], encoded[k][:, 1 + i - spans[k][0]],
                                       atol=1e-4)
        # The window matters: a token read in another window has other vectors.
        s, n = spans[1]
        other = encoded[0][:, 1 + s] if best[s] != 0 else encoded[1][:, 1]
        assert np.abs(got[:, 1 + s] - other).max() > 1e-2
    short = extract.convert_examples(
        [extract.Example(i, *lines[i].partition(" ||| ")[::2]) for i in (0, 2, 4)], SEQ,
        tokenizer)
    assert [[f["token"] for f in records[f.unique_id]["features"]] for f in short] == [
        f.tokens for f in short]


@pytest.mark.parametrize("limit, refused", [(5, True), (6, False)])
def test_the_window_limit(google_dir, tmp_path, limit, refused):
    """LONG needs 6 windows of 14 WordPieces 7 apart (48 WordPieces): a lower
    --max_windows_per_text refuses it naming the file and line, writing nothing."""
    directory = google_dir[0]
    result, text = _extract(directory, tmp_path, [LINES[0], LONG], long_text="windows",
                            max_windows_per_text=limit)
    if refused:
        assert result.code == 1 and text is None
        assert (f"{tmp_path / 'input.txt'}:2: 48 WordPieces need 6 windows of "
                "--max_seq_length=16 (--doc_stride=7), more than --max_windows_per_text=5"
                in result.stderr), result.stderr[-3000:]
        assert "Traceback" not in result.stderr
    else:
        assert result.code == 0, result.stderr[-3000:]
        assert len(text.splitlines()) == 2


def test_pairs_with_windows(google_dir, tmp_path):
    """A pair that fits is as in truncate mode (test above); a pair that does not fit is
    refused under --long_text=windows, naming the line; truncate cuts it as the original."""
    directory = google_dir[0]
    lines = [LINES[1], LINES[4]]
    result, text = _extract(directory, tmp_path, lines, long_text="windows")
    assert result.code == 1 and text is None
    assert (f"{tmp_path / 'input.txt'}:2: a pair of 2 + 16 WordPieces does not fit "
            "--max_seq_length=16 and --long_text=windows reads single texts only"
            in result.stderr), result.stderr[-3000:]
    result, text = _extract(directory, tmp_path, lines)
    assert result.code == 0 and len(json.loads(text.splitlines()[1])["features"]) == SEQ


# ------------------------------------------------------- one vector per text (issue 41)


def _pooled(values, pooling, normalize):
    """The reference pooling of one text's token vectors [tokens, hidden], spelled out."""
    vector = {"cls": lambda v: v[0], "mean": lambda v: v.mean(axis=0),
              "max": lambda v: v.max(axis=0)}[pooling](values)
    return vector / np.linalg.norm(vector) if normalize else vector


@pytest.mark.parametrize("pooling, normalize, output_format",
                         [("mean", False, "jsonl"), ("max", True, "npy"),
                          ("cls", False, "jsonl")])
def test_pooling_from_the_original_checkpoint(google_dir, tmp_path, pooling, normalize,
                                              output_format):
    """Google's TF1 checkpoint: each line's vector is the mean of layers -1 and -2 of the
    original graph over its real tokens only (buckets pad to 4, 8 or 16), pooled."""
    directory, tokens, layers = google_dir
    name = f"out.{'npy' if output_format == 'npy' else 'jsonl'}"
    result, _ = _extract(directory, tmp_path, LINES, name, pooling=pooling,
                         normalize=str(normalize).lower(), output_format=output_format,
                         layers="-1,-2", bucket_boundaries="4,8")
    assert result.code == 0, result.stderr[-3000:]
    if output_format == "npy":
        got = np.load(tmp_path / name)
        assert got.dtype == np.float32
    else:
        records = [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
        assert [list(r) for r in records] == [["linex_index", "embedding"]] * len(LINES)
        assert [r["linex_index"] for r in records] == list(range(len(LINES)))
        got = np.array([r["embedding"] for r in records])
    for i, line_tokens in enumerate(tokens):
        values = (layers[-1][i, :len(line_tokens)] + layers[-2][i, :len(line_tokens)]) / 2
        np.testing.assert_allclose(got[i], _pooled(values, pooling, normalize), atol=1e-4)
    # Padding counted would change the mean and max of every short line.
    assert len(set(len(t) for t in tokens)) > 2


def test_long_texts_are_pooled_over_their_windows(google_dir, tmp_path):
    """--long_text=windows with --pooling: the vector pools the token vectors the
    per-token output gives (each WordPiece's from its max-context window)."""
    directory = google_dir[0]
    lines = [LINES[0], LONG]
    _, tokens_text = _extract(directory, tmp_path, lines, "tokens.jsonl", layers="-1",
                              long_text="windows")
    _, pooled_text = _extract(directory, tmp_path, lines, "pooled.jsonl", layers="-1",
                              long_text="windows", pooling="mean")
    for tokens_line, pooled_line in zip(tokens_text.splitlines(), pooled_text.splitlines()):
        features = json.loads(tokens_line)["features"]
        values = np.array([f["layers"][0]["values"] for f in features])
        np.testing.assert_allclose(json.loads(pooled_line)["embedding"], values.mean(axis=0),
                                   atol=2e-6)
    assert len(json.loads(tokens_text.splitlines()[1])["features"]) > 2 * SEQ
