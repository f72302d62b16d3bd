"""Owns the fine-tuning run every task runner shares: train -> keep best -> evaluate -> predict, per seed.

A task family (classification, SQuAD, tagging, multiple choice) contributes a `TaskFamily`:
how to read and cache its splits, its model, its loop `Task`, its datasets, how to score
dev predictions and how to write its output files. Everything else is here, once:

* checks before any work: the flags that fit together, the batch sizes against the
  replicas, every split read and converted (an empty dev or test split is an error BEFORE
  training, so no trained work is lost), zero training steps refused;
* the run's `output_dir` claimed (`training.run_dir`): one run at a time, and only runs of
  the same model (bert_config + the family's identity: task, labels, ...);
* `--seeds`: one run per seed in `output_dir/seed_<s>`, the best by the primary dev
  metric copied to output_dir, `seed_results.txt` with every seed's figures, mean and std;
* `--keep_best_checkpoint`: dev evaluation after every checkpoint, the best weights kept in
  `run_dir/best` (loadable by every tool) and used for the final eval and predict;
* `eval_results{suffix}.txt` ("key = value", the original's format), TensorBoard scalars
  and the model files beside the checkpoints that `export_saved_model.py` reads.

Runners stay thin: flags -> `FinetuningRun` (training/flags.py `finetuning_run`) + the
family's own settings -> `run(settings, family)`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Sequence

from absl import logging

from data_prep import fileio
from training import runs
from training.runtime import RuntimeConfig, setup_runtime


class FinetuningError(ValueError):
    """Settings or data that would make a run meaningless; the message names the flag/file."""


@dataclasses.dataclass(frozen=True)
class FinetuningRun:
    """The settings every fine-tuning runner shares (the original's flags, plus ours)."""

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
    num_train_epochs: float = 3.0
    warmup_proportion: float = 0.1
    hparams: runs.Hyperparameters = runs.Hyperparameters(learning_rate=5e-5)
    seeds: tuple = (None,)
    keep_best_checkpoint: bool = False
    bucket_boundaries: tuple = ()
    runtime: RuntimeConfig = RuntimeConfig("")


@dataclasses.dataclass(frozen=True)
class InputOptions:
    """How every split of a run is read (set by `run` before `prepare`).

    Attributes:
      max_seq_length: the padded length of the records.
      bucket_boundaries: length buckets (`input_pipeline.RecordsConfig`); () pads every
        batch to max_seq_length.
      vocab_size, type_vocab_size: the model's tables, checked against the records' ids.
    """

    max_seq_length: int = 128
    bucket_boundaries: tuple = ()
    vocab_size: int | None = None
    type_vocab_size: int | None = None


@dataclasses.dataclass
class Split:
    """One prepared split of a task's data.

    Attributes:
      name: the split ("train", "dev", "dev_matched", "test", ...).
      suffix: appended to result file names ("" or e.g. "_mm" for MNLI mismatched).
      num_examples: real examples (training steps are examples / batch * epochs, as the
        original computes them, whatever the windows per example).
      data: the family's own prepared object (record files, examples for post-processing).
    """

    name: str
    suffix: str
    num_examples: int
    data: Any


@dataclasses.dataclass
class PreparedData:
    """The splits a run needs: train (with do_train), eval splits, predict splits."""

    train: Split | None = None
    eval_splits: list = dataclasses.field(default_factory=list)
    predict_splits: list = dataclasses.field(default_factory=list)


class TaskFamily:
    """What a task family contributes to a fine-tuning run (subclass and implement).

    Attributes:
      name: the family, for messages ("classification", "squad", ...).
    """

    name = "task"
    input_options = InputOptions()

    def identity(self) -> dict:
        """What must not change between runs in one output_dir (task, labels, ...)."""
        raise NotImplementedError

    def prepare(self, settings: FinetuningRun) -> PreparedData:
        """Reads and converts (or reuses cached) records of every split the run needs."""
        raise NotImplementedError

    def build_model(self, bert_config):
        """The Keras task model (created under the strategy's scope by the caller)."""
        raise NotImplementedError

    def loop_task(self):
        """The `training.loop.Task` (loss and statistics) for training."""
        raise NotImplementedError

    def build_variables(self, model, max_seq_length: int) -> None:
        """Creates the model's variables before any tf.function (default: one call on a
        zero batch of the encoder's [1, max_seq_length] inputs)."""
        from training import loop

        loop.build_encoder_model(model, max_seq_length)

    def records(self, split: Split):
        """The split's `input_pipeline.RecordsConfig` (files, parse spec, per-token
        features); seed, buckets and id checks are added from `input_options`."""
        raise NotImplementedError

    def dataset(self, split: Split, *, batch_size: int, is_training: bool,
                input_context=None, seed: int | None = None, replicas: int | None = None):
        """Batched features of a split (training: per-replica batch, repeated, shuffled;
        otherwise: the GLOBAL batch, read once, `example_index` per row), length-bucketed
        as `input_options` say. Without buckets every batch has the static batch size;
        with them, evaluation pads each bucket's last batch only to a multiple of
        `replicas` (when given)."""
        from training import input_pipeline

        options = self.input_options
        config = dataclasses.replace(
            self.records(split), seed=seed, bucket_boundaries=options.bucket_boundaries,
            vocab_size=options.vocab_size, type_vocab_size=options.type_vocab_size)
        return input_pipeline.finetuning_records(
            config, batch_size=batch_size, is_training=is_training,
            input_context=input_context, drop_remainder=is_training,
            pad_to_batch=not is_training, pad_to_multiple=replicas)

    def predict_outputs(self, trainer, split: Split, batch_size: int, *, output_keys,
                        feature_keys=(), sequence_keys=()) -> dict:
        """`trainer.predict` over a split, rows back in input order, padding rows dropped,
        per-token `sequence_keys` padded back to max_seq_length."""
        from training import input_pipeline

        return trainer.predict(
            self.dataset(split, batch_size=batch_size, is_training=False,
                         replicas=trainer.strategy.num_replicas_in_sync),
            output_keys=output_keys, feature_keys=feature_keys,
            order_key=input_pipeline.EXAMPLE_INDEX, sequence_keys=sequence_keys,
            sequence_length=self.input_options.max_seq_length)

    def primary_metric(self) -> str:
        """The eval_results key `--seeds` and `--keep_best_checkpoint` maximise."""
        raise NotImplementedError

    def evaluate(self, trainer, split: Split, *, step: int, run_dir: str,
                 write: bool) -> dict:
        """Dev figures (keys as in eval_results.txt, `eval_...` and `global_step`).

        Args:
          write: the final evaluation on the chief: the family may also write its own
            files (e.g. dev predictions) into run_dir; False during checkpoint selection.
        """
        raise NotImplementedError

    def eval_output_files(self, split: Split, run_dir: str) -> list:
        """Files the final `evaluate(..., write=True)` of `split` wrote into run_dir (e.g.
        dev predictions): with `--seeds` the best seed's are copied to output_dir."""
        del split, run_dir
        return []

    def predict(self, trainer, split: Split, *, run_dir: str, write: bool) -> list:
        """Predicts a split; when `write`, writes the family's prediction files into
        run_dir (all-or-nothing) and returns their paths."""
        raise NotImplementedError

    def export_metadata(self, settings: FinetuningRun):
        """The `modeling.export.ExportMetadata` written beside the checkpoints."""
        raise NotImplementedError


def settings_from(**kwargs) -> tuple[FinetuningRun, dict]:
    """(FinetuningRun, the other keyword arguments) from one flat set of keyword arguments.

    Accepts every `FinetuningRun` field and every `runs.Hyperparameters` field by name
    (`learning_rate=`, `save_checkpoints_steps=`, ...; `dtype` and `jit_compile` come from
    `runtime`), so programmatic callers need not nest them.
    """
    run_fields = {f.name for f in dataclasses.fields(FinetuningRun)} - {"hparams"}
    hparam_fields = {f.name for f in dataclasses.fields(runs.Hyperparameters)} - {
        "dtype", "jit_compile"}
    run_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in run_fields}
    hparam_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in hparam_fields}
    runtime = run_kwargs.get("runtime", RuntimeConfig(""))
    hparam_kwargs.setdefault("learning_rate", 5e-5)
    run_kwargs["hparams"] = runs.Hyperparameters(dtype=runtime.dtype,
                                                 jit_compile=runtime.jit_compile,
                                                 **hparam_kwargs)
    return FinetuningRun(**run_kwargs), kwargs


