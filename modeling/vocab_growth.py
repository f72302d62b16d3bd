"""Owns growing a network's vocabulary: the new word-embedding rows and masked-LM output biases, every other weight copied as it is.

A grown network has ``vocab_size`` rows (more than the old one when words are appended,
as many when they replace ``[unused*]`` rows). Each row named in ``sources`` starts

* ``init="mean"``: at the mean of the OLD rows listed for it (the pieces the old vocab
  split the word into; an empty list: the mean of every old row), and its masked-LM
  output bias at the mean of those rows' biases (IndoBERTweet, FVT, AdaLM: a new word
  then starts where the model already reads its pieces);
* ``init="random"``: at the original's initializer, a normal of stddev
  ``initializer_range`` truncated at two standard deviations (``tf.truncated_normal``),
  with bias 0, as a table built from scratch starts.

The word-embedding table is also the masked LM's output projection (tied), so a new row
is both how the word is read and how it is predicted. Every other tensor (the old rows
and biases, encoder, pooler, the masked-LM transform, the next-sentence head) is copied
unchanged: a value in, the same value out. Optimizers are not part of a network: a grown
model starts its optimizer fresh.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from modeling.config import BertConfig
from modeling.encoder import BertEncoder

INITS = ("mean", "random")


def grow_network(network, config: BertConfig, vocab_size: int,
                 sources: Mapping[int, Sequence[int]], init: str = "mean", seed: int = 0):
    """A copy of ``network`` with ``vocab_size`` vocab rows, the rows of ``sources`` new.

    Args:
      network: a ``BertEncoder`` or a ``BertPretrainer`` (its heads are kept).
      config: its ``BertConfig``.
      vocab_size: rows of the grown tables, at least ``config.vocab_size``.
      sources: new row id -> the old row ids whose mean it starts at (``init="mean"``;
        empty: every old row). Rows below ``config.vocab_size`` are replaced (``[unused*]``
        slots), rows above it are appended; an appended row must be listed.
      init: one of ``INITS``.
      seed: the draws of ``init="random"``.

    Returns:
      (grown network, grown config).
    """
    from modeling import models
    from modeling.checkpoints import weight_table

    old_size = config.vocab_size
    if init not in INITS:
        raise ValueError(f"init={init!r}; expected one of {INITS}")
    if vocab_size < old_size:
        raise ValueError(f"vocab_size={vocab_size} is below the network's {old_size}")
    unlisted = sorted(set(range(old_size, vocab_size)) - set(sources))
    if unlisted or any(not 0 <= row < vocab_size for row in sources):
        raise ValueError(f"every appended row needs its sources (rows {unlisted[:5]} have "
                         f"none) and every row must be below vocab_size={vocab_size}")
    grown_config = dataclasses.replace(config, vocab_size=vocab_size)
    if isinstance(network, BertEncoder):
        grown = BertEncoder(grown_config)
        old_bias = None
    else:
        grown = models.BertPretrainer(grown_config,
                                      next_sentence_prediction=network.next_sentence_prediction,
                                      objective=network.objective)
        old_bias = np.asarray(network.masked_lm.output_bias.numpy())
    old_table = np.asarray(_encoder(network).word_embeddings.numpy())
    table, bias = _grown_rows(old_table, old_bias, vocab_size, sources, init,
                              config.initializer_range, np.random.default_rng(seed))
    old_variables = {entry.tf1_name: entry.variable for entry in weight_table(network)}
    grown_vocab_variables = {id(v): value for v, value in _vocab_variables(grown, table, bias)}
    done = set()
    for entry in weight_table(grown):
        variable = entry.variable
        if id(variable) in done:
            continue  # the fused query/key/value kernel appears once per block
        done.add(id(variable))
        value = grown_vocab_variables.get(id(variable))
        if value is None:
            value = old_variables[entry.tf1_name].numpy()
        variable.assign(value)
    return grown, grown_config


def _encoder(network) -> BertEncoder:
    return network if isinstance(network, BertEncoder) else network.encoder


def _vocab_variables(network, table: np.ndarray, bias) -> list:
    """(variable, value) of the tables that have a row per vocab entry."""
    pairs = [(_encoder(network).word_embeddings, table)]
    if bias is not None:
        pairs.append((network.masked_lm.output_bias, bias))
    return pairs


def _grown_rows(table: np.ndarray, bias, vocab_size: int,
                sources: Mapping[int, Sequence[int]], init: str, stddev: float, rng):
    """The grown word-embedding table [vocab_size, hidden] and output bias [vocab_size]
    (None without a masked-LM head); old rows not in `sources` are kept bit for bit."""
    old_size, hidden = table.shape
    new_table = np.zeros((vocab_size, hidden), table.dtype)
    new_table[:old_size] = table
    new_bias = None
    if bias is not None:
        new_bias = np.zeros((vocab_size,), bias.dtype)
        new_bias[:old_size] = bias
    for row in sorted(sources):
        rows = list(sources[row]) or list(range(old_size))
        if init == "mean":
            new_table[row] = table[rows].astype(np.float64).mean(axis=0)
            if bias is not None:
                new_bias[row] = bias[rows].astype(np.float64).mean()
        else:
            new_table[row] = truncated_normal(rng, stddev, hidden)
            if bias is not None:
                new_bias[row] = 0.0
    return new_table, new_bias


def truncated_normal(rng: np.random.Generator, stddev: float, size: int) -> np.ndarray:
    """A normal(0, stddev) sample redrawn beyond two standard deviations, as
    ``tf.truncated_normal`` (the original's ``create_initializer``)."""
    values = rng.normal(0.0, stddev, size)
    outside = np.abs(values) > 2 * stddev
    while outside.any():
        values[outside] = rng.normal(0.0, stddev, int(outside.sum()))
        outside = np.abs(values) > 2 * stddev
    return values
