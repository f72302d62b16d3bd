"""The Apache Beam pipeline (data_prep/beam_pretraining_data.py) against Google's original:
the same records for a corpus within one pool, the original's statistics with pools,
determinism whatever the workers, random next sentences across files, and the CLI."""

import dataclasses
import glob
import json
import os
import subprocess
import sys

import apache_beam as beam  # requirements-beam.txt, part of requirements-dev.txt
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import pretraining_reference as reference_runs
from data_prep.pretraining_data.config import PretrainingConfig

from data_prep import beam_pretraining_data as bpd  # noqa: E402
from tests.clis import call_main  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The DirectRunner's in-process engine, named explicitly: nothing is downloaded.
IN_PROCESS = ["--runner=FnApiRunner"]


def run_beam(tmp_path, files, vocab, config, *, name="out.tfrecord", shards=2,
             pool_bytes=16 << 20, chunk_bytes=0, seed=reference_runs.SEED, **kwargs):
    outputs = [str(tmp_path / f"{name}-{i:05d}-of-{shards:05d}") for i in range(shards)]
    job = bpd.BeamJob(config=config, input_files=tuple(files), outputs=tuple(outputs),
                      summary_path=str(tmp_path / f"_{name}.summary.json"), vocab_file=vocab,
                      seed=seed, pool_bytes=pool_bytes, chunk_bytes=chunk_bytes, **kwargs)
    summary = bpd.run_job(job, PipelineOptions(IN_PROCESS))
    return outputs, summary


def record_rows(parsed):
    """[ids, segment_ids, positions, labels, is_random_next] of parsed padded records."""
    rows = []
    for i in range(len(parsed["input_ids"])):
        n = int(parsed["input_mask"][i].sum())
        k = int(parsed["masked_lm_weights"][i].sum())
        rows.append([parsed["input_ids"][i][:n].tolist(), parsed["segment_ids"][i][:n].tolist(),
                     parsed["masked_lm_positions"][i][:k].tolist(),
                     parsed["masked_lm_ids"][i][:k].tolist(),
                     int(parsed["next_sentence_labels"][i][0])])
    return rows


def test_one_pool_with_exact_draws_gives_the_originals_records(prose, tmp_path):
    """A corpus within one pool, --exact_draws: exactly the original's records (as a set:
    the order is the pipeline's hash order), every feature of every record."""
    outputs, summary = run_beam(tmp_path, [prose["corpus"]], prose["vocab"],
                                reference_runs.CONFIG, exact_draws=True)
    assert summary["num_pools"] == 1
    parsed, _ = reference_runs.read_records(outputs)
    assert sorted(record_rows(parsed)) == sorted(prose["original_rows"])


