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
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import importlib.util
import json
import os
import shlex
import struct
import subprocess
import sys
import time
from collections.abc import Callable

from absl import app, flags

REPO_ROOT = os.path.dirname(os.path.abspath(__file__))


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


FULL = {"corpus_mb": 3.0, "vocab_size": 5000, "dupe_factor": 5, "corpus_shards": 4,
        "num_train_steps": 300, "hidden_size": 128, "classifier_mb": 3.0,
        "classifier_rows_per_class": 1000, "classifier_epochs": 4.0,
        "classifier_learning_rate": 3e-4, "pretraining_learning_rate": 3e-4}
# --quick's classification text goes further than its corpus (0.4 MB): the first 0.15 MB
# hold too few module docstrings for balanced dev and test splits.
QUICK = {"corpus_mb": 0.15, "vocab_size": 1000, "dupe_factor": 1, "corpus_shards": 2,
         "num_train_steps": 20, "hidden_size": 32, "classifier_mb": 0.4,
         "classifier_rows_per_class": 100, "classifier_epochs": 2.0,
         "classifier_learning_rate": 1e-3, "pretraining_learning_rate": 1e-3}
# Full size: a peak learning rate of 1e-3 for 300 pretraining steps left an encoder that
# fine-tuning could not move off chance (dev accuracy 20% on 5 labels); 3e-4 pretrains
# better (masked-LM 7.4% vs 5.6%, next sentence 67.5% vs 60.2%) and fine-tunes.
# Raw sentences the exported classifier is asked about at the end (`kind` labels: a
# function docstring and a comment, in the standard library's style).
PREDICT_TEXTS = (
    "Return a new sorted list from the items in iterable.",
    "XXX This is a workaround for a bug in older versions of the compiler, remove it later.",
)
# Start-up chatter of TensorFlow's C++ runtime that says nothing about the stage.
NOISE_PREFIXES = (
    "WARNING: All log messages before absl::InitializeLog()",
    "To enable the following instructions:",
)
NOISE_MARKERS = ("port.cc:", "cudart_stub.cc:", "cpu_feature_guard.cc:", "cuda_platform.cc:",
                 "cuda_executor.cc:", "cuda_dnn.cc:", "cuda_fft.cc:", "cuda_blas.cc:")


@dataclasses.dataclass
class Settings:
    """The demo's sizes and paths, resolved from the flags."""

    output_dir: str
    corpus_mb: float
    vocab_size: int
    dupe_factor: int
    corpus_shards: int
    max_seq_length: int
    max_predictions_per_seq: int
    num_workers: int
    random_seed: int
    quick: bool
    num_train_steps: int = 300
    hidden_size: int = 128
    classifier_label: str = "kind"
    classifier_mb: float = 3.0
    classifier_rows_per_class: int = 1000
    classifier_epochs: float = 3.0
    classifier_learning_rate: float = 3e-4
    classifier_seq_length: int = 64
    pretraining_learning_rate: float = 1e-3

    def path(self, *parts: str) -> str:
        return os.path.join(self.output_dir, *parts)


