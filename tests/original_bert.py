"""Access to Google's original BERT code (PyPI `bert-tensorflow`), the reference in fidelity tests.

Only tests and benchmarks import this; the library never does.
"""

from absl import flags


def original_module(name: str):
    """Imports `bert.<name>` with absl flags marked parsed (the original reads flags at call time)."""
    import importlib

    module = importlib.import_module(f"bert.{name}")
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    return module
