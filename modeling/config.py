"""BertConfig: the network's hyper-parameters, to and from Google's and Hugging Face's files;
OptimizerConfig: its optimizer's (`modeling.optimization`), checked when built. TensorFlow-free:
the runners check both before they load TensorFlow.

The original numerics are named here once and handed to the layers explicitly:

* ``LAYER_NORM_EPSILON`` (1e-12), the epsilon of every LayerNorm in the original;
* ``ATTENTION_MASK_VALUE`` (-10000.0), what the original adds to the attention scores of
  padded positions;
* ``initializer_range``, the stddev of the truncated normal every layer draws its weights
  from;
* the GELU form, stored unambiguously in ``BertConfig.hidden_act``.

Activation names. ``hidden_act`` always holds one of ``ACTIVATIONS``:

    "gelu_tanh"   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), what Google's code calls "gelu"
    "gelu_exact"  x Phi(x) = 0.5 x (1 + erf(x / sqrt(2))), what Hugging Face calls "gelu"
    "relu", "tanh", "silu", "linear"

``BertConfig(hidden_act="gelu")`` and Google's ``bert_config.json`` mean "gelu_tanh";
``from_hf_config`` translates Hugging Face's names ("gelu" -> "gelu_exact", "gelu_new" /
"gelu_pytorch_tanh" / "gelu_fast" -> "gelu_tanh"). ``to_dict`` / ``to_json_file`` write
Google's format, so "gelu_tanh" goes back as "gelu" (what the original code will run) and
"gelu_exact" is written as "gelu_exact", which Google's code rejects instead of silently
running the other GELU; ``from_dict`` reads both back to the same meaning.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from typing import Any, Mapping, Sequence

from absl import logging

from data_prep.cli import UserError

LAYER_NORM_EPSILON = 1e-12
ATTENTION_MASK_VALUE = -10000.0

ACTIVATIONS = ("gelu_tanh", "gelu_exact", "relu", "tanh", "silu", "linear")

# Google's bert_config.json vocabulary (plus our own explicit names, so we read back what we write).
_GOOGLE_ACTIVATIONS = {
    "gelu": "gelu_tanh",
    "gelu_tanh": "gelu_tanh",
    "gelu_exact": "gelu_exact",
    "relu": "relu",
    "tanh": "tanh",
    "linear": "linear",
    "silu": "silu",
    "swish": "silu",
}
_TO_GOOGLE = {"gelu_tanh": "gelu"}

# Hugging Face's ACT2FN names.
_HF_ACTIVATIONS = {
    "gelu": "gelu_exact",
    "gelu_python": "gelu_exact",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
    "tanh": "tanh",
    "silu": "silu",
    "swish": "silu",
    "linear": "linear",
}
_TO_HF = {"gelu_exact": "gelu", "gelu_tanh": "gelu_new"}

GOOGLE_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "intermediate_size", "hidden_act", "hidden_dropout_prob",
    "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
    "initializer_range",
)
# This project's keys beyond Google's, with their defaults: written only when not default.
OPTIONAL_KEYS = {"causal_attention": False}


class ConfigError(UserError):
    """A BERT configuration that cannot describe a network (says which key and why)."""


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of a BERT network; the keys of Google's ``bert_config.json``.

    Attributes:
      vocab_size: rows of the word-embedding table.
      hidden_size: width of every hidden state.
      num_hidden_layers: number of transformer blocks.
      num_attention_heads: heads per block; must divide ``hidden_size``.
      intermediate_size: width of the feed-forward layer.
      hidden_act: activation of the feed-forward layer and the MLM transform, one of
        ``ACTIVATIONS`` after construction ("gelu" is read as Google's "gelu_tanh").
      hidden_dropout_prob: dropout on embeddings and on every residual branch.
      attention_probs_dropout_prob: dropout on the attention probabilities.
      max_position_embeddings: rows of the position-embedding table (longest sequence).
      type_vocab_size: rows of the token-type (segment) embedding table.
      initializer_range: stddev of the truncated-normal weight initializer.
      causal_attention: left-to-right attention (a token sees itself and the tokens
        before it; the paper's LTR model). The pooled output then reads the LAST real
        token, which has seen the whole input ([CLS] at position 0 sees only itself), as
        OpenAI GPT's classifier does. Written to ``bert_config.json`` only when true.
    """

    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 16
    initializer_range: float = 0.02
    causal_attention: bool = False

    def __post_init__(self):
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"BertConfig.{key} must be an int, found {value!r}")
            if value <= 0:
                raise ConfigError(f"BertConfig.{key} must be positive, found {value}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"BertConfig.hidden_size ({self.hidden_size}) is not a multiple of "
                f"num_attention_heads ({self.num_attention_heads})")
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, key)
            if not _finite_number(value) or not 0 <= value < 1:
                raise ConfigError(f"BertConfig.{key} must be a number in [0, 1), found {value!r}")
        rng = self.initializer_range
        if not _finite_number(rng) or rng <= 0:
            raise ConfigError(
                f"BertConfig.initializer_range must be a finite number > 0, found {rng!r}")
        if not isinstance(self.causal_attention, bool):
            raise ConfigError("BertConfig.causal_attention must be true or false, found "
                              f"{self.causal_attention!r}")
        act = self.hidden_act
        if not isinstance(act, str) or act.lower() not in _GOOGLE_ACTIVATIONS:
            raise ConfigError(
                f"BertConfig.hidden_act {act!r} is not supported; expected one of "
                f"{sorted(_GOOGLE_ACTIVATIONS)} (\"gelu\" means Google's tanh approximation)")
        # Frozen dataclass: normalise in place once, so equality and hashing see the meaning.
        object.__setattr__(self, "hidden_act", _GOOGLE_ACTIVATIONS[act.lower()])
        object.__setattr__(self, "hidden_dropout_prob", float(self.hidden_dropout_prob))
        object.__setattr__(self, "attention_probs_dropout_prob",
                           float(self.attention_probs_dropout_prob))
        object.__setattr__(self, "initializer_range", float(self.initializer_range))

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    # ----- Google's bert_config.json -----

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], *, source: str = "dict",
                  require_all: bool = False) -> "BertConfig":
        """Builds a config from Google-format keys; other keys (e.g. ``pooler_type``) are ignored.

        Args:
          values: mapping with the keys of ``bert_config.json``.
          source: where the mapping came from, for error messages.
          require_all: if True every key of ``GOOGLE_KEYS`` must be present; otherwise only
            ``vocab_size`` is required and the rest default to BERT-base.
        """
        _require_object(values, source)
        required = GOOGLE_KEYS if require_all else ("vocab_size",)
        missing = [k for k in required if k not in values]
        if missing:
            raise ConfigError(f"{source}: missing key(s) {missing}")
        kwargs = {k: values[k] for k in GOOGLE_KEYS + tuple(OPTIONAL_KEYS) if k in values}
        try:
            return cls(**kwargs)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    @classmethod
    def from_json_file(cls, path: str) -> "BertConfig":
        """Reads Google's ``bert_config.json`` (all eleven keys required)."""
        return cls.from_dict(_read_json(path), source=str(path), require_all=True)

    def to_dict(self) -> dict:
        """Google's ``bert_config.json`` keys (and the optional keys that are not at their
        defaults); "gelu_tanh" is written as Google's "gelu"."""
        d = self.explicit_dict()
        d["hidden_act"] = _TO_GOOGLE.get(self.hidden_act, self.hidden_act)
        return d

    def explicit_dict(self) -> dict:
        """Every key with our explicit activation names ("gelu_tanh" / "gelu_exact"), the
        optional keys only when not at their defaults (Keras layer configs hold this)."""
        d = dataclasses.asdict(self)
        for key, default in OPTIONAL_KEYS.items():
            if d[key] == default:
                del d[key]
        return d

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def to_json_file(self, path: str) -> None:
        """Writes the file all-or-nothing and synced (`fileio.write_text`; gs:// paths too)."""
        from data_prep import fileio

        fileio.write_text(path, self.to_json_string())

    # ----- Hugging Face config.json -----

    @classmethod
    def from_hf_config(cls, config: "Mapping[str, Any] | str | os.PathLike") -> "BertConfig":
        """Translates a Hugging Face BERT ``config.json`` (a dict, the file, or its directory)."""
        source = "Hugging Face config"
        if not isinstance(config, Mapping):
            path = os.fspath(config)
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            source = path
            config = _read_json(path)
        _require_object(config, source)
        model_type = config.get("model_type", "bert")
        if model_type != "bert":
            raise ConfigError(f"{source}: model_type {model_type!r} is not a BERT")
        position_type = config.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise ConfigError(
                f"{source}: position_embedding_type {position_type!r} is not supported "
                "(only 'absolute', as in the original BERT)")
        eps = config.get("layer_norm_eps", LAYER_NORM_EPSILON)
        if not _finite_number(eps):
            raise ConfigError(f"{source}: layer_norm_eps must be a finite number, found {eps!r}")
        if abs(eps - LAYER_NORM_EPSILON) > 1e-15:
            raise ConfigError(
                f"{source}: layer_norm_eps {eps} differs from BERT's {LAYER_NORM_EPSILON}")
        act = config.get("hidden_act", "gelu")
        if not isinstance(act, str) or act not in _HF_ACTIVATIONS:
            raise ConfigError(f"{source}: hidden_act {act!r} is not supported; expected one of "
                              f"{sorted(_HF_ACTIVATIONS)}")
        values = {k: config[k] for k in GOOGLE_KEYS if k in config}
        values["hidden_act"] = _HF_ACTIVATIONS[act]
        # Hugging Face's causal self-attention switch (BertLMHeadModel).
        if config.get("is_decoder", False):
            values["causal_attention"] = True
        return cls.from_dict(values, source=source)

    @classmethod
    def from_config_file(cls, path: str) -> "BertConfig":
        """Reads Google's ``bert_config.json`` or a Hugging Face ``config.json``.

        The two are told apart by Hugging Face's ``model_type`` key or the file name
        ``config.json``, so that each keeps its own meaning of "gelu" (module docstring).
        """
        raw = _read_json(path)
        if isinstance(raw, Mapping) and ("model_type" in raw or
                                         os.path.basename(str(path)) == "config.json"):
            return cls.from_hf_config(path)  # read again: its errors then name the file
        return cls.from_dict(raw, source=str(path), require_all=True)

    def to_hf_dict(self) -> dict:
        """A Hugging Face ``config.json`` (BertForPreTraining) describing the same network."""
        d = self.explicit_dict()
        if d.pop("causal_attention", False):
            d["is_decoder"] = True  # causal self-attention in Hugging Face's BertModel
        d["hidden_act"] = _TO_HF.get(self.hidden_act, self.hidden_act)
        d.update(model_type="bert", architectures=["BertForPreTraining"],
                 layer_norm_eps=LAYER_NORM_EPSILON, position_embedding_type="absolute",
                 pad_token_id=0)
        return d


