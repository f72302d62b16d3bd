"""Owns a fine-tuning sweep's bookkeeping (grid x seeds): each run's record, resume, redo, the best.

`training.finetuning.run` trains every run of a sweep; this module keeps what makes a
sweep resumable and what it reports:

* a run that finished writes `run_results.json` (`write_finished`: all-or-nothing, last,
  with the settings and data it answers, `request`), and a rerun skips it (`earlier`);
  one that finished with other settings or data is done again from its start, what it
  made removed first (`remove_run`: by name, only what it made); one that diverged is
  recorded as failed (`failed`); a run outside a sweep writes the record too, and is
  done again when rerun with other training settings or data (`earlier(skip=False)`);
* one kind of run per output_dir (a grid, a seed sweep, a single run: `check_kind`);
* `--seeds`: the best seed by the primary dev metric, its files copied to output_dir,
  `seed_results.txt` with every seed's figures, mean and std (`summarise_seeds`);
* a grid: the best run on dev, its files copied to output_dir, every run's dev figures in
  `grid_results.tsv` (`summarise_grid`, `grid_table`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Sequence

from absl import logging

from data_prep import fileio

RESULTS_FILE = "run_results.json"  # a sweep's run finished: its figures and outputs
GRID_RESULTS_FILE = "grid_results.tsv"
SEED_RESULTS_FILE = "seed_results.txt"


def failed(directory: str, seed, err: FloatingPointError) -> dict:
    """The result of a sweep's run stopped by a divergence (`err`): recorded as failed,
    with the reason, so that the sweep goes on and a rerun with the same settings skips it."""
    reason = " ".join(str(err).split())  # one line (it goes into grid_results.tsv)
    logging.error("%s failed: %s; the sweep goes on without it", directory, reason)
    return {"seed": seed, "dir": directory, "global_step": None, "num_train_steps": None,
            "eval": {}, "outputs": [], "model_dir": directory, "failed": reason}


def all_failed_message(runs_: Sequence[dict], output_dir: str) -> str:
    """The error of a sweep none of whose runs finished (each failed: the first reason)."""
    first = runs_[0]
    return (f"{output_dir}: every run failed ({len(runs_)}; "
            f"{_relative(first['dir'], output_dir) or '.'}: {first['failed']}). A rerun with "
            "the same settings does not try them again: change them (e.g. a lower "
            f"--learning_rate), or delete a run's {RESULTS_FILE} to retry it")


def request(settings, family, prepared, seed) -> dict:
    """What a finished run's results answer (its run_results.json keeps it): a rerun
    with other settings, other data or other initial weights runs again rather than reuse
    them."""
    splits = ([prepared.train] if prepared.train else []) + prepared.eval_splits + \
        prepared.predict_splits
    request = {
        "seed": seed, "do_train": settings.do_train, "do_eval": settings.do_eval,
        "do_predict": settings.do_predict, "init_checkpoint": settings.init_checkpoint,
        "init_weights": _weights_file(settings.init_checkpoint, settings.output_dir),
        "keep_best_checkpoint": settings.keep_best_checkpoint,
        "max_seq_length": settings.max_seq_length, "do_lower_case": settings.do_lower_case,
        "train_batch_size": settings.train_batch_size,
        "num_train_epochs": settings.num_train_epochs,
        "warmup_proportion": settings.warmup_proportion,
        "hparams": dataclasses.asdict(settings.loop),  # the shared LoopSettings
        "splits": [[split.name, split.num_examples,
                    [fileio.fingerprint(path) for pattern in family.records(split).input_patterns
                     for path in sorted(fileio.glob(pattern))]] for split in splits],
    }
    return json.loads(json.dumps(request, sort_keys=True))


def _weights_file(init_checkpoint: str | None, output_dir: str) -> dict | None:
    """The identity (`fileio.fingerprint`) of the file that names the weights
    `init_checkpoint` resolves to (a prefix's .index, a .safetensors file or shard index):
    the same path holds other weights once more pretraining wrote a newer checkpoint there,
    or a model was retrained in place (GLUE's AX, predicted with MNLI's model). None
    without one, when it cannot be read (the run refuses it when it loads it), or when it
    is in the run's own `output_dir` (the run's own checkpoints are no other weights)."""
    from modeling import checkpoints

    if not init_checkpoint:
        return None
    try:
        kind, location = checkpoints.resolve(init_checkpoint)
    except checkpoints.CheckpointError:
        return None
    if fileio.is_within(location, output_dir):
        return None
    return fileio.fingerprint(location if kind == checkpoints.HF else location + ".index")


def _relative(path: str, directory: str) -> str:
    """`path` relative to `directory` ("" for the directory itself; kept when outside)."""
    directory = directory.rstrip("/")
    if path.rstrip("/") == directory:
        return ""
    return path[len(directory) + 1:] if path.startswith(directory + "/") else path


def write_finished(directory: str, request: dict, result: dict) -> None:
    """Writes the run's run_results.json (all-or-nothing, after all its other outputs):
    the sign that it finished, with what a rerun of the sweep needs instead of it."""
    from training import run_files

    run_files.add(directory, files=[RESULTS_FILE])
    record = {"request": request, "seed": result["seed"],
              "global_step": result["global_step"],
              "num_train_steps": result["num_train_steps"], "eval": result["eval"],
              "outputs": [_relative(p, directory) for p in result["outputs"]],
              "model_dir": _relative(result["model_dir"], directory)}
    if result.get("failed"):
        record["failed"] = result["failed"]
    fileio.write_text(os.path.join(directory, RESULTS_FILE),
                      json.dumps(record, indent=1, sort_keys=True) + "\n")


def _training_part(request: dict) -> dict:
    """What of a request shapes the trained weights: every setting but do_eval and
    do_predict, and of the data only the training split (listed first)."""
    part = {k: v for k, v in request.items() if k not in ("do_eval", "do_predict", "splits")}
    part["train"] = request["splits"][0] if request.get("do_train") and request.get(
        "splits") else None
    return part


def _changed(old: dict, new: dict) -> str:
    """The keys where two requests differ, e.g. `hparams.learning_rate, train`."""
    from training import output_claim

    names = [key for key, _, _ in output_claim.identity_differences(old, new)]
    return ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")


def _read_record(path: str) -> dict | None:
    """A run_results.json as `write_finished` writes it, or None when the file is not one
    (not JSON, or JSON of another shape: damaged or edited by hand). Checked here, so that
    an error while comparing a sound record is a defect with its traceback, not a reason
    to redo the run."""
    try:
        record = json.loads(fileio.read_text(path))
    except ValueError:
        return None
    sound = (isinstance(record, dict) and isinstance(record.get("request"), dict)
             and isinstance(record["request"].get("splits", []), list)
             and isinstance(record.get("outputs"), list)
             and all(isinstance(name, str) for name in record["outputs"])
             and isinstance(record.get("model_dir"), str)
             and {"seed", "global_step", "num_train_steps", "eval"} <= set(record))
    return record if sound else None


def earlier(directory: str, request: dict, *, skip: bool = True) -> tuple[dict | None, bool]:
    """What an earlier run left in `directory`: (its result when it finished, or failed,
    with the same request (run_results.json, all its outputs in place), else None; True
    when it must be redone from scratch: its record says it ran with other settings or
    data, or cannot be read). (None, False): nothing finished here, or the same run with
    an output missing: it resumes from its newest checkpoint.

    `skip` False (a run outside a sweep): a finished run is never skipped, and redone only
    when this one trains (`do_train`) with other training settings or training data
    (`_training_part`); with the same, it resumes (evaluates and predicts again)."""
    path = os.path.join(directory, RESULTS_FILE)
    if not fileio.exists(path):
        return None, False
    record = _read_record(path)
    if record is None:
        logging.warning("%s cannot be read: the run is done again, from its start", path)
        return None, True
    old = record["request"]
    changed = _changed(old, request) if skip else (
        _changed(_training_part(old), _training_part(request))
        if request.get("do_train") else "")
    if changed:
        logging.warning("%s: finished with other settings or data (%s): the run is done "
                        "again, from its start (what it made is removed first)", path,
                        changed)
        return None, True
    if not skip:
        return None, False

    def absolute(name):
        return name if fileio.is_url(name) or os.path.isabs(name) else \
            os.path.join(directory, name) if name else directory

    outputs = [absolute(name) for name in record["outputs"]]
    missing = [p for p in outputs if not fileio.exists(p)]
    if missing:
        logging.info("%s: %s missing: the run is done again", path, missing[0])
        return None, False
    result = {"seed": record["seed"], "dir": directory, "global_step": record["global_step"],
              "num_train_steps": record["num_train_steps"], "eval": record["eval"],
              "outputs": outputs, "model_dir": absolute(record["model_dir"]), "skipped": True}
    if record.get("failed"):
        result["failed"] = record["failed"]
    return result, False


def made_by_run(directory: str) -> list[str]:
    """What `remove_run` removes of `directory`: the run's own checkpoints (prefixes) and
    the files and folders its record lists (`training.run_files`)."""
    from training import checkpointing, run_files

    return checkpointing.own_checkpoints(directory) + [
        os.path.join(directory, name) for name in run_files.read(directory)["files"]]


def remove_run(directory: str) -> None:
    """Removes what the earlier run made in `directory`, by name, so that it is done again
    from its initial checkpoint, never from the final state of a run with other settings
    or data: its own checkpoints (`checkpointing.remove_checkpoints`), the files its
    record lists (`training.run_files`: summaries, outputs, best/), then the record, then
    run_results.json, last: a kill in between leaves it, and the next run removes the
    rest. Anything else in the directory (a user's notes or plots, a folder the run did
    not make) stays; a folder of the run's files that holds others' too is kept, and the
    log says so. Call it only while owning the directory."""
    from training import checkpointing, run_files

    removed = checkpointing.remove_checkpoints(directory)
    names = [n for n in run_files.read(directory)["files"] if n != RESULTS_FILE]
    for name in names:
        target = os.path.join(directory, name)
        if fileio.exists(target):
            fileio.remove(target)
            removed.append(target)
    kept = []
    for folder in sorted({os.path.dirname(n) for n in names} - {""}):
        target = os.path.join(directory, folder)
        if fileio.isdir(target):
            if fileio.listdir(target):
                kept.append(folder + "/")
            else:
                fileio.remove(target)
    run_files.remove_record(directory)
    fileio.remove(os.path.join(directory, RESULTS_FILE))
    logging.warning("%s: removed what the earlier run made: %s%s", directory,
                    ", ".join(_relative(p, directory) for p in removed) or "nothing else",
                    f"; kept {', '.join(kept)} (it holds files the run did not write)"
                    if kept else "")


def score(results: dict, key: str) -> float | None:
    """A comparable score; None for a missing or NaN metric (undefined on the dev set, e.g.
    a correlation over one label value): never picked as the best."""
    value = results.get(key)
    return None if value is None or math.isnan(value) else float(value)


def _pick(scores: Sequence, names: Sequence[str], key: str, what: str) -> int:
    """The index of the best score (the first on a tie); runs whose score is None are no
    candidates (a warning names them); when none has a score, the first, with a warning."""
    undefined = [name for name, value in zip(names, scores) if value is None]
    if undefined:
        logging.warning("dev %s is NaN or missing for %s: not a candidate for the best "
                        "%s", key, ", ".join(undefined), what)
    candidates = [i for i, value in enumerate(scores) if value is not None]
    if not candidates:
        logging.warning("no %s has a dev %s to pick the best by: the first (%s) is kept, "
                        "not picked", what, key, names[0])
        return 0
    return max(candidates, key=lambda i: (scores[i], -i))


# The file at the top of output_dir that says which kind of run it holds (`check_kind`).
_KIND_FILES = {"grid": GRID_RESULTS_FILE, "seeds": SEED_RESULTS_FILE, "single": RESULTS_FILE}
_KIND_NAMES = {"grid": "grid sweep", "seeds": "seed sweep", "single": "single run"}


def check_kind(output_dir: str, kind: str) -> str | None:
    """Why a run of `kind` ("grid", "seeds" or "single") cannot use `output_dir`: it holds
    the results of another kind of run at its top (its files would be overwritten while
    its summary still describes it); None when it can. Writes nothing."""
    for other, name in _KIND_FILES.items():
        if other != kind and fileio.exists(os.path.join(output_dir, name)):
            return (f"{output_dir} holds a {_KIND_NAMES[other]} ({name}): a "
                    f"{_KIND_NAMES[kind]} there would overwrite its results at the top of "
                    "the directory while its summary still describes it; choose another "
                    "--output_dir")
    return None


def summarise_seeds(settings, family, prepared, seed_runs: Sequence[dict],
                    write: bool = True) -> dict:
    """Picks the seed with the best primary dev metric, copies its result files to
    output_dir and writes seed_results.txt (per-seed values, mean and std of each metric)."""
    import numpy as np

    from training import loop

    key = family.primary_metric()
    first_split = prepared.eval_splits[0].name
    finished = [r for r in seed_runs if not r.get("failed")]
    failed = [r["seed"] for r in seed_runs if r.get("failed")]
    if not finished:  # no best: the grid goes on without this point, or the run fails
        return {"runs": list(seed_runs), "best_seed": None, "best_run": None, "summary": {}}
    scores = [score(r["eval"][first_split], key) for r in finished]
    best = finished[_pick(scores, [f"seed {r['seed']}" for r in finished], key, "seed")]
    summary = {"best_seed": best["seed"], "num_seeds": len(finished)}
    if failed:  # the statistics are over the seeds that finished
        summary["num_failed_seeds"] = len(failed)
    for name in sorted(best["eval"][first_split]):
        if name == "global_step":
            continue
        values = np.array([r["eval"][first_split][name] for r in finished], np.float64)
        summary[f"{name}_mean"] = float(values.mean())
        summary[f"{name}_std"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
        for run_result, value in zip(finished, values):
            summary[f"{name}_seed_{run_result['seed']}"] = float(value)
    logging.info("Best seed %s (%s = %s); %s mean %.6g std %.6g over %d seeds%s",
                 best["seed"], key, best["eval"][first_split].get(key), key,
                 summary[f"{key}_mean"], summary[f"{key}_std"], len(finished),
                 f" (failed: seed {', '.join(map(str, failed))})" if failed else "")
    result = {"runs": list(seed_runs), "best_seed": best["seed"], "best_run": best,
              "summary": summary}
    if write:
        summary_path = os.path.join(settings.output_dir, SEED_RESULTS_FILE)
        _publish(best["outputs"], settings.output_dir,
                 {summary_path: lambda temp: loop.write_eval_results(temp, summary)})
    return result


def _publish(outputs: Sequence[str], output_dir: str, summaries: dict) -> None:
    """Copies the kept run's result files into output_dir with the sweep's own summary
    files (path -> a function writing it to the temporary path it is given), as one
    all-or-nothing set (summaries last)."""
    copies = {path: os.path.join(output_dir, os.path.basename(path)) for path in outputs}
    with fileio.AtomicOutputs(list(copies.values()) + list(summaries)) as out:
        for source, target in copies.items():
            with fileio.open_file(source, "rb") as f_in, out.open(target, "wb") as f_out:
                f_out.write(f_in.read())
        for path, write in summaries.items():
            write(out.temp(path))


def summarise_grid(settings, family, prepared, points, point_results: Sequence[dict],
                   write: bool = True) -> dict:
    """Picks the best run of the grid (by the primary metric on the first dev split, the
    first in grid order on a tie; runs that failed are not candidates), copies its result
    files to output_dir and writes grid_results.tsv: one row per run (grid point x seed)
    with its dev figures or why it failed. No run finished: the table, and "best_run"
    None."""
    key = family.primary_metric()
    first_split = prepared.eval_splits[0].name
    runs_ = [r for result in point_results for r in result["runs"]]
    kept = [i for i, r in enumerate(point_results) if r["best_run"]]  # not failed
    if not kept:
        table = grid_table(settings.output_dir, prepared.eval_splits, runs_, None)
        if write:
            _publish([], settings.output_dir, {
                os.path.join(settings.output_dir, GRID_RESULTS_FILE):
                lambda temp: fileio.write_text(temp, table)})
        return {"runs": runs_, "best_seed": None, "best_run": None, "summary": {},
                "grid": table}
    # The best of the points with a finished run (the first in grid order on a tie).
    index = kept[_pick([score(point_results[i]["best_run"]["eval"][first_split], key)
                        for i in kept], [points[i].name() for i in kept], key, "grid point")]
    best = point_results[index]["best_run"]
    table = grid_table(settings.output_dir, prepared.eval_splits, runs_, best)
    logging.info("Grid results (%s on %s):\n%s", key, first_split, table.rstrip("\n"))
    logging.info("Best: learning_rate %s, train_batch_size %d, num_train_epochs %s, seed %s "
                 "(%s = %s) in %s", points[index].learning_rate,
                 points[index].train_batch_size, points[index].num_train_epochs,
                 best["seed"], key, best["eval"][first_split].get(key), best["dir"])
    if write:
        _publish(best["outputs"], settings.output_dir,
                 {os.path.join(settings.output_dir, GRID_RESULTS_FILE):
                  lambda temp: fileio.write_text(temp, table)})
    return {"runs": runs_, "best_seed": best["seed"], "best_run": best,
            "best_point": dataclasses.asdict(points[index]),
            "summary": point_results[index]["summary"], "grid": table}


def grid_table(output_dir: str, eval_splits: Sequence, runs_: Sequence[dict],
               best: dict) -> str:
    """grid_results.tsv: a header, then per run its hyperparameters, seed, dev figures of
    every eval split (metric name + the split's suffix, e.g. `eval_accuracy_mm`), its
    directory relative to output_dir, `best` (1 for the run kept) and `failed` (why a run
    stopped without figures, e.g. its loss diverged; empty for a run that finished)."""
    columns = sorted({name + split.suffix for r in runs_ for split in eval_splits
                      for name in r["eval"].get(split.name, {}) if name != "global_step"})
    header = ["learning_rate", "train_batch_size", "num_train_epochs", "seed", "global_step",
              *columns, "dir", "best", "failed"]
    lines = ["\t".join(header)]
    for r in runs_:
        figures = {name + split.suffix: value for split in eval_splits
                   for name, value in r["eval"].get(split.name, {}).items()}
        point = r["point"]
        row = [point["learning_rate"], point["train_batch_size"], point["num_train_epochs"],
               "" if r["seed"] is None else r["seed"],
               "" if r["global_step"] is None else r["global_step"],
               *[figures.get(name, "") for name in columns],
               _relative(r["dir"], output_dir), int(best is not None and r["dir"] == best["dir"]),
               r.get("failed", "")]
        lines.append("\t".join(str(value) for value in row))
    return "\n".join(lines) + "\n"
