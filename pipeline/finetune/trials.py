"""Fine-tuning trials on Ray Tune: the one way a set of fine-tuning runs is run, for an LR sweep (`sweep`) and for
an evaluation suite (`pipeline.evaluate`).

Ray Train V2 (the default in Ray 2.60) no longer accepts a Trainer as Tune's trainable; its documented pattern is a
Tune trial function that launches the Ray Train run (Ray docs, Train "Hyperparameter Tuning with Ray Tune"). So
`_trial` is the trainable, and it trains through `runs.fit_run`, the Ray Train run of `train_loop_per_worker` that
a single `finetune.py` run uses: a trial's scores are a single run's at the same config, to the bit on the CPU.
Tune's grid is over the trials' keys (`param_space={"trial": tune.grid_search(keys)}`); `max_concurrent` trials run
at once, each holding its Train workers' CPUs (`train.num_workers` x `train.cpus_per_worker`) plus `TRIAL_CPUS`
for its own actor, so trials at fractional CPUs fill a cluster's cores.

Each trial reports once to Tune, at the end: its best epoch's eval metrics (`eval/*`, the model its checkpoint
keeps), that model's metrics on a test split when the trial has one (`test/*`), and its checkpoint (or None when
the trial does not keep it). MLflow: every trial logs into its own run, created by the caller on the driver
(a child of the caller's parent run); `TrialLines`, a Tune callback on the driver, marks it running, logs its
`best/*` (and `test/*`) metrics, closes it, and prints a line as each trial ends, with trials done / total and an
ETA.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import ray.tune

from pipeline import cluster, tracking
from pipeline.config import ConfigError, resolve_path
from pipeline.console import say
from pipeline.finetune.loop import FinetuneHandoff
from pipeline.finetune.runs import best_metrics, fit_run

TRIAL_CPUS = 0.05
"""CPUs of a trial's own actor, which only waits on its Ray Train run (whose workers hold train.cpus_per_worker)."""


@dataclass(frozen=True)
class TrialSpec:
    """One fine-tuning trial: a Ray Train run of `cfg` (its LR and seed set) on `shared`'s data and initial model."""

    label: str
    """What the console calls it (`lr 0.001`, `pydocs_topic lr 0.001 seed 2 of scratch:tiny`)."""
    cfg: Any
    """The trial's `FinetuneConfig`."""
    shared: FinetuneHandoff
    run_id: str
    """The MLflow run rank 0 logs into (created on the driver)."""
    name: str
    """The Ray Train run's name: its checkpoints are `train.storage_path`/<name>."""
    primary: str
    """The metric its console line names."""
    test_ref: Any = None
    """Ray object ref of a `TaskData` whose eval split is the task's test file; None: no test split."""
    keep: bool = True
    """Keep the trial's checkpoints (a sweep exports the best trial's); False removes them once it has reported."""


def check_trial_resources(
    num_workers: int, cpus_per_worker: float, cluster_cpus: float, field: str = "tune.lr"
) -> None:
    """A ConfigError (one line) when one trial (its actor plus its Train workers) can never be placed: Tune would
    wait for it forever.

    >>> check_trial_resources(2, 1.0, 2.0)
    Traceback (most recent call last):
    ...
    pipeline.config.sections.ConfigError: tune.lr: a trial needs train.num_workers 2 x train.cpus_per_worker 1 + 0.05 (the trial's own actor) = 2.05 CPUs; the cluster has 2
    """  # noqa: E501
    need = trial_cpus(num_workers, cpus_per_worker)
    if cluster_cpus < need:
        raise ConfigError(
            f"{field}: a trial needs train.num_workers {num_workers} x train.cpus_per_worker "
            f"{cpus_per_worker:g} + {TRIAL_CPUS:g} (the trial's own actor) = {need:g} CPUs; "
            f"the cluster has {cluster_cpus:g}"
        )


def trial_cpus(num_workers: int, cpus_per_worker: float) -> float:
    """CPUs one trial holds: `trial_cpus(1, 0.95) -> 1.0`."""
    return round(num_workers * cpus_per_worker + TRIAL_CPUS, 6)


def fitting_trials(num_workers: int, cpus_per_worker: float, cluster_cpus: float) -> int:
    """How many trials fit on the cluster's CPUs at once (at least 1): `fitting_trials(1, 0.95, 2.0) -> 2`."""
    return max(1, int(cluster_cpus / trial_cpus(num_workers, cpus_per_worker) + 1e-9))


def _test_metrics(checkpoint, spec: TrialSpec) -> dict[str, float]:
    """The best epoch's model (the checkpoint's `best/`) evaluated on the trial's test split."""
    import os

    import torch

    from model.build import load_model
    from pipeline.finetune.loop import evaluate

    td = ray.get(spec.test_ref)
    if spec.cfg.train.torch_threads:
        torch.set_num_threads(spec.cfg.train.torch_threads)
    with checkpoint.as_directory() as d:
        model = load_model(os.path.join(d, "best"), td.task)
    return evaluate(model, td, spec.cfg)


