"""The demo's stage machinery: run one project CLI as a subprocess, stream and log its output.

A `Stage` names a tool (`python -m module` or a top-level script of the repository), its
flags and a report that reads what it wrote. `run_stage` prints the command line, runs
it with the repository on PYTHONPATH (in the caller's folder, so relative paths mean
what they mean to the user), streams its output indented with TensorFlow's start-up
chatter dropped, keeps the full log in OUTPUT/logs/, and returns the report's figures;
a failure raises `StageError` with the log's tail.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable

from data_prep.cli import UserError
from demo_lib.settings import Settings

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Start-up chatter of TensorFlow's C++ runtime that says nothing about the stage.
NOISE_PREFIXES = (
    "WARNING: All log messages before absl::InitializeLog()",
    "To enable the following instructions:",
)
NOISE_MARKERS = ("port.cc:", "cudart_stub.cc:", "cpu_feature_guard.cc:", "cuda_platform.cc:",
                 "cuda_executor.cc:", "cuda_dnn.cc:", "cuda_fft.cc:", "cuda_blas.cc:")


@dataclasses.dataclass
class Stage:
    """One step of the demo: a project CLI (`python -m module --flags`) and a report.

    Attributes:
      name: short id (log file name, summary key).
      title: what the stage does, in words.
      module: the CLI's module, run as `python -m module`, or a top-level script of the
        repository (a name ending in `.py`, e.g. `run_pretraining.py`), run as
        `python path/to/script.py`.
      flags: the CLI's flags, in order, as (name, value) pairs.
      report: reads the stage's outputs and returns (lines to print, figures for the
        JSON summary); it raises when expected outputs are missing.
      missing_hint: said when `module` is not in this checkout.
      make_dirs: folders created before the tool runs (it expects them to exist).
      prepare: writes input files the tool needs (e.g. a bert_config.json), before it runs.
    """

    name: str
    title: str
    module: str
    flags: list
    report: Callable[[], tuple[list, dict]]
    missing_hint: str = ""
    make_dirs: list = dataclasses.field(default_factory=list)
    prepare: Callable[[], None] | None = None

    @property
    def is_script(self) -> bool:
        return self.module.endswith(".py")

    def argv(self, python: str = sys.executable) -> list:
        if self.is_script:
            head = [python, _display_path(os.path.join(REPO_ROOT, self.module))]
        else:
            head = [python, "-m", self.module]
        return head + [f"--{k}={v}" for k, v in self.flags]

    def is_available(self) -> bool:
        if self.is_script:
            return os.path.isfile(os.path.join(REPO_ROOT, self.module))
        return (importlib.util.find_spec(self.module.split(".")[0]) is not None
                and importlib.util.find_spec(self.module) is not None)


class StageError(UserError):
    """A stage failed; the message says which and why."""


def is_noise(line: str) -> bool:
    """True for start-up chatter of TensorFlow's C++ runtime (kept in the log only)."""
    text = line.strip()
    if text.startswith(NOISE_PREFIXES):
        return True
    return text[:1] in "IWE" and text[1:5] == "0000" and any(m in text for m in NOISE_MARKERS)


def _stream(process, log_writer, prefix: str = "    | ") -> list:
    """Copies the child's output to the log (all) and the terminal (noise dropped).

    Lines end at `\\n` or `\\r` (progress lines that rewrite themselves); the last 40
    lines are returned for error messages.
    """
    tail: list = []
    pending = b""
    last_end = b"\n"
    while True:
        chunk = os.read(process.stdout.fileno(), 65536)
        if not chunk:
            break
        log_writer.write(chunk)
        pending += chunk
        while True:
            cut = min((i for i in (pending.find(b"\n"), pending.find(b"\r")) if i >= 0),
                      default=-1)
            if cut < 0:
                break
            line, end, pending = pending[:cut], pending[cut:cut + 1], pending[cut + 1:]
            text = line.decode("utf-8", "replace")
            previous_end, last_end = last_end, end
            if is_noise(text) or (not text.strip() and end == b"\r"):
                continue
            if not text and previous_end == b"\r":  # the \n of a \r\n pair
                sys.stdout.write("\n")
                continue
            sys.stdout.write(prefix + text + end.decode())
            sys.stdout.flush()
            if end == b"\n":
                tail = (tail + [text])[-40:]
    if pending:
        text = pending.decode("utf-8", "replace")
        if not is_noise(text):
            sys.stdout.write(prefix + text + "\n")
            tail = (tail + [text])[-40:]
    return tail


def _child_env() -> dict:
    """The repository on PYTHONPATH, so `python -m data_prep...` works from any folder.

    The tools run in the caller's folder, so relative paths in their flags mean what they
    mean to the user.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_stage(stage: Stage, index: int, total: int, settings: Settings) -> dict:
    """Runs one stage, streaming its output; returns its figures. Raises StageError."""
    print(f"\n[{index}/{total}] {stage.name}: {stage.title}", flush=True)
    for folder in stage.make_dirs:
        print("    $ " + shlex.join(["mkdir", "-p", folder]), flush=True)
    print("    $ " + shlex.join(stage.argv(display_python())), flush=True)
    if not stage.is_available():
        raise StageError(f"stage {stage.name!r} cannot run: module {stage.module} not found"
                         + (f" ({stage.missing_hint})" if stage.missing_hint else ""))
    for folder in stage.make_dirs:
        os.makedirs(folder, exist_ok=True)
    if stage.prepare is not None:
        stage.prepare()
    log_path = settings.path("logs", f"{index}-{stage.name}.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    start = time.time()
    with open(log_path, "wb") as log_writer:
        process = subprocess.Popen(stage.argv(), env=_child_env(),  # cwd: the caller's
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            tail = _stream(process, log_writer)
        finally:
            returncode = process.wait()
    seconds = time.time() - start
    if returncode != 0:
        tail_text = "\n".join("      " + line for line in tail[-15:] if not is_noise(line))
        raise StageError(f"stage {stage.name!r} failed (exit code {returncode}) after "
                         f"{seconds:.1f} s; full log: {log_path}\n{tail_text}")
    lines, figures = stage.report()
    print(f"    done in {seconds:.1f} s", flush=True)
    for line in lines:
        print(f"    - {line}", flush=True)
    return {"seconds": round(seconds, 2), "command": stage.argv(display_python()),
            "log": log_path, "headline": lines[0] if lines else "", **figures}


def _display_path(path: str) -> str:
    """`path` as a user would type it: relative when under the current folder."""
    relative = os.path.relpath(path, os.getcwd())
    return relative if not relative.startswith("..") else path


def display_python() -> str:
    """The interpreter as a user would type it (relative when inside the repository)."""
    return _display_path(sys.executable)
