"""Instance generation against Google's original: exact instances, statistics, edge cases."""

import json
import os
import random
import sys
import time

import numpy as np
import pytest

import pretraining_reference as reference_runs
import reference_instances as per_instance
from conftest import TINY_VOCAB, write_vocab
from data_prep.pretraining_data.chunks import ChunkTask, load_tokenizer, process_chunk
from data_prep.cli import FlagError
from data_prep.pretraining_data.config import PretrainingConfig
from data_prep.pretraining_data.documents import ByteRange, plan_chunks, read_documents
from data_prep.pretraining_data.draws import chunk_masking_rng, chunk_rng, shuffle
from data_prep.pretraining_data.instances import create_compact_instances, unit_instances
from data_prep.pretraining_data.masking import MaskingVocab, create_masked_lm_predictions
from data_prep.pretraining_data.records import CompactSerializer, _varints
from data_prep.pretraining_data.stats import Stats
from data_prep.text_input import InputError
from data_prep import tokenization
from tests import clis

WORDS = ["the", "a", "of", "and", "to", "in", "is", "was", "it", "he", "she", "on", "cat",
         "dog", "sat", "mat", "ran", "far", "away", "home", "big", "red", "want", "run",
         ",", "!", "?"]
# Words that split into several WordPieces (e.g. "unaffable" -> un ##aff ##able).
MULTI_PIECE = ["cats", "dogs", "wanted", "unaffable", "quickly", "running", "mats", "homes"]


@pytest.fixture
def vocab_file(tmp_path):
    # Without repeated entries, so ids are line numbers for every loader.
    return write_vocab(tmp_path / "vocab.txt", list(dict.fromkeys(TINY_VOCAB)))


