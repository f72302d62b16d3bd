"""Masking on the fly (training/dynamic_masking.py) against the original's masking rules and
output, the static masks, determinism and epochs, and run_pretraining on unmasked records.

The pairs masked here are the original's own unmasked pairs on real prose (its
create_training_instances with masking replaced by a no-op; ours are identical:
test_pretraining_data.test_default_mode_builds_the_originals_instances), so the original's
masks and ours can be compared instance by instance.
"""

import collections
import dataclasses
import json
import os
import random

import numpy as np
import pytest
import tensorflow as tf

import pretraining_reference as reference_runs
import reference_instances as per_instance
from data_prep import features
from data_prep.pretraining_data.chunks import ChunkTask, load_tokenizer, process_chunk
from data_prep.pretraining_data.documents import ByteRange, read_documents
from data_prep.pretraining_data.instances import unit_instances
from data_prep.pretraining_data.masking import create_masked_lm_predictions, mask_vectorized
from training import dynamic_masking as dm
from training import input_pipeline, record_checks
from tests.clis import call_main
from tests.test_loop_support import read_eval_results

CONFIG = reference_runs.CONFIG
SEQ, PREDS = CONFIG.max_seq_length, CONFIG.max_predictions_per_seq
Z = reference_runs.Z


@pytest.fixture(scope="module")
def pairs(prose):
    """The original's unmasked pairs, padded as the unmasked records hold them."""
    rows = prose["original_unmasked_rows"]
    ids = np.zeros((len(rows), SEQ), np.int32)
    segments = np.zeros_like(ids)
    mask = np.zeros_like(ids)
    for i, (tokens, segment_ids, *_rest) in enumerate(rows):
        ids[i, :len(tokens)] = tokens
        segments[i, :len(tokens)] = segment_ids
        mask[i, :len(tokens)] = 1
    labels = np.array([[r[4]] for r in rows], np.int32)
    return dict(input_ids=ids, input_mask=mask, segment_ids=segments,
                next_sentence_labels=labels)


def masking_of(prose, **settings):
    _, vocab = load_tokenizer(prose["vocab"], True)
    return dm.DynamicMasking(max_predictions_per_seq=PREDS, vocab=vocab,
                             masked_lm_prob=CONFIG.masked_lm_prob, **settings)


def dynamic(pairs, masking, epochs):
    """Our masks of all pairs, once per epoch (seed (1, epoch)), as lists of
    (masked ids row, positions, labels)."""
    example = {k: tf.constant(v) for k, v in pairs.items()}
    out = []
    for epoch in range(epochs):
        masked = {k: v.numpy() for k, v in dm.mask_batch(
            example, masking, tf.constant([1, epoch], tf.int64)).items()}
        for i in range(len(pairs["input_ids"])):
            k = int(masked["masked_lm_weights"][i].sum())
            assert masked["masked_lm_weights"][i].tolist() == [1.0] * k + [0.0] * (PREDS - k)
            out.append((masked["input_ids"][i], masked["masked_lm_positions"][i][:k].tolist(),
                        masked["masked_lm_ids"][i][:k].tolist()))
    return out


def candidates_of(pairs, i, vocab):
    n = int(pairs["input_mask"][i].sum())
    ids = pairs["input_ids"][i]
    return [p for p in range(n) if ids[p] not in (vocab.cls_id, vocab.sep_id)]


# ---------------------------------------------------------------------------------------
# The rules, on every pair.


@pytest.mark.parametrize("whole_word", [False, True], ids=["per_token", "whole_word"])
def test_every_mask_follows_the_rules(prose, pairs, whole_word):
    masking = masking_of(prose, do_whole_word_mask=whole_word)
    vocab = masking.vocab
    masks = dynamic(pairs, masking, epochs=1)
    for i, (shown, positions, labels) in enumerate(masks):
        n = int(pairs["input_mask"][i].sum())
        original = pairs["input_ids"][i]
        budget = min(PREDS, max(1, int(round(n * CONFIG.masked_lm_prob))))
        assert positions == sorted(set(positions)), positions
        assert set(positions) <= set(candidates_of(pairs, i, vocab))  # no [CLS]/[SEP]/pad
        assert labels == original[positions].tolist()
        untouched = np.ones(SEQ, bool)
        untouched[positions] = False
        assert (shown[untouched] == original[untouched]).all()
        if whole_word:
            assert len(positions) <= budget
            for word in _words(original, n, vocab):
                chosen = set(word) & set(positions)
                assert not chosen or chosen == set(word), (word, positions)
        else:
            assert len(positions) == min(budget, len(candidates_of(pairs, i, vocab)))


