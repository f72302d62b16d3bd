"""Owns the original's model input of a text or text pair: `[CLS] a [SEP] (b [SEP])`, the longer side trimmed to fit, zero padding.

Sentence classification, multiple choice (each choice a pair) and feature extraction
build their inputs alike (`pack_pair`).
"""

from __future__ import annotations


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_length: int) -> None:
    """Pops tokens in place from the end of the longer list (b on ties) until the pair fits."""
    while len(tokens_a) + len(tokens_b) > max_length:
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


def pack_pair(tokens_a: list, tokens_b: list | None, max_seq_length: int,
              tokenizer) -> tuple[list, list, list, list]:
    """The original's model input of one text or text pair, zero-padded to max_seq_length.

    `[CLS] a [SEP]` (segment ids 0), or with `tokens_b` `[CLS] a [SEP] b [SEP]` (b's
    segment ids 1); a pair is first cut by `truncate_seq_pair` to max_seq_length - 3
    tokens, a single text to max_seq_length - 2.

    Args:
      tokens_a, tokens_b: WordPiece tokens; `tokens_b` None for a single text (a list,
        even an empty one, is a second segment). Both are truncated in place.
      tokenizer: anything with `convert_tokens_to_ids`.

    Returns:
      (tokens with [CLS]/[SEP], unpadded; input_ids, input_mask, segment_ids, each of
      max_seq_length).
    """
    if tokens_b is not None:
        truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)
    else:
        del tokens_a[max(max_seq_length - 2, 0):]
    tokens = ["[CLS]", *tokens_a, "[SEP]"]
    segment_ids = [0] * len(tokens)
    if tokens_b is not None:
        tokens += [*tokens_b, "[SEP]"]
        segment_ids += [1] * (len(tokens_b) + 1)
    input_ids = list(tokenizer.convert_tokens_to_ids(tokens))
    padding = [0] * (max_seq_length - len(input_ids))
    return tokens, input_ids + padding, [1] * len(input_ids) + padding, segment_ids + padding
