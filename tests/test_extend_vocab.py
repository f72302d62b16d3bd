"""extend_vocab.py: a pretrained model's vocab grown by domain words, checked at each layer.

One tiny BERT (2 layers, hidden 64) is pretrained in this module on real text (the
standard library's documentation, data_prep.sample_corpus) and written in Google's TF1
layout with its config and vocab beside it: where users start. The domain is numpy's
docstrings (linear algebra, polynomials, masked arrays: words that vocab splits), half for
choosing the words, half held out. The module grows it once per setting (`grown`) and
checks, each where it lives: one token per added word (Python and in-graph tokenizers),
the same encoder outputs on text without new words, the promised rows and biases read
back from every output format, old tokens' probabilities scaled only by the new rows'
mass, the step-0 loss on held-out domain text, the Hugging Face and original TF1 code
reading the outputs, the runners' refusals of a vocab that does not fit, and (slow) the
whole workflow of docs/extend_vocab.md.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import re

import numpy as np
import pytest
# absl.logging defines its flags (--verbosity) when first imported: before any in-process
# command, whose flag scope would otherwise drop them on the way out (tests/clis.py).
from absl import logging as _absl_logging  # noqa: F401

from tests.clis import call_main

SEQ = 64
NEW_WORDS = 60
NUMPY_MODULES = ("numpy.linalg", "numpy.fft", "numpy.random", "numpy.ma",
                 "numpy.polynomial.polynomial", "numpy.polynomial.chebyshev",
                 "numpy.polynomial.legendre", "numpy.polynomial.hermite", "numpy.strings")


def numpy_documents() -> list:
    """(module, sentences) of numpy's public docstrings, one document per docstring."""
    from data_prep import sample_corpus

    docs, seen = [], set()
    for name in NUMPY_MODULES:
        module = importlib.import_module(name)
        for attribute in sorted(dir(module)):
            doc = getattr(getattr(module, attribute, None), "__doc__", None)
            if attribute.startswith("_") or not isinstance(doc, str) or doc in seen:
                continue
            seen.add(doc)
            sentences = sample_corpus.docstring_sentences(doc)
            if len(sentences) >= 2:
                docs.append((name.rsplit(".", 1)[-1], sentences))
    return docs


def _write_documents(path, documents) -> str:
    path.write_text("\n\n".join("\n".join(s) for _, s in documents) + "\n", encoding="utf-8")
    return str(path)


