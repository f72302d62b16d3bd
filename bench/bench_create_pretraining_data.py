"""Benchmark: data_prep.create_pretraining_data against Google's original, side by side.

Offline and deterministic: the corpus is bench/corpus.py's (docstrings and comments of the
standard library and of the installed TensorFlow, Keras, numpy, scipy, ... sources, one
sentence per line, no line repeated), cut to each requested size, and its vocab (about
21k entries learned from its first 5 MB). `--corpus=repeated` (or `unique,repeated`)
times the same tools on the first 0.58 MB of that text repeated to size, the kind of
corpus this bench used before, to show how much repetition flatters our cached tokenizer.
For each corpus and size it runs, as subprocesses with the same flags (max_seq_length
128, max_predictions_per_seq 20, dupe_factor 5 by default):

* the original (`python -m bert.create_pretraining_data`, PyPI bert-tensorflow),
* ours with 1 worker and with all cores (the default: vectorised masking),
* ours with all cores and `--exact_draws` (the original's random draws, draw for draw),

and reports wall time, MB/s, the speed-up over the original measured in the same run,
CPU seconds of all its processes (robust on a shared,
loaded machine, where wall time is not), instances/s and peak memory (the largest single
process, from getrusage, and the whole process tree, sampled from /proc), plus the
Python tokenizer's own speed on the same text, the ceiling of a tokenizer-bound pipeline.
With --startup (default) it also times start-up alone: ours with all cores on a 2 KB
corpus (a `--compare_root` from before 2026-11-27 has a Unicode table cache: timed with
it, in the work directory, and with caching off).

    .venv/bin/python bench/bench_create_pretraining_data.py --sizes_mb=1,10
    .venv/bin/python bench/bench_create_pretraining_data.py --sizes_mb=1 --skip_original
    .venv/bin/python bench/bench_create_pretraining_data.py --sizes_mb=10 --workers=2 \
        --no-exact_draws_run --repeats=7   # medians of 7 interleaved runs of ours
    .venv/bin/python bench/bench_create_pretraining_data.py --sizes_mb=10 \
        --compare_root=/tmp/before   # e.g. `git archive HEAD | tar -x -C /tmp/before`

It prints a markdown table (with the command and the load) for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import corpus as bench_corpus  # noqa: E402
from data_prep import tokenization  # noqa: E402


# --- Measuring ---------------------------------------------------------------------------


def _tree_rss(root_pid):
    """{pid: (depth below root_pid, RSS bytes)} of root_pid and all its descendants."""
    children = collections.defaultdict(list)
    rss = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/statm") as f:
                rss[int(entry)] = int(f.read().split()[1]) * page
        except OSError:
            continue
        children[int(fields[1])].append(int(entry))
    tree, stack = {}, [(root_pid, 0)]
    while stack:
        pid, depth = stack.pop()
        tree[pid] = (depth, rss.get(pid, 0))
        stack.extend((child, depth + 1) for child in children.get(pid, []))
    return tree


# Wall time is taken inside the wrapper, around the command alone: this process's
# memory-polling thread can hold its GIL and delay noticing the end by up to ~0.2 s.
_MAXRSS_WRAPPER = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
                   "rc = subprocess.call(sys.argv[1:]); t = time.perf_counter() - t; "
                   "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
                   "print('MAXRSS_KB', u.ru_maxrss, 'CPU_S', u.ru_utime + u.ru_stime, "
                   "'WALL_S', t, file=sys.stderr); sys.exit(rc)")


def measure(cmd, env=None, cwd=ROOT, process_peaks=None):
    """Runs cmd; returns wall seconds, CPU seconds (all processes), largest single-process
    RSS (MB) and process-tree peak RSS (MB). With a dict `process_peaks`, also fills it
    with {pid: (depth, peak RSS bytes)} of every process of the tree (depth 1 is cmd's
    own process, below the measuring wrapper; 2 its children, e.g. workers)."""
    proc = subprocess.Popen([sys.executable, "-c", _MAXRSS_WRAPPER, *cmd], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def poll():
        while proc.poll() is None:
            tree = _tree_rss(proc.pid)
            peak[0] = max(peak[0], sum(r for _, r in tree.values()))
            if process_peaks is not None:
                for pid, (depth, rss) in tree.items():
                    process_peaks[pid] = (depth, max(rss, process_peaks.get(pid, (0, 0))[1]))
            time.sleep(0.2)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    _, err = proc.communicate()
    poller.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    found = re.search(r"MAXRSS_KB (\d+) CPU_S ([\d.]+) WALL_S ([\d.]+)", err)
    return float(found.group(3)), float(found.group(2)), int(found.group(1)) / 1024, \
        peak[0] / 2**20


def count_records(paths):
    import tensorflow as tf

    return sum(1 for _ in tf.data.TFRecordDataset(paths))


def tokenizer_speed(corpus_path, vocab_path):
    tokenizer = tokenization.FullTokenizer(vocab_path, do_lower_case=True)
    with open(corpus_path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    start = time.perf_counter()
    tokens = sum(len(tokenizer.tokenize(line)) for line in lines)
    seconds = time.perf_counter() - start
    return os.path.getsize(corpus_path) / 1e6 / seconds, tokens / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes_mb", default="1,10")
    parser.add_argument("--work_dir", default=None)
    parser.add_argument("--skip_original", action="store_true")
    parser.add_argument("--dupe_factor", type=int, default=5)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--max_predictions_per_seq", type=int, default=20)
    parser.add_argument("--workers", default=f"1,{len(os.sched_getaffinity(0))}")
    parser.add_argument("--exact_draws_run", default=True,
                        action=argparse.BooleanOptionalAction,
                        help="also run ours with all cores and --exact_draws")
    parser.add_argument("--ours_root", default=ROOT,
                        help="checkout whose create_pretraining_data is timed")
    parser.add_argument("--compare_root", default=None,
                        help="other checkouts, comma-separated (e.g. the code before a "
                        "change) timed in the same run, right after ours, with the same flags")
    parser.add_argument("--startup", default=True, action=argparse.BooleanOptionalAction,
                        help="also time start-up alone (a 2 KB corpus)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of ours (each checkout, interleaved); medians reported")
    parser.add_argument("--original_repeats", type=int, default=1,
                        help="runs of the original (in the first rounds); median reported")
    parser.add_argument("--corpus", default="unique",
                        help="comma-separated corpora of bench/corpus.py, timed one after the "
                        "other: unique (no line repeats) and/or repeated (0.58 MB repeated)")
    args = parser.parse_args()
    corpora = args.corpus.split(",")
    for kind in corpora:
        if kind not in bench_corpus.CORPORA:
            parser.error(f"--corpus: {kind!r} is not one of {bench_corpus.CORPORA}")

    work = args.work_dir or tempfile.mkdtemp(prefix="bench_cpd_")
    os.makedirs(work, exist_ok=True)
    common = [f"--max_seq_length={args.max_seq_length}",
              f"--max_predictions_per_seq={args.max_predictions_per_seq}",
              f"--dupe_factor={args.dupe_factor}", "--masked_lm_prob=0.15",
              "--random_seed=12345", "--do_lower_case=true"]
    # An old checkout's table cache goes to the work directory, not the user's home.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               BERT_KERAS3_CACHE_DIR=os.path.join(work, "cache"))
    rows = []
    vocab_path = os.path.join(work, "vocab.txt")
    bench_corpus.write_vocab(vocab_path)
    load_before = os.getloadavg()
    checkouts = [("ours", args.ours_root)] + (
        [(f"ours from {root}", root) for root in args.compare_root.split(",")]
        if args.compare_root else [])
    # Bytecode caches, as a user's second run (or any pip install) has them: the
    # original's site-packages have them; without this, an environment with
    # PYTHONDONTWRITEBYTECODE=1 would compile our modules in every timed run (~30 ms).
    # Then one warm-up run (which fills an old checkout's table cache).
    for _, root in checkouts:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "data_prep"], cwd=root,
                       env={k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"},
                       check=True)
        measure(startup_command(work, vocab_path, common), env=env, cwd=root)
    groups = []  # (corpus kind, MB, runs), every run of one corpus file
    for kind, size_mb in [(k, float(s)) for k in corpora
                          for s in args.sizes_mb.split(",")]:
        corpus = os.path.join(work, f"corpus_{kind}_{size_mb:g}mb.txt")
        mb = bench_corpus.write_corpus(corpus, size_mb, kind) / 1e6
        tok_mbs, tok_tps = tokenizer_speed(corpus, vocab_path)
        rows.append(dict(size_mb=mb, corpus=kind, run="tokenizer alone (1 core)",
                         seconds=mb / tok_mbs, mb_s=tok_mbs,
                         note=f"{tok_tps / 1e3:.0f}k tokens/s"))
        print(json.dumps(rows[-1]), flush=True)
        runs = []
        if not args.skip_original:
            out = os.path.join(work, f"orig_{kind}_{size_mb:g}.tfrecord")
            runs.append(("original (bert-tensorflow 1.0.4)", out,
                         ["-m", "bert.create_pretraining_data", f"--input_file={corpus}",
                          f"--output_file={out}", f"--vocab_file={vocab_path}", *common],
                         ROOT))
        all_cores = len(os.sched_getaffinity(0))
        variants = [(int(w), []) for w in args.workers.split(",")]
        if args.exact_draws_run:
            variants.append((all_cores, ["--exact_draws"]))
        for workers, extra in variants:
            for checkout, (label, root) in enumerate(checkouts):
                out = os.path.join(work, f"ours_{kind}_{size_mb:g}_{workers}_{len(extra)}_"
                                         f"{checkout}.tfrecord")
                runs.append((f"{label}, {workers} worker(s)"
                             f"{', --exact_draws' if extra else ''}", out,
                             ["-m", "data_prep.create_pretraining_data",
                              f"--input_file={corpus}", f"--output_file={out}",
                              f"--vocab_file={vocab_path}", f"--num_workers={workers}",
                              *extra, *common], root))
        groups.append((kind, mb, runs))
    # The original runs in the first `--original_repeats` rounds (~35-60 s at 10 MB: its
    # spread is small against its length); ours `--repeats` times. Each round runs every
    # corpus and size (so corpora compared in one run see the same load), the checkouts
    # interleaved, and the median of each measure is reported (single 2-s runs swing by
    # +-20% on this shared VM).
    measured = {}
    for round_index in range(max(args.repeats, args.original_repeats)):
        for kind, mb, runs in groups:
            for name, out, cmd, root in runs:
                is_original = name.startswith("original")
                if round_index >= (args.original_repeats if is_original else args.repeats):
                    continue
                load = os.getloadavg()[0]  # before the run: the load it competes with
                figures = measure([sys.executable, *cmd], env=env, cwd=root)
                measured.setdefault((kind, mb, name), []).append(
                    (*figures, load, count_records([out])))
                print(json.dumps(dict(corpus=kind, mb=mb, run=name, round=round_index,
                                      seconds=figures[0], cpu_s=figures[1])), flush=True)
                summary = os.path.join(os.path.dirname(out), "_" + os.path.basename(out)
                                       + ".summary.json")
                for extra in glob.glob(out + "*") + glob.glob(summary):
                    os.remove(extra)
    for kind, mb, runs in groups:
        original = None
        for name, _, _, _ in runs:
            results = measured[(kind, mb, name)]
            seconds = statistics.median(r[0] for r in results)
            cpu = statistics.median(r[1] for r in results)
            instances = results[0][5]
            if name.startswith("original"):
                original = (seconds, cpu)
            if len(results) > 1:
                name += f", median of {len(results)}"
            rows.append(dict(size_mb=mb, corpus=kind, run=name, seconds=seconds,
                             mb_s=mb / seconds,
                             speedup=original[0] / seconds if original else None,
                             speedup_cpu=original[1] / cpu if original else None,
                             cpu_s=cpu, mb_per_cpu_s=mb / cpu,
                             load=statistics.median(r[4] for r in results),
                             instances=instances, inst_s=instances / seconds,
                             max_rss_mb=max(r[2] for r in results),
                             tree_rss_mb=max(r[3] for r in results),
                             wall_range=(min(r[0] for r in results),
                                         max(r[0] for r in results))))
            print(json.dumps(rows[-1]), flush=True)
    if args.startup:  # after the sizes: the vocab is learned from the first corpus
        rows += startup_rows(work, vocab_path, common, env, args.ours_root)
        for label, root in checkouts[1:]:
            rows += startup_rows(work, vocab_path, common, env, root, label=label)
    print(format_table(rows, args, load_before, os.getloadavg()))


def startup_command(work, vocab_path, common):
    """Ours on a 2 KB corpus in two chunks (two workers start, as in a real run): the
    start-up run, and the warm-up before the timed runs."""
    corpus = os.path.join(work, "corpus_startup.txt")
    if not os.path.exists(corpus):
        bench_corpus.write_corpus(corpus, 0.002)
    out = os.path.join(work, "startup.tfrecord")
    return [sys.executable, "-m", "data_prep.create_pretraining_data", f"--input_file={corpus}",
            f"--output_file={out}", f"--vocab_file={vocab_path}", "--chunk_size_mb=0.001",
            *common]


def startup_rows(work, vocab_path, common, env, ours_root, label="ours",
                 repeats=5):
    """Ours on a 2 KB corpus in two chunks (start-up dominates, workers included); a
    checkout with a table cache also with caching off."""
    cmd = startup_command(work, vocab_path, common)
    out = os.path.join(work, "startup.tfrecord")  # startup_command's output
    nbytes = os.path.getsize(os.path.join(work, "corpus_startup.txt"))
    measure(cmd, env=env, cwd=ours_root)  # fills the cache
    rows = []
    variants = [(f"{label}, start-up (2 KB corpus)", env)]
    with open(os.path.join(ours_root, "data_prep", "tokenization.py")) as f:
        if "BERT_KERAS3_CACHE_DIR" in f.read():
            variants = [(f"{label}, start-up (2 KB corpus), table cache", env),
                        (f"{label}, start-up (2 KB corpus), no table cache",
                         dict(env, BERT_KERAS3_CACHE_DIR=""))]
    for name, run_env in variants:
        load = os.getloadavg()[0]
        best = min((measure(cmd, env=run_env, cwd=ours_root) for _ in range(repeats)),
                   key=lambda m: m[0])
        seconds, cpu, max_rss, tree_rss = best
        instances = count_records([out])
        rows.append(dict(size_mb=nbytes / 1e6, corpus="unique",
                         run=name + f", best of {repeats}", seconds=seconds,
                         mb_s=nbytes / 1e6 / seconds, speedup=None, speedup_cpu=None,
                         cpu_s=cpu, mb_per_cpu_s=nbytes / 1e6 / cpu, load=load,
                         instances=instances, inst_s=instances / seconds,
                         max_rss_mb=max_rss, tree_rss_mb=tree_rss))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def spread(row):
    """' (min-max)' of a median over several runs, else ''."""
    low, high = row.get("wall_range") or (None, None)
    return f" ({low:.2f}-{high:.2f})" if low is not None and high > low else ""


def run_header(load_before, load_after):
    """The line that dates a bench's table: UTC time, cores, load average before and after."""
    return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{len(os.sched_getaffinity(0))} cores, load average (1 min) "
            f"{load_before[0]:.1f} before, {load_after[0]:.1f} after.")


