"""The pretraining tf.data pipeline: shapes, dtypes, gzip, sharding, first-record check."""

import numpy as np
import pytest
import tensorflow as tf

from data_prep.cli import UserError
from tests import test_loop_support as S
from training import input_pipeline as ip
from training import record_checks


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("records")
    plain = [S.write_records(d / f"part-{i}.tfrecord", S.synthetic_instances(40, seed=i,
                                                                            full_weights=False))
             for i in range(3)]
    gz = S.write_records(d / "part-gz.tfrecord.gz", S.synthetic_instances(40, seed=0,
                                                                          full_weights=False))
    return {"dir": d, "plain": plain, "gz": gz}


def _config(patterns, **kw):
    return ip.PretrainingInputConfig(tuple(patterns), S.SEQ, S.PREDS, **kw)


def _ids(dataset, limit=None):
    out = []
    for i, batch in enumerate(dataset):
        if limit is not None and i >= limit:
            break
        out.extend(tuple(row) for row in batch["input_ids"].numpy())
    return out


def test_training_batches_have_static_shapes_and_in_memory_dtypes(files):
    ds = ip.pretraining_dataset(_config([str(files["dir"] / "part-*.tfrecord")], seed=1),
                                batch_size=8, is_training=True)
    batch = next(iter(ds))
    expected = {"input_ids": (8, S.SEQ), "input_mask": (8, S.SEQ), "segment_ids": (8, S.SEQ),
                "masked_lm_positions": (8, S.PREDS), "masked_lm_ids": (8, S.PREDS),
                "masked_lm_weights": (8, S.PREDS), "next_sentence_labels": (8, 1)}
    for name, shape in expected.items():
        assert tuple(ds.element_spec[name].shape) == shape, name  # static, drop_remainder
        assert batch[name].shape == shape
        want = tf.float32 if name == "masked_lm_weights" else tf.int32
        assert batch[name].dtype == want, name


def test_training_repeats_and_shuffles_with_seed(files):
    cfg = _config(files["plain"], seed=7, shuffle_buffer=50)
    first = _ids(ip.pretraining_dataset(cfg, batch_size=8, is_training=True), limit=40)
    again = _ids(ip.pretraining_dataset(cfg, batch_size=8, is_training=True), limit=40)
    assert len(first) == 320 > 120  # more than the 120 records: repeats
    assert first == again  # a seed makes the order reproducible
    in_order = _ids(ip.pretraining_dataset(cfg, batch_size=8, is_training=False))
    assert first[:120] != in_order


