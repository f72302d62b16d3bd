"""Runs BERT pretraining (masked LM + next sentence) from TFRecords under any strategy.

Same flags as Google's run_pretraining.py, plus distribution, precision and optimizer
flags (see training/flags.py and docs/pretraining.md), the paper's studies (Table 5's
objectives: `--next_sentence_prediction=false`, `--objective=ltr`; Table 8's masking split
with dynamic masking: `--mask_token_rate`, `--random_token_rate`) and its two-phase
schedule (Appendix A.2: `--phase2_input_file`, 90% of the steps at `--max_seq_length`, the
rest at `--phase2_max_seq_length`, one run). The runner only parses flags into a
`training.settings.PretrainingRun` and calls `training.pretraining.run`:

    python run_pretraining.py --input_file=out/*.tfrecord --output_dir=/tmp/pretrain \\
      --bert_config_file=bert_config.json --do_train --do_eval --train_batch_size=32 \\
      --max_seq_length=128 --max_predictions_per_seq=20 --num_train_steps=10000 \\
      --num_warmup_steps=1000 --learning_rate=1e-4
"""

from __future__ import annotations

from absl import flags

from data_prep import cli as shell
from data_prep.pretraining_data.config import MASKING_SETTINGS
from training import flags as common_flags
from training.settings import Phase2, PretrainingRun, settings_of

FLAGS = flags.FLAGS

common_flags.define_common_flags()
_define = common_flags.define_once
_define(flags.DEFINE_string, "input_file", None,
        "Input TF example files (can be a glob or comma separated).")
_define(flags.DEFINE_integer, "max_predictions_per_seq", 20,
        "Maximum number of masked LM predictions per sequence. Must match data generation.")
_define(flags.DEFINE_integer, "num_train_steps", 100000, "Number of training steps.")
_define(flags.DEFINE_integer, "num_warmup_steps", 10000, "Number of warmup steps.")
_define(flags.DEFINE_integer, "max_eval_steps", 100,
        "Maximum number of eval steps (at least 1, as the original's Estimator required; "
        "fewer when the eval records run out).")
_define(flags.DEFINE_string, "input_compression", "auto",
        "TFRecord compression: auto (GZIP for *.gz / *.gzip), GZIP, ZLIB or NONE.")
# Dynamic masking: only for unmasked records (create_pretraining_data --dynamic_masking),
# which are masked in the input pipeline with a fresh mask each epoch.
_define(flags.DEFINE_string, "vocab_file", None,
        "Unmasked records only: the vocab they were made with ([MASK], the random "
        "replacements, ## pieces). Required for them, refused for masked records.")
_define(flags.DEFINE_float, "masked_lm_prob", 0.15,
        "Unmasked records only: masked LM probability (as create_pretraining_data's).")
_define(flags.DEFINE_bool, "do_whole_word_mask", False,
        "Unmasked records only: mask all WordPieces of a word together.")
_define(flags.DEFINE_float, "mask_token_rate", 0.8,
        "Unmasked records only: of the positions chosen for prediction, the share shown as "
        "[MASK] (keras-hub's name; the paper's Table 8 'MASK').")
_define(flags.DEFINE_float, "random_token_rate", 0.1,
        "Unmasked records only: of the positions chosen for prediction, the share shown as "
        "a random vocabulary entry (Table 8 'RND'); the rest keep their token ('SAME').")
# The objectives of the paper's Table 5.
_define(flags.DEFINE_bool, "next_sentence_prediction", True,
        "False: the masked LM alone (the paper's 'No NSP'): no next-sentence head, loss or "
        "figures; the records' next_sentence_labels are not read.")
_define(flags.DEFINE_enum, "objective", "mlm", ["mlm", "ltr"],
        "mlm: the masked LM. ltr: a left-to-right LM (the paper's 'LTR & No NSP'): a causal "
        "encoder (written as causal_attention in output_dir/bert_config.json, which "
        "fine-tuning and export then read) predicting every next token of unmasked records "
        "(create_pretraining_data --next_sentence_prediction=false --dynamic_masking), no NSP.")
# The two-phase schedule of the paper's Appendix A.2, as one run.
_define(flags.DEFINE_string, "phase2_input_file", None,
        "Two phases in one run: after --phase1_steps steps on --input_file, train to "
        "--num_train_steps on these records (globs, comma separated) at "
        "--phase2_max_seq_length, keeping the weights, optimizer state and step.")
_define(flags.DEFINE_integer, "phase1_steps", None,
        "With --phase2_input_file: steps of phase 1 (default: 90%% of --num_train_steps, the "
        "paper's split).")
_define(flags.DEFINE_integer, "phase2_max_seq_length", 512,
        "With --phase2_input_file: the phase-2 records' max_seq_length.")
_define(flags.DEFINE_integer, "phase2_max_predictions_per_seq", None,
        "With --phase2_input_file: the phase-2 records' max_predictions_per_seq (default: "
        "--max_predictions_per_seq scaled by --phase2_max_seq_length / --max_seq_length, "
        "rounded up: the same share of the tokens, as the original's 20 at 128 and 80 at "
        "512).")
_define(flags.DEFINE_integer, "phase2_train_batch_size", None,
        "With --phase2_input_file: the global batch of phase 2 (default: --train_batch_size).")

# Which of this runner's flags apply to which mode (training/flags.py `check_modes`): the
# masking flags and the masked LM's prediction counts are the masked LM's (--objective=ltr
# predicts every next token); the --phase2_* flags a two-phase run's.
MODES = (
    common_flags.OnlyWith(
        MASKING_SETTINGS + ("max_predictions_per_seq", "phase2_max_predictions_per_seq"),
        "--objective=mlm (--objective=ltr masks nothing: it predicts every next token)",
        common_flags.flag_is("objective", "mlm")),
    common_flags.OnlyWith(("phase1_steps", "phase2_max_seq_length",
                           "phase2_max_predictions_per_seq", "phase2_train_batch_size"),
                          "--phase2_input_file (a two-phase run)",
                          common_flags.flag_given("phase2_input_file")),
)


