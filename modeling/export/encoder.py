"""Owns the ``encoder`` serving family: text (+ text_pair) -> the bare encoder's outputs (registers at import).

Signatures: ``serving_default`` (``pooled_output``, ``sequence_output``) and
``serving_all_layers`` (plus ``encoder_outputs``) on ``text`` [+ ``text_pair``], with
``preprocess`` and ``encode`` as every family.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from modeling.encoder import BertEncoder
from modeling.export import families, registry, serving


@dataclasses.dataclass(frozen=True)
class EncoderServingConfig(families.ServingConfig):
    """``--model_type=encoder``'s settings.

    Attributes:
      text_pair: inputs are pairs (``text`` + ``text_pair``).
    """

    text_pair: bool = False

    model_type: ClassVar[str] = "encoder"


class EncoderServing(families.ServingFamily):
    """``--model_type=encoder``: text (+ text_pair) -> the bare encoder's outputs."""

    model_type = "encoder"
    config_class = EncoderServingConfig
    weights_description = "an encoder"
    flags = (families.TEXT_PAIR_FLAG,)
    exports_any_run = True

    def settings(self, given, metadata, max_seq_length):
        return {"text_pair": families.text_pair_setting(given, metadata)}

    def build_model(self, config, bert_config, dtype_policy):
        return BertEncoder(bert_config, dtype=dtype_policy)

    def check_model(self, model, config):
        families.expect_model(model, BertEncoder, config)

    def signatures(self, module):
        text_pair = module.config.text_pair
        sigs = serving.text_signatures(module, lambda f: module.encode(f, layers=False), text_pair)
        # Every layer's output is large (MiniLM: ~38 MB for 32 rows of 128): on request.
        sigs["serving_all_layers"] = serving.text_function(module, module.encode, text_pair)
        return sigs


FAMILY = registry.register(EncoderServing())
