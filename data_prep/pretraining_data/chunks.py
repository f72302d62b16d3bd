"""Owns one unit of work of the local pipeline: a chunk, read to framed TFRecord bytes.

`process_chunk` runs in a worker process (or in the main one): it reads and tokenizes
the chunk's byte ranges, builds and masks its instances with the chunk's own generators,
serialises and frames them, and returns the bytes with the chunk's counts. Chunks are
independent, so they run in parallel and memory does not grow with the corpus.
"""

from __future__ import annotations

import dataclasses

from data_prep import features, tokenization
from data_prep.pretraining_data.config import PretrainingConfig
from data_prep.pretraining_data.documents import read_documents
from data_prep.pretraining_data.instances import unit_instances
from data_prep.pretraining_data.masking import MaskingVocab
from data_prep.pretraining_data.records import CompactSerializer, record_encoder
from data_prep.pretraining_data.stats import Stats


@dataclasses.dataclass(frozen=True)
class ChunkTask:
    """One unit of work of the local pipeline: a chunk's byte ranges and the settings."""

    index: int
    ranges: tuple  # documents.ByteRange, in order
    vocab_file: str
    do_lower_case: bool
    config: PretrainingConfig
    seed: int
    # Draw everything as the original does (Python's random, in its order); otherwise
    # masking is vectorised with numpy (`masking.mask_vectorized`).
    exact_draws: bool = False
    # Write the pairs unmasked (features.PRETRAINING_UNMASKED) for masking on the fly.
    dynamic_masking: bool = False


@dataclasses.dataclass
class ChunkResult:
    """What a worker returns for a chunk: its framed records and its counts."""

    index: int
    # The chunk's records in its shuffled order, already TFRecord-framed
    # (`features.frame_concatenated`), as one string: one object to pass between processes.
    data: bytes
    lengths: list  # framed length of each record, in order
    stats: Stats

    def records(self) -> list:
        """The framed records, one string each."""
        data, out, pos = self.data, [], 0
        for length in self.lengths:
            out.append(data[pos:pos + length])
            pos += length
        return out


_TOKENIZERS: dict = {}  # per process: (vocab_file, do_lower_case) -> (tokenize_ids, MaskingVocab)


def load_tokenizer(vocab_file: str, do_lower_case: bool):
    """(tokenize_ids, MaskingVocab) for a vocab, built once per process."""
    key = (vocab_file, do_lower_case)
    if key not in _TOKENIZERS:
        tokenizer = tokenization.FullTokenizer(vocab_file=vocab_file,
                                               do_lower_case=do_lower_case)
        _TOKENIZERS[key] = (tokenizer.tokenize_to_ids,
                            MaskingVocab.from_vocab(tokenizer.vocab))
    return _TOKENIZERS[key]


def process_chunk(task: ChunkTask) -> ChunkResult:
    """Reads, tokenizes, builds, serialises and frames one chunk's instances."""
    tokenize_ids, masking_vocab = load_tokenizer(task.vocab_file, task.do_lower_case)
    stats = Stats()
    documents = read_documents(task.ranges, tokenize_ids, stats)
    data, lengths = b"", []
    if documents:
        compact = unit_instances(documents, task.config, masking_vocab, seed=task.seed,
                                 index=task.index, exact_draws=task.exact_draws,
                                 dynamic_masking=task.dynamic_masking, stats=stats)
        del documents
        encoder = record_encoder(task.config, task.dynamic_masking)
        records, record_lengths = CompactSerializer(encoder, masking_vocab)(compact)
        del compact
        data, lengths = features.frame_concatenated(records, record_lengths)
    return ChunkResult(task.index, data, lengths, stats)
