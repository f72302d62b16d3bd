"""The paper's feature-based approach and sentence embeddings: text lines -> contextual token vectors of chosen layers, as Google's extract_features.py writes them, or one pooled vector per text.

`extract` holds the examples and features, running the encoder over them (length-bucketed,
under any strategy), the JSON line of each and the pooled vector of each text;
`extract_features.py` is its runner. `export` is the `embedding` serving family (one vector
per raw string, in-graph).
"""
