"""The BERT paper's studies in pretraining data (issue 26): no next-sentence task (Table 5's
"No NSP" and "LTR & No NSP") and the [MASK] / random / kept split (Table 8), in the
library both drivers run (data_prep/pretraining_data). The drivers and their CLIs:
test_beam_pretraining_data.py and test_create_pretraining_data_cli.py."""

import dataclasses
import math
import random

import numpy as np
import pytest

import reference_instances as per_instance
from data_prep import features
from data_prep.cli import FlagError
from data_prep.pretraining_data.config import PretrainingConfig
from data_prep.pretraining_data.instances import create_compact_instances, unit_instances
from data_prep.pretraining_data.masking import (
    MaskingVocab,
    one_draw_thresholds,
    two_draw_thresholds,
)
from data_prep.pretraining_data.records import CompactSerializer, record_encoder
from data_prep.pretraining_data.stats import Stats

# The six rows of Table 8 (BERT paper, Appendix C.2): MASK / SAME / RND in percent, as
# the flags --mask_token_rate (MASK) and --random_token_rate (RND); SAME is the rest.
TABLE_8 = [(80, 10, 10), (100, 0, 0), (80, 0, 20), (80, 20, 0), (0, 20, 80), (0, 0, 100)]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CLS, SEP, MASK = 2, 3, 4


def rates(row):
    """(mask_token_rate, random_token_rate) of a Table 8 row, as the CLI would take them."""
    mask, _, rnd = row
    return float(f"{mask / 100:g}"), float(f"{rnd / 100:g}")


def numbered_corpus(num_docs=300, seed=0):
    """Documents whose tokens are consecutive ids, unique across the corpus (so an
    instance's text shows where it came from), with the vocab holding every id, and the
    (document, first id, last id) of every sentence."""
    rng = random.Random(seed)
    documents, sentences, next_id = [], [], len(SPECIALS)
    for d in range(num_docs):
        document = []
        for _ in range(rng.choice([1, 1, 2, 3, 5, 8])):
            length = rng.randint(1, 14)
            document.append(list(range(next_id, next_id + length)))
            sentences.append((d, next_id, next_id + length - 1))
            next_id += length
        documents.append(document)
    vocab = {token: i for i, token in enumerate(SPECIALS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIALS), next_id)})
    return documents, MaskingVocab.from_vocab(vocab), sentences


def copy(documents):
    return [list(d) for d in documents]  # create_compact_instances shuffles in place


NO_NSP = PretrainingConfig(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=3,
                           short_seq_prob=0.2, next_sentence_prediction=False)


# ---------------------------------------------------------------------------------------
# The rates and their checks.


def test_default_rates_are_the_originals_constants():
    """The default split gives exactly the original's thresholds (0.8 then 0.5 for its two
    draws; 0.8 and 0.9 for one draw), so the default draws and records are unchanged;
    every Table 8 row gives its probabilities."""
    config = PretrainingConfig()
    assert (config.mask_token_rate, config.random_token_rate) == (0.8, 0.1)
    assert config.next_sentence_prediction is True
    assert two_draw_thresholds(0.8, 0.1) == (0.8, 0.5)
    assert one_draw_thresholds(0.8, 0.1) == (0.8, 0.9)
    for row in TABLE_8:
        m, r = rates(row)
        t1, t2 = two_draw_thresholds(m, r)
        c1, c2 = one_draw_thresholds(m, r)
        keep = row[1] / 100
        assert math.isclose(t1, m) and math.isclose((1 - t1) * t2, keep, abs_tol=1e-12)
        assert math.isclose(c1, m) and math.isclose(c2 - c1, keep, abs_tol=1e-12), row
        assert 0 <= t2 <= 1 and c1 <= c2 <= 1


