"""The stage graph: a few named stages, each a piece of Ray work, keyed by a hash of its config and its inputs.

    vocab ──► examples/shards ──► validate ──► train ──► evaluate ──► export/register

A `Stage` has a function, a JSON-able config and the names of the stages it depends on. Its key is
sha256(name, config, keys of its dependencies' results), so changing a config invalidates exactly the stages
downstream of it. A stage whose key has a completion record is skipped and its recorded result reused; a stage
can also say by itself that its output is complete (`Stage.done`, e.g. a data manifest with the same config
hash). Stages whose dependencies are complete run concurrently as Ray tasks (`num_cpus=0` by default: the work
they launch — Ray Data, Ray Train — asks for its own resources). This replaces Ray Workflows (removed in Ray
2.60); it is deliberately small.

    >>> g = [Stage("a", lambda deps: 1, {"x": 1}), Stage("b", lambda deps: deps["a"] + 1, {}, deps=("a",))]
    >>> run_graph(g, "/tmp/state", remote=False)["b"].result
    2
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pipeline.config import config_hash


@dataclass
class Stage:
    name: str
    fn: Callable[[dict[str, Any]], Any]
    """Called with {dependency name: its result}; returns a JSON-able result."""
    config: Any = None
    """JSON-able (or a dataclass); part of the stage's key."""
    deps: tuple[str, ...] = ()
    num_cpus: float = 0
    """CPUs the stage's Ray task itself holds; 0 because the Ray work it starts reserves its own."""
    done: Callable[[str], Any] | None = None
    """Optional: given the key, return the stage's result if its output is already complete, else None."""
    cache: bool = True
    """False for stages that must always run (nothing recorded)."""


@dataclass
class StageResult:
    name: str
    key: str
    status: str  # "ran" | "skipped"
    seconds: float
    result: Any = field(default=None, repr=False)


def _order(stages: list[Stage]) -> list[Stage]:
    by_name = {s.name: s for s in stages}
    if len(by_name) != len(stages):
        raise ValueError("stage names must be unique")
    for s in stages:
        for d in s.deps:
            if d not in by_name:
                raise ValueError(f"stage {s.name!r} depends on unknown stage {d!r}")
    order: list[Stage] = []
    seen: set[str] = set()
    visiting: set[str] = set()

    def visit(s: Stage) -> None:
        if s.name in seen:
            return
        if s.name in visiting:
            raise ValueError(f"stage graph has a cycle through {s.name!r}")
        visiting.add(s.name)
        for d in s.deps:
            visit(by_name[d])
        visiting.discard(s.name)
        seen.add(s.name)
        order.append(s)

    for s in stages:
        visit(s)
    return order


def stage_key(stage: Stage, dep_keys: list[str]) -> str:
    return config_hash({"stage": stage.name, "config": stage.config, "deps": dep_keys})


def _record_path(state_dir: str, name: str, key: str) -> Path:
    return Path(state_dir) / name / f"{key}.json"


def _load_record(state_dir: str, stage: Stage, key: str) -> tuple[bool, Any]:
    if stage.done is not None:
        res = stage.done(key)
        if res is not None:
            return True, res
    p = _record_path(state_dir, stage.name, key)
    if stage.cache and p.is_file():
        return True, json.loads(p.read_text())["result"]
    return False, None


def _write_record(state_dir: str, stage: Stage, key: str, result: Any) -> None:
    if not stage.cache:
        return
    p = _record_path(state_dir, stage.name, key)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"stage": stage.name, "key": key, "result": result}, default=str))
    os.replace(tmp, p)  # the record appears whole or not at all


def run_graph(
    stages: list[Stage],
    state_dir: str,
    *,
    remote: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, StageResult]:
    """Run the graph; returns {name: StageResult}. A failing stage raises and nothing downstream runs."""
    order = _order(stages)
    by_name = {s.name: s for s in order}
    results: dict[str, StageResult] = {}
    pending: dict[Any, tuple[Stage, str, float]] = {}  # ray ref -> (stage, key, start)
    remaining = list(order)

    if remote:
        import ray

    def launch_ready() -> None:
        for s in list(remaining):
            if not all(d in results for d in s.deps):
                continue
            remaining.remove(s)
            key = stage_key(s, [results[d].key for d in s.deps])
            done, res = _load_record(state_dir, s, key)
            if done:
                log(f"[stage {s.name}] up to date ({key[:12]}), skipped")
                results[s.name] = StageResult(s.name, key, "skipped", 0.0, res)
                launch_ready()
                return
            inputs = {d: results[d].result for d in s.deps}
            log(f"[stage {s.name}] running ({key[:12]})")
            start = time.perf_counter()
            if remote:
                ref = ray.remote(num_cpus=s.num_cpus, max_retries=0)(s.fn).remote(inputs)
                pending[ref] = (s, key, start)
            else:
                res = s.fn(inputs)
                _finish(s, key, start, res)
                launch_ready()
                return

    def _finish(s: Stage, key: str, start: float, res: Any) -> None:
        secs = time.perf_counter() - start
        _write_record(state_dir, s, key, res)
        results[s.name] = StageResult(s.name, key, "ran", secs, res)
        log(f"[stage {s.name}] done in {secs:.1f}s")

    launch_ready()
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        s, key, start = pending.pop(ready[0])
        _finish(s, key, start, ray.get(ready[0]))  # re-raises the stage's error
        launch_ready()
    return {name: results[name] for name in by_name}


