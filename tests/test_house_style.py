"""House rules that apply to the whole tree: libraries never read global absl FLAGS, imports
point down the layers, every command goes through the one CLI shell (`data_prep.cli`)."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIBRARIES = ("modeling", "data_prep", "training", "tasks")
SHELL = "data_prep.cli"


def _command(path: pathlib.Path) -> bool:
    """A command module: it defines a top-level `main` (what its command line calls)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body)


def _reads_flags(path: pathlib.Path) -> bool:
    """The module reads or defines absl flags (the global FLAGS, flags.DEFINE_*)."""
    return bool(re.search(r"\bFLAGS\b|\bDEFINE_?\w*\(", path.read_text(encoding="utf-8")))


def _flag_rule_breaches(root: pathlib.Path = ROOT) -> list:
    """What breaks "flags are read only by commands" inside the libraries: a library module
    reading flags that is neither a command nor imported only by commands and runners (the
    shared flag definitions: training/flags.py, data_prep/pretraining_cli.py); a library
    module importing a command (a CLI inside a library)."""
    modules = _project_modules(root)
    graph = _import_graph(root)
    in_library = {name for name in modules if name.split(".")[0] in LIBRARIES}
    commands = {name for name in in_library if _command(modules[name])}
    runners = {name for name in modules if "." not in name and name not in LIBRARIES}
    breaches = []
    for name in sorted(in_library - {SHELL}):  # the shell reads flags to name them in errors
        importers = sorted(a for a, edges in graph.items() if name in edges)
        if name in commands:
            libraries = [a for a in importers if a in in_library and a not in commands]
            if libraries:
                breaches.append(f"{name} is a command imported by library {libraries[0]}")
        elif _reads_flags(modules[name]):
            others = [a for a in importers if a not in commands and a not in runners]
            if others or not importers:
                breaches.append(f"{name} reads flags but is no command (imported by "
                                f"{others[0] if others else 'no command or runner'})")
    return breaches


def test_libraries_do_not_read_global_flags():
    """Flags are read by commands (a module with `main`) and by the shared flag modules
    only commands and runners import; no library module imports either."""
    breaches = _flag_rule_breaches()
    assert not breaches, "flags read inside library modules:\n" + "\n".join(breaches)


def test_every_command_goes_through_the_shell():
    """Every module with a `main` (runners, data tools, library commands) runs its work in
    `data_prep.cli.run_main` (one error line, exit 1, signals cleaned up). A command that
    imports nothing of the project (predict_saved_model.py: serving with TensorFlow alone)
    keeps the convention by itself (tests/test_cli.py checks it)."""
    modules = _project_modules(ROOT)
    graph = _import_graph(ROOT)
    offenders = []
    for name, path in sorted(modules.items()):
        if name == SHELL or not _command(path) or not graph[name]:
            continue
        text = path.read_text(encoding="utf-8")
        if SHELL not in graph[name] or not re.search(r"\brun_main\(", text):
            offenders.append(name)
    assert not offenders, f"commands that bypass the shell ({SHELL}.run_main): {offenders}"


def test_the_flag_rule_sees_what_it_must(tmp_path):
    """On a small tree: a library reading FLAGS without a `main` is found, a shared flags
    module imported only by a command is not, a library importing a command is found."""
    files = {
        "run_x.py": "from training import flags\ndef main(argv):\n    pass\n",
        "training/__init__.py": "",
        "training/flags.py": "FLAGS = None\n",
        "training/loop.py": "def f():\n    return FLAGS.x\n",
        "data_prep/__init__.py": "",
        "data_prep/shared_flags.py": "from absl import flags\nflags.DEFINE_string('a', None, '')\n",
        "data_prep/tool.py": "from data_prep import shared_flags\ndef main(argv):\n    pass\n",
        "data_prep/lib.py": "from data_prep import tool\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert _flag_rule_breaches(tmp_path) == [
        "data_prep.tool is a command imported by library data_prep.lib",
        "training.loop reads flags but is no command (imported by no command or runner)"]


# --------------------------------------------------------------------------- imports
#
# Which way imports point: runners -> tasks -> training -> modeling -> data_prep. A lower
# layer never names a higher one (an import, at module level or in a function, or a string
# holding a module path, which importlib imports all the same); no two modules import each
# other, however long the loop; a task family's package imports no other family's
# (what two families share lives in `tasks.common`, below them).

LAYERS = ("data_prep", "modeling", "training", "tasks")  # lowest first; runners above all
NOT_PROJECT = {"tests", "bench", "docs", "build"}


