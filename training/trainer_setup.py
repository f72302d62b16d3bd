"""Owns the set-up steps every runner shares: config and batch checks, step counts, the
model + optimizer + loop construction, checkpoint initialisation, and the model files
written beside the checkpoints (so `export_saved_model.py` needs nothing else)."""

from __future__ import annotations

import os
from typing import Callable

from absl import logging

from data_prep.cli import UserError
from modeling.export.metadata import METADATA_FILE


def check_batch(name: str, global_batch: int, replicas: int, accumulation: int = 1) -> None:
    """Raises UserError naming the flag when a global batch does not split over replicas."""
    if global_batch < 1 or global_batch % (replicas * accumulation):
        raise UserError(
            f"--{name}={global_batch} must be a positive multiple of the {replicas} replica(s)"
            + (f" x {accumulation} accumulation steps" if accumulation > 1 else ""))


def load_bert_config(bert_config_file: str, max_seq_length: int):
    """Reads bert_config.json (or a Hugging Face config.json, "gelu" then meaning its exact
    form) and checks that `max_seq_length` fits its position table."""
    import tensorflow as tf

    from modeling.config import BertConfig

    if not tf.io.gfile.exists(bert_config_file):
        raise UserError(f"--bert_config_file={bert_config_file}: no such file")
    bert_config = BertConfig.from_config_file(bert_config_file)
    if max_seq_length > bert_config.max_position_embeddings:
        raise UserError(
            f"--max_seq_length={max_seq_length}: cannot use sequence length {max_seq_length} "
            "because the BERT model was only trained up to sequence length "
            f"{bert_config.max_position_embeddings} (max_position_embeddings in "
            f"{bert_config_file})")
    return bert_config


def check_vocab_tokens(vocab_file: str, do_lower_case: bool) -> None:
    """Raises VocabError naming --vocab_file when it cannot be read or lacks a token every
    encoded input needs (`tokenization.ENCODING_TOKENS`), as the data tools refuse it, and
    naming --do_lower_case when the vocab was learned with the other casing (the
    original's runners refused that too, by Google's checkpoint names)."""
    from data_prep import tokenization

    try:
        vocab = tokenization.load_vocab(vocab_file)
        tokenization.check_vocab(vocab, vocab_file, required=tokenization.ENCODING_TOKENS)
    except tokenization.VocabError as err:
        raise tokenization.VocabError(f"--vocab_file: {err}") from None
    tokenization.check_case(vocab, vocab_file, do_lower_case)


def check_vocab_fits(vocab_file: str, bert_config, config_name: str,
                     model_vocab: str | None = None) -> None:
    """Raises VocabError naming both files and both sizes when --vocab_file is not the
    model's vocab by its size.

    More tokens than the embedding table has rows: records made with it would hold ids
    the model lacks. Fewer: accepted as the original accepts it (a table padded past its
    vocab, as NVIDIA's 30528 rows for 30522 tokens, or a config's vocab_size rounded up:
    the rows past the vocab are never read; logged), but refused when the model's own
    vocab (`model_vocab`: the vocab.txt beside its config or checkpoint) has exactly
    vocab_size tokens: a model whose vocab grew (extend_vocab.py) read with its old vocab
    would never see its new words.

    Args:
      config_name: how the message names the config, e.g. "--bert_config_file=PATH".
      model_vocab: the vocab.txt written beside the model, if any.
    """
    from data_prep import fileio, tokenization

    size = len(tokenization.load_vocab(vocab_file))
    rows = bert_config.vocab_size
    if size == rows:
        return
    if size < rows:
        own = None
        if model_vocab and os.path.isfile(model_vocab) and not fileio.same_path(
                model_vocab, vocab_file):
            own = len(tokenization.load_vocab(model_vocab))
        if own != rows:
            logging.info("--vocab_file=%s has %d tokens, %s vocab_size=%d: rows %d-%d of the "
                         "embedding table are never read", vocab_file, size, config_name,
                         rows, size, rows - 1)
            return
    raise tokenization.VocabError(
        f"--vocab_file={vocab_file} has {size} tokens but {config_name} has vocab_size="
        f"{rows}: not this model's vocab (pass the vocab.txt the model was trained with"
        + (f"; {model_vocab}, beside the model, has its {rows} tokens: a model grown by "
           "extend_vocab.py reads the vocab.txt written beside it)" if size < rows else ")"))