def write_corpus(path, num_docs, seed, words=WORDS + MULTI_PIECE, max_words=30):
    """Documents of 1-20 sentences, a few lines that tokenize to nothing (skipped)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(num_docs):
        for _ in range(rng.choice([1, 1, 2, 3, 5, 8, 12, 20])):
            lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(2, max_words)))
                         + " .")
            if rng.random() < 0.03:
                lines.append("\x07\x00")
        lines.append("   " if rng.random() < 0.1 else "")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


EXACT_CASES = [(64, 10, 0.1), (16, 3, 0.5), (128, 20, 0.1)]


def original_instances(runs):
    """The original's create_training_instances for each (files, vocab, config, seed), in
    this process, with its absl flags (of our flags' names) defined for the call only
    (tests/clis.py's flag scope; its tokenizer reads --preserve_unused_tokens)."""
    from absl import flags

    import bert.tokenization  # noqa: F401  (its flag stays defined, as an import leaves it)

    with clis._flag_scope(_OriginalFlags):  # noqa: SLF001
        flags.FLAGS.mark_as_parsed()
        cpd, tok = _OriginalFlags.modules
        results = []
        for files, vocab, config, seed in runs:
            t = tok.FullTokenizer(vocab, True)
            out = cpd.create_training_instances(
                files, t, config.max_seq_length, config.dupe_factor, config.short_seq_prob,
                config.masked_lm_prob, config.max_predictions_per_seq, random.Random(seed))
            results.append([[t.convert_tokens_to_ids(i.tokens), i.segment_ids,
                             list(i.masked_lm_positions),
                             t.convert_tokens_to_ids(i.masked_lm_labels),
                             int(i.is_random_next)] for i in out])
    return json.loads(json.dumps(results))  # plain lists, as the tests compare them


class _OriginalFlags:
    """For clis' flag scope: the original's modules (re)imported, which defines their
    flags."""

    modules = ()

    @classmethod
    def define_flags(cls):
        import importlib

        cls.modules = tuple(
            importlib.reload(sys.modules[name]) if name in sys.modules
            else importlib.import_module(name)
            for name in ("bert.tokenization", "bert.create_pretraining_data"))[::-1]


def _exact_config(max_seq_length, max_predictions, short_seq_prob):
    return PretrainingConfig(max_seq_length=max_seq_length,
                             max_predictions_per_seq=max_predictions,
                             short_seq_prob=short_seq_prob, dupe_factor=2)


WWM_CONFIG = PretrainingConfig(max_seq_length=48, max_predictions_per_seq=8,
                               dupe_factor=2, do_whole_word_mask=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Corpora, vocab, and the original's instances on them, computed once per module."""
    tmp = tmp_path_factory.mktemp("original")
    ref = dict(vocab=write_vocab(tmp / "vocab.txt", list(dict.fromkeys(TINY_VOCAB))))
    ref["exact_files"] = [write_corpus(tmp / "a.txt", 40, 1), write_corpus(tmp / "b.txt", 30, 2)]
    ref["wwm_files"] = [write_corpus(tmp / "w.txt", 40, 3, words=WORDS)]
    runs = [(ref["exact_files"], ref["vocab"], _exact_config(*case), 7) for case in EXACT_CASES]
    runs.append((ref["wwm_files"], ref["vocab"], WWM_CONFIG, 11))
    results = original_instances(runs)
    ref["exact"] = results[:len(EXACT_CASES)]
    ref["wwm"], = results[len(EXACT_CASES):]
    return ref


def as_rows(instances):
    return [[i.input_ids, i.segment_ids, i.masked_lm_positions, i.masked_lm_ids,
             int(i.is_random_next)] for i in instances]


def ours_single_pool(files, vocab, config, seed, fast=False):
    """Our instances from one pool; `fast`: masking vectorised with numpy (the default of
    the pipeline), else drawn exactly as the original."""
    tokenize_ids, masking_vocab = load_tokenizer(vocab, True)
    documents = read_documents([ByteRange(f, 0, os.path.getsize(f)) for f in files],
                               tokenize_ids)
    return per_instance.create_training_instances(
        documents, config, masking_vocab, random.Random(seed),
        masking_rng=np.random.default_rng(seed) if fast else None)


# ---------------------------------------------------------------------------------------
# Fidelity to the original.


@pytest.mark.parametrize("case", range(len(EXACT_CASES)))
def test_same_instances_as_the_original(reference, case):
    """One pool of documents and the same seed: instance for instance, draw for draw."""
    expected = reference["exact"][case]
    assert len(expected) > 100
    config = _exact_config(*EXACT_CASES[case])
    assert as_rows(ours_single_pool(reference["exact_files"], reference["vocab"], config,
                                    7)) == expected


def test_whole_word_mask_without_wordpieces_draws_like_the_original(reference):
    """No `##` pieces: whole-word masking must consume the generator exactly as
    per-token masking does (same shuffle of the same number of candidates)."""
    ours = ours_single_pool(reference["wwm_files"], reference["vocab"], WWM_CONFIG, 11)
    assert as_rows(ours) == reference["wwm"]


def _unmasked_rows(instances):
    """[ids before masking, segment_ids, is_random_next] of each instance."""
    rows = []
    for instance in instances:
        ids = list(instance.input_ids)
        for p, label in zip(instance.masked_lm_positions, instance.masked_lm_ids):
            ids[p] = label
        rows.append([ids, instance.segment_ids, int(instance.is_random_next)])
    return rows


def _prose_documents(prose):
    tokenize_ids, masking_vocab = load_tokenizer(prose["vocab"], True)
    path = prose["corpus"]
    return read_documents([ByteRange(path, 0, os.path.getsize(path))],
                          tokenize_ids), masking_vocab


def test_default_mode_builds_the_originals_instances(prose):
    """Issue 12: how the default mode (numpy masking) builds instances, pair for pair, on
    real prose. The original's own create_training_instances with its masking function
    replaced by a no-op draws only what builds instances (document shuffle, target
    lengths, A/B splits, random next documents and their starts, the put-back of unused
    segments, truncation, the final shuffle); ours must draw exactly those from `rng`, in
    the same order, and so build the same pairs in the same order, in the default mode
    and for --dynamic_masking. (Masking draws come from a separate generator, so the same
    seed gives other pairs than the original's masked run, with the same statistics:
    test_default_mode_statistics_match_the_original.)"""
    expected = [[r[0], r[1], r[4]] for r in prose["original_unmasked_rows"]]
    assert len(expected) > 5000 and all(not r[2] for r in prose["original_unmasked_rows"])
    for dynamic_masking in (False, True):
        documents, masking_vocab = _prose_documents(prose)
        compact = unit_instances(documents, reference_runs.CONFIG, masking_vocab,
                                 seed=reference_runs.SEED, index=0,
                                 dynamic_masking=dynamic_masking)
        instances = per_instance.to_instances(compact, masking_vocab)
        assert all(i.masked_lm_positions for i in instances) != dynamic_masking
        assert _unmasked_rows(instances) == expected


def test_exact_draws_reproduce_the_original_on_prose(prose):
    documents, masking_vocab = _prose_documents(prose)
    compact = unit_instances(documents, reference_runs.CONFIG, masking_vocab,
                             seed=reference_runs.SEED, index=0, exact_draws=True)
    assert as_rows(per_instance.to_instances(compact, masking_vocab)) == prose["original_rows"]


def test_default_mode_statistics_match_the_original(prose):
    """The default mode's records against the original's own output on the same corpus,
    flags and seed: every statistic within 4 standard errors of a difference (sampling
    errors from the pass-to-pass variance within documents: pretraining_reference)."""
    config = reference_runs.CONFIG
    documents, masking_vocab = _prose_documents(prose)
    stats = Stats()
    compact = unit_instances(documents, config, masking_vocab, seed=reference_runs.SEED,
                             index=0, stats=stats)
    table = reference_runs.InstanceTable.from_compact(compact, documents, config.dupe_factor,
                                                      masking_vocab.mask_id)
    ours = table.values(config.max_seq_length)
    assert ours["instances"] > 5000
    assert reference_runs.compare(ours, prose["original"], prose["se"]) == []
    # The shares themselves, within 4 binomial standard errors of the rule's 0.8/0.1/0.1.
    masked = table.masked.sum()
    for name, p in (("mask_share", 0.8), ("kept_share", 0.1), ("random_share", 0.1)):
        assert abs(ours[name] - p) < 4 * np.sqrt(p * (1 - p) / masked), name
    # The summary's counters are the records' (which show [MASK] or the token itself
    # also where a random replacement drew it).
    assert (stats.instances, stats.masked) == (len(table.tokens), masked)
    assert stats.masked_as_mask + stats.masked_kept + stats.masked_random == stats.masked
    assert 0 <= table.as_mask.sum() - stats.masked_as_mask <= stats.masked_random * 0.01
    assert 0 <= table.kept.sum() - stats.masked_kept <= stats.masked_random * 0.01


def _chunked(files, vocab, config, seed, chunk_bytes, fast=False):
    chunks, _ = plan_chunks(files, chunk_bytes)
    rows, stats = [], Stats()
    for index, ranges in enumerate(chunks):
        tokenize_ids, masking_vocab = load_tokenizer(vocab, True)
        documents = read_documents(ranges, tokenize_ids, stats)
        rows += as_rows(per_instance.create_training_instances(
            documents, config, masking_vocab, chunk_rng(seed, index), stats,
            chunk_masking_rng(seed, index) if fast else None))
    return rows, stats, len(chunks)


@pytest.mark.parametrize("fast", [True, False], ids=["vectorised_masking", "exact_draws"])
def test_chunked_statistics_match_the_original(prose, fast):
    """The streaming pipeline (many chunks, per-chunk generators, random next documents
    from the chunk) keeps the original's statistics, in both masking modes: each within 4
    standard errors of a difference from the original's on the same corpus."""
    config = reference_runs.CONFIG
    rows, stats, num_chunks = _chunked([prose["corpus"]], prose["vocab"], config, 3,
                                       chunk_bytes=12_000, fast=fast)
    assert num_chunks >= 12
    ours = reference_runs.InstanceTable.from_rows(rows, prose["mask_id"]).values(
        config.max_seq_length)
    assert ours["instances"] > 5000
    assert reference_runs.compare(ours, prose["original"], prose["se"]) == []
    # The summary counters agree with the records.
    assert stats.instances == len(rows)
    assert stats.masked == sum(len(r[2]) for r in rows)
    assert stats.masked_as_mask + stats.masked_kept + stats.masked_random == stats.masked


# ---------------------------------------------------------------------------------------
# Masking rules.


def _original_ids(instance):
    ids = list(instance.input_ids)
    for p, label in zip(instance.masked_lm_positions, instance.masked_lm_ids):
        ids[p] = label
    return ids


@pytest.mark.parametrize("fast", [True, False], ids=["vectorised_masking", "exact_draws"])
def test_special_tokens_are_never_masked(tmp_path, vocab_file, fast):
    files = [write_corpus(tmp_path / "a.txt", 60, 8)]
    vocab = tokenization.load_vocab(vocab_file)
    for wwm in (False, True):
        config = PretrainingConfig(max_seq_length=24, max_predictions_per_seq=6,
                                   masked_lm_prob=0.5, dupe_factor=3,
                                   do_whole_word_mask=wwm)
        instances = ours_single_pool(files, vocab_file, config, 1, fast=fast)
        assert len(instances) > 50
        for inst in instances:
            specials = {0, inst.num_tokens_a + 1, len(inst.input_ids) - 1}
            assert not specials & set(inst.masked_lm_positions)
            assert [inst.input_ids[p] for p in sorted(specials)] == [
                vocab["[CLS]"], vocab["[SEP]"], vocab["[SEP]"]]
            assert inst.masked_lm_positions == sorted(inst.masked_lm_positions)
            budget = min(6, max(1, int(round(len(inst.input_ids) * 0.5))))
            if wwm:  # a whole word that would overshoot the budget is skipped
                assert len(inst.masked_lm_positions) <= budget
            else:
                assert len(inst.masked_lm_positions) == budget


def _words(ids, num_tokens_a, continuation):
    """Groups of positions forming whole words; `##` after A's [SEP] joins A's last word."""
    groups = []
    for i in range(1, len(ids) - 1):
        if i == num_tokens_a + 1:
            continue
        if groups and continuation[ids[i]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def test_whole_word_masking_masks_whole_words_only(tmp_path, vocab_file):
    files = [write_corpus(tmp_path / "a.txt", 80, 9)]
    config = PretrainingConfig(max_seq_length=32, max_predictions_per_seq=5,
                               dupe_factor=3, do_whole_word_mask=True)
    _, masking_vocab = load_tokenizer(vocab_file, True)
    multi_piece_masked = 0
    stats = Stats()
    tokenize_ids, _ = load_tokenizer(vocab_file, True)
    documents = read_documents([ByteRange(files[0], 0, 10**9)], tokenize_ids)
    for inst in per_instance.create_training_instances(documents, config, masking_vocab,
                                                       random.Random(2), stats):
        masked = set(inst.masked_lm_positions)
        assert 1 <= len(masked) <= 5
        for group in _words(_original_ids(inst), inst.num_tokens_a,
                            masking_vocab.is_continuation):
            assert masked.issuperset(group) or not masked.intersection(group), group
            multi_piece_masked += len(group) > 1 and masked.issuperset(group)
    assert multi_piece_masked > 50
    assert 0.77 < stats.masked_as_mask / stats.masked < 0.83
    assert 0.08 < stats.masked_kept / stats.masked < 0.12


def test_wordpiece_opening_b_joins_the_last_word_of_a():
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "x": 5, "y": 6,
             "##z": 7}
    masking_vocab = MaskingVocab.from_vocab(vocab)
    config = PretrainingConfig(max_seq_length=8, max_predictions_per_seq=2,
                               masked_lm_prob=0.3, do_whole_word_mask=True)
    seen_pair = 0
    for seed in range(200):
        ids = [2, 5, 6, 3, 7, 5, 3]  # [CLS] x y [SEP] ##z x [SEP]
        positions, labels = create_masked_lm_predictions(
            ids, 2, config, masking_vocab, random.Random(seed))
        # round(7 * 0.3) = 2 predictions: either {y, ##z} together, or x and x.
        assert positions in ([2, 4], [1, 5]), positions
        seen_pair += positions == [2, 4]
    assert 0 < seen_pair < 200


def test_number_of_predictions_rounds_half_to_even():
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "x": 5}
    masking_vocab = MaskingVocab.from_vocab(vocab)
    config = PretrainingConfig(max_seq_length=200, max_predictions_per_seq=100)
    for length, expected in [(30, 4), (50, 8), (128, 19), (3 + 1, 1), (10, 2)]:
        ids = [2, 5, 3] + [5] * (length - 4) + [3]
        positions, _ = create_masked_lm_predictions(ids, 1, config, masking_vocab,
                                                    random.Random(0))
        assert len(positions) == expected, length


def test_random_replacements_come_from_the_whole_vocab():
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                         "[unused0]", "x"])}
    masking_vocab = MaskingVocab.from_vocab(vocab)
    config = PretrainingConfig(max_seq_length=64, max_predictions_per_seq=60,
                               masked_lm_prob=1.0)
    seen = set()
    for seed in range(30):
        ids = [2] + [6] * 30 + [3] + [6] * 29 + [3]
        create_masked_lm_predictions(ids, 30, config, masking_vocab, random.Random(seed))
        seen.update(ids)
    assert seen == set(range(7))


