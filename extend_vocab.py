"""extend_vocab.py: grows a pretrained BERT's vocabulary by domain words, for continued pretraining.

    # The 500 words of a domain corpus that save the most tokens, appended; new rows at the
    # mean of the word's old pieces (the default --init=mean)
    python extend_vocab.py --input=uncased_L-12_H-768_A-12 --corpus='chem/*.txt' \\
        --num_new_words=500 --placement=append --output_dir=bert_chem
    # Your own words, in the [unused*] slots (vocab_size unchanged)
    python extend_vocab.py --input=bert_base_hf --new_words_file=drugs.txt --output_dir=out

--input is any checkpoint convert_checkpoint.py reads (Google's TF1 layout, a Hugging Face
directory, ours, a pretraining run's directory); --bert_config_file and --vocab_file
default to the files beside it. --output_dir receives vocab.txt, the config
(bert_config.json; config.json for --output_format=hf) and the checkpoint, as one
all-or-nothing set. Every tensor but the new rows of the word embeddings and of the
masked LM's output bias is copied unchanged; optimizer slots are not carried (continued
pretraining starts its optimizer fresh, as from a released checkpoint). Then regenerate
the pretraining TFRecords with the new vocab.txt and continue pretraining from
--output_dir (docs/extend_vocab.md).
"""

from absl import app, flags

from data_prep import cli

FLAGS = flags.FLAGS

SHOWN_WORDS = 20  # the words listed in the report; the rest are counted


def define_flags():
    flags.DEFINE_string("input", None, "Checkpoint: TF1 prefix or directory, Hugging Face "
                        "directory or .safetensors file, our checkpoint prefix/directory or "
                        "a pretraining run's output_dir.")
    flags.DEFINE_enum("input_format", "auto", ["auto", "tf1", "hf", "ours"],
                      "Kind of --input (auto: detected).")
    flags.DEFINE_string("bert_config_file", None,
                        "bert_config.json or HF config.json; default: the one beside --input.")
    flags.DEFINE_string("vocab_file", None, "The model's vocab.txt; default: the one beside "
                        "--input.")
    flags.DEFINE_bool("do_lower_case", True, "Lower-case the words (uncased models); checked "
                      "against the vocab.")
    flags.DEFINE_string("output_dir", None, "Directory to write: vocab.txt, the config and "
                        "the checkpoint.")
    flags.DEFINE_enum("output_format", None, ["tf1", "hf", "ours"],
                      "Kind of checkpoint to write; default: --input's kind.")
    flags.DEFINE_string("new_words_file", None, "Words to add, one per line (empty lines, "
                        "repeats and lines the tokenizer splits are refused; words the vocab "
                        "has are skipped).")
    flags.DEFINE_string("corpus", None, "Comma-separated files or globs of text: with "
                        "--num_new_words, where the words are chosen; with --new_words_file, "
                        "where the tokens they save are counted.")
    flags.DEFINE_integer("num_new_words", None, "With --corpus: add the N words that save "
                         "the most tokens (frequency x (pieces - 1) under the current vocab).")
    flags.DEFINE_enum("placement", "unused", ["unused", "append"],
                      "unused: the words replace [unused*] entries in vocab order "
                      "(vocab_size unchanged); append: vocab_size grows.")
    flags.DEFINE_integer("pad_vocab_to_multiple_of", None, "With --placement=append: pad "
                         "the vocab with [unusedN] entries to a multiple of this.")
    flags.DEFINE_enum("init", "mean", ["mean", "random"],
                      "mean: a new row (and masked-LM bias) starts at the mean of the "
                      "word's pieces under the old vocab; random: the original's "
                      "truncated normal (stddev initializer_range), bias 0.")
    flags.DEFINE_integer("seed", 12345, "Seed of --init=random's draws.")


def main(argv):
    """Runs `run` in the shell: bad input ends with one line naming the file or flag."""
    del argv
    return cli.run_main(run, "extend_vocab.py")


