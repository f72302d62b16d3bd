"""Chunk results through shared memory (data_prep/shared_results.py): slots, fallbacks,
and the same output bytes whichever way the records travel."""

import os
import random
import subprocess
import sys

import pytest

from conftest import TINY_VOCAB, write_vocab
from data_prep import shared_results
from data_prep.pretraining_data.chunks import ChunkTask, process_chunk
from data_prep.pretraining_data.config import PretrainingConfig
from data_prep.pretraining_data.documents import ByteRange

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ["the", "a", "of", "and", "to", "in", "is", "was", "it", "he", "she", "on", "cat",
         "dog", "sat", "mat", "ran", "far", "away", "home", "big", "red", "cats", "unaffable"]

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"),
                                reason="no anonymous memory files on this platform")


def write_corpus(path, num_docs, seed):
    rng = random.Random(seed)
    docs = ["\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20))) + " ."
                      for _ in range(rng.randint(1, 10))) for _ in range(num_docs)]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture
def task(tmp_path):
    vocab = write_vocab(tmp_path / "vocab.txt", list(dict.fromkeys(TINY_VOCAB)))
    corpus = write_corpus(tmp_path / "corpus.txt", 40, 1)
    config = PretrainingConfig(
        max_seq_length=32, max_predictions_per_seq=5, masked_lm_prob=0.15,
        short_seq_prob=0.1, dupe_factor=2, do_whole_word_mask=False)
    return ChunkTask(
        index=3, ranges=(ByteRange(corpus, 0, os.path.getsize(corpus)),),
        vocab_file=vocab, do_lower_case=True, config=config, seed=7)


@pytest.fixture
def shared():
    made = shared_results.SharedResults.create()
    yield made
    made.close()


def test_a_slot_carries_the_chunk_and_is_reused_only_once_nothing_refers_to_it(task, shared):
    direct = process_chunk(task)
    assert len(direct.data) > 1000
    slot = shared.acquire()
    sent, nbytes = shared_results.process_chunk(task, slot)  # as a worker runs it
    assert nbytes == len(direct.data) and sent.data == b""  # only the size travels
    received = shared.receive(sent, slot, nbytes)
    assert isinstance(received.data, memoryview) and received.data.readonly
    assert bytes(received.data) == direct.data
    assert received.lengths == direct.lengths
    assert [bytes(r) for r in received.records()] == direct.records()
    # A record still held (as the shuffle buffer holds them) keeps the slot busy ...
    held = received.records()[-1]
    del received, sent
    assert shared.acquire() != slot
    # ... and the slot is free once the last view is gone.
    expected = bytes(held)
    del held
    assert shared.acquire() == slot
    assert expected == direct.records()[-1]


def test_data_that_does_not_fit_travels_in_the_result(task, shared, monkeypatch):
    direct = process_chunk(task)
    monkeypatch.setattr(shared_results, "SLOT_BYTES", len(direct.data) - 1)
    slot = shared.acquire()
    sent, nbytes = shared_results.process_chunk(task, slot)
    assert nbytes is None and sent.data == direct.data
    received = shared.receive(sent, slot, nbytes)
    assert received.data == direct.data
    assert shared.acquire() == slot  # given back at once
    # No shared file (another platform, or after close): the result as computed.
    shared.close()
    assert shared_results._FD is None
    sent, nbytes = shared_results.process_chunk(task, 0)
    assert nbytes is None and sent.data == direct.data


def buffered_env(**extra):
    """os.environ without PYTHONUNBUFFERED: stdout to a pipe is then block-buffered, as
    for most users, so output lost at exit would show."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env.update(extra)
    return env


# Runs the CLI in this process with the transport chosen by argv[1], then prints how many
# slots the shared file had (0 without one) once `run()` has returned control.
DRIVER = """
import sys
from data_prep import create_pretraining_data as cli, shared_results
mode, made = sys.argv[1], []
create = shared_results.SharedResults.create
def record(cls):
    made.append(None if mode == "pipe" else create())
    return made[-1]
shared_results.SharedResults.create = classmethod(record)
if mode == "too_small":
    shared_results.SLOT_BYTES = 4096  # set before the workers fork: they inherit it
sys.argv = ["create_pretraining_data", *sys.argv[2:]]
try:
    cli.run()
except SystemExit:
    print("slots", made[0].slots if made and made[0] else 0)
    raise
"""


@pytest.mark.slow
def test_the_output_is_the_same_through_shared_memory_the_pipe_or_the_fallback(tmp_path):
    vocab = write_vocab(tmp_path / "vocab.txt", list(dict.fromkeys(TINY_VOCAB)))
    corpus = write_corpus(tmp_path / "corpus.txt", 300, 2)
    outputs, slots = {}, {}
    for mode in ("shared", "pipe", "too_small"):
        out = tmp_path / f"{mode}.tfrecord"
        done = subprocess.run(
            [sys.executable, "-c", DRIVER, mode, f"--input_file={corpus}",
             f"--output_file={out}", f"--vocab_file={vocab}", "--num_workers=2",
             "--chunk_size_mb=0.004", "--shuffle_buffer_size=300", "--max_seq_length=32",
             "--max_predictions_per_seq=5", "--dupe_factor=2", "--random_seed=3"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
            env=buffered_env(PYTHONPATH=ROOT))
        assert done.returncode == 0, done.stderr[-3000:]
        outputs[mode] = out.read_bytes()
        slots[mode] = int(done.stdout.split("slots")[-1])
        assert "chunk(s)" in done.stderr
    assert len(outputs["shared"]) > 50_000
    assert outputs["shared"] == outputs["pipe"] == outputs["too_small"]
    assert slots["pipe"] == 0
    assert slots["too_small"] == 4  # the window of 2 workers + 2: each slot given back at once
    # The buffer is written every ~300 records, so slots are reused: far fewer than chunks.
    chunks = int(done.stderr.split(" chunk(s)")[0].rsplit(",", 1)[-1])
    assert chunks >= 12
    assert 4 <= slots["shared"] <= chunks // 2


def test_a_failed_write_sends_the_records_in_the_result(task, shared, monkeypatch):
    direct = process_chunk(task)

    def no_memory(*args):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(shared_results.os, "pwrite", no_memory)
    slot = shared.acquire()
    sent, nbytes = shared_results.process_chunk(task, slot)
    assert nbytes is None and sent.data == direct.data
    assert shared.receive(sent, slot, nbytes).data == direct.data
    assert shared.acquire() == slot


def test_no_shared_file_without_memfd_or_under_a_file_size_limit(monkeypatch):
    monkeypatch.delattr(shared_results.os, "memfd_create")
    assert shared_results.SharedResults.create() is None
    monkeypatch.undo()
    # A `ulimit -f` would kill a worker writing past it (SIGXFSZ): results use the pipe.
    # Checked in a child process, whose limit can be lowered without touching this one.
    script = ("import resource; from data_prep import shared_results as s; "
              "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 30, resource.RLIM_INFINITY)); "
              "print(s.SharedResults.create() is None)")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    made = shared_results.SharedResults.create()  # unlimited here
    assert made is not None
    made.close()