def test_shuffle_draws_like_random_shuffle():
    from data_prep.pretraining_data import draws

    assert draws.INLINE_OK  # the inlined shuffle is the one tested here, not the fallback
    for n in range(0, 300, 7):
        a, b = list(range(n)), list(range(n))
        r1, r2 = random.Random(n), random.Random(n)
        r1.shuffle(a)
        shuffle(b, r2)
        assert a == b and r1.random() == r2.random()


def test_truncation_windows_match_popping_tokens():
    rng = random.Random(0)
    for _ in range(300):
        len_a, len_b, limit = rng.randint(1, 40), rng.randint(1, 40), rng.randint(2, 30)
        seed = rng.random()
        a, b = list(range(len_a)), list(range(len_b))
        flip = random.Random(seed)
        while len(a) + len(b) > limit:  # the original's rule, on lists
            longer = a if len(a) > len(b) else b
            if flip.random() < 0.5:
                del longer[0]
            else:
                longer.pop()
        a0, a1, b0, b1 = per_instance.truncate_seq_pair(len_a, len_b, limit, random.Random(seed))
        assert (list(range(a0, a1)), list(range(b0, b1))) == (a, b)


# ---------------------------------------------------------------------------------------
# Reading and chunking.


def test_reading_documents_like_the_original(tmp_path, vocab_file):
    path = tmp_path / "c.txt"
    path.write_text("the cat sat\n\x07\nthe dog ran\n \t\nhe ran\n\n\n\xa0\nshe sat\r\n"
                    "\u3000\nred mat", encoding="utf-8")
    tokenize_ids, _ = load_tokenizer(vocab_file, True)
    vocab = tokenization.load_vocab(vocab_file)
    stats = Stats()
    docs = read_documents([ByteRange(str(path), 0, 10**9)], tokenize_ids, stats)
    ids = [[[vocab[t] for t in s.split()] for s in d]
           for d in (["the cat sat", "the dog ran"], ["he ran"], ["she sat"], ["red mat"])]
    assert docs == ids
    assert stats.empty_token_lines == 1 and stats.documents == 4 and stats.lines == 11


