"""Owns the serialisation of pretraining instances: tf.train.Example bytes, vectorised.

A chunk's instances become their records at once (`CompactSerializer`), without
TensorFlow: the bytes `features.ExampleEncoder` writes for the schema of the run
(`record_encoder`: masked records, or the unmasked pairs of dynamic masking), which
`features.frame_concatenated` then frames as TFRecords.
"""

from __future__ import annotations

import numpy as np

from data_prep import features
from data_prep.pretraining_data.config import PretrainingConfig
from data_prep.pretraining_data.instances import CompactInstances
from data_prep.pretraining_data.masking import MaskingVocab


def _varints(values, np):
    """Vectorised varints of a non-negative integer array: (bytes [..., w] uint8, which
    of them are used [..., w] bool, number used [...]), w the widest varint present."""
    top = int(values.max()) if values.size else 0
    width = max(1, (top.bit_length() + 6) // 7)
    if width == 1:
        return (values.astype(np.uint8)[..., None], np.ones(values.shape + (1,), bool),
                np.ones(values.shape, dtype=np.int64))
    if width == 2:  # (vocab ids below 16,384) both bytes at once, as one uint16
        values = values.astype(np.uint16)
        more = values >= 128
        pair = (values & np.uint16(0x7F)) | (values >> np.uint16(7) << np.uint16(8))
        pair |= more.view(np.uint8).astype(np.uint16) << np.uint16(7)
        used = np.empty(values.shape + (2,), dtype=bool)
        used[..., 0] = True
        used[..., 1] = more
        return (pair.astype("<u2", copy=False).view(np.uint8).reshape(values.shape + (2,)),
                used, more.astype(np.int64) + 1)
    values = values.astype(np.uint64 if width > 4 else np.uint32)
    out = np.empty(values.shape + (width,), dtype=np.uint8)
    used = np.empty(values.shape + (width,), dtype=bool)
    nbytes = np.ones(values.shape, dtype=np.int64)
    for j in range(width):
        more = values >= (1 << (7 * (j + 1))) if j + 1 < 10 else np.zeros(values.shape, bool)
        group = (values >> (7 * j)).astype(np.uint8) & np.uint8(0x7F)
        group |= more.view(np.uint8) << np.uint8(7)
        out[..., j] = group
        used[..., j] = nbytes > j if j else True
        if j + 1 < width:
            nbytes += more
    return out, used, nbytes


def _varint_len(values, np):
    out = np.ones(values.shape, dtype=np.int64)
    for j in range(1, 10):
        out += values >= (1 << (7 * j))
    return out


class CompactSerializer:
    """A whole `CompactInstances` serialised at once, vectorised with numpy: the bytes of
    `features.ExampleEncoder.encode` of each instance's features (tested against it and
    against TensorFlow's parser), a few microseconds per instance instead of tens.

    Each instance's record is assembled as a row of byte columns (constant header bytes,
    varints with their used/unused bytes) and the used bytes of all rows, read in row
    order, are the records laid end to end. The encoder's schema decides the record kind:
    `features.PRETRAINING` (masked) or `features.PRETRAINING_UNMASKED` (the pairs only,
    for dynamic masking; the instances' masking, if any, is ignored).
    """

    BLOCK = 4096  # instances per step: bounds the memory of the byte matrices

    def __init__(self, encoder: features.ExampleEncoder, vocab: MaskingVocab):
        self.np = np
        self.encoder = encoder
        self.vocab = vocab
        self.seq = encoder.lengths["input_ids"]
        self.masked = "masked_lm_ids" in encoder.lengths
        self.preds = encoder.lengths["masked_lm_ids"] if self.masked else 0

    def _constant_entry_header(self, name, payload_len, count):
        return self.encoder.entry(name, b"\x00" * payload_len, count)[:-payload_len]

    def _variable_entry(self, name, payload, used, payload_len):
        """Pieces and total length of a map entry whose payload length varies by row."""
        np = self.np
        key_field, oneof = self.encoder.entry_key_and_tag(name)
        f_len = 1 + _varint_len(payload_len, np) + payload_len
        v_len = 1 + _varint_len(f_len, np) + f_len
        e_len = len(key_field) + 1 + _varint_len(v_len, np) + v_len
        pieces = [b"\x0a", _varints(e_len, np)[:2], key_field + b"\x12",
                  _varints(v_len, np)[:2], oneof, _varints(f_len, np)[:2], b"\x0a",
                  _varints(payload_len, np)[:2], (payload, used)]
        return pieces, 1 + _varint_len(e_len, np) + e_len

    def __call__(self, compact: CompactInstances):
        """(the records laid end to end as a uint8 array, their lengths), in the
        instances' final order."""
        np = self.np
        blocks = list(self.blocks(compact))
        if not blocks:
            return np.zeros(0, np.uint8), np.zeros(0, np.int64)
        return (np.concatenate([b[0] for b in blocks]),
                np.concatenate([b[1] for b in blocks]))

    def blocks(self, compact: CompactInstances):
        """`__call__` block by block (`BLOCK` instances each), so a caller that passes
        records on (the Beam pipeline) never holds all of them."""
        np = self.np
        if not len(compact):
            return
        tokens = np.fromiter(compact.tokens, dtype=np.int64, count=len(compact.tokens))
        if len(tokens) < 2**31 and (not len(tokens) or int(tokens.max()) < 2**31):
            tokens = tokens.astype(np.int32)
        # Windows of `seq` tokens starting anywhere from -seq to len(tokens) (zeros
        # outside): row t of an instance's A (or B) part is one window, copied whole.
        pad = np.zeros(self.seq, dtype=tokens.dtype)
        windows = np.lib.stride_tricks.sliding_window_view(
            np.concatenate([pad, tokens, pad]), self.seq)
        columns = dict(
            a_start=np.array(compact.a_start, dtype=np.int64),
            a_len=np.array(compact.a_len, dtype=np.int64),
            b_start=np.array(compact.b_start, dtype=np.int64),
            b_len=np.array(compact.b_len, dtype=np.int64),
            random_next=np.array(compact.random_next, dtype=np.uint8))
        order = np.array(compact.order, dtype=np.int64)
        if self.masked:
            num_masked = np.array(compact.num_masked, dtype=np.int64)
            mask_start = np.zeros(len(num_masked), dtype=np.int64)
            np.cumsum(num_masked[:-1], out=mask_start[1:])
            positions = np.append(np.array(compact.positions, dtype=np.int64), 0)
            values = np.append(np.array(compact.values, dtype=np.int64), 0)
        else:
            num_masked = mask_start = np.zeros(len(order), dtype=np.int64)
            positions = values = np.zeros(1, dtype=np.int64)
        for lo in range(0, len(order), self.BLOCK):
            rows = order[lo:lo + self.BLOCK]
            yield self._block({k: v[rows] for k, v in columns.items()}, num_masked[rows],
                              mask_start[rows], positions, values, windows)

    def _block(self, cols, num_masked, mask_start, positions, values, windows):
        np = self.np
        seq, preds, vocab = self.seq, self.preds, self.vocab
        rows = len(num_masked)
        row_index = np.arange(rows)
        la = cols["a_len"][:, None]
        # [CLS] A [SEP] B [SEP], or [CLS] A [SEP] where B is empty (the one-segment
        # instances without the next-sentence task; never in the original's records).
        n = (cols["a_len"] + cols["b_len"] + 3 - (cols["b_len"] == 0))[:, None]
        col = np.arange(seq)
        # Column c holds A's token a_start + c - 1 for c in 1..la, B's token
        # b_start + c - la - 2 for c in la+2..n-2: B's window, A's copied over it.
        ids = windows[cols["b_start"] - cols["a_len"] - 2 + seq]
        np.copyto(ids, windows[cols["a_start"] - 1 + seq], where=(col >= 1) & (col <= la))
        ids[col >= n - 1] = 0
        ids[:, 0] = vocab.cls_id
        ids[row_index, cols["a_len"] + 1] = vocab.sep_id
        ids[row_index, n[:, 0] - 1] = vocab.sep_id
        if self.masked:
            # Masking: positions, original ids, and the values written over them.
            slot = np.arange(preds)
            real = slot < num_masked[:, None]
            flat = np.where(real, mask_start[:, None] + slot, -1)
            pos = np.where(real, positions[flat], 0)
            new = values[flat]
            labels = np.where(real, ids[row_index[:, None], pos], 0)
            write = real & (new >= 0)
            ids[np.nonzero(write)[0], pos[write]] = new[write]

        pieces = []
        total = np.zeros(rows, dtype=np.int64)
        # input_ids
        payload, used, nbytes = _varints(ids, np)
        entry, size = self._variable_entry("input_ids", payload.reshape(rows, -1),
                                           used.reshape(rows, -1), nbytes.sum(axis=1))
        pieces += entry
        total += size
        # input_mask, segment_ids: one byte per value, constant headers.
        for name, payload in (
                ("input_mask", (col < n).astype(np.uint8)),
                ("segment_ids", ((col >= la + 2) & (col < n)).astype(np.uint8))):
            header = self._constant_entry_header(name, seq, seq)
            pieces += [header, (payload, None)]
            total += len(header) + seq
        if self.masked:
            # masked_lm_positions, masked_lm_ids: varints.
            for name, matrix in (("masked_lm_positions", pos), ("masked_lm_ids", labels)):
                payload, used, nbytes = _varints(matrix, np)
                entry, size = self._variable_entry(name, payload.reshape(rows, -1),
                                                   used.reshape(rows, -1),
                                                   nbytes.sum(axis=1))
                pieces += entry
                total += size
            # masked_lm_weights: float32 1.0 / 0.0.
            header = self._constant_entry_header("masked_lm_weights", 4 * preds, preds)
            weights = real.astype("<f4").view(np.uint8).reshape(rows, 4 * preds)
            pieces += [header, (weights, None)]
            total += len(header) + 4 * preds
        # next_sentence_labels
        header = self._constant_entry_header("next_sentence_labels", 1, 1)
        pieces += [header, (cols["random_next"][:, None], None)]
        total += len(header) + 1
        # The Example: field 1 (Features), length-delimited, around the entries.
        body = total
        pieces = [b"\x0a", _varints(body, np)[:2]] + pieces
        record_lengths = body + 1 + _varint_len(body, np)

        # Lay the pieces side by side in one byte matrix (constants broadcast), with the
        # matrix of which bytes are used; the used bytes in row order are the records.
        merged = []
        for piece in pieces:
            if isinstance(piece, bytes) and merged and isinstance(merged[-1], bytes):
                merged[-1] += piece
            else:
                merged.append(piece)
        widths = [len(p) if isinstance(p, bytes) else p[0].size // rows for p in merged]
        matrix = np.empty((rows, sum(widths)), dtype=np.uint8)
        used = np.ones((rows, sum(widths)), dtype=bool)
        start = 0
        for piece, width in zip(merged, widths):
            end = start + width
            if isinstance(piece, bytes):
                matrix[:, start:end] = np.frombuffer(piece, dtype=np.uint8)
            else:
                values, mask = piece
                matrix[:, start:end] = values.reshape(rows, width)
                if mask is not None:
                    used[:, start:end] = mask.reshape(rows, width)
            start = end
        return np.compress(used.ravel(), matrix.ravel()), record_lengths


def record_encoder(config: PretrainingConfig, dynamic_masking: bool = False):
    """The `features.ExampleEncoder` of the records of a run (masked or unmasked kind)."""
    return features.pretraining_schema(dynamic_masking).encoder(
        max_seq_length=config.max_seq_length,
        max_predictions_per_seq=config.max_predictions_per_seq)
