"""The benches' corpus: megabytes of real, non-repeating English-ish text, offline.

Every data-tool bench (create_pretraining_data, the Beam pipeline, the tokenizer, dynamic
masking on real records, the statistics spread) takes its text from here, so that their
figures are measured on the same kind of text and none of them on a few hundred KB
repeated: a tokenizer's caches (ours keeps word -> pieces and line -> ids caches in every
worker; the original has none) are warm after the first pass over repeated text, which
flatters a ratio against the original by an amount only a non-repeating corpus shows.

Sources (all on this machine, nothing downloaded): the docstrings (module, class,
function, in source order, parsed with `ast`, never imported) and prose comment blocks of
the Python files of the standard library and of the installed packages in `PACKAGES`
(TensorFlow, Keras, numpy, scipy, scikit-learn, Apache Beam, ... as pinned by the
project's requirements files), cleaned and cut into sentences by
`data_prep.sample_corpus` (doctests, literal blocks and code-like comments dropped).
Deterministic for a given Python and set of package versions: files are taken in the
order of a CRC32 of their relative path (a fixed shuffle, so that any prefix mixes the
standard library and every package: a 1 MB corpus is the same kind of text as a 30 MB
one, and its first megabytes make a representative vocab), and every sentence that
already appeared is dropped, so no line of the corpus repeats. One document per source
file (its docstrings, then its comments); one sentence per line, a blank line between
documents: the original BERT input format. About 19 MB in all with the pinned packages
(the Beam and dev extras installed, `make .venv/.dev`); the whole text is built once
(1-3 minutes on 2 cores, with the load) and cached (`_cache_file`), keyed by the code
and the source files' names and contents. `describe()` (`--describe`) counts the distinct
lines and prints the SHA-256 to compare two machines' corpora.

`--corpus=repeated` is the old benches' kind of corpus, kept to measure what repetition
does: the first `unique_mb` (0.58 MB, what the old stdlib-docstring corpus held) of
the same text, repeated to size.

    .venv/bin/python bench/corpus.py --mb=10 --output=/tmp/corpus.txt   # also --describe
"""

from __future__ import annotations

import argparse
import ast
import collections
import functools
import glob
import hashlib
import inspect
import lzma
import os
import pathlib
import sys
import sysconfig
import warnings
import zlib
from collections.abc import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from data_prep import sample_corpus  # noqa: E402

# Installed packages read besides the standard library: the project's runtime and dev
# requirements (and what they pull in with most prose). A fixed list, so that packages a
# user adds to the venv (e.g. keras-hub for the encoder bench) do not change the text.
PACKAGES = ("absl", "apache_beam", "keras", "numpy", "scipy", "sklearn", "tensorflow",
            "tensorflow_hub", "tensorflow_text", "tf_keras")
# Directories skipped: tests (their text is mostly about the test, and some packages ship
# thousands of them), demos and tools the standard library ships, and the venv's
# site-packages when it lies inside the standard library's tree.
_SKIPPED_DIRS = frozenset({"test", "tests", "testing", "idlelib", "turtledemo", "lib2to3",
                           "site-packages", "__pycache__"})
CORPORA = ("unique", "repeated")
DEFAULT_UNIQUE_MB = 0.58


def source_files() -> list[tuple[str, pathlib.Path]]:
    """(relative name, path) of every source file read, in the corpus's fixed order."""
    roots = [("stdlib", pathlib.Path(sysconfig.get_paths()["stdlib"]))]
    # The venv's packages, then the test references installed beside them (seqeval, scipy,
    # scikit-learn: requirements-reference.txt); a package found in both is read once.
    bases = [pathlib.Path(sysconfig.get_paths()["purelib"]),
             pathlib.Path(sys.prefix) / "reference"]
    for package in PACKAGES:
        found = [base / package for base in bases if (base / package).is_dir()]
        roots += [(package, found[0])] if found else []
    files = []
    for label, root in roots:
        for path in root.rglob("*.py"):
            relative = path.relative_to(root)
            if _SKIPPED_DIRS.intersection(relative.parts[:-1]) or \
                    path.name.startswith("test_") or path.name.endswith("_test.py"):
                continue
            name = f"{label}/{relative.as_posix()}"
            files.append((name, path))
    return sorted(files, key=lambda item: (zlib.crc32(item[0].encode("utf-8")), item[0]))