def test_invalid_utf8_names_file_line_and_offset(tmp_path, vocab_file):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"the cat\n\nthe dog\nhe \xff\xfe ran\n")
    tokenize_ids, _ = load_tokenizer(vocab_file, True)
    with pytest.raises(InputError, match=r"bad\.txt:4: invalid UTF-8 at byte offset 20"):
        read_documents([ByteRange(str(path), 0, 100)], tokenize_ids)


def test_chunks_cut_at_document_boundaries_and_cover_everything(tmp_path, vocab_file):
    files = [write_corpus(tmp_path / "a.txt", 120, 1), write_corpus(tmp_path / "b.txt", 3, 2),
             write_corpus(tmp_path / "c.txt", 80, 3)]
    chunks, warnings = plan_chunks(files, 5000)
    assert not warnings and len(chunks) > 5
    tokenize_ids, _ = load_tokenizer(vocab_file, True)
    whole = read_documents([ByteRange(f, 0, os.path.getsize(f)) for f in files],
                           tokenize_ids)
    pieces = [doc for ranges in chunks for doc in read_documents(ranges, tokenize_ids)]
    assert pieces == whole
    covered = {}
    for ranges in chunks:
        for r in ranges:
            assert covered.get(r.path, 0) == r.start
            covered[r.path] = r.end
    assert covered == {f: os.path.getsize(f) for f in files}


