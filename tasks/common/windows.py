"""Owns the sliding windows over a long token sequence: the original SQuAD doc_stride spans and the max-context rule.

SQuAD cuts a long context into windows `doc_stride` apart and scores each token from the
window where it has the most context; token tagging cuts long sentences the same way.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence


class DocSpan(NamedTuple):
    """One window: its first token and how many tokens it holds."""

    start: int
    length: int


def doc_spans_for(num_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> list[DocSpan]:
    """Windows over `num_tokens` sub-tokens: each at most `max_tokens_for_doc` long, the next
    starting `doc_stride` later, the last one ending at the final token."""
    spans: list[DocSpan] = []
    start = 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens_for_doc)
        spans.append(DocSpan(start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans


def max_context_span_index(spans: Sequence[DocSpan], num_tokens: int) -> list[int]:
    """For every sub-token, the window that scores it: the one where it has the most
    context, min(left, right) + 0.01 * window length; the earliest window wins ties."""
    best_score = [None] * num_tokens
    best_index = [-1] * num_tokens
    for span_index, (start, length) in enumerate(spans):
        end = start + length - 1
        bonus = 0.01 * length
        for position in range(start, end + 1):
            score = min(position - start, end - position) + bonus
            if best_score[position] is None or score > best_score[position]:
                best_score[position] = score
                best_index[position] = span_index
    return best_index
