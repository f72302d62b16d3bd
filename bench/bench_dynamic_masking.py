"""Benchmark: the input pipeline with masking on the fly against a training step's appetite.

Measures, in one run, examples/s of

* `training.input_pipeline.pretraining_dataset` on masked records (the original's static
  kind) and on unmasked records with dynamic masking (`training/dynamic_masking.py`),
  per-token and whole-word, each alone (nothing else running), and
* the pretraining step of our training loop (bench_pretraining.py's `build_ours`: the real
  loop, MLM + NSP heads, AdamWeightDecay) on a fixed batch, for BERT sizes,

and prints each pipeline's examples/s divided by the fastest step's (how many times
faster the pipeline produces examples than the step consumes them). Records
(`--records=corpus`, the default): written by `data_prep.create_pretraining_data` (4
shards, `--dupe_factor=1`; masked, and unmasked with `--dynamic_masking`) from
`--corpus_mb` of bench/corpus.py's text, no line repeated, with its ~21k vocab (real
`##` pieces for whole-word masking). `--records=synthetic`: 4096 random pairs of
`--seq_length` tokens (every other one padded from 3/4 of the length), a 30522-entry
vocab whose top 20% ids are `##` pieces. The training step is timed at BERT's vocab size
(30522) either way.

    .venv/bin/python bench/bench_dynamic_masking.py --sizes=small,base
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import tensorflow as tf  # noqa: E402

import corpus as bench_corpus  # noqa: E402
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


def corpus_records(directory, seq, preds, corpus_mb):
    """Masked and unmasked records of the corpus, as create_pretraining_data writes them;
    returns ({kind: file pattern}, vocab file)."""
    text, vocab = os.path.join(directory, "corpus.txt"), os.path.join(directory, "vocab.txt")
    bench_corpus.write_corpus(text, corpus_mb)
    bench_corpus.write_vocab(vocab)
    patterns = {}
    for kind, extra in (("masked", [f"--max_predictions_per_seq={preds}"]),
                        ("unmasked", ["--dynamic_masking"])):
        out = os.path.join(directory, f"{kind}.tfrecord")
        subprocess.run([sys.executable, "-m", "data_prep.create_pretraining_data",
                        f"--input_file={text}", f"--output_file={out}",
                        f"--vocab_file={vocab}", f"--max_seq_length={seq}", "--dupe_factor=1",
                        "--num_output_shards=4", *extra], cwd=ROOT, check=True,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        patterns[kind] = out + "-*-of-*"
        assert len(glob.glob(patterns[kind])) == 4, patterns[kind]
    return patterns, vocab


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
    parser.add_argument("--pipeline_rounds", type=int, default=3,
                        help="interleaved rounds of the pipelines (3 s each); medians")
    parser.add_argument("--records", default="corpus", choices=("corpus", "synthetic"))
    parser.add_argument("--corpus_mb", type=float, default=2.0,
                        help="--records=corpus: MB of bench/corpus.py text")
    args = parser.parse_args()
    seq, preds, batch = args.seq_length, args.predictions, args.batch_size
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPU(s); batch {batch}, seq {seq}, "
          f"P {preds}")

    work = tempfile.TemporaryDirectory(prefix="bench_dynamic_masking_")  # removed at exit
    directory = work.name
    load_before = os.getloadavg()[0]
    if args.records == "corpus":
        patterns, vocab_file = corpus_records(directory, seq, preds, args.corpus_mb)
        settings = dict(max_predictions_per_seq=preds, seed=1)
        maskings = {whole_word: dynamic_masking.DynamicMasking.from_vocab_file(
            vocab_file, do_whole_word_mask=whole_word, **settings)
            for whole_word in (False, True)}
    else:
        patterns = {kind: write_records(directory, kind, seq, preds)
                    for kind in ("masked", "unmasked")}
        maskings = {whole_word: dynamic_masking.DynamicMasking(
            max_predictions_per_seq=preds, vocab=masking_vocab(),
            do_whole_word_mask=whole_word, seed=1) for whole_word in (False, True)}
    records = sum(1 for _ in tf.data.TFRecordDataset(glob.glob(patterns["unmasked"])))
    print(f"records: {args.records}, {records} pairs", flush=True)
    pipelines = {"static (masked records)": (patterns["masked"], None)}
    for whole_word, masking in maskings.items():
        name = f"dynamic masking, {'whole-word' if whole_word else 'per-token'}"
        pipelines[name] = (patterns["unmasked"], masking)
    # Rounds interleave the pipelines (a burst of other load hits them alike); medians.
    samples = {name: [] for name in pipelines}
    for _ in range(args.pipeline_rounds):
        for name, (pattern, masking) in pipelines.items():
            samples[name].append(examples_per_second(pattern, seq, preds, batch, masking,
                                                     seconds=3.0))
            print(f"input pipeline, {name}: {samples[name][-1]:.0f} examples/s", flush=True)
    throughput = {name: statistics.median(values) for name, values in samples.items()}

    data = synthetic_batch(batch, seq, preds, VOCAB)
    steps = {}
    for size in args.sizes.split(","):
        config = BertConfig(vocab_size=VOCAB, **SIZES[size])
        times = time_rounds({size: build_ours(config, data, args.steps, False)}, args.rounds)
        steps[size] = args.steps * batch / statistics.median(times[size])
        print(f"training step, BERT {size} float32: {steps[size]:.2f} examples/s", flush=True)

    fastest = max(steps.values())
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average (1 min) "
          f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after.")
    print("\n| input pipeline | examples/s, median (range) | x the fastest step's examples/s |")
    print("|---|---|---|")
    for name, eps in throughput.items():
        print(f"| {name} | {eps:.0f} ({min(samples[name]):.0f}-{max(samples[name]):.0f}) "
              f"| {eps / fastest:.0f}x |")
    print("\n| training step (float32, one CPU process) | examples/s |")
    print("|---|---|")
    for size, eps in steps.items():
        print(f"| BERT {size} | {eps:.2f} |")


if __name__ == "__main__":
    main()
