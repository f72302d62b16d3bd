"""The TFRecord schema: hand-written Example bytes, parse spec, and the original's names."""

import importlib.util
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from data_prep import features

SIZES = dict(max_seq_length=16, max_predictions_per_seq=4)


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC32C of `data` (continuing from `crc`), one byte at a time: slow, the reference
    `data_prep.features`' framing is held to."""
    table = features._CRC32C_TABLE
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + features._CRC_MASK_DELTA) & 0xFFFFFFFF


def frame_records(records):
    """`features.frame_concatenated` of a list of records."""
    lengths = np.fromiter(map(len, records), dtype=np.int64, count=len(records))
    return features.frame_concatenated(b"".join(records), lengths) if records else (b"", [])


def _random_values(rng, lengths):
    n = rng.randint(1, lengths["input_ids"])
    k = rng.randint(0, lengths["masked_lm_ids"])
    return {
        "input_ids": [rng.choice([0, 1, 127, 128, 16383, 16384, 30521, 70000, 2**40])
                      for _ in range(n)],
        "input_mask": [1] * n,
        "segment_ids": [rng.randint(0, 1) for _ in range(n)],
        "masked_lm_positions": [rng.randrange(n) for _ in range(k)],
        "masked_lm_ids": [rng.randrange(30522) for _ in range(k)],
        "masked_lm_weights": [rng.choice([1.0, 0.5, -2.25]) for _ in range(k)],
        "next_sentence_labels": [rng.randint(0, 1)],
    }


def _reference_example(values, lengths):
    """tf.train.Example built the normal way, zero-padded."""
    feature = {}
    for spec in features.PRETRAINING.features:
        padded = list(values[spec.name]) + [0] * (lengths[spec.name] - len(values[spec.name]))
        if spec.dtype == features.FLOAT32:
            feature[spec.name] = tf.train.Feature(float_list=tf.train.FloatList(value=padded))
        else:
            feature[spec.name] = tf.train.Feature(int64_list=tf.train.Int64List(value=padded))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def test_hand_serialised_bytes_parse_to_the_same_example():
    rng = random.Random(0)
    encoder = features.PRETRAINING.encoder(**SIZES)
    for _ in range(300):
        values = _random_values(rng, encoder.lengths)
        parsed = tf.train.Example.FromString(encoder.encode(values))
        assert parsed == _reference_example(values, encoder.lengths)


def test_long_records_and_negative_ints_use_the_general_varint_path():
    encoder = features.PRETRAINING.encoder(max_seq_length=20000, max_predictions_per_seq=3)
    values = {"input_ids": list(range(20000)), "input_mask": [1] * 20000,
              "segment_ids": [0] * 20000, "masked_lm_positions": [5, -1],
              "masked_lm_ids": [7], "masked_lm_weights": [1.0],
              "next_sentence_labels": [1]}
    parsed = tf.train.Example.FromString(encoder.encode(values))
    assert parsed == _reference_example(values, encoder.lengths)


def test_too_many_values_is_an_error_naming_the_feature():
    encoder = features.PRETRAINING.encoder(**SIZES)
    values = _random_values(random.Random(1), encoder.lengths)
    values["masked_lm_ids"] = [1] * 5
    with pytest.raises(ValueError, match="masked_lm_ids.*5 values.*length 4"):
        encoder.encode(values)


def test_missing_size_parameter_is_named():
    with pytest.raises(ValueError, match="max_predictions_per_seq"):
        features.PRETRAINING.lengths(max_seq_length=8)


