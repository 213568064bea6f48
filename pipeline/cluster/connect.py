"""Ray: connecting (RAY_ADDRESS or a private local cluster, without a dashboard) on free ports, disconnecting,
checking the cluster's resources, and keeping Ray's INFO chatter off the console.

Connecting never joins whatever `ray start` cluster happens to run on the machine: `RAY_ADDRESS` (set by `ray job
submit`; `auto` joins the machine's running cluster) is used when set, else a private local Ray is started. A
RAY_ADDRESS whose cluster is gone is reported in one line after a bounded wait instead of retrying forever.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from typing import Any

from pipeline.config import ConfigError
from pipeline.errors import PipelineError

RAY_DATA_LOGGING = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_data_logging.yaml")


class RayStartError(PipelineError, RuntimeError):
    """Ray could not be started or joined; the message is one line that says which address and why."""

    transient = True


def _gcs_address(address: str) -> str | None:
    """host:port of the GCS that `address` names, when it can be checked with a TCP connect (else None)."""
    if address == "auto":
        try:
            with open("/tmp/ray/ray_current_cluster") as f:
                return f.read().strip() or None
        except OSError:
            return None
    if "://" in address:  # ray:// (Ray Client) and others: left to Ray
        return None
    return address


def _reachable(hostport: str, timeout: float = 5.0) -> bool:
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def free_port(avoid: frozenset[int] = frozenset()) -> int:
    """A loopback port free now, other than Ray's fixed defaults (GCS 6379, dashboard 8265, client server 10001,
    dashboard agent 52365) and `avoid`. Ray refuses to start when it is handed a port that one of its components
    uses by default: the OS drew 52365 for a local cluster's GCS or dashboard port once in CI ("Ray component
    dashboard_agent_http is trying to use a port number 52365 that is used by other components")."""
    from ray._private import ray_constants as rc

    taken = {rc.DEFAULT_PORT, rc.DEFAULT_DASHBOARD_PORT, 10001, rc.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT, *avoid}
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken:
            return port


@contextlib.contextmanager
def _own_address(local: bool):
    """While a local cluster starts: its GCS on a port chosen here and RAY_ADDRESS naming it, so that every Ray
    process it spawns inherits its own address (and Ray Data's logging config: INFO to its log file only). Ray's
    state queries inside workers would otherwise fail with "Found multiple active Ray instances" when other clusters
    run on the machine. The driver's own environment is restored afterwards. Yields the GCS port (None when not
    local)."""
    if not local:
        yield None
        return
    from ray._private.services import get_node_ip_address

    port = free_port()
    with environ(
        RAY_GCS_SERVER_PORT=str(port),
        RAY_ADDRESS=f"{get_node_ip_address()}:{port}",
        RAY_DATA_LOGGING_CONFIG=os.environ.get("RAY_DATA_LOGGING_CONFIG") or RAY_DATA_LOGGING,
    ):
        yield port


