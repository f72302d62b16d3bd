"""predict_saved_model.py on hostile input (issue 22): an input the export refuses (a
context needing more windows than it allows), strings that are not UTF-8, and an
--output_json that cannot be written give a clear error (exit status 1, naming the
argument) and no traceback; --output_json is written all-or-nothing. Issue 38: inputs from
--input_file (a file or stdin) as from the flags, its bad lines named; Ctrl-C is one line
and status 130."""

import dataclasses
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import keras
import pytest

import predict_saved_model
from conftest import REPO_ROOT, assert_no_project_imports, isolated_argv, write_vocab
from modeling.export import families, writer
from modeling.models import BertClassifier, BertSpanLabeler
from test_export import SEQ, VOCAB, _config

MAX_WINDOWS = 4
LONG_CONTEXT = " ".join(["the cat sat on the mat far away"] * 40)  # ~20 windows of 16


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    vocab = write_vocab(root / "vocab.txt", VOCAB)
    keras.utils.set_random_seed(3)
    # One layer: what these tests prove (the CLI's messages, files and refusals) does not
    # depend on the depth; an export's cost is mostly tracing its graph.
    config = dataclasses.replace(_config(), num_hidden_layers=1)
    writer.export_saved_model(BertClassifier(config, 2), families.serving_config(
        "classifier", vocab, True, SEQ, labels=("no", "yes")), str(root / "classifier"))
    writer.export_saved_model(BertSpanLabeler(config), families.serving_config(
        "squad", vocab, True, SEQ, max_query_length=8, doc_stride=16,
        max_context_windows=MAX_WINDOWS), str(root / "squad"))
    return {"classifier": str(root / "classifier"), "squad": str(root / "squad")}


