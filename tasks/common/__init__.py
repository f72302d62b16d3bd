"""What several task families share, below them: families import it, it names no family.

`windows` (doc_stride windows and the max-context rule), `delimited` (CSV/TSV records with
their line numbers), `pairs` (text-pair truncation), `classifier_task` (the loop's
softmax-classification task), `record_cache` (a split's TFRecords reused while their
metadata's key matches).
"""