def _check_flags():
    if not FLAGS.input or not FLAGS.output_dir:
        raise app.UsageError("--input and --output_dir are required")
    if bool(FLAGS.new_words_file) == bool(FLAGS.num_new_words is not None):
        raise cli.FlagError("give the words with exactly one of --new_words_file and "
                            "--corpus + --num_new_words")
    if FLAGS.num_new_words is not None and (FLAGS.num_new_words < 1 or not FLAGS.corpus):
        raise cli.FlagError(f"--num_new_words={FLAGS.num_new_words} needs --corpus and at "
                            "least 1")
    if FLAGS["seed"].present and FLAGS.init != "random":
        raise cli.FlagError(f"--seed only applies with --init=random (--init={FLAGS.init} "
                            "draws nothing)")
    if FLAGS.pad_vocab_to_multiple_of is not None and FLAGS.pad_vocab_to_multiple_of < 1:
        raise cli.FlagError(f"--pad_vocab_to_multiple_of={FLAGS.pad_vocab_to_multiple_of}: "
                            "must be at least 1")
    from data_prep import fileio

    for flag in ("vocab_file", "bert_config_file", "new_words_file"):
        if FLAGS[flag].value and not fileio.isfile(FLAGS[flag].value):
            raise cli.FlagError(f"--{flag}={FLAGS[flag].value}: no such file")


def run():
    """Checks the flags, grows the vocab and the checkpoint, writes them; prints a report."""
    import os

    _check_flags()  # before TensorFlow loads: a bad flag is said at once
    from data_prep import fileio, new_words, tokenization
    from modeling import checkpoints, vocab_growth

    input_kind = None if FLAGS.input_format == "auto" else FLAGS.input_format
    output_kind = FLAGS.output_format or input_kind or checkpoints.resolve(FLAGS.input)[0]
    checkpoints.check_output_dir(FLAGS.input, FLAGS.output_dir, output_kind)
    if fileio.exists(FLAGS.output_dir) and not fileio.isdir(FLAGS.output_dir):
        raise cli.FlagError(f"--output_dir={FLAGS.output_dir} is a file; expected a directory")
    config, tokenizer = _model_files()
    chosen, counts = _choose_words(tokenizer)
    old_tokens = list(tokenizer.vocab) + _table_rows_past_vocab(tokenizer.vocab, config)
    plan = new_words.place_words(old_tokens, chosen.words, FLAGS.placement,
                                 FLAGS.pad_vocab_to_multiple_of)
    network, config = checkpoints.read_network(FLAGS.input, config=config,
                                               input_kind=input_kind)
    grown, grown_config = vocab_growth.grow_network(
        network, config, len(plan.tokens), new_words.row_sources(plan, tokenizer),
        init=FLAGS.init, seed=FLAGS.seed)
    # The new vocab.txt is written in a scratch folder, then copied into the output set
    # with the checkpoint and config (one all-or-nothing set).
    with fileio.work_directory(fileio.staging_name()) as scratch:
        vocab = os.path.join(scratch, "vocab.txt")
        fileio.write_text(vocab, "".join(token + "\n" for token in plan.tokens))
        saved = None
        if counts is not None:
            grown_tokenizer = tokenization.FullTokenizer(vocab, FLAGS.do_lower_case)
            saved = (new_words.corpus_tokens(counts, tokenizer),
                     new_words.corpus_tokens(counts, grown_tokenizer))
        written = checkpoints.write_network(grown, grown_config, FLAGS.output_dir,
                                            output_kind, vocab)
    _report(chosen, plan, config, grown_config, saved, written, output_kind)


def _model_files():
    """(config, the old vocab's tokenizer) from the flags or the files beside --input."""
    from modeling import checkpoints
    from modeling.config import BertConfig

    config = (BertConfig.from_config_file(FLAGS.bert_config_file) if FLAGS.bert_config_file
              else checkpoints.config_for(FLAGS.input))
    if config is None:
        raise cli.FlagError(f"--bert_config_file is required: no bert_config.json or "
                            f"config.json beside --input={FLAGS.input}")
    vocab_file = FLAGS.vocab_file or checkpoints.vocab_for(FLAGS.input)
    if vocab_file is None:
        raise cli.FlagError(f"--vocab_file is required: no vocab.txt beside "
                            f"--input={FLAGS.input}")
    return config, _tokenizer(vocab_file, config)


