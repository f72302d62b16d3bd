"""Serving throughput: the exported classifier on raw strings vs the Python path.

    .venv/bin/python bench/bench_serving.py --num_texts=512 --batch_size=32 --rounds=5

A BERT-small-ish classifier (4 layers, hidden 256, 4 heads, intermediate 1024, seq 128,
random weights, 2 labels) and a vocab built from the sample corpus's words (special tokens
+ every character + the most frequent words) are exported with
``modeling.export.export_saved_model`` and reloaded with ``tf.saved_model.load``. The texts
are real sentences of the sample corpus (``data_prep.sample_corpus``). Each round times, on
the same texts in batches of ``--batch_size``:

* ``saved_model``: ``serving_default(text=...)``: in-graph tokenization + model, one call;
* ``saved_model preprocess``: the in-graph tokenization and packing alone;
* ``saved_model serving_tokenized``: the model alone, on precomputed ids;
* ``python``: ``FullTokenizer`` (the exact fast path) + ``python_features`` + the Keras
  model wrapped in one ``tf.function`` (the fair Python path: the model is compiled too);
* ``python tokenize``: FullTokenizer + feature packing alone.

Paths alternate within each round (the machine is shared); the median over rounds is
reported as examples/s. FullTokenizer's word caches are warm after the first round, as in
a long-running server.
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

from data_prep import sample_corpus, tokenization  # noqa: E402
from modeling import export  # noqa: E402
from modeling.config import BertConfig  # noqa: E402
from modeling.models import BertClassifier  # noqa: E402
from tasks.classification.export import python_features  # noqa: E402  (registers it)
from bench_squad import write_vocab  # noqa: E402  (one vocab recipe for the benches)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_texts", type=int, default=512)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--sentences_per_text", type=int, default=1,
                        help="consecutive corpus sentences joined into one text")
    args = parser.parse_args()

    sentences = [s for s, *_ in sample_corpus.labelled_sentences(max_documents=2000)]
    long_enough = [s for s in sentences if len(s) > 20]
    k = args.sentences_per_text
    texts = [" ".join(long_enough[i:i + k]) for i in range(0, len(long_enough), k)]
    texts = texts[:args.num_texts]
    work = tempfile.mkdtemp(prefix="bench_serving_")
    vocab_file = os.path.join(work, "vocab.txt")
    vocab_size = write_vocab(sentences, vocab_file, args.vocab_size)
    config = BertConfig(vocab_size=vocab_size, hidden_size=args.hidden,
                        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                        intermediate_size=4 * args.hidden, max_position_embeddings=512)
    keras.utils.set_random_seed(0)
    model = BertClassifier(config, 2)
    serving = export.serving_config("classifier", vocab_file, True, args.seq_length,
                                   labels=("a", "b"))
    export_dir = os.path.join(work, "export")
    export.export_saved_model(model, serving, export_dir)
    loaded = tf.saved_model.load(export_dir)
    serve = loaded.signatures["serving_default"]
    preprocess = loaded.signatures["preprocess"]
    tokenized = loaded.signatures["serving_tokenized"]
    tokenizer = tokenization.FullTokenizer(vocab_file, do_lower_case=True)
    forward = tf.function(lambda f: tf.nn.softmax(model(f, training=False)["logits"]))

    batches = [texts[i:i + args.batch_size] for i in range(0, len(texts), args.batch_size)]
    string_batches = [tf.constant(b) for b in batches]
    id_batches = [{k: tf.constant(v) for k, v in python_features(
        tokenizer, b, None, args.seq_length).items()} for b in batches]
    tokens = sum(int(f["input_mask"].numpy().sum()) for f in id_batches)

    def run_saved():
        for b in string_batches:
            serve(text=b)["probabilities"].numpy()

    def run_preprocess():
        for b in string_batches:
            preprocess(text=b)["input_ids"].numpy()

    def run_tokenized():
        for f in id_batches:
            tokenized(**f)["probabilities"].numpy()

    def run_python():
        for b in batches:
            f = python_features(tokenizer, b, None, args.seq_length)
            forward({k: tf.constant(v) for k, v in f.items()}).numpy()

    def run_python_tokenize():
        for b in batches:
            python_features(tokenizer, b, None, args.seq_length)

    def run_python_tokenize_cold():
        cold = tokenization.FullTokenizer(vocab_file, do_lower_case=True)
        for b in batches:
            python_features(cold, b, None, args.seq_length)

    paths = {"saved_model (strings -> probabilities)": run_saved,
             "python (FullTokenizer + tf.function model)": run_python,
             "saved_model preprocess only": run_preprocess,
             "python tokenize + pack only (warm word caches)": run_python_tokenize,
             "python tokenize + pack only (cold caches)": run_python_tokenize_cold,
             "saved_model serving_tokenized (model only)": run_tokenized}
    # Agreement check on the benchmark texts (same ids, same probabilities).
    got = np.concatenate([serve(text=b)["probabilities"].numpy() for b in string_batches])
    want = np.concatenate([forward(f).numpy() for f in id_batches])
    ids_equal = all(np.array_equal(preprocess(text=b)["input_ids"].numpy(), f["input_ids"])
                    for b, f in zip(string_batches, id_batches))
    for fn in paths.values():  # warm-up: tracing, caches
        fn()
    times = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, fn in paths.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)

    print(f"config: {args.layers} layers, hidden {args.hidden}, seq {args.seq_length}, vocab "
          f"{vocab_size}; {len(texts)} texts ({tokens / len(texts):.1f} tokens each with "
          f"[CLS]/[SEP] after truncation), batch {args.batch_size}, {args.rounds} rounds, "
          f"{os.cpu_count()} CPUs")
    print(f"agreement: ids equal={ids_equal}, max |p_saved - p_python|="
          f"{np.abs(got - want).max():.2e}")
    print("| path | examples/s (median) | min..max |")
    print("|---|---|---|")
    for name, t in times.items():
        rates = [len(texts) / x for x in t]
        print(f"| {name} | {len(texts) / statistics.median(t):.0f} | "
              f"{min(rates):.0f}..{max(rates):.0f} |")


if __name__ == "__main__":
    main()
