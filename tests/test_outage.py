"""pipeline.tracking.outbox against a real `mlflow server` that is killed and started again on the same port and store:
rank 0's logger neither fails nor blocks while it is away, and every step reaches it exactly once."""

from __future__ import annotations

import os
import socket

import pytest

from conftest import sqlite_store

from pipeline import tracking
from pipeline.tracking import outbox as outage, wait as server_wait


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _steps(run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in tracking.client().get_metric_history(run_id, key))


@pytest.mark.slow  # two server starts: 15 s idle, a minute on a loaded 2-core machine
def test_logger_outlives_a_server_outage(mlflow_server_ctl, monkeypatch, capfd, tmp_path):
    server = mlflow_server_ctl
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # each failed attempt fails at once
    run_id = tracking.start_run("outage", "r", {})
    log = tracking.RunLogger(run_id, background=True)
    log.outbox.max_in_memory = 4  # the rows of the outage go to the spill file
    for step in range(1, 4):
        log.log_metrics({"train/loss": 10.0 - step, "train/lr": step / 100}, step)
    assert log.outbox.flush(60)

    server.kill()
    for step in range(4, 10):  # the server is away: nothing raises, everything stays queued
        log.log_metrics({"train/loss": 10.0 - step, "train/lr": step / 100}, step)
    log.set_tags({"world_size": 2})
    assert not log.outbox.flush(3) and log.outbox.away_since is not None
    pending = log.pending()
    assert [r[3] for r in pending["metrics"] if r[0] == "train/loss"] == list(range(4, 10))
    assert pending["tags"] == {"world_size": "2"} and log.outbox._spill_dir is not None
    outage.write_pending(str(tmp_path), run_id, pending)  # as a checkpoint holds it
    assert outage.read_pending(str(tmp_path), run_id) == {"run_id": run_id, **pending}
    assert outage.read_pending(str(tmp_path), "another-run") is None

    server.start()
    for step in range(10, 13):
        log.log_metrics({"train/loss": 10.0 - step, "train/lr": step / 100}, step)
    assert log.close(60)
    assert _steps(run_id, "train/loss") == [(s, 10.0 - s) for s in range(1, 13)]  # each step exactly once
    assert [s for s, _ in _steps(run_id, "train/lr")] == list(range(1, 13))
    assert tracking.client().get_run(run_id).data.tags["world_size"] == "2"

    # A restarted worker (or a re-run) sends the checkpoint's pending rows again: the server has them, none doubles.
    again = tracking.RunLogger(run_id, background=True, pending=outage.read_pending(str(tmp_path), run_id))
    again.log_metrics({"train/loss": -1.0}, 13)
    again.log_metrics({"train/loss": -2.0}, 8)  # a step it got from the checkpoint: dropped
    assert again.close(60)
    assert _steps(run_id, "train/loss") == [(s, 10.0 - s) for s in range(1, 13)] + [(13, -1.0)]

    out = capfd.readouterr().out
    away = [line for line in out.splitlines() if "unreachable since" in line]
    back = [line for line in out.splitlines() if "answers again" in line]
    assert len(away) == 1 and server.uri in away[0] and "training goes on" in away[0], out
    assert len(back) == 1, out
    log.outbox._thread.join(30)
    assert not os.path.exists(log.outbox._spill_dir)  # closed: the spill file went with the rows it held

    # A stage that needs the server and sees it go away inside its block: one line, not MLflow's traceback.
    with pytest.raises(tracking.TrackingError) as e:
        with server_wait.server_needed(server.uri, 30, "register the model"):
            server.kill()
            tracking.client(server.uri).search_experiments()
    assert "\n" not in str(e.value) and "while trying to register the model" in str(e.value)


def test_a_stage_that_needs_the_server_waits_then_fails_in_one_line(capsys):
    uri = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(tracking.TrackingError) as e:
        server_wait.wait_for_server(uri, 1, "register the model")
    msg = str(e.value)
    assert "\n" not in msg and uri in msg and "unreachable since" in msg and "register the model" in msg
    assert "re-run the same command" in msg
    assert capsys.readouterr().out.count("unreachable at") == 1  # said once while waiting
    server_wait.wait_for_server("sqlite:////nonexistent/mlflow.db", 1, "x")  # a local store never waits


def test_an_unreadable_pending_file_is_skipped_not_fatal(tmp_path, capfd):
    (tmp_path / outage.PENDING_FILE).write_text('{"run_id": "r", "metrics": [["train/loss", 1.0, 1')  # cut short
    assert outage.read_pending(str(tmp_path), "r") is None
    assert "ignoring" in capfd.readouterr().out
    outage.write_pending(str(tmp_path / "none"), "r", {"metrics": [], "tags": {}})  # nothing pending: no file
    assert not (tmp_path / "none").exists()


@pytest.mark.slow  # a new SQLite store's schema and 15 batches: about 10 s on a loaded 2-core machine
def test_rows_past_the_memory_bound_go_through_the_spill_file_in_order(tmp_path, monkeypatch):
    """A local SQLite store; 3 rows in memory at most, so batches are spilled, some while in flight."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_store(tmp_path / "mlflow.db"))
    run_id = tracking.start_run("spill", "r", {})
    log = tracking.RunLogger(run_id, background=True)
    log.outbox.max_in_memory, log.outbox.batch_size = 3, 4
    for step in range(1, 31):
        log.log_metrics({"train/loss": float(step), "train/lr": step / 100}, step)
    assert log.close(120)
    assert _steps(run_id, "train/loss") == [(s, float(s)) for s in range(1, 31)]
    assert [s for s, _ in _steps(run_id, "train/lr")] == list(range(1, 31))
