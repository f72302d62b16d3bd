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
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import inspect
import io
import json
import os
import pkgutil
import re
import sys
import time
import tokenize
import warnings
from collections.abc import Iterator

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
    if label not in ("kind", "module", "package"):
        raise ValueError(f"label must be 'kind', 'module' or 'package', got {label!r}")
    pairs = []
    for document in iter_limited_documents(max_mb, max_documents):
        for sentence, kind in zip(document.sentences, document.kinds, strict=True):
            if label == "kind":
                pairs.append((sentence, kind))
            elif label == "module":
                pairs.append((sentence, document.module))
            else:
                pairs.append((sentence, document.module.split(".")[0]))
    return pairs


# ---------------------------------------------------------------------------
# Writing.


def shard_paths(output_dir: str, num_shards: int, prefix: str = "stdlib") -> list[str]:
    return [os.path.join(output_dir, f"{prefix}-{i:05d}-of-{num_shards:05d}.txt")
            for i in range(num_shards)]


def write_corpus(output_dir: str, *, max_mb: float | None = 3.0,
                 max_documents: int | None = None, num_shards: int = 1,
                 prefix: str = "stdlib") -> CorpusSummary:
    """Writes the corpus into `num_shards` files, documents dealt round-robin.

    Each file is written under a temporary name and renamed when all are complete, so an
    interrupted run leaves no file that looks finished.

    Returns:
      A CorpusSummary (files, counts, bytes, seconds).
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    if max_mb is not None and max_mb <= 0:
        raise ValueError(f"max_mb must be > 0, got {max_mb}")
    start = time.time()
    os.makedirs(output_dir, exist_ok=True)
    paths = shard_paths(output_dir, num_shards, prefix)
    tmp_paths = [f"{p}.tmp-{os.getpid()}" for p in paths]
    documents = sentences = size = 0
    modules = set()
    kinds = dict.fromkeys(KINDS, 0)
    try:
        with contextlib.ExitStack() as stack:
            writers = [stack.enter_context(open(p, "w", encoding="utf-8", newline="\n"))
                       for p in tmp_paths]
            for index, document in enumerate(iter_limited_documents(max_mb, max_documents)):
                writers[index % num_shards].write("\n".join(document.sentences) + "\n\n")
                documents += 1
                sentences += len(document.sentences)
                size += document_size(document)
                modules.add(document.module)
                for kind in document.kinds:
                    kinds[kind] += 1
    except BaseException:
        for tmp in tmp_paths:
            if os.path.exists(tmp):
                os.remove(tmp)
        raise
    for tmp, path in zip(tmp_paths, paths, strict=True):
        os.replace(tmp, path)
    return CorpusSummary(tuple(paths), documents, sentences, size, len(modules),
                         round(time.time() - start, 3), kinds)


def main(argv=None) -> int:
    """CLI: writes the corpus shards and DIR/summary.json; prints a one-line summary."""
    parser = argparse.ArgumentParser(
        prog="python -m data_prep.sample_corpus",
        description="Write a BERT pretraining corpus (one sentence per line, blank line "
                    "between documents) from the Python standard library's documentation.")
    parser.add_argument("--output_dir", required=True, help="folder for the .txt shards")
    parser.add_argument("--max_mb", type=float, default=3.0,
                        help="stop after about this many MB (10^6 bytes) of text; "
                             "0 for everything available")
    parser.add_argument("--max_documents", type=int, default=0,
                        help="stop after this many documents; 0 for no limit")
    parser.add_argument("--num_shards", type=int, default=1, help="number of output files")
    parser.add_argument("--prefix", default="stdlib", help="output file name prefix")
    args = parser.parse_args(argv)
    try:
        summary = write_corpus(args.output_dir, max_mb=args.max_mb or None,
                               max_documents=args.max_documents or None,
                               num_shards=args.num_shards, prefix=args.prefix)
    except (ValueError, OSError) as err:
        print(f"sample_corpus: error: {err}", file=sys.stderr)
        return 2
    summary_path = os.path.join(args.output_dir, "summary.json")
    with open(summary_path, "w", encoding="utf-8") as writer:
        writer.write(summary.to_json() + "\n")
    print(f"sample_corpus: {summary.documents} documents, {summary.sentences} sentences, "
          f"{summary.bytes / 1e6:.2f} MB from {summary.modules} modules in "
          f"{summary.seconds:.1f} s -> {len(summary.files)} file(s) in {args.output_dir}; "
          f"sentences per kind: " + ", ".join(f"{k} {v}" for k, v in summary.kinds.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