def format_table(rows, args, load_before, load_after):
    lines = [
        "Corpus: bench/corpus.py (unique: no line repeats; repeated: 0.58 MB repeated to "
        "size), one sentence per line; its ~21k vocab. Flags: "
        f"max_seq_length {args.max_seq_length}, max_predictions_per_seq "
        f"{args.max_predictions_per_seq}, dupe_factor {args.dupe_factor}, seed 12345. "
        + run_header(load_before, load_after),
        "",
        "| corpus | run | wall s | MB/s | x original (wall) | CPU s (all processes) "
        "| x original (CPU) | MB per CPU-s | instances | instances/s "
        "| peak RSS, largest process (MB) | peak RSS, all processes (MB) | load avg before |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        corpus = f"{r['size_mb']:.3g} MB {r['corpus']}"
        if "instances" in r:
            speedup = "" if r.get("speedup") is None else f"{r['speedup']:.1f}x"
            speedup_cpu = "" if r.get("speedup_cpu") is None else f"{r['speedup_cpu']:.1f}x"
            lines.append(
                f"| {corpus} | {r['run']} | {r['seconds']:.2f}{spread(r)} "
                f"| {r['mb_s']:.2f} | {speedup} | {r['cpu_s']:.2f} | {speedup_cpu} "
                f"| {r['mb_per_cpu_s']:.2f} | {r['instances']} "
                f"| {r['inst_s']:.0f} | {r['max_rss_mb']:.0f} | {r['tree_rss_mb']:.0f} "
                f"| {r['load']:.1f} |")
        else:
            lines.append(f"| {corpus} | {r['run']} | {r['seconds']:.2f} | "
                         f"{r['mb_s']:.2f} | | {r['seconds']:.2f} | | {r['mb_s']:.2f} | "
                         f"{r['note']} | | | | |")
    lines += ["", "Command: `.venv/bin/python bench/bench_create_pretraining_data.py "
              + " ".join(a for a in sys.argv[1:]) + "`"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
