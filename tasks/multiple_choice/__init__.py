"""Multiple choice, SWAG first: one sequence per choice, softmax across an example's choices.

`data` (SWAG's CSV and your own CSV / JSON lines, features, cached records) and `task`
(the loop's task object, the record dataset, eval and predict outputs).
"""
