"""Bad input names what is wrong (issue 10): a damaged or truncated TFRecord in the middle of
the data names its file and record; ids beyond bert_config's vocab_size name input_ids and
vocab_size (not segment_ids); the runner exits non-zero with the message.

Issue 22: a learning rate that cannot train (-1, 0, NaN, inf) is refused by every runner
naming the flag; pretraining globs mixing masked and unmasked records, records of another
length (in the first record of any file, or a later one) and ids beyond the model's or the
masking vocab's size are refused naming the file, the record and the flag, as one line from
the CLI; fine-tuning refuses a vocab larger than the model and names the record file when
its ids do not fit."""

import dataclasses
import os

import pytest

from tests import test_loop_support as S
from tests.clis import call_main
from tests.conftest import TINY_VOCAB, write_vocab


def _write_config(path, **kwargs):
    """The tests' tiny bert_config with one layer: what they prove (refusals, messages) does
    not depend on the depth, and a run that gets as far as tracing its model is cheaper."""
    return S.write_config(path, num_hidden_layers=1, **kwargs)


def _pretraining_cfg(records, out, config, **overrides):
    from training.execution import RuntimeConfig
    from training.settings import PretrainingRun, settings_of

    values = dict(num_train_steps=40, iterations_per_loop=2, save_checkpoints_steps=100,
                  learning_rate=1e-3, num_warmup_steps=0)
    values.update(overrides)
    return settings_of(
        PretrainingRun, bert_config_file=config,
        input_patterns=tuple(records), output_dir=str(out), init_checkpoint=None,
        max_seq_length=S.SEQ, max_predictions_per_seq=S.PREDS, do_train=True, do_eval=False,
        train_batch_size=4, eval_batch_size=4, input_compression="auto",
        runtime=RuntimeConfig("one_device", seed=1), **values)[0]


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
    """The runner's command line (in this process, `call_main`) on a glob whose second file
    is damaged in the middle: exit status 1, the message names the file and the record,
    and the run leaves no lock behind. (This and the CLI's exit status were two tests, each
    training until the damaged record: one run proves both.)"""
    import re

    from training import record_checks

    good, bad = shards
    _damage(bad)
    config = _write_config(tmp_path / "bert_config.json")
    result = call_main(
        "run_pretraining", input_file=str(tmp_path / "data-*.tfrecord"),
        output_dir=tmp_path / "out", bert_config_file=config, do_train="true",
        train_batch_size=4, max_seq_length=S.SEQ, max_predictions_per_seq=S.PREDS,
        num_train_steps=40, iterations_per_loop=2, distribution_strategy="one_device")
    assert result.code == 1
    assert re.search(rf"{re.escape(bad)}: TFRecord data is damaged or truncated at "
                     r"record 1[0-9]\b", result.stderr), result.stderr[-2000:]
    assert not os.path.exists(tmp_path / "out" / ".run.lock")
    assert record_checks.find_damaged_record([good]) is None


def test_compressed_and_plain_records_in_one_run_are_refused_naming_them(shards, tmp_path):
    """One reader reads one compression: GZIP records beside uncompressed ones are refused
    before any work, naming the files (as a one-line error from the command line)."""
    import tensorflow as tf

    good, _ = shards
    with tf.io.TFRecordWriter(str(tmp_path / "data-9.tfrecord.gz"), options="GZIP") as out:
        for record in tf.data.TFRecordDataset(good):
            out.write(record.numpy())
    result = call_main(
        "run_pretraining", input_file=f"{good},{tmp_path}/data-9.tfrecord.gz",
        output_dir=tmp_path / "out", bert_config_file=_write_config(tmp_path / "c.json"),
        do_train="true", train_batch_size=4, num_train_steps=4, max_seq_length=S.SEQ,
        max_predictions_per_seq=S.PREDS, distribution_strategy="one_device")
    assert result.code == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("run_pretraining.py: error: input files mix compressed and "
                           "uncompressed records: ") and "data-9.tfrecord.gz" in last, last
    assert not list((tmp_path / "out").glob("ckpt-*"))


