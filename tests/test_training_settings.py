"""One settings path for training: the loop's and optimizer's shared settings are one type
(`training.settings.LoopSettings`) for pretraining and fine-tuning, built the same way
(`training.settings.settings_of`), and a fine-tuning runner's command line and a program's
keyword arguments build them the same way (`training.flags.FinetuningCommand.settings`);
each setting has one home (issue 39 #2)."""

import dataclasses
import importlib
import json

import pytest
from absl import flags

RUNNER_ARGV = {
    "run_classifier": (["--task_name=mrpc", "--data_dir=d"], dict(task_name="mrpc",
                                                                   data_dir="d")),
    "run_squad": (["--train_file=t.json"], dict(train_file="t.json")),
    "run_ner": (["--data_dir=d", "--label_list=O,B-X"], dict(data_dir="d",
                                                            label_list="O,B-X")),
    "run_swag": (["--data_dir=d"], dict(data_dir="d")),
}
# Shared flags set to other values than their defaults.
SHARED = dict(learning_rate=3e-5, optimizer="lamb", weight_decay_rate=0.02, clip_norm=2.0,
              iterations_per_loop=7, save_checkpoints_steps=14, log_steps=7,
              gradient_accumulation_steps=2, keep_checkpoint_max=3)


def _parsed(module, argv):
    flags.FLAGS(argv)
    try:
        return module.run_config_from_flags(flags.FLAGS)
    finally:
        flags.FLAGS.unparse_flags()


def _shared(loop):
    from training.settings import shared_settings

    return shared_settings(loop)


@pytest.mark.parametrize("runner", sorted(RUNNER_ARGV))
def test_flags_and_keyword_arguments_build_the_same_settings(runner):
    from training.settings import LoopSettings

    module = importlib.import_module(runner)
    own_argv, own_kwargs = RUNNER_ARGV[runner]
    argv = [f"{runner}.py", "--vocab_file=v", "--bert_config_file=c", "--output_dir=o",
            "--do_train", "--do_eval", "--seed=7", *own_argv,
            *(f"--{name}={value}" for name, value in SHARED.items())]
    from_flags = _parsed(module, argv)
    from_kwargs = module.COMMAND.settings(vocab_file="v", bert_config_file="c",
                                          output_dir="o", do_train=True, do_eval=True,
                                          runtime=from_flags.finetuning.runtime,
                                          **own_kwargs, **SHARED)
    # The runtime's seed alone is the one run's seed (weights, dropout and input order),
    # from a program as from `--seed` (docs/run_classifier.md's library use).
    assert from_flags.finetuning.seeds == from_kwargs.finetuning.seeds == (7,)
    assert type(from_flags.finetuning.loop) is LoopSettings
    assert from_flags.finetuning.loop == from_kwargs.finetuning.loop
    assert {k: v for k, v in _shared(from_flags.finetuning.loop).items()
            if k in SHARED} == SHARED
    # The runner's defaults hold for a program too (run_squad: max_seq_length 384).
    assert from_flags.finetuning.max_seq_length == from_kwargs.finetuning.max_seq_length
    assert type(from_flags.task) is type(from_kwargs.task)


def test_pretraining_and_finetuning_take_the_same_settings_from_the_same_flags():
    import run_classifier
    import run_pretraining

    shared = [f"--{name}={value}" for name, value in SHARED.items()]
    pretraining = _parsed(run_pretraining, [
        "run_pretraining.py", "--bert_config_file=c", "--input_file=r", "--output_dir=o",
        "--do_train", "--num_train_steps=50", "--num_warmup_steps=5", *shared])
    finetuning = _parsed(run_classifier, [
        "run_classifier.py", "--vocab_file=v", "--bert_config_file=c", "--output_dir=o",
        "--do_train", "--task_name=mrpc", "--data_dir=d", *shared])
    assert type(pretraining.loop) is type(finetuning.finetuning.loop)
    assert _shared(pretraining.loop) == _shared(finetuning.finetuning.loop)
    optimizer = pretraining.loop_config().optimizer_config()
    assert (optimizer.learning_rate, optimizer.num_train_steps, optimizer.num_warmup_steps,
            optimizer.optimizer) == (3e-5, 50, 5, "lamb")


