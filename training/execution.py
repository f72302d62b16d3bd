"""Owns where a run executes: `RuntimeConfig` (strategy, devices, seed) and `setup_runtime` (with the run's precision).

Both the runners' flag conversion (`training/flags.py`) and the fine-tuning run
(`training/finetuning.py`) use them; they live here, below both, so that neither of those
two needs the other.
"""

from __future__ import annotations

import dataclasses

# The Keras dtype policy of each --dtype.
DTYPE_POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16",
                  "float16": "mixed_float16"}


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """Where to run: strategy, devices, seeding (precision and XLA are the loop's settings,
    `training.settings.LoopSettings`)."""

    distribution_strategy: str
    tpu: str | None = None
    tpu_zone: str | None = None
    gcp_project: str | None = None
    num_tpu_cores: int = 8
    num_gpus: int = 0
    num_cpu_devices: int = 0
    seed: int | None = None
    tf_data_autotune: bool = True  # tf.data's autotuning model in the input pipelines


def setup_runtime(runtime: RuntimeConfig, dtype: str = "float32"):
    """Seeds, creates the strategy (first, as multi-worker requires) and sets the Keras
    dtype policy of `dtype` (the run's `LoopSettings.dtype`).

    Returns:
      The `tf.distribute.Strategy`.
    """
    import keras
    from absl import logging

    from training import distribution

    strategy = distribution.get_strategy(
        runtime.distribution_strategy, tpu=runtime.tpu, tpu_zone=runtime.tpu_zone,
        gcp_project=runtime.gcp_project, num_gpus=runtime.num_gpus,
        num_cpu_devices=runtime.num_cpu_devices)
    if runtime.seed is not None:
        keras.utils.set_random_seed(runtime.seed)
    policy = DTYPE_POLICIES[dtype]
    keras.config.set_dtype_policy(policy)
    logging.info("Strategy %s with %d replica(s), dtype policy %s",
                 type(strategy).__name__, strategy.num_replicas_in_sync, policy)
    if runtime.distribution_strategy == "tpu" and (
            strategy.num_replicas_in_sync != runtime.num_tpu_cores):
        logging.warning("--num_tpu_cores=%d but the TPU has %d cores; using all of them",
                        runtime.num_tpu_cores, strategy.num_replicas_in_sync)
    return strategy
