"""Ray Train: the launcher (ScalingConfig / RunConfig / FailureConfig around a per-worker loop) shared by
pretraining and fine-tuning, the run's checkpoints in storage, and what a worker asks of Ray Train (its rank and
device, DDP, reports, the checkpoint to resume from).
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Iterator


@dataclass(frozen=True)
class Scale:
    """How many workers, on what, placed how, recovering from how many failures."""

    num_workers: int = 1
    use_gpu: bool = False
    cpus_per_worker: float = 0.5
    placement_strategy: str = "PACK"
    max_failures: int = 0
    num_to_keep: int = 2
    min_workers: int | None = None
    """Elastic: Ray Train runs on as few as this many workers when no more fit (None: exactly num_workers)."""

    @property
    def workers(self) -> int | tuple[int, int]:
        """What ScalingConfig's num_workers takes: a count, or (min, max) for an elastic run.

        >>> Scale(4).workers, Scale(4, min_workers=2).workers, Scale(4, min_workers=4).workers
        (4, (2, 4), 4)
        """
        if self.min_workers is None or self.min_workers >= self.num_workers:
            return self.num_workers
        return (self.min_workers, self.num_workers)


def fit(
    loop: Callable[[Any], None],
    handoff: Any,
    *,
    name: str,
    storage_path: str,
    scale: Scale,
    datasets: dict[str, Any] | None = None,
    dataset_config: Any = None,
):
    """Run `loop(handoff)` on `scale.num_workers` Ray Train workers (as few as `scale.min_workers` when set: Ray
    Train restarts the group at the size that fits, from the newest checkpoint, and `WorkerCount` prints a line
    each time the size changes; DDP set up by Ray); `handoff` is what the
    driver gives every worker, a frozen dataclass (`PretrainHandoff`, `FinetuneHandoff`), pickled once per worker.
    A run of the same `name` in `storage_path` is resumed from its latest checkpoint. Returns Ray's Result; raises
    its error."""
    import functools

    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig

    from pipeline.cluster.failfast import FailFast
    from pipeline.cluster.resize import WorkerCount

    resources = {"CPU": scale.cpus_per_worker, **({"GPU": 1} if scale.use_gpu else {})}
    elastic = scale.workers
    kwargs: dict[str, Any] = {"datasets": datasets} if datasets else {}
    if dataset_config is not None:
        kwargs["dataset_config"] = dataset_config
    trainer = trainer_class()(
        functools.partial(_noting_traceback, loop, handoff),  # no train_loop_config: Ray Train calls it as it is
        scaling_config=ScalingConfig(
            num_workers=elastic,
            use_gpu=scale.use_gpu,
            resources_per_worker=resources,
            placement_strategy=scale.placement_strategy,
        ),
        run_config=RunConfig(
            name=name,
            storage_path=storage_path,
            failure_config=FailureConfig(max_failures=scale.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=scale.num_to_keep),
            callbacks=[FailFast(), WorkerCount(elastic[0] if isinstance(elastic, tuple) else None)],
            # Ray Train's INFO (worker group start, checkpoints, reports) to its log files only
            logging_config=LoggingConfig(log_level="WARNING"),
        ),
        **kwargs,
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    return result


def trainer_class() -> type:
    """Ray Train's TorchTrainer without two of the helper actors it starts for every run, each a Python process of
    its own (bench/studies/job_cost.py; bench/RESULTS.md "Job cost"):

    - the placement-group cleaner, a detached actor that polls the state API every second so that it can remove the
      workers' placement group if the Train controller dies while the program that called `fit` goes on (a Tune
      trial, a long-lived driver: ray-project/ray#58515). A job of ours ends when its `fit` does, failed or not,
      and a placement group that is not detached goes with its job, so the cleaner has nothing left to clean (and
      a private local cluster no longer needs a dashboard to serve it the state API: `connect`);
    - the dataset manager, which Ray Train starts even for a run without Ray Datasets (fine-tuning's).

    `DataParallelTrainer._create_default_callbacks` is Ray's private method (ray is pinned to 2.60.x in
    pyproject.toml); tests/test_core.py checks the callbacks it leaves, so a Ray that renames either fails there."""
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    class Trainer(TorchTrainer):
        def _create_default_callbacks(self) -> list:
            drop = (PlacementGroupCleanerCallback,) + (() if self.datasets else (DatasetsCallback,))
            return [c for c in super()._create_default_callbacks() if not isinstance(c, drop)]

    return Trainer


def _noting_traceback(loop: Callable[[Any], None], handoff: Any) -> None:
    """`loop(handoff)`, with a user error's traceback kept as a note on it: Ray Train hands the controller (and
    `FailFast`) the bare exception, and the job's failure log shows the note (`pipeline.runner.cli`)."""
    from pipeline.errors import PipelineError

    try:
        loop(handoff)
    except PipelineError as e:
        import traceback

        e.add_note(f"Traceback in the Ray Train worker:\n{traceback.format_exc()}")
        raise


