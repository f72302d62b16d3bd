"""Shared test set-up: quiet TensorFlow logs, tiny vocab fixtures, the repo root on sys.path."""

import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)
# The reference libraries only this process imports (seqeval, scipy, scikit-learn): kept
# out of the venv's site-packages so that the CLI subprocesses' `import tensorflow` does
# not load them (requirements-reference.txt). Appended: the venv's numpy comes first.
REFERENCE_LIBS = os.path.join(sys.prefix, "reference")
if os.path.isdir(REFERENCE_LIBS) and REFERENCE_LIBS not in sys.path:
    sys.path.append(REFERENCE_LIBS)

import pytest  # noqa: E402

TINY_VOCAB = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]",
    "the", "a", "of", "and", "to", "in", "is", "was", "it", "he", "she", "on",
    "cat", "dog", "sat", "mat", "ran", "far", "away", "home", "big", "red",
    "un", "##aff", "##able", "##s", "##ed", "##ing", "##ly", "want", "run",
    ",", ".", "!", "?", "'", "\"", "-", "(", ")", ":", ";",
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9",
] + [chr(c) for c in range(ord("a"), ord("z") + 1) if chr(c) not in ("a",)] + [
    "##" + chr(c) for c in range(ord("a"), ord("z") + 1)
]
TINY_VOCAB = list(dict.fromkeys(TINY_VOCAB))  # no repeated lines: ids stay line numbers


def write_vocab(path, tokens=TINY_VOCAB):
    """Writes a vocab.txt (one token per line) and returns its path as str."""
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return str(path)


def built_once(tmp_path_factory, name, build):
    """The folder `name` that `build(folder)` fills, built once per test session and read
    by every test that needs it (returned as a pathlib.Path; a test that changes it works
    on a `shutil.copytree` of it).

    Under pytest-xdist every worker is a session of its own: the first worker to ask
    builds the folder in the directory the workers share, holding a lock the others wait
    on; they then read the same folder. A build that fails leaves no `.done` mark, so the
    next worker to ask builds it again (and fails the same way)."""
    import fcntl
    import shutil

    base = tmp_path_factory.getbasetemp()
    # Under xdist, basetemp is <session>/popen-gwN: its parent belongs to this run alone.
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder, done = root / f"built-{name}", root / f"built-{name}.done"
    with open(root / f"built-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.write_text("")
    return folder


@pytest.fixture(scope="session")
def pretraining_records(tmp_path_factory):
    """Masked records of the pretraining data CLI over a small corpus (seq 32, 5
    predictions, 2 shards: `test_loop_support.make_records_with_cli`'s defaults), with the
    corpus and vocab beside them: read by the pretraining tests of several modules, built
    once (`built_once`; read only: write beside them elsewhere)."""
    from tests import test_loop_support

    folder = built_once(tmp_path_factory, "pretraining-records",
                        test_loop_support.make_records_with_cli)
    return {"pattern": str(folder / "records.tfrecord-*"), "vocab": str(folder / "vocab.txt"),
            "dir": folder}


@pytest.fixture(scope="session")
def prose(tmp_path_factory):
    """Real prose, a learned vocab and the original's output on it, with statistics and
    their sampling errors (tests/pretraining_reference.py): built once (`built_once`; read
    only), read by the pretraining-data modules."""
    from tests import pretraining_reference

    return pretraining_reference.load(built_once(tmp_path_factory, "pretraining-reference",
                                                 pretraining_reference.build))


# The modules of 10 s or more, longest first (the whole suite's --durations on a 2-core
# Intel Xeon (family 6 model 207), 2026-12-01: each module's setups and calls summed;
# together 86% of its time), started first: under `--dist loadfile` (with
# `--no-loadscope-reorder`: xdist's default hands out the modules with the most tests
# first) each worker takes the next module in collection order, so the last ones handed
# out are short and no long one runs on alone at the end while the other workers wait.
LONGEST_MODULES = (
    "test_paper_commands.py", "test_finetuning_sweeps.py", "test_run_classifier.py",
    "test_extend_vocab.py", "test_sentence_embeddings.py", "test_exact_resume_runners.py",
    "test_divergence.py", "test_run_ner.py", "test_demo.py", "test_export_tagger.py",
    "test_beam_pretraining_data.py", "test_fault_injection_export.py",
    "test_fault_injection_runners.py", "test_glue_submission.py",
    "test_pretraining_objectives.py", "test_run_pretraining.py", "test_export.py",
    "test_run_swag.py", "test_long_documents.py",
    "test_fault_injection_pretraining_data.py", "test_two_phase_pretraining.py",
    "test_resume.py", "test_export_hub.py", "test_run_dir.py", "test_loop_precision.py",
    "test_predict_saved_model.py", "test_dynamic_masking.py", "test_relative_paths.py",
    "test_loop.py", "test_run_squad.py", "test_export_width.py", "test_extract_features.py",
    "test_create_pretraining_data_cli.py", "test_bad_input_messages.py",
)


def pytest_collection_modifyitems(items):
    """The tests of `LONGEST_MODULES` first, in that order; the rest keep theirs. A name
    there that is no module (renamed, deleted) fails the run: it would order nothing."""
    here = os.path.dirname(os.path.abspath(__file__))
    missing = [name for name in LONGEST_MODULES if not os.path.exists(os.path.join(here, name))]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py LONGEST_MODULES: no such module {missing}")
    rank = {name: i for i, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_MODULES)))


