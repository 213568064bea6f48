"""MLflow runs: the run is created on the driver, rank 0 logs into it (`RunLogger`, with the console's progress
line), a failed or interrupted attempt's runs are ended.

Everything talks to MLflow through an explicit client (`client()`: `MlflowClient(tracking_uri())`), never the fluent
global state, so the same code works on the driver, in a Ray task and in a Ray Train worker whose working directory
differs. Reaching the store (its URI, the client, the server probe, redaction) is pipeline.tracking.server.

Resuming is first-class: `start_run` returns the existing run of the same name, and `RunLogger` never logs a step
twice for a metric (a worker restarted from a checkpoint at step 40 recomputes steps 41.. that it may already have
logged before it died; those are dropped, so the run has one value per step).

    >>> run_id = start_run("bert-pretrain", "tiny-abc", {"git_sha": "0123abc"})   # doctest: +SKIP
    >>> log = RunLogger(run_id); log.log_metrics({"loss": 7.1}, step=1); log.finish("FINISHED")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from pipeline.console import Every, say
from pipeline.tracking.server import check_tracking_server, client, tracking_uri

# MLflow limits: 100 params / 1000 metrics per log_batch call; param values up to 6000 characters.
_MAX_PARAMS_PER_BATCH = 100
_MAX_METRICS_PER_BATCH = 1000
_MAX_PARAM_LEN = 6000


def _artifact_location(uri: str, experiment: str) -> str | None:
    """For a SQLite store, artifacts go beside the database (absolute), not in whatever cwd created the experiment."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :])
        return (db.parent / "mlartifacts" / experiment).as_uri()
    return None  # a server decides (mlflow-artifacts:/ proxy or its --default-artifact-root)


