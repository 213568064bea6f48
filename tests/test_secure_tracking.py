"""The cluster's tracking server, for real: a private PostgreSQL cluster (run by an unprivileged user, loopback port
and a private socket directory) and `mlflow server --app-name basic-auth` on top of it, both set up by the very
commands cluster.yaml runs on the head (rendered: repository path, secret file, `sudo -u postgres` dropped).

Then: an unauthenticated REST call is refused (401); a job with a wrong password fails in one line before Ray
starts; the main job registers a version with the jobs' credentials, and fine-tuning from `@latest-pretrain` on
that server with a `--tune.lr` sweep registers its best trial there, the jobs joining one local Ray cluster
started with the jobs' credentials in its environment, as cluster.yaml starts Ray. The passwords must not appear
in any param, tag or job output.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

BOOKS = ["08_Ruth.txt", "32_Jonah.txt"]
JOBS_USER, JOBS_PASSWORD = "pipeline", "jobs-Secret-4f9c2e71"
ADMIN_PASSWORD = "admin-Secret-8d1b5a03"
START_TIMEOUT_S = 420  # import + migrations of mlflow on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pg_bin(name: str) -> str:
    """initdb/pg_ctl: on PATH, else Debian's /usr/lib/postgresql/<major>/bin (the newest)."""
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        pytest.fail(f"{name} not found: install PostgreSQL (apt-get install -y postgresql; .ci/run does)")
    return found


def _unprivileged() -> dict:
    """PostgreSQL refuses to run as root: run it as `nobody` then (a plain user runs it as itself)."""
    if os.geteuid() != 0:
        return {}
    pw = pwd.getpwnam("nobody")
    return {"user": pw.pw_uid, "group": pw.pw_gid}