def _ok(result):
    assert result.code == 0, (result.stderr + result.log)[-4000:]
    return result


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The pretrained tiny BERT in Google's layout (`google`: bert_model.ckpt,
    bert_config.json, vocab.txt), its run directory, and the domain text. Thirty steps:
    trained enough for the statistics below (measured: the step-0 test's paired gain on
    new-word targets is ~10 standard errors after 30 steps, ~15 after 100; a run costs
    ~0.05 CPU-s a step over its fixed ~5)."""
    from data_prep import sample_corpus

    root = tmp_path_factory.mktemp("extend_vocab")
    sample_corpus.write_corpus(str(root / "corpus"), max_mb=0.3, num_shards=1)
    _ok(call_main("build_vocab", input_file=f"{root}/corpus/*.txt",
                  output_file=root / "vocab.txt", vocab_size=1500, do_lower_case="true"))
    size = len((root / "vocab.txt").read_text(encoding="utf-8").splitlines())
    config = {"vocab_size": size, "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 2, "intermediate_size": 256, "hidden_act": "gelu",
              "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
              "max_position_embeddings": 128, "type_vocab_size": 2,
              "initializer_range": 0.02}
    (root / "bert_config.json").write_text(json.dumps(config))
    _ok(call_main("create_pretraining_data", input_file=f"{root}/corpus/*.txt",
                  output_file=root / "records.tfrecord", vocab_file=root / "vocab.txt",
                  max_seq_length=SEQ, max_predictions_per_seq=10, dupe_factor=2,
                  num_workers=1, random_seed=1))
    _ok(call_main("run_pretraining", input_file=root / "records.tfrecord",
                  bert_config_file=root / "bert_config.json", output_dir=root / "run",
                  do_train="true", train_batch_size=32, max_seq_length=SEQ,
                  max_predictions_per_seq=10, num_train_steps=30, num_warmup_steps=3,
                  learning_rate="1e-3", save_checkpoints_steps=30, iterations_per_loop=30,
                  seed=1))
    _ok(call_main("convert_checkpoint", input=root / "run", output_dir=root / "google",
                  bert_config_file=root / "bert_config.json", vocab_file=root / "vocab.txt",
                  output_format="tf1"))
    documents = numpy_documents()
    return {"root": root, "google": root / "google", "run": root / "run",
            "vocab": str(root / "vocab.txt"), "config": str(root / "bert_config.json"),
            "config_dict": config, "domain": _write_documents(root / "domain.txt", documents[0::2]),
            "heldout": documents[1::2]}


def _grow(base, out, **flags):
    values = dict(input=base["google"], corpus=base["domain"], num_new_words=NEW_WORDS,
                  placement="append", pad_vocab_to_multiple_of=8, output_dir=out)
    values.update(flags)
    return _ok(call_main("extend_vocab", **values))


@pytest.fixture(scope="module")
def grown(base):
    """The base grown by the domain's NEW_WORDS most token-saving words, appended (padded
    to a multiple of 8): --init=mean in every output format, --init=random in tf1."""
    root = base["root"]
    runs = {}
    for name, flags in (("mean", {}), ("random", {"init": "random"}),
                        ("mean_hf", {"output_format": "hf"}),
                        ("mean_ours", {"output_format": "ours"})):
        runs[name] = _grow(base, root / f"grown_{name}", **flags)
    return {name: root / f"grown_{name}" for name in runs} | {
        "stdout": runs["mean"].stdout}


# ------------------------------------------------------------------------ helpers


def _vocab_lines(path) -> list:
    return open(path, encoding="utf-8").read().splitlines()


def _added(base, grown) -> dict:
    """Added word -> id, read from the grown vocab (the lines past the base's that are
    not [unused*] pads)."""
    old = len(_vocab_lines(base["vocab"]))
    lines = _vocab_lines(grown["mean"] / "vocab.txt")
    return {w: i for i, w in enumerate(lines) if i >= old and not w.startswith("[unused")}


def _tf1_tensors(prefix) -> dict:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(prefix))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


def _pretrainer(path, config_path=None):
    from modeling import checkpoints
    from modeling.config import BertConfig

    config = BertConfig.from_config_file(str(config_path)) if config_path else None
    network, _ = checkpoints.read_network(str(path), config=config)
    return network


def _masked_batch(tokenizer, sentences, rng, mask_rate=0.15, pick=None):
    """[CLS] sentence [SEP] rows (truncated to SEQ), ~15% of their tokens replaced by
    [MASK] (or the positions `pick(ids)` chooses): inputs, positions, targets, weights."""
    rows, positions, targets = [], [], []
    for sentence in sentences:
        ids = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(sentence))[:SEQ - 2]
        if len(ids) < 3:
            continue
        chosen = pick(ids) if pick else sorted(rng.sample(
            range(len(ids)), max(1, int(round(mask_rate * len(ids))))))
        if not chosen:
            continue
        row = [tokenizer.vocab["[CLS]"]] + ids + [tokenizer.vocab["[SEP]"]]
        for p in chosen:
            row[p + 1] = tokenizer.vocab["[MASK]"]
        rows.append(row)
        positions.append([p + 1 for p in chosen])
        targets.append([ids[p] for p in chosen])
    width = max(map(len, positions))
    batch = {"input_ids": np.zeros((len(rows), SEQ), np.int32),
             "input_mask": np.zeros((len(rows), SEQ), np.int32),
             "segment_ids": np.zeros((len(rows), SEQ), np.int32),
             "masked_lm_positions": np.zeros((len(rows), width), np.int32)}
    ids_out = np.zeros((len(rows), width), np.int32)
    weights = np.zeros((len(rows), width), np.float32)
    for i, (row, pos, tgt) in enumerate(zip(rows, positions, targets)):
        batch["input_ids"][i, :len(row)] = row
        batch["input_mask"][i, :len(row)] = 1
        batch["masked_lm_positions"][i, :len(pos)] = pos
        ids_out[i, :len(tgt)] = tgt
        weights[i, :len(tgt)] = 1
    return batch, ids_out, weights


def _log_probs(network, batch, targets=None, chunk=256) -> np.ndarray:
    """float64 log-softmax of the masked-LM logits [rows, positions, vocab], or with
    `targets` [rows, positions] only theirs [rows, positions]."""
    import tensorflow as tf

    @tf.function(reduce_retracing=True)
    def forward(part):
        logits = tf.cast(network(part, training=False)["masked_lm_logits"], tf.float64)
        return tf.nn.log_softmax(logits, axis=-1)

    out = []
    for start in range(0, len(batch["input_ids"]), chunk):
        log_probs = forward({k: v[start:start + chunk] for k, v in batch.items()}).numpy()
        if targets is not None:
            log_probs = np.take_along_axis(
                log_probs, targets[start:start + chunk, :, None], -1)[..., 0]
        out.append(log_probs)
    return np.concatenate(out)


# ------------------------------------------------------------------------ the tool


def test_the_tool_reports_what_it_did(base, grown):
    out = grown["stdout"]
    old = len(_vocab_lines(base["vocab"]))
    lines = _vocab_lines(grown["mean"] / "vocab.txt")
    assert len(lines) % 8 == 0 and len(lines) >= old + NEW_WORDS
    assert f"added {NEW_WORDS} words (append: ids {old}..{old + NEW_WORDS - 1}): " in out
    saved = re.search(r"tokens on --corpus: (\d+) before, (\d+) after: (\d+) saved", out)
    assert saved and int(saved[1]) - int(saved[2]) == int(saved[3]) > 0, out
    pads = len(lines) - old - NEW_WORDS
    assert f"vocab_size: {old} -> {len(lines)}" + (f" ({pads} [unused*] pads)" if pads else
                                                   "\n") in out, out
    assert "Optimizer slots are not carried" in out
    config = json.loads((grown["mean"] / "bert_config.json").read_text())
    assert config == {**base["config_dict"], "vocab_size": len(lines)}
    assert sorted(os.listdir(grown["mean"])) == sorted(
        ["bert_config.json", "bert_model.ckpt.data-00000-of-00001", "bert_model.ckpt.index",
         "checkpoint", "vocab.txt"])
    assert sorted(os.listdir(grown["mean_hf"])) == ["config.json", "model.safetensors",
                                                    "vocab.txt"]


def test_the_chosen_words_are_the_corpus_s_most_token_saving(base, grown):
    """frequency x (pieces - 1) under the old vocab, counted independently with the
    original's tokenizer (bert-tensorflow) over the corpus's words."""
    import collections

    from tests.original_bert import original_module

    tokenization = original_module("tokenization")
    tokenizer = tokenization.FullTokenizer(base["vocab"], do_lower_case=True)
    basic = tokenization.BasicTokenizer(do_lower_case=True)
    counts = collections.Counter(
        w for line in open(base["domain"], encoding="utf-8") for w in basic.tokenize(line))
    saving = {w: c * (len(tokenizer.wordpiece_tokenizer.tokenize(w)) - 1)
              for w, c in counts.items() if w not in tokenizer.vocab}
    best = sorted(saving, key=lambda w: (-saving[w], w))[:NEW_WORDS]
    assert list(_added(base, grown)) == best


def test_added_words_are_one_token_in_python_and_in_graph(base, grown):
    """Every added word, as it appears in held-out text (any case: the vocab is
    uncased), is one token of its id, in the Python tokenizer and the serving one."""
    from data_prep.tf_tokenization import BertInGraphTokenizer
    from data_prep.tokenization import FullTokenizer

    added = _added(base, grown)
    vocab = str(grown["mean"] / "vocab.txt")
    python = FullTokenizer(vocab, do_lower_case=True)
    graph = BertInGraphTokenizer(vocab, do_lower_case=True)
    sentences = [s for _, doc in base["heldout"] for s in doc][:400]
    sentences += [f"{w.upper()}, {w.capitalize()}: ({w})." for w in added]
    in_graph = graph.tokenize(sentences).to_list()
    found = 0
    for sentence, ids in zip(sentences, in_graph):
        tokens = python.tokenize(sentence)
        assert python.convert_tokens_to_ids(tokens) == ids, sentence
        words = python.basic_tokenizer.tokenize(sentence)
        pieces = [python.wordpiece_tokenizer.tokenize(w) for w in words]
        for word, word_pieces in zip(words, pieces):
            if word in added:
                assert word_pieces == [word], (sentence, word, word_pieces)
                found += 1
    assert found > 3 * len(added)


def test_text_without_added_words_reads_the_same_rows(base, grown):
    """The encoder's outputs on base-corpus sentences (no added word) equal the original
    model's: the same rows are read, every other weight is the same."""
    from data_prep.tokenization import FullTokenizer

    tokenizer = FullTokenizer(base["vocab"], do_lower_case=True)
    grown_tokenizer = FullTokenizer(str(grown["mean"] / "vocab.txt"), do_lower_case=True)
    text = open(sorted(base["root"].glob("corpus/*.txt"))[0], encoding="utf-8").read()
    sentences = [s for s in text.split("\n") if len(s.split()) > 4
                 and tokenizer.tokenize(s) == grown_tokenizer.tokenize(s)][:64]
    assert len(sentences) == 64
    batch, _, _ = _masked_batch(tokenizer, sentences, random.Random(0))
    old = _pretrainer(base["google"])
    for name in ("mean", "random", "mean_hf", "mean_ours"):
        new = _pretrainer(grown[name])
        ours = new.encoder(batch, training=False)["sequence_output"].numpy()
        np.testing.assert_array_equal(
            ours, old.encoder(batch, training=False)["sequence_output"].numpy(), name)


