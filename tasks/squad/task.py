"""The SQuAD task as the loop and the runner see it: span loss, dataset, scoring and prediction files.

`SpanTask` is the loop's task object (the original run_squad's loss) and `SquadFamily` is
what `training.finetuning.run` needs (the windows' records read as every family's, its
`records`):
`--train_file` for training, `--predict_file` for `--do_eval` (the official EM/F1, which
needs gold answers; it picks the best seed and checkpoint) and `--do_predict` (the
original's `predictions.json`, `nbest_predictions.json`, v2.0 `null_odds.json`, plus
`eval_results.json` when the file has answers, written together).
"""

from __future__ import annotations

import dataclasses

from data_prep.cli import UserError
from modeling import losses
from modeling.export.metadata import ExportMetadata
from tasks.squad import data
from training import finetuning, input_pipeline
from training.loop import Task

# The serving family that exports a SQuAD run (`tasks.squad.export`, which reads it from
# here: the run's metadata names it, and the serving module imports this one).
MODEL_TYPE = "squad"


class SpanTask(Task):
    """Span labelling (the original run_squad's loss): mean of the start and end cross-entropy.

    Features: `input_ids`, `input_mask`, `segment_ids`, `start_positions` and
    `end_positions` ([batch] or [batch, 1] int; 0 = [CLS]). Model outputs: `start_logits`
    and `end_logits` [batch, seq_length]. Progress and eval figures: the losses and the
    argmax accuracy of each boundary.
    """

    stat_keys = ("loss", "start_loss", "end_loss", "start_correct_sum", "end_correct_sum",
                 "example_count")
    mean_keys = ("loss", "start_loss", "end_loss")

    def loss_and_stats(self, outputs, features):
        return losses.span_loss(outputs["start_logits"], outputs["end_logits"],
                                features["start_positions"], features["end_positions"])

    def metrics_from_totals(self, totals, global_step):
        steps = max(float(totals.get("steps", 0.0)), 1.0)
        count = max(float(totals["example_count"]), 1.0)
        return {"global_step": int(global_step), "loss": float(totals["loss"]) / steps,
                "start_loss": float(totals["start_loss"]) / steps,
                "end_loss": float(totals["end_loss"]) / steps,
                "start_accuracy": float(totals["start_correct_sum"]) / count,
                "end_accuracy": float(totals["end_correct_sum"]) / count}

    def progress(self, totals):
        count = max(totals["example_count"], 1.0)
        return [("start_accuracy", "start_acc", totals["start_correct_sum"] / count),
                ("end_accuracy", "end_acc", totals["end_correct_sum"] / count)]


@dataclasses.dataclass(frozen=True)
class SquadExportMetadata(ExportMetadata):
    """`export_metadata.json` of a SQuAD run: the shared fields plus the windows and the
    answer selection the run used, so that its export serves what it predicted.

    Attributes:
      max_query_length, doc_stride: how the run cut questions and contexts into windows.
      max_answer_length, n_best_size: how the run picked the answer span.
      (0: not recorded, metadata written before they were: the export's defaults apply.)
      bilstm_units: the model's BiLSTM (run_squad.py --bilstm_units; 0: none, and the key
        is then not written, as before it existed).
    """

    max_query_length: int = 0
    doc_stride: int = 0
    max_answer_length: int = 0
    n_best_size: int = 0
    bilstm_units: int = 0

    def to_json(self) -> str:
        import json

        data = json.loads(super().to_json())
        if not self.bilstm_units:
            del data["bilstm_units"]
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


