"""Where the passes run: a `PassWorker` per process, and two executors behind one interface.

    ex.imap(calls)                    # calls: iterable of (method, args, *tag); yields (call, result) in order
    ex.map(method, args_list, cost)   # the same for a list, costliest submitted first, results in list order
    ex.share(value)                   # a value many calls read (the random pool): sent once where that helps

- `LocalExecutor` (inputs up to data.local_max_bytes): in this process, or on `n` spawned worker processes
  (spawn, not fork: the job may itself run inside a Ray worker, whose threads a fork would copy mid-flight).
  Ray's processes, actor start-ups and object transfers cost tens of CPU-seconds that only pay off across nodes.
- `RayExecutor`: `n` Ray actors placed SPREAD over the cluster's nodes, one `PassWorker` each. Plain actors,
  not Ray Data's map_batches: the units are coarse (whole files, ~4M-character batches, ~1M-token example
  chunks), the driver streams a big file's batches as it reads them (a dataset's items are fixed up front), and
  each actor takes the next unit the moment it is free, so placement never makes one actor queue three units
  while another idles (it did under Ray Data's default queueing in a two-node run).

Both keep at most `per_worker` calls in flight per worker (the driver reads ahead of the workers, no further),
return results in call order, and leave the bytes independent of the executor and the number of workers
(tests/test_executors.py).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from pipeline.config import DataConfig
from pipeline.data import grouping
from pipeline.data.dedup import Edges
from pipeline.data.examples import RandomPool
from pipeline.data.masking import MaskingPolicy
from pipeline.data.passes import (
    Batch,
    encode_pieces,
    examples_for_chunks,
    sign_unit,
    text_path,
    tokenize_file,
    write_shard,
)
from pipeline.data.progress import Progress
from pipeline.data.signing import DedupParams
from pipeline.data.sources import InputFile
from pipeline.data.specials import specials
from pipeline.data.tokenizer import SentenceEncoder, check_pair, read_vocab
from pipeline.storage.io import join

Call = tuple  # (PassWorker method, its arguments, anything the caller wants back with the result)


def _unit(method: Callable) -> Callable:
    """A unit of work: Arrow's allocator releases its freed pages after it (it keeps them otherwise, ~250 MB)."""

    @functools.wraps(method)
    def run(*args: Any) -> Any:
        try:
            return method(*args)
        finally:
            pa.default_memory_pool().release_unused()

    return run


class PassWorker:
    """What one process needs for the passes: the checked tokenizer (its word cache lasts across calls), the
    config, the masking policy. A local worker process or a Ray actor holds one; small arguments only."""

    def __init__(self, tokenizer_path: str, cfg: dict, work: str, vocab_sha: str) -> None:
        # one thread per worker (tokenizers, rensa); the workers are the parallelism
        os.environ.setdefault("RAYON_NUM_THREADS", "1")
        self.cfg = DataConfig(**cfg)
        self.work = work
        vocab_path = join(self.cfg.output, "vocab.txt")
        tok = check_pair(vocab_path, tokenizer_path, vocab_sha)  # both files vs the sha256
        self.tok = SentenceEncoder(tok)
        sp = specials(tok, tokenizer_path)  # the tokenizer's own special tokens and template
        self.policy = MaskingPolicy.from_vocab(
            read_vocab(vocab_path),
            mask_rate=self.cfg.mask_rate,
            max_predictions_per_seq=self.cfg.max_predictions_per_seq,
            whole_word=self.cfg.whole_word_mask,
            specials=sp,
        )
        self.cls_id, self.sep_id, self.middle = sp.ids["cls"], sp.ids["sep"], sp.middle

    # The units of work: each writes its files by rename and returns small stats.

    @_unit
    def sign(self, f: InputFile, path: str) -> dict[str, Any]:
        return sign_unit(f, self.cfg, path, text_path(f, self.work))  # its text kept for `tokenize`

    @_unit
    def tokenize(self, f: InputFile, dropped: dict[int, str] | None = None) -> dict[str, Any]:
        return tokenize_file(f, self.tok, self.cfg, self.work, dropped)

    @_unit
    def encode(self, batch: Batch, path: str) -> dict[str, Any]:
        return encode_pieces(batch, path, self.tok, self.cfg)

    @_unit
    def examples(self, chunks: list[str], pool: RandomPool, dest: str, source: str | None = None) -> dict[str, Any]:
        return examples_for_chunks(
            chunks, pool, self.cfg, self.policy, self.cls_id, self.sep_id, dest, source, self.middle
        )

    @_unit
    def shard(self, path: str, parts: list[tuple[str, int, int]]) -> dict[str, Any]:
        return write_shard(path, parts)