def test_evaluating_without_weights_is_refused_naming_both_sources(shards, tmp_path):
    """--do_eval alone with no checkpoint in output_dir and no --init_checkpoint would
    evaluate random weights: refused, naming both."""
    from data_prep.cli import UserError

    good, _ = shards
    with pytest.raises(UserError, match=r"nothing to evaluate or predict with: no checkpoint "
                                        r"in .*out and no --init_checkpoint"):
        _run_pretraining([good], tmp_path / "out", _write_config(tmp_path / "c.json"),
                         do_train=False, do_eval=True)
    assert not list((tmp_path / "out").glob("ckpt-*"))


def test_a_truncated_file_names_the_file(shards, tmp_path):
    from training import record_checks

    _, bad = shards
    data = open(bad, "rb").read()
    open(bad, "wb").write(data[:len(data) - 7])
    path, index, message = record_checks.find_damaged_record([bad])
    assert path == bad and index == 29 and "truncated" in message.lower()


def test_ids_beyond_the_vocab_name_input_ids_vocab_size_and_the_file(tmp_path):
    """The first records fit a bert_config with vocab_size 40, a later one does not: the
    check inside tf.data fails, the error names the file, the record and the flag."""
    from training import record_checks

    instances = S.synthetic_instances(30, seed=1)
    for instance in instances:
        for name in ("input_ids", "masked_lm_ids"):
            instance[name] = [int(t) % 40 for t in instance[name]]
    instances[21]["input_ids"][5] = 47
    records = S.write_records(tmp_path / "data.tfrecord", instances)
    config = _write_config(tmp_path / "bert_config.json", vocab_size=40)
    with pytest.raises(record_checks.RecordFileError) as info:
        _run_pretraining([records], tmp_path / "out", config)
    assert str(info.value).startswith(
        f"{records}: record 21 has input_ids id 47, beyond vocab_size=40 of "
        f"--bert_config_file={config}")


# --------------------------------------------------------------------------- issue 22
# A learning rate that cannot train; pretraining records of another kind, length or vocab
# than the flags say: refused before any work, naming the flag or the file (and the
# record), never a TensorFlow traceback.

RUNNERS = ("run_pretraining.py", "run_classifier.py", "run_squad.py", "run_ner.py",
           "run_swag.py")


@pytest.mark.parametrize("rate", [-1.0, 0.0, float("nan"), float("inf")])
def test_the_optimizer_settings_refuse_a_rate_that_cannot_train(rate):
    from modeling.optimization import OptimizerConfig

    with pytest.raises(ValueError, match=r"--learning_rate=.*positive, finite"):
        OptimizerConfig(learning_rate=rate)


@pytest.mark.parametrize("setting,value", [
    ("num_warmup_steps", -1), ("num_train_steps", -5), ("weight_decay_rate", -0.1),
    ("weight_decay_rate", float("nan")), ("clip_norm", float("nan"))])
def test_the_optimizer_settings_refuse_what_is_clearly_wrong(setting, value):
    from modeling.optimization import OptimizerConfig

    with pytest.raises(ValueError, match=rf"--{setting}="):
        OptimizerConfig(**{setting: value})


def test_finetuning_refuses_a_bad_rate_before_any_work(tmp_path):
    from training import finetuning

    settings, _ = finetuning.settings_from(
        vocab_file="v.txt", bert_config_file="c.json", output_dir=str(tmp_path / "out"),
        do_train=True, learning_rate=float("nan"))
    with pytest.raises(finetuning.FinetuningError, match=r"--learning_rate=nan"):
        finetuning.validate(settings)
    settings, _ = finetuning.settings_from(
        vocab_file="v.txt", bert_config_file="c.json", output_dir=str(tmp_path / "out"),
        do_train=True, num_train_epochs=float("nan"))
    with pytest.raises(finetuning.FinetuningError, match=r"--num_train_epochs=nan"):
        finetuning.validate(settings)


