"""SQuAD prediction speed: feature conversion, forward passes, post-processing.

    .venv/bin/python bench/bench_squad.py                      # BERT-base, forward on a subset
    .venv/bin/python bench/bench_squad.py --size=small         # 4 layers, hidden 256

Builds, offline and deterministically, a SQuAD v1.1 predict file whose contexts are runs
of consecutive sentences of the sample corpus (``data_prep.sample_corpus``: standard
library docstrings), 80 to 2,000 words long, with 2 to 6 questions each (the question is
"what" + the words just before the answer + the answer's sentence-mates; the answer is a
1-5 word span of the context), until the questions give ``--windows`` windows at
max_seq_length 384 / doc_stride 128 / max_query_length 64. The vocab is every character
(and its ## form) + the most frequent words of the same sentences. The model is a
``BertSpanLabeler`` with random weights (BERT-base by default).

Everything runs in one process, on run_squad.py's prediction path, timed phase by phase:

1. ``prepare_squad_records`` (JSON -> examples -> windows -> eval.tf_record + sidecar, as
   run_squad.py does) and, separately, ``convert_examples_to_features`` alone (in memory);
2. forward passes: ``trainer_setup.build_trainer`` + ``TrainingLoop.predict`` over
   the predict records read as run_squad.py reads them (predict batch 8, last batch
   padded), with the strategy run_squad uses by default. One batch is run first
   (tracing, not timed), then two batches estimate the cost; if all windows do not fit
   ``--forward_budget_s``, only the first windows that do are run and the time is
   EXTRAPOLATED per window to all of them (printed as such);
3. post-processing: ``compute_predictions`` (n_best 20, max_answer_length 30) on ALL
   windows, with the model's logits where the forward pass ran and random logits of the
   same mean and spread elsewhere (median of ``--post_rounds``), plus
   ``write_predictions`` (the three JSON files) once.

Prints the figures as a Markdown table, with the load average before and after (the
machine is shared: CPU seconds of this process are printed beside wall seconds).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from data_prep import build_vocab, sample_corpus, tokenization  # noqa: E402
from tasks.squad import data as squad  # noqa: E402
from tasks.squad import postprocess  # noqa: E402

from modeling.config import BertConfig  # noqa: E402
from modeling.models import BertSpanLabeler  # noqa: E402
from training.execution import RuntimeConfig, setup_runtime  # noqa: E402
from tasks.squad import task as squad_task  # noqa: E402
from training import input_pipeline, trainer_setup  # noqa: E402
from training.settings import LoopConfig  # noqa: E402

SIZES = {  # layers, hidden, heads
    "base": (12, 768, 12),
    "small": (4, 256, 4),
    "tiny": (2, 128, 2),
}


class Timer:
    def __init__(self):
        self.wall = self.cpu = 0.0

    def __enter__(self):
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self._w
        self.cpu = time.process_time() - self._c


def corpus_sentences(max_mb: float) -> list[str]:
    return [s for d in sample_corpus.iter_limited_documents(max_mb=max_mb)
            for s in d.sentences if len(s.split()) >= 4]


def write_vocab(sentences, path: str, size: int) -> int:
    """Specials + every character seen (+ its ## form) + the most frequent words, to `size`."""
    counts = build_vocab.count_words(sentences, do_lower_case=True)
    vocab = build_vocab.special_tokens(0, "compact") + build_vocab.character_tokens(counts)
    seen = set(vocab)
    for word, _ in counts.most_common():
        if len(vocab) >= size:
            break
        if word not in seen:
            vocab.append(word)
            seen.add(word)
    build_vocab.write_vocab(vocab, path)
    return len(vocab)


def make_squad_json(sentences, tokenizer, window: squad.WindowConfig, target_windows: int,
                    seed: int) -> tuple[dict, int, int]:
    """SQuAD v1.1 JSON with about `target_windows` windows; (json, questions, windows)."""
    rng = random.Random(seed)
    paragraphs, windows, questions, pos = [], 0, 0, 0
    while windows < target_windows:
        # Context lengths: many short (one window) and some long (up to ~20 windows).
        target_words = int(80 * (25 ** rng.random()))  # 80 .. 2,000 words, log-uniform
        words, sent_of = [], []
        while len(words) < target_words:
            if pos >= len(sentences):
                pos = 0  # wrap around (a small corpus): contexts repeat, windows do not
            sent_words = sentences[pos].split()
            sent_of += [len(words)] * len(sent_words)
            words += sent_words
            pos += 1
        context = " ".join(words)
        offsets, o = [], 0
        for w in words:
            offsets.append(o)
            o += len(w) + 1
        num_ctx_tokens = sum(len(tokenizer.tokenize(w)) for w in words)
        qas = []
        for _ in range(rng.randint(2, 6)):
            i = rng.randrange(len(words))
            k = min(rng.randint(1, 5), len(words) - i)
            answer = " ".join(words[i:i + k])
            before = words[max(sent_of[i], i - 6):i] or words[i + k:i + k + 6]
            extra = rng.sample(words, min(4, len(words)))
            question = "what " + " ".join(before + extra) + " ?"
            q_tokens = min(len(tokenizer.tokenize(question)), window.max_query_length)
            spans = squad.doc_spans_for(
                num_ctx_tokens, window.max_seq_length - q_tokens - 3, window.doc_stride)
            windows += len(spans)
            questions += 1
            qas.append({"id": f"q{questions:05d}", "question": question,
                        "answers": [{"text": answer, "answer_start": offsets[i]}]})
        paragraphs.append({"context": context, "qas": qas})
    data = {"version": "1.1", "data": [{"title": "stdlib", "paragraphs": paragraphs}]}
    return data, questions, windows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="base")
    parser.add_argument("--windows", type=int, default=2500, help="target number of windows")
    parser.add_argument("--vocab_size", type=int, default=16000)
    parser.add_argument("--corpus_mb", type=float, default=1.0)
    parser.add_argument("--predict_batch_size", type=int, default=8)
    parser.add_argument("--forward_budget_s", type=float, default=150.0,
                        help="run the forward pass on as many windows as fit; extrapolate")
    parser.add_argument("--post_rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    load_before = os.getloadavg()
    window = squad.WindowConfig(384, 128, 64)
    post = postprocess.PostprocessConfig(n_best_size=20, max_answer_length=30, do_lower_case=True)
    batch = args.predict_batch_size

    # ---- data, vocab, model (not timed)
    work = tempfile.mkdtemp(prefix="bench_squad_")
    sentences = corpus_sentences(args.corpus_mb)
    vocab_file = os.path.join(work, "vocab.txt")
    vocab_size = write_vocab(sentences, vocab_file, args.vocab_size)
    tokenizer = tokenization.FullTokenizer(vocab_file, do_lower_case=True)
    data, num_questions, est_windows = make_squad_json(
        sentences, tokenizer, window, args.windows, args.seed)
    predict_file = os.path.join(work, "predict-v1.1.json")
    with open(predict_file, "w", encoding="utf-8") as f:
        json.dump(data, f)
    num_contexts = len(data["data"][0]["paragraphs"])
    context_words = [len(p["context"].split()) for p in data["data"][0]["paragraphs"]]

    layers, hidden, heads = SIZES[args.size]
    bert_config = BertConfig(vocab_size=vocab_size, hidden_size=hidden,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             intermediate_size=4 * hidden, max_position_embeddings=512)
    strategy = setup_runtime(RuntimeConfig(""))  # run_squad's default
    keras.utils.set_random_seed(args.seed)
    model, trainer = trainer_setup.build_trainer(
        strategy, lambda: BertSpanLabeler(bert_config), squad_task.SpanTask(),
        loop_config=LoopConfig(output_dir=os.path.join(work, "out"), num_train_steps=0,
                               num_warmup_steps=0, train_batch_size=32,
                               eval_batch_size=batch, learning_rate=5e-5),
        max_seq_length=window.max_seq_length)

    # ---- 1. feature conversion
    with Timer() as t_prepare:
        prepared = squad.prepare_squad_records(
            predict_file, work, vocab_file=vocab_file, do_lower_case=True, config=window,
            is_training=False)
    examples, features = prepared.examples, prepared.features
    num_windows = len(features)
    conv_tokenizer = tokenization.FullTokenizer(vocab_file, do_lower_case=True)  # cold caches
    with Timer() as t_convert:
        in_memory = squad.convert_examples_to_features(examples, conv_tokenizer, window,
                                                       is_training=False)
    assert len(in_memory) == num_windows
    del in_memory

    # ---- 2. forward passes (run_squad's predict path)
    def dataset():  # as the runner reads the predict records (the last batch padded)
        spec = squad.squad_schema(False).parse_spec(max_seq_length=window.max_seq_length)
        return input_pipeline.finetuning_records(
            input_pipeline.RecordsConfig((prepared.record_file,), spec), batch_size=batch,
            is_training=False, drop_remainder=False, pad_to_batch=True)

    def predict(num_batches):
        return trainer.predict(dataset().take(num_batches),
                               output_keys=("start_logits", "end_logits"),
                               feature_keys=("unique_ids",))

    total_batches = math.ceil(num_windows / batch)
    with Timer() as t_trace:
        predict(1)
    with Timer() as t_estimate:
        predict(2)
    per_batch = t_estimate.wall / 2
    run_batches = min(total_batches, max(2, int(args.forward_budget_s / per_batch)))
    with Timer() as t_forward:
        out = predict(run_batches)
    ids = out["unique_ids"].reshape(-1)
    real = ids > 0
    ids, starts, ends = ids[real], out["start_logits"][real], out["end_logits"][real]
    run_windows = len(ids)
    extrapolated = run_windows < num_windows
    fwd_per_window = t_forward.wall / (run_batches * batch)  # padded rows cost too
    fwd_cpu_per_window = t_forward.cpu / (run_batches * batch)
    fwd_all = fwd_per_window * total_batches * batch
    fwd_all_cpu = fwd_cpu_per_window * total_batches * batch

    # ---- 3. post-processing on all windows
    all_ids = np.array([f.unique_id for f in features], dtype=np.int64)
    rng = np.random.default_rng(args.seed)
    mu, sd = float(np.mean(starts)), float(np.std(starts)) or 1.0
    all_starts = rng.normal(mu, sd, (num_windows, window.max_seq_length)).astype(np.float32)
    all_ends = rng.normal(mu, sd, (num_windows, window.max_seq_length)).astype(np.float32)
    row = {int(u): i for i, u in enumerate(all_ids)}
    rows = np.array([row[int(u)] for u in ids], dtype=np.int64)
    all_starts[rows], all_ends[rows] = starts, ends
    results = (all_ids, all_starts, all_ends)
    post_times, post_cpu = [], []
    for _ in range(args.post_rounds):
        with Timer() as t:
            preds = postprocess.compute_predictions(examples, features, results, post)
        post_times.append(t.wall)
        post_cpu.append(t.cpu)
    assert len(preds.predictions) == len(examples)
    with Timer() as t_write:
        postprocess.write_predictions(examples, features, results, post, os.path.join(work, "preds"))
    t_post = statistics.median(post_times)
    t_post_cpu = statistics.median(post_cpu)
    load_after = os.getloadavg()

    # ---- report
    n_ex = len(examples)
    print(f"data: {num_contexts} contexts ({min(context_words)}-{max(context_words)} words, "
          f"median {int(statistics.median(context_words))}), {n_ex} questions -> "
          f"{num_windows} windows ({num_windows / n_ex:.1f} per question; "
          f"{sum(1 for c in collections.Counter(f.example_index for f in features).values() if c == 1)}"
          f" questions with one window); vocab {vocab_size}")
    print(f"model: {args.size} ({layers} layers, hidden {hidden}, {heads} heads, intermediate "
          f"{4 * hidden}), random weights, seq 384, predict batch {batch}, "
          f"strategy {type(strategy).__name__}, {os.cpu_count()} CPUs")
    print(f"forward: tracing + 1 batch {t_trace.wall:.1f} s (not counted); estimate "
          f"{per_batch:.2f} s/batch; ran {run_batches}/{total_batches} batches "
          f"({run_windows}/{num_windows} windows)"
          + (" -> forward time for all windows EXTRAPOLATED per window" if extrapolated else ""))
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f} "
          f"{load_after[2]:.2f}")
    print()
    print("| phase | wall s | CPU s | windows/s | examples/s |")
    print("|---|---:|---:|---:|---:|")

    def line(name, wall, cpu, windows=num_windows, examples=n_ex):
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {windows / wall:,.1f} | "
              f"{examples / wall:,.1f} |")

    line("1. prepare_squad_records (read + convert + TFRecord + sidecar)",
         t_prepare.wall, t_prepare.cpu)
    line("1. convert_examples_to_features alone (cold tokenizer caches)",
         t_convert.wall, t_convert.cpu)
    if extrapolated:
        print(f"| 2. forward, measured on {run_windows} windows ({run_batches} batches) | "
              f"{t_forward.wall:.2f} | {t_forward.cpu:.2f} | "
              f"{run_batches * batch / t_forward.wall:,.2f} | |")
        line("2. forward, all windows (EXTRAPOLATED)", fwd_all, fwd_all_cpu)
    else:
        line("2. forward, all windows (TrainingLoop.predict)", fwd_all, fwd_all_cpu)
    line(f"3. compute_predictions, all windows (median of {args.post_rounds})",
         t_post, t_post_cpu)
    line("3. write_predictions (compute + 3 JSON files)", t_write.wall, t_write.cpu)
    total = t_prepare.wall + fwd_all + t_post
    line("prediction end to end (1 prepare + 2 + 3 compute)", total,
         t_prepare.cpu + fwd_all_cpu + t_post_cpu)
    print()
    print(f"post-processing / forward: {t_post / fwd_all:.4f} (wall), "
          f"{t_post_cpu / fwd_all_cpu:.4f} (CPU); post-processing rounds (s): "
          + ", ".join(f"{x:.2f}" for x in post_times))


if __name__ == "__main__":
    main()
