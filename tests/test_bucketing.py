"""Length bucketing (training/input_pipeline.py `finetuning_records`, issue 14): every
example once, cut to its bucket, input order restored, and the same predictions and
metrics as padding every batch to max_seq_length, through the real runners. The same
under MirroredStrategy (2 logical CPUs: the CLI, bucketing on by default, its buckets'
short last batches padded to the replicas), predictions and metrics equal to one device:
test_eval_only_rerun_restores_reuses_the_cache_and_mirrored_matches_one_device in
tests/test_run_classifier.py (MNLI's pairs, in both buckets of max_seq_length=32).
"""

import os
import random

import numpy as np
import pytest
import tensorflow as tf

from data_prep import features as features_lib
from tests import test_loop_support as S
from tests.conftest import TINY_VOCAB, write_vocab
from training import flags as flags_lib
from training import input_pipeline
from tests.test_loop_support import read_eval_results

SEQ = 32
WORDS = ["the", "a", "big", "red", "far", "away", "sat", "ran", "on", "in", "to", "and",
         "cat", "dog", "mat", "home"]


def _records(path, lengths):
    """Classifier-like records: real length per example, label = length % 2."""
    schema = features_lib.RecordSchema("test", (
        features_lib.FeatureSpec("input_ids", "int64", "max_seq_length"),
        features_lib.FeatureSpec("input_mask", "int64", "max_seq_length"),
        features_lib.FeatureSpec("segment_ids", "int64", "max_seq_length"),
        features_lib.FeatureSpec("label_ids", "int64", 1),
    ))
    encoder = schema.encoder(max_seq_length=SEQ)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i, length in enumerate(lengths):
            ids = [2] + [7 + (i + j) % 40 for j in range(length - 2)] + [3]
            writer.write(encoder.encode({
                "input_ids": ids + [0] * (SEQ - length), "input_mask": [1] * length +
                [0] * (SEQ - length), "segment_ids": [0] * SEQ, "label_ids": [length % 2]}))
    return schema.parse_spec(max_seq_length=SEQ)


def test_eval_batches_hold_every_example_once_cut_to_its_bucket(tmp_path):
    rng = random.Random(0)
    lengths = [rng.randint(3, SEQ) for _ in range(53)]
    spec = _records(tmp_path / "r.tfrecord", lengths)
    config = input_pipeline.RecordsConfig((str(tmp_path / "r.tfrecord"),), spec,
                                          bucket_boundaries=(8, 16, SEQ))
    seen = {}
    for batch in input_pipeline.finetuning_records(config, batch_size=4, is_training=False,
                                                   drop_remainder=False, pad_to_batch=True):
        width, rows = batch["input_ids"].shape[1], batch["input_ids"].shape[0]
        # As many tokens as a padded batch of 4: 16, 8 and 4 rows of 8, 16 and 32.
        assert width in (8, 16, SEQ) and rows == 4 * SEQ // width
        assert rows == input_pipeline.bucket_batch_size(4, width, SEQ)
        for row in range(rows):
            index = int(batch[input_pipeline.EXAMPLE_INDEX][row])
            if index < 0:
                assert int(tf.reduce_sum(batch["input_mask"][row])) == 0  # a padding row
                continue
            length = int(tf.reduce_sum(batch["input_mask"][row]))
            assert length == lengths[index] and width == min(b for b in (8, 16, SEQ)
                                                              if b >= length)
            assert index not in seen
            seen[index] = batch["input_ids"][row, :length].numpy().tolist()
    assert sorted(seen) == list(range(len(lengths)))


def test_training_batches_are_static_and_buckets_mix(tmp_path):
    rng = random.Random(1)
    lengths = [rng.randint(3, SEQ) for _ in range(200)]
    spec = _records(tmp_path / "r.tfrecord", lengths)
    config = input_pipeline.RecordsConfig((str(tmp_path / "r.tfrecord"),), spec, seed=3,
                                          bucket_boundaries=(8, 16, SEQ))
    widths = []
    for batch in input_pipeline.finetuning_records(config, batch_size=4,
                                                   is_training=True).take(60):
        assert batch["input_ids"].shape[0] == 4
        widths.append(batch["input_ids"].shape[1])
        assert int(tf.reduce_max(tf.reduce_sum(batch["input_mask"], -1))) <= widths[-1]
    # A proper shuffle: every bucket appears early and late, not one bucket after another.
    assert set(widths[:20]) == set(widths[-20:]) == {8, 16, SEQ}
    changes = sum(a != b for a, b in zip(widths, widths[1:]))
    assert changes > 20


def test_ids_outside_the_models_tables_name_the_feature(tmp_path):
    spec = _records(tmp_path / "r.tfrecord", [10, 12])
    for buckets in ((), (16, SEQ)):
        config = input_pipeline.RecordsConfig((str(tmp_path / "r.tfrecord"),), spec,
                                              bucket_boundaries=buckets, vocab_size=10)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"input_ids holds an id >= vocab_size=10 of bert_config"):
            list(input_pipeline.finetuning_records(config, batch_size=2, is_training=False))


