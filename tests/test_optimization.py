"""The optimizer and schedule against Google's original `bert.optimization` (TF1 graph mode)."""

import contextlib
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from modeling import optimization
from training import checkpointing
from tests.original_bert import original_module

# name -> shape; names chosen so the original's regex exclusion and ours agree.
VARS = {
    "encoder/layer_0/dense/kernel": (3, 4),
    "encoder/layer_0/dense/bias": (4,),
    "encoder/layer_0/LayerNorm/gamma": (4,),
    "encoder/embeddings/word_embeddings": (5, 4),
}
STEPS = 4


def _initial_values():
    rng = np.random.default_rng(0)
    return {n: rng.normal(size=s).astype(np.float32) for n, s in VARS.items()}


def _gradients():
    rng = np.random.default_rng(1)
    return [{n: rng.normal(size=s).astype(np.float32) * 3 for n, s in VARS.items()}
            for _ in range(STEPS)]


def _run_original(lr_fn, weight_decay_rate):
    opt_mod = original_module("optimization")
    init, grads = _initial_values(), _gradients()
    graph = tf.Graph()
    with graph.as_default():
        tv1 = tf.compat.v1
        variables = {n: tv1.get_variable(n, initializer=init[n]) for n in VARS}
        lr = tv1.placeholder(tf.float32, [])
        feeds = {n: tv1.placeholder(tf.float32, VARS[n]) for n in VARS}
        optimizer = opt_mod.AdamWeightDecayOptimizer(
            learning_rate=lr, weight_decay_rate=weight_decay_rate, beta_1=0.9, beta_2=0.999,
            epsilon=1e-6, exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"])
        names = list(VARS)
        g_list = [feeds[n] for n in names]
        clipped, _ = tf.clip_by_global_norm(g_list, clip_norm=1.0)
        train_op = optimizer.apply_gradients(zip(clipped, [variables[n] for n in names]))
        with tv1.Session(graph=graph) as sess:
            sess.run(tv1.global_variables_initializer())
            for step in range(STEPS):
                feed = {feeds[n]: grads[step][n] for n in names}
                feed[lr] = lr_fn(step)
                sess.run(train_op, feed)
            return {n: sess.run(variables[n]) for n in names}


class _Holder(keras.layers.Layer):
    """Creates variables whose Keras paths equal the names in VARS."""

    def __init__(self, init, **kwargs):
        super().__init__(**kwargs)
        self.vars = {}
        for name, value in init.items():
            *scopes, leaf = name.split("/")
            with contextlib.ExitStack() as stack:
                for scope in scopes:
                    stack.enter_context(keras.name_scope(scope))
                self.vars[name] = keras.Variable(value, name=leaf)


def _run_ours(learning_rate, weight_decay_rate, fused=True, bias_correction=False):
    init, grads = _initial_values(), _gradients()
    holder = _Holder(init)
    variables = [holder.vars[n] for n in VARS]
    optimizer = optimization.AdamWeightDecay(
        learning_rate=learning_rate, weight_decay_rate=weight_decay_rate, global_clipnorm=1.0,
        fused=fused, bias_correction=bias_correction)
    for step in range(STEPS):
        optimizer.apply([tf.constant(grads[step][n]) for n in VARS], variables)
    return {n: v.numpy() for n, v in zip(VARS, variables)}


def test_variable_paths_are_the_names():
    holder = _Holder(_initial_values())
    assert [v.path for v in holder.vars.values()] == list(VARS)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("weight_decay_rate", [0.0, 0.01, 0.3])
def test_adam_weight_decay_matches_original(weight_decay_rate, fused):
    schedule = optimization.WarmupLinearDecay(0.1, num_train_steps=10, num_warmup_steps=2)
    rates = [float(schedule(s)) for s in range(STEPS)]
    expected = _run_original(rates.__getitem__, weight_decay_rate)
    got = _run_ours(schedule, weight_decay_rate, fused)
    init = _initial_values()
    for name in VARS:
        assert not np.allclose(init[name], got[name]), name  # the test moves every variable
        # The fused kernel computes 1 - beta2 in float32 (0.999f gives 0.0009999871, the
        # original 0.001): updates differ by ~1e-5 relative; the unfused rule matches to ulps.
        tol = dict(rtol=2e-5, atol=2e-5) if fused else dict(rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[name], expected[name], err_msg=name, **tol)
        if fused:  # still far closer than one step's update (~lr = 0.05)
            assert np.abs(got[name] - expected[name]).max() < 1e-5


@pytest.mark.parametrize("bias_correction", [False, True])
def test_a_traced_update_makes_its_scalars_once_for_all_variables(bias_correction):
    """In a traced step every variable's fused kernel reads the same scalar tensors (rate,
    beta powers, betas, epsilon) and every decayed variable the same lr * decay rate: made
    once per update, not once per variable (the values `test_adam_weight_decay_matches_
    original` checks)."""
    holder = _Holder(_initial_values())
    variables = list(holder.vars.values())
    optimizer = optimization.AdamWeightDecay(
        learning_rate=optimization.WarmupLinearDecay(0.1, 10, 2), weight_decay_rate=0.01,
        global_clipnorm=1.0, bias_correction=bias_correction)
    optimizer.build(variables)

    @tf.function
    def step(grads):
        optimizer.apply(grads, variables)

    graph = step.get_concrete_function([tf.TensorSpec(v.shape) for v in variables]).graph
    kernels = [op for op in graph.get_operations() if op.type == "ResourceApplyAdam"]
    assert len(kernels) == len(VARS)
    for slot in ("lr", "beta1_power", "beta2_power", "beta1", "beta2", "epsilon"):
        index = [arg.name for arg in kernels[0].op_def.input_arg].index(slot)
        assert len({op.inputs[index].ref() for op in kernels}) == 1, slot
    decays = {op.inputs[0].ref() for op in graph.get_operations()
              if op.type == "Mul" and op.outputs[0].consumers()
              and op.outputs[0].consumers()[0].type == "AssignSubVariableOp"}
    assert len(decays) == 1  # kernel and word_embeddings decay (LayerNorm, bias do not)
    assert optimizer._step.scalars is None  # nothing kept after the update


def _run_torch_adamw(rates, weight_decay_rate):
    """PyTorch's own AdamW (bias-corrected; decoupled decay lr * wd * w) on the same
    gradients, clipped to global norm 1 as ours are, decay off for LayerNorm and biases."""
    import torch

    init, grads = _initial_values(), _gradients()
    params = {n: torch.nn.Parameter(torch.tensor(v)) for n, v in init.items()}
    decayed = [p for n, p in params.items() if not (n.endswith("bias") or "LayerNorm" in n)]
    plain = [p for n, p in params.items() if n.endswith("bias") or "LayerNorm" in n]
    optimizer = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": weight_decay_rate},
         {"params": plain, "weight_decay": 0.0}], lr=rates[0], betas=(0.9, 0.999), eps=1e-6)
    for step in range(STEPS):
        for group in optimizer.param_groups:
            group["lr"] = rates[step]
        for name, param in params.items():
            param.grad = torch.tensor(grads[step][name])
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        optimizer.step()
    return {n: p.detach().numpy() for n, p in params.items()}


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("weight_decay_rate", [0.0, 0.3])
def test_adamw_bias_corrected_matches_pytorchs_adamw(weight_decay_rate, fused):
    """`--optimizer=adamw_bias_corrected` is PyTorch's AdamW step for step; the original
    rule (`adamw`) is not (its first steps are 3-6x larger), so the comparison can fail."""
    schedule = optimization.WarmupLinearDecay(0.1, num_train_steps=10, num_warmup_steps=2)
    rates = [float(schedule(s)) for s in range(STEPS)]
    expected = _run_torch_adamw(rates, weight_decay_rate)
    optimizer = optimization.create_optimizer(optimization.OptimizerConfig(
        optimizer="adamw_bias_corrected", learning_rate=0.1, num_train_steps=10,
        num_warmup_steps=2, weight_decay_rate=weight_decay_rate), pre_reduced_gradients=False)
    assert optimizer.bias_correction and optimizer.global_clipnorm == 1.0
    got = _run_ours(schedule, weight_decay_rate, fused, bias_correction=True)
    original = _run_ours(schedule, weight_decay_rate, fused)
    for name in VARS:
        # fused: 1 - beta2 formed in float32 inside the kernel (~1e-5 relative, as above)
        np.testing.assert_allclose(got[name], expected[name], rtol=2e-5, atol=2e-5 if fused
                                   else 2e-6, err_msg=name)
        assert np.abs(original[name] - expected[name]).max() > 1e-2, name


