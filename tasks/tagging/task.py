"""The token-tagging task as the loop and the runner see it: loss, model, windows' datasets, conlleval scores, prediction files.

`TaggingTask` is the loop's task object (mean cross-entropy over each word's first
WordPiece, `modeling.losses.tagging_loss`). `TaggingFamily` is what
`training.finetuning.run` needs: labels from the training file (or `--label_list`), the
model (`BertTokenTagger` fine-tuned, or with `feature_based` the frozen encoder + BiLSTM
`BertFeatureTagger` of the paper's Table 7), the windows' records, and per split:

* dev (`--do_eval`): every word scored once, from its max-context window; the conlleval
  figures of `tasks.tagging.metrics` as `eval_precision`, `eval_recall`, `eval_f1`,
  `eval_accuracy`, per entity type `eval_precision_<TYPE>` ..., and `eval_loss` (mean
  cross-entropy of the gold tags over all words); the final evaluation also writes
  `dev_predictions.txt` (`word gold predicted`, conlleval's input);
* test (`--do_predict`): `test_predictions.txt`, plus `test_results.txt` with the same
  figures (keys `test_...`) when the test file has tags.

Tag sets that are not chunk tags (scheme "none", e.g. POS) get `eval_accuracy` and
`eval_loss` only, and `eval_accuracy` is the metric `--seeds` and
`--keep_best_checkpoint` maximise (otherwise `eval_f1`).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from data_prep import fileio
from data_prep.cli import UserError
from modeling import losses
from modeling.export.metadata import METADATA_FILE, ExportMetadata
from tasks.tagging import data, metrics
from tasks.tagging.data import DEFAULT_FEATURE_LAYERS, DEFAULT_LSTM_UNITS, TaggingSettings
from training import finetuning, input_pipeline
from training.loop import Task

# The serving family that exports a tagging run (`tasks.tagging.export`, which reads it
# from here: the run's metadata names it, and the serving module imports this one).
MODEL_TYPE = "tagger"


class TaggingTask(Task):
    """Token tagging: mean cross-entropy over the positions with `label_weights` 1.

    Features: `input_ids`, `input_mask`, `segment_ids`, `label_ids` and `label_weights`
    [batch, seq_length]. Model outputs: `logits` [batch, seq_length, num_labels].
    Progress and loop-eval figures: loss and the accuracy of the weighted positions.
    """

    stat_keys = ("loss", "loss_sum", "correct_sum", "token_count")
    mean_keys = ("loss",)

    def loss_and_stats(self, outputs, features):
        return losses.tagging_loss(outputs["logits"], features["label_ids"],
                                   features["label_weights"])

    def metrics_from_totals(self, totals, global_step):
        count = max(float(totals["token_count"]), 1.0)
        return {"global_step": int(global_step),
                "eval_loss": float(totals["loss_sum"]) / count,
                "eval_accuracy": float(totals["correct_sum"]) / count}

    def progress(self, totals):
        return [("accuracy", "acc", totals["correct_sum"] / max(totals["token_count"], 1.0))]


@dataclasses.dataclass(frozen=True)
class TaggingExportMetadata(ExportMetadata):
    """`export_metadata.json` of a tagging run: the shared fields plus what rebuilding the
    model and decoding its tags need.

    Attributes:
      tag_scheme: IOB1, IOB2, IOBES, IOE or "none" (`data.detect_tag_scheme`); entities
        are decoded from predicted tags with conlleval's rules (`metrics.chunks`).
      doc_stride, document_context: how the run cut text into windows.
      feature_based, feature_layers, lstm_units: the model (a `BertFeatureTagger` when
        feature_based, else a `BertTokenTagger`).
    """

    tag_scheme: str = "IOB2"
    doc_stride: int = 0
    document_context: bool = False
    feature_based: bool = False
    feature_layers: str = ""
    lstm_units: int = 0


def build_tagging_model(bert_config, num_labels: int, *, feature_based: bool = False,
                        feature_layers: str = DEFAULT_FEATURE_LAYERS,
                        lstm_units: int = DEFAULT_LSTM_UNITS, dtype=None):
    """The tagger: `BertTokenTagger` (fine-tuning) or `BertFeatureTagger` (feature-based)."""
    from modeling.models import BertFeatureTagger, BertTokenTagger

    kwargs = {} if dtype is None else {"dtype": dtype}
    if feature_based:
        return BertFeatureTagger(bert_config, num_labels, feature_layers=feature_layers,
                                 lstm_units=lstm_units, **kwargs)
    return BertTokenTagger(bert_config, num_labels, **kwargs)


def model_from_metadata(bert_config, metadata: TaggingExportMetadata, dtype=None):
    """The tagger a run with this `export_metadata.json` trained (for export)."""
    return build_tagging_model(bert_config, len(metadata.labels),
                               feature_based=metadata.feature_based,
                               feature_layers=metadata.feature_layers or DEFAULT_FEATURE_LAYERS,
                               lstm_units=metadata.lstm_units or DEFAULT_LSTM_UNITS,
                               dtype=dtype)


class TaggingFamily(finetuning.TaskFamily):
    """Token tagging for `training.finetuning.run` (see `training.finetuning.TaskFamily`).

    Labels are known from construction on (the run directory's identity needs them): from
    `settings.label_list`, else read from the training file (a missing one is an error
    naming the flag to give instead).
    """

    name = "tagging"

    def __init__(self, settings: TaggingSettings, max_seq_length: int):
        from modeling.models import FEATURE_LAYERS

        self.settings = settings
        self.window = data.WindowConfig(max_seq_length=max_seq_length,
                                        doc_stride=settings.doc_stride,
                                        document_context=settings.document_context)
        if settings.feature_layers not in FEATURE_LAYERS:
            raise UserError(f"--feature_layers={settings.feature_layers}; expected one of "
                            f"{', '.join(FEATURE_LAYERS)}")
        if settings.lstm_units < 1:
            raise UserError(f"--lstm_units={settings.lstm_units} must be at least 1")
        self._train_file = None
        if settings.label_list:
            self.label_list = list(data.parse_label_list(settings.label_list))
            self.label_source = "--label_list"
        else:
            self._train_file = self._read("train", require_tags=True, hint=(
                "the labels come from the training file; give --label_list to run without "
                "one"))
            self.label_list = data.labels_from_sentences(self._train_file)
            self.label_source = f"the tags of {self._train_file.path}"
        self.tag_scheme = data.detect_tag_scheme(
            self.label_list, self._train_file.sentences if self._train_file else ())
        if self._train_file is not None:
            # Mixed schemes (B-/I- chunks and S- tags, ...) would be recorded silently.
            data.warn_tag_scheme_breaks(self._train_file, self.tag_scheme)
        self._task = TaggingTask()
        self._batch_sizes: dict = {}
        self._written: dict = {}

    # -- reading --------------------------------------------------------------------------

    def _read(self, split: str, *, require_tags: bool, hint: str = "") -> data.ConllFile:
        try:
            path = data.find_split_file(self.settings.data_dir, split)
        except data.DataFormatError as err:
            raise data.DataFormatError(f"{err}{'; ' + hint if hint else ''}") from None
        return data.read_conll(path, require_tags=require_tags)

    def _split_file(self, split: str, *, require_tags: bool) -> data.ConllFile:
        if split == "train" and self._train_file is not None:
            return self._train_file
        conll = self._read(split, require_tags=require_tags)
        data.check_tags(conll, self.label_list, self.label_source)
        data.warn_tag_scheme_breaks(conll, self.tag_scheme)
        if split == "train":
            self._train_file = conll
        return conll

    # -- TaskFamily ------------------------------------------------------------------------

    def identity(self) -> dict:
        s = self.settings
        return {"task": "tagging", "labels": list(self.label_list),
                "feature_based": s.feature_based,
                "feature_layers": s.feature_layers if s.feature_based else None,
                "lstm_units": s.lstm_units if s.feature_based else None}

    def prepare(self, run):
        from absl import logging

        from data_prep import tokenization

        self._check_trained_model(run)
        tokenizer = tokenization.FullTokenizer(run.vocab_file, do_lower_case=run.do_lower_case)
        # Every split the run needs is read and checked before any record is written.
        wanted = [("train", True, run.do_train), ("dev", True, run.do_eval),
                  ("test", False, run.do_predict)]
        files = {split: self._split_file(split, require_tags=tags)
                 for split, tags, needed in wanted if needed}
        if self.settings.feature_based and run.do_train and not run.init_checkpoint:
            logging.warning("--feature_based without --init_checkpoint: the frozen encoder "
                            "keeps its random initial weights")

        def split_of(name, is_training):
            prepared = data.prepare_tagging_records(
                files[name], name, run.output_dir, vocab_file=run.vocab_file,
                do_lower_case=run.do_lower_case, config=self.window,
                label_list=self.label_list, is_training=is_training, tokenizer=tokenizer)
            return finetuning.Split(name, "", prepared.num_sentences, prepared)

        prepared = finetuning.PreparedData()
        if run.do_train:
            prepared.train = split_of("train", True)
        if run.do_eval:
            prepared.eval_splits.append(split_of("dev", False))
            self._batch_sizes["dev"] = run.eval_batch_size
        if run.do_predict:
            prepared.predict_splits.append(split_of("test", False))
            self._batch_sizes["test"] = run.predict_batch_size
        return prepared

    def _check_trained_model(self, run) -> None:
        """Without --do_train, an --init_checkpoint directory of another tagging run must
        hold this run's model and labels: partial loading would otherwise leave a head
        that does not fit at its random initial weights, and predict with it."""
        import json

        path = run.init_checkpoint
        if run.do_train or not path or not fileio.isdir(path):
            return
        meta_file = os.path.join(path, METADATA_FILE)
        if not fileio.exists(meta_file):
            return
        found = json.loads(fileio.read_text(meta_file))
        if found.get("task") != "tagging":
            return
        mine = self.export_metadata(run)
        differ = [key for key in ("labels", "feature_based", "feature_layers", "lstm_units")
                  if found.get(key) != dataclasses.asdict(mine)[key]
                  and not (key == "labels" and tuple(found.get(key, ())) == mine.labels)]
        if differ:
            raise UserError(
                f"--init_checkpoint={path} is a tagging run whose "
                + ", ".join(f"{key}={found.get(key)!r}" for key in differ)
                + " differ from this run's ("
                + ", ".join(f"{key}={dataclasses.asdict(mine)[key]!r}" for key in differ)
                + "): pass its --label_list / --feature_based / --feature_layers / "
                "--lstm_units to evaluate or predict with it")

    def build_model(self, bert_config):
        s = self.settings
        return build_tagging_model(bert_config, len(self.label_list),
                                   feature_based=s.feature_based,
                                   feature_layers=s.feature_layers, lstm_units=s.lstm_units)

    def loop_task(self):
        return self._task

    def records(self, split):
        spec = data.TAGGING_SCHEMA.parse_spec(max_seq_length=self.window.max_seq_length)
        return input_pipeline.RecordsConfig((split.data.record_file,), spec,
                                            sequence_features=data.SEQUENCE_FEATURES)

    def primary_metric(self) -> str:
        return "eval_f1" if data.is_chunk_scheme(self.tag_scheme) else "eval_accuracy"

    def evaluate(self, trainer, split, *, step, run_dir, write):
        predicted, gold_nll = self._predict_words(trainer, split)
        results = self._scores(split.data.conll, predicted, gold_nll, prefix="eval_")
        results["global_step"] = int(step)
        self._written.pop((split.name, run_dir), None)
        if write:
            path = os.path.join(run_dir, "dev_predictions.txt")
            fileio.write_texts({path: data.predictions_text(split.data.conll, predicted)})
            self._written[(split.name, run_dir)] = [path]
        return results

    def eval_output_files(self, split, run_dir):
        return list(self._written.get((split.name, run_dir), []))

    def predict(self, trainer, split, *, run_dir, write):
        from absl import logging

        conll = split.data.conll
        predicted, gold_nll = self._predict_words(trainer, split)
        if not write:
            return []
        texts = {os.path.join(run_dir, "test_predictions.txt"):
                 data.predictions_text(conll, predicted)}
        if conll.has_tags:
            scores = self._scores(conll, predicted, gold_nll, prefix="test_")
            scores["global_step"] = int(trainer.global_step.numpy())
            texts[os.path.join(run_dir, "test_results.txt")] = "".join(
                f"{key} = {scores[key]}\n" for key in sorted(scores))
            for key in sorted(scores):
                logging.info("  %s = %s", key, scores[key])
        fileio.write_texts(texts)
        for path in texts:
            logging.info("Wrote %s (%d sentences, %d words)", path, len(predicted),
                         conll.num_words)
        return list(texts)

    def export_metadata(self, run):
        s = self.settings
        return TaggingExportMetadata(
            model_type=MODEL_TYPE, task="tagging", labels=tuple(self.label_list),
            do_lower_case=run.do_lower_case,
            max_seq_length=run.max_seq_length, tag_scheme=self.tag_scheme,
            doc_stride=self.window.stride, document_context=s.document_context,
            feature_based=s.feature_based,
            feature_layers=s.feature_layers if s.feature_based else "",
            lstm_units=s.lstm_units if s.feature_based else 0)

    # -- predictions -------------------------------------------------------------------------

    def _predict_words(self, trainer, split):
        """(predicted tags per sentence, -log p(gold) per word or None for an untagged file),
        each word read from the one window that scores it."""
        out = self.predict_outputs(
            trainer, split, self._batch_sizes[split.name], output_keys=("logits",),
            feature_keys=("sentence_index", "word_index", "label_weights", "label_ids"),
            sequence_keys=("logits", "word_index", "label_weights", "label_ids"))
        return stitch_predictions(split.data.conll, out, self.label_list)

    def _scores(self, conll, predicted, gold_nll, *, prefix: str) -> dict:
        """conlleval's figures (chunk schemes) or the accuracy alone, and the mean loss."""
        counts = metrics.evaluate(data.evaluation_sequence(conll, predicted))
        figures = counts.figures(types=_label_types(self.label_list))
        if not data.is_chunk_scheme(self.tag_scheme):
            figures = {"accuracy": figures["accuracy"]}
        out = {prefix + key: float(value) for key, value in figures.items()}
        out[prefix + "loss"] = float(np.mean(gold_nll)) if gold_nll is not None else 0.0
        return out


def _label_types(label_list) -> list:
    """The chunk types of a label set (every one gets its eval_..._TYPE keys)."""
    return sorted({metrics.split_tag(label)[1] for label in label_list} - {""})


def stitch_predictions(conll: data.ConllFile, out: dict, label_list) -> tuple:
    """Puts window predictions back on the words of a file.

    Args:
      conll: the split's file (its sentences in the records' `sentence_index` order).
      out: `TrainingLoop.predict` results, rows in record order: `logits` [windows, seq,
        labels], `sentence_index` [windows, 1], `word_index`, `label_weights` and
        `label_ids` [windows, seq] (`label_weights` 1 where a window scores a word).
      label_list: label names in id order.

    Returns:
      (per sentence the predicted tags of its words, float64 [words] -log p(gold tag) in
      file order, or None for a file without tags).

    Raises:
      RuntimeError when a word is scored by no window or by several (records out of step
      with the file).
    """
    sentences = conll.sentences
    sizes = np.array([len(s.words) for s in sentences], np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    rows, cols = np.nonzero(out["label_weights"] > 0)
    sentence = out["sentence_index"].reshape(-1)[rows].astype(np.int64)
    word = offsets[sentence] + out["word_index"][rows, cols].astype(np.int64)
    total = int(offsets[-1])
    hits = np.bincount(word, minlength=total)
    if len(hits) != total or (hits != 1).any():
        missing = int((hits[:total] == 0).sum())
        raise RuntimeError(f"{conll.path}: {missing} of {total} words have no prediction and "
                           f"{int((hits > 1).sum())} several: the records do not match the "
                           "file")
    logits = np.asarray(out["logits"][rows, cols], np.float64)
    order = np.argsort(word)
    logits = logits[order]
    ids = logits.argmax(-1)
    names = np.array(label_list, dtype=object)[ids]
    predicted = [list(names[offsets[i]:offsets[i + 1]]) for i in range(len(sentences))]
    if not conll.has_tags:
        return predicted, None
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    gold = out["label_ids"][rows, cols].astype(np.int64)[order]
    return predicted, -log_probs[np.arange(total), gold]
