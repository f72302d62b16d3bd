"""SQuAD reading, windowed features and TFRecords (tasks/squad/data.py, parts 1-3).

The helpers at the top (corpus, vocab from the test's own texts, answer spans) are shared
with test_squad_postprocess.py.
"""

import json
import os

from types import SimpleNamespace

import numpy as np
import pytest

from tasks.squad import data as squad
from data_prep import reference_tokenization, tokenization
from data_prep.cli import UserError
from tests.conftest import write_vocab

# Contexts with punctuation, accents, numbers, quotes and dashes; long enough together to
# need several windows at a small max_seq_length.
SENTENCES = [
    "The Zürich café opened in 1895 (closed 1943), serving crème brûlée to 1,234 guests.",
    "Dr. O'Neill's naïve theory, later called \"the Smith-Jones effect\", appeared on "
    "12 March 2001.",
    "Über 3.5% of Élodie's students scored 97/100; the rest failed!",
    "Its GDP grew by $4.2 billion in Q3, according to the U.S. Department of Commerce.",
    "São Paulo, Montréal and Kraków hosted the 2nd annual hackathon at 10:30 a.m. sharp.",
    "Photosynthesis converts carbon dioxide and water into glucose [C6H12O6] and oxygen.",
    "In 1969, Apollo 11 landed near Mare Tranquillitatis; Armstrong stepped out first.",
    "The Brontë sisters, Charlotte, Emily and Anne, wrote under the pseudonyms Currer, "
    "Ellis and Acton Bell.",
    "Mount Everest (8,848.86 m) straddles the border between Nepal and the Tibet region.",
    "Beethoven's Ninth Symphony premiered in Vienna on 7 May 1824 to thunderous applause.",
    "A kilogram of feathers weighs exactly as much as a kilogram of lead, obviously.",
    "The Amazon rainforest covers roughly 5.5 million km² across nine countries.",
]
SHORT_CONTEXT = "The cat sat on the mat in 1999, far away from home."
QUESTION_WORDS = "what when who where which how many is was the did of in does named"

PUNCT = reference_tokenization.is_punctuation  # the tokenizer's own predicate


def build_vocab_tokens(texts, do_lower_case):
    """A WordPiece vocab covering `texts`: short words whole, longer words as pieces.

    Every character also exists as a word start and as a `##` piece, so nothing becomes
    [UNK]; long words are split into a 4-character head and 3-character `##` pieces, so
    answers cross sub-token boundaries.
    """
    basic = reference_tokenization.BasicTokenizer(do_lower_case=do_lower_case)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    seen = set(vocab)

    def add(token):
        if token not in seen:
            seen.add(token)
            vocab.append(token)

    for text in texts:
        for word in basic.tokenize(text):
            for ch in word:
                add(ch)
                add("##" + ch)
            if len(word) <= 6:
                add(word)
            else:
                add(word[:4])
                for i in range(4, len(word), 3):
                    add("##" + word[i:i + 3])
    return vocab


def make_tokenizer(tmp_path, texts, do_lower_case, name="vocab.txt"):
    path = write_vocab(tmp_path / name, build_vocab_tokens(texts, do_lower_case))
    return tokenization.FullTokenizer(path, do_lower_case=do_lower_case), path


def basic_pieces(context):
    """Character spans [start, end) of the pieces BasicTokenizer makes of `context`
    (punctuation characters alone, other runs of non-space characters together)."""
    spans = []
    i = 0
    while i < len(context):
        if context[i].isspace():
            i += 1
        elif PUNCT(context[i]):
            spans.append((i, i + 1))
            i += 1
        else:
            j = i
            while j < len(context) and not context[j].isspace() and not PUNCT(context[j]):
                j += 1
            spans.append((i, j))
            i = j
    return spans


def squad_json(paragraphs, version="1.1"):
    """paragraphs: list of (context, [qa dict]) -> a SQuAD JSON object."""
    return {
        "version": version,
        "data": [{
            "title": "Test",
            "paragraphs": [{"context": c, "qas": qas} for c, qas in paragraphs],
        }],
    }


