"""An evaluation suite: one YAML file naming its tasks and the one protocol that scores a model on them.

    name: shared
    protocol: {lrs: [3e-4, 1e-3], seeds: [1, 2, 3], epochs: 3, batch_size: 32, max_seq_length: 128}
    tasks:
      - {name: pydocs_topic, task: sequence-classification, train: tasks/pydocs_topic/train.tsv,
         dev: tasks/pydocs_topic/dev.tsv, metric: accuracy}
      - {name: same_page, task: sentence-pair-classification, train: ..., dev: ..., test: ..., metric: accuracy,
         protocol: {epochs: 2}}

The protocol (docs/evaluation.md says it in full): every task is fine-tuned once per (LR of `lrs`, seed of
`seeds`); the LR whose mean dev score over the seeds is highest is chosen (ties: the earlier LR of the grid); the
task reports mean ± sd over the seeds at that LR, on `test` when the task has one, else on `dev` (GLUE practice).
The suite's score is the mean of its tasks' means. Relative paths in a suite resolve against the suite file's
directory, so a suite runs the same from any working directory. `suite_sha256` is the sha256 of the file's bytes.

Pure: reading, checking and scoring; `pipeline.evaluate.job` runs the trials.
"""

from __future__ import annotations

import hashlib
import math
import posixpath
import statistics
from dataclasses import dataclass, field, fields, replace
from typing import Any

import yaml

from pipeline.config import ConfigError
from pipeline.storage.io import is_uri

TASK_TYPES = (
    "sequence-classification",
    "sentence-pair-classification",
    "token-classification",
    "question-answering",
    "retrieval",
)
"""finetune.py's tasks plus `sentence-pair-classification` (columns sentence1, sentence2, label); `retrieval` is
finetune.py's `embedding`: train is a pairs file, dev and test are BEIR qrels files (`DIR/qrels/dev.tsv`) beside
the set's corpus.jsonl and queries.jsonl."""

METRICS = {
    "sequence-classification": ("accuracy", "macro_f1", "mcc", "pearson", "spearman"),
    "sentence-pair-classification": ("accuracy", "macro_f1", "mcc"),
    "token-classification": ("f1", "precision", "recall", "accuracy"),
    "question-answering": ("f1", "exact"),
    "retrieval": ("ndcg@10", "mrr@10", "recall@100"),
}
"""The metrics a task type can be scored by (what `pipeline.finetune.loop.evaluate` reports for it); pearson and
spearman are a regression task's (numeric labels)."""


@dataclass(frozen=True)
class Protocol:
    """How one task is fine-tuned and scored. Every field can be overridden per task (`protocol:` in a task)."""

    lrs: tuple[float, ...] = (3e-4, 1e-3)
    """The LR grid; the LR with the best mean dev score over the seeds is chosen."""
    seeds: tuple[int, ...] = (1, 2, 3)
    """One fine-tuning run per seed at every LR; the score is their mean ± sd at the chosen LR."""
    epochs: int = 3
    """Passes over the training file; the best epoch by the dev metric is kept (as finetune.py keeps it)."""
    batch_size: int = 32
    """Examples per optimizer step (one worker)."""
    max_seq_length: int = 128
    """Tokens per example."""
    max_train_examples: int | None = None
    """A seeded subset of the training file (null: all of it)."""
    max_eval_examples: int | None = None
    """The first N dev (and test) examples (null: all)."""

    def __post_init__(self) -> None:
        _need(
            len(self.lrs) >= 1 and all(isinstance(x, (int, float)) and 0 < x < math.inf for x in self.lrs),
            f"protocol.lrs {list(self.lrs)} must list one or more LRs > 0",
        )
        _need(len(set(self.lrs)) == len(self.lrs), f"protocol.lrs {list(self.lrs)} lists an LR twice")
        _need(
            len(self.seeds) >= 1 and all(isinstance(s, int) for s in self.seeds),
            f"protocol.seeds {list(self.seeds)} must list one or more integer seeds",
        )
        _need(len(set(self.seeds)) == len(self.seeds), f"protocol.seeds {list(self.seeds)} lists a seed twice")
        for name in ("epochs", "batch_size"):
            _need(
                isinstance(getattr(self, name), int) and getattr(self, name) >= 1,
                f"protocol.{name} {getattr(self, name)!r} must be an integer >= 1",
            )
        _need(
            isinstance(self.max_seq_length, int) and 16 <= self.max_seq_length <= 8192,
            f"protocol.max_seq_length {self.max_seq_length!r} is not in [16, 8192]",
        )
        for name in ("max_train_examples", "max_eval_examples"):
            v = getattr(self, name)
            _need(v is None or (isinstance(v, int) and v >= 1), f"protocol.{name} {v!r} must be null or >= 1")


