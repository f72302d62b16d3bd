"""Sentence and sentence-pair classification/regression: GLUE, XNLI and custom CSV/TSV tables.

`processors` (the reader of each data set, by name), `readers` (delimited files ->
examples, malformed rows), `examples` (what the readers make), `data` (feature conversion,
record schema, the TFRecord cache), `metrics` (official GLUE metrics, result and
submission files), `task` (the loop's task object and the record dataset) and `export`
(the serving signatures).
"""
