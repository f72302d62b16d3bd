"""Owns the settings of pretraining-data generation and their validation."""

from __future__ import annotations

import dataclasses

MIN_MAX_SEQ_LENGTH = 5  # [CLS] A [SEP] B [SEP] with A and B of at least one token each.


class ConfigError(ValueError):
    """An invalid generation setting: the message names the flag."""


@dataclasses.dataclass(frozen=True)
class PretrainingConfig:
    """Generation settings; field names are the original's flag names."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    do_whole_word_mask: bool = False

    def validate(self) -> None:
        """Raises ConfigError naming the offending flag and the accepted range."""
        if self.max_seq_length < MIN_MAX_SEQ_LENGTH:
            raise ConfigError(
                f"--max_seq_length={self.max_seq_length} is too small: it must be at least "
                f"{MIN_MAX_SEQ_LENGTH} to hold [CLS] A [SEP] B [SEP] with one token in each "
                f"of A and B")
        if self.max_predictions_per_seq < 1:
            raise ConfigError(
                f"--max_predictions_per_seq={self.max_predictions_per_seq} must be at least 1")
        if self.max_predictions_per_seq > self.max_seq_length:
            raise ConfigError(
                f"--max_predictions_per_seq={self.max_predictions_per_seq} is larger than "
                f"--max_seq_length={self.max_seq_length}: at most "
                f"{self.max_seq_length - 3} tokens of a sequence can be masked")
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise ConfigError(f"--masked_lm_prob={self.masked_lm_prob} must be in (0, 1]")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError(f"--short_seq_prob={self.short_seq_prob} must be in [0, 1]")
        if self.dupe_factor < 1:
            raise ConfigError(f"--dupe_factor={self.dupe_factor} must be at least 1")