def test_new_rows_are_the_promised_mean_and_every_other_tensor_is_copied(base, grown):
    """Read back from the written files of every format: a word's row and bias are the
    mean of its pieces' (the original's tokenizer splits it), a pad's the mean of the old
    [unused*] rows; --init=random draws the original's truncated normal with bias 0;
    every other tensor, old rows included, is the input's bit for bit."""
    from safetensors.numpy import load_file

    from modeling.checkpoints import tf1_arrays
    from tests.original_bert import original_module

    tokenization = original_module("tokenization")
    old_tokenizer = tokenization.FullTokenizer(base["vocab"], do_lower_case=True)
    before = _tf1_tensors(base["google"] / "bert_model.ckpt")
    old_rows = before["bert/embeddings/word_embeddings"].shape[0]
    lines = _vocab_lines(grown["mean"] / "vocab.txt")
    unused = [i for i, t in enumerate(lines[:old_rows]) if t.startswith("[unused")]
    sources = {i: unused for i in range(old_rows, len(lines))}
    for word, row in _added(base, grown).items():
        sources[row] = old_tokenizer.convert_tokens_to_ids(old_tokenizer.tokenize(word))
    table, bias = before["bert/embeddings/word_embeddings"], before["cls/predictions/output_bias"]
    expected_table = np.stack([table[sources[r]].astype(np.float64).mean(0)
                               for r in range(old_rows, len(lines))])
    expected_bias = np.array([bias[sources[r]].astype(np.float64).mean()
                              for r in range(old_rows, len(lines))])
    hf = load_file(str(grown["mean_hf"] / "model.safetensors"))
    written = {"tf1": _tf1_tensors(grown["mean"] / "bert_model.ckpt"),
               "ours": tf1_arrays(_pretrainer(grown["mean_ours"])),
               "hf": {"bert/embeddings/word_embeddings": hf["bert.embeddings.word_embeddings.weight"],
                      "cls/predictions/output_bias": hf["cls.predictions.bias"]},
               "random": _tf1_tensors(grown["random"] / "bert_model.ckpt")}
    for kind, after in written.items():
        new_table = after["bert/embeddings/word_embeddings"]
        new_bias = after["cls/predictions/output_bias"]
        np.testing.assert_array_equal(new_table[:old_rows], table, kind)
        np.testing.assert_array_equal(new_bias[:old_rows], bias, kind)
        if kind == "random":
            drawn = new_table[old_rows:]
            assert np.all(np.abs(drawn) <= 0.04) and np.all(new_bias[old_rows:] == 0)
            assert 0.8 * 0.02 * 0.88 < drawn.std() < 1.2 * 0.02 * 0.88  # truncated at 2 sd
        else:
            np.testing.assert_allclose(new_table[old_rows:], expected_table, rtol=1e-6,
                                       atol=1e-7, err_msg=kind)
            np.testing.assert_allclose(new_bias[old_rows:], expected_bias, rtol=1e-6,
                                       atol=1e-7, err_msg=kind)
        if kind in ("tf1", "ours", "random"):
            assert sorted(after) == sorted(n for n in before if n != "global_step"
                                           and not n.endswith(("adam_m", "adam_v")))
            for name, value in before.items():
                if name in after and "word_embeddings" not in name and \
                        name != "cls/predictions/output_bias":
                    np.testing.assert_array_equal(after[name], value, f"{kind}: {name}")


