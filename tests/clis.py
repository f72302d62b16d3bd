"""Runs the project's commands for tests: in this process by default, as a process when the
process is what a test proves.

* `call_main(tool, argv)` parses `argv` as the command line does (`data_prep.cli`: a bad
  flag is the same one line) and calls the tool's `main`, in this process, with absl's
  flags in a scope of their own (the tool's flags defined for the call, every flag as it
  was afterwards), stdout and stderr captured and `SystemExit` caught: a `Result`.
* `run_cli(tool, *args, **flags)` starts the command as a user does (`python script.py`
  or `python -m module`) and returns the same `Result`. Use it only where the process is
  under test: exit status, the message on stderr with no traceback, signals.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# tool -> (module, how it is started, whether absl parses its flags, what defines them:
# "import" (the runners, at import), "define_flags" (called when the command starts)).
TOOLS = {
    "run_pretraining": ("run_pretraining", "script", "import"),
    "run_classifier": ("run_classifier", "script", "import"),
    "run_squad": ("run_squad", "script", "import"),
    "run_ner": ("run_ner", "script", "import"),
    "run_swag": ("run_swag", "script", "import"),
    "glue_submission": ("glue_submission", "script", "import"),
    "convert_checkpoint": ("convert_checkpoint", "script", "define_flags"),
    "extend_vocab": ("extend_vocab", "script", "define_flags"),
    "export_saved_model": ("export_saved_model", "script", "define_flags"),
    "extract_features": ("extract_features", "script", "define_flags"),
    "build_vocab": ("data_prep.build_vocab", "module", "define_flags"),
    "create_pretraining_data": ("data_prep.create_pretraining_data", "module", "define_flags"),
    "beam_pretraining_data": ("data_prep.beam_pretraining_data", "module", "define_flags"),
    "sample_corpus": ("data_prep.sample_corpus", "module", None),  # argparse
    "conlleval": ("tasks.tagging.conlleval", "module", None),  # argparse
    "bert_tokenize": ("data_prep.bert_tokenize", "module", "define_flags"),
}


@dataclasses.dataclass
class Result:
    """What a command did: its exit status and what it wrote."""

    code: int
    stdout: str
    stderr: str  # including the message of a SystemExit("prog: error: ...")
    log: str = ""  # call_main: the absl log lines (INFO and up), one per line


def program(tool: str) -> str:
    """The name a tool's error lines start with (the shell's `program`)."""
    module, kind, _ = TOOLS[tool]
    return f"{module}.py" if kind == "script" else module.rpartition(".")[2]


def call_main(tool: str, argv=(), stdin: str | bytes | None = None, cwd: str | None = None,
              **flags) -> Result:
    """Runs `tool`'s command line `argv` and `--name=value` for each of `flags` in this
    process (see the module docstring), in the folder `cwd` if given. stdin and stdout
    are byte streams underneath, as a process's are (`sys.stdout.buffer` works)."""
    argv = [*map(str, argv), *(f"--{k}={v}" for k, v in flags.items())]
    name, _, defines = TOOLS[tool]
    module = importlib.import_module(name)
    out_bytes, err = io.BytesIO(), io.StringIO()
    out = io.TextIOWrapper(out_bytes, encoding="utf-8", write_through=True)
    code = 0
    with contextlib.ExitStack() as stack:
        if defines is not None:
            stack.enter_context(_flag_scope(module if defines == "define_flags" else None))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        if stdin is not None:
            stack.enter_context(_stdin(stdin))
        if cwd is not None:
            stack.enter_context(contextlib.chdir(cwd))
        log = stack.enter_context(_absl_log())
        try:
            if defines is None:
                code = module.main(list(argv)) or 0
            else:
                from data_prep import cli as shell

                remaining = shell.parse_flags([program(tool), *argv], program(tool),
                                              known_only=tool == "beam_pretraining_data")
                code = module.main(remaining) or 0
        except SystemExit as exit_:
            code = _status(exit_, err)
    out.flush()
    return Result(code, out_bytes.getvalue().decode("utf-8"), err.getvalue(), "\n".join(log))