@dataclasses.dataclass
class Stage:
    """One step of the demo: a project CLI (`python -m module --flags`) and a report.

    Attributes:
      name: short id (log file name, summary key).
      title: what the stage does, in words.
      module: the CLI's module, run as `python -m module`, or a top-level script of the
        repository (a name ending in `.py`, e.g. `run_pretraining.py`), run as
        `python path/to/script.py`.
      flags: the CLI's flags, in order, as (name, value) pairs.
      report: reads the stage's outputs and returns (lines to print, figures for the
        JSON summary); it raises when expected outputs are missing.
      missing_hint: said when `module` is not in this checkout.
      make_dirs: folders created before the tool runs (it expects them to exist).
      prepare: writes input files the tool needs (e.g. a bert_config.json), before it runs.
    """

    name: str
    title: str
    module: str
    flags: list
    report: Callable[[], tuple[list, dict]]
    missing_hint: str = ""
    make_dirs: list = dataclasses.field(default_factory=list)
    prepare: Callable[[], None] | None = None

    @property
    def is_script(self) -> bool:
        return self.module.endswith(".py")

    def argv(self, python: str = sys.executable) -> list:
        if self.is_script:
            head = [python, _display_path(os.path.join(REPO_ROOT, self.module))]
        else:
            head = [python, "-m", self.module]
        return head + [f"--{k}={v}" for k, v in self.flags]

    def is_available(self) -> bool:
        if self.is_script:
            return os.path.isfile(os.path.join(REPO_ROOT, self.module))
        return (importlib.util.find_spec(self.module.split(".")[0]) is not None
                and importlib.util.find_spec(self.module) is not None)


class StageError(RuntimeError):
    """A stage failed; the message says which and why."""


# ---------------------------------------------------------------------------
# Stage reports.


def _read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as reader:
        return json.load(reader)


def count_tfrecords(path: str) -> int:
    """Records in a TFRecord file (gzip when the name ends in .gz), from its framing only."""
    opener = gzip.open if path.endswith((".gz", ".gzip")) else open
    count = 0
    with opener(path, "rb") as reader:
        while True:
            header = reader.read(12)  # uint64 length + uint32 CRC of the length
            if not header:
                return count
            if len(header) < 12:
                raise StageError(f"{path}: truncated TFRecord header after {count} records")
            (length,) = struct.unpack("<Q", header[:8])
            reader.seek(length + 4, os.SEEK_CUR)  # data + its CRC
            count += 1


def _corpus_report(settings: Settings):
    files = sorted(glob.glob(settings.path("corpus", "*.txt")))
    if not files:
        raise StageError(f"no corpus file in {settings.path('corpus')}")
    size = documents = sentences = 0
    for path in files:
        with open(path, encoding="utf-8") as reader:
            for line in reader:
                size += len(line.encode("utf-8"))
                if line.strip():
                    sentences += 1
                else:
                    documents += 1
    figures = {"files": len(files), "bytes": size, "documents": documents,
               "sentences": sentences}
    lines = [(f"{len(files)} file(s), {size / 1e6:.2f} MB, {documents} documents, "
              f"{sentences} sentences -> {settings.path('corpus')}/")]
    return lines, figures


def _vocab_report(settings: Settings):
    vocab_file = settings.path("vocab.txt")
    if not os.path.exists(vocab_file):
        raise StageError(f"{vocab_file} was not written")
    summary_file = vocab_file + ".summary.json"
    summary = _read_json(summary_file) if os.path.exists(summary_file) else {}
    with open(vocab_file, encoding="utf-8") as reader:
        size = sum(1 for _ in reader)
    figures = {"vocab_size": size, **{k: summary[k] for k in (
        "unk_rate", "pieces_per_word", "distinct_words", "special_token_ids") if k in summary}}
    line = f"{size} tokens"
    if summary:
        line += (f", [UNK] rate {summary['unk_rate']:.2%}, {summary['pieces_per_word']:.3f} "
                 f"WordPiece tokens per word (learned from {summary['distinct_words']} "
                 f"distinct words)")
    lines = [line + f" -> {vocab_file}"]
    if "special_token_ids" in summary:
        lines.append("ids: " + ", ".join(
            f"{token}={index}" for token, index in summary["special_token_ids"].items()))
    return lines, figures


