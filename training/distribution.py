"""Owns the choice and set-up of the tf.distribute strategy (TPU initialisation lives here only).

`get_strategy` always returns a `tf.distribute.Strategy`, so library code never branches on
the strategy type:

    "default"                -> the default (no-op) strategy
    "one_device"             -> OneDeviceStrategy on the first GPU, else the CPU
    "mirrored"               -> MirroredStrategy over the local GPUs (or logical CPUs)
    "multi_worker_mirrored"  -> MultiWorkerMirroredStrategy from TF_CONFIG
    "tpu"                    -> TPUStrategy after connecting to and initialising the TPU
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from data_prep.cli import UserError

STRATEGIES = ("default", "one_device", "mirrored", "multi_worker_mirrored", "tpu")


def default_strategy_name(*, use_tpu=False, num_gpus=None):
    """The sensible strategy for this machine: tpu if asked, workers from TF_CONFIG, GPUs."""
    if use_tpu:
        return "tpu"
    tf_config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    workers = tf_config.get("cluster", {}).get("worker", [])
    if len(workers) + len(tf_config.get("cluster", {}).get("chief", [])) > 1:
        return "multi_worker_mirrored"
    if num_gpus is None:
        num_gpus = len(tf.config.list_physical_devices("GPU"))
    return "mirrored" if num_gpus > 1 else "one_device"


def configure_cpu_devices(count):
    """Splits the host CPU into `count` logical devices (must run before TF initialises).

    This lets MirroredStrategy run with several replicas on a CPU-only machine (tests, demos).
    """
    if count <= 1:
        return
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
    except RuntimeError as err:
        existing = len(tf.config.list_logical_devices("CPU"))
        if existing != count:
            raise RuntimeError(
                f"num_cpu_devices={count} must be set before TensorFlow initialises its "
                f"devices (it already has {existing} logical CPU device(s))") from err


def get_strategy(name="one_device", *, tpu=None, tpu_zone=None, gcp_project=None,
                 num_gpus=0, num_cpu_devices=0, all_reduce="auto"):
    """Returns the `tf.distribute.Strategy` called `name`.

    Args:
      name: one of STRATEGIES (or "" / None for `default_strategy_name()`).
      tpu: TPU name or grpc address for "tpu" ("" or "local" for a TPU VM).
      tpu_zone, gcp_project: passed to the TPU cluster resolver.
      num_gpus: GPUs to use for "one_device" / "mirrored" (0: every visible GPU for mirrored).
      num_cpu_devices: with no GPU, split the CPU into this many logical devices for
        "mirrored" (call before TensorFlow initialises).
      all_reduce: "auto", "ring" or "nccl" collective implementation for multi-worker.
    """
    name = name or default_strategy_name(num_gpus=num_gpus or None)
    if name not in STRATEGIES:
        raise UserError(f"--distribution_strategy must be one of {STRATEGIES}, found {name!r}")
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "tpu":
        return _tpu_strategy(tpu, tpu_zone, gcp_project)
    if name == "multi_worker_mirrored":
        implementation = {
            "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
            "ring": tf.distribute.experimental.CommunicationImplementation.RING,
            "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
        }[all_reduce]
        options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)

    configure_cpu_devices(num_cpu_devices)
    gpus = tf.config.list_logical_devices("GPU")
    if name == "one_device":
        if num_gpus and not gpus:
            raise UserError(f"--num_gpus={num_gpus} but TensorFlow sees no GPU")
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    # mirrored
    if gpus:
        devices = [d.name for d in gpus[: num_gpus or len(gpus)]]
        if num_gpus and len(devices) < num_gpus:
            raise UserError(f"--num_gpus={num_gpus} but TensorFlow sees {len(gpus)} GPU(s)")
    else:
        devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    cross_device_ops = None
    if not gpus:
        cross_device_ops = tf.distribute.ReductionToOneDevice(reduce_to_device="/cpu:0")
    return tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=cross_device_ops)


def _tpu_strategy(tpu, tpu_zone, gcp_project):
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu=tpu if tpu not in (None, "local") else "", zone=tpu_zone, project=gcp_project)
    if tpu not in (None, "", "local"):
        tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def feeds_from_host(strategy) -> bool:
    """True when the training loop can feed the GLOBAL batch from one host-side `tf.data`
    iterator (checkpointable: exact resume) and split it among the replicas itself: every
    strategy here but TPUStrategy, whose replicas must be fed by its own distributed
    dataset (infeed), and whose distributed iterator TensorFlow cannot checkpoint."""
    tpu_types = (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)
    return not isinstance(strategy, tpu_types)


def is_chief(strategy):
    """True on the worker that writes final files (the only worker outside multi-worker)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "cluster_spec", None):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type is None:
        return True
    if task_type == "chief":
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return task_type == "worker" and task_id == 0 and not has_chief


def worker_id(strategy):
    """(task_type, task_id) of this process, ("worker", 0) outside multi-worker."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or resolver.task_type is None:
        return "worker", 0
    return resolver.task_type, int(resolver.task_id or 0)
