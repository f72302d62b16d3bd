"""Single-thread tokenizer throughput on English prose: original vs ours vs in-graph.

    .venv/bin/python bench/bench_tokenizer.py [--mb 5] [--repeats 3]

The prose is bench/corpus.py's, offline and deterministic: docstrings and comments of the
standard library and of the installed TensorFlow, Keras, numpy, scipy, ... sources, one
sentence per line, no line repeated (`--corpus=repeated`: 0.58 MB of it repeated to
size, to show what repetition does to the caches); the vocab (about 21k entries) is the
benches' vocab, learned from the same text.
Prints a markdown table (tokens/s, speed-up over the original, and whether each output
is identical to the original's on every line). Times are CPU seconds of this process
(time.process_time), which the other load on a shared machine disturbs less than wall
time (also shown); rounds interleave the tokenizers and the best round of each counts.
TensorFlow is limited to one intra-op and one inter-op thread.

Then the command-line tools as a user runs them, start-up included: our
`python -m data_prep.bert_tokenize` against the original's tokenizer in an equivalent
stdin -> stdout script, on the same text (wall and CPU seconds of the process, best of
the rounds; outputs compared byte for byte), and each one's start-up alone (empty
input). `--compare_root` adds the CLI of another checkout of this project (e.g. the code
before a change) to the same rounds.
"""

from __future__ import annotations

import argparse
import gc
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import corpus as bench_corpus  # noqa: E402
from data_prep import tokenization  # noqa: E402


# The original has no tokenizer CLI: this is the loop a user would write around it, with
# the same line handling as ours (split on "\n" only, UTF-8); `original_module` marks the
# original's absl flags parsed, as its own scripts do when they start.
ORIGINAL_CLI = r"""
import sys
from original_bert import original_module
tokenization = original_module("tokenization")
tokenizer = tokenization.FullTokenizer(sys.argv[1], do_lower_case=True)
out = sys.stdout.buffer
for raw in sys.stdin.buffer:
    line = (raw[:-1] if raw.endswith(b"\n") else raw).decode("utf-8")
    out.write((" ".join(tokenizer.tokenize(line)) + "\n").encode("utf-8"))
"""