def finetuning_steps(num_examples: int, train_batch_size: int, num_train_epochs: float,
                     warmup_proportion: float) -> tuple[int, int]:
    """(train steps, warmup steps) as the original: examples / batch * epochs, truncated."""
    num_train_steps = int(num_examples / train_batch_size * num_train_epochs)
    return num_train_steps, int(num_train_steps * warmup_proportion)


def build_trainer(strategy, model_fn: Callable, task, *, loop_config,
                  max_seq_length: int | None = None, build_fn: Callable | None = None):
    """Builds model and optimizer under the strategy and the shared loop around them.

    Args:
      task: the loop's `training.loop.Task` (the pretraining task, a family's).
      loop_config: the run's `training.settings.LoopConfig` (its optimizer's settings too).
      build_fn: model -> None, creates the model's variables (default: one call on a zero
        batch of the encoder's inputs of `max_seq_length`,
        `training.loop.build_encoder_model`).

    Returns:
      (model, trainer): the Keras model from `model_fn()` with its variables created, and a
      `training.loop.TrainingLoop` running `task`.
    """
    from modeling import optimization
    from training import loop

    with strategy.scope():
        model = model_fn()
        if build_fn is None:
            loop.build_encoder_model(model, max_seq_length)
        else:
            build_fn(model)
        optimizer = optimization.create_optimizer(loop_config.optimizer_config())
    return model, loop.TrainingLoop(strategy, model, optimizer, loop_config, task)


def check_attention_of(init_checkpoint: str, bert_config,
                       bert_config_file: str | None = None) -> None:
    """Raises UserError when `init_checkpoint` was trained with the other attention
    direction than `bert_config` (read from `bert_config_file`, named when given): a
    left-to-right (`causal_attention`) model fine-tuned with its context opened both ways,
    or the reverse, would run silently on weights that never saw such attention. Read from
    the config beside the checkpoint: `bert_config.json` (ours, Google's layout), a Hugging
    Face `config.json` ("is_decoder") or the `run_identity.json` of a run; nothing to
    compare without any."""
    import json

    from data_prep import fileio
    from modeling.config import BertConfig, ConfigError

    directory = (init_checkpoint if fileio.isdir(init_checkpoint)
                 else fileio.parent_dir(init_checkpoint)).rstrip("/")
    readers = {"bert_config.json": lambda values, path: BertConfig.from_dict(values,
                                                                             source=path),
               "config.json": lambda values, path: BertConfig.from_hf_config(values),
               "run_identity.json": lambda values, path: BertConfig.from_dict(
                   values.get("bert_config", values), source=path)}
    saved, source = None, None
    for name, read in readers.items():
        path = f"{directory}/{name}"
        if not fileio.exists(path):
            continue
        try:
            saved = read(json.loads(fileio.read_text(path)), path).causal_attention
            source = path
            break
        except (ValueError, OSError, AttributeError, TypeError, ConfigError):
            continue  # not a config we can read: the weights' own checks still apply
    if saved is None or saved == bert_config.causal_attention:
        return
    ours = "left-to-right (causal_attention: true)" if bert_config.causal_attention \
        else "bidirectional"
    theirs = "left-to-right (causal_attention: true)" if saved else "bidirectional"
    flag = f"--bert_config_file={bert_config_file}" if bert_config_file \
        else "--bert_config_file"
    raise UserError(
        f"--init_checkpoint={init_checkpoint} is a {theirs} model ({source}) but {flag} "
        f"makes a {ours} encoder: use the config the model was trained with ({source})")


