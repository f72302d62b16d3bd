"""Owns the settings of pretraining-data generation and their validation."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

from data_prep.cli import FlagError

MIN_MAX_SEQ_LENGTH = 5  # [CLS] A [SEP] B [SEP] with A and B of at least one token each.
# The settings of on-the-fly masking (unmasked records masked as the masked LM reads them:
# the vocab and this config's masking fields), named as their run_pretraining.py flags.
MASKING_SETTINGS = ("vocab_file", "masked_lm_prob", "do_whole_word_mask", "mask_token_rate",
                    "random_token_rate")


@dataclasses.dataclass(frozen=True)
class PretrainingConfig:
    """Generation settings; field names are the original's flag names."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    do_whole_word_mask: bool = False
    # Of the positions chosen for prediction, the share shown as [MASK] and the share
    # replaced by a random vocabulary entry; the rest keep their token (keras-hub's
    # names; the original's 80/10/10 by default; BERT paper, Table 8).
    mask_token_rate: float = 0.8
    random_token_rate: float = 0.1
    # False: no next-sentence task (the paper's "No NSP" and "LTR & No NSP" models): B is
    # always the text that follows A, never a random document (`instances` module).
    next_sentence_prediction: bool = True

    def validate(self) -> None:
        """Raises FlagError naming the offending flag and the accepted range."""
        if self.max_seq_length < MIN_MAX_SEQ_LENGTH:
            raise FlagError(
                f"--max_seq_length={self.max_seq_length} is too small: it must be at least "
                f"{MIN_MAX_SEQ_LENGTH} to hold [CLS] A [SEP] B [SEP] with one token in each "
                f"of A and B")
        if self.max_predictions_per_seq < 1:
            raise FlagError(
                f"--max_predictions_per_seq={self.max_predictions_per_seq} must be at least 1")
        if self.max_predictions_per_seq > self.max_seq_length:
            raise FlagError(
                f"--max_predictions_per_seq={self.max_predictions_per_seq} is larger than "
                f"--max_seq_length={self.max_seq_length}: at most "
                f"{self.max_seq_length - 3} tokens of a sequence can be masked")
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise FlagError(f"--masked_lm_prob={self.masked_lm_prob} must be in (0, 1]")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise FlagError(f"--short_seq_prob={self.short_seq_prob} must be in [0, 1]")
        if self.dupe_factor < 1:
            raise FlagError(f"--dupe_factor={self.dupe_factor} must be at least 1")
        check_token_rates(self.mask_token_rate, self.random_token_rate)


def exact_rate(rate: float) -> Fraction:
    """A rate as the decimal it was written as (0.8 is 4/5, not the binary float just
    below): so that 0.8 + 0.2 is exactly 1 and the default thresholds are exactly the
    original's constants (`masking.two_draw_thresholds`)."""
    return Fraction(repr(float(rate)))


def check_token_rates(mask_token_rate: float, random_token_rate: float) -> None:
    """Raises FlagError naming the flag unless both rates are in [0, 1] and their sum
    (decimal, exact) is at most 1; NaN and infinities are refused."""
    for name, rate in (("mask_token_rate", mask_token_rate),
                       ("random_token_rate", random_token_rate)):
        if not (isinstance(rate, (int, float)) and math.isfinite(rate)
                and 0.0 <= rate <= 1.0):
            raise FlagError(f"--{name}={rate} must be a number in [0, 1]")
    if exact_rate(mask_token_rate) + exact_rate(random_token_rate) > 1:
        raise FlagError(
            f"--mask_token_rate={mask_token_rate} plus --random_token_rate="
            f"{random_token_rate} is more than 1: they are shares of the masked positions "
            "(the rest keep their token)")