# --------------------------------------------------------------------------- checks


def validate(settings: FinetuningRun) -> None:
    """Raises FinetuningError for flags that do not fit together (before any work)."""
    for name in ("vocab_file", "bert_config_file", "output_dir"):
        if not getattr(settings, name):
            raise FinetuningError(f"--{name} is required")
    if not (settings.do_train or settings.do_eval or settings.do_predict):
        raise FinetuningError(
            "At least one of `do_train`, `do_eval` or `do_predict' must be True.")
    if (len(settings.seeds) > 1 or settings.keep_best_checkpoint) and not (
            settings.do_train and settings.do_eval):
        raise FinetuningError(
            "--seeds with several seeds and --keep_best_checkpoint pick by the dev score: "
            "they need --do_train and --do_eval")
    if settings.hparams.gradient_accumulation_steps < 1:
        raise FinetuningError("--gradient_accumulation_steps must be >= 1, found "
                              f"{settings.hparams.gradient_accumulation_steps}")
    if settings.do_train and not (math.isfinite(settings.num_train_epochs)
                                  and settings.num_train_epochs > 0):
        raise FinetuningError(f"--num_train_epochs={settings.num_train_epochs} must be a "
                              "finite number > 0")
    if not 0.0 <= settings.warmup_proportion <= 1.0:
        raise FinetuningError(
            f"--warmup_proportion={settings.warmup_proportion} must be in [0, 1]")
    try:
        settings.hparams.optimizer_config()  # --learning_rate and the optimizer's flags
    except ValueError as err:
        raise FinetuningError(str(err)) from None


