"""Pretraining instances from raw text: documents, segment packing, NSP pairs, masking.

The algorithm is Google's `create_pretraining_data.py`, step for step and random draw for
random draw: given the same documents and a `random.Random` in the same state, the
functions here produce exactly the original's instances (tests compare them). What
differs is the representation and the scale:

* tokens are vocabulary ids from the moment a line is tokenized, and `[CLS]`/`[SEP]`
  are known by position, so nothing is looked up twice;
* A and B are windows (index offsets) over the chunk's segments, so truncating a
  multi-megabyte line is linear, not quadratic;
* the corpus is processed in chunks (`plan_chunks`): byte ranges of the input files cut
  at document boundaries, each read, tokenized, turned into instances and serialised
  independently (`process_chunk`) with its own random generator (`chunk_rng`), so
  chunks run in parallel processes and memory does not grow with the corpus.

Pure Python: no TensorFlow here (worker processes never import it). Randomness is
always an injected `random.Random`.
"""

from __future__ import annotations

import dataclasses
import os
import random
import struct
from typing import Callable, List, Optional, Sequence

from data_prep import features, tokenization

MIN_MAX_SEQ_LENGTH = 5  # [CLS] A [SEP] B [SEP] with A and B of at least one token each.


class InputError(ValueError):
    """Bad input text: the message names the file, line and byte offset."""


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


@dataclasses.dataclass(frozen=True)
class MaskingVocab:
    """What masking needs from the vocabulary, as ids."""

    cls_id: int
    sep_id: int
    mask_id: int
    # The original draws a random replacement from `list(vocab.keys())`: every distinct
    # token (special and [unused] ones included), mapped to its id.
    replacement_ids: tuple
    # is_continuation[id] == 1 for `##` pieces (whole-word masking joins them to the word).
    is_continuation: bytes

    @classmethod
    def from_vocab(cls, vocab) -> "MaskingVocab":
        size = max(vocab.values()) + 1
        continuation = bytearray(size)
        for token, token_id in vocab.items():
            if token.startswith("##"):
                continuation[token_id] = 1
        return cls(cls_id=vocab["[CLS]"], sep_id=vocab["[SEP]"], mask_id=vocab["[MASK]"],
                   replacement_ids=tuple(vocab.values()), is_continuation=bytes(continuation))


class Instance:
    """One training pair: `[CLS] A [SEP] B [SEP]` as ids, masking already applied."""

    __slots__ = ("input_ids", "num_tokens_a", "masked_lm_positions", "masked_lm_ids",
                 "is_random_next")

    def __init__(self, input_ids, num_tokens_a, masked_lm_positions, masked_lm_ids,
                 is_random_next):
        self.input_ids = input_ids
        self.num_tokens_a = num_tokens_a
        self.masked_lm_positions = masked_lm_positions
        self.masked_lm_ids = masked_lm_ids
        self.is_random_next = is_random_next

    @property
    def segment_ids(self) -> List[int]:
        first = self.num_tokens_a + 2
        return [0] * first + [1] * (len(self.input_ids) - first)

    def to_features(self) -> dict:
        """Unpadded feature values, named as in `features.PRETRAINING`."""
        n = len(self.input_ids)
        k = len(self.masked_lm_positions)
        return {
            "input_ids": self.input_ids,
            "input_mask": [1] * n,
            "segment_ids": self.segment_ids,
            "masked_lm_positions": self.masked_lm_positions,
            "masked_lm_ids": self.masked_lm_ids,
            "masked_lm_weights": [1.0] * k,
            "next_sentence_labels": [1 if self.is_random_next else 0],
        }


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

    def count_instance(self, instance: Instance, max_seq_length: int) -> None:
        n = len(instance.input_ids)
        self.instances += 1
        self.tokens += n
        self.short_instances += n < max_seq_length
        self.random_next += instance.is_random_next
        self.masked += len(instance.masked_lm_positions)

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


# ---------------------------------------------------------------------------------------
# Instance creation (the original's algorithm).


