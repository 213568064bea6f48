"""The stage graph: a few named stages with declared dependencies, run as Ray tasks; deliberately thin.

    vocab ──► shards ──► validate ──► train ──► evaluate ──► register

A `Stage` has a function (called with {dependency name: its result}), the names of the stages it depends on,
and optionally a `done` check and a `hold` (a lock the driver takes before that check and keeps until the graph
ends, e.g. on a run's storage directory, so that two jobs never do the same stage at once). The graph keeps
**no state of its own**: a stage is skipped only when `done()` finds its real output complete — a validated
manifest with the same config hash, a finished Ray Train run of that name in storage, a registry version in the
*current* tracking store tagged with the training run id — and then `done()`'s value is its result. Nothing
can go stale because nothing is recorded beside the outputs.

Stages whose dependencies are complete run concurrently as Ray tasks, each reserving `num_cpus`/`num_gpus`
(0 by default: the Ray Data or Ray Train work a stage starts reserves its own resources; a stage that computes
itself, like the final evaluation, reserves what it uses). This replaces Ray Workflows (removed in Ray 2.60).

    >>> g = [Stage("a", lambda deps: 1), Stage("b", lambda deps: deps["a"] + 1, deps=("a",))]
    >>> run_graph(g, remote=False, log=lambda m: None)["b"].result
    2
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Stage:
    name: str
    fn: Callable[[dict[str, Any]], Any]
    """Called with {dependency name: its result}; returns the stage's result."""
    deps: tuple[str, ...] = ()
    done: Callable[[dict[str, Any]], Any] | None = None
    """Called with the dependencies' results; returns the stage's result when its real output proves it
    complete, else None."""
    num_cpus: float = 0
    """CPUs the stage's Ray task holds while it runs."""
    num_gpus: float = 0
    describe: Callable[[Any], str] | None = None
    """The result's key figures for the console line that ends the stage (documents, examples, accuracy...)."""
    hold: Callable[[dict[str, Any]], contextlib.AbstractContextManager] | None = None
    """Called with the dependencies' results before `done`; the context it returns is entered on the driver and
    left when the graph ends (a lock that covers this stage and the ones after it)."""


@dataclass
class StageResult:
    name: str
    status: str  # "ran" | "skipped"
    seconds: float
    result: Any = field(default=None, repr=False)


def topological_order(stages: list[Stage]) -> list[Stage]:
    """Stages ordered so that each comes after its dependencies; unknown dependencies and cycles are errors."""
    by_name = {s.name: s for s in stages}
    if len(by_name) != len(stages):
        raise ValueError("stage names must be unique")
    order: list[Stage] = []
    state: dict[str, int] = {}  # 1 = visiting, 2 = placed

    def visit(s: Stage) -> None:
        if state.get(s.name) == 2:
            return
        if state.get(s.name) == 1:
            raise ValueError(f"stage graph has a cycle through {s.name!r}")
        state[s.name] = 1
        for d in s.deps:
            if d not in by_name:
                raise ValueError(f"stage {s.name!r} depends on unknown stage {d!r}")
            visit(by_name[d])
        state[s.name] = 2
        order.append(s)

    for s in stages:
        visit(s)
    return order


def run_graph(
    stages: list[Stage], *, remote: bool = True, log: Callable[[str], None] = print
) -> dict[str, StageResult]:
    """Run the graph; returns {name: StageResult} in topological order. A failing stage raises; nothing
    downstream of it runs."""
    with contextlib.ExitStack() as held:
        return _run(stages, remote, log, held)


def _run(
    stages: list[Stage], remote: bool, log: Callable[[str], None], held: contextlib.ExitStack
) -> dict[str, StageResult]:
    order = topological_order(stages)
    results: dict[str, StageResult] = {}
    pending: dict[Any, tuple[Stage, float]] = {}  # ray ref -> (stage, start)
    remaining = list(order)
    if remote:
        import ray

    def figures(s: Stage, res: Any) -> str:
        return f": {s.describe(res)}" if s.describe is not None else ""

    def finish(s: Stage, start: float, res: Any) -> None:
        results[s.name] = StageResult(s.name, "ran", time.perf_counter() - start, res)
        log(f"[stage {s.name}] done in {results[s.name].seconds:.1f}s{figures(s, res)}")

    def launch_ready() -> None:
        progressed = True
        while progressed:
            progressed = False
            for s in [s for s in remaining if all(d in results for d in s.deps)]:
                remaining.remove(s)
                inputs = {d: results[d].result for d in s.deps}
                if s.hold is not None:
                    held.enter_context(s.hold(inputs))
                res = s.done(inputs) if s.done is not None else None
                if res is not None:
                    log(f"[stage {s.name}] up to date, skipped{figures(s, res)}")
                    results[s.name] = StageResult(s.name, "skipped", 0.0, res)
                    progressed = True
                    continue
                log(f"[stage {s.name}] running")
                start = time.perf_counter()
                if remote:
                    task = ray.remote(num_cpus=s.num_cpus, num_gpus=s.num_gpus, max_retries=0)(s.fn)
                    pending[task.remote(inputs)] = (s, start)
                else:
                    finish(s, start, s.fn(inputs))
                    progressed = True

    launch_ready()
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        s, start = pending.pop(ready[0])
        finish(s, start, ray.get(ready[0]))  # re-raises the stage's error
        launch_ready()
    return {s.name: results[s.name] for s in order}


def summary_table(results: dict[str, StageResult]) -> str:
    rows = [("stage", "status", "seconds")] + [(r.name, r.status, f"{r.seconds:.1f}") for r in results.values()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows)
