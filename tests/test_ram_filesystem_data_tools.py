"""The data tools on any tf.io.gfile path (issue 23 §4): every path on TensorFlow's in-memory
`ram://` filesystem, as on a gs:// bucket, gives the same bytes as the same run on a local
disk.

Each tool runs through its in-process entry point (its `main`, flags parsed) in this
process: `ram://` lives only inside one process, so a CLI started as a subprocess could not
see files put there. Each tool defines flags of the same names (`--input_file`, ...): its
flags are defined for the call only (tests/clis.py's flag scope). The helper runs the tool
three times on the same inputs:

* `local`: every path in a local folder;
* `ram`: every path (inputs, vocab, outputs, summaries) on ram://, a file system that
  renames: temporaries beside the outputs, renamed into place;
* `object_store`: the same, with ram:// counted as an object store
  (`fileio.OBJECT_STORE_SCHEMES`), as gs:// is: outputs staged locally and uploaded once,
  complete, under their final names, nothing renamed on the store.

and reports, per run, every output file (bytes digested; the summaries' timings dropped
and the run's folder named ROOT), the renames and uploads it made, and what it left in
the temporary folder. A single local read or write of a ram:// path would fail the run
(or leave a stray local `ram:` folder, which is checked too).
"""

import json
import os
import sys

import pytest

from tests import test_loop_support as S
from tests.conftest import TINY_VOCAB

# Runs `run(root)` (defined by each tool's body) once per mode; prints RESULT{...}.
PRELUDE = r'''
import contextlib, hashlib, io, json, os, sys, tempfile
import tensorflow as tf
from absl import flags
from data_prep import fileio

FLAGS = flags.FLAGS
LOCAL, RAM = sys.argv[1], sys.argv[2]
INPUTS = json.loads(sys.stdin.read())  # {relative path: text, or "hex:" and bytes}
TIMINGS = {"seconds", "mb_per_second", "instances_per_second"}
CALLS = {"rename": 0, "upload": 0}
NOTES = {}  # what a run reports besides its files (e.g. an error message)
_rename, _upload = fileio.rename, fileio._upload


def counted(name, function):
    def call(*args, **kwargs):
        CALLS[name] += 1
        return function(*args, **kwargs)
    return call


fileio.rename, fileio._upload = counted("rename", _rename), counted("upload", _upload)


def put(root, files):
    for relative, text in files.items():
        path = f"{root}/{relative}"
        tf.io.gfile.makedirs(path.rsplit("/", 1)[0])
        with tf.io.gfile.GFile(path, "wb") as f:
            f.write(bytes.fromhex(text[4:]) if text.startswith("hex:") else text.encode())


def tree(root):
    """{path below root: bytes} of every file under root, local or ram://."""
    out = {}
    for directory, _, names in tf.io.gfile.walk(root):
        for name in names:
            path = f"{directory.rstrip('/')}/{name}"
            with tf.io.gfile.GFile(path, "rb") as f:
                out[path[len(root) + 1:]] = f.read()
    return out


def digest(name, data, root):
    if name.endswith(".json"):
        summary = {k: v for k, v in json.loads(data).items() if k not in TIMINGS}
        return json.dumps(summary, sort_keys=True).replace(root, "ROOT")
    return f"{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}"


def parse(argv, known_only=False):
    FLAGS.unparse_flags()
    FLAGS(["tool"] + argv, known_only=known_only)
'''

EPILOGUE = r'''
results = {}
plain = fileio.OBJECT_STORE_SCHEMES
for mode in ("local", "ram", "object_store"):
    root = f"{LOCAL}/{mode}" if mode == "local" else f"{RAM}/{mode}"
    fileio.OBJECT_STORE_SCHEMES = plain | {"ram"} if mode == "object_store" else plain
    put(f"{root}/in", INPUTS)
    tf.io.gfile.makedirs(f"{root}/out")
    CALLS.update(rename=0, upload=0)
    NOTES.clear()
    status, extra = run(root)
    files = {**tree(f"{root}/out"), **extra}
    results[mode] = {
        "status": status, "calls": dict(CALLS), "notes": dict(NOTES),
        "files": {name: digest(name, data, root) for name, data in sorted(files.items())},
        "staging_left": [n for n in os.listdir(tempfile.gettempdir()) if "bert-staging" in n]}
print("RESULT" + json.dumps(results))
'''


