"""tasks.common.record_cache: the one record cache of every task family (key, files, order)."""

import hashlib
import json

from tasks.common.record_cache import RecordCache, cache_key


def _write(cache: RecordCache, key: dict, payload: bytes = b"records") -> dict:
    cache.begin()
    with open(cache.record_file, "wb") as f:
        f.write(payload)
    for path in cache.extra_files:
        with open(path, "w") as f:
            f.write("{}")
    return cache.commit(key, {"num_examples": 3})


def test_reused_only_for_the_same_key_with_its_files_intact(tmp_path):
    key = cache_key(source={"path": "a", "size": 1}, window=(16, 8))
    assert key == {"source": {"path": "a", "size": 1}, "window": [16, 8]}  # as read back
    cache = RecordCache.at(str(tmp_path / "out"), "train.tf_record", ("train_features.json",))
    assert cache.load(key) is None  # nothing there yet
    written = _write(cache, key)
    assert cache.metadata_file == cache.record_file + ".metadata.json"
    stored = json.loads(open(cache.metadata_file, encoding="utf-8").read())
    assert stored == written == {
        "num_examples": 3, "record_file": "train.tf_record", "record_file_size": 7,
        "record_file_sha256": hashlib.sha256(b"records").hexdigest(), "cache_key": key}
    assert cache.load(key) == written
    assert cache.load(cache_key(**{**key, "window": [16, 4]})) is None  # another key
    # Damaged or missing pieces are rebuilt, never reused.
    with open(cache.record_file, "ab") as f:
        f.write(b"+")
    assert cache.load(key) is None
    _write(cache, key)
    (tmp_path / "out" / "train_features.json").unlink()
    assert cache.load(key) is None
    _write(cache, key)
    with open(cache.metadata_file, "w") as f:
        f.write("{not json")
    assert cache.load(key) is None


def test_a_rebuild_removes_the_old_metadata_before_the_records(tmp_path):
    """Interrupted between records and metadata, a rebuild leaves no metadata that would
    describe the other records (the next run rebuilds)."""
    cache = RecordCache.at(str(tmp_path), "dev.tf_record")
    key = cache_key(split="dev")
    _write(cache, key)
    cache.begin()
    assert not (tmp_path / "dev.tf_record.metadata.json").exists()
    assert cache.load(key) is None


def test_records_writes_once_then_reuses_and_leaves_nothing_when_writing_fails(tmp_path):
    """`records` is the whole protocol a family uses: the records written through a
    TFRecordWriter, then their metadata; the same key reuses them without writing; a
    failure while writing leaves neither records nor metadata."""
    import pytest
    import tensorflow as tf

    cache = RecordCache.at(str(tmp_path / "out"), "train.tf_record")
    calls = []

    def write(writer):
        calls.append(1)
        writer.write(b"one")
        return {"num_examples": 1}

    key = cache_key(split="train")
    metadata, reused = cache.records(key, write)
    assert not reused and metadata["num_examples"] == 1 and metadata["cache_key"] == key
    assert [bytes(r.numpy()) for r in tf.data.TFRecordDataset(cache.record_file)] == [b"one"]
    assert cache.records(key, write) == (metadata, True) and len(calls) == 1

    def broken(writer):
        writer.write(b"half")
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        cache.records(cache_key(split="other"), broken)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train.tf_record"]