def _words(ids, n, vocab):
    """The original's whole-word groups: a `##` piece joins the previous candidate's
    word, across A's [SEP] too."""
    groups = []
    for p in range(n):
        if ids[p] in (vocab.cls_id, vocab.sep_id):
            continue
        if groups and vocab.is_continuation[ids[p]]:
            groups[-1].append(p)
        else:
            groups.append([p])
    return groups


def test_number_of_predictions_rounds_as_python_does(prose):
    """round(n * masked_lm_prob) as the original computes it: float64, half to even.
    190 * 0.15 is 28.499999999999996 in float64 (28 predictions) but 28.5 in float32
    (28 or 29), 350 * 0.15 52.49999999999999 (52); 10 * 0.15 is 1.5 (2), 50 * 0.15 7.5 (8)."""
    masking = dataclasses.replace(masking_of(prose), max_predictions_per_seq=80)
    vocab = masking.vocab
    seq = 400
    word = next(i for i in vocab.replacement_ids if i > 200 and not vocab.is_continuation[i])
    cases = [(190, 28), (350, 52), (10, 2), (50, 8), (30, 4), (4, 1)]
    ids = np.full((len(cases), seq), word, np.int32)
    mask = np.zeros_like(ids)
    for row, (n, _) in enumerate(cases):
        ids[row, n:] = 0
        ids[row, [0, 2, n - 1]] = vocab.cls_id, vocab.sep_id, vocab.sep_id
        mask[row, :n] = 1
    example = dict(input_ids=tf.constant(ids), input_mask=tf.constant(mask),
                   segment_ids=tf.zeros_like(ids),
                   next_sentence_labels=tf.zeros([len(cases), 1], tf.int32))
    out = dm.mask_batch(example, masking, tf.constant([3, 4], tf.int64))
    counts = out["masked_lm_weights"].numpy().sum(axis=1).astype(int).tolist()
    assert counts == [expected for _, expected in cases]
    assert [int(round(n * 0.15)) for n, _ in cases] == counts


# ---------------------------------------------------------------------------------------
# Statistics: ours against the original's masks and our static masks, on the same pairs.


def subset_variance(values, k):
    """Variance of the sum of a uniformly random k-subset of `values` (without
    replacement): k * (c - k) / (c - 1) * population variance."""
    c = len(values)
    return 0.0 if c <= 1 else k * (c - k) / (c - 1) * float(np.var(values))


def mask_statistics(pairs, masks, vocab):
    """Totals over all masks: predictions, [MASK], kept, in segment A, position sum."""
    total = collections.Counter()
    for i, shown, positions, labels in _cycle(masks, len(pairs["input_ids"])):
        segments = pairs["segment_ids"][i]
        total["masked"] += len(positions)
        total["as_mask"] += sum(int(shown[p]) == vocab.mask_id for p in positions)
        total["kept"] += sum(int(shown[p]) == label for p, label in zip(positions, labels))
        total["in_a"] += sum(int(segments[p]) == 0 for p in positions)
        total["position"] += sum(positions)
    return total


def _cycle(masks, n):
    for j, mask in enumerate(masks):
        yield j % n, *mask


def original_masks(prose):
    """The original's masks of the same pairs: (masked ids, positions, labels)."""
    return [(np.array(r[0]), r[1], r[2]) for r in prose["original_remasked_rows"]]


def expected_selection(pairs, vocab, epochs):
    """Exact expectation and variance of the in-A count and position sum under the rule
    'a uniformly random subset of the candidates', given each pair's count."""
    out = collections.Counter()
    for i in range(len(pairs["input_ids"])):
        candidates = candidates_of(pairs, i, vocab)
        n = int(pairs["input_mask"][i].sum())
        k = min(PREDS, max(1, int(round(n * CONFIG.masked_lm_prob))), len(candidates))
        in_a = [float(pairs["segment_ids"][i][p] == 0) for p in candidates]
        out["masked"] += k * epochs
        out["in_a"] += k * np.mean(in_a) * epochs
        out["in_a_var"] += subset_variance(in_a, k) * epochs
        out["position"] += k * np.mean(candidates) * epochs
        out["position_var"] += subset_variance(candidates, k) * epochs
    return out


