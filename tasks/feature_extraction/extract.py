"""Owns feature extraction: examples -> features -> the encoder's layers per token -> the original's JSON lines.

Google's extract_features.py's rules and output format: one example per input line
(`Example`), `[CLS] a [SEP] (b [SEP])` features (`convert_examples`), the chosen layers of
every real token (`compute_layers`: length buckets, any strategy, input order kept) and
one JSON line per example with values rounded to 6 decimals (`feature_json`).

A text longer than a window is cut to its first window, as the original does, or with
`Windows` read whole: SQuAD's doc_stride windows (`tasks.common.windows`), every token's
vectors from the window where it has the most context (`merge_windows`).

One vector per text instead (`sentence_vector`): the chosen layers' mean over each real
token, pooled as sentence-transformers' Pooling module pools (cls, mean, max; padding never
counted) and optionally L2-normalized as its Normalize module; written as JSON lines
(`embedding_json`) or one float32 ``.npy`` array (`NpyRows`).
"""

from __future__ import annotations

import collections
import dataclasses
import json

from data_prep.text_input import InputError
from tasks.common.pairs import pack_pair
from tasks.common.windows import DocSpan, doc_spans_for, max_context_span_index


@dataclasses.dataclass
class Example:
    """One input line: `text_a`, or the pair `text_a ||| text_b`; ids count lines from 0."""

    unique_id: int
    text_a: str
    text_b: str | None


@dataclasses.dataclass
class Feature:
    """An example's model input: its tokens and the padded ids, mask and segment ids."""

    unique_id: int
    tokens: list
    input_ids: list
    input_mask: list
    input_type_ids: list
    span: DocSpan | None = None  # a window of a long text: which of its WordPieces it holds


