"""Benchmark: what exact resume costs (issue 24): the saved input position, restoring it,
and stopping on SIGTERM.

Measures, in one run:

* the training input's position (`checkpointing.input_position`: the `tf.data` iterator of
  `input_pipeline.pretraining_dataset`, static masks and dynamic masking) after 10 to
  `--max_position` global batches: its size on disk, the time to save it, and the time
  to resume (a new pipeline, the position restored, the first batch out), against what a
  resume without it would cost to reach the same batch (reading the consumed batches
  again: the "skip" column);
* the share of that position in a pretraining checkpoint: BERT-base and BERT-small
  weights + AdamWeightDecay slots (float32) against the input position;
* stopping on SIGTERM: `TrainingLoop.train` of BERT-small in one compiled call of many
  steps, SIGTERM sent to this process: seconds from the signal to the exit with the
  checkpoint of the current step saved (one step + one save), and that save alone.

Synthetic records as bench_dynamic_masking.py (4096 pairs, 4 files, `--seq_length`).

    .venv/bin/python bench/bench_resume.py
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench_dynamic_masking import masking_vocab, write_records  # noqa: E402
from bench_pretraining import SIZES, VOCAB  # noqa: E402
from modeling import optimization  # noqa: E402
from modeling.config import BertConfig  # noqa: E402
from modeling.models import BertPretrainer  # noqa: E402
from training import checkpointing, dynamic_masking, input_pipeline, pretraining  # noqa: E402
from training.loop import TrainingLoop  # noqa: E402
from training.settings import LoopConfig  # noqa: E402


def files_size(prefix: str) -> int:
    """Bytes of a checkpoint's files."""
    return sum(os.path.getsize(p) for p in tf.io.gfile.glob(prefix + "*"))


def position_costs(build, positions, directory):
    """[(position, bytes, save s, resume s, skip s)] for one pipeline."""
    rows = []
    for position in positions:
        iterator = iter(build())
        start = time.perf_counter()
        for _ in range(position):
            next(iterator)
        skip = time.perf_counter() - start  # what re-reading up to here costs
        state = checkpointing.input_position(iterator, {"bench": position})
        start = time.perf_counter()
        prefix = tf.train.Checkpoint(input=state).write(
            os.path.join(directory, f"p{position}-{len(rows)}"))
        save = time.perf_counter() - start
        expected = next(iterator)
        start = time.perf_counter()
        resumed = iter(build())
        restored = checkpointing.input_position(resumed, {"bench": position})
        tf.train.Checkpoint(input=restored).read(prefix).assert_consumed()
        first = next(resumed)
        resume = time.perf_counter() - start
        for key in expected:  # the batch the uninterrupted pipeline gives next
            np.testing.assert_array_equal(expected[key].numpy(), first[key].numpy())
        rows.append((position, files_size(prefix), save, resume, skip))
    return rows


def parameter_count(size: str, seq: int) -> int:
    """Trainable parameters of BertPretrainer at a bench_pretraining size."""
    model = BertPretrainer(BertConfig(vocab_size=VOCAB, **SIZES[size]))
    pretraining.build_pretraining_model(model, seq, 20)
    return sum(int(np.prod(v.shape)) for v in model.trainable_variables)


