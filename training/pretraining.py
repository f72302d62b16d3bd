"""Owns a pretraining run: the checks of its records, model and output_dir, training phase by phase, evaluation.

`run_pretraining.py` parses its flags into a `PretrainingRun` (`training.settings`, free of
TensorFlow, so that bad settings are refused before it loads) and calls `run`; tests and
programs can build a `PretrainingRun` themselves. The objectives are the paper's Table 5
(masked LM with or without next sentence prediction, a left-to-right LM), the masking
split its Table 8 (dynamic masking), and `phase2` its two-phase schedule (Appendix A.2).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import tensorflow as tf
from absl import logging

from data_prep.cli import UserError
from data_prep.features import RecordSchema
from data_prep.pretraining_data.config import MASKING_SETTINGS
from modeling import losses
from training import loop, trainer_setup
from training.execution import setup_runtime
from training.settings import LoopConfig, PretrainingRun


def run(cfg: PretrainingRun) -> dict:
    """Trains and/or evaluates; returns the eval results (empty without do_eval)."""
    loop_config = cfg.loop_config()
    strategy = setup_runtime(cfg.runtime, cfg.loop.dtype)  # First: multi-worker needs it so.

    from training import distribution, output_claim

    bert_config = model_config(cfg)
    replicas = strategy.num_replicas_in_sync
    trainer_setup.check_batch("train_batch_size", cfg.train_batch_size, replicas,
                     cfg.loop.gradient_accumulation_steps)
    trainer_setup.check_batch("eval_batch_size", cfg.eval_batch_size, replicas)
    if cfg.phase2 is not None:
        trainer_setup.check_batch("phase2_train_batch_size", cfg.phase2.train_batch_size, replicas,
                         cfg.loop.gradient_accumulation_steps)
    # One run at a time in output_dir, and only runs of this model: locked and compared
    # now, taken (`commit`) once the records, the model and its weights pass.
    claimed = output_claim.claim(cfg.output_dir, run_identity(cfg, bert_config),
                            is_chief=distribution.is_chief(strategy))
    try:
        return _train_and_evaluate(cfg, loop_config, strategy, bert_config, claimed)
    finally:
        claimed.release()


def model_config(cfg: PretrainingRun):
    """The BertConfig the run trains: --bert_config_file's, made causal for
    --objective=ltr; UserError naming the flags when a sequence length does not fit its
    position table or a causal config is given to the masked LM."""
    bert_config = trainer_setup.load_bert_config(cfg.bert_config_file, cfg.max_seq_length)
    if cfg.phase2 is not None and (cfg.phase2.max_seq_length
                                   > bert_config.max_position_embeddings):
        raise UserError(
            f"--phase2_max_seq_length={cfg.phase2.max_seq_length} is longer than "
            f"max_position_embeddings={bert_config.max_position_embeddings} of "
            f"--bert_config_file={cfg.bert_config_file}")
    if cfg.objective == "ltr":
        return dataclasses.replace(bert_config, causal_attention=True)
    if bert_config.causal_attention:
        raise UserError(
            f"--bert_config_file={cfg.bert_config_file} has causal_attention: true (a "
            "left-to-right model) but --objective=mlm: the masked LM reads both sides of a "
            "masked token; use --objective=ltr, or a config without causal_attention")
    return bert_config


def run_identity(cfg: PretrainingRun, bert_config) -> dict:
    """What the checkpoints in output_dir are (`training.output_claim`): the model's config,
    and the objective where it is not the original's (a left-to-right model says so in
    its config's causal_attention), so a default run's identity is unchanged."""
    identity = {"bert_config": bert_config.to_dict()}
    if cfg.objective == "mlm" and not cfg.next_sentence_prediction:
        identity["next_sentence_prediction"] = False
    return identity


@dataclasses.dataclass(frozen=True)
class _PhaseInput:
    """One phase's records as checked: where they are, their shapes and how to read them."""

    flag: str
    patterns: tuple
    max_seq_length: int
    max_predictions_per_seq: int
    train_batch_size: int
    files: list
    limits: tuple
    lengths: dict | None
    schema: RecordSchema | None  # PRETRAINING or PRETRAINING_UNMASKED (None: empty)
    pairs: dict  # summary path -> made with next-sentence pairs (records with a summary)