def _docstrings(tree: ast.AST) -> Iterator[str]:
    """Docstrings of a module, its classes and functions, depth first in source order."""
    if isinstance(tree, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        doc = ast.get_docstring(tree, clean=False)
        if doc:
            yield doc
    for child in ast.iter_child_nodes(tree):
        yield from _docstrings(child)


def file_sentences(path: pathlib.Path) -> list[str]:
    """Sentences of one source file: its docstrings, then its prose comment blocks."""
    try:
        source = path.read_bytes()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences in old sources
            tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return []
    sentences = []
    for doc in _docstrings(tree):
        sentences.extend(sample_corpus.docstring_sentences(doc))
    for block in sample_corpus.comment_blocks.__wrapped__(str(path)):
        sentences.extend(sample_corpus.split_sentences(block))
    return sentences


def unique_documents() -> Iterator[list[str]]:
    """Documents (lists of sentences) in the fixed order; no sentence appears twice."""
    seen: set[str] = set()
    for _, path in source_files():
        document = []
        for sentence in file_sentences(path):
            if sentence not in seen:
                seen.add(sentence)
                document.append(sentence)
        if document:
            yield document


def _fingerprint() -> str:
    """What the unique text depends on: the code that makes it (here and in sample_corpus)
    and every source file read (name and content), in order. Not modification times: two
    venvs with the same packages share one cache."""
    digest = hashlib.sha256(repr((PACKAGES, sorted(_SKIPPED_DIRS))).encode("utf-8"))
    for function in (source_files, _docstrings, file_sentences, unique_documents,
                     unique_text):
        digest.update(inspect.getsource(function).encode("utf-8"))
    with open(sample_corpus.__file__, "rb") as f:
        digest.update(f.read())
    for name, path in source_files():
        digest.update(f"{name}\0".encode("utf-8"))
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _cache_file() -> str | None:
    """The whole unique text's cache file, or None: under `$BERT_KERAS3_CACHE_DIR` (empty:
    no cache), else `$XDG_CACHE_HOME/bert-keras3`, else `~/.cache/bert-keras3` (a bench,
    run on purpose, may keep its corpus there; the library writes nothing of its own)."""
    directory = os.environ.get("BERT_KERAS3_CACHE_DIR")
    if directory is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                 ".cache")
        directory = os.path.join(base, "bert-keras3")
    if not directory:
        return None
    return os.path.join(directory, f"bench-corpus-{_fingerprint()}.txt")


@functools.cache
def unique_text() -> bytes:
    """The whole unique corpus (~19 MB, 1-3 minutes to build on 2 cores), cached on disk
    and, once read, in this process (checking the cache reads every source file)."""
    cache = _cache_file()
    if cache and os.path.exists(cache):
        with open(cache, "rb") as f:
            return f.read()
    text = "".join("\n".join(document) + "\n\n" for document in unique_documents())
    data = text.encode("utf-8")
    if cache:
        from data_prep import fileio

        fileio.makedirs(os.path.dirname(cache))
        for stale in glob.glob(os.path.join(os.path.dirname(cache), "bench-corpus-*.txt")):
            os.remove(stale)  # built by other code or from other files: never read again
        fileio.write_bytes(cache, data)
    return data


def _prefix(data: bytes, size_bytes: int) -> bytes:
    """`data` cut after the line that reaches size_bytes (a sentence or a blank line)."""
    if size_bytes > len(data):
        raise ValueError(f"the unique corpus holds {len(data) / 1e6:.2f} MB of text on this "
                         f"machine; {size_bytes / 1e6:.2f} MB were asked for")
    return data[:data.index(b"\n", max(size_bytes - 1, 0)) + 1]