def qa(qid, question, context=None, answer=None, start=None, impossible=None, answers=None):
    entry = {"id": qid, "question": question}
    if answers is not None:
        entry["answers"] = answers
    elif answer is not None:
        if start is None:
            start = context.index(answer)
        entry["answers"] = [{"text": answer, "answer_start": start}]
    else:
        entry["answers"] = []
    if impossible is not None:
        entry["is_impossible"] = impossible
    return entry


def write_json(tmp_path, obj, name="data.json"):
    path = tmp_path / name
    path.write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
    return str(path)


# ---------------------------------------------------------------------------------------
# Reading


def test_split_context_maps_characters_to_words_with_original_whitespace():
    text = " ab\tc\u202fd  e\u00a0f\n"
    tokens, offsets = squad.split_context(text)
    # U+202F splits words, U+00A0 does not (the original's is_whitespace).
    assert tokens == ["ab", "c", "d", "e\u00a0f"]
    assert offsets == [-1, 0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    assert len(offsets) == len(text)


def test_read_training_examples_locates_answers(tmp_path):
    context = "The leader was John Smith (1895-1943). He ruled."
    data = squad_json([(context, [
        qa("q1", "Who led?", context, "John Smith"),
        qa("q2", "Born when?", context, "1895"),
    ])])
    examples, skipped = squad.read_squad_examples(write_json(tmp_path, data), is_training=True)
    assert skipped == []
    assert [e.qas_id for e in examples] == ["q1", "q2"]
    assert examples[0].doc_tokens[examples[0].start_position:examples[0].end_position + 1] == [
        "John", "Smith"]
    assert examples[1].doc_tokens[examples[1].start_position] == "(1895-1943)."
    assert examples[1].orig_answer_text == "1895"


def test_prediction_examples_need_no_answers(tmp_path):
    data = squad_json([(SHORT_CONTEXT, [{"id": "q", "question": "Where?"}])])
    examples, skipped = squad.read_squad_examples(write_json(tmp_path, data), is_training=False)
    assert len(examples) == 1 and examples[0].start_position is None and skipped == []


def test_answer_start_pointing_elsewhere_is_skipped_and_counted(tmp_path):
    context = SHORT_CONTEXT
    data = squad_json([(context, [
        qa("good", "Who sat?", context, "cat"),
        qa("wrong_offset", "Where?", context, "mat", start=context.index("far")),
        qa("past_end", "When?", context, "1999", start=len(context) + 5),
        qa("negative", "When?", context, "1999", start=-3),
    ])])
    examples, skipped = squad.read_squad_examples(write_json(tmp_path, data), is_training=True)
    assert [e.qas_id for e in examples] == ["good"]
    assert [s.qas_id for s in skipped] == ["wrong_offset", "past_end", "negative"]
    assert "'mat'" in skipped[0].reason and "far" in skipped[0].reason


def test_malformed_json_names_file_and_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"version": "1.1",\n "data": [}', encoding="utf-8")
    with pytest.raises(squad.SquadFormatError, match=r"bad\.json: not valid JSON \(line 2"):
        squad.read_squad_examples(str(path), is_training=False)


def test_a_file_that_is_not_utf8_names_file_line_and_byte(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"version": "1.1",\n "data": ["caf\xe9"]}')
    with pytest.raises(UserError, match=r"latin1\.json:2: invalid UTF-8 at byte offset 33 "):
        squad.read_squad_examples(str(path), is_training=True)
    with pytest.raises(UserError, match=r"latin1\.json:2: invalid UTF-8"):
        squad.load_squad_json(str(path))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        squad.read_squad_examples(str(tmp_path / "nope.json"), is_training=False)


@pytest.mark.parametrize("mutate, pattern", [
    (lambda d: d.pop("data"), r"missing field 'data'"),
    (lambda d: d["data"][0]["paragraphs"][0].pop("context"),
     r"data\[0\]\.paragraphs\[0\]: missing field 'context'"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1].pop("question"),
     r"question id 'q2': missing field 'question'"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1].pop("id"),
     r"qas\[1\]: missing field 'id'"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1].pop("answers"),
     r"question id 'q2': missing field 'answers'"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1]["answers"][0].update(answer_start="7"),
     r"question id 'q2' answers\[0\]: field 'answer_start' should be an integer, found str"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1]["answers"].append(
        {"text": "cat", "answer_start": 4}),
     r"question id 'q2': for training, each answerable question needs exactly 1 answer, found 2"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][1].update(is_impossible=True, answers=[]),
     r"question id 'q2': is_impossible is true but version_2_with_negative is off"),
])
def test_missing_or_wrong_fields_are_errors_naming_the_place(tmp_path, mutate, pattern):
    context = SHORT_CONTEXT
    data = squad_json([(context, [qa("q1", "Who?", context, "cat"),
                                  qa("q2", "Where?", context, "mat")])])
    mutate(data)
    with pytest.raises(squad.SquadFormatError, match=pattern):
        squad.read_squad_examples(write_json(tmp_path, data), is_training=True)