def test_statistics_match_the_originals_masks_and_the_rules(prose, pairs):
    """Our on-the-fly masks and the original's own masks of the same pairs: the same
    number of predictions on every pair; the [MASK]/kept shares (binomial: every masked
    token draws independently) and where the masks fall (segment A share, positions:
    exact moments of a uniformly random subset) within 4 standard errors of each other
    and of the rules' values."""
    masking = masking_of(prose)
    vocab = masking.vocab
    epochs = reference_runs.MASKING_REPEATS
    ours, theirs = dynamic(pairs, masking, epochs), original_masks(prose)
    assert len(ours) == len(theirs) > 10000
    assert [len(m[1]) for m in ours] == [len(m[1]) for m in theirs]
    a, b = mask_statistics(pairs, ours, vocab), mask_statistics(pairs, theirs, vocab)
    expected = expected_selection(pairs, vocab, epochs)
    assert a["masked"] == b["masked"] == expected["masked"]
    masked = a["masked"]
    for name, p in (("as_mask", 0.8), ("kept", 0.1)):
        se = np.sqrt(p * (1 - p) / masked)  # one share
        assert abs(a[name] / masked - p) < Z * se, (name, a[name] / masked)
        assert abs(a[name] - b[name]) / masked < Z * np.sqrt(2) * se, (name, a, b)
    for name in ("in_a", "position"):
        se = np.sqrt(expected[f"{name}_var"])  # of one method's total
        for stats in (a, b):
            assert abs(stats[name] - expected[name]) < Z * se, (name, stats, expected)
        assert abs(a[name] - b[name]) < Z * np.sqrt(2) * se, (name, a, b)


# The paper's Table 8 rows (MASK / SAME / RND) as (mask_token_rate, random_token_rate).
TABLE_8 = [(0.8, 0.1), (1.0, 0.0), (0.8, 0.2), (0.8, 0.0), (0.0, 0.8), (0.0, 1.0)]


@pytest.mark.parametrize("mask_rate, random_rate", TABLE_8,
                         ids=[f"{m}_{r}" for m, r in TABLE_8])
def test_table_8_rows_give_their_split(prose, pairs, mask_rate, random_rate):
    """Each row of Table 8 on the fly: the same positions and labels as the default (the
    rates change only what a position shows), [MASK] / kept shares within 4 standard
    errors of the rates (a random draw is [MASK] or the label 1/V of the time), exactly
    0 or 1 where a share is."""
    masking = masking_of(prose, mask_token_rate=mask_rate, random_token_rate=random_rate)
    masking.validate()
    vocab = masking.vocab
    ours, default = dynamic(pairs, masking, 1), dynamic(pairs, masking_of(prose), 1)
    assert [m[1:] for m in ours] == [m[1:] for m in default]
    stats = mask_statistics(pairs, ours, vocab)
    masked = stats["masked"]
    hit = random_rate / len(vocab.replacement_ids)
    keep = round(1 - mask_rate - random_rate, 9)
    for name, p in (("as_mask", mask_rate + hit), ("kept", keep + hit)):
        if p in (0.0, 1.0):
            assert stats[name] == p * masked, (name, stats)
        else:
            se = np.sqrt(p * (1 - p) / masked)
            assert abs(stats[name] / masked - p) < Z * se, (name, stats[name] / masked, p)


def test_masking_rates_are_checked_and_part_of_the_input_identity(prose, unmasked_records):
    with pytest.raises(ValueError, match="--mask_token_rate=0.9 plus --random_token_rate=0.2"):
        masking_of(prose, mask_token_rate=0.9, random_token_rate=0.2).validate()
    records, _ = unmasked_records

    def identity(masking):
        config = input_pipeline.PretrainingInputConfig((records,), SEQ, PREDS, seed=1,
                                                       masking=masking)
        return input_pipeline.pretraining_input_identity(config, 8)["masking"]

    # The default's identity is the one saved before the rates existed (its runs resume).
    assert sorted(identity(masking_of(prose))) == ["do_whole_word_mask", "masked_lm_prob",
                                                   "vocab_entries"]
    other = identity(masking_of(prose, mask_token_rate=1.0, random_token_rate=0.0))
    assert (other["mask_token_rate"], other["random_token_rate"]) == (1.0, 0.0)


