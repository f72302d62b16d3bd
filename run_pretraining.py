"""Runs BERT pretraining (masked LM + next sentence) from TFRecords under any strategy.

Same flags as Google's run_pretraining.py, plus distribution, precision and optimizer
flags (see training/flags.py and docs/pretraining.md), the paper's studies (Table 5's
objectives: `--next_sentence_prediction=false`, `--objective=ltr`; Table 8's masking split
with dynamic masking: `--mask_token_rate`, `--random_token_rate`) and its two-phase
schedule (Appendix A.2: `--phase2_input_file`, 90% of the steps at `--max_seq_length`, the
rest at `--phase2_max_seq_length`, one run). The runner only parses flags into configs and
calls the libraries:

    python run_pretraining.py --input_file=out/*.tfrecord --output_dir=/tmp/pretrain \\
      --bert_config_file=bert_config.json --do_train --do_eval --train_batch_size=32 \\
      --max_seq_length=128 --max_predictions_per_seq=20 --num_train_steps=10000 \\
      --num_warmup_steps=1000 --learning_rate=1e-4
"""

from __future__ import annotations

import dataclasses

from absl import app, flags, logging

from training import cli
from training import flags as common_flags
from training import runs
from training.runtime import RuntimeConfig, setup_runtime

FLAGS = flags.FLAGS

common_flags.define_common_flags()
_define = common_flags.define_once
_define(flags.DEFINE_string, "input_file", None,
        "Input TF example files (can be a glob or comma separated).")
_define(flags.DEFINE_integer, "max_predictions_per_seq", 20,
        "Maximum number of masked LM predictions per sequence. Must match data generation.")
_define(flags.DEFINE_integer, "num_train_steps", 100000, "Number of training steps.")
_define(flags.DEFINE_integer, "num_warmup_steps", 10000, "Number of warmup steps.")
_define(flags.DEFINE_integer, "max_eval_steps", 100, "Maximum number of eval steps.")
_define(flags.DEFINE_string, "input_compression", "auto",
        "TFRecord compression: auto (GZIP for *.gz / *.gzip), GZIP, ZLIB or NONE.")
# Dynamic masking: only for unmasked records (create_pretraining_data --dynamic_masking),
# which are masked in the input pipeline with a fresh mask each epoch.
_define(flags.DEFINE_string, "vocab_file", None,
        "Unmasked records only: the vocab they were made with ([MASK], the random "
        "replacements, ## pieces). Required for them, refused for masked records.")
_define(flags.DEFINE_float, "masked_lm_prob", 0.15,
        "Unmasked records only: masked LM probability (as create_pretraining_data's).")
_define(flags.DEFINE_bool, "do_whole_word_mask", False,
        "Unmasked records only: mask all WordPieces of a word together.")
_define(flags.DEFINE_float, "mask_token_rate", 0.8,
        "Unmasked records only: of the positions chosen for prediction, the share shown as "
        "[MASK] (keras-hub's name; the paper's Table 8 'MASK').")
_define(flags.DEFINE_float, "random_token_rate", 0.1,
        "Unmasked records only: of the positions chosen for prediction, the share shown as "
        "a random vocabulary entry (Table 8 'RND'); the rest keep their token ('SAME').")
# The objectives of the paper's Table 5.
_define(flags.DEFINE_bool, "next_sentence_prediction", True,
        "False: the masked LM alone (the paper's 'No NSP'): no next-sentence head, loss or "
        "figures; the records' next_sentence_labels are not read.")
_define(flags.DEFINE_enum, "objective", "mlm", ["mlm", "ltr"],
        "mlm: the masked LM. ltr: a left-to-right LM (the paper's 'LTR & No NSP'): a causal "
        "encoder (written as causal_attention in output_dir/bert_config.json, which "
        "fine-tuning and export then read) predicting every next token of unmasked records "
        "(create_pretraining_data --next_sentence_prediction=false --dynamic_masking), no NSP.")
# The two-phase schedule of the paper's Appendix A.2, as one run.
_define(flags.DEFINE_string, "phase2_input_file", None,
        "Two phases in one run: after --phase1_steps steps on --input_file, train to "
        "--num_train_steps on these records (globs, comma separated) at "
        "--phase2_max_seq_length, keeping the weights, optimizer state and step.")
