"""House rules that apply to the whole tree: libraries never read global absl FLAGS."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIBRARIES = ("modeling", "data_prep", "training", "tasks")
# CLIs that live inside the library packages may parse flags in their own main().
CLI_MODULES = {"flags.py", "create_pretraining_data.py", "beam_pretraining_data.py",
               "pretraining_cli.py", "build_vocab.py", "tokenization.py"}


def test_libraries_do_not_read_global_flags():
    offenders = []
    for package in LIBRARIES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name in CLI_MODULES:
                continue
            if re.search(r"\bFLAGS\b", path.read_text(encoding="utf-8")):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"FLAGS read inside library modules: {offenders}"


# Which way imports point: runners -> tasks -> training -> modeling -> data_prep.
LAYERS = ("data_prep", "modeling", "training", "tasks")
RUNNERS = tuple(path.stem for path in ROOT.glob("*.py"))


def _higher_layer_names(path: pathlib.Path, higher: tuple):
    """(line, name) of every higher layer (or runner) a module names: in an import, or as
    a string holding a module path ("tasks.squad.export", f"tasks.{name}.export",
    "tasks"), which importlib would import all the same. Docstrings and messages are
    prose, not module paths."""
    import ast

    def module_path(text: str) -> bool:
        # A dotted path ("tasks.squad.export"), or the bare package "tasks" ("training"
        # alone is a common word).
        return bool(re.fullmatch(r"\w+(\.\w+)+|tasks", text))

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value] if module_path(node.value) else []
        elif isinstance(node, ast.JoinedStr) and node.values:
            # f"tasks.{name}.export": its leading literal is the start of a module path.
            first = node.values[0]
            if (isinstance(first, ast.Constant) and isinstance(first.value, str)
                    and re.fullmatch(r"(\w+\.)+", first.value)):
                names = [first.value + "{...}"]
        for name in names:
            if name.split(".")[0] in higher:
                yield node.lineno, name


def test_no_layer_names_a_higher_one():
    """modeling/ knows no task family (issue 23 §5): no library module imports a higher
    layer or a runner, not even by a string of a module path (a registry entry, an
    importlib call); a higher layer registers itself with the lower one instead."""
    offenders = []
    for index, package in enumerate(LAYERS):
        higher = LAYERS[index + 1:] + RUNNERS
        for path in (ROOT / package).rglob("*.py"):
            offenders += [f"{path.relative_to(ROOT)}:{line}: {name}"
                          for line, name in _higher_layer_names(path, higher)]
    assert not offenders, "a layer names a higher one:\n" + "\n".join(offenders)


def test_the_layer_check_sees_imports_and_module_path_strings(tmp_path):
    """The check itself: it catches what the old export registry did, and not prose."""
    module = tmp_path / "m.py"
    module.write_text(
        '"""Uses tasks.squad.data in a docstring (prose: allowed)."""\n'
        "import importlib\n"
        "from tasks.classification.data import InputExample\n"
        "import training.loop\n"
        'FAMILIES = {"squad": "tasks.squad.export"}\n'
        'name = "x"\n'
        'mod = importlib.import_module(f"tasks.{name}.export")\n'
        'package = "tasks"\n'
        'error = "a tasks.squad failure, see tasks/squad"\n', encoding="utf-8")
    found = [name for _, name in _higher_layer_names(module, ("training", "tasks"))]
    assert sorted(found) == sorted(["tasks.classification.data", "training.loop",
                                    "tasks.squad.export", "tasks.{...}", "tasks"]), found
