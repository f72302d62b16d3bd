"""export_saved_model.py: a fine-tuned classifier, a SQuAD model or the bare encoder as a
serving SavedModel that takes raw strings and tokenizes in-graph (tensorflow-text), or an
encoder as a TF Hub encoder + preprocessor pair (--model_type=hub).

    python export_saved_model.py --model_type=classifier --init_checkpoint=runs/mrpc \
        --export_dir=export/mrpc
    python export_saved_model.py --model_type=classifier --init_checkpoint=runs/mrpc \
        --bert_config_file=bert_config.json --vocab_file=vocab.txt --do_lower_case=true \
        --label_list=0,1 --text_pair --max_seq_length=128 --export_dir=export/mrpc
    python export_saved_model.py --model_type=encoder \
        --init_checkpoint=uncased_L-12_H-768_A-12 --export_dir=export/encoder
    python export_saved_model.py --model_type=hub --init_checkpoint=uncased_L-12_H-768_A-12 \
        --bert_config_file=bert_config.json --vocab_file=vocab.txt --do_lower_case=true \
        --export_dir=export/hub          # -> export/hub/encoder, export/hub/preprocessor
    python export_saved_model.py --model_type=embedding \
        --init_checkpoint=all-MiniLM-L6-v2 --export_dir=export/minilm

Settings come from explicit flags first, then from ``export_metadata.json`` beside the
checkpoint (written by the fine-tuning runner; ``--metadata_file`` points elsewhere) or
a sentence-transformers checkpoint's modules (every flag overriding one of them is
logged), then from the defaults. The config and vocab default to the files beside the
checkpoint. See docs/export.md for the signatures.
"""

from __future__ import annotations

import os

from absl import flags

from data_prep import cli
from data_prep.cli import FlagError

FLAGS = flags.FLAGS


def define_flags():
    """The common flags, then every registered family's own (``FamilyFlag`` specs)."""
    import tasks

    model_types = tasks.register_serving_families()
    flags.DEFINE_enum("model_type", "classifier", list(model_types),
                      "What to export: a fine-tuned BertClassifier, a SQuAD BertSpanLabeler, "
                      "a multiple-choice model, a token tagger, the bare encoder, or a TF Hub "
                      "encoder + preprocessor (hub): the registered serving families.")
    flags.DEFINE_string("init_checkpoint", None, "The trained model: our checkpoint (prefix or "
                        "output_dir), a TF1 checkpoint, or a Hugging Face directory.")
    flags.DEFINE_string("export_dir", None, "Directory of the SavedModel (written atomically).")
    flags.DEFINE_string("bert_config_file", None, "bert_config.json; default: the one beside "
                        "--init_checkpoint.")
    flags.DEFINE_string("vocab_file", None, "vocab.txt; default: the one beside "
                        "--init_checkpoint.")
    flags.DEFINE_bool("do_lower_case", None, "Tokenizer casing; default: the metadata's, "
                      "else true.")
    flags.DEFINE_integer("max_seq_length", None, "Padded sequence length (hub: the "
                         "preprocessor's default seq_length); default: the metadata's, else "
                         "128 (384 for squad).")
    flags.DEFINE_string("metadata_file", None, "export_metadata.json; default: the one "
                        "beside --init_checkpoint if present.")
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype of the "
                      "trained model (bfloat16: mixed_bfloat16; outputs stay float32).")
    flags.DEFINE_bool("overwrite", False, "Replace an existing --export_dir, only if it is an "
                      "export this project wrote (never a directory with other content, "
                      "never an input's directory).")
    for spec, helps in family_flags().values():
        # "squad: <its help> tagger: <its help>" (families with the same text share it).
        by_text = {}
        for model_type, text in helps.items():
            by_text.setdefault(text, []).append(model_type)
        getattr(flags, f"DEFINE_{spec.kind}")(spec.name, spec.default, " ".join(
            f"{', '.join(names)}: {text}" for text, names in by_text.items()))


def family_flags() -> dict:
    """{flag name: (its FamilyFlag, {model type declaring it: its help})} over the
    registered families; a flag declared by several families must be declared alike."""
    found = {}
    for model_type in _model_types():
        for spec in _family(model_type).flags:
            known, helps = found.setdefault(spec.name, (spec, {}))
            if (known.kind, known.default) != (spec.kind, spec.default):
                raise ValueError(f"--{spec.name}: {model_type} declares it as {spec.kind} "
                                 f"(default {spec.default!r}), {next(iter(helps))} as "
                                 f"{known.kind} (default {known.default!r})")
            helps[model_type] = spec.help
    return found