def summary_table(results: dict[str, StageResult]) -> str:
    rows = [("stage", "status", "seconds", "key")]
    rows += [(r.name, r.status, f"{r.seconds:.1f}", r.key[:12]) for r in results.values()]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows)


# ---------------------------------------------------------------------------------------------- the data stages

from pipeline.config import Config, DataConfig  # noqa: E402  (appended section; annotations only)


def data_stages(cfg: DataConfig) -> list[Stage]:
    """vocab -> shards -> validate for one DataConfig (paths already absolute, see config.resolve_paths).

    The shards stage is complete when `output/manifest.json` carries the same config hash (config fields,
    input fingerprint, given vocabulary) and vocab; an output prepared with a different config is an error
    unless `cfg.overwrite`. "validate" always runs (checksums) and returns the dict downstream stages use.
    """
    from pipeline import shards as data_job

    plan = data_job.plan(cfg)  # lists inputs, checks the output dir: fails fast, before any stage writes
    vocab = Stage(
        "vocab",
        lambda deps: data_job.run_vocab(plan),
        {"vocab": plan.vocab_key},
        done=lambda key: data_job.vocab_done(plan),
        cache=False,
    )
    shards = Stage(
        "shards",
        lambda deps: data_job.run_shards(plan, deps["vocab"]),
        {"config_hash": plan.config_hash},
        deps=("vocab",),
        done=lambda key: data_job.shards_done(plan),
        cache=False,
    )
    validate = Stage(
        "validate",
        lambda deps: data_job.run_validate(plan),
        {"config_hash": plan.config_hash},
        deps=("shards",),
        cache=False,
    )
    return [vocab, shards, validate]


# ---------------------------------------------------------------------------------------------- the pretraining stages


def phase_data_configs(cfg: Config) -> list[DataConfig]:
    """One DataConfig per training phase: phase i's max_seq_length, masking cap and output directory.

    Phases after the first reuse the first phase's vocabulary, so all phases share one embedding table.
    """
    import dataclasses

    from pipeline.config import resolve_path

    if not cfg.train.phases:
        return [cfg.data]
    out = []
    for i, ph in enumerate(cfg.train.phases):
        changes: dict[str, Any] = {"max_seq_length": ph.max_seq_length,
                                   "output": resolve_path(ph.output) if ph.output else f"{cfg.data.output}-{ph.max_seq_length}"}
        if ph.max_predictions_per_seq:
            changes["max_predictions_per_seq"] = ph.max_predictions_per_seq
        if i > 0 and cfg.data.vocab is None:
            changes["vocab"] = f"{out[0].output}/vocab.txt"
        out.append(dataclasses.replace(cfg.data, **changes))
    return out


def _nested_data_stage(name: str, dcfg: DataConfig, state_dir: str, deps: tuple[str, ...]) -> Stage:
    """A later phase's data stages, planned when they run (their vocabulary is the first phase's output)."""

    def fn(_deps: dict[str, Any]) -> Any:
        res = run_graph(data_stages(dcfg), state_dir, remote=False)
        return res["validate"].result

    return Stage(name, fn, {"data": dcfg}, deps=deps, cache=False)


def pretrain_stages(cfg: Config, state_dir: str, *, git_sha: str = "unknown", tracking_uri: str | None = None) -> list[Stage]:
    """data (per phase) -> train -> evaluate -> register, for a config whose paths are absolute.

    The MLflow run is created in the train stage (the Ray Train driver) under a run name derived from the config
    hash unless `train.run_name` is set; re-running the same command resumes it from its last checkpoint.
    """
    from pipeline import train as pretrain  # stage bodies live beside the loop

    from pipeline.tracking import tracking_uri as default_uri

    uri = tracking_uri or default_uri()  # absolute: the stages run as Ray tasks with another cwd
    data_cfgs = phase_data_configs(cfg)
    stages = data_stages(data_cfgs[0])
    data_deps = ["validate"]
    for i, dcfg in enumerate(data_cfgs[1:], start=1):
        stages.append(_nested_data_stage(f"data_phase{i}", dcfg, state_dir, ("validate",)))
        data_deps.append(f"data_phase{i}")
    run_name = cfg.train.run_name or pretrain.default_run_name(cfg)
    key_cfg = {"model": cfg.model, "train": cfg.train, "experiment": cfg.tracking.experiment, "run_name": run_name}
    train = Stage(
        "train",
        lambda deps: pretrain.train_stage(cfg, [deps[d] for d in data_deps], run_name, git_sha, uri),
        key_cfg,
        deps=tuple(data_deps),
    )
    evaluate = Stage(
        "evaluate",
        lambda deps: pretrain.evaluate_stage(cfg, deps["train"], deps[data_deps[-1]], uri),
        {"eval": "final-held-out"},
        deps=("train", data_deps[-1]),
    )
    register = Stage(
        "register",
        lambda deps: pretrain.register_stage(cfg, deps["train"], deps["validate"], git_sha, uri),
        {"model_name": cfg.tracking.model_name, "alias": cfg.tracking.alias},
        deps=("train", "evaluate", "validate"),
    )
    return [*stages, train, evaluate, register]