def _phase_inputs(cfg: PretrainingRun, bert_config):
    """([_PhaseInput] of each phase, masking without its seed): every file's first record
    checked against the flags (phase 2's: the --phase2_* ones), on the host, before any
    work (record_checks.RecordFileError, DynamicMaskingError or UserError naming the file
    and the flag), the records' summaries against the objective, and phase 2's records
    against phase 1's kind (`check_phases_alike`)."""
    from training import record_checks

    masking = dynamic_masking_for(cfg, bert_config, None)
    limits = record_checks.id_limits(
        vocab_size=bert_config.vocab_size, type_vocab_size=bert_config.type_vocab_size,
        masking=masking, bert_config_file=cfg.bert_config_file)
    # (the prefix of the phase's flags, its records, lengths and batch)
    phases = [("", cfg.input_patterns, cfg.max_seq_length, cfg.max_predictions_per_seq,
               cfg.train_batch_size)]
    if cfg.phase2 is not None:
        p = cfg.phase2
        phases.append(("phase2_", p.input_patterns, p.max_seq_length,
                       p.max_predictions_per_seq, p.train_batch_size))
    checked = []
    for prefix, patterns, seq, preds, batch in phases:
        flag = f"--{prefix}input_file"
        files = record_checks.list_files(patterns, flag)
        schema = record_checks.check_pretraining_files(
            files, seq, preds, cfg.input_compression, limits=limits, flag_prefix=prefix)
        phase = _PhaseInput(
            flag, patterns, seq, preds, batch, files, limits,
            None if schema is None else record_checks.record_lengths(schema, seq, preds,
                                                                      prefix),
            schema, check_made_for_objective(cfg, flag, files))
        if checked:
            check_phases_alike(checked[0], phase)
        if schema is not None:
            record_checks.check_record_kind(schema, masking, files[0],
                                             read_unmasked=cfg.objective == "ltr")
        checked.append(phase)
    return checked, masking


def check_phases_alike(first: _PhaseInput, second: _PhaseInput) -> None:
    """Refuses (UserError naming a file of each) two phases of other kinds of records:
    masked and unmasked (--dynamic_masking), or with and without next-sentence pairs (as
    their summaries say): one run trains one objective on one kind of text, and the
    masking flags would fit only one of them."""
    from data_prep import features

    def kind(phase):
        return "masked" if phase.schema is features.PRETRAINING else \
            "unmasked (create_pretraining_data --dynamic_masking)"

    def pairs(phase):
        return "with next-sentence pairs" if any(phase.pairs.values()) else \
            "without next-sentence pairs (--next_sentence_prediction=false)"

    differ = None
    if first.schema is not None and second.schema is not None \
            and first.schema is not second.schema:
        differ = kind
    elif first.pairs and second.pairs and (any(first.pairs.values())
                                           != any(second.pairs.values())):
        differ = pairs
    if differ is not None:
        raise UserError(
            f"{second.files[0]}: the records of {second.flag} are {differ(second)} but those "
            f"of {first.flag} ({first.files[0]}) are {differ(first)}: both phases must be "
            "the same kind of records (create_pretraining_data with the same "
            "--dynamic_masking and --next_sentence_prediction, other lengths)")


def check_made_for_objective(cfg: PretrainingRun, flag: str, files) -> dict:
    """Refuses records whose create_pretraining_data summary says they cannot teach the
    objective: next sentence prediction from records without random next sentences
    (--next_sentence_prediction=false: every label 0), and the left-to-right LM across
    the random B of next-sentence pairs. Records without a summary are not judged.

    Returns:
      {summary path: whether its records are next-sentence pairs}.
    """
    from training import record_checks

    made = {}
    for path, summary in record_checks.record_summaries(files).items():
        config = summary.get("config") or {}
        pairs = made[path] = config.get("next_sentence_prediction", True) is not False
        if cfg.next_sentence_prediction and not pairs:
            raise UserError(
                f"{path}: the records of {flag} were made with --next_sentence_prediction="
                "false (B always follows A, every next_sentence_labels 0): next sentence "
                "prediction cannot be learnt from them; pass --next_sentence_prediction=false "
                "(the masked LM alone) or records with next-sentence pairs")
        if cfg.objective == "ltr" and pairs:
            raise UserError(
                f"{path}: the records of {flag} are next-sentence pairs (B is a random "
                "document's text half the time): --objective=ltr reads contiguous text; make "
                "its records with create_pretraining_data --next_sentence_prediction=false "
                "--dynamic_masking")
    return made


