"""tests/clis.py: an in-process call defines its tool's flags for the call only, reports a
bad flag in the command line's one line, and leaves every absl flag as it found it."""

from absl import flags

from tests.clis import call_main
from tests.conftest import write_vocab


def _state(values, before=None) -> dict:
    """Everything of the global flags a call must leave as it was (of the flags and
    modules in `before`: absl.app's and absl.logging's, defined when a call imports them,
    stay defined, as after a real import)."""
    names = set(values) if before is None else set(before["flags"])
    modules = lambda registry: {  # noqa: E731
        module: [f.name for f in module_flags] for module, module_flags in registry.items()
        if module_flags and (before is None or module in before["by_module"])}
    return {
        "flags": {name: (values.find_module_defining_flag(name), values[name].value,
                         values[name].default, values[name].present,
                         values[name].help) for name in names if name in values},
        "by_module": modules(values.flags_by_module_dict()),
        "key_flags": modules(values.key_flags_by_module_dict()),
        "parsed": values.is_parsed(),
    }


def test_a_call_defines_its_tools_flags_for_the_call_and_restores_every_flag(tmp_path):
    """run_classifier defines --vocab_file, --do_lower_case and --max_seq_length at import;
    bert_tokenize and create_pretraining_data define their own of the same names when
    they start. Each call sees its tool's flags (a value refused by the tool's flag is
    the tool's one line), and the runner's come back, values and all."""
    import run_classifier  # noqa: F401  (defines its flags at import, as a user's import does)

    values = flags.FLAGS
    default = values["max_seq_length"].default
    values.set_default("max_seq_length", 77)  # as a test may have left it: it comes back
    try:
        before = _state(values)
        assert values.find_module_defining_flag("vocab_file") == "training.flags"

        done = call_main("create_pretraining_data", ["--max_seq_length=x"])
        assert done.code == 1, done.stderr
        assert done.stderr.strip() == ("create_pretraining_data: error: flag "
                                       "--max_seq_length=x: invalid literal for int() with "
                                       "base 10: 'x'"), done.stderr
        assert "Traceback" not in done.stderr
        assert _state(values, before) == before
        assert "verbosity" in values  # absl.logging's, as the tool's imports left it

        vocab = write_vocab(tmp_path / "vocab.txt")
        done = call_main("bert_tokenize", [f"--vocab_file={vocab}"], stdin="Cats\n")
        assert (done.code, done.stdout) == (0, "cat ##s\n"), done.stderr
        assert _state(values, before) == before

        done = call_main("build_vocab", ["--num_iterations=x"])  # a flag only it defines
        assert done.code == 1 and "--num_iterations=x" in done.stderr, done.stderr
        assert "num_iterations" not in values
        assert _state(values, before) == before
    finally:
        values.set_default("max_seq_length", default)
