"""No flag is parsed and then ignored (issue 12).

For each runner, in a process of its own (a runner defines its flags at import: one process
forks a child per runner after importing TensorFlow once), every flag this
project defines is changed in turn from a valid command line; the run config the runner
builds from the flags (`run_config_from_flags`) must change, or the runner must refuse
the value. A flag that changes nothing is parsed and ignored: the test names it.

A refusal is an error raised on purpose about that flag: a ValueError or absl flag/usage
error whose message names the flag. Any other exception (a TypeError, an AttributeError,
a message about something else) is a crash of the config builder, not proof that the
flag is read: the test names it too.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from tests import test_loop_support as S

# A valid command line per runner (nothing is read: configs are built from flags only).
RUNNERS = {
    "run_classifier": ["--task_name=cola", "--data_dir=d", "--vocab_file=v",
                       "--bert_config_file=c", "--output_dir=o", "--do_train"],
    "run_squad": ["--vocab_file=v", "--bert_config_file=c", "--output_dir=o", "--do_train",
                  "--train_file=t.json"],
    "run_pretraining": ["--input_file=x.tfrecord", "--bert_config_file=c", "--output_dir=o",
                        "--do_train"],
    "run_ner": ["--data_dir=d", "--vocab_file=v", "--bert_config_file=c", "--output_dir=o",
                "--do_train"],
    "run_swag": ["--data_dir=d", "--vocab_file=v", "--bert_config_file=c", "--output_dir=o",
                 "--do_train"],
    "glue_submission": ["--glue_dir=g", "--vocab_file=v", "--bert_config_file=c",
                        "--output_dir=o"],
}
# Our own packages and runners: the flags they define are walked (absl's are not).
OWN_MODULES = ("training.", "run_", "tasks.", "data_prep.", "modeling.")


def walk(runner: str, argv: list) -> dict:
    """{flag: what happened} for every flag of ours, in this process (see module doc)."""
    import importlib

    from absl import flags

    module = importlib.import_module(runner)
    values = flags.FLAGS
    ours = sorted({flag.name for name, module_flags in values.flags_by_module_dict().items()
                   if name.startswith(OWN_MODULES) or name == runner
                   for flag in module_flags})

    def config_for(extra, current=None):
        values.unparse_flags()
        values([runner + ".py"] + argv + extra)
        try:
            if current is not None:
                current.update({name: values[name].value for name in ours})
            return repr(module.run_config_from_flags(values))
        finally:
            values.unparse_flags()

    current = {}
    baseline = config_for([], current)
    assert baseline, runner
    report = {}
    for name in ours:
        for value in _alternatives(values[name], current[name]):
            try:
                changed = config_for([f"--{name}={value}"]) != baseline
            except Exception as err:  # noqa: BLE001 - sorted into refusals and crashes
                kind = "refused" if _is_refusal(err, name) else "CRASHED"
                report[name] = f"{kind} {value!r}: {type(err).__name__}: {err}"
                break
            if changed:
                report[name] = "used"
                break
        else:
            report[name] = "IGNORED"
    return report


def _is_refusal(err: Exception, name: str) -> bool:
    """True if `err` is the runner refusing the value of flag `name` on purpose: a
    ValueError or an absl flags / usage error, whose message names the flag."""
    from absl import app, flags

    if not isinstance(err, (ValueError, flags.Error, app.UsageError)):
        return False
    spellings = {name, name.replace("_", " ")}  # "--task_name" or "unknown task name"
    return any(re.search(rf"(?<!\w){re.escape(spelling)}\b", str(err))
               for spelling in spellings)


def _alternatives(flag, default):
    """Valid values other than the current one, for each kind of flag."""
    kind = flag.flag_type()
    if isinstance(default, tuple):  # a grid by default (glue_submission's learning rates)
        return [str(default[0])]
    if kind == "bool":
        return ["false" if default else "true"]
    if kind == "int":
        return [str((default or 0) + 1), str((default or 0) + 3)]
    if kind == "float":
        return [str((default or 0.0) + 0.25)]
    if kind == "enum" or getattr(flag.parser, "enum_values", None):
        return [v for v in flag.parser.enum_values if v != default][:2]
    if kind in ("list", "comma separated list of strings"):
        return ["7", "1,2"]
    return ["7", "x"]


def walk_each_forked(cases):
    """[`walk` of each (runner, argv)], each in a child forked from this process: a runner
    defines its flags at import, so each needs a process of its own, and forking after
    TensorFlow's import pays for that import once. A child's failure is its traceback."""
    import traceback

    import tensorflow  # noqa: F401  (imported once, before the forks)

    reports = []
    for runner, argv in cases:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: walk, write the report, exit without cleanup
            os.close(read)
            try:
                text = json.dumps(walk(runner, argv))
            except BaseException:  # noqa: BLE001 - reported to the parent
                text = json.dumps({"error": traceback.format_exc()})
            with os.fdopen(write, "w") as f:
                f.write(text)
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            text = f.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0 and text, (runner, status)
        reports.append(json.loads(text))
    return reports


def _walk_in_subprocess(cases, module_dir=None):
    """`walk_each_forked(cases)` in a fresh process (`module_dir`: where else to import
    the runners from)."""
    code = ("import json, sys; sys.path.insert(0, '.'); from tests import test_flags_used as t; "
            f"print('REPORT' + json.dumps(t.walk_each_forked({cases!r})))")
    env = S.runner_env()
    if module_dir is not None:
        env["PYTHONPATH"] = str(module_dir) + os.pathsep + env["PYTHONPATH"]
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=S.REPO_ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("REPORT"))
    reports = json.loads(line[len("REPORT"):])
    for report in reports:
        assert "error" not in report, report.get("error")
    return reports


def _cases():
    return sorted(RUNNERS.items())


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """{runner: its walk}, every runner and FAKE_RUNNER (as run_fake_walk) walked by one
    process (see `walk_each_forked`)."""
    module_dir = tmp_path_factory.mktemp("fake_runner")
    (module_dir / "run_fake_walk.py").write_text(FAKE_RUNNER, encoding="utf-8")
    cases = [*_cases(), ("run_fake_walk", [])]
    return dict(zip([name for name, _ in cases],
                    _walk_in_subprocess(cases, module_dir=module_dir), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("runner,argv", _cases(), ids=[name for name, _ in _cases()])
def test_every_flag_of_the_runner_changes_its_run_config(runner, argv, reports):
    report = reports[runner]
    ignored = sorted(name for name, result in report.items() if result == "IGNORED")
    crashed = {name: result for name, result in report.items()
               if result.startswith("CRASHED")}
    assert len(report) > 20, report  # the walk saw the runner's flags
    assert not ignored, f"{runner}: flags parsed and ignored: {ignored}"
    assert not crashed, f"{runner}: building the run config crashed: {crashed}"


FAKE_RUNNER = """
from absl import flags

