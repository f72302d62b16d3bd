"""Length bucketing: fine-tuning, evaluation and prediction examples/s with and without buckets.

    .venv/bin/python bench/bench_bucketing.py --sizes=small,base --dtypes=float32,bfloat16

Real sentences: the demo's classification task (`data_prep.sample_corpus`: sentences of
the Python standard library's documentation, labelled by the kind of documentation they
come from), as single sentences ("single") and as pairs of consecutive sentences of the
same document ("pair", GLUE-pair-like lengths). Tokenized with a vocab learned the bench
way (`bench_squad.write_vocab`), `--max_seq_length=128`.

Both modes run exactly what `run_classifier.py` runs: `ClassificationFamily` records and
datasets, `trainer_setup.build_trainer` (model, `AdamWeightDecay`, the shared `TrainingLoop`), with
`bucket_boundaries` = the default buckets (16, 32, 64, 128) or () (padding to
max_seq_length, the original's way). Same initial weights in both modes (seeded), so the
dev accuracy of the two is compared too (it must be equal: the predictions are).

Each (task, size, dtype) runs in its own process (BERT-base models and their traces are
not freed within one). Timing: train = `--train_calls` calls of `--steps` steps (`TrainingLoop.run_train_steps`,
after one warm-up call that traces); eval = a full pass over dev (`predict_outputs`,
after a warm-up pass), the fastest of `--eval_repeats`; predict = the same over the
training split, the fastest of `--predict_repeats`. Wall and process CPU time; the
machine is shared, so read the ratios (bucketed / padded in the same run).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench_squad import SIZES, Timer, write_vocab  # noqa: E402
from data_prep import sample_corpus  # noqa: E402
from modeling.config import BertConfig  # noqa: E402
from tasks.classification import processors  # noqa: E402
from tasks.classification.task import ClassificationFamily, ClassificationSettings  # noqa: E402
from training import distribution, finetuning, input_pipeline, trainer_setup  # noqa: E402
from training.flags import default_bucket_boundaries  # noqa: E402
from training.settings import LoopConfig  # noqa: E402

POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16"}


def write_tasks(root: str, max_mb: float, rows_per_class: int = 400) -> dict:
    """{"single": data dir, "pair": data dir, "vocab": path, "root": root}: real-text TSVs."""
    single = os.path.join(root, "single")
    sample_corpus.write_classification_data(single, max_mb=max_mb,
                                            rows_per_class=rows_per_class)
    pair = os.path.join(root, "pair")
    os.makedirs(pair, exist_ok=True)
    sentences = []
    for split in ("train", "dev", "test"):
        with open(os.path.join(single, f"{split}.tsv"), encoding="utf-8") as f:
            rows = [line.rstrip("\n").split("\t") for line in f][1:]
        sentences += [r[0] for r in rows]
        with open(os.path.join(pair, f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("a\tb\tlabel\n")
            for (a, label), (b, _) in zip(rows, rows[1:] + rows[:1]):
                f.write(f"{a}\t{b}\t{label}\n")
    vocab = os.path.join(root, "vocab.txt")
    write_vocab(sentences, vocab, 8000)
    return {"single": single, "pair": pair, "vocab": vocab, "root": root}


def lengths_summary(family, split, buckets=()) -> str:
    """Length statistics of a split; with `buckets`, the ideal token ratio: max_seq_length
    over the mean bucket length, i.e. what removing the padding could save at most in
    linear (per-token) work."""
    lengths = []
    for batch in family.dataset(split, batch_size=64, is_training=False):
        real = (batch[input_pipeline.EXAMPLE_INDEX].numpy() >= 0) & (
            batch["is_real_example"].numpy() > 0)
        lengths += tf.reduce_sum(batch["input_mask"], -1).numpy()[real].tolist()
    lengths = np.array(lengths)
    return (f"{split.num_examples} examples, WordPieces mean {lengths.mean():.1f}, median "
            f"{np.median(lengths):.0f}, 90% {np.percentile(lengths, 90):.0f}, "
            f"max {lengths.max()}" + (f", ideal token ratio {ideal_ratio(lengths, buckets):.2f}x"
                                      if buckets else ""))


def ideal_ratio(lengths, buckets) -> float:
    """max(buckets) / mean length of the bucket each example falls in."""
    bounds = np.array(sorted(buckets))
    bucket_length = bounds[np.searchsorted(bounds, np.asarray(lengths))]
    return float(bounds[-1] / bucket_length.mean())


def best_pass(run_pass, num_examples, repeats):
    """(examples/s, CPU s per example) of the fastest of `repeats` passes, by wall and by
    CPU time separately: the 2 cores are a shared VM's, and a short pass is sometimes
    given one core's worth of time (bench/RESULTS.md); the fastest pass is the one least
    disturbed."""
    walls, cpus = [], []
    for _ in range(repeats):
        with Timer() as t:
            run_pass()
        walls.append(t.wall)
        cpus.append(t.cpu)
    return num_examples / min(walls), min(cpus) / num_examples


def measure(task_dir, vocab, config, args, buckets, output_dir):
    """{phase: (examples/s wall, CPU s per example)} and the dev accuracy."""
    pair = task_dir.endswith("pair")
    custom = processors.CustomDataConfig(text_a_column="a" if pair else "sentence",
                                 text_b_column="b" if pair else None, label_column="label")
    settings, _ = finetuning.settings_from(
        vocab_file=vocab, bert_config_file="unused", output_dir=output_dir,
        max_seq_length=args.max_seq_length, do_train=True, do_eval=True, do_predict=True,
        train_batch_size=args.batch_size, eval_batch_size=args.eval_batch_size,
        predict_batch_size=args.eval_batch_size, bucket_boundaries=buckets)
    family = ClassificationFamily(ClassificationSettings("custom", task_dir, custom=custom),
                                  args.max_seq_length)
    family.input_options = finetuning.InputOptions(args.max_seq_length, buckets)
    prepared = family.prepare(settings)
    strategy = distribution.get_strategy("")
    keras.utils.set_random_seed(1)
    _, trainer = trainer_setup.build_trainer(
        strategy, lambda: family.build_model(config), family.loop_task(),
        loop_config=LoopConfig.for_run(
            settings.loop, output_dir=tempfile.mkdtemp(), num_train_steps=10**6,
            num_warmup_steps=10, train_batch_size=args.batch_size,
            eval_batch_size=args.eval_batch_size),
        max_seq_length=args.max_seq_length)
    out = {}
    dev = prepared.eval_splits[0]
    # Evaluation before training (same initial weights in both modes: same predictions).
    results = family.evaluate(trainer, dev, step=0, run_dir=output_dir, write=False)  # warm up
    out["eval"] = best_pass(
        lambda: family.evaluate(trainer, dev, step=0, run_dir=output_dir, write=False),
        dev.num_examples, args.eval_repeats)
    # Prediction over the (larger) training split: the same lengths, more examples.
    train = prepared.train
    family.predict_outputs(trainer, train, args.eval_batch_size, output_keys=("logits",))
    out["predict"] = best_pass(
        lambda: family.predict_outputs(trainer, train, args.eval_batch_size,
                                       output_keys=("logits",)),
        train.num_examples, args.predict_repeats)
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: family.dataset(prepared.train, batch_size=args.batch_size,
                                   is_training=True, input_context=ctx, seed=1))
    iterator = iter(dataset)
    trainer.run_train_steps(iterator, args.steps)  # trace
    with Timer() as t:
        for _ in range(args.train_calls):
            trainer.run_train_steps(iterator, args.steps)
    n = args.train_calls * args.steps * args.batch_size
    out["train"] = (n / t.wall, t.cpu / n)
    return out, results.get("eval_accuracy"), family, dev


def run_config(args, data, task, size, dtype, buckets):
    """Both modes of one (task, size, dtype): prints the ratios."""
    layers, hidden, heads = SIZES[size]
    config = BertConfig(vocab_size=8000, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=4 * hidden)
    keras.config.set_dtype_policy(POLICIES[dtype])
    figures = {}
    for name, b in (("padded", ()), ("bucketed", buckets)):
        out_dir = os.path.join(data["root"], f"run_{task}")
        figures[name], accuracy, family, dev = measure(data[task], data["vocab"], config,
                                                       args, b, out_dir)
        figures[name + "_acc"] = accuracy
    if args.print_lengths:
        print(f"{task}: dev {lengths_summary(family, dev, buckets)}", flush=True)
    for phase in ("train", "eval", "predict"):
        padded, bucketed = figures["padded"][phase], figures["bucketed"][phase]
        print(f"{task:6s} {size:5s} {dtype:8s} {phase:7s} padded {padded[0]:8.1f} "
              f"ex/s, bucketed {bucketed[0]:8.1f} ex/s: {bucketed[0] / padded[0]:.2f}x "
              f"wall, {padded[1] / bucketed[1]:.2f}x CPU", flush=True)
    print(f"{task:6s} {size:5s} {dtype:8s} dev accuracy padded "
          f"{figures['padded_acc']:.4f} bucketed {figures['bucketed_acc']:.4f}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="small,base")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--tasks", default="single,pair")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--eval_batch_size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--train_calls", type=int, default=3)
    parser.add_argument("--eval_repeats", type=int, default=3,
                        help="evaluation passes; the fastest counts")
    parser.add_argument("--predict_repeats", type=int, default=3,
                        help="prediction passes; the fastest counts")
    parser.add_argument("--max_mb", type=float, default=3.0)
    parser.add_argument("--rows_per_class", type=int, default=1500)
    parser.add_argument("--data_root", default="", help="(internal) data already written")
    parser.add_argument("--config", default="", help="(internal) one task:size:dtype")
    parser.add_argument("--print_lengths", action="store_true", help="(internal)")
    args = parser.parse_args()
    buckets = default_bucket_boundaries(args.max_seq_length)
    if args.config:  # one configuration, in its own process (memory is returned after it)
        root = args.data_root
        data = {"root": root, "single": os.path.join(root, "single"),
                "pair": os.path.join(root, "pair"), "vocab": os.path.join(root, "vocab.txt")}
        run_config(args, data, *args.config.split(":"), buckets)
        return
    import subprocess

    root = tempfile.mkdtemp()
    write_tasks(root, args.max_mb, args.rows_per_class)
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPU(s), batch {args.batch_size} "
          f"(eval {args.eval_batch_size}), max_seq_length {args.max_seq_length}, buckets "
          f"{buckets}; load average {os.getloadavg()[0]:.2f}", flush=True)
    passed = [f"--{k}={v}" for k, v in vars(args).items()
              if k not in ("data_root", "config", "print_lengths", "sizes", "dtypes", "tasks")]
    for task in args.tasks.split(","):
        first = True
        for size in args.sizes.split(","):
            for dtype in args.dtypes.split(","):
                cmd = [sys.executable, os.path.abspath(__file__), f"--data_root={root}",
                       f"--config={task}:{size}:{dtype}"] + passed
                if first:
                    cmd.append("--print_lengths")
                first = False
                subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
