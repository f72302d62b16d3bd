"""The paper's feature-based approach: text lines -> contextual token vectors of chosen layers, as Google's extract_features.py writes them.

`extract` holds the examples and features, running the encoder over them (length-bucketed,
under any strategy) and the JSON line of each; `extract_features.py` is its runner.
"""
