"""The main job (`make demo`): the BERT workflow on text every Python installation ships.

    .venv/bin/python demo.py --output_dir=demo_output [--quick]

Stages, each the project's real command-line tool run as a subprocess with real flags:

1. corpus            `python -m data_prep.sample_corpus`: the standard library's docstrings,
                     comments and language reference topics, one sentence per line, blank
                     line between documents -> OUTPUT/corpus/*.txt
2. vocab             `python -m data_prep.build_vocab`: a WordPiece vocabulary learned from
                     the corpus -> OUTPUT/vocab.txt
3. pretraining_data  `python -m data_prep.create_pretraining_data`: masked-LM + next-sentence
                     instances -> OUTPUT/pretraining_data/*.tfrecord
4. pretraining       `python run_pretraining.py`: a small BERT (OUTPUT/bert_config.json,
                     written by the demo like a user writes one) pretrained on those
                     records, with eval -> OUTPUT/pretraining/ (checkpoints, TensorBoard
                     logs, eval_results.txt)
5. classifier_data   `python -m data_prep.sample_corpus --classification_dir=...`: which kind
                     of documentation a sentence comes from (module / class / function
                     docstring, comment, reference topic; `--classifier_label`), split by
                     document, classes balanced by down-sampling, short sentences dropped
                     -> OUTPUT/classifier_data/{train,dev,test}.tsv (`sentence<TAB>label`)
6. classifier        `python run_classifier.py --task_name=custom --init_checkpoint=
                     OUTPUT/pretraining ...`: fine-tunes the pretrained BERT, with eval and
                     predict -> OUTPUT/classifier/ (eval_results.txt, test_results.tsv,
                     checkpoints, TensorBoard logs, export_metadata.json); the report also
                     scores test_results.tsv against test.tsv's labels
7. export            `python export_saved_model.py --model_type=classifier`: a SavedModel
                     with in-graph tokenization -> OUTPUT/export/classifier/
8. predict           `python predict_saved_model.py`: reloads it with tensorflow +
                     tensorflow-text only and classifies raw sentences
                     -> printed, and OUTPUT/predictions.json

Sizes: the full run (corpus 3 MB, vocab 5000, hidden 128, 300 pretraining steps, 1000
classification rows per label, 4 fine-tuning epochs) takes three to five minutes on two CPU
cores; `--quick` (test suite) shrinks every stage to seconds.

Each stage streams its tool's output (indented), is timed, then reports its figures from
the files it wrote. The run ends with a summary (OUTPUT/demo_summary.json too), the
TensorBoard command for OUTPUT and the command lines to run every stage by hand on your
own data. Full, unfiltered logs are in OUTPUT/logs/. A further stage is appended to
`build_stages` the same way: a `Stage` with the tool's module and flags, and a report.

Here: the flags, the stages and their flags, the run. The pieces: demo_lib/settings.py
(sizes), demo_lib/stages.py (running a stage as a subprocess), demo_lib/reports.py
(what each stage reports from its files), demo_lib/summary.py (the closing summary).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

from absl import flags

from data_prep import cli, fileio

from demo_lib import reports
from demo_lib.settings import FULL, QUICK, Settings
from demo_lib.stages import Stage, run_stage
from demo_lib.summary import print_summary, write_summary


def define_flags() -> None:
    """Defines the demo's flags; called only when demo.py runs (importing it defines none)."""
    flags.DEFINE_string("output_dir", "demo_output", "Folder for every output of the demo.")
    flags.DEFINE_bool("quick", False,
                      "Reduced sizes (seconds, for the test suite); explicit flags still win.")
    flags.DEFINE_float("corpus_mb", None,
                       "Corpus size in MB (default 3, i.e. all the text the standard library "
                       "has, about 2 MB on Python 3.11; --quick: 0.15).")
    flags.DEFINE_integer("vocab_size", None,
                         "Target vocabulary size (default 5000; --quick: 1000).")
    flags.DEFINE_integer("dupe_factor", None,
                         "Times each document is used with different masks (default 5; "
                         "--quick: 1).")
    flags.DEFINE_integer("max_seq_length", 128, "Pretraining sequence length.")
    flags.DEFINE_integer("max_predictions_per_seq", 20, "Masked positions per sequence.")
    flags.DEFINE_integer("num_workers", 0,
                         "Worker processes for create_pretraining_data (0: its default).")
    flags.DEFINE_integer("random_seed", 12345, "Seed of the data generation.")
    flags.DEFINE_integer("num_train_steps", None,
                         "Pretraining steps (default 300; --quick: 20).")
    flags.DEFINE_integer("hidden_size", None,
                         "Hidden size of the demo's BERT (default 128; --quick: 32); "
                         "layers: 2, heads: hidden_size / 32.")
    flags.DEFINE_string("classifier_label", "kind",
                        "What the fine-tuned classifier predicts of a sentence: 'kind' "
                        "(module/class/function docstring, comment, reference topic), "
                        "'module' or 'package'.")
    flags.DEFINE_integer("classifier_rows_per_class", None,
                         "Classification rows per label over train/dev/test (default 1000; "
                         "--quick: 100).")
    flags.DEFINE_float("classifier_epochs", None,
                       "Fine-tuning epochs (default 4; --quick: 2).")


