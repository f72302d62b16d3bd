"""glue_submission.py: the whole GLUE submission in one command (issue 26, section 4).

Tiny GLUE-format task folders (the download layout: every task's header line and columns
as GLUE's files, `tasks.classification.processors`) are written here. The checks of the
submission files (header, indices, label names, scores, row counts), WNLI's majority class,
--tasks and --collect_only run without training; the real command (in this process) then fine-tunes every task
of the tiny benchmark once (tiny config), predicts AX with MNLI's model and zips the 11
files in the format the GLUE server takes; a rerun trains nothing and writes the same zip.
"""

import math
import os
import random
import zipfile

import pytest

from tests import test_loop_support as S
from tests.clis import call_main
from tests.conftest import TINY_VOCAB, write_vocab
from tests.test_run_classifier import (_pairs, _sentence, _write_tsv, write_cola, write_mnli,
                                       write_mrpc, write_stsb)

SEQ = 32
ZIP_NAMES = ["CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "QQP.tsv", "MNLI-m.tsv",
             "MNLI-mm.tsv", "QNLI.tsv", "RTE.tsv", "WNLI.tsv", "AX.tsv"]
LABELS = {"CoLA.tsv": {"0", "1"}, "SST-2.tsv": {"0", "1"}, "MRPC.tsv": {"0", "1"},
          "QQP.tsv": {"0", "1"}, "WNLI.tsv": {"0", "1"},
          "QNLI.tsv": {"entailment", "not_entailment"},
          "RTE.tsv": {"entailment", "not_entailment"},
          "MNLI-m.tsv": {"entailment", "neutral", "contradiction"},
          "MNLI-mm.tsv": {"entailment", "neutral", "contradiction"},
          "AX.tsv": {"entailment", "neutral", "contradiction"}}


# ------------------------------------------------------------- tiny GLUE-format data


def write_sst2(d, rng, n_train=12, n_dev=6):
    d.mkdir(parents=True, exist_ok=True)
    rows = [(_sentence(rng, "cat" if i % 2 else "dog"), i % 2) for i in range(n_train + n_dev)]
    _write_tsv(d / "train.tsv", ["sentence", "label"], rows[:n_train])
    _write_tsv(d / "dev.tsv", ["sentence", "label"], rows[n_train:])
    _write_tsv(d / "test.tsv", ["index", "sentence"],
               [(i, r[0]) for i, r in enumerate(rows[n_train:])])
    return d


def write_qqp(d, rng, n_train=12, n_dev=6):
    d.mkdir(parents=True, exist_ok=True)
    pairs = _pairs(rng, n_train + n_dev)
    rows = [(i, 2 * i, 2 * i + 1, a, b, lab) for i, (a, b, lab) in enumerate(pairs)]
    header = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]
    _write_tsv(d / "train.tsv", header, rows[:n_train])
    _write_tsv(d / "dev.tsv", header, rows[n_train:])
    _write_tsv(d / "test.tsv", ["id", "question1", "question2"],
               [(i, r[3], r[4]) for i, r in enumerate(rows[n_train:])])
    return d


def write_index_pair(d, rng, columns, labels, n_train=12, n_dev=6, majority=None):
    """QNLI (index question sentence label), RTE and WNLI (index sentence1 sentence2
    label); `majority` makes every third train/dev label that one (else alternating)."""
    d.mkdir(parents=True, exist_ok=True)
    pairs = _pairs(rng, n_train + n_dev)
    rows = []
    for i, (a, b, same) in enumerate(pairs):
        label = labels[0] if same else labels[1]
        if majority is not None:
            label = labels[0] if i % 3 == 0 else majority
        rows.append((i, a, b, label))
    header = ["index", *columns, "label"]
    _write_tsv(d / "train.tsv", header, rows[:n_train])
    _write_tsv(d / "dev.tsv", header, [(i, *r[1:]) for i, r in enumerate(rows[n_train:])])
    _write_tsv(d / "test.tsv", header[:3], [(i, r[1], r[2])
                                            for i, r in enumerate(rows[n_train:])])
    return d


