"""Op-level profile of one pretraining step: ours vs keras-hub's BertMaskedLM, by op type.

    .venv/bin/python bench/profile_train_step.py --size=small --steps=2

Runs the two steps of `bench_pretraining.py` under `tf.profiler.experimental`, reads the
host XPlane back (no TensorBoard plugin needed) and prints, per model, the summed duration
of each TensorFlow op type (forward and backward ops together; "Grad" in the op type or
the "gradients" scope in the op name marks the backward), biggest first.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: E402

from bench import bench_pretraining as bp  # noqa: E402
from modeling.config import BertConfig  # noqa: E402


def profile(fn, steps):
    logdir = tempfile.mkdtemp()
    fn()  # warm up (trace + first run) outside the profile
    tf.profiler.experimental.start(logdir)
    for _ in range(steps):
        fn()
    tf.profiler.experimental.stop()
    path = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))[-1]
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    by_type = collections.Counter()
    by_phase = collections.Counter()
    by_name = collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):  # executor threads (inter-op pool)
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" not in name or "::" in name:  # ops are "op_name:OpType"
                    continue
                op_name, _, op_type = name.rpartition(":")
                ms = event.duration_ps / 1e9 / steps
                by_type[op_type] += ms
                by_name[name] += ms
                backward = "gradient" in op_name.lower() or "Grad" in op_type
                by_phase["backward" if backward else "forward+optimizer"] += ms
    return by_type, by_phase, by_name


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--skip_keras_hub", action="store_true")
    parser.add_argument("--names", type=int, default=0, help="also list the N costliest ops")
    args = parser.parse_args()
    keras.config.set_dtype_policy(bp.POLICIES[args.dtype])
    config = BertConfig(vocab_size=bp.VOCAB, **bp.SIZES[args.size])
    batch = bp.synthetic_batch(16, 128, 20, bp.VOCAB)
    runners = {"ours": bp.build_ours(config, batch, 1, False)}
    if not args.skip_keras_hub:
        runners["keras-hub"] = bp.build_keras_hub(config, batch, 1, False)
    for name, fn in runners.items():
        by_type, by_phase, by_name = profile(fn, args.steps)
        total = sum(by_type.values())
        print(f"== {name}: {total:.0f} ms of op time per step; "
              + ", ".join(f"{k} {v:.0f} ms" for k, v in by_phase.items()))
        for op_type, ms in by_type.most_common(args.top):
            print(f"   {op_type:40s} {ms:9.1f} ms {100 * ms / total:5.1f}%")
        for op, ms in by_name.most_common(args.names):
            print(f"   {ms:9.1f} ms  {op}")


if __name__ == "__main__":
    main()