# MLflow 3's UI opens an experiment on its GenAI view (traces, an assistant) unless the experiment's kind says
# otherwise; "custom_model_development" is the model-training view (runs, charts, registered models).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def experiment_id(name: str, uri: str | None = None) -> str:
    """The id of experiment `name` (created, or restored when deleted), marked as a model-training experiment."""
    c = client(uri)
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            c.restore_experiment(exp.experiment_id)
        if exp.tags.get("mlflow.experimentKind") != EXPERIMENT_KIND["mlflow.experimentKind"]:
            c.set_experiment_tag(exp.experiment_id, *next(iter(EXPERIMENT_KIND.items())))
        return exp.experiment_id
    try:
        return c.create_experiment(
            name, artifact_location=_artifact_location(c.tracking_uri, name), tags=EXPERIMENT_KIND
        )
    except MlflowException:  # created concurrently by another process
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def find_run(experiment: str, run_name: str) -> str | None:
    """The id of the newest run called `run_name` in `experiment`, or None."""
    c = client()
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return None
    safe = run_name.replace("'", "\\'")
    runs = c.search_runs(
        [exp.experiment_id],
        filter_string=f"attributes.run_name = '{safe}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


def newest_run_tagged(experiment: str, key: str, value: str, uri: str | None = None) -> Any | None:
    """The newest (not deleted) run of `experiment` whose tag `key` is `value`, or None."""
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return None
    runs = c.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.{key} = '{value}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0] if runs else None


def run_exists(run_id: str, uri: str | None = None) -> bool:
    """True when `run_id` is a (not deleted) run of the tracking store at `uri`; `tracking_server.ServerUnreachable`
    when the server does not answer (a run that cannot be looked up is not a missing run)."""
    try:
        return client(uri).get_run(run_id).info.lifecycle_stage != "deleted"
    except MlflowException:
        check_tracking_server(uri or tracking_uri(), timeout=10)
        return False


def _end_status(tags: dict[str, str], status: str) -> str:
    """`status`, except for a run that registered a model version (its `registered_model` tag): that one stays
    FINISHED. A later attempt that reopened it (a resume from an older checkpoint, after the newest was found
    damaged) and failed does not make the run of a version in the registry look failed.

    >>> _end_status({"registered_model": "models:/bert-pretrain/1"}, "FAILED"), _end_status({}, "FAILED")
    ('FINISHED', 'FAILED')
    """
    return "FINISHED" if "registered_model" in tags else status


def end_attempt_runs(experiment: str, attempt: str, status: str, uri: str | None = None) -> list[str]:
    """Mark every still-RUNNING run of `experiment` tagged `attempt=<attempt>` as `status` (FAILED / KILLED;
    FINISHED for a run that registered a version, see `_end_status`): a failed or interrupted job never leaves a
    run looking alive. Returns the run ids it ended."""
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return []
    runs = c.search_runs(
        [exp.experiment_id], filter_string=f"tags.attempt = '{attempt}' and attributes.status = 'RUNNING'"
    )
    for r in runs:
        c.set_terminated(r.info.run_id, status=_end_status(r.data.tags, status))
    return [r.info.run_id for r in runs]


def run_name(*parts: str, tag: str) -> str:
    """Every run's name (pretraining's `<preset>-<identity>`, fine-tuning's `<task>-<source>-<random>`): the parts
    and the tag joined by '-', each part made safe as a directory name (other characters become '-') and cut to 40.

    >>> run_name("cls", "models:/bert pretrain@v3", tag="0a1b2c")
    'cls-models-bert-pretrain-v3-0a1b2c'
    """
    safe = [re.sub(r"[^A-Za-z0-9._-]+", "-", p).strip("-")[:40] or "model" for p in parts]
    return "-".join([*safe, tag])


def start_run(experiment: str, run_name: str | None, tags: dict[str, Any] | None = None) -> str:
    """Create the run on the driver, or reopen the existing run of the same name (resume); returns its id."""
    c = client()
    exp_id = experiment_id(experiment)
    run_id = find_run(experiment, run_name) if run_name else None
    tags = {k: str(v) for k, v in (tags or {}).items()}
    if run_id is None:
        run = c.create_run(exp_id, run_name=run_name, tags=tags)
        return run.info.run_id
    c.update_run(run_id, status="RUNNING")
    if tags:
        c.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
    return run_id


def _sample_system() -> dict[str, float]:
    import psutil

    vm = psutil.virtual_memory()
    du = psutil.disk_usage(os.getcwd())
    out = {
        "system/cpu_utilization_percentage": psutil.cpu_percent(interval=None),
        "system/system_memory_usage_megabytes": (vm.total - vm.available) / 2**20,
        "system/system_memory_usage_percentage": vm.percent,
        "system/disk_usage_percentage": du.percent,
        "system/process_rss_megabytes": psutil.Process().memory_info().rss / 2**20,
    }
    try:
        import torch

        if torch.cuda.is_available():
            out["system/gpu_0_memory_usage_megabytes"] = torch.cuda.memory_allocated() / 2**20
    except Exception:  # noqa: BLE001 - system metrics are best effort
        pass
    return out


class Progress:
    """Console progress of a training loop: one plain line about every `every_s` seconds or every `every_steps`
    steps, whichever comes later, and always the last step.

        step 30/300  loss 7.1234  mlm_acc 0.0512  3,921 tok/s  eta 4m12s      (a GPU run adds `mfu 41.2%` after tok/s)
    """

    def __init__(self, total: int | None, every_steps: int = 1, every_s: float = 10.0, out=None) -> None:
        self.total, self.every_steps = total, max(1, every_steps)
        self.out = out
        self.every = Every(every_s)
        self._s0: int | None = None  # the first step this process saw (a resumed run starts mid-way)
        self._last_step = 0

    def update(self, step: int, metrics: dict[str, float]) -> str | None:
        now = time.monotonic()
        if self._s0 is None:
            self.every.start(now)
            self._s0, self._last_step = step, step - 1
        if step - self._last_step < self.every_steps and step != self.total:
            return None
        if not self.every.due(now, force=step == self.total):
            return None
        self._last_step = step
        line = f"step {step}/{self.total}" if self.total else f"step {step}"
        for key, label in (("train/loss", "loss"), ("train/mlm_accuracy", "mlm_acc"), ("train/accuracy", "acc")):
            if key in metrics:
                line += f"  {label} {metrics[key]:.4f}"
        if "train/tokens_per_s" in metrics:
            line += f"  {metrics['train/tokens_per_s']:,.0f} tok/s"
        if "train/mfu" in metrics:  # GPU runs only (pipeline.pretrain.metrics.device_peak)
            m = metrics["train/mfu"]
            line += f"  mfu {m:.1%}" if m >= 0.01 else f"  mfu {m:.2%}"  # a tiny model: 0.04%, not 0.0%
        done = step - self._s0
        if self.total and done > 0 and step < self.total:
            eta = self.every.elapsed(now) / done * (self.total - step)
            line += f"  eta {int(eta // 60)}m{int(eta % 60):02d}s"
        say(line, self.out)
        return line


def metric_key(name: str) -> str:
    """A metric's name as MLflow keys it: MLflow's names take no `@`, so the retrieval metrics' contract names
    (`ndcg@10`, the JSON lines' and the suites') are logged as `ndcg_at_10`.

    >>> metric_key("eval/ndcg@10"), metric_key("eval/accuracy")
    ('eval/ndcg_at_10', 'eval/accuracy')
    """
    return name.replace("@", "_at_")


class RunLogger:
    """Logs into one existing run (rank 0 of the Train workers, or the driver). Never logs a metric step twice.

    With `background=True` (the training loops) metrics and tags go through an `Outbox`: a tracking server that
    goes away costs no step and no metric. `pending()` is what is not yet sent, for the checkpoint
    (`pipeline.tracking.outbox.write_pending`), and `pending=` queues what a checkpoint held first."""

    def __init__(
        self,
        run_id: str,
        uri: str | None = None,
        system_metrics_every_s: float | None = None,
        *,
        total_steps: int | None = None,
        log_every_steps: int = 1,
        progress_every_s: float = 10.0,
        background: bool = False,
        pending: dict[str, Any] | None = None,
        show_progress: bool = True,
    ):
        from pipeline.tracking.outbox import Outbox

        self.run_id = run_id
        self.client = client(uri)
        self.progress = Progress(total_steps, log_every_steps, progress_every_s)
        self.show_progress = show_progress  # False: no console line (an evaluation trial; its driver has one)
        self.log_every_steps = log_every_steps
        self._last_step: dict[str, int] = {}
        self.outbox = Outbox(self.client, run_id) if background else None
        if pending and self.outbox is not None:
            rows = [tuple(r) for r in pending.get("metrics", [])]
            self.outbox.put(rows)
            self.outbox.put_tags(pending.get("tags", {}))
            for key, _, _, step in rows:
                self._last_step[key] = max(step, self._last_step.get(key, -1))
        try:
            self._start_ms = self.client.get_run(run_id).info.start_time or int(time.time() * 1000)
        except MlflowException:
            if self.outbox is None:
                raise
            self._start_ms = int(time.time() * 1000)  # the server is away: system metrics' steps count from now
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if system_metrics_every_s:
            self._thread = threading.Thread(target=self._sample_loop, args=(system_metrics_every_s,), daemon=True)
            self._thread.start()

    # -- params / tags / artifacts ---------------------------------------------------------------------------
    def log_params(self, flat: dict[str, Any]) -> None:
        """Log params once; on a resumed run the ones already there (same value) are skipped."""
        have = self.client.get_run(self.run_id).data.params
        params = []
        for k, v in flat.items():
            s = str(v)[:_MAX_PARAM_LEN]
            if k in have:
                continue  # params are immutable in MLflow; a resumed run keeps its first values
            params.append(Param(k, s))
        for i in range(0, len(params), _MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + _MAX_PARAMS_PER_BATCH])

    def set_tags(self, tags: dict[str, Any]) -> None:
        if tags and self.outbox is not None:
            self.outbox.put_tags(tags)
        elif tags:
            self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, path, artifact_path)

    def log_artifacts(self, directory: str, artifact_path: str | None = None) -> None:
        self.client.log_artifacts(self.run_id, directory, artifact_path)

    # -- metrics ---------------------------------------------------------------------------------------------
    def _logged_through(self, key: str) -> int:
        if key not in self._last_step:
            hist = self.client.get_metric_history(self.run_id, key)
            self._last_step[key] = max((m.step for m in hist), default=-1)
        return self._last_step[key]

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Log `metrics` at `step`, dropping keys already logged at this or a later step (a recomputed step); names
        go in as `metric_key` writes them."""
        ts = int(time.time() * 1000)
        metrics = {metric_key(k): v for k, v in metrics.items()}
        if self.outbox is not None:  # the outbox drops what the server already has when it sends
            rows = [
                (k, float(v), ts, int(step))
                for k, v in metrics.items()
                if v is not None and step > self._last_step.get(k, -1)
            ]
            self._last_step.update({k: int(step) for k, *_ in rows})
            self.outbox.put(rows)
            return
        batch = []
        for k, v in metrics.items():
            if v is None or step <= self._logged_through(k):
                continue
            batch.append(Metric(k, float(v), ts, int(step)))
            self._last_step[k] = int(step)
        for i in range(0, len(batch), _MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i : i + _MAX_METRICS_PER_BATCH])

    def step(self, step: int, metrics: dict[str, float]) -> None:
        """A training step's metrics: to MLflow every `log_every_steps` (and the last step), and a console
        progress line at the `Progress` cadence."""
        if step % self.log_every_steps == 0 or step == self.progress.total:
            self.log_metrics(metrics, step)
        if self.show_progress:
            self.progress.update(step, metrics)

    def log_system_metrics(self) -> None:
        """One psutil sample; its step is seconds since the run started, so restarts never collide."""
        step = int(time.time() - self._start_ms / 1000)
        self.log_metrics(_sample_system(), step)

    def _sample_loop(self, every_s: float) -> None:
        import psutil

        psutil.cpu_percent(interval=None)  # prime: the first call always returns 0.0
        while not self._stop.wait(every_s):
            try:
                self.log_system_metrics()
            except Exception:  # noqa: BLE001 - a dropped sample must not kill training
                pass

    def pending(self) -> dict[str, Any]:
        """The metrics and tags not yet sent ({"metrics": [], "tags": {}} without an outbox)."""
        return self.outbox.pending() if self.outbox is not None else {"metrics": [], "tags": {}}

    def close(self, wait_s: float = 10.0) -> bool:
        """Stop the system-metrics sampler and send what the outbox holds (the run stays open): up to 2 minutes
        while the server answers, and no more than `wait_s` seconds once it is found away (also when a send still in
        MLflow's retries finds it so during the wait). True when nothing is left unsent; what is, the last checkpoint
        holds."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.outbox is None:
            return True
        return self.outbox.close(max(wait_s, 120.0), away_timeout=wait_s)

    def finish(self, status: str = "FINISHED") -> None:
        """Stop sampling and mark the run FINISHED / FAILED / KILLED (a run that registered a version stays
        FINISHED, see `_end_status`)."""
        self.close()
        if status != "FINISHED":
            status = _end_status(self.client.get_run(self.run_id).data.tags, status)
        self.client.set_terminated(self.run_id, status=status)
