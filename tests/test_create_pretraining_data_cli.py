"""The create_pretraining_data CLI (in this process but where the process is under test):
outputs, summary, determinism, errors."""

import glob
import json
import os
import random
import subprocess
import sys

import pytest

from conftest import TINY_VOCAB, write_vocab
from tests import clis

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ["the", "a", "of", "and", "to", "in", "is", "was", "it", "he", "she", "on", "cat",
         "dog", "sat", "mat", "ran", "far", "away", "home", "big", "red", "cats", "unaffable"]
SMALL = ["--max_seq_length=32", "--max_predictions_per_seq=5", "--dupe_factor=2"]

pytestmark = pytest.mark.slow


@pytest.fixture
def vocab_file(tmp_path):
    return write_vocab(tmp_path / "vocab.txt", list(dict.fromkeys(TINY_VOCAB)))


def write_corpus(path, num_docs, seed):
    rng = random.Random(seed)
    docs = []
    for _ in range(num_docs):
        docs.append("\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20)))
                              + " ." for _ in range(rng.randint(1, 10))))
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return str(path)


def run_cli(*args):
    """The CLI with `args` in this process (tests/clis.py): its exit status, stdout and
    stderr with the log lines, as a finished process's."""
    done = clis.call_main("create_pretraining_data", args)
    return subprocess.CompletedProcess(args, done.code, done.stdout, done.stderr + done.log)


def run_process(*args, module="data_prep.create_pretraining_data"):
    """`python -m module args`: the original's CLI, or ours where the end of the process
    is under test."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT,
                          check=False, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT))


def summary_of(output):
    """Where the CLI writes the summary of `output` (DIR/_NAME.summary.json)."""
    directory, name = os.path.split(output)
    return os.path.join(directory, "_" + name + ".summary.json")


def read_records(paths, compression=""):
    import tensorflow as tf

    return [r.numpy() for r in tf.data.TFRecordDataset(paths, compression_type=compression)]


def parse_all(paths, compression=""):
    import tensorflow as tf

    from data_prep import features

    parse = features.PRETRAINING.parser(max_seq_length=32, max_predictions_per_seq=5)
    rows = []
    for parsed in tf.data.TFRecordDataset(paths, compression_type=compression).map(parse):
        rows.append({k: v.numpy().tolist() for k, v in parsed.items()})
    return rows


def test_shards_gzip_and_summary(tmp_path, vocab_file):
    corpus = write_corpus(tmp_path / "corpus.txt", 200, 1)
    out_a, out_b = str(tmp_path / "out" / "a.tfrecord"), str(tmp_path / "out" / "b.tfrecord")
    os.makedirs(tmp_path / "out")
    done = run_cli(f"--input_file={corpus}", f"--output_file={out_a},{out_b}",
                   f"--vocab_file={vocab_file}", "--num_output_shards=2", "--gzip",
                   "--num_workers=2", "--chunk_size_mb=0.005", *SMALL)
    assert done.returncode == 0, done.stderr
    files = sorted(glob.glob(str(tmp_path / "out" / "*")))
    names = [os.path.basename(f) for f in files]
    assert names == ["_a.tfrecord.summary.json", "a.tfrecord-00000-of-00002",
                     "a.tfrecord-00001-of-00002", "b.tfrecord-00000-of-00002",
                     "b.tfrecord-00001-of-00002"]
    summary = json.loads((tmp_path / "out" / "_a.tfrecord.summary.json").read_text())
    shards = [f for f in files if not f.endswith(".json")]
    counts = [len(read_records([f], "GZIP")) for f in shards]
    assert sum(counts) == summary["instances"] > 100
    assert max(counts) - min(counts) <= 1  # round-robin
    assert summary["num_chunks"] > 3 and summary["num_workers"] == 2
    for key in ("documents", "tokens", "masked_fraction", "random_next_share",
                "mask_token_share", "kept_token_share", "random_token_share", "seconds",
                "mb_per_second", "short_instance_share"):
        assert summary[key] is not None, key
    assert 0.77 < summary["mask_token_share"] < 0.83
    rows = parse_all(shards, "GZIP")
    assert sum(r["next_sentence_labels"][0] for r in rows) == summary["random_next"]
    assert sum(sum(r["input_mask"]) for r in rows) == summary["tokens"]
    assert "MB/s" in done.stderr and "ETA" in done.stderr


def test_a_successful_run_ends_with_its_logs_flushed_and_no_worker_left(tmp_path, vocab_file):
    from tests.test_fault_injection_runners import _no_process_left

    corpus = write_corpus(tmp_path / "corpus.txt", 200, 5)
    out = str(tmp_path / "out.tfrecord")
    proc = subprocess.Popen(
        [sys.executable, "-m", "data_prep.create_pretraining_data", f"--input_file={corpus}",
         f"--output_file={out}", f"--vocab_file={vocab_file}", "--num_workers=2",
         "--chunk_size_mb=0.005", *SMALL], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT))
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    _no_process_left(proc)
    assert stderr.rstrip().splitlines()[-1].endswith(f"Summary written to {summary_of(out)}")
    summary = json.loads(open(summary_of(out)).read())
    assert summary["num_workers"] == 2 and summary["num_chunks"] > 3
    assert len(read_records([out])) == summary["instances"] > 100


# Calls the console script's run() as a program would, then reports what ran afterwards:
# the code after the call, its `finally`, an atexit handler, and a file it never flushed.
CALLER = """
import atexit, multiprocessing, sys
from data_prep import create_pretraining_data as cli
log = open(sys.argv[1], "w")  # written below, flushed only by the normal exit
atexit.register(lambda: print("atexit handler ran", flush=True))
sys.argv = ["create_pretraining_data", *sys.argv[2:]]
try:
    cli.run()
