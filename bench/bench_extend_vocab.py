"""Domain adaptation with a grown vocab: continued pretraining from (a) the base vocab, (b) extend_vocab.py --init=random, (c) --init=mean; held-out loss, tokens, a downstream task.

    nice -n 15 .venv/bin/python bench/bench_extend_vocab.py --work_dir=/tmp/bench_vocab

Every stage is the repository's own command, run as a process with the flags a user
gives (printed), in `--work_dir`:

1. the base model: a small BERT (`--layers` x `--hidden`) pretrained for `--base_steps`
   on the sample corpus (the Python standard library's documentation,
   `data_prep.sample_corpus`), with a WordPiece vocab learned from it (`--vocab_size`);
   or, with `--base_checkpoint`, a real pretrained encoder (for instance all-MiniLM-L6-v2,
   which ships no masked-LM head) trained `--base_steps` on that corpus with its own vocab,
   so that its masked LM is learned;
2. the domain: Debian's package descriptions (`apt-cache dumpavail`, or
   `--packages_file`): real text whose words (gstreamer, haskell, fonts, ...) that vocab
   splits badly. Split by source package (a CRC32 of its name), so no package's text is
   in two parts: 60% pretraining text (descriptions of one section, in package order,
   eight to a document), 10% held-out text for the masked-LM loss, 30% a downstream task
   (the package's Debian section among eight, from its one-line description; train 15%,
   dev 5%, test 10%, a description seen in another part dropped);
3. `extend_vocab.py --corpus=<domain pretraining text> --num_new_words=N
   --placement=append`, with `--init=random` (b) and `--init=mean` (c);
4. continued pretraining for the same `--steps` from (a) the base model with its vocab,
   (b) and (c) with the grown one (records of the same text, same seed);
5. the held-out domain masked-LM loss of (b) and (c) at `--eval_steps` (step 0: the grown
   checkpoints): the same records and masks for both, so the difference is paired (mean
   +- its standard error over the masked positions), and at step 0 split by whether the
   target is a new word; (a)'s tokens differ, so its loss is not comparable, not shown;
6. tokens per document under the base and the grown vocab;
7. at step 0, the probability mass the new rows take at masked positions of held-out
   base-corpus text (old tokens only): what appending costs the old predictions;
8. the downstream task fine-tuned (`run_classifier.py --task_name=custom`, `--seeds`) from
   the base model and from each continued run: the test accuracy averaged over the seeds
   +- its standard error over the test examples, n, each seed's, and the differences
   paired on the examples.

`--steps=0`: stages 1-3, 5 at step 0, 6 and 7 only. A rerun in the same --work_dir keeps
what is there (the base model, records, runs).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import subprocess
import sys
import time
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

TASK_SECTIONS = ("admin", "games", "graphics", "net", "science", "sound", "text", "utils")
SEQ, PREDICTIONS = 64, 10


def command(args: list, log: str, done: str | None = None) -> float:
    """Runs a repository command as a process (printed); returns its seconds. Skipped
    when `done` exists (a rerun in the same --work_dir redoes only what is missing)."""
    if done and os.path.exists(done):
        print(f"(kept {done})", flush=True)
        return 0.0
    script = args[0]
    argv = ([sys.executable, "-m", script] if not script.endswith(".py")
            else [sys.executable, os.path.join(REPO, script)]) + [str(a) for a in args[1:]]
    print("$", " ".join(["python"] + argv[1:]), flush=True)
    start = time.perf_counter()
    with open(log, "a", encoding="utf-8") as out:
        done = subprocess.run(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                              check=False)
    if done.returncode:
        raise SystemExit(f"{script} failed ({done.returncode}); see {log}")
    return time.perf_counter() - start


def read_packages(path: str | None) -> list:
    """(source, section, description) of every package with a description."""
    text = (open(path, encoding="utf-8").read() if path else subprocess.run(
        ["apt-cache", "dumpavail"], capture_output=True, text=True, check=True).stdout)
    out = []
    for record in text.split("\n\n"):
        fields = {}
        for line in record.split("\n"):
            if line and not line.startswith(" ") and ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        if fields.get("Description") and fields.get("Package"):
            source = fields.get("Source", fields["Package"]).split()[0]
            section = fields.get("Section", "").rsplit("/", 1)[-1]
            out.append((source, fields["Package"], section, fields["Description"]))
    return out


def split_domain(packages: list, work: str) -> dict:
    """Writes the domain's pretraining text, held-out text and task (module docstring)."""
    def part(source):
        h = zlib.crc32(source.encode("utf-8")) % 100
        return ("corpus" if h < 60 else "heldout" if h < 70 else "train" if h < 85
                else "dev" if h < 90 else "test")

    by_part = collections.defaultdict(list)
    for source, package, section, description in sorted(packages, key=lambda p: (p[2], p[1])):
        by_part[part(source)].append((section, description))
    paths = {}
    for name in ("corpus", "heldout"):
        lines = [d for _, d in by_part[name]]
        docs = ["\n".join(lines[i:i + 8]) for i in range(0, len(lines), 8)]
        paths[name] = os.path.join(work, f"domain_{name}.txt")
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write("\n\n".join(docs) + "\n")
    seen = collections.Counter(d for name in ("corpus", "heldout") for _, d in by_part[name])
    for name in ("train", "dev", "test"):
        seen.update(d for _, d in by_part[name])
    task = os.path.join(work, "task")
    os.makedirs(task, exist_ok=True)
    counts = {}
    for name in ("train", "dev", "test"):
        rows = [(d, s) for s, d in by_part[name] if s in TASK_SECTIONS and seen[d] == 1
                and "\t" not in d]
        # Shuffled: the files come sorted by section, and the input pipeline shuffles
        # within a buffer of 100 examples only (the original's).
        random.Random(zlib.crc32(name.encode())).shuffle(rows)
        counts[name] = len(rows)
        with open(os.path.join(task, f"{name}.tsv"), "w", encoding="utf-8") as f:
            f.write("sentence\tlabel\n" + "".join(f"{d}\t{s}\n" for d, s in rows))
    paths["task"] = task
    print(f"domain: {len(packages)} packages; pretraining text "
          f"{os.path.getsize(paths['corpus']) / 1e6:.2f} MB, held-out "
          f"{os.path.getsize(paths['heldout']) / 1e6:.2f} MB; task "
          f"{counts} ({len(TASK_SECTIONS)} sections)", flush=True)
    return paths


