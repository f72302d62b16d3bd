"""Writes a whole GLUE submission in one command: every task fine-tuned (grid, seeds, best on dev), zipped.

Each GLUE task of `--glue_dir` (the download layout: CoLA, SST-2, MRPC, STS-B, QQP, MNLI,
QNLI, RTE, WNLI, diagnostic) is fine-tuned as `run_classifier.py` does it, in
`output_dir/<Task>`, with the grid of `--learning_rate` / `--train_batch_size` /
`--num_train_epochs` values and `--seeds` (the paper's protocol; without --learning_rate:
5e-5,4e-5,3e-5,2e-5 with batch 32 and 3 epochs, Section 4.1); AX is predicted with MNLI's
best model; WNLI predicts the majority class (`--wnli=majority`, as the paper). The best
run's test predictions of every task, in the files GLUE's server takes, are checked and
zipped into `output_dir/submission.zip`. A killed run continues where it stopped;
`--collect_only` zips what finished task folders hold. See docs/run_classifier.md:

    python glue_submission.py --glue_dir=glue_data --output_dir=/tmp/glue \\
      --vocab_file=uncased_L-12_H-768_A-12/vocab.txt \\
      --bert_config_file=uncased_L-12_H-768_A-12/bert_config.json \\
      --init_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from absl import flags

from data_prep import cli as shell
from training import finetuning
from training import flags as common_flags

if TYPE_CHECKING:  # imported when the command runs (it loads TensorFlow)
    from tasks.classification.glue import GlueSettings

FLAGS = flags.FLAGS

common_flags.define_common_flags()
common_flags.define_finetuning_flags()
_define = common_flags.define_once
_define(flags.DEFINE_string, "glue_dir", None,
        "GLUE's data in the download layout: CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, "
        "WNLI, diagnostic (diagnostic.tsv, for AX). Optional with --collect_only (then the "
        "row counts are not checked against the test sets).")
_define(flags.DEFINE_list, "tasks", ["CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI",
                                     "RTE", "WNLI", "AX"],
        "The GLUE tasks to run (AX needs MNLI, whose finished run is reused). The zip is "
        "written once every task's files are in output_dir.")
_define(flags.DEFINE_enum, "wnli", "majority", ["majority", "finetune"],
        "WNLI: majority (the paper: every test example gets the most frequent label of the "
        "train and dev sets) or finetune (like the other tasks).")
_define(flags.DEFINE_bool, "skip_bad_rows", False,
        "Skip malformed rows (counted in the cache metadata) instead of failing on the first.")
_define(flags.DEFINE_bool, "collect_only", False,
        "Train nothing: check the submission files finished task folders of output_dir hold "
        "and zip them.")

# Section 4.1: "we selected the best fine-tuning learning rate (among 5e-5, 4e-5, 3e-5, and
# 2e-5) on the Dev set", batch 32 and 3 epochs (the shared flags' defaults).
PAPER_LEARNING_RATES = (5e-5, 4e-5, 3e-5, 2e-5)
# The run is always train -> dev -> test: these flags are not this command's to set.
_FIXED_FLAGS = ("do_train", "do_eval", "do_predict")


def _modes(values) -> tuple:
    """This command's `OnlyWith` table (training/flags.py `check_modes`): --collect_only
    trains nothing and reads no data, so only --output_dir applies with it."""
    ours = {flag.name for module, module_flags in values.flags_by_module_dict().items()
            if module in ("glue_submission", __name__) or module.startswith("training.")
            for flag in module_flags}
    return (common_flags.OnlyWith(tuple(sorted(ours - {"output_dir", "collect_only"})),
                                  "a run that trains, not with --collect_only",
                                  lambda flag_values: not flag_values.collect_only),
            common_flags.OnlyWith(("wnli",), "WNLI in --tasks",
                                  lambda flag_values: any(name.strip().lower() == "wnli"
                                                          for name in flag_values.tasks)))


@dataclasses.dataclass(frozen=True)
class GlueRun:
    """Everything the benchmark run needs, read from flags once (see the flag help)."""

    finetuning: finetuning.FinetuningRun
    glue: GlueSettings


# This runner's defaults of the flags runners share, shown by --helpfull and used when a
# flag is not given (training/flags.py `use_defaults`).
DEFAULTS = {"learning_rate": PAPER_LEARNING_RATES}
common_flags.use_defaults(DEFAULTS)


def run_config_from_flags(values=FLAGS) -> GlueRun:
    """Validates the flags and turns them into a `GlueRun`."""
    common_flags.use_defaults(DEFAULTS, values)
    common_flags.check_modes(values, _modes(values))
    for name in ("output_dir",) + (() if values.collect_only else (
            "glue_dir", "vocab_file", "bert_config_file")):
        if not getattr(values, name):
            raise shell.FlagError(f"--{name} is required")
    given = [name for name in _FIXED_FLAGS if values[name].present]
    if given:
        raise shell.FlagError(f"--{given[0]}: glue_submission.py always trains, evaluates on dev "
                              "and predicts the test sets")
    from tasks.classification import glue  # loads TensorFlow: after the flags' own checks

    settings = common_flags.finetuning_run(values)  # default: the paper's learning rates
    settings = dataclasses.replace(settings, do_train=True, do_eval=True, do_predict=True)
    return GlueRun(settings, glue.GlueSettings(
        glue_dir=values.glue_dir, tasks=glue.parse_tasks(values.tasks), wnli=values.wnli,
        collect_only=values.collect_only, skip_bad_rows=values.skip_bad_rows))


def run(cfg: GlueRun) -> dict:
    """Runs the benchmark as `cfg` asks (`tasks.classification.glue.run_benchmark`)."""
    from tasks.classification import glue

    if not cfg.glue.collect_only:
        finetuning.validate(cfg.finetuning)
    return glue.run_benchmark(cfg.finetuning, cfg.glue)


def main(argv):
    del argv
    return shell.run_main(lambda: run(run_config_from_flags(FLAGS)), "glue_submission.py")


if __name__ == "__main__":
    shell.start(main, "glue_submission.py")