def run_modes(tmp_path, body, inputs):
    """The three runs of `body` (see the module docstring), in this process with its
    temporary folder in tmp_path, ram:// below a folder of this call's own; returns
    {mode: report} and "stderr" (what the runs wrote there and logged)."""
    import contextlib
    import io
    import tempfile
    import uuid

    import tensorflow as tf

    from data_prep import fileio
    from tests import clis

    temp = tmp_path / "tmp"
    temp.mkdir()
    (tmp_path / "local").mkdir()
    ram = f"ram://data_tools-{uuid.uuid4().hex}"
    saved = (fileio.rename, fileio._upload, fileio.OBJECT_STORE_SCHEMES, tempfile.tempdir,
             sys.argv, sys.stdin)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.ExitStack() as stack:
            # The body defines its tool's flags; they go when the call ends.
            stack.enter_context(clis._flag_scope(_BODY_DEFINES_FLAGS))  # noqa: SLF001
            stack.enter_context(contextlib.chdir(tmp_path))
            stack.enter_context(contextlib.redirect_stdout(out))
            stack.enter_context(contextlib.redirect_stderr(err))
            log = stack.enter_context(clis._absl_log())  # noqa: SLF001
            tempfile.tempdir = str(temp)
            sys.argv = ["-c", str(tmp_path / "local"), ram]
            sys.stdin = io.StringIO(json.dumps(inputs))
            exec(compile(PRELUDE + body + EPILOGUE, "<data tool runs>", "exec"),  # noqa: S102
                 {"__name__": "__data_tool_runs__"})
    finally:
        (fileio.rename, fileio._upload, fileio.OBJECT_STORE_SCHEMES, tempfile.tempdir,
         sys.argv, sys.stdin) = saved
        if tf.io.gfile.exists(ram):
            tf.io.gfile.rmtree(ram)
    assert not os.path.exists(tmp_path / "ram:"), "a ram:// path escaped to the local disk"
    line = next(line for line in out.getvalue().splitlines() if line.startswith("RESULT"))
    results = json.loads(line[len("RESULT"):])
    results["stderr"] = err.getvalue() + "\n".join(log)
    return results


class _BODY_DEFINES_FLAGS:  # noqa: N801
    """For clis' flag scope: no tool module; the body defines its tool's flags."""

    @staticmethod
    def define_flags():
        pass


def assert_same_outputs(results, names, uploads):
    """Every mode wrote the local run's files, byte for byte; ram:// renamed its
    temporaries, the object store got `uploads` uploads and no rename; nothing staged is
    left behind."""
    local = results["local"]
    assert local["status"] == 0 and sorted(local["files"]) == sorted(names), local
    for mode in ("ram", "object_store"):
        assert results[mode]["status"] == 0, (mode, results["stderr"][-3000:])
        assert results[mode]["files"] == local["files"], mode
        assert results[mode]["staging_left"] == [], mode
    assert results["ram"]["calls"] == {"rename": uploads, "upload": 0}
    assert results["object_store"]["calls"] == {"rename": 0, "upload": uploads}


WORDS = ["the", "cat", "dog", "sat", "on", "a", "mat", "ran", "far", "away", "home", "big",
         "red", "cats", "unaffable", ",", "."]


def corpus(seed, documents):
    """Documents of 1-8 sentences, blank lines between them."""
    import random

    rng = random.Random(seed)
    return "\n\n".join(
        "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 15)))
                  for _ in range(rng.randint(1, 8)))
        for _ in range(documents)) + "\n"


def data_inputs():
    """Two corpus files (the second with a line of over 100 x max_seq_length bytes) and
    the vocab."""
    long_line = " ".join(["the cat sat on the mat ."] * 150)
    return {"corpus/a.txt": corpus(1, 60),
            "corpus/b.txt": corpus(2, 40) + "\n" + long_line + "\n",
            "vocab.txt": "\n".join(TINY_VOCAB) + "\n"}


CREATE_PRETRAINING_DATA = r'''
from data_prep import create_pretraining_data as tool

tool.define_flags()


def run(root, corpus="corpus/*.txt"):
    parse([f"--input_file={root}/in/{corpus}", f"--vocab_file={root}/in/vocab.txt",
           f"--output_file={root}/out/train.tfrecord,{root}/out/more.tfrecord",
           "--num_output_shards=2", "--gzip", "--num_workers=2", "--chunk_size_mb=0.002",
           "--max_seq_length=32", "--max_predictions_per_seq=5", "--dupe_factor=2"])
    return tool.main(["tool"]), {}
'''