class _Executor:
    """The part both executors share: `map` (cost order, progress lines) on top of each one's `imap`."""

    workers: int
    per_worker = 2

    def imap(self, calls: Iterable[Call]) -> Iterator[tuple[Call, Any]]:
        raise NotImplementedError

    def share(self, value: Any) -> Any:
        return value

    def release(self) -> None:
        """Give the workers' resources back until the next call (a no-op where nothing is reserved)."""

    def duplicate_edges(self, paths: list[str], params: DedupParams) -> tuple[Edges, Edges]:
        """The dedup pass's candidate edges (exact, near) from the records `sign` wrote to `paths`."""
        raise NotImplementedError

    def map(self, method: str, args: list[tuple], cost: list[float] | None = None) -> list[Any]:
        """`method(*a)` for each `a` in `args`, results in that order; the costliest are submitted first (a big
        unit started last would run alone at the end). Logs progress at most every PROGRESS_EVERY_S."""
        order = sorted(range(len(args)), key=lambda i: -cost[i]) if cost else list(range(len(args)))
        progress = Progress(method, "units", len(args))
        results: dict[int, Any] = {}
        for k, (_, r) in enumerate(self.imap((method, args[i]) for i in order)):
            results[order[k]] = r
            progress.step()
        return [results[i] for i in range(len(args))]

    def close(self) -> None:
        pass

    def __enter__(self) -> _Executor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------- local


def local_workers(cfg: DataConfig, files: list[InputFile]) -> int:
    """Processes for a preparation on this machine: data.num_actors, at most the cores, and one per
    LOCAL_WORKER_BYTES of input (a small corpus is prepared in the job's own process, no worker started).

    >>> local_workers(DataConfig(num_actors=8), [InputFile("a", "text", 0, size=5 * 2**20)]) <= 3
    True
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cfg.num_actors, cores, -(-sum(f.size for f in files) // LOCAL_WORKER_BYTES)))


# Bytes of input per local worker process: a worker costs ~0.4 CPU-s to start (interpreter, imports, tokenizer)
# and prepares ~1.4 MB per CPU-second here, so a second one pays off from about 2 MiB.
LOCAL_WORKER_BYTES = 2 * 2**20

_WORKER: PassWorker | None = None  # in a local worker process


def _start_worker(*args: Any) -> None:
    global _WORKER
    _WORKER = PassWorker(*args)


def _in_worker(method: str, *args: Any) -> Any:
    return getattr(_WORKER, method)(*args)


def _started() -> None:
    """A no-op task: submitting one per worker starts them all (ProcessPoolExecutor spawns in `submit`)."""


@contextlib.contextmanager
def _without_main() -> Iterator[None]:
    """Spawned processes re-run the parent's __main__ script (as __mp_main__) before they work: a caller's script
    without an `if __name__ == "__main__"` guard would prepare again in every worker, and a main read from stdin
    cannot be re-run at all. The workers need only the passes, so their start sees a bare __main__."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class LocalExecutor(_Executor):
    """The passes on this machine: in this process (`n == 1`), or on `n` spawned worker processes, all started
    here so they load the tokenizer while the driver plans."""

    def __init__(self, n: int, worker_args: tuple) -> None:
        self.workers = n
        if n == 1:
            self.here: PassWorker | None = PassWorker(*worker_args)
            self.pool = None
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self.here = None
            self.pool = ProcessPoolExecutor(
                n, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker, initargs=worker_args
            )
            with _without_main():
                for _ in range(n):
                    self.pool.submit(_started)

    def where(self) -> str:
        return "in this process" if self.pool is None else f"on {self.workers} local worker processes"

    def duplicate_edges(self, paths: list[str], params: DedupParams) -> tuple[Edges, Edges]:
        return grouping.memory_duplicate_edges(paths, params)

    def imap(self, calls: Iterable[Call]) -> Iterator[tuple[Call, Any]]:
        if self.pool is None:
            for call in calls:
                yield call, getattr(self.here, call[0])(*call[1])
            return
        calls = iter(calls)
        pending: collections.deque = collections.deque()  # (call, future), in call order
        while True:
            while len(pending) < self.per_worker * self.workers:  # read a call only when there is room for it
                call = next(calls, None)
                if call is None:
                    break
                pending.append((call, self.pool.submit(_in_worker, call[0], *call[1])))
            if not pending:
                return
            call, future = pending.popleft()
            yield call, future.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