@pytest.mark.parametrize("is_training,v2", [(True, False), (False, False), (True, True),
                                            (False, True)])
def test_a_question_id_used_twice_is_refused_naming_id_file_and_places(tmp_path,
                                                                       is_training, v2):
    """Issue 22: duplicate ids were silently merged (one answer per id downstream). Across
    paragraphs and articles, 7 and "7" (one predictions.json key), and when the first of
    the two is a training question skipped for its answer."""
    context = SHORT_CONTEXT
    impossible = {"impossible": False} if v2 else {}

    def at(paragraph, question):
        return rf"data\[0\]\.paragraphs\[{paragraph}\]\.qas\[{question}\]"

    cases = [
        ([(context, [qa("q1", "Who?", context, "cat", **impossible)]),
          (context, [qa("q2", "Where?", context, "mat", **impossible),
                     qa("q1", "Why?", context, "cat", **impossible)])],
         "'q1'", f"{at(0, 0)} and {at(1, 1)}"),
        ([(context, [qa(7, "Who?", context, "cat", **impossible)]),
          (context, [qa("7", "Who?", context, "mat", **impossible)])],
         "'7'", f"{at(0, 0)} and {at(1, 0)}"),
        ([(context, [qa("bad", "Who?", context, "zebra", start=0, **impossible),
                     qa("bad", "Who?", context, "cat", **impossible)])],
         "'bad'", f"{at(0, 0)} and {at(0, 1)}"),
    ]
    for paragraphs, qid, places in cases:
        data = squad_json(paragraphs, version="v2.0" if v2 else "1.1")
        path = write_json(tmp_path, data)
        with pytest.raises(squad.SquadFormatError,
                           match=rf"data\.json: question id {qid} is used twice, at {places}"):
            squad.read_squad_examples(path, is_training=is_training,
                                      version_2_with_negative=v2)
    # Across articles too.
    data = squad_json([(context, [qa("a", "Who?", context, "cat", **impossible)])])
    data["data"].append(squad_json([(context, [qa("a", "Who?", context, "cat",
                                                   **impossible)])])["data"][0])
    with pytest.raises(squad.SquadFormatError, match=r"'a' is used twice.*data\[1\]"):
        squad.read_squad_examples(write_json(tmp_path, data), is_training=is_training,
                                  version_2_with_negative=v2)


def test_v2_impossible_questions(tmp_path):
    context = SHORT_CONTEXT
    data = squad_json([(context, [
        qa("pos", "Who?", context, "cat", impossible=False),
        qa("neg", "Why?", impossible=True),
    ])], version="v2.0")
    examples, _ = squad.read_squad_examples(
        write_json(tmp_path, data), is_training=True, version_2_with_negative=True)
    assert not examples[0].is_impossible and examples[0].start_position == 1
    assert examples[1].is_impossible and examples[1].start_position == -1
    assert examples[1].orig_answer_text == ""


# ---------------------------------------------------------------------------------------
# Features


