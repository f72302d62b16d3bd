"""Pretraining-data fidelity fixtures: a real-prose corpus, Google's original run on it, and
statistics with their sampling errors.

Shared by test_pretraining_data.py, test_beam_pretraining_data.py and
test_dynamic_masking.py. Everything is computed once per test session (`build`, through
conftest's `prose` fixture: one folder the pytest-xdist workers share).

* The corpus is real English prose: the Python standard library's docstrings and comments,
  written by `data_prep.sample_corpus` (nothing downloaded); the vocab is learned from it
  (special tokens, every character alone and as a `##` piece, the most frequent words), so
  rarer words split into `##` pieces and whole-word masking has words to join.
* The original is Google's `bert.create_pretraining_data` (PyPI bert-tensorflow), run in a
  subprocess (its absl flags would collide with ours in this process).

Sampling error. Instances are not independent draws: all instances of one document in one
dupe pass share its target-length draw (`short_seq_prob`), and a long document makes many
of them; so a share's error is far larger than the binomial sqrt(p(1-p)/n) over instances.
What is independent is the passes: given the corpus, the dupe_factor passes over one
document are i.i.d. (each pass draws its own target length, splits, random next documents
and masks). For a ratio statistic R = sum(y) / sum(w) over instances (e.g. y = 1 if the
instance is shorter than max_seq_length, w = 1), linearise z = y - R w, sum z per
(document, pass) cell, and

    Var(R) ~= sum over documents d of K * s_d^2 / (sum w)^2,

with K = dupe_factor passes and s_d^2 the sample variance (ddof 1) of document d's K cell
sums (the variance of a total of K i.i.d. passes is K times one pass's). For the number of
instances, the cells count instances and Var(N) = sum_d K * s_d^2. One run's estimate is
noisy (a few long documents dominate it), so the variances of SE_RUNS runs with other
seeds are averaged. Checked against the spread of the statistics over 150 seeds on this
corpus: the root-mean-square estimate was 3-11% below the observed standard deviation
(instances 138 vs 155, short share 0.0089 vs 0.0095, random next 0.0053 vs 0.0056,
[MASK] share 0.00121 vs 0.00121).

Two runs of the same algorithm on the same corpus (ours and the original's) are
independent, each with that variance, so a difference of the two has standard error
sqrt(2) * SE, and the tests allow 4 of them (a false alarm about once in 16,000 per
statistic). SE is estimated from our run, whose instances we can attribute to documents
and passes; under the hypothesis being tested (same algorithm) it is the original's too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from data_prep import build_vocab, sample_corpus, tokenization  # noqa: E402
from data_prep.pretraining_data.chunks import load_tokenizer  # noqa: E402
from data_prep.pretraining_data.config import PretrainingConfig  # noqa: E402
from data_prep.pretraining_data.documents import ByteRange, read_documents  # noqa: E402
from data_prep.pretraining_data.instances import CompactInstances, unit_instances  # noqa: E402

# Tolerance, in standard errors of a difference (see the module docstring).
Z = 4.0
CORPUS_MB = 0.2
VOCAB_WORDS = 2500
SEED = 12345
SE_RUNS = 4  # our runs whose variance estimates are averaged
MASKING_REPEATS = 2  # the original masks its unmasked instances this many times
# The configuration of the reference runs: the original's defaults but shorter sequences
# (more instances per MB, so a few thousand instances come from a small corpus).
CONFIG = PretrainingConfig(max_seq_length=64, max_predictions_per_seq=10,
                           masked_lm_prob=0.15, short_seq_prob=0.1, dupe_factor=6)
WWM_CONFIG = dataclasses.replace(CONFIG, do_whole_word_mask=True)


def write_prose_corpus(directory: str, max_mb: float = CORPUS_MB) -> str:
    """sample_corpus text (one sentence per line, blank line between documents)."""
    summary = sample_corpus.write_corpus(directory, max_mb=max_mb, prefix="prose")
    return summary.files[0]


def write_learned_vocab(corpus: str, path: str, words: int = VOCAB_WORDS) -> str:
    """Specials, characters (alone and as ## pieces), then the most frequent words."""
    with open(corpus, encoding="utf-8") as f:
        counts = build_vocab.count_words(f.read().split("\n"), do_lower_case=True)
    vocab = build_vocab.special_tokens(num_unused=5, layout="compact")
    vocab += build_vocab.character_tokens(counts)
    seen = set(vocab)
    for word, _ in counts.most_common():
        if len(vocab) >= words:
            break
        if word not in seen:
            vocab.append(word)
            seen.add(word)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    return path


# ---------------------------------------------------------------------------------------
# Google's original, in a subprocess.

_ORIGINAL = r"""
import json, random, sys
from absl import flags
import bert.create_pretraining_data as cpd
import bert.tokenization as tok
flags.FLAGS.mark_as_parsed()
masking = cpd.create_masked_lm_predictions
results = []
for a in json.load(sys.stdin):
    t = tok.FullTokenizer(a["vocab"], True)
    if a["job"] == "instances":
        # no_masking: the original's own create_training_instances with its masking
        # function replaced by one that masks nothing and draws nothing, so every draw
        # left is one that builds instances.
        cpd.create_masked_lm_predictions = (
            (lambda tokens, *rest: (tokens, [], [])) if a["no_masking"] else masking)
        out = cpd.create_training_instances(
            a["files"], t, a["max_seq_length"], a["dupe_factor"], a["short_seq_prob"],
            a["masked_lm_prob"], a["max_predictions_per_seq"], random.Random(a["seed"]))
        results.append([[t.convert_tokens_to_ids(i.tokens), i.segment_ids,
                         list(i.masked_lm_positions),
                         t.convert_tokens_to_ids(i.masked_lm_labels), int(i.is_random_next)]
                        for i in out])
    else:  # "mask": the original's masking of unmasked id sequences (given, or the
        # input_ids of the previous job's instances)
        inv = {v: k for k, v in t.vocab.items()}
        vocab_words = list(t.vocab.keys())
        rng = random.Random(a["seed"])
        sequences = a["sequences"] if a["sequences"] is not None else [
            row[0] for row in results[-1]]
        rows = []
        for _ in range(a["repeats"]):
            for ids in sequences:
                tokens, positions, labels = masking(
                    [inv[i] for i in ids], a["masked_lm_prob"], a["max_predictions_per_seq"],
                    vocab_words, rng)
                rows.append([t.convert_tokens_to_ids(tokens), list(positions),
                             t.convert_tokens_to_ids(labels)])
        results.append(rows)
json.dump(results, sys.stdout)
"""


def run_original(jobs: list) -> list:
    """Runs the original on each job (see _ORIGINAL) in one subprocess; returns the rows."""
    done = subprocess.run([sys.executable, "-c", _ORIGINAL], input=json.dumps(jobs), cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if done.returncode != 0:
        raise RuntimeError(f"the original failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def instances_job(files, vocab, config, seed, no_masking=False) -> dict:
    assert not config.do_whole_word_mask, "bert-tensorflow 1.0.4 predates whole-word masking"
    return dict(job="instances", files=list(files), vocab=vocab, seed=seed,
                no_masking=no_masking,
                **{k: getattr(config, k) for k in (
                    "max_seq_length", "dupe_factor", "short_seq_prob", "masked_lm_prob",
                    "max_predictions_per_seq")})


def masking_job(sequences, vocab, config, seed, repeats=1) -> dict:
    """The original's masking of `sequences` (None: the previous job's instances), each
    masked `repeats` times with one generator."""
    assert not config.do_whole_word_mask, "bert-tensorflow 1.0.4 predates whole-word masking"
    return dict(job="mask", sequences=sequences, vocab=vocab, seed=seed, repeats=repeats,
                masked_lm_prob=config.masked_lm_prob,
                max_predictions_per_seq=config.max_predictions_per_seq)


# ---------------------------------------------------------------------------------------
# Statistics of instances, with sampling errors.

RATIOS = ("short", "mean_tokens", "random_next", "masked_fraction", "mask_share",
          "kept_share", "random_share")


@dataclasses.dataclass
class InstanceTable:
    """Per-instance quantities behind the statistics (numpy arrays of one length)."""

    tokens: np.ndarray  # real tokens, [CLS]/[SEP] included
    random_next: np.ndarray
    masked: np.ndarray  # masked positions
    as_mask: np.ndarray  # of them: replaced by [MASK]
    kept: np.ndarray  # kept as they were
    # (document, pass) of each instance where known (our runs), else None.
    cells: tuple | None = None

    @classmethod
    def from_rows(cls, rows, mask_id: int) -> "InstanceTable":
        """From [ids, segment_ids, positions, labels, is_random_next] rows (masked ids)."""
        return cls(
            tokens=np.array([len(r[0]) for r in rows]),
            random_next=np.array([r[4] for r in rows]),
            masked=np.array([len(r[2]) for r in rows]),
            as_mask=np.array([sum(r[0][p] == mask_id for p in r[2]) for r in rows]),
            kept=np.array([sum(r[0][p] == label for p, label in zip(r[2], r[3]))
                           for r in rows]))

    @classmethod
    def from_records(cls, parsed: dict, mask_id: int) -> "InstanceTable":
        """From parsed, padded features (numpy arrays [n, ...], as `read_records` gives)."""
        tokens = parsed["input_mask"].sum(axis=1)
        if "masked_lm_weights" not in parsed:
            zeros = np.zeros(len(tokens), np.int64)
            return cls(tokens, parsed["next_sentence_labels"][:, 0], zeros, zeros, zeros)
        weights = parsed["masked_lm_weights"] > 0
        at = np.take_along_axis(parsed["input_ids"], parsed["masked_lm_positions"], axis=1)
        return cls(tokens=tokens, random_next=parsed["next_sentence_labels"][:, 0],
                   masked=weights.sum(axis=1), as_mask=((at == mask_id) & weights).sum(axis=1),
                   kept=((at == parsed["masked_lm_ids"]) & weights).sum(axis=1))

    @classmethod
    def from_compact(cls, compact: "CompactInstances", documents: list,
                     dupe_factor: int, mask_id: int) -> "InstanceTable":
        """Our instances in creation order, with each one's (document, pass).

        `documents` must be the list `create_compact_instances` shuffled in place: its
        token layout is `compact.tokens`, so the document of an instance is the one whose
        tokens hold A's first token; passes restart at document 0.
        """
        bounds = np.cumsum([sum(map(len, d)) for d in documents])
        document = np.searchsorted(bounds, np.asarray(compact.a_start), side="right")
        passes = np.concatenate([[0], np.cumsum(np.diff(document) < 0)])
        assert passes[-1] == dupe_factor - 1 or len(documents) == 1
        tokens = np.asarray(compact.a_len) + np.asarray(compact.b_len) + 3
        k = np.asarray(compact.num_masked, dtype=np.int64)
        if len(k) == 0:  # unmasked (dynamic masking)
            k = np.zeros(len(tokens), np.int64)
        # As in the records (from_rows, from_records): a position shows [MASK], or its
        # own token (kept; a random replacement may draw it too), or another token.
        owner = np.repeat(np.arange(len(tokens)), k)
        values = np.asarray(compact.values, dtype=np.int64)
        position = np.asarray(compact.positions, dtype=np.int64)
        a_start, a_len = np.asarray(compact.a_start), np.asarray(compact.a_len)
        b_start = np.asarray(compact.b_start)
        flat = np.where(position <= a_len[owner], a_start[owner] + position - 1,
                        b_start[owner] + position - a_len[owner] - 2)
        label = np.asarray(compact.tokens, dtype=np.int64)[flat] if len(flat) else flat
        shown = np.where(values == -1, label, values)
        as_mask = np.bincount(owner, weights=shown == mask_id, minlength=len(tokens))
        kept = np.bincount(owner, weights=shown == label, minlength=len(tokens))
        return cls(tokens, np.asarray(compact.random_next, dtype=np.int64), k, as_mask, kept,
                   cells=(document, passes, len(documents), dupe_factor))

    def _yw(self, name):
        ones = np.ones(len(self.tokens))
        return {
            "short": (None, ones),  # filled by values(): needs max_seq_length
            "mean_tokens": (self.tokens, ones),
            "random_next": (self.random_next, ones),
            "masked_fraction": (self.masked, self.tokens),
            "mask_share": (self.as_mask, self.masked),
            "kept_share": (self.kept, self.masked),
            "random_share": (self.masked - self.as_mask - self.kept, self.masked),
        }[name]

    def yw(self, name, max_seq_length):
        y, w = self._yw(name)
        if name == "short":
            y = (self.tokens < max_seq_length).astype(float)
        return np.asarray(y, float), np.asarray(w, float)

    def values(self, max_seq_length: int) -> dict:
        out = {"instances": len(self.tokens)}
        for name in RATIOS:
            y, w = self.yw(name, max_seq_length)
            out[name] = y.sum() / w.sum() if w.sum() else float("nan")
        return out

    def standard_errors(self, max_seq_length: int) -> dict:
        """The within-document estimate of the module docstring, per statistic."""
        document, passes, num_docs, k = self.cells
        assert k >= 2, "the estimate needs at least two dupe passes"

        def total_variance(z):
            cell = np.zeros((num_docs, k))
            np.add.at(cell, (document, passes), z)
            return float((k * cell.var(axis=1, ddof=1)).sum())

        out = {"instances": math.sqrt(total_variance(np.ones(len(self.tokens))))}
        for name in RATIOS:
            y, w = self.yw(name, max_seq_length)
            ratio = y.sum() / w.sum()
            out[name] = math.sqrt(total_variance(y - ratio * w)) / w.sum()
        return out


def compare(ours: dict, theirs: dict, se: dict, names=None, z: float = Z) -> list:
    """Statistics whose difference exceeds z standard errors of a difference of two
    independent runs (sqrt(2) * se); each as a readable line. Empty: all agree."""
    bad = []
    for name in names or ("instances",) + RATIOS:
        diff = ours[name] - theirs[name]
        limit = z * math.sqrt(2) * se[name]
        if not abs(diff) <= limit:
            bad.append(f"{name}: ours {ours[name]:.6g} vs the original's {theirs[name]:.6g}"
                       f" (difference {diff:.3g}, allowed {limit:.3g} = {z} x sqrt(2) x SE"
                       f" {se[name]:.3g})")
    return bad


# ---------------------------------------------------------------------------------------
# The session's reference: built once, shared by the test modules.


def our_table(files, vocab, config, seed, *, exact_draws=False, dynamic_masking=False):
    """Our single-pool run (the local pipeline's code path for one chunk) as an
    InstanceTable with cells, plus the CompactInstances."""
    tokenize_ids, masking_vocab = load_tokenizer(vocab, True)
    documents = read_documents([ByteRange(f, 0, os.path.getsize(f)) for f in files],
                               tokenize_ids)
    compact = unit_instances(documents, config, masking_vocab, seed=seed, index=0,
                             exact_draws=exact_draws, dynamic_masking=dynamic_masking)
    table = InstanceTable.from_compact(compact, documents, config.dupe_factor,
                                       masking_vocab.mask_id)
    return table, compact


def build(directory) -> None:
    """Writes the corpus, vocab and `reference.json` into `directory`: the original's output
    (masked; with its masking function replaced by a no-op; and those unmasked pairs masked
    MASKING_REPEATS times by its masking function), its statistics and the standard errors
    of our single-pool runs (read by `load`; built once per test session: conftest's
    `prose`). (bert-tensorflow 1.0.4 predates whole-word masking: whole-word masking is
    checked against our port of it, `pd.create_masked_lm_predictions`, in the tests.)"""
    directory = str(directory)
    corpus = write_prose_corpus(directory)
    vocab = write_learned_vocab(corpus, os.path.join(directory, "vocab.txt"))
    original, unmasked, remasked = run_original([
        instances_job([corpus], vocab, CONFIG, SEED),
        instances_job([corpus], vocab, CONFIG, SEED, no_masking=True),
        masking_job(None, vocab, CONFIG, SEED, repeats=MASKING_REPEATS)])
    mask_id = tokenization.load_vocab(vocab)["[MASK]"]
    variances = []
    for run in range(SE_RUNS):
        table, _ = our_table([corpus], vocab, CONFIG, SEED + 1 + run)
        variances.append({k: v ** 2 for k, v in
                          table.standard_errors(CONFIG.max_seq_length).items()})
    ref = dict(corpus=os.path.basename(corpus), vocab="vocab.txt", mask_id=mask_id,
               original_rows=original, original_unmasked_rows=unmasked,
               original_remasked_rows=remasked,
               original={k: float(v) for k, v in InstanceTable.from_rows(
                   original, mask_id).values(CONFIG.max_seq_length).items()},
               se={k: math.sqrt(sum(v[k] for v in variances) / SE_RUNS)
                   for k in variances[0]})
    with open(os.path.join(directory, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(ref, f)


def load(directory) -> dict:
    """The reference `build` wrote into `directory` (corpus and vocab as full paths)."""
    directory = str(directory)
    with open(os.path.join(directory, "reference.json"), encoding="utf-8") as f:
        ref = json.load(f)
    return dict(ref, corpus=os.path.join(directory, ref["corpus"]),
                vocab=os.path.join(directory, ref["vocab"]))


def read_records(paths, schema=None, compression=""):
    """Parsed records of TFRecord files as numpy arrays [n, length] per feature."""
    import tensorflow as tf

    from data_prep import features

    raw = [r.numpy() for r in tf.data.TFRecordDataset(paths, compression_type=compression)]
    first = tf.train.Example.FromString(raw[0])
    if schema is None:
        schema = features.PRETRAINING if "masked_lm_ids" in first.features.feature \
            else features.PRETRAINING_UNMASKED
    sizes = dict(max_seq_length=len(first.features.feature["input_ids"].int64_list.value))
    if "masked_lm_ids" in first.features.feature:
        sizes["max_predictions_per_seq"] = len(
            first.features.feature["masked_lm_ids"].int64_list.value)
    parsed = tf.io.parse_example(tf.constant(raw), schema.parse_spec(**sizes))
    return {k: v.numpy() for k, v in parsed.items()}, raw