_define(flags.DEFINE_integer, "phase1_steps", None,
        "With --phase2_input_file: steps of phase 1 (default: 90%% of --num_train_steps, the "
        "paper's split).")
_define(flags.DEFINE_integer, "phase2_max_seq_length", 512,
        "With --phase2_input_file: the phase-2 records' max_seq_length.")
_define(flags.DEFINE_integer, "phase2_max_predictions_per_seq", 80,
        "With --phase2_input_file: the phase-2 records' max_predictions_per_seq.")
_define(flags.DEFINE_integer, "phase2_train_batch_size", None,
        "With --phase2_input_file: the global batch of phase 2 (default: --train_batch_size).")

# The flags that only mean something with --phase2_input_file.
_PHASE2_FLAGS = ("phase1_steps", "phase2_max_seq_length", "phase2_max_predictions_per_seq",
                 "phase2_train_batch_size")
# The flags of on-the-fly masking (unmasked records read by the masked LM).
_MASKING_FLAGS = ("vocab_file", "masked_lm_prob", "do_whole_word_mask", "mask_token_rate",
                  "random_token_rate")


@dataclasses.dataclass(frozen=True)
class Phase2:
    """The second phase of a two-phase run (the paper's Appendix A.2): from step
    `start_step` to num_train_steps on other records, longer ones."""

    input_patterns: tuple
    start_step: int
    max_seq_length: int
    max_predictions_per_seq: int
    train_batch_size: int


@dataclasses.dataclass(frozen=True)
class PretrainingRun:
    """Everything one pretraining run needs, read from flags once."""

    bert_config_file: str
    input_patterns: tuple
    output_dir: str
    init_checkpoint: str | None
    max_seq_length: int
    max_predictions_per_seq: int
    do_train: bool
    do_eval: bool
    train_batch_size: int
    eval_batch_size: int
    input_compression: str
    runtime: RuntimeConfig
    optimizer: "object"
    loop: "object"
    # Dynamic masking (unmasked records): None where the flag was not given.
    vocab_file: str | None = None
    masked_lm_prob: float | None = None
    do_whole_word_mask: bool | None = None
    mask_token_rate: float | None = None
    random_token_rate: float | None = None
    # The objective (the paper's Table 5) and the optional second phase (Appendix A.2).
    next_sentence_prediction: bool = True
    objective: str = "mlm"
    phase2: Phase2 | None = None


def run_config_from_flags(values=FLAGS) -> PretrainingRun:
    """Validates the flags and turns them into a `PretrainingRun`."""
    from modeling.optimization import OptimizerConfig
    from training.input_pipeline import split_patterns
    from training.loop import LoopConfig

    common_flags.refuse_grids(values, ("learning_rate", "train_batch_size"), "run_pretraining.py")
    if not values.do_train and not values.do_eval:
        raise ValueError("At least one of `do_train` or `do_eval` must be True.")
    for name in ("bert_config_file", "input_file", "output_dir"):
        if not getattr(values, name):
            raise ValueError(f"--{name} is required")
    if values.gradient_accumulation_steps < 1:
        raise ValueError("--gradient_accumulation_steps must be >= 1, found "
                         f"{values.gradient_accumulation_steps}")
    if values.do_train and values.num_train_steps < 1:
        raise ValueError(f"--num_train_steps={values.num_train_steps}: --do_train needs at "
                         "least one step")
    objective, next_sentence_prediction = _objective_from_flags(values)
    phase2 = _phase2_from_flags(values)
    # Building it checks --learning_rate and the other optimizer flags (ValueError).
    optimizer = OptimizerConfig(
        learning_rate=values.learning_rate, num_train_steps=values.num_train_steps,
        num_warmup_steps=values.num_warmup_steps, optimizer=values.optimizer,
        weight_decay_rate=values.weight_decay_rate, clip_norm=values.clip_norm)
    loop = LoopConfig(
        output_dir=values.output_dir, num_train_steps=values.num_train_steps,
        train_batch_size=values.train_batch_size, eval_batch_size=values.eval_batch_size,
        iterations_per_loop=max(1, values.iterations_per_loop),
        save_checkpoints_steps=max(1, values.save_checkpoints_steps),
        log_steps=max(1, values.log_steps), max_eval_steps=values.max_eval_steps,
        gradient_accumulation_steps=values.gradient_accumulation_steps, dtype=values.dtype,
        jit_compile=values.jit_compile, keep_checkpoint_max=values.keep_checkpoint_max)
    return PretrainingRun(
        bert_config_file=values.bert_config_file,
        input_patterns=split_patterns(values.input_file), output_dir=values.output_dir,
        init_checkpoint=values.init_checkpoint, max_seq_length=values.max_seq_length,
        max_predictions_per_seq=values.max_predictions_per_seq, do_train=values.do_train,
        do_eval=values.do_eval, train_batch_size=values.train_batch_size,
        eval_batch_size=values.eval_batch_size, input_compression=values.input_compression,
        runtime=common_flags.runtime_config(values), optimizer=optimizer, loop=loop,
        vocab_file=values.vocab_file or None,
        masked_lm_prob=values.masked_lm_prob if values["masked_lm_prob"].present else None,
        do_whole_word_mask=(values.do_whole_word_mask
                            if values["do_whole_word_mask"].present else None),
        mask_token_rate=values.mask_token_rate if values["mask_token_rate"].present else None,
        random_token_rate=(values.random_token_rate
                           if values["random_token_rate"].present else None),
        next_sentence_prediction=next_sentence_prediction, objective=objective,
        phase2=phase2)


