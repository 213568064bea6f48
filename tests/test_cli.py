"""pipeline.runner.cli's outcome of a job (`run_job`): every failure one stderr line naming a log with the traceback,
exit 1; Ray's wrappers unwrapped to the error a user can act on; Ctrl-C exit 130; credentials never shown."""

from __future__ import annotations

import re

from pipeline.runner.cli import root_cause, run_job
from pipeline.storage.io import StorageError


def _line_and_log(capsys) -> tuple[str, str]:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    m = re.search(r"(?:log: |traceback in )(/\S+\.log)\)$", lines[0])
    assert m, lines[0]
    with open(m.group(1)) as f:
        return lines[0], f.read()


def test_a_user_error_is_one_line_and_its_traceback_is_in_the_log(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_LOG_DIR", str(tmp_path / "logs"))

    def body() -> int:
        raise StorageError("http://user:secret@host:9/x/train_state.json is not valid JSON")

    assert run_job("pretrain", body) == 1
    line, log = _line_and_log(capsys)
    assert line.startswith("pretrain: error: http://user:***@host:9/x/train_state.json is not valid JSON (log: ")
    assert line.split("(log: ")[1].startswith(str(tmp_path / "logs" / "pretrain-"))
    assert "Traceback (most recent call last)" in log and "in body" in log and "StorageError" in log
    assert "secret" not in log and "user:***@host" in log


def test_a_bug_is_one_line_naming_its_traceback(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_LOG_DIR", str(tmp_path / "logs"))
    assert run_job("prepare_data", lambda: {}["shards"]) == 1
    line, log = _line_and_log(capsys)
    assert line.startswith("prepare_data: internal error: KeyError: 'shards' (a bug; traceback in ")
    assert "KeyError: 'shards'" in log and "<lambda>" in log


def test_interrupt_is_exit_130_after_the_abort_hook(capsys):
    seen = []

    def body() -> int:
        raise KeyboardInterrupt

    assert run_job("pretrain", body, on_abort=seen.append) == 130
    assert seen == ["KILLED"] and "pretrain: interrupted" in capsys.readouterr().err


def test_root_cause_unwraps_ray_train_and_task_errors():
    """The real wrapper types, built as Ray builds them: a stage task's RayTaskError holding Ray Train's
    WorkerGroupError, whose per-worker errors hold the worker's own (rank 1's user error wins over rank 0's
    collective failure it caused); ControllerError's failure; a plain error is its own cause."""
    from ray.exceptions import RayTaskError
    from ray.train import ControllerError, WorkerGroupError

    own = StorageError("runs/x/checkpoint_1/train_state.json is not valid JSON")
    group = WorkerGroupError("2 workers failed", {0: RuntimeError("gloo: connection closed by peer"), 1: own})
    task = RayTaskError("train_stage", "Traceback ...", group).as_instanceof_cause()
    assert root_cause(task) is own
    assert root_cause(ControllerError(own)) is own
    bug = ValueError("x")
    assert root_cause(WorkerGroupError("1 failed", {0: bug})) is bug and root_cause(bug) is bug


def test_a_cluster_failure_is_named_as_rays_not_as_a_bug(capsys):
    from ray.exceptions import OutOfMemoryError, RayTaskError

    oom = OutOfMemoryError("Task was killed due to the node running low on memory.\nMemory on the node was 1.9GB")
    assert (
        run_job("pretrain", lambda: (_ for _ in ()).throw(RayTaskError("shards", "tb", oom).as_instanceof_cause())) == 1
    )
    line, _ = _line_and_log(capsys)
    assert line.startswith(
        "pretrain: error: Ray: OutOfMemoryError: Task was killed due to the node running low on memory. (log: "
    )


def test_every_error_class_of_the_pipeline_derives_from_the_one_base():
    """The command line catches one type: every exception class defined in `pipeline` is a PipelineError (a user
    can mend it), and each keeps the built-in base it had (ValueError or RuntimeError) for callers that catch that."""
    import importlib
    import inspect
    import pkgutil

    import pipeline
    from pipeline.errors import PipelineError

    found = {}
    for mod in pkgutil.walk_packages(pipeline.__path__, "pipeline."):
        m = importlib.import_module(mod.name)
        for name, obj in vars(m).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == mod.name:
                found[f"{mod.name}.{name}"] = obj
    assert len(found) >= 13, sorted(found)  # ConfigError, StorageError, TrackingError, ... (pipeline.errors' own too)
    assert [n for n, c in found.items() if not issubclass(c, PipelineError)] == []
    assert [
        n for n, c in found.items() if c is not PipelineError and not issubclass(c, (ValueError, RuntimeError))
    ] == []
