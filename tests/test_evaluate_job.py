"""`jobs/evaluate.py` end to end on a real local Ray cluster and a real SQLite MLflow store (issue 56), on the
test-sized suite (tests/data/eval_tiny.yaml: two tasks, one with a test split, one LR, two seeds: 4 trials of 4 steps
a model, two at a time): a registered version (the real MiniLM checkpoint, registered here) scored and tagged; then
the same suite again with that version and `scratch:tiny` (the version's scorecard read back, scratch:tiny's trials
run, both compared); a trial's score against the same fine-tuning run made by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import sqlite_store

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "tests" / "data" / "eval_tiny.yaml"


@pytest.fixture(scope="module")
def store(tmp_path_factory, minilm_dir):
    """A SQLite store with MiniLM registered as models:/minilm/1."""
    from pipeline import tracking

    root = tmp_path_factory.mktemp("evaluate")
    uri = sqlite_store(root / "mlflow.db")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        run_id = tracking.start_run("minilm", "register-minilm")
        tracking.register_hf_model(str(minilm_dir), "minilm", "shipped", {"run_id": run_id}, run_id)
        tracking.client(uri).set_terminated(run_id, status="FINISHED")
        yield root


def _evaluate(store: Path, minilm_dir: Path, ray_address: str, *models: str) -> tuple[dict, str]:
    """`jobs/evaluate.py` as a user runs it, a driver of its own on the module's cluster: (its JSON line, stdout)."""
    import os

    argv = [a for m in models for a in ("--model", m)]
    p = subprocess.run(
        [
            sys.executable,
            str(REPO / "jobs" / "evaluate.py"),
            *argv,
            "--suite",
            str(SUITE),
            "--data.tokenizer",
            str(minilm_dir / "vocab.txt"),
            "--train.storage_path",
            str(store / "runs"),
        ],
        cwd=store,
        env={**os.environ, "RAY_ADDRESS": ray_address},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stdout


@pytest.fixture(scope="module")
def address(ray_local):
    return ray_local.get_runtime_context().gcs_address


@pytest.fixture(scope="module")
def first(address, store, minilm_dir):
    return _evaluate(store, minilm_dir, address, "models:/minilm@shipped")


@pytest.fixture(scope="module")
def second(first, address, store, minilm_dir):
    """The same suite again: the version (by number now) has its scorecard; scratch:tiny has none."""
    return _evaluate(store, minilm_dir, address, "models:/minilm/1", "scratch:tiny")


def _check_scores(r: dict) -> None:
    assert set(r["tasks"]) == {"pydocs_topic", "same_page"}
    for name, t in r["tasks"].items():
        assert t["metric"] == "accuracy" and t["lr"] == 1e-3 and t["seeds"] == [1, 2] and len(t["scores"]) == 2
        assert t["mean"] == pytest.approx(sum(t["scores"]) / 2) and 0 <= t["mean"] <= 1
        assert t["split"] == ("test" if name == "same_page" else "dev")
    assert r["score"] == pytest.approx((r["tasks"]["pydocs_topic"]["mean"] + r["tasks"]["same_page"]["mean"]) / 2)


@pytest.mark.slow
def test_a_registered_version_scored_with_its_scorecard(first, store):
    from pipeline import tracking

    res, out = first
    assert res["suite"] == "tiny-test" and set(res["models"]) == {"models:/minilm@shipped"}
    import hashlib

    assert res["suite_sha256"] == hashlib.sha256(SUITE.read_bytes()).hexdigest()
    _check_scores(res["models"]["models:/minilm@shipped"])
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("task (metric)"))
    assert lines[head].split()[-1] == "models:/minilm@shipped"
    assert lines[head + 4].startswith("score (tiny-test)")
    assert sum("trials 4/4 done" in line for line in lines) == 1 and "2 at a time" in out

    # the version's tags name the suite, its sha256, the score and the evaluation run
    c = tracking.client()
    tags = c.get_model_version("minilm", "1").tags
    assert tags["suite.tiny-test.sha256"] == res["suite_sha256"]
    assert float(tags["suite.tiny-test.score"]) == pytest.approx(
        res["models"]["models:/minilm@shipped"]["score"], abs=1e-5
    )
    run_id = tags["suite.tiny-test.run_id"]
    assert run_id == res["models"]["models:/minilm@shipped"]["run_id"]
    run = c.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["suite"] == "tiny-test"
    m = res["models"]["models:/minilm@shipped"]
    assert run.data.metrics["suite/score"] == pytest.approx(m["score"])
    assert run.data.metrics["suite/same_page/accuracy"] == pytest.approx(m["tasks"]["same_page"]["mean"])
    assert run.data.metrics["suite/pydocs_topic/accuracy_sd"] == pytest.approx(m["tasks"]["pydocs_topic"]["sd"])
    names = {a.path for a in c.list_artifacts(run_id)} | {a.path for a in c.list_artifacts(run_id, "suite")}
    assert {"scorecard.json", "scorecard.md", "scorecard.png", "suite/eval_tiny.yaml"} <= names
    md = Path(c.download_artifacts(run_id, "scorecard.md", str(store))).read_text()
    assert "| score (tiny-test) |" in md and "models:/minilm@shipped" in md
    png = Path(c.download_artifacts(run_id, "scorecard.png", str(store))).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # the trials, nested: 2 tasks x 1 LR x 2 seeds, each FINISHED with its best (and test) metrics
    exp = c.get_experiment_by_name("bert-evaluate")
    kids = c.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'")
    assert len(kids) == 4 and all(k.info.status == "FINISHED" for k in kids)
    pair = [k for k in kids if k.data.tags["suite_task"] == "same_page"]
    assert all("test/accuracy" in k.data.metrics and "best/accuracy" in k.data.metrics for k in pair)
    assert sorted(k.data.metrics["test/accuracy"] for k in pair) == sorted(m["tasks"]["same_page"]["scores"])
    assert not any((store / "runs").glob("eval-*-lr*"))  # a trial's checkpoints go once it has reported