def _pretraining_report(settings: Settings):
    out_dir = settings.path("pretraining_data")
    records = sorted(p for p in glob.glob(os.path.join(out_dir, "*.tfrecord*"))
                     if not p.endswith(".json") and ".tmp" not in os.path.basename(p))
    if not records:
        raise StageError(f"no TFRecord file in {out_dir}")
    summaries = sorted(glob.glob(os.path.join(out_dir, "*.summary.json")))
    size = sum(os.path.getsize(p) for p in records)
    lines = [f"{len(records)} TFRecord file(s), {size / 1e6:.2f} MB -> {out_dir}/"]
    if summaries:
        summary = _read_json(summaries[0])
        figures = {"files": len(records), "bytes": size, "summary": summary}
        lines = _pretraining_summary_lines(summary) + lines
    else:
        instances = sum(count_tfrecords(p) for p in records)
        figures = {"files": len(records), "bytes": size, "instances": instances}
        lines.append(f"{instances} instances (no summary JSON found; records counted)")
    return lines, figures


def _pretraining_summary_lines(summary: dict) -> list:
    """The create_pretraining_data summary in words; every scalar when its keys are unknown."""
    get = summary.get
    lines = []
    if "instances" in summary and "documents" in summary:
        line = f"{get('instances')} instances from {get('documents')} documents"
        if "tokens" in summary:
            line += f", {get('tokens')} tokens"
        if "mean_tokens_per_instance" in summary:
            line += f" ({get('mean_tokens_per_instance'):.1f} per instance)"
        lines.append(line)
    if "masked_fraction" in summary:
        line = f"masked {get('masked_fraction'):.1%} of tokens"
        shares = [(name, get(f"{key}_token_share")) for name, key in (
            ("[MASK]", "mask"), ("random", "random"), ("kept", "kept"))]
        if all(value is not None for _, value in shares):
            line += ": " + ", ".join(f"{name} {value:.1%}" for name, value in shares)
        lines.append(line)
    if "random_next_share" in summary:
        line = f"random next sentence {get('random_next_share'):.1%}"
        if "short_instance_share" in summary:
            line += f"; shorter than max_seq_length {get('short_instance_share'):.1%}"
        lines.append(line)
    if "seconds" in summary:
        line = f"{get('seconds'):.1f} s"
        if "mb_per_second" in summary:
            line += f", {get('mb_per_second'):.3g} MB/s"
        if "num_workers" in summary:
            line += f", {get('num_workers')} worker(s)"
        lines.append(line)
    if not lines:
        lines = [f"{key}: {_format_value(value)}" for key, value in summary.items()
                 if isinstance(value, (int, float, str, bool))]
    return lines


def _format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


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
              lambda: _corpus_report(settings)),
        Stage("vocab", "learn a WordPiece vocabulary from the corpus",
              "data_prep.build_vocab",
              [("input_file", corpus_glob), ("output_file", vocab_file),
               ("vocab_size", settings.vocab_size), ("do_lower_case", "true")],
              lambda: _vocab_report(settings)),
        Stage("pretraining_data", "write masked-LM / next-sentence pretraining TFRecords",
              "data_prep.create_pretraining_data", pretraining_flags,
              lambda: _pretraining_report(settings),
              missing_hint="data_prep/create_pretraining_data.py (issue 2, section 4) is not "
                           "in this checkout yet",
              make_dirs=[settings.path("pretraining_data")]),
        Stage("pretraining", "pretrain a small BERT (masked LM + next sentence) with eval",
              "run_pretraining.py", _pretraining_run_flags(settings),
              lambda: _pretraining_run_report(settings),
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
              lambda: _classifier_data_report(settings)),
        Stage("classifier", "fine-tune the pretrained BERT on it, with eval and predict",
              "run_classifier.py", _classifier_flags(settings),
              lambda: _classifier_report(settings)),
        Stage("export", "export the classifier as a SavedModel that tokenizes raw text "
                        "in-graph",
              "export_saved_model.py",
              [("model_type", "classifier"), ("init_checkpoint", settings.path("classifier")),
               ("export_dir", settings.path("export", "classifier")), ("overwrite", "true")],
              lambda: _export_report(settings)),
        Stage("predict", "reload the SavedModel (tensorflow + tensorflow-text only) and "
                         "classify raw sentences",
              "predict_saved_model.py",
              [("export_dir", settings.path("export", "classifier"))]
              + [("text", text) for text in PREDICT_TEXTS]
              + [("output_json", settings.path("predictions.json"))],
              lambda: _predict_report(settings)),
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
    with open(path, "w", encoding="utf-8") as writer:
        json.dump(bert_config_for(settings), writer, indent=2)
        writer.write("\n")
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