@contextlib.contextmanager
def environ(**values: str):
    """Environment variables set while the block runs; the previous values (or their absence) restored after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


IDLE_WORKER_KEEP_MS = 10_000
"""How long a private local cluster keeps an idle Ray worker process beyond Ray's soft limit (Ray's default: 1 s)."""


def connect(num_cpus: int | None = None, *, log_to_driver: bool = True) -> str:
    """`ray.init` on RAY_ADDRESS when set, else on a new private local cluster; returns the address used.
    End with `disconnect()`."""
    import ray

    if ray.is_initialized():
        return "already connected"
    address = os.environ.get("RAY_ADDRESS") or "local"
    if address == "local":
        # One machine that no autoscaler drains: Ray Train's preemption watcher (an actor per run, whose start
        # prints a core-worker error about its constructor arguments on every job's console) has nothing to watch.
        # The cluster's processes inherit this environment; on a real cluster (RAY_ADDRESS) the watcher stays.
        os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
        # Ray keeps as many idle worker processes as the machine has CPUs and kills the others after 1 s idle; a
        # job's bursts of Ray tasks (zero-CPU stage tasks, Ray Data's tasks at fractions of a CPU) then start new
        # ones, each paying Python's and Ray's imports again. Kept 10 s instead: six books prepared twice on Ray on
        # 2 cores started 22 worker processes instead of 34, in 0.58 of the CPU-seconds (a study at b1e6bcb,
        # bench/RESULTS.md "Job cost"); idle workers past the limit still go after 10 s.
        os.environ.setdefault("RAY_idle_worker_killing_time_threshold_ms", str(IDLE_WORKER_KEEP_MS))
    if address != "local":
        gcs = _gcs_address(address)
        if address == "auto" and gcs is None:
            raise RayStartError("RAY_ADDRESS=auto but no running Ray cluster was found on this machine (ray start?)")
        if gcs is not None and not _reachable(gcs):
            raise RayStartError(
                f"no Ray cluster answers at {gcs} (RAY_ADDRESS={address}); start it, or unset "
                f"RAY_ADDRESS to run on a private local Ray"
            )
    try:
        # Workers log Ray's own INFO chatter (Train checkpoints, Data executions) only to the session's log
        # files; the console keeps our progress lines, warnings and errors.
        # A private local cluster has no dashboard: nothing of a job reads Ray's state API (Ray Train's
        # placement-group cleaner did: `pipeline.cluster.train.trainer_class`), and the cluster ends with the job.
        handler = signal.getsignal(signal.SIGTERM)
        with _own_address(address == "local") as gcs_port:
            local = {"num_cpus": num_cpus} if gcs_port else {}
            ray.init(
                address=address,
                configure_logging=False,
                log_to_driver=log_to_driver,
                include_dashboard=False,
                logging_config=ray.LoggingConfig(encoding="TEXT", log_level="WARNING"),
                **local,
            )
        if callable(handler):  # Ray's core worker installs its own (it aborts the process): keep the job's
            signal.signal(signal.SIGTERM, handler)
    except Exception as e:  # noqa: BLE001 - e.g. "node timed out during startup" on an overloaded machine
        # its first line that says something (a failed dashboard's message starts with an empty line), else its type
        why = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise RayStartError(f"could not start or join Ray ({address}): {why}") from None
    return address


def disconnect() -> None:
    """`ray.shutdown()`: a private local cluster stops with it. It runs no dashboard (`connect`), so nothing of it
    is left in the temp directory (the dashboard's multiprocessing forkserver left a `pymp-*` directory a job)."""
    import ray

    ray.shutdown()


def session_log_dir() -> str:
    """The connected Ray session's log directory (where Ray's own logs go), for the job to name once."""
    import ray

    try:
        return str(ray._private.worker._global_node.get_logs_dir_path())  # noqa: SLF001 - no public accessor
    except AttributeError:  # joined a remote cluster: its logs are on its nodes
        return "on the cluster's nodes (/tmp/ray/session_latest/logs)"


def check_local_gpu(section: str, use_gpu: bool) -> None:
    """Before a private local cluster starts (no RAY_ADDRESS, or `local`, and not yet connected): a ConfigError
    when `use_gpu` asks for a GPU that torch on this machine cannot use, the GPUs such a cluster would have.
    One line in about a second, where starting Ray to find out took 10-20 s on 2 cores. On a cluster
    (RAY_ADDRESS) `check_resources` asks the cluster after connecting."""
    import ray

    if not use_gpu or (os.environ.get("RAY_ADDRESS") or "local") != "local" or ray.is_initialized():
        return
    import torch

    if torch.cuda.device_count() < 1:
        raise ConfigError(
            f"{section}.use_gpu is true but the Ray cluster has no GPU (a private local cluster: "
            f"torch {torch.__version__} sees no CUDA device on this machine)"
        )


def check_resources(section: str, *, use_gpu: bool, num_workers: int, cpus_per_worker: float) -> None:
    """Fail at once (ConfigError naming the field) when the connected cluster cannot ever hold the workers,
    rather than waiting forever for resources that do not exist."""
    import ray

    res = ray.cluster_resources()
    if use_gpu and res.get("GPU", 0) < 1:
        raise ConfigError(
            f"{section}.use_gpu is true but the Ray cluster has no GPU "
            f"(resources: {', '.join(f'{k}={v:g}' for k, v in sorted(res.items()) if k in ('CPU', 'GPU'))})"
        )
    if use_gpu and res.get("GPU", 0) < num_workers:
        raise ConfigError(
            f"{section}.num_workers {num_workers} needs {num_workers} GPUs; the cluster has {res.get('GPU', 0):g}"
        )
    need = num_workers * cpus_per_worker
    if res.get("CPU", 0) < need:
        raise ConfigError(
            f"{section}.num_workers {num_workers} x cpus_per_worker {cpus_per_worker:g} = {need:g} CPUs; "
            f"the cluster has {res.get('CPU', 0):g}"
        )


FOOTER_FILES_PER_READER = 10
"""Ray Data's parquet listing reads this many files' footers per batch (RAY_DATA_PARQUET_FOOTER_BATCH_SIZE)."""


def read_parquet(paths: list[str], **kwargs: Any):
    """`ray.data.read_parquet(paths, **kwargs)` with as many footer-reading actors as the files need.

    Ray Data 2.60 lists parquet files by reading their footers on a pool of `FooterReader` actors, 32 of them
    unless RAY_DATA_PARQUET_FOOTER_NUM_ACTORS says otherwise, each a new worker process, started for every read
    and killed after it, however few the files: a job's handful of shards paid for dozens of processes (a read of 4
    files on a 2-core local cluster: 11-12.5 CPU-s with the default, 7-8 with one actor). Here the pool is one
    actor per batch of footers, at most 32, unless the variable is set. The indexer reads the variable once, on
    this process, when the dataset is created; its actors are scheduled wherever Ray puts them."""
    import ray.data

    actors = os.environ.get("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS") or str(
        min(32, max(1, -(-len(paths) // FOOTER_FILES_PER_READER)))
    )
    with environ(RAY_DATA_PARQUET_FOOTER_NUM_ACTORS=actors):
        return ray.data.read_parquet(paths, **kwargs)


def quiet_ray_data() -> None:
    """In this process: Ray Data's and Ray Train's INFO chatter (execution plans, "Dataset ... finished",
    "Reporting training result ...") to their session log files only, and progress bars off (the job prints its
    own progress). Warnings and errors still reach the console."""
    import logging

    import ray.data
    from ray.util.debug import log_once

    ray.data.DataContext.get_current().enable_progress_bars = False
    log_once("ray_data_progress_manager_disabled")  # the notice that bars are off, which we turned off ourselves
    for h in logging.getLogger("ray.data").handlers:
        if not isinstance(h, logging.FileHandler) and "File" not in type(h).__name__:
            h.setLevel(logging.WARNING)
    quiet_ray_train()


def quiet_ray_train() -> None:
    """In this process (a Train worker): Ray Train's "Reporting training result ..." INFO line off the console, and
    its "Error in training function" traceback too: the error reaches the driver inside WorkerGroupError, whose
    text keeps that traceback, and the job prints it as one line and writes it to its failure log
    (`pipeline.runner.cli.run_job`); on the console it would be one traceback per worker and per attempt."""
    import logging

    logging.getLogger("ray.train.v2._internal.util").setLevel(logging.CRITICAL)

    try:  # Ray Train V2 logs each report under its module's file path, not under "ray.train"
        from ray.train.v2._internal.execution import context as train_context

        logging.getLogger(train_context.__file__).setLevel(logging.WARNING)
    except ImportError:
        pass
