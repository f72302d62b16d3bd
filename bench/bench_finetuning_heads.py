"""Fine-tuning heads benchmark: the tagging (and multiple-choice) training steps against the classifier step of the same size.

    .venv/bin/python bench/bench_finetuning_heads.py --sizes=small,base --heads=classifier,tagging,feature_based

Every head's step is the one its runner runs: the task model + its loop `Task` in the shared
`training.loop.TrainingLoop` (its compiled `_train_steps`: `--steps` steps of
`strategy.run` per call, the runners' default strategy), `AdamWeightDecay` from
`optimization.create_optimizer` (warmup + linear decay, global-norm clipping 1.0), the
config's dropout 0.1, random weights, one synthetic batch repeated (batch 16, seq 128,
every other row 3/4 real tokens):

* classifier: `BertClassifier` + `ClassifierTask` (run_classifier.py), 2 labels;
* tagging: `BertTokenTagger` + `TaggingTask` (run_ner.py), 9 labels (CoNLL-2003's), a
  label on 70% of the real tokens (first pieces);
* feature_based: `BertFeatureTagger` (run_ner.py --feature_based, concat_last_four, two
  BiLSTM layers of --lstm_units per direction) + `TaggingTask`;
* multiple_choice: `BertMultipleChoice` + the classifier's loss over the choices
  (run_swag.py), batch // 4 examples of 4 choices: the same number of sequences per step,
  so its examples/s are sequences/s.

The same BertConfig, batch and sequence length for all; rounds alternate the heads
(`time_rounds`), the first (tracing) call of each is excluded, the median round is
reported as examples/s and CPU seconds per step, and each head's ratio to the classifier
of the same run (wall and CPU time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench_pretraining import (POLICIES, SIZES, VOCAB, time_rounds,  # noqa: E402
                               train_steps_runner)
from modeling import optimization  # noqa: E402
from modeling.config import BertConfig  # noqa: E402
from training import distribution, loop  # noqa: E402
from training.settings import LoopConfig  # noqa: E402

CLASSIFIER_LABELS = 2
TAGGING_LABELS = 9  # O + B-/I- of PER, LOC, ORG, MISC


def encoder_batch(batch, seq, vocab, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int32)
    mask[::2, seq * 3 // 4:] = 0
    return rng, {
        "input_ids": rng.integers(1000, vocab, (batch, seq)).astype(np.int32),
        "input_mask": mask,
        "segment_ids": np.zeros((batch, seq), np.int32),
    }


def build_trainer_runner(model_fn, task, batch, steps, jit):
    """A callable running `steps` compiled training steps of the model built by model_fn."""
    strategy = distribution.get_strategy("")
    with strategy.scope():
        model = model_fn()
        model({k: batch[k][:1] for k in ("input_ids", "input_mask", "segment_ids")})
        optimizer = optimization.create_optimizer(optimization.OptimizerConfig(
            learning_rate=2e-5, num_train_steps=10**6, num_warmup_steps=100))
    cfg = LoopConfig(output_dir=tempfile.mkdtemp(),
                          train_batch_size=len(batch["input_ids"]),
                          iterations_per_loop=steps, jit_compile=jit,
                          dtype=keras.config.dtype_policy().compute_dtype)
    trainer = loop.TrainingLoop(strategy, model, optimizer, cfg, task)
    return train_steps_runner(strategy, trainer, batch, steps)


# --- classifier (the baseline) -------------------------------------------------------------


def build_classifier(config, batch_size, seq, steps, jit, args):
    from modeling.models import BertClassifier
    from tasks.common.classifier_task import ClassifierTask

    rng, batch = encoder_batch(batch_size, seq, config.vocab_size)
    batch["label_ids"] = rng.integers(0, CLASSIFIER_LABELS, (batch_size,)).astype(np.int32)
    batch["is_real_example"] = np.ones((batch_size,), np.int32)
    return build_trainer_runner(lambda: BertClassifier(config, CLASSIFIER_LABELS),
                                ClassifierTask(CLASSIFIER_LABELS), batch, steps, jit)


# --- token tagging (run_ner.py) ------------------------------------------------------------


def tagging_batch(batch_size, seq, vocab):
    rng, batch = encoder_batch(batch_size, seq, vocab)
    batch["label_ids"] = rng.integers(0, TAGGING_LABELS, (batch_size, seq)).astype(np.int32)
    first_piece = rng.random((batch_size, seq)) < 0.7
    batch["label_weights"] = (first_piece & (batch["input_mask"] > 0)).astype(np.int32)
    return batch


def build_tagging(config, batch_size, seq, steps, jit, args):
    from modeling.models import BertTokenTagger
    from tasks.tagging.task import TaggingTask

    batch = tagging_batch(batch_size, seq, config.vocab_size)
    return build_trainer_runner(lambda: BertTokenTagger(config, TAGGING_LABELS),
                                TaggingTask(), batch, steps, jit)


def build_feature_based(config, batch_size, seq, steps, jit, args):
    from modeling.models import BertFeatureTagger
    from tasks.tagging.task import TaggingTask

    batch = tagging_batch(batch_size, seq, config.vocab_size)
    return build_trainer_runner(
        lambda: BertFeatureTagger(config, TAGGING_LABELS, feature_layers="concat_last_four",
                                  lstm_units=args.lstm_units),
        TaggingTask(), batch, steps, jit)


# --- multiple choice (run_swag.py) ---------------------------------------------------------


def build_multiple_choice(config, batch_size, seq, steps, jit, args):
    """`BertMultipleChoice` + the classifier's loss over the choices (run_swag.py):
    batch_size // num_choices examples of num_choices choices, i.e. the classifier's number
    of sequences per step (its examples/s below are sequences/s)."""
    from modeling.models import BertMultipleChoice
    from tasks.common.classifier_task import ClassifierTask

    examples = batch_size // args.num_choices
    rng, flat = encoder_batch(examples * args.num_choices, seq, config.vocab_size)
    batch = {k: v.reshape(examples, args.num_choices, seq) for k, v in flat.items()}
    batch["label_ids"] = rng.integers(0, args.num_choices, (examples,)).astype(np.int32)
    batch["is_real_example"] = np.ones((examples,), np.int32)
    return build_trainer_runner(lambda: BertMultipleChoice(config),
                                ClassifierTask(args.num_choices), batch, steps, jit)


HEADS = {
    "classifier": build_classifier,
    "tagging": build_tagging,
    "feature_based": build_feature_based,
    "multiple_choice": build_multiple_choice,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="small,base")
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--heads", default=",".join(HEADS),
                        help=f"comma-separated, from {', '.join(HEADS)} (classifier is "
                             "always run: the ratios are to it)")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4, help="steps per timed call")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lstm_units", type=int, default=768,
                        help="feature_based: BiLSTM units per direction (the paper's 768)")
    parser.add_argument("--num_choices", type=int, default=4,
                        help="multiple_choice: choices per example (SWAG's 4)")
    parser.add_argument("--jit_compile", action="store_true")
    args = parser.parse_args()
    heads = ["classifier"] + [h for h in args.heads.split(",") if h and h != "classifier"]
    unknown = [h for h in heads if h not in HEADS]
    if unknown:
        parser.error(f"unknown heads {unknown}; expected {list(HEADS)}")

    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
          f"{os.cpu_count()} CPU(s); batch {args.batch_size}, seq {args.seq_length}, "
          f"{args.steps} steps/call, {args.rounds} rounds, jit_compile={args.jit_compile}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    for size in args.sizes.split(","):
        config = BertConfig(vocab_size=VOCAB, **SIZES[size])
        for dtype in args.dtypes.split(","):
            keras.config.set_dtype_policy(POLICIES[dtype])
            runners = {h: HEADS[h](config, args.batch_size, args.seq_length, args.steps,
                                   args.jit_compile, args) for h in heads}
            load_before = os.getloadavg()[0]
            cpu: dict = {}
            times = time_rounds(runners, args.rounds, cpu)
            load_after = os.getloadavg()[0]
            keras.config.set_dtype_policy("float32")
            base_wall = statistics.median(times["classifier"])
            base_cpu = statistics.median(cpu["classifier"])
            for name in heads:
                wall, cpu_s = statistics.median(times[name]), statistics.median(cpu[name])
                eps = args.steps * args.batch_size / wall
                print(f"{size:5s} {dtype:8s} {name:14s} {eps:8.2f} examples/s, "
                      f"{cpu_s / args.steps:.2f} CPU s/step; vs classifier: "
                      f"{base_wall / wall:.2f}x examples/s (wall), {base_cpu / cpu_s:.2f}x "
                      f"(CPU time); rounds {' '.join(f'{t:.1f}' for t in times[name])} s",
                      flush=True)
            print(f"{size:5s} {dtype:8s} load average {load_before:.2f} -> {load_after:.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
