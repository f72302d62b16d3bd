"""Owns how to train: `LoopSettings` (the loop's and optimizer's settings every run of a command shares), `LoopConfig` (one run's: those plus its own output_dir, steps and batch sizes) and `PretrainingRun` (a pretraining run's settings).

A run's settings (`PretrainingRun` here, `training.finetuning.FinetuningRun`) hold a
`LoopSettings` as `loop` beside their own fields, and both are built the same way, from
keyword arguments named as the flags (`settings_of`; the runners pass
`training.flags.loop_settings` and their other flags). Each run builds its `LoopConfig`
from them (`LoopConfig.for_run`: pretraining once, fine-tuning per grid point and seed).
Building `LoopSettings` checks the loop's periods and counts (`check_loop_settings`);
`LoopConfig.optimizer_config()` checks the optimizer's (`modeling.config.OptimizerConfig`),
each once, before TensorFlow loads (this module and its imports are TensorFlow-free).
"""

from __future__ import annotations

import dataclasses

from data_prep.cli import UserError
from training.execution import RuntimeConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopSettings:
    """The loop's and its optimizer's settings that every run of a command shares (the
    runners' shared flags, named as them).

    Attributes:
      iterations_per_loop: steps run by one call of the compiled training function.
      save_checkpoints_steps: checkpoint period in steps.
      log_steps: a progress line (and summaries) at least this many steps apart, rounded
        up to the call granularity.
      gradient_accumulation_steps: micro-batches per update (divides the replica batch).
      keep_checkpoint_max: checkpoints kept in output_dir.
      dtype: "float32", "bfloat16" or "float16" (float16 uses dynamic loss scaling): the
        Keras dtype policy `training.execution.setup_runtime` sets before the model is
        built.
      jit_compile: compile the forward/backward pass with XLA.
      learning_rate, optimizer, weight_decay_rate, clip_norm: the optimizer's settings
        (`LoopConfig.optimizer_config`; a fine-tuning grid point has its own learning rate).
      divergence_factor: a run whose recent loss exceeds this many times the loss it
        started at has diverged (`training.loop`); 0 turns that check off (a NaN or Inf
        loss or gradient always stops the run).

    Raises:
      UserError: a period or count below 1, naming its flag (`check_loop_settings`), or a
        divergence_factor between 0 and 2.
    """

    iterations_per_loop: int = 1000
    save_checkpoints_steps: int = 1000
    log_steps: int = 100
    gradient_accumulation_steps: int = 1
    keep_checkpoint_max: int = 5
    dtype: str = "float32"
    jit_compile: bool = False
    learning_rate: float = 5e-5
    optimizer: str = "adamw"
    weight_decay_rate: float = 0.01
    clip_norm: float = 1.0
    divergence_factor: float = 10.0

    def __post_init__(self):
        if not (self.divergence_factor == 0 or self.divergence_factor >= 2):
            raise UserError(f"--divergence_factor={self.divergence_factor} must be 0 (no "
                            "loss check) or at least 2")
        check_loop_settings(iterations_per_loop=self.iterations_per_loop,
                            save_checkpoints_steps=self.save_checkpoints_steps,
                            log_steps=self.log_steps,
                            keep_checkpoint_max=self.keep_checkpoint_max,
                            gradient_accumulation_steps=self.gradient_accumulation_steps)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopConfig(LoopSettings):
    """One run's loop (what `training.loop.TrainingLoop` takes): the shared
    `LoopSettings` plus what the run itself decides.

    Attributes:
      output_dir: checkpoints, TensorBoard summaries and result files.
      num_train_steps: optimizer updates to reach (a resumed run continues to it).
      num_warmup_steps: the learning rate's linear warmup.
      train_batch_size: GLOBAL examples per optimizer update (all replicas, all micro-batches).
      eval_batch_size: global examples per eval step.
      max_eval_steps: eval batches (fewer if the eval data runs out).
    """

    output_dir: str
    num_train_steps: int = 100000
    num_warmup_steps: int = 10000
    train_batch_size: int = 32
    eval_batch_size: int = 8
    max_eval_steps: int = 100

    @classmethod
    def for_run(cls, settings: LoopSettings, **run) -> "LoopConfig":
        """`settings` with the run's own fields (`run`: output_dir, steps, batch sizes; a
        shared setting given there, such as a grid point's learning_rate, wins)."""
        return cls(**{**shared_settings(settings), **run})

    def optimizer_config(self):
        """The `modeling.config.OptimizerConfig` of these settings; building it
        checks them (UserError naming the flag: `OptimizerConfig.validate`)."""
        from modeling.config import OptimizerConfig

        return OptimizerConfig(
            learning_rate=self.learning_rate, num_train_steps=self.num_train_steps,
            num_warmup_steps=self.num_warmup_steps, optimizer=self.optimizer,
            weight_decay_rate=self.weight_decay_rate, clip_norm=self.clip_norm)


