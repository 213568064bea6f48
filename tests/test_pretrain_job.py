"""End-to-end pretraining on real components: a local Ray cluster with the job server, real data stages on a
subset of ../shared/corpora, real MLflow stores (a real `mlflow server` on loopback for the main job, whose UI is
read in Debian's Chromium driven by playwright; SQLite for the rest).

One prepared dataset (module fixture) is shared by every test; the first job finds it up to date. Crash/resume
tests call `pipeline.pretrain.job.run_training` on the same cluster and compare final weights bit for bit.
Training on two nodes is tests/test_two_hosts.py's (two real hosts, the same training).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import sqlite_store

pytestmark = pytest.mark.slow

BOOKS = ["08_Ruth.txt", "31_Obad.txt", "32_Jonah.txt", "34_Nahum.txt", "35_Hab.txt", "36_Zep.txt", "37_Hag.txt"]
# Small and fast: a tiny vocabulary, 4 shards (1 held out), no dropout noise in the comparison tests.
# the paper's objective (NSP pairs, 15%) rather than tiny.yaml's MLM-only 30%, so NSP is trained and logged here too
DATA_ARGS = [
    "--data.vocab_size",
    "600",
    "--data.num_shards",
    "4",
    "--data.num_actors",
    "1",
    "--data.nsp",
    "true",
    "--data.mask_rate",
    "0.15",
    "--data.max_predictions_per_seq",
    "20",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(s3_server):
    """A real local Ray cluster with the dashboard (job server), 2 CPUs, in this process; its processes pointed at
    the session's S3 server (`s3_server`: the environment they start with), as a cluster's nodes are at theirs."""
    import ray

    from conftest import dashboard_head

    if ray.is_initialized():
        ray.shutdown()
    saved = {k: os.environ.get(k) for k in s3_server.env}
    os.environ.update(s3_server.env)
    head, port = dashboard_head(num_cpus=2)
    ray.init(address=head.address, configure_logging=False, log_to_driver=False)
    yield f"http://127.0.0.1:{port}"
    ray.shutdown()
    head.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # s3fs caches instances by arguments, not by the endpoint in the env


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("pretrain")


@pytest.fixture(scope="module")
def prepared(cluster, work, shared_dir):
    """The real data stages (vocab -> shards -> validate) on a few books, run once for the module."""
    from pipeline.config import load_config, resolve_paths
    from pipeline.runner.dag import run_graph
    from pipeline.data.stages import data_stages

    inputs = [str(shared_dir / "corpora" / "books" / b) for b in BOOKS]
    args = ["--data.inputs", json.dumps(inputs), "--data.output", str(work / "data"), *DATA_ARGS]
    cfg = resolve_paths(load_config(Path(__file__).parents[1] / "configs" / "tiny.yaml", args))
    res = run_graph(data_stages(cfg.data), remote=False, log=lambda m: None)
    return {"args": args, "validate": res["validate"].result}


def job_args(prepared, work, name: str, *extra: str) -> list[str]:
    return [
        "--config",
        "configs/tiny.yaml",
        *prepared["args"],
        "--train.storage_path",
        str(work / f"runs-{name}"),
        "--train.max_steps",
        "24",
        "--train.warmup_steps",
        "4",
        "--train.eval_every_steps",
        "8",
        "--train.checkpoint_every_steps",
        "12",
        "--train.micro_batch_size",
        "16",
        "--train.global_batch_size",
        "32",
        "--tracking.system_metrics_every_s",
        "2",
        "--eval.suite",
        "null",
        *extra,
    ]


_SHA: dict[str, str] = {}


def head_sha(repo_root: Path) -> str:
    """The commit under test, read once (other commits may land while the module runs)."""
    if "sha" not in _SHA:
        _SHA["sha"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo_root, capture_output=True, text=True
        ).stdout.strip()
    return _SHA["sha"]


def submit(address: str, repo_root: Path, args: list[str], env: dict[str, str], timeout: float = 400) -> str:
    """Submit `python jobs/pretrain.py ARGS` through the job server; wait for a terminal state; return the logs."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)
    entry = " ".join([sys.executable, "jobs/pretrain.py", *[f"'{a}'" for a in args]])
    # Ray does not upload .git with the working dir, so the submitter passes the commit (as the README says).
    runtime_env = {
        "working_dir": str(repo_root),
        "excludes": ["data/", "runs/", "mlruns/", "*.db"],
        "env_vars": {"RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "GIT_SHA": head_sha(repo_root), **env},
    }
    for _ in range(60):  # the node's dashboard agent takes a few seconds to register after ray.init
        try:
            job_id = client.submit_job(entrypoint=entry, runtime_env=runtime_env)
            break
        except RuntimeError as e:
            if "No available agent" not in str(e):
                raise
            time.sleep(2)
    else:
        pytest.fail("the job server never found an agent to run the job")
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = client.get_job_status(job_id)
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            break
        time.sleep(0.5)
    else:
        client.stop_job(job_id)
    logs = client.get_job_logs(job_id)
    assert status == JobStatus.SUCCEEDED, f"job {job_id} ended {status}:\n{logs[-5000:]}"
    return logs


def check_registered(logs: str, model_name: str, prepared: dict, repo_root: Path, tmp_path: Path) -> str:
    """The job's last line, the version's lineage tags and alias, metrics at many steps, a transformers load."""
    import torch
    import transformers

    from pipeline import tracking

    last = logs.strip().splitlines()[-1]
    assert last.startswith(f"registered models:/{model_name}/"), last
    version = last.rsplit("/", 1)[1]
    info = tracking.model_version_info(f"models:/{model_name}@latest-pretrain")
    assert info["version"] == version
    tags = info["tags"]
    manifest_path = Path(prepared["validate"].output) / "manifest.json"
    assert tags["data_manifest_sha256"] == hashlib.sha256(manifest_path.read_bytes()).hexdigest()
    assert tags["vocab_sha256"] == json.loads(manifest_path.read_text())["vocab_sha256"]
    assert tags["git_sha"] == head_sha(repo_root) and len(tags["config_hash"]) == 64
    run_id = tags["run_id"]

    client = tracking.client()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["registered_model"] == f"models:/{model_name}/{version}"
    assert run.data.params["train.max_steps"] == "24" and run.data.params["model.preset"] == "tiny"
    for key in (
        "loss",
        "mlm_loss",
        "nsp_loss",
        "mlm_accuracy",
        "nsp_accuracy",
        "lr",
        "grad_norm",
        "tokens_per_s",
        "examples_per_s",
    ):
        steps = [m.step for m in client.get_metric_history(run_id, f"train/{key}")]
        assert sorted(steps) == list(range(1, 25)), key  # every step exactly once
    loss = [m.value for m in sorted(client.get_metric_history(run_id, "train/mlm_loss"), key=lambda m: m.step)]
    assert sum(loss[-4:]) / 4 < sum(loss[:4]) / 4 - 0.3, loss  # the MLM loss falls
    evals = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "eval/mlm_loss"))
    assert [s for s, _ in evals] == [8, 16, 24] and evals[-1][1] < evals[0][1]
    assert "eval/final/mlm_accuracy" in run.data.metrics and "system/cpu_utilization_percentage" in run.data.metrics
    assert not any("/" not in k for k in run.data.metrics), sorted(run.data.metrics)  # every metric in a group
    mv = client.get_model_version(model_name, version)
    assert f"{prepared['validate'].examples:,} examples" in mv.description and "jobs/pretrain.py" in mv.description
    # the run's Datasets panel: the prepared data (training) and its held-out shard (eval), tied to the manifest
    inputs = {(d.dataset.name, d.tags[0].value): d.dataset for d in run.inputs.dataset_inputs}
    data_name = Path(prepared["validate"].output).name
    assert {(data_name, "training"), (f"{data_name}-heldout", "eval")} <= set(inputs), sorted(inputs)
    assert f"the run's dataset `{data_name}`" in mv.description
    for (name, context), d in inputs.items():
        assert d.digest == tags["data_manifest_sha256"][:36] or name.endswith(("-phase1", "-phase1-heldout"))
        profile, schema = json.loads(d.profile), json.loads(d.schema)["mlflow_colspec"]
        assert [c["name"] for c in schema][:2] == ["input_ids", "token_type_ids"] and profile["examples"] > 0
        assert d.source_type == "local" and json.loads(d.source)["uri"].rstrip("/").endswith(
            name.split("-phase")[0].removesuffix("-heldout")
        )
    first = json.loads(inputs[(data_name, "training")].profile)
    assert first["manifest_sha256"] == tags["data_manifest_sha256"] and first["shards"] == 3
    assert (
        first["examples"] + json.loads(inputs[(f"{data_name}-heldout", "eval")].profile)["examples"]
        == prepared["validate"].examples
    )
    arts = {a.path for a in client.list_artifacts(run_id)} | {a.path for a in client.list_artifacts(run_id, "data")}
    assert {"config.yaml", "data/manifest.json", "data/vocab.txt", "data/tokenizer.json", "model"} <= arts

    local = tracking.download_model(f"models:/{model_name}/{version}", str(tmp_path / f"dl-{model_name}"))
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"} <= set(os.listdir(local))
    assert transformers.AutoTokenizer.from_pretrained(local).model_max_length == 512
    assert not any(f.endswith((".bin", ".pt", ".pkl")) for f in os.listdir(local))  # safetensors only
    hf = transformers.BertForPreTraining.from_pretrained(local).eval()
    ours = _ours(local)
    ids = torch.tensor([[2, 17, 45, 4, 88, 3, 61, 90, 3]])
    tt = torch.tensor([[0, 0, 0, 0, 0, 0, 1, 1, 1]])
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=tt)
        got = ours(ids, tt)
    torch.testing.assert_close(got.mlm_logits, ref.prediction_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.nsp_logits, ref.seq_relationship_logits, atol=1e-4, rtol=1e-4)
    return run_id


