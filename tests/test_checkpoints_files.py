"""modeling.checkpoints on the files themselves: sharded safetensors, refused pickles, damage.

Hugging Face splits large checkpoints into `model-0000K-of-0000N.safetensors` shards listed
by `model.safetensors.index.json`; PyTorch's `pytorch_model.bin` is a pickle, which this
project refuses instead of unpickling; a damaged `.index`, `.data-*` or `.safetensors` file
gets a CheckpointError that names it.
"""

import json
import os
import pathlib
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import tensorflow as tf

from modeling import checkpoints
from modeling.checkpoints import CheckpointError, load_pretrained
from modeling.config import BertConfig
from modeling.models import BertPretrainer
from test_modeling_reference import tiny_config_dict, tiny_inputs

ROOT = str(pathlib.Path(__file__).resolve().parent.parent)


def _model(seed=0):
    config = BertConfig.from_dict(tiny_config_dict())
    model = BertPretrainer(config)
    inputs = tiny_inputs(tiny_config_dict())
    model(inputs)  # builds every weight
    rng = np.random.default_rng(seed)
    for var in model.weights:  # distinct values everywhere, biases and LayerNorm included
        var.assign(rng.normal(size=var.shape).astype(np.float32))
    return model, config


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny pretrainer exported as one model.safetensors (+ config.json)."""
    model, config = _model(seed=1)
    directory = tmp_path_factory.mktemp("hf")
    checkpoints.export_hf_checkpoint(model, config, str(directory))
    return {"dir": directory, "model": model, "config": config}


def _read_all(path):
    from safetensors.numpy import load_file
    return load_file(str(path))


def _shard(single_dir, out_dir, num_shards=3):
    """Splits single_dir/model.safetensors into shards + index, the way transformers names them."""
    from safetensors.numpy import save_file

    tensors = _read_all(single_dir / "model.safetensors")
    names = sorted(tensors)
    out_dir.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for k in range(num_shards):
        shard = f"model-{k + 1:05d}-of-{num_shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[k::num_shards]}
        save_file(part, str(out_dir / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    total = int(sum(t.nbytes for t in tensors.values()))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / checkpoints.HF_INDEX).write_text(json.dumps(index, indent=2))
    shutil.copy(single_dir / "config.json", out_dir / "config.json")
    return out_dir


def _assert_same_weights(a, b):
    assert len(a.weights) == len(b.weights)
    for x, y in zip(a.weights, b.weights):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=x.path)


# ------------------------------------------------------------------------- sharded


def test_sharded_safetensors_load_like_the_single_file(exported, tmp_path):
    sharded = _shard(exported["dir"], tmp_path / "sharded")
    assert not (sharded / "model.safetensors").exists()
    assert len(list(sharded.glob("model-*-of-00003.safetensors"))) == 3
    index = str(sharded / checkpoints.HF_INDEX)
    assert checkpoints.resolve(str(sharded)) == ("hf", index)
    assert checkpoints.resolve(index) == ("hf", index)

    single = BertPretrainer(exported["config"])
    assert load_pretrained(str(exported["dir"]), single).ok
    _assert_same_weights(single, exported["model"])
    for path in (str(sharded), index):
        model, _ = _model(seed=2)  # other weights until loaded
        report = load_pretrained(path, model)
        assert report.ok and report.kind == "hf" and report.path == index
        assert len(report.loaded) == len(checkpoints.weight_table(model))
        _assert_same_weights(model, single)

    # The helpers around the loader see the sharded directory too.
    assert checkpoints.config_for(str(sharded)) == exported["config"]
    assert checkpoints.checkpoint_has_pretraining_heads(str(sharded))
    out = checkpoints.convert(str(sharded), str(tmp_path / "tf1"), "tf1")
    again = BertPretrainer(exported["config"])
    load_pretrained(out, again)
    _assert_same_weights(again, single)


def test_sharded_errors_name_the_index_and_the_shard_or_tensor(exported, tmp_path):
    sharded = _shard(exported["dir"], tmp_path / "sharded")
    index = sharded / checkpoints.HF_INDEX
    weight_map = json.loads(index.read_text())["weight_map"]
    second = "model-00002-of-00003.safetensors"

    missing = tmp_path / "missing"
    shutil.copytree(sharded, missing)
    os.remove(missing / second)
    with pytest.raises(CheckpointError) as err:
        load_pretrained(str(missing), BertPretrainer(exported["config"]))
    assert str(missing / checkpoints.HF_INDEX) in str(err.value)
    assert f"shard {second} is missing" in str(err.value)

    # A shard that lacks a tensor the index maps to it.
    from safetensors.numpy import save_file
    lacking = tmp_path / "lacking"
    shutil.copytree(sharded, lacking)
    tensors = _read_all(lacking / second)
    dropped = sorted(tensors)[0]
    assert weight_map[dropped] == second
    del tensors[dropped]
    save_file(tensors, str(lacking / second))
    with pytest.raises(CheckpointError) as err:
        load_pretrained(str(lacking), BertPretrainer(exported["config"]))
    message = str(err.value)
    assert str(lacking / checkpoints.HF_INDEX) in message
    assert f"tensor {dropped} is mapped to shard {second}, which does not hold it" in message

    for name, text, expected in [
        ("garbage", "{not json", "not a JSON safetensors index"),
        ("no_map", json.dumps({"metadata": {}}), "\"weight_map\""),
        ("escape", json.dumps({"weight_map": {"bert.pooler.dense.bias": "../x.safetensors"}}),
         r"'\.\./x\.safetensors' \(of tensor bert\.pooler\.dense\.bias\) is not a file name"),
    ]:
        bad = tmp_path / name
        shutil.copytree(sharded, bad)
        (bad / checkpoints.HF_INDEX).write_text(text)
        with pytest.raises(CheckpointError, match=expected) as err:
            load_pretrained(str(bad), BertPretrainer(exported["config"]))
        assert str(bad / checkpoints.HF_INDEX) in str(err.value)


def test_safetensors_shards_without_an_index_are_named(exported, tmp_path):
    sharded = _shard(exported["dir"], tmp_path / "sharded")
    os.remove(sharded / checkpoints.HF_INDEX)
    with pytest.raises(CheckpointError, match="holds model-00001-of-00003.safetensors.*"
                       "neither model.safetensors nor model.safetensors.index.json"):
        checkpoints.resolve(str(sharded))


def test_half_precision_safetensors_load_as_float32(exported, tmp_path):
    # Hugging Face files are often float16 or bfloat16; numpy alone cannot read bfloat16.
    from safetensors.numpy import save_file as save_numpy
    from safetensors.tensorflow import save_file as save_tf

    tensors = _read_all(exported["dir"] / "model.safetensors")
    for dtype, save in ((tf.float16, None), (tf.bfloat16, save_tf)):
        directory = tmp_path / dtype.name
        directory.mkdir()
        shutil.copy(exported["dir"] / "config.json", directory / "config.json")
        if save is None:
            save_numpy({k: v.astype(np.float16) for k, v in tensors.items()},
                       str(directory / "model.safetensors"))
        else:
            save({k: tf.cast(v, dtype) for k, v in tensors.items()},
                 str(directory / "model.safetensors"))
        model = BertPretrainer(exported["config"])
        assert load_pretrained(str(directory), model).ok
        expected = BertPretrainer(exported["config"])
        load_pretrained(str(exported["dir"]), expected)
        for got, full in zip(model.weights, expected.weights):
            assert got.dtype == "float32"
            rounded = tf.cast(tf.cast(full.numpy(), dtype), tf.float32).numpy()
            np.testing.assert_array_equal(got.numpy(), rounded, err_msg=full.path)


def test_hf_export_and_load_on_a_url_filesystem(exported):
    # gs:// and other tf.io.gfile filesystems: TensorFlow's in-memory ram:// stands in.
    directory = "ram://checkpoints_files/hf"
    path = checkpoints.export_hf_checkpoint(exported["model"], exported["config"], directory)
    assert path == directory + "/model.safetensors"
    assert tf.io.gfile.exists(path) and tf.io.gfile.exists(directory + "/config.json")
    assert not os.path.exists("ram:")  # nothing went to a local path named like the URL
    assert checkpoints.config_for(directory) == exported["config"]
    model = BertPretrainer(exported["config"])
    assert load_pretrained(directory, model).ok
    _assert_same_weights(model, exported["model"])


# ------------------------------------------------------------------------- pickles


class _TouchOnUnpickle:
    """Unpickling an instance creates `marker`: proof that something was unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def _pickle_files(directory, marker):
    """A torch.save-style zip (pytorch_model.bin) and a bare pickle (.pt) that touch marker."""
    payload = pickle.dumps({"bert.pooler.dense.bias": _TouchOnUnpickle(marker)}, protocol=2)
    # The payload does what the test relies on: unpickling it creates the marker. (It is
    # this test's own in-memory bytes; the loader under test must never get this far.)
    pickle.loads(payload)
    assert os.path.exists(marker)
    os.remove(marker)
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(directory / "pytorch_model.bin", "w") as archive:
        archive.writestr("archive/data.pkl", payload)
    (directory / "weights.pt").write_bytes(payload)
    (directory / "config.json").write_text(json.dumps(dict(tiny_config_dict(),
                                                           model_type="bert")))
    return directory