def restore_or_init(trainer, model, init_checkpoint: str | None, *, do_train: bool,
                    fresh: bool = False) -> int:
    """Resumes from the run's own checkpoint (unless `fresh`: a run done again), else loads
    `init_checkpoint` (encoder-only allowed when training; refused when its attention
    direction differs: `check_attention_of`); returns the step training starts from.

    Without `do_train` every weight must come from a checkpoint: evaluating or predicting
    with weights at their random start (no checkpoint at all, or a pretraining checkpoint
    without the task's head) is refused, naming what is missing."""
    from data_prep.cli import UserError
    from modeling import checkpoints

    missing = []

    def init_from_checkpoint():
        check_attention_of(init_checkpoint, model.config)
        report = checkpoints.load_pretrained(init_checkpoint, model, partial=True)
        logging.info("Initialised from %s: %s", init_checkpoint, report)
        missing.extend(report.missing)

    start_step = trainer.restore_or_initialize(
        init_from_checkpoint if init_checkpoint else None, fresh=fresh,
        init_checkpoint=init_checkpoint)
    if start_step == 0 and not init_checkpoint and not do_train:
        raise UserError(
            f"nothing to evaluate or predict with: no checkpoint in {trainer.config.output_dir} "
            "and no --init_checkpoint (without --do_train the weights would be random)")
    if missing and not do_train:
        listed = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more"
                                           if len(missing) > 3 else "")
        raise UserError(
            f"--init_checkpoint={init_checkpoint} has no weights for {listed} (e.g. a "
            "pretraining checkpoint, without the task's head): without --do_train they "
            "would be evaluated at their random start; pass a fine-tuned checkpoint (or "
            "its output_dir), or add --do_train")
    return start_step


MODEL_FILES = ("bert_config.json", "vocab.txt", METADATA_FILE)


def check_model_files(directory: str, bert_config, vocab_file: str, metadata) -> None:
    """Raises UserError naming the file when `directory` holds one of the `MODEL_FILES`
    that the run did not write (`training.run_files`) and that says something else than the
    one `write_model_files` would write there (the same config, vocab or metadata is
    taken as it is: e.g. output_dir holding the --vocab_file). Writes nothing."""
    import json

    from data_prep import fileio
    from modeling.config import BertConfig
    from training import run_files

    def same(name: str, path: str) -> bool:
        try:
            if name == "vocab.txt":
                return fileio.sha256(path) == fileio.sha256(vocab_file)
            if name == "bert_config.json":
                return BertConfig.from_json_file(path) == bert_config
            return json.loads(fileio.read_text(path)) == json.loads(metadata.to_json())
        except (UserError, json.JSONDecodeError, UnicodeDecodeError):  # unreadable: not ours
            return False

    for name in MODEL_FILES:
        path = os.path.join(directory, name)
        if fileio.exists(path) and not run_files.owns(directory, name) and not same(name, path):
            raise UserError(
                f"{path} exists, was not written by this run and differs from the {name} it "
                f"writes beside its checkpoints: it would be replaced. Move it out of "
                f"{directory}, or choose another output directory")


def write_model_files(directory: str, bert_config, vocab_file: str, metadata) -> None:
    """bert_config.json, vocab.txt and export_metadata.json beside the checkpoints."""
    import tensorflow as tf

    from data_prep import fileio
    from modeling.export.metadata import write_export_metadata

    tf.io.gfile.makedirs(directory)
    bert_config.to_json_file(os.path.join(directory, "bert_config.json"))
    vocab = os.path.join(directory, "vocab.txt")
    if os.path.abspath(vocab_file) != os.path.abspath(vocab):
        fileio.copy_file(vocab_file, vocab)
    write_export_metadata(directory, metadata)