except SystemExit as done:
    print("run() returned", done.code, "workers left", len(multiprocessing.active_children()),
          flush=True)
finally:
    log.write("finally ran\\n")
"""


def test_run_returns_control_to_its_caller(tmp_path, vocab_file):
    """run() returns to the program that called it (the code after the call, its
    `finally`, its atexit handlers and its unflushed files all run), with the workers
    reaped; and absl's --profile_file, which dumps the profile from an atexit handler, is
    written: the run ends as Python programs end (as for `python -m cProfile` and
    coverage)."""
    import pstats

    corpus = write_corpus(tmp_path / "corpus.txt", 60, 7)
    out = tmp_path / "out.tfrecord"
    log = tmp_path / "caller.log"
    profile = tmp_path / "run.prof"
    done = subprocess.run(
        [sys.executable, "-c", CALLER, str(log), f"--input_file={corpus}",
         f"--output_file={out}", f"--vocab_file={vocab_file}", "--num_workers=2",
         "--chunk_size_mb=0.002", f"--profile_file={profile}", *SMALL], cwd=ROOT,
        capture_output=True, text=True,
        timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr[-3000:]
    # The workers are reaped before run() returns (generate shuts its pool down).
    assert done.stdout.splitlines() == ["run() returned 0 workers left 0",
                                        "atexit handler ran"], done.stderr[-3000:]
    assert log.read_text() == "finally ran\n"
    assert len(read_records([str(out)])) > 10
    assert profile.exists() and profile.stat().st_size > 0
    functions = {name for _, _, name in pstats.Stats(str(profile)).stats}
    assert {"main", "generate", "write_all"} <= functions


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_failed_stdout_flush_fails_the_run(tmp_path, vocab_file):
    """What a program printed before running the command is flushed at exit; when that
    fails (here: stdout is /dev/full, every write ENOSPC) the exit status says so. One
    worker: forking workers flushes stdout first, which would fail the run earlier."""
    corpus = write_corpus(tmp_path / "corpus.txt", 60, 8)
    out = tmp_path / "out.tfrecord"
    program = ("import sys; print('a line of the caller'); "
               "from data_prep import create_pretraining_data as cli; "
               "sys.argv = ['create_pretraining_data', *sys.argv[1:]]; cli.run()")
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-c", program, f"--input_file={corpus}", f"--output_file={out}",
             f"--vocab_file={vocab_file}", "--num_workers=1", *SMALL], cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True, timeout=300,
            env={k: v for k, v in dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                                       PYTHONPATH=ROOT).items() if k != "PYTHONUNBUFFERED"})
    assert done.returncode != 0, done.stderr[-3000:]
    assert "No space left on device" in done.stderr
    assert out.exists(), done.stderr[-3000:]  # the command succeeded; the caller's line was lost


def test_output_depends_on_seed_not_on_workers(tmp_path, vocab_file):
    corpus = write_corpus(tmp_path / "corpus.txt", 150, 2)
    outputs = {}
    for name, workers, seed in [("w1", 1, 5), ("w2", 2, 5), ("seed6", 2, 6)]:
        out = str(tmp_path / f"{name}.tfrecord")
        done = run_cli(f"--input_file={corpus}", f"--output_file={out}",
                       f"--vocab_file={vocab_file}", f"--num_workers={workers}",
                       f"--random_seed={seed}", "--chunk_size_mb=0.004",
                       "--shuffle_buffer_size=50", *SMALL)
        assert done.returncode == 0, done.stderr
        with open(out, "rb") as f:
            outputs[name] = f.read()
    assert outputs["w1"] == outputs["w2"]
    assert outputs["w1"] != outputs["seed6"]
    assert not glob.glob(str(tmp_path / "*.tmp-*"))
    assert not glob.glob(str(tmp_path / ".*.tmp-*"))


def test_one_chunk_gives_the_originals_records(tmp_path, vocab_file):
    """A corpus within one chunk: the same records as the original CLI, in the same order,
    in both output files; and each tool reads the other's files."""
    corpus = write_corpus(tmp_path / "corpus.txt", 60, 3)
    common = [f"--input_file={corpus}", f"--vocab_file={vocab_file}", "--random_seed=77",
              *SMALL]
    ours = [str(tmp_path / "ours0.tfrecord"), str(tmp_path / "ours1.tfrecord")]
    theirs = [str(tmp_path / "orig0.tfrecord"), str(tmp_path / "orig1.tfrecord")]
    done = run_cli(*common, f"--output_file={','.join(ours)}", "--num_workers=2",
                   "--exact_draws")
    assert done.returncode == 0, done.stderr
    done = run_process(*common, f"--output_file={','.join(theirs)}",
                       module="bert.create_pretraining_data")
    assert done.returncode == 0, done.stderr[-3000:]
    for mine, original in zip(ours, theirs):
        assert parse_all([mine]) == parse_all([original])
        assert len(read_records([mine])) > 50
    # By default masking is vectorised: other draws, the original's shape of records.
    fast = str(tmp_path / "fast.tfrecord")
    done = run_cli(*common, f"--output_file={fast}")
    assert done.returncode == 0, done.stderr
    fast_rows, original_rows = parse_all([fast]), parse_all(theirs)
    assert fast_rows != original_rows[:len(fast_rows)]
    assert abs(len(fast_rows) / len(original_rows) - 1) < 0.1
    with open(summary_of(fast), encoding="utf-8") as f:
        summary = json.load(f)
    assert summary["exact_draws"] is False and summary["instances"] == len(fast_rows)
    assert 0.1 < summary["masked_fraction"] < 0.2