def _pretraining_run_report(settings: Settings):
    results_path = settings.path("pretraining", "eval_results.txt")
    if not os.path.exists(results_path):
        raise StageError(f"{results_path} was not written")
    results = {}
    with open(results_path, encoding="utf-8") as reader:
        for line in reader:
            key, _, value = line.partition(" = ")
            if value:
                results[key.strip()] = float(value)
    lines = [f"step {int(results.get('global_step', 0))}: loss {results.get('loss', 0):.3f}, "
             f"masked-LM accuracy {results.get('masked_lm_accuracy', 0):.1%}, next-sentence "
             f"accuracy {results.get('next_sentence_accuracy', 0):.1%} -> {results_path}",
             f"TensorBoard: tensorboard --logdir {settings.path('pretraining')}"]
    return lines, {"eval_results": results}


def _read_key_values(path: str) -> dict:
    """`key = value` lines (eval_results.txt) as floats."""
    results = {}
    with open(path, encoding="utf-8") as reader:
        for line in reader:
            key, _, value = line.partition(" = ")
            if value:
                try:
                    results[key.strip()] = float(value)
                except ValueError:
                    results[key.strip()] = value.strip()
    return results


def _read_tsv(path: str) -> list:
    """Rows of a headed TSV as lists of fields (header dropped)."""
    with open(path, encoding="utf-8") as reader:
        return [line.rstrip("\n").split("\t") for line in reader][1:]


def _classifier_data_report(settings: Settings):
    folder = settings.path("classifier_data")
    summary_path = os.path.join(folder, "summary.json")
    if not os.path.exists(summary_path):
        raise StageError(f"{summary_path} was not written")
    summary = _read_json(summary_path)
    rows, labels = summary["rows"], summary["labels"]
    lines = [f"{len(labels)} labels ({', '.join(labels)}), balanced: train {rows['train']}, "
             f"dev {rows['dev']}, test {rows['test']} sentences -> {folder}/"
             "{train,dev,test}.tsv",
             f"split by document: {summary['documents']['train']} / "
             f"{summary['documents']['dev']} / {summary['documents']['test']} documents"]
    return lines, {"labels": labels, "rows": rows, "documents": summary["documents"]}


def _classifier_report(settings: Settings):
    folder = settings.path("classifier")
    results_path = os.path.join(folder, "eval_results.txt")
    test_path = os.path.join(folder, "test_results.tsv")
    for path in (results_path, test_path):
        if not os.path.exists(path):
            raise StageError(f"{path} was not written")
    results = _read_key_values(results_path)
    with open(test_path, encoding="utf-8") as reader:
        probabilities = [[float(x) for x in line.split("\t")] for line in reader if line.strip()]
    figures = {"eval_results": results, "test_rows": len(probabilities)}
    lines = [f"step {int(results.get('global_step', 0))}: dev accuracy "
             f"{results.get('eval_accuracy', 0):.1%}, dev loss {results.get('eval_loss', 0):.3f}"
             f" -> {results_path}"]
    # test.tsv keeps its labels (the runner ignores them): score the predictions too.
    metadata_path = os.path.join(folder, "export_metadata.json")
    test_rows = _read_tsv(settings.path("classifier_data", "test.tsv"))
    if os.path.exists(metadata_path) and len(test_rows) == len(probabilities):
        labels = _read_json(metadata_path).get("labels") or []
        if labels and all(len(p) == len(labels) for p in probabilities):
            predicted = [labels[max(range(len(p)), key=p.__getitem__)] for p in probabilities]
            correct = sum(pred == row[-1] for pred, row in zip(predicted, test_rows,
                                                                strict=True))
            figures["test_accuracy"] = correct / max(1, len(test_rows))
            figures["labels"] = labels
            lines.append(f"test accuracy {figures['test_accuracy']:.1%} on {len(test_rows)} "
                         f"sentences (chance {1 / len(labels):.1%}) -> {test_path}")
    if "test_accuracy" not in figures:
        lines.append(f"{len(probabilities)} test predictions -> {test_path}")
    lines.append(f"TensorBoard: tensorboard --logdir {folder}")
    return lines, figures


