"""Owns the fine-tuning run every task runner shares: train -> keep best -> evaluate -> predict, per seed.

A task family (classification, SQuAD, tagging, multiple choice) contributes a `TaskFamily`:
how to read and cache its splits, its model, its loop `Task`, its datasets, how to score
dev predictions and how to write its output files. Everything else is here, once:

* checks before any work: the flags that fit together, the batch sizes against the
  replicas, every split read and converted (an empty dev or test split is an error BEFORE
  training, so no trained work is lost), zero training steps refused;
* the run's `output_dir` claimed (`training.output_claim`): one run at a time, and only runs of
  the same model (bert_config + the family's identity: task, labels, ...);
* `--seeds`: one run per seed in `output_dir/seed_<s>`, the best by the primary dev
  metric copied to output_dir, `seed_results.txt` with every seed's figures, mean and std;
* a grid (several values of `--learning_rate`, `--train_batch_size`, `--num_train_epochs`,
  the paper's fine-tuning protocol): every combination (times the seeds) in its own
  subdirectory `output_dir/lr<..>_bs<..>_ep<..>`, the best on dev copied to output_dir,
  every run's dev figures in `grid_results.tsv`;
* sweeps resume (`training.sweeps`: each run's record, the best picked, the summaries): a
  run of a sweep (grid or seeds) that finished writes `run_results.json` (all-or-nothing,
  last), and a rerun skips it; the interrupted one resumes exactly; one that finished with
  other settings or data is done again from its start (what it made removed first); one
  that diverged (the loop's `FloatingPointError`) is recorded as failed, the sweep goes on
  and picks the best of those that finished;
* `--keep_best_checkpoint`: dev evaluation after every checkpoint, the best weights kept in
  `run_dir/best` (loadable by every tool; its score and step in `best/best_checkpoint.json`,
  the directory replaced all-or-nothing, so a resumed run keeps comparing with it) and
  used for the final eval and predict;
* `eval_results{suffix}.txt` ("key = value", the original's format), TensorBoard scalars
  and the model files beside the checkpoints that `export_saved_model.py` reads.

Runners stay thin: each is a `training.flags.FinetuningCommand` (flags -> `FinetuningRun`
through `settings_from`, the one way its settings are built, + the family's own settings ->
`run(settings, family)`); the loop's and optimizer's shared settings are the run's
`loop` (`training.settings.LoopSettings`), and each run (grid point, seed) builds its
`LoopConfig` from them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from absl import logging

from data_prep import fileio
from data_prep.cli import UserError
from training import sweeps, trainer_setup
from training.settings import LoopConfig, LoopSettings, settings_of
from training.execution import RuntimeConfig, setup_runtime


class FinetuningError(UserError):
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
    # The loop's and optimizer's settings of every run (the shared flags); each run builds
    # its LoopConfig from them and its own output_dir, steps and batch sizes.
    loop: LoopSettings = LoopSettings()
    seeds: tuple = (None,)
    keep_best_checkpoint: bool = False
    bucket_boundaries: tuple = ()
    runtime: RuntimeConfig = RuntimeConfig("")
    # Several values of learning rate, batch size or epochs: a grid (then the three fields
    # above hold its first point). None: one point, the fields above.
    grid: "Grid | None" = None
    # Skip a run whose run_results.json says it finished with these settings (always on in
    # a sweep; glue_submission.py turns it on for its single runs too).
    skip_finished: bool = False


@dataclasses.dataclass(frozen=True)
class Grid:
    """The hyperparameter values a sweep tries: every combination, in the order
    learning rate (outermost), batch size, epochs."""

    learning_rates: tuple
    train_batch_sizes: tuple
    num_train_epochs: tuple


@dataclasses.dataclass(frozen=True)
class GridPoint:
    """One combination of a grid (or the one point of a run without a grid)."""

    learning_rate: float
    train_batch_size: int
    num_train_epochs: float

    def name(self) -> str:
        """Its subdirectory of output_dir, e.g. `lr5e-05_bs32_ep3.0` (shortest exact
        spelling of each value: distinct points never share a directory)."""
        return (f"lr{float(self.learning_rate)!r}_bs{int(self.train_batch_size)}"
                f"_ep{float(self.num_train_epochs)!r}")


def grid_points(settings: FinetuningRun) -> list:
    """The `GridPoint`s a run trains: the grid's combinations, or its one point."""
    import itertools

    grid = settings.grid
    if grid is None:
        return [GridPoint(settings.loop.learning_rate, settings.train_batch_size,
                          settings.num_train_epochs)]
    return [GridPoint(*values) for values in itertools.product(
        grid.learning_rates, grid.train_batch_sizes, grid.num_train_epochs)]