def _ours(local: str):
    from model import BertForPreTraining
    from model.hf import load_hf

    return load_hf(local, BertForPreTraining).eval()


# ------------------------------------------------------------------------------------------------ through Ray Jobs


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory):
    """A real `mlflow server` (SQLite store, artifacts it serves) for the module's main job."""
    from conftest import MlflowServer

    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    yield server.uri
    server.kill()


@pytest.fixture(scope="module")
def main_job(cluster, prepared, work, repo_root, tracking_server):
    """The main job through Ray Jobs into a real `mlflow server`, run once for the module: (args, store URI, logs).

    Two phases in one schedule (as base/large do): steps 1-12 on the fixture's 128-token shards, 13-24 on 64-token
    shards that the job prepares itself with phase 1's vocabulary. (A SQLite store is the second store of
    test_stage_truth_comes_from_the_current_tracking_store.)"""
    phases = json.dumps(
        [
            {"fraction": 0.5, "max_seq_length": 128, "output": prepared["validate"].output},
            {"max_seq_length": 64, "max_predictions_per_seq": 10, "output": str(work / "data-64")},
        ]
    )
    # the scorecard stage on a test-sized suite (2 trials of 4 steps; configs/tiny.yaml has configs/eval/quick.yaml)
    args = job_args(
        prepared,
        work,
        "main",
        "--train.phases",
        phases,
        "--eval.suite",
        str(repo_root / "tests" / "data" / "eval_stage.yaml"),
    )
    return args, tracking_server, submit(cluster, repo_root, args, {"MLFLOW_TRACKING_URI": tracking_server})


