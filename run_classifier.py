"""Fine-tunes BERT on GLUE, XNLI or your own CSV/TSV data; evaluates and predicts.

Same flags as Google's run_classifier.py, plus the shared distribution, precision and
optimizer flags (training/flags.py), the custom-data flags, `--seeds` and
`--keep_best_checkpoint` (docs/run_classifier.md). The runner parses flags into a
`ClassifierRun` and calls `run`; the loop, losses, data and metrics live in the libraries:

    python run_classifier.py --task_name=MRPC --data_dir=glue_data/MRPC \\
      --vocab_file=uncased_L-12_H-768_A-12/vocab.txt \\
      --bert_config_file=uncased_L-12_H-768_A-12/bert_config.json \\
      --init_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \\
      --do_train --do_eval --do_predict --max_seq_length=128 --train_batch_size=32 \\
      --learning_rate=2e-5 --num_train_epochs=3.0 --output_dir=/tmp/mrpc_output
"""

from __future__ import annotations

import dataclasses
import math
import os

from absl import app, flags, logging

from training import flags as common_flags
from training import runs

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

# MNLI is evaluated and predicted on both its matched and mismatched sets: split -> suffix
# of the result files.
_EVAL_SPLITS = {"mnli": (("dev_matched", ""), ("dev_mismatched", "_mm"))}
_PREDICT_SPLITS = {"mnli": (("test_matched", ""), ("test_mismatched", "_mm"))}


@dataclasses.dataclass(frozen=True)
class ClassifierRun:
    """Everything one fine-tuning run needs, read from flags once (see the flag help)."""

    task_name: str
    data_dir: str
    vocab_file: str
    bert_config_file: str
    output_dir: str
    init_checkpoint: str | None = None
    do_lower_case: bool = True
    max_seq_length: int = 128
    do_train: bool = False
    do_eval: bool = False
    do_predict: bool = False
    train_batch_size: int = 32
    eval_batch_size: int = 8
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
    xnli_language: str = "zh"
    custom: "object" = None  # data_prep.classifier_data.CustomDataConfig for task "custom"
    skip_bad_rows: bool = False
    seeds: tuple = (None,)
    keep_best_checkpoint: bool = False
    runtime: common_flags.RuntimeConfig = common_flags.RuntimeConfig("")


def _column(value):
    if value is None or str(value).strip() == "":
        return None
    value = str(value).strip()
    try:
        return int(value)
    except ValueError:
        return value


def run_config_from_flags(values=FLAGS) -> ClassifierRun:
    """Validates the flags and turns them into a `ClassifierRun`."""
    from data_prep import classifier_data as cd
    from data_prep.glue_metrics import normalize_task_name

    for name in ("task_name", "data_dir", "vocab_file", "bert_config_file", "output_dir"):
        if not getattr(values, name):
            raise ValueError(f"--{name} is required")
    task = normalize_task_name(values.task_name)
    custom = None
    if task == "custom":
        if _column(values.text_a_column) is None or _column(values.label_column) is None:
            raise ValueError("--task_name=custom needs --text_a_column and --label_column")
        custom = cd.CustomDataConfig(
            text_a_column=_column(values.text_a_column),
            label_column=_column(values.label_column),
            text_b_column=_column(values.text_b_column), delimiter=values.delimiter,
            has_header=values.has_header, labels=values.label_list or None,
            is_regression=values.is_regression, quotechar=values.quotechar)
    return ClassifierRun(
        task_name=task, data_dir=values.data_dir, vocab_file=values.vocab_file,
        bert_config_file=values.bert_config_file, output_dir=values.output_dir,
        init_checkpoint=values.init_checkpoint, do_lower_case=values.do_lower_case,
        max_seq_length=values.max_seq_length, do_train=values.do_train,
        do_eval=values.do_eval, do_predict=values.do_predict,
        train_batch_size=values.train_batch_size, eval_batch_size=values.eval_batch_size,
        predict_batch_size=values.predict_batch_size, learning_rate=values.learning_rate,
        num_train_epochs=values.num_train_epochs, warmup_proportion=values.warmup_proportion,
        save_checkpoints_steps=max(1, values.save_checkpoints_steps),
        iterations_per_loop=max(1, values.iterations_per_loop),
        log_steps=max(1, values.log_steps), keep_checkpoint_max=values.keep_checkpoint_max,
        gradient_accumulation_steps=values.gradient_accumulation_steps,
        optimizer=values.optimizer, weight_decay_rate=values.weight_decay_rate,
        clip_norm=values.clip_norm, xnli_language=values.xnli_language, custom=custom,
        skip_bad_rows=values.skip_bad_rows, seeds=common_flags.parse_seeds(values),
        keep_best_checkpoint=values.keep_best_checkpoint,
        runtime=common_flags.runtime_config(values))


