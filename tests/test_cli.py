"""The one CLI shell (`data_prep.cli`, issue 32 §3-4, issue 30 #7): every command ends bad
input with one line `prog: error: <message>` and status 1, registers the SIGTERM/Ctrl-C
clean-up, names the flag of a path it cannot reach (gs:// with no network), and shows in
its help the defaults it runs with.

In this process (`tests.clis.call_main`), except one real process per command
(`test_each_command_s_wiring_as_a_process`): the exit status, the line on stderr and no
traceback of the program a user starts.
"""

import os
import re
import signal

import pytest

from data_prep import cli as shell
from data_prep import lifecycle
from tests import test_loop_support as S
from tests.clis import TOOLS, call_main, program, run_cli
from tests.conftest import TINY_VOCAB, imported_modules, write_vocab
from tests.test_flags_used import RUNNERS as REQUIRED  # each runner's required flags

RUNNERS = ("run_pretraining", "run_classifier", "run_squad", "run_ner", "run_swag",
           "glue_submission")
# A bucket no one owns: offline it fails at once ("Could not resolve host"), online without
# credentials as a permission error; either way a file-system error naming the path.
GS = "gs://bert-tf2-tests-no-such-bucket-404"


@pytest.fixture
def files(tmp_path):
    vocab = write_vocab(tmp_path / "vocab.txt")
    config = S.write_config(tmp_path / "bert_config.json", vocab_size=len(TINY_VOCAB))
    return {"dir": tmp_path, "vocab": vocab, "config": config}


def _one_error_line(result, tool, expected):
    """Status 1, stderr's last line `prog: error: ...expected...`, no traceback."""
    assert result.code == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"{program(tool)}: error: "), result.stderr[-2000:]
    assert expected in line, line
    return line


# --------------------------------------------------------------------------- bad input

BAD_INPUT = {
    "run_pretraining": ([], "At least one of `do_train` or `do_eval` must be True"),
    "run_classifier": ([], "--task_name is required"),
    "run_squad": (["--vocab_file=v", "--bert_config_file=nowhere.json", "--output_dir=o",
                   "--do_train"],  # the original's validate_flags_or_throw
                  "If `do_train` is True, then `train_file` must be specified."),
    "run_ner": ([], "--data_dir is required"),
    "run_swag": ([], "--data_dir is required"),
    "glue_submission": ([], "--output_dir is required"),
    # convert_checkpoint exited 2 (and printed its usage for a missing flag).
    "convert_checkpoint": ([], "--input and --output_dir are required"),
    "extend_vocab": ([], "--input and --output_dir are required"),
    "export_saved_model": ([], "--init_checkpoint is required"),
    "extract_features": ([], "--input_file is required"),
    # build_vocab exited 2 for a missing flag.
    "build_vocab": (["--output_file=v.txt"], "--input_file is required"),
    "create_pretraining_data": (["--input_file=/no/such/dir/*.txt", "--output_file=o",
                                 "--vocab_file=v"], "--input_file"),
    "beam_pretraining_data": (["--input_file=a", "--output_file=b", "--vocab_file=v",
                               "--pool_size_mb=0"], "--pool_size_mb=0.0 must be positive"),
    # sample_corpus exited 2 (argparse).
    "sample_corpus": (["--max_mb=0.3"], "give --output_dir (corpus) and/or --classification_dir"),
    "conlleval": ([], "line 2: unexpected number of features"),  # stdin: a short line
    # bert_tokenize printed no program name (and lived inside data_prep/tokenization.py).
    "bert_tokenize": (["--do_lower_case=false"], "--vocab_file is required"),
}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_bad_input_is_one_line_and_status_1(tool):
    argv, expected = BAD_INPUT[tool]
    stdin = "a B-X B-X\nb O\n" if tool == "conlleval" else None
    _one_error_line(call_main(tool, argv, stdin=stdin), tool, expected)


@pytest.mark.parametrize("tool", ["run_squad", "build_vocab", "convert_checkpoint",
                                  "sample_corpus"])