# This runner's defaults of the flags runners share, shown by --helpfull and used when a
# flag is not given (training/flags.py `use_defaults`).
DEFAULTS = {}
common_flags.use_defaults(DEFAULTS)


def run_config_from_flags(values=FLAGS) -> PretrainingRun:
    """Validates the flags and turns them into a `PretrainingRun` (whose building checks
    the loop's and the optimizer's settings): all before TensorFlow loads."""
    common_flags.use_defaults(DEFAULTS, values)
    common_flags.refuse_grids(values, ("learning_rate", "train_batch_size"), "run_pretraining.py")
    common_flags.check_modes(values, MODES)
    if not values.do_train and not values.do_eval:
        raise shell.FlagError("At least one of `do_train` or `do_eval` must be True.")
    for name in ("bert_config_file", "input_file", "output_dir"):
        if not getattr(values, name):
            raise shell.FlagError(f"--{name} is required")
    if values.do_train and values.num_train_steps < 1:
        raise shell.FlagError(f"--num_train_steps={values.num_train_steps}: --do_train needs at "
                              "least one step")
    if values.max_eval_steps < 1:
        # The original's Estimator.evaluate refused it too ("Must specify steps > 0"): no
        # batch evaluated has no figures to report.
        raise shell.FlagError(f"--max_eval_steps={values.max_eval_steps} must be at least 1 (the "
                              "eval batches to read)")
    objective, next_sentence_prediction = _objective_from_flags(values)
    phase2 = _phase2_from_flags(values)
    settings, _ = settings_of(
        PretrainingRun, **common_flags.loop_settings(values),
        bert_config_file=values.bert_config_file,
        input_patterns=common_flags.split_patterns(values.input_file),
        output_dir=values.output_dir,
        init_checkpoint=values.init_checkpoint, max_seq_length=values.max_seq_length,
        max_predictions_per_seq=values.max_predictions_per_seq, do_train=values.do_train,
        do_eval=values.do_eval, train_batch_size=values.train_batch_size,
        eval_batch_size=values.eval_batch_size, num_train_steps=values.num_train_steps,
        num_warmup_steps=values.num_warmup_steps, max_eval_steps=values.max_eval_steps,
        input_compression=values.input_compression,
        runtime=common_flags.runtime_config(values),
        vocab_file=values.vocab_file or None,
        masked_lm_prob=values.masked_lm_prob if values["masked_lm_prob"].present else None,
        do_whole_word_mask=(values.do_whole_word_mask
                            if values["do_whole_word_mask"].present else None),
        mask_token_rate=values.mask_token_rate if values["mask_token_rate"].present else None,
        random_token_rate=(values.random_token_rate
                           if values["random_token_rate"].present else None),
        next_sentence_prediction=next_sentence_prediction, objective=objective,
        phase2=phase2)
    return settings


def _objective_from_flags(values) -> tuple:
    """(objective, next_sentence_prediction), refusing combinations that cannot be meant:
    NSP with the left-to-right LM, bad rates (its masking flags: `MODES`)."""
    from data_prep.pretraining_data.config import check_token_rates

    objective = values.objective
    nsp = values.next_sentence_prediction
    if objective == "ltr":
        if values["next_sentence_prediction"].present and nsp:
            raise shell.FlagError("--objective=ltr has no next sentence prediction (the paper's "
                                  "'LTR & No NSP'): drop --next_sentence_prediction=true")
        nsp = False
    check_token_rates(values.mask_token_rate, values.random_token_rate)
    return objective, bool(nsp)


def _phase2_from_flags(values) -> Phase2 | None:
    """The second phase from the --phase2_* flags (None without --phase2_input_file, whose
    companions are then refused: `MODES`): phase 1 is 90% of the steps unless
    --phase1_steps."""
    if not values.phase2_input_file:
        return None
    start = (values.phase1_steps if values.phase1_steps is not None
             else int(0.9 * values.num_train_steps))
    if not 1 <= start < values.num_train_steps:
        raise shell.FlagError(f"--phase1_steps={start} must be at least 1 and below "
                              f"--num_train_steps={values.num_train_steps} (phase 2 has the rest)")
    batch = (values.phase2_train_batch_size if values.phase2_train_batch_size is not None
             else values.train_batch_size)
    predictions = values.phase2_max_predictions_per_seq
    if predictions is None:  # the phase-1 share of the tokens, as 20 per 128 -> 80 per 512
        predictions = -(-values.max_predictions_per_seq * values.phase2_max_seq_length
                        // max(1, values.max_seq_length))
    for name, value in (("phase2_max_seq_length", values.phase2_max_seq_length),
                        ("phase2_max_predictions_per_seq", predictions),
                        ("phase2_train_batch_size", batch)):
        if value < 1:
            raise shell.FlagError(f"--{name}={value} must be positive")
    return Phase2(common_flags.split_patterns(values.phase2_input_file), start,
                  values.phase2_max_seq_length, predictions, batch)


def run(cfg: PretrainingRun) -> dict:
    """Runs `cfg` (`training.pretraining.run`; imported here, as it loads TensorFlow)."""
    from training import pretraining

    return pretraining.run(cfg)


def main(argv):
    del argv
    return shell.run_main(lambda: run(run_config_from_flags(FLAGS)), "run_pretraining.py")


if __name__ == "__main__":
    shell.start(main, "run_pretraining.py")
