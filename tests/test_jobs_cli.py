"""The command-line convention of every job, tried as a user would: bad input is exit code 1 with one line on
stderr naming the field or file, found before Ray starts (or right after connecting, for cluster resources)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from conftest import sqlite_store

JOBS = ("jobs/pretrain.py", "jobs/prepare_data.py")


def _run(repo_root, *args, env=None, timeout=180):
    env = {**os.environ, **(env or {})}
    env.pop("RAY_ADDRESS", None) if env.get("RAY_ADDRESS") is None else None
    t = time.time()
    p = subprocess.run(
        [sys.executable, *map(str, args)], cwd=repo_root, env=env, capture_output=True, text=True, timeout=timeout
    )
    return p, time.time() - t


def _one_line(p) -> str:
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and "Traceback" not in p.stderr, (p.returncode, p.stderr[-3000:])
    return lines[0]


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--train.lr", "abc"], "train.lr 'abc' is not a number"),
        (["--train.global_batch_size", "0"], "train.global_batch_size 0 < 1"),
        (["--model.preset", "huge"], "unknown preset 'huge'"),
        (["--data.max_seq_length", "1024"], "data.max_seq_length 1024 > model max_position_embeddings"),
        (
            ["--data.inputs", "no/such/books"],
            "data.inputs: {cwd}/no/such/books does not exist (relative paths resolve against the current directory",
        ),
    ],
)
def test_pretrain_bad_input_is_one_line_within_seconds(repo_root, tmp_path, args, expect):
    p, secs = _run(
        repo_root,
        "jobs/pretrain.py",
        "--config",
        "configs/tiny.yaml",
        "--train.storage_path",
        tmp_path / "runs",
        *args,
        env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"},
    )
    assert expect.format(cwd=repo_root) in _one_line(p)
    assert secs < 30 and not (tmp_path / "runs").exists()  # nothing started, nothing written


def test_prepare_data_missing_input_is_one_line(repo_root, tmp_path):
    p, _ = _run(repo_root, "jobs/prepare_data.py", "--input", "missing.txt", "--output", tmp_path / "out")
    assert f"{repo_root}/missing.txt does not exist" in _one_line(p) and not (tmp_path / "out").exists()


def test_prepare_data_checks_the_rows_against_the_presets_model(repo_root, tmp_path):
    """`--config configs/modernbert-tiny.yaml`: its rows of 1,024 fit its model (they were checked against the
    default BERT's 512 positions, and refused), so the first line is about the input; tiny's 128 x 8 do not."""
    args = ["--data.inputs", tmp_path / "none", "--data.output", tmp_path / "out"]
    p, _ = _run(repo_root, "jobs/prepare_data.py", "--config", "configs/modernbert-tiny.yaml", *args)
    assert f"data.inputs: {tmp_path}/none does not exist" in _one_line(p)
    p, _ = _run(
        repo_root, "jobs/prepare_data.py", "--config", "configs/tiny.yaml", *args, "--data.max_seq_length", 1024
    )
    assert "data.max_seq_length 1024 > model max_position_embeddings 512" in _one_line(p)


@pytest.mark.slow  # no Ray, but a whole job's imports (about 7 s): kept out of the quick loop
def test_a_dead_ray_address_is_one_line_not_a_hang(repo_root, tmp_path, shared_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    p, secs = _run(
        repo_root,
        "jobs/pretrain.py",
        "--config",
        "configs/tiny.yaml",
        "--data.inputs",
        shared_dir / "corpora/books/08_Ruth.txt",
        "--data.output",
        tmp_path / "d",
        env={"RAY_ADDRESS": f"127.0.0.1:{port}", "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"},
    )
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in _one_line(p) and secs < 60


@pytest.mark.slow  # no Ray, but a whole job's imports (about 7 s): kept out of the quick loop
def test_use_gpu_on_a_machine_without_gpu_fails_before_ray_starts(repo_root, tmp_path, shared_dir):
    """Without RAY_ADDRESS the job would start a private local cluster, whose GPUs are this machine's: checked with
    torch before Ray starts (`cluster.check_local_gpu`), never a wait for a GPU that is not there. On a cluster it
    is checked after connecting: tests/test_finetune_job.py::test_cli_use_gpu_without_gpu_is_one_line."""
    if torch_sees_a_gpu():
        pytest.skip("this machine has a GPU")
    p, secs = _run(
        repo_root,
        "jobs/pretrain.py",
        "--config",
        "configs/tiny.yaml",
        "--train.use_gpu",
        "true",
        "--data.inputs",
        shared_dir / "corpora/books/08_Ruth.txt",
        "--data.output",
        tmp_path / "d",
        "--train.storage_path",
        tmp_path / "runs",
        env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"},
    )
    line = _one_line(p)
    assert "train.use_gpu is true but the Ray cluster has no GPU (a private local cluster: torch " in line, line
    assert "ray: local" not in p.stdout and secs < 60  # Ray never started
    assert not (tmp_path / "d").exists() and not (tmp_path / "runs").exists()


MIXTURE = (
    "[{{name: books, inputs: [{shared}/corpora/books], weight: {w}}}, {{name: {name}, inputs: [{path}], weight: 1}}]"
)


@pytest.mark.slow  # no Ray, but a whole job's imports (about 7 s a job): kept out of the quick loop
@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize(
    "case,expect",
    [
        ("weights", "data.sources weights 0, 0 do not sum to a positive number"),
        ("no file", "data.sources[news]: no readable input file under {tmp}/empty (skipped 1: {tmp}/empty/notes.bin"),
        ("no path", "data.sources[news].inputs: {tmp}/nowhere does not exist"),
        ("phase", "train.phases[1].source_weights names pydocs, not a source of data.sources (books, news)"),
        ("temperature", "data.mix_temperature 0.0 must be > 0"),
    ],
)
def test_a_bad_mixture_is_one_line_naming_the_field_before_ray_starts(
    repo_root, tmp_path, shared_dir, job, case, expect
):
    """Issue 58's bad mixtures, on both jobs that take data.sources: weights not summing to a positive number, a
    source with no readable file (a folder of an unknown format only) or no such path, a phase naming a source the
    data does not have, a temperature <= 0. Each is one line naming the field, before Ray starts or anything is
    written (prepare_data has no train section: the phase case is pretrain's alone)."""
    if case == "phase" and job == "jobs/prepare_data.py":
        pytest.skip("prepare_data takes the data section only")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.bin").write_bytes(b"not a corpus")
    path = {"no file": tmp_path / "empty", "no path": tmp_path / "nowhere"}.get(case, shared_dir / "corpora/wiki")
    sources = MIXTURE.format(shared=shared_dir, w=0 if case == "weights" else 3, name="news", path=path)
    args = ["--data.sources", sources.replace("weight: 1}]", "weight: 0}]") if case == "weights" else sources]
    if case == "phase":
        args += ["--train.phases", "[{fraction: 0.8}, {source_weights: {books: 1, pydocs: 1}}]"]
    if case == "temperature":
        args += ["--data.mix_temperature", "0"]
    if job == "jobs/pretrain.py":
        args += ["--train.storage_path", tmp_path / "runs", "--eval.suite", "null"]
    p, secs = _run(
        repo_root,
        job,
        "--config",
        "configs/tiny.yaml",
        "--data.output",
        tmp_path / "d",
        *args,
        env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"},
    )
    assert expect.format(tmp=tmp_path) in _one_line(p)
    assert "ray: local" not in p.stdout and secs < 60  # Ray never started
    assert not (tmp_path / "d").exists() and not (tmp_path / "runs").exists()


def torch_sees_a_gpu() -> bool:
    import torch

    return torch.cuda.device_count() > 0


@pytest.mark.slow
def test_sigterm_ends_the_mlflow_run_as_killed(repo_root, tmp_path, shared_dir):
    """An interrupted attempt never leaves its MLflow run RUNNING: SIGTERM mid-training ends it KILLED, exit 130."""
    import signal

    from mlflow import MlflowClient

    uri = sqlite_store(tmp_path / "m.db")
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    env.pop("RAY_ADDRESS", None)
    books = [str(shared_dir / "corpora/books" / b) for b in ("08_Ruth.txt", "32_Jonah.txt")]
    proc = subprocess.Popen(
        [
            sys.executable,
            "jobs/pretrain.py",
            "--config",
            "configs/tiny.yaml",
            "--data.inputs",
            repr(books).replace("'", '"'),
            "--data.output",
            str(tmp_path / "d"),
            "--data.vocab_size",
            "600",
            "--data.num_shards",
            "3",
            "--data.num_actors",
            "1",
            "--train.storage_path",
            str(tmp_path / "runs"),
            "--train.max_steps",
            "100000",
            "--train.micro_batch_size",
            "8",
            "--train.global_batch_size",
            "16",
        ],
        cwd=repo_root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    client = MlflowClient(uri)
    deadline, run = time.time() + 300, None
    while time.time() < deadline and proc.poll() is None:
        exp = (tmp_path / "m.db").exists() and client.get_experiment_by_name("bert-pretrain")
        runs = client.search_runs([exp.experiment_id]) if exp else []
        if runs and client.get_metric_history(runs[0].info.run_id, "train/loss"):
            run = runs[0]
            break
        time.sleep(2)
    assert run is not None and run.info.status == "RUNNING", proc.communicate(timeout=60)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "pretrain: interrupted" in err.strip().splitlines()[-1]
    assert client.get_run(run.info.run_id).info.status == "KILLED"


def test_pretrain_model_init_contradicting_the_preset_is_one_line_before_work(repo_root, tmp_path, minilm_dir):
    """configs/tiny.yaml names preset tiny; MiniLM is 384 wide: refused in one line, nothing prepared or trained."""
    p, _ = _run(
        repo_root,
        "jobs/pretrain.py",
        "--config",
        "configs/tiny.yaml",
        "--model.init",
        minilm_dir,
        "--data.output",
        tmp_path / "data",
        "--train.storage_path",
        tmp_path / "runs",
        env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"},
    )
    assert f"error: model.preset tiny: hidden_size 128 != 384 in {minilm_dir}/config.json (log: " in _one_line(p)
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs").exists()


_GARBLED_IN_A_WORKER = """
import sys

import ray

from pipeline.runner.cli import run_job
from pipeline import cluster
from pipeline.runner.dag import Stage, run_graph

state, runs, attempts = sys.argv[1:4]


def loop(config):  # every worker reads the garbled train_state.json, as a resume does
    from pipeline import cluster
    from pipeline.storage.io import read_json

    cluster.quiet_ray_train()
    with open(config["attempts"], "a") as f:  # one line per worker per attempt
        f.write("attempt\\n")
    read_json(config["state"])


def train(_deps):  # the train stage: a Ray task that runs Ray Train, allowed 2 retries as tiny.yaml allows
    return cluster.fit(loop, {"state": state, "attempts": attempts}, name="garbled", storage_path=runs,
                        scale=cluster.Scale(num_workers=2, cpus_per_worker=0.5, max_failures=2))


def body():
    cluster.connect(2)  # as the jobs do: a private local Ray
    try:
        return run_graph([Stage("train", train)], remote=True, log=lambda m: None)
    finally:
        ray.shutdown()


sys.exit(run_job("pretrain", body))
"""


@pytest.mark.slow
def test_an_input_error_in_a_train_worker_is_one_line(repo_root, tmp_path):
    """A garbled train_state.json read in the Train workers (a Ray task -> Ray Train -> 2 workers) reaches the
    user as one line naming the file, not a traceback per worker (`errors.root_cause` unwraps RayTaskError and
    Ray Train's errors), after one attempt although `max_failures` allows three (`cluster.failfast.FailFast`);
    the log it names keeps the worker's traceback. About 40 s on 2 busy cores (a local Ray and
    one Train attempt)."""
    state = tmp_path / "checkpoint_000001" / "train_state.json"
    state.parent.mkdir()
    state.write_text('{"step": 4, gar')
    logs = tmp_path / "logs"
    attempts = tmp_path / "attempts"
    p, _ = _run(
        repo_root,
        "-c",
        _GARBLED_IN_A_WORKER,
        state,
        tmp_path / "runs",
        attempts,
        env={"PIPELINE_LOG_DIR": str(logs), "PYTHONPATH": str(repo_root)},
        timeout=300,
    )
    assert p.returncode == 1 and "Traceback" not in p.stderr and "Error in training function" not in p.stderr, p.stderr[
        -3000:
    ]
    # the user's own error is not retried (max_failures 2 would have made it 3 attempts): one per worker
    assert attempts.exists() and attempts.read_text().split() == ["attempt", "attempt"], p.stderr[-3000:]
    mine = [line for line in p.stderr.splitlines() if "train_state.json" in line]
    assert len(mine) == 1 and mine[0].startswith(f"pretrain: error: {state} is not valid JSON: "), p.stderr[-3000:]
    log = mine[0].rsplit("(log: ", 1)[1].rstrip(")")
    text = open(log).read()
    assert (
        log.startswith(str(logs))
        and "Traceback in the Ray Train worker" in text
        and "in loop" in text
        and "read_json" in text
    )