def test_pools_keep_the_originals_statistics(prose, tmp_path):
    """Several pools (random next documents from a hash-partitioned pool), numpy masking:
    every statistic within 4 standard errors of a difference from the original's on the
    same corpus (pretraining_reference). The summary counts what the files hold."""
    size = os.path.getsize(prose["corpus"])
    outputs, summary = run_beam(tmp_path, [prose["corpus"]], prose["vocab"],
                                reference_runs.CONFIG, shards=3, pool_bytes=size // 5,
                                chunk_bytes=size // 7)
    assert summary["num_pools"] >= 5 and summary["num_chunks"] >= 7
    parsed, raw = reference_runs.read_records(outputs)
    table = reference_runs.InstanceTable.from_records(parsed, prose["mask_id"])
    ours = table.values(reference_runs.CONFIG.max_seq_length)
    assert reference_runs.compare(ours, prose["original"], prose["se"]) == []
    assert summary["instances"] == len(raw) == ours["instances"]
    assert summary["tokens"] == int(table.tokens.sum())
    assert summary["random_next"] == int(table.random_next.sum())
    assert summary["masked"] == int(table.masked.sum())
    # Files hold hash ranges: about a third each.
    counts = [sum(1 for _ in reference_runs.read_records([f])[1]) for f in outputs]
    assert min(counts) > 0.25 * len(raw)


def test_dynamic_masking_writes_the_pairs_unmasked(prose, tmp_path):
    """--dynamic_masking: the unmasked record kind, one copy of the pairs by default
    (dupe_factor as the job gives it), with the original's pair statistics."""
    from data_prep import features

    config = reference_runs.CONFIG
    size = os.path.getsize(prose["corpus"])
    outputs, summary = run_beam(tmp_path, [prose["corpus"]], prose["vocab"], config,
                                pool_bytes=size // 3, dynamic_masking=True)
    parsed, raw = reference_runs.read_records(outputs)
    assert set(parsed) == set(features.PRETRAINING_UNMASKED.names)
    assert summary["dynamic_masking"] and summary["masked"] == 0
    table = reference_runs.InstanceTable.from_records(parsed, prose["mask_id"])
    ours = table.values(config.max_seq_length)
    # No [MASK] anywhere: the ids are the text's.
    assert not (parsed["input_ids"] == prose["mask_id"]).any()
    assert reference_runs.compare(ours, prose["original"], prose["se"],
                                  names=("instances", "short", "mean_tokens",
                                         "random_next")) == []


def run_local(tmp_path, files, vocab, config, *, name="local.tfrecord",
              seed=reference_runs.SEED, **kwargs):
    """The local pool's run (create_pretraining_data.generate, in this process)."""
    from data_prep import create_pretraining_data

    out = str(tmp_path / name)
    summary = create_pretraining_data.generate(
        config, list(files), [out], vocab_file=vocab, do_lower_case=True, seed=seed,
        num_workers=1, gzip=False, chunk_bytes=0, shuffle_buffer_size=1000,
        progress_seconds=1000, summary_path=str(tmp_path / f"_{name}.summary.json"),
        **kwargs)
    return [out], summary


# The BERT paper's studies (issue 26): Table 8's splits of the masked positions (MASK,
# SAME, RND in percent) and Table 5's objectives without next-sentence prediction.
STUDIES = {
    "no_nsp_0_20_80": (dict(next_sentence_prediction=False, mask_token_rate=0.0,
                            random_token_rate=0.8), {}),
    "100_0_0_exact_draws": (dict(mask_token_rate=1.0, random_token_rate=0.0),
                            dict(exact_draws=True)),
    "80_20_0": (dict(mask_token_rate=0.8, random_token_rate=0.0), {}),
    "ltr_no_nsp_unmasked": (dict(next_sentence_prediction=False), dict(dynamic_masking=True)),
}


@pytest.mark.parametrize("study", STUDIES)
def test_both_drivers_write_the_same_records_for_the_studies(prose, tmp_path, study):
    """A corpus within one chunk and one pool, one seed: the local pool and the Beam
    pipeline write the same records (as sets: each its own order) and count the same, for
    each study's settings. The records hold what was asked: the share of masked
    positions shown as [MASK], as their own token, as another token within 5 binomial
    standard errors of the split (a random entry is [MASK] or the token itself 1/V of the
    time), exact where a share is 0 or 1; without NSP no random next, one segment or B
    the text after A; the summaries record the settings."""
    settings, job = STUDIES[study]
    config = dataclasses.replace(reference_runs.CONFIG, dupe_factor=2, **settings)
    local, local_summary = run_local(tmp_path, [prose["corpus"]], prose["vocab"], config,
                                     **job)
    beam_out, beam_summary = run_beam(tmp_path, [prose["corpus"]], prose["vocab"], config,
                                      **job)
    assert local_summary["num_chunks"] == beam_summary["num_pools"] == 1
    _, local_raw = reference_runs.read_records(local)
    parsed, beam_raw = reference_runs.read_records(beam_out)
    assert len(local_raw) > 1500
    assert sorted(local_raw) == sorted(beam_raw)
    counts = ("instances", "tokens", "random_next", "masked", "masked_as_mask",
              "masked_kept", "masked_random", "short_instances")
    assert {k: local_summary[k] for k in counts} == {k: beam_summary[k] for k in counts}
    for summary in (local_summary, beam_summary):
        assert {k: summary["config"][k] for k in settings} == settings
        assert summary["config"]["next_sentence_prediction"] == config.next_sentence_prediction
    labels = parsed["next_sentence_labels"][:, 0]
    segments = parsed["segment_ids"]
    n = parsed["input_mask"].sum(axis=1)
    if not config.next_sentence_prediction:
        assert not labels.any() and beam_summary["random_next"] == 0
        # One segment ([CLS] A [SEP]: ids 0) or two (0 then 1 up to the end).
        two = segments.any(axis=1)
        assert two.sum() > 100 and (~two).sum() > 100
        ends = segments[np.arange(len(n)), n - 1]
        assert (ends == two).all()
    else:  # random next half the time, and always after a one-sentence chunk
        assert 0.5 < labels.mean() < 0.8
    assert labels.sum() == beam_summary["random_next"]
    if job.get("dynamic_masking"):
        assert "masked_lm_ids" not in parsed and beam_summary["masked"] == 0
        return
    weights = parsed["masked_lm_weights"] > 0
    shown = np.take_along_axis(parsed["input_ids"], parsed["masked_lm_positions"], axis=1)
    total = int(weights.sum())
    assert total == beam_summary["masked"] > 10_000
    observed = {"mask": int(((shown == prose["mask_id"]) & weights).sum()),
                "same": int(((shown == parsed["masked_lm_ids"]) & weights).sum())}
    observed["other"] = total - observed["mask"] - observed["same"]
    m, r = config.mask_token_rate, config.random_token_rate
    size = len(open(prose["vocab"], encoding="utf-8").read().split())
    keep = round(1 - m - r, 9)
    expected = {"mask": m + r / size, "same": keep + r / size, "other": r * (1 - 2 / size)}
    for name, p in expected.items():
        if p == 0:
            assert observed[name] == 0, (name, observed)
        else:
            assert abs(observed[name] / total - p) <= 5 * np.sqrt(p * (1 - p) / total), (
                name, observed, p)


def test_random_next_sentences_come_from_other_files(tmp_path):
    """Pools mix documents of all input files: a pair's random B comes from the other
    file about as often as that file's share of the documents (here: half). The local
    pipeline draws it from its chunk, i.e. mostly the same file."""
    from conftest import write_vocab

    words_a = ["alpha", "beta", "gamma", "delta"]
    words_b = ["one", "two", "three", "four"]
    vocab = write_vocab(tmp_path / "vocab.txt", ["[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                 "[MASK]", ".", *words_a, *words_b])
    rng = np.random.default_rng(0)
    files = []
    for name, words in (("a.txt", words_a), ("b.txt", words_b)):
        docs = ["\n".join(" ".join(rng.choice(words, 6)) + " ." for _ in range(4))
                for _ in range(150)]
        (tmp_path / name).write_text("\n\n".join(docs) + "\n", encoding="utf-8")
        files.append(str(tmp_path / name))
    config = PretrainingConfig(max_seq_length=32, max_predictions_per_seq=4,
                               dupe_factor=2)
    outputs, _ = run_beam(tmp_path, files, vocab, config, pool_bytes=6000,
                          dynamic_masking=True)
    parsed, _ = reference_runs.read_records(outputs)
    ids_a = {6, 7, 8, 9}  # the words of a.txt (b.txt's are 10-13)
    crossing = total = 0
    for ids, segments, label in zip(parsed["input_ids"], parsed["segment_ids"],
                                    parsed["next_sentence_labels"][:, 0]):
        if label:
            a_from_a = bool(set(ids[segments == 0].tolist()) & ids_a)
            b_from_a = bool(set(ids[(segments == 1) & (ids > 0)].tolist()) & ids_a)
            total += 1
            crossing += a_from_a != b_from_a
    assert total > 300
    # A pool of ~40 documents holds a share f of a.txt's: B crosses with probability
    # 2f(1-f) on average, 1/2 - 2 Var(f) ~ 1/2 - 1/80; allowed: that spread plus 4
    # binomial standard errors.
    assert abs(crossing / total - 0.5) < 0.02 + 4 * np.sqrt(0.25 / total), (crossing, total)


def test_what_a_step_holds_does_not_grow_with_the_corpus(prose, tmp_path, monkeypatch):
    """The pipeline's own bound on memory: a pool holds about --pool_size_mb of text and a
    sorting bucket at most about BUCKET_RECORDS records, whatever the corpus size. The
    same text once and four times over (other byte offsets: other documents): four times
    the pools and buckets, each within the sampling spread of its bound. (The DirectRunner
    engine itself holds whole collections: bench/RESULTS.md.)"""
    text = open(prose["corpus"], encoding="utf-8").read().rstrip("\n") + "\n\n"
    config = PretrainingConfig(max_seq_length=64, max_predictions_per_seq=10,
                               dupe_factor=1)
    bucket_records = 400
    monkeypatch.setattr(bpd, "BUCKET_RECORDS", bucket_records)
    seen = {"pools": [], "keys": []}
    build = bpd.BuildPool.process

    def build_and_record(self, element):  # the class is pickled by reference: runs here
        seen["pools"].append([sum(map(len, document)) for _, document in element[1]])
        for output in build(self, element):
            if isinstance(output, tuple):  # (sort key, record); not a tagged output
                seen["keys"].append(output[0])
            yield output

    monkeypatch.setattr(bpd.BuildPool, "process", build_and_record)
    pool_bytes = len(text.encode("utf-8")) // 4
    results = {}
    for copies in (1, 4):
        seen["pools"], seen["keys"] = [], []
        corpus = tmp_path / f"x{copies}.txt"
        corpus.write_text(text * copies, encoding="utf-8")
        _, summary = run_beam(tmp_path, [str(corpus)], prose["vocab"], config,
                              name=f"x{copies}", shards=2, pool_bytes=pool_bytes,
                              dynamic_masking=True)
        pools, keys = seen["pools"], seen["keys"]
        assert len(pools) == summary["num_pools"] == 4 * copies
        assert len(keys) == summary["instances"]
        # The buckets GroupBuckets forms (the pipeline's own bucket_of on each key).
        per_file = bpd.buckets_per_file(len(keys), 2)
        buckets = np.bincount([bpd.bucket_of(key, 2, per_file) for key in keys])
        # Documents are dealt to pools by a hash: a pool's tokens are a sum over all
        # documents d of t_d * Bernoulli(1/P), mean T/P, variance sum(t_d^2)(1/P)(1-1/P).
        tokens = np.array([t for pool in pools for t in pool], dtype=np.float64)
        p = 1 / len(pools)
        mean, sd = tokens.sum() * p, np.sqrt((tokens ** 2).sum() * p * (1 - p))
        assert max(sum(pool) for pool in pools) < mean + 5 * sd
        # Records are dealt to buckets by a hash too: at most BUCKET_RECORDS on average.
        assert len(buckets) >= summary["instances"] / bucket_records
        assert max(buckets) < bucket_records + 5 * np.sqrt(bucket_records)
        results[copies] = (mean, len(buckets), summary["instances"])
    # Four times the text: as many tokens per pool (within 5%: only the
    # rounding of the pool count differs), about four times the buckets.
    assert abs(results[4][0] / results[1][0] - 1) < 0.05
    assert results[4][1] >= 3 * results[1][1] and results[4][2] > 3.5 * results[1][2]


# ---------------------------------------------------------------------------------------
# The CLI, in this process (but for the kill).


def run_cli(*args):
    """The tool's command line `args` in this process: its Result (stderr with the log)."""
    done = call_main("beam_pretraining_data", args)
    return dataclasses.replace(done, stderr=done.stderr + done.log)


@pytest.mark.slow
def test_cli_output_depends_on_the_seed_only(prose, tmp_path):
    """DirectRunner with 1 worker and with 2 worker processes, other chunk sizes: the
    same bytes in every shard (gzip too); another seed: other bytes."""
    common = [f"--input_file={prose['corpus']}", f"--vocab_file={prose['vocab']}",
              "--max_seq_length=64", "--max_predictions_per_seq=10", "--dupe_factor=2",
              "--num_output_shards=3", "--gzip", "--pool_size_mb=0.05"]
    runs = {}
    for name, extra in [
            ("one", ["--direct_num_workers=1"]),
            ("two", ["--runner=DirectRunner", "--direct_num_workers=2",
                     "--direct_running_mode=multi_processing", "--chunk_size_mb=0.02"]),
            ("seed", ["--random_seed=7"])]:
        os.makedirs(tmp_path / name)
        done = run_cli(*common, f"--output_file={tmp_path / name / 'train.tfrecord'}", *extra)
        assert done.code == 0, done.stderr[-3000:]
        files = sorted(glob.glob(str(tmp_path / name / "train.tfrecord*")))
        assert [os.path.basename(f) for f in files] == [
            f"train.tfrecord-0000{i}-of-00003" for i in range(3)]
        runs[name] = [open(f, "rb").read() for f in files]
        summary = json.loads((tmp_path / name / "_train.tfrecord.summary.json").read_text())
        assert summary["num_pools"] > 3
        assert not [p for p in os.listdir(tmp_path / name) if p.startswith(".")]
        _, raw = reference_runs.read_records(files, compression="GZIP")
        assert len(raw) == summary["instances"] > 1000
    assert runs["one"] == runs["two"]
    assert runs["one"] != runs["seed"]


def test_cli_refuses_what_it_would_ignore(prose, tmp_path):
    """Flags of the local process pool (not this tool's flags, nor Beam options), unknown
    flags and masking flags with --dynamic_masking are errors naming the flag; nothing is
    written. (--num_workers is Beam's own option: Dataflow's initial worker count.)"""
    out = str(tmp_path / "o.tfrecord")
    common = [f"--input_file={prose['corpus']}", f"--vocab_file={prose['vocab']}",
              f"--output_file={out}"]
    for extra, message in [
            (["--shuffle_buffer_size=2"], "--shuffle_buffer_size"),
            (["--progress_seconds=1"], "--progress_seconds"),
            (["--no_such_flag=1"], "--no_such_flag"),
            (["--dynamic_masking", "--masked_lm_prob=0.2"], "--masked_lm_prob"),
            (["--dynamic_masking", "--mask_token_rate=0.5"], "--mask_token_rate"),
            (["--mask_token_rate=nan"], "--mask_token_rate=nan must be a number in [0, 1]"),
            (["--random_token_rate=-0.1"], "--random_token_rate=-0.1 must be a number"),
            (["--mask_token_rate=0.9", "--random_token_rate=0.2"],
             "--mask_token_rate=0.9 plus --random_token_rate=0.2 is more than 1"),
            (["--pool_size_mb=0"], "--pool_size_mb")]:
        done = call_main("beam_pretraining_data", [*common, *extra])
        assert done.code == 1 and message in done.stderr, done.stderr[-2000:]
        assert "beam_pretraining_data: error: " in done.stderr, done.stderr[-2000:]
        assert not os.listdir(tmp_path), os.listdir(tmp_path)


@pytest.mark.slow
def test_cli_studies_give_the_local_pools_records(prose, tmp_path):
    """The studies' flags on both command lines (Beam on the DirectRunner, named
    explicitly, offline): --next_sentence_prediction=false with Table 8's 0/0/100 row, a
    corpus within one chunk and one pool: the same records from both tools, no random
    next, no [MASK] but where a random replacement drew it; the summaries record the
    settings."""
    common = [f"--input_file={prose['corpus']}", f"--vocab_file={prose['vocab']}",
              "--max_seq_length=64", "--max_predictions_per_seq=10", "--dupe_factor=2",
              "--next_sentence_prediction=false", "--mask_token_rate=0",
              "--random_token_rate=1"]
    beam_out, local_out = tmp_path / "beam.tfrecord", tmp_path / "local.tfrecord"
    done = run_cli(*common, f"--output_file={beam_out}", "--runner=DirectRunner")
    assert done.code == 0, done.stderr[-3000:]
    done = call_main("create_pretraining_data", [*common, f"--output_file={local_out}"])
    assert done.code == 0, done.stderr[-3000:]
    parsed, beam_raw = reference_runs.read_records([str(beam_out)])
    _, local_raw = reference_runs.read_records([str(local_out)])
    assert sorted(beam_raw) == sorted(local_raw) and len(beam_raw) > 1500
    assert not parsed["next_sentence_labels"].any()
    weights = parsed["masked_lm_weights"] > 0
    shown = np.take_along_axis(parsed["input_ids"], parsed["masked_lm_positions"], axis=1)
    # Every prediction is a random entry: [MASK] about 1/V of the time (V = 2500).
    assert ((shown == prose["mask_id"]) & weights).sum() < 0.002 * weights.sum()
    for name in ("beam", "local"):
        summary = json.loads((tmp_path / f"_{name}.tfrecord.summary.json").read_text())
        assert summary["config"]["next_sentence_prediction"] is False
        assert summary["config"]["mask_token_rate"] == 0.0
        assert summary["config"]["random_token_rate"] == 1.0
        assert summary["masked_random"] == summary["masked"] == int(weights.sum())
        assert summary["random_next"] == 0


@pytest.mark.slow
def test_a_killed_runs_work_folder_is_removed_by_the_next_run(prose, tmp_path):
    """kill -9 of a real run (the DirectRunner, offline) while its hidden work folder
    exists leaves that folder behind (with the sorting buckets); the next run with the
    same output removes it (fileio.work_directory), so leftovers do not pile up."""
    import signal
    import time

    out = tmp_path / "out"
    out.mkdir()
    args = [f"--input_file={prose['corpus']}", f"--vocab_file={prose['vocab']}",
            f"--output_file={out / 'train.tfrecord'}", "--runner=DirectRunner",
            "--max_seq_length=64", "--max_predictions_per_seq=10", "--dupe_factor=2",
            "--pool_size_mb=0.05"]
    with open(tmp_path / "log.txt", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "data_prep.beam_pretraining_data",
                                 *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True,
                                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        work, deadline = [], time.monotonic() + 300
        while not work and proc.poll() is None and time.monotonic() < deadline:
            work = [name for name in os.listdir(out) if ".beam-work.tmp-" in name]
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert work, (tmp_path / "log.txt").read_text()[-3000:]
    assert work[0].startswith(".train.tfrecord.beam-work.tmp-") and f"-{proc.pid}-" in work[0]
    assert work[0] in os.listdir(out)  # what a kill -9 leaves
    done = run_cli(*args)
    assert done.code == 0, done.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["_train.tfrecord.summary.json", "train.tfrecord"]
    assert "Removed 1 temporary file(s) left by an interrupted run" in done.stderr
