"""Independent references for the modeling tests: Google's original graph and a numpy forward pass.

* ``original_modeling()``: Google's ``bert.modeling`` made importable on TF 2.21 (a
  ``tensorflow.contrib.layers.layer_norm`` shim with contrib's variable names and epsilon,
  and ``tf.layers.dense`` rebuilt from ``tf.compat.v1`` variables, since Keras 3 removed it).
* ``build_original_checkpoint(...)``: runs the original graph (encoder + pretraining heads
  written the way ``run_pretraining.py`` builds them) on random weights, saves a TF1
  checkpoint and returns the graph's outputs.
* ``numpy_forward(...)``: a float64 numpy BERT over Hugging Face-named weights.

The tests at the bottom check the two references against each other.
"""

from __future__ import annotations

import json
import math
import sys
import types

import numpy as np
import pytest

from original_bert import original_module

LN_EPS = 1e-12


# --------------------------------------------------------------------------- original graph


def _install_contrib_shim():
    import tensorflow as tf

    v1 = tf.compat.v1
    if "tensorflow.contrib.layers" in sys.modules:
        return

    def layer_norm(inputs, begin_norm_axis=-1, begin_params_axis=-1, scope=None):
        # Same variables (LayerNorm/beta, LayerNorm/gamma) and epsilon as tf.contrib.layers.
        with v1.variable_scope(scope, default_name="LayerNorm"):
            width = inputs.shape[-1]
            beta = v1.get_variable("beta", [width], initializer=v1.zeros_initializer())
            gamma = v1.get_variable("gamma", [width], initializer=v1.ones_initializer())
            mean, variance = tf.nn.moments(inputs, [-1], keepdims=True)
            return tf.nn.batch_normalization(inputs, mean, variance, beta, gamma, 1e-12)

    contrib = types.ModuleType("tensorflow.contrib")
    layers = types.ModuleType("tensorflow.contrib.layers")
    layers.layer_norm = layer_norm
    contrib.layers = layers
    sys.modules["tensorflow.contrib"] = contrib
    sys.modules["tensorflow.contrib.layers"] = layers


class _V1WithLayers:
    """tf.compat.v1 plus the tf.layers.dense that Keras 3 no longer provides."""

    def __init__(self, v1):
        self._v1 = v1
        self.layers = types.SimpleNamespace(dense=self._dense)

    def __getattr__(self, name):
        return getattr(self._v1, name)

    def _dense(self, inputs, units, activation=None, name=None, kernel_initializer=None):
        v1 = self._v1
        with v1.variable_scope(name, default_name="dense"):
            kernel = v1.get_variable("kernel", [inputs.shape[-1], units],
                                     initializer=kernel_initializer)
            bias = v1.get_variable("bias", [units], initializer=v1.zeros_initializer())
            out = v1.nn.bias_add(v1.matmul(inputs, kernel), bias)
            return activation(out) if activation is not None else out


def original_modeling():
    """Google's bert.modeling, runnable in tf.compat.v1 graph mode on TF 2.21."""
    import tensorflow as tf

    _install_contrib_shim()
    modeling = original_module("modeling")
    if not isinstance(modeling.tf, _V1WithLayers):
        modeling.tf = _V1WithLayers(tf.compat.v1)
    return modeling


def tiny_config_dict(**overrides):
    d = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, hidden_act="gelu", hidden_dropout_prob=0.1,
             attention_probs_dropout_prob=0.1, max_position_embeddings=64,
             type_vocab_size=2, initializer_range=0.02)
    d.update(overrides)
    return d