def test_decay_skips_layer_norm_and_bias():
    init = _initial_values()
    holder = _Holder(init)
    variables = list(holder.vars.values())
    optimizer = optimization.AdamWeightDecay(learning_rate=0.5, weight_decay_rate=0.1)
    optimizer.apply([tf.zeros_like(v) for v in variables], variables)
    for name, var in holder.vars.items():
        decayed = not np.allclose(var.numpy(), init[name])
        assert decayed == (name.endswith("kernel") or name.endswith("word_embeddings")), name


def test_schedule_matches_original_polynomial_decay_with_warmup():
    peak, total, warmup = 1e-3, 50, 10
    schedule = optimization.WarmupLinearDecay(peak, total, warmup)
    for step in [0, 1, 5, 9, 10, 11, 30, 49, 50, 60]:
        if step < warmup:
            expected = peak * step / warmup
        else:
            expected = peak * (1 - min(step, total) / total)
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_schedule_and_optimizer_serialise():
    schedule = optimization.WarmupLinearDecay(2e-5, 100, 10)
    restored = keras.optimizers.schedules.deserialize(
        json.loads(json.dumps(keras.optimizers.schedules.serialize(schedule))))
    assert float(restored(5)) == pytest.approx(float(schedule(5)))
    for name in ["adamw", "adamw_bias_corrected", "lamb"]:
        opt = optimization.create_optimizer(optimization.OptimizerConfig(optimizer=name))
        config = json.loads(json.dumps(keras.optimizers.serialize(opt)))
        clone = keras.optimizers.deserialize(config)
        assert type(clone) is type(opt)
        assert clone.weight_decay_rate == opt.weight_decay_rate
        assert clone.global_clipnorm == 1.0