def check_prepared(settings: FinetuningRun, prepared: PreparedData) -> None:
    """Refuses degenerate work before training: zero steps, empty dev or test splits."""
    if settings.do_train:
        train = prepared.train
        steps, _ = runs.finetuning_steps(train.num_examples, settings.train_batch_size,
                                         settings.num_train_epochs, settings.warmup_proportion)
        if steps < 1:
            raise FinetuningError(
                f"--do_train: {train.num_examples} training example(s) with "
                f"--train_batch_size={settings.train_batch_size} and "
                f"--num_train_epochs={settings.num_train_epochs} give 0 training steps; "
                "use a smaller batch, more epochs or more data")
    for flag, splits in (("--do_eval", prepared.eval_splits),
                         ("--do_predict", prepared.predict_splits)):
        for split in splits:
            if split.num_examples == 0:
                raise FinetuningError(
                    f"{flag}: the {split.name} split has no examples "
                    f"({_source_of(split)}); nothing to evaluate or predict. Fix the file "
                    f"or drop {flag}")


def _source_of(split: Split) -> str:
    metadata = getattr(split.data, "metadata", None) or {}
    return str(metadata.get("source_file") or metadata.get("input_file") or split.name)


# ------------------------------------------------------------------------------ run


def run(settings: FinetuningRun, family: TaskFamily) -> dict:
    """Fine-tunes, evaluates and predicts as `settings` asks, once per seed.

    Returns:
      {"runs": [per-seed dicts: seed, dir, global_step, num_train_steps, eval (split name
      -> figures), outputs (paths)], "best_seed", "summary" (seed statistics; empty for
      one seed)}.
    """
    validate(settings)
    strategy = setup_runtime(settings.runtime)  # First: multi-worker wants it.

    from training import distribution, input_pipeline, run_dir

    bert_config = runs.load_bert_config(settings.bert_config_file, settings.max_seq_length)
    runs.check_vocab_fits(settings.vocab_file, bert_config, settings.bert_config_file)
    replicas = strategy.num_replicas_in_sync
    runs.check_batch("train_batch_size", settings.train_batch_size, replicas,
                     settings.hparams.gradient_accumulation_steps)
    runs.check_batch("eval_batch_size", settings.eval_batch_size, replicas)
    runs.check_batch("predict_batch_size", settings.predict_batch_size, replicas)
    family.input_options = InputOptions(
        max_seq_length=settings.max_seq_length, bucket_boundaries=settings.bucket_boundaries,
        vocab_size=bert_config.vocab_size, type_vocab_size=bert_config.type_vocab_size)
    chief = distribution.is_chief(strategy)
    # Locked and compared now; taken (identity, model files) only when every check below
    # has passed: a run refused by one leaves output_dir to the run that fits it.
    claimed = run_dir.claim(settings.output_dir,
                            {"bert_config": bert_config.to_dict(), **family.identity()},
                            is_chief=chief)
    try:
        prepared = family.prepare(settings)
        check_prepared(settings, prepared)
        several = len(settings.seeds) > 1
        seed_runs = []
        for seed in settings.seeds:
            directory = (os.path.join(settings.output_dir, f"seed_{seed}") if several
                         else settings.output_dir)

            def commit(directory=directory):
                """Takes output_dir for the run and writes the model files beside the
                checkpoints (chief only)."""
                claimed.commit()
                if chief:
                    runs.write_model_files(directory, bert_config, settings.vocab_file,
                                           family.export_metadata(settings))

            with input_pipeline.naming_bad_records(_record_files(family, prepared),
                                                   limits=_id_limits(settings, bert_config)):
                seed_runs.append(_run_one(settings, family, prepared, strategy,
                                          bert_config, seed, directory, commit))
        if not several:
            return {"runs": seed_runs, "best_seed": settings.seeds[0], "summary": {}}
        return _summarise_seeds(settings, family, prepared, seed_runs, write=chief)
    finally:
        claimed.release()


