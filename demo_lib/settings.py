"""The demo's sizes and paths: the full run's, --quick's, and the `Settings` resolved from them."""

from __future__ import annotations

import dataclasses
import os

FULL = {"corpus_mb": 3.0, "vocab_size": 5000, "dupe_factor": 5, "corpus_shards": 4,
        "num_train_steps": 300, "hidden_size": 128, "classifier_mb": 3.0,
        "classifier_rows_per_class": 1000, "classifier_epochs": 4.0,
        "classifier_learning_rate": 3e-4, "pretraining_learning_rate": 3e-4}
# --quick's classification text goes further than its corpus (0.4 MB): the first 0.15 MB
# hold too few module docstrings for balanced dev and test splits.
QUICK = {"corpus_mb": 0.15, "vocab_size": 1000, "dupe_factor": 1, "corpus_shards": 2,
         "num_train_steps": 20, "hidden_size": 32, "classifier_mb": 0.4,
         "classifier_rows_per_class": 100, "classifier_epochs": 2.0,
         "classifier_learning_rate": 1e-3, "pretraining_learning_rate": 1e-3}
# Full size: a peak learning rate of 1e-3 for 300 pretraining steps left an encoder that
# fine-tuning could not move off chance (dev accuracy 20% on 5 labels); 3e-4 pretrains
# better (masked-LM 7.4% vs 5.6%, next sentence 67.5% vs 60.2%) and fine-tunes.


@dataclasses.dataclass
class Settings:
    """The demo's sizes and paths, resolved from the flags."""

    output_dir: str
    corpus_mb: float
    vocab_size: int
    dupe_factor: int
    corpus_shards: int
    max_seq_length: int
    max_predictions_per_seq: int
    num_workers: int
    random_seed: int
    quick: bool
    num_train_steps: int = 300
    hidden_size: int = 128
    classifier_label: str = "kind"
    classifier_mb: float = 3.0
    classifier_rows_per_class: int = 1000
    classifier_epochs: float = 3.0
    classifier_learning_rate: float = 3e-4
    classifier_seq_length: int = 64
    pretraining_learning_rate: float = 1e-3

    def path(self, *parts: str) -> str:
        """A path under the output folder."""
        return os.path.join(self.output_dir, *parts)
