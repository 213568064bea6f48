"""pipeline.tracking against a real MLflow SQLite store: runs, resumable logging, registry, download."""

from __future__ import annotations

import json
import os

import pytest

from pipeline import tracking

from conftest import sqlite_store


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    """One SQLite store for the module (creating MLflow's schema costs seconds); tests use their own names."""
    d = tmp_path_factory.mktemp("mlflow")
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = sqlite_store(d / "mlflow.db")
    yield d
    if old is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = old


@pytest.fixture()
def store(store_dir, tmp_path):
    assert tracking.tracking_uri() == f"sqlite:///{store_dir / 'mlflow.db'}"
    return tmp_path


def test_start_run_reopens_the_run_of_the_same_name(store):
    a = tracking.start_run("exp-reopen", "run-a", {"git_sha": "abc"})
    b = tracking.start_run("exp-reopen", "run-b", {})
    assert a != b
    tracking.RunLogger(a).finish("FAILED")
    assert tracking.start_run("exp-reopen", "run-a", {"attempt": 2}) == a
    run = tracking.client().get_run(a)
    assert run.info.status == "RUNNING" and run.data.tags["git_sha"] == "abc" and run.data.tags["attempt"] == "2"
    assert tracking.find_run("exp-reopen", "nope") is None and tracking.find_run("missing-exp", "run-a") is None


def test_a_failed_reopening_never_fails_a_run_that_registered_a_version(store):
    """The FINISHED run behind a registered version, reopened by a later attempt (a resume from an older
    checkpoint) that fails or is interrupted, stays FINISHED; a run that registered nothing is marked FAILED."""
    done = tracking.start_run("exp-keep", "done", {})
    tracking.RunLogger(done).set_tags({"registered_model": "models:/m/1"})
    tracking.RunLogger(done).finish("FINISHED")
    other = tracking.start_run("exp-keep", "other", {})
    c = tracking.client()
    for attempt, end in (
        ("a1", lambda run_id: tracking.RunLogger(run_id).finish("FAILED")),
        ("a2", lambda run_id: tracking.end_attempt_runs("exp-keep", "a2", "KILLED")),
    ):
        assert tracking.start_run("exp-keep", "done", {"attempt": attempt}) == done
        assert c.get_run(done).info.status == "RUNNING"
        end(done)
        assert c.get_run(done).info.status == "FINISHED", attempt
    tracking.start_run("exp-keep", "other", {"attempt": "a3"})
    assert tracking.end_attempt_runs("exp-keep", "a3", "FAILED") == [other]
    assert c.get_run(other).info.status == "FAILED"


def test_run_logger_never_logs_a_step_twice(store):
    run_id = tracking.start_run("exp", "r", {})
    first = tracking.RunLogger(run_id)
    first.log_params({"train.lr": 0.001, "data.inputs": ["/a", "/b"]})
    for step in range(1, 6):
        first.log_metrics({"loss": 10.0 - step, "lr": 0.1 * step}, step)
    # a restarted worker resumes from a checkpoint at step 3 and recomputes steps 4.. in a new logger
    second = tracking.RunLogger(run_id)
    second.log_params({"train.lr": 0.001, "data.inputs": ["/a", "/b"]})  # resumed run: no error, no duplicate
    for step in range(4, 8):
        second.log_metrics({"loss": 100.0 + step, "lr": 0.1 * step}, step)
    c = tracking.client()
    hist = [(m.step, m.value) for m in c.get_metric_history(run_id, "loss")]
    assert sorted(hist) == [(1, 9.0), (2, 8.0), (3, 7.0), (4, 6.0), (5, 5.0), (6, 106.0), (7, 107.0)]
    assert c.get_run(run_id).data.params == {"train.lr": "0.001", "data.inputs": "['/a', '/b']"}


def test_system_metrics_are_sampled_with_psutil(store):
    import psutil

    run_id = tracking.start_run("exp", "sys", {})
    log = tracking.RunLogger(run_id)
    log.log_system_metrics()
    m = tracking.client().get_run(run_id).data.metrics
    assert 0 <= m["system/cpu_utilization_percentage"] <= 100 * psutil.cpu_count()
    total_mb = psutil.virtual_memory().total / 2**20
    assert 0 < m["system/system_memory_usage_megabytes"] < total_mb
    assert m["system/process_rss_megabytes"] > 10


