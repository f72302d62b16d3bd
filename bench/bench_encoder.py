"""Encoder forward benchmark: our BertEncoder vs keras-hub's BertBackbone (same size, same run).

    .venv/bin/pip install keras-hub   # benchmark only; not a project dependency
    .venv/bin/python bench/bench_encoder.py --batch_size=8 --seq_length=128 --rounds=5

Both models get random weights and the same inputs (a few padded positions). Each mode
(float32, float32 + jit_compile, mixed_bfloat16, mixed_bfloat16 + jit_compile) wraps each
model's inference call in one ``tf.function``; timings alternate between the two models
round by round (the machine is shared, so the interleaving keeps noise fair) and report the
median. A dense matmul of the feed-forward shape is timed in the same run as a ceiling.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from modeling.config import BertConfig  # noqa: E402
from modeling.encoder import BertEncoder  # noqa: E402

MODES = {
    "float32": ("float32", False),
    "float32+jit": ("float32", True),
    "bfloat16": ("mixed_bfloat16", False),
    "bfloat16+jit": ("mixed_bfloat16", True),
}


def encoder_flops(config: BertConfig, batch: int, seq: int) -> float:
    """Multiply-add FLOPs (x2) of one forward pass: projections, attention, pooler."""
    h, i, n = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    tokens = batch * seq
    per_layer = 2 * tokens * (4 * h * h + 2 * h * i) + 2 * 2 * batch * seq * seq * h
    return n * per_layer + 2 * batch * h * h


def make_inputs(batch: int, seq: int, vocab: int):
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, vocab, (batch, seq)).astype(np.int32)
    mask = np.ones((batch, seq), np.int32)
    mask[::2, seq * 3 // 4:] = 0  # Some padding, as real batches have.
    segments = np.zeros((batch, seq), np.int32)
    segments[:, seq // 2:] = 1
    return tf.constant(ids), tf.constant(mask), tf.constant(segments)


def build_ours(config):
    model = BertEncoder(config)

    def run(ids, mask, segments):
        out = model({"input_ids": ids, "input_mask": mask, "segment_ids": segments},
                    training=False)
        return out["sequence_output"], out["pooled_output"]

    return run


def build_keras_hub(config):
    import keras_hub

    model = keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size, num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads, hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size, dropout=config.hidden_dropout_prob,
        max_sequence_length=config.max_position_embeddings,
        num_segments=config.type_vocab_size)

    def run(ids, mask, segments):
        out = model({"token_ids": ids, "padding_mask": mask, "segment_ids": segments},
                    training=False)
        return out["sequence_output"], out["pooled_output"]

    return run


def time_call(fn, args, iterations: int) -> tuple:
    """(wall seconds, process CPU seconds) per call; outputs are fetched, so the work is done.

    CPU seconds are less sensitive than wall time to other jobs on a shared machine.
    """
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(iterations):
        out = fn(*args)
    _ = [o.numpy() for o in out]
    return ((time.perf_counter() - start) / iterations,
            (time.process_time() - cpu) / iterations)


def build_matmul(dtype: str, rows: int, hidden: int, inner: int):
    """A [rows, hidden] x [hidden, inner] matmul (the feed-forward shape) and its FLOPs."""
    a = tf.cast(tf.random.normal((rows, hidden)), dtype)
    b = tf.cast(tf.random.normal((hidden, inner)), dtype)
    fn = tf.function(lambda: (tf.matmul(a, b),))
    return fn, 2 * rows * hidden * inner


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per model and mode")
    parser.add_argument("--iterations", type=int, default=1, help="forward passes per round")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--layers", type=int, default=12, help="12 = BERT-base")
    parser.add_argument("--no_keras_hub", action="store_true")
    args = parser.parse_args()

    config = BertConfig(vocab_size=30522, num_hidden_layers=args.layers, type_vocab_size=2)
    b, s = args.batch_size, args.seq_length
    inputs = make_inputs(b, s, config.vocab_size)
    flops = encoder_flops(config, b, s)
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
          f"{os.cpu_count()} CPUs; batch {b}, seq {s}, {config.num_hidden_layers} layers, "
          f"hidden {config.hidden_size}; {flops / 1e9 / b:.1f} GFLOP per sequence")

    rows = []
    for mode in args.modes.split(","):
        policy, jit = MODES[mode]
        keras.config.set_dtype_policy(policy)
        try:
            builders = {"ours": build_ours}
            if not args.no_keras_hub:
                builders["keras-hub"] = build_keras_hub
            fns = {name: tf.function(build(config), jit_compile=jit)
                   for name, build in builders.items()}
            matmul, matmul_flops = build_matmul(
                "bfloat16" if "bfloat16" in mode else "float32", b * s, config.hidden_size,
                config.intermediate_size)
            for fn in fns.values():  # trace / compile, warm up
                time_call(fn, inputs, 1)
                time_call(fn, inputs, 1)
            time_call(matmul, (), 3)
            wall = {name: [] for name in fns}
            cpu = {name: [] for name in fns}
            gemm_times = []
            for _ in range(args.rounds):
                # The matmul ceiling is timed in the same rounds, under the same load.
                gemm_times.append(time_call(matmul, (), 10)[0])
                for name, fn in fns.items():
                    w, c = time_call(fn, inputs, args.iterations)
                    wall[name].append(w)
                    cpu[name].append(c)
        finally:
            keras.config.set_dtype_policy("float32")
        ours, ours_cpu = statistics.median(wall["ours"]), statistics.median(cpu["ours"])
        nan = float("nan")
        theirs = statistics.median(wall["keras-hub"]) if "keras-hub" in wall else nan
        theirs_cpu = statistics.median(cpu["keras-hub"]) if "keras-hub" in cpu else nan
        gemm_rate = matmul_flops / statistics.median(gemm_times) / 1e9
        row = (mode, b / ours, b / theirs, theirs / ours, theirs_cpu / ours_cpu,
               flops / ours / 1e9 / gemm_rate)
        rows.append(row)
        print(f"{mode:>13}: ours {b / ours:6.2f} seq/s, keras-hub {b / theirs:6.2f} seq/s, "
              f"ratio {row[3]:4.2f}x (CPU-time ratio {row[4]:4.2f}x), ours at "
              f"{flops / ours / 1e9:.0f} GFLOP/s = {100 * row[5]:.0f}% of the "
              f"{gemm_rate:.0f} GFLOP/s matmul", flush=True)

    print("\n| mode | ours (seq/s) | keras-hub BertBackbone (seq/s) | ours / keras-hub (wall) "
          "| ours / keras-hub (CPU time) | ours as % of same-run matmul GFLOP/s |")
    print("|---|---|---|---|---|---|")
    for mode, ours, theirs, ratio, cpu_ratio, frac in rows:
        print(f"| {mode} | {ours:.2f} | {theirs:.2f} | {ratio:.2f}x | {cpu_ratio:.2f}x "
              f"| {100 * frac:.0f}% |")


if __name__ == "__main__":
    main()
