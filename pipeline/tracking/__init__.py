"""MLflow, all of it: reaching the store (`server`), runs and the rank-0 logger (`runs`), the metric outbox that
outlives a server outage (`outbox`), the bounded wait of the stages that need the server (`wait`), and the model
registry (`registry`).

Code that only tracks imports the package (`from pipeline import tracking`) and calls the names below; the
submodules are where each lives.
"""

from pipeline.tracking.server import TrackingError, artifact_root, check_tracking_server, client, redact, tracking_uri
from pipeline.tracking.runs import (EXPERIMENT_KIND, Progress, RunLogger, end_attempt_runs, experiment_id, find_run,
                                    newest_run_tagged, run_exists, start_run)
from pipeline.tracking.registry import (download_model, fetch_registered, find_version, model_version_info,
                                        register_hf_model, version_description, write_tokenizer_config)

__all__ = ["EXPERIMENT_KIND", "Progress", "RunLogger", "TrackingError", "artifact_root", "check_tracking_server", "client",
           "download_model", "end_attempt_runs", "experiment_id", "fetch_registered", "find_run", "find_version",
           "model_version_info", "newest_run_tagged", "redact", "register_hf_model", "run_exists", "start_run",
           "tracking_uri", "version_description", "write_tokenizer_config"]