def shared_settings(settings: LoopSettings) -> dict:
    """The `LoopSettings` fields of `settings` (a `LoopConfig` too), by name."""
    return {field.name: getattr(settings, field.name)
            for field in dataclasses.fields(LoopSettings)}


def settings_of(run_type, **kwargs) -> tuple:
    """(a `run_type`, the keyword arguments it does not take) from keyword arguments named
    as the flags: its fields, and its `loop` (`LoopSettings`) from the shared ones. How
    pretraining and fine-tuning build their settings, from the command line or a program."""
    loop_names = {field.name for field in dataclasses.fields(LoopSettings)}
    run_names = {field.name for field in dataclasses.fields(run_type)} - {"loop"}
    loop = LoopSettings(**{k: kwargs.pop(k) for k in list(kwargs) if k in loop_names})
    run = run_type(loop=loop, **{k: kwargs.pop(k) for k in list(kwargs) if k in run_names})
    return run, kwargs


def check_loop_settings(**settings: int) -> None:
    """Raises UserError naming the flag of a loop period or count below 1
    (iterations_per_loop, save_checkpoints_steps, log_steps, keep_checkpoint_max,
    gradient_accumulation_steps): 0 has no meaning for them (a checkpoint every 0 steps,
    0 checkpoints kept), so it is refused rather than silently taken as 1. The one check
    of these settings (`LoopSettings`, for pretraining and fine-tuning, before any work)."""
    for name, value in settings.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"--{name}={value} must be a whole number >= 1")


@dataclasses.dataclass(frozen=True)
class Phase2:
    """The second phase of a two-phase run (the paper's Appendix A.2): from step
    `start_step` to num_train_steps on other records, longer ones."""

    input_patterns: tuple
    start_step: int
    max_seq_length: int
    max_predictions_per_seq: int
    train_batch_size: int


@dataclasses.dataclass(frozen=True)
class PretrainingRun:
    """Everything one pretraining run needs (`training.pretraining.run`), read from flags
    once (`settings_of`, as fine-tuning's settings). Building it checks the optimizer's
    settings (UserError naming the flag), so run_pretraining.py refuses them before
    TensorFlow loads."""

    bert_config_file: str
    input_patterns: tuple
    output_dir: str
    init_checkpoint: str | None
    max_seq_length: int
    max_predictions_per_seq: int
    do_train: bool
    do_eval: bool
    train_batch_size: int
    eval_batch_size: int
    input_compression: str
    runtime: RuntimeConfig
    num_train_steps: int = 100000
    num_warmup_steps: int = 10000
    max_eval_steps: int = 100
    # The loop's and the optimizer's shared settings (the run's LoopConfig: `loop_config`).
    loop: LoopSettings = LoopSettings()
    # Dynamic masking (unmasked records): None where the flag was not given.
    vocab_file: str | None = None
    masked_lm_prob: float | None = None
    do_whole_word_mask: bool | None = None
    mask_token_rate: float | None = None
    random_token_rate: float | None = None
    # The objective (the paper's Table 5) and the optional second phase (Appendix A.2).
    next_sentence_prediction: bool = True
    objective: str = "mlm"
    phase2: Phase2 | None = None

    def __post_init__(self):
        self.loop_config().optimizer_config()

    def loop_config(self) -> LoopConfig:
        """The run's loop: its shared settings with its output_dir, steps and batch sizes."""
        return LoopConfig.for_run(
            self.loop, output_dir=self.output_dir, num_train_steps=self.num_train_steps,
            num_warmup_steps=self.num_warmup_steps, train_batch_size=self.train_batch_size,
            eval_batch_size=self.eval_batch_size, max_eval_steps=self.max_eval_steps)