def test_register_download_and_version_info(store, minilm_dir):
    import shutil

    import transformers

    run_id = tracking.start_run("exp", "reg", {})
    export = store / "export"
    shutil.copytree(minilm_dir, export)
    tags = {
        "data_manifest_sha256": "d" * 64,
        "vocab_sha256": "v" * 64,
        "config_hash": "c" * 64,
        "git_sha": "g",
        "run_id": run_id,
    }
    v1 = tracking.register_hf_model(str(export), "bert-test", "latest-pretrain", tags, run_id)
    v2 = tracking.register_hf_model(str(export), "bert-test", "latest-pretrain", {**tags, "git_sha": "h"}, run_id)
    assert (v1, v2) == ("1", "2")
    info = tracking.model_version_info("models:/bert-test@latest-pretrain")
    assert info["version"] == "2" and info["run_id"] == run_id and info["tags"] == {**tags, "git_sha": "h"}
    assert tracking.model_version_info("models:/bert-test/1")["tags"]["git_sha"] == "g"
    local = tracking.download_model("models:/bert-test@latest-pretrain", str(store / "dl"))
    assert json.loads((export / "config.json").read_text()) == json.loads(open(f"{local}/config.json").read())
    model = transformers.AutoModel.from_pretrained(local)
    assert model.config.hidden_size == 384
    with pytest.raises(tracking.TrackingError, match="models:/bert-test@nope"):
        tracking.model_version_info("models:/bert-test@nope")
    with pytest.raises(tracking.TrackingError, match="not a models:/"):
        tracking.model_version_info("runs:/x/model")


def test_progress_prints_at_a_steady_cadence_and_always_the_last_step(monkeypatch):
    """Every `every_steps` steps but not more often than every `every_s` seconds, and the final step."""
    import io

    from pipeline import tracking

    clock = [100.0]
    monkeypatch.setattr(tracking.runs.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    p = tracking.Progress(total=30, every_steps=5, every_s=10.0, out=out)
    printed = []
    for step in range(1, 31):
        clock[0] += 3.0  # 3 s per step: every 5 steps is 15 s, later than 10 s
        line = p.update(
            step, {"train/loss": 7.0 - step / 10, "train/mlm_accuracy": 0.01 * step, "train/tokens_per_s": 1234.5}
        )
        if line:
            printed.append(step)
    assert printed == [5, 10, 15, 20, 25, 30]
    lines = out.getvalue().splitlines()
    assert lines[-1] == "step 30/30  loss 4.0000  mlm_acc 0.3000  1,234 tok/s"
    assert lines[0].startswith("step 5/30  loss 6.5000  mlm_acc 0.0500  1,234 tok/s  eta 1m15s")


def test_prepared_data_is_logged_as_the_runs_datasets(tmp_path):
    """mlflow.log_input's datasets from a manifest: names, contexts, the digest tied to the manifest's sha256, the
    shard schema and a profile whose training and held-out examples add up (a real SQLite store)."""
    import hashlib
    import json

    from mlflow import MlflowClient

    from pipeline.data.dataset import SCHEMA, PreparedDataset
    from pipeline.tracking.lineage import log_datasets, prepared_datasets

    out = tmp_path / "tiny"
    (out / "shards").mkdir(parents=True)
    manifest = {
        "documents_written": 3,
        "examples": 10,
        "tokens": 700,
        "duplicates": {"exact": 1, "near": 2},
        "config": {"max_seq_length": 128},
        "vocab_sha256": "ab" * 32,
    }
    (out / "manifest.json").write_text(json.dumps(manifest))
    sha = hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    shards = (
        (str(out / "shards/a.parquet"), 4),
        (str(out / "shards/b.parquet"), 3),
        (str(out / "shards/c.parquet"), 3),
    )
    ds = PreparedDataset(str(out), manifest, sha, ("[PAD]",), shards)
    c = MlflowClient(sqlite_store(tmp_path / "m.db"))
    run = c.create_run(c.create_experiment("lineage"))
    log_datasets(c, run.info.run_id, prepared_datasets(ds, phase=0, num_eval_shards=1, arrow_schema=SCHEMA))
    got = {(d.dataset.name, d.tags[0].value): d.dataset for d in c.get_run(run.info.run_id).inputs.dataset_inputs}
    assert sorted(got) == [("tiny", "training"), ("tiny-heldout", "eval")]
    train, held = json.loads(got[("tiny", "training")].profile), json.loads(got[("tiny-heldout", "eval")].profile)
    assert (train["examples"], train["shards"], held["examples"], held["shards"]) == (7, 2, 3, 1)
    assert (train["duplicates_exact"], train["duplicates_near"], train["manifest_sha256"]) == (1, 2, sha)
    assert all(d.digest == sha[:36] and json.loads(d.source)["uri"] == str(out) for d in got.values())
    cols = json.loads(got[("tiny", "training")].schema)["mlflow_colspec"]
    assert [c["name"] for c in cols] == SCHEMA.names and cols[0] == {
        "type": "array",
        "items": {"type": "integer"},
        "name": "input_ids",
        "required": True,
    }


@pytest.mark.parametrize("given, client", [(None, False), ("false", True)])
def test_mlflow_telemetry_is_off_unless_the_environment_turns_it_on(given, client):
    """Its thread changes os.environ while requests reads it (a KeyError that ended a job): off by default."""
    import subprocess
    import sys

    # as a user's job runs: MLflow itself turns telemetry off under pytest (PYTEST_CURRENT_TEST) and in CI
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "PYTEST_CURRENT_TEST", "CI")
    }
    if given is not None:
        env["MLFLOW_DISABLE_TELEMETRY"] = given
    code = (
        "from pipeline.tracking import runs; from mlflow.telemetry.client import get_telemetry_client; "
        "print(get_telemetry_client() is not None)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == str(client), out.stderr[-2000:]