def _export_report(settings: Settings):
    folder = settings.path("export", "classifier")
    if not os.path.exists(os.path.join(folder, "saved_model.pb")):
        raise StageError(f"{folder}/saved_model.pb was not written")
    size = sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(folder) for name in names)
    metadata_path = os.path.join(folder, "assets.extra", "export_metadata.json")
    metadata = _read_json(metadata_path) if os.path.exists(metadata_path) else {}
    line = f"SavedModel, {size / 1e6:.1f} MB -> {folder}/"
    if metadata.get("labels"):
        line += f" (labels: {', '.join(metadata['labels'])})"
    return [line, "signatures: serving_default (text -> probabilities, label), "
                  "serving_tokenized, preprocess"], {"bytes": size,
                                                     "labels": metadata.get("labels", [])}


def _predict_report(settings: Settings):
    path = settings.path("predictions.json")
    if not os.path.exists(path):
        raise StageError(f"{path} was not written")
    data = _read_json(path)
    texts = data["inputs"]["text"]
    lines, predictions = [], []
    for text, row in zip(texts, data["predictions"], strict=True):
        probability = max(row["probabilities"])
        predictions.append({"text": text, "label": row["label"], "probability": probability})
        lines.append(f"{row['label']} (p={probability:.2f}): {text!r}")
    return lines, {"predictions": predictions, "file": path}


# ---------------------------------------------------------------------------
# Running.


def _is_noise(line: str) -> bool:
    text = line.strip()
    if text.startswith(NOISE_PREFIXES):
        return True
    return text[:1] in "IWE" and text[1:5] == "0000" and any(m in text for m in NOISE_MARKERS)


def _stream(process, log_writer, prefix: str = "    | ") -> list:
    """Copies the child's output to the log (all) and the terminal (noise dropped).

    Lines end at `\\n` or `\\r` (progress lines that rewrite themselves); the last 40
    lines are returned for error messages.
    """
    tail: list = []
    pending = b""
    last_end = b"\n"
    while True:
        chunk = os.read(process.stdout.fileno(), 65536)
        if not chunk:
            break
        log_writer.write(chunk)
        pending += chunk
        while True:
            cut = min((i for i in (pending.find(b"\n"), pending.find(b"\r")) if i >= 0),
                      default=-1)
            if cut < 0:
                break
            line, end, pending = pending[:cut], pending[cut:cut + 1], pending[cut + 1:]
            text = line.decode("utf-8", "replace")
            previous_end, last_end = last_end, end
            if _is_noise(text) or (not text.strip() and end == b"\r"):
                continue
            if not text and previous_end == b"\r":  # the \n of a \r\n pair
                sys.stdout.write("\n")
                continue
            sys.stdout.write(prefix + text + end.decode())
            sys.stdout.flush()
            if end == b"\n":
                tail = (tail + [text])[-40:]
    if pending:
        text = pending.decode("utf-8", "replace")
        if not _is_noise(text):
            sys.stdout.write(prefix + text + "\n")
            tail = (tail + [text])[-40:]
    return tail


