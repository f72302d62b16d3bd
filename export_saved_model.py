"""export_saved_model.py: a fine-tuned classifier, a SQuAD model or the bare encoder as a
serving SavedModel that takes raw strings and tokenizes in-graph (tensorflow-text).

    python export_saved_model.py --model_type=classifier --init_checkpoint=runs/mrpc \
        --export_dir=export/mrpc
    python export_saved_model.py --model_type=classifier --init_checkpoint=runs/mrpc \
        --bert_config_file=bert_config.json --vocab_file=vocab.txt --do_lower_case=true \
        --label_list=0,1 --text_pair --max_seq_length=128 --export_dir=export/mrpc
    python export_saved_model.py --model_type=encoder \
        --init_checkpoint=uncased_L-12_H-768_A-12 --export_dir=export/encoder

Settings come from explicit flags first, then from ``export_metadata.json`` beside the
checkpoint (written by the fine-tuning runner; ``--metadata_file`` points elsewhere), then
from the defaults. The config and vocab default to the files beside the checkpoint. See
docs/export.md for the signatures.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_enum("model_type", "classifier", ["classifier", "squad", "encoder"],
                      "What to export: a fine-tuned BertClassifier, a SQuAD BertSpanLabeler "
                      "or the bare encoder.")
    flags.DEFINE_string("init_checkpoint", None, "The trained model: our checkpoint (prefix or "
                        "output_dir), a TF1 checkpoint, or a Hugging Face directory.")
    flags.DEFINE_string("export_dir", None, "Directory of the SavedModel (written atomically).")
    flags.DEFINE_string("bert_config_file", None, "bert_config.json; default: the one beside "
                        "--init_checkpoint.")
    flags.DEFINE_string("vocab_file", None, "vocab.txt; default: the one beside "
                        "--init_checkpoint.")
    flags.DEFINE_bool("do_lower_case", None, "Tokenizer casing; default: the metadata's, "
                      "else true.")
    flags.DEFINE_integer("max_seq_length", None, "Padded sequence length; default: the "
                         "metadata's, else 128 (384 for squad).")
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
    flags.DEFINE_integer("max_query_length", 64, "squad: question tokens kept.")
    flags.DEFINE_integer("max_answer_length", 30, "squad: longest answer in tokens.")
    flags.DEFINE_integer("n_best_size", 20, "squad: candidate starts / ends per window (the "
                         "original's filter before picking the best span).")
    flags.DEFINE_integer("doc_stride", 128, "squad: tokens between the starts of "
                         "consecutive context windows.")
    flags.DEFINE_bool("overwrite", False, "Replace an existing non-empty --export_dir.")


class FlagError(ValueError):
    """A flag value that cannot work (the message names the flag)."""


def _checkpoint_dir(path: str) -> str:
    import tensorflow as tf

    return path if tf.io.gfile.isdir(path) else os.path.dirname(path)


def _metadata(ckpt_dir: str):
    import tensorflow as tf

    from modeling import export

    path = FLAGS.metadata_file or os.path.join(ckpt_dir, export.METADATA_FILE)
    if FLAGS.metadata_file and not tf.io.gfile.exists(path):
        raise FlagError(f"--metadata_file={path}: no such file")
    return export.read_export_metadata(path) if tf.io.gfile.exists(path) else None


def _labels(meta, model_type: str):
    """(labels, is_regression) from flags, then metadata; checks --num_labels."""
    if model_type != "classifier":
        return (), False
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

    meta = _metadata(ckpt_dir)
    labels, is_regression = _labels(meta, FLAGS.model_type)
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
    serving = export.ServingConfig(
        model_type=FLAGS.model_type, vocab_file=vocab_file,
        do_lower_case=pick(FLAGS.do_lower_case, meta and meta.do_lower_case, True),
        max_seq_length=pick(FLAGS.max_seq_length, meta and meta.max_seq_length, default_len),
        labels=labels, is_regression=is_regression,
        text_pair=bool(pick(FLAGS.text_pair, meta and meta.text_pair, False)),
        max_query_length=FLAGS.max_query_length, max_answer_length=FLAGS.max_answer_length,
        doc_stride=FLAGS.doc_stride, n_best_size=FLAGS.n_best_size,
        task=(meta.task if meta else ""))
    return serving, config


def build_model(serving, config, dtype: str):
    from modeling.encoder import BertEncoder
    from modeling.models import BertClassifier, BertSpanLabeler

    policy = "mixed_bfloat16" if dtype == "bfloat16" else "float32"
    if serving.model_type == "classifier":
        num = 1 if serving.is_regression else len(serving.labels)
        return BertClassifier(config, num, dtype=policy)
    if serving.model_type == "squad":
        return BertSpanLabeler(config, dtype=policy)
    return BertEncoder(config, dtype=policy)


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
        what = {"classifier": "a fine-tuned classifier (run_classifier.py output)",
                "squad": "a fine-tuned SQuAD model (run_squad.py output)",
                "encoder": "an encoder"}[model_type]
        raise FlagError(f"--init_checkpoint={path} lacks weights of {what}: "
                        f"{report.missing[:8]}{' ...' if len(report.missing) > 8 else ''}")


def run() -> str:
    """The export described by FLAGS; returns the export directory."""
    if not FLAGS.init_checkpoint:
        raise FlagError("--init_checkpoint is required")
    if not FLAGS.export_dir:
        raise FlagError("--export_dir is required")
    from modeling import checkpoints, export

    try:
        checkpoints.resolve(FLAGS.init_checkpoint)
    except (checkpoints.CheckpointError, OSError) as err:
        raise FlagError(f"--init_checkpoint: {err}") from None
    ckpt_dir = _checkpoint_dir(FLAGS.init_checkpoint)
    serving, config = build_serving_config(ckpt_dir)
    model = build_model(serving, config, FLAGS.dtype)
    load_weights(model, FLAGS.init_checkpoint, serving.model_type)
    out = export.export_saved_model(model, serving, FLAGS.export_dir, overwrite=FLAGS.overwrite)
    print(f"exported {serving.model_type} ({FLAGS.dtype}, max_seq_length="
          f"{serving.max_seq_length}, do_lower_case={serving.do_lower_case}"
          + (f", labels={list(serving.labels)}" if serving.labels else "")
          + (", text_pair" if serving.text_pair else "") + f") to {out}")
    return out


def main(argv):
    del argv
    from data_prep.tokenization import VocabError
    from modeling import export
    from modeling.checkpoints import CheckpointError
    from modeling.config import ConfigError

    try:
        run()
    except (FlagError, export.ExportError, CheckpointError, ConfigError, VocabError) as err:
        print(f"export_saved_model.py: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    define_flags()
    app.run(main)
