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

Settings come from explicit flags first, then from ``export_metadata.json`` beside the
checkpoint (written by the fine-tuning runner; ``--metadata_file`` points elsewhere), then
from the defaults. The config and vocab default to the files beside the checkpoint. See
docs/export.md for the signatures.
"""

from __future__ import annotations

import os

from absl import app, flags

FLAGS = flags.FLAGS


def define_flags():
    from modeling.export import MODEL_TYPES

    flags.DEFINE_enum("model_type", "classifier", list(MODEL_TYPES),
                      "What to export: a fine-tuned BertClassifier, a SQuAD BertSpanLabeler, "
                      "the bare encoder, or a TF Hub encoder + preprocessor (hub); the "
                      "families registered in modeling.export.SERVING_FAMILIES.")
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
    flags.DEFINE_list("label_list", None, "Classifier label names in id order (comma "
                      "separated); default: the metadata's labels.")
    flags.DEFINE_integer("num_labels", None, "Classifier outputs; checked against the label "
                         "list. Without a label list, labels are named '0'..'n-1'.")
    flags.DEFINE_bool("is_regression", None, "Classifier with one float output (score).")
    flags.DEFINE_bool("text_pair", None, "Classifier/encoder: inputs are pairs (text + "
                      "text_pair); default: the metadata's, else false.")
    flags.DEFINE_string("metadata_file", None, "export_metadata.json; default: the one "
                        "beside --init_checkpoint if present.")
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype of the "
                      "trained model (bfloat16: mixed_bfloat16; outputs stay float32).")
    flags.DEFINE_integer("max_query_length", 64, "squad: question tokens kept; default: the "
                         "run's metadata, else 64.")
    flags.DEFINE_integer("max_answer_length", 30, "squad: longest answer in tokens; default: "
                         "the run's metadata, else 30.")
    flags.DEFINE_integer("n_best_size", 20, "squad: candidate starts / ends per window (the "
                         "original's filter before picking the best span); default: the "
                         "run's metadata, else 20.")
    flags.DEFINE_integer("doc_stride", 128, "squad, tagger: tokens between the starts of "
                         "consecutive windows of a long context / text; default: the run's "
                         "metadata, else 128 (tagger: half a window, as run_ner.py).")
    flags.DEFINE_integer("max_context_windows", 64, "squad, tagger: most doc_stride windows "
                         "one input may need; a longer one is refused with an error (bounded "
                         "memory per request).")
    flags.DEFINE_string("tag_scheme", "", "tagger: how entities are decoded from the tags: "
                        "IOB1, IOB2, IOBES, IOE or none; default: the run's metadata, else "
                        "detected from the labels.")
    flags.DEFINE_bool("feature_based", False, "tagger: the run_ner.py --feature_based model "
                      "(frozen encoder + BiLSTM); default: the run's metadata.")
    flags.DEFINE_string("feature_layers", "", "tagger, feature-based: the run's "
                        "--feature_layers; default: the run's metadata.")
    flags.DEFINE_integer("lstm_units", 0, "tagger, feature-based: the run's --lstm_units "
                         "(0: 768); default: the run's metadata.")
    flags.DEFINE_bool("overwrite", False, "Replace an existing --export_dir, only if it is an "
                      "export this project wrote (never a directory with other content, "
                      "never an input's directory).")


class FlagError(ValueError):
    """A flag value that cannot work (the message names the flag)."""


# Flags that set one family's ServingConfig field: given for another family, they would be
# parsed and ignored, so they are refused.
FAMILY_FLAGS = {"label_list": "labels", "num_labels": "labels",
                "is_regression": "is_regression", "text_pair": "text_pair",
                "max_query_length": "max_query_length",
                "max_answer_length": "max_answer_length", "n_best_size": "n_best_size",
                "doc_stride": "doc_stride", "max_context_windows": "max_context_windows",
                "tag_scheme": "tag_scheme", "feature_based": "feature_based",
                "feature_layers": "feature_layers", "lstm_units": "lstm_units"}


def _check_family_flags(family) -> None:
    for flag, field in FAMILY_FLAGS.items():
        if FLAGS[flag].present and field not in family.fields:
            users = sorted(t for t in _model_types() if field in _family(t).fields)
            raise FlagError(f"--{flag} does not apply to --model_type={family.model_type} "
                            f"(it is for: {', '.join(users) or 'no model type'})")


def _model_types():
    from modeling.export import MODEL_TYPES

    return MODEL_TYPES


def _family(model_type):
    from modeling.export import get_family

    return get_family(model_type)


def _checkpoint_dir(path: str) -> str:
    import tensorflow as tf

    return path if tf.io.gfile.isdir(path) else os.path.dirname(path)


def _metadata(ckpt_dir: str, family):
    import tensorflow as tf

    from modeling import export

    path = FLAGS.metadata_file or os.path.join(ckpt_dir, export.METADATA_FILE)
    if FLAGS.metadata_file and not tf.io.gfile.exists(path):
        raise FlagError(f"--metadata_file={path}: no such file")
    if not tf.io.gfile.exists(path):
        return None
    try:
        # Refuses the metadata of another family's run (a SWAG run as a classifier, ...).
        return export.read_run_metadata(path, family)
    except export.ExportError as err:
        raise FlagError(str(err)) from None


def _labels(meta, family):
    """(labels, is_regression) from flags, then metadata; checks --num_labels."""
    model_type = family.model_type
    if "labels" not in family.fields:
        return (), False
    if model_type != "classifier":
        labels = tuple(FLAGS.label_list) if FLAGS.label_list else tuple(
            meta.labels if meta else ())
        if not labels:
            raise FlagError(f"a {model_type} export needs --label_list (or an "
                            "export_metadata.json beside --init_checkpoint)")
        if FLAGS.num_labels is not None and FLAGS.num_labels != len(labels):
            raise FlagError(f"label count mismatch: --num_labels={FLAGS.num_labels} but the "
                            f"label list has {len(labels)} labels: {list(labels)}")
        if len(set(labels)) != len(labels):
            raise FlagError(f"--label_list has repeated names: {list(labels)}")
        return labels, False
    is_regression = FLAGS.is_regression
    if is_regression is None:
        is_regression = bool(meta and meta.is_regression)
    if is_regression:
        if FLAGS.num_labels not in (None, 1):
            raise FlagError(f"--num_labels={FLAGS.num_labels} with --is_regression: "
                            "a regression head has exactly 1 output")
        return (), True
    labels = tuple(FLAGS.label_list) if FLAGS.label_list else tuple(meta.labels if meta else ())
    if FLAGS.num_labels is not None:
        if labels and len(labels) != FLAGS.num_labels:
            raise FlagError(f"label count mismatch: --num_labels={FLAGS.num_labels} but the "
                            f"label list has {len(labels)} labels: {list(labels)}")
        labels = labels or tuple(str(i) for i in range(FLAGS.num_labels))
    if not labels:
        raise FlagError("a classifier export needs --label_list or --num_labels (or an "
                        "export_metadata.json beside --init_checkpoint)")
    if len(set(labels)) != len(labels):
        raise FlagError(f"--label_list has repeated names: {list(labels)}")
    return labels, False


def build_serving_config(ckpt_dir: str):
    """Flags + metadata -> (ServingConfig, BertConfig); raises FlagError before heavy work."""
    import tensorflow as tf

    from modeling import checkpoints, export
    from modeling.config import BertConfig

    family = _family(FLAGS.model_type)
    meta = _metadata(ckpt_dir, family)
    labels, is_regression = _labels(meta, family)
    vocab_file = FLAGS.vocab_file or os.path.join(ckpt_dir, "vocab.txt")
    if not tf.io.gfile.exists(vocab_file):
        raise FlagError(f"--vocab_file: {vocab_file} does not exist"
                        + ("" if FLAGS.vocab_file else " (no vocab.txt beside the checkpoint)"))
    if FLAGS.bert_config_file:
        if not tf.io.gfile.exists(FLAGS.bert_config_file):
            raise FlagError(f"--bert_config_file: {FLAGS.bert_config_file} does not exist")
        config = BertConfig.from_json_file(FLAGS.bert_config_file)
    else:
        config = checkpoints.config_for(FLAGS.init_checkpoint)
        if config is None:
            raise FlagError("--bert_config_file is required: no bert_config.json / "
                            f"config.json beside {FLAGS.init_checkpoint}")

    def pick(flag_value, meta_value, default):
        if flag_value is not None:
            return flag_value
        return meta_value if meta is not None else default

    default_len = 384 if FLAGS.model_type == "squad" else 128
    if FLAGS.max_seq_length is not None:
        max_seq_length = FLAGS.max_seq_length
    elif meta is not None and FLAGS.model_type != "hub":
        max_seq_length = meta.max_seq_length
    else:
        # A hub preprocessor's default seq_length is TF Hub's 128, not the fine-tuning
        # run's: callers choose theirs per call (bert_pack_inputs(..., seq_length=...)).
        max_seq_length = default_len
    # Family settings (ServingConfig fields named as their flags): the flag's default, the
    # family's own default, what the run's metadata says, then a flag given explicitly.
    fields = dict(
        max_query_length=FLAGS.max_query_length, max_answer_length=FLAGS.max_answer_length,
        doc_stride=FLAGS.doc_stride, n_best_size=FLAGS.n_best_size,
        max_context_windows=FLAGS.max_context_windows, tag_scheme=FLAGS.tag_scheme,
        feature_based=FLAGS.feature_based, feature_layers=FLAGS.feature_layers,
        lstm_units=FLAGS.lstm_units)
    given = {name: value for name, value in fields.items() if FLAGS[name].present}
    fields.update(family.default_fields(max_seq_length))
    fields.update(family.config_fields(meta) if meta is not None else {})
    fields.update(given)
    try:
        serving = export.ServingConfig(
            model_type=FLAGS.model_type, vocab_file=vocab_file,
            do_lower_case=pick(FLAGS.do_lower_case, meta and meta.do_lower_case, True),
            max_seq_length=max_seq_length,
            labels=labels, is_regression=is_regression,
            text_pair=bool(pick(FLAGS.text_pair, meta and meta.text_pair, False)),
            task=(meta.task if meta else ""), **fields)
    except export.ExportError as err:
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
        hint = ""
        if model_type == "classifier" and "classifier" in str(err):
            hint = ("\n  (the classifier head's size differs: check --label_list / "
                    "--num_labels / --is_regression against the fine-tuned task)")
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
    from modeling import checkpoints, export

    _check_family_flags(_family(FLAGS.model_type))
    try:
        _, location = checkpoints.resolve(FLAGS.init_checkpoint)
    except (checkpoints.CheckpointError, OSError) as err:
        raise FlagError(f"--init_checkpoint: {err}") from None
    ckpt_dir = _checkpoint_dir(FLAGS.init_checkpoint)
    serving, config = build_serving_config(ckpt_dir)
    inputs = _inputs(location)
    # Before any work: refuse an export_dir that would replace an input or foreign data.
    export.check_export_dir(os.path.abspath(FLAGS.export_dir) if "://" not in FLAGS.export_dir
                            else FLAGS.export_dir, overwrite=FLAGS.overwrite,
                            inputs=[*inputs, ("--vocab_file", serving.vocab_file)])
    model = build_model(serving, config, FLAGS.dtype)
    load_weights(model, FLAGS.init_checkpoint, serving.model_type)
    out = export.export_saved_model(model, serving, FLAGS.export_dir,
                                    overwrite=FLAGS.overwrite, inputs=inputs)
    print(f"exported {serving.model_type} ({FLAGS.dtype}, max_seq_length="
          f"{serving.max_seq_length}, do_lower_case={serving.do_lower_case}"
          + (f", labels={list(serving.labels)}" if serving.labels else "")
          + (", text_pair" if serving.text_pair else "") + f") to {out}")
    return out


def main(argv):
    del argv
    from data_prep import fileio
    from data_prep.tokenization import VocabError
    from modeling import export
    from modeling.checkpoints import CheckpointError
    from modeling.config import ConfigError
    from training import cli

    # SIGTERM/SIGHUP unwind like Ctrl-C: the temporary export is removed, the previous
    # export (if any) stays.
    cli.run_cli(run, "export_saved_model.py", (FlagError, export.ExportError, CheckpointError,
                                               ConfigError, VocabError, fileio.OutputError),
                status=2)


if __name__ == "__main__":
    define_flags()
    app.run(main)