def _cli(args, cwd):
    """The script as a user runs it, isolated (tensorflow + tensorflow_text only); args
    may be bytes (what a shell passes)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH="", TF_CPP_MIN_LOG_LEVEL="2")
    script = os.path.join(REPO_ROOT, "predict_saved_model.py")
    result = subprocess.run(isolated_argv(script, *args), cwd=cwd, env=env,
                            capture_output=True, timeout=300)
    assert_no_project_imports(result.stderr.decode("utf-8", "replace"))
    return result


def _error_line(stderr: bytes) -> str:
    text = stderr.decode("utf-8", "replace")
    assert "Traceback" not in text, text[-3000:]
    lines = [line for line in text.splitlines() if "predict_saved_model.py: error:" in line]
    assert len(lines) == 1, text[-3000:]
    return lines[0]


@pytest.mark.slow
def test_a_context_beyond_the_exports_windows_is_named(exports, tmp_path, capsys):
    """The traceback of the graph's InvalidArgumentError, before; now the input(s) that
    need too many windows, the limit, and what to do (in this process: that an error line
    is the process's exit status 1 is the bytes tests'). A context within the limit is
    served by the script as a user runs it, isolated (tensorflow + tensorflow_text
    only)."""
    out = tmp_path / "out.json"
    code = predict_saved_model.main([f"--export_dir={exports['squad']}",
                                     f"--output_json={out}", "--question=who sat?",
                                     "--context=the cat sat.", "--question=who sat?",
                                     f"--context={LONG_CONTEXT}"])
    assert code == 1
    line = _error_line(capsys.readouterr().err.encode())
    assert "input #2 (--question, --context) refused by the export" in line, line
    assert f"max_context_windows={MAX_WINDOWS}" in line and "--max_context_windows" in line
    assert not out.exists()
    result = _cli([f"--export_dir={exports['squad']}", "--question=who sat?",
                   "--context=the cat sat."], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("argument,message", [
    (b"--text=caf\xff", "--text #1: byte 0xff is not valid UTF-8 (at character 3)"),
    # A surrogate encoded as UTF-8 (CESU-8) is not UTF-8 either.
    (b"--text=a\xed\xa0\x80b", "--text #1: byte 0xed is not valid UTF-8 (at character 1)"),
])
def test_bytes_that_are_not_utf8_are_named(exports, tmp_path, argument, message):
    result = _cli([f"--export_dir={exports['classifier']}".encode(), argument], tmp_path)
    assert result.returncode == 1
    assert message in _error_line(result.stderr)


def test_a_lone_surrogate_is_named(exports, capsys):
    code = predict_saved_model.main([f"--export_dir={exports['classifier']}", "--text=ok",
                                     "--text=a\ud800b"])
    assert code == 1
    assert ("--text #2: U+D800 is a lone surrogate, not a character (at character 1)"
            in capsys.readouterr().err)


def test_an_export_without_its_variables_is_one_error_line(exports, tmp_path, capsys):
    """TensorFlow's load error spans two lines ("... Failed to find any matching files"
    then "You may be trying to load on a different device ..."): printed as one."""
    broken = tmp_path / "no_variables"
    shutil.copytree(exports["classifier"], broken)
    shutil.rmtree(broken / "variables")
    code = predict_saved_model.main([f"--export_dir={broken}", "--text=hi"])
    assert code == 1
    err = capsys.readouterr().err
    line = _error_line(err.encode())
    assert f"cannot load {broken}:" in line and "variables" in line, line
    assert line in err.splitlines()[-1], err  # nothing of the message after it


def test_output_json_that_cannot_be_written_is_refused_before_any_work(exports, tmp_path,
                                                                      capsys):
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "a_file").write_text("mine")
    cases = {str(tmp_path / "a_folder"): "is a directory; give a file name",
             str(tmp_path / "missing" / "x.json"): "does not exist",
             str(tmp_path / "a_file" / "x.json"): "does not exist"}
    for path, message in cases.items():
        code = predict_saved_model.main([f"--export_dir={exports['classifier']}",
                                         "--text=hi", f"--output_json={path}"])
        err = capsys.readouterr().err
        assert code == 1 and f"--output_json={path}" in err and message in err, err
    assert (tmp_path / "a_file").read_text() == "mine"
    assert sorted(os.listdir(tmp_path / "a_folder")) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_output_json_in_a_read_only_folder_is_refused(exports, tmp_path, capsys):
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        code = predict_saved_model.main([f"--export_dir={exports['classifier']}",
                                         "--text=hi", f"--output_json={folder / 'x.json'}"])
    finally:
        folder.chmod(0o755)
    assert code == 1 and "is not writable" in capsys.readouterr().err


def test_output_json_that_is_the_input_file_or_inside_the_export_is_refused(
        exports, tmp_path, capsys, monkeypatch):
    """Issue: --output_json naming the --input_file replaced the user's inputs with the
    JSON, and one inside --export_dir (its saved_model.pb) destroyed the export, both with
    status 0. Now one error line before any work (nothing served), whichever name reaches
    the file: relative, absolute, through a symbolic link; `-` is stdin, not a file."""
    import hashlib
    import shutil

    export = tmp_path / "export"
    shutil.copytree(exports["classifier"], export)  # a copy: the old code destroyed it
    (tmp_path / "export_link").symlink_to(export)
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat .\n", encoding="utf-8")
    (tmp_path / "alias.txt").symlink_to(texts)
    monkeypatch.chdir(tmp_path)

    def tree():
        return {str(p.relative_to(tmp_path)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(tmp_path.rglob("*")) if p.is_file()}

    before = tree()
    cases = [  # (--export_dir, --input_file, --output_json, message)
        (export, "texts.txt", texts, "is the --input_file (texts.txt)"),
        (export, str(texts), "./texts.txt", f"is the --input_file ({texts})"),
        (export, "texts.txt", "alias.txt", "is the --input_file (texts.txt)"),
        (export, "texts.txt", export / "saved_model.pb", f"lies inside --export_dir={export}"),
        ("export_link", "texts.txt", "export/assets.extra/served.json",
         "lies inside --export_dir=export_link"),
        (export, "texts.txt", "export_link/variables/variables.index",
         f"lies inside --export_dir={export}"),
    ]
    for export_dir, input_file, output, message in cases:
        code = predict_saved_model.main([f"--export_dir={export_dir}",
                                         f"--input_file={input_file}",
                                         f"--output_json={output}"])
        out, err = capsys.readouterr()
        assert code == 1 and out == "", (output, out, err)
        assert err.startswith(f"predict_saved_model.py: error: --output_json={output} "
                              f"{message}") and err.count("\n") == 1, (output, err)
        assert tree() == before, output
    # stdin is no file: an --output_json named "-" is a file like any other.
    lines = _served_lines([f"--export_dir={export}", "--input_file=-", "--output_json=-"],
                          capsys, b"the cat sat .\n", monkeypatch)
    assert len(lines) == 1 and json.loads((tmp_path / "-").read_text())["predictions"]
    assert texts.read_text(encoding="utf-8") == "the cat sat .\n"


def test_output_json_is_written_all_or_nothing(exports, tmp_path, capsys, monkeypatch):
    """A failure while writing (a read-only or full disk, found only then) leaves the
    previous file as it was and no temporary; a success replaces it whole."""
    out = tmp_path / "served.json"
    out.write_text("previous")

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", str(dst))

    args = [f"--export_dir={exports['classifier']}", "--text=hi", "--text=the cat sat",
            f"--output_json={out}"]
    with monkeypatch.context() as patch:
        patch.setattr(predict_saved_model.os, "replace", refuse)
        code = predict_saved_model.main(args)
    err = capsys.readouterr().err
    assert code == 1 and f"--output_json={out}: cannot write it" in err
    assert "Permission denied" in err
    assert out.read_text() == "previous" and os.listdir(tmp_path) == ["served.json"]
    assert predict_saved_model.main(args) == 0
    document = json.loads(out.read_text())
    assert document["inputs"] == {"text": ["hi", "the cat sat"]}
    assert len(document["predictions"]) == 2 and os.listdir(tmp_path) == ["served.json"]


def _served_lines(argv, capsys, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = predict_saved_model.main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return [line.split(" -> ", 1)[1] for line in out.splitlines()]


def test_input_file_serves_as_the_flags_do(exports, tmp_path, capsys, monkeypatch):
    """Issue 38: inputs only as arguments could not pass a long document ("Argument list
    too long"). --input_file: one text per line for a model of single texts (blank lines
    skipped), JSON lines keyed by the flags' names otherwise; `-` reads stdin."""
    texts = ["the cat sat .", "a dog ran far away", " ".join(["the red mat"] * 3000)]
    (tmp_path / "texts.txt").write_text(f"{texts[0]}\n\n{texts[1]}\r\n{texts[2]}\n",
                                        encoding="utf-8")
    classifier = f"--export_dir={exports['classifier']}"
    by_flags = _served_lines([classifier, *(f"--text={t}" for t in texts)], capsys)
    assert _served_lines([classifier, f"--input_file={tmp_path / 'texts.txt'}"],
                         capsys) == by_flags
    squad = f"--export_dir={exports['squad']}"
    pairs = [("who sat?", "the cat sat on the mat ."), ("who ran?", "a dog ran far away .")]
    by_flags = _served_lines([squad, *(f"--{k}={v}" for q, c in pairs
                                       for k, v in (("question", q), ("context", c)))], capsys)
    lines = "".join(json.dumps({"question": q, "context": c}) + "\n" for q, c in pairs)
    assert _served_lines([squad, "--input_file=-"], capsys, lines.encode(),
                         monkeypatch) == by_flags


