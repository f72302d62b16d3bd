"""Owns how to train: `LoopConfig`, the one settings type of the loop and its optimizer, for pretraining and fine-tuning alike.

Runners build it from the shared flags (`training.flags.loop_settings`, named as the
flags); building it checks the loop's periods and counts (`check_loop_settings`), and
`optimizer_config()` checks the optimizer's (`modeling.optimization.OptimizerConfig`), each
once. A fine-tuning run (`training.finetuning.FinetuningRun.loop`) holds the shared
settings and sets its own `PER_RUN` fields per grid point and seed.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """How to train: the loop's settings and its optimizer's, the one settings type of
    pretraining and fine-tuning; runners build it from the shared flags (named as them).

    Attributes:
      output_dir: checkpoints, TensorBoard summaries and result files.
      num_train_steps: optimizer updates to reach (a resumed run continues to it).
      train_batch_size: GLOBAL examples per optimizer update (all replicas, all micro-batches).
      eval_batch_size: global examples per eval step.
      iterations_per_loop: steps run by one call of the compiled training function.
      save_checkpoints_steps: checkpoint period in steps.
      log_steps: a progress line (and summaries) at least this many steps apart, rounded
        up to the call granularity.
      max_eval_steps: eval batches (fewer if the eval data runs out).
      gradient_accumulation_steps: micro-batches per update (divides the replica batch).
      dtype: "float32", "bfloat16" or "float16" (float16 uses dynamic loss scaling); the
        Keras dtype policy itself is set by the runner before the model is built.
      jit_compile: compile the forward/backward pass with XLA.
      keep_checkpoint_max: checkpoints kept in output_dir.
      learning_rate, num_warmup_steps, optimizer, weight_decay_rate, clip_norm: the
        optimizer's settings (`optimizer_config`).
      divergence_factor: a run whose recent loss exceeds this many times the loss it
        started at has diverged (`training.loop`); 0 turns that check off (a NaN or Inf
        loss or gradient always stops the run).

    The fine-tuning settings (`training.finetuning.FinetuningRun.loop`) hold the shared
    ones; each run sets its own `PER_RUN` fields when it is built.

    Raises:
      ValueError: a period or count below 1, naming its flag (`check_loop_settings`),
        or a divergence_factor between 0 and 2.
    """

    output_dir: str
    num_train_steps: int = 100000
    train_batch_size: int = 32
    eval_batch_size: int = 8
    iterations_per_loop: int = 1000
    save_checkpoints_steps: int = 1000
    log_steps: int = 100
    max_eval_steps: int = 100
    gradient_accumulation_steps: int = 1
    dtype: str = "float32"
    jit_compile: bool = False
    keep_checkpoint_max: int = 5
    learning_rate: float = 5e-5
    num_warmup_steps: int = 10000
    optimizer: str = "adamw"
    weight_decay_rate: float = 0.01
    clip_norm: float = 1.0
    divergence_factor: float = 10.0

    def __post_init__(self):
        if not (self.divergence_factor == 0 or self.divergence_factor >= 2):
            raise ValueError(f"--divergence_factor={self.divergence_factor} must be 0 (no "
                             "loss check) or at least 2")
        check_loop_settings(iterations_per_loop=self.iterations_per_loop,
                            save_checkpoints_steps=self.save_checkpoints_steps,
                            log_steps=self.log_steps,
                            keep_checkpoint_max=self.keep_checkpoint_max,
                            gradient_accumulation_steps=self.gradient_accumulation_steps)

    def optimizer_config(self):
        """The `modeling.optimization.OptimizerConfig` of these settings; building it
        checks them (ValueError naming the flag: `OptimizerConfig.validate`)."""
        from modeling import optimization

        return optimization.OptimizerConfig(
            learning_rate=self.learning_rate, num_train_steps=self.num_train_steps,
            num_warmup_steps=self.num_warmup_steps, optimizer=self.optimizer,
            weight_decay_rate=self.weight_decay_rate, clip_norm=self.clip_norm)


# The LoopConfig fields each run sets itself (a fine-tuning run from its data and grid
# point); the others are the settings the runners' shared flags give.
PER_RUN = ("output_dir", "num_train_steps", "num_warmup_steps", "train_batch_size",
           "eval_batch_size", "max_eval_steps")


def check_loop_settings(**settings: int) -> None:
    """Raises ValueError naming the flag of a loop period or count below 1
    (iterations_per_loop, save_checkpoints_steps, log_steps, keep_checkpoint_max,
    gradient_accumulation_steps): 0 has no meaning for them (a checkpoint every 0 steps,
    0 checkpoints kept), so it is refused rather than silently taken as 1. The one check
    of these settings (`LoopConfig`, for pretraining and fine-tuning, before any work)."""
    for name, value in settings.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"--{name}={value} must be a whole number >= 1")