flags.DEFINE_integer("used", 1, "Changes the run config.")
flags.DEFINE_integer("refused", 1, "Refused, naming the flag, when changed.")
flags.DEFINE_integer("crashes", 1, "Crashes the config builder when changed.")
flags.DEFINE_integer("unread", 1, "Read by nothing.")
flags.DEFINE_integer("other_error", 1, "A ValueError about something else when changed.")


def run_config_from_flags(values):
    if values.refused != 1:
        raise ValueError(f"--refused={values.refused}: must be 1")
    if values.other_error != 1:
        raise ValueError("the output directory is not empty")
    return (values.used, None + values.crashes if values.crashes != 1 else None)
"""


def test_the_walk_tells_a_refusal_from_a_crash(reports):
    """The walk's verdicts on a runner with one flag of each kind: only a deliberate
    error naming the flag counts as reading it."""
    report = reports["run_fake_walk"]
    verdicts = {name: result.split()[0] for name, result in report.items()}
    assert verdicts == {"used": "used", "refused": "refused", "crashes": "CRASHED",
                        "unread": "IGNORED", "other_error": "CRASHED"}, report
    assert "TypeError" in report["crashes"], report


# CLIs without a run config: every flag they define (absl or argparse) must be read
# (FLAGS.<name>, args.<name>) in them.
STATIC_CLIS = ("extract_features.py", "export_saved_model.py", "predict_saved_model.py",
               "convert_checkpoint.py", "extend_vocab.py", "demo.py", "data_prep/create_pretraining_data.py",
               "data_prep/build_vocab.py", "data_prep/beam_pretraining_data.py",
               "data_prep/sample_corpus.py", "data_prep/bert_tokenize.py",
               "data_prep/pretraining_cli.py")
# Where flags are defined for the runners (walked through them), not read.
SHARED_FLAG_MODULES = ("training/flags.py",)


def _defined_flags(source: str) -> list:
    """Names of the flags a module's source defines, with absl or argparse."""
    defined = re.findall(r"DEFINE_\w+\(\s*[\"'](\w+)[\"']", source)
    defined += re.findall(r"flags\.DEFINE_\w+,\s*[\"'](\w+)[\"']", source)
    defined += re.findall(r"add_argument\(\s*[\"']--(\w+)[\"']", source)
    return defined


@pytest.mark.parametrize("path", STATIC_CLIS)
def test_every_flag_of_the_cli_is_read(path):
    source = open(os.path.join(S.REPO_ROOT, path), encoding="utf-8").read()
    defined = _defined_flags(source)
    assert defined, f"{path}: no flag definition found: the check would check nothing"
    # Read: FLAGS.name, args.name, FLAGS["name"]; for argparse also getattr(args, "name")
    # (its definition spells "--name", so a bare "name" string is a use).
    argparse_flags = set(re.findall(r"add_argument\(\s*[\"']--(\w+)[\"']", source))
    unread = [name for name in defined
              if not re.search(rf"(FLAGS|values|flags_|args)\.{name}\b|\[[\"']{name}[\"']\]",
                               source)
              and not (name in argparse_flags and re.search(rf"[\"']{name}[\"']", source))]
    assert not unread, f"{path}: flags defined but never read: {unread}"


def test_every_module_with_flags_is_checked():
    """A new runner or CLI joins RUNNERS or STATIC_CLIS; none is left out unseen."""
    root = S.REPO_ROOT
    paths = [name for name in os.listdir(root) if name.endswith(".py")]
    paths += [os.path.join(package, name) for package in ("data_prep", "training", "tasks",
                                                         "modeling")
              for name in os.listdir(os.path.join(root, package)) if name.endswith(".py")]
    with_flags = {path for path in paths
                  if _defined_flags(open(os.path.join(root, path), encoding="utf-8").read())}
    checked = {f"{runner}.py" for runner in RUNNERS} | set(STATIC_CLIS) | set(
        SHARED_FLAG_MODULES)
    assert with_flags <= checked, sorted(with_flags - checked)