@pytest.fixture(scope="module")
def old_text_probabilities(base, grown):
    """Masked-LM log-probabilities on base-corpus sentences (old text, old tokens) of
    the base and of the grown models: {name: (log_probs, weights)}."""
    from data_prep.tokenization import FullTokenizer

    tokenizer = FullTokenizer(base["vocab"], do_lower_case=True)
    text = open(sorted(base["root"].glob("corpus/*.txt"))[0], encoding="utf-8").read()
    sentences = [s for s in text.split("\n") if len(s.split()) > 4][-200:]
    batch, _, weights = _masked_batch(tokenizer, sentences, random.Random(1))
    return {name: (_log_probs(_pretrainer(path), batch), weights)
            for name, path in (("base", base["google"]), ("mean", grown["mean"]),
                               ("random", grown["random"]))}


@pytest.mark.parametrize("init", ["mean", "random"])
def test_old_tokens_lose_only_the_mass_the_new_rows_take(old_text_probabilities, init):
    """Appending rows leaves the old logits as they were, so at every masked position of
    old text each old token's probability is the base model's times (1 - m), m the mass
    of the new rows. The mean m is measured (docs/extend_vocab.md states it)."""
    base_lp, weights = old_text_probabilities["base"]
    new_lp, _ = old_text_probabilities[init]
    old = base_lp.shape[-1]
    mass = np.exp(new_lp[..., old:]).sum(-1)
    np.testing.assert_allclose(new_lp[..., :old], base_lp + np.log1p(-mass)[..., None],
                               atol=2e-5)
    m = mass[weights > 0]
    print(f"[extend_vocab] new rows' mass at masked positions of old text, --init={init}: "
          f"mean {m.mean():.4f} +- {m.std(ddof=1) / np.sqrt(len(m)):.4f} over {len(m)}")
    assert 0 < m.mean() < 0.5