def _train_and_evaluate(cfg: PretrainingRun, loop_config: LoopConfig, strategy, bert_config,
                        claimed) -> dict:
    """The run itself, in a claimed output_dir: check the records, build, restore or init,
    commit the claim, train (phase by phase), evaluate."""
    import os

    from modeling.models import BertPretrainer
    from training import distribution, input_pipeline, record_checks

    phases, masking = _phase_inputs(cfg, bert_config)
    objective = {"next_sentence_prediction": cfg.next_sentence_prediction,
                 "objective": cfg.objective}
    model, trainer = trainer_setup.build_trainer(
        strategy, lambda: BertPretrainer(bert_config, **objective),
        PretrainingTask(**objective), loop_config=loop_config,
        build_fn=lambda model: build_pretraining_model(model, cfg.max_seq_length,
                                                       cfg.max_predictions_per_seq))
    start_step = trainer_setup.restore_or_init(trainer, model, cfg.init_checkpoint,
                                               do_train=cfg.do_train)

    # The seed the input was (or is now) built with: a resumed run continues its input
    # from the position saved in the checkpoint (TrainingLoop.train).
    seed = trainer.input_seed(cfg.runtime.seed)
    if masking is not None:
        masking = dataclasses.replace(masking, seed=seed)

    def input_config(phase):
        return input_pipeline.PretrainingInputConfig(
            phase.patterns, phase.max_seq_length, phase.max_predictions_per_seq,
            compression=cfg.input_compression, seed=seed,
            autotune=cfg.runtime.tf_data_autotune,
            vocab_size=bert_config.vocab_size, type_vocab_size=bert_config.type_vocab_size,
            masking=masking and dataclasses.replace(
                masking, max_predictions_per_seq=phase.max_predictions_per_seq),
            read_unmasked=cfg.objective == "ltr")

    def dataset_fn(config, batch_size, is_training):
        def make(input_context):
            return input_pipeline.pretraining_dataset(
                config, batch_size=input_context.get_per_replica_batch_size(batch_size),
                is_training=is_training, input_context=input_context, check=False)
        return make

    def naming_bad_records(phase):
        return record_checks.naming_bad_records(phase.patterns, cfg.input_compression,
                                                 limits=phase.limits, lengths=phase.lengths)

    ends = [cfg.phase2.start_step] if cfg.phase2 is not None else []
    identities = [input_pipeline.pretraining_input_identity(input_config(phase),
                                                            phase.train_batch_size)
                  for phase in phases]
    if cfg.do_train:  # a resume on other input is refused before the directory is taken
        now = next(i for i, end in enumerate(ends + [None]) if end is None or start_step < end)
        trainer.check_input(identities[now], identities[now - 1] if now else None, quiet=True)
    claimed.commit()  # every check passed: the directory is this run's
    if cfg.objective == "ltr" and distribution.is_chief(strategy):
        # The left-to-right encoder's config beside its checkpoints: fine-tuning and export
        # read it there (causal_attention), as they must to keep the left-only context.
        path = os.path.join(cfg.output_dir, "bert_config.json")
        bert_config.to_json_file(path)
        logging.info("Wrote %s (causal_attention: true): fine-tune this model with "
                     "--bert_config_file=%s", path, path)
    logging.info("%d input file(s), first %s%s; training from step %d to %d%s",
                 len(phases[0].files), phases[0].files[0],
                 " (unmasked: dynamic masking)" if masking else "", start_step,
                 cfg.num_train_steps,
                 f" (phase 2 from step {ends[0]} on {phases[1].files[0]} and "
                 f"{len(phases[1].files) - 1} more)" if ends else "")
    if cfg.do_train:
        previous = None
        for phase, end, identity in zip(phases, ends + [None], identities):
            config = input_config(phase)
            with naming_bad_records(phase):
                trainer.train(dataset_fn(config, phase.train_batch_size, True),
                              input_identity=identity, until_step=end,
                              previous_input_identity=previous)
            previous = identity
    results = {}
    if cfg.do_eval:
        # The records of the phase the model is in (phase 2's once it has begun).
        step = int(trainer.global_step.numpy())
        phase = phases[-1] if ends and step > ends[0] else phases[0]
        with naming_bad_records(phase):
            results = trainer.evaluate(dataset_fn(input_config(phase), cfg.eval_batch_size,
                                                  False))
        for key in sorted(results):
            logging.info("  %s = %s", key, results[key])
    return results


