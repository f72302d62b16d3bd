"""The `bert_tokenize` command: stdin lines -> lines of space-separated WordPieces.

    python -m data_prep.bert_tokenize --vocab_file=vocab.txt --do_lower_case=true < in.txt

Each stdin line (split on "\n" only) becomes one output line, through
`data_prep.tokenization.FullTokenizer` (the original's tokens). Bad input exits 1 with
`bert_tokenize: error: <what and where>` on stderr, through the one CLI shell
(`data_prep.cli`). Nothing is written but stdout.
"""

from __future__ import annotations

import contextlib
import sys

from data_prep import cli, text_input, tokenization

PROG = "bert_tokenize"


def define_flags() -> None:
    """Defines the flags (at start-up, never at import: other CLIs use the same names)."""
    from absl import flags

    if "vocab_file" not in flags.FLAGS:
        flags.DEFINE_string("vocab_file", None, "WordPiece vocab file (one token per line).")
    if "do_lower_case" not in flags.FLAGS:
        flags.DEFINE_bool("do_lower_case", True, "Lower-case and strip accents (uncased models).")


def tokenize_stream(tokenizer, source, sink, batch_lines: int = 4096) -> int:
    r"""Writes one line of space-separated tokens to `sink` (binary) per line of `source`.

    `source` is a binary stream split on b"\n" only. Returns the number of lines. Raises
    `text_input.InputError` naming the line and byte offset of invalid UTF-8, after
    writing the lines before it.
    """
    out: list[str] = []
    count = offset = 0
    for count, raw in enumerate(source, start=1):
        try:
            line = text_input.decode_utf8(raw, "stdin", first_line=count, first_offset=offset)
        except text_input.InputError:
            sink.write("".join(out).encode("utf-8"))
            raise
        offset += len(raw)
        if line.endswith("\n"):
            line = line[:-1]
        out.append(" ".join(tokenizer.tokenize(line)) + "\n")
        if len(out) >= batch_lines:
            sink.write("".join(out).encode("utf-8"))
            out.clear()
    sink.write("".join(out).encode("utf-8"))
    return count


def main(argv) -> int:
    """The command (flags parsed): `_work` in the shell (`data_prep.cli`)."""
    return cli.run_main(lambda: _work(argv), PROG)


def _work(argv) -> None:
    """Tokenizes stdin to stdout; the lines before an error are kept (flushed)."""
    from absl import flags

    if len(argv) > 1:
        raise cli.FlagError(f"unexpected arguments {argv[1:]}; text is read from stdin")
    FLAGS = flags.FLAGS
    if not FLAGS.vocab_file:
        raise cli.FlagError("--vocab_file is required")
    try:
        tokenizer = tokenization.FullTokenizer(FLAGS.vocab_file,
                                               do_lower_case=FLAGS.do_lower_case)
        tokenization.check_vocab(tokenizer.vocab, FLAGS.vocab_file)
    except tokenization.VocabError as err:
        raise cli.FlagError(f"--vocab_file: {err}") from None
    try:
        tokenize_stream(tokenizer, sys.stdin.buffer, sys.stdout.buffer)
    except BrokenPipeError:  # `| head`: the reader closed stdout, no defect of ours
        raise cli.UserError("stdout was closed before every line was written") from None
    finally:
        with contextlib.suppress(BrokenPipeError):
            sys.stdout.flush()


def run() -> None:
    """Console-script entry point (`bert_tokenize`)."""
    define_flags()
    cli.start(main, PROG)


if __name__ == "__main__":
    run()