def truncate_seq_pair(len_a: int, len_b: int, max_num_tokens: int, rng: random.Random):
    """Trims A and B one token at a time, from the longer (B on a tie), front or back.

    Returns the kept windows `(a_start, a_end, b_start, b_end)`; one coin flip per
    removed token, as the original, but on offsets so the cost is linear.
    """
    a_start, a_end, b_start, b_end = 0, len_a, 0, len_b
    flip = rng.random
    excess = len_a + len_b - max_num_tokens
    while excess > 0:
        if a_end - a_start > b_end - b_start:
            if flip() < 0.5:
                a_start += 1
            else:
                a_end -= 1
        else:
            if flip() < 0.5:
                b_start += 1
            else:
                b_end -= 1
        excess -= 1
    return a_start, a_end, b_start, b_end


def _window(segments: Sequence[Sequence[int]], start: int, end: int) -> List[int]:
    """Tokens [start, end) of the concatenation of `segments`, copying only those."""
    out: List[int] = []
    pos = 0
    for segment in segments:
        seg_end = pos + len(segment)
        if seg_end > start:
            out.extend(segment[max(start - pos, 0):end - pos])
        pos = seg_end
        if pos >= end:
            break
    return out


_BIT_LENGTHS = [n.bit_length() for n in range(4097)]


def shuffle(items: list, rng: random.Random) -> None:
    """`rng.shuffle(items)`: the same permutation from the same random draws, faster.

    The hot loop of masking; inlines CPython's Fisher-Yates with rejection sampling
    (`_randbelow_with_getrandbits`). Other generator types use their own `shuffle`.
    """
    if type(rng) is not random.Random:
        rng.shuffle(items)
        return
    getrandbits = rng.getrandbits
    bits = _BIT_LENGTHS if len(items) < len(_BIT_LENGTHS) else \
        [n.bit_length() for n in range(len(items) + 1)]
    for i in range(len(items) - 1, 0, -1):
        k = bits[i + 1]
        j = getrandbits(k)
        while j > i:
            j = getrandbits(k)
        items[i], items[j] = items[j], items[i]


def create_masked_lm_predictions(input_ids: List[int], num_tokens_a: int,
                                 config: PretrainingConfig, vocab: MaskingVocab,
                                 rng: random.Random, stats: Optional[Stats] = None):
    """Masks `input_ids` (`[CLS] A [SEP] B [SEP]`) in place.

    Returns (masked_lm_positions, masked_lm_ids), sorted by position.
    """
    n = len(input_ids)
    sep_a = num_tokens_a + 1
    if config.do_whole_word_mask:
        # A `##` piece joins the previous candidate word, even across A's [SEP] (the
        # original skips special tokens without closing the group).
        continuation = vocab.is_continuation
        candidates = []
        for i in range(1, n - 1):
            if i == sep_a:
                continue
            if candidates and continuation[input_ids[i]]:
                candidates[-1].append(i)
            else:
                candidates.append([i])
    else:
        candidates = list(range(1, sep_a))
        candidates.extend(range(sep_a + 1, n - 1))
    shuffle(candidates, rng)

    num_to_predict = min(config.max_predictions_per_seq,
                         max(1, int(round(n * config.masked_lm_prob))))
    if not config.do_whole_word_mask:
        chosen = candidates[:num_to_predict]
    else:
        chosen = []
        for group in candidates:
            if len(chosen) >= num_to_predict:
                break
            # A word that would exceed the count is skipped, not cut.
            if len(chosen) + len(group) > num_to_predict:
                continue
            chosen.extend(group)

    draw = rng.random
    replacements = vocab.replacement_ids
    last_replacement = len(replacements) - 1
    originals = {}
    as_mask = kept = replaced = 0
    for index in chosen:
        originals[index] = input_ids[index]
        if draw() < 0.8:
            input_ids[index] = vocab.mask_id
            as_mask += 1
        elif draw() < 0.5:
            kept += 1
        else:
            input_ids[index] = replacements[rng.randint(0, last_replacement)]
            replaced += 1
    if stats is not None:
        stats.masked_as_mask += as_mask
        stats.masked_kept += kept
        stats.masked_random += replaced
    positions = sorted(originals)
    return positions, [originals[p] for p in positions]