def checkpoint_uri(result, storage_path: str) -> str:
    """The final checkpoint of a Result as a path or URI (a URI storage path gives a path inside its filesystem)."""
    path = result.checkpoint.path
    return path if "://" not in storage_path else f"{storage_path.split('://', 1)[0]}://{path}"


def checkpoints(storage_path: str, name: str) -> list[tuple[str, dict[str, Any] | None, str | None]]:
    """(path or URI, train_state or None, why it is unreadable or None) of every checkpoint of run `name` in
    storage, newest first: highest step (an unreadable train_state.json first: it could be the newest), among
    equal steps the later directory name (Ray Train's names are report times)."""
    from pipeline.storage.io import StorageError, filesystem, join, read_json

    run_dir = join(storage_path, name)
    fs, p = filesystem(run_dir)
    found: list[tuple[float, str, str, dict[str, Any] | None, str | None]] = []
    dirs = [d for d, info in fs.glob(join(p, "checkpoint_*"), detail=True).items() if info["type"] == "directory"]
    for ckpt in dirs:  # (Ray Train's checkpoint_manager_snapshot.json matches the pattern too)
        ckpt = ckpt.rstrip("/")
        uri = ckpt if "://" not in storage_path else f"{storage_path.split('://', 1)[0]}://{ckpt}"
        try:
            state, why = read_json(join(uri, "train_state.json")), None
        except StorageError as e:
            state, why = None, str(e)
        step = int(state.get("step", -1)) if isinstance(state, dict) else float("inf")
        found.append(
            (
                step,
                ckpt.rsplit("/", 1)[-1],
                uri,
                state if isinstance(state, dict) else None,
                why or (None if isinstance(state, dict) else "train_state.json is not a JSON object"),
            )
        )
    return [(uri, state, why) for _, _, uri, state, why in sorted(found, key=lambda f: (f[0], f[1]), reverse=True)]


def worker() -> tuple[int, int, Any]:
    """(rank, world size, torch device) inside a Ray Train worker."""
    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    return ctx.get_world_rank(), ctx.get_world_size(), ray.train.torch.get_device()


def num_nodes(world: int) -> int:
    """How many distinct nodes the workers run on (a collective: every rank must call it)."""
    import ray
    import torch.distributed as dist

    nodes = [ray.get_runtime_context().get_node_id()] * world
    if world > 1:
        dist.all_gather_object(nodes, nodes[0])
    return len(set(nodes))


def prepare_model(model):
    """Move to the worker's device and wrap in DDP when there are several workers (Ray Train's own)."""
    import ray.train.torch

    return ray.train.torch.prepare_model(model)


def uploads_in_background(mode: str, storage_path: str) -> bool:
    """Whether checkpoints go to storage in the background (`train.checkpoint_upload`): "auto" does so for an
    object store (a URI other than file://), where the upload is the slow part; a local or shared disk copies
    in the foreground, as it always did.

    >>> [uploads_in_background("auto", p) for p in ("s3://b/runs", "gs://b/r", "file:///x", "runs", "/mnt/r")]
    [True, True, False, False, False]
    >>> uploads_in_background("sync", "s3://b/runs"), uploads_in_background("async", "runs")
    (False, True)
    """
    if mode == "auto":
        return "://" in storage_path and not storage_path.startswith("file://")
    return mode == "async"


_swept = False


