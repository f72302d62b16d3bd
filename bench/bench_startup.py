"""Time from start to the first training step of each runner, and where it goes.

    .venv/bin/python bench/bench_startup.py --runs=3

Each runner is started as a subprocess, exactly as a user starts it, on small data with a
small BERT (2 layers, hidden 128; the start-up work does not depend much on the size) and
`--log_steps=1 --iterations_per_loop=1`, and the parent notes when each milestone line
arrives on its output:

* `python + TensorFlow`: the process starts until the runner's first log line (the
  strategy is created): interpreter, imports, TensorFlow's own initialisation;
* `data + model`: until "Training on" (pretraining: "training from step"): records read
  or converted, the model and optimizer built, checkpoint restored or initialised;
* `first step`: until the first progress line (tracing and running the first compiled
  training call).

The reference line is `python -c "import tensorflow, keras"` alone. Median of `--runs`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CONFIG = {"vocab_size": 0, "hidden_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 2, "intermediate_size": 512, "hidden_act": "gelu",
          "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
          "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02}
WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away", "big", "red"]


def env():
    out = dict(os.environ)
    out["PYTHONPATH"] = ROOT + os.pathsep + out.get("PYTHONPATH", "")
    out.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return out


def timed(cmd, milestones):
    """{milestone: seconds from the start until a line containing it} (+ "end")."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen, lines = {}, []

    def read():
        for line in proc.stdout:
            lines.append(line)
            for name, markers in milestones.items():
                if name not in seen and any(m in line for m in markers):
                    seen[name] = time.perf_counter() - start
    reader = threading.Thread(target=read)
    reader.start()
    proc.wait()
    reader.join()
    seen["end"] = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[1]} failed:\n{''.join(lines)[-3000:]}")
    return seen


def prepare(root):
    """Vocab, config, pretraining records, a classifier TSV task, a SQuAD file, a CoNLL
    file and a SWAG CSV."""
    import random

    from data_prep import build_vocab

    rng = random.Random(0)
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]",
                                                                "[MASK]"] + WORDS + [
        ".", "?"] + [chr(c) for c in range(97, 123)] + ["##" + chr(c) for c in range(97, 123)]
    build_vocab.write_vocab(vocab, os.path.join(root, "vocab.txt"))
    config = dict(CONFIG, vocab_size=len(vocab))
    with open(os.path.join(root, "bert_config.json"), "w") as f:
        json.dump(config, f)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + " ."
                 for _ in range(400)]
    with open(os.path.join(root, "corpus.txt"), "w") as f:
        for i, s in enumerate(sentences):
            f.write(s + "\n" + ("\n" if i % 8 == 7 else ""))
    subprocess.run([sys.executable, "-m", "data_prep.create_pretraining_data",
                    f"--input_file={root}/corpus.txt", f"--output_file={root}/pre.tfrecord",
                    f"--vocab_file={root}/vocab.txt", "--max_seq_length=128",
                    "--dupe_factor=2"], cwd=ROOT, env=env(), check=True, capture_output=True)
    task = os.path.join(root, "task")
    os.makedirs(task, exist_ok=True)
    for split in ("train", "dev"):
        with open(os.path.join(task, f"{split}.tsv"), "w") as f:
            f.write("text\tlabel\n")
            for s in sentences[:200]:
                f.write(f"{s}\t{'yes' if 'cat' in s else 'no'}\n")
    paragraphs = [{"context": " ".join(sentences[i:i + 5]), "qas": [
        {"id": f"q{i}", "question": "what sat ?", "answers": [
            {"text": sentences[i].split()[0], "answer_start": 0}]}]} for i in range(0, 200, 5)]
    with open(os.path.join(root, "squad.json"), "w") as f:
        json.dump({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}, f)
    ner = os.path.join(root, "ner")
    os.makedirs(ner, exist_ok=True)
    with open(os.path.join(ner, "train.txt"), "w") as f:  # CoNLL: word, tag; blank lines
        for s in sentences[:200]:
            f.write("".join(f"{w} {'B-ANIMAL' if w in ('cat', 'dog') else 'O'}\n"
                            for w in s.split()) + "\n")
    swag = os.path.join(root, "swag")
    os.makedirs(swag, exist_ok=True)
    with open(os.path.join(swag, "train.csv"), "w") as f:  # SWAG's "regular" CSV
        f.write(",video-id,fold-ind,startphrase,sent1,sent2,gold-source,"
                "ending0,ending1,ending2,ending3,label\n")
        for i, s in enumerate(sentences[:200]):
            endings = [sentences[(i + k + 1) % 400] for k in range(4)]
            f.write(f"{i},v{i},{i},{s} the cat,{s},the cat,gold,{','.join(endings)},0\n")


def commands(root, run):
    out = os.path.join(root, f"out_{run}")
    common = [f"--bert_config_file={root}/bert_config.json", "--log_steps=1",
              "--iterations_per_loop=1", "--save_checkpoints_steps=1000",
              "--distribution_strategy=one_device"]
    return {
        "run_pretraining.py": [f"--input_file={root}/pre.tfrecord", "--do_train",
                               "--num_train_steps=2", "--train_batch_size=8",
                               f"--output_dir={out}_pre"] + common,
        "run_classifier.py": ["--task_name=custom", f"--data_dir={root}/task",
                              "--text_a_column=text", "--label_column=label",
                              f"--vocab_file={root}/vocab.txt", "--do_train",
                              "--num_train_epochs=0.1", "--train_batch_size=8",
                              f"--output_dir={out}_clf"] + common,
        "run_squad.py": [f"--train_file={root}/squad.json", f"--vocab_file={root}/vocab.txt",
                         "--do_train", "--num_train_epochs=0.5", "--train_batch_size=8",
                         "--max_seq_length=128", f"--output_dir={out}_squad"] + common,
        "run_ner.py": [f"--data_dir={root}/ner", f"--vocab_file={root}/vocab.txt",
                       "--do_train", "--num_train_epochs=0.1", "--train_batch_size=8",
                       "--max_seq_length=128", f"--output_dir={out}_ner"] + common,
        "run_swag.py": [f"--data_dir={root}/swag", f"--vocab_file={root}/vocab.txt",
                        "--do_train", "--num_train_epochs=0.1", "--train_batch_size=8",
                        "--max_seq_length=128", f"--output_dir={out}_swag"] + common,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    root = tempfile.mkdtemp()
    prepare(root)
    base = [timed([sys.executable, "-c", "import tensorflow, keras"], {})["end"]
            for _ in range(args.runs)]
    print(f"python -c 'import tensorflow, keras': {statistics.median(base):.2f} s "
          f"(load average {os.getloadavg()[0]:.2f})", flush=True)
    milestones = {"python + TensorFlow": ("Strategy ",),
                  "data + model": ("Training on", "training from step"),
                  "first step": (" loss ",)}
    results = {}
    for run in range(args.runs):
        for name, flags in commands(root, run).items():
            seen = timed([sys.executable, os.path.join(ROOT, name)] + flags, milestones)
            for key, value in seen.items():
                results.setdefault(name, {}).setdefault(key, []).append(value)
    for name, figures in results.items():
        median = {k: statistics.median(v) for k, v in figures.items()}
        parts, last = [], 0.0
        for key in milestones:
            parts.append(f"{key} {median[key] - last:.2f} s")
            last = median[key]
        print(f"{name:20s} first step after {median['first step']:.2f} s: "
              f"{', '.join(parts)}; whole run {median['end']:.2f} s", flush=True)


if __name__ == "__main__":
    main()