def records(text: str, out: str, vocab: str, log: str, dupe: int, seed: int = 7) -> str:
    command(["data_prep.create_pretraining_data", f"--input_file={text}",
             f"--output_file={out}", f"--vocab_file={vocab}", f"--max_seq_length={SEQ}",
             f"--max_predictions_per_seq={PREDICTIONS}", f"--dupe_factor={dupe}",
             f"--random_seed={seed}", "--num_workers=1"], log, done=out)
    return out


def pretrain(records_path: str, config: str, out: str, steps: int, args, log: str,
             init: str | None = None, every: int | None = None) -> None:
    if os.path.exists(f"{out}/ckpt-{steps}.index"):
        print(f"(kept {out})", flush=True)
        return
    command(["run_pretraining.py", f"--input_file={records_path}",
             f"--bert_config_file={config}", f"--output_dir={out}", "--do_train",
             f"--train_batch_size={args.batch}", f"--max_seq_length={SEQ}",
             f"--max_predictions_per_seq={PREDICTIONS}", f"--num_train_steps={steps}",
             f"--num_warmup_steps={steps // 10}", f"--learning_rate={args.learning_rate}",
             f"--save_checkpoints_steps={every or steps}", "--keep_checkpoint_max=100",
             f"--iterations_per_loop={every or min(steps, 500)}", "--log_steps=500",
             "--seed=1"] + ([f"--init_checkpoint={init}"] if init else []), log)


