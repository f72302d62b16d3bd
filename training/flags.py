"""Owns the runners' shared absl flags, their conversion to configs, and the fine-tuning command skeleton.

Runners call `define_common_flags()` (plus their own) and state their own defaults of the
shared flags (`use_defaults`: what --helpfull shows is what runs), then build plain frozen
dataclasses: `runtime_config(FLAGS)` (a `training.execution.RuntimeConfig`) and
`loop_settings(FLAGS)` (the `training.settings.LoopSettings` flags), which pretraining
(`run_pretraining.py`) and fine-tuning (`finetuning_values(FLAGS)` through
`training.finetuning.settings_from`) both pass, with their other flags by name, to
`training.settings.settings_of`. A fine-tuning runner is a `FinetuningCommand`: its
own flags, defaults and task family; the skeleton (flags -> settings -> run -> one-line
errors) is here once. Which flag applies to which mode is one rule for every runner
(`check_modes` over `SHARED_MODES` and each runner's `OnlyWith` table, `MODES`): a flag
given in another mode is refused, never parsed and ignored. Libraries never see FLAGS,
and nothing below the runners imports this module. Flag names and meanings follow
Google's original runners; the new ones (distribution_strategy, dtype, ...) are
documented inline.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Generic, Sequence, TypeVar

from absl import flags

from data_prep.cli import UserError
from training.execution import DTYPE_POLICIES, RuntimeConfig
from training.finetuning import FinetuningRun

FLAGS = flags.FLAGS

DTYPES = tuple(DTYPE_POLICIES)  # float32, bfloat16, float16
STRATEGY_NAMES = ("", "one_device", "mirrored", "multi_worker_mirrored", "tpu")


def define_once(define, name, *args, **kwargs):
    if name not in FLAGS:
        define(name, *args, **kwargs)


# flag -> the default it was defined with, for every flag a runner gave its own default.
_DEFINED_DEFAULTS: dict = {}


def use_defaults(defaults: dict, values=FLAGS) -> None:
    """Gives the flags this runner's defaults: those in `defaults`, the defined ones for the
    rest (a flag another runner of this process changed goes back to its definition's).

    A flag shared by several runners has one definition per process (absl), with the
    default of whichever module defined it first; each runner states its own here, at
    import (before the command line is parsed, so --help and --helpfull show them) and
    again when it reads its flags (`run_config_from_flags`: absl then also updates the
    value of a flag not given on the command line), so what the help says is what runs.
    """
    for name in set(_DEFINED_DEFAULTS) | set(defaults):
        _DEFINED_DEFAULTS.setdefault(name, values[name].default)
        values.set_default(name, defaults.get(name, _DEFINED_DEFAULTS[name]))


class _GridParser(flags.ArgumentParser):
    """One value, parsed and checked by `base` exactly as a plain flag of its type, or
    comma-separated values (a tuple of them): the hyperparameters a fine-tuning grid spans.

    The flag's type stays the base's ("float", "int"): a single value is what it always was.
    """

    def __init__(self, base):
        self.base = base
        self.syntactic_help = f"{base.syntactic_help}, or comma-separated values"

    def parse(self, argument):
        if isinstance(argument, str) and "," in argument:
            items = [item.strip() for item in argument.split(",")]
        elif isinstance(argument, (list, tuple)):
            items = list(argument)
        else:
            return self.base.parse(argument)
        values = tuple(self.base.parse(item) for item in items)
        if len(set(values)) != len(values):
            raise ValueError(f"a value is repeated: {', '.join(map(str, values))}")
        return values[0] if len(values) == 1 else values

    def flag_type(self):
        return self.base.flag_type()


class _GridSerializer(flags.ArgumentSerializer):
    """Writes a grid flag back as its command line spells it (a flagfile round trip)."""

    def serialize(self, value):
        if isinstance(value, tuple):
            return ",".join(str(v) for v in value)
        return str(value)


def define_grid_flag(name, default, base_parser, help_text):
    """Defines (once) a float/int flag that also takes comma-separated values (a grid)."""
    if name not in FLAGS:
        flags.DEFINE(_GridParser(base_parser), name, default, help_text,
                     serializer=_GridSerializer())


def grid_values(values, name) -> tuple:
    """A grid flag's values as a tuple (one element for a single value)."""
    value = values[name].value
    return tuple(value) if isinstance(value, tuple) else (value,)


def refuse_grids(values, names, program) -> None:
    """Refuses several values of a grid flag in a runner that takes one (run_pretraining),
    naming the flag: a grid is for the fine-tuning runners."""
    for name in names:
        value = values[name].value
        if isinstance(value, tuple):
            raise flags.ValidationError(
                f"--{name}={','.join(map(str, value))}: {program} takes one value (a grid "
                "of comma-separated values is for the fine-tuning runners)")


@dataclasses.dataclass(frozen=True)
class OnlyWith:
    """Flags that mean something in one mode of a command only: given in another, they
    would be parsed and then ignored, so they are refused (`check_modes`).

    Attributes:
      flags: the flags of the mode.
      mode: the mode as the message names it ("--long_document=windows").
      applies: FlagValues -> whether the command runs in that mode.
    """

    flags: tuple
    mode: str
    applies: Callable


def flag_is(name: str, *values) -> Callable:
    """`OnlyWith.applies` for "--name is one of `values`" (strings compared lower-cased,
    as the runners read task names)."""
    def applies(flag_values) -> bool:
        value = flag_values[name].value
        return (value.strip().lower() if isinstance(value, str) else value) in values
    return applies


def flag_given(name: str) -> Callable:
    """`OnlyWith.applies` for "--name is set" (not empty, not false)."""
    return lambda flag_values: bool(flag_values[name].value)


def _on_tpu(values) -> bool:
    return "use_tpu" in values and (values.use_tpu or values.distribution_strategy == "tpu")


def _bucketing(values) -> bool:
    """--bucket_by_length as the run takes it: off under TPU unless given."""
    if _on_tpu(values) and not values["bucket_by_length"].present:
        return False
    return values.bucket_by_length


# Which shared flags apply to which mode, for every runner (a runner adds its own table).
SHARED_MODES = (
    OnlyWith(("tpu_name", "tpu_zone", "gcp_project", "master", "num_tpu_cores"),
             "--distribution_strategy=tpu (or --use_tpu)", _on_tpu),
    OnlyWith(("bucket_boundaries",), "--bucket_by_length", _bucketing),
    OnlyWith(("seed",), "one run, not with --seeds (each of its runs has its seed)",
             lambda values: "seeds" not in values or not values.seeds),
)


def check_modes(values, *tables) -> None:
    """Refuses (FlagError, one line naming the flag and its mode) a flag given on the
    command line in a mode it does not apply to: the rule of every runner, `SHARED_MODES`
    and the runner's own `OnlyWith` table. A flag the runner does not define is skipped."""
    from data_prep.cli import FlagError

    for rule in (*SHARED_MODES, *(rule for table in tables for rule in table)):
        given = [name for name in rule.flags if name in values and values[name].present]
        if given and not rule.applies(values):
            raise FlagError(f"--{given[0]} only applies with {rule.mode}")


def define_common_flags():
    """Flags every runner shares (the original's names and defaults where they exist)."""
    d = define_once
    d(flags.DEFINE_string, "bert_config_file", None,
      "The config json file of the pre-trained BERT model (the architecture).")
    d(flags.DEFINE_string, "output_dir", None,
      "Where checkpoints, TensorBoard summaries and result files are written.")
    d(flags.DEFINE_string, "init_checkpoint", None,
      "Initial checkpoint: Google's TF1 checkpoint, a Hugging Face directory, or ours.")
    d(flags.DEFINE_integer, "max_seq_length", 128,
      "Maximum total input sequence length after WordPiece tokenization.")
    d(flags.DEFINE_bool, "do_train", False, "Whether to run training.")
    d(flags.DEFINE_bool, "do_eval", False, "Whether to run eval on the dev set.")
    define_grid_flag("train_batch_size", 32, flags.IntegerParser(),
                     "Total (global) batch size for training, over all replicas. Fine-tuning "
                     "runners: comma-separated values (e.g. 16,32) make a grid (see "
                     "--learning_rate).")
    d(flags.DEFINE_integer, "eval_batch_size", 8, "Total (global) batch size for eval.")
    define_grid_flag("learning_rate", 5e-5, flags.FloatParser(),
                     "The initial learning rate for Adam. Fine-tuning runners: comma-separated "
                     "values (e.g. 5e-5,4e-5,3e-5,2e-5) make a grid with those of "
                     "--train_batch_size and --num_train_epochs: every combination is trained "
                     "(times --seeds) in its own subdirectory of output_dir, the best on dev is "
                     "kept (docs/finetuning.md).")
    d(flags.DEFINE_integer, "save_checkpoints_steps", 1000,
      "How often to save the model checkpoint.")
    d(flags.DEFINE_integer, "iterations_per_loop", 1000,
      "How many steps to make in each compiled training call (host round trip).")
    d(flags.DEFINE_bool, "use_tpu", False, "Whether to use TPU (same as "
      "--distribution_strategy=tpu).")
    d(flags.DEFINE_string, "tpu_name", None,
      "The Cloud TPU to use: its name or grpc://ip:port; 'local' for a TPU VM.")
    d(flags.DEFINE_string, "tpu_zone", None, "GCE zone of the Cloud TPU (auto-detected if unset).")
    d(flags.DEFINE_string, "gcp_project", None,
      "GCP project of the Cloud TPU (auto-detected if unset).")
    d(flags.DEFINE_string, "master", None, "[Optional] TensorFlow master URL (TPU grpc address).")
    d(flags.DEFINE_integer, "num_tpu_cores", 8,
      "Only used if use_tpu: the TPU cores expected (TPUStrategy uses all the TPU's cores; a "
      "mismatch is reported).")
    # New in this port.
    d(flags.DEFINE_enum, "distribution_strategy", "", STRATEGY_NAMES,
      "one_device | mirrored | multi_worker_mirrored | tpu; empty: tpu if --use_tpu, "
      "multi_worker_mirrored if TF_CONFIG lists several workers, mirrored with several GPUs, "
      "else one_device.")
    d(flags.DEFINE_integer, "num_gpus", 0,
      "GPUs to use with one_device/mirrored (0: all visible GPUs).")
    d(flags.DEFINE_integer, "num_cpu_devices", 0,
      "Without GPUs: split the CPU into this many logical devices so mirrored has several "
      "replicas (testing distribution on a CPU-only machine).")
    d(flags.DEFINE_enum, "dtype", "float32", DTYPES,
      "Compute dtype: float32, bfloat16 (mixed, variables float32) or float16 (mixed, with "
      "dynamic loss scaling).")
    d(flags.DEFINE_bool, "jit_compile", False, "Compile the forward/backward pass with XLA.")
    d(flags.DEFINE_bool, "tf_data_autotune", True,
      "tf.data's autotuning model (TensorFlow's default) sizes the input pipelines' "
      "parallelism and buffers to the host; false: AUTOTUNE parallelism stays at the "
      "number of schedulable cores, with no model thread.")
    d(flags.DEFINE_enum, "optimizer", "adamw", ["adamw", "adamw_bias_corrected", "lamb"],
      "adamw: the original AdamWeightDecay rule; adamw_bias_corrected: the same with "
      "Adam's bias correction (PyTorch's AdamW); lamb: LAMB for large batches.")
    d(flags.DEFINE_integer, "gradient_accumulation_steps", 1,
      "Micro-batches per optimizer update; train_batch_size stays the global batch per update.")
    d(flags.DEFINE_float, "weight_decay_rate", 0.01,
      "Decoupled weight decay (not applied to LayerNorm and bias variables).")
    d(flags.DEFINE_float, "clip_norm", 1.0, "Global-norm gradient clipping; <= 0 disables.")
    d(flags.DEFINE_integer, "log_steps", 100,
      "Steps between progress lines and TensorBoard summaries (at least one compiled call).")
    d(flags.DEFINE_integer, "keep_checkpoint_max", 5, "Checkpoints kept in output_dir.")
    d(flags.DEFINE_float, "divergence_factor", 10.0,
      "Stop a run as diverged when its recent loss (a moving mean over about 10 steps) "
      "exceeds this many times the loss it started at (the mean of its first 10 steps, at "
      "least 1); 0 turns this check off (a NaN or Inf loss or gradient always stops the "
      "run). Raise it for a loss whose batches differ wildly (docs/pretraining.md, "
      "Divergence).")
    d(flags.DEFINE_integer, "seed", None,
      "Random seed for weights, dropout and input order (makes runs reproducible).")


def define_finetuning_flags():
    """Flags of the original fine-tuning runners (run_classifier, run_squad), defined once."""
    d = define_once
    d(flags.DEFINE_string, "vocab_file", None,
      "The vocabulary file that the BERT model was trained on.")
    d(flags.DEFINE_bool, "do_lower_case", True,
      "Whether to lower case the input text. Should be True for uncased models and False "
      "for cased models.")
    d(flags.DEFINE_bool, "do_predict", False, "Whether to run the model in inference mode "
      "on the test set.")
    d(flags.DEFINE_integer, "predict_batch_size", 8, "Total (global) batch size for predict.")
    define_grid_flag("num_train_epochs", 3.0, flags.FloatParser(),
                     "Total number of training epochs to perform. Comma-separated values (e.g. "
                     "2,3,4) make a grid (see --learning_rate).")
    d(flags.DEFINE_float, "warmup_proportion", 0.1,
      "Proportion of training to perform linear learning rate warmup for. E.g., 0.1 = 10% "
      "of training.")
    # New in this port.
    d(flags.DEFINE_list, "seeds", [],
      "Comma-separated seeds: one fine-tuning restart per seed (each in output_dir/seed_<s>), "
      "keeping the best dev score and reporting mean and spread. Empty: one run with --seed.")
    d(flags.DEFINE_bool, "keep_best_checkpoint", False,
      "Evaluate on dev at every checkpoint and keep the best one (primary metric) in "
      "output_dir/best; eval and predict then use it.")
    define_bucketing_flags()


def define_bucketing_flags():
    """--bucket_by_length and --bucket_boundaries (fine-tuning runners, extract_features)."""
    d = define_once
    d(flags.DEFINE_bool, "bucket_by_length", True,
      "Batch examples of similar length together and cut each batch to its length bucket "
      "(same results, much less padding). false: pad every batch to max_seq_length, the "
      "original's way. Off by default under the tpu strategy (static shapes).")
    d(flags.DEFINE_list, "bucket_boundaries", [],
      "Padded lengths of the length buckets, e.g. 32,64,128 (max_seq_length is always the "
      "last). Empty: powers of two from 16, then max_seq_length.")


def parse_seeds(values=FLAGS) -> tuple:
    """--seeds as a tuple of ints (empty: one run with --seed, `finetuning.settings_from`);
    refused as the grid flags refuse their values (an empty item, a repeat), or outside
    NumPy's seeds."""
    items = [str(item).strip() for item in values.seeds or ()]
    spelled = ",".join(items)
    seeds = []
    for item in items:
        try:
            seed = int(item)
        except ValueError:
            raise flags.ValidationError(f"--seeds={spelled}: {item!r} is not an "
                                        "integer") from None
        if not 0 <= seed < 2 ** 32:
            raise flags.ValidationError(f"--seeds={spelled}: {seed} is not a seed (0 to "
                                        "2**32 - 1)")
        seeds.append(seed)
    if len(set(seeds)) != len(seeds):
        raise flags.ValidationError(f"--seeds={spelled}: a seed is repeated")
    return tuple(seeds)


def split_patterns(value: str) -> tuple[str, ...]:
    """A comma-separated list of globs (--input_file) as a tuple, blanks dropped."""
    return tuple(p.strip() for p in value.split(",") if p.strip())


def runtime_config(values=FLAGS) -> RuntimeConfig:
    """Reads the shared runtime flags; `use_tpu` means the tpu strategy."""
    strategy = values.distribution_strategy
    if values.use_tpu:
        if strategy not in ("", "tpu"):
            raise flags.ValidationError(
                f"--use_tpu conflicts with --distribution_strategy={strategy}")
        strategy = "tpu"
    return RuntimeConfig(
        distribution_strategy=strategy,
        tpu=values.tpu_name or values.master,
        tpu_zone=values.tpu_zone,
        gcp_project=values.gcp_project,
        num_tpu_cores=values.num_tpu_cores,
        num_gpus=values.num_gpus,
        num_cpu_devices=values.num_cpu_devices,
        seed=values.seed,
        tf_data_autotune=values.tf_data_autotune,
    )


def loop_settings(values=FLAGS) -> dict:
    """The flags of `training.settings.LoopSettings` (the loop's and the optimizer's shared
    settings), by name: what pretraining and fine-tuning both build their `loop` from."""
    from training.settings import LoopSettings

    return {field.name: values[field.name].value
            for field in dataclasses.fields(LoopSettings)}


def finetuning_values(values=FLAGS) -> dict:
    """The shared fine-tuning flags as the keyword arguments of
    `training.finetuning.settings_from` (a grid flag's values as a tuple)."""
    max_seq_length = values.max_seq_length
    settings = loop_settings(values)
    settings.update(
        learning_rate=grid_values(values, "learning_rate"),
        train_batch_size=grid_values(values, "train_batch_size"),
        num_train_epochs=grid_values(values, "num_train_epochs"),
        bucket_boundaries=bucket_boundaries(values, max_seq_length),
        vocab_file=values.vocab_file, bert_config_file=values.bert_config_file,
        output_dir=values.output_dir, init_checkpoint=values.init_checkpoint,
        do_lower_case=values.do_lower_case, max_seq_length=max_seq_length,
        do_train=values.do_train, do_eval=values.do_eval, do_predict=values.do_predict,
        eval_batch_size=values.eval_batch_size, predict_batch_size=values.predict_batch_size,
        warmup_proportion=values.warmup_proportion, seeds=parse_seeds(values),
        keep_best_checkpoint=values.keep_best_checkpoint, runtime=runtime_config(values))
    return settings


def finetuning_run(values=FLAGS):
    """The shared fine-tuning flags as a `training.finetuning.FinetuningRun`."""
    from training import finetuning

    return finetuning.settings_from(**finetuning_values(values))[0]


# A task family's own settings (e.g. tasks.classification.task.ClassificationSettings).
TaskSettings = TypeVar("TaskSettings")


@dataclasses.dataclass(frozen=True)
class TaskRun(Generic[TaskSettings]):
    """A fine-tuning command's settings: the shared ones and its task family's own."""

    finetuning: FinetuningRun
    task: TaskSettings


@dataclasses.dataclass(frozen=True)
class FinetuningCommand:
    """A fine-tuning runner (run_classifier, run_squad, run_ner, run_swag): the skeleton
    they share (flags -> `TaskRun` -> `training.finetuning.run`), given what each adds.

    Attributes:
      program: the runner's file name, for its messages.
      own_settings: FlagValues -> its own flags, checked (UserError naming the flag), as
        keyword arguments of `task_settings`.
      task_settings: keyword arguments -> the family's settings.
      family: (task settings, max_seq_length) -> its `training.finetuning.TaskFamily`.
      defaults: its defaults of the shared flags (`use_defaults`; stated at import, so
        --helpfull shows them, and by `settings` for a program's keyword arguments).
      required: the flags a command line must give.
      check: TaskRun -> None, the runner's own checks, before the shared ones
        (`training.finetuning.validate`; run_squad: the original's validate_flags_or_throw).
      finish: (the run's result, the family) -> the command's result (default: as is).
      modes: the `OnlyWith` table of its own flags (`check_modes`).
    """

    program: str
    own_settings: Callable
    task_settings: Callable
    family: Callable
    defaults: dict = dataclasses.field(default_factory=dict)
    required: tuple = ("data_dir", "vocab_file", "bert_config_file", "output_dir")
    check: Callable | None = None
    finish: Callable | None = None
    modes: tuple = ()

    def __post_init__(self):
        use_defaults(self.defaults)

    def settings(self, **kwargs) -> TaskRun:
        """The `TaskRun` of flat keyword arguments named as the flags (this runner's
        defaults for those not given): the one way the settings are built, from the
        command line (`settings_from_flags`) or from a program."""
        from training import finetuning

        shared, own = finetuning.settings_from(**{**self.defaults, **kwargs})
        return TaskRun(shared, self.task_settings(**own))

    def settings_from_flags(self, values=FLAGS) -> TaskRun:
        """Checks the flags and turns them into a `TaskRun`."""
        use_defaults(self.defaults, values)
        for name in self.required:
            if not values[name].value:
                raise UserError(f"--{name} is required")
        check_modes(values, self.modes)
        own = self.own_settings(values)
        return self.settings(**finetuning_values(values), **own)

    def run(self, cfg: TaskRun) -> dict:
        """Fine-tunes, evaluates and predicts as `cfg` asks (`training.finetuning.run`:
        once per seed, per grid point).

        Returns:
          `training.finetuning.run`'s result (through `finish` when given): {"runs":
          [per-run dicts: seed, dir, eval (split -> figures), outputs, ...], "best_seed",
          "best_run", "summary" (seed statistics; empty for one seed)}.
        """
        from training import finetuning

        if self.check is not None:
            self.check(cfg)
        made = []

        def family():
            made.append(self.family(cfg.task, cfg.finetuning.max_seq_length))
            return made[0]

        result = finetuning.run(cfg.finetuning, family)
        return self.finish(result, made[0]) if self.finish else result

    def main(self, argv):
        """The runner's `main`: its flags run, bad input reported in one line."""
        from data_prep import cli

        del argv
        return cli.run_main(lambda: self.run(self.settings_from_flags(FLAGS)), self.program)


def bucket_boundaries(values, max_seq_length: int) -> tuple:
    """--bucket_by_length / --bucket_boundaries as the run's buckets (() = off)."""
    if not _bucketing(values):  # TPUs want one static shape unless asked otherwise.
        return ()  # --bucket_boundaries is refused then (`SHARED_MODES`)
    if values.bucket_boundaries:
        try:
            given = [int(v) for v in values.bucket_boundaries]
        except ValueError:
            raise flags.ValidationError(
                f"--bucket_boundaries={','.join(values.bucket_boundaries)}: integers "
                "expected") from None
        try:
            return check_bucket_boundaries(given, max_seq_length)
        except UserError as err:
            raise flags.ValidationError(str(err)) from None
    return default_bucket_boundaries(max_seq_length)


def default_bucket_boundaries(max_seq_length: int) -> tuple[int, ...]:
    """Powers of two from 16 below max_seq_length, then max_seq_length: (16, 32, 64, 128)."""
    out, length = [], 16
    while length < max_seq_length:
        out.append(length)
        length *= 2
    return tuple(out) + (int(max_seq_length),)


def check_bucket_boundaries(boundaries: Sequence[int], max_seq_length: int) -> tuple:
    """Sorted, unique boundaries ending at max_seq_length; UserError naming the flag."""
    values = sorted({int(b) for b in boundaries})
    if not values or values[0] < 1 or values[-1] > max_seq_length:
        raise UserError(f"--bucket_boundaries={','.join(map(str, boundaries))}: lengths must "
                        f"be in [1, --max_seq_length={max_seq_length}]")
    if values[-1] != max_seq_length:
        values.append(int(max_seq_length))
    return tuple(values)
