"""Which runs each export family takes: the runners' export_metadata.json says what a run is
(its model_type, written by each task family's own code), and export_saved_model.py refuses
another family's run with an error naming the directory, what it holds and what was asked;
SQuAD runs record their windows and answer selection, which the export then uses."""

import json
import types

import keras
import pytest

from conftest import write_vocab
from modeling.export import families, registry
from modeling.export.metadata import (METADATA_FILE, ExportError, write_export_metadata,
                                      write_marker)
from modeling.models import BertClassifier, BertMultipleChoice, BertSpanLabeler
from test_export import SEQ, VOCAB, _cli, _config, _save_like_training

RUN_FAMILIES = ("classifier", "squad", "multiple_choice", "tagger")
# The encoder every run has: these families export any run's.
ENCODER_FAMILIES = ("encoder", "hub", "embedding")
SQUAD_SETTINGS = dict(doc_stride=12, max_query_length=8, max_answer_length=6, n_best_size=7)


def runner_metadata(run_type, data_dir):
    """The ExportMetadata the runner of `run_type` writes, from its task family's code:
    a regression classifier (STS-B), SQuAD v1.1, SWAG, a CoNLL tagger."""
    run = types.SimpleNamespace(do_lower_case=True, max_seq_length=SEQ)
    if run_type == "classifier":
        from tasks.classification.task import ClassificationFamily, ClassificationSettings

        family = ClassificationFamily(ClassificationSettings("sts-b", str(data_dir)), SEQ)
    elif run_type == "squad":
        from tasks.squad.data import SquadSettings
        from tasks.squad.task import SquadFamily

        family = SquadFamily(SquadSettings(**SQUAD_SETTINGS), SEQ)
    elif run_type == "multiple_choice":
        from tasks.multiple_choice.task import MultipleChoiceFamily, MultipleChoiceSettings

        family = MultipleChoiceFamily(MultipleChoiceSettings(str(data_dir)), SEQ)
    else:
        from tasks.tagging.task import TaggingFamily, TaggingSettings

        family = TaggingFamily(TaggingSettings(str(data_dir), label_list=(
            "O", "B-PER", "I-PER")), SEQ)
    return family.export_metadata(run)


def test_each_family_exports_only_its_own_runs(tmp_path):
    """Every pair (run family, asked family): accepted when they match (or the encoder
    is asked), else refused naming the directory, the run's family and task, and what was
    asked."""
    for run_type in RUN_FAMILIES:
        meta = runner_metadata(run_type, tmp_path)
        assert meta.model_type == run_type
        directory = tmp_path / run_type
        directory.mkdir()
        write_export_metadata(str(directory), meta)
        for asked in registry.model_types():
            family = registry.get_family(asked)
            if asked == run_type or asked in ENCODER_FAMILIES:
                got = registry.read_run_metadata(str(directory), family)
                assert type(got) is registry.get_family(run_type).metadata_class, (run_type, asked)
                assert (got.max_seq_length, got.task) == (SEQ, meta.task)
                continue
            with pytest.raises(ExportError) as err:
                registry.read_run_metadata(str(directory), family)
            message = str(err.value)
            for part in (str(directory), f"model_type={run_type!r}", f"task={meta.task!r}",
                         f"--model_type={asked} was asked",
                         f"export it with --model_type={run_type}"):
                assert part in message, (run_type, asked, message)
        # The default reader reads a run as its own family's metadata.
        assert type(registry.read_run_metadata(str(directory))) is type(meta)


def test_an_unknown_model_type_is_refused(tmp_path):
    (tmp_path / METADATA_FILE).write_text('{"task": "x", "model_type": "clasifier"}')
    with pytest.raises(ExportError, match="model_type='clasifier' is not one of"):
        registry.read_run_metadata(str(tmp_path), registry.get_family("classifier"))


def _run_dir(directory, model, run_type):
    """A runner's output_dir: checkpoint, config, vocab and its export_metadata.json."""
    directory.mkdir()
    write_vocab(directory / "vocab.txt", VOCAB)
    _config().to_json_file(str(directory / "bert_config.json"))
    _save_like_training(model, directory)
    write_export_metadata(str(directory), runner_metadata(run_type, directory))
    return directory


