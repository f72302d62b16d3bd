"""Fault injection for export_saved_model.py (issue 10's proof, the export part).

The real CLI is killed (SIGKILL, SIGTERM) at seeded random moments while it replaces an
export with --overwrite; the runs alternate between two checkpoints, so the previous
export and the new one give different outputs. After every kill, the final name holds a
complete export (loadable, serving exactly the previous checkpoint's or the new one's
outputs), nothing visible was left beside it, a SIGTERM'd run removed its own temporary,
and no process is left. A last run then succeeds and removes every stale temporary.
An export left in place (the same directory under the final name) is compared byte for
byte with the one served before the kill; one that replaced it is loaded and served.

Kills are counted as having landed only when the run was still running and ended with the
signal's exit status; mid-export only when its temporary export existed just before the
signal. The test requires enough of both (of each signal), or it would check nothing.
"""

import collections
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the ops the exported graph uses)

from conftest import REPO_ROOT, write_vocab
from data_prep import fileio
from data_prep.tokenization import FullTokenizer
from modeling.export import writer
from modeling.export.metadata import ExportMetadata, write_export_metadata
from modeling.models import BertClassifier
from test_export import (LABELS, SEQ, TEXTS, VOCAB, _config, _save_like_training,
                         python_features)
from tests.clis import call_main

pytestmark = pytest.mark.slow

# (signal, when): "anytime" over a whole run (imports, checkpoint loading, writing),
# "writing" once the run's temporary export has appeared (saving, the swap, clean-up).
# SIGTERM anytime: before its handler exists or after; a SIGKILL before the writing
# leaves what a run that never started leaves (its moments in the writing are the
# stratified ones; a start-up kill -9 of a CLI is test_fault_injection_runners.py's).
# The writing kills stratified in thirds of the temporary's life: SIGKILL in the first
# (the save), SIGTERM in the second, SIGKILL in the last (the save's end, the swap, the
# old one's removal); a signal that missed the writing is tried again (MISSED_RETRIES).
KILLS = [(signal.SIGTERM, "anytime"), (signal.SIGKILL, "writing"),
         (signal.SIGTERM, "writing"), (signal.SIGKILL, "writing")]
MISSED_RETRIES = 4


def _run_dir(root, name, seed):
    keras.utils.set_random_seed(seed)
    directory = root / name
    directory.mkdir()
    write_vocab(directory / "vocab.txt", VOCAB)
    _config().to_json_file(str(directory / "bert_config.json"))
    model = BertClassifier(_config(), len(LABELS))
    _save_like_training(model, directory)
    write_export_metadata(str(directory), ExportMetadata(
        labels=tuple(LABELS), max_seq_length=SEQ))
    features = python_features(FullTokenizer(str(directory / "vocab.txt")), TEXTS,
                                      None, SEQ)
    logits = model({k: tf.constant(v) for k, v in features.items()})["logits"]
    return directory, tf.nn.softmax(logits).numpy()