def test_job_end_to_end(main_job, prepared, work, repo_root, tmp_path, monkeypatch, browser_page):
    """Through Ray Jobs into a real `mlflow server`, then what a person sees of it in a real browser."""
    _, uri, logs = main_job
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert "[stage shards] up to date" in logs  # the prepared fixture's shards were reused
    run_id = check_registered(logs, "bert-pretrain", prepared, repo_root, tmp_path)
    from pipeline import tracking
    from pipeline.data.dataset import read_manifest

    phase = dict(_history(run_id, "train/phase"))
    assert {s for s, p in phase.items() if p == 0} == set(range(1, 13)) and {
        s for s, p in phase.items() if p == 1
    } == set(range(13, 25))
    short = read_manifest(str(work / "data-64"))
    assert short["config"]["max_seq_length"] == 64 and short["vocab_sha256"] == prepared["validate"].vocab_sha256
    run = tracking.client().get_run(run_id)
    assert run.data.params["train.phases"].count("max_seq_length") == 2
    assert 1 <= run.data.metrics["tokenizer/fertility"] < 3  # the tokenizer report (issue 57)
    assert run.info.artifact_uri.startswith("mlflow-artifacts:")  # served by the server
    info = tracking.model_version_info("models:/bert-pretrain@latest-pretrain")
    # the scorecard stage (issue 56): the version scored on the suite, its table printed before the last line
    card = {k: v for k, v in info["tags"].items() if k.startswith("suite.stage-test.")}
    assert set(card) == {"suite.stage-test.sha256", "suite.stage-test.score", "suite.stage-test.run_id"}, info["tags"]
    assert 0 <= float(card["suite.stage-test.score"]) <= 1
    ev = tracking.client().get_run(card["suite.stage-test.run_id"])
    assert ev.info.status == "FINISHED" and "suite/pydocs_topic/accuracy" in ev.data.metrics
    assert "[stage scorecard]" in logs and "score (stage-test)" in logs
    assert logs.strip().splitlines()[-1].startswith("registered models:/bert-pretrain/")
    # a run's checkpoint directory is an evaluation source: exported as the register stage exports the final one
    import torch
    from safetensors.torch import load_file

    from pipeline.evaluate.checkpoint import export_checkpoint, is_pretraining_checkpoint

    final = [
        c
        for c in (work / "runs-main").glob("*/checkpoint_*")
        if c.is_dir() and json.loads((c / "train_state.json").read_text())["step"] == 24
    ]
    assert len(final) == 1 and is_pretraining_checkpoint(str(final[0]))
    tags = export_checkpoint(str(final[0]), str(tmp_path / "from-checkpoint"))
    assert tags["pretrain_run_id"] == run_id and tags["source_checkpoint_step"] == "24"
    registered = tracking.download_model(f"models:/bert-pretrain/{info['version']}", str(tmp_path / "registered"))
    ours, theirs = (load_file(str(Path(d) / "model.safetensors")) for d in (tmp_path / "from-checkpoint", registered))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    for name in ("vocab.txt", "tokenizer.json"):  # the run's own tokenizer (an artifact), as the version's
        assert (tmp_path / "from-checkpoint" / name).read_bytes() == (Path(registered) / name).read_bytes(), name
    exp = tracking.client().get_experiment_by_name("bert-pretrain")
    check_in_browser(browser_page, uri, "bert-pretrain", info, exp, Path(prepared["validate"].output).name, tmp_path)