def _trial(config: dict[str, Any], specs: dict[str, TrialSpec]) -> None:
    """One Tune trial: its Ray Train run, then its best epoch's eval (and test) metrics to Tune. (`config` is Tune's:
    this trial's point of the grid.)"""
    from pipeline.storage.io import remove

    spec = specs[config["trial"]]
    result = fit_run(spec.cfg, spec.shared, spec.run_id, spec.name)
    out: dict[str, Any] = {f"eval/{k}": v for k, v in best_metrics(result.checkpoint).items()}
    if spec.test_ref is not None:
        out.update({f"test/{k}": v for k, v in _test_metrics(result.checkpoint, spec).items()})
    storage = spec.cfg.train.storage_path
    out["checkpoint"] = cluster.checkpoint_uri(result, storage) if spec.keep else None
    if not spec.keep:
        remove(f"{storage.rstrip('/')}/{spec.name}", recursive=True)
    ray.tune.report({**out, "trial": config["trial"]})


class TrialLines(ray.tune.Callback):
    """On the driver: each trial's MLflow run marked running, given its best/* (and test/*) metrics and closed, and
    a console line as each trial ends: trials done / total and an ETA at the rate trials have ended so far."""

    def __init__(self, specs: dict[str, TrialSpec], uri: str, prefix: str = "[tune]") -> None:
        self.specs, self.uri, self.prefix = specs, uri, prefix
        self.keys = list(specs)
        self.done = 0
        self.t0 = time.monotonic()

    def _spec(self, trial) -> tuple[str, TrialSpec]:
        key = trial.config["trial"]
        return f"trial {self.keys.index(key) + 1}/{len(self.keys)} {self.specs[key].label}", self.specs[key]

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        what, spec = self._spec(trial)
        tracking.client(self.uri).update_run(spec.run_id, status="RUNNING")
        say(f"{self.prefix} {what} started (MLflow run {spec.run_id})")

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        _, spec = self._spec(trial)
        best = {f"best/{k[len('eval/') :]}": v for k, v in result.items() if k.startswith("eval/")}
        test = {k: v for k, v in result.items() if k.startswith("test/")}
        tracking.RunLogger(spec.run_id, self.uri).log_metrics({**best, **test}, int(result["eval/step"]))

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        what, spec = self._spec(trial)
        tracking.client(self.uri).set_terminated(spec.run_id, status="FINISHED")
        self.done += 1
        r = trial.last_result
        left = len(self.keys) - self.done
        eta = left * (time.monotonic() - self.t0) / self.done  # at the rate trials have ended so far
        test = f", test {r[f'test/{spec.primary}']:.4f}" if f"test/{spec.primary}" in r else ""
        say(
            f"{self.prefix} {what} done: {spec.primary} {r[f'eval/{spec.primary}']:.4f}{test} (best epoch "
            f"{r['eval/epoch']:g}, step {r['eval/step']:g}); trials {self.done}/{len(self.keys)} done, "
            f"eta {_duration(eta) if left else '0s'}"
        )

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        what, spec = self._spec(trial)
        tracking.client(self.uri).set_terminated(spec.run_id, status="FAILED")
        say(f"{self.prefix} {what} failed (see MLflow run {spec.run_id} and Ray's logs)")


def _duration(s: float) -> str:
    """`_duration(200) -> '3m20s'`, `_duration(42.4) -> '42s'`."""
    m, sec = divmod(int(round(s)), 60)
    return f"{m}m{sec:02d}s" if m else f"{sec}s"


def run_trials(
    specs: dict[str, TrialSpec], name: str, storage_path: str, max_concurrent: int, uri: str, prefix: str = "[tune]"
) -> dict[str, dict[str, Any]]:
    """Run every trial on Tune, `max_concurrent` at a time; returns {key: the trial's reported metrics}. Raises the
    first trial's error, if any. `storage_path` holds Tune's experiment directory (`<storage>/<name>`)."""
    storage = resolve_path(storage_path)  # absolute: a trial runs in its own working directory
    specs = {
        k: replace(s, cfg=replace(s.cfg, train=replace(s.cfg.train, storage_path=storage))) for k, s in specs.items()
    }
    tuner = ray.tune.Tuner(
        ray.tune.with_resources(ray.tune.with_parameters(_trial, specs=specs), {"CPU": TRIAL_CPUS}),
        param_space={"trial": ray.tune.grid_search(list(specs))},
        tune_config=ray.tune.TuneConfig(max_concurrent_trials=max_concurrent),
        run_config=ray.tune.RunConfig(
            name=name,
            storage_path=storage,
            verbose=0,
            failure_config=ray.tune.FailureConfig(fail_fast=True),  # as a single run fails
            callbacks=[TrialLines(specs, uri, prefix)],
        ),
    )
    # Tune's legacy console output at verbose=0 prints nothing (the new engine still prints a banner), and without
    # Tune's SIGINT handler Ctrl-C interrupts the job as it does a single run (Tune's would end the trials quietly)
    with cluster.environ(RAY_AIR_NEW_OUTPUT="0", TUNE_DISABLE_SIGINT_HANDLER="1"):
        grid = tuner.fit()
    if grid.errors:
        raise grid.errors[0]
    return {r.metrics["trial"]: r.metrics for r in grid}


def end_open(run_ids: list[str], status: str, uri: str) -> None:
    """Close the trials' runs the callback did not (never started, or cut off): no run is left looking alive."""
    c = tracking.client(uri)
    for run_id in run_ids:
        if c.get_run(run_id).info.status in ("RUNNING", "SCHEDULED"):
            c.set_terminated(run_id, status=status)
