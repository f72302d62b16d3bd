"""The BERT network: config, Keras 3 layers, heads, losses, optimizers, checkpoints.

Plug-ins that register on import: every layer and model class is registered with Keras as
serializable (`package="bert"`, `keras.saving.register_keras_serializable`) when its
module is imported: `embeddings`, `transformer`, `encoder`, `heads`, `models` (which
imports the four others) and `optimization` (the learning-rate schedule and optimizers).
Keras finds them by name (`bert>BertEncoder`, in a `get_config` / `from_config` or
`keras.saving` round trip) only in a process that has imported those modules. The serving
families register the same way with `modeling.export.registry` (see there).
"""
