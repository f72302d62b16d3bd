"""extract_features.py: contextual token vectors from a BERT checkpoint, as JSON lines (the paper's
feature-based approach), with the flags and the output format of Google's script; or one
vector per text (--pooling), as sentence-transformers computes it.

    python extract_features.py --input_file=input.txt --output_file=out.jsonl \
        --init_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \
        --bert_config_file=uncased_L-12_H-768_A-12/bert_config.json \
        --vocab_file=uncased_L-12_H-768_A-12/vocab.txt --layers=-1,-2,-3,-4

Each input line is one example, ``text_a`` or ``text_a ||| text_b``. Each output line is
``{"linex_index": i, "features": [{"token": t, "layers": [{"index": -1, "values": [...]},
...]}, ...]}`` with one feature per real token ([CLS] ... [SEP]) and values rounded to 6
decimals. A text longer than ``--max_seq_length`` is cut to its first window, as the original
does, or with ``--long_text=windows`` read whole in ``--doc_stride`` windows, each token's
vectors from the window where it has the most context. ``--init_checkpoint`` may also be a
Hugging Face BERT directory (config.json + model.safetensors + vocab.txt) or a directory
holding ``bert_model.ckpt``; the directory's config and vocab are then the defaults of
``--bert_config_file`` and ``--vocab_file``.

With ``--pooling=cls|mean|max`` (``--normalize``: L2) each line gives one vector, the
``--layers``' mean (default: the last layer) pooled over its real tokens:
``{"linex_index": i, "embedding": [...]}``, or with ``--output_format=npy`` one float32
array [lines, hidden]. A sentence-transformers directory as ``--init_checkpoint`` also sets
the defaults of ``--max_seq_length``, ``--do_lower_case``, ``--pooling`` and
``--normalize`` (flags given override them, each override logged). See docs/embeddings.md.
"""

from __future__ import annotations

import dataclasses
import os
import re

from absl import app, flags, logging

from data_prep import cli
from tasks.feature_extraction.extract import (Example, NpyRows, Windows, compute_layers,
                                              convert_examples, embedding_json, feature_json,
                                              merge_windows, sentence_vector)

FLAGS = flags.FLAGS


def define_flags():
    """The original script's flags plus --distribution_strategy (defined only when run)."""
    flags.DEFINE_string("input_file", None,
                        "Text file, one example per line ('a' or 'a ||| b').")
    flags.DEFINE_string("output_file", None, "JSON lines output file (with "
                        "--output_format=npy: a .npy file).")
    flags.DEFINE_string("layers", "-1,-2,-3,-4", "Comma-separated encoder layer indexes "
                        "(Python indexing over the blocks: -1 is the last). With --pooling: "
                        "the layers whose mean is pooled; default there: -1.")
    flags.DEFINE_enum("pooling", "none", ["none", "cls", "mean", "max"],
                      "none: the original's vectors of every token; else one vector per "
                      "line: its [CLS] token's (cls), the mean (mean) or the maximum of each "
                      "dimension (max) over its tokens, padding never counted. Default from "
                      "a sentence-transformers --init_checkpoint: its Pooling module's.")
    flags.DEFINE_bool("normalize", False, "With --pooling: divide each vector by its L2 "
                      "norm. Default from a sentence-transformers --init_checkpoint: whether "
                      "it has a Normalize module.")
    flags.DEFINE_enum("output_format", "jsonl", ["jsonl", "npy"],
                      "With --pooling: JSON lines {\"linex_index\": i, \"embedding\": [...]} "
                      "or npy (one float32 array [lines, hidden], rows in input order).")
    flags.DEFINE_string("bert_config_file", None, "bert_config.json (Google) or config.json "
                        "(Hugging Face); defaults to the one beside --init_checkpoint.")
    flags.DEFINE_integer("max_seq_length", 128, "Sequence length after WordPiece (truncated / "
                         "padded to it); default from a sentence-transformers "
                         "--init_checkpoint: its max_seq_length.")
    flags.DEFINE_string("init_checkpoint", None, "TF1 checkpoint prefix or directory, Hugging "
                        "Face directory, or one of this project's checkpoints.")
    flags.DEFINE_string("vocab_file", None, "vocab.txt; defaults to the one beside "
                        "--init_checkpoint.")
    flags.DEFINE_bool("do_lower_case", True, "Lower-case the input (uncased models); default "
                      "from a sentence-transformers --init_checkpoint: its tokenizer's.")
    flags.DEFINE_integer("batch_size", 32, "Batch size for predictions (global).")
    flags.DEFINE_enum("long_text", "truncate", ["truncate", "windows"],
                      "A text longer than --max_seq_length: 'truncate' keeps its first window "
                      "(the original); 'windows' reads it whole in --doc_stride windows, "
                      "each token's vectors from the window where it has the most context "
                      "(single texts only: a pair that does not fit is refused).")
    flags.DEFINE_integer("doc_stride", None, "With --long_text=windows: WordPieces between "
                         "the starts of two windows (empty: half a window, "
                         "(max_seq_length - 2) // 2).")
    flags.DEFINE_integer("max_windows_per_text", 64, "With --long_text=windows: a text "
                         "needing more windows is refused, naming its line.")
    flags.DEFINE_string("distribution_strategy", "one_device",
                        "default, one_device, mirrored, multi_worker_mirrored or tpu.")
    flags.DEFINE_integer("num_gpus", 0, "GPUs for one_device / mirrored (0: all for mirrored).")
    flags.DEFINE_integer("num_cpu_devices", 0, "With mirrored and no GPU: logical CPU devices.")
    flags.DEFINE_bool("jit_compile", False, "Compile the forward pass with XLA.")
    # Accepted for command-line compatibility with the original script.
    flags.DEFINE_bool("use_tpu", False, "Same as --distribution_strategy=tpu.")
    flags.DEFINE_string("master", None, "TPU name / address when --use_tpu.")
    flags.DEFINE_integer("num_tpu_cores", 8, "TPU cores expected with --use_tpu (the TPU "
                         "strategy uses all of them; a mismatch is reported).")
    flags.DEFINE_bool("use_one_hot_embeddings", False, "Look words up with a one-hot matmul "
                      "(the original's TPU path; the same numbers).")
    from training import flags as common_flags

    common_flags.define_bucketing_flags()