def _runner_flags(script, tmp_path):
    """Flags a runner accepts up to its checks (the files need not exist: the rate is
    checked first)."""
    common = dict(output_dir=tmp_path / "out", bert_config_file=tmp_path / "c.json",
                  do_train="true")
    if script == "run_pretraining.py":
        return dict(common, input_file=tmp_path / "r.tfrecord")
    common.update(vocab_file=tmp_path / "v.txt", data_dir=tmp_path)
    if script == "run_classifier.py":
        return dict(common, task_name="cola")
    if script == "run_squad.py":
        del common["data_dir"]
        return dict(common, train_file=tmp_path / "train.json")
    return common


@pytest.mark.parametrize("rate", ["-1", "nan"])
@pytest.mark.parametrize("script", RUNNERS)
def test_every_runner_refuses_a_bad_learning_rate_naming_the_flag(script, rate, tmp_path):
    flags = dict(_runner_flags(script, tmp_path), learning_rate=rate)
    result = call_main(script[:-3], **flags)
    assert result.code == 1
    assert f"{script}: error: --learning_rate={float(rate)}" in result.stderr, \
        result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "out")


def _unmasked(path, instances, seq=S.SEQ):
    """Writes instances as unmasked records (create_pretraining_data --dynamic_masking)."""
    import tensorflow as tf

    from data_prep import features

    encoder = features.PRETRAINING_UNMASKED.encoder(max_seq_length=seq)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for instance in instances:
            writer.write(encoder.encode({k: v for k, v in instance.items()
                                         if not k.startswith("masked_lm_")}))
    return str(path)


def _run_pretraining(records, out, config, **changes):
    """run_pretraining.run in this process with `_pretraining_cfg`, fields replaced."""
    import run_pretraining

    cfg = _pretraining_cfg(records, out, config)
    run_pretraining.run(dataclasses.replace(cfg, **changes))


@pytest.mark.parametrize("masked_first", [True, False])
def test_masked_and_unmasked_records_in_one_run_are_refused_naming_one_of_each(
        tmp_path, masked_first):
    from training import record_checks

    instances = S.synthetic_instances(8)
    masked = S.write_records(tmp_path / ("a.tfrecord" if masked_first else "b.tfrecord"),
                             instances)
    unmasked = _unmasked(tmp_path / ("b.tfrecord" if masked_first else "a.tfrecord"),
                         instances)
    vocab = write_vocab(tmp_path / "vocab.txt")
    config = _write_config(tmp_path / "bert_config.json", vocab_size=len(TINY_VOCAB))
    for vocab_file in (None, vocab):  # as masked records, or as unmasked ones
        with pytest.raises(record_checks.RecordFileError) as info:
            _run_pretraining([str(tmp_path / "*.tfrecord")], tmp_path / "out", config,
                             vocab_file=vocab_file)
        message = str(info.value)
        assert f"masked records ({masked})" in message
        assert f"unmasked ones ({unmasked}" in message
        assert not (tmp_path / "out").exists()


def test_records_of_another_length_name_the_file_and_the_flag(tmp_path):
    from training import record_checks

    config = _write_config(tmp_path / "bert_config.json")
    short = S.write_records(tmp_path / "a.tfrecord", S.synthetic_instances(8))
    long = S.write_records(tmp_path / "b.tfrecord", S.synthetic_instances(8, seq=64), seq=64)
    with pytest.raises(record_checks.RecordFileError,
                       match=rf"{long}: first record has input_ids of length 64 but "
                             r"--max_seq_length expects 32"):
        _run_pretraining([short, long], tmp_path / "out", config)
    with pytest.raises(record_checks.RecordFileError,
                       match=rf"{short}: first record has input_ids of length 32 but "
                             r"--max_seq_length expects 64"):
        _run_pretraining([short, long], tmp_path / "out", config, max_seq_length=64)
    assert not (tmp_path / "out").exists()