def test_improve_answer_span_finds_the_exact_sub_tokens(tmp_path):
    context = "The leader was John Smith (1895-1943). He ruled."
    tokenizer, _ = make_tokenizer(tmp_path, [context], do_lower_case=True)
    doc = tokenizer.tokenize("(1895-1943).")
    assert squad.improve_answer_span(doc, 0, len(doc) - 1, tokenizer, "1895") == (1, 1)
    # No exact sub-span: the word span stays.
    assert squad.improve_answer_span(doc, 0, len(doc) - 1, tokenizer, "189") == (0, len(doc) - 1)


def test_doc_spans_and_max_context():
    spans = squad.doc_spans_for(10, 4, 3)
    assert spans == [(0, 4), (3, 4), (6, 4)]
    best = squad.max_context_span_index(spans, 10)
    # Token 3: span0 has (3 left, 0 right), span1 (0, 3): tie on min -> earliest span.
    assert best == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert squad.doc_spans_for(0, 4, 3) == []
    assert squad.doc_spans_for(3, 4, 3) == [(0, 3)]
    # A stride larger than the window still ends at the last token.
    assert squad.doc_spans_for(9, 4, 6) == [(0, 4), (4, 4), (8, 1)]


def long_context_example_set(tmp_path, do_lower_case):
    context = " ".join(SENTENCES)
    qas = [qa("q-glucose", "What is made from carbon dioxide and water?", context, "glucose"),
           qa("q-last", "What is covered?", context, "nine countries.")]
    texts = SENTENCES + [QUESTION_WORDS] + [q["question"] for q in qas]
    tokenizer, _ = make_tokenizer(tmp_path, texts, do_lower_case)
    examples, _ = squad.examples_from_json(squad_json([(context, qas)]), is_training=True)
    return tokenizer, examples


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_windows_layout_and_training_positions(tmp_path, do_lower_case):
    tokenizer, examples = long_context_example_set(tmp_path, do_lower_case)
    config = squad.WindowConfig(max_seq_length=48, doc_stride=16, max_query_length=8)
    features = squad.convert_examples_to_features(examples, tokenizer, config, is_training=True)
    assert [f.unique_id for f in features] == list(range(1000000000, 1000000000 + len(features)))
    doc_tokens = [t for w in examples[0].doc_tokens for t in tokenizer.tokenize(w)]
    assert "[UNK]" not in doc_tokens
    for ex_index, example in enumerate(examples):
        windows = [f for f in features if f.example_index == ex_index]
        assert len(windows) >= 4
        assert [f.doc_span_index for f in windows] == list(range(len(windows)))
        query = tokenizer.tokenize(example.question_text)[:8]
        assert "[UNK]" not in query
        scored = {}
        hits = 0
        for f in windows:
            n = len(f.tokens)
            assert f.tokens[:len(query) + 2] == ["[CLS]", *query, "[SEP]"]
            assert f.tokens[-1] == "[SEP]"
            assert len(f.input_ids) == len(f.input_mask) == len(f.segment_ids) == 48
            assert f.input_ids[:n] == tokenizer.convert_tokens_to_ids(f.tokens)
            assert f.input_mask == [1] * n + [0] * (48 - n)
            q = len(query) + 2
            assert f.segment_ids == [0] * q + [1] * (n - q) + [0] * (48 - n)
            assert sorted(f.token_to_orig_map) == list(range(len(query) + 2, n - 1))
            # Windows start doc_stride sub-tokens apart.
            first = f.doc_span_index * 16
            for k, pos in enumerate(sorted(f.token_to_orig_map)):
                assert f.tokens[pos] == doc_tokens[first + k]
                if f.token_is_max_context[pos]:
                    assert first + k not in scored
                    scored[first + k] = f.doc_span_index
            if f.start_position:
                hits += 1
                assert f.tokens[f.start_position:f.end_position + 1] == tokenizer.tokenize(
                    example.orig_answer_text)
            else:
                assert f.end_position == 0
        assert sorted(scored) == list(range(len(doc_tokens)))  # every token scored once
        assert hits >= 1