def test_lamb_excludes_same_variables():
    init = _initial_values()
    holder = _Holder(init)
    variables = list(holder.vars.values())
    opt = optimization.create_optimizer(
        optimization.OptimizerConfig(optimizer="lamb", learning_rate=0.1, num_warmup_steps=0),
        pre_reduced_gradients=False)
    assert isinstance(opt, optimization.BertLamb)
    opt.build(variables)
    used = {v.path: opt.decays(v) for v in variables}
    assert used == {n: not (n.endswith("bias") or "LayerNorm" in n) for n in VARS}
    assert {v.path: opt.uses_layer_adaptation(v) for v in variables} == used


# LAMB against a numpy reference of the paper. Variables beyond VARS: one that starts at
# zero (||w|| = 0: trust ratio 1 on the first step) and one whose gradient is always zero
# (with no decay its update is 0: ||r|| = 0, ratio 1, and it must not become NaN).
LAMB_VARS = dict(VARS, **{"encoder/layer_0/output/dense/kernel": (4, 3),
                          "encoder/pooler/dense/kernel": (2, 3)})
ZERO_INIT = "encoder/layer_0/output/dense/kernel"
ZERO_GRAD = "encoder/pooler/dense/kernel"
LAMB_STEPS = 5


def _lamb_problem():
    rng = np.random.default_rng(3)
    init = {n: rng.normal(size=s).astype(np.float32) for n, s in LAMB_VARS.items()}
    init[ZERO_INIT][...] = 0.0
    grads = []
    for _ in range(LAMB_STEPS):
        step = {n: (rng.normal(size=s) * 3).astype(np.float32) for n, s in LAMB_VARS.items()}
        step[ZERO_GRAD][...] = 0.0
        grads.append(step)
    return init, grads


