"""Fine-tunes BERT on SQuAD v1.1 / v2.0, predicts answers and scores them with the official metrics.

Same flags as Google's run_squad.py, plus the shared distribution, precision and optimizer
flags (training/flags.py); see docs/run_squad.md. The runner parses flags into a `SquadRun`
and calls `run`; windows, post-processing and metrics live in data_prep/squad*.py, the loop
in training/loop.py (`SpanTask`):

    python run_squad.py --vocab_file=uncased_L-12_H-768_A-12/vocab.txt \\
      --bert_config_file=uncased_L-12_H-768_A-12/bert_config.json \\
      --init_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \\
      --do_train --train_file=train-v1.1.json --do_predict --predict_file=dev-v1.1.json \\
      --train_batch_size=32 --learning_rate=3e-5 --num_train_epochs=2.0 \\
      --max_seq_length=384 --doc_stride=128 --output_dir=/tmp/squad_base
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from absl import app, flags, logging

from training import flags as common_flags
from training import runs

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

# The original's --max_seq_length default for SQuAD; the shared flag's default (128) is the
# classifier's, so an absent --max_seq_length means this.
SQUAD_MAX_SEQ_LENGTH = 384


@dataclasses.dataclass(frozen=True)
class SquadRun:
    """Everything one SQuAD run needs, read from flags once (see the flag help)."""

    vocab_file: str
    bert_config_file: str
    output_dir: str
    train_file: str | None = None
    predict_file: str | None = None
    init_checkpoint: str | None = None
    do_lower_case: bool = True
    max_seq_length: int = SQUAD_MAX_SEQ_LENGTH
    doc_stride: int = 128
    max_query_length: int = 64
    do_train: bool = False
    do_predict: bool = False
    train_batch_size: int = 32
    predict_batch_size: int = 8
    learning_rate: float = 5e-5
    num_train_epochs: float = 3.0
    warmup_proportion: float = 0.1
    save_checkpoints_steps: int = 1000
    iterations_per_loop: int = 1000
    log_steps: int = 100
    keep_checkpoint_max: int = 5
    gradient_accumulation_steps: int = 1
    optimizer: str = "adamw"
    weight_decay_rate: float = 0.01
    clip_norm: float = 1.0
    n_best_size: int = 20
    max_answer_length: int = 30
    verbose_logging: bool = False
    version_2_with_negative: bool = False
    null_score_diff_threshold: float = 0.0
    runtime: common_flags.RuntimeConfig = common_flags.RuntimeConfig("")


def run_config_from_flags(values=FLAGS) -> SquadRun:
    """Turns the flags into a `SquadRun` (checked by `validate`)."""
    max_seq_length = (values.max_seq_length if values["max_seq_length"].present
                      else SQUAD_MAX_SEQ_LENGTH)
    return SquadRun(
        vocab_file=values.vocab_file, bert_config_file=values.bert_config_file,
        output_dir=values.output_dir, train_file=values.train_file,
        predict_file=values.predict_file, init_checkpoint=values.init_checkpoint,
        do_lower_case=values.do_lower_case, max_seq_length=max_seq_length,
        doc_stride=values.doc_stride, max_query_length=values.max_query_length,
        do_train=values.do_train, do_predict=values.do_predict,
        train_batch_size=values.train_batch_size,
        predict_batch_size=values.predict_batch_size, learning_rate=values.learning_rate,
        num_train_epochs=values.num_train_epochs, warmup_proportion=values.warmup_proportion,
        save_checkpoints_steps=max(1, values.save_checkpoints_steps),
        iterations_per_loop=max(1, values.iterations_per_loop),
        log_steps=max(1, values.log_steps), keep_checkpoint_max=values.keep_checkpoint_max,
        gradient_accumulation_steps=values.gradient_accumulation_steps,
        optimizer=values.optimizer, weight_decay_rate=values.weight_decay_rate,
        clip_norm=values.clip_norm, n_best_size=values.n_best_size,
        max_answer_length=values.max_answer_length, verbose_logging=values.verbose_logging,
        version_2_with_negative=values.version_2_with_negative,
        null_score_diff_threshold=values.null_score_diff_threshold,
        runtime=common_flags.runtime_config(values))


def validate(cfg: SquadRun, bert_config=None):
    """The original's validate_flags_or_throw; raises ValueError. With `bert_config` (after
    the strategy exists: multi-worker wants it before any TensorFlow work) it also checks
    that the input files exist and the sequence length fits the model."""
    for name in ("vocab_file", "bert_config_file", "output_dir"):
        if not getattr(cfg, name):
            raise ValueError(f"--{name} is required")
    if not cfg.do_train and not cfg.do_predict:
        raise ValueError("At least one of `do_train` or `do_predict` must be True.")
    if cfg.do_train and not cfg.train_file:
        raise ValueError("If `do_train` is True, then `train_file` must be specified.")
    if cfg.do_predict and not cfg.predict_file:
        raise ValueError("If `do_predict` is True, then `predict_file` must be specified.")
    if cfg.max_seq_length <= cfg.max_query_length + 3:
        raise ValueError(
            f"The max_seq_length ({cfg.max_seq_length}) must be greater than "
            f"max_query_length ({cfg.max_query_length}) + 3")
    if cfg.gradient_accumulation_steps < 1:
        raise ValueError("--gradient_accumulation_steps must be >= 1, found "
                         f"{cfg.gradient_accumulation_steps}")
    if bert_config is None:
        return
    import tensorflow as tf

    files = [("vocab_file", cfg.vocab_file)]
    files += [("train_file", cfg.train_file)] if cfg.do_train else []
    files += [("predict_file", cfg.predict_file)] if cfg.do_predict else []
    for name, path in files:
        if not tf.io.gfile.exists(path):
            raise ValueError(f"--{name}={path}: no such file")


def _write_model_files(cfg: SquadRun, bert_config):
    """Model files beside the checkpoints, so `export_saved_model.py --model_type=squad
    --init_checkpoint=<output_dir>` needs only the window flags."""
    from modeling import export

    runs.write_model_files(cfg.output_dir, bert_config, cfg.vocab_file, export.ExportMetadata(
        task="squad_v2" if cfg.version_2_with_negative else "squad",
        do_lower_case=cfg.do_lower_case, max_seq_length=cfg.max_seq_length))


def run(cfg: SquadRun) -> dict:
    """Trains and/or predicts as `cfg` asks.

    Returns:
      {"global_step", "num_train_steps", "predictions" (data_prep.squad.SquadPredictions or
      None), "files" (name -> path of the written prediction files), "eval" (the official
      metrics, or None when not predicting or the predict file has no answers)}.
    """
    validate(cfg)
    strategy = common_flags.setup_runtime(cfg.runtime)  # First: multi-worker needs it so.

    import tensorflow as tf

    from data_prep import squad
    from modeling.models import BertSpanLabeler
    from training import input_pipeline, loop

    bert_config = runs.load_bert_config(cfg.bert_config_file, cfg.max_seq_length)
    validate(cfg, bert_config)
    replicas = strategy.num_replicas_in_sync
    runs.check_batch("train_batch_size", cfg.train_batch_size, replicas,
                     cfg.gradient_accumulation_steps)
    runs.check_batch("predict_batch_size", cfg.predict_batch_size, replicas)
    tf.io.gfile.makedirs(cfg.output_dir)
    window = squad.WindowConfig(cfg.max_seq_length, cfg.doc_stride, cfg.max_query_length)

    def prepare(path, is_training):
        return squad.prepare_squad_records(
            path, cfg.output_dir, vocab_file=cfg.vocab_file, do_lower_case=cfg.do_lower_case,
            config=window, is_training=is_training,
            version_2_with_negative=cfg.version_2_with_negative)

    train = prepare(cfg.train_file, True) if cfg.do_train else None
    num_train_steps = num_warmup_steps = 0
    if train is not None:
        if train.num_features == 0:
            raise ValueError(f"{cfg.train_file}: no training examples")
        # As the original: examples (not windows) / batch * epochs.
        num_train_steps, num_warmup_steps = runs.finetuning_steps(
            train.num_examples, cfg.train_batch_size, cfg.num_train_epochs,
            cfg.warmup_proportion)
    predict = prepare(cfg.predict_file, False) if cfg.do_predict else None

    model, trainer = runs.build_trainer(
        strategy, lambda: BertSpanLabeler(bert_config), loop.SpanTask(),
        hparams=runs.hyperparameters_from(cfg), max_seq_length=cfg.max_seq_length,
        output_dir=cfg.output_dir, num_train_steps=num_train_steps,
        num_warmup_steps=num_warmup_steps, train_batch_size=cfg.train_batch_size,
        eval_batch_size=cfg.predict_batch_size)
    if trainer.is_chief:
        _write_model_files(cfg, bert_config)
    start_step = runs.restore_or_init(trainer, model, cfg.init_checkpoint,
                                      do_train=cfg.do_train)
    seed = cfg.runtime.seed

    def records(prepared, batch_size, is_training, input_context=None):
        config = input_pipeline.SquadInputConfig(
            (prepared.record_file,), cfg.max_seq_length,
            seed=None if seed is None else seed + start_step)
        return input_pipeline.squad_dataset(config, batch_size=batch_size,
                                            is_training=is_training,
                                            input_context=input_context)

    if train is not None:
        logging.info("Training on %d examples (%d windows): %d steps (%d warmup), batch %d, "
                     "from step %d", train.num_examples, train.num_features, num_train_steps,
                     num_warmup_steps, cfg.train_batch_size, start_step)

        def train_fn(input_context):
            return records(train, input_context.get_per_replica_batch_size(
                cfg.train_batch_size), True, input_context)

        trainer.train(train_fn)
    result = {"global_step": int(trainer.global_step.numpy()),
              "num_train_steps": num_train_steps, "predictions": None, "files": {},
              "eval": None}
    if predict is not None:
        result.update(_predict(cfg, trainer, predict,
                               records(predict, cfg.predict_batch_size, False)))
    return result


def _predict(cfg: SquadRun, trainer, predict, dataset) -> dict:
    """Logits over eval.tf_record -> the three prediction files -> the official metrics."""
    from data_prep import squad, squad_metrics

    logging.info("Predicting %d examples (%d windows), batch %d", predict.num_examples,
                 predict.num_features, cfg.predict_batch_size)
    out = trainer.predict(dataset, output_keys=("start_logits", "end_logits"),
                          feature_keys=("unique_ids",))
    unique_ids = out["unique_ids"].reshape(-1)
    known = {f.unique_id for f in predict.features}
    keep = [i for i, u in enumerate(unique_ids) if int(u) in known]  # drops padding rows
    if len(keep) != predict.num_features:
        raise RuntimeError(f"{predict.record_file}: {len(keep)} windows predicted, "
                           f"{predict.num_features} expected")
    post = squad.PostprocessConfig(
        n_best_size=cfg.n_best_size, max_answer_length=cfg.max_answer_length,
        do_lower_case=cfg.do_lower_case, version_2_with_negative=cfg.version_2_with_negative,
        null_score_diff_threshold=cfg.null_score_diff_threshold,
        verbose_logging=cfg.verbose_logging)
    logits = (unique_ids[keep], out["start_logits"][keep], out["end_logits"][keep])
    if not trainer.is_chief:
        return {"predictions": squad.compute_predictions(predict.examples, predict.features,
                                                         logits, post)}
    predictions, paths = squad.write_predictions(predict.examples, predict.features, logits,
                                                 post, cfg.output_dir)
    scores = None
    dataset_json = squad.load_squad_json(cfg.predict_file)
    if squad_metrics.has_gold_answers(dataset_json):
        # The v2.0 metrics whenever the file has unanswerable questions, even without the
        # flag (the v1.1 ones cannot score a question with no gold answer).
        v2 = cfg.version_2_with_negative or squad_metrics.is_v2_dataset(dataset_json)
        scores = squad_metrics.evaluate(dataset_json, predictions.predictions,
                                        predictions.null_odds or None,
                                        version_2_with_negative=v2)
        path = os.path.join(cfg.output_dir, "eval_results.json")
        squad_metrics.write_eval_results(scores, path)
        paths["eval_results.json"] = path
        logging.info("***** Eval results (%d questions) *****", predict.num_examples)
        print(json.dumps(scores, sort_keys=True))
    else:
        logging.info("%s has no answers: predictions written, nothing to score",
                     cfg.predict_file)
    return {"predictions": predictions, "files": paths, "eval": scores}


def main(argv):
    del argv
    from data_prep import squad

    try:
        run(run_config_from_flags(FLAGS))
    except (ValueError, FileNotFoundError, squad.SquadFormatError) as err:
        logging.error("%s", err)
        sys.exit(f"run_squad.py: error: {err}")


if __name__ == "__main__":
    app.run(main)