def test_pytorch_pickles_are_refused_and_never_unpickled(tmp_path):
    marker = tmp_path / "UNPICKLED"
    directory = _pickle_files(tmp_path / "torch", marker)
    config = BertConfig.from_dict(tiny_config_dict())
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    shutil.copy(directory / "weights.pt", renamed / "model.safetensors")
    cases = [
        (str(directory), "pytorch_model.bin"),
        (str(directory / "pytorch_model.bin"), "pytorch_model.bin"),
        (str(directory / "weights.pt"), "weights.pt"),
        (str(renamed), "model.safetensors"),  # a pickle under a safetensors name
    ]
    for path, named in cases:
        with pytest.raises(CheckpointError) as err:
            load_pretrained(path, BertPretrainer(config))
        message = str(err.value)
        assert named in message and "is a PyTorch pickle" in message, message
        assert "never unpickles" in message
        assert ".save_pretrained(\"OUT_DIR\", safe_serialization=True)" in message
    with pytest.raises(CheckpointError, match="is a PyTorch pickle"):
        checkpoints.convert(str(directory), str(tmp_path / "out"), "tf1")
    assert not (tmp_path / "out").exists()
    assert not marker.exists()


def test_random_bytes_named_like_a_pickle_are_not_called_one(tmp_path):
    """Issue 38: random bytes in garbage.bin were "a PyTorch pickle" from the name alone;
    the bytes decide (a zip archive or a pickle stream), alone or in a directory."""
    config = BertConfig.from_dict(tiny_config_dict())
    garbage = tmp_path / "dir" / "garbage.bin"
    garbage.parent.mkdir()
    garbage.write_bytes(bytes(range(7, 256)) * 4)
    for path, expected in ((garbage, "(nor a PyTorch pickle: its bytes are neither a zip "
                                     "archive nor a pickle)"),
                           (garbage.parent, ": no checkpoint found")):
        with pytest.raises(CheckpointError) as err:
            load_pretrained(str(path), BertPretrainer(config))
        assert "pickle file" not in str(err.value) and expected in str(err.value), err.value