@pytest.fixture(scope="module")
def postgres():
    """A private PostgreSQL cluster: 127.0.0.1:<free port> plus a socket in a private directory; removed after."""
    # A short directory of its own (Unix socket paths are limited to ~107 bytes), owned by the server's user.
    root = Path(tempfile.mkdtemp(prefix="pg-"))
    as_user = _unprivileged()
    if as_user:
        os.chown(root, as_user["user"], as_user["group"])
    data, port = root / "data", free_port()
    run = dict(capture_output=True, text=True, timeout=300, **as_user)
    out = subprocess.run([pg_bin("initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync"], **run)
    assert out.returncode == 0, out.stderr
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={root} -c fsync=off"
    out = subprocess.run(
        [pg_bin("pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w", "-t", "240", "-o", opts, "start"], **run
    )
    assert out.returncode == 0, out.stdout + out.stderr + (root / "log").read_text()
    try:
        yield {"PGHOST": str(root), "PGPORT": str(port)}
    finally:
        subprocess.run([pg_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], **run)
        shutil.rmtree(root, ignore_errors=True)


def rendered_head_commands(repo_root: Path, secret_file: Path) -> list[str]:
    """cluster.yaml's MLflow/PostgreSQL commands for the head, rendered to run here: the repository where
    `~/bert-pipeline` is, the test's secret file, and no `sudo -u postgres` (the test's PGUSER is the superuser).
    `install` (apt-get, systemctl) is what .ci/run does instead."""
    cluster = yaml.safe_load((repo_root / "cluster.yaml").read_text())
    cmds = [
        c
        for c in cluster["head_setup_commands"] + cluster["head_start_ray_commands"]
        if "deploy/mlflow_head.sh" in c and "mlflow_head.sh install" not in c
    ]
    assert [("init-db" in c, " start" in c) for c in cmds] == [(True, False), (False, True)], cmds
    return [
        c.replace("~/bert-pipeline", str(repo_root))
        .replace("~/.bert-pipeline/mlflow.env", str(secret_file))
        .replace("sudo -u postgres ", "")
        for c in cmds
    ]


@pytest.fixture(scope="module")
def tracking_server(postgres, repo_root, tmp_path_factory):
    """`mlflow server --app-name basic-auth` on PostgreSQL, started by cluster.yaml's own commands; stopped after."""
    work = tmp_path_factory.mktemp("server")
    secret = work / "mlflow.env"
    secret.write_text(f"MLFLOW_TRACKING_USERNAME={JOBS_USER}\nMLFLOW_TRACKING_PASSWORD={JOBS_PASSWORD}\n")
    # The admin's password as a head keeps it: in the server's private directory (mode 0600), not in the
    # environment of the commands (cluster.yaml exports only the jobs' user), so the server gets it only if the
    # script hands it over itself.
    (work / "state").mkdir(mode=0o700)
    (work / "state" / "admin-password").write_text(ADMIN_PASSWORD)
    (work / "state" / "admin-password").chmod(0o600)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PG"))}
    env.update(
        postgres,
        PGUSER="postgres",
        PYTHON=sys.executable,
        MLFLOW_HOST="127.0.0.1",
        MLFLOW_PORT=str(port),
        MLFLOW_SERVER_DIR=str(work / "state"),
        MLFLOW_SERVER_WORKERS="1",
        MLFLOW_START_TIMEOUT=str(START_TIMEOUT_S),
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
    )
    cmds = rendered_head_commands(repo_root, secret)
    # cluster.yaml sends artifacts to S3; here a local directory stands in for the bucket.
    cmds[1] = cmds[1].replace("s3://my-bert-bucket/mlflow-artifacts", str(work / "artifacts"))
    stop = f"bash {repo_root / 'deploy' / 'mlflow_head.sh'} stop"
    try:
        for cmd in cmds:  # from a directory of their own, where nothing may appear (tested)
            out = subprocess.run(
                ["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S + 60, cwd=work
            )
            assert out.returncode == 0, f"{cmd}\n{out.stdout}\n{out.stderr}"
        yield {
            "uri": f"http://127.0.0.1:{port}",
            "log": work / "state" / "server.log",
            "artifacts": work / "artifacts",
            "cwd": work,
            "pg": postgres,
        }
    finally:
        subprocess.run(["bash", "-c", stop], env=env, capture_output=True, timeout=120)
        pid_file = work / "state" / "server.pid"
        if pid_file.exists():  # stop did not finish: the server's process group goes anyway
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def _get(url: str, auth: tuple[str, str] | None = None) -> int:
    import base64

    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def job_env(uri: str, password: str = JOBS_PASSWORD) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_") and k != "RAY_ADDRESS"}
    env.update(MLFLOW_TRACKING_URI=uri, MLFLOW_TRACKING_USERNAME=JOBS_USER, MLFLOW_TRACKING_PASSWORD=password)
    return env


def test_unauthenticated_rest_request_is_refused(tracking_server):
    url = tracking_server["uri"] + "/api/2.0/mlflow/experiments/search?max_results=1"
    assert _get(url) == 401
    assert _get(url, ("pipeline", "wrong")) == 401
    assert _get(url, (JOBS_USER, JOBS_PASSWORD)) == 200
    assert _get(tracking_server["uri"] + "/health") == 200  # the liveness probe stays open, and says nothing


def test_server_state_is_private_and_secrets_are_not_on_its_command_line(tracking_server):
    state = tracking_server["log"].parent
    assert state.stat().st_mode & 0o077 == 0
    assert (state / "basic_auth.ini").stat().st_mode & 0o077 == 0
    assert "postgresql+psycopg2://" in (state / "basic_auth.ini").read_text()
    assert "\nauth_cache_ttl_seconds = 60\n" in (state / "basic_auth.ini").read_text()  # scrypt once a minute
    pid = int((state / "server.pid").read_text())
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode().replace("\0", " ")
    assert "--app-name basic-auth" in cmdline and "--host 127.0.0.1" in cmdline and "postgresql+psycopg2://" in cmdline
    assert ADMIN_PASSWORD not in cmdline and JOBS_PASSWORD not in cmdline
    # The users are in PostgreSQL's mlflow_auth, as basic_auth.ini says: not in MLflow's default auth store, a
    # ./basic_auth.db in the directory the server was started from (what a comment line inside the script's start
    # command once made of it).
    assert {p.name for p in tracking_server["cwd"].iterdir()} <= {"artifacts", "mlflow.env", "state"}
    out = subprocess.run(
        [pg_bin("psql"), "-U", "postgres", "-d", "mlflow_auth", "-AtX", "-c", "SELECT username FROM users"],
        env={**os.environ, **tracking_server["pg"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sorted(out.stdout.split()) == ["admin", JOBS_USER], out.stdout + out.stderr


@pytest.mark.parametrize("password", ["wrong-password", None])
def test_check_tracking_server_names_server_and_problem(tracking_server, monkeypatch, password):
    from pipeline.tracking.server import TrackingError, check_tracking_server

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", JOBS_USER)
    if password is None:
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    with pytest.raises(TrackingError) as e:
        check_tracking_server(tracking_server["uri"])
    msg = str(e.value)
    assert "\n" not in msg and tracking_server["uri"] in msg and "401" in msg
    assert ("MLFLOW_TRACKING_PASSWORD" in msg) and (password is None or password not in msg)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", JOBS_USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", JOBS_PASSWORD)
    check_tracking_server(tracking_server["uri"])


def test_credentials_in_the_uri_itself_are_used_and_never_shown(tracking_server, monkeypatch):
    """MLFLOW_TRACKING_URI=http://user:password@host:port (no MLFLOW_TRACKING_* variables): the probe reads the
    host right and authenticates with the URI's credentials; a wrong one is refused in a line without it."""
    from pipeline.tracking.server import TrackingError, check_tracking_server

    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    scheme, hostport = tracking_server["uri"].split("://")
    check_tracking_server(f"{scheme}://{JOBS_USER}:{JOBS_PASSWORD}@{hostport}")
    with pytest.raises(TrackingError) as e:
        check_tracking_server(f"{scheme}://{JOBS_USER}:wrong-password@{hostport}")
    msg = str(e.value)
    assert f"{scheme}://{JOBS_USER}:***@{hostport}" in msg and "401" in msg and "wrong-password" not in msg


def test_job_with_wrong_password_fails_in_one_line_before_ray(tracking_server, repo_root, tmp_path):
    storage = tmp_path / "runs"
    out = subprocess.run(
        [
            sys.executable,
            "jobs/pretrain.py",
            "--config",
            "configs/tiny.yaml",
            "--train.storage_path",
            str(storage),
            "--data.output",
            str(tmp_path / "data"),
        ],
        cwd=repo_root,
        env=job_env(tracking_server["uri"], "wrong-password"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and tracking_server["uri"] in lines[0] and "401" in lines[0], out.stderr
    assert "wrong-password" not in out.stderr + out.stdout and "Traceback" not in out.stderr
    assert not storage.exists() and not (tmp_path / "data").exists()


@pytest.fixture(scope="module")
def ray_head(tracking_server):
    """The address of a local Ray cluster (2 CPUs) that the module's jobs join (RAY_ADDRESS), started as
    cluster.yaml starts Ray on a node: with the jobs' MLflow credentials (`mlflow.env`) in its environment, which
    its workers inherit (rank 0 logs to the server). One Ray start for the module's jobs, not one each."""
    from conftest import cluster_for_jobs

    creds = {k: v for k, v in job_env(tracking_server["uri"]).items() if k.startswith("MLFLOW_TRACKING_")}
    with cluster_for_jobs(**creds) as address:
        yield address


@pytest.fixture(scope="module")
def pretrained(tracking_server, ray_head, repo_root, shared_dir, tmp_path_factory):
    """The main job, a few steps on two small books, registering into the authenticated server."""
    work = tmp_path_factory.mktemp("pretrain")
    inputs = json.dumps([str(shared_dir / "corpora" / "books" / b) for b in BOOKS])
    out = subprocess.run(
        [
            sys.executable,
            str(repo_root / "jobs" / "pretrain.py"),
            "--config",
            str(repo_root / "configs" / "tiny.yaml"),
            "--data.inputs",
            inputs,
            "--data.output",
            str(work / "data"),
            "--train.storage_path",
            str(work / "runs"),
            "--data.vocab_size",
            "600",
            "--data.num_shards",
            "4",
            "--data.num_actors",
            "1",
            "--train.max_steps",
            "4",
            "--train.micro_batch_size",
            "8",
            "--train.global_batch_size",
            "8",
            "--train.num_workers",
            "1",
            "--eval.suite",
            "null",
        ],
        cwd=work,
        env={**job_env(tracking_server["uri"]), "RAY_ADDRESS": ray_head},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return {"work": work, "stdout": out.stdout, "stderr": out.stderr, "last": out.stdout.strip().splitlines()[-1]}


def _as_jobs_user(monkeypatch, uri: str):
    from pipeline import tracking

    for k, v in job_env(uri).items():
        if k.startswith("MLFLOW_TRACKING"):
            monkeypatch.setenv(k, v)
    return tracking.client()


def test_pretraining_registers_a_version_on_the_authenticated_server(pretrained, tracking_server, monkeypatch):
    assert pretrained["last"].startswith("registered models:/bert-pretrain/"), pretrained["last"]
    c = _as_jobs_user(monkeypatch, tracking_server["uri"])
    mv = c.get_model_version_by_alias("bert-pretrain", "latest-pretrain")
    assert pretrained["last"] == f"registered models:/bert-pretrain/{mv.version}"
    run = c.get_run(mv.run_id)
    assert run.info.artifact_uri.startswith("mlflow-artifacts:")  # proxied by the server (--serve-artifacts)
    assert any(tracking_server["artifacts"].rglob("config.json"))
    # Credentials never reach MLflow params, tags or the job's output.
    values = [*run.data.params.items(), *run.data.tags.items(), *mv.tags.items()]
    for secret in (JOBS_PASSWORD, ADMIN_PASSWORD):
        assert not any(secret in f"{k}={v}" for k, v in values)
        assert secret not in pretrained["stdout"] + pretrained["stderr"]


def test_finetuning_from_latest_pretrain_with_a_learning_rate_sweep_registers_the_best_trial(
    pretrained, tracking_server, ray_head, repo_root, shared_dir, tmp_path, monkeypatch
):
    """Fine-tuning starts from `models:/bert-pretrain@latest-pretrain` on the server, with `--tune.lr 1e-4,3e-3`:
    Ray Tune runs a trial per LR (each the job's Ray Train run, rank 0 logging to the server with the cluster's
    credentials), MLflow holds one parent run and a child run per LR, and the one registered version is the best
    trial's (the higher eval accuracy of the two, ties to the lower eval loss, as the loop picks epochs); it names
    its source version and the pretraining run. (A scratch model's vocabulary from the registry:
    tests/test_finetune.py::test_resolve_registry_lineage.)"""
    task = shared_dir / "tasks" / "pydocs_topic"
    out = subprocess.run(
        [
            sys.executable,
            str(repo_root / "jobs" / "finetune.py"),
            "--model",
            "models:/bert-pretrain@latest-pretrain",
            "--task",
            "sequence-classification",
            "--train",
            str(task / "train.tsv"),
            "--eval",
            str(task / "dev.tsv"),
            "--data.max_seq_length",
            "32",
            "--data.max_train_examples",
            "64",
            "--data.max_eval_examples",
            "32",
            "--train.batch_size",
            "16",
            "--train.max_steps",
            "4",
            "--tune.lr",
            "1e-4,3e-3",
            "--train.storage_path",
            str(tmp_path / "sweep"),
            "--tracking.experiment",
            "tune-lr",
            "--tracking.model_name",
            "tune-lr",
        ],
        cwd=tmp_path,
        env={**job_env(tracking_server["uri"]), "RAY_ADDRESS": ray_head},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert JOBS_PASSWORD not in out.stdout + out.stderr
    c = _as_jobs_user(monkeypatch, tracking_server["uri"])
    source = c.get_model_version_by_alias("bert-pretrain", "latest-pretrain")
    _check_sweep(out.stdout.strip().splitlines(), c, tmp_path / "sweep", source)


def _check_sweep(lines: list[str], c, storage: Path, source_mv) -> None:
    metrics = json.loads(lines[-1])  # the stdout contract: the last line is the (best trial's) eval metrics
    assert lines[-2].startswith("registered models:/tune-lr/1 (run "), lines[-2]
    # one line per trial start and end and one naming the best; none of Tune's own tables or banners
    assert sum(line.startswith("[tune] trial ") for line in lines) == 4
    assert sum(line.startswith("[tune] best: lr ") for line in lines) == 1
    assert not any(
        s in "\n".join(lines) for s in ("Trial status", "View detailed results", "Configuration for experiment")
    )

    runs = c.search_runs([c.get_experiment_by_name("tune-lr").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(runs) == 3 and len(parents) == 1, [r.info.run_name for r in runs]
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(float(r.data.params["train.lr"]) for r in children) == [1e-4, 3e-3]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert parent.data.params["tune.lr"] == "[0.0001, 0.003]" and "train.lr" not in parent.data.params
    for r in children:  # each trial trained with the Ray Train loop, rank 0 logging into its child run
        assert [m.step for m in c.get_metric_history(r.info.run_id, "train/loss")] == [1, 2, 3, 4]
        assert (storage / r.info.run_name).is_dir()  # its checkpoints under train.storage_path
        # each trial starts from the registered pretrained version (the alias resolved to its number)
        assert r.data.tags["source_model"] == f"models:/bert-pretrain/{source_mv.version}"
    assert (storage / parent.info.run_name).is_dir()  # Tune's experiment directory too

    best = max(children, key=lambda r: (r.data.metrics["best/accuracy"], -r.data.metrics["best/loss"]))
    (mv,) = c.search_model_versions("name = 'tune-lr'")  # exactly one version: the other trial registers nothing
    assert lines[-2] == f"registered models:/tune-lr/{mv.version} (run {best.info.run_id})"
    assert mv.run_id == best.info.run_id and mv.tags["run_id"] == best.info.run_id
    assert mv.tags["tune_parent_run_id"] == parent.info.run_id and mv.tags["task"] == "sequence-classification"
    assert c.get_model_version_by_alias("tune-lr", "latest-finetune").version == mv.version
    # the registered version names its source version and the pretraining run
    assert mv.tags["source_model"] == f"models:/bert-pretrain/{source_mv.version}"
    assert mv.tags["pretrain_run_id"] == source_mv.tags["run_id"]
    assert parent.data.tags["tune_best_run_id"] == best.info.run_id
    assert (
        float(parent.data.tags["tune_best_lr"])
        == parent.data.metrics["tune/best_lr"]
        == float(best.data.params["train.lr"])
    )
    assert metrics["accuracy"] == pytest.approx(best.data.metrics["best/accuracy"])
    assert parent.data.metrics["best/accuracy"] == pytest.approx(metrics["accuracy"])
