"""Every writer of an all-or-nothing output goes through fileio's synced path (issue 23 §3).

Each writer below runs for real with the syscalls recorded (`test_fileio.Syscalls`): every
file it leaves under a final name was synced under its temporary name, then renamed, and
its directory synced after the rename. A writer that wrote in place, or renamed an unsynced
temporary (as several did), fails here.
"""

import os

from conftest import write_vocab
from tests.test_fileio import Syscalls


def assert_durable(calls, directory, names=None):
    """Every file in `directory` (or those of `names`) was synced as a temporary, renamed
    into place, and the directory synced after that rename."""
    from data_prep import fileio

    names = sorted(os.listdir(directory)) if names is None else names
    assert names, "nothing was written"
    for name in names:
        final = os.path.join(directory, name)
        renames = [i for i, call in enumerate(calls)
                   if call[0] in ("rename", "exchange") and call[2] == final]
        assert renames, f"{final} was not renamed into place: {calls}"
        at = renames[-1]
        temp = calls[at][1]
        assert fileio.is_temporary(temp), calls[at]
        assert ("fsync", temp) in calls[:at], f"{final}: data not synced before its rename"
        assert ("fsync", str(directory)) in calls[at + 1:], \
            f"{final}: directory not synced after the rename"


def test_bert_config_and_run_identity(tmp_path, monkeypatch):
    from modeling.config import BertConfig
    from training.output_claim import RunDir

    calls = Syscalls(monkeypatch).calls
    BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64).to_json_file(str(tmp_path / "bert_config.json"))
    RunDir(str(tmp_path), {"model": "tiny"}).commit()
    assert sorted(os.listdir(tmp_path)) == ["bert_config.json", "run_identity.json"]
    assert_durable(calls, tmp_path)


def test_model_files_beside_the_checkpoints(tmp_path, monkeypatch):
    from modeling.config import BertConfig
    from modeling.export.metadata import ExportMetadata
    from training import trainer_setup

    vocab = write_vocab(tmp_path / "vocab_in.txt")
    out = tmp_path / "run"
    calls = Syscalls(monkeypatch).calls
    trainer_setup.write_model_files(str(out), BertConfig(vocab_size=99, hidden_size=32,
                                                num_hidden_layers=2, num_attention_heads=2,
                                                intermediate_size=64),
                           vocab, ExportMetadata(task="mrpc", labels=("0", "1")))
    assert sorted(os.listdir(out)) == ["bert_config.json", "export_metadata.json",
                                       "vocab.txt"]
    assert (out / "vocab.txt").read_bytes() == (tmp_path / "vocab_in.txt").read_bytes()
    assert_durable(calls, out)


def test_converted_checkpoints(tmp_path, monkeypatch):
    """convert_checkpoint's Hugging Face export (model.safetensors, config.json, vocab)
    and our own (TensorFlow writes the .index/.data files in a scratch folder; they are
    synced and renamed into place with the `checkpoint` state and bert_config.json)."""
    from modeling import checkpoints
    from modeling.config import BertConfig
    from modeling.encoder import BertEncoder

    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=64)
    encoder = BertEncoder(config)
    vocab = write_vocab(tmp_path / "vocab.txt")
    calls = Syscalls(monkeypatch).calls
    checkpoints.export_hf_checkpoint(encoder, config, str(tmp_path / "hf"), vocab_file=vocab)
    assert sorted(os.listdir(tmp_path / "hf")) == ["config.json", "model.safetensors",
                                                   "vocab.txt"]
    assert_durable(calls, tmp_path / "hf")
    del calls[:]
    checkpoints.save_ours(encoder, str(tmp_path / "ours"), config)
    assert sorted(os.listdir(tmp_path / "ours")) == [
        "bert_config.json", "checkpoint", "ckpt.data-00000-of-00001", "ckpt.index"]
    assert_durable(calls, tmp_path / "ours")


