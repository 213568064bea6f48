"""pipeline.tracking.server: the store's URI, the server probe's one-line messages, credentials kept out of them, and
the lock that lets two processes create one new SQLite store."""

from __future__ import annotations

import os
import socket

import pytest

from pipeline.tracking import server as tracking_server


@pytest.fixture()
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tracking_uri_is_absolute(cwd, monkeypatch):
    assert tracking_server.tracking_uri() == f"sqlite:///{cwd / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///sub/x.db")
    assert tracking_server.tracking_uri() == f"sqlite:///{cwd / 'sub' / 'x.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking_server.tracking_uri() == "http://127.0.0.1:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "./mlruns")
    assert tracking_server.tracking_uri() == (cwd / "mlruns").as_uri()


def test_unreachable_server_is_one_clear_line():
    uri = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(tracking_server.TrackingError) as e:
        tracking_server.check_tracking_server(uri, timeout=2)
    msg = str(e.value)
    assert "\n" not in msg and uri in msg and "unreachable" in msg
    tracking_server.check_tracking_server("sqlite:////nonexistent-dir-is-fine/mlflow.db")  # local stores always pass


_CREATE_STORE = """
import os, sys, time
from pipeline import tracking
open(sys.argv[1], "w").close()  # MLflow imported: ready
while not os.path.exists(sys.argv[2]):  # start together
    time.sleep(0.01)
print(tracking.experiment_id("race"))
"""


@pytest.mark.slow
def test_two_first_runs_create_one_new_sqlite_store(tmp_path, repo_root):
    """Two processes open the same fresh SQLite store at the same moment: without the lock beside the .db both run
    MLflow's schema migration and one dies in it (`duplicate column name`); with it both succeed. ~15 s."""
    import subprocess
    import sys
    import time

    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "PYTHONPATH": str(repo_root)}
    go, ready = tmp_path / "go", [tmp_path / f"ready{i}" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CREATE_STORE, str(r), str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in ready
    ]
    while not all(r.exists() for r in ready) and all(p.poll() is None for p in procs):
        time.sleep(0.05)
    go.touch()
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert outs[0][0].split()[-1] == outs[1][0].split()[-1]  # the same experiment, created once


def test_credentials_in_the_tracking_uri_are_redacted_and_the_host_read(monkeypatch):
    """`http://user:pw@127.0.0.1:PORT` with nothing listening: the message names the server without the password,
    and the probe went to 127.0.0.1:PORT (connection refused), not to a host misread out of `user:pw@...`."""
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    port = free_port()  # nothing listens here once closed
    with pytest.raises(tracking_server.TrackingError) as e:
        tracking_server.check_tracking_server(f"http://user:s3cret@127.0.0.1:{port}", timeout=5)
    msg = str(e.value)
    assert msg.startswith(f"MLflow tracking server http://user:***@127.0.0.1:{port} is unreachable (")
    assert "s3cret" not in msg and "refused" in msg.lower(), msg