# Raw sentences the exported classifier is asked about at the end (`kind` labels: a
# function docstring and a comment, in the standard library's style).
PREDICT_TEXTS = (
    "Return a new sorted list from the items in iterable.",
    "XXX This is a workaround for a bug in older versions of the compiler, remove it later.",
)


# ---------------------------------------------------------------------------
# The stages.


def build_stages(settings: Settings) -> list:
    """The demo's stages, in order. Append later stages here."""
    corpus_glob = settings.path("corpus", "*.txt")
    vocab_file = settings.path("vocab.txt")
    pretraining_flags = [
        ("input_file", corpus_glob),
        ("output_file", settings.path("pretraining_data", "pretrain.tfrecord")),
        ("vocab_file", vocab_file),
        ("do_lower_case", "true"),
        ("max_seq_length", settings.max_seq_length),
        ("max_predictions_per_seq", settings.max_predictions_per_seq),
        ("masked_lm_prob", 0.15),
        ("dupe_factor", settings.dupe_factor),
        ("random_seed", settings.random_seed),
    ]
    if settings.num_workers:
        pretraining_flags.append(("num_workers", settings.num_workers))
    return [
        Stage("corpus", "build a sample corpus from the Python standard library's documentation",
              "data_prep.sample_corpus",
              [("output_dir", settings.path("corpus")), ("max_mb", settings.corpus_mb),
               ("num_shards", settings.corpus_shards)],
              lambda: reports.corpus_report(settings)),
        Stage("vocab", "learn a WordPiece vocabulary from the corpus",
              "data_prep.build_vocab",
              [("input_file", corpus_glob), ("output_file", vocab_file),
               ("vocab_size", settings.vocab_size), ("do_lower_case", "true")],
              lambda: reports.vocab_report(settings)),
        Stage("pretraining_data", "write masked-LM / next-sentence pretraining TFRecords",
              "data_prep.create_pretraining_data", pretraining_flags,
              lambda: reports.pretraining_report(settings),
              missing_hint="data_prep/create_pretraining_data.py (issue 2, section 4) is not "
                           "in this checkout yet",
              make_dirs=[settings.path("pretraining_data")]),
        Stage("pretraining", "pretrain a small BERT (masked LM + next sentence) with eval",
              "run_pretraining.py", _pretraining_run_flags(settings),
              lambda: reports.pretraining_run_report(settings),
              prepare=lambda: write_bert_config(settings)),
        Stage("classifier_data",
              f"write a sentence classification task (label: {settings.classifier_label}) "
              "from the same documentation",
              "data_prep.sample_corpus",
              [("classification_dir", settings.path("classifier_data")),
               ("classification_label", settings.classifier_label),
               ("max_mb", settings.classifier_mb),
               ("classification_rows_per_class", settings.classifier_rows_per_class),
               ("classification_min_words", 5),
               ("classification_seed", settings.random_seed)],
              lambda: reports.classifier_data_report(settings)),
        Stage("classifier", "fine-tune the pretrained BERT on it, with eval and predict",
              "run_classifier.py", _classifier_flags(settings),
              lambda: reports.classifier_report(settings)),
        Stage("export", "export the classifier as a SavedModel that tokenizes raw text "
                        "in-graph",
              "export_saved_model.py",
              [("model_type", "classifier"), ("init_checkpoint", settings.path("classifier")),
               ("export_dir", settings.path("export", "classifier")), ("overwrite", "true")],
              lambda: reports.export_report(settings)),
        Stage("predict", "reload the SavedModel (tensorflow + tensorflow-text only) and "
                         "classify raw sentences",
              "predict_saved_model.py",
              [("export_dir", settings.path("export", "classifier"))]
              + [("text", text) for text in PREDICT_TEXTS]
              + [("output_json", settings.path("predictions.json"))],
              lambda: reports.predict_report(settings)),
    ]


def _classifier_flags(settings: Settings) -> list:
    steps_per_report = 5 if settings.quick else 25
    return [
        ("task_name", "custom"), ("data_dir", settings.path("classifier_data")),
        ("text_a_column", "sentence"), ("label_column", "label"), ("has_header", "true"),
        ("vocab_file", settings.path("vocab.txt")), ("do_lower_case", "true"),
        ("bert_config_file", settings.path("bert_config.json")),
        ("init_checkpoint", settings.path("pretraining")),
        ("output_dir", settings.path("classifier")),
        ("do_train", "true"), ("do_eval", "true"), ("do_predict", "true"),
        ("max_seq_length", settings.classifier_seq_length),
        ("train_batch_size", 32), ("eval_batch_size", 32), ("predict_batch_size", 32),
        ("learning_rate", settings.classifier_learning_rate),
        ("num_train_epochs", settings.classifier_epochs),
        ("save_checkpoints_steps", 1000),
        ("iterations_per_loop", steps_per_report), ("log_steps", steps_per_report),
        ("seed", settings.random_seed),
    ]