def _validate(cfg: ClassifierRun):
    if not (cfg.do_train or cfg.do_eval or cfg.do_predict):
        raise ValueError("At least one of `do_train`, `do_eval` or `do_predict' must be True.")
    if (len(cfg.seeds) > 1 or cfg.keep_best_checkpoint) and not (cfg.do_train and cfg.do_eval):
        raise ValueError("--seeds with several seeds and --keep_best_checkpoint pick by the "
                         "dev score: they need --do_train and --do_eval")
    if cfg.gradient_accumulation_steps < 1:
        raise ValueError("--gradient_accumulation_steps must be >= 1, found "
                         f"{cfg.gradient_accumulation_steps}")


@dataclasses.dataclass
class _Data:
    """The task's processor, labels and cached record files, shared by every seed."""

    processor: "object"
    label_list: list
    is_regression: bool
    train: "object" = None
    eval_splits: list = dataclasses.field(default_factory=list)  # (split, suffix, cached)
    predict_splits: list = dataclasses.field(default_factory=list)

    @property
    def num_labels(self):
        return 1 if self.is_regression else len(self.label_list)


def _prepare_data(cfg: ClassifierRun) -> _Data:
    from data_prep import classifier_data as cd
    from data_prep import tokenization

    processor = cd.get_processor(cfg.task_name, xnli_language=cfg.xnli_language,
                                 custom=cfg.custom)
    data = _Data(processor, processor.get_labels(cfg.data_dir), processor.is_regression)
    tokenizer = tokenization.FullTokenizer(cfg.vocab_file, do_lower_case=cfg.do_lower_case)

    def prepare(split, pad):
        return cd.prepare_classifier_records(
            processor, cfg.data_dir, split, cfg.output_dir, vocab_file=cfg.vocab_file,
            do_lower_case=cfg.do_lower_case, max_seq_length=cfg.max_seq_length,
            skip_bad_rows=cfg.skip_bad_rows, pad_to_multiple=pad, tokenizer=tokenizer)

    if cfg.do_train:
        data.train = prepare("train", None)
        if data.train.num_examples == 0:
            raise ValueError(f"{data.train.metadata['source_file']}: no training examples")
    if cfg.do_eval:
        for split, suffix in _EVAL_SPLITS.get(cfg.task_name, (("dev", ""),)):
            data.eval_splits.append((split, suffix, prepare(split, cfg.eval_batch_size)))
    if cfg.do_predict:
        for split, suffix in _PREDICT_SPLITS.get(cfg.task_name, (("test", ""),)):
            data.predict_splits.append((split, suffix, prepare(split, cfg.predict_batch_size)))
    return data


def _write_model_files(cfg: ClassifierRun, data: _Data, directory: str, bert_config):
    """Model files beside the checkpoints, so `export_saved_model.py
    --init_checkpoint=<directory>` needs nothing else."""
    from modeling import export

    text_pair = any(layout.text_b is not None for layout in data.processor.layouts.values())
    runs.write_model_files(directory, bert_config, cfg.vocab_file, export.ExportMetadata(
        task=cfg.task_name, labels=tuple(data.label_list), is_regression=data.is_regression,
        do_lower_case=cfg.do_lower_case, max_seq_length=cfg.max_seq_length,
        text_pair=text_pair))


def run(cfg: ClassifierRun) -> dict:
    """Fine-tunes, evaluates and predicts as `cfg` asks, once per seed.

    Returns:
      {"runs": [per-seed dicts: seed, dir, eval (split -> eval results)], "best_seed",
      "summary" (the seed statistics; empty for one seed)}.
    """
    _validate(cfg)
    strategy = common_flags.setup_runtime(cfg.runtime)  # First: multi-worker needs it so.

    import tensorflow as tf

    bert_config = runs.load_bert_config(cfg.bert_config_file, cfg.max_seq_length)
    replicas = strategy.num_replicas_in_sync
    runs.check_batch("train_batch_size", cfg.train_batch_size, replicas,
                     cfg.gradient_accumulation_steps)
    runs.check_batch("eval_batch_size", cfg.eval_batch_size, replicas)
    runs.check_batch("predict_batch_size", cfg.predict_batch_size, replicas)
    tf.io.gfile.makedirs(cfg.output_dir)
    data = _prepare_data(cfg)

    from training import distribution

    chief = distribution.is_chief(strategy)
    several = len(cfg.seeds) > 1
    seed_runs = []
    for seed in cfg.seeds:
        run_dir = os.path.join(cfg.output_dir, f"seed_{seed}") if several else cfg.output_dir
        if chief:
            _write_model_files(cfg, data, run_dir, bert_config)
        seed_runs.append(_run_one(cfg, data, strategy, bert_config, seed, run_dir))
    if not several:
        return {"runs": seed_runs, "best_seed": cfg.seeds[0], "summary": {}}
    return _summarise_seeds(cfg, data, seed_runs, write=chief)