def dynamic_masking_for(cfg: PretrainingRun, bert_config, seed):
    """The on-the-fly masking of unmasked records from the flags (None without
    --vocab_file); DynamicMaskingError names the flag that does not fit."""
    from training import dynamic_masking

    if cfg.vocab_file is None:
        given = [f"--{name}" for name in MASKING_SETTINGS[1:] if getattr(cfg, name) is not None]
        if given:
            raise dynamic_masking.DynamicMaskingError(
                f"{', '.join(given)}: only for unmasked records (create_pretraining_data "
                "--dynamic_masking), which also need --vocab_file")
        return None
    masking = dynamic_masking.DynamicMasking.from_vocab_file(
        cfg.vocab_file, max_predictions_per_seq=cfg.max_predictions_per_seq,
        masked_lm_prob=0.15 if cfg.masked_lm_prob is None else cfg.masked_lm_prob,
        do_whole_word_mask=bool(cfg.do_whole_word_mask), seed=seed,
        mask_token_rate=0.8 if cfg.mask_token_rate is None else cfg.mask_token_rate,
        random_token_rate=0.1 if cfg.random_token_rate is None else cfg.random_token_rate)
    masking.validate()  # the flags' FlagError, naming each
    largest = max(masking.vocab.replacement_ids)
    if largest >= bert_config.vocab_size:
        raise dynamic_masking.DynamicMaskingError(
            f"--vocab_file={cfg.vocab_file} has ids up to {largest} but bert_config's "
            f"vocab_size is {bert_config.vocab_size}: not the model's vocab")
    return masking


# ------------------------------------------------------------------ the task


# The pretraining task's statistics (per objective) and the masked LM's model inputs.
STAT_KEYS = ("loss", "mlm_loss", "mlm_nll_sum", "mlm_correct_sum", "mlm_weight_sum",
             "nsp_loss_sum", "nsp_correct_sum", "nsp_count")
MLM_STAT_KEYS = STAT_KEYS[:5]  # masked LM without next sentence prediction ("No NSP")
LTR_STAT_KEYS = ("loss", "lm_nll_sum", "lm_correct_sum", "lm_count")  # left-to-right LM
MODEL_INPUTS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")


def model_inputs(features):
    """The model's input dict (input_ids, input_mask, segment_ids, masked_lm_positions)."""
    return {name: features[name] for name in MODEL_INPUTS}


def build_pretraining_model(model, max_seq_length, max_predictions_per_seq):
    """Creates the model's variables with one call on a zero batch (before any tf.function)."""
    zeros = {
        "input_ids": tf.zeros([1, max_seq_length], tf.int32),
        "input_mask": tf.ones([1, max_seq_length], tf.int32),
        "segment_ids": tf.zeros([1, max_seq_length], tf.int32),
        "masked_lm_positions": tf.zeros([1, max_predictions_per_seq], tf.int32),
    }
    model(zeros, training=False)
    return model


def _perplexity(mean_nll: float) -> float:
    """exp(mean negative log-likelihood), inf where that overflows float64."""
    return math.exp(mean_nll) if mean_nll < 700 else math.inf


def _check_evaluated(totals, count_key: str) -> None:
    """Raises UserError when the totals hold no eval batch or no prediction: their figures
    would read as a perfect score (loss 0, perplexity 1) made of nothing."""
    steps, count = float(totals.get("steps", 0.0)), float(totals[count_key])
    if steps < 1 or count <= 0:
        raise UserError(f"the eval read {int(steps)} batch(es) with {count:g} predictions: "
                        "no figures to report (empty eval records, or max_eval_steps < 1)")


