"""MLflow, all of it: reaching the store (`server`), runs and the rank-0 logger (`runs`), the metric outbox that
outlives a server outage (`outbox`), the bounded wait of the stages that need the server (`wait`), and the model
registry (`registry`).

Code that only tracks imports the package (`from pipeline import tracking`) and calls the names below; the
submodules are where each lives.
"""

import importlib
import os
from typing import Any

# MLflow 3's usage telemetry is off in the pipeline's processes unless the environment says otherwise: its thread
# sets and unsets an environment variable (_MLFLOW_TELEMETRY_SESSION_ID) while `requests` iterates os.environ in
# another thread, which ended a pretraining job with "KeyError: '_MLFLOW_TELEMETRY_SESSION_ID'" in an MLflow API
# call; and it phones home, which offline clusters cannot. Every mlflow import of the project is under this
# package, so this runs first. MLFLOW_DISABLE_TELEMETRY=false keeps it on.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# and no tqdm bar of its own as a registry version or a scorecard downloads: a job's console is its own lines
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

# Each name loads its submodule on first use (PEP 562, as `model` does): mlflow takes seconds to import, and a job
# that fails on its input, or a Train worker that never logs, should not pay for it.
_WHERE = {
    **dict.fromkeys(
        ["TrackingError", "artifact_root", "check_tracking_server", "client", "redact", "tracking_uri"], "server"
    ),
    **dict.fromkeys(
        [
            "EXPERIMENT_KIND",
            "Progress",
            "RunLogger",
            "end_attempt_runs",
            "experiment_id",
            "find_run",
            "metric_key",
            "newest_run_tagged",
            "run_exists",
            "run_name",
            "start_run",
        ],
        "runs",
    ),
    **dict.fromkeys(
        [
            "download_model",
            "fetch_registered",
            "find_version",
            "model_version_info",
            "register_hf_model",
            "version_description",
            "write_tokenizer_config",
        ],
        "registry",
    ),
}

__all__ = sorted(_WHERE)


_SUBMODULES = ("outbox", "registry", "runs", "server", "wait")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"pipeline.tracking.{name}")
    if name not in _WHERE:
        raise AttributeError(f"module 'pipeline.tracking' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"pipeline.tracking.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
