"""One console line each time Ray Train starts a run's worker group at another size.

With `train.min_workers` Ray Train's elastic scaling (`ScalingConfig(num_workers=(min, max))`) restarts the worker
group from the newest checkpoint at whatever size the cluster holds: smaller after a node is lost for good,
larger when capacity returns. The workers resume at any size (`pipeline.pretrain.loader`); `WorkerCount`, a
callback in Ray Train's controller, says when the size changed. It hooks the worker group's start, which Ray
Train's public `UserCallback` does not offer (its `WorkerGroupCallback`, a developer API).
"""

from __future__ import annotations

from ray.train.v2._internal.execution.callback import WorkerGroupCallback

from pipeline.console import say


class WorkerCount(WorkerGroupCallback):
    """Before each worker-group start: a line when the size differs from the last start's (and, for an elastic
    run, at the first start, with its range).

    >>> w = WorkerCount(min_workers=1)
    >>> for n in (2, 2, 1, 2):
    ...     w.started(n)
    '[train] 2 workers (elastic: train.min_workers 1)'
    '[train] worker count 2 -> 1: resuming from the newest checkpoint'
    '[train] worker count 1 -> 2: resuming from the newest checkpoint'
    """

    def __init__(self, min_workers: int | None = None) -> None:
        self.min_workers, self.last = min_workers, None

    def started(self, n: int) -> str | None:
        """The line for a group of `n` workers starting now, or None."""
        last, self.last = self.last, n
        if last is None:
            return f"[train] {n} workers (elastic: train.min_workers {self.min_workers})" if self.min_workers else None
        if n != last:
            return f"[train] worker count {last} -> {n}: resuming from the newest checkpoint"
        return None

    def before_worker_group_start(self, worker_group_context) -> None:
        if (line := self.started(worker_group_context.num_workers)) is not None:
            say(line)