@pytest.mark.parametrize("content,message", [
    (b'{"question": "who?", "context": "a cat."}\n["who?"]\n', "FILE:2: not a JSON object;"),
    (b'{"question": "who?"}\n', "FILE:1: keys ['question']; this model takes ['context', "
                                 "'question']"),
    (b'{"question": "who?", "context": 3}\n', "FILE:1: 'context' must be a text"),
    (b"who sat?\n", "FILE:1: not a JSON object (Expecting value"),
    (b'{"question": "caf\xff", "context": "x"}\n', "FILE:1: byte 0xff is not valid UTF-8"),
    (b"\n  \n", "--input_file=FILE: no input (the file is empty or blank)"),
])
def test_a_bad_input_file_line_is_named(tmp_path, content, message):
    """What a SQuAD export's --input_file may not hold, each named (file and line)."""
    path = tmp_path / "inputs.jsonl"
    path.write_bytes(content)
    with pytest.raises(predict_saved_model.UsageError) as err:
        lines = predict_saved_model._read_lines(str(path))
        predict_saved_model._file_inputs(str(path), lines, {"question", "context"})
    assert message.replace("FILE", str(path)) in str(err.value), err.value


def test_a_bad_input_file_line_is_one_error_line(exports, tmp_path, capsys):
    path = tmp_path / "inputs.jsonl"
    path.write_bytes(b"who sat?\n")
    code = predict_saved_model.main([f"--export_dir={exports['squad']}",
                                     f"--input_file={path}"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith(f"predict_saved_model.py: error: {path}:1: not a "
                                        "JSON object"), err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_an_input_file_that_is_a_directory_or_mixed_with_flags_is_refused(exports, tmp_path,
                                                                         capsys):
    for argv, message in (([f"--input_file={tmp_path}"],
                           f"--input_file={tmp_path} is a directory; give a file"),
                          ([f"--input_file={tmp_path}", "--text=a"],
                           "--input_file replaces the input flags")):
        with pytest.raises(SystemExit) if "--text=a" in argv else _no_exit():
            code = predict_saved_model.main([f"--export_dir={exports['classifier']}", *argv])
            assert code == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


class _no_exit:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_READ_SYSCALL = {"x86_64": "0", "aarch64": "63"}.get(os.uname().machine)


def _reading_stdin(pid) -> bool:
    """True once process `pid` waits in read(0, ...) (Linux: /proc/PID/syscall)."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    return fields[:2] == [_READ_SYSCALL, "0x0"]


@pytest.mark.skipif(_READ_SYSCALL is None, reason="reads /proc/PID/syscall (Linux x86_64 "
                                                 "or aarch64)")
def test_ctrl_c_is_one_line_and_status_130(tmp_path):
    """Issue 38: Ctrl-C printed a KeyboardInterrupt traceback. The process, interrupted
    while it waits for its --input_file on stdin: one line, status 130. It starts with
    SIGINT at its default, as in a terminal (a suite started in the background, `make test
    &`, hands its children SIGINT ignored: the signal would then be lost)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = os.path.join(REPO_ROOT, "predict_saved_model.py")
    process = subprocess.Popen([sys.executable, "-I", script, f"--export_dir={tmp_path}",
                                "--input_file=-"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not _reading_stdin(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _reading_stdin(process.pid), "never waited for stdin"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    assert stderr.decode() == "predict_saved_model.py: interrupted (Ctrl-C)\n"