def _require_object(values: Any, source: str) -> None:
    """ConfigError naming ``source`` unless the config is a JSON object (a mapping)."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{source}: expected a JSON object, found {type(values).__name__}")


def _read_json(path: str) -> Any:
    """The JSON value of a config file; ConfigError naming the file when it cannot be read."""
    import tensorflow as tf

    try:
        with tf.io.gfile.GFile(path, "r") as f:
            text = f.read()
    except (tf.errors.NotFoundError, FileNotFoundError):
        raise ConfigError(f"{path}: config file not found") from None
    except (tf.errors.OpError, OSError) as e:  # a directory, no permission, ...
        message = getattr(e, "message", None) or e.strerror or str(e)
        raise ConfigError(f"{path}: cannot read the config file ({message})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a JSON config file (invalid UTF-8 at byte "
                          f"{e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None


# Path fragments of variables that get no weight decay, as in the original (which matched
# TF1 names such as "bert/encoder/layer_0/output/LayerNorm/gamma" and ".../dense/bias").
DEFAULT_NO_DECAY = ("LayerNorm", "layer_norm", "bias")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """What `create_optimizer` needs; runners fill it from flags."""

    learning_rate: float = 5e-5
    num_train_steps: int = 100000
    num_warmup_steps: int = 10000
    optimizer: str = "adamw"  # or "adamw_bias_corrected", "lamb" (`create_optimizer`)
    weight_decay_rate: float = 0.01
    clip_norm: float = 1.0  # global-norm clipping; <= 0 disables it
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-6
    no_decay_patterns: Sequence[str] = DEFAULT_NO_DECAY

    def __post_init__(self):
        """Every config is checked when built, whoever builds it."""
        self.validate()
        if self.num_warmup_steps > self.num_train_steps:
            # Accepted, as the original accepts it (its schedule never leaves warmup), but
            # said: the peak rate is never reached.
            logging.warning(
                "--num_warmup_steps=%d exceeds --num_train_steps=%d: the learning rate never "
                "leaves warmup (it reaches %.3g x --learning_rate at the last step)",
                self.num_warmup_steps, self.num_train_steps,
                self.num_train_steps / self.num_warmup_steps)

    def validate(self) -> None:
        """Raises UserError naming the setting (its runners' flag of the same name) when a
        value cannot train: a rate of -1 climbs the loss, NaN poisons every weight.

        The one check of these settings, for every runner: building the config runs it.
        """
        rate = self.learning_rate
        if not _finite_number(rate) or rate <= 0:
            raise UserError(f"--learning_rate={rate}: the learning rate must be a positive, "
                            "finite number")
        for name in ("num_train_steps", "num_warmup_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise UserError(f"--{name}={value} must be a whole number >= 0")
        if not _finite_number(self.weight_decay_rate) or self.weight_decay_rate < 0:
            raise UserError(f"--weight_decay_rate={self.weight_decay_rate} must be a finite "
                            "number >= 0")
        if not _finite_number(self.clip_norm):
            raise UserError(f"--clip_norm={self.clip_norm} must be a finite number (<= 0 "
                            "turns clipping off)")


def _finite_number(value) -> bool:
    """True for a real number that is neither NaN nor infinite (bools are not numbers)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and \
        math.isfinite(value)
