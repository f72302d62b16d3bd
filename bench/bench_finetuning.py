"""Fine-tuning-step benchmark: our classifier step vs keras-hub's BertTextClassifier (same run).

    .venv/bin/pip install keras-hub   # benchmark only; not a project dependency
    .venv/bin/python bench/bench_finetuning.py --sizes=small,base --dtypes=float32,bfloat16

Ours is the step exactly as run_classifier runs it: `BertClassifier` + `ClassifierTask` in the
shared `training.loop.TrainingLoop` (its compiled `_train_steps` function: `--steps` steps of
`strategy.run` per call, under the runner's default strategy), `AdamWeightDecay` from
`optimization.create_optimizer` (warmup + linear decay, global-norm clipping 1.0), dropout 0.1.
keras-hub's is `BertTextClassifier(backbone=BertBackbone(same size), num_classes=2,
preprocessor=None)` compiled with `keras.optimizers.AdamW` (global_clipnorm 1.0),
`SparseCategoricalCrossentropy(from_logits=True)`, `jit_compile=False` and
`steps_per_execution=--steps`, trained with `fit(steps_per_epoch=--steps)` on the same
repeated synthetic batch. Each timed call runs `--steps` steps; the first (tracing) call of
each is excluded. Rounds alternate ours / keras-hub / a matmul chain (`time_rounds`), and
the median round is reported as examples/s, CPU seconds per step and GFLOP/s (3 x forward
matmul FLOPs) against the same rounds' matmul.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# Shared helpers (model sizes, interleaved timing, matmul ceiling, FLOP count).
from bench_pretraining import (MATMUL_N, MATMUL_REPS, POLICIES, SIZES, VOCAB,  # noqa: E402
                               build_matmul, keras_hub_backbone, time_rounds,
                               train_flops_per_sequence, train_steps_runner)
from modeling import optimization  # noqa: E402
from modeling.config import BertConfig  # noqa: E402
from modeling.models import BertClassifier  # noqa: E402
from tasks.classification import task as classification_task  # noqa: E402
from training import distribution, loop  # noqa: E402
from training.settings import LoopConfig  # noqa: E402

NUM_LABELS = 2


def synthetic_batch(batch, seq, vocab, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int32)
    mask[::2, seq * 3 // 4:] = 0
    return {
        "input_ids": rng.integers(1000, vocab, (batch, seq)).astype(np.int32),
        "input_mask": mask,
        "segment_ids": (np.arange(seq)[None, :] >= seq // 2).astype(np.int32).repeat(batch, 0),
        "label_ids": rng.integers(0, NUM_LABELS, (batch,)).astype(np.int32),
        "is_real_example": np.ones((batch,), np.int32),
    }


def build_ours(config, batch, steps, jit):
    """run_classifier's model / optimizer / loop construction, minus data and checkpoints."""
    strategy = distribution.get_strategy("")
    seq = batch["input_ids"].shape[1]
    with strategy.scope():
        model = BertClassifier(config, NUM_LABELS)
        loop.build_encoder_model(model, seq)
        optimizer = optimization.create_optimizer(optimization.OptimizerConfig(
            learning_rate=2e-5, num_train_steps=10**6, num_warmup_steps=100))
    cfg = LoopConfig(output_dir=tempfile.mkdtemp(), train_batch_size=len(
        batch["input_ids"]), iterations_per_loop=steps, jit_compile=jit,
        dtype=keras.config.dtype_policy().compute_dtype)
    trainer = loop.TrainingLoop(strategy, model, optimizer, cfg,
                                classification_task.ClassifierTask(NUM_LABELS))
    return train_steps_runner(strategy, trainer, batch, steps)


def build_keras_hub(config, batch, steps, jit):
    import keras_hub

    backbone = keras_hub_backbone(config)
    model = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=NUM_LABELS,
                                                preprocessor=None, dropout=0.1)
    model.compile(optimizer=keras.optimizers.AdamW(2e-5, weight_decay=0.01, epsilon=1e-6,
                                                   global_clipnorm=1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=jit, steps_per_execution=steps)
    x = {"token_ids": batch["input_ids"], "segment_ids": batch["segment_ids"],
         "padding_mask": batch["input_mask"].astype(bool)}
    data = tf.data.Dataset.from_tensors((x, batch["label_ids"])).repeat()

    def run():
        model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False)
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="small,base")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4,
                        help="steps per timed call (ours: iterations_per_loop; keras-hub: "
                             "steps_per_execution)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jit_compile", action="store_true")
    parser.add_argument("--skip_keras_hub", action="store_true")
    args = parser.parse_args()

    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
          f"{os.cpu_count()} CPU(s); batch {args.batch_size}, seq {args.seq_length}, "
          f"{args.steps} steps/call, {args.rounds} rounds, jit_compile={args.jit_compile}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    batch = synthetic_batch(args.batch_size, args.seq_length, VOCAB)
    ours_f32 = {}
    for size in args.sizes.split(","):
        config = BertConfig(vocab_size=VOCAB, **SIZES[size])
        flops = train_flops_per_sequence(config, args.seq_length, 0)
        for dtype in args.dtypes.split(","):
            keras.config.set_dtype_policy(POLICIES[dtype])
            runners = {"ours": build_ours(config, batch, args.steps, args.jit_compile)}
            if not args.skip_keras_hub:
                try:
                    runners["keras-hub"] = build_keras_hub(config, batch, args.steps,
                                                           args.jit_compile)
                    if dtype != "float32":  # may fail under mixed precision: try first
                        runners["keras-hub"]()
                except Exception as e:  # noqa: BLE001 -- report and go on without it
                    runners.pop("keras-hub", None)
                    print(f"{size:5s} {dtype:8s} keras-hub failed: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:160]}", flush=True)
            runners["matmul"] = build_matmul(tf.float32 if dtype == "float32" else tf.bfloat16)
            load_before = os.getloadavg()[0]
            cpu = {}
            times = time_rounds(runners, args.rounds, cpu)
            load_after = os.getloadavg()[0]
            keras.config.set_dtype_policy("float32")
            peak = 2 * MATMUL_N ** 3 * MATMUL_REPS / statistics.median(times.pop("matmul")) / 1e9
            print(f"{size:5s} {dtype:8s} matmul {MATMUL_N}^3 {peak:8.1f} GFLOP/s; load average "
                  f"{load_before:.2f} -> {load_after:.2f}", flush=True)
            results = {}
            for name, ts in times.items():
                eps = args.steps * args.batch_size / statistics.median(ts)
                results[name] = eps
                gflops = eps * flops / 1e9
                print(f"{size:5s} {dtype:8s} {name:9s} {eps:8.2f} examples/s "
                      f"{gflops:8.1f} GFLOP/s ({gflops / peak:.2f} of matmul), "
                      f"{statistics.median(cpu[name]) / args.steps:.2f} CPU s/step, "
                      f"rounds {' '.join(f'{t:.1f}' for t in ts)} s", flush=True)
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


if __name__ == "__main__":
    main()
