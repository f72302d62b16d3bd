"""Owns the record cache every task family keeps in its output_dir: a split's TFRecords reused while the metadata JSON beside them was written for the same key.

The protocol, once for all families: the key (what shaped the records: source file
fingerprint, vocab hash, settings, format version) is stored in
`<record_file>.metadata.json` under "cache_key" with the record file's size and the
SHA-256 of its bytes (hashed once, when the records are written: a training run's input
identity carries it, so a resume on other records is refused, `training.finetuning`); the
cache is reused only when the key is equal, the files exist and the record file has that
size.
A rebuild first removes the old metadata (it must never describe other records), writes
the records (each file all-or-nothing, `data_prep.fileio`), then the metadata, last: an
interrupted rebuild leaves records without metadata, which the next run rebuilds.
`RecordCache.records` is that whole sequence; a family gives only the key and what
writes its records.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

from absl import logging

from data_prep import fileio

METADATA_SUFFIX = ".metadata.json"


def cache_key(**fields) -> dict:
    """The key as it will read back from the metadata JSON (the round trip turns tuples
    into lists), so that a fresh key and a stored one compare equal."""
    return json.loads(json.dumps(fields))


@dataclasses.dataclass
class CachedRecords:
    """A split's records as a family's cache has them (families subclass it with what
    else their split needs: examples, the file as read, ...).

    Attributes:
      record_file, metadata_file: the TFRecords and their JSON metadata.
      metadata: the stored metadata (counts of the family's own, and the cache key).
      reused: the records were already there for the same key.
    """

    record_file: str
    metadata_file: str
    metadata: dict
    reused: bool


@dataclasses.dataclass(frozen=True)
class RecordCache:
    """One split's cached records.

    Attributes:
      record_file: the TFRecord file; its metadata is `record_file + ".metadata.json"`.
      extra_files: files written with the records that a reuse also needs (e.g. SQuAD's
        prediction features).
    """

    record_file: str
    extra_files: tuple = ()

    @classmethod
    def at(cls, output_dir: str, file_name: str, extra_files: tuple = ()) -> "RecordCache":
        """The cache of `output_dir/file_name` (extra files named relative to output_dir)."""
        return cls(os.path.join(output_dir, file_name),
                   tuple(os.path.join(output_dir, name) for name in extra_files))

    @property
    def metadata_file(self) -> str:
        return self.record_file + METADATA_SUFFIX

    def load(self, key: dict) -> dict | None:
        """The stored metadata when it was written for `key` and the files it describes are
        all there (the record file at its recorded size); else None."""
        files = (self.record_file, self.metadata_file) + self.extra_files
        if not all(fileio.exists(path) for path in files):
            return None
        try:
            metadata = json.loads(fileio.read_text(self.metadata_file))
        except (ValueError, OSError):
            return None
        if not isinstance(metadata, dict) or metadata.get("cache_key") != key:
            return None
        if fileio.getsize(self.record_file) != metadata.get("record_file_size"):
            return None
        if not metadata.get("record_file_sha256"):
            return None
        return metadata

    def records(self, key: dict, write: Callable) -> tuple[dict, bool]:
        """(metadata, reused): the stored metadata while it was written for `key` (`load`);
        else the records made anew: `write(writer)` writes them with a
        `tf.io.TFRecordWriter` on the record file's temporary (renamed into place once it
        returns) and returns the family's metadata, committed last (`commit`)."""
        metadata = self.load(key)
        if metadata is not None:
            logging.info("Reusing cached records %s", self.record_file)
            return metadata, True
        import tensorflow as tf

        self.begin()
        with fileio.AtomicOutputs([self.record_file]) as out, \
                tf.io.TFRecordWriter(out.temp(self.record_file)) as writer:
            metadata = write(writer)
        return self.commit(key, metadata), False

    def begin(self) -> None:
        """Before writing new records: the directory exists, no metadata describes the old."""
        fileio.makedirs(os.path.dirname(self.record_file) or ".")
        if fileio.exists(self.metadata_file):
            fileio.remove(self.metadata_file)

    def commit(self, key: dict, metadata: dict) -> dict:
        """After the records are in place: writes their metadata (`metadata` plus the record
        file's name, size and SHA-256 and the key), last. Returns what was written."""
        metadata = {**metadata, "record_file": os.path.basename(self.record_file),
                    "record_file_size": fileio.getsize(self.record_file),
                    "record_file_sha256": fileio.sha256(self.record_file), "cache_key": key}
        fileio.write_text(self.metadata_file,
                          json.dumps(metadata, indent=2, ensure_ascii=False) + "\n")
        return metadata