def test_a_file_without_blank_lines_is_split_into_pieces_with_a_warning(tmp_path):
    path = tmp_path / "one_doc.txt"
    path.write_text("the cat sat on the mat .\n" * 2000, encoding="utf-8")
    chunks, warnings = plan_chunks([str(path)], 10_000)
    assert len(chunks) >= 4 and len(warnings) == len(chunks) - 1
    assert "one_doc.txt:" in warnings[0] and "no blank line" in warnings[0]
    assert all(r.end - r.start < 2 * 10_000 + 100 for c in chunks for r in c)


def test_one_sentence_documents_always_get_a_random_next(tmp_path, vocab_file):
    path = tmp_path / "c.txt"
    path.write_text("\n\n".join(f"the cat sat {'on the mat ' * (i % 5)}." for i in range(50)),
                    encoding="utf-8")
    config = PretrainingConfig(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2)
    instances = ours_single_pool([str(path)], vocab_file, config, 4)
    assert len(instances) == 100 and all(i.is_random_next for i in instances)


def test_a_multi_megabyte_line_is_linear(tmp_path, vocab_file):
    path = tmp_path / "long.txt"
    path.write_text("he sat .\n" + "the cat sat on the mat . " * 60_000 + "\nshe ran .\n\n"
                    "the dog ran far away .\n", encoding="utf-8")
    assert path.stat().st_size > 1_400_000
    config = PretrainingConfig(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2)
    start = time.process_time()
    instances = ours_single_pool([str(path)], vocab_file, config, 0)
    assert time.process_time() - start < 30
    assert instances and all(len(i.input_ids) <= 32 for i in instances)


