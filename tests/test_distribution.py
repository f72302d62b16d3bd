"""Strategy selection (in-process; the multi-replica runs are in test_run_pretraining.py)."""

import json

import pytest
import tensorflow as tf

from training import distribution


def test_one_device_and_default_are_strategies():
    one = distribution.get_strategy("one_device")
    assert isinstance(one, tf.distribute.OneDeviceStrategy)
    assert one.num_replicas_in_sync == 1
    default = distribution.get_strategy("default")
    assert isinstance(default, tf.distribute.Strategy)
    assert distribution.is_chief(one) and distribution.worker_id(one) == ("worker", 0)


def test_unknown_strategy_is_rejected():
    with pytest.raises(ValueError, match="one_device"):
        distribution.get_strategy("horovod")


def test_default_name_follows_the_hardware(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert distribution.default_strategy_name(num_gpus=0) == "one_device"
    assert distribution.default_strategy_name(num_gpus=4) == "mirrored"
    assert distribution.default_strategy_name(use_tpu=True) == "tpu"
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": 0}}))
    assert distribution.default_strategy_name(num_gpus=0) == "multi_worker_mirrored"


def test_logical_cpus_after_initialisation_is_a_clear_error():
    tf.constant(1.0)  # TensorFlow is initialised in this process by now
    existing = len(tf.config.list_logical_devices("CPU"))
    with pytest.raises(RuntimeError, match="before TensorFlow initialises"):
        distribution.configure_cpu_devices(existing + 1)


def test_gpus_requested_without_gpus():
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="num_gpus=2"):
        distribution.get_strategy("one_device", num_gpus=2)


def _flag_values(**overrides):
    import types
    values = dict(distribution_strategy="", use_tpu=False, tpu_name=None, master=None,
                  tpu_zone=None, gcp_project=None, num_tpu_cores=8, num_gpus=0,
                  num_cpu_devices=0, seed=None, tf_data_autotune=True)
    values.update(overrides)
    return types.SimpleNamespace(**values)


def test_use_tpu_means_the_tpu_strategy_and_master_is_the_address():
    from training import flags as common_flags
    runtime = common_flags.runtime_config(_flag_values(use_tpu=True, master="grpc://10.0.0.2"))
    assert runtime.distribution_strategy == "tpu" and runtime.tpu == "grpc://10.0.0.2"
    named = common_flags.runtime_config(_flag_values(use_tpu=True, tpu_name="my-tpu",
                                                     master="grpc://x"))
    assert named.tpu == "my-tpu"
    with pytest.raises(Exception, match="conflicts"):
        common_flags.runtime_config(_flag_values(use_tpu=True,
                                                 distribution_strategy="mirrored"))
    assert common_flags.runtime_config(_flag_values()).distribution_strategy == ""
