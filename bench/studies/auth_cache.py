# Finished study, ran at 7fd8a90 (2026-11-28): MLflow's credential cache: 0.06 of the server's CPU a request
"""What MLflow's basic-auth credential cache saves the tracking server: the server's CPU-seconds for the same
authenticated requests with the cache off (MLflow's default, `auth_cache_ttl_seconds = 0`: werkzeug's scrypt on
every request) and on (`60`, as deploy/mlflow_head.sh configures the cluster's head), in one run.

    python bench/studies/auth_cache.py --requests 100 --rounds 2

Each round starts `mlflow server --app-name basic-auth` (one worker, SQLite stores for runs and users, GenAI jobs
off, as deploy/mlflow_head.sh starts it but without PostgreSQL, which the password check does not touch) once per
setting, the settings alternating from round to round, and sends `--requests` requests as a job's rank 0 does:
`log_batch` of a few metrics to one run, with the admin's credentials. Measured: the server's process tree's CPU
time (psutil) and wall time over the requests. Everything is written under one temporary directory, removed at
the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import print_table, tree_cpu  # noqa: E402

from pipeline.cluster.connect import free_port  # noqa: E402

PASSWORD = "bench-admin-password-1"


def measure(ttl: int, requests: int, work: Path) -> tuple[float, float]:
    """(server CPU-s, wall s) for `requests` authenticated log_batch calls with `auth_cache_ttl_seconds = ttl`."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    d = Path(tempfile.mkdtemp(dir=work))
    ini = d / "basic_auth.ini"
    ini.write_text(
        f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{d / 'auth.db'}\n"
        f"admin_username = admin\nadmin_password = {PASSWORD}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        f"auth_cache_ttl_seconds = {ttl}\n"
    )
    port = free_port()
    env = {
        **os.environ,
        "MLFLOW_AUTH_CONFIG_PATH": str(ini),
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "bench",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--app-name",
            "basic-auth",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{d / 'runs.db'}",
            "--artifacts-destination",
            str(d / "artifacts"),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(d / "server.log", "w"),
        env=env,
        cwd=d,
        start_new_session=True,
    )
    try:
        os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = "admin", PASSWORD
        client = MlflowClient(f"http://127.0.0.1:{port}")
        deadline = time.time() + 240
        while True:
            try:
                run_id = client.create_run(client.create_experiment(f"bench-{ttl}")).info.run_id
                break
            except Exception:
                if proc.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"the server did not start:\n{(d / 'server.log').read_text()[-3000:]}")
                time.sleep(1)
        time.sleep(1)  # the server settles (its start-up's CPU is not counted)
        cpu0, t0 = tree_cpu(proc.pid), time.perf_counter()
        for step in range(requests):
            now = int(time.time() * 1000)
            client.log_batch(run_id, metrics=[Metric(k, float(step), now, step) for k in ("train/loss", "train/lr")])
        wall = time.perf_counter() - t0
        return tree_cpu(proc.pid) - cpu0, wall
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="auth-cache-"))
    res: dict[int, list[tuple[float, float]]] = {0: [], 60: []}
    try:
        for r in range(args.rounds):
            for ttl in (0, 60) if r % 2 == 0 else (60, 0):
                cpu, wall = measure(ttl, args.requests, work)
                res[ttl].append((cpu, wall))
                print(
                    f"round {r + 1} auth_cache_ttl_seconds {ttl:>2}: server {cpu:.1f} CPU-s, {wall:.1f} s for "
                    f"{args.requests} requests",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ref = statistics.median(c for c, _ in res[0])
    rows = []
    for ttl, name in ((0, "off (MLflow's default)"), (60, "60 s (deploy/mlflow_head.sh)")):
        cpu, wall = statistics.median(c for c, _ in res[ttl]), statistics.median(w for _, w in res[ttl])
        rows.append(
            (name, f"{1000 * cpu / args.requests:.0f}", f"{1000 * wall / args.requests:.0f}", f"{cpu / ref:.2f}")
        )
    print()
    print_table(("credential cache", "server CPU ms a request", "wall ms a request", "CPU ÷ off"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
