"""docs/paper.md's commands work: the scaled-down blocks run end to end, every flag exists.

docs/paper.md is the single source of truth: each shell block there is preceded by an HTML
comment naming it (`<!-- scaled: NAME ... -->` or `<!-- full: NAME ... -->`) with
`expects: PATH [KEY ...]` lines (what a scaled-down block must write under $W). Here:

* fast: every block parses, has a marker, and every `--flag` it gives a script is one of
  that script's flags (read from `SCRIPT --helpxml`, or `--help` for argparse tools);
* slow: the `setup` block runs once in a temporary $W (once per test session: the
  pytest-xdist workers copy it), then every other scaled-down block, in page order, as
  `bash -e` in the repository's root with the project's Python first on PATH.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER = os.path.join(REPO_ROOT, "docs", "paper.md")
MARKED_BLOCK = re.compile(r"^<!--\s*(scaled|full):(.*?)-->\s*\n```(\w*)\n(.*?)\n```", re.S | re.M)
ANY_SHELL_FENCE = re.compile(r"^```(sh|bash|shell)\s*$", re.M)
HEREDOC = re.compile(r"(?<!<)<<-?\s*['\"]?(\w+)['\"]?")
SHELL_OPERATORS = {";", "&&", "||", "|", "&", ">", ">>", "<", "(", ")"}
BLOCK_TIMEOUT = 900


@dataclasses.dataclass
class Block:
    """One marked shell block of docs/paper.md."""

    kind: str                      # "scaled" or "full"
    name: str
    code: str
    line: int                      # line of the fence in paper.md
    expects: list = dataclasses.field(default_factory=list)   # [(path under $W, [key])]


def parse_blocks(text: str) -> list:
    """The marked blocks of `text`, in page order (see the module docstring)."""
    blocks = []
    for match in MARKED_BLOCK.finditer(text):
        kind, marker, language, code = match.groups()
        lines = [line.strip() for line in marker.strip().splitlines() if line.strip()]
        block = Block(kind, lines[0], code, text.count("\n", 0, match.start(4)))
        for line in lines[1:]:
            key, _, value = line.partition(":")
            words = value.split()
            if key == "expects" and words:
                block.expects.append((words[0], words[1:]))
            else:
                raise ValueError(f"{PAPER}:{block.line}: bad marker line {line!r} in {block.name}")
        assert language in ("sh", "bash"), f"{PAPER}:{block.line}: {block.name} is not sh"
        blocks.append(block)
    return blocks


def logical_lines(code: str) -> list:
    """Shell lines with `\\` continuations joined and here-document bodies dropped."""
    out, pending_end, current = [], None, ""
    for line in code.splitlines():
        if pending_end is not None:
            if line.strip() == pending_end:
                pending_end = None
            continue
        current += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        heredoc = HEREDOC.search(current)
        if heredoc:
            pending_end = heredoc.group(1)
        out.append(current)
        current = ""
    return out


def commands(code: str) -> list:
    """[(script, [flag names])] for every `python SCRIPT.py ...` / `python -m MODULE ...`
    of a block (`python -` reading a here-document is not a script)."""
    found = []
    for line in logical_lines(code):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        for i, token in enumerate(tokens):
            if token != "python" or i + 1 >= len(tokens):
                continue
            if tokens[i + 1] == "-m":
                script, rest = tokens[i + 2], tokens[i + 3:]
            elif tokens[i + 1].endswith(".py"):
                script, rest = tokens[i + 1], tokens[i + 2:]
            else:
                continue
            names = []
            for arg in rest:
                if arg in SHELL_OPERATORS:
                    break
                if arg.startswith("--"):
                    names.append(arg[2:].split("=", 1)[0])
            found.append((script, names))
    return found


def script_argv(script: str) -> list:
    """The command line that starts `script` (a .py file or a module) with this Python."""
    return [sys.executable, script] if script.endswith(".py") else [sys.executable, "-m", script]


def _env(work_dir: str | None = None) -> dict:
    """The blocks' environment: this Python first on PATH (their `python`), $W set."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    if work_dir is not None:
        env["W"] = work_dir
    return env


def _exists(script: str) -> bool:
    """True if `script` (`run_x.py` or `package.module`) is a file of the repository."""
    if script.endswith(".py"):
        return os.path.exists(os.path.join(REPO_ROOT, script))
    return os.path.exists(os.path.join(REPO_ROOT, *script.split(".")) + ".py")