@dataclass(frozen=True)
class Task:
    """One task of a suite: its files (absolute, or URIs), type, metric and protocol."""

    name: str
    task: str
    train: str
    dev: str
    metric: str
    protocol: Protocol
    test: str | None = None


@dataclass(frozen=True)
class Suite:
    name: str
    path: str
    sha256: str
    protocol: Protocol
    tasks: tuple[Task, ...] = field(default_factory=tuple)

    def num_trials(self, num_models: int) -> int:
        """Trials the suite runs for `num_models` models: models x sum over tasks of LRs x seeds."""
        return num_models * sum(len(t.protocol.lrs) * len(t.protocol.seeds) for t in self.tasks)


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


_PROTOCOL_FIELDS = {f.name for f in fields(Protocol)}


def _protocol(raw: Any, base: Protocol, where: str) -> Protocol:
    _need(isinstance(raw, dict), f"{where}: must be a mapping of {', '.join(sorted(_PROTOCOL_FIELDS))}")
    unknown = sorted(set(raw) - _PROTOCOL_FIELDS)
    _need(not unknown, f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_PROTOCOL_FIELDS))}")
    values = {}
    for k, v in raw.items():
        if k in ("lrs", "seeds"):
            v = tuple(v) if isinstance(v, list) else (v,)
            if k == "lrs":  # YAML reads 1e-3 as a string (no dot): numbers as a person writes them
                try:
                    v = tuple(float(x) for x in v)
                except (TypeError, ValueError):
                    raise ConfigError(f"{where}.lrs {list(v)} must list numbers") from None
        values[k] = v
    try:
        return replace(base, **values)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _resolve(path: Any, base_dir: str, where: str) -> str:
    _need(isinstance(path, str) and path.strip() != "", f"{where} must be a file path")
    if is_uri(path) or posixpath.isabs(path):
        return path
    return posixpath.normpath(posixpath.join(base_dir, path))