def test_round_trip_through_tfrecord_and_tf_data(tmp_path):
    rng = random.Random(2)
    encoder = features.PRETRAINING.encoder(**SIZES)
    records = [_random_values(rng, encoder.lengths) for _ in range(20)]
    for values in records:  # int32 in memory: keep ids in range for the comparison
        values["input_ids"] = [v % 30000 for v in values["input_ids"]]
    path = str(tmp_path / "data.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for values in records:
            writer.write(encoder.encode(values))
    parse = features.PRETRAINING.parser(**SIZES)
    dataset = tf.data.TFRecordDataset(path).map(parse)
    for values, parsed in zip(records, dataset):
        for spec in features.PRETRAINING.features:
            tensor = parsed[spec.name]
            expected_dtype = tf.float32 if spec.dtype == features.FLOAT32 else tf.int32
            assert tensor.dtype == expected_dtype
            length = encoder.lengths[spec.name]
            expected = list(values[spec.name]) + [0] * (length - len(values[spec.name]))
            assert tensor.numpy().tolist() == pytest.approx(expected), spec.name
    batch = next(iter(tf.data.TFRecordDataset(path).batch(4).map(parse)))
    assert batch["input_ids"].shape == (4, 16)
    assert batch["masked_lm_weights"].shape == (4, 4)


def _original_pretraining_spec(max_seq_length, max_predictions_per_seq):
    """The parse spec written in the original run_pretraining.py, read from its source."""
    spec = importlib.util.find_spec("bert.run_pretraining")
    with open(spec.origin, encoding="utf-8") as f:
        source = f.read()
    entries = re.findall(r'"(\w+)":\s*tf\.FixedLenFeature\(\[(\w+)\],\s*tf\.(\w+)\)', source)
    assert len(entries) == 7, entries
    sizes = {"max_seq_length": max_seq_length,
             "max_predictions_per_seq": max_predictions_per_seq, "1": 1}
    return {name: tf.io.FixedLenFeature([sizes[length]], getattr(tf, dtype))
            for name, length, dtype in entries}


def test_schema_equals_the_original_readers_spec():
    original = _original_pretraining_spec(**SIZES)
    ours = features.PRETRAINING.parse_spec(**SIZES)
    assert ours == original


def test_our_records_parse_with_the_original_feature_spec():
    encoder = features.PRETRAINING.encoder(**SIZES)
    values = _random_values(random.Random(3), encoder.lengths)
    values["input_ids"] = [v % 30000 for v in values["input_ids"]]
    parsed = tf.io.parse_single_example(encoder.encode(values),
                                        _original_pretraining_spec(**SIZES))
    assert parsed["input_ids"].numpy().tolist()[:len(values["input_ids"])] == values["input_ids"]
    assert parsed["next_sentence_labels"].numpy().tolist() == values["next_sentence_labels"]


def test_writer_side_does_not_import_tensorflow(tmp_path, tiny_vocab_file):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat .\nthe dog ran far away .\n\nhe ran home .\n"
                      "she sat .\n", encoding="utf-8")
    code = (
        "import sys\n"
        "from data_prep.pretraining_data.chunks import ChunkTask, process_chunk\n"
        "from data_prep.pretraining_data.config import PretrainingConfig\n"
        "from data_prep.pretraining_data.documents import ByteRange\n"
        f"t = ChunkTask(0, (ByteRange({str(corpus)!r}, 0, 10**6),), {tiny_vocab_file!r}, "
        "True, PretrainingConfig(max_seq_length=16, max_predictions_per_seq=3), 1)\n"
        "r = process_chunk(t); assert r.data and r.records()\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], cwd=root, check=False, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_crc32c_reference_values():
    assert crc32c(b"") == 0
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value
    assert crc32c(b"\x00" * 32) == 0x8A9136AA  # RFC 3720 B.4


def test_the_c_crc32c_is_installed():
    """google-crc32c (a runtime requirement) is here with its C extension, so framing
    takes the fast path; without it, it would fall back to numpy silently."""
    assert features.native_crc32c() is not None
    assert features.native_crc32c()(b"123456789") == 0xE3069283


def test_framing_without_the_c_crc32c(monkeypatch):
    """Where google-crc32c's C extension is missing, framing falls back to numpy with the
    same bytes; asking for the C path then fails with a message naming the package."""
    records = [b"", b"a", b"hello world" * 50]
    lengths = np.array([len(r) for r in records], dtype=np.int64)
    with_c = features.frame_concatenated(b"".join(records), lengths)
    monkeypatch.setattr(features, "_NATIVE_CRC", None)  # as if the lookup found nothing
    assert features.native_crc32c() is None
    assert features.frame_concatenated(b"".join(records), lengths) == with_c
    with pytest.raises(RuntimeError, match="google-crc32c"):
        features.frame_concatenated(b"".join(records), lengths, native=True)


@pytest.mark.parametrize("native", [True, False], ids=["google_crc32c", "numpy"])
def test_framing_is_byte_identical_to_tf_record_writer(tmp_path, native):
    """frame_concatenated (CRC32C by google-crc32c's C extension, or by
    numpy over many records at once where it is missing) write exactly what
    tf.io.TFRecordWriter writes, for empty, tiny, odd and long records."""
    rng = random.Random(1)
    records = [bytes(rng.randrange(256) for _ in range(rng.choice(
        [0, 1, 3, 4, 5, 7, 8, 100, 777, 5000, rng.randrange(3000)]))) for _ in range(2500)]
    records += [b"\xff" * 4100, b"\x00" * 9]
    path = str(tmp_path / "reference.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    with open(path, "rb") as f:
        expected = f.read()
    lengths = np.array([len(r) for r in records], dtype=np.int64)
    data, framed = features.frame_concatenated(b"".join(records), lengths, native=native)
    assert data == expected
    assert framed == [len(r) + 16 for r in records]
    assert frame_records(records) == (data, framed)
    assert frame_records([]) == (b"", [])
    # The masked CRC of each record agrees with the pure-Python reference.
    pos = 0
    for record in records[:200]:
        pos += 12 + len(record)
        assert int.from_bytes(data[pos:pos + 4], "little") == masked_crc32c(record)
        pos += 4
    assert [r.numpy() for r in tf.data.TFRecordDataset(path)][:5] == records[:5]
