"""Sentence and sentence-pair classification/regression: GLUE, XNLI and custom CSV/TSV tables.

`data` (readers, features, the TFRecord cache), `metrics` (official GLUE metrics, result
and submission files) and `task` (the loop's task object and the record dataset).
"""
