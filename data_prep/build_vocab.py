"""Learns a BERT WordPiece vocabulary (vocab.txt) from raw text; library functions and CLI.

    python -m data_prep.build_vocab --input_file='corpus/*.txt' --output_file=vocab.txt \\
        --vocab_size=8000 --do_lower_case=true

The text is split into words exactly as the BERT tokenizer does at use time
(`data_prep.reference_tokenization.BasicTokenizer`: cleaning, CJK splitting, optional lower-casing
and accent stripping, punctuation splitting), and tensorflow-text's WordPiece learner
(`tensorflow_text.tools.wordpiece_vocab.wordpiece_tokenizer_learner_lib.learn`, the
algorithm behind `bert_vocab_from_dataset`) learns the pieces from the word counts.

Vocabulary layout (ids are line numbers):

* `layout="bert"` (default): `[PAD]`, `[unused0]`..`[unused98]`, `[UNK]`, `[CLS]`, `[SEP]`,
  `[MASK]`, `[unused99]`.. -- Google's layout: with the default `num_unused=100`, `[PAD]`
  is 0 and `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]` are 100, 101, 102, 103 as in Google's
  vocabularies (with fewer than 99 unused slots they follow the slots there are);
* `layout="compact"`: `[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]`, `[unused0]`..;
* then every character seen in the (sampled) input, sorted by code point, then the `##`
  form of each of them that can continue a word (not punctuation, not CJK ideographs,
  which the basic tokenizer always splits off), so that no text made of seen characters
  ever becomes `[UNK]` (except words over 200 characters, as in the original);
* then the learned pieces, most frequent first, up to `vocab_size`.

The CLI writes the vocab atomically (temporary name, then rename), then loads it with
`FullTokenizer`, measures the `[UNK]` rate and pieces per word on a sample of the input,
and writes these figures to `<output_file>.summary.json`.

The flags are defined only when the CLI runs (`run()` or `python -m`), never on import,
so library users and other CLIs (which define `input_file`, `output_file`,
`do_lower_case`) can import this module freely.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import json
import os
import random
import time

from data_prep import cli, fileio, reference_tokenization, text_input, tokenization
from data_prep.tokenization import count_words  # noqa: F401 - build_vocab.count_words

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
LAYOUTS = ("bert", "compact")
# In Google's vocabularies [UNK] follows [unused0]..[unused98].
_BERT_UNUSED_BEFORE_UNK = 99
_JOINER = "##"
# The learner accepts a vocabulary between (1 - slack) * target and target (its default).
_SLACK_RATIO = 0.05
_LEARNER_PATH = ("tools", "wordpiece_vocab", "wordpiece_tokenizer_learner_lib.py")


@dataclasses.dataclass(frozen=True)
class VocabConfig:
    """Settings of the vocabulary learner.

    Attributes:
      vocab_size: target (maximum) number of tokens, specials included.
      do_lower_case: lower-case and strip accents, as the tokenizer will at use time.
      num_unused: number of reserved `[unusedN]` slots.
      layout: "bert" or "compact" (see the module docstring).
      min_token_count: lowest count a piece may have (the learner's search floor).
      max_token_length: longest piece learned, in characters; longer words still get
        their characters.
      num_iterations: iterations of the learner.
      max_unique_words: most frequent distinct words given to the learner.
      max_input_mb: read a uniform random sample of lines when the input is larger than
        this many MB (10^6 bytes); 0 reads everything.
      seed: seed of the line sampling.
      sanity_sample_lines: lines kept (reservoir sample) for the [UNK] check.
    """

    vocab_size: int = 30522
    do_lower_case: bool = True
    num_unused: int = 100
    layout: str = "bert"
    min_token_count: int = 2
    max_token_length: int = 50
    num_iterations: int = 4
    max_unique_words: int = 5_000_000
    max_input_mb: float = 256.0
    seed: int = 12345
    sanity_sample_lines: int = 5000

    def validate(self) -> None:
        if self.layout not in LAYOUTS:
            raise cli.UserError(f"--layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.num_unused < 0:
            raise cli.UserError(f"--num_unused must be >= 0, got {self.num_unused}")
        specials = len(SPECIAL_TOKENS) + self.num_unused
        if self.vocab_size <= specials:
            raise cli.UserError(
                f"--vocab_size={self.vocab_size} is too small: the special tokens alone "
                f"take {specials} entries ({len(SPECIAL_TOKENS)} + --num_unused="
                f"{self.num_unused}); raise --vocab_size or lower --num_unused")
        for name in ("min_token_count", "max_token_length", "num_iterations",
                     "max_unique_words"):
            if getattr(self, name) < 1:
                raise cli.UserError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.max_input_mb < 0:
            raise cli.UserError(f"--max_input_mb must be >= 0, got {self.max_input_mb}")


@dataclasses.dataclass
class TextStats:
    """What reading the input found."""

    files: list
    input_bytes: int = 0
    lines_read: int = 0
    lines_kept: int = 0
    sample_probability: float = 1.0
    sample_lines: list = dataclasses.field(default_factory=list)


# ---------------------------------------------------------------------------
# Input.


def iter_text_lines(files: list[str], stats: TextStats, config: VocabConfig):
    """Yields decoded lines (without `\\n`), sampled when the input exceeds max_input_mb.

    Lines end at `\\n` only, as in the pretraining data tools. Every line is decoded (so
    invalid UTF-8 anywhere is reported with its file and line), and a line is kept with
    probability `max_input_mb / input size`. A reservoir of `sanity_sample_lines` kept
    lines is stored in `stats.sample_lines` for the [UNK] check.

    Raises:
      text_input.InputError: invalid UTF-8 (names the file, line and byte offset).
    """
    stats.input_bytes = sum(fileio.getsize(f) for f in files)
    limit = int(config.max_input_mb * 1_000_000)
    if limit and stats.input_bytes > limit:
        stats.sample_probability = limit / stats.input_bytes
    rng = random.Random(config.seed)
    reservoir_rng = random.Random(config.seed + 1)
    for path in files:
        with fileio.open_file(path, "rb") as reader:
            offset = 0
            for line_number, raw in enumerate(reader, start=1):
                line = text_input.decode_utf8(raw, path, first_line=line_number,
                                              first_offset=offset)
                offset += len(raw)
                stats.lines_read += 1
                if stats.sample_probability < 1.0 and rng.random() >= stats.sample_probability:
                    continue
                line = line.rstrip("\n")
                stats.lines_kept += 1
                _reservoir_add(stats.sample_lines, line, stats.lines_kept,
                               config.sanity_sample_lines, reservoir_rng)
                yield line


def _reservoir_add(sample: list, item, seen: int, size: int, rng: random.Random) -> None:
    if len(sample) < size:
        sample.append(item)
    else:
        slot = rng.randrange(seen)
        if slot < size:
            sample[slot] = item


# ---------------------------------------------------------------------------
# Learning.


def special_tokens(num_unused: int, layout: str = "bert") -> list[str]:
    """The reserved tokens at the start of the vocab, in id order (see the module docstring)."""
    unused = [f"[unused{i}]" for i in range(num_unused)]
    if layout == "compact":
        return list(SPECIAL_TOKENS) + unused
    if layout == "bert":
        head = unused[:_BERT_UNUSED_BEFORE_UNK]
        return ["[PAD]"] + head + list(SPECIAL_TOKENS[1:]) + unused[_BERT_UNUSED_BEFORE_UNK:]
    raise cli.UserError(f"--layout must be one of {LAYOUTS}, got {layout!r}")


def can_continue_word(char: str) -> bool:
    """Whether `char` can follow another character inside a basic-tokenizer word."""
    return not (reference_tokenization.is_punctuation(char)
                or reference_tokenization.is_chinese_char(ord(char)))


def character_tokens(word_counts) -> list[str]:
    """Every character of the words, sorted, then the `##` form of those that can continue one."""
    chars = sorted({char for word in word_counts for char in word})
    return chars + [_JOINER + c for c in chars if can_continue_word(c)]


def _learner():
    """tensorflow-text's WordPiece learner module.

    The learner is pure Python (numpy only). It is loaded from its file inside the
    installed tensorflow_text package without running the package's `__init__`, which
    would import TensorFlow (seconds, and its start-up logging) for nothing; if that ever
    fails, the ordinary import is used.
    """
    try:
        spec = importlib.util.find_spec("tensorflow_text")
        path = os.path.join(os.path.dirname(spec.origin), *_LEARNER_PATH)
        module_spec = importlib.util.spec_from_file_location(
            "tensorflow_text_wordpiece_learner", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        module.learn  # noqa: B018 - the function used below must be there
        return module
    except Exception:  # noqa: BLE001 - fall back to the documented import path
        from tensorflow_text.tools.wordpiece_vocab import (
            wordpiece_tokenizer_learner_lib,
        )

        return wordpiece_tokenizer_learner_lib


def _learn_pieces(words, target: int, max_unique_chars: int, config: VocabConfig) -> list:
    """The learner's vocabulary for `target` tokens, with a narrowed threshold search.

    The learner binary-searches the count threshold between `lower_thresh` and the largest
    word count, one full learning pass per step (about 15 passes on a small corpus). The
    vocabulary shrinks as the threshold grows, so doubling the threshold from
    `min_token_count` brackets the answer in a few passes (each one `learn` restricted to
    a single threshold), and the learner's own search then runs inside that bracket.
    Returns the learner's token list, possibly longer than `target` (the caller keeps the
    first, most frequent, pieces).
    """
    learner = _learner()

    def learn(lower: int, upper: int) -> list:
        return learner.learn(
            words, target, reserved_tokens=[], upper_thresh=upper, lower_thresh=lower,
            num_iterations=config.num_iterations, max_input_tokens=config.max_unique_words,
            max_token_length=config.max_token_length, max_unique_chars=max_unique_chars)

    max_count = max(count for _, count in words)
    lower = upper = config.min_token_count
    vocab = learn(lower, lower)
    if len(vocab) <= target:
        return vocab  # even the lowest threshold allowed gives no more than the target
    while len(vocab) > target and upper < max_count:
        lower, above = upper, vocab  # the smallest vocabulary seen over the target
        upper = min(2 * upper, max_count)
        vocab = learn(upper, upper)
    if len(vocab) > target or len(vocab) >= (1 - _SLACK_RATIO) * target:
        return vocab  # over the target: the caller keeps the most frequent pieces
    if upper - lower > 1:
        vocab = learn(lower, upper)
        if len(vocab) >= (1 - _SLACK_RATIO) * target:
            return vocab
    # No threshold lands within the slack: cut the next larger vocabulary to the target.
    return above


def learn_vocab(word_counts: collections.Counter, config: VocabConfig) -> list[str]:
    """Learns the vocabulary (specials, characters, learned pieces) from word counts.

    Returns:
      The tokens in id order, at most `config.vocab_size` of them.

    Raises:
      cli.UserError: no words, or vocab_size too small for the specials and characters.
    """
    config.validate()
    if not word_counts:
        raise cli.UserError("the input holds no words: nothing to learn a vocabulary from")
    specials = special_tokens(config.num_unused, config.layout)
    required = specials + character_tokens(word_counts)
    if len(required) > config.vocab_size:
        raise cli.UserError(
            f"--vocab_size={config.vocab_size} is too small: {len(specials)} special tokens "
            f"plus {len(required) - len(specials)} character tokens (every character seen "
            f"and its ## form) need {len(required)}; raise --vocab_size to at least "
            f"{len(required) + 100} or lower --num_unused")
    learner_words = [(w, c) for w, c in word_counts.items()
                     if len(w) <= config.max_token_length]
    learned: list[str] = []
    if learner_words:
        # The learner's own character tokens count against its target; pieces we drop
        # (## forms of punctuation and CJK) or already hold are made up for here.
        learner_chars = {char for word, _ in learner_words for char in word}
        target = config.vocab_size - len(required) + 2 * len(learner_chars)
        learned = _learn_pieces(learner_words, target, len(learner_chars) + 1, config)
    vocab = list(required)
    seen = set(vocab)
    for token in learned:
        if len(vocab) >= config.vocab_size:
            break
        if token in seen or token == _JOINER or (
                token.startswith(_JOINER) and len(token) == len(_JOINER) + 1):
            continue  # characters and their usable ## forms are already in `required`
        seen.add(token)
        vocab.append(token)
    _check_tokens(vocab)
    return vocab


def _check_tokens(vocab: list[str]) -> None:
    for index, token in enumerate(vocab):
        if not token or token != token.strip() or len(token.split()) != 1:
            raise AssertionError(f"learned token {index} {token!r} holds whitespace")


# ---------------------------------------------------------------------------
# Output and checks.


def check_writable(output_file: str) -> None:
    """Fails early (before minutes of learning) when `output_file` cannot be written."""
    if fileio.is_url(output_file):
        return
    if os.path.isdir(output_file):
        raise cli.UserError(f"--output_file={output_file} is a directory; expected a file "
                            "name such as vocab.txt")
    probe = fileio.temporary_path(output_file)
    try:
        fileio.makedirs(fileio.parent_dir(output_file))
        with fileio.open_file(probe, "wb"):
            pass
        fileio.remove(probe)
    except OSError as err:
        raise cli.UserError(f"--output_file={output_file}: cannot write there: "
                            f"{err.strerror or err}") from err


def write_vocab(vocab: list[str], output_file: str) -> None:
    """Writes one token per line (UTF-8, `\\n`) all-or-nothing: temporary name, then rename."""
    fileio.write_bytes(output_file, "".join(token + "\n" for token in vocab).encode("utf-8"))


def unk_report(vocab_file: str, lines: list[str], do_lower_case: bool) -> dict:
    """Tokenizes `lines` with FullTokenizer and returns words, pieces and [UNK] counts/rates."""
    tokenizer = tokenization.FullTokenizer(vocab_file, do_lower_case=do_lower_case)
    words = pieces = unknown = 0
    for line in lines:
        for word in tokenizer.basic_tokenizer.tokenize(line):
            word_pieces = tokenizer.wordpiece_tokenizer.tokenize(word)
            words += 1
            pieces += len(word_pieces)
            unknown += word_pieces.count(reference_tokenization.UNK_TOKEN)
    return {
        "sample_lines": len(lines),
        "sample_words": words,
        "sample_pieces": pieces,
        "unk_pieces": unknown,
        "unk_rate": unknown / pieces if pieces else 0.0,
        "pieces_per_word": pieces / words if words else 0.0,
    }


def build_vocab(input_file, output_file: str, config: VocabConfig, log=print) -> dict:
    """Reads the input, learns and writes the vocab, checks it; returns a summary dict.

    Args:
      input_file: comma-separated globs, or a list of globs.
      output_file: the vocab.txt to write.
      config: learner settings.
      log: callable taking one message string (progress).
    """
    config.validate()
    start = time.time()
    files = text_input.expand_input_files(input_file)
    check_writable(output_file)
    stats = TextStats(files=files)
    log(f"reading {len(files)} file(s)")
    word_counts = count_words(iter_text_lines(files, stats, config), config.do_lower_case)
    if stats.sample_probability < 1.0:
        log(f"input is {stats.input_bytes / 1e6:.1f} MB > --max_input_mb="
            f"{config.max_input_mb:g}: sampled {stats.lines_kept} of {stats.lines_read} lines")
    if not word_counts:
        raise cli.UserError(
            f"no text in the input: {len(files)} file(s) matching {input_file!r} hold "
            f"{stats.lines_read} line(s) and no words")
    read_seconds = time.time() - start
    log(f"counted {sum(word_counts.values())} words ({len(word_counts)} distinct) in "
        f"{stats.lines_kept} lines, {stats.input_bytes / 1e6:.2f} MB, {read_seconds:.1f} s")
    vocab = learn_vocab(word_counts, config)
    learn_seconds = time.time() - start - read_seconds
    log(f"learned {len(vocab)} tokens (target {config.vocab_size}) in {learn_seconds:.1f} s")
    write_vocab(vocab, output_file)
    report = unk_report(output_file, stats.sample_lines, config.do_lower_case)
    log(f"wrote {output_file}; [UNK] rate {report['unk_rate']:.4%} and "
        f"{report['pieces_per_word']:.3f} pieces per word on {report['sample_lines']} "
        f"sample lines")
    ids = {token: index for index, token in enumerate(vocab)}
    summary = {
        "output_file": output_file,
        "input_files": len(files),
        "input_bytes": stats.input_bytes,
        "lines_read": stats.lines_read,
        "lines_used": stats.lines_kept,
        "words": sum(word_counts.values()),
        "distinct_words": len(word_counts),
        "vocab_size": len(vocab),
        "target_vocab_size": config.vocab_size,
        "special_token_ids": {t: ids[t] for t in SPECIAL_TOKENS},
        "num_unused": config.num_unused,
        "character_tokens": len(character_tokens(word_counts)),
        "config": dataclasses.asdict(config),
        "seconds": round(time.time() - start, 3),
        **report,
    }
    return summary


def write_summary(summary: dict, output_file: str) -> str:
    """Writes `<output_file>.summary.json` and returns its path."""
    path = output_file + ".summary.json"
    fileio.write_text(path, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return path


# ---------------------------------------------------------------------------
# CLI.


def define_flags(flag_values=None) -> None:
    """Defines the CLI's flags (only ever called by the CLI entry points)."""
    from absl import flags

    fv = flag_values or flags.FLAGS
    defaults = VocabConfig()
    flags.DEFINE_string("input_file", None, "Input raw text file(s): comma-separated globs.",
                        flag_values=fv)
    flags.DEFINE_string("output_file", None, "Output vocab.txt (one token per line).",
                        flag_values=fv)
    flags.DEFINE_integer("vocab_size", defaults.vocab_size,
                         "Target (maximum) vocabulary size, special tokens included.",
                         flag_values=fv)
    flags.DEFINE_bool("do_lower_case", defaults.do_lower_case,
                      "Lower-case and strip accents (uncased model); use the same value "
                      "with create_pretraining_data and the runners.", flag_values=fv)
    flags.DEFINE_integer("num_unused", defaults.num_unused,
                         "Reserved [unusedN] tokens.", flag_values=fv)
    flags.DEFINE_enum("layout", defaults.layout, LAYOUTS,
                      "bert: [PAD] [unused0-98] [UNK] [CLS] [SEP] [MASK] [unused99..] "
                      "(Google's ids); compact: [PAD] [UNK] [CLS] [SEP] [MASK] [unused..].",
                      flag_values=fv)
    flags.DEFINE_integer("min_token_count", defaults.min_token_count,
                         "Lowest count a learned piece may have.", flag_values=fv)
    flags.DEFINE_integer("max_token_length", defaults.max_token_length,
                         "Longest learned piece, in characters.", flag_values=fv)
    flags.DEFINE_integer("num_iterations", defaults.num_iterations,
                         "Iterations of the WordPiece learner.", flag_values=fv)
    flags.DEFINE_integer("max_unique_words", defaults.max_unique_words,
                         "Most frequent distinct words given to the learner.", flag_values=fv)
    flags.DEFINE_float("max_input_mb", defaults.max_input_mb,
                       "Learn from a uniform random sample of lines when the input is larger "
                       "than this many MB; 0 reads everything.", flag_values=fv)
    flags.DEFINE_integer("random_seed", defaults.seed, "Seed of the line sampling.",
                         flag_values=fv)