def run_process(cmd, stdin_path, env, cwd):
    """(wall s, CPU s, stdout bytes) of one subprocess fed `stdin_path`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(stdin_path, "rb") as stdin:
        done = subprocess.run(cmd, stdin=stdin, capture_output=True, env=env, cwd=cwd,
                              check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{cmd} failed:\n{done.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def cli_table(lines, vocab_file, workdir, repeats, ours_root, compare_root=None):
    """Markdown table: the CLIs on the text and on empty input, best of `repeats` rounds."""
    text_path = os.path.join(workdir, "text.txt")
    with open(text_path, "wb") as f:
        f.write("".join(line + "\n" for line in lines).encode("utf-8"))
    empty_path = os.path.join(workdir, "empty.txt")
    open(empty_path, "wb").close()
    mb = os.path.getsize(text_path) / 1e6
    cache_dir = os.path.join(workdir, "cache")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT / "tests"))
    original = [sys.executable, "-c", ORIGINAL_CLI, vocab_file]
    checkouts = [("ours", ours_root)] + (
        [(f"ours from {compare_root}", compare_root)] if compare_root else [])
    # A checkout from before 2026-11-27 has its CLI in data_prep/tokenization.py and a
    # Unicode table cache (timed warm, and off: the tables computed in the run).
    variants = {}
    warm_up_path = os.path.join(workdir, "warm_up.txt")
    with open(warm_up_path, "w", encoding="utf-8") as f:
        f.write("Naïve café, Ünïcödé.\n")
    for label, root in checkouts:
        new = os.path.exists(os.path.join(root, "data_prep", "bert_tokenize.py"))
        cmd = [sys.executable, "-m", "data_prep.bert_tokenize" if new else
               "data_prep.tokenization", f"--vocab_file={vocab_file}", "--do_lower_case=true"]
        if new:
            variants[label] = [("", cmd, env, root)]
        else:
            warm = dict(env, BERT_KERAS3_CACHE_DIR=cache_dir)
            run_process(cmd, warm_up_path, warm, root)  # fills its cache
            variants[label] = [(", table cache warm", cmd, warm, root),
                               (", no table cache", cmd,
                                dict(env, BERT_KERAS3_CACHE_DIR=""), root)]
    groups = []
    for stdin_path, what in ((empty_path, "start-up only (empty input)"),
                             (text_path, f"{mb:.2f} MB")):
        group = {f"original, {what}": (original, stdin_path, env, ROOT)}
        for label, runs in variants.items():
            for suffix, cmd, run_env, root in runs:
                group[f"{label}, {what}{suffix}"] = (cmd, stdin_path, run_env, root)
        groups.append(group)
    runs = {name: run for group in groups for name, run in group.items()}
    wall = dict.fromkeys(runs, float("inf"))
    cpu = dict.fromkeys(runs, float("inf"))
    outputs = {}
    for _ in range(repeats):
        for name, (cmd, stdin_path, run_env, cwd) in runs.items():
            seconds, cpu_seconds, outputs[name] = run_process(cmd, stdin_path, run_env, cwd)
            wall[name] = min(wall[name], seconds)
            cpu[name] = min(cpu[name], cpu_seconds)
    rows = ["| run | wall s | CPU s | MB/s (wall) | vs original (wall) | vs original (CPU) "
            "| output identical to original |", "|---|---:|---:|---:|---:|---:|---|"]
    for group in groups:
        base = next(iter(group))
        for name in group:
            speed = f"{mb / wall[name]:.2f}" if "MB" in name else ""
            same = "yes" if outputs[name] == outputs[base] else "no"
            rows.append(f"| {name} | {wall[name]:.2f} | {cpu[name]:.2f} | {speed} "
                        f"| {wall[base] / wall[name]:.1f}x | {cpu[base] / cpu[name]:.1f}x "
                        f"| {same} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=5.0, help="megabytes of prose")
    parser.add_argument("--corpus", default="unique", choices=bench_corpus.CORPORA)
    parser.add_argument("--repeats", type=int, default=3, help="rounds; the best counts")
    parser.add_argument("--batch", type=int, default=1024, help="lines per in-graph batch")
    parser.add_argument("--cli", default=True, action=argparse.BooleanOptionalAction,
                        help="also time the command-line tools, start-up included")
    parser.add_argument("--in_process", default=True, action=argparse.BooleanOptionalAction,
                        help="time the tokenizers in this process")
    parser.add_argument("--ours_root", default=str(ROOT),
                        help="checkout whose `python -m data_prep.bert_tokenize` is timed")
    parser.add_argument("--compare_root", default=None,
                        help="another checkout (e.g. the code before a change) whose CLI is "
                        "timed in the same rounds")
    args = parser.parse_args()

    lines = bench_corpus.corpus_lines(args.mb, args.corpus)
    mb = sum(len(line.encode("utf-8")) + 1 for line in lines) / 1e6
    workdir = tempfile.mkdtemp(prefix="bench_tokenizer_")
    vocab_file = os.path.join(workdir, "vocab.txt")
    bench_corpus.write_vocab(vocab_file)
    print(f"Corpus: bench/corpus.py, {args.corpus}, {mb:.2f} MB. "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average (1 min) "
          f"{os.getloadavg()[0]:.1f} before.\n", flush=True)

    if args.cli:
        print(f"Command-line tools on {mb:.2f} MB, best of {args.repeats} rounds "
              f"(ours from {args.ours_root}):\n")
        print(cli_table(lines, vocab_file, workdir, args.repeats, args.ours_root,
                        args.compare_root) + "\n", flush=True)
    if not args.in_process:
        return

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import tensorflow_text as tf_text

    from data_prep import tf_tokenization
    from original_bert import original_module

    original = original_module("tokenization").FullTokenizer(vocab_file, do_lower_case=True)

    def ours(method):
        def run():  # a fresh tokenizer each time: the caches start cold
            tokenizer = tokenization.FullTokenizer(vocab_file, do_lower_case=True)
            return [getattr(tokenizer, method)(line) for line in lines]
        return run

    graph = tf_tokenization.BertInGraphTokenizer(vocab_file, do_lower_case=True)
    vocab_tokens = graph.vocab_tokens
    batches = [tf.constant(lines[i:i + args.batch]) for i in range(0, len(lines), args.batch)]

    def in_graph(tokenize):
        fn = tf.function(tokenize, input_signature=[tf.TensorSpec([None], tf.string)])
        fn(batches[0])  # trace outside the timing

        def run():
            return [fn(batch) for batch in batches]
        return run

    def as_tokens(output):
        if output and isinstance(output[0], tf.RaggedTensor):  # in-graph: ids, by batch
            return [[vocab_tokens[i] for i in row] for r in output for row in r.to_list()]
        return output

    stock = tf_text.FastBertTokenizer(vocab=vocab_tokens, lower_case_nfd_strip_accents=True,
                                      token_out_type=tf.int64)
    candidates = {
        "original (bert-tensorflow 1.0.4)": lambda: [original.tokenize(x) for x in lines],
        "ours, exact path (`tokenize_exact`)": ours("tokenize_exact"),
        "ours, fast path (`tokenize`)": ours("tokenize"),
        "in-graph, ours (`BertInGraphTokenizer`)": in_graph(graph.tokenize),
        "in-graph, stock `tf_text.FastBertTokenizer`": in_graph(stock.tokenize),
    }
    # Rounds interleave all tokenizers, so a burst of load from other processes hits
    # them alike; the best round of each counts. Outputs are kept only as one string per
    # line (not as millions of live lists, which would make every run pay for garbage
    # collection passes over them); in-graph id tensors are converted outside the timing.
    # gc.freeze(): the objects of the set-up (TensorFlow's ~270k, the corpus) are not
    # part of any tokenizer's cost, yet each full collection would walk them all.
    gc.collect()
    gc.freeze()
    cpu = dict.fromkeys(candidates, float("inf"))
    wall = dict.fromkeys(candidates, float("inf"))
    outputs = {}
    for _ in range(args.repeats):
        for name, run in candidates.items():
            outputs.pop(name, None)
            gc.collect()
            start_cpu, start_wall = time.process_time(), time.perf_counter()
            output = run()
            cpu[name] = min(cpu[name], time.process_time() - start_cpu)
            wall[name] = min(wall[name], time.perf_counter() - start_wall)
            outputs[name] = [" ".join(tokens) for tokens in as_tokens(output)]
            del output
    expected = outputs["original (bert-tensorflow 1.0.4)"]
    n_tokens = sum(len(line.split()) for line in expected)

    print(f"{len(lines)} lines, {mb:.2f} MB, {n_tokens} tokens (uncased, "
          f"{len(vocab_tokens)}-entry vocab), one thread, best of {args.repeats}\n")
    print("| tokenizer | CPU s | wall s | tokens/s (CPU) | vs original | identical to original |")
    print("|---|---:|---:|---:|---:|---|")
    base = cpu["original (bert-tensorflow 1.0.4)"]
    for name in candidates:
        same = "yes" if outputs[name] == expected else "no"
        print(f"| {name} | {cpu[name]:.2f} | {wall[name]:.2f} | {n_tokens / cpu[name]:,.0f} "
              f"| {base / cpu[name]:.1f}x | {same} |")

if __name__ == "__main__":
    main()
