"""Long documents: test accuracy and examples/s of run_classifier.py's --long_document modes on a task only the whole text solves.

    .venv/bin/python bench/bench_long_documents.py --placement=end,anywhere \
        --pretrain_steps=1000 --learning_rate=3e-4 --epochs=10

Documents of `--words` words of real, non-repeating text (bench/corpus.py: consecutive
corpus sentences, each used once; train and test from disjoint text). The label's
evidence is one sentence naming a made-up marker word (class "a" or "b"), placed at the
end of the document ("end") or at a random sentence boundary past the first 120 words
("anywhere": past the first window up to --max_seq_length=128); nothing else in the text
depends on the label, so `truncate` (first window only) should sit at chance.

No pretrained checkpoint is on this machine, and users fine-tune a pretrained one, so the
small BERT (`--layers` x `--hidden`) is first pretrained (`--pretrain_steps`, 0: from
scratch) by the repository's own create_pretraining_data and run_pretraining, in this
process, on `--pretrain_mb` of corpus text the task never reads (`pretrain`); every mode
is then fine-tuned from that checkpoint by `run_classifier.run` exactly as the CLI runs
it (the original's AdamWeightDecay, warmup 10 %, linear decay). Accuracy is on the
held-out test set (dev = test here: the run's eval), examples/s of the eval-only rerun
(checkpoint restored, records cached) over the test documents. `--print_loss`: each
run's training loss curve; `--speed`: what padding windows cost a windows model.
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
MODES = (("truncate", {}), ("head_tail", {}),
         ("windows", {"window_pooling": "mean"}), ("windows", {"window_pooling": "max"}),
         ("windows", {"window_pooling": "attention"}))


def documents(lines, words: int, count: int, placement: str, skip_words: int, rng):
    """`count` (text, label) of about `words` words from `lines` (consumed)."""
    out = []
    for _ in range(count):
        sentences, n = [], 0
        while n < words:
            line = lines.pop()
            sentences.append(line)
            n += len(line.split())
        label = rng.choice("ab")
        if placement == "end":
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
        vocab = os.path.join(tempfile.mkdtemp(prefix="bench_long_"), "vocab.txt")
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
def loss_curve():
    """Collects the training loop's progress lines' (step, loss) ("step N/M loss X ...")
    while the block runs."""
    from absl import logging

    curve = []

    class Losses(py_logging.Handler):
        def emit(self, record):
            words = record.getMessage().split()
            if len(words) > 3 and words[0] == "step" and words[2] == "loss":
                curve.append((int(words[1].split("/")[0]), float(words[3])))

    handler, level = Losses(), logging.get_verbosity()
    logging.get_absl_logger().addHandler(handler)
    logging.set_verbosity(logging.INFO)
    try:
        yield curve
    finally:
        logging.get_absl_logger().removeHandler(handler)
        logging.set_verbosity(level)


def format_curve(curve):
    return ", ".join(f"{step} {loss:.3f}" for step, loss in curve)


def pretrain(lines, work, vocab, config, args):
    """The checkpoint every mode fine-tunes (`init_checkpoint`): the bench's BERT pretrained
    (masked LM + next sentence) by the repository's own tools, in this process, on
    `args.pretrain_mb` of corpus text the task never reads (`lines`: what is left once
    every document is made). Prints the training loss curve and the held-out eval."""
    from data_prep import create_pretraining_data as cpd
    from data_prep.pretraining_data.config import PretrainingConfig
    from training import pretraining
    from training.execution import RuntimeConfig
    from training.settings import LoopConfig

    text, size, target = [], 0, args.pretrain_mb * 1e6
    while size < target:  # documents of 30 sentences, the original's input format
        document = [lines.pop(0) for _ in range(30)]
        text.append("\n".join(document) + "\n\n")
        size += sum(len(s.encode("utf-8")) + 1 for s in document)
    held_out = max(1, len(text) // 20)
    seq = args.max_seq_length
    predictions = -(-seq * 15 // 100)
    records = {}
    for split, documents_ in (("train", text[held_out:]), ("eval", text[:held_out])):
        source = os.path.join(work, f"pretrain_{split}.txt")
        with open(source, "w", encoding="utf-8") as f:
            f.writelines(documents_)
        records[split] = os.path.join(work, f"pretrain_{split}.tfrecord")
        summary = cpd.generate(
            PretrainingConfig(max_seq_length=seq, max_predictions_per_seq=predictions,
                              dupe_factor=args.pretrain_dupe_factor),
            [source], [records[split]], vocab_file=vocab, do_lower_case=True, seed=12345,
            num_workers=1, gzip=False, chunk_bytes=0, shuffle_buffer_size=10000,
            progress_seconds=10**6, summary_path=records[split] + ".summary.json")
        print(f"pretraining {split} records: {summary.get('instances', summary)} instances "
              f"from {sum(len(d) for d in documents_) / 1e6:.2f} MB", flush=True)

    out = os.path.join(work, "pretrained")
    steps, batch = args.pretrain_steps, args.pretrain_batch
    start = time.perf_counter()
    with loss_curve() as curve:
        results = pretraining.run(pretraining.PretrainingRun(
            bert_config_file=config, input_patterns=(records["train"],), output_dir=out,
            init_checkpoint=None, max_seq_length=seq, max_predictions_per_seq=predictions,
            do_train=True, do_eval=False, train_batch_size=batch, eval_batch_size=batch,
            input_compression="auto", runtime=RuntimeConfig("one_device", seed=1),
            loop=LoopConfig(output_dir=out, num_train_steps=steps,
                            num_warmup_steps=steps // 10, train_batch_size=batch,
                            eval_batch_size=batch, iterations_per_loop=50,
                            save_checkpoints_steps=steps, log_steps=max(50, steps // 10),
                            learning_rate=args.pretrain_learning_rate)))
        results = pretraining.run(pretraining.PretrainingRun(
            bert_config_file=config, input_patterns=(records["eval"],), output_dir=out,
            init_checkpoint=None, max_seq_length=seq, max_predictions_per_seq=predictions,
            do_train=False, do_eval=True, train_batch_size=batch, eval_batch_size=batch,
            input_compression="auto", runtime=RuntimeConfig("one_device", seed=1),
            loop=LoopConfig(output_dir=out, num_train_steps=steps, train_batch_size=batch,
                            num_warmup_steps=0, eval_batch_size=batch, max_eval_steps=50,
                            learning_rate=args.pretrain_learning_rate)))
    print(f"pretraining: {steps} steps of {batch} x {seq} in {time.perf_counter() - start:.0f} s; "
          f"training loss (MLM + NSP) by step: "
          + format_curve(curve), flush=True)
    print("pretraining held-out eval: " + ", ".join(
        f"{k} {float(v):.3f}" for k, v in sorted(results.items())), flush=True)
    return out


def write_split(path, rows):
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows(rows)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--placement", default="end,anywhere")
    parser.add_argument("--words", type=int, default=1000)
    parser.add_argument("--train", type=int, default=512)
    parser.add_argument("--test", type=int, default=128)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--doc_stride", type=int, default=126)
    parser.add_argument("--max_windows", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--epochs", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=3e-4)
    parser.add_argument("--modes", default="")
    parser.add_argument("--pretrain_steps", type=int, default=1000,
                        help="pretrain the BERT this many steps on corpus text the task "
                             "never reads, then fine-tune every mode from it (0: from "
                             "scratch)")
    parser.add_argument("--print_loss", action="store_true",
                        help="print each fine-tuning run's training loss curve")
    parser.add_argument("--init_checkpoint", default="",
                        help="fine-tune from this checkpoint (e.g. an earlier run's "
                             "pretrained/ directory, same flags) instead of pretraining")
    parser.add_argument("--pretrain_mb", type=float, default=2.0)
    parser.add_argument("--pretrain_dupe_factor", type=int, default=2)
    parser.add_argument("--pretrain_batch", type=int, default=32)
    parser.add_argument("--pretrain_learning_rate", type=float, default=3e-4)
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
    if args.memory_child:
        memory_child(args)
        return
    if args.memory:
        print("| documents | windows | windows at once | peak RSS MB | RSS before the "
              "step MB | step s | step CPU s |\n|---:|---:|---:|---:|---:|---:|---:|", flush=True)
        memory(args)
        return
    if args.speed:
        windows, speed = model_speed()
        print(f"windows model predict, documents of 1-8 windows (mean {windows:.2f}) in "
              f"records of 8, 2 x 128, seq 128, batch 8: {speed:.1f} documents/s")
        return

    import json

    import run_classifier as rc
    from tasks.classification import processors
    from training.execution import RuntimeConfig

    work = tempfile.mkdtemp(prefix="bench_long_")
    vocab = os.path.join(work, "vocab.txt")
    bench_corpus.write_vocab(vocab)
    with open(vocab, encoding="utf-8") as f:
        vocab_size = sum(1 for _ in f)
    config = os.path.join(work, "bert_config.json")
    with open(config, "w") as f:
        json.dump({"vocab_size": vocab_size, "hidden_size": args.hidden,
                   "num_hidden_layers": args.layers, "num_attention_heads": 2,
                   "intermediate_size": 4 * args.hidden, "hidden_act": "gelu",
                   "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                   "max_position_embeddings": 512, "type_vocab_size": 2,
                   "initializer_range": 0.02}, f)
    lines = bench_corpus.corpus_lines(16.0)[::-1]   # popped from the end: corpus order
    custom = processors.CustomDataConfig(text_a_column="text", label_column="label",
                                         delimiter="comma", labels="a,b")
    modes = [m for m in MODES if not args.modes
             or f"{m[0]}{'-' + m[1]['window_pooling'] if m[1] else ''}" in args.modes.split(",")]
    splits = {}
    for placement in args.placement.split(","):
        rng = random.Random(0)
        data = os.path.join(work, placement)
        os.makedirs(data)
        train = documents(lines, args.words, args.train, placement, 120, rng)
        write_split(os.path.join(data, "train.csv"), train)
        test = documents(lines, args.words, args.test, placement, 120, rng)
        write_split(os.path.join(data, "dev.csv"), test)
        splits[placement] = data
    init_checkpoint = args.init_checkpoint or (
        pretrain(lines, work, vocab, config, args) if args.pretrain_steps else None)
    print(f"| placement | mode | test accuracy (n = {args.test}, ± 1 SE) | eval documents/s "
          "| train s |")
    print("|---|---|---:|---:|---:|")
    for placement, data in splits.items():
        for mode, extra in modes:
            name = mode + ("-" + extra["window_pooling"] if extra else "")
            out = os.path.join(work, f"out_{placement}_{name}")
            values = dict(task_name="custom", custom=custom, data_dir=data, vocab_file=vocab,
                          bert_config_file=config, output_dir=out,
                          max_seq_length=args.max_seq_length, do_train=True, do_eval=True,
                          train_batch_size=args.batch, eval_batch_size=args.batch,
                          learning_rate=args.learning_rate, num_train_epochs=args.epochs,
                          save_checkpoints_steps=100000, iterations_per_loop=50,
                          log_steps=50, seeds=(1,), init_checkpoint=init_checkpoint,
                          runtime=RuntimeConfig("one_device", seed=1),
                          long_document=mode, **extra)
            if mode == "windows":
                values.update(doc_stride=args.doc_stride,
                              max_windows_per_document=args.max_windows)
            start = time.perf_counter()
            with loss_curve() as curve:
                rc.run(rc.COMMAND.settings(**values))
            train_s = time.perf_counter() - start
            if args.print_loss:
                print(f"{placement} {name} training loss by step: {format_curve(curve)}",
                      flush=True)
            start = time.perf_counter()
            rc.run(rc.COMMAND.settings(**{**values, "do_train": False}))
            eval_s = time.perf_counter() - start
            with open(os.path.join(out, "eval_results.txt")) as f:
                results = dict(line.strip().split(" = ") for line in f)
            accuracy = float(results["eval_accuracy"])
            error = (accuracy * (1 - accuracy) / args.test) ** 0.5
            print(f"| {placement} | {name} | {accuracy:.3f} ± {error:.3f} | "
                  f"{args.test / eval_s:.1f} | {train_s:.0f} |", flush=True)


if __name__ == "__main__":
    main()