def _objective_from_flags(values) -> tuple:
    """(objective, next_sentence_prediction), refusing combinations that cannot be meant:
    NSP with the left-to-right LM, masking flags with it (it masks nothing), bad rates."""
    from data_prep.pretraining_data.config import check_token_rates

    objective = values.objective
    nsp = values.next_sentence_prediction
    if objective == "ltr":
        if values["next_sentence_prediction"].present and nsp:
            raise ValueError("--objective=ltr has no next sentence prediction (the paper's "
                             "'LTR & No NSP'): drop --next_sentence_prediction=true")
        given = [f"--{name}" for name in _MASKING_FLAGS if values[name].present]
        if given:
            raise ValueError(f"{', '.join(given)}: --objective=ltr masks nothing (it predicts "
                             "every next token); these flags are for the masked LM")
        nsp = False
    check_token_rates(values.mask_token_rate, values.random_token_rate)
    return objective, bool(nsp)


def _phase2_from_flags(values) -> Phase2 | None:
    """The second phase from the --phase2_* flags (None without --phase2_input_file, whose
    companions are then refused): phase 1 is 90% of the steps unless --phase1_steps."""
    from training.input_pipeline import split_patterns

    if not values.phase2_input_file:
        given = [f"--{name}" for name in _PHASE2_FLAGS if values[name].present]
        if given:
            raise ValueError(f"{', '.join(given)}: only with --phase2_input_file (a two-phase "
                             "run)")
        return None
    start = (values.phase1_steps if values.phase1_steps is not None
             else int(0.9 * values.num_train_steps))
    if not 1 <= start < values.num_train_steps:
        raise ValueError(f"--phase1_steps={start} must be at least 1 and below "
                         f"--num_train_steps={values.num_train_steps} (phase 2 has the rest)")
    batch = (values.phase2_train_batch_size if values.phase2_train_batch_size is not None
             else values.train_batch_size)
    for name, value in (("phase2_max_seq_length", values.phase2_max_seq_length),
                        ("phase2_max_predictions_per_seq", values.phase2_max_predictions_per_seq),
                        ("phase2_train_batch_size", batch)):
        if value < 1:
            raise ValueError(f"--{name}={value} must be positive")
    return Phase2(split_patterns(values.phase2_input_file), start,
                  values.phase2_max_seq_length, values.phase2_max_predictions_per_seq, batch)


def run(cfg: PretrainingRun) -> dict:
    """Trains and/or evaluates; returns the eval results (empty without do_eval)."""
    strategy = setup_runtime(cfg.runtime)  # First: multi-worker needs it so.

    from training import distribution, run_dir

    bert_config = model_config(cfg)
    replicas = strategy.num_replicas_in_sync
    runs.check_batch("train_batch_size", cfg.train_batch_size, replicas,
                     cfg.loop.gradient_accumulation_steps)
    runs.check_batch("eval_batch_size", cfg.eval_batch_size, replicas)
    if cfg.phase2 is not None:
        runs.check_batch("phase2_train_batch_size", cfg.phase2.train_batch_size, replicas,
                         cfg.loop.gradient_accumulation_steps)
    # One run at a time in output_dir, and only runs of this model: locked and compared
    # now, taken (`commit`) once the records, the model and its weights pass.
    claimed = run_dir.claim(cfg.output_dir, run_identity(cfg, bert_config),
                            is_chief=distribution.is_chief(strategy))
    try:
        return _train_and_evaluate(cfg, strategy, bert_config, claimed)
    finally:
        claimed.release()


