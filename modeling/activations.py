"""The activation functions named in ``BertConfig.hidden_act``, by their unambiguous names."""

from __future__ import annotations

import math

import tensorflow as tf
from keras import ops

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_COEFF = 0.044715


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


@tf.function(jit_compile=True, autograph=False)
def _gelu_tanh_grad(dy, x, t):
    """d gelu_tanh / dx * dy, given t = tanh(sqrt(2/pi) (x + 0.044715 x^3)).

    0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), as one XLA-fused
    element-wise loop (TensorFlow's autodiff of the forward runs ~15 separate full-size ops).
    """
    half = tf.cast(0.5, x.dtype)
    one = tf.cast(1.0, x.dtype)
    slope = (tf.cast(_SQRT_2_OVER_PI, x.dtype)
             + tf.cast(3.0 * _GELU_COEFF * _SQRT_2_OVER_PI, x.dtype) * (x * x))
    return dy * (half * (one + t) + half * x * (one - t * t) * slope)


@tf.autograph.experimental.do_not_convert
@tf.custom_gradient
def _gelu_tanh_fast_grad(x):
    # Exactly the ops of tf.nn.gelu(x, approximate=True) (what ops.gelu runs), so the forward
    # values are bit-identical to gelu_tanh; only the backward is hand-written.
    coeff = tf.cast(_GELU_COEFF, x.dtype)
    t = tf.math.tanh(0.7978845608028654 * (x + coeff * tf.math.pow(x, 3)))
    y = 0.5 * x * (1.0 + t)

    def grad(dy):
        return _gelu_tanh_grad(dy, x, t)
    return y, grad


def gelu_tanh_training(x):
    """``gelu_tanh`` with a hand-written, fused gradient: same forward values, faster backward.

    For training graphs only: at inference the plain ``gelu_tanh`` lets oneDNN fuse
    MatMul + BiasAdd + GELU into one kernel, which the custom-gradient wrapper would hide.
    """
    return _gelu_tanh_fast_grad(tf.convert_to_tensor(x))


_ACTIVATIONS = {
    "gelu_tanh": gelu_tanh,
    "gelu_exact": gelu_exact,
    "relu": ops.relu,
    "tanh": ops.tanh,
    "silu": ops.silu,
    "linear": linear,
}

# Same values as _ACTIVATIONS, cheaper gradients; used when a layer is called in training.
_TRAINING_ACTIVATIONS = {"gelu_tanh": gelu_tanh_training}


def get(name: str):
    """Returns the activation function for one of ``config.ACTIVATIONS``."""
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; expected one of "
                         f"{sorted(_ACTIVATIONS)}") from None


def get_for_training(name: str):
    """Like ``get``, with a faster-gradient version of the function where there is one."""
    return _TRAINING_ACTIVATIONS.get(name) or get(name)
