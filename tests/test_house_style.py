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
