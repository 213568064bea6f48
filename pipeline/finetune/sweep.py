"""Fine-tuning that finds its LR: a Ray Tune grid over `tune.lr`, one trial per LR, the best trial registered.

Ray Train V2 (the default in Ray 2.60) no longer accepts a Trainer as Tune's trainable; its documented pattern is a
Tune trial function that launches the Ray Train run (Ray docs, Train "Hyperparameter Tuning with Ray Tune"). So
`_trial` is the trainable, and it trains through `job.fit_run`, the Ray Train run of `train_loop_per_worker` that a
single run uses; the grid is Tune's own (`param_space={"train_loop_config": {"lr": tune.grid_search(...)}}`),
`tune.max_concurrent_trials` trials at a time (1 by default: on a small machine trials would starve each other).
Each trial reports once to Tune, at the end: its best epoch's eval metrics (the model its checkpoint keeps).

MLflow, all runs created on the driver: one parent run (the job's run name; params with the grid) and one child
per LR (`<name>-lr<lr>`, tag `mlflow.parentRunId`, its own `train.lr`), which rank 0 of that trial logs into. A Tune
callback on the driver prints a line as each trial starts and ends, logs the trial's `best/*` metrics and closes its
child. The best trial (`pick_best`: highest eval metric, ties to the lower eval loss, as the loop orders epochs) is
exported and registered like a single run, made by its child run, plus a `tune_parent_run_id` tag; the parent gets
the best trial's metrics and tags naming it and its LR. Tune's experiment directory is `train.storage_path`/<name>,
each trial's Ray Train checkpoints `train.storage_path`/<child name>.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import ray.tune
from ray.train import Checkpoint

from pipeline import tracking
from pipeline.tracking import server as tracking_server
from pipeline.config import ConfigError, resolve_path
from pipeline import cluster
from pipeline.finetune.loop import FinetuneHandoff
from pipeline.finetune.runs import Job, best_metrics, fit_run, with_lr

TRIAL_CPUS = 0.05
"""CPUs of a trial's own actor, which only waits on its Ray Train run (whose workers hold train.cpus_per_worker)."""


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


@dataclass(frozen=True)
class _Trials:
    """What the driver gives every trial: the job's config (storage made absolute), what its Ray Train runs share,
    and each LR's child run {lr: (MLflow run id, Ray Train run name)}."""

    cfg: Any
    shared: FinetuneHandoff
    children: dict[float, tuple[str, str]]


def _trial(config: dict[str, Any], trials: _Trials) -> None:
    """One Tune trial: the job's Ray Train run at this trial's LR, then its best epoch's eval metrics to Tune.
    (`config` is Tune's: this trial's point of the grid.)"""
    lr = config["train_loop_config"]["lr"]
    run_id, name = trials.children[lr]
    result = fit_run(with_lr(trials.cfg, lr), trials.shared, run_id, name)
    ray.tune.report({**{f"eval/{k}": v for k, v in best_metrics(result.checkpoint).items()}, "lr": lr,
                     "checkpoint": cluster.checkpoint_uri(result, trials.cfg.train.storage_path)})


class _TrialLines(ray.tune.Callback):
    """On the driver: a console line as each trial starts and ends, its child run opened, given its best/*
    metrics and closed."""

    def __init__(self, children: dict[float, tuple[str, str]], primary: str, uri: str) -> None:
        self.children, self.primary, self.uri = children, primary, uri
        self.lrs = list(children)

    def _child(self, trial) -> tuple[str, str]:
        lr = trial.config["train_loop_config"]["lr"]
        return f"trial {self.lrs.index(lr) + 1}/{len(self.lrs)} lr {lr:g}", self.children[lr][0]

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        what, run_id = self._child(trial)
        tracking.client(self.uri).update_run(run_id, status="RUNNING")
        print(f"[tune] {what} started (MLflow run {run_id})", flush=True)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        _, run_id = self._child(trial)
        best = {k[len("eval/"):]: v for k, v in result.items() if k.startswith("eval/")}
        tracking.RunLogger(run_id, self.uri).log_metrics({f"best/{k}": v for k, v in best.items()}, int(best["step"]))

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        what, run_id = self._child(trial)
        tracking.client(self.uri).set_terminated(run_id, status="FINISHED")
        r = trial.last_result
        print(f"[tune] {what} done: {self.primary} {r[f'eval/{self.primary}']:.4f} (best epoch {r['eval/epoch']:g}, "
              f"step {r['eval/step']:g})", flush=True)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        what, run_id = self._child(trial)
        tracking.client(self.uri).set_terminated(run_id, status="FAILED")
        print(f"[tune] {what} failed (see MLflow run {run_id} and Ray's logs)", flush=True)


