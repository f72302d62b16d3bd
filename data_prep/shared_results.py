"""Chunk results from forked workers through shared memory instead of the executor's pipe.

A chunk's framed records are about ten times its text (6.7 MB for a 0.62 MB chunk of the
benches' text at `dupe_factor` 5). Returned as a result, they are pickled, pushed through
the executor's 64 KB pipe and copied three more times on the way in (the reader's pieces,
its buffer, unpickling): ~8 ms of this process's CPU per chunk, taken from the workers on
a machine whose cores they fill, and ~5 ms of the worker's (bench/RESULTS.md, measured on
6.4 MB results). Here each task gets a slot of one anonymous in-memory file
(`os.memfd_create`) that the workers inherit by fork: the worker writes its records into
the slot (one `pwrite`) and returns only their size; this process maps them (`mmap`, no
copy) and hands the mapping on as the result's data.

* Nothing to leak: the file has no name and is freed with the last process holding it,
  even after `kill -9` (workers die with this process, `lifecycle.init_worker_process`).
* Slots are `SLOT_BYTES` apart in a sparse file, so only what is written takes memory;
  a slot is reused once nothing refers to the records mapped from it any more (a
  finalizer on the mapping), so memory stays what the records in flight and in the
  shuffle buffer take, as before.
* A chunk larger than a slot, a failed write, a platform without `memfd_create` or
  fork, or a file-size limit (`ulimit -f`, whose signal would kill a worker writing past
  it): the records travel in the result as before. The output is the same either way.

What it buys, and why it is kept: the ~8 ms per chunk is main-process CPU, proportional
to the corpus, and the main process alone receives, shuffles and writes every record, so
its CPU per chunk bounds the run's speed however many workers are added. What it costs a
maintainer: a second transport (Linux, fork only) beside the executor's pipe, with slot
bookkeeping (a finalizer per mapping) and three fallbacks, all of which must give the
same bytes (tests/test_shared_results.py checks each).
"""

from __future__ import annotations

import mmap
import os
import weakref

from data_prep.pretraining_data import chunks

# Offset between slots: the most one chunk's records can take through shared memory.
SLOT_BYTES = 1 << 30

# The shared file's descriptor, set in this process before the workers are forked (they
# inherit it); None where results travel through the pipe.
_FD: int | None = None


class SharedResults:
    """The shared file and its slots, owned by the process that starts the workers."""

    def __init__(self, fd: int):
        self.fd = fd
        self.free: list[int] = []
        self.slots = 0

    @classmethod
    def create(cls) -> "SharedResults | None":
        """A new shared file, made the one forked workers write to; None where the
        platform has no anonymous memory files (results then travel through the pipe)."""
        global _FD
        if not hasattr(os, "memfd_create"):
            return None
        import resource

        if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
            return None
        try:
            fd = os.memfd_create("create_pretraining_data-results", os.MFD_CLOEXEC)
        except OSError:
            return None
        _FD = fd
        return cls(fd)

    def acquire(self) -> int:
        """A free slot (a new one when all are in use)."""
        if self.free:
            return self.free.pop()
        self.slots += 1
        return self.slots - 1

    def receive(self, result: chunks.ChunkResult, slot: int,
                nbytes: int | None) -> chunks.ChunkResult:
        """The result with its data in place: mapped from `slot` if the worker wrote
        `nbytes` there, else as sent. The slot is free again once the mapping is gone."""
        if nbytes is None:
            self.free.append(slot)
            return result
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapping = mmap.mmap(self.fd, nbytes, flags=flags, prot=mmap.PROT_READ,
                            offset=slot * SLOT_BYTES)
        weakref.finalize(mapping, self.free.append, slot)
        result.data = memoryview(mapping)
        return result

    def close(self) -> None:
        """Closes this process's descriptor (mappings still in use stay valid)."""
        global _FD
        if _FD == self.fd:
            _FD = None
        try:
            os.close(self.fd)
        except OSError:
            pass


def process_chunk(task: chunks.ChunkTask, slot: int | None):
    """`chunks.process_chunk` in a worker: (the result, the bytes written to
    `slot` of the shared file, or None when its data travels in the result)."""
    result = chunks.process_chunk(task)
    data = result.data
    if slot is None or _FD is None or not data or len(data) > SLOT_BYTES:
        return result, None
    view, offset, done = memoryview(data), slot * SLOT_BYTES, 0
    try:
        while done < len(view):
            done += os.pwrite(_FD, view[done:], offset + done)
    except OSError:  # e.g. out of memory for the shared file: send it the usual way
        return result, None
    result.data = b""
    return result, done