def model_config(cfg: PretrainingRun):
    """The BertConfig the run trains: --bert_config_file's, made causal for
    --objective=ltr; ValueError naming the flags when a sequence length does not fit its
    position table or a causal config is given to the masked LM."""
    bert_config = runs.load_bert_config(cfg.bert_config_file, cfg.max_seq_length)
    if cfg.phase2 is not None and (cfg.phase2.max_seq_length
                                   > bert_config.max_position_embeddings):
        raise ValueError(
            f"--phase2_max_seq_length={cfg.phase2.max_seq_length} is longer than "
            f"max_position_embeddings={bert_config.max_position_embeddings} of "
            f"--bert_config_file={cfg.bert_config_file}")
    if cfg.objective == "ltr":
        return dataclasses.replace(bert_config, causal_attention=True)
    if bert_config.causal_attention:
        raise ValueError(
            f"--bert_config_file={cfg.bert_config_file} has causal_attention: true (a "
            "left-to-right model) but --objective=mlm: the masked LM reads both sides of a "
            "masked token; use --objective=ltr, or a config without causal_attention")
    return bert_config


def run_identity(cfg: PretrainingRun, bert_config) -> dict:
    """What the checkpoints in output_dir are (`training.run_dir`): the model's config,
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


def _phase_inputs(cfg: PretrainingRun, bert_config):
    """([_PhaseInput] of each phase, masking without its seed): every file's first record
    checked against the flags, on the host, before any work (input_pipeline.RecordFileError,
    DynamicMaskingError or ValueError naming the file), and the records' summaries against
    the objective."""
    from training import input_pipeline

    masking = dynamic_masking_for(cfg, bert_config, None)
    limits = input_pipeline.id_limits(
        vocab_size=bert_config.vocab_size, type_vocab_size=bert_config.type_vocab_size,
        masking=masking, bert_config_file=cfg.bert_config_file)
    phases = [("--input_file", cfg.input_patterns, cfg.max_seq_length,
               cfg.max_predictions_per_seq, cfg.train_batch_size)]
    if cfg.phase2 is not None:
        p = cfg.phase2
        phases.append(("--phase2_input_file", p.input_patterns, p.max_seq_length,
                       p.max_predictions_per_seq, p.train_batch_size))
    checked = []
    for flag, patterns, seq, preds, batch in phases:
        files = input_pipeline.list_files(patterns)
        schema = input_pipeline.check_pretraining_files(
            files, seq, preds, cfg.input_compression, limits=limits)
        if schema is not None:
            input_pipeline.check_record_kind(schema, masking, files[0],
                                             read_unmasked=cfg.objective == "ltr")
        check_made_for_objective(cfg, flag, files)
        lengths = None if schema is None else input_pipeline.record_lengths(schema, seq, preds)
        checked.append(_PhaseInput(flag, patterns, seq, preds, batch, files, limits, lengths))
    return checked, masking


def check_made_for_objective(cfg: PretrainingRun, flag: str, files) -> None:
    """Refuses records whose create_pretraining_data summary says they cannot teach the
    objective: next sentence prediction from records without random next sentences
    (--next_sentence_prediction=false: every label 0), and the left-to-right LM across
    the random B of next-sentence pairs. Records without a summary are not judged."""
    from training import input_pipeline

    for path, summary in input_pipeline.record_summaries(files).items():
        config = summary.get("config") or {}
        pairs = config.get("next_sentence_prediction", True) is not False
        if cfg.next_sentence_prediction and not pairs:
            raise ValueError(
                f"{path}: the records of {flag} were made with --next_sentence_prediction="
                "false (B always follows A, every next_sentence_labels 0): next sentence "
                "prediction cannot be learnt from them; pass --next_sentence_prediction=false "
                "(the masked LM alone) or records with next-sentence pairs")
        if cfg.objective == "ltr" and pairs:
            raise ValueError(
                f"{path}: the records of {flag} are next-sentence pairs (B is a random "
                "document's text half the time): --objective=ltr reads contiguous text; make "
                "its records with create_pretraining_data --next_sentence_prediction=false "
                "--dynamic_masking")


def _train_and_evaluate(cfg: PretrainingRun, strategy, bert_config, claimed) -> dict:
    """The run itself, in a claimed output_dir: check the records, build, restore or init,
    commit the claim, train (phase by phase), evaluate."""
    import os

    from modeling import checkpoints, optimization
    from modeling.models import BertPretrainer
    from training import distribution, input_pipeline, loop

    phases, masking = _phase_inputs(cfg, bert_config)
    objective = {"next_sentence_prediction": cfg.next_sentence_prediction,
                 "objective": cfg.objective}
    with strategy.scope():
        model = BertPretrainer(bert_config, **objective)
        loop.build_pretraining_model(model, cfg.max_seq_length, cfg.max_predictions_per_seq)
        optimizer = optimization.create_optimizer(cfg.optimizer)
    trainer = loop.PretrainingLoop(strategy, model, optimizer, cfg.loop, **objective)

    def init_from_checkpoint():
        runs.check_attention_of(cfg.init_checkpoint, bert_config)
        report = checkpoints.load_pretrained(cfg.init_checkpoint, model, partial=True)
        logging.info("Initialised from %s: %s", cfg.init_checkpoint, report)

    start_step = trainer.restore_or_initialize(
        init_from_checkpoint if cfg.init_checkpoint else None)
    claimed.commit()  # every check passed: the directory is this run's
    if cfg.objective == "ltr" and distribution.is_chief(strategy):
        # The left-to-right encoder's config beside its checkpoints: fine-tuning and export
        # read it there (causal_attention), as they must to keep the left-only context.
        path = os.path.join(cfg.output_dir, "bert_config.json")
        bert_config.to_json_file(path)
        logging.info("Wrote %s (causal_attention: true): fine-tune this model with "
                     "--bert_config_file=%s", path, path)

    # The seed the input was (or is now) built with: a resumed run continues its input
    # from the position saved in the checkpoint (TrainingLoop.train).
    seed = trainer.input_seed(cfg.runtime.seed)
    if masking is not None:
        masking = dataclasses.replace(masking, seed=seed)

    def input_config(phase):
        return input_pipeline.PretrainingInputConfig(
            phase.patterns, phase.max_seq_length, phase.max_predictions_per_seq,
            compression=cfg.input_compression, seed=seed,
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
        return input_pipeline.naming_bad_records(phase.patterns, cfg.input_compression,
                                                 limits=phase.limits, lengths=phase.lengths)

    ends = [cfg.phase2.start_step] if cfg.phase2 is not None else []
    logging.info("%d input file(s), first %s%s; training from step %d to %d%s",
                 len(phases[0].files), phases[0].files[0],
                 " (unmasked: dynamic masking)" if masking else "", start_step,
                 cfg.loop.num_train_steps,
                 f" (phase 2 from step {ends[0]} on {phases[1].files[0]} and "
                 f"{len(phases[1].files) - 1} more)" if ends else "")
    if cfg.do_train:
        previous = None
        for phase, end in zip(phases, ends + [None]):
            config = input_config(phase)
            identity = input_pipeline.pretraining_input_identity(config,
                                                                 phase.train_batch_size)
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
        given = [f"--{name}" for name in _MASKING_FLAGS[1:] if getattr(cfg, name) is not None]
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
    try:
        masking.validate()
    except ValueError as err:
        raise dynamic_masking.DynamicMaskingError(str(err)) from None
    largest = max(masking.vocab.replacement_ids)
    if largest >= bert_config.vocab_size:
        raise dynamic_masking.DynamicMaskingError(
            f"--vocab_file={cfg.vocab_file} has ids up to {largest} but bert_config's "
            f"vocab_size is {bert_config.vocab_size}: not the model's vocab")
    return masking


def main(argv):
    del argv
    cli.run_cli(lambda: run(run_config_from_flags(FLAGS)), "run_pretraining.py")


if __name__ == "__main__":
    app.run(main)
