"""Fine-tunes BERT on GLUE, XNLI or your own CSV/TSV data; evaluates and predicts.

Same flags as Google's run_classifier.py, plus the shared distribution, precision and
optimizer flags (training/flags.py), the custom-data flags, `--seeds` and
`--keep_best_checkpoint` (docs/run_classifier.md). The runner gives the shared
fine-tuning command (`training.flags.FinetuningCommand`: flags -> settings ->
`training.finetuning.run`) its flags, defaults and family; the task (data, loss, metrics,
outputs) is `tasks.classification`:

    python run_classifier.py --task_name=MRPC --data_dir=glue_data/MRPC \\
      --vocab_file=uncased_L-12_H-768_A-12/vocab.txt \\
      --bert_config_file=uncased_L-12_H-768_A-12/bert_config.json \\
      --init_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \\
      --do_train --do_eval --do_predict --max_seq_length=128 --train_batch_size=32 \\
      --learning_rate=2e-5 --num_train_epochs=3.0 --output_dir=/tmp/mrpc_output
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
        "The input data dir. Should contain the .tsv files (or other data files) for the task.")
_define(flags.DEFINE_string, "task_name", None,
        "The name of the task to train: cola, sst-2, mrpc, sts-b, qqp, mnli, mnli-mm, qnli, "
        "rte, wnli, ax, xnli or custom.")
_define(flags.DEFINE_string, "xnli_language", "zh", "XNLI language (train, dev and test).")
_define(flags.DEFINE_string, "text_a_column", None,
        "custom: column of the (first) text: a header name or a 0-based index.")
_define(flags.DEFINE_string, "text_b_column", None,
        "custom: column of the second text for pair tasks (empty: single texts).")
_define(flags.DEFINE_string, "label_column", None, "custom: label column (name or index).")
_define(flags.DEFINE_string, "delimiter", "tab",
        "custom: one character, or tab, comma, semicolon, pipe.")
_define(flags.DEFINE_bool, "has_header", True, "custom: the first row names the columns.")
_define(flags.DEFINE_string, "label_list", None,
        "custom: comma-separated label names in id order (empty: inferred from train).")
_define(flags.DEFINE_bool, "is_regression", False,
        "custom: labels are float scores (Pearson/Spearman metrics, squared-error loss).")
_define(flags.DEFINE_string, "quotechar", "auto",
        "custom: csv quote character; auto: '\"' for comma-separated files, none otherwise.")
_define(flags.DEFINE_bool, "skip_bad_rows", False,
        "Skip malformed rows (counted in the cache metadata) instead of failing on the first.")
_define(flags.DEFINE_enum, "long_document", "truncate", ["truncate", "head_tail", "windows"],
        "A text longer than max_seq_length: truncate (the original: its first tokens), "
        "head_tail (its first --head_tokens and its last tokens) or windows (all of it, "
        "through --doc_stride windows pooled into one prediction); single-text tasks for "
        "head_tail and windows. docs/run_classifier.md#long-documents.")
_define(flags.DEFINE_integer, "head_tokens", None,
        "head_tail: tokens kept from the start of a long text, the rest of the window from "
        "its end; default round((max_seq_length - 2) * 128 / 510), Sun et al.'s 128 of 510.")
_define(flags.DEFINE_integer, "doc_stride", None,
        "windows: tokens between the starts of a text's windows; default a whole window's "
        "text (max_seq_length - 2: side by side; overlap slows learning, bench/RESULTS.md).")
_define(flags.DEFINE_integer, "max_windows_per_document", 8,
        "windows: most windows one text may need; a longer text is refused (file and line).")
_define(flags.DEFINE_enum, "window_pooling", "max_ends", ["max_ends", "max", "mean",
                                                          "attention"],
        "windows: how the windows' pooled outputs become one document vector: max_ends "
        "(the first and last windows' beside the per-feature max over all), max, mean, or "
        "attention (a learned score per window); trained end to end. Which learns what: "
        "docs/run_classifier.md#long-documents.")

def _column(value):
    if value is None or str(value).strip() == "":
        return None
    value = str(value).strip()
    try:
        return int(value)
    except ValueError:
        return value


def _own_settings(values) -> dict:
    """This runner's flags, checked, as `ClassificationSettings` keyword arguments."""
    from tasks.classification import processors
    from tasks.classification.metrics import normalize_task_name

    task = normalize_task_name(values.task_name)
    custom = None
    if task == "custom":
        if _column(values.text_a_column) is None or _column(values.label_column) is None:
            raise shell.FlagError("--task_name=custom needs --text_a_column and --label_column")
        custom = processors.CustomDataConfig(
            text_a_column=_column(values.text_a_column),
            label_column=_column(values.label_column),
            text_b_column=_column(values.text_b_column), delimiter=values.delimiter,
            has_header=values.has_header, labels=values.label_list or None,
            is_regression=values.is_regression, quotechar=values.quotechar)
    return dict(task_name=task, data_dir=values.data_dir, xnli_language=values.xnli_language,
                custom=custom, skip_bad_rows=values.skip_bad_rows,
                long_document=values.long_document, head_tokens=values.head_tokens,
                doc_stride=values.doc_stride,
                max_windows_per_document=values.max_windows_per_document,
                window_pooling=values.window_pooling)


# Which of this runner's flags apply to which mode (training/flags.py `check_modes`).
MODES = (
    common_flags.OnlyWith(("text_a_column", "text_b_column", "label_column", "delimiter",
                           "has_header", "label_list", "is_regression", "quotechar"),
                          "--task_name=custom", common_flags.flag_is("task_name", "custom")),
    common_flags.OnlyWith(("xnli_language",), "--task_name=xnli",
                          common_flags.flag_is("task_name", "xnli")),
    common_flags.OnlyWith(("head_tokens",), "--long_document=head_tail",
                          common_flags.flag_is("long_document", "head_tail")),
    common_flags.OnlyWith(("doc_stride", "max_windows_per_document", "window_pooling"),
                          "--long_document=windows",
                          common_flags.flag_is("long_document", "windows")),
)


def _task_settings(**values):
    from tasks.classification.data import ClassificationSettings

    return ClassificationSettings(**values)


def _family(task, max_seq_length):
    from tasks.classification.task import ClassificationFamily

    return ClassificationFamily(task, max_seq_length)


# This runner's defaults of the flags runners share, shown by --helpfull and used when a
# flag is not given (training/flags.py `use_defaults`).
DEFAULTS = {"task_name": None, "doc_stride": None}
COMMAND = common_flags.FinetuningCommand(
    "run_classifier.py", _own_settings, _task_settings, _family, DEFAULTS,
    required=("task_name", "data_dir", "vocab_file", "bert_config_file", "output_dir"),
    modes=MODES)
run, run_config_from_flags, main = COMMAND.run, COMMAND.settings_from_flags, COMMAND.main


if __name__ == "__main__":
    shell.start(main, "run_classifier.py")