def create_instances_from_document(documents: Sequence[Sequence[Sequence[int]]],
                                   document_index: int, config: PretrainingConfig,
                                   vocab: MaskingVocab, rng: random.Random,
                                   stats: Optional[Stats] = None) -> List[Instance]:
    """All instances of one document in one dupe pass.

    `documents[d][s]` is segment (sentence) s of document d, as non-empty id lists.
    """
    document = documents[document_index]
    max_num_tokens = config.max_seq_length - 3
    # Drawn once per document and pass, not per instance.
    target_seq_length = max_num_tokens
    if rng.random() < config.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances = []
    chunk: list = []
    chunk_length = 0
    i = 0
    last = len(document) - 1
    while i <= last:
        segment = document[i]
        chunk.append(segment)
        chunk_length += len(segment)
        if i == last or chunk_length >= target_seq_length:
            a_end = 1
            if len(chunk) >= 2:
                a_end = rng.randint(1, len(chunk) - 1)
            a_segments = chunk[:a_end]
            len_a = sum(map(len, a_segments))

            if len(chunk) == 1 or rng.random() < 0.5:
                is_random_next = True
                target_b_length = target_seq_length - len_a
                for _ in range(10):
                    random_index = rng.randint(0, len(documents) - 1)
                    if random_index != document_index:
                        break
                random_document = documents[random_index]
                random_start = rng.randint(0, len(random_document) - 1)
                b_segments = []
                len_b = 0
                for j in range(random_start, len(random_document)):
                    b_segments.append(random_document[j])
                    len_b += len(random_document[j])
                    if len_b >= target_b_length:
                        break
                # The chunk's segments after A were not used: go back and reuse them.
                i -= len(chunk) - a_end
            else:
                is_random_next = False
                b_segments = chunk[a_end:]
                len_b = chunk_length - len_a

            a_lo, a_hi, b_lo, b_hi = truncate_seq_pair(len_a, len_b, max_num_tokens, rng)
            tokens_a = _window(a_segments, a_lo, a_hi)
            tokens_b = _window(b_segments, b_lo, b_hi)
            input_ids = [vocab.cls_id]
            input_ids += tokens_a
            input_ids.append(vocab.sep_id)
            input_ids += tokens_b
            input_ids.append(vocab.sep_id)
            positions, labels = create_masked_lm_predictions(
                input_ids, len(tokens_a), config, vocab, rng, stats)
            instance = Instance(input_ids, len(tokens_a), positions, labels, is_random_next)
            if stats is not None:
                stats.count_instance(instance, config.max_seq_length)
            instances.append(instance)
            chunk = []
            chunk_length = 0
        i += 1
    return instances


def create_training_instances(documents: list, config: PretrainingConfig,
                              vocab: MaskingVocab, rng: random.Random,
                              stats: Optional[Stats] = None) -> List[Instance]:
    """The original's `create_training_instances` after reading: shuffle documents (in
    place), `dupe_factor` passes over them, then shuffle the instances."""
    rng.shuffle(documents)
    instances: List[Instance] = []
    for _ in range(config.dupe_factor):
        for document_index in range(len(documents)):
            instances.extend(create_instances_from_document(
                documents, document_index, config, vocab, rng, stats))
    rng.shuffle(instances)
    return instances


# ---------------------------------------------------------------------------------------
# Reading: byte ranges of input files -> documents of id segments.


@dataclasses.dataclass(frozen=True)
class ByteRange:
    path: str
    start: int
    end: int


def line_number_at(path: str, offset: int) -> int:
    """1-based number of the line holding byte `offset` (used for error messages)."""
    count = 0
    with open(path, "rb") as f:
        remaining = offset
        while remaining > 0:
            block = f.read(min(remaining, 1 << 20))
            if not block:
                break
            count += block.count(b"\n")
            remaining -= len(block)
    return count + 1