# ------------------------------------------------------------------------- damage


@pytest.fixture(scope="module")
def tf_checkpoints(exported, tmp_path_factory):
    """The same model as Google's TF1 layout and as our tf.train.Checkpoint."""
    root = tmp_path_factory.mktemp("tf")
    tf1 = checkpoints.export_tf1_checkpoint(exported["model"], exported["config"],
                                            str(root / "tf1"))
    ours = checkpoints.save_ours(exported["model"], str(root / "ours"), exported["config"])
    return {"tf1": tf1, "ours": ours}


def _damaged_copy(prefix, tmp_path, how):
    """Copies the checkpoint directory of `prefix` and damages one file; returns (dir, file)."""
    source = os.path.dirname(prefix)
    target = tmp_path / f"{os.path.basename(source)}_{how}"
    shutil.copytree(source, target)
    name = os.path.basename(prefix)
    if how == "index":
        damaged = target / f"{name}.index"
        damaged.write_bytes(b"this is not an sstable" * 10)
    else:
        [damaged] = target.glob(f"{name}.data-*")
        data = damaged.read_bytes()
        if how == "truncated":
            damaged.write_bytes(data[:len(data) // 3])
        elif how == "garbage":
            damaged.write_bytes(bytes(255 - b for b in data))  # same size, other bytes
        else:
            os.remove(damaged)
    return str(target), str(damaged)


@pytest.mark.parametrize("kind", ["tf1", "ours"])
@pytest.mark.parametrize("how, expected", [
    ("index", "is not a readable checkpoint index"),
    ("truncated", "is damaged or truncated"),
    ("garbage", "is damaged or truncated"),
    ("missing", "is missing"),
])
def test_damaged_tf_checkpoints_name_the_file(exported, tf_checkpoints, tmp_path, kind, how,
                                              expected):
    directory, damaged = _damaged_copy(tf_checkpoints[kind], tmp_path, how)
    model = BertPretrainer(exported["config"])
    before = [w.numpy() for w in model.weights]
    with pytest.raises(CheckpointError) as err:
        load_pretrained(directory, model)
    message = str(err.value)
    shown = damaged if how != "missing" else damaged.split(".data-")[0] + ".data-*"
    assert shown in message and expected in message, message
    if kind == "tf1":  # the table loader assigns nothing until every tensor is read
        for a, b in zip(before, model.weights):
            np.testing.assert_array_equal(a, b.numpy())


def test_damaged_safetensors_name_the_file(exported, tmp_path):
    data = (exported["dir"] / "model.safetensors").read_bytes()
    for name, content, detail in [
        ("garbage", b"not a safetensors file at all" * 8, "header"),
        ("truncated", data[:len(data) - 100], "incomplete metadata"),
        ("empty", b"", "header too small"),
    ]:
        directory = tmp_path / name
        directory.mkdir()
        (directory / "model.safetensors").write_bytes(content)
        with pytest.raises(CheckpointError) as err:
            load_pretrained(str(directory), BertPretrainer(exported["config"]))
        message = str(err.value)
        assert f"{directory / 'model.safetensors'}: not a valid safetensors file" in message
        assert detail in message and "pickle" not in message, message


def test_damaged_checkpoint_state_file_is_named(tf_checkpoints, tmp_path):
    directory = tmp_path / "state"
    shutil.copytree(os.path.dirname(tf_checkpoints["ours"]), directory)
    (directory / "checkpoint").write_text("garbage {{{\n")
    with pytest.raises(CheckpointError, match="checkpoint state file names no readable"):
        checkpoints.resolve(str(directory))


def test_a_sigterm_during_a_checkpoint_save_ends_the_run_after_the_save_is_complete(tmp_path):
    """The signal arrives as the save starts (deterministically: sent from inside it); the
    checkpoint is still written whole and the run then exits 128 + SIGTERM."""
    code = textwrap.dedent(f"""
        import os, signal
        import tensorflow as tf
        from data_prep import lifecycle
        from training.checkpointing import CheckpointSaver

        lifecycle.exit_cleanly_on_signals()
        checkpoint = tf.train.Checkpoint(v=tf.Variable(tf.ones([64, 64])), step=tf.Variable(7))
        saver = CheckpointSaver(checkpoint, {str(tmp_path)!r})
        original = saver.manager.save

        def save_after_signal(**kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            return original(**kwargs)

        saver.manager.save = save_after_signal
        with lifecycle.signal_decides_exit_status():
            saver.save(7)
        print("not reached")
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-3000:]
    assert "not reached" not in done.stdout
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-7")
    reader = tf.train.load_checkpoint(str(tmp_path / "ckpt-7"))
    np.testing.assert_array_equal(reader.get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE"),
                                  np.ones([64, 64], np.float32))