def test_random_replacements_come_from_the_whole_vocab(prose, pairs):
    """Replacements are uniform over every vocabulary entry (special and [unused] ones
    included, as the original's `list(vocab.keys())`): their mean id within 4 standard
    errors of the uniform mean, and low ids ([PAD], [UNK], [unusedN]) drawn too."""
    masking = masking_of(prose)
    vocab = masking.vocab
    replaced = []
    for _, shown, positions, labels in _cycle(dynamic(pairs, masking, epochs=3),
                                              len(pairs["input_ids"])):
        replaced += [int(shown[p]) for p, label in zip(positions, labels)
                     if int(shown[p]) not in (vocab.mask_id, label)]
    ids = np.sort(np.array(vocab.replacement_ids))
    n = len(replaced)
    assert n > 3000
    assert abs(np.mean(replaced) - ids.mean()) < Z * ids.std() / np.sqrt(n)
    # Five equal slices of the vocabulary, each drawn its share of the time (binomial).
    for part in np.array_split(ids, 5):
        p = len(part) / len(ids)
        hits = np.isin(replaced, part).sum()
        assert abs(hits - n * p) < Z * np.sqrt(n * p * (1 - p)), (part[0], hits, n * p)
    # The specials before [MASK] are drawn too ([PAD], [UNK], [CLS], [SEP]: 4 of ~2500
    # ids; about 8 expected).
    assert sum(r < vocab.mask_id for r in replaced) >= 1


def test_static_masks_agree_with_the_dynamic_ones(prose, pairs):
    """The static (numpy, create_pretraining_data's default) masks of the same pairs:
    the same counts on every pair, and shares within 4 standard errors of the dynamic
    ones'."""
    masking = masking_of(prose)
    vocab = masking.vocab
    rows = prose["original_unmasked_rows"]
    # Our instances of these pairs (they are ours too), masked by mask_vectorized.
    tokenize_ids, _ = load_tokenizer(prose["vocab"], True)
    path = prose["corpus"]
    documents = read_documents([ByteRange(path, 0, os.path.getsize(path))],
                               tokenize_ids)
    compact = unit_instances(documents, CONFIG, vocab, seed=reference_runs.SEED, index=0,
                             dynamic_masking=True)
    mask_vectorized(compact, CONFIG, vocab, np.random.default_rng(9))
    static = []
    for instance, row in zip(per_instance.to_instances(compact, vocab), rows):
        ids = list(instance.input_ids)
        for p, label in zip(instance.masked_lm_positions, instance.masked_lm_ids):
            ids[p] = label
        assert ids == row[0]  # the same pair, in the same place
        static.append((np.array(instance.input_ids), instance.masked_lm_positions,
                       instance.masked_lm_ids))
    ours = dynamic(pairs, masking, epochs=1)
    assert [len(m[1]) for m in ours] == [len(m[1]) for m in static]
    a, b = mask_statistics(pairs, ours, vocab), mask_statistics(pairs, static, vocab)
    expected = expected_selection(pairs, vocab, 1)
    for name, p in (("as_mask", 0.8), ("kept", 0.1)):
        se = np.sqrt(2 * p * (1 - p) / a["masked"])
        assert abs(a[name] - b[name]) / a["masked"] < Z * se, (name, a, b)
    for name in ("in_a", "position"):
        assert abs(a[name] - b[name]) < Z * np.sqrt(2 * expected[f"{name}_var"]), name


def test_whole_word_masks_agree_with_the_static_port(prose, pairs):
    """Whole-word masking (bert-tensorflow 1.0.4 predates it): ours on the fly against our
    static port of the original's rule (`create_masked_lm_predictions`, Python
    draws) on the same pairs, paired per pair over repeats: predictions per pair and the
    share of `##` pieces among them within 4 standard errors of the paired differences."""
    masking = masking_of(prose, do_whole_word_mask=True)
    vocab = masking.vocab
    repeats = 2
    n_pairs = len(pairs["input_ids"])
    ours = dynamic(pairs, masking, epochs=repeats)
    rng = random.Random(5)
    static = []
    for _ in range(repeats):
        for i in range(n_pairs):
            n = int(pairs["input_mask"][i].sum())
            ids = pairs["input_ids"][i][:n].tolist()
            num_a = int((pairs["segment_ids"][i][:n] == 0).sum()) - 2
            positions, labels = create_masked_lm_predictions(
                ids, num_a, dataclasses.replace(CONFIG, do_whole_word_mask=True), vocab, rng)
            static.append((np.array(ids), positions, labels))

    def per_pair(masks):
        count = np.zeros(n_pairs)
        pieces = np.zeros(n_pairs)
        for j, (_, positions, labels) in enumerate(masks):
            count[j % n_pairs] += len(positions) / repeats
            pieces[j % n_pairs] += sum(vocab.is_continuation[t] for t in labels) / repeats
        return count, pieces

    (count_a, pieces_a), (count_b, pieces_b) = per_pair(ours), per_pair(static)
    assert pieces_a.sum() > 500  # words of several pieces are masked whole
    for a, b in ((count_a, count_b), (pieces_a, pieces_b)):
        d = a - b
        assert abs(d.mean()) < Z * d.std(ddof=1) / np.sqrt(n_pairs) + 1e-12, d.mean()


