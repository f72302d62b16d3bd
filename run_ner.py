"""Fine-tunes BERT for token tagging (CoNLL-2003 NER, or any CoNLL-format tag set); evaluates with conlleval and predicts.

The flags of run_classifier.py wherever they mean the same, plus the shared distribution,
precision and optimizer flags (training/flags.py), `--seeds`, `--keep_best_checkpoint`
and the tagging flags (`--label_list`, `--document_context`, `--doc_stride`, and the
paper's feature-based approach: `--feature_based`, `--feature_layers`, `--lstm_units`);
see docs/run_ner.md. The runner gives the shared fine-tuning command
(`training.flags.FinetuningCommand`) its flags, defaults and family; the task (reading,
windows, conlleval, output files) is `tasks.tagging`:

    python run_ner.py --data_dir=conll2003 \\
      --vocab_file=cased_L-12_H-768_A-12/vocab.txt \\
      --bert_config_file=cased_L-12_H-768_A-12/bert_config.json \\
      --init_checkpoint=cased_L-12_H-768_A-12/bert_model.ckpt --do_lower_case=false \\
      --do_train --do_eval --do_predict --document_context --max_seq_length=128 \\
      --train_batch_size=32 --learning_rate=5e-5 --num_train_epochs=3.0 \\
      --output_dir=/tmp/ner_output
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
        "The input data dir: train.txt, dev.txt, test.txt (or CoNLL-2003's eng.train, "
        "eng.testa, eng.testb; valid.txt for dev), one word a line, the tag last.")
_define(flags.DEFINE_string, "label_list", None,
        "Comma-separated tags in id order (empty: the training file's tags, O first, the "
        "others sorted).")
_define(flags.DEFINE_bool, "document_context", False,
        "Fill each window around a sentence with its neighbours from the same document "
        "(-DOCSTART- lines bound documents): the paper's maximal document context.")
_define(flags.DEFINE_integer, "doc_stride", None,
        "A sentence longer than a window is cut into windows this many WordPieces apart "
        "(empty: half a window, (max_seq_length - 2) // 2).")
_define(flags.DEFINE_bool, "feature_based", False,
        "The paper's feature-based approach (Table 7): freeze the encoder and train a "
        "two-layer BiLSTM + dense on its activations (--feature_layers).")
_define(flags.DEFINE_enum, "feature_layers", "concat_last_four",
        ["embeddings", "second_to_last_hidden", "last_hidden", "weighted_sum_last_four",
         "concat_last_four", "weighted_sum_all"],
        "With --feature_based: which of the encoder's activations feed the BiLSTM (the rows "
        "of the paper's Table 7).")
_define(flags.DEFINE_integer, "lstm_units", 768,
        "With --feature_based: units per direction of each of the two BiLSTM layers.")

# Which of this runner's flags apply to which mode (training/flags.py `check_modes`).
MODES = (common_flags.OnlyWith(("feature_layers", "lstm_units"), "--feature_based",
                               common_flags.flag_given("feature_based")),)


def _own_settings(values) -> dict:
    """This runner's flags, checked, as `TaggingSettings` keyword arguments (reads no
    file)."""
    doc_stride = values.doc_stride  # None: half a window
    if doc_stride is not None and doc_stride < 1:
        raise shell.FlagError(f"--doc_stride={doc_stride} must be at least 1")
    return dict(data_dir=values.data_dir, label_list=values.label_list or None,
                document_context=values.document_context, doc_stride=doc_stride,
                feature_based=values.feature_based, feature_layers=values.feature_layers,
                lstm_units=values.lstm_units)


def _task_settings(label_list=None, **values):
    """`TaggingSettings`, --label_list (comma-separated, or a sequence) as a tuple."""
    from tasks.tagging import data
    from tasks.tagging.data import TaggingSettings

    return TaggingSettings(label_list=data.parse_label_list(label_list) if label_list
                           else None, **values)


def _family(task, max_seq_length):
    from tasks.tagging.task import TaggingFamily

    return TaggingFamily(task, max_seq_length)


# This runner's defaults of the flags runners share, shown by --helpfull and used when a
# flag is not given (training/flags.py `use_defaults`).
DEFAULTS = {"doc_stride": None}
COMMAND = common_flags.FinetuningCommand("run_ner.py", _own_settings, _task_settings,
                                         _family, DEFAULTS, modes=MODES)
run, run_config_from_flags, main = COMMAND.run, COMMAND.settings_from_flags, COMMAND.main


if __name__ == "__main__":
    shell.start(main, "run_ner.py")
