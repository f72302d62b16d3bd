"""Multiple-choice data (tasks/multiple_choice/data.py) and model: SWAG's CSV with and without
labels, your own CSV and JSON lines, the choice pairs and their truncation, cached records,
errors that name the file and line, and BertMultipleChoice's per-choice encoding."""

import json

import numpy as np
import pytest
import tensorflow as tf

from tasks.multiple_choice import data
from tests.conftest import write_vocab

SWAG_HEADER = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"


def swag_row(i, sent1, sent2, endings, label=None):
    fields = [str(i), f"v{i}", str(i), f"{sent1} {sent2}", sent1, sent2, "gold"] + list(endings)
    if label is not None:
        fields.append(str(label))
    return ",".join(f'"{f}"' if ("," in f or "\n" in f) else f for f in fields)


def write_swag(path, rows, labels=True):
    header = SWAG_HEADER if labels else SWAG_HEADER.rsplit(",", 1)[0]
    path.write_text("\n".join([header] + rows) + "\n", encoding="utf-8")
    return str(path)


def test_swag_csv_with_and_without_labels(tmp_path):
    rows = [swag_row(0, "The cat sat.", "It", ["ran far.", "sat on a mat.", "is red.",
                                                "ran, away."], 1),
            swag_row(1, "A dog ran.", "The dog", ["sat.", "ran home.", "is big.", "far."], 1)]
    examples = data.read_examples(write_swag(tmp_path / "val.csv", rows))
    assert [e.label for e in examples] == [1, 1]
    assert examples[0].context == "The cat sat." and examples[0].question == "It"
    assert examples[0].endings[3] == "ran, away."  # quoted comma
    assert data.choice_texts(examples[0])[1] == ("The cat sat.", "It sat on a mat.")
    test_rows = [r.rsplit(",", 1)[0] for r in rows]
    test = data.read_examples(write_swag(tmp_path / "test.csv", test_rows, labels=False),
                              split="test")
    assert [e.label for e in test] == [None, None] and test[1].endings[1] == "ran home."


def test_custom_csv_and_jsonl_formats(tmp_path):
    (tmp_path / "train.csv").write_text(
        "q,premise,a,b,c,answer\nWhy?,The cat sat.,yes,no,maybe,no\n", encoding="utf-8")
    fmt = data.ChoiceFormat(context="premise", question="q", endings=("a", "b", "c"),
                            label="answer", label_is_text=True)
    (example,) = data.read_examples(str(tmp_path / "train.csv"), fmt)
    assert example.label == 1 and data.choice_texts(example)[2] == ("The cat sat.",
                                                                      "Why? maybe")
    lines = [{"ctx": "A dog ran.", "choices": ["far", "home", "away"], "gold": 2},
             {"ctx": "The cat sat.", "choices": ["on", "in", "at"], "gold": 0}]
    (tmp_path / "dev.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n",
                                        encoding="utf-8")
    fmt = data.ChoiceFormat(context="ctx", question=None, endings=("choices",), label="gold")
    examples = data.read_examples(str(tmp_path / "dev.jsonl"), fmt, split="dev")
    assert [e.label for e in examples] == [2, 0]
    assert data.choice_texts(examples[0])[0] == ("A dog ran.", "far")
    assert data.split_file(str(tmp_path), "dev").endswith("dev.jsonl")


@pytest.mark.parametrize("content,message", [
    ("", r"empty file"),
    (SWAG_HEADER + "\n", r"no examples"),
    (SWAG_HEADER.replace("ending2", "e2") + "\n", r":1: no column 'ending2'"),
    (SWAG_HEADER + '\n0,v,0,s,"two\nlines",s2,g,a,b,c,d,1\n1,v,1,s,x,y,g,a,b,c\n',
     r"val.csv:4: 10 fields, the header has 12"),
    (SWAG_HEADER + "\n0,v,0,s,x,y,g,a,b,c,d,4\n", r"val.csv:2: label 4 out of range"),
    (SWAG_HEADER + "\n0,v,0,s,x,y,g,a,b,c,d,one\n", r"label 'one' is not an ending index"),
    (SWAG_HEADER + "\n0,v,0,s,x,y,g,a,b,c,d,\n", r"val.csv:2: no label \('label'\) in a dev"),
])
def test_errors_name_the_file_and_line(tmp_path, content, message):
    path = tmp_path / "val.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(data.MultipleChoiceFormatError, match=message):
        data.read_examples(str(path), split="dev")