def _record_files(family: TaskFamily, prepared: PreparedData) -> list:
    splits = ([prepared.train] if prepared.train else []) + prepared.eval_splits + \
        prepared.predict_splits
    return sorted({p for split in splits for p in family.records(split).input_patterns})


def _id_limits(settings: FinetuningRun, bert_config) -> tuple:
    """The `input_pipeline.IdLimit`s the records are checked against, as the error naming
    a record beyond them says it: the records are made with --vocab_file."""
    from training import input_pipeline

    return tuple(
        dataclasses.replace(limit, hint=f"the records were made with --vocab_file="
                                        f"{settings.vocab_file}: not this model's vocab")
        if limit.feature == "input_ids" else limit
        for limit in input_pipeline.id_limits(
            vocab_size=bert_config.vocab_size, type_vocab_size=bert_config.type_vocab_size,
            bert_config_file=settings.bert_config_file))


def _run_one(settings: FinetuningRun, family: TaskFamily, prepared: PreparedData, strategy,
             bert_config, seed, directory: str, commit) -> dict:
    """Train -> (best checkpoint) -> eval -> predict in `directory` with one seed; `commit`
    is called once the model is built and its weights restored or initialised (the last
    check), before anything is written."""
    import keras

    from training import input_pipeline, loop

    if seed is not None:
        keras.utils.set_random_seed(seed)
    num_train_steps = num_warmup_steps = 0
    if settings.do_train:
        num_train_steps, num_warmup_steps = runs.finetuning_steps(
            prepared.train.num_examples, settings.train_batch_size,
            settings.num_train_epochs, settings.warmup_proportion)
    model, trainer = runs.build_trainer(
        strategy, lambda: family.build_model(bert_config), family.loop_task(),
        hparams=settings.hparams, max_seq_length=settings.max_seq_length,
        output_dir=directory, num_train_steps=num_train_steps,
        num_warmup_steps=num_warmup_steps, train_batch_size=settings.train_batch_size,
        eval_batch_size=settings.eval_batch_size,
        build_fn=lambda model: family.build_variables(model, settings.max_seq_length))
    start_step = runs.restore_or_init(trainer, model, settings.init_checkpoint,
                                      do_train=settings.do_train)
    commit()
    # A resumed run continues its input from the position saved in the checkpoint.
    data_seed = trainer.input_seed(seed)

    best = None
    if settings.keep_best_checkpoint:
        best = _BestKeeper(settings, family, prepared.eval_splits[0], directory, model,
                           bert_config, trainer)
    if settings.do_train:
        train = prepared.train
        logging.info("Training on %d examples: %d steps (%d warmup), batch %d, from step %d",
                     train.num_examples, num_train_steps, num_warmup_steps,
                     settings.train_batch_size, start_step)

        def train_fn(input_context):
            return family.dataset(
                train, batch_size=input_context.get_per_replica_batch_size(
                    settings.train_batch_size),
                is_training=True, input_context=input_context, seed=data_seed)

        identity = input_pipeline.records_input_identity(
            dataclasses.replace(family.records(train), seed=data_seed,
                                bucket_boundaries=family.input_options.bucket_boundaries),
            settings.train_batch_size)
        trainer.train(train_fn, on_checkpoint=best.on_checkpoint if best else None,
                      input_identity=identity)
    step = int(trainer.global_step.numpy())
    if best is not None and best.step is not None:
        step = best.restore()

    result = {"seed": seed, "dir": directory, "global_step": step,
              "num_train_steps": num_train_steps, "eval": {}, "outputs": []}
    for split in prepared.eval_splits:
        metrics = family.evaluate(trainer, split, step=step, run_dir=directory,
                                  write=trainer.is_chief)
        result["eval"][split.name] = metrics
        logging.info("***** Eval results (%s, %d examples) *****", split.name,
                     split.num_examples)
        for key in sorted(metrics):
            logging.info("  %s = %s", key, metrics[key])
        trainer.write_eval_summaries(metrics, "eval" + split.suffix)
        if trainer.is_chief:
            path = os.path.join(directory, f"eval_results{split.suffix}.txt")
            loop.write_eval_results(path, metrics)
            result["outputs"].append(path)
            result["outputs"].extend(family.eval_output_files(split, directory))
    for split in prepared.predict_splits:
        logging.info("Predicting %s (%d examples), batch %d", split.name, split.num_examples,
                     settings.predict_batch_size)
        result["outputs"].extend(family.predict(trainer, split, run_dir=directory,
                                                write=trainer.is_chief))
    return result