@pytest.mark.parametrize("runner", ["run_pretraining", "run_classifier"])
def test_a_loop_setting_below_one_is_refused_naming_the_flag(runner):
    module = importlib.import_module(runner)
    argv = {"run_pretraining": ["--input_file=r", "--do_train"],
            "run_classifier": ["--vocab_file=v", "--task_name=mrpc", "--data_dir=d",
                               "--do_train"]}[runner]
    with pytest.raises(ValueError,
                       match=r"--gradient_accumulation_steps=0 must be a whole number >= 1"):
        _parsed(module, [f"{runner}.py", "--bert_config_file=c", "--output_dir=o", *argv,
                         "--gradient_accumulation_steps=0"])


def test_each_setting_has_one_home_and_one_type():
    """No field of a run's settings is held twice (the run's own output_dir and batch
    sizes beside a loop config holding them too; dtype and jit_compile in the runtime and
    the loop), none is typed `object`, and the loop a run builds is its settings' values."""
    import typing

    import run_pretraining
    from training import finetuning
    from training.execution import RuntimeConfig
    from training.flags import TaskRun
    from training.settings import LoopConfig, LoopSettings, PretrainingRun

    loop = {f.name for f in dataclasses.fields(LoopSettings)}
    for run_type in (PretrainingRun, finetuning.FinetuningRun):
        fields = {f.name: f.type for f in dataclasses.fields(run_type)}
        assert fields["loop"] == "LoopSettings", run_type
        assert not loop & set(fields), (run_type, loop & set(fields))
        assert "object" not in map(str, fields.values()), run_type
    assert not loop & {f.name for f in dataclasses.fields(RuntimeConfig)}
    assert "object" not in [str(f.type) for f in dataclasses.fields(TaskRun)]
    assert typing.get_type_hints(TaskRun)["finetuning"] is finetuning.FinetuningRun
    cfg = _parsed(run_pretraining, [
        "run_pretraining.py", "--bert_config_file=c", "--input_file=r", "--output_dir=o",
        "--do_train", "--num_train_steps=50", "--train_batch_size=6", "--dtype=bfloat16"])
    built = cfg.loop_config()
    assert isinstance(built, LoopConfig) and built.dtype == "bfloat16"
    assert (built.output_dir, built.num_train_steps, built.train_batch_size) == ("o", 50, 6)



def test_input_file_lists_split_on_commas_dropping_blanks():
    from training.flags import split_patterns

    assert split_patterns("a/*.tfrecord, gs://b/c*,") == ("a/*.tfrecord", "gs://b/c*")

# --- Flags that do not apply to the chosen mode (issue 38 #6) ------------------------------