def test_another_number_of_choices_and_bad_json_are_named(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"c": "x", "e": ["a", "b"], "l": 0}\n{"c": "y", "e": ["a"], "l": 0}\n')
    fmt = data.ChoiceFormat(context="c", question=None, endings=("e",), label="l")
    with pytest.raises(data.MultipleChoiceFormatError, match=r"train.jsonl:2: 1 ending"):
        data.read_examples(str(path), fmt)
    path.write_text('{"c": "x", "e": ["a", "b", "c"], "l": 0}\n')
    with pytest.raises(data.MultipleChoiceFormatError, match=r"3 endings, but .* have 2"):
        data.read_examples(str(path), fmt, num_choices=2)
    path.write_text('{"c": "x", "e": ["a", "b"], "l": 0}\n{oops\n')
    with pytest.raises(data.MultipleChoiceFormatError, match=r"train.jsonl:2: not JSON"):
        data.read_examples(str(path), fmt)


def test_features_pair_each_choice_and_truncate_longest_first(tmp_path):
    from data_prep.tokenization import FullTokenizer

    tokenizer = FullTokenizer(write_vocab(tmp_path / "vocab.txt"), do_lower_case=True)
    example = data.ChoiceExample("g", "the cat sat on the mat", "the dog",
                                 ("ran far away", "sat"), 1)
    values, longest = data.convert_example(example, 2, 10, tokenizer)
    ids = np.array(values["input_ids"]).reshape(2, 10)
    tokens = [tokenizer.convert_ids_to_tokens([int(i) for i in row if i]) for row in ids]
    # 6 + 5 tokens do not fit in 10 - 3: the longer side loses its last token, b on ties.
    assert tokens[0] == ["[CLS]", "the", "cat", "sat", "on", "[SEP]", "the", "dog", "ran",
                         "[SEP]"]
    assert tokens[1] == ["[CLS]", "the", "cat", "sat", "on", "[SEP]", "the", "dog", "sat",
                         "[SEP]"]
    segments = np.array(values["segment_ids"]).reshape(2, 10)
    assert segments[1].tolist() == [0] * 6 + [1] * 4
    assert longest == 6 + 5 + 3 and values["label_ids"] == [1]
    padding, _ = data.convert_example(None, 2, 10, tokenizer)
    assert padding["is_real_example"] == [0] and not any(padding["input_mask"])


def test_records_round_trip_and_the_cache_is_reused(tmp_path):
    from tests.test_multiple_choice_data import swag_row as row

    d = tmp_path / "swag"
    d.mkdir()
    write_swag(d / "val.csv", [row(i, "the cat sat .", "the dog", ["ran", "sat", "far", "a"],
                                   i % 4) for i in range(5)])
    vocab = write_vocab(tmp_path / "vocab.txt")
    kwargs = dict(fmt=data.SWAG, vocab_file=vocab, do_lower_case=True, max_seq_length=12,
                  pad_to_multiple=4)
    cached = data.prepare_records(str(d), "dev", str(tmp_path / "out"), **kwargs)
    assert cached.num_examples == 5 and cached.metadata["num_records"] == 8
    spec = data.parse_spec(4, 12)
    rows = [tf.io.parse_single_example(r, spec) for r in
            tf.data.TFRecordDataset(cached.record_file)]
    assert len(rows) == 8 and rows[0]["input_ids"].shape == (4, 12)
    assert [int(r["label_ids"]) for r in rows[:5]] == [0, 1, 2, 3, 0]
    assert [int(r["is_real_example"]) for r in rows] == [1] * 5 + [0] * 3
    again = data.prepare_records(str(d), "dev", str(tmp_path / "out"), **kwargs)
    assert again.metadata == cached.metadata  # reused, not rewritten


def test_the_model_scores_each_choice_with_the_same_weights():
    """A [batch, choices, seq] batch gives the logits of C separate [batch, seq] calls."""
    from modeling.config import BertConfig
    from modeling.models import BertMultipleChoice

    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64)
    model = BertMultipleChoice(config)
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(5, 60, (3, 4, 8)).astype(np.int32),
             "input_mask": np.ones((3, 4, 8), np.int32),
             "segment_ids": np.zeros((3, 4, 8), np.int32)}
    batch["input_mask"][:, :, 6:] = 0
    logits = model(batch)["logits"].numpy()
    assert logits.shape == (3, 4)
    for choice in range(4):
        one = {k: v[:, choice] for k, v in batch.items()}
        pooled = model.encoder(one)["pooled_output"]
        expected = model.classifier(pooled).numpy()[:, 0]
        np.testing.assert_allclose(logits[:, choice], expected, atol=1e-5)
