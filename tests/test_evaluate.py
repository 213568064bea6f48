"""The evaluation suite without Ray: reading and checking a suite file, the protocol's scoring, the table, the
derived tasks' script, and the job's bad-input lines (each before any trial). The trials themselves:
tests/test_evaluate_job.py."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import ConfigError
from pipeline.evaluate.job import check_files
from pipeline.evaluate.suite import choose_lr, load_suite, suite_score, table, task_score

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["shared", "quick"])
def test_the_project_suites_load_and_their_files_exist(name):
    s = load_suite(str(REPO / "configs" / "eval" / f"{name}.yaml"))
    assert s.name == name and len(s.sha256) == 64
    check_files(s)  # every task file there and not empty
    by = {t.name: t for t in s.tasks}
    assert by["pydocs_topic"].test is None and Path(by["pydocs_topic"].train).is_file()
    if name == "quick":  # two trials side by side: the main job's budget (bench/results/quality.md)
        assert set(by) == {"pydocs_topic"} and s.num_trials(1) == 2
        assert by["pydocs_topic"].protocol.max_train_examples == 800 and by["pydocs_topic"].protocol.epochs == 2
    if name == "shared":
        assert by["code_spans"].task == "token-classification" and by["code_spans"].test.endswith("test.conll")
        assert by["same_page"].task == "sentence-pair-classification" and by["same_page"].test.endswith("test.tsv")
        assert s.protocol.lrs == (3e-4, 1e-3) and s.protocol.seeds == (1, 2, 3)
        assert by["same_page"].protocol.max_seq_length == 160 and by["pydocs_topic"].protocol.max_seq_length == 128
        assert by["pydocs_search"].task == "retrieval" and by["pydocs_search"].test.endswith("qrels/test.tsv")
        assert by["pydocs_search"].metric == "ndcg@10" and by["pydocs_search"].protocol.max_seq_length == 64
        assert s.num_trials(2) == 2 * 4 * 2 * 3


def _suite(tmp_path: Path, text: str) -> str:
    p = tmp_path / "suite.yaml"
    p.write_text(text)
    return str(p)


TASK = "{name: t, task: sequence-classification, train: tr.tsv, dev: dev.tsv, metric: accuracy}"


@pytest.mark.parametrize(
    "text, words",
    [
        ("name: s\ntasks: [{name: t, task: [unclosed\n", ["does not parse as YAML"]),
        (
            f"name: s\ntasks: [{TASK.replace('sequence-classification', 'sentiment')}]\n",
            ["unknown task type 'sentiment'", "task t"],
        ),
        (
            f"name: s\ntasks: [{TASK.replace('accuracy', 'f1')}]\n",
            ["metric 'f1' does not fit sequence-classification", "accuracy, macro_f1"],
        ),
        (f"name: s\nprotocol: {{lrs: [0]}}\ntasks: [{TASK}]\n", ["protocol", "lrs [0.0]"]),
        (f"name: s\nprotocol: {{lr: [1e-3]}}\ntasks: [{TASK}]\n", ["unknown field(s) lr"]),
        ("name: s\ntasks: []\n", ["tasks must be a non-empty list"]),
        (f"name: s\ntasks: [{TASK}, {TASK}]\n", ["task t: named twice"]),
        (f"name: s\ntasks: [{TASK.replace(', dev: dev.tsv', '')}]\n", ["task t: no dev file"]),
    ],
)
def test_a_bad_suite_is_one_line_naming_the_field(tmp_path, text, words):
    path = _suite(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_suite(path)
    msg = str(e.value)
    assert "\n" not in msg and path in msg and all(w in msg for w in words), msg


def test_missing_or_empty_task_files_are_named(tmp_path):
    (tmp_path / "tr.tsv").write_text("sentence\tlabel\na\tx\n")
    s = load_suite(_suite(tmp_path, f"name: s\ntasks: [{TASK}]\n"))  # relative to the suite file's directory
    with pytest.raises(ConfigError, match=r"task t: dev file .*dev.tsv does not exist"):
        check_files(s)
    (tmp_path / "dev.tsv").write_text("")
    with pytest.raises(ConfigError, match=r"task t: dev file .*dev.tsv is empty"):
        check_files(s)


def test_the_protocol_picks_the_lr_by_mean_dev_and_reports_test_at_it():
    dev = {3e-4: [0.60, 0.70, 0.65], 1e-3: [0.70, 0.72, 0.74], 3e-3: [0.2, 0.9, 0.9]}
    test = {3e-4: [0.5, 0.5, 0.5], 1e-3: [0.61, 0.63, 0.65], 3e-3: [0.1, 0.1, 0.1]}
    assert choose_lr(dev) == 1e-3  # 0.72 > 0.667 > 0.65
    r = task_score(dev, test, (1, 2, 3), "accuracy")
    assert r["lr"] == 1e-3 and r["scores"] == [0.61, 0.63, 0.65] and r["dev_mean"] == pytest.approx(0.72)
    assert r["mean"] == pytest.approx(0.63) and r["sd"] == pytest.approx(0.02)  # sample sd
    assert choose_lr({1e-3: [0.5], 3e-4: [0.5]}) == 1e-3  # a tie goes to the earlier LR of the grid
    assert choose_lr({1e-3: [math.nan, 0.9], 3e-4: [0.1, 0.1]}) == 3e-4  # a diverged seed sinks its LR
    assert suite_score({"a": {"mean": 0.5}, "b": {"mean": 0.8}}) == pytest.approx(0.65)


def test_the_table_reads_tasks_by_models():
    s = load_suite(str(REPO / "tests" / "data" / "eval_tiny.yaml"))
    res = {
        "score": 0.6,
        "tasks": {
            "pydocs_topic": {"mean": 0.5, "sd": 0.01, "lr": 1e-3},
            "same_page": {"mean": 0.7, "sd": 0.0, "lr": 1e-3},
        },
    }
    text = table(s, {"models:/m/1": res, "scratch:tiny": {**res, "score": 0.4}})
    lines = text.splitlines()
    assert lines[0].split()[-2:] == ["models:/m/1", "scratch:tiny"]
    assert "pydocs_topic (accuracy, dev)" in lines[2] and "50.0 ± 1.0 (lr 0.001)" in lines[2]
    assert "same_page (accuracy, test)" in lines[3] and lines[4].split()[-2:] == ["60.0", "40.0"]
    md = table(s, {"models:/m/1": res}, markdown=True)
    assert md.splitlines()[1] == "|---|---|" and md.splitlines()[-1] == "| score (tiny-test) | 60.0 |"


def test_the_derived_tasks_are_what_their_script_makes(tmp_path, shared_dir):
    out = tmp_path / "tasks"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "configs" / "eval" / "make_tasks.py"),
            "--shared",
            str(shared_dir),
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    committed = REPO / "configs" / "eval" / "tasks"
    files = sorted(p.relative_to(committed) for p in committed.rglob("*.*") if p.suffix in (".tsv", ".conll", ".jsonl"))
    assert len(files) == 11  # pydocs_search: train.tsv, corpus.jsonl, queries.jsonl, qrels/dev.tsv, qrels/test.tsv
    for f in files:
        assert (out / f).read_bytes() == (committed / f).read_bytes(), f
    # labels from the data: balanced pairs; code tags only where the authors marked code
    rows = (committed / "same_page" / "dev.tsv").read_text().splitlines()[1:]
    assert sum(r.endswith("\t1") for r in rows) == len(rows) // 2 == 150
    words = [line.split("\t") for line in (committed / "code_spans" / "dev.conll").read_text().splitlines() if line]
    assert {t for _, t in words} == {"O", "B-CODE", "I-CODE"} and not any("``" in w or ":func:" in w for w, _ in words)
    shutil.rmtree(out)


def _evaluate(argv: list[str], capsys) -> tuple[int, str, str]:
    from conftest import load_job

    rc = load_job("evaluate").main(argv)
    cap = capsys.readouterr()
    # MLflow's own INFO lines as it opens a new SQLite store are its logging's, not the job's
    return rc, cap.out, "\n".join(line for line in cap.err.splitlines() if " INFO mlflow." not in line)


def test_a_dev_label_train_never_saw_is_one_line_before_any_trial(tmp_path, capsys, minilm_dir, monkeypatch):
    from conftest import sqlite_store

    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_store(tmp_path / "mlflow.db"))
    (tmp_path / "tr.tsv").write_text("sentence\tlabel\nan apple\tfruit\na carrot\tvegetable\n")
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\na pear\tfruit\nan oak\ttree\n")
    rc, out, err = _evaluate(
        [
            "--model",
            str(minilm_dir),
            "--suite",
            _suite(tmp_path, f"name: s\ntasks: [{TASK}]\n"),
            "--train.storage_path",
            str(tmp_path / "runs"),
        ],
        capsys,
    )
    assert rc == 1 and len(err.strip().splitlines()) == 1, err
    assert "dev.tsv: row 3: unknown label 'tree'" in err and "trial" not in out
    assert not (tmp_path / "runs").exists()


def test_a_model_that_does_not_resolve_is_one_line(tmp_path, capsys, monkeypatch):
    from conftest import sqlite_store

    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_store(tmp_path / "mlflow.db"))
    rc, _, err = _evaluate(
        ["--model", "models:/nothing-here@latest", "--suite", str(REPO / "tests" / "data" / "eval_tiny.yaml")], capsys
    )
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "nothing-here" in err, err
    rc, _, err = _evaluate(
        ["--model", str(tmp_path), "--suite", str(REPO / "tests" / "data" / "eval_tiny.yaml")], capsys
    )
    assert rc == 1 and "not models:/name@alias" in err and len(err.strip().splitlines()) == 1, err


def test_a_field_the_protocol_sets_is_refused_not_ignored(capsys):
    rc, out, err = _evaluate(
        ["--model", "scratch:tiny", "--suite", str(REPO / "tests" / "data" / "eval_tiny.yaml"), "--train.epochs", "5"],
        capsys,
    )
    assert rc == 1 and "train.epochs 5: each trial takes it from the suite's protocol (epochs)" in err, err


@pytest.mark.parametrize(
    "module",
    ["pipeline.evaluate.suite", "pipeline.evaluate.config", "pipeline.evaluate.job", "pipeline.finetune.trials"],
)
def test_the_worked_examples_in_the_docstrings_hold(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0, result