# ---------------------------------------------------------------------------------------------- Ray


class RayExecutor(_Executor):
    """`n` PassWorker actors SPREAD over the running Ray cluster's nodes (a fraction of a CPU each when the
    cluster has fewer CPUs than actors). An actor that dies is restarted and its calls retried: every unit first
    looks for its finished result and writes by rename, so a retry never doubles anything."""

    def __init__(self, n: int, worker_args: tuple) -> None:
        self.workers, self.worker_args = n, worker_args
        self.actors: list[Any] = []
        self.nodes: list[str] = []
        self._start()

    def _start(self) -> None:
        import ray

        cpus = min(1.0, ray.cluster_resources().get("CPU", 1.0) / max(1, self.workers))
        actor = ray.remote(num_cpus=cpus, scheduling_strategy="SPREAD", max_restarts=2, max_task_retries=2)(_RayWorker)
        self.actors = [actor.remote(*self.worker_args) for _ in range(self.workers)]
        self.nodes = ray.get([a.node.remote() for a in self.actors])

    def release(self) -> None:
        """End the actors, so that other Ray work (the dedup pass's Ray Data grouping) gets their CPUs; the next
        call starts them again."""
        self.close()

    def where(self) -> str:
        return f"on {self.workers} Ray actor(s) on {len(set(self.nodes))} node(s)"

    def share(self, value: Any) -> Any:
        import ray

        return ray.put(value)  # one copy per node; calls receive the value (Ray resolves a top-level ref)

    def imap(self, calls: Iterable[Call]) -> Iterator[tuple[Call, Any]]:
        import ray

        if not self.actors:
            self._start()
        calls = iter(calls)
        load = [0] * self.workers
        in_flight: dict[Any, tuple[int, int, Call]] = {}  # ref -> (sequence number, actor, call)
        ready: dict[int, tuple[Call, Any]] = {}  # finished, waiting for the ones before them
        submitted = returned = 0
        more = True
        while True:
            while more and min(load) < self.per_worker and len(in_flight) + len(ready) < self.per_worker * self.workers:
                call = next(calls, None)
                if call is None:
                    more = False
                    break
                a = load.index(min(load))
                method = getattr(self.actors[a], call[0])  # by name: the state API and dashboard show the pass
                in_flight[method.remote(*call[1])] = (submitted, a, call)
                load[a] += 1
                submitted += 1
            if returned in ready:
                yield ready.pop(returned)
                returned += 1
                continue
            if not in_flight:
                return
            [ref], _ = ray.wait(list(in_flight), num_returns=1)
            seq, a, call = in_flight.pop(ref)
            load[a] -= 1
            ready[seq] = (call, ray.get(ref))

    def duplicate_edges(self, paths: list[str], params: DedupParams) -> tuple[Edges, Edges]:
        """The dedup pass's grouping: up to `grouping.MEMORY_GROUPING_MAX_RECORDS` records here, more on Ray Data
        across the cluster (the actors ended first: Ray Data's tasks need their CPUs). The same edges either way."""
        from pipeline.cluster import quiet_ray_data

        rows = grouping.count_records(paths)
        if rows <= grouping.MEMORY_GROUPING_MAX_RECORDS:
            return grouping.memory_duplicate_edges(paths, params)
        quiet_ray_data()  # the "[data]" lines are this stage's progress
        self.release()
        return grouping.ray_duplicate_edges(paths, params, rows)

    def close(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []


class _RayWorker(PassWorker):
    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def make_executor(cfg: DataConfig, files: list[InputFile], worker_args: tuple, local: bool) -> _Executor:
    """A LocalExecutor for inputs up to data.local_max_bytes (`local`), else a RayExecutor of data.num_actors
    actors on the running cluster (started here when none is)."""
    if local:
        return LocalExecutor(local_workers(cfg, files), worker_args)
    import ray

    if not ray.is_initialized():
        ray.init()
    return RayExecutor(cfg.num_actors, worker_args)