def test_stage_truth_comes_from_the_current_tracking_store(main_job, cluster, repo_root, tmp_path, monkeypatch):
    """The module's main-job command against a second, empty store (SQLite) registers there (it used to print a
    version that store did not have), from the final checkpoint already in storage, with no Ray Train run; against
    the first store (the server) again, every stage is found done by its real output and skipped (the scorecard by
    the version's suite tags)."""
    from pipeline import tracking

    args, first, first_logs = main_job
    registered = first_logs.strip().splitlines()[-1]
    for uri, expect in ((sqlite_store(tmp_path / "b.db"), "running"), (first, "up to date")):
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        # (the second store's version is not scored: its scorecard stage would only repeat the first's trials)
        logs = submit(
            cluster, repo_root, args if uri == first else [*args, "--eval.suite", "null"], {"MLFLOW_TRACKING_URI": uri}
        )
        assert f"[stage register] {expect}" in logs
        last = logs.strip().splitlines()[-1]
        assert last == (registered if uri == first else "registered models:/bert-pretrain/1"), logs[-3000:]
        info = tracking.model_version_info(f"models:/bert-pretrain/{last.rsplit('/', 1)[1]}")
        assert tracking.run_exists(info["tags"]["run_id"])  # its run is in this store
        run = tracking.client().get_run(info["tags"]["run_id"])
        assert run.info.status == "FINISHED" and run.data.tags["world_size"] == "2"
        if expect == "running":  # trained to step 24 in the first store's run: its final checkpoint, no training
            assert "[train] " in logs and " was trained to step 24 already (" in logs, logs[-3000:]
            assert "[rank 0]" not in logs and "train/loss" not in run.data.metrics
    assert "[stage train] up to date" in logs and "[stage shards] up to date" in logs
    assert "[stage scorecard] up to date" in logs and "score (stage-test)" in logs  # read back from the version


def check_in_browser(page, uri: str, model_name: str, info: dict, exp, data_name: str, shots) -> None:
    """The run's datasets and charts and the registered version as the MLflow UI shows them (screenshots under
    `shots`)."""
    assert exp.tags.get("mlflow.experimentKind") == "custom_model_development"  # opens on the training view
    run_id = info["run_id"]
    page.goto(f"{uri}/#/experiments/{exp.experiment_id}/runs/{run_id}")
    # the Datasets panel: the prepared data as "<name> (<digest>)", the manifest's sha256 cut to MLflow's 36
    # characters, with its context (the held-out shards' entry sits behind a "+1")
    page.get_by_text(f"{data_name} ({info['tags']['data_manifest_sha256'][:36]})").first.wait_for(timeout=60_000)
    assert "Training" in page.inner_text("body")
    page.screenshot(path=str(shots / "run-overview.png"))
    page.goto(f"{uri}/#/experiments/{exp.experiment_id}/runs/{run_id}/model-metrics")
    # Metric names grouped by prefix: the UI makes a section of each and sorts the sections ("eval (N)",
    # "eval/final (N)", "train (N)") and the charts in each by name, so the first chart is the eval/loss curve, not
    # a one-point eval/final/* chart.
    first = page.get_by_test_id("experiment-view-compare-runs-card").first
    first.get_by_text("(eval/loss)").wait_for(timeout=60_000)  # the chart's legend: run name (metric)
    assert first.get_by_role("heading").inner_text() == "loss"
    assert (
        page.get_by_text("eval/final", exact=True).count() >= 1 and page.get_by_text("train", exact=True).count() >= 1
    )
    page.get_by_placeholder("Search metric charts").fill("train/loss")
    page.get_by_text("(train/loss)").first.wait_for(timeout=30_000)  # the chart's legend: run name (metric)
    page.screenshot(path=str(shots / "run.png"))

    page.goto(f"{uri}/#/models/{model_name}/versions/{info['version']}")
    page.get_by_text("latest-pretrain").first.wait_for(timeout=60_000)
    text = page.inner_text("body")
    for tag in ("data_manifest_sha256", "vocab_sha256", "config_hash", "git_sha", "run_id"):
        assert tag in text, tag
    assert info["tags"]["run_id"] in text
    assert "BERT pretrained for 24 steps" in text and "jobs/pretrain.py" in text and "from_pretrained" in text
    page.screenshot(path=str(shots / "version.png"))