def write_diagnostic(d, rng, n=7):
    d.mkdir(parents=True, exist_ok=True)
    _write_tsv(d / "diagnostic.tsv", ["index", "sentence1", "sentence2"],
               [(i, a, b) for i, (a, b, _) in enumerate(_pairs(rng, n))])
    return d


def write_glue(root):
    """Every GLUE task folder of the download layout, tiny; WNLI's majority label is 1."""
    rng = random.Random(0)
    write_cola(root / "CoLA", rng, n_train=12, n_dev=6)
    write_sst2(root / "SST-2", rng)
    write_mrpc(root / "MRPC", rng, n_train=12, n_dev=6)
    write_stsb(root / "STS-B", rng, n_train=12, n_dev=6)
    write_qqp(root / "QQP", rng)
    write_mnli(root / "MNLI", rng, n_train=12, n_dev=5)
    write_index_pair(root / "QNLI", rng, ["question", "sentence"],
                     ["entailment", "not_entailment"])
    write_index_pair(root / "RTE", rng, ["sentence1", "sentence2"],
                     ["entailment", "not_entailment"])
    write_index_pair(root / "WNLI", rng, ["sentence1", "sentence2"], ["0", "1"],
                     majority="1")
    write_diagnostic(root / "diagnostic", rng)
    return root


def _test_rows(glue_dir):
    """{zip name: test examples} counted from the files (header line excluded)."""
    files = {"CoLA.tsv": "CoLA/test.tsv", "SST-2.tsv": "SST-2/test.tsv",
             "MRPC.tsv": "MRPC/test.tsv", "STS-B.tsv": "STS-B/test.tsv",
             "QQP.tsv": "QQP/test.tsv", "MNLI-m.tsv": "MNLI/test_matched.tsv",
             "MNLI-mm.tsv": "MNLI/test_mismatched.tsv", "QNLI.tsv": "QNLI/test.tsv",
             "RTE.tsv": "RTE/test.tsv", "WNLI.tsv": "WNLI/test.tsv",
             "AX.tsv": "diagnostic/diagnostic.tsv"}
    return {name: len(open(os.path.join(glue_dir, path), encoding="utf-8").readlines()) - 1
            for name, path in files.items()}


def _valid_file(name, rows):
    """A submission file the server takes for `name` with `rows` predictions."""
    value = "0.5" if name == "STS-B.tsv" else sorted(LABELS[name])[0]
    return "index\tprediction\n" + "".join(f"{i}\t{value}\n" for i in range(rows))


def _fake_outputs(out, rows):
    """Each task folder of a finished benchmark holding its valid submission file(s)."""
    from tasks.classification import glue

    for task in glue.TASKS:
        for name, _ in glue.submission_files(task):
            folder = out / glue.RUN_DIRS[task]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(_valid_file(name, rows[name]))


# -------------------------------------------------------------- checks, no training


@pytest.mark.parametrize("name, text, message", [
    ("RTE.tsv", "id\tprediction\n0\tentailment\n", r"RTE.tsv:1: expected the header"),
    ("RTE.tsv", "index\tprediction\n0\tentailment\n2\tentailment\n", r"RTE.tsv:3: expected '1"),
    ("RTE.tsv", "index\tprediction\n0\t1\n", r"RTE.tsv:2: '1' is not a label of RTE"),
    ("MRPC.tsv", "index\tprediction\n0\tentailment\n", r"MRPC.tsv:2: 'entailment' is not"),
    ("AX.tsv", "index\tprediction\n0\tnot_entailment\n", r"AX.tsv:2: 'not_entailment'"),
    ("STS-B.tsv", "index\tprediction\n0\tnan\n", r"STS-B.tsv:2: 'nan' is not a finite"),
    ("STS-B.tsv", "index\tprediction\n0\thigh\n", r"STS-B.tsv:2: 'high' is not a finite"),
    ("CoLA.tsv", "index\tprediction\n0\t1\t0.9\n", r"CoLA.tsv:2: expected '0<TAB>"),
])
def test_a_submission_file_the_server_would_refuse_is_refused_naming_file_and_line(
        tmp_path, name, text, message):
    from tasks.classification import glue

    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(glue.GlueError, match=message):
        glue.check_submission_file(str(path), name)


