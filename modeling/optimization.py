"""Owns BERT's optimizers: warmup + linear decay, the original AdamWeightDecay, BERT's LAMB.

The original's update (Google BERT `optimization.py`), per variable, per step:

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g^2
    update = m / (sqrt(v) + epsilon)            # no bias correction
    update += weight_decay_rate * w             # unless the variable is LayerNorm or a bias
    w -= learning_rate * update

after clipping all gradients together to global norm 1.0. The learning rate rises linearly
from 0 over `num_warmup_steps`, then (from the peak) falls linearly to 0 at
`num_train_steps`.

`--optimizer=adamw_bias_corrected`: the same rule with Adam's bias correction (PyTorch's
AdamW); the original's first steps are 3-6x larger (docs/pretraining.md).

`--optimizer=lamb` selects `BertLamb`: LAMB as large-batch BERT pretraining uses it (You et
al. 2019; NVIDIA's and Model Garden's BERT): bias-corrected Adam moments, the weight decay
added to the update before the layer-wise trust ratio ||w|| / ||update||, and LayerNorm and
bias variables excluded from both (see the class docstring).

Gradient reduction: the training loop (`training/loop.py`) all-reduces gradients across
replicas itself, before they reach the optimizer, so global-norm clipping sees the global
gradient. Optimizers built here therefore skip Keras' own cross-replica sum
(`pre_reduced_gradients=True`); pass `pre_reduced_gradients=False` to use them with
`model.fit`.
"""

from __future__ import annotations

import math
import types

import keras
import tensorflow as tf
from keras import ops

from modeling.config import DEFAULT_NO_DECAY, OptimizerConfig