# (runner, argv choosing a mode, a flag of another mode, that mode as the error names it)
OUT_OF_MODE = [
    ("run_classifier", [], "--doc_stride=16", "--long_document=windows"),
    ("run_classifier", ["--long_document=truncate"], "--max_windows_per_document=4",
     "--long_document=windows"),
    ("run_classifier", [], "--window_pooling=mean", "--long_document=windows"),
    ("run_classifier", ["--long_document=head_tail"], "--window_pooling=attention",
     "--long_document=windows"),
    ("run_classifier", ["--long_document=windows"], "--head_tokens=3",
     "--long_document=head_tail"),
    ("run_classifier", ["--task_name=custom", "--text_a_column=0", "--label_column=1"],
     "--xnli_language=de", "--task_name=xnli"),
    ("run_classifier", [], "--delimiter=comma", "--task_name=custom"),
    ("run_classifier", ["--bucket_by_length=false"], "--bucket_boundaries=16,32",
     "--bucket_by_length"),
    ("run_classifier", ["--do_eval", "--seeds=1,2"], "--seed=3", "one run, not with --seeds"),
    ("run_classifier", [], "--tpu_zone=z", "--distribution_strategy=tpu (or --use_tpu)"),
    ("run_squad", [], "--null_score_diff_threshold=1.5", "--version_2_with_negative"),
    ("run_ner", [], "--lstm_units=8", "--feature_based"),
    ("run_swag", [], "--context_column=c", "--task_name=custom"),
    ("run_swag", ["--task_name=custom", "--context_column=c", "--ending_columns=a,b"],
     "--label_is_text", "--label_column (a labelled file)"),
    ("run_pretraining", ["--objective=ltr"], "--masked_lm_prob=0.2", "--objective=mlm"),
    ("run_pretraining", [], "--phase2_train_batch_size=8", "--phase2_input_file"),
    ("run_pretraining", [], "--num_tpu_cores=4", "--distribution_strategy=tpu"),
    ("glue_submission", ["--collect_only"], "--learning_rate=1e-5", "a run that trains"),
    ("glue_submission", ["--tasks=MRPC,RTE"], "--wnli=finetune", "WNLI in --tasks"),
]


@pytest.mark.parametrize("runner,argv,flag,mode", OUT_OF_MODE,
                         ids=[f"{c[0]}{c[2]}" for c in OUT_OF_MODE])
def test_a_flag_of_another_mode_is_refused_naming_the_flag_and_its_mode(runner, argv, flag,
                                                                          mode):
    """Every runner's flags are checked against one table of which flag applies to which
    mode (`training.flags.check_modes`): given in another mode, a flag would be parsed and
    ignored (--doc_stride with truncate, --window_pooling with head_tail, --xnli_language
    with a custom task were), so it is refused in one line."""
    from data_prep.cli import FlagError
    from tests.test_flags_used import RUNNERS

    module = importlib.import_module(runner)
    base = ["--output_dir=o"] if "--collect_only" in argv else RUNNERS[runner]
    with pytest.raises(FlagError) as err:
        _parsed(module, [f"{runner}.py", *base, *argv, flag])
    name = flag.split("=")[0]
    assert str(err.value).startswith(f"{name} only applies with {mode}"), str(err.value)
    # In its mode the flag is taken (the same command line without the mode's flags).
    if runner == "run_classifier" and "windows" in mode:
        _parsed(module, [f"{runner}.py", *RUNNERS[runner], "--long_document=windows", flag])


@pytest.mark.parametrize("runner", ["run_classifier", "run_squad", "run_ner", "run_swag",
                                    "run_pretraining"])
def test_every_mode_table_names_flags_of_its_runner(runner):
    """A rule naming a flag the runner does not define would check nothing."""
    from training import flags as common_flags

    module = importlib.import_module(runner)
    for rule in (*common_flags.SHARED_MODES, *module.MODES):
        assert set(rule.flags) <= set(flags.FLAGS), (rule, set(rule.flags) - set(flags.FLAGS))


def test_a_sequence_longer_than_the_position_table_names_the_flag_and_the_config(tmp_path):
    """The original's message, with the flag and the file that set the limit."""
    from data_prep.cli import UserError
    from tests import test_loop_support as S
    from training import trainer_setup

    config = S.write_config(tmp_path / "bert_config.json")
    limit = json.loads(open(config).read())["max_position_embeddings"]
    with pytest.raises(UserError, match=(
            rf"^--max_seq_length={limit + 1}: cannot use sequence length {limit + 1} because "
            rf"the BERT model was only trained up to sequence length {limit} "
            rf"\(max_position_embeddings in {config}\)$")):
        trainer_setup.load_bert_config(config, limit + 1)
    assert trainer_setup.load_bert_config(config, limit).max_position_embeddings == limit