def _primary_key(cfg: ClassifierRun, data: _Data) -> str:
    from data_prep import glue_metrics

    return "eval_" + glue_metrics.primary_metric_name(cfg.task_name, data.is_regression)


def _score(results: dict, key: str) -> float:
    value = results.get(key, float("nan"))
    return -math.inf if value is None or math.isnan(value) else float(value)


def _run_one(cfg: ClassifierRun, data: _Data, strategy, bert_config, seed, run_dir) -> dict:
    """Train -> (best checkpoint) -> eval -> predict in run_dir with one seed."""
    import keras
    import tensorflow as tf

    from data_prep import glue_metrics
    from modeling.models import BertClassifier
    from training import input_pipeline, loop

    if seed is not None:
        keras.utils.set_random_seed(seed)
    num_train_steps = num_warmup_steps = 0
    if cfg.do_train:
        num_train_steps, num_warmup_steps = runs.finetuning_steps(
            data.train.num_examples, cfg.train_batch_size, cfg.num_train_epochs,
            cfg.warmup_proportion)
    task = loop.ClassifierTask(data.num_labels, data.is_regression)
    model, trainer = runs.build_trainer(
        strategy, lambda: BertClassifier(bert_config, data.num_labels), task,
        hparams=runs.hyperparameters_from(cfg), max_seq_length=cfg.max_seq_length,
        output_dir=run_dir, num_train_steps=num_train_steps, num_warmup_steps=num_warmup_steps,
        train_batch_size=cfg.train_batch_size, eval_batch_size=cfg.eval_batch_size)
    start_step = runs.restore_or_init(trainer, model, cfg.init_checkpoint,
                                      do_train=cfg.do_train)

    def records(cached, batch_size, is_training, input_context=None):
        config = input_pipeline.ClassifierInputConfig(
            (cached.record_file,), cfg.max_seq_length, data.is_regression,
            seed=None if seed is None else seed + start_step)
        return input_pipeline.classifier_dataset(config, batch_size=batch_size,
                                                 is_training=is_training,
                                                 input_context=input_context)

    def predict(cached, batch_size):
        return trainer.predict(records(cached, batch_size, False), output_keys=("logits",),
                               feature_keys=("label_ids", "is_real_example"))

    def evaluate(cached, step):
        out = predict(cached, cfg.eval_batch_size)
        return task.eval_results(cfg.task_name, out["logits"], out["label_ids"],
                                 out["is_real_example"], step)

    best = _BestKeeper(cfg, data, run_dir, model, bert_config, evaluate,
                       write=trainer.is_chief) if cfg.keep_best_checkpoint else None
    if cfg.do_train:
        logging.info("Training on %d examples: %d steps (%d warmup), batch %d, from step %d",
                     data.train.num_examples, num_train_steps, num_warmup_steps,
                     cfg.train_batch_size, start_step)

        def train_fn(input_context):
            return records(data.train,
                           input_context.get_per_replica_batch_size(cfg.train_batch_size),
                           True, input_context)

        trainer.train(train_fn, on_checkpoint=best.on_checkpoint if best else None)
    eval_step = int(trainer.global_step.numpy())
    if best is not None:
        eval_step = best.restore() if best.step is not None else eval_step

    results = {"seed": seed, "dir": run_dir, "eval": {}}
    for split, suffix, cached in data.eval_splits:
        metrics = evaluate(cached, eval_step)
        results["eval"][split] = metrics
        logging.info("***** Eval results (%s, %d examples) *****", split, cached.num_examples)
        for key in sorted(metrics):
            logging.info("  %s = %s", key, metrics[key])
        trainer.write_eval_summaries(metrics, "eval" + suffix)
        if trainer.is_chief:
            loop.write_eval_results(os.path.join(run_dir, f"eval_results{suffix}.txt"), metrics)
    for split, suffix, cached in data.predict_splits:
        out = predict(cached, cfg.predict_batch_size)
        keep = out["is_real_example"] > 0
        logits = out["logits"][keep]
        if data.is_regression:
            values, submission = logits, logits[:, 0]
        else:
            values = tf.nn.softmax(tf.constant(logits, tf.float32), axis=-1).numpy()
            submission = values
        if not trainer.is_chief:
            continue
        path = os.path.join(run_dir, f"test_results{suffix}.tsv")
        written = glue_metrics.write_test_results_tsv(path, values)
        logging.info("Wrote %d predictions (%s) to %s", written, split, path)
        if written != cached.num_examples:
            raise RuntimeError(f"{path}: {written} predictions for {cached.num_examples} "
                               "examples")
        try:
            name = glue_metrics.glue_submission_file_name(cfg.task_name, split)
        except ValueError:
            continue  # XNLI and custom data have no GLUE server file.
        if cached.metadata.get("num_bad_rows"):
            logging.warning("%d bad test rows were skipped: %s indices are 0..n-1 and no "
                            "longer match the GLUE test set", cached.metadata["num_bad_rows"],
                            name)
        glue_metrics.write_glue_submission(os.path.join(run_dir, name), cfg.task_name,
                                           submission, None if data.is_regression
                                           else data.label_list)
    return results