def _error(tmp_path, vocab_file, *args, corpus=None):
    """The command's error output for bad input: in this process with one worker (no fork
    of the test process), as a process when the test asks for worker processes."""
    if corpus is None:
        corpus = write_corpus(tmp_path / "ok.txt", 5, 4)
    argv = [f"--input_file={corpus}", f"--output_file={tmp_path / 'o.tfrecord'}",
            f"--vocab_file={vocab_file}", *SMALL, *args]
    if any(arg.startswith("--num_workers=") for arg in args):
        done = clis.run_cli("create_pretraining_data", *argv)
    else:
        done = clis.call_main("create_pretraining_data", [*argv, "--num_workers=1"])
    assert done.code == 1
    # Nothing but the error line: no traceback, nor one from the interpreter's exit.
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, (
        done.stderr[-3000:])
    assert not glob.glob(str(tmp_path / "o.tfrecord*")), "no output may be left behind"
    assert not [n for n in os.listdir(tmp_path) if "o.tfrecord" in n], "nor a temporary"
    return done.stderr


def test_bad_inputs_fail_with_a_clear_message(tmp_path, vocab_file):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"the cat\n\nthe dog\nhe \xff ran\n")
    assert "bad.txt:4: invalid UTF-8" in _error(tmp_path, vocab_file, corpus=str(bad))
    # The same from a worker process, deep in a file of many chunks.
    good = write_corpus(tmp_path / "good.txt", 100, 9)
    with open(good, "rb") as f:
        text = f.read()
    bad.write_bytes(text + b"\nthe \xc3( cat\n" + text)
    line = text.count(b"\n") + 2
    err = _error(tmp_path, vocab_file, "--num_workers=2", "--chunk_size_mb=0.002",
                 corpus=str(bad))
    assert f"bad.txt:{line}: invalid UTF-8 at byte offset {len(text) + 5}" in err
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert "input is empty" in _error(tmp_path, vocab_file, corpus=str(empty))
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n  \n\x07\n")
    assert "no instances" in _error(tmp_path, vocab_file, corpus=str(blank))
    err = _error(tmp_path, vocab_file, corpus=str(tmp_path / "nothing*.txt"))
    assert "--input_file" in err and "nothing*.txt" in err and "matches no file" in err
    assert "--max_seq_length=4 is too small" in _error(tmp_path, vocab_file,
                                                         "--max_seq_length=4")
    assert "--max_predictions_per_seq=40 is larger than --max_seq_length=32" in _error(
        tmp_path, vocab_file, "--max_predictions_per_seq=40")


