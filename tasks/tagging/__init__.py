"""Token tagging (CoNLL-2003 NER first; any tag set: POS, chunking), fine-tuned or feature-based.

`data` (the CoNLL reader, labels and tag schemes, WordPiece windows, TFRecords, prediction
files), `metrics` (conlleval, ported) and `task` (the loop's task object, the model choice
and the family `training.finetuning.run` drives).
"""
