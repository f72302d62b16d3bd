"""Owns the one training, evaluation and prediction loop used by every runner, under every strategy.

What differs between runners lives in a small task object (`Task`): which features the
model takes (`model_inputs`), the per-replica loss and the summed statistics
(`loss_and_stats`), which statistics are per-replica means (`mean_keys`), the progress
line's figures (`progress`) and the eval metrics (`metrics_from_totals`).
Pretraining's task (`training.pretraining.PretrainingTask`: masked LM + NSP, masked LM
alone, or the left-to-right LM) lives with the pretraining run; each fine-tuning task
family's task object lives in the tasks layer (`tasks.common.classifier_task.ClassifierTask`,
`tasks.squad.task.SpanTask`, ...); `TrainingLoop(strategy, model, optimizer, config, task)`
is the loop. The loop writes its eval figures as the original's eval_results.txt
(`write_eval_results`), for pretraining and fine-tuning alike.

Shape of a training call (`_train_steps`, one `tf.function`): `iterations_per_loop`
times, `strategy.run(replica_step, next(iterator))`, then a cross-replica sum of the step's
statistics. A replica step computes the loss of its batch (split into
`gradient_accumulation_steps` micro-batches whose gradients are summed), scales it by
1 / (num_replicas * accumulation_steps), all-reduces the gradients (SUM) itself and hands
the result to a Keras optimizer built with `pre_reduced_gradients=True`, so global-norm
clipping sees the global gradient. Net effect: each update uses the mean of the per-replica
(per-micro-batch) gradients of the original per-core loss, the semantics of the original's
TPU CrossShardOptimizer with a mean reduction.

Input and exact resume (`train`): on every strategy but TPU (`distribution.feeds_from_host`)
the loop reads the GLOBAL batch from one host-side `tf.data` iterator inside the compiled
call and splits it among the replicas itself
(`strategy.experimental_distribute_values_from_function`); every worker of a multi-worker
run builds the same pipeline (same seed) and its replicas take their rows. That iterator
is checkpointable: its state (file offsets, shuffle and prefetch buffers, counters) is
saved with every checkpoint (`checkpointing.input_position`), with the dropout generators'
states, so a resumed run trains on exactly the batches, and draws exactly the dropout
masks, of the run it continues. The saved input says what it is (`input_identity`); a
resumed run with other input (files, batch size, seed, ...) is refused naming what changed.
Under TPUStrategy the input comes from its distributed dataset, which TensorFlow cannot
checkpoint: a resumed run starts its input over, reshuffled with seed + step (logged).

Stopping: a SIGTERM or SIGHUP (a preempted machine) or Ctrl-C during `train` is turned
into a stop request (`lifecycle.stop_requests`) that a variable carries into the compiled
call; every replica reads it at each step and the gradients' all-reduce carries it, so
all workers end after the same step. The loop then saves a checkpoint at that step and
exits with 128 + signal.

float16 trains with `keras.optimizers.LossScaleOptimizer` (dynamic loss scaling; steps with
non-finite gradients are skipped and the scale halved; the loop counts and logs them).

Divergence: a step diverges when its loss is NaN or Inf, when its gradients are (their
global norm, checked every step; not in float16, whose loss scaling skips such steps), or
when the run's recent loss (a moving mean over about `START_STEPS` steps) exceeds
`divergence_factor` (`LoopConfig`) times the loss the run started at (the mean of its
first `START_STEPS` steps, at least 1; while those are measured, `START_STEPS` times
that: only an explosion trips it then). Both are kept in every checkpoint
(`divergence/`), so a resumed run, also one resumed after a divergence, is judged
against the start of the run, never against a damaged state; no single batch decides (a
batch of outliers moves the recent mean by a tenth of its loss). The run then stops
with `TrainingDivergedError` (a `FloatingPointError`) naming the step, before any
checkpoint of it, and sets aside (`checkpointing.set_aside`) the checkpoint whose weights
led there (the one of the step before) and every newer one, and also every checkpoint
newer than the newest sane one (saved with a recent loss at most `SANE_FACTOR` times the
start's): a rerun with saner settings trains on from a checkpoint that was still
learning; the message names it (or says that the rerun starts over). A run that ends
with its recent loss more than `SANE_FACTOR` times where it began says so.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import time
from typing import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from data_prep import fileio, lifecycle
from data_prep.cli import UserError
from training import checkpointing, distribution, output_claim, run_files, summaries
from training.settings import LoopConfig

# Per-step control values the replica step returns beside the task's statistics.
_NONFINITE_GRADS = "_nonfinite_grads"
_STOP = "_stop"
ENCODER_INPUTS = ("input_ids", "input_mask", "segment_ids")
# The divergence check (see the module docstring): the run's start is the mean loss of
# its first START_STEPS steps, its recent loss a moving mean of weight 1 / START_STEPS;
# a checkpoint is sane, and a finished run ended where it should, when its recent loss
# is at most SANE_FACTOR times the start's (both at least 1).
START_STEPS = 10
SANE_FACTOR = 2.0
# Why a step diverged (`_train_steps`' "bad_kind"), as the error says it.
_DIVERGED = {1: "training loss is NaN or Inf",
             2: "gradients are NaN or Inf (their global norm) with a finite loss",
             3: "training loss {loss:.4g} (the mean of its last steps) exceeds "
                "{factor:g} x the loss the run started at ({start:.4g}, the mean of its "
                "first steps; --divergence_factor)"}


class TrainingDivergedError(FloatingPointError, UserError):
    """Training diverged at a step (the message names it, why, and the checkpoint a rerun
    resumes from). A FloatingPointError as the loop has always raised; a UserError too,
    so that a runner reports it in one line (the settings or data the user chose)."""


def build_encoder_model(model, max_seq_length):
    """Creates a classifier's (or any encoder-input model's) variables on a zero batch."""
    model({"input_ids": tf.zeros([1, max_seq_length], tf.int32),
           "input_mask": tf.ones([1, max_seq_length], tf.int32),
           "segment_ids": tf.zeros([1, max_seq_length], tf.int32)}, training=False)
    return model


def write_eval_results(path, results):
    """Writes "key = value" lines sorted by key, like the original's eval_results.txt
    (all-or-nothing: a temporary renamed into place)."""
    fileio.write_text(path, "".join(f"{key} = {results[key]}\n" for key in sorted(results)))


# ------------------------------------------------------------------------------ tasks


class Task:
    """What one kind of training contributes to the loop (subclass and override).

    Attributes:
      stat_keys: the float32 scalar statistics `loss_and_stats` returns; the loop sums them
        over replicas, micro-batches and steps. Must include "loss".
      mean_keys: the statistics that are per-replica MEANS (e.g. the batch loss): the loop
        divides them by replicas x accumulation steps before summing, so their sum over
        one step is the mean over the step's replicas. The others are plain sums.
    """

    stat_keys: tuple = ("loss",)
    mean_keys: tuple = ("loss",)

    def model_inputs(self, features: dict) -> dict:
        """The model's input dict taken from a batch of features."""
        return {name: features[name] for name in ENCODER_INPUTS}

    def loss_and_stats(self, outputs: dict, features: dict):
        """(scalar float32 loss of this replica's batch, dict of `stat_keys` scalars)."""
        raise NotImplementedError

    def metrics_from_totals(self, totals: dict, global_step: int) -> dict:
        """Eval figures (eval_results.txt) from statistics summed over eval batches;
        `totals["steps"]` counts the batches."""
        steps = max(float(totals.get("steps", 0.0)), 1.0)
        return {"global_step": int(global_step), "loss": float(totals["loss"]) / steps}

    def progress(self, totals: dict) -> list:
        """[(summary key, short label, value)] for a progress line, from summed statistics."""
        del totals
        return []


