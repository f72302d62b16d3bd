"""The serving export: a fine-tuned model as a SavedModel serving raw strings with only TensorFlow and TF Text.

``writer.export_saved_model(model, config, export_dir)`` writes a TensorFlow SavedModel
that ``tf.saved_model.load`` serves in a process with only ``tensorflow`` and
``tensorflow_text`` (imported first, for its ops): no project code, no Keras classes.
Tokenization is ``data_prep.tf_tokenization.BertInGraphTokenizer`` baked into the graph
with the model's own vocab (also packaged as the asset ``assets/vocab.txt``) and casing.

Modules, one job each: ``metadata`` (``export_metadata.json``, the run -> export
contract, and the marker), ``registry`` (the serving families by ``model_type``),
``serving`` (the in-graph pieces signatures are built on), ``families`` (what a family
declares: the ``ServingFamily`` base and its settings), ``writer`` (the all-or-nothing
write and its checks), and two families: ``encoder`` and ``hub`` (a TF Hub encoder +
preprocessor pair, not one SavedModel).

What each ``--model_type`` exports is a *serving family*, registered at import by the
module that defines it; every task package defines its own in its ``export.py`` (its
signatures, its settings, its flags). ``tasks.register_serving_families()`` imports them
all; nothing in this package names a task family.

Signatures every single-SavedModel family shares (batch-first; strings are UTF-8
``tf.string`` [batch]):

* ``serving_default``: the task on raw strings (see each family's module);
* ``preprocess``: the same string inputs -> int32 ``input_ids``, ``input_mask``,
  ``segment_ids`` [batch, seq] (plus a family's extras);
* ``encode``: int32 ``input_ids``/``input_mask``/``segment_ids`` [batch, seq] (this
  project's input names) -> ``pooled_output`` [batch, hidden], ``sequence_output``
  [batch, seq, hidden], ``encoder_outputs`` [batch, layers, seq, hidden] (stacked:
  signatures cannot return lists). This is NOT the TF Hub encoder interface (other input
  names, stacked layers, no ``training`` argument): ``--model_type=hub`` exports that.

All float outputs are float32, whatever the compute dtype (a ``mixed_bfloat16`` model
computes in bfloat16 and casts its outputs). ``seq`` is the request's width, not
``max_seq_length`` (see ``serving``).

Adding a task family's export (the extension point)
---------------------------------------------------
1. Write ``<task package>/export.py`` with a ``families.ServingConfig`` subclass holding
   the family's own settings as fields with defaults (``model_type`` as a class
   attribute), and a ``families.ServingFamily`` subclass registered at import: ``FAMILY =
   registry.register(YourServing())``. The family declares ``model_type``,
   ``config_class``, its command-line flags (``flags``: ``FamilyFlag`` specs, which the
   CLI defines and refuses for every other family), the ``ExportMetadata`` subclass its
   runner writes (``metadata_class``, with ``model_type=FAMILY.model_type``: the
   family's runs are refused by the others) and how its settings are chosen
   (``settings(given, metadata, max_seq_length)``: the flags given, then the run's
   metadata, then its defaults), ``validate(config)``,
   ``build_model(config, bert_config, dtype_policy)``, ``check_model(model, config)`` and
   ``signatures(module)``: concrete functions by name, built on the ``serving`` helpers
   (``module.pack`` for the classifier packing, ``module.model_outputs``,
   ``text_signatures``). Override ``write`` only for a layout other than one SavedModel
   (see ``hub``).
2. Nothing else changes: ``tasks.register_serving_families()`` imports every task
   package's ``export.py``; ``export_saved_model.py``'s ``--model_type`` choices, the
   family flags, the weight checks, the overwrite rules and the atomic writer then apply.

Only the families that export the encoder every run has (``exports_any_run``: ``encoder``,
``hub``, the sentence embedding family) take any run's ``export_metadata.json``; the others
refuse another family's run (``registry.read_run_metadata``).
"""