def test_step_0_loss_on_held_out_domain_text(base, grown):
    """The step-0 masked-LM loss of held-out domain text under the new vocab, --init=mean
    against --init=random on the same masked positions (paired): where the target is an
    added word, the mean start is far better (many standard errors). Measured over every
    position too and printed: on this thirty-step model, which predicts much the same
    distribution everywhere, the mean rows also take more of the old tokens' mass
    (test_old_tokens_...), which costs the old targets more than the new words gain; on a
    real encoder the mean start is lower over all positions too (bench_extend_vocab.py
    --base_checkpoint; docs/extend_vocab.md has both)."""
    from data_prep.tokenization import FullTokenizer

    tokenizer = FullTokenizer(str(grown["mean"] / "vocab.txt"), do_lower_case=True)
    added = set(_added(base, grown).values())
    sentences = [s for _, doc in base["heldout"] for s in doc][:2500]
    rng = random.Random(2)
    batch, targets, weights = _masked_batch(tokenizer, sentences, rng)
    losses = {}
    for init in ("mean", "random"):
        losses[init] = -_log_probs(_pretrainer(grown[init]), batch, targets)
    keep = weights > 0
    new = np.isin(targets, list(added)) & keep
    old = ~np.isin(targets, list(added)) & keep

    def paired(mask):
        d = (losses["random"] - losses["mean"])[mask]
        return d.mean(), d.std(ddof=1) / np.sqrt(len(d)), len(d)

    for label, mask in (("new-word targets", new), ("old targets", old), ("all", keep)):
        m, se, n = paired(mask)
        print(f"[extend_vocab] step-0 loss, random - mean, {label}: {m:+.4f} +- {se:.4f} "
              f"(n = {n})")
    m, se, n = paired(new)
    assert n >= 300 and m > 5 * se, (m, se, n)


# ------------------------------------------------------------------------ other ecosystems


def test_hf_output_is_transformers_bert_for_masked_lm(base, grown, tmp_path, monkeypatch):
    """A Hugging Face directory written by transformers itself, grown (--output_format
    defaults to the input's: hf), loads in BertForMaskedLM with the new vocab_size and
    gives our grown model's masked-LM logits."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing downloaded, read at import
    import torch
    import transformers

    from data_prep.tokenization import FullTokenizer

    _ok(call_main("convert_checkpoint", input=base["google"], output_dir=tmp_path / "ours_hf",
                  output_format="hf"))
    hf_written = tmp_path / "hf_written"
    transformers.BertForPreTraining.from_pretrained(str(tmp_path / "ours_hf")).save_pretrained(
        str(hf_written))
    (hf_written / "vocab.txt").write_text(open(base["vocab"], encoding="utf-8").read())
    _grow(base, tmp_path / "grown_hf", input=hf_written)
    assert _vocab_lines(tmp_path / "grown_hf" / "vocab.txt") == _vocab_lines(
        grown["mean"] / "vocab.txt")
    model = transformers.BertForMaskedLM.from_pretrained(str(tmp_path / "grown_hf")).eval()
    rows = len(_vocab_lines(grown["mean"] / "vocab.txt"))
    assert model.config.vocab_size == rows
    assert tuple(model.cls.predictions.decoder.weight.shape) == (rows, 64)
    tokenizer = FullTokenizer(str(grown["mean"] / "vocab.txt"), do_lower_case=True)
    sentences = [s for _, doc in base["heldout"][:20] for s in doc][:32]
    batch, _, _ = _masked_batch(tokenizer, sentences, random.Random(3))
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                       attention_mask=torch.tensor(batch["input_mask"], dtype=torch.long),
                       token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long)
                       ).logits.numpy()
    ours = _pretrainer(grown["mean"])(batch, training=False)["masked_lm_logits"].numpy()
    theirs = np.take_along_axis(theirs, batch["masked_lm_positions"][..., None], axis=1)
    np.testing.assert_allclose(theirs, ours, atol=2e-4)


def test_tf1_output_runs_in_the_original_code(base, grown):
    """Google's modeling.py (its graph, its Saver) restores the grown tf1 checkpoint with
    the new vocab_size and computes our encoder layers and masked-LM logits."""
    from data_prep.tokenization import FullTokenizer
    from tests.test_modeling_reference import run_original_graph

    config = json.loads((grown["mean"] / "bert_config.json").read_text())
    tokenizer = FullTokenizer(str(grown["mean"] / "vocab.txt"), do_lower_case=True)
    sentences = [s for _, doc in base["heldout"][:10] for s in doc][:8]
    batch, _, _ = _masked_batch(tokenizer, sentences, random.Random(4),
                                pick=lambda ids: [0, 1, 2])
    theirs = run_original_graph(config, batch,
                                checkpoint=str(grown["mean"] / "bert_model.ckpt"))
    assert theirs["mlm"].shape[-1] == config["vocab_size"]
    network = _pretrainer(grown["mean"])
    ours = network(batch, training=False)["masked_lm_logits"].numpy()
    np.testing.assert_allclose(theirs["mlm"], ours, atol=1e-4)
    layers = network.encoder(batch, training=False)["sequence_output"].numpy()
    np.testing.assert_allclose(theirs["layers"][-1], layers, atol=1e-4)


# ------------------------------------------------------------------------ words and places


def test_unused_placement_keeps_vocab_size_and_a_pretraining_run_is_an_input(base, tmp_path):
    """--placement=unused fills [unused*] in id order from a words file; the input is
    the pretraining run's directory (ours), its config and vocab named by flags."""
    words = tmp_path / "words.txt"
    words.write_text("Eigenvalues\nchebyshev\nthe\nhermitian\n", encoding="utf-8")
    result = _ok(call_main("extend_vocab", input=base["run"], new_words_file=words,
                           bert_config_file=base["config"], vocab_file=base["vocab"],
                           output_dir=tmp_path / "out"))
    assert "skipped 1 words already in the vocab: the" in result.stdout
    lines = _vocab_lines(tmp_path / "out" / "vocab.txt")
    old = _vocab_lines(base["vocab"])
    unused = [i for i, t in enumerate(old) if t.startswith("[unused")][:3]
    assert [lines[i] for i in unused] == ["eigenvalues", "chebyshev", "hermitian"]
    assert len(lines) == len(old) and [t for i, t in enumerate(lines) if i not in unused] == [
        t for i, t in enumerate(old) if i not in unused]
    assert os.path.exists(tmp_path / "out" / "ckpt.index")  # ours, as the input
    from modeling.checkpoints import tf1_arrays
    from tests.original_bert import original_module

    old_tokenizer = original_module("tokenization").FullTokenizer(base["vocab"], True)
    before = _tf1_tensors(base["google"] / "bert_model.ckpt")
    after = tf1_arrays(_pretrainer(tmp_path / "out"))
    for word, row in zip(["eigenvalues", "chebyshev", "hermitian"], unused):
        pieces = old_tokenizer.convert_tokens_to_ids(old_tokenizer.tokenize(word))
        for name in ("bert/embeddings/word_embeddings", "cls/predictions/output_bias"):
            np.testing.assert_allclose(after[name][row], before[name][pieces].astype(
                np.float64).mean(0), rtol=1e-6, atol=1e-7, err_msg=f"{word}: {name}")
    too_many = tmp_path / "many.txt"
    too_many.write_text("".join(f"zzword{i}\n" for i in range(150)), encoding="utf-8")
    result = call_main("extend_vocab", input=base["google"], new_words_file=too_many,
                       output_dir=tmp_path / "refused")
    assert result.code == 1
    assert "--placement=unused: 150 words to add but the vocab has only 100 [unused*] " \
        "entries" in result.stderr, result.stderr
    assert not (tmp_path / "refused").exists()


