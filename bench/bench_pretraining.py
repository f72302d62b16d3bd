"""Pretraining-step benchmark: our loop's step vs keras-hub's BertMaskedLM (same run), plus the
input pipeline alone and a matmul ceiling.

    .venv/bin/pip install keras-hub   # benchmark only; not a project dependency
    .venv/bin/python bench/bench_pretraining.py --sizes=small,base --dtypes=float32,bfloat16

Our step is the real training loop (`training.loop.TrainingLoop.run_train_steps`: one
`tf.function` running `--steps` steps of `strategy.run`, with MLM + NSP heads, the original
AdamWeightDecay with global-norm clipping). keras-hub's step is BertMaskedLM (MLM head at
the masked positions, no NSP head) with keras.optimizers.AdamW and global-norm clipping,
`--steps` steps inside one `tf.function` too, so both pay the same harness. Both use
dropout 0.1, random weights, the same synthetic batch (batch 16, seq 128, 20 predictions
by default). Models alternate round by round (the machine is shared and noisy) and the
median round is reported: sequences/s, achieved GFLOP/s (training = 3x the forward
matmul FLOPs) and its ratio to a float32 / bfloat16 matmul measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from modeling import optimization  # noqa: E402
from modeling.config import BertConfig  # noqa: E402
from modeling.models import BertPretrainer  # noqa: E402
from training import input_pipeline, pretraining  # noqa: E402
from training.loop import TrainingLoop  # noqa: E402
from training.settings import LoopConfig  # noqa: E402

SIZES = {
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072),
    "small": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                  intermediate_size=2048),
}
POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16"}
VOCAB = 30522


def train_flops_per_sequence(c: BertConfig, seq: int, preds: int) -> float:
    """3 x forward matmul FLOPs of one sequence (encoder, pooler, NSP, MLM at P positions)."""
    h, i, n = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    layer = 2 * seq * (4 * h * h + 2 * h * i) + 2 * 2 * seq * seq * h
    heads = 2 * h * h + 2 * preds * (h * h + h * c.vocab_size)
    return 3.0 * (n * layer + heads)


def synthetic_batch(batch, seq, preds, vocab, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int32)
    mask[::2, seq * 3 // 4:] = 0
    positions = np.sort(np.stack([rng.choice(np.arange(1, seq * 3 // 4), preds, replace=False)
                                  for _ in range(batch)]), axis=1).astype(np.int32)
    return {
        "input_ids": rng.integers(1000, vocab, (batch, seq)).astype(np.int32),
        "input_mask": mask,
        "segment_ids": (np.arange(seq)[None, :] >= seq // 2).astype(np.int32).repeat(batch, 0),
        "masked_lm_positions": positions,
        "masked_lm_ids": rng.integers(1000, vocab, (batch, preds)).astype(np.int32),
        "masked_lm_weights": np.ones((batch, preds), np.float32),
        "next_sentence_labels": rng.integers(0, 2, (batch, 1)).astype(np.int32),
    }


def build_ours(config, batch, steps, jit):
    strategy = tf.distribute.get_strategy()
    model = BertPretrainer(config)
    opt = optimization.create_optimizer(optimization.OptimizerConfig(
        learning_rate=1e-4, num_train_steps=10**6, num_warmup_steps=100))
    cfg = LoopConfig(output_dir=tempfile.mkdtemp(), train_batch_size=len(
        batch["input_ids"]), jit_compile=jit)
    trainer = TrainingLoop(strategy, model, opt, cfg, pretraining.PretrainingTask())
    return train_steps_runner(strategy, trainer, batch, steps)


def train_steps_runner(strategy, trainer, batch, steps):
    """A callable running `steps` compiled training steps of `trainer` on a fixed batch."""
    data = tf.data.Dataset.from_tensors({k: tf.constant(v) for k, v in batch.items()}).repeat()
    iterator = iter(strategy.distribute_datasets_from_function(lambda ctx: data))

    def run():
        out = trainer.run_train_steps(iterator, steps)
        assert out["bad_step"] < 0
    return run


def keras_hub_backbone(config):
    """keras-hub's BertBackbone with the sizes of our `config` (dropout 0.1, 2 segments)."""
    import keras_hub

    return keras_hub.models.BertBackbone(
        vocabulary_size=config.vocab_size, num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads, hidden_dim=config.hidden_size,
        intermediate_dim=config.intermediate_size, dropout=0.1,
        max_sequence_length=config.max_position_embeddings, num_segments=2)


def build_keras_hub(config, batch, steps, jit):
    import keras_hub

    backbone = keras_hub_backbone(config)
    model = keras_hub.models.BertMaskedLM(backbone=backbone, preprocessor=None)
    opt = keras.optimizers.AdamW(1e-4, weight_decay=0.01, epsilon=1e-6, global_clipnorm=1.0)
    x = {"token_ids": tf.constant(batch["input_ids"]),
         "segment_ids": tf.constant(batch["segment_ids"]),
         "padding_mask": tf.constant(batch["input_mask"].astype(bool)),
         "mask_positions": tf.constant(batch["masked_lm_positions"])}
    y = tf.constant(batch["masked_lm_ids"])
    w = tf.constant(batch["masked_lm_weights"])
    model(x)
    opt.build(model.trainable_variables)
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(jit_compile=jit)
    def grads_fn():
        with tf.GradientTape() as tape:
            logits = tf.cast(model(x, training=True), tf.float32)
            loss = ce(y, logits, sample_weight=w)
        return tape.gradient(loss, model.trainable_variables), loss

    @tf.function
    def steps_fn(n):
        loss = tf.constant(0.0)
        for _ in tf.range(n):
            grads, loss = grads_fn()
            opt.apply(grads, model.trainable_variables)
        return loss

    def run():
        steps_fn(tf.constant(steps)).numpy()
    return run


