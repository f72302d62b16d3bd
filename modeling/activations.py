"""The activation functions named in ``BertConfig.hidden_act``, by their unambiguous names."""

from __future__ import annotations

import math

from keras import ops

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu_tanh(x):
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

    What Google's original code computes for ``hidden_act: "gelu"``.
    """
    return ops.gelu(x, approximate=True)


def gelu_exact(x):
    """GELU, exact: x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))) (Hugging Face's "gelu")."""
    return ops.gelu(x, approximate=False)


def linear(x):
    return x


_ACTIVATIONS = {
    "gelu_tanh": gelu_tanh,
    "gelu_exact": gelu_exact,
    "relu": ops.relu,
    "tanh": ops.tanh,
    "silu": ops.silu,
    "linear": linear,
}


def get(name: str):
    """Returns the activation function for one of ``config.ACTIVATIONS``."""
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; expected one of "
                         f"{sorted(_ACTIVATIONS)}") from None