class _BestKeeper:
    """Evaluates on the first dev split after every checkpoint; keeps the best in run_dir/best
    (model weights + bert_config.json, vocab.txt, export_metadata.json, eval_results.txt)."""

    def __init__(self, cfg, data, run_dir, model, bert_config, evaluate, write=True):
        self.cfg, self.data, self.model, self.evaluate = cfg, data, model, evaluate
        self.write = write  # only the chief writes; every worker evaluates and keeps a copy
        self.weights = None
        self.bert_config = bert_config
        self.dir = os.path.join(run_dir, "best")
        self.key = _primary_key(cfg, data)
        self.step = None
        self.score = -math.inf

    def on_checkpoint(self, step):
        from modeling import checkpoints
        from training import loop

        _, _, cached = self.data.eval_splits[0]
        results = self.evaluate(cached, step)
        score = _score(results, self.key)
        logging.info("Dev %s at step %d: %s (best so far %s)", self.key, step,
                     results.get(self.key), self.score)
        if self.step is not None and score <= self.score:
            return
        self.step, self.score = step, score
        self.weights = [w.numpy() for w in self.model.weights]
        if self.write:
            _write_model_files(self.cfg, self.data, self.dir, self.bert_config)
            checkpoints.save_ours(self.model, self.dir)
            loop.write_eval_results(os.path.join(self.dir, "eval_results.txt"), results)

    def restore(self) -> int:
        """Loads the best weights into the model; returns their step."""
        self.model.set_weights(self.weights)
        logging.info("Using the best checkpoint (step %d, %s = %s) for eval and predict",
                     self.step, self.key, self.score)
        return self.step


def _summarise_seeds(cfg: ClassifierRun, data: _Data, seed_runs: list,
                     write: bool = True) -> dict:
    """Picks the seed with the best primary dev metric, copies its result files to
    output_dir and writes seed_results.txt (per-seed values, mean and std of each metric)."""
    import numpy as np
    import tensorflow as tf

    from training import loop

    key = _primary_key(cfg, data)
    first_split = data.eval_splits[0][0]
    scores = [_score(r["eval"][first_split], key) for r in seed_runs]
    best = seed_runs[int(np.argmax(scores))]
    summary = {"best_seed": best["seed"], "num_seeds": len(seed_runs)}
    for name in sorted(best["eval"][first_split]):
        if name == "global_step":
            continue
        values = np.array([r["eval"][first_split][name] for r in seed_runs], np.float64)
        summary[f"{name}_mean"] = float(values.mean())
        summary[f"{name}_std"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
        for run_result, value in zip(seed_runs, values):
            summary[f"{name}_seed_{run_result['seed']}"] = float(value)
    logging.info("Best seed %s (%s = %s); %s mean %.6g std %.6g over %d seeds", best["seed"],
                 key, best["eval"][first_split].get(key), key, summary[f"{key}_mean"],
                 summary[f"{key}_std"], len(seed_runs))
    if not write:
        return {"runs": seed_runs, "best_seed": best["seed"], "summary": summary}
    loop.write_eval_results(os.path.join(cfg.output_dir, "seed_results.txt"), summary)
    for name in tf.io.gfile.listdir(best["dir"]):
        if name.endswith((".txt", ".tsv")) and name not in ("vocab.txt",):
            tf.io.gfile.copy(os.path.join(best["dir"], name),
                             os.path.join(cfg.output_dir, name), overwrite=True)
    return {"runs": seed_runs, "best_seed": best["seed"], "summary": summary}


def main(argv):
    del argv
    run(run_config_from_flags(FLAGS))


if __name__ == "__main__":
    app.run(main)