def test_a_table_padded_past_its_vocab_gets_the_words_after_its_rows(tmp_path):
    """NVIDIA's layout (more rows than vocab lines, up to the next multiple of 8): the
    rows past the last line are named [unusedN] in the grown vocab, the words follow."""
    from tests.conftest import TINY_VOCAB, write_vocab
    from tests.test_modeling_reference import run_original_graph, tiny_config_dict, tiny_inputs

    config = tiny_config_dict(vocab_size=112)
    assert len(TINY_VOCAB) == 109
    google = tmp_path / "google"
    google.mkdir()
    run_original_graph(config, tiny_inputs(config), save_to=str(google / "bert_model.ckpt"))
    (google / "bert_config.json").write_text(json.dumps(config))
    write_vocab(google / "vocab.txt")
    words = tmp_path / "words.txt"
    words.write_text("catnip\n", encoding="utf-8")
    _ok(call_main("extend_vocab", input=google, new_words_file=words, placement="append",
                  output_dir=tmp_path / "out"))
    lines = _vocab_lines(tmp_path / "out" / "vocab.txt")
    assert lines == TINY_VOCAB + ["[unused2]", "[unused3]", "[unused4]", "catnip"]
    assert json.loads((tmp_path / "out" / "bert_config.json").read_text())["vocab_size"] == 113