@dataclasses.dataclass(frozen=True)
class Windows:
    """Long texts read whole: windows `doc_stride` WordPieces apart (None: half a window),
    at most `max_windows_per_text` of them per text."""

    doc_stride: int | None = None
    max_windows_per_text: int = 64

    def stride(self, seq_length: int) -> int:
        if self.doc_stride is not None:
            return self.doc_stride
        return max(1, (seq_length - 2) // 2)


def convert_examples(examples: list, seq_length: int, tokenizer, windows: Windows | None = None,
                     source: str = "input") -> list:
    """[CLS] a [SEP] (b [SEP]) with segment ids 0 / 1, padded with zeros to seq_length
    (`tasks.common.pairs.pack_pair`, the original's rules).

    With `windows`, a single text longer than seq_length - 2 WordPieces is not cut: it
    becomes consecutive features `[CLS] window [SEP]`, one per doc_stride window (each with
    its `span`), for `merge_windows` to join. Texts that fit are features as without it.

    Raises:
      InputError naming `source` and the line: with `windows`, a pair that does not fit
      (pairs are not windowed) or a text needing more than max_windows_per_text windows.
    """
    features = []
    room = seq_length - 2
    for example in examples:
        tokens_a = tokenizer.tokenize(example.text_a)
        tokens_b = (tokenizer.tokenize(example.text_b) if example.text_b else None) or None
        line = f"{source}:{example.unique_id + 1}"
        if windows and tokens_b and len(tokens_a) + len(tokens_b) > seq_length - 3:
            raise InputError(
                f"{line}: a pair of {len(tokens_a)} + {len(tokens_b)} WordPieces does not fit "
                f"--max_seq_length={seq_length} and --long_text=windows reads single texts "
                "only: shorten the pair or use --long_text=truncate")
        if windows and len(tokens_a) > room and not tokens_b:
            features.extend(_windows_of(example.unique_id, tokens_a, seq_length, tokenizer,
                                        windows, line))
            continue
        tokens, ids, mask, type_ids = pack_pair(tokens_a, tokens_b, seq_length, tokenizer)
        features.append(Feature(example.unique_id, tokens, ids, mask, type_ids))
    return features


def _windows_of(unique_id, tokens_a, seq_length, tokenizer, windows, line) -> list:
    """One `[CLS] window [SEP]` feature per doc_stride window of a long single text."""
    spans = doc_spans_for(len(tokens_a), seq_length - 2, windows.stride(seq_length))
    if len(spans) > windows.max_windows_per_text:
        raise InputError(
            f"{line}: {len(tokens_a)} WordPieces need {len(spans)} windows of "
            f"--max_seq_length={seq_length} (--doc_stride={windows.stride(seq_length)}), "
            f"more than --max_windows_per_text={windows.max_windows_per_text}: raise it or "
            "split the line")
    features = []
    for span in spans:
        tokens, ids, mask, type_ids = pack_pair(
            tokens_a[span.start:span.start + span.length], None, seq_length, tokenizer)
        features.append(Feature(unique_id, tokens, ids, mask, type_ids, span))
    return features


def merge_windows(computed):
    """Joins `compute_layers`' windows of each long text into one (feature, layers).

    The joined feature holds `[CLS]`, every WordPiece of the text once in order, `[SEP]`;
    each WordPiece's vectors come from its max-context window
    (`tasks.common.windows.max_context_span_index`, SQuAD's rule), `[CLS]`'s from the
    first window and `[SEP]`'s from the last. Other features pass through unchanged.
    Holds one text's windows at a time.
    """
    group: list = []
    for feature, layers in computed:
        if group and feature.unique_id != group[0][0].unique_id:
            yield _joined(group)
            group = []
        if feature.span is None:
            yield feature, layers
        else:
            group.append((feature, layers))
    if group:
        yield _joined(group)


def _joined(group):
    """One text's (window feature, layers [layer, length, hidden]) as its whole line."""
    import numpy as np

    spans = [feature.span for feature, _ in group]
    num_tokens = spans[-1].start + spans[-1].length
    best = max_context_span_index(spans, num_tokens)
    first, last = group[0], group[-1]
    values = np.empty((first[1].shape[0], num_tokens + 2, first[1].shape[2]), np.float32)
    tokens = ["[CLS]"]
    values[:, 0] = first[1][:, 0]
    for position, index in enumerate(best):
        feature, layers = group[index]
        in_window = 1 + position - feature.span.start  # after the window's [CLS]
        tokens.append(feature.tokens[in_window])
        values[:, 1 + position] = layers[:, in_window]
    tokens.append("[SEP]")
    values[:, -1] = last[1][:, last[0].span.length + 1]
    return Feature(first[0].unique_id, tokens, [], [], []), values


def compute_layers(encoder, features: list, layer_indexes: list, batch_size: int,
                   strategy=None, jit_compile: bool = False, bucket_boundaries=(),
                   window_batches: int = 32):
    """Yields (feature, float32 array [len(layer_indexes), length, hidden]) in input order.

    `length` is the padded length of the feature's batch: max_seq_length, or with
    `bucket_boundaries` the smallest boundary that holds it (attention masks make the
    padding inert, so the vectors of the real tokens are the same); a bucket's batches
    hold `input_pipeline.bucket_batch_size` rows (as many tokens as a padded batch).
    Bucketing works on windows of `window_batches` batches, so memory stays bounded and
    lines stream out in input order.
    """
    import numpy as np
    import tensorflow as tf

    from training import input_pipeline

    strategy = strategy or tf.distribute.get_strategy()
    seq_length = len(features[0].input_ids) if features else 0
    boundaries = tuple(bucket_boundaries) or (seq_length,)

    def forward(batch):
        outputs = encoder(batch, training=False)["encoder_outputs"]
        return tf.stack([tf.cast(outputs[i], tf.float32) for i in layer_indexes], axis=1)

    forward_fn = tf.function(forward, jit_compile=jit_compile, autograph=False)

    @tf.function(autograph=False)
    def step(batch):
        return strategy.gather(strategy.run(forward_fn, args=(batch,)), axis=0)

    def run_batch(rows, length, size):
        arrays = {
            "input_ids": [f.input_ids[:length] for f in rows],
            "input_mask": [f.input_mask[:length] for f in rows],
            "segment_ids": [f.input_type_ids[:length] for f in rows],
        }
        # Pad a short batch to the bucket's `size` rows (one static shape per bucket).
        batch = {k: np.zeros([size, length], np.int32) for k in arrays}
        for key, values in arrays.items():
            batch[key][:len(rows)] = values
        return step(distribute(batch, size)).numpy()[:len(rows)]

    replicas = strategy.num_replicas_in_sync
    if batch_size % replicas:
        raise ValueError(f"--batch_size={batch_size} must be a multiple of the {replicas} "
                         "replicas")

    def distribute(batch, size):
        """Replica r gets rows [r * per, (r + 1) * per): gather puts them back in order."""
        per = size // replicas

        def rows_of(context):
            r = context.replica_id_in_sync_group
            return {k: tf.constant(v[r * per:(r + 1) * per]) for k, v in batch.items()}

        return strategy.experimental_distribute_values_from_function(rows_of)

    window = batch_size * window_batches
    for start in range(0, len(features), window):
        chunk = features[start:start + window]
        results = [None] * len(chunk)
        by_bucket: dict = {}
        for i, feature in enumerate(chunk):
            length = sum(feature.input_mask)
            bucket = next(b for b in boundaries if b >= length)
            by_bucket.setdefault(bucket, []).append(i)
        for length, positions in sorted(by_bucket.items()):
            size = input_pipeline.bucket_batch_size(batch_size, length, seq_length)
            for lo in range(0, len(positions), size):
                part = positions[lo:lo + size]
                picked = run_batch([chunk[i] for i in part], length, size)
                for i, row in zip(part, picked):
                    results[i] = row
        yield from zip(chunk, results)


def feature_json(feature: Feature, layers, layer_indexes: list) -> str:
    """One output line, exactly the original's layout and rounding."""
    tokens = []
    for position, token in enumerate(feature.tokens):
        entry = collections.OrderedDict()
        entry["token"] = token
        entry["layers"] = [
            collections.OrderedDict(
                [("index", layer_index),
                 ("values", [round(float(x), 6) for x in layers[j, position]])])
            for j, layer_index in enumerate(layer_indexes)
        ]
        tokens.append(entry)
    line = collections.OrderedDict([("linex_index", feature.unique_id), ("features", tokens)])
    return json.dumps(line) + "\n"


def sentence_vector(feature: Feature, layers, pooling: str, normalize: bool):
    """One text's vector, float32 [hidden], from `compute_layers` / `merge_windows`' layers
    [len(layer_indexes), length, hidden] of `feature`.

    The layers' mean at each real token ([CLS] ... [SEP]: `feature.tokens`; never the
    padding), then `pooling`: "cls" its [CLS] vector, "mean" the mean over the tokens,
    "max" the maximum of each dimension over them (sentence-transformers' Pooling modes);
    with `normalize` divided by its L2 norm (at least 1e-12, as its Normalize module).
    """
    import numpy as np

    tokens = layers[:, :len(feature.tokens)]
    tokens = tokens[0] if len(tokens) == 1 else tokens.mean(axis=0)
    if pooling == "cls":
        vector = tokens[0]
    elif pooling == "mean":
        vector = tokens.sum(axis=0) / np.float32(len(tokens))
    elif pooling == "max":
        vector = tokens.max(axis=0)
    else:
        raise ValueError(f"pooling {pooling!r} is not one of cls, mean, max")
    vector = vector.astype(np.float32)
    if normalize:
        vector = vector / max(np.float32(np.linalg.norm(vector)), np.float32(1e-12))
    return vector


def embedding_json(feature: Feature, vector) -> str:
    """One output line of a text's vector, rounded to 6 decimals as the token output."""
    values = [round(float(x), 6) for x in vector]
    return json.dumps({"linex_index": feature.unique_id, "embedding": values}) + "\n"


class NpyRows:
    """A ``.npy`` file of one float32 array [rows, dim] written a row at a time (rows in
    the order written), so that large inputs never sit in memory whole.

    Args:
      writer: a binary file object.
      rows, dim: the array's shape, known before the first row.
    """

    def __init__(self, writer, rows: int, dim: int):
        import numpy as np

        self.writer, self.expected, self.dim, self.written = writer, rows, dim, 0
        np.lib.format.write_array_header_1_0(
            writer, {"descr": "<f4", "fortran_order": False, "shape": (rows, dim)})

    def write(self, vector) -> None:
        import numpy as np

        vector = np.asarray(vector, "<f4")
        if vector.shape != (self.dim,) or self.written == self.expected:
            raise ValueError(f"row {self.written} of shape {vector.shape} does not fit "
                             f"[{self.expected}, {self.dim}]")
        self.writer.write(vector.tobytes())
        self.written += 1

    def close(self) -> None:
        if self.written != self.expected:
            raise ValueError(f"{self.written} rows written of {self.expected}")