def load_suite(path: str) -> Suite:
    """Read and check a suite file; every problem is one ConfigError naming the file and the field.

    Checks the shape only (types, task types, metrics); `check_files` checks the task files.
    """
    from pipeline.storage.io import read_bytes

    try:
        raw_bytes = read_bytes(path)
    except FileNotFoundError:
        raise ConfigError(f"--suite {path}: file does not exist") from None
    try:
        raw = yaml.safe_load(raw_bytes.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        first = str(e).replace("\n", " ")
        raise ConfigError(f"--suite {path}: does not parse as YAML ({first})") from None
    _need(isinstance(raw, dict), f"--suite {path}: must be a mapping with name, protocol and tasks")
    unknown = sorted(set(raw) - {"name", "protocol", "tasks"})
    _need(not unknown, f"--suite {path}: unknown key(s) {', '.join(unknown)} (name, protocol, tasks)")
    name = raw.get("name")
    _need(
        isinstance(name, str) and name.replace("-", "").replace("_", "").isalnum(),
        f"--suite {path}: name {name!r} must be letters, digits, '-' or '_'",
    )
    base = _protocol(raw.get("protocol") or {}, Protocol(), f"--suite {path}: protocol")
    tasks_raw = raw.get("tasks")
    _need(isinstance(tasks_raw, list) and tasks_raw, f"--suite {path}: tasks must be a non-empty list")
    base_dir = posixpath.dirname(path) if is_uri(path) else posixpath.dirname(posixpath.abspath(path))
    tasks: list[Task] = []
    for i, t in enumerate(tasks_raw):
        where = f"--suite {path}: tasks[{i}]"
        _need(isinstance(t, dict), f"{where} must be a mapping")
        unknown = sorted(set(t) - {"name", "task", "train", "dev", "test", "metric", "protocol"})
        _need(not unknown, f"{where}: unknown key(s) {', '.join(unknown)}")
        tname = t.get("name")
        _need(
            isinstance(tname, str) and tname.replace("-", "").replace("_", "").isalnum(),
            f"{where}.name {tname!r} must be letters, digits, '-' or '_'",
        )
        where = f"--suite {path}: task {tname}"
        _need(tname not in {x.name for x in tasks}, f"{where}: named twice")
        kind = t.get("task")
        _need(kind in TASK_TYPES, f"{where}: unknown task type {kind!r}; choose one of {', '.join(TASK_TYPES)}")
        metric = t.get("metric")
        _need(
            metric in METRICS[kind],
            f"{where}: metric {metric!r} does not fit {kind}; choose one of {', '.join(METRICS[kind])}",
        )
        for key in ("train", "dev"):
            _need(key in t, f"{where}: no {key} file")
        tasks.append(
            Task(
                tname,
                kind,
                _resolve(t["train"], base_dir, f"{where}.train"),
                _resolve(t["dev"], base_dir, f"{where}.dev"),
                metric,
                _protocol(t.get("protocol") or {}, base, f"{where}.protocol"),
                _resolve(t["test"], base_dir, f"{where}.test") if t.get("test") is not None else None,
            )
        )
    return Suite(name, path, hashlib.sha256(raw_bytes).hexdigest(), base, tuple(tasks))


# ---------------------------------------------------------------------------------------------------------------
# scoring (pure)


def lr_key(lr: float) -> str:
    """An LR as a stable string key: `lr_key(0.001) -> '0.001'`, `lr_key(3e-05) -> '3e-05'`."""
    return f"{lr:g}"


def choose_lr(dev: dict[float, list[float]]) -> float:
    """The LR with the best mean dev score; ties (and NaN means, which rank last) go to the earlier LR of the grid.

    >>> choose_lr({3e-4: [0.5, 0.7], 1e-3: [0.6, 0.6], 3e-3: [0.2, 0.1]})
    0.0003
    >>> choose_lr({3e-4: [float("nan")], 1e-3: [0.1]})
    0.001
    """

    def mean(xs: list[float]) -> float:
        m = statistics.fmean(xs)
        return m if m == m else -math.inf

    best = max(mean(v) for v in dev.values())
    return next(lr for lr, v in dev.items() if mean(v) == best)


def task_score(
    dev: dict[float, list[float]], reported: dict[float, list[float]], seeds: tuple[int, ...], metric: str
) -> dict[str, Any]:
    """A task's result from its trials: `dev[lr]` and `reported[lr]` (the test scores, or the dev ones again) list
    one score per seed, in `seeds` order. Returns {"metric", "mean", "sd", "lr", "seeds", "scores", "dev_mean"}:
    `sd` is the sample standard deviation (0 for one seed).

    >>> r = task_score({1e-3: [0.5, 0.7]}, {1e-3: [0.5, 0.7]}, (1, 2), "accuracy")
    >>> (round(r["mean"], 6), round(r["sd"], 6), r["lr"], r["seeds"])
    (0.6, 0.141421, 0.001, [1, 2])
    """
    lr = choose_lr(dev)
    scores = reported[lr]
    return {
        "metric": metric,
        "mean": statistics.fmean(scores),
        "sd": statistics.stdev(scores) if len(scores) > 1 else 0.0,
        "lr": lr,
        "seeds": list(seeds),
        "scores": list(scores),
        "dev_mean": statistics.fmean(dev[lr]),
    }


def suite_score(tasks: dict[str, dict[str, Any]]) -> float:
    """The mean of the tasks' means: `suite_score({"a": {"mean": 0.5}, "b": {"mean": 0.7}}) -> 0.6`."""
    return statistics.fmean(t["mean"] for t in tasks.values())


def table(suite: Suite, models: dict[str, dict[str, Any]], markdown: bool = False) -> str:
    """Tasks by models: `mean ± sd` of each task's metric (x100) at its chosen LR, and the suite score.

    `models` is the JSON line's `models` ({SRC: {"score", "tasks": {TASK: {...}}}})."""
    srcs = list(models)
    head = ["task (metric)", *srcs]
    rows = []
    for t in suite.tasks:
        where = "test" if t.test else "dev"
        cells = []
        for s in srcs:
            r = models[s]["tasks"][t.name]
            cells.append(f"{100 * r['mean']:.1f} ± {100 * r['sd']:.1f} (lr {lr_key(r['lr'])})")
        rows.append([f"{t.name} ({t.metric}, {where})", *cells])
    rows.append([f"score ({suite.name})", *(f"{100 * models[s]['score']:.1f}" for s in srcs)])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *map(line, rows)])