def main(argv) -> int:
    """The command (flags parsed): `work` in the shell (`data_prep.cli`)."""
    return cli.run_main(lambda: _work(argv), "build_vocab")


def _work(argv) -> None:
    from absl import flags, logging

    if len(argv) > 1:
        raise cli.FlagError(f"unexpected arguments {argv[1:]}")
    FLAGS = flags.FLAGS
    for name in ("input_file", "output_file"):
        if not FLAGS[name].value:
            raise cli.FlagError(f"--{name} is required")
    config = VocabConfig(
        vocab_size=FLAGS.vocab_size, do_lower_case=FLAGS.do_lower_case,
        num_unused=FLAGS.num_unused, layout=FLAGS.layout,
        min_token_count=FLAGS.min_token_count, max_token_length=FLAGS.max_token_length,
        num_iterations=FLAGS.num_iterations, max_unique_words=FLAGS.max_unique_words,
        max_input_mb=FLAGS.max_input_mb, seed=FLAGS.random_seed)
    summary = build_vocab(FLAGS.input_file, FLAGS.output_file, config, log=logging.info)
    summary_path = write_summary(summary, FLAGS.output_file)
    logging.info("summary: %s", summary_path)
    print(f"vocab: {summary['vocab_size']} tokens -> {FLAGS.output_file}; [UNK] rate "
          f"{summary['unk_rate']:.4%}, {summary['pieces_per_word']:.3f} pieces/word on "
          f"{summary['sample_lines']} sample lines; ids: " + ", ".join(
              f"{t}={i}" for t, i in summary["special_token_ids"].items()))


def run() -> None:
    """Console-script entry point (`build_vocab`)."""
    define_flags()
    cli.start(main, "build_vocab")


if __name__ == "__main__":
    run()