def test_impossible_training_positions_are_cls(tmp_path):
    tokenizer, _ = make_tokenizer(tmp_path, [SHORT_CONTEXT, QUESTION_WORDS], True)
    data = squad_json([(SHORT_CONTEXT, [qa("neg", "Why?", impossible=True)])])
    examples, _ = squad.examples_from_json(data, is_training=True, version_2_with_negative=True)
    (feature,) = squad.convert_examples_to_features(examples, tokenizer, is_training=True)
    assert (feature.start_position, feature.end_position, feature.is_impossible) == (0, 0, True)


@pytest.mark.parametrize("changes, message", [
    (dict(n_best_size=0), r"--n_best_size=0 must be a positive whole number"),
    (dict(max_answer_length=-1), r"--max_answer_length=-1 must be a positive whole number"),
    (dict(doc_stride=0), r"--doc_stride=0 must be at least 1"),
])
@pytest.mark.parametrize("do_predict", [False, True])
def test_settings_are_refused_before_any_work(tmp_path, changes, message, do_predict):
    """Answer settings too, though only prediction uses them: a training run must not
    spend its hours before they are refused."""
    run = SimpleNamespace(do_train=True, do_predict=do_predict, do_eval=False,
                          max_seq_length=48)
    settings = squad.SquadSettings(train_file="t.json", predict_file="p.json",
                                   max_query_length=12, **changes)
    with pytest.raises(UserError, match=message):
        settings.validate(run)
    squad.SquadSettings(train_file="t.json", predict_file="p.json",
                        max_query_length=12).validate(run)


def test_window_config_validation():
    with pytest.raises(ValueError, match=r"max_seq_length \(67\) must be greater"):
        squad.WindowConfig(max_seq_length=67, max_query_length=64)
    with pytest.raises(ValueError, match="doc_stride"):
        squad.WindowConfig(doc_stride=0)


# ---------------------------------------------------------------------------------------
# Storage


@pytest.mark.parametrize("is_training", [True, False])
def test_tfrecords_round_trip_atomically(tmp_path, is_training):
    import tensorflow as tf

    tokenizer, examples = long_context_example_set(tmp_path, True)
    config = squad.WindowConfig(max_seq_length=40, doc_stride=16, max_query_length=8)
    features = squad.convert_examples_to_features(
        examples, tokenizer, config, is_training=is_training)
    path = str(tmp_path / "out" / "train.tf_record")
    assert squad.write_squad_tfrecord(features, path, is_training) == len(features)
    assert sorted(os.listdir(tmp_path / "out")) == ["train.tf_record"]
    parse = squad.squad_schema(is_training).parser(max_seq_length=40)
    records = [parse(r) for r in tf.data.TFRecordDataset(path)]
    assert len(records) == len(features)
    for f, r in zip(features, records):
        values = squad.squad_record_values(f, is_training)
        assert set(r) == set(values)
        for name, v in values.items():
            np.testing.assert_array_equal(r[name].numpy(), np.asarray(v, dtype=np.int32))
    assert ("start_positions" in records[0]) == is_training


def test_record_writer_leaves_nothing_on_failure(tmp_path):
    def interrupted():
        raise RuntimeError("interrupted")
        yield

    with pytest.raises(RuntimeError):
        squad.write_squad_tfrecord(interrupted(), str(tmp_path / "eval.tf_record"), False)
    assert os.listdir(tmp_path) == []


def test_prediction_sidecar_round_trip(tmp_path):
    tokenizer, examples = long_context_example_set(tmp_path, False)
    config = squad.WindowConfig(max_seq_length=40, doc_stride=16, max_query_length=8)
    features = squad.convert_examples_to_features(examples, tokenizer, config, is_training=False)
    path = str(tmp_path / "eval_features.json")
    squad.save_prediction_features(features, path, max_seq_length=40)
    loaded, metadata = squad.load_prediction_features(path)
    assert metadata == {"max_seq_length": 40}
    for a, b in zip(features, loaded, strict=True):
        for field in ("unique_id", "example_index", "doc_span_index", "tokens",
                      "token_to_orig_map", "token_is_max_context"):
            assert getattr(a, field) == getattr(b, field)
            assert list(getattr(b, "token_to_orig_map")) == list(a.token_to_orig_map)