def stop_latency(pattern, seq, preds, batch, directory):
    """(signal -> exit s, the checkpoint save s, steps done, mean step s) of BERT-small."""
    config = BertConfig(vocab_size=VOCAB, **SIZES["small"])
    model = BertPretrainer(config)
    pretraining.build_pretraining_model(model, seq, preds)
    opt = optimization.create_optimizer(optimization.OptimizerConfig(
        learning_rate=1e-4, num_train_steps=10**6, num_warmup_steps=100))
    cfg = LoopConfig(output_dir=directory, num_train_steps=10**6, train_batch_size=batch,
                          iterations_per_loop=10**6, save_checkpoints_steps=10**6,
                          log_steps=10**6)
    trainer = TrainingLoop(tf.distribute.get_strategy(), model, opt, cfg,
                           pretraining.PretrainingTask())
    trainer.restore_or_initialize()
    input_config = input_pipeline.PretrainingInputConfig((pattern,), seq, preds, seed=1)
    saves = []
    original = trainer.saver.save

    def timed_save(step):
        start = time.perf_counter()
        path = original(step)
        saves.append(time.perf_counter() - start)
        return path
    trainer.saver.save = timed_save
    sent = {}

    def send():
        time.sleep(20.0)  # tracing, then training
        sent["at"], sent["step"] = time.perf_counter(), int(trainer.global_step.numpy())
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=send, daemon=True).start()
    start = time.perf_counter()
    try:
        trainer.train(lambda ctx: input_pipeline.pretraining_dataset(
            input_config, batch_size=ctx.get_per_replica_batch_size(batch), is_training=True))
    except SystemExit:
        pass
    end = time.perf_counter()
    steps = int(trainer.global_step.numpy())
    per_step = (sent["at"] - start) / max(sent["step"], 1)  # tracing included: an upper bound
    return end - sent["at"], saves[-1], steps, per_step


def main():
    """Runs the measurements and prints the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch_size", type=int, default=32, help="global batch")
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20)
    parser.add_argument("--max_position", type=int, default=4000)
    args = parser.parse_args()
    seq, preds, batch = args.seq_length, args.predictions, args.batch_size
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPU(s); global batch {batch}, "
          f"seq {seq}, P {preds}; shuffle buffer "
          f"{input_pipeline.PretrainingInputConfig(()).shuffle_buffer} records")
    directory = tempfile.mkdtemp()
    static = write_records(directory, "masked", seq, preds)
    unmasked = write_records(directory, "unmasked", seq, preds)
    masking = dynamic_masking.DynamicMasking(max_predictions_per_seq=preds,
                                             vocab=masking_vocab(), seed=1)
    pipelines = {
        "static masks": lambda: input_pipeline.pretraining_dataset(
            input_pipeline.PretrainingInputConfig((static,), seq, preds, seed=1),
            batch_size=batch, is_training=True),
        "dynamic masking": lambda: input_pipeline.pretraining_dataset(
            input_pipeline.PretrainingInputConfig((unmasked,), seq, preds, seed=1,
                                                  masking=masking),
            batch_size=batch, is_training=True),
    }
    positions = [p for p in (10, 100, 1000, args.max_position) if p <= args.max_position]
    print("\n| input | position (global batches) | input state | save | resume (restore + "
          "first batch) | re-reading to the same batch |")
    print("|---|---|---|---|---|---|")
    state_bytes = 0
    for name, build in pipelines.items():
        for position, size, save, resume, skip in position_costs(build, positions, directory):
            state_bytes = max(state_bytes, size)
            print(f"| {name} | {position} | {size / 1e6:.2f} MB | {save * 1e3:.0f} ms | "
                  f"{resume * 1e3:.0f} ms | {skip:.2f} s |", flush=True)

    print("\n| model | weights + AdamWeightDecay slots (float32) | input state (largest above) "
          "| share |")
    print("|---|---|---|---|")
    for size in ("small", "base"):
        params = parameter_count(size, seq)
        model_bytes = 3 * 4 * params
        print(f"| BERT {size} ({params / 1e6:.1f}M parameters) | {model_bytes / 1e6:.0f} MB | "
              f"{state_bytes / 1e6:.2f} MB | {100 * state_bytes / model_bytes:.2f}% |",
              flush=True)

    latency, save, steps, per_step = stop_latency(static, seq, preds, 8,
                                                  os.path.join(directory, "stop"))
    print(f"\nSIGTERM during one compiled call of 10^6 steps (BERT-small, batch 8): "
          f"stopped after step {steps}; signal -> exit {latency:.2f} s, of which the "
          f"checkpoint save {save:.2f} s; a step takes at most {per_step:.2f} s here")


if __name__ == "__main__":
    main()
