"""The main job's `scorecard` stage: the version that `register` made, scored on `eval.suite` (after `register`).

`jobs/pretrain.py` adds it to the graph when `eval.suite` is set (pipeline.pretrain never imports pipeline.evaluate:
the stage comes from above, as the graph's one extension). It is done, and skipped, when the registered version
already carries a scorecard of the suite file's sha256 (its `suite.<name>.sha256` tag); its result is the
scorecard: {"suite", "suite_sha256", "version", "score", "run_id", "table", "models"}.

The trials run on the job's cluster with `jobs/evaluate.py`'s defaults (one CPU a trial, one torch thread), their
checkpoints under `train.storage_path`/evaluate while they run; `scratch:*` baselines take the new version's
tokenizer.
"""

from __future__ import annotations

import os
from typing import Any

from pipeline.runner.dag import Stage


def _eval_config(cfg, version_uri: str):
    from dataclasses import replace

    from pipeline.evaluate.config import EvaluateConfig

    ecfg = EvaluateConfig()
    return replace(
        ecfg,
        data=replace(ecfg.data, tokenizer=version_uri),
        train=replace(
            ecfg.train, storage_path=f"{cfg.train.storage_path.rstrip('/')}/evaluate", use_gpu=cfg.train.use_gpu
        ),
        suite=replace(ecfg.suite, max_concurrent_trials=cfg.eval.max_concurrent_trials),
    )


def _result(suite, version_uri: str, out: dict[str, Any]) -> dict[str, Any]:
    from pipeline.evaluate.suite import table

    mine = out["models"][version_uri]
    return {
        "suite": suite.name,
        "suite_sha256": suite.sha256,
        "version": version_uri,
        "score": mine["score"],
        "run_id": mine.get("run_id"),
        "table": table(suite, out["models"]),
        "models": out["models"],
    }


def run_scorecard(cfg, registered: dict[str, str], uri: str) -> dict[str, Any]:
    """Score the registered version (and `eval.baselines`) on `eval.suite`."""
    from pipeline.evaluate.job import run_evaluate
    from pipeline.evaluate.suite import load_suite

    os.environ["MLFLOW_TRACKING_URI"] = uri
    suite = load_suite(cfg.eval.suite)
    version_uri = registered["uri"]
    out = run_evaluate(_eval_config(cfg, version_uri), [version_uri, *cfg.eval.baselines], suite)
    return _result(suite, version_uri, out)


def scorecard_done(cfg, registered: dict[str, str], uri: str) -> dict[str, Any] | None:
    """The version's scorecard of this suite file, when it has one (tags `suite.<name>.sha256|run_id`)."""
    from pipeline.evaluate.job import scorecard_of
    from pipeline.evaluate.suite import load_suite

    suite = load_suite(cfg.eval.suite)
    mine = scorecard_of(registered["name"], registered["version"], suite, uri)
    return None if mine is None else _result(suite, registered["uri"], {"models": {registered["uri"]: mine}})


def scorecard_stage(cfg, tracking_uri: str) -> Stage:
    """The stage `jobs/pretrain.py` appends after `register` when `eval.suite` is set."""
    return Stage(
        "scorecard",
        lambda deps: run_scorecard(cfg, deps["register"], tracking_uri),
        deps=("register",),
        done=lambda deps: scorecard_done(cfg, deps["register"], tracking_uri),
        describe=lambda r: f"{r['version']} on suite {r['suite']}: score {r['score']:.4f} (MLflow run {r['run_id']})",
    )