@functools.lru_cache(maxsize=None)
def script_flags(script: str) -> frozenset | None:
    """The flags `script` defines (None if there is no such script): absl's `--helpxml`,
    or the options of an argparse tool's `--help`; asked once per script (the blocks
    name the same few scripts many times)."""
    if not _exists(script):
        return None
    proc = subprocess.run(script_argv(script) + ["--helpxml"], cwd=REPO_ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    if "<AllFlags>" in proc.stdout:
        root = ET.fromstring(proc.stdout[proc.stdout.index("<?xml"):])
        return frozenset(flag.findtext("name") for flag in root.iter("flag"))
    proc = subprocess.run(script_argv(script) + ["--help"], cwd=REPO_ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"{script}: neither --helpxml nor --help: {proc.stderr[-2000:]}"
    return frozenset(re.findall(r"^\s+(?:-\w, )?--([\w-]+)", proc.stdout, re.M))


def read_keys(path: str) -> list:
    """The keys of a results file: a JSON object's, a TSV's header fields and first
    column, or `key = value` lines'."""
    with open(path, encoding="utf-8") as reader:
        text = reader.read()
    if path.endswith(".json"):
        data = json.loads(text)
        return list(data) if isinstance(data, dict) else []
    if path.endswith(".tsv"):
        rows = [line.split("\t") for line in text.splitlines() if line]
        return (rows[0] + [row[0] for row in rows[1:]]) if rows else []
    return [line.split(" = ", 1)[0].strip() for line in text.splitlines() if " = " in line]


def check_expects(block: Block, work_dir: str) -> None:
    """Every `expects:` file of `block` exists, is not empty and holds each key."""
    for relative, keys in block.expects:
        path = os.path.join(work_dir, relative)
        folder = os.path.dirname(path)
        beside = sorted(os.listdir(folder)) if os.path.isdir(folder) else "no such folder"
        assert os.path.isfile(path) and os.path.getsize(path) > 0, (
            f"{block.name}: {relative} missing or empty; beside it: {beside}")
        if keys:
            found = read_keys(path)
            for key in keys:
                assert any(key in k for k in found), (
                    f"{block.name}: no key containing {key!r} in {relative}: {found}")


def run_block(block: Block, work_dir: str) -> float:
    """Runs `block` with `bash -e` in the repository's root, its scripts forked from one
    TensorFlow import (tests/forkserver.py); returns its seconds."""
    from tests import forkserver

    start = time.monotonic()
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=REPO_ROOT,
                          env=forkserver.shell_env(_env(work_dir)), capture_output=True,
                          text=True,
                          timeout=BLOCK_TIMEOUT, check=False)
    seconds = time.monotonic() - start
    assert proc.returncode == 0, (
        f"{block.name} (docs/paper.md line {block.line}) exited {proc.returncode}:\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    print(f"[paper] {block.name}: {seconds:.1f} s")
    return seconds


BLOCKS = parse_blocks(open(PAPER, encoding="utf-8").read())
SCALED = [b for b in BLOCKS if b.kind == "scaled"]


# ---- fast: the page's structure and flags --------------------------------------------------

def test_every_shell_block_is_marked_and_scaled_blocks_say_what_they_write():
    """No shell block escapes the test; each scaled one says what it must write."""
    text = open(PAPER, encoding="utf-8").read()
    assert len(ANY_SHELL_FENCE.findall(text)) == len(BLOCKS), (
        "a ```sh block of docs/paper.md has no <!-- scaled: --> / <!-- full: --> marker")
    names = [(b.kind, b.name) for b in BLOCKS]
    assert len(set(names)) == len(names), names
    assert SCALED and SCALED[0].name == "setup", "the setup block comes first"
    for block in SCALED:
        assert block.expects, f"scaled block {block.name} has no expects: line"
        assert commands(block.code), f"{block.name} runs no python command"
        for relative, _ in block.expects:
            assert not os.path.isabs(relative), f"{block.name}: {relative} is not under $W"


def test_parser_reads_continuations_heredocs_and_modules():
    """Flags are read across `\\` lines, not from here-documents or after `&&`."""
    code = ("python -m data_prep.x --a=1 \\\n  --b 'q r' && echo --c\n"
            "python - <<'EOF'\nprint('--d')\nEOF\n"
            "IFS=: read x y <<< \"$z\"\nfor u in 1; do\n  python run_x.py --e=$u --nof; done\n")
    assert commands(code) == [("data_prep.x", ["a", "b"]), ("run_x.py", ["e", "nof"])]


def test_every_flag_of_every_block_exists_in_its_script():
    """A flag the script does not define fails (and a script that does not exist)."""
    unknown = []
    for block in BLOCKS:
        for script, names in commands(block.code):
            known = script_flags(script)
            if known is None:
                unknown.append(f"{block.name}: no script {script}")
                continue
            for name in names:
                if name in known or (name.startswith("no") and name[2:] in known):
                    continue
                unknown.append(f"{block.name}: {script} has no --{name}")
    assert not unknown, "\n".join(unknown)


# ---- slow: the scaled-down blocks, end to end ----------------------------------------------

@pytest.fixture(scope="module")
def paper_dir(tmp_path_factory):
    """$W after the setup block. The block runs once per test session (`built_once`: the
    pytest-xdist workers share it); each worker runs its blocks in a copy of its own."""
    from tests.conftest import built_once

    def setup(work_dir):
        run_block(SCALED[0], str(work_dir))
        check_expects(SCALED[0], str(work_dir))

    built = built_once(tmp_path_factory, "paper-setup", setup)
    work_dir = tmp_path_factory.mktemp("paper")
    shutil.copytree(built, work_dir, dirs_exist_ok=True)
    return str(work_dir)


@pytest.mark.slow
@pytest.mark.parametrize("block", SCALED[1:], ids=lambda b: b.name)
def test_scaled_block_runs_and_writes_its_outputs(block, paper_dir):
    """The block exits 0 in $W after the setup block and writes its `expects:` files."""
    run_block(block, paper_dir)
    check_expects(block, paper_dir)