def test_a_submission_file_is_checked_against_the_test_set_size(tmp_path):
    from tasks.classification import glue

    path = tmp_path / "STS-B.tsv"
    path.write_text("index\tprediction\n0\t4.25\n1\t-0.5\n")
    assert glue.check_submission_file(str(path), "STS-B.tsv") == 2
    with pytest.raises(glue.GlueError, match="STS-B.tsv: 2 predictions, but the test set "
                                             "has 3 examples"):
        glue.check_submission_file(str(path), "STS-B.tsv", expected=3)


def test_wnli_predicts_the_majority_class_of_train_and_dev(tmp_path):
    from tasks.classification import glue

    data = write_index_pair(tmp_path / "WNLI", random.Random(1), ["sentence1", "sentence2"],
                            ["0", "1"], majority="1")
    result = glue.majority_baseline(str(data), str(tmp_path / "out"))
    lines = (tmp_path / "out" / "WNLI.tsv").read_text().splitlines()
    assert lines == ["index\tprediction"] + [f"{i}\t1" for i in range(6)]
    assert (tmp_path / "out" / "test_results.tsv").read_text() == "0.0\t1.0\n" * 6
    dev = [line.split("\t")[-1] for line in (data / "dev.tsv").read_text().splitlines()[1:]]
    assert result["dev"]["eval_accuracy"] == pytest.approx(dev.count("1") / len(dev))
    assert "eval_accuracy = " in (tmp_path / "out" / "eval_results.txt").read_text()


def test_the_tasks_flag_is_checked():
    from tasks.classification import glue

    assert glue.parse_tasks(["RTE", "mnli", "AX", "sts-b"]) == ("sts-b", "mnli", "rte", "ax")
    with pytest.raises(glue.GlueError, match="--tasks: 'SQuAD' is not a GLUE task"):
        glue.parse_tasks(["RTE", "SQuAD"])
    with pytest.raises(glue.GlueError, match="--tasks: 'xnli' is not a GLUE task"):
        glue.parse_tasks(["xnli"])
    with pytest.raises(glue.GlueError, match="--tasks: AX is predicted with MNLI's model"):
        glue.parse_tasks(["AX", "RTE"])


def test_collect_only_zips_the_checked_files_or_writes_nothing(tmp_path):
    from tasks.classification import glue
    from training import finetuning

    glue_dir = write_glue(tmp_path / "glue")
    rows = _test_rows(glue_dir)
    out = tmp_path / "out"
    _fake_outputs(out, rows)
    run = finetuning.FinetuningRun(vocab_file="v", bert_config_file="c",
                                   output_dir=str(out))
    settings = glue.GlueSettings(glue_dir=str(glue_dir), collect_only=True)
    result = glue.run_benchmark(run, settings)
    with zipfile.ZipFile(out / "submission.zip") as archive:
        assert archive.namelist() == ZIP_NAMES
        for name in ZIP_NAMES:
            assert archive.read(name).decode() == _valid_file(name, rows[name])
    assert result["missing"] == [] and result["zip"] == str(out / "submission.zip")
    before = (out / "submission.zip").read_bytes()

    # One file short of the test set: refused naming it, the zip is left as it was.
    (out / "RTE" / "RTE.tsv").write_text(_valid_file("RTE.tsv", rows["RTE.tsv"] - 1))
    with pytest.raises(glue.GlueError, match=r"RTE.tsv: \d+ predictions, but the test set"):
        glue.run_benchmark(run, settings)
    assert (out / "submission.zip").read_bytes() == before
    # A task missing: refused naming its file.
    os.remove(out / "RTE" / "RTE.tsv")
    with pytest.raises(glue.GlueError, match="no RTE.tsv"):
        glue.run_benchmark(run, settings)
    assert (out / "submission.zip").read_bytes() == before
    assert sorted(name for name in os.listdir(out) if not os.path.isdir(out / name)) == [
        glue.DEV_RESULTS_FILE, "submission.zip"]  # no temporary left