def sweep_checkpoint_dirs(tmp: str | None = None) -> list[str]:
    """Remove the checkpoint directories (`checkpoint_dir`'s, named with their process id) that processes no longer
    alive on this host left in the temporary directory: a worker stopped while it wrote one (a Ctrl-C, a kill) never
    reaches its clean-up. Returns what it removed. A live process's own, and directories named otherwise, stay."""
    import os
    import re
    import shutil

    def dead(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            pass
        return False

    tmp = tmp or tempfile.gettempdir()
    gone = []
    for name in os.listdir(tmp):
        m = re.fullmatch(r"checkpoint-(?:write|upload)-(\d+)-.+", name)
        if m and os.path.isdir(os.path.join(tmp, name)) and dead(int(m.group(1))):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
            gone.append(name)
    return gone


@contextlib.contextmanager
def checkpoint_dir(background: bool) -> Iterator[str]:
    """A fresh local directory to write one checkpoint into before `report`, named with this process's id
    (`checkpoint-write-PID-*`, `checkpoint-upload-PID-*`). In the foreground it is deleted as the block ends (the
    copy in storage is done by then); in the background Ray Train deletes it once its upload is done (`report`),
    so it must outlive the block. A process's first call removes those of processes that died before their
    clean-up (`sweep_checkpoint_dirs`)."""
    import os

    global _swept
    if not _swept:
        sweep_checkpoint_dirs()
        _swept = True
    if not background:
        with tempfile.TemporaryDirectory(prefix=f"checkpoint-write-{os.getpid()}-") as d:
            yield d
        return
    yield tempfile.mkdtemp(prefix=f"checkpoint-upload-{os.getpid()}-")


def report(
    metrics: dict[str, Any], checkpoint_dir: str | None = None, *, background: bool = False, deferred: Any = None
) -> None:
    """Report metrics (and a checkpoint directory, copied into storage by Ray Train) from every rank. With
    `background`, Ray Train's CheckpointUploadMode.ASYNC: the call returns once the ranks agree on the checkpoint's
    name, a Ray Train thread uploads it, then deletes the local directory, and only then registers it (what
    `ray.train.get_checkpoint` and a restart resume from; the worker waits for its uploads before it ends). A
    failed upload fails the worker, as a failed synchronous one does.

    `deferred` (rank 0's, background only): what `save_checkpoint` left to write into the directory
    (`pipeline.core.checkpoint.DeferredFiles`: `write()`, `drop()`). The upload thread writes it first (weights,
    optimizer state, their sha256s, `train_state.json` last), then uploads the directory as Ray Train would
    (`persist_current_checkpoint`); a checkpoint whose write or upload fails is never registered. Ray Train has one
    upload thread (`MAX_CHECKPOINT_UPLOAD_THREADS` 1 in 2.60): checkpoints upload in the order reported."""
    import weakref

    import ray.train
    from ray.train import CheckpointUploadMode

    ckpt = ray.train.Checkpoint.from_directory(checkpoint_dir) if checkpoint_dir else None
    if not (background and ckpt is not None):
        ray.train.report(metrics, checkpoint=ckpt)
        return
    upload = None
    if deferred is not None:
        storage = ray.train.get_context().get_storage()  # (in the training thread: the context is its own)

        def upload(checkpoint, dir_name: str):
            deferred.write()
            return storage.persist_current_checkpoint(checkpoint, dir_name)

        # once Ray Train lets go of `upload` (done, or never submitted: a report it skips while replacing workers),
        # an unwritten snapshot goes with it, and the next checkpoint does not wait for it
        weakref.finalize(upload, deferred.drop)
    try:
        ray.train.report(
            metrics,
            checkpoint=ckpt,
            checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
            delete_local_checkpoint_after_upload=True,
            checkpoint_upload_fn=upload,
        )
    except BaseException:
        if deferred is not None:
            deferred.drop()
        raise


def resume_checkpoint(at_start: list[str] | tuple[str, ...] = (), resume_from: str | None = None):
    """Inside a worker: the checkpoint to resume from. Ray Train's own (the one reported last) when this job reported
    it (a retry after a worker failed: nothing is newer); else `resume_from`, the newest intact checkpoint the driver
    found when the job started (its path or URI; None: start afresh). `at_start`: the names of the run's checkpoint
    directories in storage then. The two differ when Ray's is damaged, and when the run was stopped between writing
    a checkpoint and Ray Train's record of it (its run snapshot, `checkpoint_manager_snapshot.json`): Ray then hands
    an older checkpoint, or none at all, and the run would redo those steps, or all of them, without a word (found
    by a Ctrl-C a moment after a checkpoint: bench/gpu/gpu_e2e.sh's CPU dry run, 2026-11-29)."""
    import posixpath

    import ray.train

    ckpt = ray.train.get_checkpoint()
    ours = None if ckpt is None else posixpath.basename(ckpt.path.rstrip("/"))
    if ckpt is not None and ours not in at_start:
        return ckpt
    if resume_from is None:
        return None
    name = posixpath.basename(resume_from.rstrip("/"))
    if ckpt is None:
        return ray.train.Checkpoint(resume_from)  # the filesystem from the URI, as Ray Train's storage finds it
    if ours == name:
        return ckpt
    return ray.train.Checkpoint(posixpath.join(posixpath.dirname(ckpt.path.rstrip("/")), name), ckpt.filesystem)
