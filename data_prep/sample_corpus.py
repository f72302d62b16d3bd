"""Sample corpus from the Python standard library's own documentation, in BERT's input format.

Every Python installation ships English prose: module, class and function docstrings, the
comments of the standard library's Python sources, and the language reference topics
`pydoc` shows (`pydoc_data.topics`): about 2 MB on Python 3.11. This module turns that text
into a pretraining corpus in the original BERT input format:

* one sentence per line,
* a blank line between documents,
* UTF-8, lines separated by `\\n`.

Documents, in this order (deterministic for a given Python version and set of
importable standard-library modules, when built in a fresh process as the CLI does):

1. for every standard-library module (`sys.stdlib_module_names`, sorted, minus the
   modules listed in `EXCLUDED_MODULES`, plus the submodules of packages, sorted, minus
   test packages and `__main__` modules): its module docstring; one document per public
   class (the class docstring followed by the docstrings of its public methods and
   properties); one document holding the docstrings of its public functions; one document
   holding the prose comment blocks of its source file (see `comment_blocks`);
2. the language reference topics of `pydoc_data.topics`, one document per topic, sorted.

Only objects defined in the module itself are read (`obj.__module__`), and a docstring
already used is skipped, so re-exported or inherited text appears once.

Each sentence keeps the kind of documentation it came from (`module`, `class`,
`function` -- methods included --, `comment` or `topic`) and its module, so a later stage
can build a small real-text classification task with `labelled_sentences()`.

Docstring cleaning and sentence splitting (`docstring_sentences`) are deliberately
simple and documented:

* `inspect.cleandoc` normalises indentation; the text is cut into paragraphs at blank
  lines;
* doctests are dropped: from a line starting with `>>>` to the end of its paragraph;
* a paragraph is dropped as code when it is indented and follows a paragraph ending
  with `:` (reST literal blocks, grammar rules and code samples in the reference topics);
* lines made of punctuation only (reST heading underlines) are dropped;
* a paragraph's lines are joined with single spaces (all whitespace runs collapse);
* a paragraph is split into sentences after `.`, `!` or `?` (and any closing quotes or
  brackets) followed by whitespace and an upper-case letter, a digit or an opening quote
  or bracket, unless the word ending in `.` is a known abbreviation (`e.g.`, `i.e.`,
  `etc.`, ...) or a single letter;
* sentences without any letter are dropped.

The CLI (`python -m data_prep.sample_corpus --output_dir=DIR --max_mb=3`) writes
`DIR/stdlib-NNNNN-of-NNNNN.txt` shards and `DIR/summary.json`.

Classification data (`--classification_dir=CDIR`, with or without `--output_dir`; same
`--max_mb`/`--max_documents` limits, so the sentences are those of the corpus):
`write_classification_data` writes `CDIR/train.tsv`, `dev.tsv`, `test.tsv` (header
`sentence<TAB>label`, the format of `run_classifier.py --task_name=custom`) and
`CDIR/summary.json`, labelling each sentence by `--classification_label` (`kind`,
`module` or `package`, as `labelled_sentences`):

* sentences shorter than `--classification_min_words` words are dropped, and so is a
  sentence already seen in an earlier document (the reference topics repeat many), so no
  sentence is in two splits or has two labels;
* the split is by document, from a CRC32 of the document's name (80/10/10 by default), so
  no document has sentences in two splits and a document's split does not depend on the
  limits or on the other documents;
* `--classification_max_classes` keeps the most frequent labels (0: all);
* each split is balanced by down-sampling every label to the rarest label's count in that
  split, at most `--classification_rows_per_class` times the split's share (seeded by
  `--classification_seed`); rows are then shuffled with the same seed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import io
import json
import os
import pkgutil
import random
import re
import sys
import time
import tokenize
import warnings
import zlib
from collections.abc import Iterator

from data_prep import cli, fileio

KIND_MODULE = "module"
KIND_CLASS = "class"
KIND_FUNCTION = "function"
KIND_COMMENT = "comment"
KIND_TOPIC = "topic"
KINDS = (KIND_MODULE, KIND_CLASS, KIND_FUNCTION, KIND_COMMENT, KIND_TOPIC)

# Modules never imported: side effects on import (opening a browser, printing, GUI,
# terminal escape sequences, writing caches), installation-specific replacements
# (setuptools swaps `distutils`), boilerplate-only text (`encodings`), test code, or
# text read another way (`pydoc_data`).
EXCLUDED_MODULES = frozenset({
    "antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test",
    "lib2to3", "distutils", "ensurepip", "venv", "readline", "rlcompleter", "encodings",
    "pydoc_data", "site", "sitecustomize", "usercustomize", "xxlimited", "xxsubtype",
    "xxlimited_35",
})
_EXCLUDED_SUBMODULE_NAMES = frozenset({"__main__", "test", "tests", "idle_test"})

_ABBREVIATIONS = frozenset({
    "e.g.", "i.e.", "etc.", "vs.", "cf.", "mr.", "mrs.", "dr.", "st.", "no.", "fig.",
    "approx.", "resp.", "incl.", "viz.", "al.", "ca.", "ex.", "sec.", "ch.", "vol.",
})
# Candidate sentence ends: terminal punctuation, optional closing quotes/brackets,
# whitespace, then what may start a sentence.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_PUNCTUATION_ONLY = re.compile(r"^[\W_]+$")
_HAS_LETTER = re.compile(r"[^\W\d_]")
# Comment lines that are code, not prose: commented-out statements, assignments, calls,
# type comments, linter pragmas, coding/shebang lines.
_CODE_COMMENT = re.compile(
    r"(^(import|from|def|class|return|if|for|while|elif|else|try|except|with|assert|raise|"
    r"print|yield|del|pass|break|continue|lambda)\b.*[:()=\]]\s*$)"
    r"|==|!=|->|\+=|-=|\w\(\)|\w\[|^\w+(\.\w+)* = |;\s*$|^[\w.]+\(.*\)$"
    r"|^(type|noqa|pragma|pylint|fmt|mypy|flake8|XXX|TODO|FIXME)\b|coding[:=]|^!|^-\*-")


@dataclasses.dataclass(frozen=True)
class Document:
    """One corpus document: its sentences and, per sentence, the kind of source text.

    Attributes:
      name: where the text comes from, e.g. `json`, `json.JSONDecoder`, `json:functions`,
        `topic:assert`.
      module: the module the text belongs to (`pydoc_data.topics` for topics).
      sentences: the sentences, in order.
      kinds: one of `KINDS` per sentence.
    """

    name: str
    module: str
    sentences: tuple[str, ...]
    kinds: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class CorpusSummary:
    """What `write_corpus` wrote."""

    files: tuple[str, ...]
    documents: int
    sentences: int
    bytes: int
    modules: int
    seconds: float
    kinds: dict

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)


# ---------------------------------------------------------------------------
# Text cleaning and sentence splitting.


def split_sentences(paragraph: str) -> list[str]:
    """Splits one paragraph (any whitespace) into sentences; see the module docstring."""
    text = " ".join(paragraph.split())
    sentences = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        candidate = text[start:match.start() + 1]
        last_word = candidate.rsplit(" ", 1)[-1].lower()
        if last_word in _ABBREVIATIONS or re.fullmatch(r"\(?[^\W\d_]\.", last_word):
            continue
        sentences.append(text[start:match.end()].strip())
        start = match.end()
    sentences.append(text[start:].strip())
    return [s for s in sentences if _HAS_LETTER.search(s)]


def _paragraphs(text: str) -> list[list[str]]:
    paragraphs: list[list[str]] = [[]]
    for line in text.split("\n"):
        if line.strip():
            paragraphs[-1].append(line)
        elif paragraphs[-1]:
            paragraphs.append([])
    return [p for p in paragraphs if p]


def docstring_sentences(doc: str | None) -> list[str]:
    """Cleans one docstring or reference topic and returns its sentences, in order."""
    if not doc or not isinstance(doc, str):
        return []
    sentences: list[str] = []
    previous_ends_with_colon = False
    for lines in _paragraphs(inspect.cleandoc(doc)):
        is_literal = lines[0][:1].isspace() and previous_ends_with_colon
        if not is_literal:  # a literal block may span several indented paragraphs
            previous_ends_with_colon = lines[-1].rstrip().endswith(":")
        if is_literal:
            continue
        doctest = [i for i, line in enumerate(lines) if line.lstrip().startswith(">>>")]
        if doctest:
            lines = lines[:doctest[0]]
        kept = [line for line in lines if not _PUNCTUATION_ONLY.match(line.strip())]
        if kept:
            sentences.extend(split_sentences(" ".join(kept)))
    return sentences


# ---------------------------------------------------------------------------
# Walking the standard library.


def _quiet_import(name: str):
    """Imports a module with warnings and any import-time printing suppressed; None on error."""
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), \
            contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - any failure to import just skips the module
            return None


def stdlib_module_names() -> list[str]:
    """Top-level standard-library modules read, sorted (Python 3.10+)."""
    names = getattr(sys, "stdlib_module_names", ())
    return sorted(n for n in names if not n.startswith("_") and n not in EXCLUDED_MODULES)


def iter_modules() -> Iterator:
    """Yields the importable standard-library modules and their submodules, sorted, once."""
    seen = set()

    def visit(name):
        module = _quiet_import(name)
        if module is None or module.__name__ in seen:
            return
        seen.add(module.__name__)
        yield module
        path = getattr(module, "__path__", None)
        if path is None:
            return
        children = sorted(info.name for info in pkgutil.iter_modules(path))
        for child in children:
            if child in _EXCLUDED_SUBMODULE_NAMES or child.startswith(("test_", "_")):
                continue
            yield from visit(f"{name}.{child}")

    for top in stdlib_module_names():
        yield from visit(top)


def _own_public_members(module, module_name: str):
    """(name, object) pairs of public classes and routines defined in the module, sorted."""
    members = []
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if getattr(obj, "__module__", None) != module_name:
            continue
        members.append((name, obj))
    return members


def _member_docs(cls) -> list[str]:
    """Docstrings of a class's own public methods and properties, sorted by name."""
    docs = []
    for name, obj in sorted(vars(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(obj, (classmethod, staticmethod)):
            obj = obj.__func__
        if not (inspect.isroutine(obj) or inspect.isdatadescriptor(obj)):
            continue
        doc = getattr(obj, "__doc__", None)
        if isinstance(doc, str) and doc != type(obj).__doc__:  # skip generic type docs
            docs.append(doc)
    return docs


def _document(name, module, parts, seen_docs) -> Document | None:
    """Builds a document from (kind, docstring) parts, skipping docstrings already used."""
    sentences, kinds = [], []
    for kind, doc in parts:
        if not isinstance(doc, str) or not doc.strip() or doc in seen_docs:
            continue
        seen_docs.add(doc)
        for sentence in docstring_sentences(doc):
            sentences.append(sentence)
            kinds.append(kind)
    if not sentences:
        return None
    return Document(name, module, tuple(sentences), tuple(kinds))


def _module_documents(module, seen_docs) -> Iterator[Document]:
    module_name = module.__name__
    doc = _document(module_name, module_name, [(KIND_MODULE, module.__doc__)], seen_docs)
    if doc:
        yield doc
    functions = []
    for name, obj in _own_public_members(module, module_name):
        if inspect.isclass(obj):
            parts = [(KIND_CLASS, obj.__doc__)]
            parts += [(KIND_FUNCTION, doc) for doc in _member_docs(obj)]
            doc = _document(f"{module_name}.{name}", module_name, parts, seen_docs)
            if doc:
                yield doc
        else:
            functions.append((KIND_FUNCTION, obj.__doc__))
    doc = _document(f"{module_name}:functions", module_name, functions, seen_docs)
    if doc:
        yield doc
    doc = _comment_document(module, seen_docs)
    if doc:
        yield doc


@functools.cache
def comment_blocks(source_file: str) -> tuple[str, ...]:
    """Prose comment blocks of a Python source file: consecutive own-line `#` comments.

    Lines that look like code (see `_CODE_COMMENT`) or hold only punctuation are dropped;
    a block is kept when it still has at least 3 words.
    """
    try:
        with open(source_file, "rb") as reader:
            tokens = list(tokenize.tokenize(reader.readline))
    except (OSError, SyntaxError, tokenize.TokenError, UnicodeDecodeError):
        return ()
    blocks: list[list[str]] = []
    last_line = -2
    for token in tokens:
        if token.type != tokenize.COMMENT or token.line[:token.start[1]].strip():
            continue  # trailing comments after code are mostly terse notes
        text = token.string.lstrip("#").strip()
        if token.start[0] != last_line + 1 or not blocks:
            blocks.append([])
        last_line = token.start[0]
        if text and not _PUNCTUATION_ONLY.match(text) and not _CODE_COMMENT.search(text):
            blocks[-1].append(text)
    return tuple(" ".join(b) for b in blocks if len(" ".join(b).split()) >= 3)


def _comment_document(module, seen_docs) -> Document | None:
    source_file = getattr(module, "__file__", None) or ""
    if not source_file.endswith(".py"):
        return None
    parts = [(KIND_COMMENT, block) for block in comment_blocks(source_file)]
    return _document(f"{module.__name__}:comments", module.__name__, parts, seen_docs)


def _topic_documents(seen_docs) -> Iterator[Document]:
    topics_module = _quiet_import("pydoc_data.topics")
    topics = getattr(topics_module, "topics", {}) if topics_module else {}
    for key in sorted(topics):
        doc = _document(f"topic:{key}", "pydoc_data.topics", [(KIND_TOPIC, topics[key])],
                        seen_docs)
        if doc:
            yield doc


def iter_documents(max_documents: int | None = None) -> Iterator[Document]:
    """Yields the corpus documents in their fixed order (see the module docstring).

    Args:
      max_documents: stop after this many documents (None: all).
    """
    seen_docs: set[str] = set()

    def sources():
        for module in iter_modules():
            with warnings.catch_warnings():  # e.g. deprecated aliases read from typing
                warnings.simplefilter("ignore")
                documents = list(_module_documents(module, seen_docs))
            yield from documents
        yield from _topic_documents(seen_docs)

    for count, document in enumerate(sources()):
        if max_documents is not None and count >= max_documents:
            return
        yield document


def iter_limited_documents(max_mb: float | None = None,
                           max_documents: int | None = None) -> Iterator[Document]:
    """Documents in order until `max_mb` (10^6 bytes of UTF-8 output) or `max_documents`.

    The document that crosses `max_mb` is the last one yielded, so the output is never
    empty and never ends mid-document.
    """
    budget = None if max_mb is None else int(max_mb * 1_000_000)
    written = 0
    for document in iter_documents(max_documents):
        yield document
        written += document_size(document)
        if budget is not None and written >= budget:
            return


def document_size(document: Document) -> int:
    """Bytes the document takes in the output, blank separator line included."""
    return sum(len(s.encode("utf-8")) + 1 for s in document.sentences) + 1


def labelled_sentences(max_mb: float | None = None, max_documents: int | None = None,
                       label: str = "kind") -> list[tuple[str, str]]:
    """(sentence, label) pairs of the same documents `write_corpus` writes, in order.

    Args:
      max_mb, max_documents: the same limits as given to `write_corpus`.
      label: "kind" (module / class / function / topic docstring), "module" (the full
        module name) or "package" (the top-level package, e.g. `email`).
    """
    _check_label(label)
    pairs = []
    for document in iter_limited_documents(max_mb, max_documents):
        pairs.extend(document_labels(document, label))
    return pairs


LABELS = ("kind", "module", "package")


def _check_label(label: str) -> None:
    if label not in LABELS:
        raise ValueError(f"label must be 'kind', 'module' or 'package', got {label!r}")


def document_labels(document: Document, label: str = "kind") -> list[tuple[str, str]]:
    """(sentence, label) pairs of one document; `label` as in `labelled_sentences`."""
    if label == "kind":
        return list(zip(document.sentences, document.kinds, strict=True))
    name = document.module if label == "module" else document.module.split(".")[0]
    return [(sentence, name) for sentence in document.sentences]


# ---------------------------------------------------------------------------
# Classification data.

SPLITS = ("train", "dev", "test")


def document_split(name: str, dev_percent: int = 10, test_percent: int = 10) -> str:
    """The split of a document, from a CRC32 of its name: stable across runs and limits."""
    bucket = zlib.crc32(name.encode("utf-8")) % 100
    if bucket < dev_percent:
        return "dev"
    if bucket < dev_percent + test_percent:
        return "test"
    return "train"


@dataclasses.dataclass(frozen=True)
class ClassificationSummary:
    """What `write_classification_data` wrote."""

    files: dict
    label: str
    labels: tuple[str, ...]
    rows: dict
    rows_per_label: dict
    candidates: dict
    documents: dict
    seconds: float

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)


def classification_rows(documents, *, label: str = "kind", rows_per_class: int = 1000,
                        min_words: int = 5, max_classes: int = 0, dev_percent: int = 10,
                        test_percent: int = 10, seed: int = 12345):
    """Balanced (sentence, label) rows per split from documents; see the module docstring.

    Returns:
      (rows: {split: [(sentence, label), ...]}, labels kept (sorted),
       candidates: {split: {label: count before down-sampling}},
       documents: {split: documents with at least one kept sentence})
    """
    _check_label(label)
    if rows_per_class < 1:
        raise cli.UserError(f"--classification_rows_per_class must be >= 1, got "
                            f"{rows_per_class}")
    if not (0 <= dev_percent and 0 <= test_percent and dev_percent + test_percent < 100):
        raise cli.UserError("--classification_dev_percent and --classification_test_percent "
                            "must be >= 0 and sum to less than 100")
    pools = {split: {} for split in SPLITS}
    document_counts = dict.fromkeys(SPLITS, 0)
    seen: set[str] = set()
    for document in documents:
        split = document_split(document.name, dev_percent, test_percent)
        kept = []
        for sentence, name in document_labels(document, label):
            if (len(sentence.split()) < min_words or sentence in seen or "\t" in sentence
                    or "\n" in sentence):
                continue
            seen.add(sentence)
            kept.append((sentence, name))
        if kept:
            document_counts[split] += 1
        for sentence, name in kept:
            pools[split].setdefault(name, []).append(sentence)
    totals: dict = {}
    for pool in pools.values():
        for name, sentences in pool.items():
            totals[name] = totals.get(name, 0) + len(sentences)
    ranked = sorted(totals, key=lambda name: (-totals[name], name))
    labels = sorted(ranked[:max_classes] if max_classes > 0 else ranked)
    shares = {"train": (100 - dev_percent - test_percent) / 100, "dev": dev_percent / 100,
              "test": test_percent / 100}
    rows, candidates = {}, {}
    for index, split in enumerate(SPLITS):
        pool = pools[split]
        candidates[split] = {name: len(pool.get(name, ())) for name in labels}
        cap = max(1, round(rows_per_class * shares[split])) if shares[split] else 0
        per_label = min([cap] + list(candidates[split].values())) if labels else 0
        rng = random.Random(seed * 10 + index)
        split_rows = []
        for name in labels:
            sentences = pool.get(name, [])
            chosen = sorted(rng.sample(range(len(sentences)), per_label))
            split_rows.extend((sentences[i], name) for i in chosen)
        rng.shuffle(split_rows)
        rows[split] = split_rows
    return rows, tuple(labels), candidates, document_counts


def write_classification_data(output_dir: str, *, max_mb: float | None = 3.0,
                              max_documents: int | None = None, label: str = "kind",
                              rows_per_class: int = 1000, min_words: int = 5,
                              max_classes: int = 0, dev_percent: int = 10,
                              test_percent: int = 10, seed: int = 12345,
                              documents=None) -> ClassificationSummary:
    """Writes train.tsv, dev.tsv and test.tsv (header `sentence<TAB>label`) into output_dir.

    Args:
      output_dir: the folder (created).
      max_mb, max_documents: the corpus limits (the same documents `write_corpus` writes).
      label, rows_per_class, min_words, max_classes, dev_percent, test_percent, seed: see
        `classification_rows` and the module docstring.
      documents: the documents to use instead of walking the standard library again.

    Raises:
      cli.UserError: bad settings, or a split left without rows (too little text).
    """
    start = time.time()
    if documents is None:
        documents = iter_limited_documents(max_mb, max_documents)
    rows, labels, candidates, document_counts = classification_rows(
        documents, label=label, rows_per_class=rows_per_class, min_words=min_words,
        max_classes=max_classes, dev_percent=dev_percent, test_percent=test_percent, seed=seed)
    if len(labels) < 2:
        raise cli.UserError(f"only {len(labels)} label(s) {list(labels)} in the text: a "
                            "classifier needs at least 2 (raise --max_mb)")
    for split in SPLITS:
        if not rows[split] and (split == "train" or
                                (dev_percent if split == "dev" else test_percent)):
            raise cli.UserError(f"the {split} split has no rows: some label has no sentence "
                                f"there ({candidates[split]}); raise --max_mb or lower "
                                "--classification_max_classes")
    files = {split: os.path.join(output_dir, f"{split}.tsv") for split in SPLITS}
    with fileio.AtomicOutputs(list(files.values())) as out:
        for split, path in files.items():
            with out.open(path, "w", newline="\n") as writer:
                writer.write("sentence\tlabel\n")
                for sentence, name in rows[split]:
                    writer.write(f"{sentence}\t{name}\n")
    return ClassificationSummary(
        files=files, label=label, labels=labels,
        rows={split: len(rows[split]) for split in SPLITS},
        rows_per_label={split: (len(rows[split]) // len(labels)) for split in SPLITS},
        candidates=candidates, documents=document_counts,
        seconds=round(time.time() - start, 3))


# ---------------------------------------------------------------------------
# Writing.


def shard_paths(output_dir: str, num_shards: int, prefix: str = "stdlib") -> list[str]:
    return [os.path.join(output_dir, f"{prefix}-{i:05d}-of-{num_shards:05d}.txt")
            for i in range(num_shards)]


def write_corpus(output_dir: str, *, max_mb: float | None = 3.0,
                 max_documents: int | None = None, num_shards: int = 1,
                 prefix: str = "stdlib") -> CorpusSummary:
    """Writes the corpus into `num_shards` files, documents dealt round-robin.

    The files are one `fileio.AtomicOutputs` set (hidden temporaries, synced, renamed
    when all are complete), so an interrupted run leaves no file that looks finished.

    Returns:
      A CorpusSummary (files, counts, bytes, seconds).
    """
    if num_shards < 1:
        raise cli.UserError(f"--num_shards must be >= 1, got {num_shards}")
    if max_mb is not None and max_mb <= 0:
        raise cli.UserError(f"--max_mb must be > 0, got {max_mb}")
    start = time.time()
    paths = shard_paths(output_dir, num_shards, prefix)
    documents = sentences = size = 0
    modules = set()
    kinds = dict.fromkeys(KINDS, 0)
    with fileio.AtomicOutputs(paths) as out, contextlib.ExitStack() as stack:
        writers = [stack.enter_context(out.open(p, "w", newline="\n")) for p in paths]
        for index, document in enumerate(iter_limited_documents(max_mb, max_documents)):
            writers[index % num_shards].write("\n".join(document.sentences) + "\n\n")
            documents += 1
            sentences += len(document.sentences)
            size += document_size(document)
            modules.add(document.module)
            for kind in document.kinds:
                kinds[kind] += 1
    return CorpusSummary(tuple(paths), documents, sentences, size, len(modules),
                         round(time.time() - start, 3), kinds)


def main(argv=None) -> int:
    """CLI: the corpus shards + DIR/summary.json and/or the classification TSVs."""
    flag_values: dict = {}  # the arguments, once parsed: the shell names a path's flag
    return cli.run_main(lambda: _work(argv, flag_values), "sample_corpus",
                        flag_values=flag_values)


def _work(argv, flag_values: dict) -> None:
    parser = cli.ArgumentParser(
        prog="python -m data_prep.sample_corpus",
        description="Write a BERT pretraining corpus (one sentence per line, blank line "
                    "between documents) from the Python standard library's documentation, "
                    "and/or a sentence classification task (train/dev/test.tsv) from the "
                    "same text.")
    parser.add_argument("--output_dir", default="", help="folder for the .txt shards")
    parser.add_argument("--max_mb", type=float, default=3.0,
                        help="stop after about this many MB (10^6 bytes) of text; "
                             "0 for everything available")
    parser.add_argument("--max_documents", type=int, default=0,
                        help="stop after this many documents; 0 for no limit")
    parser.add_argument("--num_shards", type=int, default=1, help="number of output files")
    parser.add_argument("--prefix", default="stdlib", help="output file name prefix")
    group = parser.add_argument_group(
        "classification data", "a sentence classification task from the same documents")
    group.add_argument("--classification_dir", default="",
                       help="folder for train.tsv, dev.tsv, test.tsv (header "
                            "sentence<TAB>label) and summary.json")
    group.add_argument("--classification_label", default="kind", choices=LABELS,
                       help="what a sentence is labelled with: the kind of documentation "
                            "(module/class/function/comment/topic), its module or its "
                            "top-level package")
    group.add_argument("--classification_rows_per_class", type=int, default=1000,
                       help="rows per label over the three splits, at most (balanced: every "
                            "label gets the rarest label's count)")
    group.add_argument("--classification_min_words", type=int, default=5,
                       help="drop sentences with fewer words")
    group.add_argument("--classification_max_classes", type=int, default=0,
                       help="keep the most frequent labels only; 0 for all")
    group.add_argument("--classification_dev_percent", type=int, default=10,
                       help="documents (by name hash) in dev")
    group.add_argument("--classification_test_percent", type=int, default=10,
                       help="documents (by name hash) in test")
    group.add_argument("--classification_seed", type=int, default=12345,
                       help="seed of the down-sampling and shuffling")
    args = parser.parse_args(argv)
    flag_values.update(vars(args))
    if not args.output_dir and not args.classification_dir:
        parser.error("give --output_dir (corpus) and/or --classification_dir")
    if args.output_dir:
        summary = write_corpus(args.output_dir, max_mb=args.max_mb or None,
                               max_documents=args.max_documents or None,
                               num_shards=args.num_shards, prefix=args.prefix)
        fileio.write_text(os.path.join(args.output_dir, "summary.json"),
                          summary.to_json() + "\n")
        print(f"sample_corpus: {summary.documents} documents, {summary.sentences} sentences, "
              f"{summary.bytes / 1e6:.2f} MB from {summary.modules} modules in "
              f"{summary.seconds:.1f} s -> {len(summary.files)} file(s) in {args.output_dir}; "
              f"sentences per kind: " + ", ".join(f"{k} {v}" for k, v in summary.kinds.items()))
    if args.classification_dir:
        data = write_classification_data(
            args.classification_dir, max_mb=args.max_mb or None,
            max_documents=args.max_documents or None, label=args.classification_label,
            rows_per_class=args.classification_rows_per_class,
            min_words=args.classification_min_words,
            max_classes=args.classification_max_classes,
            dev_percent=args.classification_dev_percent,
            test_percent=args.classification_test_percent, seed=args.classification_seed)
        fileio.write_text(os.path.join(args.classification_dir, "summary.json"),
                          data.to_json() + "\n")
        print(f"sample_corpus: classification by {data.label}: {len(data.labels)} labels "
              f"({', '.join(data.labels)}); rows train {data.rows['train']}, dev "
              f"{data.rows['dev']}, test {data.rows['test']} (balanced; documents "
              f"{data.documents['train']}/{data.documents['dev']}/{data.documents['test']}) "
              f"in {data.seconds:.1f} s -> {args.classification_dir}")


if __name__ == "__main__":
    sys.exit(main())