def test_a_later_record_of_another_length_names_the_file_and_record(tmp_path):
    """Only the first record of a file is read up front; a later one fails inside tf.data
    (parse_example names no file): the error names the file and the record."""
    import tensorflow as tf

    from data_prep import features
    from training import record_checks

    path = tmp_path / "mixed.tfrecord"
    short = features.PRETRAINING.encoder(max_seq_length=S.SEQ, max_predictions_per_seq=S.PREDS)
    long = features.PRETRAINING.encoder(max_seq_length=64, max_predictions_per_seq=S.PREDS)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i, instance in enumerate(S.synthetic_instances(12) + S.synthetic_instances(
                4, seq=64)):
            writer.write((long if i >= 12 else short).encode(instance))
    config = _write_config(tmp_path / "bert_config.json")
    with pytest.raises(record_checks.RecordFileError,
                       match=rf"{path}: record 12 has input_ids of length 64 but "
                             r"--max_seq_length expects 32"):
        _run_pretraining([str(path)], tmp_path / "out", config)


def test_ids_beyond_the_vocab_in_the_first_record_name_the_file_and_flag(shards, tmp_path):
    from training import record_checks

    good, _ = shards
    config = _write_config(tmp_path / "bert_config.json", vocab_size=40)
    with pytest.raises(record_checks.RecordFileError,
                       match=rf"{good}: first record has input_ids id \d+, beyond "
                             rf"vocab_size=40 of --bert_config_file={config}"):
        _run_pretraining([good], tmp_path / "out", config)
    assert not (tmp_path / "out").exists()


def test_dynamic_masking_refuses_a_vocab_smaller_than_the_records_ids(tmp_path):
    """The records hold ids up to 59; a 30-token vocab_file cannot be theirs (its random
    replacements and ## pieces would be another vocab's)."""
    from training import record_checks

    records = _unmasked(tmp_path / "pairs.tfrecord", S.synthetic_instances(16))
    vocab = write_vocab(tmp_path / "small_vocab.txt", TINY_VOCAB[:30])
    config = _write_config(tmp_path / "bert_config.json", vocab_size=len(TINY_VOCAB))
    with pytest.raises(record_checks.RecordFileError,
                       match=rf"{records}: first record has input_ids id \d+, beyond the 30 "
                             rf"tokens of --vocab_file={vocab}"):
        _run_pretraining([records], tmp_path / "out", config, vocab_file=vocab)
    assert not (tmp_path / "out").exists()


def test_a_later_record_beyond_the_masking_vocab_names_the_file_and_record(tmp_path):
    import numpy as np

    from training import record_checks

    instances = S.synthetic_instances(16)
    for instance in instances[:11]:  # the first records fit the 40 tokens
        instance["input_ids"] = [int(t) % 40 for t in instance["input_ids"]]
    instances[10]["input_ids"][3] = 55
    records = _unmasked(tmp_path / "pairs.tfrecord", instances)
    vocab = write_vocab(tmp_path / "small_vocab.txt", TINY_VOCAB[:40])
    config = _write_config(tmp_path / "bert_config.json", vocab_size=len(TINY_VOCAB))
    assert max(np.max(i["input_ids"]) for i in instances[11:]) < 60
    with pytest.raises(record_checks.RecordFileError) as info:
        _run_pretraining([records], tmp_path / "out", config, vocab_file=vocab)
    assert str(info.value).startswith(
        f"{records}: record 10 has input_ids id 55, beyond the 40 tokens of "
        f"--vocab_file={vocab}")


@pytest.mark.parametrize("case", ["max_seq_length", "vocab_size"])
def test_the_cli_says_what_does_not_fit_in_one_line(shards, tmp_path, case):
    good, _ = shards
    config = _write_config(tmp_path / "bert_config.json",
                            vocab_size=40 if case == "vocab_size" else S.VOCAB)
    result = call_main(
        "run_pretraining", input_file=good, output_dir=tmp_path / "out",
        bert_config_file=config, do_train="true", train_batch_size=4, num_train_steps=4,
        max_seq_length=64 if case == "max_seq_length" else S.SEQ,
        max_predictions_per_seq=S.PREDS, distribution_strategy="one_device")
    assert result.code == 1
    expected = {"max_seq_length": "input_ids of length 32 but --max_seq_length expects 64",
                "vocab_size": f"beyond vocab_size=40 of --bert_config_file={config}"}[case]
    assert f"run_pretraining.py: error: {good}: first record has " in result.stderr
    assert expected in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "out")