def test_chunk_zero_uses_the_seed_and_chunks_are_reproducible(tmp_path, vocab_file):
    assert chunk_rng(5, 0).random() == random.Random(5).random()
    assert chunk_rng(5, 1).random() != chunk_rng(5, 2).random()
    path = write_corpus(tmp_path / "a.txt", 30, 1)
    task = ChunkTask(3, (ByteRange(path, 0, os.path.getsize(path)),), vocab_file, True,
                     PretrainingConfig(max_seq_length=32, max_predictions_per_seq=4,
                                          dupe_factor=2), 9)
    first, second = process_chunk(task), process_chunk(task)
    assert first.data and first.lengths and sum(first.lengths) == len(first.data)
    assert first.data == second.data and first.stats == second.stats
    assert len(first.records()) == first.stats.instances


@pytest.mark.parametrize("kwargs,flag", [
    (dict(max_seq_length=4), "--max_seq_length=4 is too small: it must be at least 5"),
    (dict(max_seq_length=16, max_predictions_per_seq=17), "--max_predictions_per_seq=17"),
    (dict(max_predictions_per_seq=0), "--max_predictions_per_seq=0"),
    (dict(masked_lm_prob=0.0), "--masked_lm_prob"),
    (dict(short_seq_prob=1.5), "--short_seq_prob"),
    (dict(dupe_factor=0), "--dupe_factor"),
])
def test_invalid_settings_name_the_flag(kwargs, flag):
    with pytest.raises(FlagError, match=flag.replace("(", r"\(")):
        PretrainingConfig(**kwargs).validate()
    PretrainingConfig(max_seq_length=5, max_predictions_per_seq=2).validate()