def _lamb_reference(init, grads, rates, weight_decay_rate, *, decay_inside=True,
                    exclude_adaptation=True, bias_correction=True, clip_norm=1.0):
    """You et al. 2019, Algorithm 2 (phi = identity) in float64, with BERT's exclusions.

    The keyword switches give the variants the test must tell apart: Keras' LAMB (decay
    outside the trust ratio, every variable adapted) and the uncorrected moments of the
    paper's early drafts.
    """
    beta1, beta2, eps = 0.9, 0.999, 1e-6
    w = {n: v.astype(np.float64) for n, v in init.items()}
    m = {n: np.zeros_like(v) for n, v in w.items()}
    v = {n: np.zeros_like(x) for n, x in w.items()}
    for t, (g32, lr) in enumerate(zip(grads, rates), start=1):
        g = {n: x.astype(np.float64) for n, x in g32.items()}
        norm = np.sqrt(sum((x ** 2).sum() for x in g.values()))
        scale = clip_norm / max(norm, clip_norm)  # tf.clip_by_global_norm
        for name in w:
            excluded = "LayerNorm" in name or "bias" in name
            m[name] = beta1 * m[name] + (1 - beta1) * g[name] * scale
            v[name] = beta2 * v[name] + (1 - beta2) * (g[name] * scale) ** 2
            m_hat = m[name] / (1 - beta1 ** t) if bias_correction else m[name]
            v_hat = v[name] / (1 - beta2 ** t) if bias_correction else v[name]
            r = m_hat / (np.sqrt(v_hat) + eps)
            decay = 0.0 if excluded else weight_decay_rate * w[name]
            if decay_inside:
                r = r + decay
            ratio = 1.0
            if not (excluded and exclude_adaptation):
                w_norm, r_norm = np.linalg.norm(w[name]), np.linalg.norm(r)
                ratio = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
            new = w[name] - lr * ratio * r
            if not decay_inside:
                new = new - lr * decay
            w[name] = new
    return w


def _lamb_ours(init, grads, weight_decay_rate):
    """`--optimizer=lamb` as the runners build it: warmup to 0.1 over 2 of 10 steps."""
    holder = _Holder(init)
    variables = [holder.vars[n] for n in LAMB_VARS]
    optimizer = optimization.create_optimizer(optimization.OptimizerConfig(
        optimizer="lamb", learning_rate=0.1, num_train_steps=10, num_warmup_steps=2,
        weight_decay_rate=weight_decay_rate), pre_reduced_gradients=False)
    for step in range(LAMB_STEPS):
        optimizer.apply([tf.constant(grads[step][n]) for n in LAMB_VARS], variables)
    return {n: v.numpy() for n, v in zip(LAMB_VARS, variables)}


@pytest.mark.parametrize("weight_decay_rate", [0.0, 0.01, 0.5])
def test_bert_lamb_matches_numpy_reference_of_the_paper(weight_decay_rate):
    init, grads = _lamb_problem()
    schedule = optimization.WarmupLinearDecay(0.1, num_train_steps=10, num_warmup_steps=2)
    rates = [float(schedule(s)) for s in range(LAMB_STEPS)]
    got = _lamb_ours(init, grads, weight_decay_rate)
    expected = _lamb_reference(init, grads, rates, weight_decay_rate)
    for name in LAMB_VARS:
        assert np.all(np.isfinite(got[name])), name
        # float32 arithmetic on O(1) values over 5 steps: errors of a few ulps (~1e-7).
        np.testing.assert_allclose(got[name], expected[name], rtol=2e-6, atol=2e-7,
                                   err_msg=name)
    moved = {n for n in LAMB_VARS if not np.allclose(got[n], init[n])}
    if weight_decay_rate:
        assert moved == set(LAMB_VARS)  # the zero-gradient kernel moves by its decay alone
    else:
        assert moved == set(LAMB_VARS) - {ZERO_GRAD}
        np.testing.assert_array_equal(got[ZERO_GRAD], init[ZERO_GRAD])

    # The reference tells the rule apart from its variants by far more than the tolerance.
    variants = [dict(exclude_adaptation=False), dict(bias_correction=False)]
    if weight_decay_rate:
        variants.append(dict(decay_inside=False))
    for variant in variants:
        other = _lamb_reference(init, grads, rates, weight_decay_rate, **variant)
        worst = max(np.abs(other[n] - got[n]).max() for n in LAMB_VARS)
        assert worst > 1e-3, variant