def test_a_failure_while_writing_leaves_no_output(base, tmp_path, monkeypatch):
    """The vocab, config and checkpoint are one set: a write that fails when the set is
    committed (here: the disk refuses to sync) leaves none of them."""
    from data_prep import fileio

    def full_disk(path):
        raise OSError(28, "No space left on device (test)")

    monkeypatch.setattr(fileio, "sync", full_disk)
    words = tmp_path / "words.txt"
    words.write_text("eigenvalues\n", encoding="utf-8")
    result = call_main("extend_vocab", input=base["google"], new_words_file=words,
                       output_dir=tmp_path / "out")
    assert result.code == 1 and "No space left on device (test)" in result.stderr, \
        result.stderr[-2000:]
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize("text, message", [
    ("alpha\n\nbeta\n", "words.txt:2: empty line"),
    ("alpha\nbeta gamma\n", "words.txt:2: 'beta gamma' is 2 words to the tokenizer"),
    ("alpha\nx-ray\n", "words.txt:2: 'x-ray' is 3 words to the tokenizer (x - ray)"),
    ("Alpha\nbeta\nalpha\n", "words.txt:3: 'alpha' repeats line 1"),
    ("alpha\n" + "b" * 201 + "\n", "words.txt:2: a word of 201 characters"),
    ("the\nof\n", "no word to add: every word of --new_words_file="),
])
def test_a_bad_words_file_is_refused_naming_its_line(base, tmp_path, text, message):
    words = tmp_path / "words.txt"
    words.write_text(text, encoding="utf-8")
    result = call_main("extend_vocab", input=base["google"], new_words_file=words,
                       output_dir=tmp_path / "out")
    assert result.code == 1 and message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags, message", [
    ({"do_lower_case": "false"}, "--do_lower_case=false but vocab file"),
    ({"num_new_words": 5}, "give the words with exactly one of --new_words_file and"),
    ({"placement": "append", "pad_vocab_to_multiple_of": 0},
     "--pad_vocab_to_multiple_of=0: must be at least 1"),
    ({"pad_vocab_to_multiple_of": 8}, "--pad_vocab_to_multiple_of pads an appended vocab"),
    ({"vocab_file": "bad_vocab"}, "has 5 tokens but the config beside --input="),
    ({"seed": 3}, "--seed only applies with --init=random (--init=mean draws nothing)"),
])
def test_bad_flags_are_refused(base, tmp_path, flags, message):
    words = tmp_path / "words.txt"
    words.write_text("eigenvalues\n", encoding="utf-8")
    values = dict(input=base["google"], new_words_file=words, output_dir=tmp_path / "out")
    if flags.get("vocab_file") == "bad_vocab":
        flags = {"vocab_file": tmp_path / "vocab.txt"}
        (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    if "num_new_words" in flags:
        flags = {**flags, "corpus": base["domain"]}
    result = call_main("extend_vocab", **{**values, **flags})
    assert result.code == 1 and message in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_do_lower_case_is_checked_against_the_vocab(tmp_path):
    from data_prep import tokenization

    cased = {t: i for i, t in enumerate(["[PAD]", "The", "the", "Numpy", "array"])}
    with pytest.raises(tokenization.VocabError, match="--do_lower_case=true but vocab file "
                       "'v.txt' is cased: 2 of its 4 tokens hold capital letters"):
        tokenization.check_case(cased, "v.txt", True)
    tokenization.check_case(cased, "v.txt", False)
    uncased = {f"w{i}": i for i in range(200)}
    with pytest.raises(tokenization.VocabError, match="is uncased"):
        tokenization.check_case(uncased, "v.txt", False)
    tokenization.check_case(uncased, "v.txt", True)


# ------------------------------------------------------------------------ the runners


def test_a_padded_table_fits_a_shorter_vocab_and_nothing_else_does(tmp_path):
    """A table with more rows than the vocab fits (NVIDIA's 30528 rows for 30522 tokens, a
    config rounded up), as in the original; but not when the model's own vocab beside it
    has every row (a grown model read with its old vocab), nor a vocab longer than the
    table: both sizes named."""
    from data_prep.tokenization import VocabError
    from modeling.config import BertConfig
    from training import trainer_setup

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"w{i}\n" for i in range(30522)))
    grown = tmp_path / "grown_vocab.txt"
    for rows, own, fits in ((30522, None, True), (30528, None, True), (30592, None, True),
                            (30528, 30522, True), (30536, 30536, False),
                            (30521, None, False)):
        model_vocab = None
        if own is not None:
            grown.write_text("".join(f"w{i}\n" for i in range(own)))
            model_vocab = str(grown)
        if fits:
            trainer_setup.check_vocab_fits(str(vocab), BertConfig(vocab_size=rows), "c",
                                           model_vocab)
        else:
            with pytest.raises(VocabError, match=rf"--vocab_file={vocab} has 30522 tokens "
                                                 rf"but c has vocab_size={rows}: "):
                trainer_setup.check_vocab_fits(str(vocab), BertConfig(vocab_size=rows), "c",
                                               model_vocab)


def _classifier_data(base, directory) -> str:
    """Which numpy module a held-out docstring sentence documents (real text)."""
    directory.mkdir(exist_ok=True)
    rows = [(s.replace("\t", " "), module) for module, doc in base["heldout"] for s in doc
            if module in ("linalg", "ma", "random") and len(s.split()) > 3]
    random.Random(0).shuffle(rows)
    for name, part in (("train", rows[:96]), ("dev", rows[96:128]), ("test", rows[128:160])):
        (directory / f"{name}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{s}\t{m}\n" for s, m in part), encoding="utf-8")
    return str(directory)