def write_corpus(path: str, size_mb: float, corpus: str = "unique",
                 unique_mb: float = DEFAULT_UNIQUE_MB) -> int:
    """Writes `size_mb` (10^6 bytes) of corpus text to `path`; returns the bytes written.

    `corpus`: "unique" (no line repeats; see the module docstring) or "repeated" (the first
    `unique_mb` of the same text, ending at a line, repeated to size).
    """
    if corpus not in CORPORA:
        raise ValueError(f"corpus must be one of {CORPORA}, got {corpus!r}")
    size_bytes = int(size_mb * 1e6)
    if corpus == "unique":
        data = _prefix(unique_text(), size_bytes)
    else:
        block = _prefix(unique_text(), int(unique_mb * 1e6))
        block = block.rstrip(b"\n") + b"\n\n"  # each repeat starts a new document
        data = block * (size_bytes // len(block) + 1)
        data = data[:data.index(b"\n", size_bytes - 1) + 1]
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def corpus_lines(size_mb: float, corpus: str = "unique",
                 unique_mb: float = DEFAULT_UNIQUE_MB) -> list[str]:
    """The corpus's non-blank lines (one sentence each), `size_mb` of text."""
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "corpus.txt")
        write_corpus(path, size_mb, corpus, unique_mb)
        with open(path, encoding="utf-8") as f:
            return [line for line in f.read().split("\n") if line]


SPECIAL_TOKENS = (["[PAD]"] + [f"[unused{i}]" for i in range(99)]
                  + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"])  # BERT's ids 0-103


def write_vocab(vocab_path: str, size: int = 30_000, sample_mb: float = 5.0) -> int:
    """Writes the benches' vocab: a plausible uncased WordPiece vocab learned from the
    unique corpus's first `sample_mb` (the same vocab whatever size a bench runs): BERT's
    special tokens, every character alone and as a `##` piece, the 3,000 most frequent word
    endings (`##` pieces of 2-5 characters), then the most frequent words, up to `size`
    entries. Returns the number of entries (about 21,000 with the defaults)."""
    from data_prep import reference_tokenization

    basic = reference_tokenization.BasicTokenizer(do_lower_case=True)
    words = collections.Counter()
    for line in _prefix(unique_text(), int(sample_mb * 1e6)).decode("utf-8").split("\n"):
        words.update(basic.tokenize(line))
    chars = sorted({c for w in words for c in w})
    suffixes = collections.Counter()
    for word, count in words.items():
        for k in range(2, min(6, len(word))):
            suffixes["##" + word[-k:]] += count
    tokens = list(SPECIAL_TOKENS) + chars + ["##" + c for c in chars]
    tokens += [s for s, _ in suffixes.most_common(3000)]
    tokens += [w for w, _ in words.most_common(size)]
    tokens = list(dict.fromkeys(tokens))[:size]
    with open(vocab_path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    return len(tokens)


def describe(path: str) -> dict:
    """How much of a corpus file is unique: lines, distinct lines and their bytes, sizes
    compressed by xz (a 64 MB window, so that repeats far apart are found: gzip's 32 KB
    window is not) and the SHA-256 to check that two machines built the same text."""
    with open(path, "rb") as f:
        data = f.read()
    lines = [line for line in data.split(b"\n") if line]
    distinct = set(lines)
    packed = lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)
    return dict(bytes=len(data), lines=len(lines), distinct_lines=len(distinct),
                distinct_line_bytes=sum(len(line) + 1 for line in distinct),
                documents=data.count(b"\n\n") + 1, xz_bytes=len(packed),
                sha256=hashlib.sha256(data).hexdigest())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=10.0)
    parser.add_argument("--output", required=True)
    parser.add_argument("--corpus", choices=CORPORA, default="unique")
    parser.add_argument("--unique_mb", type=float, default=DEFAULT_UNIQUE_MB,
                        help="with --corpus=repeated: the MB of text repeated")
    parser.add_argument("--describe", action="store_true",
                        help="print lines, distinct lines, xz size and SHA-256")
    args = parser.parse_args()
    written = write_corpus(args.output, args.mb, args.corpus, args.unique_mb)
    print(f"{written} bytes -> {args.output}")
    if args.describe:
        print(describe(args.output))


if __name__ == "__main__":
    main()