@pytest.mark.slow
def test_create_pretraining_data_on_ram_paths(tmp_path):
    """Inputs read by this process and handed to 2 forked workers with their chunks
    (which never open a URL), long lines found on the way, 2 names x 2 shards of GZIP
    records and the summary: the local run's bytes."""
    inputs = data_inputs()
    results = run_modes(tmp_path, CREATE_PRETRAINING_DATA, inputs)
    shards = [f"{name}.tfrecord-0000{k}-of-00002" for k in (0, 1) for name in ("train", "more")]
    assert_same_outputs(results, shards + ["_train.tfrecord.summary.json"], uploads=5)
    summary = json.loads(results["local"]["files"]["_train.tfrecord.summary.json"])
    assert summary["num_workers"] == 2 and summary["num_chunks"] > 3
    assert summary["long_lines"] == 1 and summary["instances"] > 100
    assert summary["input_files"] == ["ROOT/in/corpus/a.txt", "ROOT/in/corpus/b.txt"]
    # The long-line warning, the same in every mode (the last line of b.txt).
    warnings = [line.split("/in/corpus/")[1] for line in results["stderr"].splitlines()
                if "a line of" in line]
    last = inputs["corpus/b.txt"].count("\n")
    assert len(warnings) == 3 and len(set(warnings)) == 1, warnings
    assert warnings[0].startswith(f"b.txt:{last}: a line of 3749 bytes;"), warnings


BAD_UTF8 = r'''
def run(root):
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        try:
            status, _ = run_tool(root, corpus="bad.txt")
        except SystemExit as exit_:  # the shell's one line, status 1
            print(exit_.code, file=errors)
            status = 1 if isinstance(exit_.code, str) else exit_.code
    NOTES["errors"] = errors.getvalue().replace(root, "ROOT")
    return status, {}
'''


@pytest.mark.slow
def test_create_pretraining_data_names_bad_text_on_ram_paths(tmp_path):
    """Invalid UTF-8 in a chunk past the first: the error names the file, line and byte
    offset as for a local file (this process reads a URL input and checks it before a
    worker gets it); nothing is written."""
    good = corpus(3, 60)
    raw = (good + "\nthe cat \xff sat .\n").encode("latin-1")
    inputs = {"bad.txt": "hex:" + raw.hex(), "vocab.txt": "\n".join(TINY_VOCAB) + "\n"}
    body = CREATE_PRETRAINING_DATA.replace("def run(root", "def run_tool(root") + BAD_UTF8
    results = run_modes(tmp_path, body, inputs)
    assert len(good) > 3 * 2 * 1024  # several chunks before the bad line
    line, offset = good.count("\n") + 2, len(good) + len("\nthe cat ")
    expected = (f"create_pretraining_data: error: ROOT/in/bad.txt:{line}: invalid UTF-8 at "
                f"byte offset {offset} (invalid start byte)")
    for mode in ("local", "ram", "object_store"):
        assert results[mode]["status"] == 1, mode
        assert expected in results[mode]["notes"]["errors"], (mode, results[mode]["notes"])
        assert results[mode]["files"] == {}, mode  # nothing written, no temporary left


BEAM_PRETRAINING_DATA = r'''
from data_prep import beam_pretraining_data as tool

tool.define_flags()


def run(root):
    parse([f"--input_file={root}/in/corpus/*.txt", f"--vocab_file={root}/in/vocab.txt",
           f"--output_file={root}/out/train.tfrecord", "--num_output_shards=2",
           "--chunk_size_mb=0.002", "--pool_size_mb=0.004", "--max_seq_length=32",
           "--max_predictions_per_seq=5", "--dupe_factor=2"], known_only=True)
    return tool.main(["tool"]), {}
'''


@pytest.mark.slow
def test_beam_pretraining_data_on_ram_paths(tmp_path):
    """The Beam pipeline (the DirectRunner's in-process engine, whose workers see this
    process's ram://): chunks read and records written by the workers, sorting buckets in
    a work folder beside the outputs, the summary. On the object store its temporaries
    stay beside the outputs (the workers write them) and are copied into place."""
    import apache_beam  # noqa: F401  (requirements-dev.txt: missing, this test fails)
    results = run_modes(tmp_path, BEAM_PRETRAINING_DATA, data_inputs())
    names = [f"train.tfrecord-0000{k}-of-00002" for k in (0, 1)]
    local = results["local"]
    assert local["status"] == 0 and sorted(local["files"]) == sorted(
        names + ["_train.tfrecord.summary.json"]), local
    for mode in ("ram", "object_store"):
        assert results[mode]["status"] == 0, (mode, results["stderr"][-3000:])
        assert results[mode]["files"] == local["files"], mode
        # Written by the workers: beside the outputs and renamed, on either file system.
        assert results[mode]["calls"] == {"rename": 3, "upload": 0}, mode
    summary = json.loads(local["files"]["_train.tfrecord.summary.json"])
    assert summary["num_pools"] > 3 and summary["instances"] > 100