def time_rounds(runners, rounds, cpu_times=None):
    """{name: [wall seconds per round]}, alternating the runners each round.

    If `cpu_times` is a dict, it receives {name: [process CPU seconds per round]} (the
    steadiest figure on a shared machine: other jobs steal wall time, not our CPU time).
    """
    times = {name: [] for name in runners}
    for fn in runners.values():
        fn()  # trace, compile, warm up
    for _ in range(rounds):
        for name, fn in runners.items():
            start, cpu = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - start)
            if cpu_times is not None:
                cpu_times.setdefault(name, []).append(time.process_time() - cpu)
    return times


MATMUL_N, MATMUL_REPS = 2048, 10


def build_matmul(dtype, n=MATMUL_N, reps=MATMUL_REPS):
    """A chain of `reps` [n, n] x [n, n] matmuls; FLOPs = 2 n^3 reps."""
    a = tf.cast(tf.random.normal([n, n], dtype=tf.float32), dtype)

    @tf.function
    def mm(x):
        for _ in range(reps):
            x = tf.matmul(x, a) * tf.cast(1e-3, dtype)
        return x
    return lambda: mm(a).numpy()


def pipeline_examples_per_second(seq, preds, batch, seconds=5.0, records=4096):
    from data_prep import features

    d = tempfile.mkdtemp()
    encoder = features.PRETRAINING.encoder(max_seq_length=seq, max_predictions_per_seq=preds)
    one = synthetic_batch(records, seq, preds, VOCAB, seed=3)
    for shard in range(4):
        with tf.io.TFRecordWriter(os.path.join(d, f"part-{shard}.tfrecord")) as writer:
            for r in range(shard, records, 4):
                writer.write(encoder.encode({k: v[r].tolist() for k, v in one.items()}))
    cfg = input_pipeline.PretrainingInputConfig((os.path.join(d, "part-*"),), seq, preds)
    ds = input_pipeline.pretraining_dataset(cfg, batch_size=batch, is_training=True)
    it = iter(ds)
    for _ in range(20):
        next(it)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(it)
        count += batch
    return count / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="small,base")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20)
    parser.add_argument("--steps", type=int, default=2, help="steps per timed call")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jit_compile", action="store_true")
    parser.add_argument("--skip_keras_hub", action="store_true")
    parser.add_argument("--skip_pipeline", action="store_true")
    args = parser.parse_args()

    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
          f"{os.cpu_count()} CPU(s); batch {args.batch_size}, seq {args.seq_length}, "
          f"P {args.predictions}, {args.steps} steps/call, {args.rounds} rounds, "
          f"jit_compile={args.jit_compile}")
    batch = synthetic_batch(args.batch_size, args.seq_length, args.predictions, VOCAB)
    ours_f32 = {}
    rows = []
    for size in args.sizes.split(","):
        config = BertConfig(vocab_size=VOCAB, **SIZES[size])
        flops = train_flops_per_sequence(config, args.seq_length, args.predictions)
        for dtype in args.dtypes.split(","):
            keras.config.set_dtype_policy(POLICIES[dtype])
            runners = {"ours": build_ours(config, batch, args.steps, args.jit_compile)}
            # keras-hub 0.32's MaskedLMHead fails under mixed_bfloat16 with Keras 3.15
            # (adds its float32 bias to bfloat16 logits), so it runs in float32 only.
            if not args.skip_keras_hub and dtype == "float32":
                runners["keras-hub"] = build_keras_hub(config, batch, args.steps,
                                                       args.jit_compile)
            # The matmul ceiling is timed in the same rounds, so load changes hit both.
            runners["matmul"] = build_matmul(tf.float32 if dtype == "float32" else tf.bfloat16)
            cpu = {}
            times = time_rounds(runners, args.rounds, cpu)
            keras.config.set_dtype_policy("float32")
            peak = 2 * MATMUL_N ** 3 * MATMUL_REPS / statistics.median(times.pop("matmul")) / 1e9
            peaks = {dtype: peak}
            print(f"{size:5s} {dtype:8s} matmul {MATMUL_N}^3 {peak:8.1f} GFLOP/s", flush=True)
            results = {}
            for name, ts in times.items():
                seqs = args.steps * args.batch_size / statistics.median(ts)
                results[name] = seqs
                gflops = seqs * flops / 1e9
                rows.append((size, dtype, name, seqs, gflops, gflops / peaks[dtype]))
                print(f"{size:5s} {dtype:8s} {name:9s} {seqs:8.2f} seq/s {gflops:8.1f} GFLOP/s "
                      f"({gflops / peaks[dtype]:.2f} of matmul), "
                      f"{statistics.median(cpu[name]) / args.steps:.2f} CPU s/step", flush=True)
            if "keras-hub" in results:
                print(f"{size:5s} {dtype:8s} ours / keras-hub = "
                      f"{results['ours'] / results['keras-hub']:.2f}x wall, "
                      f"{statistics.median(cpu['keras-hub']) / statistics.median(cpu['ours']):.2f}x"
                      f" CPU time", flush=True)
            if dtype == "float32":
                ours_f32[size] = results["ours"]
            elif size in ours_f32:
                print(f"{size:5s} {dtype:8s} ours / ours float32 = "
                      f"{results['ours'] / ours_f32[size]:.2f}x", flush=True)
    if not args.skip_pipeline:
        eps = pipeline_examples_per_second(args.seq_length, args.predictions, args.batch_size)
        fastest = max(r[3] for r in rows if r[2] == "ours") if rows else float("nan")
        print(f"input pipeline alone: {eps:.0f} examples/s = {eps / fastest:.0f}x the fastest "
              f"step measured ({fastest:.2f} seq/s)")


if __name__ == "__main__":
    main()