_XLA_CACHE = []  # the folder pytest_configure made (in the process that made it)


def pytest_configure(config):
    """One XLA compilation cache for the test run (TensorFlow's documented
    `--tf_xla_persistent_cache_directory` in TF_XLA_FLAGS), shared by the pytest-xdist
    workers and every process the tests start: the XLA-fused gradient kernels
    (modeling/transformer.py, modeling/activations.py) are otherwise compiled again in
    each fresh process, ~1 CPU-s a run. TensorFlow writes each entry to a temporary
    name, renames it, and loads one only if its HLO equals the one compiling; the
    executable is the one a compilation makes. Made by the first process to configure
    (the controller, whose environment the workers inherit); removed at its end."""
    if "--tf_xla_persistent_cache_directory" in os.environ.get("TF_XLA_FLAGS", ""):
        return
    import tempfile

    folder = tempfile.mkdtemp(prefix="bert-tests-xla-cache-")
    _XLA_CACHE.append(folder)
    os.environ["TF_XLA_FLAGS"] = " ".join(filter(None, (
        os.environ.get("TF_XLA_FLAGS", ""), f"--tf_xla_persistent_cache_directory={folder}")))


def pytest_unconfigure(config):
    import shutil

    for folder in _XLA_CACHE:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def no_tf_data_autotuning():
    """tf.data's autotuning model off in every input pipeline this process builds (and the
    runs tests/forkserver.py forks; runs started as processes keep TensorFlow's default):
    a test keeps iterators in fixtures and reference cycles long after their last read,
    and freeing one waits for the model thread's sleep, up to a minute with the CPU idle
    (training/input_pipeline.py `AUTOTUNE_MODEL`)."""
    from training import input_pipeline

    input_pipeline.AUTOTUNE_MODEL = False
    yield
    input_pipeline.AUTOTUNE_MODEL = True


@pytest.fixture
def tiny_vocab_file(tmp_path):
    """A small English WordPiece vocab written to tmp_path."""
    return write_vocab(tmp_path / "vocab.txt")


# This repository's packages. A serving process (`run_isolated`, predict_saved_model.py)
# must import none of them: `python -I` keeps the repository off sys.path, but the editable
# install `make` sets up (`pip install -e .`) still finds them through its import hook, so
# such a process logs its imports (`isolated_argv`) and `assert_no_project_imports` reads
# the log.
PROJECT_PACKAGES = frozenset(name for name in os.listdir(REPO_ROOT)
                             if os.path.isfile(os.path.join(REPO_ROOT, name, "__init__.py")))


def isolated_argv(script: str, *args) -> list:
    """The command line of `script` in an isolated process (`python -I`: no PYTHONPATH,
    no script folder on sys.path), its imports logged on stderr (`-X importtime`)."""
    return [sys.executable, "-I", "-X", "importtime", script, *args]


def imported_modules(stderr: str) -> set:
    """The modules a process imported, from its `-X importtime` log on stderr."""
    return {line.split("|")[-1].strip() for line in stderr.splitlines()
            if line.startswith("import time:")}


def assert_no_project_imports(stderr: str) -> None:
    """The isolated process whose log is `stderr` imported no module of this repository."""
    imported = imported_modules(stderr)
    assert "encodings" in imported, "no import log: start the process with isolated_argv"
    ours = sorted(name for name in imported if name.split(".")[0] in PROJECT_PACKAGES)
    assert not ours, f"the isolated process imported this repository's modules: {ours}"


def run_isolated(work, script: str, args) -> dict:
    """Runs `script` (Python source) in a fresh isolated process in the folder `work`,
    with no PYTHONPATH, and checks that it imported none of this repository's modules:
    the way a serving process uses an export. `args` goes to it as JSON (argv[1]); the
    script writes an .npz (argv[2]), returned as a dict of numpy arrays."""
    import numpy as np

    (work / "args.json").write_text(json.dumps(args, ensure_ascii=False), encoding="utf-8")
    (work / "script.py").write_text(script, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH="", TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(isolated_argv("script.py", "args.json", "out.npz"),
                            cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_no_project_imports(result.stderr)
    with np.load(work / "out.npz", allow_pickle=True) as data:
        return dict(data)