def test_fast_serialisation_equals_the_schema_encoder(reference):
    from data_prep import features

    config = _exact_config(*EXACT_CASES[0])
    encoder = features.PRETRAINING.encoder(max_seq_length=config.max_seq_length,
                                           max_predictions_per_seq=config.max_predictions_per_seq)
    instances = ours_single_pool(reference["exact_files"], reference["vocab"], config, 1)
    assert any(i.is_random_next for i in instances) and not all(i.is_random_next
                                                                 for i in instances)
    serialize = per_instance.InstanceSerializer(encoder)
    for instance in instances:
        assert serialize(instance) == encoder.encode(instance.to_features())


def _check_compact_serialisation(compact, config, masking_vocab):
    from data_prep import features

    encoder = features.PRETRAINING.encoder(max_seq_length=config.max_seq_length,
                                           max_predictions_per_seq=config.max_predictions_per_seq)
    serialize = per_instance.InstanceSerializer(encoder)
    expected = [serialize(i) for i in per_instance.to_instances(compact, masking_vocab)]
    data, lengths = CompactSerializer(encoder, masking_vocab)(compact)
    assert lengths.tolist() == [len(r) for r in expected]
    assert data.tobytes() == b"".join(expected)
    # And the schema's general encoder agrees with the fast per-instance path.
    for instance, record in zip(per_instance.to_instances(compact, masking_vocab)[:50], expected):
        assert encoder.encode(instance.to_features()) == record


@pytest.mark.parametrize("fast", [True, False], ids=["vectorised_masking", "exact_draws"])
def test_vectorised_serialisation_equals_the_per_instance_one(reference, fast):
    """CompactSerializer (the pipeline's writer) gives the same bytes as serialising each
    instance, for both masking modes, whole-word masking and sequences over 128 (two-byte
    position varints)."""
    tokenize_ids, masking_vocab = load_tokenizer(reference["vocab"], True)
    for config in (_exact_config(*EXACT_CASES[0]), WWM_CONFIG,
                   PretrainingConfig(max_seq_length=300, max_predictions_per_seq=45,
                                     dupe_factor=1)):
        documents = read_documents(
            [ByteRange(f, 0, os.path.getsize(f)) for f in reference["exact_files"]],
            tokenize_ids)
        compact = create_compact_instances(
            documents, config, masking_vocab, random.Random(4), None,
            np.random.default_rng(4) if fast else None)
        assert len(compact) > 50
        _check_compact_serialisation(compact, config, masking_vocab)


def test_vectorised_varints_equal_the_encoder_s_for_every_width():
    """`_varints` (the serialiser's varints of a whole matrix, with a one-byte and a
    two-byte fast path) gives, read in row order, exactly `features.encode_varint`'s bytes,
    for values of every width from 1 to 10 bytes and matrices of each widest width."""
    from data_prep import features

    rng = np.random.default_rng(7)
    for bits in (1, 7, 8, 14, 15, 21, 28, 35, 63, 64):
        values = rng.integers(0, 2**min(bits, 63), (37, 11), dtype=np.uint64)
        values[0, 0] = 2**bits - 1  # the widest value of this width
        values[1, :3] = (0, 127, 128)
        payload, used, nbytes = _varints(values, np)
        expected = [features.encode_varint(int(v)) for v in values.ravel()]
        assert payload[used].tobytes() == b"".join(expected), bits
        assert nbytes.ravel().tolist() == [len(e) for e in expected], bits
        assert payload.shape[-1] == max(len(e) for e in expected), bits