def _glue_config(extra):
    """The GlueRun glue_submission.py builds from a valid command line plus `extra`."""
    from absl import flags

    import glue_submission

    argv = ["glue_submission.py", "--glue_dir=g", "--vocab_file=v", "--bert_config_file=c",
            "--output_dir=o", *extra]
    try:
        flags.FLAGS(argv)
        return glue_submission.run_config_from_flags(flags.FLAGS)
    finally:
        flags.FLAGS.unparse_flags()


def test_glue_submission_runs_the_papers_grid_unless_told_otherwise():
    from training import finetuning

    paper = _glue_config([]).finetuning
    assert paper.grid == finetuning.Grid((5e-5, 4e-5, 3e-5, 2e-5), (32,), (3.0,))
    assert (paper.do_train, paper.do_eval, paper.do_predict) == (True, True, True)
    one = _glue_config(["--learning_rate=2e-5", "--seeds=1,2"]).finetuning
    assert one.grid is None and one.loop.learning_rate == 2e-5 and one.seeds == (1, 2)
    cfg = _glue_config(["--tasks=RTE,WNLI", "--wnli=finetune"]).glue
    assert (cfg.tasks, cfg.wnli) == (("rte", "wnli"), "finetune")
    with pytest.raises(ValueError, match="--do_predict: glue_submission.py always"):
        _glue_config(["--do_predict=false"])
    assert not _glue_config([]).glue.skip_bad_rows
    assert _glue_config(["--skip_bad_rows"]).glue.skip_bad_rows


def test_a_bad_row_of_the_last_task_is_refused_before_any_task_trains(tmp_path):
    """RTE's test set (the eighth task) has a malformed row: refused naming the file and
    the line, before the first task (CoLA) writes anything, --skip_bad_rows or not (a
    test row is never skipped: each has its line in the submission file); a bad dev row
    is skipped with it."""
    from tasks.classification import examples, glue
    from training import finetuning

    glue_dir = write_glue(tmp_path / "glue")
    test_file = glue_dir / "RTE" / "test.tsv"
    lines = test_file.read_text().count("\n")
    with open(test_file, "a") as f:
        f.write("99\tonly one sentence\n")
    out = tmp_path / "out"
    run = finetuning.FinetuningRun(vocab_file="v", bert_config_file="c", output_dir=str(out),
                                   do_train=True, do_eval=True, do_predict=True)
    for skip in (False, True):
        with pytest.raises(examples.DataFormatError,
                           match=rf"RTE/test.tsv:{lines + 1}: .*never a test row"):
            glue.run_benchmark(run, glue.GlueSettings(glue_dir=str(glue_dir),
                                                      skip_bad_rows=skip))
        assert not out.exists()
    test_file.write_text(test_file.read_text().replace("99\tonly one sentence\n", ""))
    with open(glue_dir / "RTE" / "dev.tsv", "a") as f:
        f.write("99\tonly one sentence\n")
    with pytest.raises(examples.DataFormatError, match=r"RTE/dev.tsv:.*\(--skip_bad_rows "
                                                       r"skips such rows\)"):
        glue.check_data(str(glue_dir), glue.TASKS)
    glue.check_data(str(glue_dir), glue.TASKS, skip_bad_rows=True)  # skipped: no error


# ----------------------------------------------------------- the real CLI, end to end


def _command(root, out, *extra):
    flags = dict(glue_dir=root / "glue", output_dir=out, vocab_file=root / "vocab.txt",
                 bert_config_file=root / "bert_config.json", max_seq_length=SEQ,
                 learning_rate="1e-3", train_batch_size=4, eval_batch_size=4,
                 predict_batch_size=4, num_train_epochs=1, save_checkpoints_steps=100,
                 iterations_per_loop=3, distribution_strategy="one_device")
    return [f"--{k}={v}" for k, v in flags.items()] + list(extra)