def test_default_and_given_boundaries():
    assert flags_lib.default_bucket_boundaries(128) == (16, 32, 64, 128)
    assert flags_lib.default_bucket_boundaries(384) == (16, 32, 64, 128, 256, 384)
    assert flags_lib.check_bucket_boundaries([64, 32], 128) == (32, 64, 128)
    with pytest.raises(ValueError, match="--bucket_boundaries=300"):
        flags_lib.check_bucket_boundaries([300], 128)


# ------------------------------------------------------------- through the runners


def _sentence(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 26))) + " ."


@pytest.fixture(scope="module")
def classifier_env(tmp_path_factory):
    import run_classifier as rc
    from tasks.classification import processors
    from training.execution import RuntimeConfig

    root = tmp_path_factory.mktemp("bucketing")
    rng = random.Random(2)
    data = root / "data"
    data.mkdir()
    rows = [(_sentence(rng), _sentence(rng)) for _ in range(43)]
    for split in ("train", "dev", "test"):
        lines = ["a\tb\tlabel"] + [f"{a}\t{b}\t{'yes' if 'cat' in a else 'no'}"
                                   for a, b in rows]
        (data / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    # One layer: the buckets' equality with padding does not depend on the depth.
    env = {"vocab": write_vocab(root / "vocab.txt"),
           "config": S.write_config(root / "bert_config.json", vocab_size=len(TINY_VOCAB),
                                    num_hidden_layers=1)}

    def make(out, **overrides):
        values = dict(task_name="custom", data_dir=str(data), vocab_file=env["vocab"],
                      bert_config_file=env["config"], output_dir=str(out),
                      max_seq_length=SEQ, do_train=False, do_eval=True, do_predict=True,
                      train_batch_size=4, eval_batch_size=5, predict_batch_size=5,
                      learning_rate=1e-3, num_train_epochs=2.0,
                      custom=processors.CustomDataConfig(text_a_column="a", text_b_column="b",
                                                 label_column="label", labels=("no", "yes")),
                      runtime=RuntimeConfig("one_device", seed=4))
        values.update(overrides)
        return rc.COMMAND.settings(**values)

    # Trained with length buckets, then evaluated and predicting with them (on the weights
    # of its last checkpoint, the one it saves when training ends).
    trained = root / "trained"
    rc.run(make(trained, do_train=True, bucket_boundaries=(8, 16, SEQ)))
    return {"root": root, "make": make, "trained": str(trained)}


def _results(directory):

    probs = np.loadtxt(os.path.join(directory, "test_results.tsv"), delimiter="\t")
    return read_eval_results(os.path.join(directory, "eval_results.txt")), probs


def test_classifier_results_equal_with_and_without_buckets(classifier_env):
    """The bucketed run's eval and predict (the trained run's own, on its last checkpoint's
    weights) equal an eval and predict from that checkpoint padding every batch."""
    import run_classifier as rc

    root, make = classifier_env["root"], classifier_env["make"]
    rc.run(make(root / "padded", init_checkpoint=classifier_env["trained"]))
    padded, bucketed = _results(root / "padded"), _results(classifier_env["trained"])
    assert padded[1].shape == (43, 2)
    np.testing.assert_allclose(bucketed[1], padded[1], atol=2e-6)
    # The metrics; global_step is the trained run's step, 0 for the run from its checkpoint.
    metrics = [{k: v for k, v in results.items() if k != "global_step"}
               for results, _ in (bucketed, padded)]
    assert metrics[0] == pytest.approx(metrics[1], rel=1e-5) and len(metrics[0]) >= 3
    assert bucketed[0]["global_step"] > 0 and padded[0]["global_step"] == 0


def test_evaluation_pads_a_buckets_last_batch_only_to_the_replicas(tmp_path):
    """With pad_to_multiple (the replicas), a bucket's short last batch is not padded to a
    whole batch: 53 examples in 3 buckets cost at most 53 + 3 rows, not 3 extra batches."""
    rng = random.Random(0)
    lengths = [rng.randint(3, SEQ) for _ in range(53)]
    spec = _records(tmp_path / "r.tfrecord", lengths)
    config = input_pipeline.RecordsConfig((str(tmp_path / "r.tfrecord"),), spec,
                                          bucket_boundaries=(8, 16, SEQ))
    rows, seen = 0, []
    for batch in input_pipeline.finetuning_records(config, batch_size=16, is_training=False,
                                                   drop_remainder=False, pad_to_batch=True,
                                                   pad_to_multiple=2):
        n, width = batch["input_ids"].shape[:2]
        assert n % 2 == 0 and n <= 16 * SEQ // width
        rows += n
        seen += [i for i in batch[input_pipeline.EXAMPLE_INDEX].numpy().tolist() if i >= 0]
    assert sorted(seen) == list(range(53)) and rows <= 53 + 3