def test_converted_checkpoint_is_one_set(tmp_path):
    """A conversion that fails part-way (here: its vocab cannot be read) leaves the
    previous conversion's files as they were, never new weights beside an old config
    (each file was written on its own, the checkpoint under its final names)."""
    import pytest

    from modeling import checkpoints
    from modeling.config import BertConfig
    from modeling.encoder import BertEncoder

    def config(hidden):
        return BertConfig(vocab_size=99, hidden_size=hidden, num_hidden_layers=2,
                          num_attention_heads=2, intermediate_size=64,
                          max_position_embeddings=64)

    vocab = write_vocab(tmp_path / "vocab.txt")
    missing = str(tmp_path / "no_vocab.txt")
    for name, write in (("tf1", checkpoints.export_tf1_checkpoint),
                        ("hf", checkpoints.export_hf_checkpoint),
                        ("ours", lambda m, c, d, vocab_file: checkpoints.save_ours(
                            m, d, c, vocab_file))):
        out = tmp_path / name
        write(BertEncoder(config(32)), config(32), str(out), vocab_file=vocab)
        before = {n: (out / n).read_bytes() for n in os.listdir(out)}
        with pytest.raises(OSError):
            write(BertEncoder(config(64)), config(64), str(out), vocab_file=missing)
        assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before, name


def test_squad_records(tmp_path, monkeypatch):
    from tasks.squad import data as squad

    out = tmp_path / "squad"
    calls = Syscalls(monkeypatch).calls
    assert squad.write_squad_tfrecord([], str(out / "eval.tf_record"), is_training=False) == 0
    assert os.listdir(out) == ["eval.tf_record"]
    assert_durable(calls, out)


def test_sample_corpus(tmp_path, monkeypatch):
    from data_prep import sample_corpus

    calls = Syscalls(monkeypatch).calls
    summary = sample_corpus.write_corpus(str(tmp_path / "corpus"), max_documents=6,
                                         num_shards=2)
    assert sorted(os.listdir(tmp_path / "corpus")) == sorted(
        os.path.basename(f) for f in summary.files)
    assert_durable(calls, tmp_path / "corpus")


def test_create_pretraining_data_records_and_summary(tmp_path, monkeypatch):
    """The CLI's set (records + summary), written in this process (one worker)."""
    from data_prep import create_pretraining_data as cpd
    from data_prep.pretraining_cli import summary_path_for
    from data_prep.pretraining_data.config import PretrainingConfig

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join("the cat sat on the mat .\nthe dog ran far away ."
                                  for _ in range(40)) + "\n", encoding="utf-8")
    vocab = write_vocab(tmp_path / "vocab.txt")
    out = tmp_path / "out"
    out.mkdir()
    outputs = [str(out / "train.tfrecord")]
    calls = Syscalls(monkeypatch).calls
    cpd.generate(PretrainingConfig(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2),
                 [str(corpus)], outputs, vocab_file=vocab, do_lower_case=True, seed=1,
                 num_workers=1, gzip=False, chunk_bytes=0, shuffle_buffer_size=100,
                 progress_seconds=100, summary_path=summary_path_for(outputs[0]))
    assert sorted(os.listdir(out)) == ["_train.tfrecord.summary.json", "train.tfrecord"]
    assert_durable(calls, out)


def test_demo_files(tmp_path, monkeypatch):
    """demo.py's own outputs (the model's bert_config.json, demo_summary.json) were
    written in place with `open` (a kill left a partial file under the final name)."""
    import demo
    from demo_lib.settings import QUICK, Settings
    from demo_lib.summary import write_summary

    settings = Settings(output_dir=str(tmp_path), max_seq_length=64,
                        max_predictions_per_seq=10, num_workers=1, random_seed=1,
                        quick=True, **QUICK)
    write_vocab(tmp_path / "vocab.txt")
    calls = Syscalls(monkeypatch).calls
    demo.write_bert_config(settings)
    write_summary(settings.path("demo_summary.json"), {"ok": True})
    assert_durable(calls, tmp_path, ["bert_config.json", "demo_summary.json"])