class TrainingLoop:
    """Trains, evaluates and predicts with a model under a strategy; create it after the model.

    Args:
      strategy: any `tf.distribute.Strategy` (the model and optimizer must have been
        created under its scope).
      model: a built Keras model mapping `task.model_inputs(features)` to a dict of outputs.
      optimizer: a Keras optimizer with `pre_reduced_gradients=True`
        (`modeling.optimization.create_optimizer`).
      config: `LoopConfig`.
      task: the `Task` (loss, statistics, metrics). `self.loss_fn` is its
        `loss_and_stats`; it is looked up when the step is traced, so it can be replaced
        before the first call.
    """

    def __init__(self, strategy: tf.distribute.Strategy, model: keras.Model, optimizer,
                 config: LoopConfig, task: Task):
        if not getattr(optimizer, "pre_reduced_gradients", False):
            raise ValueError("the loop all-reduces gradients itself: build the optimizer with "
                             "pre_reduced_gradients=True (modeling.optimization.create_optimizer)")
        self.strategy = strategy
        self.model = model
        self.config = config
        self.task = task
        self.loss_fn = task.loss_and_stats
        self.stat_keys = tuple(task.stat_keys)
        self.mean_keys = tuple(task.mean_keys)
        self.is_chief = distribution.is_chief(strategy)
        self.base_optimizer = optimizer
        with strategy.scope():
            self.global_step = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="global_step",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
            self.loss_scale_optimizer = None
            if config.dtype == "float16":
                self.loss_scale_optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            self.optimizer = self.loss_scale_optimizer or optimizer
            self.optimizer.build(model.trainable_variables)
        # This process's stop request (a signal's number, 0: none), outside the strategy's
        # scope: every worker has its own; the step's all-reduce combines them.
        self._stop_signal = tf.Variable(0, dtype=tf.int32, trainable=False,
                                        name="stop_signal")
        # The divergence check's state, saved in every checkpoint (module docstring): the
        # mean loss of the run's first `steps` steps (up to START_STEPS) and its recent
        # loss; every worker computes the same values from the all-reduced losses.
        self.divergence = tf.train.Checkpoint(
            start=tf.Variable(0.0, dtype=tf.float32, trainable=False, name="loss_start"),
            steps=tf.Variable(0, dtype=tf.int32, trainable=False, name="loss_start_steps"),
            recent=tf.Variable(0.0, dtype=tf.float32, trainable=False, name="loss_recent"))
        self._restored_path: str | None = None
        self.skipped_steps = 0  # float16 steps skipped for non-finite gradients
        self.checkpoint = checkpointing.make_checkpoint(model, optimizer, self.global_step,
                                                        self.loss_scale_optimizer,
                                                        divergence=self.divergence)
        self._saver = None  # made at the first save: a refused run writes nothing
        # A nested XLA function when asked; inline otherwise, so grappler sees one graph.
        # The compiled calls write their loops and branches as graph ops (tf.while_loop,
        # tf.cond): no AutoGraph conversion, which cost a fresh process ~2 s of source
        # rewriting of the loop's, the tasks' and the model's functions before step one.
        self._grad_fn = (tf.function(self._loss_and_grads, jit_compile=True, autograph=False)
                         if config.jit_compile else self._loss_and_grads)
        self._train_fn = tf.function(self._train_steps, autograph=False)
        self._eval_fn = tf.function(self._eval_steps, autograph=False)
        # Prediction functions by (input spec, outputs): traced once per spec, whatever
        # the batch sizes and bucket lengths (see `predict`).
        self._predict_fns: dict = {}
        self.history: list[dict] = []

    @property
    def saver(self) -> checkpointing.CheckpointSaver:
        """The checkpoint saver (its CheckpointManager reads the state file when made)."""
        if self._saver is None:
            task_type, task_id = distribution.worker_id(self.strategy)
            self._saver = checkpointing.CheckpointSaver(
                self.checkpoint, self.config.output_dir, is_chief=self.is_chief,
                worker_tag=f"{task_type}_{task_id}",
                max_to_keep=self.config.keep_checkpoint_max)
        return self._saver

    # ----------------------------------------------------------------- restore
    def restore_or_initialize(self, init_fn: Callable[[], None] | None = None, *,
                              fresh: bool = False, init_checkpoint: str | None = None) -> int:
        """Resumes from output_dir's newest checkpoint, else calls `init_fn` (init_checkpoint).

        Args:
          fresh: start from `init_fn` even when output_dir has checkpoints of the run (a
            run done again: the caller removes them before the first save).
          init_checkpoint: the path `init_fn` loads, named when it is a checkpoint in
            output_dir that the run's own saves would overwrite.

        Returns:
          The global step training starts from.

        Raises:
          checkpointing.CheckpointCollisionError: output_dir holds a checkpoint the run did
            not write under the name of one it would save.
          checkpointing.StateFileError: output_dir holds a `checkpoint` file the run did
            not write.
        """
        checkpointing.check_state_file(self.config.output_dir)
        path = None if fresh else checkpointing.restore_latest(self.checkpoint,
                                                               self.config.output_dir)
        self._restored_path = path
        step = int(self.global_step.numpy())
        checkpointing.check_no_foreign(self.config.output_dir, step,
                                       self.config.num_train_steps, init_checkpoint)
        if path:
            logging.info("Resumed from %s at step %d", path, step)
        elif init_fn is not None:
            init_fn()
        return step

    def input_seed(self, seed: int | None) -> int | None:
        """The seed to build the training input with; put it in `train`'s input_identity
        as "seed". Call it after `restore_or_initialize`.

        * Exact resume (a checkpoint with an input position): `seed`, or without one the
          seed the interrupted run drew (saved in its input identity).
        * A fresh run without a seed: one drawn at random (the chief's, on every worker:
          their pipelines must be the same), so that it can be resumed exactly too.
        * No input position to resume (a checkpoint written before exact resume, or under
          TPUStrategy): the input starts over, so `seed + step` (None stays None), not to
          train on the first batches again.
        """
        path = self._restored_path
        step = int(self.global_step.numpy())
        exact = distribution.feeds_from_host(self.strategy)
        saved = checkpointing.saved_input_identity(path) if (path and exact) else None
        if saved is not None:
            if seed is None and saved.get("seed") is not None:
                logging.info("Input seed %s: the one the resumed run drew", saved["seed"])
                return saved["seed"]
            return seed
        if path:
            return None if seed is None else seed + step
        if seed is None and exact:
            seed = self._shared_random_seed()
            logging.info("Input seed %d, drawn at random (saved with the checkpoints)", seed)
        return seed

    def _shared_random_seed(self) -> int:
        """A random seed, the first replica's on every worker (one collective)."""
        drawn = random.SystemRandom().getrandbits(31)
        value = self.strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(drawn if ctx.replica_id_in_sync_group == 0 else 0,
                                    tf.int64))
        return int(self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None))

    # ------------------------------------------------------------- replica math
    def _loss_and_grads(self, features, grad_scale):
        with tf.GradientTape() as tape:
            outputs = self.model(self.task.model_inputs(features), training=True)
            loss, stats = self.loss_fn(outputs, features)
            scaled = loss * grad_scale
            if self.loss_scale_optimizer is not None:
                scaled = self.loss_scale_optimizer.scale_loss(scaled)
        grads = tape.gradient(scaled, self.model.trainable_variables)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                 for g, v in zip(grads, self.model.trainable_variables)]
        return grads, stats

    def _replica_step(self, features):
        k = self.config.gradient_accumulation_steps
        replicas = self.strategy.num_replicas_in_sync
        grad_scale = tf.constant(1.0 / (replicas * k), tf.float32)
        if k == 1:
            grads, stats = self._grad_fn(features, grad_scale)
        else:
            grads, stats = self._accumulate(features, k, grad_scale)
        stats = {key: stats[key] / (replicas * k) if key in self.mean_keys else stats[key]
                 for key in self.stat_keys}
        context = tf.distribute.get_replica_context()
        # The stop request rides on the gradients' all-reduce: every replica of every
        # worker sees the sum, so they all stop after the same step.
        stop = tf.cast(self._stop_signal.read_value() > 0, tf.float32)
        reduced = context.all_reduce(tf.distribute.ReduceOp.SUM, grads + [stop])
        grads, stop = reduced[:-1], reduced[-1]
        if self.loss_scale_optimizer is not None:
            # The loss scale optimizer's own test: exactly the steps it skips.
            finite = self.loss_scale_optimizer.check_finite(grads)
        else:
            # The global norm (global-norm clipping's too): NaN/Inf gradients can come with
            # a finite loss (an overflow in the backward pass).
            finite = tf.math.is_finite(tf.linalg.global_norm(grads))
        self.optimizer.apply(grads, self.model.trainable_variables)
        stats = dict(stats)
        stats[_NONFINITE_GRADS] = 1.0 - tf.cast(finite, tf.float32)
        stats[_STOP] = stop
        return stats

    def _accumulate(self, features, k, grad_scale):
        def micro_batches(t):
            # [batch, ...] -> [k, batch / k, ...]: a dimension the batch has statically
            # stays static (TPU, XLA); one it has not (a length bucket's length) is read at
            # run time.
            dims = [k, -1 if t.shape[0] is None else t.shape[0] // k]
            dims += [tf.shape(t)[axis] if size is None else size
                     for axis, size in enumerate(t.shape.as_list()[1:], start=1)]
            return tf.reshape(t, tf.stack(dims))

        split = {name: micro_batches(t) for name, t in features.items()}

        def micro_step(i, grads, stats):
            g, s = self._grad_fn({name: t[i] for name, t in split.items()}, grad_scale)
            return (i + 1, [a + b for a, b in zip(grads, g)],
                    {key: stats[key] + s[key] for key in self.stat_keys})

        start = (tf.constant(0), [tf.zeros_like(v) for v in self.model.trainable_variables],
                 {key: tf.constant(0.0) for key in self.stat_keys})
        _, grads, stats = tf.while_loop(lambda i, *_: i < k, micro_step, start,
                                        maximum_iterations=k)
        return grads, stats

    def _sum_over_replicas(self, per_replica):
        return {key: self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
                for key, value in per_replica.items()}

    # ---------------------------------------------------------- compiled calls
    def _distribute(self, batch):
        """A GLOBAL batch -> per-replica values: replica r (global index, every worker)
        gets the r-th contiguous slice of the rows, as a per-replica pipeline would."""
        replicas = self.strategy.num_replicas_in_sync
        if replicas == 1:
            return batch
        parts = {name: tf.split(t, replicas) for name, t in batch.items()}
        return self.strategy.experimental_distribute_values_from_function(
            lambda ctx: {name: tf.identity(p[ctx.replica_id_in_sync_group])
                         for name, p in parts.items()})

    def _train_steps(self, iterator, num_steps):
        """Up to `num_steps` steps in one call; it ends early after a diverged step (not
        counted into the totals, its loss not kept) or a step that carried a stop request."""
        # A plain iterator yields global batches (split here); a distributed one
        # (`distribute_datasets_from_function`) per-replica ones.
        global_batches = not isinstance(iterator, tf.distribute.DistributedIterator)
        may_skip = self.loss_scale_optimizer is not None  # float16 skips non-finite steps

        def step(done, totals, skipped, stopped, bad_step, bad_kind, bad_loss):
            batch = next(iterator)
            if global_batches:
                batch = self._distribute(batch)
            stats = self._sum_over_replicas(self.strategy.run(self._replica_step,
                                                              args=(batch,)))
            self.global_step.assign_add(1)
            nonfinite = stats[_NONFINITE_GRADS] > 0
            loss = stats["loss"]
            recent, too_high = self._recent_loss(loss)
            kind = tf.where(tf.logical_not(tf.math.is_finite(loss)), 1,
                            tf.where(tf.logical_and(nonfinite, not may_skip), 2,
                                     tf.where(too_high, 3, 0)))
            diverged = kind > 0

            def sound():
                self._count_loss(loss, recent)
                return ({key: totals[key] + stats[key] for key in self.stat_keys},
                        skipped + tf.cast(nonfinite, tf.float32), stats[_STOP] > 0)

            totals, skipped, stopped = tf.cond(diverged, lambda: (totals, skipped, stopped),
                                               sound)
            return (done + 1, totals, skipped, stopped,
                    tf.where(diverged, self.global_step.read_value(), bad_step),
                    tf.where(diverged, kind, bad_kind), tf.where(diverged, recent, bad_loss))

        def more(done, totals, skipped, stopped, bad_step, *_):
            return tf.logical_and(done < num_steps,
                                  tf.logical_and(tf.logical_not(stopped), bad_step < 0))

        start = (tf.constant(0, tf.int32), {key: tf.constant(0.0) for key in self.stat_keys},
                 tf.constant(0.0), tf.constant(False), tf.constant(-1, tf.int64),
                 tf.constant(0), tf.constant(0.0))
        done, totals, skipped, stopped, bad_step, bad_kind, bad_loss = tf.while_loop(
            more, step, start, maximum_iterations=num_steps)
        return {"totals": totals, "bad_step": bad_step, "bad_kind": bad_kind,
                "bad_loss": bad_loss,
                "steps": done, "stopped": stopped, "skipped": skipped}

    def _recent_loss(self, loss):
        """(the recent loss with this step's, True when it exceeds divergence_factor x
        the run's start): the divergence check of a step (module docstring)."""
        state = self.divergence
        started = state.steps > 0
        recent = tf.where(started, (1.0 - 1.0 / START_STEPS) * state.recent
                          + loss / START_STEPS, loss)
        factor = self.config.divergence_factor
        if not factor:
            return recent, tf.constant(False)
        # While the start is measured (a mean of fewer batches), START_STEPS x looser: a
        # batch then trips it only at about 1000 x the mean of those before (an explosion).
        measuring = tf.where(state.steps < START_STEPS, float(START_STEPS), 1.0)
        limit = factor * measuring * tf.maximum(state.start, 1.0)
        return recent, tf.logical_and(started, recent > limit)

    def _count_loss(self, loss, recent):
        """Keeps a sound step's loss: the recent loss, and the start's mean until it has
        START_STEPS steps."""
        state = self.divergence
        state.recent.assign(recent)
        measuring = state.steps < START_STEPS
        count = tf.cast(state.steps + 1, tf.float32)
        state.start.assign(tf.where(measuring, state.start + (loss - state.start) / count,
                                    state.start))
        state.steps.assign_add(tf.cast(measuring, tf.int32))

    def _eval_replica_step(self, features):
        outputs = self.model(self.task.model_inputs(features), training=False)
        _, stats = self.loss_fn(outputs, features)
        replicas = self.strategy.num_replicas_in_sync
        return {key: stats[key] / replicas if key in self.mean_keys else stats[key]
                for key in self.stat_keys}

    def _eval_steps(self, iterator, num_steps):
        """Summed statistics of up to `num_steps` batches (fewer when the input ends)."""

        def step(done, more, totals):
            optional = iterator.get_next_as_optional()

            def add():
                stats = self._sum_over_replicas(self.strategy.run(
                    self._eval_replica_step, args=(optional.get_value(),)))
                stats["steps"] = tf.constant(1.0)
                return {key: totals[key] + stats[key] for key in totals}

            return done + 1, optional.has_value(), tf.cond(optional.has_value(), add,
                                                            lambda: totals)

        start = (tf.constant(0, tf.int32), tf.constant(True),
                 {key: tf.constant(0.0) for key in self.stat_keys + ("steps",)})
        _, _, totals = tf.while_loop(
            lambda done, more, _: tf.logical_and(more, done < num_steps), step, start,
            maximum_iterations=num_steps)
        return totals

    # ------------------------------------------------------------------ train
    def run_train_steps(self, iterator, num_steps: int) -> dict:
        """Runs `num_steps` steps (no logging, no checkpoints) from a distributed iterator
        (per-replica batches) or a plain one (global batches, split among the replicas).

        Returns:
          The summed statistics (floats), `bad_step` (-1 when no step diverged), `steps`
          run and `skipped` (float16 steps with non-finite gradients).
        """
        out = self._train_fn(iterator, tf.constant(num_steps, tf.int32))
        result = {key: float(value.numpy()) for key, value in out["totals"].items()}
        result.update(bad_step=int(out["bad_step"].numpy()), steps=int(out["steps"].numpy()),
                      skipped=int(out["skipped"].numpy()))
        return result

    def train(self, dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
              on_checkpoint: Callable[[int], None] | None = None,
              input_identity: dict | None = None, *, until_step: int | None = None,
              previous_input_identity: dict | None = None):
        """Trains from the current global step to `num_train_steps` (or `until_step`);
        returns the history.

        Args:
          dataset_fn: input_context -> batched dataset (repeating), batched with
            `input_context.get_per_replica_batch_size(global batch)`. The loop asks for ONE
            pipeline feeding one "replica" (so that batch is the global one) and splits it
            among the replicas itself (exact resume); under TPUStrategy it is called per
            input pipeline, as `strategy.distribute_datasets_from_function` does.
          on_checkpoint: called with the step after each checkpoint save (e.g. a dev
            evaluation that keeps the best checkpoint); not after a save on a stop signal.
          input_identity: JSON-serialisable description of the input (files, batch size,
            "seed" from `input_seed`, settings), saved with its position: a run resumed
            with another identity is refused (`checkpointing.InputPositionError`) naming
            what differs.
          until_step: stop at this step (a phase of the run ends there, with a checkpoint);
            the learning rate schedule still runs to `num_train_steps`.
          previous_input_identity: the identity of the input a previous phase trained on
            (`train_phases`): a checkpoint holding ITS position is where this input starts
            (from its beginning), not an input to resume.

        Raises:
          TrainingDivergedError: a step diverged (a non-finite loss or gradient, or a loss
            far above the run's first: see the module docstring), naming it and the
            checkpoint a rerun resumes from; the checkpoints whose weights led there are
            set aside first.
          SystemExit: 128 + signal after a SIGTERM, SIGHUP or Ctrl-C, once the checkpoint
            of the step it arrived in is saved.
        """
        cfg = self.config
        step = int(self.global_step.numpy())
        end = cfg.num_train_steps if until_step is None else min(until_step,
                                                                  cfg.num_train_steps)
        if step >= end:
            logging.info("Global step %d already reaches %s=%d", step,
                         "num_train_steps" if end == cfg.num_train_steps else "the phase's end",
                         end)
            return self.history
        iterator = self._training_input(dataset_fn, input_identity, previous_input_identity)
        writer = self._summary_writer("train")
        window = _Window(step, self.stat_keys)
        start_step, start_time = step, time.time()
        with lifecycle.stop_requests(self._request_stop) as request:
            while step < end:
                next_save = (step // cfg.save_checkpoints_steps + 1) * cfg.save_checkpoints_steps
                n = min(cfg.iterations_per_loop, end - step, next_save - step)
                out = self._train_fn(iterator, tf.constant(n, tf.int32))
                bad_step = int(out["bad_step"].numpy())
                if bad_step >= 0:
                    writer.flush()
                    self._diverged(bad_step, int(out["bad_kind"].numpy()),
                                   float(out["bad_loss"].numpy()))
                done = int(out["steps"].numpy())
                stopped = bool(out["stopped"].numpy())
                step += done
                window.add(out["totals"], done, float(out["skipped"].numpy()))
                last = step >= end
                if window.steps >= cfg.log_steps or last or stopped:
                    self._log(window, step, start_step, start_time, writer)
                    window = _Window(step, self.stat_keys)
                if stopped:
                    self._stop_with_checkpoint(step, request, writer)
                if step % cfg.save_checkpoints_steps == 0 or last:
                    path = self.saver.save(step)
                    if path:
                        logging.info("Saved checkpoint %s", path)
                    if on_checkpoint is not None:
                        on_checkpoint(step)
            if request.signal is not None:  # during the last save or its evaluation
                self._stop_with_checkpoint(step, request, writer, saved=True)
        writer.flush()
        if end == cfg.num_train_steps:
            self._say_if_far_above()
        return self.history

    def _say_if_far_above(self) -> None:
        """A warning when the run ends with its recent loss more than SANE_FACTOR times
        the loss it started at: it finished, but did not learn."""
        start = float(self.divergence.start.numpy())
        recent = float(self.divergence.recent.numpy())
        if int(self.divergence.steps.numpy()) and recent > SANE_FACTOR * max(start, 1.0):
            logging.warning(
                "Training ended with a loss of %.4g (the mean of its last steps), %.1f x "
                "the %.4g it started at (the mean of its first steps): the run did not "
                "learn; a lower learning rate (or a look at the input) may help", recent,
                recent / max(start, 1e-12), start)

    def _sane_checkpoint_before(self, step: int) -> int:
        """The step of the newest of the run's checkpoints before `step` whose recent loss
        was sane (at most SANE_FACTOR x the run's start; a checkpoint without the check's
        state counts as sane), 0 when none is."""
        start = max(float(self.divergence.start.numpy()), 1.0)
        for prefix in checkpointing.checkpoints_newest_first(self.config.output_dir):
            saved = int(os.path.basename(prefix).rsplit("-", 1)[-1])
            if saved >= step:
                continue
            try:
                recent = checkpointing.saved_value(prefix, "divergence/recent")
            except (tf.errors.OpError, ValueError):
                continue  # unreadable: not one to resume
            if recent is None or float(recent) <= SANE_FACTOR * start:
                return saved
        return 0

    def _diverged(self, step: int, kind: int, loss: float):
        """Sets aside the checkpoints from step - 1 on (the weights that gave step `step`
        its bad loss or gradients, and newer) and any newer than the newest sane one, and
        raises TrainingDivergedError naming the checkpoint a rerun resumes from."""
        directory = self.config.output_dir
        what = _DIVERGED[kind].format(loss=loss, factor=self.config.divergence_factor,
                                      start=float(self.divergence.start.numpy()))
        message = f"{what} at step {step}: training diverged; stopping"
        if not self.is_chief:
            raise TrainingDivergedError(f"{message} (the chief worker names the checkpoint "
                                        "a rerun resumes from)")
        moved = checkpointing.set_aside(directory, self._sane_checkpoint_before(step - 1) + 1)
        if moved:
            message += (f". Set aside {', '.join(os.path.basename(p) for p in moved)} (the "
                        f"weights that led there, and any whose loss was already more than "
                        f"{SANE_FACTOR:g} x the start's) into {os.path.dirname(moved[0])}")
        left = checkpointing.checkpoints_newest_first(directory)
        if left:
            aside = os.path.join(directory, checkpointing.SET_ASIDE_DIR)
            message += (f". A rerun resumes from {left[0]} (to resume an older one, move "
                        f"the newer ones' files out of {directory}, e.g. into {aside})")
        else:
            message += (f". No checkpoint before it is left in {directory}: a rerun starts "
                        "over (from --init_checkpoint when given)")
        raise TrainingDivergedError(
            message + "; lower the learning rate (or fix the input) first, or it diverges "
            "again")

    def _request_stop(self, signum: int) -> None:
        """Called from the signal watcher thread: the compiled loop stops after its step."""
        self._stop_signal.assign(signum)

    def _stop_with_checkpoint(self, step, request, writer, saved=False):
        """Saves the checkpoint of `step` (the step a stop signal arrived in; `saved`:
        already saved) and exits."""
        writer.flush()
        path = self.saver.save(step) if not saved else (
            os.path.join(self.config.output_dir, f"ckpt-{step}") if self.is_chief else None)
        signum = request.signal
        why = ("(another worker was asked to stop)" if signum is None  # a peer's signal
               else f"on signal {signum}")
        logging.warning("Stopping at step %d %s%s", step, why,
                        f": saved {path}; a restart with the same command resumes from "
                        f"step {step}" if path else "")
        request.handled()
        raise SystemExit(request.exit_status())

    def check_input(self, identity: dict | None, previous_identity: dict | None = None,
                    quiet: bool = False) -> bool:
        """Refuses (`checkpointing.InputPositionError`, naming what changed) to resume the
        restored checkpoint's input position with another input; returns True when it
        holds the position of the previous phase's input (`previous_identity`): this
        input then starts from its beginning. Writes nothing: a run calls it before it
        takes output_dir (`train` checks again)."""
        path = self._restored_path
        if not path or not distribution.feeds_from_host(self.strategy):
            return False
        identity = json.loads(json.dumps(identity or {}, sort_keys=True))
        saved = checkpointing.saved_input_identity(path)
        previous = json.loads(json.dumps(previous_identity, sort_keys=True))
        if saved is None:
            if not quiet:
                logging.warning("%s holds no input position (written before exact resume, "
                                "or under TPUStrategy): the input starts over", path)
            return False
        if previous is not None and saved == previous and saved != identity:
            if not quiet:
                logging.info("%s holds the position of the previous phase's input: this "
                             "phase's input starts from its beginning", path)
            return True
        _check_input_identity(path, saved, identity)
        return False

    def _training_input(self, dataset_fn, identity, previous_identity=None):
        """The training iterator: a checkpointable host iterator of global batches whose
        position is restored from (and saved with) the checkpoints; under TPUStrategy the
        strategy's distributed iterator, whose position is not saved (see the module
        docstring). A restored checkpoint holding the position of `previous_identity`
        (the input of the phase before) starts this input from its beginning."""
        path = self._restored_path
        if not distribution.feeds_from_host(self.strategy):
            logging.warning(
                "%s: the position of the training input is not saved with the checkpoints "
                "(TensorFlow cannot checkpoint its distributed iterator); a resumed run "
                "starts its input over, reshuffled (seed + step)",
                type(self.strategy).__name__)
            return iter(self.strategy.distribute_datasets_from_function(dataset_fn))
        dataset = dataset_fn(tf.distribute.InputContext(
            num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=1))
        iterator = iter(dataset)
        identity = json.loads(json.dumps(identity or {}, sort_keys=True))
        new_phase = self.check_input(identity, previous_identity)
        if new_phase:
            # The restored checkpoint's input position is not this input's: an empty
            # object takes TensorFlow's pending (deferred) restoration of it, so that
            # attaching the new position below restores nothing into it.
            self.checkpoint.input = tf.train.Checkpoint()
        position = checkpointing.input_position(iterator, identity)
        try:
            # Restores the saved position now when a checkpoint was restored (deferred
            # restoration of the new `input` dependency).
            self.checkpoint.input = position
        except (tf.errors.OpError, ValueError) as err:
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise checkpointing.InputPositionError(
                f"{path}: its saved input position does not fit this input pipeline "
                f"({message})") from err
        if path and checkpointing.has_input_position(path) and not new_phase:
            logging.info("Input resumes at the position saved in %s", path)
        return iterator

    def _log(self, window, step, start_step, start_time, writer):
        cfg = self.config
        elapsed = max(time.time() - window.time, 1e-9)
        examples_per_s = window.steps * cfg.train_batch_size / elapsed
        done = step - start_step
        per_step = (time.time() - start_time) / max(done, 1)
        eta = datetime.timedelta(seconds=int(per_step * (cfg.num_train_steps - step)))
        figures = self.task.progress(window.totals)
        record = {"step": step, "loss": window.totals["loss"] / window.steps}
        record.update({key: float(value) for key, _, value in figures})
        record["learning_rate"] = float(keras.ops.convert_to_numpy(
            self.base_optimizer.learning_rate))
        record["examples_per_second"] = examples_per_s
        self.history.append(record)
        if self.loss_scale_optimizer is not None:
            record["loss_scale"] = float(self.loss_scale_optimizer.dynamic_scale.numpy())
            record["skipped_steps"] = window.skipped
            self.skipped_steps += int(window.skipped)
            if window.skipped:
                logging.info("float16: %d step(s) up to step %d skipped for non-finite "
                             "gradients (%d since the start of this run); loss scale %g",
                             int(window.skipped), step, self.skipped_steps,
                             record["loss_scale"])
        middle = "".join(f" {label} {float(value):.4f}" for _, label, value in figures)
        logging.info("step %d/%d loss %.6f%s lr %.3e examples/s %.1f eta %s", step,
                     cfg.num_train_steps, record["loss"], middle, record["learning_rate"],
                     examples_per_s, eta)
        summaries.write_scalars(writer, {k: v for k, v in record.items() if k != "step"}, step)

    # ------------------------------------------------------------------- eval
    def evaluate(self, dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
                 results_file: str | None = "eval_results.txt") -> dict:
        """Runs up to `max_eval_steps` batches; the chief writes `results_file` in output_dir.

        Args:
          dataset_fn: input_context -> per-replica batched dataset (finite).
        """
        dataset = self.strategy.distribute_datasets_from_function(dataset_fn)
        totals = self._eval_fn(iter(dataset), tf.constant(self.config.max_eval_steps, tf.int32))
        totals = {key: float(value.numpy()) for key, value in totals.items()}
        step = int(self.global_step.numpy())
        results = self.task.metrics_from_totals(totals, step)
        logging.info("Eval at step %d over %d batches: %s", step, int(totals["steps"]),
                     " ".join(f"{k}={v:.6g}" for k, v in sorted(results.items())))
        if self.is_chief:
            summaries.write_scalars(self._summary_writer("eval"),
                                    {k: v for k, v in results.items() if k != "global_step"},
                                    step)
            if results_file:
                tf.io.gfile.makedirs(self.config.output_dir)
                write_eval_results(os.path.join(self.config.output_dir, results_file), results)
                run_files.add(self.config.output_dir, files=[results_file])
        return results

    def write_eval_summaries(self, results: dict, name: str = "eval"):
        """Writes eval figures (all but global_step) as TensorBoard scalars in output_dir/name."""
        if self.is_chief:
            step = int(self.global_step.numpy())
            summaries.write_scalars(self._summary_writer(name),
                                    {k: v for k, v in results.items() if k != "global_step"},
                                    step)

    def _summary_writer(self, name):
        return summaries.writer(self.config.output_dir, name, enabled=self.is_chief)

    # ---------------------------------------------------------------- predict
    def _predict_replica(self, features, output_keys, feature_keys):
        outputs = self.model(self.task.model_inputs(features), training=False)
        keys = output_keys if output_keys is not None else tuple(outputs)
        out = {key: tf.cast(outputs[key], tf.float32) for key in keys}
        out.update({f"features/{key}": features[key] for key in feature_keys})
        return out

    def _predict_batch(self, batch, output_keys, feature_keys):
        return self.strategy.run(self._predict_replica, args=(batch, output_keys, feature_keys))

    def _predict_function(self, element_spec, output_keys, feature_keys):
        """The compiled prediction of one batch, traced once for the dataset's spec: its
        batch and sequence dimensions stay unknown, so length buckets and short last
        batches do not retrace it (one trace instead of one per shape)."""
        key = (repr(element_spec), output_keys, feature_keys)
        if key not in self._predict_fns:
            self._predict_fns[key] = tf.function(
                lambda batch: self._predict_batch(batch, output_keys, feature_keys),
                input_signature=[element_spec], autograph=False)
        return self._predict_fns[key]

    def predict(self, dataset: tf.data.Dataset, *, output_keys: Sequence[str] | None = None,
                feature_keys: Sequence[str] = (), order_key: str | None = None,
                sequence_keys: Sequence[str] = (), sequence_length: int | None = None) -> dict:
        """Batched forward pass over a finite dataset; numpy results in input order.

        Use fixed-size batches (static shapes for TPU and XLA) and pad the data to whole
        batches, with `is_real_example=0` rows (`tasks.classification.data.pad_examples`,
        as the original does on TPU) or all-zero rows (`input_pipeline.finetuning_records`'
        `pad_to_batch`); drop those rows from the result.

        Args:
          dataset: GLOBALLY batched features (each batch is split across the replicas in
            order; the batch size must be divisible by the number of replicas).
          output_keys: model outputs to return (default: all).
          feature_keys: features passed through (e.g. "label_ids", "is_real_example"),
            returned under their own names.
          order_key: a passed-through feature holding each row's input position (e.g.
            `input_pipeline.EXAMPLE_INDEX`, -1 on padding rows): the rows come back sorted
            by it, padding rows dropped. Needed when batches come out of input order
            (length bucketing).
          sequence_keys, sequence_length: outputs or features whose axis 1 is the sequence
            (e.g. span logits [batch, seq]); batches cut to a bucket's length are padded
            back to `sequence_length` with zeros so that all rows line up.

        Returns:
          {name: numpy array [num_rows, ...]} with rows in dataset (or `order_key`) order.
        """
        output_keys = None if output_keys is None else tuple(output_keys)
        feature_keys = tuple(feature_keys)
        if order_key is not None and order_key not in feature_keys:
            feature_keys += (order_key,)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = \
            tf.data.experimental.AutoShardPolicy.OFF
        distributed = self.strategy.experimental_distribute_dataset(
            dataset.with_options(options))
        predict_fn = self._predict_function(distributed.element_spec, output_keys,
                                            feature_keys)
        chunks: dict = {}
        for batch in distributed:
            per_replica = predict_fn(batch)
            for key, value in per_replica.items():
                parts = self.strategy.experimental_local_results(value)
                chunks.setdefault(key, []).extend(np.asarray(p) for p in parts)
        out = {}
        for key, parts in chunks.items():
            name = key[len("features/"):] if key.startswith("features/") else key
            if name in sequence_keys and sequence_length is not None:
                parts = [_pad_axis_1(p, sequence_length) for p in parts]
            out[name] = np.concatenate(parts, axis=0)
        if order_key is not None and out:
            position = out[order_key].reshape(-1)
            keep = np.flatnonzero(position >= 0)
            keep = keep[np.argsort(position[keep], kind="stable")]
            out = {name: value[keep] for name, value in out.items()}
        return out


def _check_input_identity(path: str, saved: dict, identity: dict) -> None:
    """Refuses to resume the input saved in checkpoint `path` with another input, naming
    what changed (its position means nothing for other files, batches or settings)."""
    differences = output_claim.identity_differences(saved, identity)
    if not differences:
        return
    listed = "; ".join(f"{key}: {old!r} there, {new!r} now" for key, old, new in differences[:8])
    raise checkpointing.InputPositionError(
        f"{path} was trained on other input ({listed}): its saved input position does not "
        "apply. Resume with the same input files, batch size, seed and input settings "
        "(the number of replicas may change), or start a new --output_dir with "
        f"--init_checkpoint={path} (its weights, a fresh optimizer and input)")


def _pad_axis_1(array: np.ndarray, length: int) -> np.ndarray:
    """Zero-pads axis 1 of `array` to `length` (a batch cut to its length bucket)."""
    missing = length - array.shape[1]
    if missing <= 0:
        return array
    pad = [(0, 0)] * array.ndim
    pad[1] = (0, missing)
    return np.pad(array, pad)


class _Window:
    """Statistics summed since the last progress line."""

    def __init__(self, step, keys):
        self.step = step
        self.steps = 0
        self.skipped = 0.0
        self.time = time.time()
        self.keys = tuple(keys)
        self.totals = {key: 0.0 for key in self.keys}

    def add(self, totals, n, skipped=0.0):
        self.steps += n
        self.skipped += skipped
        for key in self.keys:
            self.totals[key] += float(totals[key].numpy())