@pytest.mark.slow
def test_a_trial_scores_what_finetune_py_makes_by_hand(second, store, minilm_dir, shared_dir):
    """scratch:tiny on pydocs_topic at LR 1e-3, seed 2, as finetune.py would be run with the suite's settings."""
    from pipeline.finetune.config import load_finetune_config
    from pipeline.finetune.job import run_finetune

    res, _ = second
    cfg = load_finetune_config(
        None,
        [
            "--train.lr",
            "1e-3",
            "--train.seed",
            "2",
            "--train.epochs",
            "1",
            "--train.batch_size",
            "16",
            "--data.max_seq_length",
            "32",
            "--data.max_train_examples",
            "64",
            "--data.max_eval_examples",
            "48",
            "--data.tokenizer",
            str(minilm_dir / "vocab.txt"),
            "--train.torch_threads",
            "1",
            "--train.storage_path",
            str(store / "manual"),
            "--tracking.register",
            "false",
        ],
    )
    task = shared_dir / "tasks" / "pydocs_topic"
    manual = run_finetune(
        cfg, "scratch:tiny", "sequence-classification", str(task / "train.tsv"), str(task / "dev.tsv")
    )
    suite_score = res["models"]["scratch:tiny"]["tasks"]["pydocs_topic"]["scores"][1]  # seeds [1, 2]
    assert manual["metrics"]["accuracy"] == pytest.approx(suite_score, abs=1e-6)


@pytest.mark.slow
def test_the_same_suite_again_reads_the_version_back_and_compares_it(first, second, store):
    from pipeline import tracking

    res, again, out = first[0], *second
    assert "(models:/minilm/1) already has a scorecard of suite tiny-test" in out
    assert "trials 4/4 done" in out and "4 trials for 1 model(s)" in out  # scratch:tiny's only
    assert again["models"]["models:/minilm/1"] == res["models"]["models:/minilm@shipped"]  # read back, run id too
    _check_scores(again["models"]["scratch:tiny"])
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("task (metric)"))
    assert lines[head].split()[-2:] == ["models:/minilm/1", "scratch:tiny"]
    # scratch:tiny's evaluation run keeps the comparison of both; the version's tags still name the first run
    c = tracking.client()
    run_id = again["models"]["scratch:tiny"]["run_id"]
    assert c.get_run(run_id).info.status == "FINISHED" and run_id != res["models"]["models:/minilm@shipped"]["run_id"]
    md = Path(c.download_artifacts(run_id, "scorecard.md", str(store))).read_text()
    assert "models:/minilm/1" in md and "scratch:tiny" in md
    tags = c.get_model_version("minilm", "1").tags
    assert tags["suite.tiny-test.run_id"] == res["models"]["models:/minilm@shipped"]["run_id"]


@pytest.mark.slow
def test_the_trials_bench_runs_at_its_smallest(address, minilm_dir, tmp_path, capsys):
    """bench/quality/eval_trials.py on one 4-step trial, both of its runs on the module's cluster."""
    from conftest import load_bench

    suite = tmp_path / "one.yaml"
    suite.write_text(
        SUITE.read_text()
        .split("  - {name: same_page")[0]
        .replace("seeds: [1, 2]", "seeds: [1]")
        .replace("../../../shared", str(REPO.parent / "shared"))
    )
    assert load_bench("eval_trials").main(["--suite", str(suite), "--address", address]) == 0
    out = capsys.readouterr().out
    assert "ratio one at a time / side by side (wall): " in out and "this suite: 1 trials a model" in out
