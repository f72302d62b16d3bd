"""Every file through tf.io.gfile (issue 12): runs whose every path is on TensorFlow's
in-memory `ram://` filesystem, as a gs:// bucket would be (the original README's TPU
examples keep config, vocab, data, checkpoints and outputs in a bucket).

`ram://` exists only inside this process, so nothing here can reach it through `open()`:
a single local read or write would fail the run (or, for writes, leave a stray local
`ram:` directory, which is checked too). The data tools and extract_features.py, against
the same runs on local paths: test_ram_filesystem_data_tools.py.
"""

import json
import os
import random

import pytest
import tensorflow as tf

from tests import test_loop_support as S
from tests.conftest import TINY_VOCAB
from training.execution import RuntimeConfig
from tests.test_loop_support import read_eval_results

ROOT = "ram://bert_test"


def _write(path, text):
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(text)
    return path


@pytest.fixture(scope="module")
def ram_env():
    rng = random.Random(0)
    vocab = _write(f"{ROOT}/model/vocab.txt", "\n".join(TINY_VOCAB) + "\n")
    # One layer (pre_config.json too): where the files are does not depend on the depth.
    config = _write(f"{ROOT}/model/bert_config.json",
                    json.dumps(S.tiny_config_dict(vocab_size=len(TINY_VOCAB),
                                               num_hidden_layers=1)))
    words = ["the", "cat", "dog", "sat", "on", "a", "mat", "ran", "far", "away"]
    rows = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) + " ."
            for _ in range(24)]
    for split in ("train", "dev", "test"):
        _write(f"{ROOT}/glue/{split}.tsv", "text\tlabel\n" + "".join(
            f"{r}\t{'pos' if 'cat' in r else 'neg'}\n" for r in rows))
    yield {"vocab": vocab, "config": config, "data": f"{ROOT}/glue"}
    tf.io.gfile.rmtree(ROOT)
    assert not os.path.exists(os.path.join(S.REPO_ROOT, "ram:")), "a path escaped to disk"


def test_run_classifier_on_ram_paths(ram_env):
    import run_classifier as rc
    from tasks.classification import processors

    out = f"{ROOT}/classifier_out"
    cfg = rc.COMMAND.settings(
        task_name="custom", data_dir=ram_env["data"], vocab_file=ram_env["vocab"],
        bert_config_file=ram_env["config"], output_dir=out, max_seq_length=16,
        do_train=True, do_eval=True, do_predict=True, train_batch_size=4, eval_batch_size=4,
        predict_batch_size=4, num_train_epochs=1.0, save_checkpoints_steps=3,
        bucket_boundaries=(8, 16), seeds=(1, 2),
        custom=processors.CustomDataConfig(text_a_column="text", label_column="label"),
        runtime=RuntimeConfig("one_device", seed=1))
    result = rc.run(cfg)
    names = set(tf.io.gfile.listdir(out))
    assert {"seed_results.txt", "eval_results.txt", "test_results.tsv", "train.tf_record",
            "run_identity.json"} <= names, names
    assert ".run.lock" not in names  # released
    assert read_eval_results(f"{out}/eval_results.txt")["global_step"] == 6
    seed_dir = f"{out}/seed_{result['best_seed']}"
    assert tf.train.latest_checkpoint(seed_dir).endswith("ckpt-6")
    assert {"bert_config.json", "vocab.txt", "export_metadata.json"} <= set(
        tf.io.gfile.listdir(seed_dir))
    with tf.io.gfile.GFile(f"{out}/test_results.tsv") as f:
        assert len(f.read().splitlines()) == 24


def test_run_pretraining_on_ram_paths(ram_env):
    import run_pretraining
    from training.settings import PretrainingRun
    from training.settings import settings_of

    records = f"{ROOT}/records/part-0.tfrecord"
    tf.io.gfile.makedirs(os.path.dirname(records))
    S.write_records(records, S.synthetic_instances(16))
    config = _write(f"{ROOT}/model/pre_config.json",
                    json.dumps(S.tiny_config_dict(num_hidden_layers=1)))
    out = f"{ROOT}/pretraining_out"
    cfg, _ = settings_of(
        PretrainingRun, bert_config_file=config,
        input_patterns=(f"{ROOT}/records/part-*",), output_dir=out, init_checkpoint=None,
        max_seq_length=S.SEQ, max_predictions_per_seq=S.PREDS, do_train=True, do_eval=True,
        train_batch_size=4, eval_batch_size=4, input_compression="auto",
        runtime=RuntimeConfig("one_device"), num_train_steps=4, iterations_per_loop=2,
        save_checkpoints_steps=2, max_eval_steps=2, learning_rate=1e-3, num_warmup_steps=0)
    results = run_pretraining.run(cfg)
    assert results["global_step"] == 4
    assert tf.train.latest_checkpoint(out).endswith("ckpt-4")
    assert tf.io.gfile.exists(f"{out}/eval_results.txt")
