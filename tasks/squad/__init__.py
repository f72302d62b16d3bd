"""Span extraction, SQuAD v1.1 and v2.0.

`data` (reading, windowed features, TFRecords), `postprocess` (logits -> answers and the
original's prediction files), `metrics` (the official evaluation) and `task` (the loop's
task object and the record dataset).
"""
