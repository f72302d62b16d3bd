"""One package per task family: what it reads, its features, loop task, metrics and outputs.

`classification/` (GLUE, XNLI, custom tables), `squad/` (span extraction), and the others
beside them. `data_prep/` keeps what is generic (tokenization, vocab, record schema,
pretraining data), `training/` the task-agnostic machinery and `modeling/` the network.

A package's `export.py` registers its serving family with `modeling.export.registry` when
it is imported; `register_serving_families` imports them all. The families' training side
(`task.py`, a `training.finetuning.TaskFamily`) registers nothing: each runner imports its
family and passes it to `training.finetuning.run`.
"""

import importlib
import importlib.util
import pkgutil


def register_serving_families() -> tuple:
    """Imports every serving family so that it registers with
    ``modeling.export.registry``: ``modeling.export.encoder``, ``modeling.export.hub`` and
    each task package's ``export`` module. Returns the model types.

    Adding a task package with an ``export.py`` adds its family here, with no edit.
    """
    from modeling.export import encoder, hub, registry  # noqa: F401  (register at import)

    for info in pkgutil.iter_modules(__path__):
        if info.ispkg and importlib.util.find_spec(f"{__name__}.{info.name}.export"):
            importlib.import_module(f"{__name__}.{info.name}.export")
    return registry.model_types()
