"""Pretrain BERT: prepare shards (skipped when up to date) -> Ray Train -> evaluate -> export + register in MLflow.

    python jobs/pretrain.py --config configs/tiny.yaml [--section.field value ...]
    ray job submit --working-dir . -- python jobs/pretrain.py --config configs/base.yaml

Runs on the Ray cluster it finds (RAY_ADDRESS, as under `ray job submit`) or starts an embedded one. The
tracking server is checked before any work; every path is made absolute before stages are shipped to Ray.
The last stdout line is `registered models:/<name>/<version>`. Bad input: one line on stderr, exit code 1.
Ray does not upload `.git` with `--working-dir`, so pass the commit for the `git_sha` registry tag:
    ray job submit --working-dir . --runtime-env-json "{\"env_vars\": {\"GIT_SHA\": \"$(git rev-parse HEAD)\"}}" -- ...
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


def git_sha() -> str:
    """The commit being run: GIT_SHA if set (CI, images), else `git rev-parse HEAD`, else "unknown"."""
    if os.environ.get("GIT_SHA"):
        return os.environ["GIT_SHA"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def state_dir_for(storage_path: str) -> str:
    """Where stage completion records live: beside the checkpoints when local, else in the user's cache."""
    if "://" in storage_path:
        return os.path.join(os.path.expanduser("~"), ".cache", "bert-pipeline", "stages")
    return os.path.join(storage_path, "_stages")


def _root_cause(e: BaseException) -> BaseException:
    """A stage's own exception out of Ray's wrappers (RayTaskError keeps it as .cause)."""
    seen = 0
    while seen < 10 and getattr(e, "cause", None) is not None and e.cause is not e:
        e = e.cause
        seen += 1
    return e


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="YAML preset (configs/tiny.yaml, base.yaml, large.yaml)")
    args, overrides = parser.parse_known_args(argv)

    from pipeline.config import ConfigError, load_config, resolve_paths
    from pipeline.tracking import TrackingError, check_tracking_server, tracking_uri

    try:
        cfg = resolve_paths(load_config(args.config, overrides))
        uri = tracking_uri()
        os.environ["MLFLOW_TRACKING_URI"] = uri  # absolute, for everything this process starts
        check_tracking_server(uri)
    except (ConfigError, TrackingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    import ray
    import ray.data

    from pipeline.dag import pretrain_stages, run_graph, summary_table

    known = (ConfigError, TrackingError, ValueError, FileNotFoundError, OSError)
    try:
        ray.init(configure_logging=False, log_to_driver=True)
        ray.data.DataContext.get_current().enable_progress_bars = False  # bars would land after the last line
        print(f"tracking: {uri}; cluster: {ray.cluster_resources()}", flush=True)
        state_dir = state_dir_for(cfg.train.storage_path)
        stages = pretrain_stages(cfg, state_dir, git_sha=git_sha(), tracking_uri=uri)
        results = run_graph(stages, state_dir, remote=True)
    except Exception as e:  # noqa: BLE001 - one clear line for known input errors, traceback for bugs
        cause = _root_cause(e)
        if isinstance(cause, known) or type(cause).__name__ in ("InputError", "DataValidationError", "OutputExistsError"):
            print(f"error: {type(cause).__name__}: {cause}".splitlines()[0], file=sys.stderr)
            return 1
        raise
    finally:
        if ray.is_initialized():
            ray.shutdown()
    print(summary_table(results))
    print(f"registered {results['register'].result['uri']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