def _child_env() -> dict:
    """The repository on PYTHONPATH, so `python -m data_prep...` works from any folder.

    The tools run in the caller's folder, so relative paths in their flags mean what they
    mean to the user.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_stage(stage: Stage, index: int, total: int, settings: Settings) -> dict:
    """Runs one stage, streaming its output; returns its figures. Raises StageError."""
    print(f"\n[{index}/{total}] {stage.name}: {stage.title}", flush=True)
    for folder in stage.make_dirs:
        print("    $ " + shlex.join(["mkdir", "-p", folder]), flush=True)
    print("    $ " + shlex.join(stage.argv(_display_python())), flush=True)
    if not stage.is_available():
        raise StageError(f"stage {stage.name!r} cannot run: module {stage.module} not found"
                         + (f" ({stage.missing_hint})" if stage.missing_hint else ""))
    for folder in stage.make_dirs:
        os.makedirs(folder, exist_ok=True)
    if stage.prepare is not None:
        stage.prepare()
    log_path = settings.path("logs", f"{index}-{stage.name}.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    start = time.time()
    with open(log_path, "wb") as log_writer:
        process = subprocess.Popen(stage.argv(), env=_child_env(),  # cwd: the caller's
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            tail = _stream(process, log_writer)
        finally:
            returncode = process.wait()
    seconds = time.time() - start
    if returncode != 0:
        tail_text = "\n".join("      " + line for line in tail[-15:] if not _is_noise(line))
        raise StageError(f"stage {stage.name!r} failed (exit code {returncode}) after "
                         f"{seconds:.1f} s; full log: {log_path}\n{tail_text}")
    lines, figures = stage.report()
    print(f"    done in {seconds:.1f} s", flush=True)
    for line in lines:
        print(f"    - {line}", flush=True)
    return {"seconds": round(seconds, 2), "command": stage.argv(_display_python()),
            "log": log_path, "headline": lines[0] if lines else "", **figures}


def _display_path(path: str) -> str:
    """`path` as a user would type it: relative when under the current folder."""
    relative = os.path.relpath(path, os.getcwd())
    return relative if not relative.startswith("..") else path


def _display_python() -> str:
    """The interpreter as a user would type it (relative when inside the repository)."""
    return _display_path(sys.executable)


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


def print_summary(stages, results: dict, settings: Settings, total_seconds: float) -> None:
    print("\n" + "=" * 78)
    print(f"Demo finished in {total_seconds:.1f} s. Outputs under {settings.output_dir}/:")
    for stage in stages:
        if stage.name in results:
            result = results[stage.name]
            print(f"  {stage.name:<18} {result['seconds']:>7.1f} s  {result['headline']}")
    print(f"  {'logs':<18} {settings.path('logs')}/")
    print(f"  {'summary':<18} {settings.path('demo_summary.json')}")
    print(f"\nTensorBoard (pretraining and fine-tuning curves): "
          f"tensorboard --logdir {settings.output_dir}")
    print("\nRun each stage by hand (replace the paths and sizes with your own data):")
    for index, stage in enumerate(stages, start=1):
        print(f"\n  # {index}. {stage.title}")
        for folder in stage.make_dirs:
            print("  " + shlex.join(["mkdir", "-p", folder]))
        print("  " + _wrap_command(stage.argv(_display_python())))


def _wrap_command(argv: list) -> str:
    flags_start = next((i for i, a in enumerate(argv) if a.startswith("--")), len(argv))
    head = shlex.join(argv[:flags_start])
    return " \\\n      ".join([head] + [shlex.quote(a) for a in argv[flags_start:]])


def main(argv) -> int:
    del argv
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
    except StageError as err:
        print(f"\nERROR: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        summary["seconds"] = round(time.time() - start, 2)
        with open(summary_path, "w", encoding="utf-8") as writer:
            json.dump(summary, writer, indent=2)
            writer.write("\n")
    print_summary(stages, results, settings, time.time() - start)
    return 0


if __name__ == "__main__":
    define_flags()
    app.run(main)
