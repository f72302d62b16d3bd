"""One settings path for training: the loop's and optimizer's settings are one type
(`training.settings.LoopConfig`) for pretraining and fine-tuning, and a fine-tuning runner's
command line and a program's keyword arguments build them the same way
(`training.flags.FinetuningCommand.settings`)."""

import dataclasses
import importlib

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


def _shared(loop_config):
    from training.settings import PER_RUN

    return {k: v for k, v in dataclasses.asdict(loop_config).items() if k not in PER_RUN}


@pytest.mark.parametrize("runner", sorted(RUNNER_ARGV))
def test_flags_and_keyword_arguments_build_the_same_settings(runner):
    from training.settings import LoopConfig

    module = importlib.import_module(runner)
    own_argv, own_kwargs = RUNNER_ARGV[runner]
    argv = [f"{runner}.py", "--vocab_file=v", "--bert_config_file=c", "--output_dir=o",
            "--do_train", "--do_eval", *own_argv,
            *(f"--{name}={value}" for name, value in SHARED.items())]
    from_flags = _parsed(module, argv)
    from_kwargs = module.COMMAND.settings(vocab_file="v", bert_config_file="c",
                                          output_dir="o", do_train=True, do_eval=True,
                                          **own_kwargs, **SHARED)
    assert isinstance(from_flags.finetuning.loop, LoopConfig)
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
    optimizer = pretraining.loop.optimizer_config()
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
