"""One package per task family: what it reads, its features, loop task, metrics and outputs.

`classification/` (GLUE, XNLI, custom tables), `squad/` (span extraction), and the others
beside them. `data_prep/` keeps what is generic (tokenization, vocab, record schema,
pretraining data), `training/` the task-agnostic machinery and `modeling/` the network.
"""
