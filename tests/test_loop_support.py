"""Shared helpers for the pretraining loop/runner tests: tiny configs, records, the runner
in this process or as a process.

(No tests here; the module name keeps it with the loop tests it serves.)
"""

import os
import re
import socket
import subprocess
import sys

import numpy as np

from tests.clis import call_main

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ = 32
PREDS = 5
VOCAB = 60


def tiny_config_dict(vocab_size=VOCAB, dropout=0.0, **overrides):
    """The tests' tiny bert_config (2 layers of 32), with `overrides` (other keys' values).
    `num_hidden_layers=1` where what a test proves does not depend on the depth (signals,
    resume, paths, redo, refusals): a tiny run's cost is mostly tracing its model's graph,
    ~30% less with one layer than with two."""
    return {
        "vocab_size": vocab_size, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 64, "hidden_act": "gelu",
        "hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout,
        "max_position_embeddings": 128, "type_vocab_size": 2, "initializer_range": 0.02,
        **overrides,
    }


def write_config(path, **kwargs):
    import json
    with open(path, "w") as f:
        json.dump(tiny_config_dict(**kwargs), f)
    return str(path)


def synthetic_instances(n, seq=SEQ, preds=PREDS, vocab=VOCAB, seed=0, full_weights=True):
    """Learnable records: skewed token distribution, NSP label visible in the segment ids."""
    rng = np.random.default_rng(seed)
    probs = 1.0 / np.arange(1, vocab - 4)
    probs /= probs.sum()
    out = []
    for _ in range(n):
        length = seq if full_weights else int(rng.integers(seq // 2, seq + 1))
        tokens = list(5 + rng.choice(vocab - 5, size=length, p=probs))
        tokens[0] = 2
        split = int(rng.integers(3, length - 2))
        label = int(rng.integers(0, 2))
        segments = [0] * split + [1] * (length - split)
        if label:  # "random next": the second segment starts with a marker token
            tokens[split] = 6
        n_pred = preds if full_weights else int(rng.integers(1, preds + 1))
        positions = sorted(rng.choice(np.arange(1, length), size=n_pred, replace=False))
        labels = [int(tokens[p]) for p in positions]
        for p in positions:
            tokens[p] = 4
        out.append({
            "input_ids": [int(t) for t in tokens], "input_mask": [1] * length,
            "segment_ids": segments, "masked_lm_positions": [int(p) for p in positions],
            "masked_lm_ids": labels, "masked_lm_weights": [1.0] * n_pred,
            "next_sentence_labels": [label],
        })
    return out


def write_records(path, instances, seq=SEQ, preds=PREDS):
    """Writes instances with data_prep.features' pretraining schema (gzip if path ends .gz)."""
    import tensorflow as tf

    from data_prep import features
    encoder = features.PRETRAINING.encoder(max_seq_length=seq, max_predictions_per_seq=preds)
    options = tf.io.TFRecordOptions(compression_type="GZIP" if str(path).endswith(".gz")
                                    else "")
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for inst in instances:
            writer.write(encoder.encode(inst))
    return str(path)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_local_workers(command, count=2, timeout=240):
    """Runs `command` as `count` MultiWorkerMirroredStrategy workers on this machine (a
    TF_CONFIG each, distinct free ports) to their end; asserts each exited 0 with
    `count` replicas; returns their outputs (stdout and stderr), worker 0's first."""
    import json

    ports = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    from tests import forkserver  # workers nobody kills: forked from one TensorFlow import

    procs = []
    for index in range(count):
        routed, env = forkserver.routed(command, runner_env({"TF_CONFIG": json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}})}))
        procs.append(subprocess.Popen(routed, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    try:
        logs = [proc.communicate(timeout=timeout)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-4000:]
        assert f"with {count} replica(s)" in log, log[-4000:]
    return logs


def runner_env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.pop("TF_CONFIG", None)
    env.update(extra or {})
    return env


def runner_command(**flags):
    cmd = [sys.executable, os.path.join(REPO_ROOT, "run_pretraining.py")]
    for key, value in flags.items():
        cmd.append(f"--{key}={value}")
    return cmd


def run_runner(timeout=240, env=None, process=False, **flags):
    """Runs run_pretraining.py with `flags` to completion; returns (exit status, its output:
    stdout, stderr and the absl log lines). In this process (tests/clis.py call_main) unless
    `process` (or an `env` for it): a process only where the process is under test."""
    if not process and env is None:
        result = call_main("run_pretraining", **flags)
        return result.code, "\n".join([result.stdout, result.stderr, result.log])
    from tests import forkserver  # a fresh TensorFlow runtime, not a fresh interpreter

    proc = forkserver.run(runner_command(**flags), runner_env(env), REPO_ROOT, timeout)
    return proc.returncode, proc.stdout + proc.stderr


def export_and_serve(model_type, run_dir, work_dir, serve_flags):
    """export_saved_model.py on a runner's output directory (in this process), then
    predict_saved_model.py (a process, isolated: tensorflow + tensorflow_text only) with
    `serve_flags`, as a user runs them; returns (the --output_json document, the printed
    lines)."""
    import json

    from tests.conftest import assert_no_project_imports, isolated_argv

    export_dir = os.path.join(work_dir, "export")
    result = call_main("export_saved_model", model_type=model_type, init_checkpoint=run_dir,
                       export_dir=export_dir)
    assert result.code == 0, (result.stderr + result.log)[-3000:]
    out_json = os.path.join(work_dir, "served.json")
    proc = subprocess.run(
        isolated_argv(os.path.join(REPO_ROOT, "predict_saved_model.py"),
                      f"--export_dir={export_dir}", f"--output_json={out_json}", *serve_flags),
        env=runner_env(), cwd=work_dir, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_no_project_imports(proc.stderr)
    with open(out_json, encoding="utf-8") as f:
        return json.load(f), proc.stdout.strip().splitlines()


LOG_LINE = re.compile(r"step (\d+)/(\d+) loss ([-\d.e+naif]+) mlm_acc ([\d.]+) nsp_acc ([\d.]+)")
ANY_LOG_LINE = re.compile(r"step (\d+)/(\d+) loss ([-\d.e+naif]+)((?: [a-z_]+_acc [\d.]+)*) lr")


def parse_log(output):
    """[(step, loss, mlm_acc, nsp_acc)] from the runner's progress lines."""
    return [(int(m.group(1)), float(m.group(3)), float(m.group(4)), float(m.group(5)))
            for m in LOG_LINE.finditer(output)]


def parse_progress(output):
    """[(step, loss, {label: accuracy})] from progress lines of any objective (no NSP,
    left-to-right: other figures than `parse_log` reads)."""
    lines = []
    for m in ANY_LOG_LINE.finditer(output):
        parts = m.group(4).split()
        lines.append((int(m.group(1)), float(m.group(3)),
                      {parts[i]: float(parts[i + 1]) for i in range(0, len(parts), 2)}))
    return lines


def write_corpus(path, num_docs=40, sentences=8, seed=0):
    """A small English-like corpus in BERT's input format from the tiny test vocab's words."""
    import random
    rng = random.Random(seed)
    nouns = ["cat", "dog", "mat", "home"]
    verbs = ["sat", "ran", "was", "is"]
    words = ["the", "a", "big", "red", "far", "away", "on", "in", "to", "and", "of", "it",
             "he", "she"]
    lines = []
    for _ in range(num_docs):
        for _ in range(sentences):
            # At least 10 words, so every instance has enough tokens for all predictions.
            body = [rng.choice(words) for _ in range(rng.randint(6, 10))]
            lines.append(" ".join(["the", rng.choice(nouns), rng.choice(verbs)] + body) + " .")
        lines.append("")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


def make_records_with_cli(tmp_dir, *, seq=SEQ, preds=PREDS, shards=2, dupe_factor=3, seed=1,
                          extra=()):
    """Runs data_prep.create_pretraining_data (in this process) over a small corpus;
    returns the glob.

    `extra`: more flags (e.g. "--next_sentence_prediction=false"); with "--dynamic_masking"
    the masking flags are left out (that tool refuses them then).
    """
    from tests.conftest import write_vocab
    import pathlib
    tmp_dir = pathlib.Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    vocab = write_vocab(tmp_dir / "vocab.txt")
    corpus = write_corpus(tmp_dir / "corpus.txt")
    out = tmp_dir / "records.tfrecord"
    masking = [] if "--dynamic_masking" in extra else [
        f"--max_predictions_per_seq={preds}", "--masked_lm_prob=0.5"]
    argv = [f"--input_file={corpus}", f"--output_file={out}", f"--vocab_file={vocab}",
            f"--max_seq_length={seq}", *masking, "--short_seq_prob=0",
            f"--dupe_factor={dupe_factor}", f"--random_seed={seed}", "--num_workers=1",
            f"--num_output_shards={shards}", *extra]
    result = call_main("create_pretraining_data", argv)
    assert result.code == 0, (result.stderr + result.log)[-3000:]
    return str(tmp_dir / "records.tfrecord-*"), vocab


def read_eval_results(path):
    """Parses an eval_results.txt (`key = value` lines, as the original writes them) back
    into a dict of floats; any tf.io.gfile path (ram://, gs://)."""
    import tensorflow as tf

    out = {}
    with tf.io.gfile.GFile(str(path)) as f:
        for line in f:
            if " = " in line:
                key, value = line.strip().split(" = ", 1)
                out[key] = float(value)
    return out


def accumulated_and_whole_gradients(command, k=2, **settings):
    """(gradients of one training batch, the same batch's gradients accumulated over `k`
    micro-batches), as numpy arrays, and the batch's features: a fine-tuning runner's
    family (its `FinetuningCommand` and settings as keyword arguments) prepares its train
    split, and the loop's two gradient paths are traced for the dataset's own element
    spec (with length buckets the length is unknown until run time, as in the loop)."""
    import tensorflow as tf

    from training import distribution, finetuning, trainer_setup
    from training.settings import LoopConfig

    cfg = command.settings(**settings)
    run = cfg.finetuning
    family = command.family(cfg.task, run.max_seq_length)
    bert_config = trainer_setup.load_bert_config(run.bert_config_file, run.max_seq_length)
    family.input_options = finetuning.InputOptions(
        max_seq_length=run.max_seq_length, bucket_boundaries=run.bucket_boundaries,
        vocab_size=bert_config.vocab_size, type_vocab_size=bert_config.type_vocab_size)
    train = family.prepare(run).train
    dataset = family.dataset(train, batch_size=run.train_batch_size, is_training=True, seed=1)
    assert dataset.element_spec["input_ids"].shape[-1] is None  # cut to a length bucket
    loop_config = LoopConfig.for_run(run.loop, output_dir=run.output_dir, num_train_steps=1,
                                     train_batch_size=run.train_batch_size,
                                     gradient_accumulation_steps=k)
    _, trainer = trainer_setup.build_trainer(
        distribution.get_strategy("one_device"), lambda: family.build_model(bert_config),
        family.loop_task(), loop_config=loop_config, max_seq_length=run.max_seq_length,
        build_fn=lambda model: family.build_variables(model, run.max_seq_length))
    spec = [dataset.element_spec]
    whole = tf.function(lambda batch: trainer._grad_fn(batch, tf.constant(1.0))[0],
                        input_signature=spec)
    accumulated = tf.function(
        lambda batch: trainer._accumulate(batch, k, tf.constant(1.0 / k))[0],
        input_signature=spec)
    batch = next(iter(dataset))
    return ([g.numpy() for g in whole(batch)], [g.numpy() for g in accumulated(batch)],
            {name: t.numpy() for name, t in batch.items()})


def assert_same_gradients(whole, accumulated):
    """The two gradient lists of `accumulated_and_whole_gradients` agree to float32
    rounding, and the batch moves the model: over all gradients, and per tensor for every
    tensor that is not ~0 (a bias the loss cannot see, such as the shared score bias of
    multiple choice's softmax over its choices, is 0 up to rounding). A wrong scale or
    micro-batch is off by its whole size."""
    norms = [float(np.linalg.norm(g)) for g in whole]
    total = float(np.sqrt(sum(n * n for n in norms)))
    assert len(whole) == len(accumulated) and total > 0
    error = float(np.sqrt(sum(float(np.sum((a - b) ** 2))
                              for a, b in zip(whole, accumulated))))
    assert error <= 1e-4 * total, (error, total)
    for index, (a, b) in enumerate(zip(whole, accumulated)):
        if norms[index] > 1e-3 * max(norms):
            assert np.linalg.norm(a - b) <= 1e-3 * norms[index], (index, norms[index])


def tree(directory, skip=()):
    """{path relative to `directory`: bytes} of every file under it (its folders too, as
    None), but those whose name ends with one of `skip`: what a refused run must leave
    byte for byte."""
    out = {}
    for root, dirs, names in os.walk(directory):
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), directory) + "/"] = None
        for name in names:
            if not name.endswith(tuple(skip)):
                with open(os.path.join(root, name), "rb") as f:
                    out[os.path.relpath(os.path.join(root, name), directory)] = f.read()
    return out