PAIR = re.compile(r"^(.*) \|\|\| (.*)$")  # the original's pair format, "a ||| b"


def read_examples(input_file: str) -> list:
    """One example per line; ``a ||| b`` is a pair. Ids count lines from 0.

    Lines are read as the original reads them through TensorFlow's GFile: they end at
    "\\n", every "\\r" is dropped, each line is stripped; a blank line is an example
    with no tokens. Bad input is refused before any model is loaded.

    Raises:
      text_input.InputError naming the file (and line): a path that is missing, a
      directory or unreadable; invalid UTF-8 (line and byte offset, as every data tool
      reports it); a line with "|||" outside the pair format;
      no example at all (an empty file, or only blank lines).
    """
    from data_prep import fileio
    from data_prep.text_input import InputError, decode_utf8

    if fileio.isdir(input_file):
        raise InputError(f"--input_file={input_file} is a directory; expected a text file "
                         "with one example per line")
    if not fileio.exists(input_file):
        raise InputError(f"--input_file={input_file}: no such file")
    try:
        with fileio.open_file(input_file, "rb") as reader:
            raw = reader.read()
    except Exception as err:  # noqa: BLE001 - OSError locally, tf.errors for URLs
        if not isinstance(err, OSError) and type(err).__module__.split(".")[0] != \
                "tensorflow":
            raise
        raise InputError(f"--input_file={input_file}: cannot read it ({err})") from None
    text = decode_utf8(raw, input_file)
    lines = text.replace("\r", "").split("\n")
    if lines[-1] == "":
        lines.pop()  # after the last "\n": not a line
    examples = []
    for unique_id, line in enumerate(lines):
        line = line.strip()
        pair = PAIR.match(line)
        if pair:
            text_a, text_b = pair.group(1), pair.group(2)
        else:
            text_a, text_b = line, None
        if "|||" in text_a or "|||" in (text_b or ""):
            raise InputError(
                f"{input_file}:{unique_id + 1}: '|||' outside the pair format: a line is "
                "'text' or 'text_a ||| text_b' (one '|||', a space on each side, text on "
                f"both sides); found {line[:80]!r}")
        examples.append(Example(unique_id, text_a, text_b))
    if not any(example.text_a or example.text_b for example in examples):
        raise InputError(f"--input_file={input_file}: no examples: the file is empty or "
                         "holds only blank lines")
    return examples