def test_prepare_records_caches_and_invalidates(tmp_path):
    import random

    context = " ".join(SENTENCES[:4])
    qas = [qa(f"q{k}", "What is it?", context, w) for k, w in
           enumerate(["café", "1895", "Élodie's", "GDP", "guests."])]
    data_file = write_json(tmp_path, squad_json([(context, qas)]))
    _, vocab_file = make_tokenizer(tmp_path, SENTENCES + [QUESTION_WORDS], True)
    config = squad.WindowConfig(max_seq_length=40, doc_stride=16, max_query_length=8)
    out = str(tmp_path / "out")
    kwargs = dict(vocab_file=vocab_file, do_lower_case=True, config=config)

    train = squad.prepare_squad_records(data_file, out, is_training=True, **kwargs)
    assert not train.reused and train.num_examples == 5
    assert train.record_file.endswith("train.tf_record") and train.examples is None
    again = squad.prepare_squad_records(data_file, out, is_training=True, **kwargs)
    assert again.reused and again.metadata == train.metadata
    # The original pre-shuffles training examples with random.Random(12345).
    import tensorflow as tf
    tokenizer = tokenization.FullTokenizer(vocab_file, do_lower_case=True)
    examples, _ = squad.read_squad_examples(data_file, is_training=True)
    random.Random(12345).shuffle(examples)
    assert [e.qas_id for e in examples] != [q["id"] for q in qas]
    expected = squad.convert_examples_to_features(examples, tokenizer, config, is_training=True)
    parse = squad.SQUAD_TRAIN_SCHEMA.parser(max_seq_length=40)
    records = [parse(r) for r in tf.data.TFRecordDataset(train.record_file)]
    assert len(records) == len(expected) == train.num_features
    for r, f in zip(records, expected):
        for name, v in squad.squad_record_values(f, True).items():
            assert r[name].numpy().tolist() == list(v)

    pred = squad.prepare_squad_records(data_file, out, is_training=False, **kwargs)
    assert not pred.reused and [e.qas_id for e in pred.examples] == [q["id"] for q in qas]
    cached = squad.prepare_squad_records(data_file, out, is_training=False, **kwargs)
    assert cached.reused
    assert [f.token_to_orig_map for f in cached.features] == [
        f.token_to_orig_map for f in pred.features]
    assert sorted(os.listdir(out)) == [
        "eval.tf_record", "eval.tf_record.metadata.json", "eval_features.json",
        "train.tf_record", "train.tf_record.metadata.json"]

    changed = squad.prepare_squad_records(
        data_file, out, is_training=True, **{**kwargs, "config": squad.WindowConfig(
            max_seq_length=48, doc_stride=16, max_query_length=8)})
    assert not changed.reused


def test_damaged_cached_records_or_metadata_are_rebuilt(tmp_path):
    """The cache checks what every family's checks (tasks.common.record_cache): a record
    file of another size, or metadata that is not JSON, is rebuilt, not reused or fatal."""
    context = " ".join(SENTENCES[:2])
    data_file = write_json(tmp_path, squad_json([(context, [qa("q0", "What?", context,
                                                               "café")])]))
    _, vocab_file = make_tokenizer(tmp_path, SENTENCES + [QUESTION_WORDS], True)
    kwargs = dict(vocab_file=vocab_file, do_lower_case=True, is_training=True,
                  config=squad.WindowConfig(max_seq_length=40, doc_stride=16,
                                            max_query_length=8))
    out = str(tmp_path / "out")
    first = squad.prepare_squad_records(data_file, out, **kwargs)
    size = os.path.getsize(first.record_file)
    with open(first.record_file, "r+b") as f:
        f.truncate(size - 5)  # a damaged copy
    again = squad.prepare_squad_records(data_file, out, **kwargs)
    assert not again.reused and os.path.getsize(again.record_file) == size
    with open(again.metadata_file, "w") as f:
        f.write("{half written")
    assert not squad.prepare_squad_records(data_file, out, **kwargs).reused