class SquadFamily(finetuning.TaskFamily):
    """SQuAD for `training.finetuning.run` (see `training.finetuning.TaskFamily`).

    After a run, `results[run_dir]` holds what the last prediction in that directory gave:
    {"predictions": postprocess.SquadPredictions, "files": name -> path, "eval": the
    official scores or None}.
    """

    name = "squad"

    def __init__(self, settings: data.SquadSettings, max_seq_length: int):
        self.settings = settings
        self.max_seq_length = max_seq_length
        self.window = data.WindowConfig(max_seq_length, settings.doc_stride,
                                        settings.max_query_length)
        self._batch_sizes: dict = {}
        self._dataset_json = None
        self._final_logits: dict = {}
        self.results: dict = {}

    def identity(self) -> dict:
        # The BiLSTM changes the weights' meaning; named only when there is one, so the
        # identity of the original's model is unchanged.
        bilstm = self.settings.bilstm_units
        return {"task": "squad", **({"bilstm_units": bilstm} if bilstm else {})}

    def check_files(self, run) -> None:
        """Raises UserError naming the flag of an input file that does not exist."""
        from data_prep import fileio

        files = [("vocab_file", run.vocab_file)]
        files += [("train_file", self.settings.train_file)] if run.do_train else []
        files += ([("predict_file", self.settings.predict_file)]
                  if run.do_predict or run.do_eval else [])
        for name, path in files:
            if not fileio.exists(path):
                raise UserError(f"--{name}={path}: no such file")

    def prepare(self, run):
        from tasks.squad import metrics

        self.check_files(run)
        cfg = self.settings

        def prepare(path, is_training):
            return data.prepare_squad_records(
                path, run.output_dir, vocab_file=run.vocab_file,
                do_lower_case=run.do_lower_case, config=self.window, is_training=is_training,
                version_2_with_negative=cfg.version_2_with_negative)

        prepared = finetuning.PreparedData()
        if run.do_train:
            train = prepare(cfg.train_file, True)
            if train.num_features == 0:
                raise data.SquadFormatError(f"{cfg.train_file}: no training examples")
            # As the original: examples (not windows) / batch * epochs.
            prepared.train = finetuning.Split("train", "", train.num_examples, train)
        if run.do_eval or run.do_predict:
            predict = prepare(cfg.predict_file, False)
            split = finetuning.Split("dev", "", predict.num_examples, predict)
            self._dataset_json = data.load_squad_json(cfg.predict_file)
            if run.do_eval:
                if not metrics.has_gold_answers(self._dataset_json):
                    raise UserError(f"--do_eval: {cfg.predict_file} has no answers to score "
                                    "(a test file); use --do_predict alone")
                prepared.eval_splits.append(split)
                self._batch_sizes["eval"] = run.eval_batch_size
            if run.do_predict:
                prepared.predict_splits.append(split)
                self._batch_sizes["predict"] = run.predict_batch_size
        self._do_lower_case = run.do_lower_case
        return prepared

    def build_model(self, bert_config):
        from modeling.models import BertSpanLabeler

        return BertSpanLabeler(bert_config, bilstm_units=self.settings.bilstm_units)

    def loop_task(self):
        return SpanTask()

    def records(self, split):
        is_training = split.name == "train"
        spec = data.squad_schema(is_training).parse_spec(max_seq_length=self.max_seq_length)
        return input_pipeline.RecordsConfig((split.data.record_file,), spec)

    def primary_metric(self) -> str:
        return "f1"

    def _logits(self, trainer, split, batch_size):
        """(unique ids, start logits, end logits) of every window, padding rows dropped."""
        prepared = split.data
        out = self.predict_outputs(trainer, split, batch_size,
                                   output_keys=("start_logits", "end_logits"),
                                   feature_keys=("unique_ids",),
                                   sequence_keys=("start_logits", "end_logits"))
        unique_ids = out["unique_ids"].reshape(-1)
        known = {f.unique_id for f in prepared.features}
        keep = [i for i, u in enumerate(unique_ids) if int(u) in known]  # drops padding
        if len(keep) != prepared.num_features:
            raise RuntimeError(f"{prepared.record_file}: {len(keep)} windows predicted, "
                               f"{prepared.num_features} expected")
        return unique_ids[keep], out["start_logits"][keep], out["end_logits"][keep]

    def _postprocess_config(self):
        from tasks.squad import postprocess

        cfg = self.settings
        return postprocess.PostprocessConfig(
            n_best_size=cfg.n_best_size, max_answer_length=cfg.max_answer_length,
            do_lower_case=self._do_lower_case,
            version_2_with_negative=cfg.version_2_with_negative,
            null_score_diff_threshold=cfg.null_score_diff_threshold,
            verbose_logging=cfg.verbose_logging)

    def _score(self, predictions):
        """The official scores, or None for a file without answers."""
        from tasks.squad import metrics

        if not metrics.has_gold_answers(self._dataset_json):
            return None
        # The v2.0 metrics whenever the file has unanswerable questions, even without the
        # flag (the v1.1 ones cannot score a question with no gold answer).
        v2 = self.settings.version_2_with_negative or metrics.is_v2_dataset(self._dataset_json)
        return metrics.evaluate(self._dataset_json, predictions.predictions,
                                predictions.null_odds or None, version_2_with_negative=v2,
                                source=self.settings.predict_file)

    def evaluate(self, trainer, split, *, step, run_dir, write):
        from tasks.squad import postprocess

        logits = self._logits(trainer, split, self._batch_sizes["eval"])
        if write:  # the final evaluation: --do_predict reuses these logits
            self._final_logits[split.name] = logits
        predictions = postprocess.compute_predictions(split.data.examples, split.data.features,
                                                      logits, self._postprocess_config())
        scores = dict(self._score(predictions))
        scores["global_step"] = int(step)
        return scores

    def predict(self, trainer, split, *, run_dir, write):
        import json
        import os

        from absl import logging

        from data_prep import fileio
        from tasks.squad import metrics, postprocess

        logits = self._final_logits.pop(split.name, None)
        if logits is None:
            logits = self._logits(trainer, split, self._batch_sizes["predict"])
        prepared = split.data
        predictions = postprocess.compute_predictions(prepared.examples, prepared.features,
                                                      logits, self._postprocess_config())
        scores = self._score(predictions)
        self.results[run_dir] = {"predictions": predictions, "files": {}, "eval": scores}
        if not write:
            return []
        texts = postprocess.predictions_to_json(predictions)
        if not self.settings.version_2_with_negative:
            texts.pop("null_odds.json", None)
        if scores is not None:
            texts["eval_results.json"] = metrics.eval_results_text(scores)
        paths = {name: os.path.join(run_dir, name) for name in texts}
        fileio.write_texts({paths[name]: text for name, text in texts.items()})
        for path in paths.values():
            logging.info("Wrote %s", path)
        if scores is None:
            logging.info("%s has no answers: predictions written, nothing to score",
                         self.settings.predict_file)
        else:
            logging.info("***** Eval results (%d questions) *****", prepared.num_examples)
            print(json.dumps(scores, sort_keys=True))
        self.results[run_dir]["files"] = paths
        return list(paths.values())

    def export_metadata(self, run):
        cfg = self.settings
        return SquadExportMetadata(
            task="squad_v2" if cfg.version_2_with_negative else "squad",
            do_lower_case=run.do_lower_case, max_seq_length=run.max_seq_length,
            model_type=MODEL_TYPE, max_query_length=cfg.max_query_length,
            doc_stride=cfg.doc_stride, max_answer_length=cfg.max_answer_length,
            n_best_size=cfg.n_best_size, bilstm_units=cfg.bilstm_units)
