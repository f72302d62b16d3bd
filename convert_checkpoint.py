"""convert_checkpoint.py: converts BERT checkpoints between Google's TF1 layout, Hugging Face
directories and this project's tf.train.Checkpoint.

    # Google's release -> Hugging Face directory (model.safetensors + config.json + vocab.txt)
    python convert_checkpoint.py --input=uncased_L-12_H-768_A-12 --output_dir=hf_bert \
        --output_format=hf
    # Hugging Face directory -> Google's layout (bert_model.ckpt + bert_config.json)
    python convert_checkpoint.py --input=hf_bert --output_dir=google_bert --output_format=tf1
    # A pretraining run of this project -> Google's layout
    python convert_checkpoint.py --input=runs/pretrain --bert_config_file=bert_config.json \
        --output_dir=google_bert --output_format=tf1

The input kind is detected (``--input_format`` forces it); the GELU form of the config is
kept in every output (see docs/modeling.md). A sentence-transformers directory's pooling,
normalization, casing and max_seq_length are written beside the output
(docs/embeddings.md).
"""

from absl import app, flags, logging

from data_prep import cli

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("input", None, "Checkpoint: TF1 prefix or directory, Hugging Face "
                        "directory or .safetensors file, sentence-transformers directory, or "
                        "our checkpoint prefix/directory.")
    flags.DEFINE_enum("input_format", "auto", ["auto", "tf1", "hf", "ours"],
                      "Kind of --input (auto: detected).")
    flags.DEFINE_string("output_dir", None, "Directory to write.")
    flags.DEFINE_enum("output_format", "tf1", ["tf1", "hf", "ours"], "Kind to write.")
    flags.DEFINE_string("bert_config_file", None,
                        "bert_config.json or HF config.json; default: the one beside --input.")
    flags.DEFINE_string("vocab_file", None, "Copied to --output_dir; default: vocab.txt "
                        "beside --input.")
    flags.DEFINE_enum("model", "auto", ["auto", "encoder", "pretrainer"],
                      "Weights to convert (auto: with the pretraining heads when present).")
    flags.DEFINE_bool("partial", False, "Drop checkpoint tensors the model does not have "
                      "(e.g. a fine-tuned classifier head) instead of failing.")


def main(argv):
    """Runs `run` in the shell: bad input ends with one line naming the file or flag."""
    del argv
    return cli.run_main(run, "convert_checkpoint.py")


def run():
    """Checks the flags, converts --input to --output_format in --output_dir; prints what
    it wrote."""
    if not FLAGS.input or not FLAGS.output_dir:  # before TensorFlow loads: said at once
        raise app.UsageError("--input and --output_dir are required")
    from data_prep import fileio
    from modeling import checkpoints
    from modeling.checkpoints import sentence_transformers
    from modeling.config import BertConfig

    if FLAGS.vocab_file and not fileio.exists(FLAGS.vocab_file):
        raise cli.FlagError(f"--vocab_file={FLAGS.vocab_file}: no such file")
    if fileio.exists(FLAGS.output_dir) and not fileio.isdir(FLAGS.output_dir):
        raise cli.FlagError(f"--output_dir={FLAGS.output_dir} is a file; expected a directory")
    if sentence_transformers.is_sentence_transformers(FLAGS.input):
        for message in sentence_transformers.read(FLAGS.input).overrides(
                {name: FLAGS[name].value for name in ("bert_config_file", "vocab_file")}):
            logging.warning("%s", message)
    config = (BertConfig.from_config_file(FLAGS.bert_config_file)
              if FLAGS.bert_config_file else None)
    written = checkpoints.convert(
        FLAGS.input, FLAGS.output_dir, FLAGS.output_format, config=config,
        input_kind=None if FLAGS.input_format == "auto" else FLAGS.input_format,
        vocab_file=FLAGS.vocab_file, model=FLAGS.model, partial=FLAGS.partial)
    print(f"wrote {written}")


if __name__ == "__main__":
    define_flags()
    cli.start(main, "convert_checkpoint.py")
