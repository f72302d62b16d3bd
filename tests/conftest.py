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


@pytest.fixture
def tiny_vocab_file(tmp_path):
    """A small English WordPiece vocab written to tmp_path."""
    return write_vocab(tmp_path / "vocab.txt")


def run_isolated(work, script: str, args) -> dict:
    """Runs `script` (Python source) in a fresh `python -I` process in the folder `work`,
    with no PYTHONPATH, so it sees none of this repository's modules: the way a serving
    process uses an export. `args` goes to it as JSON (argv[1]); the script writes an
    .npz (argv[2]), returned as a dict of numpy arrays."""
    import numpy as np

    (work / "args.json").write_text(json.dumps(args, ensure_ascii=False), encoding="utf-8")
    (work / "script.py").write_text(script, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH="", TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, "-I", "script.py", "args.json", "out.npz"],
                            cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with np.load(work / "out.npz", allow_pickle=True) as data:
        return dict(data)
