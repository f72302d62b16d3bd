"""Outputs are written only through data_prep.fileio (the rule in its docstring).

Every call of the library, the runners and the demo that opens a file for writing, copies
or renames onto a name, or lets TensorFlow write a file (`TFRecordWriter`,
`tf.saved_model.save`) either writes into a temporary of `fileio.AtomicOutputs`
(`out.temp(...)`) or is listed below with the reason it is not an output written in
place. A new `open(path, "w")` on a final name fails here: use fileio's writers.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("data_prep", "modeling", "training", "tasks", "demo_lib")
RENAMES = ("os.replace", "os.rename", "shutil.copy", "shutil.copyfile", "shutil.copy2",
           "shutil.move")

# (file, enclosing function) -> why its writing calls are allowed.
ALLOWED = {
    ("data_prep/beam_pretraining_data.py", "write_bucket"): "scratch in the work folder",
    ("data_prep/beam_pretraining_data.py", "_write_json"): "scratch in the work folder",
    ("data_prep/beam_pretraining_data.py", "open_record_file"):
        "the set's temporaries, written by Beam workers (shared_temporaries)",
    ("data_prep/build_vocab.py", "check_writable"): "a probe temporary, removed at once",
    ("modeling/export/families.py", "write"): "into the export's temporary directory",
    ("modeling/export/hub.py", "write"): "into the export's temporary directory",
    ("modeling/export/metadata.py", "write_marker"): "into the export's temporary directory",
    ("training/checkpointing.py", "set_aside"):
        "training checkpoints: TensorFlow's files, moved aside, not an output of ours",
    ("training/output_claim.py", "_try_create_lock"): "the run lock: an exclusive create",
    ("demo_lib/stages.py", "run_stage"): "a stage's log: a stream",
    ("predict_saved_model.py", "_write_atomically"):
        "imports no project code: inlines fileio's temporary, sync and rename",
}


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _into_temporary(call) -> bool:
    first = call.args[0] if call.args else None
    return isinstance(first, ast.Call) and _dotted(first.func).endswith(".temp")


def _writes(call) -> bool:
    """True for a call that writes a file other than a temporary of AtomicOutputs."""
    name = _dotted(call.func)
    last = name.rsplit(".", 1)[-1]
    if name == "open" or last in ("fdopen", "open_file", "GFile"):
        mode = next((kw.value for kw in call.keywords if kw.arg == "mode"),
                    call.args[1] if len(call.args) > 1 else None)
        if mode is None or (isinstance(mode, ast.Constant)
                            and not set(str(mode.value)) & set("wax+")):
            return False
        return not _into_temporary(call)
    if last == "TFRecordWriter":
        return not _into_temporary(call)
    return (name.endswith(("gfile.copy", "gfile.rename", "saved_model.save"))
            or name in RENAMES)


def _writing_calls(path: pathlib.Path):
    """(enclosing function or "<module>", line, callee) of each writing call in `path`."""
    found = []

    def visit(node, function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Call) and _writes(node):
            found.append((function, node.lineno, _dotted(node.func)))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(path.read_text(encoding="utf-8")), "<module>")
    return found


def _sources():
    yield from sorted(ROOT.glob("*.py"))
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_outputs_are_written_through_fileio():
    offending, used = [], set()
    for path in _sources():
        relative = path.relative_to(ROOT).as_posix()
        if relative == "data_prep/fileio.py":
            continue
        for function, line, callee in _writing_calls(path):
            if (relative, function) in ALLOWED:
                used.add((relative, function))
            else:
                offending.append(f"{relative}:{line} {function}: {callee}")
    assert not offending, ("writes that bypass data_prep.fileio's all-or-nothing writers "
                           "(see its docstring): " + "; ".join(offending))
    assert used == set(ALLOWED), f"allowed but no longer writing: {set(ALLOWED) - used}"


def test_the_check_sees_a_write_in_place(tmp_path):
    """The scan finds what it must refuse, and passes writes into a temporary."""
    source = tmp_path / "tool.py"
    source.write_text(
        "def save(path, out):\n"
        "    with open(path, 'w') as f: f.write('x')\n"
        "    with tf.io.gfile.GFile(path, mode='wb') as f: f.write(b'x')\n"
        "    tf.io.gfile.copy(path, path + '.bak')\n"
        "    with out.open(path) as f: f.write('x')\n"
        "    with fileio.open_file(out.temp(path), 'wb') as f: f.write(b'x')\n"
        "    with open(path) as f: f.read()\n", encoding="utf-8")
    assert [(f, line) for f, line, _ in _writing_calls(source)] == [
        ("save", 2), ("save", 3), ("save", 4)]
