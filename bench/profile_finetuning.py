"""Where a bucketed fine-tuning step and a bucketed prediction pass spend their time, by op type.

    .venv/bin/python bench/profile_finetuning.py --size=small --dtype=float32

The set-up of `bench_bucketing.py` (real sentences, `ClassificationFamily`, the runner's
trainer, default length buckets). Profiled under `tf.profiler.experimental` as
`profile_train_step.py` does (host XPlane read back, no TensorBoard plugin): `--calls`
training calls of `--steps` steps, then one prediction pass over the test split. Printed:
the wall time, the op time summed over TensorFlow's executor threads, and the costliest op
types, so what is not compute (input pipeline, Python, host round trips) shows as the gap.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402

from bench_bucketing import POLICIES, write_tasks  # noqa: E402
from bench_squad import SIZES  # noqa: E402
from modeling.config import BertConfig  # noqa: E402
from profile_train_step import profile  # noqa: E402
from tasks.classification import processors  # noqa: E402
from tasks.classification.task import ClassificationFamily, ClassificationSettings  # noqa: E402
from training import distribution, finetuning, trainer_setup  # noqa: E402
from training.flags import default_bucket_boundaries  # noqa: E402
from training.settings import LoopConfig  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    keras.config.set_dtype_policy(POLICIES[args.dtype])
    root = tempfile.mkdtemp()
    data = write_tasks(root, 1.0)
    layers, hidden, heads = SIZES[args.size]
    config = BertConfig(vocab_size=8000, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=4 * hidden)
    buckets = default_bucket_boundaries(128)
    settings, _ = finetuning.settings_from(
        vocab_file=data["vocab"], bert_config_file="unused", output_dir=root,
        max_seq_length=128, do_train=True, do_predict=True, train_batch_size=args.batch_size,
        predict_batch_size=args.batch_size, bucket_boundaries=buckets)
    family = ClassificationFamily(ClassificationSettings(
        "custom", data["single"], custom=processors.CustomDataConfig(text_a_column="sentence",
                                                             label_column="label")), 128)
    family.input_options = finetuning.InputOptions(128, buckets)
    prepared = family.prepare(settings)
    strategy = distribution.get_strategy("")
    _, trainer = trainer_setup.build_trainer(
        strategy, lambda: family.build_model(config), family.loop_task(),
        loop_config=LoopConfig.for_run(
            settings.loop, output_dir=tempfile.mkdtemp(), num_train_steps=10**6,
            num_warmup_steps=10, train_batch_size=args.batch_size,
            eval_batch_size=args.batch_size),
        max_seq_length=128)
    iterator = iter(strategy.distribute_datasets_from_function(
        lambda ctx: family.dataset(prepared.train, batch_size=args.batch_size,
                                   is_training=True, input_context=ctx, seed=1)))
    test = prepared.predict_splits[0]
    work = {
        f"train ({args.steps} steps of batch {args.batch_size})":
            (lambda: trainer.run_train_steps(iterator, args.steps), args.calls),
        f"predict ({test.num_examples} examples, batch {args.batch_size})":
            (lambda: family.predict_outputs(trainer, test, args.batch_size,
                                            output_keys=("logits",)), 1),
    }
    for name, (fn, calls) in work.items():
        by_type, by_phase, _ = profile(fn, calls)  # warms up first
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            fn()
        wall = (time.perf_counter() - start) * 1000 / calls
        cpu = (time.process_time() - cpu) * 1000 / calls
        total = sum(by_type.values())
        print(f"== {args.size} {args.dtype} {name}: {wall:.0f} ms wall, {cpu:.0f} ms CPU per "
              f"call (unprofiled); {total:.0f} ms of op time summed over threads; "
              + ", ".join(f"{k} {v:.0f} ms" for k, v in by_phase.items()), flush=True)
        for op_type, ms in by_type.most_common(args.top):
            print(f"   {op_type:40s} {ms:9.1f} ms {100 * ms / total:5.1f}%", flush=True)


if __name__ == "__main__":
    main()