def score(results: dict, key: str) -> float:
    """A comparable score: -inf for a missing or NaN metric."""
    value = results.get(key, float("nan"))
    return -math.inf if value is None or math.isnan(value) else float(value)


class _BestKeeper:
    """Evaluates on the first dev split after every checkpoint; keeps the best in run_dir/best
    (model weights + bert_config.json, vocab.txt, export_metadata.json, eval_results.txt)."""

    def __init__(self, settings, family, split, run_dir, model, bert_config, trainer):
        self.settings, self.family, self.split = settings, family, split
        self.model, self.bert_config, self.trainer = model, bert_config, trainer
        self.run_dir = run_dir
        self.dir = os.path.join(run_dir, "best")
        self.key = family.primary_metric()
        self.weights = None
        self.step = None
        self.score = -math.inf

    def on_checkpoint(self, step):
        from modeling import checkpoints
        from training import loop

        results = self.family.evaluate(self.trainer, self.split, step=step,
                                       run_dir=self.run_dir, write=False)
        value = score(results, self.key)
        logging.info("Dev %s at step %d: %s (best so far %s)", self.key, step,
                     results.get(self.key), self.score)
        if self.step is not None and value <= self.score:
            return
        self.step, self.score = step, value
        self.weights = [w.numpy() for w in self.model.weights]
        if self.trainer.is_chief:
            runs.write_model_files(self.dir, self.bert_config, self.settings.vocab_file,
                                   self.family.export_metadata(self.settings))
            checkpoints.save_ours(self.model, self.dir)
            loop.write_eval_results(os.path.join(self.dir, "eval_results.txt"), results)

    def restore(self) -> int:
        """Loads the best weights into the model; returns their step."""
        self.model.set_weights(self.weights)
        logging.info("Using the best checkpoint (step %d, %s = %s) for eval and predict",
                     self.step, self.key, self.score)
        return self.step


def _summarise_seeds(settings: FinetuningRun, family: TaskFamily, prepared: PreparedData,
                     seed_runs: Sequence[dict], write: bool = True) -> dict:
    """Picks the seed with the best primary dev metric, copies its result files to
    output_dir and writes seed_results.txt (per-seed values, mean and std of each metric)."""
    import numpy as np

    from training import loop

    key = family.primary_metric()
    first_split = prepared.eval_splits[0].name
    scores = [score(r["eval"][first_split], key) for r in seed_runs]
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
    result = {"runs": list(seed_runs), "best_seed": best["seed"], "summary": summary}
    if not write:
        return result
    copies = {path: os.path.join(settings.output_dir, os.path.basename(path))
              for path in best["outputs"]}
    summary_path = os.path.join(settings.output_dir, "seed_results.txt")
    with fileio.AtomicOutputs(list(copies.values()) + [summary_path]) as out:
        for source, target in copies.items():
            with fileio.open_file(source, "rb") as f_in, out.open(target, "wb") as f_out:
                f_out.write(f_in.read())
        loop.write_eval_results(out.temp(summary_path), summary)
    return result