def bert_config_for(settings: Settings) -> dict:
    """A small BERT in Google's bert_config.json format, sized for the demo's vocab."""
    with open(settings.path("vocab.txt"), encoding="utf-8") as reader:
        vocab_size = sum(1 for _ in reader)
    hidden = settings.hidden_size
    return {
        "vocab_size": vocab_size, "hidden_size": hidden, "num_hidden_layers": 2,
        "num_attention_heads": max(1, hidden // 32), "intermediate_size": 4 * hidden,
        "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": max(512, settings.max_seq_length),
        "type_vocab_size": 2, "initializer_range": 0.02,
    }


def write_bert_config(settings: Settings) -> None:
    path = settings.path("bert_config.json")
    fileio.write_text(path, json.dumps(bert_config_for(settings), indent=2) + "\n")
    print(f"    wrote {path}", flush=True)


def _pretraining_run_flags(settings: Settings) -> list:
    steps = settings.num_train_steps
    return [
        ("input_file", settings.path("pretraining_data", "pretrain.tfrecord*")),
        ("output_dir", settings.path("pretraining")),
        ("bert_config_file", settings.path("bert_config.json")),
        ("do_train", "true"), ("do_eval", "true"),
        ("train_batch_size", 32), ("eval_batch_size", 32),
        ("max_seq_length", settings.max_seq_length),
        ("max_predictions_per_seq", settings.max_predictions_per_seq),
        ("num_train_steps", steps), ("num_warmup_steps", max(1, steps // 10)),
        ("learning_rate", settings.pretraining_learning_rate),
        ("save_checkpoints_steps", max(10, steps // 3)),
        ("iterations_per_loop", max(5, steps // 15)), ("log_steps", max(5, steps // 15)),
        ("max_eval_steps", 5 if settings.quick else 20),
        ("seed", settings.random_seed),
    ]


def resolve_settings() -> Settings:
    """Settings from the parsed flags; --quick picks the reduced sizes flags don't set."""
    FLAGS = flags.FLAGS
    sizes = QUICK if FLAGS.quick else FULL
    return Settings(
        output_dir=FLAGS.output_dir,
        corpus_mb=FLAGS.corpus_mb if FLAGS.corpus_mb is not None else sizes["corpus_mb"],
        vocab_size=FLAGS.vocab_size if FLAGS.vocab_size is not None else sizes["vocab_size"],
        dupe_factor=(FLAGS.dupe_factor if FLAGS.dupe_factor is not None
                     else sizes["dupe_factor"]),
        corpus_shards=sizes["corpus_shards"],
        max_seq_length=FLAGS.max_seq_length,
        max_predictions_per_seq=FLAGS.max_predictions_per_seq,
        num_workers=FLAGS.num_workers,
        random_seed=FLAGS.random_seed,
        quick=FLAGS.quick,
        num_train_steps=(FLAGS.num_train_steps if FLAGS.num_train_steps is not None
                         else sizes["num_train_steps"]),
        hidden_size=FLAGS.hidden_size if FLAGS.hidden_size is not None else sizes["hidden_size"],
        classifier_label=FLAGS.classifier_label,
        classifier_mb=sizes["classifier_mb"],
        classifier_rows_per_class=(FLAGS.classifier_rows_per_class
                                   if FLAGS.classifier_rows_per_class is not None
                                   else sizes["classifier_rows_per_class"]),
        classifier_epochs=(FLAGS.classifier_epochs if FLAGS.classifier_epochs is not None
                           else sizes["classifier_epochs"]),
        classifier_learning_rate=sizes["classifier_learning_rate"],
        pretraining_learning_rate=sizes["pretraining_learning_rate"],
    )


def main(argv) -> int:
    """The command (flags parsed): `work` in the shell (`data_prep.cli`)."""
    del argv
    return cli.run_main(_work, "demo.py")


def _work() -> None:
    settings = resolve_settings()
    os.makedirs(settings.output_dir, exist_ok=True)
    stages = build_stages(settings)
    mode = "quick" if settings.quick else "full"
    print(f"BERT demo ({mode}): corpus up to {settings.corpus_mb:g} MB, "
          f"vocab {settings.vocab_size}, dupe_factor {settings.dupe_factor}, "
          f"max_seq_length {settings.max_seq_length} -> {settings.output_dir}/", flush=True)
    start = time.time()
    results: dict = {}
    summary = {"settings": dataclasses.asdict(settings), "stages": results, "ok": False}
    summary_path = settings.path("demo_summary.json")
    try:
        for index, stage in enumerate(stages, start=1):
            results[stage.name] = run_stage(stage, index, len(stages), settings)
        summary["ok"] = True
    finally:
        summary["seconds"] = round(time.time() - start, 2)
        write_summary(summary_path, summary)
    print_summary(stages, results, settings, time.time() - start)


if __name__ == "__main__":
    define_flags()
    cli.start(main, "demo.py")