def masked_nll(checkpoint: str, config, records_path: str, vocab_rows: int | None = None):
    """Per masked position of the records: -log p(target) under the checkpoint's masked LM
    ([positions]); with `vocab_rows`, also the probability the rows >= vocab_rows take."""
    import numpy as np
    import tensorflow as tf

    from modeling import checkpoints
    from modeling.models import BertPretrainer
    from training import input_pipeline

    model = BertPretrainer(config)
    checkpoints.load_pretrained(checkpoint, model, partial=True)

    @tf.function
    def forward(batch):
        logits = model({k: batch[k] for k in ("input_ids", "input_mask", "segment_ids",
                                              "masked_lm_positions")},
                       training=False)["masked_lm_logits"]
        log_probs = tf.nn.log_softmax(logits, axis=-1)
        nll = -tf.gather(log_probs, batch["masked_lm_ids"], batch_dims=2)
        mass = (tf.reduce_sum(tf.exp(log_probs[..., vocab_rows:]), -1) if vocab_rows
                else tf.zeros_like(nll))
        return nll, mass

    data = input_pipeline.pretraining_dataset(
        input_pipeline.PretrainingInputConfig([records_path], SEQ, PREDICTIONS),
        batch_size=64, is_training=False)
    nll, mass, ids = [], [], []
    for batch in data:
        n, m = forward(batch)
        keep = batch["masked_lm_weights"].numpy() > 0
        nll.append(n.numpy()[keep])
        mass.append(m.numpy()[keep])
        ids.append(batch["masked_lm_ids"].numpy()[keep])
    return np.concatenate(nll), np.concatenate(mass), np.concatenate(ids)


def mean_se(values) -> tuple:
    import numpy as np

    values = np.asarray(values, np.float64)
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(len(values)))


def tokens_per_document(path: str, vocab: str) -> float:
    from data_prep import tokenization

    tokenizer = tokenization.FullTokenizer(vocab, do_lower_case=True)
    with open(path, encoding="utf-8") as f:
        docs = [d for d in f.read().split("\n\n") if d.strip()]
    return sum(len(tokenizer.tokenize(d)) for d in docs) / len(docs)