# ---------------------------------------------------------------------------------------
# In the input pipeline: unmasked records, determinism, epochs.


@pytest.fixture(scope="module")
def unmasked_records(prose, tmp_path_factory):
    """Unmasked TFRecords (what create_pretraining_data --dynamic_masking writes) of the
    first part of the corpus: ~300 pairs."""
    path = prose["corpus"]
    task = ChunkTask(0, (ByteRange(path, 0, 20_000),), prose["vocab"], True,
                     dataclasses.replace(CONFIG, dupe_factor=1), 3, dynamic_masking=True)
    result = process_chunk(task)
    out = str(tmp_path_factory.mktemp("unmasked") / "pairs.tfrecord")
    with open(out, "wb") as f:
        f.write(result.data)
    return out, result.stats.instances


def batches(records, masking, seed, count, is_training=True, batch_size=16):
    config = input_pipeline.PretrainingInputConfig(
        [records], SEQ, PREDS, seed=seed, masking=masking, shuffle_buffer=64)
    dataset = input_pipeline.pretraining_dataset(config, batch_size=batch_size,
                                                 is_training=is_training)
    return [{k: v.numpy() for k, v in b.items()} for b in dataset.take(count)]


def test_pipeline_gives_the_models_layout(prose, unmasked_records):
    """Unmasked records come out of the input pipeline with the features, dtypes and
    shapes masked records have."""
    records, _ = unmasked_records
    masking = masking_of(prose, seed=1)
    batch = batches(records, masking, 1, 1)[0]
    assert set(batch) == set(features.PRETRAINING.names)
    for name in ("input_ids", "input_mask", "segment_ids"):
        assert batch[name].shape == (16, SEQ) and batch[name].dtype == np.int32
    for name in ("masked_lm_positions", "masked_lm_ids"):
        assert batch[name].shape == (16, PREDS) and batch[name].dtype == np.int32
    assert batch["masked_lm_weights"].dtype == np.float32
    assert batch["next_sentence_labels"].shape == (16, 1)
    assert (batch["masked_lm_weights"].sum(axis=1) >= 1).all()


def _unmasked_key(batch, row):
    ids = batch["input_ids"][row].copy()
    k = int(batch["masked_lm_weights"][row].sum())
    ids[batch["masked_lm_positions"][row][:k]] = batch["masked_lm_ids"][row][:k]
    return ids.tobytes()


def _mask_of(batch, row):
    k = int(batch["masked_lm_weights"][row].sum())
    return batch["input_ids"][row].tobytes(), batch["masked_lm_positions"][row][:k].tobytes()


def test_masks_are_deterministic_for_a_seed_and_change_every_epoch(prose, unmasked_records):
    records, instances = unmasked_records
    masking = masking_of(prose, seed=11)
    count = 4 * instances // 16  # four epochs
    first = batches(records, masking, 11, count)
    again = batches(records, masking, 11, count)
    other = batches(records, masking_of(prose, seed=12), 12, count)
    assert all((a[k] == b[k]).all() for a, b in zip(first, again) for k in a)
    assert any((a["input_ids"] != b["input_ids"]).any() for a, b in zip(first, other))
    seen = collections.defaultdict(list)  # the same pair, every time it comes
    for batch in first:
        for row in range(16):
            seen[_unmasked_key(batch, row)].append(_mask_of(batch, row))
    repeated = [masks for masks in seen.values() if len(masks) >= 3]
    assert len(repeated) > 0.8 * instances
    # A pair's masks coincide by chance only when it is short (a single prediction among
    # a few candidates); on most pairs every epoch's mask is new.
    fresh = sum(len(set(masks)) == len(masks) for masks in repeated)
    assert fresh > 0.8 * len(repeated), (fresh, len(repeated))