@pytest.mark.parametrize("kwargs,message", [
    (dict(mask_token_rate=-0.1), "--mask_token_rate=-0.1 must be a number in [0, 1]"),
    (dict(mask_token_rate=1.5), "--mask_token_rate=1.5 must be a number in [0, 1]"),
    (dict(random_token_rate=-1.0), "--random_token_rate=-1.0 must be"),
    (dict(random_token_rate=1.01), "--random_token_rate=1.01 must be"),
    (dict(mask_token_rate=float("nan")), "--mask_token_rate=nan must be"),
    (dict(random_token_rate=float("inf")), "--random_token_rate=inf must be"),
    (dict(mask_token_rate=0.9, random_token_rate=0.2),
     "--mask_token_rate=0.9 plus --random_token_rate=0.2 is more than 1"),
    (dict(mask_token_rate=0.5, random_token_rate=0.5000001), "is more than 1"),
])
def test_bad_rates_are_refused_naming_the_flag(kwargs, message):
    with pytest.raises(FlagError) as err:
        PretrainingConfig(**kwargs).validate()
    assert message in str(err.value)


def test_rates_that_add_up_to_one_as_decimals_are_accepted():
    """0.7 + 0.3 (0.9999999999999999... or 1.0000000000000002 in binary floats) is 1."""
    for m, r in [(0.7, 0.3), (0.1, 0.9), (0.8, 0.2), (0.0, 1.0), (1.0, 0.0), (0.6, 0.4)]:
        PretrainingConfig(mask_token_rate=m, random_token_rate=r).validate()
        assert one_draw_thresholds(m, r)[1] == one_draw_thresholds(m, r)[0]  # none kept


# ---------------------------------------------------------------------------------------
# Table 8: the split of the masked positions.

MODES = {
    "vectorised": dict(masking_rng=True),  # the default of both drivers
    "exact_draws": dict(masking_rng=False),
    "whole_word": dict(masking_rng=False, do_whole_word_mask=True),
}


def _masked_instances(documents, vocab, config, seed, masking_rng):
    stats = Stats()
    compact = create_compact_instances(copy(documents), config, vocab, random.Random(seed),
                                       stats,
                                       np.random.default_rng(seed) if masking_rng else None)
    return per_instance.to_instances(compact, vocab), stats, compact


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("row", TABLE_8, ids=["/".join(map(str, r)) for r in TABLE_8])
def test_table_8_rows_give_their_split(row, mode):
    """Each row of Table 8 as flags: among the masked positions of the records, the shares
    shown as [MASK], as their own token and as another token are the row's, within 5
    binomial standard errors (each position is an independent draw); a share of 0 or 1
    is exact. A random replacement is any vocabulary entry (as the original: [MASK] or
    the token itself too, each 1/V). The summary's counters count the draws."""
    settings = dict(MODES[mode])
    masking_rng = settings.pop("masking_rng")
    documents, vocab, _ = numbered_corpus()
    size = len(vocab.replacement_ids)
    m, r = rates(row)
    config = PretrainingConfig(max_seq_length=64, max_predictions_per_seq=32,
                               masked_lm_prob=0.5, dupe_factor=4, mask_token_rate=m,
                               random_token_rate=r, **settings)
    instances, stats, _ = _masked_instances(documents, vocab, config, 1, masking_rng)
    shown = {"mask": 0, "same": 0, "other": 0}
    for inst in instances:
        for p, label in zip(inst.masked_lm_positions, inst.masked_lm_ids):
            token = inst.input_ids[p]
            shown["mask" if token == MASK else "same" if token == label else "other"] += 1
    total = sum(shown.values())
    assert total == stats.masked > 20_000
    keep = row[1] / 100
    expected = {"mask": m + r / size, "same": keep + r / size, "other": r * (1 - 2 / size)}
    for name, p in expected.items():
        if p == 0:
            assert shown[name] == 0, (name, shown)
        else:
            se = math.sqrt(p * (1 - p) / total)
            assert abs(shown[name] / total - p) <= 5 * se + 1e-12, (name, shown, p)
    for count, p in ((stats.masked_as_mask, m), (stats.masked_kept, keep),
                     (stats.masked_random, r)):
        if p in (0, 1):
            assert count == p * total
        else:
            assert abs(count / total - p) <= 5 * math.sqrt(p * (1 - p) / total)