def eval_metrics(totals, global_step):
    """The original's eval_results.txt figures from summed statistics, plus
    `masked_lm_perplexity` (exp of the weighted mean masked-LM loss: the paper's "LM
    (ppl)", Table 6); the next-sentence figures only when the totals have them (a run
    without NSP reports none). UserError for totals of no batch or no prediction."""
    _check_evaluated(totals, "mlm_weight_sum")
    steps = float(totals["steps"])
    weight = float(totals["mlm_weight_sum"])
    masked_lm_loss = float(totals["mlm_nll_sum"]) / weight
    results = {
        "global_step": int(global_step),
        "loss": float(totals["loss"]) / steps,
        "masked_lm_accuracy": float(totals["mlm_correct_sum"]) / weight,
        "masked_lm_loss": masked_lm_loss,
        "masked_lm_perplexity": _perplexity(masked_lm_loss),
    }
    if "nsp_count" in totals:
        count = max(float(totals["nsp_count"]), 1.0)
        results.update(next_sentence_accuracy=float(totals["nsp_correct_sum"]) / count,
                       next_sentence_loss=float(totals["nsp_loss_sum"]) / count)
    return results


def next_token_eval_metrics(totals, global_step):
    """The left-to-right LM's eval_results.txt figures: mean loss over batches, and over
    every predicted token its loss, accuracy and perplexity (exp of that loss).
    UserError for totals of no batch or no prediction."""
    _check_evaluated(totals, "lm_count")
    steps = float(totals["steps"])
    count = float(totals["lm_count"])
    next_token_loss = float(totals["lm_nll_sum"]) / count
    return {"global_step": int(global_step), "loss": float(totals["loss"]) / steps,
            "next_token_accuracy": float(totals["lm_correct_sum"]) / count,
            "next_token_loss": next_token_loss,
            "next_token_perplexity": _perplexity(next_token_loss)}


class PretrainingTask(loop.Task):
    """The pretraining objectives: masked LM + next sentence (the original run_pretraining's
    loss and metrics), masked LM alone ("No NSP") or the left-to-right LM ("LTR & No NSP"),
    the paper's Table 5.

    Args:
      loss_fn: (outputs, features) -> (scalar loss, dict of the stat_keys' scalars);
        default: `losses.pretraining_loss` (masked LM), `losses.next_token_loss` (ltr).
      next_sentence_prediction: the model has the NSP head (masked LM only).
      objective: "mlm" or "ltr" (`modeling.models.OBJECTIVES`).
    """

    def __init__(self, loss_fn: Callable | None = None, *,
                 next_sentence_prediction: bool = True, objective: str = "mlm"):
        self.objective = objective
        self.next_sentence_prediction = bool(next_sentence_prediction) and objective == "mlm"
        if objective == "ltr":
            self.loss_fn = loss_fn or losses.next_token_loss
            self.stat_keys, self.mean_keys = LTR_STAT_KEYS, ("loss",)
        else:
            self.loss_fn = loss_fn or losses.pretraining_loss
            self.stat_keys = STAT_KEYS if self.next_sentence_prediction else MLM_STAT_KEYS
            self.mean_keys = ("loss", "mlm_loss")

    def model_inputs(self, features):
        if self.objective == "ltr":
            return {name: features[name] for name in loop.ENCODER_INPUTS}
        return model_inputs(features)

    def loss_and_stats(self, outputs, features):
        return self.loss_fn(outputs, features)

    def metrics_from_totals(self, totals, global_step):
        if self.objective == "ltr":
            return next_token_eval_metrics(totals, global_step)
        return eval_metrics(totals, global_step)

    def progress(self, totals):
        if self.objective == "ltr":
            return [("next_token_accuracy", "lm_acc",
                     totals["lm_correct_sum"] / max(totals["lm_count"], 1e-12))]
        figures = [("masked_lm_accuracy", "mlm_acc",
                    totals["mlm_correct_sum"] / max(totals["mlm_weight_sum"], 1e-12))]
        if self.next_sentence_prediction:
            figures.append(("next_sentence_accuracy", "nsp_acc",
                            totals["nsp_correct_sum"] / max(totals["nsp_count"], 1.0)))
        return figures

