"""The demo's closing summary: per-stage figures and files, and the commands to rerun each stage.

The same figures are written to OUTPUT/demo_summary.json (`write_summary`), whether the
run succeeded or stopped at a stage.
"""

from __future__ import annotations

import json
import shlex

from data_prep import fileio
from demo_lib.settings import Settings
from demo_lib.stages import display_python


def write_summary(path: str, summary: dict) -> None:
    """OUTPUT/demo_summary.json: the settings, each stage's figures, whether all ran."""
    fileio.write_text(path, json.dumps(summary, indent=2) + "\n")


def print_summary(stages, results: dict, settings: Settings, total_seconds: float) -> None:
    """Each stage's time and headline, where the files are, and every stage's command."""
    print("\n" + "=" * 78)
    print(f"Demo finished in {total_seconds:.1f} s. Outputs under {settings.output_dir}/:")
    for stage in stages:
        if stage.name in results:
            result = results[stage.name]
            print(f"  {stage.name:<18} {result['seconds']:>7.1f} s  {result['headline']}")
    print(f"  {'logs':<18} {settings.path('logs')}/")
    print(f"  {'summary':<18} {settings.path('demo_summary.json')}")
    print(f"\nTensorBoard (pretraining and fine-tuning curves): "
          f"tensorboard --logdir {settings.output_dir}")
    print("\nRun each stage by hand (replace the paths and sizes with your own data):")
    for index, stage in enumerate(stages, start=1):
        print(f"\n  # {index}. {stage.title}")
        for folder in stage.make_dirs:
            print("  " + shlex.join(["mkdir", "-p", folder]))
        print("  " + _wrap_command(stage.argv(display_python())))


def _wrap_command(argv: list) -> str:
    flags_start = next((i for i, a in enumerate(argv) if a.startswith("--")), len(argv))
    head = shlex.join(argv[:flags_start])
    return " \\\n      ".join([head] + [shlex.quote(a) for a in argv[flags_start:]])
