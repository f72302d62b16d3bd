"""Benchmark: the input pipeline with masking on the fly against a training step's appetite.

Measures, in one run, examples/s of

* `training.input_pipeline.pretraining_dataset` on masked records (the original's static
  kind) and on unmasked records with dynamic masking (`training/dynamic_masking.py`),
  per-token and whole-word, each alone (nothing else running), and
* the pretraining step of our training loop (bench_pretraining.py's `build_ours`: the real
  loop, MLM + NSP heads, AdamWeightDecay) on a fixed batch, for BERT sizes,

and prints each pipeline's examples/s divided by the fastest step's (how many times
faster the pipeline produces examples than the step consumes them). Synthetic records:
4096 pairs of `--seq_length` tokens (every other one padded from 3/4 of the length), a
30522-entry vocab whose top 20% ids are `##` pieces (words of ~1.3 pieces for
whole-word masking).

    .venv/bin/python bench/bench_dynamic_masking.py --sizes=small,base
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import tensorflow as tf  # noqa: E402

from bench_pretraining import SIZES, VOCAB, build_ours, synthetic_batch, time_rounds  # noqa: E402
from data_prep import features  # noqa: E402
from data_prep.pretraining_data.masking import MaskingVocab  # noqa: E402
from modeling.config import BertConfig  # noqa: E402
from training import dynamic_masking, input_pipeline  # noqa: E402

CLS, SEP, MASK = 101, 102, 103


def masking_vocab():
    pieces = bytes(int(i >= VOCAB * 0.8) for i in range(VOCAB))
    return MaskingVocab(cls_id=CLS, sep_id=SEP, mask_id=MASK,
                        replacement_ids=tuple(range(VOCAB)),
                        is_continuation=pieces)


def write_records(directory, kind, seq, preds, records=4096):
    """4 TFRecord files of synthetic pairs ([CLS] A [SEP] B [SEP]) of one record kind."""
    schema = features.pretraining_schema(dynamic_masking=kind == "unmasked")
    encoder = schema.encoder(max_seq_length=seq, max_predictions_per_seq=preds)
    data = synthetic_batch(records, seq, preds, VOCAB, seed=3)
    ids, mask = data["input_ids"], data["input_mask"]
    ids[:, 0], ids[:, seq // 2 - 1] = CLS, SEP
    last = mask.sum(axis=1) - 1
    ids[range(records), last] = SEP
    ids[mask == 0] = 0
    data["segment_ids"] = data["segment_ids"] * mask
    for shard in range(4):
        path = os.path.join(directory, f"{kind}-{shard}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for r in range(shard, records, 4):
                writer.write(encoder.encode({k: v[r].tolist() for k, v in data.items()}))
    return os.path.join(directory, f"{kind}-*")


def examples_per_second(pattern, seq, preds, batch, masking=None, seconds=5.0):
    config = input_pipeline.PretrainingInputConfig((pattern,), seq, preds, masking=masking,
                                                   seed=1)
    iterator = iter(input_pipeline.pretraining_dataset(config, batch_size=batch,
                                                       is_training=True))
    for _ in range(20):
        next(iterator)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        next(iterator)
        count += batch
    return count / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="small,base")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20)
    parser.add_argument("--steps", type=int, default=2, help="steps per timed call")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    seq, preds, batch = args.seq_length, args.predictions, args.batch_size
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPU(s); batch {batch}, seq {seq}, "
          f"P {preds}")

    directory = tempfile.mkdtemp()
    vocab = masking_vocab()
    pipelines = {
        "static (masked records)": (write_records(directory, "masked", seq, preds), None),
    }
    unmasked = write_records(directory, "unmasked", seq, preds)
    for whole_word in (False, True):
        masking = dynamic_masking.DynamicMasking(
            max_predictions_per_seq=preds, vocab=vocab, do_whole_word_mask=whole_word, seed=1)
        name = f"dynamic masking, {'whole-word' if whole_word else 'per-token'}"
        pipelines[name] = (unmasked, masking)
    throughput = {}
    for name, (pattern, masking) in pipelines.items():
        throughput[name] = examples_per_second(pattern, seq, preds, batch, masking)
        print(f"input pipeline, {name}: {throughput[name]:.0f} examples/s", flush=True)

    data = synthetic_batch(batch, seq, preds, VOCAB)
    steps = {}
    for size in args.sizes.split(","):
        config = BertConfig(vocab_size=VOCAB, **SIZES[size])
        times = time_rounds({size: build_ours(config, data, args.steps, False)}, args.rounds)
        steps[size] = args.steps * batch / statistics.median(times[size])
        print(f"training step, BERT {size} float32: {steps[size]:.2f} examples/s", flush=True)

    fastest = max(steps.values())
    print("\n| input pipeline | examples/s | x the fastest step's examples/s |")
    print("|---|---|---|")
    for name, eps in throughput.items():
        print(f"| {name} | {eps:.0f} | {eps / fastest:.0f}x |")
    print("\n| training step (float32, one CPU process) | examples/s |")
    print("|---|---|")
    for size, eps in steps.items():
        print(f"| BERT {size} | {eps:.2f} |")


if __name__ == "__main__":
    main()