def at_point(settings: FinetuningRun, point: GridPoint, output_dir: str) -> FinetuningRun:
    """The settings of one grid point's runs (no grid), written in `output_dir`."""
    return dataclasses.replace(
        settings, output_dir=output_dir, train_batch_size=point.train_batch_size,
        num_train_epochs=point.num_train_epochs, grid=None,
        loop=dataclasses.replace(settings.loop, learning_rate=point.learning_rate))


@dataclasses.dataclass(frozen=True)
class InputOptions:
    """How every split of a run is read (set by `run` before `prepare`).

    Attributes:
      max_seq_length: the padded length of the records.
      bucket_boundaries: length buckets (`input_pipeline.RecordsConfig`); () pads every
        batch to max_seq_length.
      vocab_size, type_vocab_size: the model's tables, checked against the records' ids.
      autotune: tf.data's autotuning model (`RuntimeConfig.tf_data_autotune`).
    """

    max_seq_length: int = 128
    bucket_boundaries: tuple = ()
    vocab_size: int | None = None
    type_vocab_size: int | None = None
    autotune: bool = True


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
            vocab_size=options.vocab_size, type_vocab_size=options.type_vocab_size,
            autotune=options.autotune)
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
        """The `modeling.export.metadata.ExportMetadata` written beside the checkpoints."""
        raise NotImplementedError


def settings_from(**kwargs) -> tuple[FinetuningRun, dict]:
    """(FinetuningRun, the other keyword arguments) from one flat set of keyword arguments
    named as the flags: how every fine-tuning command builds its settings
    (`training.flags.FinetuningCommand`, from the flags or from a program).

    Accepts every `FinetuningRun` field and every `LoopSettings` one by name
    (`learning_rate=`, `save_checkpoints_steps=`, `dtype=`, ...: `training.settings.settings_of`,
    as pretraining). A tuple of learning rates, batch sizes or epochs makes a grid, as
    comma-separated flag values do. No `seeds` (or none given to `--seeds`): one run with
    the runtime's seed (`--seed`; None: unseeded).
    """
    if not kwargs.get("seeds"):
        runtime = kwargs.get("runtime")
        kwargs["seeds"] = (runtime.seed if runtime is not None else None,)
    # A sequence of learning rates, batch sizes or epochs is a grid, as on the command line.
    values = {name: kwargs.get(name, default) for name, default in (
        ("learning_rate", 5e-5), ("train_batch_size", 32), ("num_train_epochs", 3.0))}
    values = {name: tuple(v) if isinstance(v, (list, tuple)) else (v,)
              for name, v in values.items()}
    if max(map(len, values.values())) > 1 and "grid" not in kwargs:
        kwargs["grid"] = Grid(values["learning_rate"], values["train_batch_size"],
                              values["num_train_epochs"])
    kwargs.update({name: value[0] for name, value in values.items()})
    return settings_of(FinetuningRun, **kwargs)


# --------------------------------------------------------------------------- checks


def validate(settings: FinetuningRun) -> None:
    """Raises FinetuningError for flags that do not fit together, VocabError for a
    --vocab_file without the tokens every input needs or learned with the other casing
    than --do_lower_case's (before any work)."""
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
    points = grid_points(settings)
    if len(points) > 1 and not (settings.do_train and settings.do_eval):
        raise FinetuningError(
            "a grid (several values of --learning_rate, --train_batch_size or "
            "--num_train_epochs) picks by the dev score: it needs --do_train and --do_eval")
    if not 0.0 <= settings.warmup_proportion <= 1.0:
        raise FinetuningError(
            f"--warmup_proportion={settings.warmup_proportion} must be in [0, 1]")
    for point in points:
        if settings.do_train and not (math.isfinite(point.num_train_epochs)
                                      and point.num_train_epochs > 0):
            raise FinetuningError(f"--num_train_epochs={point.num_train_epochs} must be a "
                                  "finite number > 0")
        try:  # --learning_rate and the optimizer's flags
            LoopConfig.for_run(settings.loop, output_dir=settings.output_dir,
                               learning_rate=point.learning_rate).optimizer_config()
        except UserError as err:
            raise FinetuningError(str(err)) from None
    trainer_setup.check_vocab_tokens(settings.vocab_file,  # before any data is read
                                     settings.do_lower_case)
    if settings.max_seq_length < 3:
        logging.warning("--max_seq_length=%d leaves no room for text ([CLS] and [SEP] take "
                        "2 positions): every example is read as [CLS] [SEP] alone",
                        settings.max_seq_length)


