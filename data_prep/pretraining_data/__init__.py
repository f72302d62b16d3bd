"""Pretraining instances from raw text: one implementation, whatever drives it.

The algorithm is Google's `create_pretraining_data.py`, step for step and random draw for
random draw: given the same documents and a `random.Random` in the same state, these
modules produce exactly the original's instances (tests compare them). Both drivers, the
local process pool (`data_prep.create_pretraining_data`) and the Apache Beam pipeline
(`data_prep.beam_pretraining_data`), run them. One module per job:

* `config`: the generation settings (`PretrainingConfig`, named as the original's flags);
* `documents`: reading: input files cut into chunks at document boundaries
  (`plan_chunks`), byte ranges read into documents of token ids (`read_documents`);
* `instances`: documents -> instances (segment packing, NSP pairs, truncation), built by
  one inlined loop over offsets into the chunk's flat token list (`CompactInstances`),
  so truncating a multi-megabyte line is linear, not quadratic, and nothing is copied;
* `masking`: the 80/10/10 masked-LM rule, whole-word masking; drawn exactly as the
  original (one Python draw per candidate position) or vectorised with numpy for a whole
  chunk (`mask_vectorized`: the same rules and distribution, other draws);
* `draws`: the random draws: CPython's shuffle and randint inlined (the same numbers,
  faster), and the generators of each unit of work (`chunk_rng`, `chunk_masking_rng`);
* `records`: a chunk's instances serialised to tf.train.Example bytes at once with numpy
  (`CompactSerializer`), then TFRecord-framed by `features.frame_concatenated`;
* `stats`: the counts behind the run summary;
* `chunks`: one unit of work end to end (`process_chunk`: read, tokenize, build,
  serialise, frame), so chunks run in parallel processes and memory does not grow with
  the corpus.

No TensorFlow here (worker processes never import it); numpy only. Randomness is always
an injected generator. The original's per-instance formulation (instances as objects, one
function per document) is kept as a readable reference in tests/reference_instances.py,
where the tests compare the two.
"""
