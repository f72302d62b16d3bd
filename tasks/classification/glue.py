"""Owns the GLUE benchmark as a whole: every task's run, AX, WNLI, the checked submission zip.

`run_benchmark` fine-tunes every task with `training.finetuning.run` (grid, seeds, best on
dev: the paper's protocol, Section 4.1 and Appendix A.3), each in `output_dir/<Task>`;
the test predictions of each task's best run are at the top of its folder in the files
the GLUE server takes (`tasks.classification.metrics.glue_submission_text`). AX (the
diagnostic set) is predicted with MNLI's best model; WNLI predicts the majority class by
default, as the paper did (GLUE FAQ 12: its train and dev sets are adversarial).
`collect` finds those files, `check_submission_file` checks each (header, indices, label
names or scores, the test set's row count) and `write_zip` writes the zip the server takes.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Mapping, Sequence

from absl import logging

from data_prep import fileio
from data_prep.cli import UserError
from tasks.classification import metrics, processors
from tasks.common.classifier_task import test_results_text

# The benchmark's tasks in the order they are run (AX needs MNLI's model).
TASKS = ("cola", "sst-2", "mrpc", "sts-b", "qqp", "mnli", "qnli", "rte", "wnli", "ax")
# Each task's folder in GLUE's download layout (download_glue_data.py) ...
DATA_DIRS = {"cola": "CoLA", "sst-2": "SST-2", "mrpc": "MRPC", "sts-b": "STS-B",
             "qqp": "QQP", "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI",
             "ax": "diagnostic"}
# ... and its run's folder in output_dir.
RUN_DIRS = {**DATA_DIRS, "ax": "AX"}
SUBMISSION_ZIP = "submission.zip"
DEV_RESULTS_FILE = "glue_dev_results.tsv"


class GlueError(UserError):
    """A submission that cannot be assembled or a benchmark that cannot run; names the
    file, folder or flag and what is wrong."""


@dataclasses.dataclass(frozen=True)
class GlueSettings:
    """What `run_benchmark` runs beyond the shared fine-tuning settings.

    Attributes:
      glue_dir: GLUE's data in the download layout (`DATA_DIRS` folders); None with
        `collect_only` (then row counts are not checked).
      tasks: canonical task names (`TASKS`), in `TASKS` order; "ax" needs "mnli".
      wnli: "majority" (the paper: the majority class of WNLI's train and dev sets) or
        "finetune" (fine-tuned like the other tasks).
      collect_only: no training: zip the files finished runs left in output_dir.
      skip_bad_rows: skip malformed rows (counted) instead of failing on the first.
    """

    glue_dir: str | None
    tasks: tuple = TASKS
    wnli: str = "majority"
    collect_only: bool = False
    skip_bad_rows: bool = False


def parse_tasks(names: Sequence[str]) -> tuple:
    """Canonical task names in run order from user spellings ("CoLA", "sts-b", "AX");
    GlueError naming --tasks for an unknown or non-GLUE name, or AX without MNLI."""
    tasks = set()
    for name in names:
        try:
            task = metrics.normalize_task_name(name)
        except ValueError:
            task = None
        if task not in TASKS:
            raise GlueError(f"--tasks: {name!r} is not a GLUE task; expected some of "
                            f"{', '.join(DATA_DIRS[t] if t != 'ax' else 'AX' for t in TASKS)}")
        tasks.add(task)
    if not tasks:
        raise GlueError("--tasks: no task given")
    if "ax" in tasks and "mnli" not in tasks:
        raise GlueError("--tasks: AX is predicted with MNLI's model: add MNLI (a finished "
                        "MNLI run is reused, not trained again)")
    return tuple(task for task in TASKS if task in tasks)


def submission_files(task: str) -> list:
    """[(file name in the zip, test split)] of a task: MNLI has two."""
    if task == "mnli":
        return [(metrics.glue_submission_file_name("mnli", split), split)
                for split in ("test_matched", "test_mismatched")]
    return [(metrics.glue_submission_file_name(task), "test")]


def data_dir(glue_dir: str, task: str) -> str:
    """A task's folder in GLUE's download layout (AX: diagnostic)."""
    return os.path.join(glue_dir, DATA_DIRS[task])


def splits_read(task: str) -> list:
    """The splits a task's run reads: train and dev (MNLI: both dev sets) then its test
    splits; AX (predicted with MNLI's model) only its test set."""
    tests = [split for _, split in submission_files(task)]
    if task == "ax":
        return tests
    devs = ["dev_matched", "dev_mismatched"] if task == "mnli" else ["dev"]
    return ["train", *devs, *tests]


def check_data(glue_dir: str, tasks: Sequence[str], skip_bad_rows: bool = False) -> None:
    """Refuses, before any training, a task whose folder or data file is missing, or whose
    data has a malformed row (the message names file and line; --skip_bad_rows skips
    them): a bad file is found before hours of other tasks' training, not after."""
    for task in tasks:
        directory = data_dir(glue_dir, task)
        if not fileio.isdir(directory):
            raise GlueError(f"--glue_dir={glue_dir}: no folder {DATA_DIRS[task]} for "
                            f"{RUN_DIRS[task]} ({directory})")
        processor = processors.get_processor(task)
        for split in splits_read(task):
            processor.source_file(directory, split)  # names the missing file
        for split in splits_read(task):
            processor.read_split(directory, split, skip_bad_rows=skip_bad_rows)


# ------------------------------------------------------------------------------ running


def run_benchmark(run, settings: GlueSettings) -> dict:
    """Fine-tunes (or reuses) every task of `settings.tasks` and zips the submission.

    Args:
      run: the shared `training.finetuning.FinetuningRun` (output_dir: the benchmark's
        folder; its grid and seeds apply to every task).
      settings: the benchmark's own settings.

    Returns:
      {"tasks": task -> {"dir", "dev" (the kept run's dev figures, first dev split),
      "model_dir"} of the tasks run, "files": zip name -> path, "missing": zip names not
      found, "zip": the zip's path or None (incomplete)}. glue_dev_results.tsv in
      output_dir lists every task folder's primary dev figure.
    """
    done = {}
    if not settings.collect_only:
        check_data(settings.glue_dir, settings.tasks, settings.skip_bad_rows)
        for task in settings.tasks:
            logging.info("***** GLUE %s *****", RUN_DIRS[task])
            if task == "wnli" and settings.wnli == "majority":
                done[task] = majority_baseline(data_dir(settings.glue_dir, task),
                                               os.path.join(run.output_dir, RUN_DIRS[task]),
                                               settings.skip_bad_rows)
            elif task == "ax":
                done[task] = _predict_ax(run, settings, done["mnli"]["model_dir"])
            else:
                done[task] = _finetune(run, settings, task)
    files, missing = collect(run.output_dir)
    if missing and settings.collect_only:
        raise GlueError(f"{run.output_dir}: no {', '.join(missing)} (each task's file is at "
                        f"the top of its folder: {', '.join(RUN_DIRS[t] for t in TASKS)}); "
                        "run the missing tasks first")
    zip_path = None
    if missing:
        logging.warning("Not zipped: %s missing (run those tasks: --tasks); the other files "
                        "are in their folders", ", ".join(missing))
    else:
        zip_path = os.path.join(run.output_dir, SUBMISSION_ZIP)
        write_zip(zip_path, files,
                  expected_rows(settings.glue_dir) if settings.glue_dir else {})
        logging.info("Wrote the GLUE submission %s (%d files)", zip_path, len(files))
    fileio.write_text(os.path.join(run.output_dir, DEV_RESULTS_FILE),
                      dev_results_text(run.output_dir))
    return {"tasks": done, "files": files, "missing": missing, "zip": zip_path}


def _finetune(run, settings: GlueSettings, task: str) -> dict:
    """One task through `training.finetuning.run` in output_dir/<Task> (finished runs of
    the same settings are reused)."""
    from tasks.classification.task import ClassificationFamily, ClassificationSettings
    from training import finetuning

    task_run = dataclasses.replace(run, output_dir=os.path.join(run.output_dir,
                                                                RUN_DIRS[task]),
                                   skip_finished=True)
    family = ClassificationFamily(
        ClassificationSettings(task_name=task, data_dir=data_dir(settings.glue_dir, task),
                               skip_bad_rows=settings.skip_bad_rows),
        task_run.max_seq_length)
    result = finetuning.run(task_run, family)
    best = result["best_run"]
    dev = next(iter(best["eval"].values()))
    return {"dir": task_run.output_dir, "dev": dev, "model_dir": best["model_dir"]}


def _predict_ax(run, settings: GlueSettings, mnli_model_dir: str) -> dict:
    """AX (the diagnostic set) predicted with MNLI's kept model, in output_dir/AX."""
    from tasks.classification.task import ClassificationFamily, ClassificationSettings
    from training import finetuning

    ax_run = dataclasses.replace(
        run, output_dir=os.path.join(run.output_dir, RUN_DIRS["ax"]), do_train=False,
        do_eval=False, do_predict=True, init_checkpoint=mnli_model_dir, seeds=(None,),
        grid=None, keep_best_checkpoint=False, skip_finished=True)
    logging.info("AX: predicting with MNLI's model %s", mnli_model_dir)
    family = ClassificationFamily(
        ClassificationSettings(task_name="ax", data_dir=data_dir(settings.glue_dir, "ax"),
                               skip_bad_rows=settings.skip_bad_rows),
        ax_run.max_seq_length)
    finetuning.run(ax_run, family)
    return {"dir": ax_run.output_dir, "dev": {}, "model_dir": mnli_model_dir}


def majority_baseline(task_data_dir: str, output_dir: str,
                      skip_bad_rows: bool = False) -> dict:
    """WNLI as the paper submitted it: every test example gets the most frequent label of
    the train and dev sets together (a tie: the first in the label list). Writes WNLI.tsv,
    test_results.tsv (one-hot) and eval_results.txt (the dev accuracy of that rule) into
    output_dir, as one all-or-nothing set."""
    processor = processors.get_processor("wnli")
    labels = list(processor.get_labels())
    train = processor.get_train_examples(task_data_dir, skip_bad_rows)
    dev = processor.get_dev_examples(task_data_dir, skip_bad_rows)
    test = processor.get_test_examples(task_data_dir, skip_bad_rows)
    counts = collections.Counter(str(e.label) for e in train + dev)
    majority = max(labels, key=lambda label: (counts[label], -labels.index(label)))
    label_id = labels.index(majority)
    accuracy = sum(str(e.label) == majority for e in dev) / max(len(dev), 1)
    one_hot = [[1.0 if i == label_id else 0.0 for i in range(len(labels))] for _ in test]
    figures = {"eval_accuracy": accuracy, "global_step": 0}
    fileio.write_texts({
        os.path.join(output_dir, "WNLI.tsv"): metrics.glue_submission_text(
            "wnli", [label_id] * len(test), labels),
        os.path.join(output_dir, "test_results.tsv"): test_results_text(one_hot),
        os.path.join(output_dir, "eval_results.txt"): metrics.format_metrics(figures),
    })
    logging.info("WNLI: the majority class %r of train + dev (%s) for its %d test examples; "
                 "dev accuracy %.4f", majority, dict(counts), len(test), accuracy)
    return {"dir": output_dir, "dev": figures, "model_dir": None}


def dev_results_text(output_dir: str) -> str:
    """glue_dev_results.tsv: per task folder with results, the primary dev metric of its
    kept run (its eval_results.txt at the top; MNLI also mismatched) and the folder."""
    lines = ["task\tmetric\tvalue\n"]
    for task in TASKS:
        if task == "ax":
            continue  # no dev set
        metric = "eval_" + metrics.primary_metric_name(task)
        for name, suffix in ((RUN_DIRS[task], ""),) + (
                (("MNLI-mm", "_mm"),) if task == "mnli" else ()):
            path = os.path.join(output_dir, RUN_DIRS[task], f"eval_results{suffix}.txt")
            if fileio.exists(path):
                figures = _read_figures(path)
                lines.append(f"{name}\t{metric}\t{figures.get(metric, '')}\n")
    return "".join(lines)


def _read_figures(path: str) -> dict:
    """An eval_results.txt's "key = value" lines as {key: text}."""
    return dict(line.split(" = ", 1) for line in fileio.read_text(path).splitlines()
                if " = " in line)


# ------------------------------------------------------------------ collecting, checking


def collect(output_dir: str) -> tuple[dict, list]:
    """({zip name: path} of the submission files found at the top of each task's folder,
    [zip names missing]), in the benchmark's order."""
    files, missing = {}, []
    for task in TASKS:
        for name, _ in submission_files(task):
            path = os.path.join(output_dir, RUN_DIRS[task], name)
            if fileio.exists(path):
                files[name] = path
            else:
                missing.append(name)
    return files, missing


def expected_rows(glue_dir: str) -> dict:
    """{zip name: examples in its test set} from GLUE's data (read as the runs read it)."""
    counts = {}
    for task in TASKS:
        directory = data_dir(glue_dir, task)
        if not fileio.isdir(directory):
            continue
        processor = processors.get_processor(task)
        for name, split in submission_files(task):
            counts[name] = len(processor.read_split(directory, split).examples)
    return counts


def _task_of(file_name: str) -> str:
    """The task whose submission file is `file_name` (MNLI-mm.tsv -> mnli)."""
    return next(task for task in TASKS for name, _ in submission_files(task)
                if name == file_name)


def check_submission_file(path: str, file_name: str, expected: int | None = None) -> int:
    """Checks one submission file as the server reads it; returns its rows.

    Header `index<TAB>prediction`; then rows 0..n-1 in order, each with a label name of
    the task (MNLI and AX: entailment/neutral/contradiction; QNLI, RTE: entailment /
    not_entailment; the others 0/1) or, for STS-B, a finite score; `expected` rows when
    given. GlueError naming the file and line otherwise.
    """
    task = _task_of(file_name)
    labels = None if task == "sts-b" else set(processors.get_processor(task).get_labels())
    lines = fileio.read_text(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines or lines[0] != "index\tprediction":
        raise GlueError(f"{path}:1: expected the header 'index<TAB>prediction', found "
                        f"{(lines or [''])[0]!r}")
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != 2 or fields[0] != str(number - 2):
            raise GlueError(f"{path}:{number}: expected '{number - 2}<TAB>prediction', "
                            f"found {line!r}")
        value = fields[1]
        if labels is not None and value not in labels:
            raise GlueError(f"{path}:{number}: {value!r} is not a label of "
                            f"{file_name[:-4]} ({', '.join(sorted(labels))})")
        if labels is None:
            try:
                score = float(value)
            except ValueError:
                score = float("nan")
            if score != score or score in (float("inf"), float("-inf")):
                raise GlueError(f"{path}:{number}: {value!r} is not a finite score")
    rows = len(lines) - 1
    if expected is not None and rows != expected:
        raise GlueError(f"{path}: {rows} predictions, but the test set has {expected} "
                        "examples")
    return rows


def write_zip(zip_path: str, files: Mapping[str, str], expected: Mapping[str, int]) -> None:
    """Checks every file (`check_submission_file`) and writes them, flat, into one zip
    (all-or-nothing)."""
    import zipfile

    for name, path in files.items():
        check_submission_file(path, name, expected.get(name))
    with fileio.AtomicOutputs([zip_path]) as out:
        with fileio.open_file(out.temp(zip_path), "wb") as raw, zipfile.ZipFile(
                raw, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, path in files.items():
                with fileio.open_file(path, "rb") as f:
                    archive.writestr(name, f.read())
