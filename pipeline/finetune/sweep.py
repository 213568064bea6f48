"""Fine-tuning that finds its LR: a grid over `tune.lr`, one trial per LR, the best trial registered.

The trials are `pipeline.finetune.trials`' (Ray Tune, each trial the Ray Train run a single run is),
`tune.max_concurrent_trials` at a time (1 by default: on a small machine trials would starve each other).

MLflow, all runs created on the driver: one parent run (the job's run name; params with the grid) and one child
per LR (`<name>-lr<lr>`, tag `mlflow.parentRunId`, its own `train.lr`), which rank 0 of that trial logs into. The
best trial (`pick_best`: highest eval metric, ties to the lower eval loss, as the loop orders epochs) is exported
and registered like a single run, made by its child run, plus a `tune_parent_run_id` tag; the parent gets the
best trial's metrics and tags naming it and its LR. Tune's experiment directory is `train.storage_path`/<name>,
each trial's Ray Train checkpoints `train.storage_path`/<child name>.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import ray
from ray.train import Checkpoint

from pipeline import tracking
from pipeline.console import say
from pipeline.finetune.runs import Job, with_lr
from pipeline.finetune.trials import TrialSpec, check_trial_resources, end_open, run_trials
from pipeline.tracking import server as tracking_server


def pick_best(results: list[dict[str, Any]], primary: str) -> int:
    """Index of the best trial's reported metrics: the highest `eval/<primary>`, ties to the lower `eval/loss`;
    NaN (a diverged trial) ranks last.

    >>> pick_best([{"eval/accuracy": 0.5, "eval/loss": 1.2}, {"eval/accuracy": 0.5, "eval/loss": 0.9},
    ...            {"eval/accuracy": float("nan"), "eval/loss": 0.1}], "accuracy")
    1
    """

    def key(i: int) -> tuple[float, float]:
        m, loss = results[i].get(f"eval/{primary}", math.nan), results[i].get("eval/loss", math.nan)
        return (m if m == m else -math.inf, -loss if loss == loss else -math.inf)

    return max(range(len(results)), key=key)


def _open_children(job: Job, run_name: str, parent_id: str) -> dict[float, tuple[str, str]]:
    """A child run per LR (params, label map), SCHEDULED until its trial starts: {lr: (run id, run name)}."""
    children = {}
    for lr in job.cfg.tune.lr or []:  # MLflow bookkeeping only; Tune runs the trials
        name = f"{run_name}-lr{lr:g}"
        run_id = tracking.start_run(
            job.cfg.tracking.experiment, name, {**job.tags, "mlflow.parentRunId": parent_id, "tune_lr": f"{lr:g}"}
        )
        logger = tracking.RunLogger(run_id, job.shared.tracking_uri)
        job.log_inputs(logger, with_lr(job.cfg, lr), {"train.lr_source": "tune.lr"})
        logger.client.update_run(run_id, status="SCHEDULED")
        children[lr] = (run_id, name)
    return children


def run_sweep(job: Job, run_name: str) -> dict[str, Any]:
    """The parent run around Tune's sweep; the best trial exported and registered. Returns run_finetune's dict for
    the best trial (its child run) plus `parent_run_id` and `lr`."""
    cfg, uri = job.cfg, job.shared.tracking_uri
    check_trial_resources(cfg.train.num_workers, cfg.train.cpus_per_worker, ray.cluster_resources().get("CPU", 0))
    parent_id = tracking.start_run(cfg.tracking.experiment, run_name, job.tags)
    parent = tracking.RunLogger(parent_id, uri)
    say(
        f"[tune] MLflow parent run {parent_id} ({run_name}) at {tracking_server.redact(uri)}: {len(cfg.tune.lr or [])} trials, "  # noqa: E501
        f"{cfg.tune.max_concurrent_trials} at a time",
        sys.stdout,
    )
    children: dict[float, tuple[str, str]] = {}
    status = "FAILED"
    try:
        parent.log_params({k: v for k, v in job.params(cfg).items() if k != "train.lr"})  # the trials' is tune.lr
        children = _open_children(job, run_name, parent_id)
        specs = {
            f"{lr:g}": TrialSpec(f"lr {lr:g}", with_lr(cfg, lr), job.shared, run_id, name, job.primary)
            for lr, (run_id, name) in children.items()
        }
        reported = run_trials(specs, run_name, cfg.train.storage_path, cfg.tune.max_concurrent_trials, uri)
        results = [{**reported[f"{lr:g}"], "lr": lr} for lr in children]
        winner = results[pick_best(results, job.primary)]
        lr, (run_id, name) = winner["lr"], children[winner["lr"]]
        best, out = job.export(Checkpoint(winner["checkpoint"]))
        registered = job.register(out, best, run_id, tracking.RunLogger(run_id, uri), {"tune_parent_run_id": parent_id})
        parent.log_metrics({"tune/best_lr": lr, **{f"best/{k}": v for k, v in best.items()}}, step=int(best["step"]))
        parent.set_tags(
            {
                "tune_best_run_id": run_id,
                "tune_best_lr": f"{lr:g}",
                **({"registered_model": registered} if registered else {}),
            }
        )
        say(f"[tune] best: lr {lr:g}, {job.primary} {best[job.primary]:.4f} (MLflow run {run_id})", sys.stdout)
        status = "FINISHED"
        return {
            "metrics": best,
            "model_dir": str(out) if job.output_dir else None,
            "registered": registered,
            "run_id": run_id,
            "run_name": name,
            "parent_run_id": parent_id,
            "lr": lr,
        }
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        end_open([run_id for run_id, _ in children.values()], status, uri)
        parent.finish(status)
