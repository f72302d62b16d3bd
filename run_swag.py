"""Fine-tunes BERT for multiple choice (SWAG, or your own CSV / JSON lines); evaluates and predicts.

The flags of run_classifier.py wherever they mean the same, plus the shared distribution,
precision and optimizer flags (training/flags.py), `--seeds`, `--keep_best_checkpoint`
and the format flags of your own data; see docs/run_swag.md. The runner gives the
shared fine-tuning command (`training.flags.FinetuningCommand`) its flags, defaults and
family; the task (reading, choices, metrics, output files) is `tasks.multiple_choice`:

    python run_swag.py --data_dir=swagaf/data \\
      --vocab_file=uncased_L-12_H-768_A-12/vocab.txt \\
      --bert_config_file=uncased_L-12_H-768_A-12/bert_config.json \\
      --init_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \\
      --do_train --do_eval --do_predict --max_seq_length=128 --train_batch_size=16 \\
      --learning_rate=2e-5 --num_train_epochs=3.0 --output_dir=/tmp/swag_output
"""

from __future__ import annotations

from absl import flags

from data_prep import cli as shell
from training import flags as common_flags

FLAGS = flags.FLAGS

common_flags.define_common_flags()
common_flags.define_finetuning_flags()
_define = common_flags.define_once
_define(flags.DEFINE_string, "data_dir", None,
        "The input data dir: SWAG's train.csv, val.csv, test.csv (or train/dev/test .csv or "
        ".jsonl of your own data).")
_define(flags.DEFINE_string, "task_name", "swag",
        "swag: SWAG's regular CSV files; custom: your own CSV / JSON lines, fields named by "
        "--context_column, --question_column, --ending_columns, --label_column.")
_define(flags.DEFINE_string, "context_column", None,
        "custom: the context field (sentence A of every choice).")
_define(flags.DEFINE_string, "question_column", None,
        "custom: a field prepended to every ending (empty: sentence B is the ending alone).")
_define(flags.DEFINE_list, "ending_columns", [],
        "custom: the ending fields in choice order, or (JSON lines) one field holding the list.")
_define(flags.DEFINE_string, "label_column", None,
        "custom: the label field: the right ending's index (or its text with "
        "--label_is_text).")
_define(flags.DEFINE_bool, "label_is_text", False,
        "custom: the label is the text of the right ending, not its index.")

# Which of this runner's flags apply to which mode (training/flags.py `check_modes`).
MODES = (
    common_flags.OnlyWith(("context_column", "question_column", "ending_columns",
                           "label_column", "label_is_text"), "--task_name=custom",
                          common_flags.flag_is("task_name", "custom")),
    common_flags.OnlyWith(("label_is_text",), "--label_column (a labelled file)",
                          common_flags.flag_given("label_column")),
)


def _own_settings(values) -> dict:
    """This runner's flags, checked, as `MultipleChoiceSettings` keyword arguments (reads
    no file)."""
    from tasks.multiple_choice import data

    task = (values.task_name or "swag").strip().lower()
    if task == "swag":
        fmt = data.SWAG
    elif task == "custom":
        if not values.context_column or not values.ending_columns:
            raise shell.FlagError("--task_name=custom needs --context_column and --ending_columns")
        fmt = data.ChoiceFormat(
            context=values.context_column, question=values.question_column or None,
            endings=tuple(c.strip() for c in values.ending_columns if c.strip()),
            label=values.label_column or None, label_is_text=values.label_is_text)
    else:
        raise shell.FlagError(f"--task_name={values.task_name}: expected swag or custom")
    return dict(data_dir=values.data_dir, format=fmt, task_name=task)


def _task_settings(**values):
    from tasks.multiple_choice.data import MultipleChoiceSettings

    return MultipleChoiceSettings(**values)


def _check(cfg) -> None:
    """The task settings against the run's modes (UserError), before any file is read."""
    cfg.task.validate(cfg.finetuning)


def _family(task, max_seq_length):
    from tasks.multiple_choice.task import MultipleChoiceFamily

    return MultipleChoiceFamily(task, max_seq_length)


# This runner's defaults of the flags runners share, shown by --helpfull and used when a
# flag is not given (training/flags.py `use_defaults`).
DEFAULTS = {"task_name": "swag"}
COMMAND = common_flags.FinetuningCommand("run_swag.py", _own_settings, _task_settings,
                                         _family, DEFAULTS, check=_check, modes=MODES)
run, run_config_from_flags, main = COMMAND.run, COMMAND.settings_from_flags, COMMAND.main


if __name__ == "__main__":
    shell.start(main, "run_swag.py")
