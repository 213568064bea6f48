"""Pretrain BERT: prepare shards (skipped when up to date) -> Ray Train -> evaluate -> export + register in MLflow
-> with `eval.suite`, the registered version's scorecard on that evaluation suite (`scorecard` stage).

    python jobs/pretrain.py --config configs/tiny.yaml [--section.field value ...]
    ray job submit --working-dir . -- python jobs/pretrain.py --config configs/base.yaml

Runs on the Ray cluster in RAY_ADDRESS (as under `ray job submit`; `auto` joins a running `ray start` cluster) or
starts a private local one. Config values, input paths, the tracking server and the cluster's resources are checked
before any work; every path is made absolute before stages are shipped to Ray. The last stdout line is
`registered models:/<name>/<version>`. Bad input: one line on stderr, exit code 1.
Ray does not upload `.git` with `--working-dir`, so pass the commit for the `git_sha` registry tag:
    ray job submit --working-dir . --runtime-env-json "{\"env_vars\": {\"GIT_SHA\": \"$(git rev-parse HEAD)\"}}" -- ...
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

# `python jobs/pretrain.py` puts jobs/ on sys.path, not the project; a plain checkout (`ray job submit
# --working-dir .`) should work without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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


def main(argv: list[str] | None = None) -> int:
    from pipeline.config import SECTIONS, config_parser
    from pipeline.runner.cli import run_job

    parser = config_parser(SECTIONS, __doc__)  # --help: --config and every --section.field, documented
    argv = sys.argv[1:] if argv is None else argv

    attempt = uuid.uuid4().hex[:12]
    state: dict = {}

    def abort(status: str) -> None:  # a failed or interrupted attempt never leaves its MLflow run RUNNING
        if state.get("started"):
            from pipeline import tracking

            try:
                tracking.end_attempt_runs(state["cfg"].tracking.experiment, attempt, status, state["uri"])
            except Exception:  # noqa: BLE001 - the original error matters more
                pass

    def body() -> int:
        from pipeline.config import Config, config_path, parse, phase_data_configs, resolve_paths
        from pipeline import cluster
        from pipeline.data.stages import check_paths
        from pipeline.storage.preflight import check_storage, data_targets
        from pipeline.tracking.server import artifact_root, check_tracking_server, redact, tracking_uri

        check_storage([("--config", config_path(argv), "read")])
        _, sections = parse(parser, argv, SECTIONS)
        cfg = resolve_paths(Config(**sections))
        check_storage(
            data_targets(cfg.data)
            + [("train.storage_path", cfg.train.storage_path, "write")]
            + [
                (f"train.phases[{i}].output", d.output, "write")
                for i, d in enumerate(phase_data_configs(cfg) if cfg.train.phases else [])
            ]
        )
        check_paths(cfg.data)
        if cfg.data.sources:  # a source with no readable file: one line before Ray starts, not at the plan
            from pipeline.data.sources import check_sources

            check_sources(cfg.data.sources)
        if cfg.eval.suite:  # the suite and its task files, before any work (the scorecard stage runs last)
            from pipeline.evaluate.job import check_files
            from pipeline.evaluate.suite import load_suite

            check_files(load_suite(cfg.eval.suite))
        uri = tracking_uri()
        os.environ["MLFLOW_TRACKING_URI"] = uri  # absolute, for everything this process starts
        check_tracking_server(uri)
        check_storage([("MLflow artifact root", artifact_root(uri, cfg.tracking.experiment), "write")])
        from pipeline.pretrain.init import resolve_init

        cfg, init = resolve_init(cfg)  # model.init: architecture and vocabulary from the checkpoint, checked here
        state.update(cfg=cfg, uri=uri)
        import ray
        import ray.data

        from pipeline.runner.dag import run_graph, summary_table
        from pipeline.pretrain.job import pretrain_stages

        cluster.check_local_gpu("train", cfg.train.use_gpu)
        address = cluster.connect()
        try:
            cluster.check_resources(
                "train",
                use_gpu=cfg.train.use_gpu,
                num_workers=cfg.train.num_workers,
                cpus_per_worker=cfg.train.cpus_per_worker,
            )
            ray.data.DataContext.get_current().enable_progress_bars = False  # bars would land after the last line
            res = ray.cluster_resources()
            print(
                f"tracking: {redact(uri)}; ray: {address} ({res.get('CPU', 0):g} CPU, {res.get('GPU', 0):g} GPU); "
                f"Ray's logs: {cluster.session_log_dir()}",
                flush=True,
            )
            command = "python jobs/pretrain.py " + " ".join(shlex.quote(a) for a in argv)
            stages = pretrain_stages(
                cfg, git_sha=git_sha(), tracking_uri=uri, attempt=attempt, command=command, init=init
            )
            if cfg.eval.suite:  # the registered version scored on the suite (pipeline.evaluate.stage)
                from pipeline.evaluate.stage import scorecard_stage

                stages.append(scorecard_stage(cfg, uri))
            state["started"] = True
            results = run_graph(stages, remote=True)
        finally:
            cluster.disconnect()
        print(summary_table(results))
        if "scorecard" in results:
            card = results["scorecard"].result
            print(
                f"scorecard of {card['version']}, suite {card['suite']} (MLflow run {card['run_id']}):\n{card['table']}",  # noqa: E501
                flush=True,
            )
        print(f"registered {results['register'].result['uri']}", flush=True)
        return 0

    return run_job("pretrain", body, on_abort=abort)


if __name__ == "__main__":
    sys.exit(main())
