"""The TFRecord schema of every record kind, and the writer and parser derived from it.

One `RecordSchema` per record kind lists each feature's name, on-disk dtype and length
(a fixed number or the name of a size parameter such as `max_seq_length`). Both sides
derive from it:

* writing: `schema.encoder(**sizes).encode(values)` pads each feature with zeros and
  returns the serialised `tf.train.Example` bytes. The protobuf wire format is written by
  hand in pure Python, so data-preparation workers never import TensorFlow; tests check
  the bytes parse to exactly the features `tf.train.Example` gives.
* reading: `schema.parse_spec(**sizes)` (a `tf.io.parse_single_example` spec) and
  `schema.parser(**sizes)` (parses and casts int64 to int32, the in-memory dtype).

Integers are int64 on disk (as Google's files), int32 in memory. To add a record kind,
declare another `RecordSchema` (task families declare theirs in their own `data.py`).
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Mapping, Optional, Sequence, Union

INT64 = "int64"
FLOAT32 = "float32"


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """One fixed-length feature: `length` is an int or the name of a size parameter."""

    name: str
    dtype: str
    length: Union[int, str]

    def resolve_length(self, sizes: Mapping[str, int]) -> int:
        if isinstance(self.length, int):
            return self.length
        if self.length not in sizes:
            raise ValueError(f"feature {self.name!r} needs the size parameter {self.length!r}")
        return int(sizes[self.length])


@dataclasses.dataclass(frozen=True)
class RecordSchema:
    """The features of one record kind, in the order they are written."""

    kind: str
    features: tuple

    @property
    def names(self) -> tuple:
        return tuple(f.name for f in self.features)

    def lengths(self, **sizes: int) -> dict:
        """Feature name -> fixed length for the given size parameters."""
        return {f.name: f.resolve_length(sizes) for f in self.features}

    def encoder(self, **sizes: int) -> "ExampleEncoder":
        return ExampleEncoder(self, self.lengths(**sizes))

    def parse_spec(self, **sizes: int) -> dict:
        """`tf.io.parse_single_example` / `parse_example` spec (int64 and float32 on disk)."""
        import tensorflow as tf  # Only readers need TensorFlow; writers stay pure Python.

        dtypes = {INT64: tf.int64, FLOAT32: tf.float32}
        lengths = self.lengths(**sizes)
        return {f.name: tf.io.FixedLenFeature([lengths[f.name]], dtypes[f.dtype])
                for f in self.features}

    def parser(self, **sizes: int):
        """Returns `parse(serialized) -> dict of tensors`, integers cast to int32.

        Works on a scalar string (one record) or a vector of them (a batch).
        """
        spec = self.parse_spec(**sizes)
        return lambda serialized: parse_with_spec(serialized, spec)


def parse_with_spec(serialized, spec: dict) -> dict:
    """Parses one serialized record (a scalar string) or a batch (a vector) with a
    `tf.io` parse spec; int64 features (on disk) come back as int32, the in-memory dtype
    (TPUs and XLA prefer int32)."""
    import tensorflow as tf

    if serialized.shape.rank == 0:
        parsed = tf.io.parse_single_example(serialized, spec)
    else:
        parsed = tf.io.parse_example(serialized, spec)
    return {name: tf.cast(t, tf.int32) if t.dtype == tf.int64 else t
            for name, t in parsed.items()}


PRETRAINING = RecordSchema(
    kind="pretraining",
    features=(
        FeatureSpec("input_ids", INT64, "max_seq_length"),
        FeatureSpec("input_mask", INT64, "max_seq_length"),
        FeatureSpec("segment_ids", INT64, "max_seq_length"),
        FeatureSpec("masked_lm_positions", INT64, "max_predictions_per_seq"),
        FeatureSpec("masked_lm_ids", INT64, "max_predictions_per_seq"),
        FeatureSpec("masked_lm_weights", FLOAT32, "max_predictions_per_seq"),
        FeatureSpec("next_sentence_labels", INT64, 1),
    ),
)

# The NSP pairs without masking (`create_pretraining_data --dynamic_masking`):
# run_pretraining masks them in its input pipeline (training/dynamic_masking.py), a fresh
# mask every epoch. The same pair features as PRETRAINING, in the same order.
PRETRAINING_UNMASKED = RecordSchema(
    kind="pretraining_unmasked",
    features=tuple(f for f in PRETRAINING.features
                   if not f.name.startswith("masked_lm_")),
)

def pretraining_schema(dynamic_masking: bool) -> RecordSchema:
    """The record kind create_pretraining_data writes: masked, or unmasked pairs."""
    return PRETRAINING_UNMASKED if dynamic_masking else PRETRAINING


# ---------------------------------------------------------------------------------------
# Protobuf wire format, by hand.
#
#   Example  { Features features = 1; }
#   Features { map<string, Feature> feature = 1; }   (entry: key = 1, value = 2)
#   Feature  { oneof { BytesList = 1; FloatList = 2; Int64List = 3; } }
#   Int64List / FloatList { repeated value = 1 [packed = true]; }
# Every field here is length-delimited (wire type 2): tag byte = field_number << 3 | 2.

_LEN_TAG = {1: b"\x0a", 2: b"\x12", 3: b"\x1a"}
# Varints below 2**16 (ids of any usual vocab, positions, field lengths) are looked up.
_VARINT_TABLE_SIZE = 1 << 16


def encode_varint(value: int) -> bytes:
    """Base-128 varint of an int64 (negative values as 10-byte two's complement)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_VARINTS: list = []  # varints of 0.._VARINT_TABLE_SIZE-1, once `_varint_table` built it


def _varint_table() -> list:
    """The varint bytes of every value below `_VARINT_TABLE_SIZE`, for the per-value
    encoders. Built on first use (~12 ms), not at import: every CLI start would pay it,
    and the vectorised record writers never need it."""
    if not _VARINTS:
        _VARINTS.extend(
            [bytes((v,)) for v in range(1 << 7)]
            + [bytes((v & 0x7F | 0x80, v >> 7)) for v in range(1 << 7, 1 << 14)]
            + [bytes((v & 0x7F | 0x80, v >> 7 & 0x7F | 0x80, v >> 14))
               for v in range(1 << 14, _VARINT_TABLE_SIZE)])
    return _VARINTS


def _size_varint(size: int) -> bytes:
    """The varint of a length: from the table if it is built, else computed."""
    return _VARINTS[size] if size < len(_VARINTS) else encode_varint(size)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _LEN_TAG[field] + _size_varint(len(payload)) + payload


def packed_int64(values: Sequence[int]) -> bytes:
    """The packed varint payload of an Int64List's values."""
    table = _varint_table()
    if values and min(values) >= 0:  # (a negative index would wrap around the table)
        try:
            return b"".join([table[v] for v in values])
        except (IndexError, TypeError):
            pass
    return b"".join([encode_varint(int(v)) for v in values])


def packed_float32(values: Sequence[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


class ExampleEncoder:
    """Serialises one record of a schema to `tf.train.Example` bytes, zero-padding features."""

    def __init__(self, schema: RecordSchema, lengths: Mapping[str, int]):
        self.schema = schema
        self.lengths = dict(lengths)
        # (name, dtype, length, map-entry key prefix, Feature oneof field number)
        self._plan = []
        for spec in schema.features:
            key = spec.name.encode("utf-8")
            key_field = _length_delimited(1, key)
            oneof = _LEN_TAG[3 if spec.dtype == INT64 else 2]
            self._plan.append((spec.name, spec.dtype, self.lengths[spec.name], key_field, oneof))
        self._by_name = {name: rest for name, *rest in self._plan}

    def encode(self, values: Mapping[str, Sequence]) -> bytes:
        """`values[name]` is a list of at most the feature's length; the rest is zeros."""
        packed = {}
        for name, dtype, _, _, _ in self._plan:
            items = values[name]
            payload = packed_int64(items) if dtype == INT64 else packed_float32(items)
            packed[name] = (payload, len(items))
        return self.encode_packed(packed)

    def encode_packed(self, packed: Mapping[str, tuple]) -> bytes:
        """Like `encode`, from `(packed payload bytes, number of values)` per feature
        (see `packed_int64` / `packed_float32`), for writers that build payloads fast."""
        return self.encode_entries([self.entry(name, *packed[name]) for name in self.names])

    @property
    def names(self) -> tuple:
        return self.schema.names

    def entry_key_and_tag(self, name: str) -> tuple:
        """(serialised map key field, Feature oneof tag byte) of a feature: the constant
        parts of its map entry, for vectorised writers."""
        _, _, key_field, oneof = self._by_name[name]
        return key_field, oneof

    def entry(self, name: str, payload: bytes, count: int) -> bytes:
        """The serialised map entry of one feature from its packed payload (`count`
        values, zero-padded here). Writers may cache entries of recurring values."""
        dtype, length, key_field, oneof = self._by_name[name]
        pad = length - count
        if pad < 0:
            raise ValueError(
                f"{self.schema.kind} feature {name!r} has {count} values, "
                f"more than its length {length}")
        # Zero padding: a zero varint is the single byte 0x00, a zero float 4 bytes.
        if pad:
            payload += (b"\x00" if dtype == INT64 else b"\x00\x00\x00\x00") * pad
        # Nested length-delimited fields, innermost first: the value list, the Feature,
        # the map entry (key + value).
        size = len(payload)
        v_list = _size_varint(size)
        size += 1 + len(v_list)
        v_feature = _size_varint(size)
        size += 1 + len(v_feature)
        v_value = _size_varint(size)
        size += len(key_field) + 1 + len(v_value)
        v_entry = _size_varint(size)
        return b"".join((b"\x0a", v_entry, key_field, b"\x12", v_value, oneof, v_feature,
                         b"\x0a", v_list, payload))

    @staticmethod
    def encode_entries(entries: Sequence[bytes]) -> bytes:
        """The Example of the map entries of all features, given in schema order."""
        body = b"".join(entries)
        size = len(body)
        return b"".join((b"\x0a", _size_varint(size), body))


# ---------------------------------------------------------------------------------------
# TFRecord framing, by hand (so that no writing process needs TensorFlow).
#
# Each record on disk: uint64 length (little-endian), uint32 masked_crc32c(length bytes),
# the data, uint32 masked_crc32c(data); masked_crc32c(x) = rotr15(crc32c(x)) + 0xa282ead8
# (tensorflow/core/lib/hash/crc32c.h). CRC32C (Castagnoli) is not in the standard
# library; `frame_concatenated` computes it with google-crc32c's C extension (a runtime
# dependency: ~10x faster) and, where only its slow pure-Python fallback is installed,
# with numpy over many records at once (rows of a byte matrix, four bytes per step).
# The pure-Python reference is in tests/test_features.py.

_CRC32C_POLY = 0x82F63B78  # reflected Castagnoli polynomial
_CRC_MASK_DELTA = 0xA282EAD8


def _crc32c_table() -> list:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _CRC32C_POLY if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C_TABLE = _crc32c_table()


class _Crc32cBatch:
    """CRC32C of many byte strings at once with numpy.

    The strings are right-aligned in the rows of a zero-padded byte matrix whose width is
    a multiple of 4, and the rows' CRC registers advance together, one little-endian
    uint32 column per step (slicing by 4, with two 16-bit tables). A row padded with p
    leading zero bytes starts from the register state that p zero bytes turn into the
    standard initial value 0xFFFFFFFF (`_init`, found by running the register
    backwards), so the padding does not change the result.
    """

    def __init__(self):
        import numpy as np

        self.np = np
        t0 = np.array(_CRC32C_TABLE, dtype=np.uint32)
        tables = [t0]
        for _ in range(3):
            prev = tables[-1]
            tables.append((prev >> np.uint32(8)) ^ t0[prev & np.uint32(0xFF)])
        # Slicing by 4 with two 16-bit tables: the register after xor-ing in 4 bytes is
        # low[its low 16 bits] ^ high[its high 16 bits].
        x = np.arange(1 << 16, dtype=np.uint32)
        self.low = tables[3][x & 0xFF] ^ tables[2][x >> 8]
        self.high = tables[1][x & 0xFF] ^ tables[0][x >> 8]
        # The top byte of table[b] differs for every b: it identifies the byte shifted out.
        self._byte_of_top = [0] * 256
        for b, value in enumerate(_CRC32C_TABLE):
            self._byte_of_top[value >> 24] = b
        self._init = np.array([0xFFFFFFFF], dtype=np.uint32)

    def _init_states(self, max_pad: int):
        """init[p]: the register state that p zero bytes turn into 0xFFFFFFFF."""
        np = self.np
        if len(self._init) <= max_pad:
            states = self._init.tolist()
            state, table, byte_of_top = states[-1], _CRC32C_TABLE, self._byte_of_top
            while len(states) <= max_pad:
                b = byte_of_top[state >> 24]
                state = (((state ^ table[b]) << 8) & 0xFFFFFFFF) | b
                states.append(state)
            self._init = np.array(states, dtype=np.uint32)
        return self._init

    def masked(self, data, lengths):
        """Masked CRC32C (uint32 array) of consecutive strings of `data` (a uint8 array)
        with the given lengths (an int64 array)."""
        np = self.np
        out = np.empty(len(lengths), dtype=np.uint32)
        block = 2048  # rows per step: keeps the matrix in cache and memory small
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        low, high = self.low, self.high
        for lo in range(0, len(lengths), block):
            hi = min(lo + block, len(lengths))
            lens = lengths[lo:hi]
            width = max(4, int(lens.max() + 3) // 4 * 4)
            pads = width - lens
            matrix = np.zeros((hi - lo, width), dtype=np.uint8)
            matrix[np.arange(width) >= pads[:, None]] = data[offsets[lo]:offsets[hi]]
            columns = matrix.view("<u4").T.copy()
            crc = self._init_states(width)[pads]
            for column in columns:
                crc ^= column
                halves = crc.astype("<u4", copy=False).view("<u2")
                crc = low.take(halves[0::2])
                crc ^= high.take(halves[1::2])
            out[lo:hi] = crc
        out ^= np.uint32(0xFFFFFFFF)
        return _masked(out)


_CRC_BATCH = None
_NATIVE_CRC = False  # not looked up yet


def native_crc32c():
    """google-crc32c's C function `value(bytes) -> int`, or None where the package or its
    C extension is missing (its pure-Python fallback is slower than the numpy batch)."""
    global _NATIVE_CRC
    if _NATIVE_CRC is False:
        _NATIVE_CRC = None
        try:
            import google_crc32c

            if getattr(google_crc32c, "implementation", None) == "c":
                from google_crc32c import cext

                _NATIVE_CRC = cext.value
        except ImportError:
            pass
    return _NATIVE_CRC


def _masked(crcs):
    """masked_crc32c of a uint32 array of CRC32C values."""
    import numpy as np

    return ((crcs >> np.uint32(15)) | (crcs << np.uint32(17))) + np.uint32(_CRC_MASK_DELTA)


def frame_concatenated(data, lengths, native: Optional[bool] = None):
    """TFRecord framing of the records laid end to end in `data` (bytes or a uint8 numpy
    array) with the given lengths (an int64 numpy array): (bytes of the whole framed
    sequence, exactly what `tf.io.TFRecordWriter` writes for them, and the framed length
    of each). `native`: CRCs with
    google-crc32c's C extension (True), with numpy (False) or the former where installed
    (None); the bytes are the same."""
    global _CRC_BATCH
    import numpy as np

    n = len(lengths)
    if n == 0:
        return b"", []
    if isinstance(data, np.ndarray):
        array, data = data, data.tobytes()
    else:
        array = np.frombuffer(data, dtype=np.uint8)
    lengths = np.asarray(lengths, dtype=np.int64)
    length_bytes = lengths.astype("<u8")
    ends = np.cumsum(lengths).tolist()
    records = [data[start:end] for start, end in zip([0] + ends[:-1], ends)]
    crc = native_crc32c() if native is not False else None
    if native and crc is None:
        raise RuntimeError("google-crc32c's C extension is not installed")
    if crc is not None:
        data_crcs = _masked(np.fromiter(map(crc, records), dtype=np.uint32, count=n))
        distinct, which = np.unique(length_bytes, return_inverse=True)
        length_crcs = _masked(np.array([crc(v.tobytes()) for v in distinct],
                                       dtype=np.uint32))[which.reshape(-1)]
    else:
        if _CRC_BATCH is None:
            _CRC_BATCH = _Crc32cBatch()
        data_crcs = _CRC_BATCH.masked(array, lengths)
        length_crcs = _CRC_BATCH.masked(length_bytes.view(np.uint8), np.full(n, 8, np.int64))
    headers = np.empty((n, 3), dtype="<u4")
    headers[:, :2] = length_bytes.view("<u4").reshape(n, 2)
    headers[:, 2] = length_crcs
    header_bytes = headers.tobytes()
    footer_bytes = data_crcs.astype("<u4").tobytes()
    parts = [b""] * (3 * n)
    parts[0::3] = [header_bytes[i:i + 12] for i in range(0, 12 * n, 12)]
    parts[1::3] = records
    parts[2::3] = [footer_bytes[i:i + 4] for i in range(0, 4 * n, 4)]
    return b"".join(parts), (lengths + 16).tolist()