def _check_family_flags(family) -> None:
    """A flag of other families, given for this one, would be parsed and ignored: refused."""
    own = {spec.name for spec in family.flags}
    for name, (_, families) in family_flags().items():
        if FLAGS[name].present and name not in own:
            raise FlagError(f"--{name} does not apply to --model_type={family.model_type} "
                            f"(it is for: {', '.join(sorted(families))})")


def _model_types():
    from modeling.export.registry import model_types

    return model_types()


def _family(model_type):
    from modeling.export.registry import get_family

    return get_family(model_type)


def _checkpoint_dir(path: str) -> str:
    import tensorflow as tf

    return path if tf.io.gfile.isdir(path) else os.path.dirname(path)


def _metadata(ckpt_dir: str, family):
    import tensorflow as tf

    from modeling.export import registry
    from modeling.export.metadata import METADATA_FILE, ExportError

    path = FLAGS.metadata_file or os.path.join(ckpt_dir, METADATA_FILE)
    if FLAGS.metadata_file and not tf.io.gfile.exists(path):
        raise FlagError(f"--metadata_file={path}: no such file")
    if not tf.io.gfile.exists(path):
        return _sentence_transformers_metadata(family)
    try:
        # Refuses the metadata of another family's run (a SWAG run as a classifier, ...).
        return registry.read_run_metadata(path, family)
    except ExportError as err:
        raise FlagError(str(err)) from None


def _sentence_transformers_metadata(family):
    """A sentence-transformers --init_checkpoint's settings as its run metadata (None for
    another checkpoint), every flag given that overrides one of them logged."""
    from absl import logging

    from modeling.checkpoints import sentence_transformers
    from tasks.feature_extraction.export import MODEL_TYPE, run_metadata

    if not sentence_transformers.is_sentence_transformers(FLAGS.init_checkpoint):
        return None
    model = sentence_transformers.read(FLAGS.init_checkpoint)
    if family.model_type != MODEL_TYPE and not family.exports_any_run:
        raise FlagError(f"--init_checkpoint={FLAGS.init_checkpoint} is a sentence-transformers "
                        f"model (an encoder and its pooling), but --model_type="
                        f"{family.model_type} was asked, which exports "
                        f"{family.weights_description}: export it with --model_type="
                        f"{MODEL_TYPE}")
    names = ["max_seq_length", "do_lower_case", "vocab_file", "bert_config_file"] + [
        spec.name for spec in family.flags]
    for message in model.overrides({name: FLAGS[name].value for name in names
                                    if FLAGS[name].present}):
        logging.warning("%s", message)
    return run_metadata(model)


def build_serving_config(ckpt_dir: str):
    """Flags + metadata -> (the family's ServingConfig, BertConfig); raises FlagError
    before heavy work."""
    import tensorflow as tf

    from modeling import checkpoints
    from modeling.export.metadata import ExportError
    from modeling.config import BertConfig
    from training import trainer_setup

    family = _family(FLAGS.model_type)
    meta = _metadata(ckpt_dir, family)
    if FLAGS.max_seq_length is not None:
        max_seq_length = FLAGS.max_seq_length
    elif meta is not None and family.max_seq_length_from_run:
        max_seq_length = meta.max_seq_length
    else:
        max_seq_length = family.default_max_seq_length
    # The family's settings: its flags given, then the run's metadata, then its defaults.
    given = {spec.name: FLAGS[spec.name].value for spec in family.flags
             if FLAGS[spec.name].present}
    try:
        settings = family.settings(given, meta, max_seq_length)
    except ExportError as err:
        raise FlagError(str(err)) from None
    vocab_file = (FLAGS.vocab_file or checkpoints.vocab_for(FLAGS.init_checkpoint)
                  or os.path.join(ckpt_dir, "vocab.txt"))
    if not tf.io.gfile.exists(vocab_file):
        raise FlagError(f"--vocab_file: {vocab_file} does not exist"
                        + ("" if FLAGS.vocab_file else " (no vocab.txt beside the checkpoint)"))
    if FLAGS.bert_config_file:
        if not tf.io.gfile.exists(FLAGS.bert_config_file):
            raise FlagError(f"--bert_config_file: {FLAGS.bert_config_file} does not exist")
        config = BertConfig.from_config_file(FLAGS.bert_config_file)  # or HF config.json
        # A left-to-right model exported with attention both ways would serve silently.
        trainer_setup.check_attention_of(FLAGS.init_checkpoint, config, FLAGS.bert_config_file)
    else:
        config = checkpoints.config_for(FLAGS.init_checkpoint)
        if config is None:
            raise FlagError("--bert_config_file is required: no bert_config.json / "
                            f"config.json beside {FLAGS.init_checkpoint}")
    # A grown model served with its old vocab would never see its new words (VocabError,
    # bad input; anything else raised here is a defect and keeps its traceback).
    trainer_setup.check_vocab_fits(
        vocab_file, config, f"--bert_config_file={FLAGS.bert_config_file}"
        if FLAGS.bert_config_file else f"the config beside {FLAGS.init_checkpoint}",
        checkpoints.vocab_for(FLAGS.init_checkpoint))
    do_lower_case = FLAGS.do_lower_case
    if do_lower_case is None:
        do_lower_case = meta.do_lower_case if meta is not None else True
    # Served with the other casing, the model would see other tokens than it learned.
    trainer_setup.check_vocab_tokens(vocab_file, do_lower_case)
    try:
        serving = family.config_class(
            vocab_file=vocab_file, do_lower_case=do_lower_case, max_seq_length=max_seq_length,
            task=(meta.task if meta else ""), **settings)
    except ExportError as err:
        raise FlagError(str(err)) from None
    return serving, config