def check_prepared(settings: FinetuningRun, prepared: PreparedData) -> None:
    """Refuses degenerate work before training: zero steps, empty dev or test splits."""
    for point in grid_points(settings) if settings.do_train else ():
        train = prepared.train
        steps, _ = trainer_setup.finetuning_steps(train.num_examples, point.train_batch_size,
                                         point.num_train_epochs, settings.warmup_proportion)
        if steps < 1:
            raise FinetuningError(
                f"--do_train: {train.num_examples} training example(s) with "
                f"--train_batch_size={point.train_batch_size} and "
                f"--num_train_epochs={point.num_train_epochs} give 0 training steps; "
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


def run(settings: FinetuningRun, family) -> dict:
    """Fine-tunes, evaluates and predicts as `settings` asks: once per seed, per grid point.

    Args:
      family: the `TaskFamily`, or a function of no arguments making it once the settings
        are checked (a family may read its data when made).

    Returns:
      {"runs": [per-run dicts: seed, dir, global_step, num_train_steps, eval (split name
      -> figures), outputs (paths), model_dir (the weights eval and predict used), point
      (its hyperparameters), skipped (finished earlier)], "best_seed", "best_run" (the
      dict of the run kept), "summary" (the best point's seed statistics; empty for one
      seed)} plus, with a grid, "best_point" and "grid" (the table's rows).
    """
    validate(settings)
    if not isinstance(family, TaskFamily):
        family = family()
    # First: multi-worker wants it.
    strategy = setup_runtime(settings.runtime, settings.loop.dtype)

    from training import distribution, output_claim, record_checks, run_files

    bert_config = trainer_setup.load_bert_config(settings.bert_config_file, settings.max_seq_length)
    trainer_setup.check_vocab_fits(
        settings.vocab_file, bert_config, f"--bert_config_file={settings.bert_config_file}",
        os.path.join(os.path.dirname(settings.bert_config_file), "vocab.txt"))
    replicas = strategy.num_replicas_in_sync
    points = grid_points(settings)
    for point in points:
        trainer_setup.check_batch("train_batch_size", point.train_batch_size, replicas,
                         settings.loop.gradient_accumulation_steps)
    trainer_setup.check_batch("eval_batch_size", settings.eval_batch_size, replicas)
    trainer_setup.check_batch("predict_batch_size", settings.predict_batch_size, replicas)
    family.input_options = InputOptions(
        max_seq_length=settings.max_seq_length, bucket_boundaries=settings.bucket_boundaries,
        vocab_size=bert_config.vocab_size, type_vocab_size=bert_config.type_vocab_size,
        autotune=settings.runtime.tf_data_autotune)
    chief = distribution.is_chief(strategy)
    # Locked and compared now; taken (identity, model files) only when every check below
    # has passed: a run refused by one leaves output_dir to the run that fits it.
    claimed = output_claim.claim(settings.output_dir,
                            {"bert_config": bert_config.to_dict(), **family.identity()},
                            is_chief=chief)
    try:
        grid = len(points) > 1
        several = len(settings.seeds) > 1
        skip_finished = grid or several or settings.skip_finished
        other_kind = sweeps.check_kind(settings.output_dir,
                                       "grid" if grid else "seeds" if several else "single")
        if other_kind:
            raise FinetuningError(other_kind)
        prepared = family.prepare(settings)
        check_prepared(settings, prepared)
        point_results = []
        for index, point in enumerate(points):
            point_settings = at_point(settings, point, os.path.join(
                settings.output_dir, point.name()) if grid else settings.output_dir)
            if grid:
                logging.info("Grid point %d/%d: learning_rate %s, train_batch_size %d, "
                             "num_train_epochs %s in %s", index + 1, len(points),
                             point.learning_rate, point.train_batch_size,
                             point.num_train_epochs, point_settings.output_dir)
            seed_runs = []
            for seed in settings.seeds:
                directory = (os.path.join(point_settings.output_dir, f"seed_{seed}")
                             if several else point_settings.output_dir)

                request = sweeps.request(point_settings, family, prepared, seed)
                earlier, redo = sweeps.earlier(directory, request, skip=skip_finished)
                if redo:
                    _check_redo_keeps(directory, point_settings.init_checkpoint)
                if chief:  # the files its commit writes: never over a user's own
                    trainer_setup.check_model_files(directory, bert_config,
                                                    settings.vocab_file,
                                                    family.export_metadata(point_settings))

                def commit(directory=directory, point_settings=point_settings, redo=redo):
                    """Takes output_dir for the run (what an earlier run with other settings
                    made removed first) and writes the model files beside the checkpoints
                    (chief only)."""
                    claimed.commit()
                    if chief:
                        if redo:
                            sweeps.remove_run(directory)
                        run_files.add(directory, files=trainer_setup.MODEL_FILES)
                        trainer_setup.write_model_files(directory, bert_config,
                                                        settings.vocab_file,
                                                        family.export_metadata(point_settings))

                if earlier is not None:
                    claimed.commit()
                    if earlier.get("failed"):
                        logging.warning("%s failed earlier with these settings (%s): "
                                        "skipped, not tried again: %s", directory,
                                        sweeps.RESULTS_FILE, earlier["failed"])
                    else:
                        logging.info("%s finished earlier (%s): skipped", directory,
                                     sweeps.RESULTS_FILE)
                    seed_runs.append({**earlier, "point": dataclasses.asdict(point)})
                    continue
                try:
                    with record_checks.naming_bad_records(
                            _record_files(family, prepared),
                            limits=_id_limits(settings, bert_config)):
                        result = _run_one(point_settings, family, prepared, strategy,
                                          bert_config, seed, directory, commit, fresh=redo)
                except FloatingPointError as err:  # the loop's divergence stop
                    if not skip_finished:
                        raise
                    result = sweeps.failed(directory, seed, err)
                result["point"] = dataclasses.asdict(point)
                if (skip_finished or settings.do_train) and chief:
                    sweeps.write_finished(directory, request, result)
                seed_runs.append(result)
            if several:
                point_results.append(sweeps.summarise_seeds(point_settings, family, prepared,
                                                      seed_runs, write=chief))
            else:
                finished = not seed_runs[0].get("failed")
                point_results.append({"runs": seed_runs,
                                      "best_seed": settings.seeds[0] if finished else None,
                                      "best_run": seed_runs[0] if finished else None,
                                      "summary": {}})
        if grid:
            result = sweeps.summarise_grid(settings, family, prepared, points,
                                           point_results, write=chief)
        else:
            result = point_results[0]
        if result["best_run"] is None:
            raise FinetuningError(sweeps.all_failed_message(result["runs"],
                                                            settings.output_dir))
        return result
    finally:
        claimed.release()


def _record_files(family: TaskFamily, prepared: PreparedData) -> list:
    splits = ([prepared.train] if prepared.train else []) + prepared.eval_splits + \
        prepared.predict_splits
    return sorted({p for split in splits for p in family.records(split).input_patterns})


def _id_limits(settings: FinetuningRun, bert_config) -> tuple:
    """The `record_checks.IdLimit`s the records are checked against, as the error naming
    a record beyond them says it: the records are made with --vocab_file."""
    from training import record_checks

    return tuple(
        dataclasses.replace(limit, hint=f"the records were made with --vocab_file="
                                        f"{settings.vocab_file}: not this model's vocab")
        if limit.feature == "input_ids" else limit
        for limit in record_checks.id_limits(
            vocab_size=bert_config.vocab_size, type_vocab_size=bert_config.type_vocab_size,
            bert_config_file=settings.bert_config_file))


def _run_one(settings: FinetuningRun, family: TaskFamily, prepared: PreparedData, strategy,
             bert_config, seed, directory: str, commit, fresh: bool = False) -> dict:
    """Train -> (best checkpoint) -> eval -> predict in `directory` with one seed; `commit`
    is called once every check has passed (the model built, its weights restored or
    initialised, the input fits the checkpoint's, best/ readable), before anything is
    written. `fresh`: the run is done again from its initial checkpoint (`commit` removes
    what the earlier run made)."""
    import keras

    from training import input_pipeline, loop, run_files

    if seed is not None:
        keras.utils.set_random_seed(seed)
    num_train_steps = num_warmup_steps = 0
    if settings.do_train:
        num_train_steps, num_warmup_steps = trainer_setup.finetuning_steps(
            prepared.train.num_examples, settings.train_batch_size,
            settings.num_train_epochs, settings.warmup_proportion)
    loop_config = LoopConfig.for_run(
        settings.loop, output_dir=directory, num_train_steps=num_train_steps,
        num_warmup_steps=num_warmup_steps, train_batch_size=settings.train_batch_size,
        eval_batch_size=settings.eval_batch_size)
    model, trainer = trainer_setup.build_trainer(
        strategy, lambda: family.build_model(bert_config), family.loop_task(),
        loop_config=loop_config, max_seq_length=settings.max_seq_length,
        build_fn=lambda model: family.build_variables(model, settings.max_seq_length))
    start_step = trainer_setup.restore_or_init(trainer, model, settings.init_checkpoint,
                                               do_train=settings.do_train, fresh=fresh)
    # A resumed run continues its input from the position saved in the checkpoint.
    data_seed = trainer.input_seed(seed)
    identity = None
    if settings.do_train:
        train = prepared.train
        identity = input_pipeline.records_input_identity(
            dataclasses.replace(family.records(train), seed=data_seed,
                                bucket_boundaries=family.input_options.bucket_boundaries),
            settings.train_batch_size)
        # What the saved position counts in: records of this length, with this content
        # (hashed when the cache was written): edited data is other input, not the same
        # file name.
        identity.update(max_seq_length=settings.max_seq_length,
                        records_sha256=train.data.metadata["record_file_sha256"][:16])
        trainer.check_input(identity, quiet=True)  # refused before anything is written
    best = None
    if settings.keep_best_checkpoint:
        best = _BestKeeper(settings, family, prepared.eval_splits[0], directory, model,
                           bert_config, trainer, fresh=fresh)
    commit()
    if best is not None:
        # A resumed run whose newest checkpoint was saved but not yet compared (killed in
        # between): compare it now, as the uninterrupted run did right after saving it.
        # (Comparing one already compared changes nothing: the same weights score the same.)
        due = start_step > 0 and (start_step % settings.loop.save_checkpoints_steps == 0
                                  or start_step == num_train_steps)
        if settings.do_train and due and (best.step is None or best.step < start_step):
            best.on_checkpoint(start_step)
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

        trainer.train(train_fn, on_checkpoint=best.on_checkpoint if best else None,
                      input_identity=identity)
    step = int(trainer.global_step.numpy())
    model_dir = directory
    if best is not None and best.step is not None:
        step = best.restore()
        model_dir = best.dir
    elif best is not None:
        logging.warning("No checkpoint had a dev %s to pick the best by (NaN or missing): "
                        "eval and predict use the final weights (step %d)", best.key, step)

    result = {"seed": seed, "dir": directory, "global_step": step,
              "num_train_steps": num_train_steps, "eval": {}, "outputs": [],
              "model_dir": model_dir}
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
    if trainer.is_chief:
        run_files.add(directory, files=result["outputs"])
    return result


BEST_STATE_FILE = "best_checkpoint.json"


def _check_redo_keeps(directory: str, init_checkpoint: str | None) -> None:
    """Refuses to redo a run whose --init_checkpoint is among what the earlier run made in
    `directory` (its checkpoints, best/): the redo removes them first, then saves its own
    under the same names."""
    from modeling import checkpoints

    if not init_checkpoint:
        return
    try:
        _, location = checkpoints.resolve(init_checkpoint)
    except checkpoints.CheckpointError:
        return  # refused with its reason when it is loaded
    made = [p for p in sweeps.made_by_run(directory) if fileio.is_within(location, p)]
    if made:
        raise FinetuningError(
            f"--init_checkpoint={init_checkpoint} is {made[0]}, made by the earlier run in "
            f"{directory}, which this run does again from its start with other settings: it "
            "would remove it first. Copy it out of that directory and pass its new path, or "
            "choose another --output_dir")


class _BestKeeper:
    """Evaluates on the first dev split after every checkpoint; keeps the best in run_dir/best
    (model weights + bert_config.json, vocab.txt, export_metadata.json, eval_results.txt and
    best_checkpoint.json: its metric, score and step).

    best/ is replaced as one directory (all-or-nothing), so its weights and its score always
    agree; a resumed run reads the score and step back and keeps comparing with them (the
    weights are loaded from best/ only if no later checkpoint beats them).
    """

    def __init__(self, settings, family, split, run_dir, model, bert_config, trainer,
                 fresh=False):
        self.settings, self.family, self.split = settings, family, split
        self.model, self.bert_config, self.trainer = model, bert_config, trainer
        self.run_dir = run_dir
        self.dir = os.path.join(run_dir, "best")
        self.key = family.primary_metric()
        self.weights = None
        self.step = None
        self.score = -math.inf
        self._check_ours()
        if not fresh:  # a run done again: its best/ goes with what it made
            self._read_state()

    def _check_ours(self) -> None:
        """Refuses a best/ the run did not make: it would be replaced (writes nothing).
        Ours: recorded (`training.run_files`; `on_checkpoint` records it before writing)."""
        from training import run_files

        if not fileio.exists(self.dir) or run_files.owns(self.run_dir, "best"):
            return
        raise FinetuningError(
            f"{self.dir} exists but this run did not make it (not in "
            f"{os.path.join(self.run_dir, run_files.RECORD_FILE)}): --keep_best_checkpoint "
            "keeps the best checkpoint there and would replace it. Move it away, or choose "
            "another output directory")

    def _read_state(self) -> None:
        """The best (score, step) an interrupted run kept in best/, if any."""
        path = os.path.join(self.dir, BEST_STATE_FILE)
        if not fileio.exists(path):
            return
        try:
            state = json.loads(fileio.read_text(path))
            if state["metric"] != self.key:
                raise ValueError(f"metric {state['metric']!r}, not {self.key!r}")
            self.step, self.score = int(state["step"]), float(state["score"])
        except (ValueError, KeyError, TypeError) as err:
            raise FinetuningError(f"{path}: cannot be read ({err}); it records the best "
                                  f"checkpoint kept in {self.dir}: delete that directory to "
                                  "start the selection over") from None
        logging.info("Best checkpoint so far: step %d, %s = %s (%s)", self.step, self.key,
                     self.score, self.dir)

    def on_checkpoint(self, step):
        results = self.family.evaluate(self.trainer, self.split, step=step,
                                       run_dir=self.run_dir, write=False)
        value = sweeps.score(results, self.key)
        so_far = "none" if self.step is None else f"{self.score} at step {self.step}"
        if value is None:
            logging.warning("Dev %s at step %d is %s (undefined on this dev set, e.g. a "
                            "correlation over one label value): not a candidate for the "
                            "best checkpoint (best so far: %s)", self.key, step,
                            results.get(self.key), so_far)
            return
        logging.info("Dev %s at step %d: %s (best so far: %s)", self.key, step, value, so_far)
        if self.step is not None and value <= self.score:
            return
        self.step, self.score = step, value
        self.weights = [w.numpy() for w in self.model.weights]
        if self.trainer.is_chief:
            self._write(results)

    def _write(self, results) -> None:
        """Replaces best/ with the current weights, their files and their score, as one
        directory (a kill leaves the previous best/ or the new one)."""
        from modeling import checkpoints
        from training import loop, run_files

        state = {"metric": self.key, "score": self.score, "step": self.step}
        run_files.add(self.run_dir, files=["best"])  # first: a kill leaves it the run's
        with fileio.AtomicOutputs([self.dir], replace_directories=True) as out:
            temp = out.temp(self.dir)
            trainer_setup.write_model_files(temp, self.bert_config, self.settings.vocab_file,
                                   self.family.export_metadata(self.settings))
            checkpoints.save_ours(self.model, temp)
            loop.write_eval_results(os.path.join(temp, "eval_results.txt"), results)
            fileio.write_text(os.path.join(temp, BEST_STATE_FILE),
                              json.dumps(state, sort_keys=True) + "\n")

    def restore(self) -> int:
        """Loads the best weights into the model (from best/ when an earlier run of this
        directory kept them); returns their step."""
        if self.weights is None:
            from modeling import checkpoints

            checkpoints.load_pretrained(self.dir, self.model)
        else:
            self.model.set_weights(self.weights)
        logging.info("Using the best checkpoint (step %d, %s = %s) for eval and predict",
                     self.step, self.key, self.score)
        return self.step