def test_bad_masking_rates_are_refused_naming_the_flag(tmp_path, vocab_file):
    """--mask_token_rate / --random_token_rate (Table 8 of the BERT paper): negative,
    above 1, NaN, or adding up to more than 1 is an error naming the flag, before any
    work; with --dynamic_masking they belong to run_pretraining.py."""
    for args, message in [
            (["--mask_token_rate=-0.2"], "--mask_token_rate=-0.2 must be a number in [0, 1]"),
            (["--random_token_rate=1.5"], "--random_token_rate=1.5 must be a number in [0, 1]"),
            (["--mask_token_rate=nan"], "--mask_token_rate=nan must be a number in [0, 1]"),
            (["--mask_token_rate=0.9", "--random_token_rate=0.2"],
             "--mask_token_rate=0.9 plus --random_token_rate=0.2 is more than 1"),
            (["--dynamic_masking", "--random_token_rate=0.2"],
             # (SMALL gives --max_predictions_per_seq, named too)
             "--max_predictions_per_seq, --random_token_rate: no effect with "
             "--dynamic_masking")]:
        err = _error(tmp_path, vocab_file, *args)
        assert f"create_pretraining_data: error: {message}" in err, err[-2000:]


def test_no_nsp_and_table_8_rates_from_the_command_line(tmp_path, vocab_file):
    """--next_sentence_prediction=false with Table 8's 0/20/80 row: records of the usual
    features, no random next, the summary records the objective and the split."""
    corpus = write_corpus(tmp_path / "corpus.txt", 150, 8)
    out = str(tmp_path / "o.tfrecord")
    done = run_cli(f"--input_file={corpus}", f"--output_file={out}",
                   f"--vocab_file={vocab_file}", "--next_sentence_prediction=false",
                   "--mask_token_rate=0", "--random_token_rate=0.8", "--num_workers=2",
                   "--chunk_size_mb=0.004", *SMALL)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(open(summary_of(out), encoding="utf-8").read())
    config = summary["config"]
    assert config["next_sentence_prediction"] is False
    assert (config["mask_token_rate"], config["random_token_rate"]) == (0.0, 0.8)
    assert summary["random_next"] == 0 and summary["masked_as_mask"] == 0
    assert summary["num_chunks"] > 3 and summary["instances"] > 300
    rows = parse_all([out])
    assert len(rows) == summary["instances"]
    assert not any(r["next_sentence_labels"][0] for r in rows)
    assert summary["kept_token_share"] is not None and summary["kept_token_share"] > 0.1