def test_vectorised_serialisation_of_large_ids():
    """Ids needing 3- and 4-byte varints (vocabularies beyond 16k and 2M entries)."""
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 2**21 + 7,
             "big": 2**22 + 1, "x": 127, "y": 128, "z": 16384}
    masking_vocab = MaskingVocab.from_vocab(vocab)
    rng = random.Random(0)
    documents = [[[rng.choice(list(vocab.values())) for _ in range(rng.randint(1, 9))]
                  for _ in range(rng.randint(1, 6))] for _ in range(30)]
    config = PretrainingConfig(max_seq_length=20, max_predictions_per_seq=4,
                               dupe_factor=2, masked_lm_prob=0.3)
    for masking_rng in (None, np.random.default_rng(1)):
        compact = create_compact_instances([list(d) for d in documents], config,
                                           masking_vocab, random.Random(1), None,
                                           masking_rng)
        _check_compact_serialisation(compact, config, masking_vocab)


def test_vectorised_masking_rules():
    """Vectorised masking: the original's count per instance, never [CLS]/[SEP], sorted
    distinct positions, labels are the original tokens, replacements drawn from the
    whole vocabulary, kept tokens unchanged, 80/10/10 within two points."""
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                         "[unused0]", "x", "y"])}
    masking_vocab = MaskingVocab.from_vocab(vocab)
    rng = random.Random(3)
    documents = [[[rng.choice([6, 7]) for _ in range(rng.randint(1, 12))]
                  for _ in range(rng.randint(1, 8))] for _ in range(300)]
    for prob, max_pred in ((0.15, 20), (1.0, 64)):
        config = PretrainingConfig(max_seq_length=64, max_predictions_per_seq=max_pred,
                                   masked_lm_prob=prob, dupe_factor=2)
        stats = Stats()
        instances = per_instance.create_training_instances([list(d) for d in documents], config,
                                                           masking_vocab, random.Random(5), stats,
                                                           np.random.default_rng(5))
        assert len(instances) > 500
        replaced_with = set()
        for inst in instances:
            n = len(inst.input_ids)
            specials = {0, inst.num_tokens_a + 1, n - 1}
            positions = inst.masked_lm_positions
            assert positions == sorted(set(positions)) and not specials & set(positions)
            assert len(positions) == min(max_pred, max(1, int(round(n * prob))), n - 3)
            assert all(label in (6, 7) for label in inst.masked_lm_ids)
            for p, label in zip(positions, inst.masked_lm_ids):
                if inst.input_ids[p] not in (4, label):
                    replaced_with.add(inst.input_ids[p])
            assert [inst.input_ids[p] for p in sorted(specials)] == [2, 3, 3]
        assert stats.instances == len(instances)
        assert stats.masked == sum(len(i.masked_lm_positions) for i in instances)
        assert abs(stats.masked_as_mask / stats.masked - 0.8) < 0.02
        assert abs(stats.masked_kept / stats.masked - 0.1) < 0.02
        assert abs(stats.masked_random / stats.masked - 0.1) < 0.02
        if prob == 1.0:  # many replacements: every vocabulary entry shows up
            assert {0, 1, 2, 3, 5} <= replaced_with  # special and [unused] ones too


def test_inlined_loop_equals_the_per_document_functions(reference):
    """create_compact_instances (the inlined hot loop) against the readable per-document
    functions it inlines, on the same documents and seed."""
    tokenize_ids, masking_vocab = load_tokenizer(reference["vocab"], True)
    for config in (_exact_config(*EXACT_CASES[1]), WWM_CONFIG):
        def documents():
            return read_documents([ByteRange(f, 0, os.path.getsize(f))
                                   for f in reference["exact_files"]], tokenize_ids)

        rng, docs, expected = random.Random(9), documents(), []
        rng.shuffle(docs)
        for _ in range(config.dupe_factor):
            for index in range(len(docs)):
                expected += per_instance.create_instances_from_document(docs, index, config,
                                                                        masking_vocab, rng)
        rng.shuffle(expected)
        ours = per_instance.create_training_instances(documents(), config, masking_vocab,
                                                      random.Random(9))
        assert as_rows(ours) == as_rows(expected)