def _project_modules(root: pathlib.Path) -> dict:
    """Dotted name -> path of every module of the project (runners, libraries, their
    packages); tests and benchmarks are not part of it."""
    modules = {path.stem: path for path in root.glob("*.py")}
    for package in root.iterdir():
        if (package.name in NOT_PROJECT or package.name.startswith(".")
                or not (package / "__init__.py").exists()):
            continue
        for path in package.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict) -> str | None:
    """The project module `name` means (the longest dotted prefix that is one), or None."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: pathlib.Path, modules: dict) -> list:
    """(line, imported project module) for every import of `module`, wherever it stands,
    and every string that is a dotted path of a project module ("tasks.squad.export",
    or the leading literal of f"tasks.{name}.export"). Prose (docstrings, messages) is
    not a module path."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from a.b import c` imports a.b.c when c is a module, else a.b.
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                     for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"\w+(\.\w+)+", node.value):
                names = [node.value]
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if (isinstance(first, ast.Constant) and isinstance(first.value, str)
                    and re.fullmatch(r"(\w+\.)+", first.value)):
                names = [first.value.rstrip(".")]
        for name in names:
            target = _resolve(name, modules)
            if target and target != module:
                found.append((getattr(node, "lineno", 0), target))
    return found


def _import_graph(root: pathlib.Path = ROOT) -> dict:
    """module -> {imported module: first line naming it}."""
    modules = _project_modules(root)
    graph = {}
    for module, path in modules.items():
        edges = {}
        for line, target in _imports(module, path, modules):
            edges.setdefault(target, line)
        graph[module] = edges
    return graph


def _layer(module: str) -> int:
    top = module.split(".")[0]
    return LAYERS.index(top) if top in LAYERS else len(LAYERS)


def _family(module: str) -> str | None:
    """The task family package a module belongs to (tasks.<family>.*), else None."""
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == "tasks" and parts[1] != "common":
        return parts[1]
    return None


def _import_rule_breaches(graph: dict) -> list:
    """(importer, imported, what is wrong) for every import against the direction rule."""
    breaches = []
    for module, edges in graph.items():
        for target in edges:
            if _layer(target) > _layer(module):
                breaches.append((module, target, "a lower layer names a higher one"))
            elif _family(module) and _family(target) and _family(module) != _family(target):
                breaches.append((module, target, "a task family imports another family"))
    return breaches


def _cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _describe_cycle(graph: dict, component: list) -> str:
    members = set(component)
    return "; ".join(f"{a} -> {b} (line {graph[a][b]})" for a in component
                     for b in sorted(graph[a]) if b in members)


def test_no_two_modules_import_each_other():
    """No import cycle among the project's modules, through function-level imports too."""
    graph = _import_graph()
    cycles = _cycles(graph)
    assert not cycles, "modules that import each other:\n" + "\n".join(
        _describe_cycle(graph, component) for component in cycles)


def test_imports_point_down_the_layers():
    """runners -> tasks -> training -> modeling -> data_prep, families side by side."""
    graph = _import_graph()
    offenders = [f"{a} -> {b} (line {graph[a][b]}): {why}"
                 for a, b, why in _import_rule_breaches(graph)]
    assert not offenders, "imports against the layer rule:\n" + "\n".join(sorted(offenders))


def test_the_import_checks_see_what_they_must(tmp_path):
    """The checks themselves, on a small tree: a function-level import closing a loop of
    three, a module path in a string and in an f-string, a family importing another, a
    relative import; prose naming a module is not an import."""
    files = {
        "run_x.py": "import tasks.a.task\n",
        "data_prep/__init__.py": "",
        "data_prep/low.py": '"""Uses training.loop (prose)."""\nNAME = "training.loop"\n',
        "training/__init__.py": "",
        "training/loop.py": "def f():\n    from training import runs\n",
        "training/runs.py": "from training.steps import x\n",
        "training/steps.py": "from . import loop\nerror = 'see training.loop for why'\n",
        "modeling/__init__.py": "",
        "modeling/m.py": "import importlib\n"
                         "mod = importlib.import_module(f'tasks.{name}.export')\n",
        "tasks/__init__.py": "",
        "tasks/common/__init__.py": "",
        "tasks/common/shared.py": "from training import loop\n",
        "tasks/a/__init__.py": "",
        "tasks/a/task.py": "from tasks.common import shared\nfrom tasks.b import data\n",
        "tasks/b/__init__.py": "",
        "tasks/b/data.py": "from tasks.common.shared import loop\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    graph = _import_graph(tmp_path)
    assert _cycles(graph) == [["training.loop", "training.runs", "training.steps"]]
    breaches = sorted((a, b) for a, b, _ in _import_rule_breaches(graph))
    assert breaches == [("data_prep.low", "training.loop"), ("modeling.m", "tasks"),
                        ("tasks.a.task", "tasks.b.data")], breaches