def tiny_inputs(config, batch=3, seq=16, num_predictions=4, seed=0):
    """Random inputs with padding (row 1 has 10 real tokens, row 2 has 5)."""
    rng = np.random.default_rng(seed)
    input_ids = rng.integers(5, config["vocab_size"], (batch, seq)).astype(np.int32)
    input_mask = np.ones((batch, seq), np.int32)
    lengths = [seq, 10, 5][:batch] + [seq] * max(0, batch - 3)
    for i, n in enumerate(lengths):
        input_mask[i, n:] = 0
        input_ids[i, n:] = 0
    segment_ids = np.zeros((batch, seq), np.int32)
    segment_ids[:, seq // 2:] = 1
    segment_ids *= input_mask
    positions = np.stack([rng.choice(min(n, seq), num_predictions, replace=False)
                          for n in lengths]).astype(np.int32)
    return dict(input_ids=input_ids, input_mask=input_mask, segment_ids=segment_ids,
                masked_lm_positions=positions)


def _original_heads(modeling, tf, bert_config, model, positions):
    """Pretraining heads built the way run_pretraining.py builds them (names and math)."""
    seq = model.get_sequence_output()
    batch, seq_length, width = modeling.get_shape_list(seq, expected_rank=3)
    offsets = tf.reshape(tf.range(0, batch, dtype=tf.int32) * seq_length, [-1, 1])
    flat = tf.gather(tf.reshape(seq, [batch * seq_length, width]),
                     tf.reshape(positions + offsets, [-1]))
    with tf.variable_scope("cls/predictions"):
        with tf.variable_scope("transform"):
            flat = tf.layers.dense(flat, units=bert_config.hidden_size,
                                   activation=modeling.get_activation(bert_config.hidden_act),
                                   kernel_initializer=modeling.create_initializer(
                                       bert_config.initializer_range))
            flat = modeling.layer_norm(flat)
        output_bias = tf.get_variable("output_bias", shape=[bert_config.vocab_size],
                                      initializer=tf.zeros_initializer())
        mlm = tf.nn.bias_add(tf.matmul(flat, model.get_embedding_table(), transpose_b=True),
                             output_bias)
    with tf.variable_scope("cls/seq_relationship"):
        weights = tf.get_variable("output_weights", shape=[2, bert_config.hidden_size],
                                  initializer=modeling.create_initializer(
                                      bert_config.initializer_range))
        bias = tf.get_variable("output_bias", shape=[2], initializer=tf.zeros_initializer())
        nsp = tf.nn.bias_add(tf.matmul(model.get_pooled_output(), weights, transpose_b=True),
                             bias)
    return tf.reshape(mlm, [batch, -1, bert_config.vocab_size]), nsp


def run_original_graph(config_dict, inputs, *, checkpoint=None, save_to=None, seed=0,
                       with_heads=True, optimizer_slots=False):
    """Builds the original graph, fills it (random or from ``checkpoint``), runs it.

    Args:
      config_dict: Google-format config.
      inputs: dict of numpy arrays (``tiny_inputs``).
      checkpoint: TF1 prefix to restore with a Saver; None -> random weights.
      save_to: prefix to save the (random) weights to, with a Saver.
      seed: numpy seed of the random weights.
      with_heads: also build the pretraining heads.
      optimizer_slots: also save global_step and adam_m / adam_v slots (must be ignored).

    Returns:
      dict of numpy outputs: ``layers`` (list), ``pooled``, ``embedding``, and with heads
      ``mlm`` [batch, predictions, vocab] and ``nsp`` [batch, 2].
    """
    import tensorflow as tf

    modeling = original_modeling()
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        bert_config = modeling.BertConfig.from_dict(config_dict)
        model = modeling.BertModel(
            config=bert_config, is_training=False,
            input_ids=tf.constant(inputs["input_ids"]),
            input_mask=tf.constant(inputs["input_mask"]),
            token_type_ids=tf.constant(inputs["segment_ids"]),
            use_one_hot_embeddings=False)
        fetches = {"layers": model.get_all_encoder_layers(),
                   "pooled": model.get_pooled_output(),
                   "embedding": model.get_embedding_output()}
        if with_heads:
            fetches["mlm"], fetches["nsp"] = _original_heads(
                modeling, _V1WithLayers(v1), bert_config, model,
                tf.constant(inputs["masked_lm_positions"]))
        weights = v1.global_variables()
        extra = []
        if optimizer_slots:
            extra.append(v1.train.get_or_create_global_step())
            for w in weights[:3]:
                for slot in ("adam_m", "adam_v"):
                    extra.append(v1.get_variable(w.op.name + "/" + slot, shape=w.shape,
                                                 initializer=v1.zeros_initializer()))
        saver = v1.train.Saver(weights + extra)
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            if checkpoint is None:
                rng = np.random.default_rng(seed)
                for w in weights:
                    shape = w.shape.as_list()
                    scale = 0.2 if len(shape) > 1 else 0.1
                    value = rng.normal(0.0, scale, shape)
                    if w.op.name.endswith("gamma"):
                        value = 1.0 + value
                    w.load(value.astype(np.float32), sess)
            else:
                v1.train.Saver(weights).restore(sess, checkpoint)
            if save_to:
                saver.save(sess, save_to)
            return sess.run(fetches)


# --------------------------------------------------------------------------- numpy reference


def _gelu(x, form):
    if form == "gelu_exact":
        erf = np.vectorize(math.erf)
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _ln(x, w, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + LN_EPS) * w + b


def random_hf_weights(config, seed=0, with_heads=True):
    """Random weights under Hugging Face BertForPreTraining names (Linear weights [out, in])."""
    rng = np.random.default_rng(seed)
    h, inter, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    w = {}

    def put(name, shape, center=0.0):
        w[name] = (center + rng.normal(0.0, 0.2, shape)).astype(np.float32)

    put("bert.embeddings.word_embeddings.weight", (v, h))
    put("bert.embeddings.position_embeddings.weight", (config["max_position_embeddings"], h))
    put("bert.embeddings.token_type_embeddings.weight", (config["type_vocab_size"], h))

    def linear(prefix, n_out, n_in):
        put(prefix + ".weight", (n_out, n_in))
        put(prefix + ".bias", (n_out,))

    def norm(prefix):
        put(prefix + ".weight", (h,), 1.0)
        put(prefix + ".bias", (h,))

    norm("bert.embeddings.LayerNorm")
    for i in range(config["num_hidden_layers"]):
        p = f"bert.encoder.layer.{i}"
        for part in ("query", "key", "value"):
            linear(f"{p}.attention.self.{part}", h, h)
        linear(f"{p}.attention.output.dense", h, h)
        norm(f"{p}.attention.output.LayerNorm")
        linear(f"{p}.intermediate.dense", inter, h)
        linear(f"{p}.output.dense", h, inter)
        norm(f"{p}.output.LayerNorm")
    linear("bert.pooler.dense", h, h)
    if with_heads:
        linear("cls.predictions.transform.dense", h, h)
        norm("cls.predictions.transform.LayerNorm")
        put("cls.predictions.bias", (v,))
        linear("cls.seq_relationship", 2, h)
    return w


def numpy_forward(w, config, inputs, act):
    """float64 BERT forward pass over Hugging Face-named weights.

    Returns dict: ``layers`` (list of [b, s, h]), ``pooled``, and when the cls weights are
    present ``mlm`` [b, P, vocab] and ``nsp`` [b, 2].
    """
    g = {k: v.astype(np.float64) for k, v in w.items()}
    ids, mask, seg = inputs["input_ids"], inputs["input_mask"], inputs["segment_ids"]
    b, s = ids.shape
    h, n = config["hidden_size"], config["num_attention_heads"]
    d = h // n

    def lin(x, p):
        return x @ g[p + ".weight"].T + g[p + ".bias"]

    def norm(x, p):
        return _ln(x, g[p + ".weight"], g[p + ".bias"])

    x = (g["bert.embeddings.word_embeddings.weight"][ids]
         + g["bert.embeddings.position_embeddings.weight"][:s][None]
         + g["bert.embeddings.token_type_embeddings.weight"][seg])
    x = norm(x, "bert.embeddings.LayerNorm")
    bias = (1.0 - mask[:, None, None, :].astype(np.float64)) * -10000.0
    layers = []
    for i in range(config["num_hidden_layers"]):
        p = f"bert.encoder.layer.{i}"

        def heads(t):
            return t.reshape(b, s, n, d).transpose(0, 2, 1, 3)

        q = heads(lin(x, f"{p}.attention.self.query"))
        k = heads(lin(x, f"{p}.attention.self.key"))
        v = heads(lin(x, f"{p}.attention.self.value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + bias
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, h)
        x = norm(x + lin(ctx, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
        ffn = lin(_gelu(lin(x, f"{p}.intermediate.dense"), act), f"{p}.output.dense")
        x = norm(x + ffn, f"{p}.output.LayerNorm")
        layers.append(x)
    out = {"layers": layers, "pooled": np.tanh(lin(x[:, 0], "bert.pooler.dense"))}
    if "cls.predictions.bias" in g:
        pos = inputs["masked_lm_positions"]
        picked = np.take_along_axis(x, pos[:, :, None], axis=1)
        t = norm(_gelu(lin(picked, "cls.predictions.transform.dense"), act),
                 "cls.predictions.transform.LayerNorm")
        out["mlm"] = t @ g["bert.embeddings.word_embeddings.weight"].T + g["cls.predictions.bias"]
        out["nsp"] = lin(out["pooled"], "cls.seq_relationship")
    return out


def hf_weights_to_tf1(w):
    """Hugging Face names/layout -> original TF1 names/layout (test-side, for cross-checks)."""
    out = {}
    for name, value in w.items():
        tf1 = name.replace(".", "/").replace("/layer/", "/layer_")
        tf1 = tf1.replace("LayerNorm/weight", "LayerNorm/gamma").replace(
            "LayerNorm/bias", "LayerNorm/beta")
        if tf1.endswith("_embeddings/weight"):
            tf1 = tf1[:-len("/weight")]
        elif tf1 == "cls/predictions/bias":
            tf1 = "cls/predictions/output_bias"
        elif tf1.startswith("cls/seq_relationship/"):
            tf1 = tf1.replace("/weight", "/output_weights").replace("/bias", "/output_bias")
        elif tf1.endswith("/weight"):
            tf1, value = tf1[:-len("/weight")] + "/kernel", value.T
        out[tf1] = np.ascontiguousarray(value)
    return out


def write_tf1_checkpoint(arrays, prefix):
    """Writes name -> array as a TF1 checkpoint with tf.compat.v1 variables and a Saver."""
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        variables = [v1.get_variable(name, initializer=value) for name, value in arrays.items()]
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            v1.train.Saver(variables).save(sess, prefix)
    return prefix


def write_hf_dir(directory, weights, config_dict, hf_act):
    """A Hugging Face BERT directory: model.safetensors + config.json."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(directory / "model.safetensors"))
    hf = dict(config_dict, hidden_act=hf_act, model_type="bert", layer_norm_eps=1e-12,
              architectures=["BertForPreTraining"])
    (directory / "config.json").write_text(json.dumps(hf))
    return directory


# --------------------------------------------------------------------------- reference checks


def test_numpy_reference_matches_original_graph(tmp_path):
    """The two references agree (same weights, tanh GELU), so either can judge our model."""
    config = tiny_config_dict()
    inputs = tiny_inputs(config)
    w = random_hf_weights(config, seed=3)
    prefix = write_tf1_checkpoint(hf_weights_to_tf1(w), str(tmp_path / "bert_model.ckpt"))
    original = run_original_graph(config, inputs, checkpoint=prefix)
    ours = numpy_forward(w, config, inputs, "gelu_tanh")
    for a, b in zip(original["layers"], ours["layers"]):
        np.testing.assert_allclose(a, b, atol=1e-4)
    np.testing.assert_allclose(original["mlm"], ours["mlm"], atol=1e-4)
    np.testing.assert_allclose(original["nsp"], ours["nsp"], atol=1e-4)


def test_gelu_forms_differ():
    x = np.linspace(-3, 3, 13)
    assert np.abs(_gelu(x, "gelu_exact") - _gelu(x, "gelu_tanh")).max() > 1e-4


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
