"""Benchmark: the Apache Beam pipeline (DirectRunner) against the local process pool.

Same corpus, vocab and flags as bench_create_pretraining_data.py (whose measuring and
counting helpers this reuses): bench/corpus.py's text, no line repeated (or with
`--corpus=repeated` 0.58 MB of it repeated), cut to each size, its ~21k vocab,
max_seq_length 128, max_predictions_per_seq 20, dupe_factor 5, seed 12345. For each size
and worker count it runs, as subprocesses,

* `python -m data_prep.create_pretraining_data --num_workers=W` (the local pool), and
* `python -m data_prep.beam_pretraining_data --runner=DirectRunner --direct_num_workers=W`
  (the DirectRunner's in-process engine; with W > 1 in worker processes,
  `--direct_running_mode=multi_processing`), once per `--pool_sizes_mb`,

`--repeats` times, the runs of one size and worker count interleaved round by round, and
reports the medians of wall time, MB/s, CPU seconds of all processes, peak memory (largest
process, the whole tree, the tool's main process and its largest worker process) and the
Beam run's wall-time ratio to the local pool with the same number of workers (the median
of the ratios within each round).

    .venv/bin/python bench/bench_beam_pretraining_data.py --sizes_mb=1,10 --repeats=3
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import corpus as bench_corpus  # noqa: E402
from bench_create_pretraining_data import (  # noqa: E402
    count_records, measure, run_header, startup_command)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes_mb", default="1,10")
    parser.add_argument("--workers", default=f"1,{len(os.sched_getaffinity(0))}")
    parser.add_argument("--pool_sizes_mb", default="16,2",
                        help="Beam --pool_size_mb values (16 is the default)")
    parser.add_argument("--dupe_factor", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1,
                        help="interleaved rounds per size and worker count; medians reported")
    parser.add_argument("--corpus", default="unique", choices=bench_corpus.CORPORA)
    parser.add_argument("--work_dir", default=None)
    args = parser.parse_args()

    work = args.work_dir or tempfile.mkdtemp(prefix="bench_beam_")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    common = ["--max_seq_length=128", "--max_predictions_per_seq=20",
              f"--dupe_factor={args.dupe_factor}", "--masked_lm_prob=0.15",
              "--random_seed=12345", "--do_lower_case=true"]
    vocab = os.path.join(work, "vocab.txt")
    bench_corpus.write_vocab(vocab)
    # Bytecode, as a user's second run finds it.
    subprocess.run([sys.executable, "-m", "compileall", "-q", "data_prep"], cwd=ROOT,
                   env={k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"},
                   check=True)
    measure(startup_command(work, vocab, common), env=env, cwd=ROOT)
    load_before = os.getloadavg()
    rows = []
    for size_mb in [float(s) for s in args.sizes_mb.split(",")]:
        corpus = os.path.join(work, f"corpus_{size_mb:g}mb.txt")
        mb = bench_corpus.write_corpus(corpus, size_mb, args.corpus) / 1e6
        data = [f"--input_file={corpus}", f"--vocab_file={vocab}", *common]
        for workers in [int(w) for w in args.workers.split(",")]:
            runs = [(f"local pool, {workers} worker(s)",
                     ["-m", "data_prep.create_pretraining_data", *data,
                      f"--num_workers={workers}"])]
            for pool in args.pool_sizes_mb.split(","):
                mode = ["--direct_running_mode=multi_processing"] if workers > 1 else []
                runs.append((f"Beam DirectRunner, {workers} worker(s), pool {pool} MB",
                             ["-m", "data_prep.beam_pretraining_data", *data,
                              "--runner=DirectRunner", f"--direct_num_workers={workers}",
                              f"--pool_size_mb={pool}", *mode]))
            measured = {name: [] for name, _ in runs}
            for round_index in range(args.repeats):
                local = None
                for name, cmd in runs:
                    out = os.path.join(work, "out.tfrecord")
                    load = os.getloadavg()[0]
                    peaks = {}
                    seconds, cpu, max_rss, tree_rss = measure(
                        [sys.executable, *cmd, f"--output_file={out}"], env=env,
                        process_peaks=peaks)
                    main_rss = max((r for d, r in peaks.values() if d == 1), default=0)
                    worker_rss = max((r for d, r in peaks.values() if d >= 2), default=0)
                    local = seconds if local is None else local
                    measured[name].append(dict(
                        seconds=seconds, cpu_s=cpu, max_rss_mb=max_rss, tree_rss_mb=tree_rss,
                        main_rss_mb=main_rss / 2**20, worker_rss_mb=worker_rss / 2**20,
                        load=load, vs_local=local / seconds, instances=count_records([out])))
                    print(json.dumps(dict(run=name, round=round_index, **measured[name][-1])),
                          flush=True)
                    for path in glob.glob(os.path.join(work, "*out.tfrecord*")):
                        os.remove(path)
            for name, results in measured.items():
                median = {key: statistics.median(r[key] for r in results)
                          for key in results[0] if key not in ("instances",)}
                for key in ("max_rss_mb", "tree_rss_mb", "main_rss_mb", "worker_rss_mb"):
                    median[key] = max(r[key] for r in results)  # peaks: the highest
                rows.append(dict(size_mb=mb, run=name, mb_s=mb / median["seconds"],
                                 instances=results[0]["instances"], runs=len(results),
                                 wall_range=(min(r["seconds"] for r in results),
                                             max(r["seconds"] for r in results)),
                                 **median))
                print(json.dumps(rows[-1]), flush=True)
    print(format_table(rows, args, load_before, os.getloadavg()))


def format_table(rows, args, load_before, load_after):
    lines = [
        f"Corpus: bench/corpus.py, {args.corpus}; its ~21k vocab; max_seq_length 128, "
        f"max_predictions_per_seq 20, dupe_factor {args.dupe_factor}, seed 12345. Medians "
        f"of {args.repeats} interleaved round(s) (wall range in brackets; peak memory: the "
        "highest). " + run_header(load_before, load_after),
        "",
        "| corpus | run | wall s | MB/s | CPU s (all processes) | instances "
        "| peak RSS, largest process (MB) | peak RSS, all processes (MB) "
        "| peak RSS, main process (MB) | peak RSS, largest worker process (MB) "
        "| wall: local pool / this | load avg before |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        low, high = r["wall_range"]
        spread = f" ({low:.2f}-{high:.2f})" if high > low else ""
        lines.append(
            f"| {r['size_mb']:.1f} MB | {r['run']} | {r['seconds']:.2f}{spread} "
            f"| {r['mb_s']:.2f} | {r['cpu_s']:.2f} | {r['instances']} | {r['max_rss_mb']:.0f} "
            f"| {r['tree_rss_mb']:.0f} | {r['main_rss_mb']:.0f} | {r['worker_rss_mb']:.0f} "
            f"| {r['vs_local']:.2f}x | {r['load']:.1f} |")
    lines += ["", "Command: `.venv/bin/python bench/bench_beam_pretraining_data.py "
              + " ".join(sys.argv[1:]) + "`"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