def test_eval_reads_every_full_batch_once_in_order(files):
    ds = ip.pretraining_dataset(_config(files["plain"]), batch_size=16, is_training=False)
    got = _ids(ds)
    expected = [tuple(inst["input_ids"]) + (0,) * (S.SEQ - len(inst["input_ids"]))
                for i in range(3) for inst in S.synthetic_instances(40, seed=i,
                                                                   full_weights=False)]
    assert got == expected[: (120 // 16) * 16]


def test_gzip_is_detected_by_extension_or_flag(files):
    ds = ip.pretraining_dataset(_config([files["gz"]]), batch_size=40, is_training=False)
    plain = ip.pretraining_dataset(_config([files["plain"][0]]), batch_size=40,
                                   is_training=False)
    assert _ids(ds) == _ids(plain)
    with pytest.raises(ValueError, match="not a readable TFRecord"):
        ip.pretraining_dataset(_config([files["gz"]], compression="NONE"), batch_size=4,
                               is_training=False)


class _Context:
    def __init__(self, n, i):
        self.num_input_pipelines, self.input_pipeline_id = n, i


def test_files_are_sharded_per_input_pipeline(files):
    cfg = _config(files["plain"])
    shards = [set(_ids(ip.pretraining_dataset(cfg, batch_size=4, is_training=False,
                                              input_context=_Context(3, i))))
              for i in range(3)]
    assert all(len(s) == 40 for s in shards)
    assert not (shards[0] & shards[1]) and not (shards[1] & shards[2])


def test_records_are_sharded_when_files_are_fewer_than_pipelines(files):
    cfg = _config(files["plain"][:1])
    shards = [_ids(ip.pretraining_dataset(cfg, batch_size=4, is_training=False,
                                          input_context=_Context(2, i))) for i in range(2)]
    assert len(shards[0]) == len(shards[1]) == 20
    assert not set(shards[0]) & set(shards[1])


def test_wrong_max_seq_length_names_file_and_lengths(files):
    cfg = ip.PretrainingInputConfig((files["plain"][0],), 64, S.PREDS)
    with pytest.raises(ValueError) as err:
        ip.pretraining_dataset(cfg, batch_size=4, is_training=True)
    message = str(err.value)
    assert files["plain"][0] in message and "input_ids" in message
    assert f"length {S.SEQ}" in message and "max_seq_length expects 64" in message


def test_wrong_max_predictions_is_reported(files):
    with pytest.raises(ValueError, match="max_predictions_per_seq expects 7"):
        record_checks.check_pretraining_files([files["plain"][0]], S.SEQ, 7)


def test_pattern_matching_nothing_is_an_error(tmp_path):
    with pytest.raises(UserError, match="matches no file"):
        record_checks.list_files([str(tmp_path / "nothing-*.tfrecord")])


def test_an_input_that_is_a_directory_names_the_flag(tmp_path):
    """Issue 38: --input_file=DIR printed TensorFlow's op text ("Is a directory"); it is
    refused naming the flag and the glob to pass. A wider glob skips the folders it
    matches."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sub").mkdir()
    (tmp_path / "data" / "a.tfrecord").write_bytes(b"")
    data = str(tmp_path / "data")
    for given in (data, data + "/"):
        with pytest.raises(record_checks.RecordFileError) as err:
            record_checks.list_files([given], "--phase2_input_file")
        assert str(err.value) == (f"--phase2_input_file={given} is a directory; pass its "
                                  f"record files, e.g. --phase2_input_file='{data}/*.tfrecord'")
    assert record_checks.list_files([data + "/*"]) == [data + "/a.tfrecord"]



def test_weights_parse_as_float(files):
    ds = ip.pretraining_dataset(_config([files["plain"][0]]), batch_size=40, is_training=False)
    batch = next(iter(ds))
    expected = [sum(i["masked_lm_weights"]) for i in S.synthetic_instances(
        40, seed=0, full_weights=False)]
    np.testing.assert_allclose(batch["masked_lm_weights"].numpy().sum(1), expected)


def test_summary_json_beside_the_records_is_not_read_as_a_record(tmp_path):
    """create_pretraining_data writes out.tfrecord.summary.json: `out.tfrecord*` must skip it."""
    (tmp_path / "out.tfrecord").write_bytes(b"")
    (tmp_path / "out.tfrecord.summary.json").write_text("{}")
    files = record_checks.list_files([str(tmp_path / "out.tfrecord*")])
    assert files == [str(tmp_path / "out.tfrecord")]
    with pytest.raises(UserError, match="matches no file"):
        record_checks.list_files([str(tmp_path / "*.json")])


def test_every_pipeline_keeps_tensorflows_autotuning_unless_told_otherwise(files, tmp_path,
                                                                          monkeypatch):
    """Both builders leave tf.data's autotuning model as TensorFlow has it (on) and switch
    it off only when their config says so (`--tf_data_autotune=false`) or the process
    does (`AUTOTUNE_MODEL`, as the test suite does); auto-sharding is off in both."""
    from tests.test_bucketing import _records

    assert ip.AUTOTUNE_MODEL is False  # tests/conftest.py
    monkeypatch.setattr(ip, "AUTOTUNE_MODEL", True)  # as in a run of its own

    pattern = str(files["dir"] / "part-*.tfrecord")
    spec = _records(tmp_path / "r.tfrecord", [5, 9, 12])
    for autotune in (True, False):
        built = [ip.pretraining_dataset(_config([pattern], seed=1, autotune=autotune),
                                        batch_size=8, is_training=training)
                 for training in (True, False)]
        built += [ip.finetuning_records(
            ip.RecordsConfig((str(tmp_path / "r.tfrecord"),), spec, bucket_boundaries=buckets,
                             autotune=autotune), batch_size=2, is_training=training)
            for training in (True, False) for buckets in ((), (8, 16))]
        for dataset in built:
            assert dataset.options().autotune.enabled is (None if autotune else False)
            assert dataset.options().experimental_distribute.auto_shard_policy == \
                tf.data.experimental.AutoShardPolicy.OFF

def test_the_runners_flag_reaches_every_pipeline_of_a_run(pretraining_records, tmp_path,
                                                          monkeypatch):
    """--tf_data_autotune=false (the default: true) goes through the run's settings to
    every pipeline a pretraining and a fine-tuning run build (training, evaluation,
    prediction)."""
    import random

    from tests.clis import call_main
    from tests.conftest import write_vocab
    from tests.test_run_classifier import write_mrpc

    seen = []
    finished = ip._finished  # noqa: SLF001 - what every builder ends with
    monkeypatch.setattr(ip, "_finished", lambda dataset, deterministic, autotune=True: (
        seen.append(autotune), finished(dataset, deterministic, autotune))[1])
    # One layer: the flag's wiring does not depend on the depth.
    config = S.write_config(tmp_path / "bert_config.json", vocab_size=120, num_hidden_layers=1)
    done = call_main("run_pretraining", input_file=pretraining_records["pattern"],
                     bert_config_file=config, output_dir=tmp_path / "pretraining",
                     max_seq_length=S.SEQ, max_predictions_per_seq=S.PREDS,
                     train_batch_size=8, eval_batch_size=8, num_train_steps=2,
                     iterations_per_loop=2, max_eval_steps=1, do_train="true",
                     do_eval="true", tf_data_autotune="false")
    assert done.code == 0, done.stderr[-3000:]
    pretraining = len(seen)
    vocab = write_vocab(tmp_path / "vocab.txt")
    done = call_main("run_classifier", task_name="MRPC",
                     data_dir=write_mrpc(tmp_path / "mrpc", random.Random(0), 8, 4),
                     vocab_file=vocab, bert_config_file=S.write_config(
                         tmp_path / "c.json", vocab_size=len(open(vocab).read().split()),
                         num_hidden_layers=1),
                     output_dir=tmp_path / "mrpc_out", max_seq_length=32, do_train="true",
                     do_eval="true", do_predict="true", train_batch_size=4,
                     num_train_epochs=1.0, tf_data_autotune="false")
    assert done.code == 0, done.stderr[-3000:]
    assert pretraining >= 2 and len(seen) >= pretraining + 3, seen
    assert set(seen) == {False}, seen