def _choose_words(tokenizer):
    """(the words to add, the corpus's word counts or None)."""
    from data_prep import new_words

    counts = (new_words.count_corpus_words(FLAGS.corpus, FLAGS.do_lower_case)
              if FLAGS.corpus else None)
    if FLAGS.new_words_file:
        chosen = new_words.read_words_file(FLAGS.new_words_file, tokenizer)
    else:
        chosen = new_words.most_saving_words(counts, tokenizer, FLAGS.num_new_words)
    if not chosen.words:
        raise new_words.NewWordsError(
            "no word to add: " + (f"every word of --new_words_file={FLAGS.new_words_file} "
                                  "is in the vocab" if FLAGS.new_words_file else
                                  f"no word of --corpus={FLAGS.corpus} splits into pieces"))
    return chosen, counts


def _tokenizer(vocab_file: str, config):
    """The old vocab's tokenizer; VocabError naming the flags when the vocab does not
    fit the model or --do_lower_case does not fit the vocab."""
    from data_prep import tokenization
    from modeling import checkpoints
    from training import trainer_setup

    tokenizer = tokenization.FullTokenizer(vocab_file, FLAGS.do_lower_case)
    tokenization.check_vocab(tokenizer.vocab, vocab_file)
    tokenization.check_case(tokenizer.vocab, vocab_file, FLAGS.do_lower_case)
    trainer_setup.check_vocab_fits(vocab_file, config,
                                   f"--bert_config_file={FLAGS.bert_config_file}"
                                   if FLAGS.bert_config_file else
                                   f"the config beside --input={FLAGS.input}",
                                   checkpoints.vocab_for(FLAGS.input))
    return tokenizer


def _table_rows_past_vocab(vocab, config) -> list:
    """Names for the embedding rows a padded table has past the vocab's last line (NVIDIA's
    30528 rows for 30522 tokens): `[unusedN]`, so the new words come after them."""
    from data_prep import new_words

    numbers = [int(m.group(1)) for m in map(new_words.UNUSED.match, vocab) if m]
    start = max(numbers, default=-1) + 1
    return [f"[unused{start + i}]" for i in range(config.vocab_size - len(vocab))]


def _report(chosen, plan, config, grown_config, saved, written, output_kind):
    def listed(words):
        shown = ", ".join(words[:SHOWN_WORDS])
        return shown + (f", ... (+{len(words) - SHOWN_WORDS} more)"
                        if len(words) > SHOWN_WORDS else "")

    ids = sorted(plan.ids.values())
    print(f"added {len(chosen.words)} words ({FLAGS.placement}: ids {ids[0]}..{ids[-1]}): "
          f"{listed(chosen.words)}")
    if chosen.known:
        print(f"skipped {len(chosen.known)} words already in the vocab: "
              f"{listed(chosen.known)}")
    if saved is not None:
        before, after = saved
        print(f"tokens on --corpus: {before} before, {after} after: {before - after} saved "
              f"({100.0 * (before - after) / max(before, 1):.1f}%)")
    print(f"vocab_size: {config.vocab_size} -> {grown_config.vocab_size}"
          + (f" ({len(plan.pads)} [unused*] pads)" if plan.pads else ""))
    print(f"new rows: --init={FLAGS.init} ("
          + ("the mean of each word's old pieces, embedding and masked-LM bias"
             if FLAGS.init == "mean" else "truncated normal, bias 0") + ")")
    print(f"wrote {written} ({output_kind}), its config and vocab.txt. Optimizer slots are "
          "not carried: continued pretraining starts its optimizer fresh. Regenerate the "
          "pretraining TFRecords with the new vocab.txt.")


if __name__ == "__main__":
    define_flags()
    cli.start(main, "extend_vocab.py")