@keras.saving.register_keras_serializable(package="bert")
class WarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to `peak_learning_rate`, then linear decay to 0 at `num_train_steps`.

    At step s: warmup (s < num_warmup_steps) gives peak * s / num_warmup_steps; otherwise
    peak * (1 - min(s, num_train_steps) / num_train_steps), exactly the original's
    `polynomial_decay(power=1)` blended with its warmup.
    """

    def __init__(self, peak_learning_rate, num_train_steps, num_warmup_steps=0, name=None):
        super().__init__()
        self.peak_learning_rate = float(peak_learning_rate)
        self.num_train_steps = int(num_train_steps)
        self.num_warmup_steps = int(num_warmup_steps)
        self.name = name

    def __call__(self, step):
        step = ops.cast(step, "float32")
        peak = ops.cast(self.peak_learning_rate, "float32")
        total = max(self.num_train_steps, 1)
        decayed = peak * (1.0 - ops.minimum(step, float(total)) / float(total))
        if self.num_warmup_steps <= 0:
            return decayed
        warmup = peak * step / float(self.num_warmup_steps)
        return ops.where(step < float(self.num_warmup_steps), warmup, decayed)

    def get_config(self):
        return {
            "peak_learning_rate": self.peak_learning_rate,
            "num_train_steps": self.num_train_steps,
            "num_warmup_steps": self.num_warmup_steps,
            "name": self.name,
        }


class _BertAdamBase(keras.optimizers.Optimizer):
    """What AdamWeightDecay and BertLamb share: Adam's settings and moments (m, v), weight
    decay excluded by variable path, (optionally) pre-reduced gradients, the config.

    Args:
      learning_rate: float or `LearningRateSchedule`.
      weight_decay_rate: decoupled decay coefficient.
      beta_1, beta_2, epsilon: Adam moments.
      no_decay_patterns: variables whose path contains any of these get no decay.
      pre_reduced_gradients: True when the caller sums gradients across replicas itself.
      **kwargs: other `keras.optimizers.Optimizer` arguments (e.g. `global_clipnorm`);
        Keras' own `weight_decay` is dropped (the decay here is `weight_decay_rate`).
    """

    def __init__(self, learning_rate, weight_decay_rate=0.01, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-6, no_decay_patterns=DEFAULT_NO_DECAY, pre_reduced_gradients=False,
                 **kwargs):
        kwargs.pop("weight_decay", None)
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.weight_decay_rate = float(weight_decay_rate)
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)
        self.no_decay_patterns = tuple(no_decay_patterns or ())
        self.pre_reduced_gradients = bool(pre_reduced_gradients)

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._m, self._v = self.add_optimizer_variables(var_list, ["m", "v"])

    def decays(self, variable) -> bool:
        """Whether `variable` gets the weight decay: not when its path contains one of
        `no_decay_patterns` (LayerNorm and bias variables by default, as the original)."""
        return not any(pattern in _variable_path(variable)
                       for pattern in self.no_decay_patterns)

    def _all_reduce_sum_gradients(self, grads_and_vars):
        # The loop has already summed gradients across replicas (see module docstring).
        if self.pre_reduced_gradients:
            return list(grads_and_vars)
        return super()._all_reduce_sum_gradients(grads_and_vars)

    def get_config(self):
        config = super().get_config()
        config.pop("weight_decay", None)
        config.update({
            "weight_decay_rate": self.weight_decay_rate,
            "beta_1": self.beta_1,
            "beta_2": self.beta_2,
            "epsilon": self.epsilon,
            "no_decay_patterns": list(self.no_decay_patterns),
            "pre_reduced_gradients": self.pre_reduced_gradients,
        })
        return config


def _handle(variable):
    """The resource handle of a Keras or tf variable (per device inside strategy updates)."""
    return getattr(variable, "value", variable).handle if not isinstance(
        variable, tf.Variable) else variable.handle


def _one_minus_power(beta, step):
    """1 - beta^step, accurate to float32 rounding of the result.

    In float32, 1 - 0.999f**1 is 0.0009999871 (0.999 is not representable), 1.3e-5 off the
    true 0.001; as -expm1(step * log(beta)) with log(beta) taken in float64, the error is
    a few ulps, so the bias correction is the paper's.
    """
    return -ops.expm1(step * math.log(beta))


def _variable_path(variable):
    return getattr(variable, "path", None) or variable.name


@keras.saving.register_keras_serializable(package="bert")
class AdamWeightDecay(_BertAdamBase):
    """The original BERT Adam: no bias correction, decoupled weight decay skipped by path;
    with `bias_correction=True`, AdamW as PyTorch and Hugging Face define it.

    Args:
      learning_rate: float or `LearningRateSchedule`.
      weight_decay_rate: decoupled decay coefficient (multiplied by the learning rate).
      beta_1, beta_2, epsilon: Adam moments; the original uses 0.9, 0.999, 1e-6.
      no_decay_patterns: variables whose path contains any of these get no decay.
      pre_reduced_gradients: True when the caller sums gradients across replicas itself.
      fused: use TensorFlow's fused Adam kernel (same rule, ~3x less optimizer time; it
        forms 1 - beta_2 in float32, 0.0009999871 for 0.999, so updates differ from the
        unfused rule by ~1e-5 relative).
      bias_correction: divide the moments by 1 - beta^t (t = the update's number, from 1):
        `lr * m_hat / (sqrt(v_hat) + epsilon)`. False (the original) leaves them as they are.
      **kwargs: other `keras.optimizers.Optimizer` arguments (e.g. `global_clipnorm`).
    """

    def __init__(self, learning_rate=1e-4, weight_decay_rate=0.01, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-6, no_decay_patterns=DEFAULT_NO_DECAY, pre_reduced_gradients=False,
                 fused=True, bias_correction=False, name="adam_weight_decay", **kwargs):
        super().__init__(learning_rate, weight_decay_rate, beta_1, beta_2, epsilon,
                         no_decay_patterns, pre_reduced_gradients, name=name, **kwargs)
        self.fused = bool(fused)
        self.bias_correction = bool(bias_correction)
        # The fused kernel's scalars of the `apply` running, by (dtype, device): made once
        # per update, not per variable (~10 ops each in a traced step; the same values). A
        # plain namespace: the optimizer's attribute tracking keeps it out of checkpoints.
        self._step = types.SimpleNamespace(scalars=None)

    def apply(self, grads, trainable_variables=None):
        """Keras' `apply`, sharing the fused kernel's scalars across the variables."""
        self._step.scalars = {}
        try:
            return super().apply(grads, trainable_variables)
        finally:
            self._step.scalars = None

    def _corrections(self, dtype):
        """(1 - beta_1^t, 1 - beta_2^t) for this update's step t = iterations + 1 with
        bias correction; (1.0, 1.0) for the original, which has none."""
        if not self.bias_correction:
            return 1.0, 1.0
        step = ops.cast(self.iterations + 1, dtype)
        return _one_minus_power(self.beta_1, step), _one_minus_power(self.beta_2, step)

    def _fused_scalars(self, learning_rate, dtype):
        """The fused kernel's scalars for this update (see `update_step`)."""
        lr = ops.cast(learning_rate, dtype)
        correction_1, correction_2 = self._corrections(dtype)
        return {
            "lr": lr, "decay": lr * self.weight_decay_rate,
            "beta1_power": ops.cast(1.0 - correction_1, dtype),
            "beta2_power": ops.cast(1.0 - correction_2, dtype),
            "beta1": tf.constant(self.beta_1, dtype), "beta2": tf.constant(self.beta_2, dtype),
            "epsilon": ops.cast(self.epsilon * ops.sqrt(correction_2), dtype),
        }

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        gradient = ops.cast(gradient, dtype)
        index = self._get_variable_index(variable)
        m, v = self._m[index], self._v[index]
        if self.fused:
            # w -= lr * wd * w first: the Adam part does not depend on w, so this equals
            # the original's single update. Then TensorFlow's fused Adam kernel (one pass
            # over memory instead of ~8): lr * sqrt(1 - beta2_power) / (1 - beta1_power) *
            # m / (sqrt(v) + epsilon). Beta powers 1 - correction (0 for the original) and
            # epsilon * sqrt(correction_2) make it lr * m_hat / (sqrt(v_hat) + epsilon).
            shared = self._step.scalars if self._step.scalars is not None else {}
            key = (dtype, getattr(variable, "device", None))
            if key not in shared:
                shared[key] = self._fused_scalars(learning_rate, dtype)
            scalars = shared[key]
            if self.weight_decay_rate and self.decays(variable):
                self.assign_sub(variable, scalars["decay"] * variable)
            tf.raw_ops.ResourceApplyAdam(
                var=_handle(variable), m=_handle(m), v=_handle(v),
                beta1_power=scalars["beta1_power"], beta2_power=scalars["beta2_power"],
                lr=scalars["lr"], beta1=scalars["beta1"], beta2=scalars["beta2"],
                epsilon=scalars["epsilon"], grad=tf.convert_to_tensor(gradient))
            return
        lr = ops.cast(learning_rate, dtype)
        correction_1, correction_2 = self._corrections(dtype)
        self.assign(m, self.beta_1 * m + (1.0 - self.beta_1) * gradient)
        self.assign(v, self.beta_2 * v + (1.0 - self.beta_2) * ops.square(gradient))
        # Dividing by 1.0 is exact: the original's update is unchanged.
        update = (m / correction_1) / (ops.sqrt(v / correction_2) + self.epsilon)
        if self.weight_decay_rate and self.decays(variable):
            update = update + self.weight_decay_rate * variable
        self.assign_sub(variable, lr * update)

    def get_config(self):
        config = super().get_config()
        config["fused"] = self.fused
        config["bias_correction"] = self.bias_correction
        return config


@keras.saving.register_keras_serializable(package="bert")
class BertLamb(_BertAdamBase):
    """LAMB as large-batch BERT pretraining uses it (You et al. 2019, Algorithm 2).

    "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes" (You, Li,
    Reddi et al., ICLR 2020, arXiv:1904.00962 v5, Algorithm 2), with the exclusions of
    TensorFlow Model Garden's LAMB as its BERT configs use it (LayerNorm and bias excluded
    from decay; layer adaptation excluded for the same variables). Per variable w, at step
    t = 1, 2, ...:

        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g^2
        r = (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon)   # bias-corrected
        r += weight_decay_rate * w              # decay INSIDE the trust ratio
        ratio = ||w|| / ||r||                   # 1 when either norm is 0
        w -= learning_rate * ratio * r

    Variables whose path contains one of `no_decay_patterns` (LayerNorm and bias by
    default, matched as in `AdamWeightDecay`) get neither the decay nor the layer
    adaptation: their update is plain bias-corrected Adam, ratio 1. The paper's scaling
    function phi is the identity, as in those implementations.

    Unlike `keras.optimizers.Lamb` (decay applied outside the trust ratio as
    w -= lr * wd * w, trust ratio on every variable), this is the rule BERT's LAMB
    results were obtained with.

    Args:
      learning_rate: float or `LearningRateSchedule`.
      weight_decay_rate: the paper's lambda, added to the update before the trust ratio.
      beta_1, beta_2, epsilon: Adam moments (Model Garden's BERT: 0.9, 0.999, 1e-6).
      no_decay_patterns: variables whose path contains any of these get no decay and no
        layer adaptation.
      pre_reduced_gradients: True when the caller sums gradients across replicas itself.
      **kwargs: other `keras.optimizers.Optimizer` arguments (e.g. `global_clipnorm`).
    """

    def __init__(self, learning_rate=1e-3, weight_decay_rate=0.01, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-6, no_decay_patterns=DEFAULT_NO_DECAY, pre_reduced_gradients=False,
                 name="bert_lamb", **kwargs):
        super().__init__(learning_rate, weight_decay_rate, beta_1, beta_2, epsilon,
                         no_decay_patterns, pre_reduced_gradients, name=name, **kwargs)

    def uses_layer_adaptation(self, variable) -> bool:
        """False for the variables excluded by path (the same ones that get no decay)."""
        return self.decays(variable)

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        gradient = ops.cast(gradient, dtype)
        # `iterations` counts the updates already applied: this one is step t = iterations + 1.
        step = ops.cast(self.iterations + 1, dtype)
        index = self._get_variable_index(variable)
        m, v = self._m[index], self._v[index]
        self.assign(m, self.beta_1 * m + (1.0 - self.beta_1) * gradient)
        self.assign(v, self.beta_2 * v + (1.0 - self.beta_2) * ops.square(gradient))
        m_hat = m / _one_minus_power(self.beta_1, step)
        v_hat = v / _one_minus_power(self.beta_2, step)
        update = m_hat / (ops.sqrt(v_hat) + self.epsilon)
        if self.uses_layer_adaptation(variable):
            if self.weight_decay_rate:
                update = update + self.weight_decay_rate * variable
            w_norm = ops.sqrt(ops.sum(ops.square(variable)))
            r_norm = ops.sqrt(ops.sum(ops.square(update)))
            usable = ops.logical_and(w_norm > 0.0, r_norm > 0.0)
            # The inner where keeps 0/0 out of the graph (no NaN even where unused).
            ratio = ops.where(usable, w_norm / ops.where(usable, r_norm, 1.0), 1.0)
            update = ratio * update
        self.assign_sub(variable, lr * update)


def create_optimizer(config: OptimizerConfig, *, pre_reduced_gradients=True):
    """Builds the schedule and optimizer described by `config` (create under strategy.scope()).

    Returns:
      A `keras.optimizers.Optimizer` (AdamWeightDecay or BertLamb) with global-norm clipping.
    """
    schedule = WarmupLinearDecay(config.learning_rate, config.num_train_steps,
                                 config.num_warmup_steps)
    common = dict(
        learning_rate=schedule,
        weight_decay_rate=config.weight_decay_rate,
        beta_1=config.beta_1,
        beta_2=config.beta_2,
        epsilon=config.epsilon,
        no_decay_patterns=tuple(config.no_decay_patterns),
        pre_reduced_gradients=pre_reduced_gradients,
        global_clipnorm=config.clip_norm if config.clip_norm and config.clip_norm > 0 else None,
    )
    name = config.optimizer.lower()
    if name in ("adamw", "adam_weight_decay", "adam"):
        return AdamWeightDecay(**common)
    if name == "adamw_bias_corrected":
        return AdamWeightDecay(bias_correction=True, **common)
    if name == "lamb":
        return BertLamb(**common)
    raise ValueError("optimizer must be 'adamw', 'adamw_bias_corrected' or 'lamb', found "
                     f"{config.optimizer!r}")