def test_bad_vocab_and_output_paths(tmp_path, vocab_file):
    corpus = write_corpus(tmp_path / "c.txt", 5, 5)
    malformed = write_vocab(tmp_path / "malformed.txt", ["[PAD]", "[UNK]", "the", "cat"])
    # A cased vocab read lower-cased (the default): its capitalised tokens never match.
    cased = write_vocab(tmp_path / "cased.txt", [t if t.startswith("[") else t.capitalize()
                                                 for t in dict.fromkeys(TINY_VOCAB)])
    for vocab, expected in [(str(tmp_path / "missing.txt"), "--vocab_file: "),
                            (malformed, "--vocab_file: "),
                            (cased, "--do_lower_case=true but vocab file")]:
        done = clis.call_main("create_pretraining_data", input_file=corpus,
                              output_file=tmp_path / "o.tfrecord", vocab_file=vocab,
                              num_workers=1)
        assert done.code == 1 and expected in done.stderr, done.stderr[-2000:]
        assert os.path.basename(vocab) in done.stderr and "Traceback" not in done.stderr
    unwritable = tmp_path / "no_such_dir" / "o.tfrecord"
    done = clis.call_main("create_pretraining_data", input_file=corpus,
                          output_file=unwritable, vocab_file=vocab_file, num_workers=1)
    assert done.code == 1 and "--output_file: cannot write" in done.stderr
    assert "no_such_dir" in done.stderr


def test_odd_but_valid_inputs_are_processed_and_logged(tmp_path, vocab_file):
    one_doc = tmp_path / "one_doc.txt"  # no blank line at all, a 0.5 MB line inside
    one_doc.write_text("the cat sat .\n" * 3000 + "the dog ran far . " * 30_000 + "\n"
                       + "he sat .\n" * 3000, encoding="utf-8")
    out = str(tmp_path / "o.tfrecord")
    done = run_cli(f"--input_file={one_doc}", f"--output_file={out}",
                   f"--vocab_file={vocab_file}", "--chunk_size_mb=0.02", *SMALL)
    assert done.returncode == 0, done.stderr
    assert "no blank line" in done.stderr and "split into pieces" in done.stderr
    assert len(read_records([out])) > 100
    # The 0.54 MB line (line 3001) is one sentence: an instance keeps 32 tokens of it.
    assert "one_doc.txt:3001: a line of 0.54 MB; 1 line(s) of this file exceed" in done.stderr
    assert "one sentence per line" in done.stderr
    with open(summary_of(out), encoding="utf-8") as f:
        assert json.load(f)["long_lines"] == 1
    one_sentence = tmp_path / "one_sentence.txt"
    one_sentence.write_text("\n\n".join(["the cat sat on the mat ."] * 40), encoding="utf-8")
    done = run_cli(f"--input_file={one_sentence}", f"--output_file={out}",
                   f"--vocab_file={vocab_file}", "--max_predictions_per_seq=31",
                   "--max_seq_length=32", "--dupe_factor=1")
    assert done.returncode == 0, done.stderr
    summary = json.loads(open(summary_of(out)).read())
    assert summary["random_next_share"] == 1.0 and summary["instances"] == 40
    assert "at most 29 tokens" in done.stderr  # max_predictions_per_seq > max_seq_length - 3


def test_shuffle_buffer_mixes_whole_chunks_uniformly():
    """The cross-chunk buffer: every record written once, chunks interleaved, a block
    written as soon as `size` records are held, the rest at the end."""
    from data_prep import create_pretraining_data as cli
    from data_prep.pretraining_data.chunks import ChunkResult
    from tests.test_features import frame_records
    from data_prep.pretraining_data.stats import Stats

    def chunk(index, n):
        records = [f"{index}:{i}".encode() for i in range(n)]
        data, lengths = frame_records(records)
        return ChunkResult(index, data, lengths, Stats())

    buffer = cli.ShuffleBuffer(250, seed=1)
    written = []
    for index in range(5):
        ready = buffer.push(chunk(index, 100))
        assert len(ready) in (0, 300)  # 300 held (>= 250): all of them go out
        written += ready
    written += buffer.drain()
    assert len(written) == 500 and buffer.drain() == []
    payloads = [bytes(r)[12:-4].decode() for r in written]
    assert sorted(payloads) == sorted(f"{c}:{i}" for c in range(5) for i in range(100))
    first_block = [int(p.split(":")[0]) for p in payloads[:300]]
    assert set(first_block) == {0, 1, 2} and first_block[:100] != [0] * 100
    assert {int(p.split(":")[0]) for p in payloads[300:]} == {3, 4}


