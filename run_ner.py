"""Fine-tunes BERT for token tagging (CoNLL-2003 NER, or any CoNLL-format tag set); evaluates with conlleval and predicts.

The flags of run_classifier.py wherever they mean the same, plus the shared distribution,
precision and optimizer flags (training/flags.py), `--seeds`, `--keep_best_checkpoint`
and the tagging flags (`--label_list`, `--document_context`, `--doc_stride`, and the
paper's feature-based approach: `--feature_based`, `--feature_layers`, `--lstm_units`);
see docs/run_ner.md. The runner parses flags into a `NerRun` and calls `run`; the run is
`training.finetuning.run`, the task (reading, windows, conlleval, output files) is
`tasks.tagging`:

    python run_ner.py --data_dir=conll2003 \\
      --vocab_file=cased_L-12_H-768_A-12/vocab.txt \\
      --bert_config_file=cased_L-12_H-768_A-12/bert_config.json \\
      --init_checkpoint=cased_L-12_H-768_A-12/bert_model.ckpt --do_lower_case=false \\
      --do_train --do_eval --do_predict --document_context --max_seq_length=128 \\
      --train_batch_size=32 --learning_rate=5e-5 --num_train_epochs=3.0 \\
      --output_dir=/tmp/ner_output
"""

from __future__ import annotations

import dataclasses

from absl import flags

from data_prep import cli as shell
from training import cli, finetuning
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

# Flags that only mean something with --feature_based.
_FEATURE_FLAGS = ("feature_layers", "lstm_units")


@dataclasses.dataclass(frozen=True)
class NerRun:
    """Everything one tagging run needs, read from flags once (see the flag help)."""

    finetuning: finetuning.FinetuningRun
    task: "object"  # tasks.tagging.task.TaggingSettings


def make_run(**kwargs) -> NerRun:
    """A NerRun from flat keyword arguments (the flag names)."""
    from tasks.tagging.task import TaggingSettings

    settings, rest = finetuning.settings_from(**kwargs)
    if isinstance(rest.get("label_list"), str):
        rest["label_list"] = tuple(rest["label_list"].split(","))
    return NerRun(settings, TaggingSettings(**rest))


# This runner's defaults of the flags runners share, shown by --helpfull and used when a
# flag is not given (training/flags.py `use_defaults`).
DEFAULTS = {"doc_stride": None}
common_flags.use_defaults(DEFAULTS)


def run_config_from_flags(values=FLAGS) -> NerRun:
    """Validates the flags and turns them into a `NerRun` (reads no file)."""
    from tasks.tagging import data
    from tasks.tagging.task import TaggingSettings

    common_flags.use_defaults(DEFAULTS, values)
    for name in ("data_dir", "vocab_file", "bert_config_file", "output_dir"):
        if not getattr(values, name):
            raise ValueError(f"--{name} is required")
    if not values.feature_based:
        given = [name for name in _FEATURE_FLAGS if values[name].present]
        if given:
            raise ValueError(f"--{given[0]} only applies with --feature_based")
    doc_stride = values.doc_stride  # None: half a window
    if doc_stride is not None and doc_stride < 1:
        raise ValueError(f"--doc_stride={doc_stride} must be at least 1")
    label_list = data.parse_label_list(values.label_list) if values.label_list else None
    return NerRun(
        common_flags.finetuning_run(values),
        TaggingSettings(data_dir=values.data_dir, label_list=label_list,
                        document_context=values.document_context, doc_stride=doc_stride,
                        feature_based=values.feature_based,
                        feature_layers=values.feature_layers,
                        lstm_units=values.lstm_units))


def run(cfg: NerRun) -> dict:
    """Fine-tunes, evaluates and predicts as `cfg` asks, once per seed.

    Returns:
      `training.finetuning.run`'s result: {"runs": [per-seed dicts: seed, dir, eval (split
      -> figures), outputs], "best_seed", "summary" (seed statistics; empty for one seed)}.
    """
    from tasks.tagging.task import TaggingFamily

    finetuning.validate(cfg.finetuning)
    family = TaggingFamily(cfg.task, cfg.finetuning.max_seq_length)
    return finetuning.run(cfg.finetuning, family)


def main(argv):
    del argv
    return cli.run_cli(lambda: run(run_config_from_flags(FLAGS)), "run_ner.py")


if __name__ == "__main__":
    shell.start(main, "run_ner.py")
