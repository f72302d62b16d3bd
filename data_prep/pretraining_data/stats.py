"""Owns the counts of a pretraining-data run: what the summary JSON reports."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Stats:
    """Counts behind the run summary; chunks' stats add up."""

    input_bytes: int = 0
    lines: int = 0
    empty_token_lines: int = 0  # non-blank lines that tokenize to nothing (skipped)
    documents: int = 0
    split_documents: int = 0  # documents cut at a chunk boundary (no blank line in reach)
    instances: int = 0
    tokens: int = 0  # real tokens, [CLS]/[SEP] included
    short_instances: int = 0  # fewer tokens than max_seq_length
    random_next: int = 0
    masked: int = 0
    masked_as_mask: int = 0
    masked_kept: int = 0
    masked_random: int = 0

    def add(self, other: "Stats") -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))

    def summary(self) -> dict:
        """Counts plus the derived shares (None where undefined)."""

        def share(num, den):
            return round(num / den, 6) if den else None

        out = dataclasses.asdict(self)
        out.update(
            masked_fraction=share(self.masked, self.tokens),
            random_next_share=share(self.random_next, self.instances),
            short_instance_share=share(self.short_instances, self.instances),
            mean_tokens_per_instance=share(self.tokens, self.instances),
            mask_token_share=share(self.masked_as_mask, self.masked),
            kept_token_share=share(self.masked_kept, self.masked),
            random_token_share=share(self.masked_random, self.masked),
        )
        return out
