"""Owns the original's text-pair truncation: `[CLS] a [SEP] b [SEP]` fits max_seq_length by trimming the longer side.

Sentence-pair classification and multiple choice (each choice a pair) truncate alike.
"""

from __future__ import annotations


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_length: int) -> None:
    """Pops tokens in place from the end of the longer list (b on ties) until the pair fits."""
    while len(tokens_a) + len(tokens_b) > max_length:
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()