def _tune(job: Job, run_name: str, children: dict[float, tuple[str, str]]) -> ray.tune.ResultGrid:
    """Tune's grid over the children's LRs; raises the first trial's error, if any."""
    cfg = job.cfg
    storage = resolve_path(cfg.train.storage_path)  # absolute: a trial runs in its own working directory
    trials = _Trials(replace(cfg, train=replace(cfg.train, storage_path=storage)), job.shared, children)
    tuner = ray.tune.Tuner(
        ray.tune.with_resources(ray.tune.with_parameters(_trial, trials=trials), {"CPU": TRIAL_CPUS}),
        param_space={"train_loop_config": {"lr": ray.tune.grid_search(list(children))}},
        tune_config=ray.tune.TuneConfig(max_concurrent_trials=cfg.tune.max_concurrent_trials),
        run_config=ray.tune.RunConfig(name=run_name, storage_path=storage, verbose=0,
                                      failure_config=ray.tune.FailureConfig(fail_fast=True),  # as a single run fails
                                      callbacks=[_TrialLines(children, job.primary, job.shared.tracking_uri)]),
    )
    # Tune's legacy console output at verbose=0 prints nothing (the new engine still prints a banner), and without
    # Tune's SIGINT handler Ctrl-C interrupts the job as it does a single run (Tune's would end the sweep quietly)
    with cluster.environ(RAY_AIR_NEW_OUTPUT="0", TUNE_DISABLE_SIGINT_HANDLER="1"):
        grid = tuner.fit()
    if grid.errors:
        raise grid.errors[0]
    return grid


def _open_children(job: Job, run_name: str, parent_id: str) -> dict[float, tuple[str, str]]:
    """A child run per LR (params, label map), SCHEDULED until its trial starts: {lr: (run id, run name)}."""
    children = {}
    for lr in job.cfg.tune.lr or []:  # MLflow bookkeeping only; Tune runs the trials
        name = f"{run_name}-lr{lr:g}"
        run_id = tracking.start_run(job.cfg.tracking.experiment, name,
                                    {**job.tags, "mlflow.parentRunId": parent_id, "tune_lr": f"{lr:g}"})
        logger = tracking.RunLogger(run_id, job.shared.tracking_uri)
        job.log_inputs(logger, with_lr(job.cfg, lr), {"train.lr_source": "tune.lr"})
        logger.client.update_run(run_id, status="SCHEDULED")
        children[lr] = (run_id, name)
    return children


def _end_open(children: dict[float, tuple[str, str]], status: str, uri: str) -> None:
    """Close the children the callback did not (never started, or cut off): no run is left looking alive."""
    c = tracking.client(uri)
    for run_id, _ in children.values():
        if c.get_run(run_id).info.status in ("RUNNING", "SCHEDULED"):
            c.set_terminated(run_id, status=status)


def check_trial_resources(num_workers: int, cpus_per_worker: float, cluster_cpus: float) -> None:
    """A ConfigError (one line) when one trial (its actor plus its Train workers) can never be placed: Tune would
    wait for it forever.

    >>> check_trial_resources(2, 1.0, 2.0)
    Traceback (most recent call last):
    ...
    pipeline.config.sections.ConfigError: tune.lr: a trial needs train.num_workers 2 x train.cpus_per_worker 1 + 0.05 (the trial's own actor) = 2.05 CPUs; the cluster has 2
    """
    need = num_workers * cpus_per_worker + TRIAL_CPUS
    if cluster_cpus < need:
        raise ConfigError(f"tune.lr: a trial needs train.num_workers {num_workers} x train.cpus_per_worker "
                          f"{cpus_per_worker:g} + {TRIAL_CPUS:g} (the trial's own actor) = {need:g} CPUs; "
                          f"the cluster has {cluster_cpus:g}")


def run_sweep(job: Job, run_name: str) -> dict[str, Any]:
    """The parent run around Tune's sweep; the best trial exported and registered. Returns run_finetune's dict for
    the best trial (its child run) plus `parent_run_id` and `lr`."""
    cfg, uri = job.cfg, job.shared.tracking_uri
    check_trial_resources(cfg.train.num_workers, cfg.train.cpus_per_worker, ray.cluster_resources().get("CPU", 0))
    parent_id = tracking.start_run(cfg.tracking.experiment, run_name, job.tags)
    parent = tracking.RunLogger(parent_id, uri)
    print(f"[tune] MLflow parent run {parent_id} ({run_name}) at {tracking_server.redact(uri)}: {len(cfg.tune.lr or [])} trials, "
          f"{cfg.tune.max_concurrent_trials} at a time", flush=True)
    children: dict[float, tuple[str, str]] = {}
    status = "FAILED"
    try:
        parent.log_params({k: v for k, v in job.params(cfg).items() if k != "train.lr"})  # the trials' is tune.lr
        children = _open_children(job, run_name, parent_id)
        grid = _tune(job, run_name, children)
        results = [r.metrics for r in grid]
        winner = results[pick_best(results, job.primary)]
        lr, (run_id, name) = winner["lr"], children[winner["lr"]]
        best, out = job.export(Checkpoint(winner["checkpoint"]))
        registered = job.register(out, best, run_id, tracking.RunLogger(run_id, uri), {"tune_parent_run_id": parent_id})
        parent.log_metrics({"tune/best_lr": lr, **{f"best/{k}": v for k, v in best.items()}}, step=int(best["step"]))
        parent.set_tags({"tune_best_run_id": run_id, "tune_best_lr": f"{lr:g}",
                         **({"registered_model": registered} if registered else {})})
        print(f"[tune] best: lr {lr:g}, {job.primary} {best[job.primary]:.4f} (MLflow run {run_id})", flush=True)
        status = "FINISHED"
        return {"metrics": best, "model_dir": str(out) if job.output_dir else None, "registered": registered,
                "run_id": run_id, "run_name": name, "parent_run_id": parent_id, "lr": lr}
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        _end_open(children, status, uri)
        parent.finish(status)