# --- Outputs: refused before any work, summary naming, readers (issues 10 and 12) -----------


def test_outputs_that_would_destroy_data_are_refused_before_any_work(tmp_path, vocab_file):
    """An output that is an input (directly, via a glob, a relative path, a symlink, the
    vocab), the same output twice, an output that is a directory: exit 1, nothing touched."""
    corpus = write_corpus(tmp_path / "corpus.txt", 20, 11)
    (tmp_path / "link.txt").symlink_to(corpus)
    (tmp_path / "a_directory").mkdir()
    before = {p: open(p, "rb").read() for p in (corpus, vocab_file)}
    names = sorted(os.listdir(tmp_path))
    small = ["--max_seq_length=32", "--max_predictions_per_seq=5", "--dupe_factor=1"]
    cases = [
        ([f"--input_file={corpus}", f"--output_file={corpus}"],
         "is also an input (--input_file="),
        ([f"--input_file={tmp_path}/corp*", f"--output_file={corpus}"], "is also an input"),
        (["--input_file=corpus.txt", "--output_file=./corpus.txt"], "is also an input"),
        ([f"--input_file={corpus}", f"--output_file={tmp_path / 'link.txt'}"],
         "is also an input"),
        ([f"--input_file={corpus}", f"--output_file={vocab_file}"],
         "is also an input (--vocab_file="),
        ([f"--input_file={corpus}", "--output_file=o.tfrecord,./o.tfrecord"],
         "named twice"),
        ([f"--input_file={corpus}", f"--output_file={tmp_path / 'a_directory'}"],
         "a_directory is a directory; expected a file name"),
    ]
    for args, expected in cases:
        done = clis.call_main("create_pretraining_data",
                              [*args, f"--vocab_file={vocab_file}", *small, "--num_workers=1"],
                              cwd=str(tmp_path))
        assert done.code == 1, (args, done.stderr[-2000:])
        assert "create_pretraining_data: error: --output_file" in done.stderr, args
        assert expected in done.stderr, (args, done.stderr[-2000:])
        assert {p: open(p, "rb").read() for p in before} == before, args
        assert sorted(os.listdir(tmp_path)) == names, args
        assert os.listdir(tmp_path / "a_directory") == []


def test_a_directory_as_input_says_so(tmp_path, vocab_file):
    texts = tmp_path / "texts"
    texts.mkdir()
    write_corpus(texts / "part1.txt", 5, 12)
    for pattern in (str(texts), str(texts) + "/"):
        err = _error(tmp_path, vocab_file, corpus=pattern)
        assert "--input_file" in err and "is a directory" in err, err
        assert f"--input_file='{texts}/*.txt'" in err
        assert "matches no file" not in err


# The original README: `--input_file=/tmp/tf_examples.tfrecord*`. The original's
# run_pretraining.py globs that pattern with tf.gfile.Glob and reads every file with its
# `input_fn_builder`; bert.run_pretraining cannot be imported under TensorFlow 2
# (tf.contrib, flags), so its two functions are compiled from its source, with
# tf.contrib.data.map_and_batch replaced by what it does (map, then batch).
_ORIGINAL_READER = r"""
import ast, pathlib, sys, types
sys.path.insert(0, sys.argv[3])
import tensorflow.compat.v1 as tf1
from original_bert import original_module


class TF1WithContrib:
    contrib = types.SimpleNamespace(data=types.SimpleNamespace(
        map_and_batch=lambda map_func, batch_size, num_parallel_batches, drop_remainder:
        (lambda d: d.map(map_func).batch(batch_size, drop_remainder=drop_remainder))))

    def __getattr__(self, name):
        return getattr(tf1, name)


path = pathlib.Path(original_module("tokenization").__file__).with_name("run_pretraining.py")
tree = ast.parse(path.read_text(encoding="utf-8"))
body = [n for n in tree.body if isinstance(n, ast.FunctionDef)
        and n.name in ("input_fn_builder", "_decode_record")]
namespace = {"tf": TF1WithContrib()}
exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
input_files = tf1.gfile.Glob(sys.argv[1])  # as the original's main() expands --input_file
dataset = namespace["input_fn_builder"](input_files, 32, 5, is_training=False)(
    {"batch_size": 1})
count = 0
for batch in dataset.take(int(sys.argv[2])):  # the eval input repeats: two full passes
    count += 1
print("FILES", ",".join(sorted(input_files)))
print("READ", count, sorted(batch), batch["input_ids"].shape)
"""