def test_rates_change_what_is_shown_not_what_is_chosen():
    """Vectorised masking (the default): the rates change only the value shown at each
    chosen position; the pairs and the chosen positions are the same draws."""
    documents, vocab, _ = numbered_corpus(100)
    base = PretrainingConfig(max_seq_length=48, max_predictions_per_seq=8, dupe_factor=2)
    layouts = set()
    for row in TABLE_8:
        m, r = rates(row)
        config = dataclasses.replace(base, mask_token_rate=m, random_token_rate=r)
        _, _, compact = _masked_instances(documents, vocab, config, 5, True)
        layouts.add((tuple(compact.a_start), tuple(compact.b_start), tuple(compact.order),
                     tuple(compact.positions.tolist())))
    assert len(layouts) == 1


# ---------------------------------------------------------------------------------------
# No next-sentence prediction.


def _document_of(sentences):
    starts = np.array([s[1] for s in sentences])
    documents = np.array([s[0] for s in sentences])
    return lambda token: int(documents[np.searchsorted(starts, token, side="right") - 1])


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
def test_no_nsp_instances_are_contiguous_text(masked):
    """--next_sentence_prediction=false: never a random next. An instance is `[CLS] A
    [SEP] B [SEP]` with B the text that follows A in the same document (segment ids 0
    then 1; a gap only where truncation trimmed A's end or B's start), or, for a
    one-sentence chunk, `[CLS] A [SEP]` with segment ids all 0; labels are all 0. The
    records, unmasked (--dynamic_masking, what a left-to-right LM trains on) or masked,
    hold exactly that."""
    documents, vocab, sentences = numbered_corpus()
    document_of = _document_of(sentences)
    starts = {s[1] for s in sentences}
    ends = {s[2] for s in sentences}
    stats = Stats()
    compact = unit_instances(copy(documents), NO_NSP, vocab, seed=3, index=0,
                             dynamic_masking=not masked, stats=stats)
    instances = per_instance.to_instances(compact, vocab)
    max_tokens = NO_NSP.max_seq_length - 3
    one = two = 0
    for inst in instances:
        ids = list(inst.input_ids)
        for p, label in zip(inst.masked_lm_positions, inst.masked_lm_ids):
            ids[p] = label
        assert not inst.is_random_next
        la = inst.num_tokens_a
        a = ids[1:la + 1]
        assert ids[0] == CLS and ids[la + 1] == SEP and ids[-1] == SEP
        assert a == list(range(a[0], a[0] + la))
        if masked:  # the original's count: real tokens, [CLS] and [SEP] included
            budget = min(NO_NSP.max_predictions_per_seq,
                         max(1, round(len(ids) * NO_NSP.masked_lm_prob)))
            assert len(inst.masked_lm_positions) == min(budget, len(ids) - 2 - (
                len(ids) > la + 2))
        if len(ids) == la + 2:  # one segment
            one += 1
            assert inst.segment_ids == [0] * len(ids)
            assert la == max_tokens or (a[0] in starts and a[-1] in ends)
            continue
        two += 1
        b = ids[la + 2:-1]
        assert b and b == list(range(b[0], b[0] + len(b)))
        assert inst.segment_ids == [0] * (la + 2) + [1] * (len(b) + 1)
        assert document_of(a[0]) == document_of(b[-1])
        assert b[0] > a[-1]
        if la + len(b) < max_tokens:  # not truncated: whole sentences, no gap
            assert b[0] == a[-1] + 1 and a[0] in starts and b[0] in starts
            assert b[-1] in ends
        if masked:
            assert 0 not in inst.masked_lm_positions and la + 1 not in inst.masked_lm_positions
            assert len(ids) - 1 not in inst.masked_lm_positions
    assert one > 100 and two > 300
    assert stats.random_next == 0 and stats.instances == len(instances)
    assert stats.tokens == sum(len(i.input_ids) for i in instances)