def _defaults_from_checkpoint(init_checkpoint, bert_config_file, vocab_file):
    """Config and vocab beside the checkpoint when the flags do not name them."""
    from modeling import checkpoints
    from modeling.config import BertConfig
    from training import trainer_setup

    _, location = checkpoints.resolve(init_checkpoint)
    if bert_config_file:
        config = BertConfig.from_config_file(bert_config_file)
        # A left-to-right model's features are not those of its weights read both ways.
        trainer_setup.check_attention_of(init_checkpoint, config, bert_config_file)
    else:
        config = checkpoints.config_for(init_checkpoint)
        if config is None:
            raise app.UsageError(f"--bert_config_file is required: no bert_config.json or "
                                 f"config.json beside {location}")
    if not vocab_file:
        vocab_file = checkpoints.vocab_for(init_checkpoint)
        if vocab_file is None:
            raise app.UsageError(f"--vocab_file is required: no vocab.txt in "
                                 f"{os.path.dirname(location)}")
    return config, vocab_file


def _layer_indexes(text: str) -> list:
    """--layers as integers (UsageError naming the flag when one is not an integer)."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise app.UsageError(f"--layers={text}: expected comma-separated integers "
                             "(e.g. -1,-2,-3,-4)") from None


@dataclasses.dataclass(frozen=True)
class TextSettings:
    """How texts are read and what is written per line: the flags, or their defaults from
    a sentence-transformers checkpoint."""

    max_seq_length: int
    do_lower_case: bool
    pooling: str
    normalize: bool
    layer_indexes: list


def _text_settings() -> TextSettings:
    """--max_seq_length, --do_lower_case, --pooling, --normalize and --layers: the flags
    given, else a sentence-transformers checkpoint's settings, else the flags' defaults.
    Each flag that overrides the checkpoint's setting is logged; UsageError naming a flag
    that cannot apply."""
    from modeling.checkpoints import sentence_transformers

    names = ("max_seq_length", "do_lower_case", "pooling", "normalize")
    values = {name: FLAGS[name].value for name in names}
    given = {name: FLAGS[name].value for name in names + ("layers", "vocab_file",
                                                          "bert_config_file")
             if FLAGS[name].present}
    if sentence_transformers.is_sentence_transformers(FLAGS.init_checkpoint):
        model = sentence_transformers.read(FLAGS.init_checkpoint)
        values.update({k: v for k, v in model.settings().items() if k not in given})
        logging.info("sentence-transformers model %s: %s", model.directory, ", ".join(
            f"{k}={v}" for k, v in model.settings().items()))
        for message in model.overrides(given):
            logging.warning("%s", message)
    pooled = values["pooling"] != "none"
    if not pooled:
        for name, default in (("normalize", False), ("output_format", "jsonl")):
            if FLAGS[name].present and FLAGS[name].value != default:
                value = FLAGS[name].value
                raise app.UsageError(f"--{name}={str(value).lower()} needs one vector per "
                                     "line: give --pooling=cls, mean or max")
    layers = _layer_indexes(FLAGS.layers) if FLAGS["layers"].present or not pooled else [-1]
    return TextSettings(values["max_seq_length"], values["do_lower_case"], values["pooling"],
                        values["normalize"] and pooled, layers)


def _windows():
    """--long_text and its flags as `Windows` (None: truncate); UsageError naming a flag
    (its flags given with truncate are refused before: `run`'s `check_modes`)."""
    if FLAGS.long_text == "truncate":
        return None
    if FLAGS.doc_stride is not None and FLAGS.doc_stride < 1:
        raise app.UsageError(f"--doc_stride={FLAGS.doc_stride}: must be at least 1")
    if FLAGS.max_windows_per_text < 1:
        raise app.UsageError(f"--max_windows_per_text={FLAGS.max_windows_per_text}: must be "
                             "at least 1")
    return Windows(FLAGS.doc_stride, FLAGS.max_windows_per_text)


def run():
    """Checks the flags and inputs (before loading any model), then writes the JSON lines."""
    for name in ("input_file", "output_file", "init_checkpoint"):  # before TensorFlow loads
        if not getattr(FLAGS, name):
            raise app.UsageError(f"--{name} is required")
    from data_prep import fileio
    from data_prep.tokenization import FullTokenizer
    from training import flags as common_flags
    from training import trainer_setup
    from modeling import checkpoints
    from modeling.encoder import BertEncoder
    from training.distribution import get_strategy

    fileio.check_outputs([("--output_file", FLAGS.output_file)],
                         [("--input_file", FLAGS.input_file),
                          ("--vocab_file", FLAGS.vocab_file),
                          ("--bert_config_file", FLAGS.bert_config_file)])
    text = _text_settings()
    layer_indexes, max_seq_length = text.layer_indexes, text.max_seq_length
    if FLAGS.batch_size < 1:
        raise app.UsageError(f"--batch_size={FLAGS.batch_size}: must be at least 1")
    if max_seq_length < 3:
        raise app.UsageError(f"--max_seq_length={max_seq_length}: must be at least 3 "
                             "([CLS], a token, [SEP])")
    common_flags.check_modes(FLAGS, (common_flags.OnlyWith(
        ("doc_stride", "max_windows_per_text"), "--long_text=windows",
        common_flags.flag_is("long_text", "windows")),))
    windows = _windows()
    buckets = common_flags.bucket_boundaries(FLAGS, max_seq_length)
    examples = read_examples(FLAGS.input_file)
    # The strategy first: a mirrored CPU split must happen before TensorFlow sets up devices.
    strategy_name = "tpu" if FLAGS.use_tpu else FLAGS.distribution_strategy
    strategy = get_strategy(strategy_name, tpu=FLAGS.master, num_gpus=FLAGS.num_gpus,
                            num_cpu_devices=FLAGS.num_cpu_devices)
    config, vocab_file = _defaults_from_checkpoint(
        FLAGS.init_checkpoint, FLAGS.bert_config_file, FLAGS.vocab_file)
    for index in layer_indexes:
        if not -config.num_hidden_layers <= index < config.num_hidden_layers:
            raise app.UsageError(f"--layers: {index} is out of range for "
                                 f"{config.num_hidden_layers} layers")
    if max_seq_length > config.max_position_embeddings:
        raise app.UsageError(f"--max_seq_length {max_seq_length} exceeds "
                             f"max_position_embeddings {config.max_position_embeddings}")
    trainer_setup.check_vocab_tokens(vocab_file, text.do_lower_case)  # tokens and casing
    tokenizer = FullTokenizer(vocab_file=vocab_file, do_lower_case=text.do_lower_case)
    trainer_setup.check_vocab_fits(  # a grown model read with its old vocab, or the reverse
        vocab_file, config, f"--bert_config_file={FLAGS.bert_config_file}"
        if FLAGS.bert_config_file else f"the config beside {FLAGS.init_checkpoint}",
        checkpoints.vocab_for(FLAGS.init_checkpoint))
    features = convert_examples(examples, max_seq_length, tokenizer, windows,
                                FLAGS.input_file)

    if FLAGS.batch_size % strategy.num_replicas_in_sync:
        raise app.UsageError(f"--batch_size={FLAGS.batch_size} must be a multiple of the "
                             f"{strategy.num_replicas_in_sync} replicas")
    if strategy_name == "tpu" and strategy.num_replicas_in_sync != FLAGS.num_tpu_cores:
        logging.warning("--num_tpu_cores=%d but the TPU has %d cores; using all of them",
                        FLAGS.num_tpu_cores, strategy.num_replicas_in_sync)
    with strategy.scope():
        encoder = BertEncoder(config, use_one_hot_embeddings=FLAGS.use_one_hot_embeddings)
    report = checkpoints.load_pretrained(FLAGS.init_checkpoint, encoder, partial=True)
    if report.missing:
        raise checkpoints.CheckpointError(report.describe())
    logging.info("%s", report.describe())

    logging.info("Computing %s of %d examples (%d windows, layers %s) into %s",
                 "features" if text.pooling == "none" else
                 f"{text.pooling}-pooled vectors{' (L2-normalized)' * text.normalize}",
                 len(examples), len(features), layer_indexes, FLAGS.output_file)
    computed = merge_windows(compute_layers(encoder, features, layer_indexes,
                                            FLAGS.batch_size, strategy, FLAGS.jit_compile,
                                            buckets))
    npy = text.pooling != "none" and FLAGS.output_format == "npy"
    # All or nothing: the output appears under --output_file only once complete.
    with fileio.AtomicOutputs([FLAGS.output_file]) as out:
        with out.open(FLAGS.output_file, "wb" if npy else "w",
                      **({} if npy else {"newline": "\n"})) as writer:
            rows = NpyRows(writer, len(examples), config.hidden_size) if npy else None
            for feature, layers in computed:
                if text.pooling == "none":
                    writer.write(feature_json(feature, layers, layer_indexes))
                    continue
                vector = sentence_vector(feature, layers, text.pooling, text.normalize)
                if rows:
                    rows.write(vector)
                else:
                    writer.write(embedding_json(feature, vector))
            if rows:
                rows.close()


def main(argv):
    """Runs `run`; bad input ends with one line naming the file, line or flag, exit 1."""
    del argv
    return cli.run_main(run, "extract_features.py")


if __name__ == "__main__":
    define_flags()
    cli.start(main, "extract_features.py")