@pytest.mark.slow
@pytest.mark.parametrize("run_type,asked,flags", [
    ("classifier", "multiple_choice", []),              # a regression classifier (STS-B)
    ("multiple_choice", "classifier", ["--is_regression"]),   # a SWAG run
    ("squad", "classifier", ["--is_regression"]),
])
def test_cli_refuses_another_familys_run(tmp_path, run_type, asked, flags):
    """Issue 22: these exports exited 0 (the heads' weights load into one another). (That
    the registry accepts a run as its own family is `test_each_family_exports_only_its_own_runs`';
    each family's CLI export of its own run, test_export, test_run_swag and
    test_export_multiple_choice's.)"""
    keras.utils.set_random_seed(11)
    model = {"classifier": lambda: BertClassifier(_config(), 1),
             "multiple_choice": lambda: BertMultipleChoice(_config()),
             "squad": lambda: BertSpanLabeler(_config())}[run_type]()
    run = _run_dir(tmp_path / "run", model, run_type)
    result = _cli(f"--model_type={asked}", f"--init_checkpoint={run}", *flags,
                  f"--export_dir={tmp_path / 'out'}")
    assert result.code == 1, (result.stdout + result.stderr)[-3000:]
    assert "Traceback" not in result.stderr
    assert (f"{run} holds a fine-tuned" in result.stderr
            and f"model_type={run_type!r}" in result.stderr
            and f"--model_type={asked} was asked" in result.stderr), result.stderr[-2000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_squad_export_takes_the_runs_windows_and_flags_override_them(tmp_path):
    """Issue 22: the SQuAD run's export_metadata.json lacked max_query_length and
    doc_stride, so its export fell back to 64 / 128 (and refused max_seq_length 32)."""
    keras.utils.set_random_seed(12)
    run = _run_dir(tmp_path / "run", BertSpanLabeler(_config()), "squad")
    meta = json.loads((run / METADATA_FILE).read_text())
    assert {k: meta[k] for k in SQUAD_SETTINGS} == SQUAD_SETTINGS

    # What the export is built from: the run's windows and answer selection ...
    family = registry.get_family("squad")
    from_run = family.settings({}, registry.read_run_metadata(str(run), family), SEQ)
    assert {k: from_run[k] for k in SQUAD_SETTINGS} == SQUAD_SETTINGS
    # ... and through the CLI, flags override some; the rest still come from the run.
    result = _cli("--model_type=squad", f"--init_checkpoint={run}", "--doc_stride=5",
                  "--max_query_length=4", f"--export_dir={tmp_path / 'flags'}")
    assert result.code == 0, result.stderr[-3000:]
    got = json.loads((tmp_path / "flags" / "assets.extra" / METADATA_FILE).read_text())
    assert (got["doc_stride"], got["max_query_length"]) == (5, 4)
    assert (got["max_answer_length"], got["n_best_size"]) == (6, 7)
    assert got["max_seq_length"] == SEQ and got["model_type"] == "squad"


# --------------------------------------------------------------------------- the registry


def _alternatives(spec):
    """Values of a family flag to try, for each kind."""
    return {"bool": [True, False], "integer": [(spec.default or 0) + 3, 1, 2],
            "list": [["x", "y"], ["O", "B-X", "I-X"]],
            "string": ["IOB2", "none", "weighted_sum_all", "x"]}[spec.kind]


def _flag_verdict(family, spec, metadata, vocab):
    """"used" if some value of the flag changes the family's config, "refused" if its
    values are refused with an error naming it, else "IGNORED" (parsed and dropped)."""
    def config(given):
        settings = family.settings(given, metadata, SEQ)
        return family.config_class(vocab_file=vocab, max_seq_length=SEQ, **settings)

    try:
        baseline = config({})
    except ExportError:
        return "no baseline"  # e.g. a tagger without its run's labels
    outcomes = []
    for value in _alternatives(spec):
        try:
            if config({spec.name: value}) != baseline:
                return "used"
        except ExportError as err:
            named = f"--{spec.name}" in str(err) or f"{spec.name}=" in str(err)
            outcomes.append("refused" if named else f"CRASHED: {err}")
    return "refused" if "refused" in outcomes else (outcomes or ["IGNORED"])[0]


def test_every_family_flag_sets_its_familys_config(tmp_path):
    """Each family owns its flags (issue 23 §5): every flag it declares reaches its
    config (or is refused naming itself), from a run's metadata or without one."""
    vocab = write_vocab(tmp_path / "vocab.txt", VOCAB)
    verdicts = {}
    for model_type in registry.model_types():
        family = registry.get_family(model_type)
        # No run; the family's runner's run (STS-B regression for the classifier); a
        # labelled run.
        runs = [None, family.metadata_class(labels=("O", "B-Y"), model_type=model_type)]
        if model_type in RUN_FAMILIES:
            runs.append(runner_metadata(model_type, tmp_path))
        for spec in family.flags:
            assert spec.kind in ("bool", "integer", "list", "string"), spec
            found = [_flag_verdict(family, spec, metadata, vocab) for metadata in runs]
            verdicts[f"{model_type} --{spec.name}"] = next(
                (v for v in ("used", "refused") if v in found), found)
    assert len(verdicts) >= 15, verdicts
    wrong = {k: v for k, v in verdicts.items() if v not in ("used", "refused")}
    assert not wrong, wrong
    assert verdicts["tagger --num_labels"] == "refused"  # a check only, with labels
    # The classifier's labels alone, then a regression run: no flag silently dropped.
    classifier = registry.get_family("classifier")
    assert classifier.settings({"num_labels": 3}, None, SEQ)["labels"] == ("0", "1", "2")
    with pytest.raises(ExportError, match="--label_list=a,b with a regression head"):
        classifier.settings({"label_list": ["a", "b"]},
                            runner_metadata("classifier", tmp_path), SEQ)


def test_the_registry_refuses_a_second_family_of_a_model_type(tmp_path):
    from tasks.classification.export import ClassifierServingConfig

    class Impostor(families.ServingFamily):
        model_type = "classifier"
        config_class = ClassifierServingConfig

    class Mismatched(families.ServingFamily):
        model_type = "not_a_classifier"
        config_class = ClassifierServingConfig

    with pytest.raises(ValueError, match="'classifier' is registered twice"):
        registry.register(Impostor())
    with pytest.raises(ValueError, match="has model_type 'classifier', not "
                                         "'not_a_classifier'"):
        registry.register(Mismatched())
    assert "not_a_classifier" not in registry.model_types()
    assert type(registry.get_family("classifier")).__name__ == "ClassifierServing"
    with pytest.raises(ExportError, match="model_type 'clasifier' is not one of"):
        registry.get_family("clasifier")
    vocab = write_vocab(tmp_path / "vocab.txt", VOCAB)
    with pytest.raises(ExportError, match=r"'squad' has no setting \['labels'\]"):
        families.serving_config("squad", vocab, True, 384, labels=("a",))


# The marker's keys, in order, as every export wrote them before the families owned their
# settings (assets.extra/export_metadata.json: its format does not change).
COMMON_MARKER_KEYS = ["task", "labels", "is_regression", "do_lower_case", "max_seq_length",
                      "text_pair", "model_type"]
MARKER_KEYS = {
    "classifier": COMMON_MARKER_KEYS, "encoder": COMMON_MARKER_KEYS,
    "hub": COMMON_MARKER_KEYS, "multiple_choice": COMMON_MARKER_KEYS,
    "embedding": COMMON_MARKER_KEYS + ["pooling", "normalize", "layers"],
    "squad": COMMON_MARKER_KEYS + ["max_query_length", "max_answer_length", "doc_stride",
                                   "n_best_size", "max_context_windows"],
    "tagger": COMMON_MARKER_KEYS + ["tag_scheme", "doc_stride", "max_context_windows",
                                    "feature_based", "feature_layers", "lstm_units"],
}


def test_the_export_marker_keeps_its_keys_for_every_family(tmp_path):
    vocab = write_vocab(tmp_path / "vocab.txt", VOCAB)
    settings = {"classifier": dict(labels=("a", "b"), text_pair=True),
                "encoder": dict(text_pair=True), "squad": dict(max_query_length=8),
                "tagger": dict(labels=("O", "B-X", "I-X"))}
    assert set(registry.model_types()) == set(MARKER_KEYS)
    for model_type, keys in MARKER_KEYS.items():
        config = families.serving_config(model_type, vocab, True, SEQ, task="t",
                                         **settings.get(model_type, {}))
        directory = tmp_path / model_type
        write_marker(str(directory), model_type, config)
        data = json.loads((directory / "assets.extra" / METADATA_FILE).read_text())
        assert list(data) == keys, model_type
        assert data["model_type"] == model_type and data["max_seq_length"] == SEQ
        assert data["text_pair"] == (model_type in ("classifier", "encoder"))