def _run(argv):
    """The command in this process (tests/test_cli.py runs it once as a process): its exit
    status and everything it wrote (stdout, stderr, the absl log lines)."""
    result = call_main("glue_submission", argv, cwd=S.REPO_ROOT)
    return result.code, result.stdout + result.stderr + result.log


@pytest.mark.slow
def test_one_command_writes_the_whole_submission_and_a_rerun_trains_nothing(tmp_path):
    write_glue(tmp_path / "glue")
    write_vocab(tmp_path / "vocab.txt")
    S.write_config(tmp_path / "bert_config.json", vocab_size=len(TINY_VOCAB),
                   num_hidden_layers=1)
    out = tmp_path / "out"
    code, log = _run(_command(tmp_path, out))
    assert code == 0, log[-4000:]
    rows = _test_rows(tmp_path / "glue")
    with zipfile.ZipFile(out / "submission.zip") as archive:
        assert archive.namelist() == ZIP_NAMES
        files = {name: archive.read(name).decode() for name in ZIP_NAMES}
    for name, text in files.items():
        lines = text.splitlines()
        assert lines[0] == "index\tprediction", name
        assert [line.split("\t")[0] for line in lines[1:]] == [
            str(i) for i in range(rows[name])], name
        values = [line.split("\t")[1] for line in lines[1:]]
        if name == "STS-B.tsv":
            assert all(math.isfinite(float(v)) for v in values), values
        else:
            assert set(values) <= LABELS[name], (name, values)
    assert files["WNLI.tsv"] == "index\tprediction\n" + "".join(
        f"{i}\t1\n" for i in range(rows["WNLI.tsv"]))  # the majority class
    # Each task's folder holds its run; AX is predicted with MNLI's model.
    for task in ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE"):
        assert (out / task / "eval_results.txt").exists() and (
            out / task / "run_results.json").exists(), task
    assert (out / "MNLI" / "eval_results_mm.txt").exists()
    assert "AX: predicting with MNLI's model" in log
    dev = (out / "glue_dev_results.tsv").read_text().splitlines()
    assert dev[0] == "task\tmetric\tvalue" and len(dev) == 1 + 10  # 9 tasks + MNLI-mm

    code, log = _run(_command(tmp_path, out))
    assert code == 0, log[-4000:]
    for task in ("CoLA", "MNLI", "RTE", "AX"):  # AX: MNLI's model is the same weights
        assert f"{out / task} finished earlier (run_results.json): skipped" in log
    assert "Training on" not in log
    with zipfile.ZipFile(out / "submission.zip") as archive:
        assert {name: archive.read(name).decode() for name in ZIP_NAMES} == files


@pytest.mark.slow
def test_wnli_finetune_trains_wnli_like_any_other_task(tmp_path):
    """--wnli=finetune: WNLI is fine-tuned in its folder (no majority baseline), and its
    predictions are a submission file the server takes."""
    write_glue(tmp_path / "glue")
    write_vocab(tmp_path / "vocab.txt")
    S.write_config(tmp_path / "bert_config.json", vocab_size=len(TINY_VOCAB),
                   num_hidden_layers=1)
    out = tmp_path / "out"
    code, log = _run(_command(tmp_path, out, "--tasks=WNLI", "--wnli=finetune"))
    assert code == 0, log[-4000:]
    assert "WNLI: the majority class" not in log
    assert "Training on" in log
    assert (out / "WNLI" / "eval_results.txt").exists()
    assert (out / "WNLI" / "run_results.json").exists()
    rows = _test_rows(tmp_path / "glue")["WNLI.tsv"]
    lines = (out / "WNLI" / "WNLI.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction"
    assert [line.split("\t")[0] for line in lines[1:]] == [str(i) for i in range(rows)]
    assert {line.split("\t")[1] for line in lines[1:]} <= LABELS["WNLI.tsv"]
    assert not (out / "submission.zip").exists()  # the other tasks were not run
    dev = (out / "glue_dev_results.tsv").read_text().splitlines()
    assert dev[0] == "task\tmetric\tvalue" and dev[1].startswith("WNLI\t")