@pytest.mark.parametrize("case", ["old vocab", "old config"])
def test_the_runners_refuse_a_vocab_that_does_not_fit_naming_both_sizes(base, grown,
                                                                           tmp_path, case):
    old = len(_vocab_lines(base["vocab"]))
    new = len(_vocab_lines(grown["mean"] / "vocab.txt"))
    data = _classifier_data(base, tmp_path / "data")
    vocab = base["vocab"] if case == "old vocab" else grown["mean"] / "vocab.txt"
    config = grown["mean"] / "bert_config.json" if case == "old vocab" else base["config"]
    expected = (f"has {old} tokens but --bert_config_file={config} has vocab_size={new}"
                if case == "old vocab" else
                f"has a vocab of {new} rows (its word embeddings) but the config has "
                f"vocab_size={old}")
    if case == "old config":  # the config must fit the vocab given: the old one
        vocab = base["vocab"]
    result = call_main("run_classifier", task_name="custom", data_dir=data,
                       text_a_column="sentence", label_column="label", vocab_file=vocab,
                       bert_config_file=config, init_checkpoint=grown["mean"],
                       output_dir=tmp_path / "out", do_train="true", max_seq_length=32,
                       train_batch_size=16)
    assert result.code == 1 and expected in result.stderr, (result.stderr + result.log)[-3000:]
    assert "Traceback" not in result.stderr
    for tool, flags in (("extract_features", dict(input_file=f"{data}/dev.tsv", layers=-1,
                                                  output_file=tmp_path / "f.jsonl")),
                        ("export_saved_model", dict(export_dir=tmp_path / "export",
                                                    model_type="encoder"))):
        if case == "old config":
            continue  # the same load_pretrained refusal as run_classifier's
        result = call_main(tool, init_checkpoint=grown["mean"], vocab_file=base["vocab"],
                           **flags)
        assert result.code == 1 and (f"has {old} tokens but the config beside" in
                                     result.stderr), (tool, result.stderr[-2000:])
        assert "Traceback" not in result.stderr, (tool, result.stderr[-2000:])


# ------------------------------------------------------------------------ the workflow


@pytest.mark.slow
def test_the_whole_workflow_of_the_guide(base, grown, tmp_path):
    """docs/extend_vocab.md's commands, small: records with the grown vocab, continued
    pretraining from the grown model, then every fine-tuning runner, extract_features and
    export_saved_model from the continued run with the grown vocab."""
    from tests.test_run_ner import write_conll
    from tests.test_run_squad import write_squad

    g, W = grown["mean"], tmp_path
    vocab, config = str(g / "vocab.txt"), str(g / "bert_config.json")
    _ok(call_main("create_pretraining_data", input_file=base["domain"],
                  output_file=W / "domain.tfrecord", vocab_file=vocab, max_seq_length=SEQ,
                  max_predictions_per_seq=10, dupe_factor=1, num_workers=1))
    _ok(call_main("run_pretraining", input_file=W / "domain.tfrecord", bert_config_file=config,
                  init_checkpoint=g, output_dir=W / "continued", do_train="true",
                  train_batch_size=32, max_seq_length=SEQ, max_predictions_per_seq=10,
                  num_train_steps=2, num_warmup_steps=1, learning_rate="1e-4",
                  iterations_per_loop=2, save_checkpoints_steps=2))
    # The runners' default batch sizes; epochs enough for a step on the smallest data.
    common = dict(vocab_file=vocab, bert_config_file=config, init_checkpoint=W / "continued",
                  do_train="true", num_train_epochs=4.0, max_seq_length=SEQ, seed=1)
    _ok(call_main("run_classifier", task_name="custom",
                  data_dir=_classifier_data(base, W / "classify"), text_a_column="sentence",
                  label_column="label", do_eval="true", output_dir=W / "classifier", **common))
    rng = random.Random(0)
    (W / "squad").mkdir()
    _ok(call_main("run_squad", train_file=write_squad(W / "squad" / "train.json", rng, "1.1", 4),
                  predict_file=write_squad(W / "squad" / "dev.json", rng, "1.1", 2, dev=True),
                  do_predict="true", doc_stride=32, max_query_length=16,
                  output_dir=W / "squad_out", **common))
    (W / "ner").mkdir()
    for split in ("eng.train", "eng.testa", "eng.testb"):
        write_conll(W / "ner" / split, rng, documents=2, per_document=4)
    _ok(call_main("run_ner", data_dir=W / "ner", do_eval="true", output_dir=W / "ner_out",
                  **common))
    first, second = list(_added(base, grown))[:2]
    (W / "input.txt").write_text(f"The {first} of a {second}.\n")
    _ok(call_main("extract_features", input_file=W / "input.txt", output_file=W / "f.jsonl",
                  init_checkpoint=W / "continued", vocab_file=vocab, bert_config_file=config,
                  layers=-1, max_seq_length=SEQ))
    tokens = [f["token"] for f in json.loads(open(W / "f.jsonl").readline())["features"]]
    assert first in tokens and second in tokens, tokens
    _ok(call_main("export_saved_model", model_type="classifier",
                  init_checkpoint=W / "classifier", export_dir=W / "export"))
    assert (W / "export" / "saved_model.pb").exists()