def _blank(line: bytes) -> bool:
    return not line.strip()


def _find_cut(f, target: int, size: int, search_bytes: int):
    """A cut offset at or after `target`: just after a blank line if one starts within
    `search_bytes`, else at the first line start after `target`. Returns (offset, found)."""
    f.seek(target)
    f.readline()  # the rest of the line holding `target`
    fallback = f.tell()
    while f.tell() < size:
        line = f.readline()
        if _blank(line):
            return f.tell(), True
        if f.tell() - target > search_bytes:
            break
    if fallback >= size:
        return size, True
    return fallback, False


def plan_chunks(paths: Sequence[str], chunk_bytes: int,
                search_bytes: Optional[int] = None):
    """Cuts the input files into chunks of about `chunk_bytes` at document boundaries.

    A chunk is a tuple of ByteRanges (small files are packed together, large ones cut).
    Where no blank line lies within `search_bytes` (default: `chunk_bytes`) after a cut
    point, the document is cut at a line boundary instead. Returns (chunks, warnings).
    """
    search_bytes = search_bytes or chunk_bytes
    chunks, current, current_size, warnings = [], [], 0, []
    for path in paths:
        size = os.path.getsize(path)
        pos = 0
        with open(path, "rb") as f:
            while pos < size:
                want = chunk_bytes - current_size
                if size - pos <= want:
                    current.append(ByteRange(path, pos, size))
                    current_size += size - pos
                    break
                cut, found = _find_cut(f, pos + want, size, search_bytes)
                current.append(ByteRange(path, pos, cut))
                chunks.append(tuple(current))
                current, current_size = [], 0
                if not found:
                    warnings.append(
                        f"{path}:{line_number_at(path, cut)}: no blank line (document "
                        f"boundary) within {search_bytes / 1e6:.1f} MB after byte "
                        f"{pos + want}; the document is split into pieces here")
                pos = cut
        if current_size >= chunk_bytes:
            chunks.append(tuple(current))
            current, current_size = [], 0
    if current:
        chunks.append(tuple(current))
    return chunks, warnings


TokenizeIds = Callable[[str], List[int]]


def read_documents(ranges: Sequence[ByteRange], tokenize_ids: TokenizeIds,
                   stats: Optional[Stats] = None) -> list:
    """Documents of the byte ranges, read as the original reads its files.

    Lines end at "\\n"; each is stripped; a blank line ends the document; a line that
    tokenizes to nothing is skipped without ending it; empty documents are dropped.
    Invalid UTF-8 raises InputError naming the file, line and byte offset.
    """
    stats = stats if stats is not None else Stats()
    documents: list = []
    current: list = []
    for byte_range in ranges:
        with open(byte_range.path, "rb") as f:
            f.seek(byte_range.start)
            pos = byte_range.start
            while pos < byte_range.end:
                raw = f.readline()
                if not raw:
                    break
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError as err:
                    offset = pos + err.start
                    raise InputError(
                        f"{byte_range.path}:{line_number_at(byte_range.path, offset)}: "
                        f"invalid UTF-8 at byte offset {offset} ({err.reason}); "
                        f"the input must be UTF-8 text") from None
                pos += len(raw)
                stats.lines += 1
                if not line:
                    if current:
                        documents.append(current)
                        current = []
                    continue
                ids = tokenize_ids(line)
                if ids:
                    current.append(ids)
                else:
                    stats.empty_token_lines += 1
            stats.input_bytes += pos - byte_range.start
    if current:
        documents.append(current)
    stats.documents += len(documents)
    return documents


# ---------------------------------------------------------------------------------------
# One chunk, end to end: the unit of work of a worker process.


def chunk_rng(seed: int, chunk_index: int) -> random.Random:
    """The generator of one chunk. Chunk 0 uses the seed itself, so that a corpus that
    fits in one chunk gives exactly the original's instances, in the original's order."""
    if chunk_index == 0:
        return random.Random(seed)
    return random.Random(f"{seed}/chunk/{chunk_index}")


