"""Fine-tunes BERT on SQuAD v1.1 / v2.0, predicts answers and scores them with the official metrics.

Same flags as Google's run_squad.py, plus the shared distribution, precision and optimizer
flags (training/flags.py), `--do_eval` (the official EM/F1 on `--predict_file`), `--seeds`
and `--keep_best_checkpoint`; see docs/run_squad.md. The runner gives the shared
fine-tuning command (`training.flags.FinetuningCommand`) its flags, defaults, family and
result; the task (windows, post-processing, metrics, output files) is `tasks.squad`:

    python run_squad.py --vocab_file=uncased_L-12_H-768_A-12/vocab.txt \\
      --bert_config_file=uncased_L-12_H-768_A-12/bert_config.json \\
      --init_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \\
      --do_train --train_file=train-v1.1.json --do_predict --predict_file=dev-v1.1.json \\
      --train_batch_size=32 --learning_rate=3e-5 --num_train_epochs=2.0 \\
      --max_seq_length=384 --doc_stride=128 --output_dir=/tmp/squad_base
"""

from __future__ import annotations

from absl import flags

from data_prep import cli as shell
from training import flags as common_flags

FLAGS = flags.FLAGS

common_flags.define_common_flags()
common_flags.define_finetuning_flags()
_define = common_flags.define_once
_define(flags.DEFINE_string, "train_file", None,
        "SQuAD json for training. E.g., train-v1.1.json")
_define(flags.DEFINE_string, "predict_file", None,
        "SQuAD json for predictions. E.g., dev-v1.1.json or test-v1.1.json")
_define(flags.DEFINE_integer, "doc_stride", 128,
        "When splitting up a long document into chunks, how much stride to take between "
        "chunks.")
_define(flags.DEFINE_integer, "max_query_length", 64,
        "The maximum number of tokens for the question. Questions longer than this will be "
        "truncated to this length.")
_define(flags.DEFINE_integer, "n_best_size", 20,
        "The total number of n-best predictions to generate in the nbest_predictions.json "
        "output file.")
_define(flags.DEFINE_integer, "max_answer_length", 30,
        "The maximum length of an answer that can be generated. This is needed because the "
        "start and end predictions are not conditioned on one another.")
_define(flags.DEFINE_bool, "verbose_logging", False,
        "If true, all of the warnings related to data processing will be printed.")
_define(flags.DEFINE_bool, "version_2_with_negative", False,
        "If true, the SQuAD examples contain some that do not have an answer.")
_define(flags.DEFINE_float, "null_score_diff_threshold", 0.0,
        "If null_score - best_non_null is greater than the threshold predict null.")
_define(flags.DEFINE_integer, "bilstm_units", 0,
        "0: the original span layer on the encoder. N: a randomly initialised BiLSTM of N "
        "units per direction between the encoder and the span layer (the paper's '+ BiLSTM', "
        "Table 5, on its left-to-right model); saved in export_metadata.json for export.")

# The original's --max_seq_length default for SQuAD (the shared flag's, 128, is the
# classifier's); DEFAULTS below makes it this runner's.
SQUAD_MAX_SEQ_LENGTH = 384
SQUAD_DOC_STRIDE = 128


def _own_settings(values) -> dict:
    """This runner's flags as `SquadSettings` keyword arguments (checked by its `validate`
    when the run starts)."""
    return dict(train_file=values.train_file, predict_file=values.predict_file,
                doc_stride=values.doc_stride, max_query_length=values.max_query_length,
                n_best_size=values.n_best_size, max_answer_length=values.max_answer_length,
                verbose_logging=values.verbose_logging,
                version_2_with_negative=values.version_2_with_negative,
                null_score_diff_threshold=values.null_score_diff_threshold,
                bilstm_units=values.bilstm_units)


def _task_settings(**values):
    from tasks.squad.data import SquadSettings

    return SquadSettings(**values)


def _family(task, max_seq_length):
    from tasks.squad.task import SquadFamily

    return SquadFamily(task, max_seq_length)


def _check(cfg) -> None:
    """The original's validate_flags_or_throw for the SQuAD flags (UserError), before
    TensorFlow is loaded."""
    cfg.task.validate(cfg.finetuning)


def _finish(result: dict, family) -> dict:
    """`training.finetuning.run`'s result plus, for the run kept (best seed and grid
    point): "global_step", "num_train_steps", "predictions"
    (tasks.squad.postprocess.SquadPredictions, or None when not predicting or when a
    sweep's run that finished earlier was skipped), "files" (name -> path of the written
    prediction files), "eval" (the official scores of the predictions, or None when not
    predicting or the predict file has no answers)."""
    best = result["best_run"]
    # A sweep's run that finished earlier was skipped: its files (no SquadPredictions).
    predicted = family.results.get(best["dir"]) or _results_of_files(best["outputs"])
    return {**result, "global_step": best["global_step"],
            "num_train_steps": best["num_train_steps"],
            "predictions": predicted.get("predictions"), "files": predicted.get("files", {}),
            "eval": predicted.get("eval")}


def _results_of_files(outputs) -> dict:
    """The family's `results` entry of a run that finished earlier, from its files: the
    prediction files by name and the scores in eval_results.json (no SquadPredictions)."""
    import json
    import os

    from data_prep import fileio

    names = ("predictions.json", "nbest_predictions.json", "null_odds.json",
             "eval_results.json")
    files = {os.path.basename(p): p for p in outputs if os.path.basename(p) in names}
    scores = (json.loads(fileio.read_text(files["eval_results.json"]))
              if "eval_results.json" in files else None)
    return {"predictions": None, "files": files, "eval": scores}


# Which of this runner's flags apply to which mode (training/flags.py `check_modes`).
MODES = (common_flags.OnlyWith(("null_score_diff_threshold",), "--version_2_with_negative",
                               common_flags.flag_given("version_2_with_negative")),)

# This runner's defaults of the flags runners share, shown by --helpfull and used when a
# flag is not given (training/flags.py `use_defaults`).
DEFAULTS = {"max_seq_length": SQUAD_MAX_SEQ_LENGTH, "doc_stride": SQUAD_DOC_STRIDE}
COMMAND = common_flags.FinetuningCommand("run_squad.py", _own_settings, _task_settings,
                                         _family, DEFAULTS, required=(), check=_check,
                                         finish=_finish, modes=MODES)
run, run_config_from_flags, main = COMMAND.run, COMMAND.settings_from_flags, COMMAND.main


if __name__ == "__main__":
    shell.start(main, "run_squad.py")
