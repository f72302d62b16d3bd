"""The `bert_tokenize` command: stdin lines -> lines of space-separated WordPieces.

    python -m data_prep.bert_tokenize --vocab_file=vocab.txt --do_lower_case=true < in.txt

Each stdin line (split on "\n" only) becomes one output line, through
`data_prep.tokenization.FullTokenizer` (the original's tokens). Bad input exits 1 with
`bert_tokenize: error: <what and where>` on stderr: all of it goes through `main`'s one
`except`. Nothing is written but stdout.
"""

from __future__ import annotations

import sys

from data_prep import text_input, tokenization

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


def _tokenize(argv) -> None:
    """Parses `argv` (program name first) and tokenizes stdin to stdout; raises
    ValueError (flags.Error, VocabError, InputError) for bad input."""
    from absl import flags

    define_flags()
    FLAGS = flags.FLAGS
    FLAGS.unparse_flags()  # a fresh parse each call (in-process callers run it repeatedly)
    extra = FLAGS(argv)[1:]
    if extra:
        raise ValueError(f"unexpected arguments {extra}; text is read from stdin")
    if not FLAGS.vocab_file:
        raise ValueError("--vocab_file is required")
    try:
        tokenizer = tokenization.FullTokenizer(FLAGS.vocab_file,
                                               do_lower_case=FLAGS.do_lower_case)
        tokenization.check_vocab(tokenizer.vocab, FLAGS.vocab_file)
    except tokenization.VocabError as err:
        raise ValueError(f"--vocab_file: {err}") from None
    tokenize_stream(tokenizer, sys.stdin.buffer, sys.stdout.buffer)


def main(argv) -> int:
    """The command: 0, or 1 with one error line (the CLI's one place for bad input)."""
    from absl import flags

    try:
        _tokenize(argv)
    except (ValueError, flags.Error) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    finally:
        sys.stdout.flush()  # the lines before an error are kept
    return 0


def run() -> None:
    """Console-script entry point (`bert_tokenize`)."""
    sys.exit(main(sys.argv))


if __name__ == "__main__":
    run()