def _pair_data(directory):
    """train.tsv and dev.tsv of sentence pairs (text, text2, label)."""
    directory.mkdir()
    rows = ["text\ttext2\tlabel"] + [f"the cat sat .\tthe dog ran .\t{i % 2}" for i in range(8)]
    for split in ("train", "dev"):
        (directory / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return str(directory)


def test_finetuning_refuses_a_vocab_larger_than_the_model_before_any_work(tmp_path):
    import run_classifier
    from tasks.classification import processors
    from training.execution import RuntimeConfig

    vocab = write_vocab(tmp_path / "vocab.txt")
    config = _write_config(tmp_path / "bert_config.json", vocab_size=len(TINY_VOCAB) - 9)
    cfg = run_classifier.COMMAND.settings(
        task_name="custom", data_dir=_pair_data(tmp_path / "data"), vocab_file=vocab,
        bert_config_file=config, output_dir=str(tmp_path / "out"), max_seq_length=16,
        do_train=True, train_batch_size=4,
        custom=processors.CustomDataConfig(text_a_column="text", label_column="label"),
        runtime=RuntimeConfig("one_device"))
    with pytest.raises(ValueError, match=rf"--vocab_file={vocab} has {len(TINY_VOCAB)} tokens "
                                         rf"but --bert_config_file={config} has vocab_size="
                                         rf"{len(TINY_VOCAB) - 9}"):
        run_classifier.run(cfg)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_finetuning_records_beyond_the_models_tables_are_a_one_line_error(tmp_path):
    """Sentence pairs (segment id 1) for a model with type_vocab_size 1: the check inside
    tf.data fails; the runner names the record file, the record and the flag."""
    import json

    config = tmp_path / "bert_config.json"
    config.write_text(json.dumps({**S.tiny_config_dict(vocab_size=len(TINY_VOCAB),
                                                       num_hidden_layers=1),
                                  "type_vocab_size": 1}))
    result = call_main(
        "run_classifier", ["--task_name=custom",
         f"--data_dir={_pair_data(tmp_path / 'data')}", "--text_a_column=text",
         "--text_b_column=text2", "--label_column=label",
         f"--vocab_file={write_vocab(tmp_path / 'vocab.txt')}", f"--bert_config_file={config}",
         f"--output_dir={tmp_path / 'out'}", "--do_train", "--max_seq_length=16",
         "--train_batch_size=4", "--distribution_strategy=one_device"])
    assert result.code == 1
    record_file = tmp_path / "out" / "train.tf_record"
    assert (f"run_classifier.py: error: {record_file}: record 0 has segment_ids id 1, beyond "
            f"type_vocab_size=1 of --bert_config_file={config}") in result.stderr, \
        result.stderr[-3000:]
    assert "Traceback" not in result.stderr


# --------------------------------------------------------------------------- issue 23
# convert_checkpoint.py reads its config as every tool does (BertConfig.from_config_file)
# and ends bad input with one line naming the file or flag, exit 1 (the shell's; it was
# 2), nothing written.


@pytest.fixture(scope="module")
def our_checkpoint(tmp_path_factory):
    from modeling import checkpoints
    from modeling.config import BertConfig
    from modeling.encoder import BertEncoder

    directory = tmp_path_factory.mktemp("ours")
    config = BertConfig.from_json_file(_write_config(directory / "bert_config.json"))
    checkpoints.save_ours(BertEncoder(config), str(directory), config)
    return directory


@pytest.mark.parametrize("case", ["config_not_json", "hf_config_not_json", "missing_vocab",
                                  "output_dir_is_a_file", "output_dir_is_the_input"])
def test_convert_checkpoint_says_what_is_wrong_in_one_line(our_checkpoint, tmp_path, case):
    flags = {"input": str(our_checkpoint), "output_dir": str(tmp_path / "out"),
             "output_format": "hf"}
    if case in ("config_not_json", "hf_config_not_json"):
        bad = tmp_path / ("bert_config.json" if case == "config_not_json" else "config.json")
        bad.write_text('{"hidden_size": 32,', encoding="utf-8")
        flags["bert_config_file"] = str(bad)
        expected = f"{bad}: not valid JSON"
    elif case == "missing_vocab":
        flags["vocab_file"] = str(tmp_path / "nowhere" / "vocab.txt")
        expected = f"--vocab_file={flags['vocab_file']}: no such file"
    elif case == "output_dir_is_a_file":
        (tmp_path / "out").write_text("not a directory", encoding="utf-8")
        expected = f"--output_dir={tmp_path / 'out'} is a file"
    else:  # ours into the input's directory would write its ckpt files over the input's
        flags.update(output_dir=str(our_checkpoint), output_format="ours")
        expected = f"output_dir {our_checkpoint} holds the input checkpoint"
    before = {path.name: path.read_bytes() for path in our_checkpoint.iterdir()}
    result = call_main("convert_checkpoint", **flags)
    assert result.code == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"convert_checkpoint.py: error: {expected}" in result.stderr, result.stderr[-2000:]
    assert not os.path.isdir(tmp_path / "out")
    assert {path.name: path.read_bytes() for path in our_checkpoint.iterdir()} == before


# --------------------------------------------------------------------------- issue 38


@pytest.mark.parametrize("case", ["0 bytes", "a glob of empty files", "gzip of no record"])
def test_pretraining_input_without_records_is_refused_in_one_line(tmp_path, case):
    """Issue 38 #5: an empty input file passed every check and the run then spun at 100%
    CPU inside the compiled training call, deaf to SIGTERM and Ctrl-C."""
    import gzip

    if case == "gzip of no record":
        with gzip.open(tmp_path / "none.tfrecord.gz", "wb"):
            pass
        pattern = str(tmp_path / "none.tfrecord.gz")
    else:
        for name in ("a", "b")[:1 if case == "0 bytes" else 2]:
            (tmp_path / f"{name}.tfrecord").write_bytes(b"")
        pattern = str(tmp_path / ("a.tfrecord" if case == "0 bytes" else "*.tfrecord"))
    result = call_main(
        "run_pretraining", input_file=pattern, output_dir=tmp_path / "out",
        bert_config_file=_write_config(tmp_path / "bert_config.json"), do_train="true",
        train_batch_size=4, num_train_steps=4, max_seq_length=S.SEQ,
        max_predictions_per_seq=S.PREDS, distribution_strategy="one_device")
    assert result.code == 1, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("run_pretraining.py: error: --input_file: no record to "
                                "read: "), lines
    assert "Traceback" not in result.stderr and "training from step" not in result.log
    assert not os.path.exists(tmp_path / "out" / ".run.lock")


def test_a_training_input_whose_files_hold_no_record_fails_instead_of_spinning(tmp_path):
    """Issue 38 #5, below the checks: files emptied after them. The training input repeated
    its file names forever under the interleave; files that yield nothing made that a
    search without end inside one TensorFlow op, deaf to signals. It reads whole passes
    now, and a pass without a record ends it: the compiled step fails (an empty file among
    full ones is read past)."""
    import threading

    import tensorflow as tf

    from training import input_pipeline, record_checks

    good = S.write_records(tmp_path / "good.tfrecord", S.synthetic_instances(8))
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    pattern = str(tmp_path / "*.tfrecord")

    def twenty_steps():
        """20 batches through a compiled call, as the training loop reads them."""
        config = input_pipeline.PretrainingInputConfig((pattern,), S.SEQ, S.PREDS, seed=1)
        iterator = iter(input_pipeline.pretraining_dataset(config, batch_size=4,
                                                           is_training=True, check=False))
        step = tf.function(lambda: next(iterator)["input_ids"])
        outcome = []

        def read():
            try:
                with record_checks.naming_bad_records((pattern,)):
                    outcome.append([step() for _ in range(20)])
            except Exception as err:  # noqa: BLE001 - the outcome under test
                outcome.append(err)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(120)
        assert outcome, f"{pattern}: still reading after 120 s (spinning)"
        return outcome[0]

    assert len(twenty_steps()) == 20  # good + empty
    os.remove(good)
    error = twenty_steps()
    assert isinstance(error, record_checks.RecordFileError), repr(error)
    assert str(error) == (f"no record to read: {tmp_path / 'empty.tfrecord'} holds no "
                          "TFRecord (empty); they held records when the run started")


def test_records_that_read_from_the_start_but_not_from_the_resumed_position(tmp_path):
    """Issue 38: a pretraining file replaced by other records of the same size (its size is
    what the saved input position is checked against) failed the resumed run with
    "damaged TFRecord data in [...]: Graph execution error:". Every record still reads from
    the start: the message now says the file changed since the checkpoint, naming it (the
    one in which the position fails inside a record)."""
    import numpy as np
    import tensorflow as tf

    from training import record_checks

    same = S.write_records(tmp_path / "a.tfrecord", S.synthetic_instances(8))
    changed = S.write_records(tmp_path / "b.tfrecord", S.synthetic_instances(8, vocab=300))
    sizes = [len(r.numpy()) + 16 for r in tf.data.TFRecordDataset(same)]
    offset = sum(sizes[:3])  # a record's start in a.tfrecord, inside one of b.tfrecord's
    assert offset not in np.cumsum([len(r.numpy()) + 16
                                    for r in tf.data.TFRecordDataset(changed)])
    # What the resumed reader raised (TensorFlow's text, its position in the old records).
    error = tf.errors.DataLossError(
        None, None, "Graph execution error:\n\n{{function_node __wrapped__IteratorGetNext"
                    f"_device_/job:localhost}}}} corrupted record at {offset}\n\t [[{{{{node "
                    "x}}}}]]")
    with pytest.raises(record_checks.RecordFileError) as info:
        with record_checks.naming_bad_records((str(tmp_path / "*.tfrecord"),)):
            raise error
    message = str(info.value)
    assert message.startswith(f"{changed}: every record reads from the start, but reading "
                              "on from where the run was failed (corrupted record at "
                              f"{offset}): the file changed since the checkpoint"), message


@pytest.mark.parametrize("runner", ["run_classifier", "run_squad", "run_ner", "run_swag",
                                    "glue_submission", "extract_features"])
def test_a_vocab_without_the_special_tokens_is_refused_in_one_line(runner, tmp_path):
    """Issue 38 #9: run_classifier ended in a traceback (KeyError: '[CLS]') where the data
    tools refuse the same vocab in one line; every runner now refuses it, before reading
    any data, with the data tools' check (`tokenization.check_vocab`)."""
    from tests.test_flags_used import RUNNERS

    vocab = write_vocab(tmp_path / "vocab.txt", [t for t in TINY_VOCAB if t != "[CLS]"])
    argv = [arg for arg in RUNNERS.get(runner, []) if not arg.startswith("--vocab_file")]
    if runner == "extract_features":  # its checkpoint is checked first: a real one
        from modeling import checkpoints
        from modeling.config import BertConfig
        from modeling.encoder import BertEncoder

        config = _write_config(tmp_path / "bert_config.json")
        checkpoints.save_ours(BertEncoder(BertConfig.from_json_file(config)),
                              str(tmp_path / "ckpt"), BertConfig.from_json_file(config))
        argv = [f"--input_file={vocab}", f"--output_file={tmp_path / 'features.jsonl'}",
                f"--init_checkpoint={tmp_path / 'ckpt'}", f"--bert_config_file={config}",
                "--layers=-1"]
    result = call_main(runner, [*argv, f"--vocab_file={vocab}"], cwd=tmp_path)
    assert result.code == 1, result.stderr[-2000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.endswith(f": error: --vocab_file: vocab file {vocab!r} lacks required "
                         f"token(s) [CLS] ({len(TINY_VOCAB) - 1} tokens read); is it a BERT "
                         "vocab.txt?"), result.stderr[-2000:]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("runner", ["run_classifier", "run_squad", "run_ner", "run_swag",
                                    "glue_submission"])
def test_a_cased_vocab_with_lower_casing_is_refused_in_one_line(runner, tmp_path):
    """The original's runners refused --do_lower_case against a checkpoint of the other
    casing (`validate_case_matches_checkpoint`, by Google's checkpoint names); every
    fine-tuning runner refuses it from the vocab itself (`tokenization.check_case`),
    before reading any data: lower-cased text never reaches a cased vocab's capitals."""
    from tests.test_flags_used import RUNNERS

    words = TINY_VOCAB + ["The", "Cat", "Dog"]
    vocab = write_vocab(tmp_path / "vocab.txt", words)
    plain = sum(1 for t in words if not (t.startswith("[") and t.endswith("]")))
    argv = [arg for arg in RUNNERS.get(runner, []) if not arg.startswith("--vocab_file")]
    result = call_main(runner, [*argv, f"--vocab_file={vocab}"], cwd=tmp_path)
    assert result.code == 1, result.stderr[-2000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.endswith(f": error: --do_lower_case=true but vocab file {vocab!r} is cased: "
                         f"3 of its {plain} tokens hold capital letters "
                         "(e.g. 'The'), which lower-cased text never produces; pass "
                         "--do_lower_case=false"), result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_eval_from_a_checkpoint_without_the_task_head_is_refused(tmp_path):
    """Issue 38: --do_eval without training from a pretraining checkpoint evaluated a
    random classifier head; without --do_train every weight must come from a checkpoint
    (eval without weights is an error), so the missing head is named instead."""
    from modeling import checkpoints
    from modeling.config import BertConfig
    from modeling.models import BertPretrainer

    config = _write_config(tmp_path / "bert_config.json", vocab_size=len(TINY_VOCAB))
    bert_config = BertConfig.from_json_file(config)
    prefix = checkpoints.export_tf1_checkpoint(BertPretrainer(bert_config), bert_config,
                                               str(tmp_path / "pretrained"))
    data = _pair_data(tmp_path / "data")
    out = tmp_path / "out"
    result = call_main(
        "run_classifier", task_name="custom", data_dir=data, text_a_column="text",
        text_b_column="text2", label_column="label", vocab_file=write_vocab(
            tmp_path / "vocab.txt"), bert_config_file=config, init_checkpoint=prefix,
        output_dir=out, do_eval="true", max_seq_length=16,
        distribution_strategy="one_device")
    assert result.code == 1, result.stderr[-2000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"run_classifier.py: error: --init_checkpoint={prefix} has no "
                           "weights for "), line
    assert "classifier" in line and "add --do_train" in line, line
    assert not (out / "eval_results.txt").exists()


def test_a_max_seq_length_without_room_for_text_is_warned_about(tmp_path, caplog):
    """Issue 38: --max_seq_length=2 trained and evaluated on [CLS] [SEP] alone, silently."""
    from training import finetuning

    vocab = write_vocab(tmp_path / "vocab.txt")
    for length, warned in ((2, True), (3, False)):
        settings, _ = finetuning.settings_from(
            vocab_file=vocab, bert_config_file="c.json", output_dir=str(tmp_path / "out"),
            do_train=True, max_seq_length=length)
        caplog.clear()
        finetuning.validate(settings)
        found = [r.getMessage() for r in caplog.records if "leaves no room for text" in
                 r.getMessage()]
        assert [m.startswith("--max_seq_length=2 leaves no room") for m in found] == (
            [True] if warned else []), caplog.text
