"""Bad input names what is wrong (issue 10): a damaged or truncated TFRecord in the middle of
the data names its file and record; ids beyond bert_config's vocab_size name input_ids and
vocab_size (not segment_ids); the runner exits non-zero with the message."""

import os
import subprocess

import pytest

from tests import test_loop_support as S


def _pretraining_cfg(records, out, config, **loop_overrides):
    import run_pretraining
    from modeling.optimization import OptimizerConfig
    from training import flags as common_flags
    from training.loop import LoopConfig

    loop = dict(output_dir=str(out), num_train_steps=40, train_batch_size=4,
                iterations_per_loop=2, save_checkpoints_steps=100)
    loop.update(loop_overrides)
    return run_pretraining.PretrainingRun(
        bert_config_file=config, input_patterns=tuple(records), output_dir=str(out),
        init_checkpoint=None, max_seq_length=S.SEQ, max_predictions_per_seq=S.PREDS,
        do_train=True, do_eval=False, train_batch_size=4, eval_batch_size=4,
        input_compression="auto", runtime=common_flags.RuntimeConfig("one_device", seed=1),
        optimizer=OptimizerConfig(learning_rate=1e-3, num_train_steps=40, num_warmup_steps=0),
        loop=LoopConfig(**loop))


@pytest.fixture
def shards(tmp_path):
    good = S.write_records(tmp_path / "data-0.tfrecord", S.synthetic_instances(30, seed=1))
    bad = S.write_records(tmp_path / "data-1.tfrecord", S.synthetic_instances(30, seed=2))
    return good, bad


def _damage(path, at_fraction=0.5):
    data = bytearray(open(path, "rb").read())
    data[int(len(data) * at_fraction)] ^= 0xFF
    open(path, "wb").write(bytes(data))


def test_a_damaged_record_in_the_middle_names_the_file_and_record(shards, tmp_path):
    import run_pretraining
    from training import input_pipeline

    good, bad = shards
    _damage(bad)
    config = S.write_config(tmp_path / "bert_config.json")
    with pytest.raises(input_pipeline.RecordFileError,
                       match=r"data-1\.tfrecord: TFRecord data is damaged or truncated at "
                             r"record 1[0-9]\b"):
        run_pretraining.run(_pretraining_cfg([str(tmp_path / "data-*.tfrecord")],
                                             tmp_path / "out", config))
    assert input_pipeline.find_damaged_record([good]) is None


def test_a_truncated_file_names_the_file(shards, tmp_path):
    from training import input_pipeline

    _, bad = shards
    data = open(bad, "rb").read()
    open(bad, "wb").write(data[:len(data) - 7])
    path, index, message = input_pipeline.find_damaged_record([bad])
    assert path == bad and index == 29 and "truncated" in message.lower()


def test_ids_beyond_the_vocab_name_input_ids_and_vocab_size(shards, tmp_path):
    """The records use ids up to 59; a bert_config with vocab_size 40 cannot embed them."""
    import tensorflow as tf

    import run_pretraining

    good, _ = shards
    config = S.write_config(tmp_path / "bert_config.json", vocab_size=40)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input_ids holds an id >= vocab_size=40 of bert_config"):
        run_pretraining.run(_pretraining_cfg([good], tmp_path / "out", config))


@pytest.mark.slow
def test_the_cli_exits_non_zero_with_the_file_named(shards, tmp_path):
    _, bad = shards
    _damage(bad, 0.3)
    config = S.write_config(tmp_path / "bert_config.json")
    proc = subprocess.run(
        S.runner_command(input_file=str(tmp_path / "data-*.tfrecord"),
                         output_dir=tmp_path / "out", bert_config_file=config,
                         do_train="true", train_batch_size=4, max_seq_length=S.SEQ,
                         max_predictions_per_seq=S.PREDS, num_train_steps=40,
                         iterations_per_loop=2, distribution_strategy="one_device"),
        env=S.runner_env(), cwd=S.REPO_ROOT, capture_output=True, text=True, timeout=240,
        check=False)
    assert proc.returncode != 0
    assert f"{bad}: TFRecord data is damaged or truncated" in proc.stderr, proc.stderr[-2000:]
    assert not os.path.exists(tmp_path / "out" / ".run.lock")