def test_bert_lamb_zero_norm_variable_takes_a_plain_adam_step():
    # ||w|| = 0: ratio 1, so the first update is lr * m_hat / (sqrt(v_hat) + eps), i.e.
    # lr * g / (|g| + eps) elementwise after bias correction (no clipping here).
    holder = _Holder({"encoder/dense/kernel": np.zeros((2, 3), np.float32)})
    variable = holder.vars["encoder/dense/kernel"]
    grad = np.array([[0.5, -2.0, 1e-3], [3.0, -0.25, 0.0]], np.float32)
    optimizer = optimization.BertLamb(learning_rate=0.01, weight_decay_rate=0.01)
    optimizer.apply([tf.constant(grad)], [variable])
    np.testing.assert_allclose(variable.numpy(), -0.01 * grad / (np.abs(grad) + 1e-6),
                               rtol=1e-6)


def _tracked(variables):
    """A checkpointable object holding the (tf) variables of Keras variables, by position."""
    return tf.train.Checkpoint(**{f"v{i}": v.value for i, v in enumerate(variables)})


def test_an_unbuilt_optimizer_is_not_checkpointed():
    """It has no moments yet: its checkpoint would silently hold only the step count."""
    with pytest.raises(ValueError, match="build the optimizer"):
        checkpointing.optimizer_state(optimization.AdamWeightDecay(learning_rate=0.1))


@pytest.mark.parametrize("make", [
    lambda: optimization.BertLamb(learning_rate=0.05, weight_decay_rate=0.01),
    lambda: optimization.AdamWeightDecay(learning_rate=0.05, bias_correction=True)],
    ids=["lamb", "adamw_bias_corrected"])
def test_bias_corrected_state_survives_a_checkpoint(tmp_path, make):
    """The step count the bias correction reads is in the checkpoint: a restored optimizer
    takes the next step bit for bit as the uninterrupted one."""
    init, grads = _lamb_problem()
    holder = _Holder(init)
    variables = [holder.vars[n] for n in LAMB_VARS]
    optimizer = make()
    for step in range(3):
        optimizer.apply([tf.constant(grads[step][n]) for n in LAMB_VARS], variables)
    path = tf.train.Checkpoint(model=_tracked(variables),
                              optimizer=checkpointing.optimizer_state(optimizer)).save(
        str(tmp_path / "c"))
    names = [n for n, _ in tf.train.list_variables(path)]
    slots = [n for n in names if n.startswith("optimizer/variables/")]
    assert len(slots) >= 2 * len(LAMB_VARS)  # m and v

    fresh = _Holder({n: np.zeros_like(v) for n, v in init.items()})
    again = make()
    fresh_vars = [fresh.vars[n] for n in LAMB_VARS]
    again.build(fresh_vars)
    tf.train.Checkpoint(model=_tracked(fresh_vars),
                       optimizer=checkpointing.optimizer_state(again)).restore(
        path).assert_consumed()
    for a, b in zip(variables, fresh_vars):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert int(again.iterations.numpy()) == 3  # bias correction continues at t = 4
    for opt, vs in ((optimizer, variables), (again, fresh_vars)):
        opt.apply([tf.constant(grads[3][n]) for n in LAMB_VARS], vs)
    for a, b in zip(variables, fresh_vars):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_unknown_optimizer_is_rejected():
    with pytest.raises(ValueError, match="adamw"):
        optimization.create_optimizer(optimization.OptimizerConfig(optimizer="sgd"))


@pytest.mark.parametrize("cls,extra", [(optimization.AdamWeightDecay,
                                        {"fused": False, "bias_correction": True}),
                                       (optimization.BertLamb, {})])
def test_both_optimizers_save_every_setting_and_load_from_their_config(cls, extra):
    opt = cls(learning_rate=0.1, weight_decay_rate=0.02, beta_1=0.8, beta_2=0.99,
              epsilon=1e-7, no_decay_patterns=("norm",), pre_reduced_gradients=True,
              global_clipnorm=1.0, weight_decay=0.5, **extra)
    config = opt.get_config()
    assert "weight_decay" not in config  # the decay is weight_decay_rate, Keras' is dropped
    assert {k: config[k] for k in ("weight_decay_rate", "beta_1", "beta_2", "epsilon",
                                   "no_decay_patterns", "pre_reduced_gradients",
                                   "global_clipnorm", *extra)} == {
        "weight_decay_rate": 0.02, "beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-7,
        "no_decay_patterns": ["norm"], "pre_reduced_gradients": True,
        "global_clipnorm": 1.0, **extra}
    assert cls.from_config(config).get_config() == config