@dataclasses.dataclass(frozen=True)
class ChunkTask:
    index: int
    ranges: tuple
    vocab_file: str
    do_lower_case: bool
    config: PretrainingConfig
    seed: int


@dataclasses.dataclass
class ChunkResult:
    index: int
    records: list  # serialised tf.train.Example bytes, in the chunk's shuffled order
    stats: Stats


_TOKENIZERS: dict = {}  # per process: (vocab_file, do_lower_case) -> (tokenize_ids, MaskingVocab)


def load_tokenizer(vocab_file: str, do_lower_case: bool):
    """(tokenize_ids, MaskingVocab) for a vocab, built once per process."""
    key = (vocab_file, do_lower_case)
    if key not in _TOKENIZERS:
        tokenizer = tokenization.FullTokenizer(vocab_file=vocab_file,
                                               do_lower_case=do_lower_case)
        tokenize_ids = getattr(tokenizer, "tokenize_to_ids", None)
        if tokenize_ids is None:
            vocab = tokenizer.vocab

            def tokenize_ids(text, _tokenize=tokenizer.tokenize, _vocab=vocab):
                return [_vocab[t] for t in _tokenize(text)]

        _TOKENIZERS[key] = (tokenize_ids, MaskingVocab.from_vocab(tokenizer.vocab))
    return _TOKENIZERS[key]


_ONE_FLOAT32 = struct.pack("<f", 1.0)


class InstanceSerializer:
    """`encoder.encode(instance.to_features())`, fast: only the ids are encoded per
    instance; the map entries of the mask, segment ids, weights and label depend on a
    few lengths only and are cached."""

    def __init__(self, encoder: features.ExampleEncoder):
        self.encoder = encoder
        self._mask: dict = {}
        self._segments: dict = {}
        self._weights: dict = {}
        self._labels = {flag: encoder.entry("next_sentence_labels", bytes([flag]), 1)
                        for flag in (False, True)}

    def __call__(self, instance: Instance) -> bytes:
        encoder, packed = self.encoder, features.packed_uint
        n = len(instance.input_ids)
        first = instance.num_tokens_a + 2
        k = len(instance.masked_lm_positions)
        mask = self._mask.get(n)
        if mask is None:
            mask = self._mask[n] = encoder.entry("input_mask", b"\x01" * n, n)
        segments = self._segments.get((first, n))
        if segments is None:
            segments = self._segments[first, n] = encoder.entry(
                "segment_ids", b"\x00" * first + b"\x01" * (n - first), n)
        weights = self._weights.get(k)
        if weights is None:
            weights = self._weights[k] = encoder.entry("masked_lm_weights",
                                                       _ONE_FLOAT32 * k, k)
        return encoder.encode_entries((
            encoder.entry("input_ids", packed(instance.input_ids), n),
            mask,
            segments,
            encoder.entry("masked_lm_positions", packed(instance.masked_lm_positions), k),
            encoder.entry("masked_lm_ids", packed(instance.masked_lm_ids), k),
            weights,
            self._labels[bool(instance.is_random_next)],
        ))


def serialize_instance(instance: Instance, encoder: features.ExampleEncoder) -> bytes:
    """One instance's tf.train.Example bytes (see InstanceSerializer for the fast path)."""
    return InstanceSerializer(encoder)(instance)


def process_chunk(task: ChunkTask) -> ChunkResult:
    """Reads, tokenizes, builds and serialises one chunk's instances."""
    tokenize_ids, masking_vocab = load_tokenizer(task.vocab_file, task.do_lower_case)
    stats = Stats()
    documents = read_documents(task.ranges, tokenize_ids, stats)
    records: list = []
    if documents:
        config = task.config
        instances = create_training_instances(
            documents, config, masking_vocab, chunk_rng(task.seed, task.index), stats)
        del documents
        encoder = features.PRETRAINING.encoder(
            max_seq_length=config.max_seq_length,
            max_predictions_per_seq=config.max_predictions_per_seq)
        serialize = InstanceSerializer(encoder)
        records = [serialize(inst) for inst in instances]
    return ChunkResult(task.index, records, stats)
