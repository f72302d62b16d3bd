"""Owns the `conlleval` command: the CoNLL shared tasks' report for a predictions file.

    python -m tasks.tagging.conlleval < dev_predictions.txt

reads lines of `word ... gold predicted` (run_ner.py's dev/test_predictions.txt, or any
file in the perl's input format) from stdin and prints the perl script's report
(`tasks.tagging.metrics`, where the rules are).
"""

from __future__ import annotations

import sys

from data_prep import cli
from tasks.tagging import metrics


def main(argv=None) -> int:
    """The command: the report on stdout; a malformed line is one error line, status 1."""
    return cli.run_main(lambda: _work(argv), "conlleval")


def _work(argv) -> None:
    cli.ArgumentParser(
        prog="python -m tasks.tagging.conlleval",
        description="conlleval's report (accuracy, chunk precision, recall, F1 overall and "
                    "per type) for `word ... gold predicted` lines on stdin.").parse_args(argv)
    sys.stdout.write(metrics.report(metrics.evaluate_lines(sys.stdin)))


if __name__ == "__main__":
    sys.exit(main())