def stopped_at(done, step, out):
    """A directory `out` holding what a run stopped right after its checkpoint `step`
    resumes from, made from the uninterrupted run `done` (the same steps: the same
    checkpoint): that checkpoint alone, with the run's identity when it has one and its
    saver's record of the checkpoint (training/run_files.py). Real kills of real runs, and
    what else a killed run leaves, are tests/test_exact_resume_runners.py's."""
    import tensorflow as tf

    from training import run_files

    out.mkdir()
    for path in tf.io.gfile.glob(str(done / f"ckpt-{step}") + ".*") + tf.io.gfile.glob(
            str(done / "run_identity.json")):
        tf.io.gfile.copy(path, str(out / os.path.basename(path)))
    tf.compat.v1.train.update_checkpoint_state(str(out), f"ckpt-{step}")
    run_files.add(str(out), checkpoints=[f"ckpt-{step}"])
    return out


def unmasked_records(tmp_path_factory, pretraining_records):
    """The glob of unmasked records (create_pretraining_data --dynamic_masking, in this
    process, 2 shards) of the conftest corpus (`pretraining_records`), built once per
    session (conftest `built_once`) for the modules that resume dynamically masked runs;
    read only."""
    from tests.conftest import built_once

    def build(folder):
        made = call_main("create_pretraining_data", [
            f"--input_file={pretraining_records['dir'] / 'corpus.txt'}",
            f"--output_file={folder / 'pairs.tfrecord'}",
            f"--vocab_file={pretraining_records['vocab']}", f"--max_seq_length={SEQ}",
            "--dynamic_masking", "--short_seq_prob=0", "--dupe_factor=1", "--random_seed=1",
            "--num_workers=1", "--num_output_shards=2"])
        assert made.code == 0, (made.stderr + made.log)[-3000:]

    return str(built_once(tmp_path_factory, "unmasked-records", build) / "pairs.tfrecord-*")