def test_one_sentence_documents_make_one_segment_instances():
    """Where NSP pairs every sentence alone with a random document, No NSP writes the
    sentence alone: `[CLS] A [SEP]`, and masks only A's tokens."""
    documents = [[[5 + i, 6 + i, 7 + i]] for i in range(0, 150, 3)]
    vocab = MaskingVocab.from_vocab({**{t: i for i, t in enumerate(SPECIALS)},
                                     **{f"w{i}": i for i in range(5, 160)}})
    for masking_rng in (None, np.random.default_rng(0)):
        compact = create_compact_instances(copy(documents), NO_NSP, vocab, random.Random(4),
                                           None, masking_rng)
        instances = per_instance.to_instances(compact, vocab)
        assert len(instances) == 150
        for inst in instances:
            assert len(inst.input_ids) == 5 and not inst.is_random_next
            assert inst.segment_ids == [0] * 5
            assert inst.masked_lm_positions and set(inst.masked_lm_positions) <= {1, 2, 3}


@pytest.mark.parametrize("config", [
    NO_NSP,
    dataclasses.replace(NO_NSP, do_whole_word_mask=True),
    dataclasses.replace(NO_NSP, mask_token_rate=0.0, random_token_rate=0.8),
    dataclasses.replace(NO_NSP, next_sentence_prediction=True, mask_token_rate=1.0,
                        random_token_rate=0.0),
], ids=["no_nsp", "no_nsp_whole_word", "no_nsp_0_20_80", "nsp_100_0_0"])
def test_inlined_loop_equals_the_per_document_reference(config):
    """The inlined hot loop against the readable per-document reference
    (tests/reference_instances.py), draw for draw, with the studies' settings."""
    documents, vocab, _ = numbered_corpus(120, seed=2)
    rng, docs, expected = random.Random(9), copy(documents), []
    rng.shuffle(docs)
    for _ in range(config.dupe_factor):
        for index in range(len(docs)):
            expected += per_instance.create_instances_from_document(docs, index, config,
                                                                    vocab, rng)
    rng.shuffle(expected)
    ours, _, _ = _masked_instances(documents, vocab, config, 9, False)
    rows = [[i.input_ids, i.segment_ids, i.masked_lm_positions, i.masked_lm_ids,
             i.is_random_next] for i in ours]
    assert rows == [[i.input_ids, i.segment_ids, i.masked_lm_positions, i.masked_lm_ids,
                     i.is_random_next] for i in expected]
    assert len(rows) > 200


@pytest.mark.parametrize("dynamic_masking", [False, True], ids=["masked", "unmasked"])
@pytest.mark.parametrize("vectorised", [False, True], ids=["exact_draws", "vectorised"])
def test_no_nsp_records_are_the_schema_s_bytes(dynamic_masking, vectorised):
    """One-segment instances serialised at once (CompactSerializer, what both drivers
    write) are exactly the schema encoder's bytes of their features, in either record
    kind: the same features as ever, next_sentence_labels 0."""
    documents, vocab, _ = numbered_corpus(120, seed=4)
    config = dataclasses.replace(NO_NSP, max_seq_length=40)
    compact = create_compact_instances(copy(documents), config, vocab, random.Random(1), None,
                                       np.random.default_rng(1) if vectorised else None,
                                       mask=not dynamic_masking)
    encoder = record_encoder(config, dynamic_masking)
    instances = per_instance.to_instances(compact, vocab)
    assert any(len(i.input_ids) == i.num_tokens_a + 2 for i in instances)
    expected = []
    for inst in instances:
        values = inst.to_features()
        if dynamic_masking:
            values = {k: v for k, v in values.items() if not k.startswith("masked_lm_")}
        expected.append(encoder.encode(values))
    data, lengths = CompactSerializer(encoder, vocab)(compact)
    assert lengths.tolist() == [len(r) for r in expected]
    assert data.tobytes() == b"".join(expected)
    assert encoder.schema is features.pretraining_schema(dynamic_masking)