def build_model(serving, config, dtype: str):
    policy = "mixed_bfloat16" if dtype == "bfloat16" else "float32"
    return _family(serving.model_type).build_model(serving, config, policy)


def load_weights(model, path: str, model_type: str) -> None:
    """Loads what the model needs; a missing weight or a head of another size is an error."""
    from modeling import checkpoints

    try:
        # partial: a pretraining checkpoint exported as an encoder has extra heads.
        report = checkpoints.load_pretrained(path, model, partial=True)
    except checkpoints.CheckpointError as err:
        hint = _family(model_type).weights_hint(str(err))
        raise FlagError(f"--init_checkpoint={path}: {err}{hint}") from None
    if report.missing:
        what = _family(model_type).weights_description
        raise FlagError(f"--init_checkpoint={path} lacks weights of {what}: "
                        f"{report.missing[:8]}{' ...' if len(report.missing) > 8 else ''}")


def _inputs(location: str) -> list:
    """(flag, path) of everything the export reads: never to be replaced by it."""
    inputs = [("--init_checkpoint", FLAGS.init_checkpoint),
              ("--init_checkpoint", location)]
    for flag in ("vocab_file", "bert_config_file", "metadata_file"):
        if FLAGS[flag].value:
            inputs.append((f"--{flag}", FLAGS[flag].value))
    return inputs


def run() -> str:
    """The export described by FLAGS; returns the export directory."""
    if not FLAGS.init_checkpoint:
        raise FlagError("--init_checkpoint is required")
    if not FLAGS.export_dir:
        raise FlagError("--export_dir is required")
    from modeling import checkpoints
    from modeling.export import writer

    _check_family_flags(_family(FLAGS.model_type))
    try:
        _, location = checkpoints.resolve(FLAGS.init_checkpoint)
    except (checkpoints.CheckpointError, OSError) as err:
        raise FlagError(f"--init_checkpoint: {err}") from None
    ckpt_dir = _checkpoint_dir(FLAGS.init_checkpoint)
    serving, config = build_serving_config(ckpt_dir)
    inputs = _inputs(location)
    # Before any work: refuse an export_dir that would replace an input or foreign data.
    writer.check_export_dir(os.path.abspath(FLAGS.export_dir) if "://" not in FLAGS.export_dir
                            else FLAGS.export_dir, overwrite=FLAGS.overwrite,
                            inputs=[*inputs, ("--vocab_file", serving.vocab_file)])
    model = build_model(serving, config, FLAGS.dtype)
    load_weights(model, FLAGS.init_checkpoint, serving.model_type)
    out = writer.export_saved_model(model, serving, FLAGS.export_dir,
                                    overwrite=FLAGS.overwrite, inputs=inputs)
    labels = getattr(serving, "labels", ())
    print(f"exported {serving.model_type} ({FLAGS.dtype}, max_seq_length="
          f"{serving.max_seq_length}, do_lower_case={serving.do_lower_case}"
          + (f", labels={list(labels)}" if labels else "")
          + (", text_pair" if getattr(serving, "text_pair", False) else "")
          + "".join(f", {name}={getattr(serving, name)}" for name in ("pooling", "normalize")
                    if hasattr(serving, name)) + f") to {out}")
    return out


def main(argv):
    del argv
    # SIGTERM/SIGHUP unwind like Ctrl-C: the temporary export is removed, the previous
    # export (if any) stays.
    return cli.run_main(run, "export_saved_model.py")


if __name__ == "__main__":
    define_flags()
    cli.start(main, "export_saved_model.py")
