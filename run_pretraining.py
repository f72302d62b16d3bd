"""Runs BERT pretraining (masked LM + next sentence) from TFRecords under any strategy.

Same flags as Google's run_pretraining.py, plus distribution, precision and optimizer
flags (see training/flags.py and docs/pretraining.md). The runner only parses flags into
configs and calls the libraries:

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
                            if values["do_whole_word_mask"].present else None))


def run(cfg: PretrainingRun) -> dict:
    """Trains and/or evaluates; returns the eval results (empty without do_eval)."""
    strategy = setup_runtime(cfg.runtime)  # First: multi-worker needs it so.

    from training import distribution, run_dir

    bert_config = runs.load_bert_config(cfg.bert_config_file, cfg.max_seq_length)
    replicas = strategy.num_replicas_in_sync
    runs.check_batch("train_batch_size", cfg.train_batch_size, replicas,
                     cfg.loop.gradient_accumulation_steps)
    runs.check_batch("eval_batch_size", cfg.eval_batch_size, replicas)
    # One run at a time in output_dir, and only runs of this bert_config: locked and
    # compared now, taken (`commit`) once the records, the model and its weights pass.
    claimed = run_dir.claim(cfg.output_dir, {"bert_config": bert_config.to_dict()},
                            is_chief=distribution.is_chief(strategy))
    try:
        return _train_and_evaluate(cfg, strategy, bert_config, claimed)
    finally:
        claimed.release()


def _check_records(cfg: PretrainingRun, bert_config):
    """(files, masking without its seed, record lengths): every file's first record checked
    against the flags, on the host, before any work (input_pipeline.RecordFileError or
    DynamicMaskingError naming the file)."""
    from training import input_pipeline

    files = input_pipeline.list_files(cfg.input_patterns)
    masking = dynamic_masking_for(cfg, bert_config, None)
    limits = input_pipeline.id_limits(
        vocab_size=bert_config.vocab_size, type_vocab_size=bert_config.type_vocab_size,
        masking=masking, bert_config_file=cfg.bert_config_file)
    schema = input_pipeline.check_pretraining_files(
        files, cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.input_compression,
        limits=limits)
    if schema is not None:
        input_pipeline.check_record_kind(schema, masking, files[0])
    lengths = None if schema is None else input_pipeline.record_lengths(
        schema, cfg.max_seq_length, cfg.max_predictions_per_seq)
    return files, masking, limits, lengths


def _train_and_evaluate(cfg: PretrainingRun, strategy, bert_config, claimed) -> dict:
    """The run itself, in a claimed output_dir: check the records, build, restore or init,
    commit the claim, train, evaluate."""
    from modeling import checkpoints, optimization
    from modeling.models import BertPretrainer
    from training import input_pipeline, loop

    files, masking, limits, lengths = _check_records(cfg, bert_config)
    with strategy.scope():
        model = BertPretrainer(bert_config)
        loop.build_pretraining_model(model, cfg.max_seq_length, cfg.max_predictions_per_seq)
        optimizer = optimization.create_optimizer(cfg.optimizer)
    trainer = loop.PretrainingLoop(strategy, model, optimizer, cfg.loop)

    def init_from_checkpoint():
        report = checkpoints.load_pretrained(cfg.init_checkpoint, model, partial=True)
        logging.info("Initialised from %s: %s", cfg.init_checkpoint, report)

    start_step = trainer.restore_or_initialize(
        init_from_checkpoint if cfg.init_checkpoint else None)
    claimed.commit()  # every check passed: the directory is this run's

    # The seed the input was (or is now) built with: a resumed run continues its input
    # from the position saved in the checkpoint (TrainingLoop.train).
    seed = trainer.input_seed(cfg.runtime.seed)
    if masking is not None:
        masking = dataclasses.replace(masking, seed=seed)
    input_config = input_pipeline.PretrainingInputConfig(
        cfg.input_patterns, cfg.max_seq_length, cfg.max_predictions_per_seq,
        compression=cfg.input_compression, seed=seed,
        vocab_size=bert_config.vocab_size, type_vocab_size=bert_config.type_vocab_size,
        masking=masking)

    def dataset_fn(batch_size, is_training):
        def make(input_context):
            return input_pipeline.pretraining_dataset(
                input_config, batch_size=input_context.get_per_replica_batch_size(batch_size),
                is_training=is_training, input_context=input_context, check=False)
        return make

    logging.info("%d input file(s), first %s%s; training from step %d to %d", len(files),
                 files[0], " (unmasked: dynamic masking)" if masking else "", start_step,
                 cfg.loop.num_train_steps)
    results = {}
    with input_pipeline.naming_bad_records(cfg.input_patterns, cfg.input_compression,
                                           limits=limits, lengths=lengths):
        if cfg.do_train:
            trainer.train(dataset_fn(cfg.train_batch_size, True),
                          input_identity=input_pipeline.pretraining_input_identity(
                              input_config, cfg.train_batch_size))
        if cfg.do_eval:
            results = trainer.evaluate(dataset_fn(cfg.eval_batch_size, False))
        for key in sorted(results):
            logging.info("  %s = %s", key, results[key])
    return results


def dynamic_masking_for(cfg: PretrainingRun, bert_config, seed):
    """The on-the-fly masking of unmasked records from the flags (None without
    --vocab_file); DynamicMaskingError names the flag that does not fit."""
    from training import dynamic_masking

    if cfg.vocab_file is None:
        given = [f"--{name}" for name in ("masked_lm_prob", "do_whole_word_mask")
                 if getattr(cfg, name) is not None]
        if given:
            raise dynamic_masking.DynamicMaskingError(
                f"{', '.join(given)}: only for unmasked records (create_pretraining_data "
                "--dynamic_masking), which also need --vocab_file")
        return None
    masking = dynamic_masking.DynamicMasking.from_vocab_file(
        cfg.vocab_file, max_predictions_per_seq=cfg.max_predictions_per_seq,
        masked_lm_prob=0.15 if cfg.masked_lm_prob is None else cfg.masked_lm_prob,
        do_whole_word_mask=bool(cfg.do_whole_word_mask), seed=seed)
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