BUILD_VOCAB = r'''
from data_prep import build_vocab as tool

tool.define_flags()


def run(root):
    parse([f"--input_file={root}/in/corpus/*.txt", f"--output_file={root}/out/vocab.txt",
           "--vocab_size=90", "--num_unused=3", "--min_token_count=2"])
    return tool.main(["tool"]), {}
'''


@pytest.mark.slow
def test_build_vocab_on_ram_paths(tmp_path):
    """The corpus read, the vocab written, re-read for its [UNK] check and its summary
    written, all on ram://: the local run's bytes."""
    results = run_modes(tmp_path, BUILD_VOCAB, data_inputs())
    assert_same_outputs(results, ["vocab.txt", "vocab.txt.summary.json"], uploads=2)
    summary = json.loads(results["local"]["files"]["vocab.txt.summary.json"])
    assert summary["vocab_size"] > 60 and summary["output_file"] == "ROOT/out/vocab.txt"


BERT_TOKENIZE = r'''
from data_prep import bert_tokenize as tool

tool.define_flags()
TEXT = "The cat sat on the mat.\nUnaffable dogs ran far away!\n\nhome\n".encode()


def run(root):
    """stdin -> stdout with the vocab on ram://; the output is what was printed."""
    stdin, stdout = io.TextIOWrapper(io.BytesIO(TEXT)), io.TextIOWrapper(io.BytesIO())
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.redirect_stdout(stdout))
        sys.stdin = stdin
        stack.callback(setattr, sys, "stdin", sys.__stdin__)
        parse([f"--vocab_file={root}/in/vocab.txt", "--do_lower_case=true"])
        status = tool.main(["bert_tokenize"])
    stdout.flush()
    return status, {"stdout": stdout.buffer.getvalue()}
'''


@pytest.mark.slow
def test_bert_tokenize_on_ram_paths(tmp_path):
    results = run_modes(tmp_path, BERT_TOKENIZE, data_inputs())
    for mode in ("local", "ram", "object_store"):
        assert results[mode]["status"] == 0, (mode, results["stderr"][-3000:])
        assert results[mode]["files"] == results["local"]["files"], mode
    assert sorted(results["local"]["files"]) == ["stdout"]
    assert not results["local"]["files"]["stdout"].startswith("0 bytes")


EXTRACT_FEATURES = r'''
import extract_features as tool
from modeling import checkpoints
from modeling.config import BertConfig
from modeling.encoder import BertEncoder

tool.define_flags()
CONFIG = json.loads(INPUTS.pop("config"))
INPUTS["bert_config.json"] = json.dumps(CONFIG)
ENCODER = BertEncoder(BertConfig.from_dict(CONFIG))


def run(root):
    checkpoints.save_ours(ENCODER, f"{root}/in/encoder")
    CALLS.update(rename=0, upload=0)  # count the tool's own outputs only
    parse([f"--input_file={root}/in/input.txt", f"--output_file={root}/out/features.jsonl",
           f"--init_checkpoint={root}/in/encoder",
           f"--bert_config_file={root}/in/bert_config.json",
           f"--vocab_file={root}/in/vocab.txt", "--max_seq_length=16", "--batch_size=2",
           "--layers=-1,-2"])
    tool.main([])  # exits with a message on bad input
    return 0, {}
'''


@pytest.mark.slow
def test_extract_features_on_ram_paths(tmp_path):
    """Input, checkpoint, config and vocab read and the JSON lines written on ram://, one
    encoder's weights saved to each place: the local run's bytes."""
    inputs = {"input.txt": "the cat sat on the mat .\na dog ran far away . ||| the cat sat .\n"
                           "unaffable cats\n",
              "vocab.txt": "\n".join(TINY_VOCAB) + "\n",
              "config": json.dumps(S.tiny_config_dict(vocab_size=len(TINY_VOCAB)))}
    results = run_modes(tmp_path, EXTRACT_FEATURES, inputs)
    assert_same_outputs(results, ["features.jsonl"], uploads=1)
    assert not results["local"]["files"]["features.jsonl"].startswith("0 bytes")