def test_unreachable_tracking_server_fails_before_training(repo_root, work, tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"
    storage = tmp_path / "runs"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    t = time.time()
    out = subprocess.run(
        [sys.executable, "jobs/pretrain.py", "--config", "configs/tiny.yaml", "--train.storage_path", str(storage)],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and uri in lines[0] and "unreachable" in lines[0], out.stderr
    assert "Traceback" not in out.stderr and not storage.exists() and time.time() - t < 60


def test_a_second_identical_command_is_refused_while_the_first_holds_the_run(
    cluster, prepared, work, tmp_path, repo_root, monkeypatch
):
    """The run's storage directory is locked (as the first command's driver holds it): the same command, run on
    the module's cluster, fails at once in one line naming the holder, before it opens an MLflow run or trains.
    ~30 s."""
    import ray

    from pipeline import tracking
    from pipeline.pretrain.identity import run_lock

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    storage = work / "runs-locked"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tracking.client().search_experiments()  # the store exists (the first run's), so MLflow has no schema to create
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    with run_lock(str(storage), "locked"):
        out = subprocess.run(
            [sys.executable, "jobs/pretrain.py", *job_args(prepared, work, "locked", "--train.run_name", "locked")],
            cwd=repo_root,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert out.returncode == 1, out.stderr[-3000:]
    errors = out.stderr.strip().splitlines()
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert errors[0].startswith(
        f"pretrain: error: run {storage}/locked is being trained by another job "
        f"(pid {os.getpid()} on {socket.gethostname()}); wait for it to finish"
    ), errors
    assert "[stage shards] up to date" in out.stdout and "[stage train]" not in out.stdout
    assert not list(storage.glob("locked/checkpoint_*"))
    assert tracking.find_run("bert-pretrain", "locked") is None  # no MLflow run opened


# ------------------------------------------------------------------------------------------------ fault tolerance


def _cfg(prepared, work, name: str, *extra: str):
    from pipeline.config import load_config, resolve_paths

    args = [
        *prepared["args"],
        "--train.storage_path",
        str(work / "ft-runs"),
        "--train.run_name",
        name,
        *FT_ARGS,
        *extra,
    ]
    return resolve_paths(load_config(Path(__file__).parents[1] / "configs" / "tiny.yaml", args))


# No dropout: each rank draws its own dropout masks, the one thing a change of the number of workers changes, so
# one baseline without it serves the exact-resume runs and the run resumed on fewer workers alike. (Dropout's
# per-rank generators restored on a Ray Train restart, bit for bit: test_finetune_job.py's interrupted run, through
# the same resume code; a checkpoint's generators round-tripped: test_core.py.)
NO_DROPOUT = ("--model.overrides.hidden_dropout_prob", "0.0", "--model.overrides.attention_probs_dropout_prob", "0.0")

# The fault-tolerance runs' training (tests/test_two_hosts.py repeats the baseline's on two hosts).
FT_ARGS = [
    "--train.max_steps",
    "8",
    "--train.warmup_steps",
    "2",
    "--train.micro_batch_size",
    "8",
    "--train.global_batch_size",
    "32",
    "--train.checkpoint_every_steps",
    "4",
    "--train.eval_every_steps",
    "4",
    "--train.shuffle_buffer_rows",
    "24",
    "--tracking.system_metrics_every_s",
    "0",
    "--eval.suite",
    "null",
    *NO_DROPOUT,
]


def weights_digest(checkpoint: str) -> str:
    """sha256 of a checkpoint's weights (sorted names and bytes); a URI checkpoint is copied and the copy removed."""
    from safetensors.torch import load_file

    from pipeline.storage.io import local_checkpoint_dir

    local = local_checkpoint_dir(checkpoint)
    sd = load_file(os.path.join(local, "model.safetensors"))
    if local != checkpoint:  # a copy of a URI checkpoint: nothing left behind in /tmp
        shutil.rmtree(local)
    return hashlib.sha256(b"".join(k.encode() + sd[k].numpy().tobytes() for k in sorted(sd))).hexdigest()


def fail_once_at(step: int, marker: Path):
    """A test-only step hook: rank 0 SIGKILLs itself after `step`, once per run (the restarted attempt goes on).
    Defined as a closure so that Ray pickles it by value into the workers."""

    def hook(s: int, rank: int) -> None:
        import os
        import signal

        if s == step and rank == 0 and not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            print(f"[rank 0] fault injection: SIGKILL at step {s}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def _train(prepared, work, name: str, *extra: str, fail_at: int | None = None, data=None) -> tuple[str, str]:
    """Run pipeline.pretrain.job.run_training under MLflow run `name`; returns (sha256 of the final weights, run id)."""
    from pipeline import tracking
    from pipeline.pretrain.job import run_training

    cfg = _cfg(prepared, work, name, *extra)
    run_id = tracking.start_run("ft", name, {})
    hook = fail_once_at(fail_at, work / "faults" / name) if fail_at else None
    res = run_training(cfg, [data or prepared["validate"]], run_id, name, tracking.tracking_uri(), on_step=hook)
    return weights_digest(res.checkpoint), run_id


@pytest.fixture(scope="module")
def ft_store(work):
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = sqlite_store(work / "ft.db")
    yield
    if old is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = old


@pytest.fixture(scope="module")
def baseline(cluster, prepared, work, ft_store, one_host_reference, s3_server):
    """An uninterrupted 2-worker run: 8 steps x 2 accumulation micro-steps, several epochs of the subset, its
    checkpoints on S3 (the session's moto server), uploaded in the background (`checkpoint_upload` auto). The
    other fault-tolerance runs here (but the S3 test's re-run of a copy) keep theirs on local disk or under a
    `file://` URI and must end with these weights. Its shards, weights and per-step losses are kept for
    tests/test_two_hosts.py (the same data and training on two hosts). (digest, MLflow run id, storage path, the
    checkpoint-upload-* directories it left in the temporary directory)."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    storage = f"s3://{s3_server.bucket('baseline')}/runs"
    before = set(Path(tempfile.gettempdir()).glob("checkpoint-upload-*"))
    digest, run_id = _train(prepared, work, "baseline", "--train.storage_path", storage)
    left = set(Path(tempfile.gettempdir()).glob("checkpoint-upload-*")) - before
    one_host_reference.update(
        digest=digest, shards=prepared["validate"].manifest["shards"], losses=_history(run_id, "train/loss")
    )
    return digest, run_id, storage, left


def copy_run(src: str, dst: str) -> None:
    """Run directory `src` (a URI) copied whole to `dst` (a local path or a URI), with pyarrow's `copy_files` as
    `pipeline.storage.io.local_checkpoint_dir` copies a checkpoint."""
    import pyarrow.fs as pafs

    sfs, s = pafs.FileSystem.from_uri(src)
    dfs, d = pafs.FileSystem.from_uri(dst if "://" in dst else Path(dst).as_uri())
    pafs.copy_files(s, d, source_filesystem=sfs, destination_filesystem=dfs)


def _history(run_id: str, key: str) -> list[tuple[int, float]]:
    from pipeline import tracking

    return sorted((m.step, m.value) for m in tracking.client().get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def interrupted(baseline, prepared, work):
    """A run whose rank 0 is SIGKILLed after step 6 with no retries, so it fails with its step-4 checkpoint
    written; and copies of its directory made before anything resumes it. The "rerun", "vocabswap" and
    "nosnapshot" tests start from these: one interrupted training run for all three."""
    with pytest.raises(Exception):
        _train(prepared, work, "rerun", "--train.max_failures", "0", fail_at=6)
    runs = work / "ft-runs"
    shutil.copytree(runs / "rerun", runs / "vocabswap")
    shutil.copytree(runs / "rerun", runs / "nosnapshot")


def test_rerunning_an_interrupted_run_resumes_it(baseline, interrupted, prepared, work):
    """Without retries the run failed at step 6; the same command again resumes from its step-4 checkpoint."""
    digest, run_id = _train(prepared, work, "rerun", "--train.max_failures", "0", fail_at=6)
    assert digest == baseline[0]
    assert _history(run_id, "train/loss") == _history(baseline[1], "train/loss")


def test_a_checkpoint_ray_train_has_no_record_of_is_resumed_from(baseline, interrupted, prepared, work):
    """The interrupted run as a job stopped between writing its step-4 checkpoint and Ray Train's record of it (its
    run snapshot deleted: a Ctrl-C a moment after a checkpoint, found by bench/gpu/gpu_e2e.sh's dry run): the same
    command resumes from that checkpoint (Ray Train alone would hand the workers none, and the run would start over
    without a word, its losses the same, bit for bit, so only the steps logged tell), to the baseline's weights."""
    run = work / "ft-runs" / "nosnapshot"
    (run / "checkpoint_manager_snapshot.json").unlink(missing_ok=True)  # (a killed run may have left none)
    digest, run_id = _train(prepared, work, "nosnapshot", "--train.max_failures", "0")
    assert digest == baseline[0]
    assert _history(run_id, "train/loss") == _history(baseline[1], "train/loss")[4:]  # steps 5-8


def test_checkpoints_uploaded_in_the_background_to_s3_resume_exactly(baseline, prepared, work, capsys):
    """`train.storage_path` on S3 (the baseline's: the moto server): checkpoints uploaded in the background
    (`checkpoint_upload` auto) are both on S3 with the hashes they recorded and no local copy is left; the local
    runs of this module end with the same weights. A copy of the run on S3 with its step-8 weights truncated is
    re-run: it names the damaged checkpoint and resumes exactly from the step-4 checkpoint, which was written (from
    its snapshot) and uploaded while steps 5-8 trained."""
    import fsspec

    from pipeline.cluster import checkpoints
    from pipeline.pretrain.identity import newest_intact

    _, baseline_run, storage, left = baseline
    assert left == set()  # each upload's local copy deleted once uploaded
    at = {state["step"]: uri for uri, state, _ in checkpoints(storage, "baseline")}
    assert sorted(at) == [4, 8]
    (newest, state), bad = newest_intact(storage, "baseline")
    assert state["step"] == 8 and bad == [] and newest == at[8]
    copy_run(f"{storage}/baseline", f"{storage}/s3-async")
    at = {state["step"]: uri for uri, state, _ in checkpoints(storage, "s3-async")}
    fs = fsspec.filesystem("s3")
    weights = at[8].split("://", 1)[1] + "/model.safetensors"
    fs.pipe(weights, fs.cat(weights)[:1000])
    capsys.readouterr()
    digest, run_id = _train(prepared, work, "s3-async", "--train.storage_path", storage)
    # the re-run names the damaged checkpoint and the hash it recorded, and falls back to the previous one
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "damaged" in ln]
    recorded = state["files"]["model.safetensors"]
    assert len(lines) == 1 and lines[0].startswith(
        f"[train] damaged checkpoint {at[8]} (model.safetensors has sha256 "
    ), lines
    assert lines[0].endswith(f", not the {recorded[:12]} recorded when it was written): resuming from step 4 ({at[4]})")
    assert at[4].startswith(f"{storage}/s3-async/checkpoint_")
    assert digest == baseline[0]
    # steps 5-8 logged once each, with the uninterrupted run's losses
    assert _history(run_id, "train/loss") == _history(baseline_run, "train/loss")[4:]


def test_every_checkpoint_damaged_is_one_line_and_the_registered_run_stays_finished(baseline, prepared, work):
    """A copy of the uninterrupted run, registered, then every checkpoint of it damaged: re-running it fails in
    one line that says how to start over, and the run that registered a version stays FINISHED. (A damaged newest
    checkpoint alone is skipped for the previous one: test_checkpoints_uploaded_in_the_background_to_s3_resume_
    exactly.) No training."""
    from pipeline import tracking
    from pipeline.core.checkpoint import CheckpointCorrupt
    from pipeline.pretrain.identity import newest_intact
    from pipeline.pretrain.job import TrainResult, register_stage, train_stage

    runs = work / "ft-runs"
    copy_run(f"{baseline[2]}/baseline", str(runs / "damaged"))
    run_id = baseline[1]
    cfg = _cfg(prepared, work, "damaged", "--tracking.experiment", "ft", "--tracking.model_name", "bert-damaged")
    data, uri = prepared["validate"], tracking.tracking_uri()
    final, _ = newest_intact(cfg.train.storage_path, "damaged")
    assert final[1]["step"] == 8
    reg = register_stage(cfg, TrainResult(final[0], run_id, "damaged", 8), data, "0" * 40, uri, {}, "pytest")
    for ckpt in (runs / "damaged").glob("checkpoint_*/"):
        (ckpt / "optimizer.pt").write_bytes(b"")
    with pytest.raises(CheckpointCorrupt, match=rf"^run {runs / 'damaged'} has no intact checkpoint: .*to start over"):
        train_stage(cfg, [data], "0" * 40, uri, "after-damage")
    tracking.end_attempt_runs("ft", "after-damage", "FAILED")  # what the job's abort does
    assert tracking.client().get_run(run_id).info.status == "FINISHED"
    assert tracking.find_version(reg["name"], run_id) == reg["version"] == "1"


def test_training_outlives_the_tracking_server(baseline, prepared, work, mlflow_server_ctl, monkeypatch):
    """The tracking server is SIGKILLed after step 2 and rank 0 after step 6: Ray Train restarts the group from the
    step-4 checkpoint, mid epoch, and training finishes with the uninterrupted run's weights, bit for bit; evaluate
    waits `tracking.server_wait_s`, then fails in one line; with the server back, the same stages complete, and
    train/loss has the uninterrupted run's value at each step, exactly once. About 35 s beyond the server's start.
    (This run is also the killed-worker test: a worker lost mid-run is recovered by Ray Train exactly.)"""
    from pipeline import tracking
    from pipeline.pretrain.job import evaluate_stage, register_stage, run_training

    expected = {k: _history(baseline[1], k) for k in ("train/loss", "eval/mlm_loss")}  # from the SQLite store
    server = mlflow_server_ctl
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    cfg = _cfg(prepared, work, "outage", "--train.max_failures", "1", "--tracking.server_wait_s", "2")
    crash = fail_once_at(6, work / "faults" / "outage")
    pid = server.proc.pid

    def hook(s: int, rank: int) -> None:
        import os
        import signal

        if s == 2 and rank == 0:
            os.killpg(pid, signal.SIGKILL)  # the whole server, as an outage would take it
        crash(s, rank)

    run_id = tracking.start_run("outage", "outage", {})
    trained = run_training(cfg, [prepared["validate"]], run_id, "outage", server.uri, on_step=hook)
    assert trained.step == 8 and (work / "faults" / "outage").exists()  # it finished, through a worker restart
    assert weights_digest(trained.checkpoint) == baseline[0]  # resumed mid epoch from step 4, bit for bit
    with pytest.raises(tracking.TrackingError) as e:
        evaluate_stage(cfg, trained, prepared["validate"], server.uri)
    assert "\n" not in str(e.value) and "unreachable since" in str(e.value) and "re-run" in str(e.value)

    server.kill()  # reap the process the hook killed
    server.start()  # the same port and store
    final = evaluate_stage(cfg, trained, prepared["validate"], server.uri)  # the re-run's stages
    registered = register_stage(cfg, trained, prepared["validate"], "sha", server.uri, final, "test", None)
    assert registered["version"] == "1"
    assert _history(run_id, "train/loss") == expected["train/loss"]  # steps 1..8, each once, the same values
    assert _history(run_id, "eval/mlm_loss") == expected["eval/mlm_loss"]
    assert tracking.client().get_run(run_id).info.status == "FINISHED"


def test_resuming_with_another_vocabulary_is_refused(interrupted, prepared, work, minilm_dir):
    """A run killed after a checkpoint (the `interrupted` copy), then the data directory is rebuilt with another
    vocabulary (a trained one can come out different): resuming is refused in one line that names the vocabulary,
    before any worker starts."""
    from pipeline.config import DataConfig
    from pipeline.core.checkpoint import CheckpointMismatch
    from pipeline.runner.dag import run_graph
    from pipeline.data.stages import data_stages

    old = prepared["validate"]
    cfg = DataConfig(
        **{**old.manifest["config"], "output": str(work / "data-vocabswap"), "vocab": str(minilm_dir / "vocab.txt")}
    )
    rebuilt = run_graph(data_stages(cfg), remote=False, log=lambda m: None)["validate"].result
    assert rebuilt.vocab_sha256 != old.vocab_sha256
    with pytest.raises(
        CheckpointMismatch,
        match=rf"trained with vocabulary sha256 {old.vocab_sha256[:12]}.*{rebuilt.vocab_sha256[:12]}",
    ):
        _train(prepared, work, "vocabswap", data=rebuilt)


def test_a_run_resumes_on_fewer_workers_with_the_same_losses(baseline, prepared, work, capsys):
    """Through Ray Train, checkpoints under a `file://` URI: a local copy of the 2-worker baseline whose step-8
    checkpoint is damaged, re-run on 1 worker: it resumes from the step-4 checkpoint the 2 workers wrote and logs
    steps 5-8 with the 2-worker run's losses within 1e-3 relative (the fault-tolerance runs have no dropout, whose
    draws are each rank's own, the one thing a resize changes; the same on 1, 2 and 3 workers in this process:
    tests/test_elastic.py). One Ray Train run."""
    from pipeline import tracking

    runs = work / "uri-runs"
    copy_run(f"{baseline[2]}/baseline", str(runs / "one-worker"))
    newest = max(
        (d for d in (runs / "one-worker").glob("checkpoint_*") if d.is_dir()),
        key=lambda d: json.loads((d / "train_state.json").read_text())["step"],
    )
    (newest / "model.safetensors").write_bytes(b"")
    capsys.readouterr()
    _, one = _train(prepared, work, "one-worker", "--train.storage_path", runs.as_uri(), "--train.num_workers", "1")
    assert ": resuming from step 4 (" in capsys.readouterr().out
    assert tracking.client().get_run(one).data.tags["world_size"] == "1"
    both, resumed = _history(baseline[1], "train/loss"), _history(one, "train/loss")
    assert [s for s, _ in both] == list(range(1, 9)) and [s for s, _ in resumed] == [5, 6, 7, 8]
    for (step, want), (_, got) in zip(both[4:], resumed):
        assert got == pytest.approx(want, rel=1e-3), step
    print(
        f"largest relative loss difference, 2 workers vs resumed on 1: "
        f"{max(abs(got / want - 1) for (_, want), (_, got) in zip(both[4:], resumed)):.1e}"
    )


# ------------------------------------------------------------------------------------------------ model.init


def test_continued_run_from_a_directory_and_a_registered_version(baseline, prepared, work, tmp_path):
    """A tiny checkpoint on the prepared data's own vocabulary: continued from its directory (lineage tags on the
    version), resolved again as a models:/ version (same weights sha256), and resuming the run from other
    weights is refused in one line before any worker starts."""
    import torch

    from model import BertConfig, BertForPreTraining
    from model.hf import save_hf
    from pipeline import tracking
    from pipeline.core.checkpoint import CheckpointMismatch
    from pipeline.pretrain.init import resolve_init
    from pipeline.pretrain.job import register_stage, run_training

    data = prepared["validate"]
    dirs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=data.vocab_size))
        dirs.append(save_hf(model, tmp_path / f"ckpt{seed}", tokenizer=data.output))
    cfg, init = resolve_init(_cfg(prepared, work, "continued", "--model.init", str(dirs[0])))
    assert init.heads == "mlm+nsp" and cfg.data.vocab.startswith(str(dirs[0]))
    run_id = tracking.start_run("ft", "continued", init.tags)
    res = run_training(cfg, [data], run_id, "continued", tracking.tracking_uri(), init=init)
    reg = register_stage(cfg, res, data, "0" * 40, tracking.tracking_uri(), {}, "pytest", init)
    mv = tracking.model_version_info(reg["uri"])
    assert mv["tags"]["init_model"] == str(dirs[0]) and mv["tags"]["init_model_sha256"] == init.weights_sha256
    assert f"Continued from {dirs[0]}" in tracking.client().get_model_version(mv["name"], mv["version"]).description

    _, via_registry = resolve_init(_cfg(prepared, work, "continued", "--model.init", reg["uri"]))
    assert via_registry.source_tags["source_model"] == reg["uri"] and via_registry.heads == "mlm+nsp"

    _, other = resolve_init(_cfg(prepared, work, "continued", "--model.init", str(dirs[1])))
    with pytest.raises(
        CheckpointMismatch, match=rf"started from {dirs[0]} \(weights sha256 {init.weights_sha256[:12]}\)"
    ):
        run_training(cfg, [data], run_id, "continued", tracking.tracking_uri(), init=other)
