"""The demo's stage reports: each reads what its stage wrote and returns (lines, figures).

A report raises `StageError` when an output it expects is missing; its lines are
printed under the stage and its figures go into OUTPUT/demo_summary.json. `settings` is
the demo's `Settings` (only its paths and a few sizes are read).
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import struct

from demo_lib.settings import Settings
from demo_lib.stages import StageError


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


def corpus_report(settings: Settings):
    """Files, size, documents and sentences of the corpus."""
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


def vocab_report(settings: Settings):
    """The vocab's size and build_vocab's [UNK] rate, pieces per word and special ids."""
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


def pretraining_report(settings: Settings):
    """The records' files and size, and create_pretraining_data's summary in words."""
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


def pretraining_run_report(settings: Settings):
    """run_pretraining.py's eval results (loss, masked-LM and next-sentence accuracy)."""
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


def classifier_data_report(settings: Settings):
    """Labels, rows and documents of the classification splits."""
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


def classifier_report(settings: Settings):
    """Dev accuracy and loss, and the test predictions scored against test.tsv."""
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


def export_report(settings: Settings):
    """The SavedModel's size and labels."""
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


def predict_report(settings: Settings):
    """The reloaded SavedModel's label and probability for each raw sentence."""
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