def _start(run_dir, target):
    return subprocess.Popen(
        [sys.executable, os.path.join(REPO_ROOT, "export_saved_model.py"),
         f"--init_checkpoint={run_dir}", f"--export_dir={target}", "--overwrite=true"],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


def _children(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _has_temporary(out, process):
    """True while `process`'s temporary export (being saved, or the old one swapped out
    and being removed) exists in `out`."""
    return any(f"-{process.pid}-" in name for name in os.listdir(out)
               if fileio.is_temporary(name))


def _wait_for_temporary(out, process, present=True, timeout=120):
    """Polls until `process`'s temporary export exists (present=True) or no longer exists
    (present=False); False if the process exited first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        found = _has_temporary(out, process)
        if found == present:
            return True
        time.sleep(0.005)
    return False


def _served(target):
    serve = tf.saved_model.load(str(target)).signatures["serving_default"]
    return serve(text=tf.constant(TEXTS))["probabilities"].numpy()


# One interrupted run: did the signal land (the run still ran and ended with the signal's
# status), and did it land mid-export (its temporary existed just before the signal)?
Outcome = collections.namedtuple(
    "Outcome", "signal when code landed mid_export new_in_place temporaries_left")


def _ended_by(sig, code):
    """True if exit status `code` is the one `sig` gives: -9 for SIGKILL; for SIGTERM 143
    (the handler's clean exit) or -15 (the signal came before the handler existed)."""
    if sig == signal.SIGKILL:
        return code == -signal.SIGKILL
    return code in (128 + signal.SIGTERM, -signal.SIGTERM)


def _snapshot(directory):
    """{relative path: bytes} of every file under `directory` (the runs' inputs)."""
    return {os.path.relpath(os.path.join(root, name), directory):
            open(os.path.join(root, name), "rb").read()
            for root, _, names in os.walk(directory) for name in names}


def _which(got, references):
    names = [name for name, want in references.items()
             if np.abs(got - want).max() < 1e-5]
    assert len(names) == 1, {n: float(np.abs(got - w).max()) for n, w in references.items()}
    return names[0]


def test_kill_at_random_moments_leaves_the_old_or_the_new_export(tmp_path):
    rng = np.random.default_rng(20240610)
    runs = tmp_path / "runs"
    runs.mkdir()
    run_a, probs_a = _run_dir(runs, "a", 1)
    run_b, probs_b = _run_dir(runs, "b", 2)
    references = {"a": probs_a, "b": probs_b}
    inputs = _snapshot(runs)
    assert np.abs(probs_a - probs_b).max() > 1e-3
    out = tmp_path / "out"
    target = out / "export"

    out.mkdir()
    started = time.monotonic()
    first = _start(run_a, target)
    assert _wait_for_temporary(out, first)
    writing_started = time.monotonic()
    assert _wait_for_temporary(out, first, present=False)
    writing = time.monotonic() - writing_started  # the temporary's life: save and swap
    assert first.wait(timeout=300) == 0, first.stderr.read()[-3000:]
    full = time.monotonic() - started  # one whole run
    current = _which(_served(target), references)
    assert current == "a"
    served = _snapshot(target)  # the bytes of the export `current` names

    outcomes = []
    writing_kills = 0
    # When the writing kills missed the temporary's life (this machine's timing moved
    # since the first run) so that a signal never landed mid-export, that signal is tried
    # again early in the temporary's life, at most MISSED_RETRIES times in all.
    kills, retries, i = list(KILLS), 0, -1
    while kills:
        i += 1
        sig, when = kills.pop(0)
        new = "b" if current == "a" else "a"
        in_place = os.stat(target).st_ino  # the export directory under the final name
        process = _start(run_a if new == "a" else run_b, target)
        if when == "writing":
            # Stratified over the temporary's life (saving, the swap, the old one's
            # removal): the k-th of n writing kills in [k/n, (k+1)/n) of it.
            n = sum(w == "writing" for _, w in KILLS)
            # A retry (past the n stratified kills) aims early in the temporary's life.
            start = writing_kills if writing_kills < n else 0.0
            fraction = (start + float(rng.uniform(0.0, 1.0 if writing_kills < n else 0.5))) / n
            writing_kills += 1
            _wait_for_temporary(out, process)
            time.sleep(fraction * writing)
        else:
            time.sleep(float(rng.uniform(0.2, 0.9)) * full)
        children = _children(process.pid)
        running = process.poll() is None
        mid_export = running and _has_temporary(out, process)
        process.send_signal(sig)
        code = process.wait(timeout=120)
        stderr = process.stderr.read()
        assert not [child for child in children if fileio.pid_alive(child)], children
        # Under the final name: a complete export, the previous one or the new one.
        assert writer.export_kind(str(target)) == "classifier", (i, sig, code)
        # The new outputs are served exactly when the directory under the final name was
        # replaced (the new one is made beside it while the old one exists, so its inode
        # differs): a kill leaves the old export whole or the new one whole, never a mix,
        # and a run that ended on its own replaced it. The old one left in place is the
        # export served before, byte for byte (the same bytes serve the same outputs).
        replaced = os.stat(target).st_ino != in_place
        if replaced:
            found = _which(_served(target), references)
            served = _snapshot(target)
        else:
            assert _snapshot(target) == served, (i, sig, code)
            found = current
        assert (found == new) == replaced, (i, sig, code, found, replaced)
        if code == 0:
            assert found == new, (i, sig)
        leftovers = [name for name in os.listdir(out) if name != "export"]
        assert all(fileio.is_temporary(name) for name in leftovers), leftovers
        if code == 128 + signal.SIGTERM:  # the handler ran: it removed its own temporary
            assert not [n for n in leftovers if f"-{process.pid}-" in n], (leftovers, stderr)
        landed = running and _ended_by(sig, code)
        outcomes.append(Outcome(sig.name, when, code, landed, mid_export and landed,
                                found == new, len(leftovers)))
        current = found
        missed = [candidate for candidate in (signal.SIGKILL, signal.SIGTERM)
                  if not any(o.mid_export and o.signal == candidate.name for o in outcomes)]
        if not kills and missed and retries < MISSED_RETRIES:
            retries += 1
            kills.append((missed[0], "writing"))

    # The kills landed, mid-export for each signal; the final rerun succeeds and cleans up.
    print(f"full run {full:.1f}s, writing {writing:.2f}s; kills:", outcomes)
    assert sum(o.landed for o in outcomes) >= len(KILLS) - 1, outcomes
    assert sum(o.mid_export for o in outcomes) >= 2, outcomes
    assert {o.signal for o in outcomes if o.mid_export} == {"SIGKILL", "SIGTERM"}, outcomes
    new = "b" if current == "a" else "a"
    # Nobody signals the last run: the CLI in this process (tests/clis.py; the processes
    # above are the killed ones), the temporaries it removes being those of dead processes.
    last = call_main("export_saved_model", [
        f"--init_checkpoint={run_a if new == 'a' else run_b}", f"--export_dir={target}",
        "--overwrite=true"], cwd=REPO_ROOT)
    assert last.code == 0, (last.stderr + last.log)[-3000:]
    assert _which(_served(target), references) == new
    assert os.listdir(out) == ["export"], outcomes
    assert _snapshot(runs) == inputs  # the checkpoints exported from are untouched