def test_summary_is_not_matched_by_the_output_glob_and_the_original_reads_it(
        tmp_path, vocab_file):
    """Every file the glob `OUTPUT*` matches is records that the original's reader parses."""
    corpus = write_corpus(tmp_path / "corpus.txt", 80, 13)
    output = str(tmp_path / "tf_examples.tfrecord")
    done = run_cli(f"--input_file={corpus}", f"--output_file={output}",
                   f"--vocab_file={vocab_file}", "--num_output_shards=2", *SMALL)
    assert done.returncode == 0, done.stderr
    matched = sorted(glob.glob(output + "*"))
    instances = len(read_records([p for p in matched if not p.endswith(".json")]))
    assert instances > 50
    reader = subprocess.run(
        [sys.executable, "-c", _ORIGINAL_READER, output + "*", str(2 * instances),
         os.path.join(ROOT, "tests")], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), check=False)
    assert reader.returncode == 0, reader.stderr[-3000:]  # before: "corrupted record at 0"
    assert f"READ {2 * instances} " in reader.stdout, reader.stdout
    assert "FILES " + ",".join(matched) in reader.stdout
    assert [os.path.basename(p) for p in matched] == [
        "tf_examples.tfrecord-00000-of-00002", "tf_examples.tfrecord-00001-of-00002"]
    with open(summary_of(output), encoding="utf-8") as f:
        summary = json.load(f)
    assert summary["summary_file"] == summary_of(output)
    assert summary["instances"] == instances
    # This project's reader on the same glob, and on the whole directory (where the
    # summary is skipped by its name), reads the same records.
    from training import record_checks

    assert record_checks.list_files([output + "*"]) == matched
    assert record_checks.list_files([str(tmp_path / "*.tfrecord*")]) == matched


def test_readers_skip_temporaries_and_summaries(tmp_path):
    """A writer's temporaries (running or killed) and summaries are never taken as
    records."""
    from data_prep import fileio
    from training import record_checks

    records = [tmp_path / "out.tfrecord", tmp_path / "out.tfrecord-00001-of-00002"]
    others = [fileio.temporary_path(str(tmp_path / "out.tfrecord")),
              str(tmp_path / "out.tfrecord.summary.json"),
              str(tmp_path / "_out.tfrecord.summary.json")]
    for path in [*map(str, records), *others]:
        open(path, "wb").close()
    expected = sorted(map(str, records))
    assert record_checks.list_files([str(tmp_path / "out.tfrecord*")]) == expected
    assert record_checks.list_files([str(tmp_path / "*")]) == expected


def test_find_long_lines_across_block_boundaries(tmp_path):
    """The line scan agrees with a plain split whatever the block size."""
    import random as random_module

    from data_prep import create_pretraining_data as cli

    rng = random_module.Random(3)
    lines = [b"x" * rng.choice([0, 1, 5, 40, 99, 100, 101, 350]) for _ in range(300)]
    data = b"\n".join(lines) + rng.choice([b"", b"\n", b"y" * 200])
    path = tmp_path / "lines.txt"
    path.write_bytes(data)
    expected = [(i + 1, len(line)) for i, line in enumerate(data.split(b"\n"))
                if len(line) > 100]
    for block in (1, 7, 64, 100, 101, 4096, 1 << 20):
        assert cli.find_long_lines(str(path), 100, block_bytes=block) == expected, block
    assert expected