def run_cli(tool: str, *args, timeout: float = 600, env: dict | None = None,
            cwd: str = REPO_ROOT, stdin: str | None = None, **flags) -> Result:
    """Starts `tool` as a process with `args` and `--name=value` for each of `flags`."""
    name, kind, _ = TOOLS[tool]
    argv = [*map(str, args), *(f"--{k}={v}" for k, v in flags.items())]
    command = ([sys.executable, os.path.join(REPO_ROOT, f"{name}.py")] if kind == "script"
               else [sys.executable, "-m", name])
    environment = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="2",
                       CUDA_VISIBLE_DEVICES="", **(env or {}))
    done = subprocess.run(command + argv, cwd=cwd, env=environment, capture_output=True,
                          text=True, timeout=timeout, check=False, input=stdin)
    return Result(done.returncode, done.stdout, done.stderr)


def _status(exit_: SystemExit, err: io.StringIO) -> int:
    """The exit status Python gives a SystemExit; its message goes to `err` as Python
    prints it."""
    if exit_.code is None:
        return 0
    if isinstance(exit_.code, int):
        return exit_.code
    print(exit_.code, file=err)
    return 1


@contextlib.contextmanager
def _flag_scope(tool_module=None):
    """The flags as they are now come back afterwards, through absl's public API: the
    flags defined meanwhile are deleted and the others get back their value, default and
    presence (`absl.testing.flagsaver`), and whether FLAGS was parsed.

    With `tool_module` (a command that defines its flags when it starts), the project's
    flags are set aside first (`FlagValues.remove_flag_values`) and the tool's defined:
    commands define flags of the same names (--input_file, --max_seq_length, ...), one
    at a time as in their own process. The project's flags come back afterwards, each
    registered again to the module that defined it (--helpfull groups flags by module).
    """
    from absl import flags
    from absl.testing import flagsaver

    values = flags.FLAGS
    saved = flagsaver.save_flag_values(values)
    was_parsed = values.is_parsed()
    aside = _set_aside(values) if tool_module is not None else None
    kept = set(values)
    try:
        if tool_module is not None:
            tool_module.define_flags()
        yield
    finally:
        values.unparse_flags()
        absl_own = {name for name in set(values) - set(saved)  # absl.app, absl.logging:
                    if values.find_module_defining_flag(name).startswith("absl")}  # stay
        now = flagsaver.save_flag_values(values)
        saved.update({name: now[name] for name in absl_own})
        if aside is not None:
            values.remove_flag_values(_holding(values, set(values) - kept - absl_own))
            _put_back(values, *aside)
        flagsaver.restore_flag_values(saved, values)  # deletes the other flags defined meanwhile
        if was_parsed:
            values.mark_as_parsed()


def _holding(values, names):
    """A FlagValues holding the flags `names` of `values` (the same Flag objects)."""
    from absl import flags

    holder = flags.FlagValues()
    for name in {values[name].name for name in names}:
        holder[name] = values[name]
    return holder


def _set_aside(values):
    """Removes every flag that absl itself did not define from `values`; returns them and
    the modules that defined them, for `_put_back`."""
    ours = {flag.name for module, module_flags in values.flags_by_module_dict().items()
            if not module.startswith("absl") for flag in module_flags}
    modules = [(registry, {key: list(module_flags) for key, module_flags in
                           registry_dict.items()})
               for registry, registry_dict in (
                   (values.register_flag_by_module, values.flags_by_module_dict()),
                   (values.register_flag_by_module_id, values.flags_by_module_id_dict()),
                   (values.register_key_flag_for_module, values.key_flags_by_module_dict()))]
    aside = _holding(values, ours & set(values))
    values.remove_flag_values(aside)
    return aside, modules


def _put_back(values, aside, modules):
    """Registers the flags `_set_aside` removed again, each to its defining modules."""
    values.append_flag_values(aside)
    back = set(aside)
    for register, by_module in modules:
        for module, module_flags in by_module.items():
            for flag in module_flags:
                if flag.name in back:
                    register(module, flag)


@contextlib.contextmanager
def _absl_log():
    """The absl log lines (INFO and up) written meanwhile, as a list (absl's own handler
    writes to the stderr it found at start-up, which redirect_stderr does not catch)."""
    import logging

    lines = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("absl")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@contextlib.contextmanager
def _stdin(text: str | bytes):
    previous = sys.stdin
    data = text if isinstance(text, bytes) else text.encode("utf-8")
    sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    try:
        yield
    finally:
        sys.stdin = previous