def test_a_flag_that_does_not_parse_is_the_same_line(tool):
    """absl's own parse errors (and argparse's) in the shell's form, not 'FATAL Flags
    parsing error' / argparse's usage and status 2."""
    flag = "--max_mb=abc" if tool == "sample_corpus" else "--no_such_flag=1"
    expected = "--max_mb" if tool == "sample_corpus" else "no_such_flag"
    _one_error_line(call_main(tool, [flag]), tool, expected)


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_command_registers_the_signal_clean_up(tool, monkeypatch):
    """The shell installs the SIGTERM/SIGHUP handler for every command before its work
    (build_vocab, sample_corpus and bert_tokenize did not register it)."""
    monkeypatch.setattr(lifecycle, "_INSTALLED", False)
    previous = {sig: signal.signal(sig, signal.SIG_DFL) for sig in (signal.SIGTERM,
                                                                    signal.SIGHUP)}
    try:
        argv, _ = BAD_INPUT[tool]
        call_main(tool, argv, stdin="a B-X B-X\nb O\n" if tool == "conlleval" else None)
        assert signal.getsignal(signal.SIGTERM) is lifecycle._raise_system_exit
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_sigterm_removes_build_vocab_s_temporaries(files, monkeypatch):
    """A SIGTERM while build_vocab commits its vocab (the temporary written, not yet
    renamed): the run ends 128 + 15 and leaves neither the vocab nor a temporary."""
    from data_prep import fileio

    corpus = files["dir"] / "corpus.txt"
    corpus.write_text("the cat sat on the mat .\nthe dog ran .\n" * 50, encoding="utf-8")
    out = files["dir"] / "out"
    out.mkdir()
    monkeypatch.setattr(lifecycle, "_INSTALLED", False)
    monkeypatch.setattr(lifecycle, "_RECEIVED", [])  # this test's signal stays in this test
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sync = fileio.sync

    def terminated_while_syncing(path):
        sync(path)
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, \
            "no SIGTERM handler: the signal would kill the process and leave the temporary"
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(fileio, "sync", terminated_while_syncing)
    try:
        result = call_main("build_vocab", [f"--input_file={corpus}",
                                           f"--output_file={out / 'vocab.txt'}",
                                           "--vocab_size=120", "--num_unused=2"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.code == 128 + signal.SIGTERM, result.stderr[-2000:]
    assert os.listdir(out) == []


def test_ctrl_c_ends_with_one_line_and_130(monkeypatch):
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as info:
        shell.run_main(interrupted, "tool")
    assert info.value.code == shell.INTERRUPTED == 130


INTERNAL = "internal error (a bug, please report it with the traceback above): "


def test_an_error_that_is_no_bad_input_keeps_its_traceback(capsys):
    """A bug is not turned into a line: only UserError, absl's flag errors and
    file-system errors about a flag's path are; anything else prints its traceback and a
    line saying it is a defect (a ValueError too: Keras, NumPy and TensorFlow raise it for
    programming errors)."""
    def bug():
        raise ValueError("a bug")

    for work, kind in ((bug, "ValueError: a bug"),
                       (lambda: open("/nonexistent/x"), "FileNotFoundError: ")):  # no flag's
        with pytest.raises(SystemExit) as info:
            shell.run_main(work, "tool", flag_values={"output_dir": "/tmp/a", "data": "/a/b"})
        assert info.value.code.startswith(f"tool: {INTERNAL}{kind}"), info.value.code
        assert "Traceback (most recent call last)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        shell.run_main(lambda: (_ for _ in ()).throw(shell.UserError("bad --x")), "tool")
    assert info.value.code == "tool: error: bad --x"
    assert capsys.readouterr().err == ""


DATA_FLAGS = ["--input_file=in.txt", "--output_file=o", "--vocab_file=v"]
# A library function each command calls early (module, attribute) and the arguments that
# get it there: an internal ValueError raised in it must keep its traceback.
CALLED = {
    "run_pretraining": ("training.trainer_setup", "load_bert_config", REQUIRED["run_pretraining"]),
    "run_classifier": ("training.finetuning", "validate", REQUIRED["run_classifier"]),
    "run_squad": ("training.finetuning", "validate", REQUIRED["run_squad"]),
    "run_ner": ("training.finetuning", "validate", REQUIRED["run_ner"]),
    "run_swag": ("training.finetuning", "validate", REQUIRED["run_swag"]),
    "glue_submission": ("training.finetuning", "validate", REQUIRED["glue_submission"]),
    "extract_features": ("data_prep.fileio", "check_outputs",
                         ["--input_file=in.txt", "--output_file=out.jsonl",
                          "--init_checkpoint=ckpt"]),
    "export_saved_model": ("modeling.checkpoints", "resolve",
                           ["--init_checkpoint=ckpt", "--export_dir=export"]),
    "convert_checkpoint": ("modeling.checkpoints", "convert", ["--input=ckpt", "--output_dir=o"]),
    "build_vocab": ("data_prep.build_vocab", "build_vocab",
                    ["--input_file=in.txt", "--output_file=vocab.txt"]),
    "create_pretraining_data": ("data_prep.pretraining_cli", "job_from_flags", DATA_FLAGS),
    "beam_pretraining_data": ("data_prep.pretraining_cli", "job_from_flags", DATA_FLAGS),
    "sample_corpus": ("data_prep.sample_corpus", "write_corpus", ["--output_dir=corpus"]),
    "conlleval": ("tasks.tagging.metrics", "evaluate_lines", []),
    "bert_tokenize": ("data_prep.tokenization", "FullTokenizer", ["--vocab_file=vocab.txt"]),
    "predict_saved_model": ("predict_saved_model", "_check_utf8",
                            ["--export_dir=export", "--text=a"]),
}


@pytest.mark.parametrize("tool", sorted(CALLED))
def test_an_internal_value_error_keeps_its_traceback(tool, monkeypatch, tmp_path, capsys):
    """Issue 39 #1: a ValueError nobody raised on purpose (here injected into a library
    function the command calls) was one line blaming the user; now its traceback, then a
    line saying it is a defect to report, status 1."""
    import importlib

    module, name, argv = CALLED[tool]

    def internal(*args, **kwargs):
        raise ValueError("injected defect")

    monkeypatch.setattr(importlib.import_module(module), name, internal)
    monkeypatch.chdir(tmp_path)
    if tool == "predict_saved_model":  # serving with TensorFlow alone: its own shell
        import predict_saved_model

        code = predict_saved_model.main(argv)
        result = type("Result", (), {"code": code, "stderr": capsys.readouterr().err})
        prog = "predict_saved_model.py"
    else:
        result, prog = call_main(tool, argv, stdin="a O O\n"), program(tool)
    assert result.code == 1, result.stderr[-3000:]
    assert "Traceback (most recent call last)" in result.stderr, result.stderr[-3000:]
    assert "in internal\n    raise ValueError(\"injected defect\")" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"{prog}: {INTERNAL}ValueError: injected defect"), result.stderr[-3000:]


# --------------------------------------------------------------------------- gs:// paths


def _gs_cases(f):
    common = [f"--vocab_file={f['vocab']}", f"--bert_config_file={f['config']}", "--do_train"]
    local_out = f"--output_dir={f['dir'] / 'out'}"
    return {
        "input_file": ("run_pretraining", [f"--input_file={GS}/data/*.tfrecord",
                                           f"--bert_config_file={f['config']}", local_out,
                                           "--do_train"]),
        "output_dir": ("run_classifier", ["--task_name=cola", f"--data_dir={f['dir']}",
                                          *common, f"--output_dir={GS}/run"]),
        "data_dir": ("run_classifier", ["--task_name=cola", f"--data_dir={GS}/glue",
                                        *common, local_out]),
        "init_checkpoint": ("export_saved_model", [f"--init_checkpoint={GS}/ckpt",
                                                   f"--export_dir={f['dir'] / 'export'}"]),
        # Issue 38 #13: the path that fails is derived from the flag's (the config looked
        # up beside the checkpoint).
        "run_classifier --init_checkpoint": (
            "run_classifier", ["--task_name=cola", f"--data_dir={f['cola']}", *common,
                               local_out, f"--init_checkpoint={GS}/model.ckpt"]),
        "run_pretraining --init_checkpoint": (
            "run_pretraining", [f"--input_file={f['records']}", f"--init_checkpoint={GS}/m.ckpt",
                                f"--bert_config_file={f['config']}", local_out, "--do_train",
                                f"--max_seq_length={S.SEQ}",
                                f"--max_predictions_per_seq={S.PREDS}"]),
        "extract_features --init_checkpoint": (
            "extract_features", [f"--input_file={f['vocab']}", f"--init_checkpoint={GS}/m.ckpt",
                                 f"--output_file={f['dir'] / 'features.jsonl'}"]),
        "export_dir": ("export_saved_model", ["--model_type=encoder",
                                              f"--init_checkpoint={f['ckpt']}",
                                              f"--vocab_file={f['vocab']}",
                                              f"--bert_config_file={f['config']}",
                                              f"--export_dir={GS}/export"]),
        "create_pretraining_data --input_file": (
            "create_pretraining_data", [f"--input_file={GS}/corpus/*.txt",
                                        f"--output_file={f['dir'] / 'x.tfrecord'}",
                                        f"--vocab_file={f['vocab']}"]),
        "create_pretraining_data --output_file": (
            "create_pretraining_data", [f"--input_file={f['vocab']}",
                                        f"--output_file={GS}/x.tfrecord",
                                        f"--vocab_file={f['vocab']}"]),
    }


@pytest.fixture
def with_checkpoint(files):
    from modeling import checkpoints
    from modeling.config import BertConfig
    from modeling.encoder import BertEncoder

    config = BertConfig.from_json_file(files["config"])
    checkpoints.save_ours(BertEncoder(config), str(files["dir"] / "ckpt"), config)
    (files["dir"] / "train.tsv").write_text("a\tb\n", encoding="utf-8")
    records = S.write_records(files["dir"] / "data.tfrecord", S.synthetic_instances(4))
    (files["dir"] / "cola").mkdir()
    (files["dir"] / "cola" / "train.tsv").write_text("".join(
        f"gj04\t{i % 2}\t\tthe cat sat .\n" for i in range(32)), encoding="utf-8")
    return dict(files, ckpt=str(files["dir"] / "ckpt"), records=records,
                cola=str(files["dir"] / "cola"))


@pytest.mark.parametrize("case", ["input_file", "output_dir", "data_dir", "init_checkpoint",
                                  "export_dir", "create_pretraining_data --input_file",
                                  "create_pretraining_data --output_file",
                                  "run_classifier --init_checkpoint",
                                  "run_pretraining --init_checkpoint",
                                  "extract_features --init_checkpoint"])
def test_an_unreachable_gs_path_names_its_flag_in_one_line(case, with_checkpoint):
    """Issue 30 #7: these printed a FailedPreconditionError traceback ("Could not resolve
    host ... when reading gs://..."); now one line naming the flag and the path, status 1."""
    tool, argv = _gs_cases(with_checkpoint)[case]
    flag = case.rpartition(" ")[2].lstrip("-")
    line = _one_error_line(call_main(tool, argv), tool, f"--{flag}={GS}/")
    assert re.search(r"Error: .*gs://", line), line


def test_a_path_error_names_the_flag_whose_path_it_is():
    """The flag whose value (or a comma-separated part, or a glob's folder) the error
    names; a folder above the flag's path (creating it) counts too; other flags do not."""
    import tensorflow as tf

    values = {"input_file": "gs://b/in/a.txt,gs://b/in2/*.txt", "output_dir": "gs://b/out/run",
              "dtype": "float32", "seed": 3}
    err = tf.errors.FailedPreconditionError(None, None, "Could not resolve host\n\t when "
                                                        "reading gs://b/in2")
    assert shell.path_error(err, values) == (
        "--input_file=gs://b/in/a.txt,gs://b/in2/*.txt: FailedPreconditionError: Could not "
        "resolve host; when reading gs://b/in2")
    err = tf.errors.PermissionDeniedError(None, None, "denied: gs://b/out")
    assert shell.path_error(err, values).startswith("--output_dir=gs://b/out/run: ")
    assert shell.path_error(tf.errors.InvalidArgumentError(None, None, "float32 gs://b/out"),
                            values) is None  # not a file-system error
    assert shell.path_error(PermissionError(13, "Permission denied", "/x/y"), values) is None


def test_a_path_derived_from_a_flag_names_that_flag():
    """Issue 38 #13: the config looked up beside --init_checkpoint failed with no flag named
    (run_pretraining: a traceback), or run_classifier named --bert_config_file, whose
    relative value bert_config.json is only the end of the failing path."""
    import tensorflow as tf

    values = {"init_checkpoint": "gs://b/run/model.ckpt", "bert_config_file": "bert_config.json",
              "vocab_file": "/data/vocab.txt", "data_dir": "/data", "output_dir": "out"}
    err = tf.errors.FailedPreconditionError(
        None, None, "Could not resolve host\n\t when reading gs://b/run/bert_config.json")
    assert shell.path_error(err, values).startswith("--init_checkpoint=gs://b/run/model.ckpt: ")
    # The flag's own path beats one beside another flag's: data_dir's train.tsv, not the
    # vocab beside it.
    err = PermissionError(13, "Permission denied", "/data/train.tsv")
    assert shell.path_error(err, values).startswith("--data_dir=/data: ")
    err = PermissionError(13, "Permission denied", "/elsewhere/bert_config.json")
    assert shell.path_error(err, values) is None


# --------------------------------------------------------------------------- help


def _help_defaults() -> dict:
    """flag -> the default --helpfull prints, as text (absl's help parsed back: a flag's
    line is indented 2 spaces, its continuation lines 4, "(default: ...)" among them)."""
    from absl import flags

    found, current = {}, None
    for line in flags.FLAGS.get_help().splitlines():
        flag = re.match(r"  --(?:\[no\])?(\w+):", line)
        if flag:
            current = flag.group(1)
            continue
        default = re.match(r"    \(default: (.*)\)$", line)
        if default and current:
            found[current] = default.group(1)
    return found




# Flags whose absence the config keeps as None, "not given": refused where they do not
# apply (masked records), else the run takes the help's default (training/pretraining.py).
NOT_GIVEN = {"run_pretraining": {"masked_lm_prob", "do_whole_word_mask", "mask_token_rate",
                                 "random_token_rate"}}


@pytest.mark.parametrize("runner", RUNNERS)
def test_the_help_shows_the_default_the_runner_uses(runner):
    """Issue 32 §4: for every flag, giving the default --helpfull shows changes nothing in
    the run config (run_squad showed --max_seq_length 128 and ran 384; glue_submission
    showed --learning_rate 5e-05 and swept the paper's four). Every runner is imported
    first: shared flags have one definition per process, whichever runner made it."""
    import importlib

    from absl import flags

    from tests.clis import _flag_scope

    modules = {name: importlib.import_module(name) for name in RUNNERS}
    module = modules[runner]
    values = flags.FLAGS
    with _flag_scope():
        # What the runner's process does before it parses (its import states its defaults).
        from training import flags as common_flags

        common_flags.use_defaults(module.DEFAULTS)
        shown = _help_defaults()
        assert {"max_seq_length", "learning_rate", "train_batch_size"} <= set(shown)

        def config(extra):
            values.unparse_flags()
            values([f"{runner}.py", *REQUIRED[runner], *extra])
            return repr(module.run_config_from_flags(values))

        baseline = config([])
        given = {arg.split("=")[0].lstrip("-") for arg in REQUIRED[runner]}
        checked, lies = 0, []
        for name, text in sorted(shown.items()):
            if name in given or name in NOT_GIVEN.get(runner, ()) or name not in values:
                continue
            if values.find_module_defining_flag(name).startswith("absl"):
                continue
            value = text.strip("'\"")
            try:
                explicit = config([f"--{name}={value}"] if text != "None" else [])
            except Exception:  # noqa: BLE001 - a flag refused when given (e.g. do_train
                continue        # in glue_submission): it has no "given" value to compare
            checked += 1
            if explicit != baseline:
                lies.append(f"--{name}: help shows {text}")
        assert checked > 20, checked
        assert not lies, f"{runner}: help defaults that are not what runs: {lies}"


# --------------------------------------------------------------------------- processes


# The runners that train: their wiring case is a rate that cannot train, refused in a
# fraction of a second: the task's, the loop's and the optimizer's settings are all built
# and checked before TensorFlow loads (SQuAD's task settings, the length buckets, the
# optimizer's config and pretraining's settings loaded it). Their BAD_INPUT lines are
# checked in this process (`test_bad_input_is_one_line_and_status_1`).
TRAINING_RUNNERS = ("run_pretraining", "run_classifier", "run_squad", "run_ner", "run_swag")


def _wiring_case(tool, tmp_path):
    """(args, expected text) of a bad input each command refuses after its start-up."""
    if tool == "create_pretraining_data":  # issue 30 #7 as a process: a gs:// output
        vocab = write_vocab(tmp_path / "vocab.txt")
        return ([f"--input_file={vocab}", f"--output_file={GS}/x.tfrecord",
                 f"--vocab_file={vocab}"], f"--output_file={GS}/x.tfrecord: ")
    if tool in TRAINING_RUNNERS:
        return ([*REQUIRED[tool], "--learning_rate=-1"],
                "--learning_rate=-1.0: the learning rate must be a positive, finite number")
    argv, expected = BAD_INPUT[tool]
    return argv, expected


# The commands whose wiring case above is answered only after TensorFlow has loaded: a
# gs:// output is TensorFlow's file system to reach; export_saved_model's flags are its
# families' (which import TensorFlow). Every other command answers a bad flag before it
# loads TensorFlow (a fraction of a second, not TensorFlow's import).
ANSWERED_AFTER_TENSORFLOW = {"create_pretraining_data", "export_saved_model"}


@pytest.mark.slow
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_each_command_s_wiring_as_a_process(tool, tmp_path):
    """The program a user starts: status 1, one `prog: error:` line, no traceback; and
    whether it loaded TensorFlow first (Python's own import log, -X importtime): a
    training runner refuses a rate that cannot train before it loads TensorFlow
    (`TRAINING_RUNNERS`)."""
    args, expected = _wiring_case(tool, tmp_path)
    stdin = "a B-X B-X\nb O\n" if tool == "conlleval" else None
    result = run_cli(tool, *args, cwd=str(tmp_path), stdin=stdin,
                     env={"PYTHONPROFILEIMPORTTIME": "1"})
    _one_error_line(result, tool, expected)
    loaded_tensorflow = "tensorflow" in _imported(result)
    assert loaded_tensorflow == (tool in ANSWERED_AFTER_TENSORFLOW), tool


def _imported(result) -> set:
    """The modules a process started with PYTHONPROFILEIMPORTTIME imported (its log)."""
    imported = imported_modules(result.stderr)
    assert "data_prep.cli" in imported  # the log is there
    return imported


def test_conlleval_reports_through_the_shell(tmp_path):
    """The conlleval command (moved out of tasks/tagging/metrics.py): the perl's report."""
    result = call_main("conlleval", [], stdin="Jo B-PER B-PER\nis O O\n\nAnn B-PER O\n")
    assert result.code == 0, result.stderr
    assert result.stdout.startswith("processed 3 tokens with 2 phrases; found: 1 phrases; "
                                     "correct: 1.\naccuracy:  66.67%; precision: 100.00%; "
                                     "recall:  50.00%; FB1:  66.67\n")