def test_record_kind_and_flags_must_agree(prose, unmasked_records, tmp_path):
    records, _ = unmasked_records
    schema = record_checks.check_pretraining_files([records], SEQ, PREDS)
    assert schema is features.PRETRAINING_UNMASKED
    with pytest.raises(dm.DynamicMaskingError, match="--vocab_file"):
        record_checks.check_record_kind(schema, None, records)
    with pytest.raises(dm.DynamicMaskingError, match="already masked"):
        record_checks.check_record_kind(features.PRETRAINING, masking_of(prose), records)
    with pytest.raises(ValueError, match="max_seq_length expects 32"):
        record_checks.check_pretraining_files([records], 32, PREDS)


# ---------------------------------------------------------------------------------------
# End to end: create_pretraining_data --dynamic_masking, then run_pretraining.


@pytest.mark.slow
def test_run_pretraining_trains_on_unmasked_records(prose, tmp_path):
    records = str(tmp_path / "pairs.tfrecord")
    data = ["--input_file=" + prose["corpus"], "--vocab_file=" + prose["vocab"],
            f"--output_file={records}", f"--max_seq_length={SEQ}"]
    refused = call_main("create_pretraining_data",
                        [*data, "--dynamic_masking", "--masked_lm_prob=0.2"])
    assert refused.code == 1 and "--masked_lm_prob" in refused.stderr
    done = call_main("create_pretraining_data", [*data, "--dynamic_masking", "--num_workers=1"])
    assert done.code == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "_pairs.tfrecord.summary.json").read_text())
    assert summary["dynamic_masking"] and summary["config"]["dupe_factor"] == 1
    assert record_checks.check_pretraining_files([records], SEQ, PREDS) is \
        features.PRETRAINING_UNMASKED
    vocab_size = len(open(prose["vocab"], encoding="utf-8").read().split())
    config = tmp_path / "bert_config.json"
    config.write_text(json.dumps(dict(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, hidden_act="gelu", hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1, max_position_embeddings=SEQ, type_vocab_size=2,
        initializer_range=0.02)))
    train = [f"--input_file={records}", f"--bert_config_file={config}",
             f"--max_seq_length={SEQ}", f"--max_predictions_per_seq={PREDS}",
             "--train_batch_size=8", "--eval_batch_size=8", "--num_train_steps=6",
             "--num_warmup_steps=2", "--iterations_per_loop=3", "--save_checkpoints_steps=6",
             "--max_eval_steps=3", "--seed=1", "--learning_rate=1e-3"]
    refused = call_main("run_pretraining", [*train, f"--output_dir={tmp_path / 'no_vocab'}",
                                            "--do_train"])
    assert refused.code == 1 and "--vocab_file" in refused.stderr, refused.stderr[-2000:]
    done = call_main("run_pretraining", [*train, f"--output_dir={tmp_path / 'run'}",
                                         "--do_train", "--do_eval",
                                         f"--vocab_file={prose['vocab']}", "--do_whole_word_mask"])
    assert done.code == 0, (done.stderr + done.log)[-3000:]
    from training import pretraining

    values = read_eval_results(str(tmp_path / "run" / "eval_results.txt"))
    assert values["global_step"] == 6
    assert np.isfinite(values["loss"])
    # The accuracy recomputed here: the run's last checkpoint on the batches its eval read
    # (the records in order, masked on the fly with the run's seed: the masks are stateless
    # functions of it), each prediction counted by its weight.
    from modeling.config import BertConfig
    from modeling.models import BertPretrainer

    masking = dm.DynamicMasking.from_vocab_file(
        prose["vocab"], max_predictions_per_seq=PREDS, masked_lm_prob=0.15,
        do_whole_word_mask=True, mask_token_rate=0.8, random_token_rate=0.1, seed=1)
    model = BertPretrainer(BertConfig.from_json_file(str(config)))
    pretraining.build_pretraining_model(model, SEQ, PREDS)
    tf.train.Checkpoint(model=model).restore(
        tf.train.latest_checkpoint(str(tmp_path / "run"))).expect_partial()
    correct = weight = 0.0
    for batch in batches(records, masking, 1, 3, is_training=False, batch_size=8):
        logits = model({k: tf.constant(v) for k, v in batch.items()},
                       training=False)["masked_lm_logits"].numpy()
        hits = logits.argmax(-1) == batch["masked_lm_ids"]
        correct += float((hits * batch["masked_lm_weights"]).sum())
        weight += float(batch["masked_lm_weights"].sum())
    assert weight > 0
    assert values["masked_lm_accuracy"] == pytest.approx(correct / weight, abs=1e-6), (
        values, correct, weight)