def finetune(task: str, vocab: str, config: str, init: str, out: str, seed: int, args,
             log: str) -> list:
    """run_classifier fine-tuned from `init` on the task: each test example right or not."""
    command(["run_classifier.py", "--task_name=custom", f"--data_dir={task}",
             "--text_a_column=sentence", "--label_column=label",
             f"--label_list={','.join(TASK_SECTIONS)}", f"--vocab_file={vocab}",
             f"--bert_config_file={config}", f"--init_checkpoint={init}", "--do_train",
             "--do_eval", "--do_predict", "--max_seq_length=32", "--train_batch_size=32",
             f"--learning_rate={args.task_learning_rate}",
             f"--num_train_epochs={args.task_epochs}", f"--seed={seed}", f"--output_dir={out}"],
            log, done=f"{out}/test_results.tsv")
    labels = [line.rstrip("\n").split("\t")[1] for line in
              open(os.path.join(task, "test.tsv"), encoding="utf-8").readlines()[1:]]
    with open(os.path.join(out, "test_results.tsv"), encoding="utf-8") as f:
        rows = [list(map(float, line.split("\t"))) for line in f if line.strip()]
    predicted = [TASK_SECTIONS[max(range(len(r)), key=r.__getitem__)] for r in rows]
    return [p == y for p, y in zip(predicted, labels)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work_dir", default="/tmp/bench_extend_vocab")
    parser.add_argument("--packages_file", default=None,
                        help="a Debian Packages file (default: apt-cache dumpavail)")
    parser.add_argument("--vocab_size", type=int, default=4000)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=5e-4)
    parser.add_argument("--base_mb", type=float, default=3.0)
    parser.add_argument("--base_steps", type=int, default=4000)
    parser.add_argument("--base_checkpoint", default="",
                        help="a pretrained model directory (Hugging Face's or Google's, its "
                             "config and vocab.txt inside): the base is --base_steps of "
                             "masked-LM training from it on the sample corpus (its vocab), "
                             "not a model from scratch")
    parser.add_argument("--steps", type=int, default=1500,
                        help="continued pretraining steps; 0: the step-0 figures only")
    parser.add_argument("--eval_steps", default="0,50,100,200,300,600,900,1200,1500",
                        help="steps of (b) and (c) whose held-out loss is measured "
                             "(checkpoints saved every --save_every)")
    parser.add_argument("--save_every", type=int, default=50)
    parser.add_argument("--seeds", default="1,2,3", help="fine-tuning seeds")
    parser.add_argument("--new_words", type=int, default=300)
    parser.add_argument("--task_epochs", type=float, default=6.0)
    parser.add_argument("--task_learning_rate", type=float, default=3e-4)
    args = parser.parse_args()

    import numpy as np

    from modeling.config import BertConfig

    W = args.work_dir
    os.makedirs(W, exist_ok=True)
    log = os.path.join(W, "commands.log")
    start = time.perf_counter()
    # 1. The base model.
    if not os.path.exists(os.path.join(W, "base", "checkpoint")):
        command(["data_prep.sample_corpus", f"--output_dir={W}/base_corpus",
                 f"--max_mb={args.base_mb}", "--num_shards=1"], log)
        if args.base_checkpoint:
            source = args.base_checkpoint
            config_name = ("config.json" if os.path.exists(os.path.join(source, "config.json"))
                           else "bert_config.json")
            shutil.copyfile(os.path.join(source, "vocab.txt"), f"{W}/vocab.txt")
            BertConfig.from_config_file(os.path.join(source, config_name)).to_json_file(
                f"{W}/bert_config.json")
        else:
            command(["data_prep.build_vocab", f"--input_file={W}/base_corpus/*.txt",
                     f"--output_file={W}/vocab.txt", f"--vocab_size={args.vocab_size}",
                     "--do_lower_case=true"], log)
            with open(f"{W}/vocab.txt", encoding="utf-8") as f:
                size = sum(1 for _ in f)
            with open(f"{W}/bert_config.json", "w") as f:
                json.dump({"vocab_size": size, "hidden_size": args.hidden,
                           "num_hidden_layers": args.layers, "num_attention_heads": 4,
                           "intermediate_size": 4 * args.hidden, "hidden_act": "gelu",
                           "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                           "max_position_embeddings": 128, "type_vocab_size": 2,
                           "initializer_range": 0.02}, f)
        records(f"{W}/base_corpus/*.txt", f"{W}/base.tfrecord", f"{W}/vocab.txt", log, 3)
        seconds = time.perf_counter()
        pretrain(f"{W}/base.tfrecord", f"{W}/bert_config.json", f"{W}/base",
                 args.base_steps, args, log, init=args.base_checkpoint or None)
        print(f"base model: {args.base_steps} steps in "
              f"{time.perf_counter() - seconds:.0f} s", flush=True)
    # 2. The domain.
    paths = split_domain(read_packages(args.packages_file), W)
    # 3. The grown models.
    for init in ("random", "mean"):
        command(["extend_vocab.py", f"--input={W}/base", f"--bert_config_file={W}/bert_config.json",
                 f"--vocab_file={W}/vocab.txt", f"--corpus={paths['corpus']}",
                 f"--num_new_words={args.new_words}", "--placement=append",
                 f"--init={init}", f"--output_dir={W}/grown_{init}", "--output_format=tf1"],
                log, done=f"{W}/grown_{init}/vocab.txt")
    grown_vocab = f"{W}/grown_mean/vocab.txt"
    with open(log, encoding="utf-8") as f:
        report = [line.strip() for line in f if line.startswith(("added ", "tokens on"))]
    print("extend_vocab: " + " | ".join(report[-2:])[:400], flush=True)
    # 4. Continued pretraining.
    base_records = records(paths["corpus"], f"{W}/domain_base.tfrecord", f"{W}/vocab.txt",
                           log, 2)
    grown_records = records(paths["corpus"], f"{W}/domain_grown.tfrecord", grown_vocab, log, 2)
    heldout = records(paths["heldout"], f"{W}/heldout_grown.tfrecord", grown_vocab, log, 1, 11)
    runs = {"a": (base_records, f"{W}/bert_config.json", f"{W}/base", f"{W}/vocab.txt"),
            "b": (grown_records, f"{W}/grown_random/bert_config.json", f"{W}/grown_random",
                  grown_vocab),
            "c": (grown_records, f"{W}/grown_mean/bert_config.json", f"{W}/grown_mean",
                  grown_vocab)}
    if args.steps:
        for name, (recs, config, init, _) in runs.items():
            pretrain(recs, config, f"{W}/continued_{name}", args.steps, args, log, init=init,
                     every=args.save_every)
    # 5. Held-out loss over the steps, (b) against (c).
    grown_config = BertConfig.from_json_file(f"{W}/grown_mean/bert_config.json")
    print("\n| step | (b) random | (c) mean | (b) - (c), paired |\n|---:|---:|---:|---:|")
    for step in map(int, args.eval_steps.split(",") if args.steps else [0]):
        losses = {}
        for name in ("b", "c"):
            ckpt = (runs[name][2] if step == 0
                    else f"{W}/continued_{name}/ckpt-{step}")
            losses[name] = masked_nll(ckpt, grown_config, heldout)
        old_rows = BertConfig.from_json_file(f"{W}/bert_config.json").vocab_size
        b, c = losses["b"][0], losses["c"][0]
        mb, sb = mean_se(b)
        mc, sc = mean_se(c)
        md, sd = mean_se(b - c)
        print(f"| {step} | {mb:.3f} ± {sb:.3f} | {mc:.3f} ± {sc:.3f} | "
              f"{md:+.3f} ± {sd:.3f} |", flush=True)
        if step == 0:
            new = losses["c"][2] >= old_rows
            step0 = (new.mean(), mean_se((b - c)[new]), mean_se((b - c)[~new]), len(b))
    share, on_new, on_old, n = step0
    print(f"step 0 split by target (n = {n} positions, {100 * share:.1f}% new words): "
          f"(b) - (c) on new-word targets {on_new[0]:+.3f} ± {on_new[1]:.3f}, on old "
          f"targets {on_old[0]:+.3f} ± {on_old[1]:.3f}", flush=True)
    # 6. Tokens per document.
    for label, path in (("held-out domain documents", paths["heldout"]),):
        before = tokens_per_document(path, f"{W}/vocab.txt")
        after = tokens_per_document(path, grown_vocab)
        print(f"tokens per {label}: base vocab {before:.1f}, grown {after:.1f} "
              f"({100 * (before - after) / before:.1f}% fewer)", flush=True)
    # 7. Mass the new rows take on old text.
    old_records = records(f"{W}/base_corpus/*.txt", f"{W}/base_eval.tfrecord",
                          f"{W}/vocab.txt", log, 1, 13)
    for name, label in (("b", "random"), ("c", "mean")):
        _, mass, _ = masked_nll(runs[name][2], grown_config, old_records, old_rows)
        m, s = mean_se(mass)
        print(f"new rows' probability mass on base-corpus masked positions, --init={label}: "
              f"mean {100 * m:.2f}% ± {100 * s:.2f}%, median {100 * np.median(mass):.2f}%",
              flush=True)
    if not args.steps:
        print(f"total {time.perf_counter() - start:.0f} s")
        return
    # 8. The downstream task, fine-tuned with each seed; per test example the share of
    # seeds that got it right, so differences are paired on the examples.
    seeds = [int(x) for x in args.seeds.split(",")]
    print(f"\n| fine-tuned from | test accuracy, mean of seeds {args.seeds} ± SE (n) "
          "| per seed |\n|---|---:|---:|")
    results = {}
    for key, name, config, init, vocab in (
            ("0", "base, no continued pretraining", f"{W}/bert_config.json", f"{W}/base",
             f"{W}/vocab.txt"),
            ("a", "(a) base vocab, continued", runs["a"][1], f"{W}/continued_a", runs["a"][3]),
            ("b", "(b) grown, random, continued", runs["b"][1], f"{W}/continued_b",
             grown_vocab),
            ("c", "(c) grown, mean, continued", runs["c"][1], f"{W}/continued_c",
             grown_vocab)):
        per_seed = [finetune(paths["task"], vocab, config, init, f"{W}/task_{key}_{seed}",
                             seed, args, log) for seed in seeds]
        results[key] = np.mean(np.asarray(per_seed, float), axis=0)
        m, se = mean_se(results[key])
        print(f"| {name} | {m:.3f} ± {se:.3f} ({len(results[key])}) | "
              + ", ".join(f"{np.mean(c):.3f}" for c in per_seed) + " |", flush=True)
    for first, second in (("c", "b"), ("c", "a"), ("b", "a"), ("a", "0")):
        m, se = mean_se(results[first] - results[second])
        print(f"paired difference ({first}) - ({second}): {m:+.3f} ± {se:.3f}")
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
