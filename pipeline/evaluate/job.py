"""The evaluation job: every model of `--model` fine-tuned on every task of a suite by its protocol
(`pipeline.evaluate.suite`), the trials in parallel on the Ray cluster (`pipeline.finetune.trials`), and the
scorecard stored with the model.

`run_evaluate(cfg, sources, suite)`:

1. Everything is checked on the driver before any trial: each source resolves (`finetune.job.resolve_source`),
   and every task file of the suite is read and tokenized with each model's tokenizer (`prepare_task`: a missing
   or empty file, a missing column, a dev label that train never saw are one line naming the file and row).
2. A registered version that already carries a scorecard of this suite's sha256 (tags `suite.<name>.sha256`,
   `.score`, `.run_id`) is not evaluated again: its scorecard is read back from its evaluation run
   (`suite.force` evaluates it again).
3. One MLflow evaluation run per (model, suite) in `tracking.experiment`, each trial (model, task, LR, seed) a
   nested run of it; all trials go to Tune at once, as many at a time as the cluster's CPUs hold.
4. Each evaluation run gets `suite/<task>/<metric>` (the mean at the chosen LR), `.../<metric>_sd`,
   `suite/score`, the suite file, `scorecard.json` (the job's JSON for the model), and the comparison of all the
   job's models as `scorecard.md` and `scorecard.png`; a registered version gets the tags above.

A trial is the fine-tuning run `jobs/finetune.py` makes with the same LR, seed, epochs and data settings: its
initial head is drawn with `torch.manual_seed(seed)` on the driver, the training subset with the same seed, and it
trains through the same Ray Train run; its score is that run's best epoch (by the task's metric).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.config import ConfigError
from pipeline.console import say
from pipeline.evaluate.suite import Suite, Task, lr_key, suite_score, table, task_score


def tag_keys(suite_name: str) -> dict[str, str]:
    """The version tags of a scorecard.

    >>> tag_keys("shared")
    {'sha256': 'suite.shared.sha256', 'score': 'suite.shared.score', 'run_id': 'suite.shared.run_id'}
    """
    return {k: f"suite.{suite_name}.{k}" for k in ("sha256", "score", "run_id")}


@dataclass
class _Model:
    """One `--model` of the job: its source, and what its trials share."""

    spec: str
    source: Any  # finetune.job.Source
    version: tuple[str, str] | None  # (name, version) when it is a registered version
    run_id: str | None = None
    result: dict[str, Any] | None = None  # its scorecard, when read back instead of evaluated


def _ft_config(cfg, task: Task, lr: float, seed: int):
    """The `FinetuneConfig` of one trial: the job's, with the protocol's fields for this task, LR and seed."""
    from pipeline.finetune.config import FinetuneConfig, FtTuneConfig

    p = task.protocol
    data = replace(
        cfg.data,
        max_seq_length=p.max_seq_length,
        max_train_examples=p.max_train_examples,
        max_eval_examples=p.max_eval_examples,
    )
    train = replace(cfg.train, lr=lr, seed=seed, epochs=p.epochs, batch_size=p.batch_size, max_steps=None)
    return FinetuneConfig(
        data=data,
        model=cfg.model,
        train=train,
        eval=cfg.eval,
        tracking=replace(cfg.tracking, register=False),
        tune=FtTuneConfig(),
    )


def _prepare(task: Task, source, cfg, seed: int, eval_path: str):
    from pipeline.finetune.data import prepare_task

    d = cfg.data
    kind = "embedding" if task.task == "retrieval" else task.task  # a pair task keeps its own: it needs both columns
    return prepare_task(
        kind,
        task.train,
        eval_path,
        source.tokenizer_path,
        task.protocol.max_seq_length,
        d.doc_stride,
        d.max_query_length,
        task.protocol.max_train_examples,
        task.protocol.max_eval_examples,
        seed,
    )


def check_files(suite: Suite) -> None:
    """Every task file exists and is not empty: one ConfigError naming the task and the file, before anything."""
    from pipeline.storage.io import exists, filesystem

    for t in suite.tasks:
        for key in ("train", "dev", "test"):
            path = getattr(t, key)
            if path is None:
                continue
            if not exists(path):
                raise ConfigError(f"--suite {suite.path}: task {t.name}: {key} file {path} does not exist")
            fs, p = filesystem(path)
            if fs.size(p) == 0:
                raise ConfigError(f"--suite {suite.path}: task {t.name}: {key} file {path} is empty")


def _registered(spec: str) -> tuple[str, str] | None:
    if not spec.startswith("models:/"):
        return None
    from pipeline import tracking

    info = tracking.model_version_info(spec)
    return info["name"], str(info["version"])


def scorecard_of(name: str, version: str, suite: Suite, uri: str) -> dict[str, Any] | None:
    """The scorecard of registered version `name`/`version` on this very suite (same sha256), read back from its
    evaluation run; None when it has none."""
    from pipeline import tracking

    c = tracking.client(uri)
    tags = c.get_model_version(name, version).tags
    keys = tag_keys(suite.name)
    if tags.get(keys["sha256"]) != suite.sha256:
        return None
    with tempfile.TemporaryDirectory(prefix="scorecard-") as d:
        return json.loads(Path(c.download_artifacts(tags[keys["run_id"]], "scorecard.json", d)).read_text())


def _source_name(m: _Model) -> str:
    if m.version is not None:
        return f"{m.version[0]}-v{m.version[1]}"
    if m.source.preset is not None:
        return f"scratch-{m.source.preset}"
    if "source_checkpoint_step" in m.source.tags:  # runs/<run>/checkpoint_000012: the run's name and the step
        return f"{Path(m.spec.rstrip('/')).parent.name}-step{m.source.tags['source_checkpoint_step']}"
    return Path(m.spec.rstrip("/")).name


def run_evaluate(cfg, sources: list[str], suite: Suite) -> dict[str, Any]:
    """Score every source on the suite; returns the JSON line's object (`{"suite", "suite_sha256", "models"}`).
    Connects to Ray (`cluster.connect`) unless it already is."""
    import ray

    from pipeline import cluster
    from pipeline.evaluate.checkpoint import export_checkpoint, is_pretraining_checkpoint
    from pipeline.finetune.job import Source, resolve_source
    from pipeline.storage.preflight import check_storage
    from pipeline.tracking import server as tracking_server

    if len(set(sources)) != len(sources):
        raise ConfigError(f"--model lists a source twice: {', '.join(sources)}")
    uri = tracking_server.tracking_uri()
    tracking_server.check_tracking_server(uri)
    check_storage([("MLflow artifact root", tracking_server.artifact_root(uri, cfg.tracking.experiment), "write")])
    check_files(suite)
    work = tempfile.mkdtemp(prefix="evaluate-")  # registry downloads and the scorecard files; removed in every case
    try:
        models: list[_Model] = []
        for i, spec in enumerate(sources):
            if is_pretraining_checkpoint(spec):  # a run's checkpoint: exported as its register stage would
                out_dir = os.path.join(work, f"source{i}", "checkpoint")
                tags = export_checkpoint(spec, out_dir)
                models.append(_Model(spec, Source(spec, out_dir, None, out_dir, tags), None))
                continue
            try:
                version = _registered(spec)
                card = scorecard_of(*version, suite, uri) if version and not cfg.suite.force else None
                if card is not None:  # scored on this very suite already: read back, nothing downloaded
                    models.append(_Model(spec, None, version, card["run_id"], card))
                    say(
                        f"[evaluate] {spec} (models:/{version[0]}/{version[1]}) already has a scorecard of suite "
                        f"{suite.name} (sha256 {suite.sha256[:12]}): score {card['score']:.4f}, MLflow run "
                        f"{card['run_id']}; --suite.force true evaluates it again"
                    )
                    continue
                source = resolve_source(spec, cfg.data.tokenizer, os.path.join(work, f"source{i}"))
            except ConfigError:
                raise
            except Exception as e:  # noqa: BLE001 - a registry that does not know it: one line naming it
                raise ConfigError(f"--model {spec}: does not resolve ({str(e).splitlines()[0]})") from None
            models.append(_Model(spec, source, version))
        todo = [m for m in models if m.result is None]
        # every task file, tokenized for every model still to evaluate, before any trial (bad data: one line)
        data = {
            (m.spec, t.name, s): _prepare(t, m.source, cfg, s, t.dev)
            for m in todo
            for t in suite.tasks
            for s in _seeds_with_own_data(t)
        }
        tests = {
            (m.spec, t.name, s): _prepare(t, m.source, cfg, s, t.test)
            for m in todo
            for t in suite.tasks
            if t.test
            for s in _seeds_with_own_data(t)
        }
        if todo:
            started_ray = not ray.is_initialized()
            cluster.check_local_gpu("train", cfg.train.use_gpu)
            cluster.connect()
            try:
                _evaluate(cfg, suite, todo, data, tests, uri, work)
            finally:
                if started_ray:
                    cluster.disconnect()
        out = {"suite": suite.name, "suite_sha256": suite.sha256, "models": {m.spec: m.result for m in models}}
        _log_comparison(suite, todo, out, uri, work)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _seeds_with_own_data(t: Task) -> tuple[int | None, ...]:
    """The seeds whose training data differs (a seeded subset draws per seed); (None,) when all share it."""
    return t.protocol.seeds if t.protocol.max_train_examples is not None else (None,)


def _open_model_run(cfg, suite: Suite, m: _Model, name: str, uri: str, work: str, opened: list[str]) -> None:
    """The model's evaluation run (`m.run_id`, added to `opened` at once): its tags, the protocol as params, the
    suite file."""
    from pipeline import tracking

    m.run_id = tracking.start_run(
        cfg.tracking.experiment,
        name,
        {**m.source.tags, "suite": suite.name, "suite_sha256": suite.sha256, "source_model": m.spec},
    )
    opened.append(m.run_id)
    logger = tracking.RunLogger(m.run_id, uri)
    logger.log_params(
        {
            "suite": suite.name,
            "suite_sha256": suite.sha256,
            "source": m.spec,
            **{f"protocol.{k}": v for k, v in asdict(suite.protocol).items()},
        }
    )
    logger.log_artifact(_local_copy(suite.path, work), "suite")


def _initial_model(cfg, m: _Model, td: Any, seed: int, vocab: int) -> Any:
    """An object ref to the trial's initial task model (class, config, state dict): the new head drawn with
    `torch.manual_seed(seed)`, as finetune.py draws it."""
    import ray
    import torch

    from pipeline.finetune.job import task_model

    torch.manual_seed(seed)
    model = task_model(m.source, td, dict(cfg.model.overrides), vocab)
    return ray.put({"class": type(model).__name__, "config": asdict(model.config), "state_dict": model.state_dict()})


def _open_trial(cfg, suite: Suite, m: _Model, name: str, trial: tuple, refs: tuple, uri: str, opened: list[str]) -> Any:
    """One trial's nested run (SCHEDULED, its fine-tuning config as params; added to `opened` at once) and its
    `TrialSpec`. `trial` is (task, LR, seed); `refs` (task data, test data or None, initial model) as object refs."""
    from pipeline import tracking
    from pipeline.finetune.loop import FinetuneHandoff
    from pipeline.finetune.trials import TrialSpec

    task, lr, seed = trial
    td_ref, test_ref, init = refs
    run_name = f"{name}-{task.name}-lr{lr_key(lr)}-s{seed}"
    run_id = tracking.start_run(
        cfg.tracking.experiment,
        run_name,
        {
            **m.source.tags,
            "mlflow.parentRunId": m.run_id,
            "suite": suite.name,
            "suite_task": task.name,
            "task": task.task,
            "lr": lr_key(lr),
            "seed": str(seed),
        },
    )
    opened.append(run_id)
    ft = _ft_config(cfg, task, lr, seed)
    tracking.RunLogger(run_id, uri).log_params(
        {
            **ft.flat(),
            "task": task.task,
            "suite_task": task.name,
            "source": m.spec,
            "train_file": task.train,
            "dev_file": task.dev,
            "test_file": task.test or "",
        }
    )
    tracking.client(uri).update_run(run_id, status="SCHEDULED")
    shared = FinetuneHandoff(td_ref, init, uri, task.metric, cfg=ft, run_id=run_id, quiet=True)
    return TrialSpec(
        f"{task.name} lr {lr_key(lr)} seed {seed} of {m.spec}",
        ft,
        shared,
        run_id,
        run_name,
        task.metric,
        test_ref=test_ref,
        keep=False,
    )


def _evaluate(cfg, suite: Suite, todo: list[_Model], data: dict, tests: dict, uri: str, work: str) -> None:
    """Open the runs, run every trial on Tune, score and log."""
    import ray

    from pipeline.finetune.data import load_tokenizer
    from pipeline.finetune.trials import check_trial_resources, end_open, fitting_trials, run_trials, trial_cpus

    t = cfg.train
    cpus = ray.cluster_resources().get("CPU", 0)
    check_trial_resources(t.num_workers, t.cpus_per_worker, cpus, field="train.cpus_per_worker")
    at_once = cfg.suite.max_concurrent_trials or fitting_trials(t.num_workers, t.cpus_per_worker, cpus)
    tag = uuid.uuid4().hex[:6]
    specs: dict[str, Any] = {}  # trial key -> TrialSpec
    where: dict[str, tuple[str, str, float, int]] = {}  # trial key -> (model, task, LR, seed)
    opened: list[str] = []
    status = "FAILED"
    try:
        for m in todo:
            name = f"eval-{suite.name}-{_source_name(m)}-{tag}"
            _open_model_run(cfg, suite, m, name, uri, work, opened)
            vocab = load_tokenizer(m.source.tokenizer_path).get_vocab_size()
            for task in suite.tasks:
                shared_data: dict[int | None, Any] = {}
                for seed in task.protocol.seeds:
                    dkey = seed if task.protocol.max_train_examples is not None else None
                    if dkey not in shared_data:
                        td = data[(m.spec, task.name, dkey)]
                        test = tests.get((m.spec, task.name, dkey))
                        if test is not None:
                            test.train = {}  # the test split's TaskData only evaluates
                        shared_data[dkey] = (td, ray.put(td), ray.put(test) if test is not None else None)
                    td, td_ref, test_ref = shared_data[dkey]
                    init = _initial_model(cfg, m, td, seed, vocab)
                    for lr in task.protocol.lrs:
                        key = f"{len(specs):04d}"
                        refs = (td_ref, test_ref, init)
                        specs[key] = _open_trial(cfg, suite, m, name, (task, lr, seed), refs, uri, opened)
                        where[key] = (m.spec, task.name, lr, seed)
        say(
            f"[evaluate] suite {suite.name} ({len(suite.tasks)} tasks, sha256 {suite.sha256[:12]}): {len(specs)} "
            f"trials for {len(todo)} model(s), {at_once} at a time ({trial_cpus(t.num_workers, t.cpus_per_worker):g} "
            f"CPU each, {cpus:g} CPU in the cluster)"
        )
        reported = run_trials(specs, f"eval-{suite.name}-{tag}", t.storage_path, at_once, uri, prefix="[evaluate]")
        for m in todo:
            m.result = _score(suite, m, reported, where)
            _log_model(suite, m, uri)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if status != "FINISHED":
            end_open(opened, status, uri)


def _score(suite: Suite, m: _Model, reported: dict, where: dict) -> dict[str, Any]:
    """The model's JSON: {"score", "tasks": {TASK: task_score(...)}} from its trials' reports."""
    tasks: dict[str, Any] = {}
    for task in suite.tasks:
        dev: dict[float, list[float]] = {lr: [] for lr in task.protocol.lrs}
        rep: dict[float, list[float]] = {lr: [] for lr in task.protocol.lrs}
        for seed in task.protocol.seeds:
            for lr in task.protocol.lrs:
                key = next(k for k, w in where.items() if w == (m.spec, task.name, lr, seed))
                r = reported[key]
                dev[lr].append(float(r[f"eval/{task.metric}"]))
                rep[lr].append(float(r[f"test/{task.metric}"] if task.test else r[f"eval/{task.metric}"]))
        tasks[task.name] = {
            **task_score(dev, rep, task.protocol.seeds, task.metric),
            "split": "test" if task.test else "dev",
        }
    return {"score": suite_score(tasks), "tasks": tasks, "run_id": m.run_id}


def _log_model(suite: Suite, m: _Model, uri: str) -> None:
    """The scorecard's metrics on the model's evaluation run, and its tags on a registered version."""
    from pipeline import tracking

    logger = tracking.RunLogger(m.run_id, uri)
    metrics = {"suite/score": m.result["score"]}
    for name, r in m.result["tasks"].items():
        metrics[f"suite/{name}/{r['metric']}"] = r["mean"]
        metrics[f"suite/{name}/{r['metric']}_sd"] = r["sd"]
        metrics[f"suite/{name}/lr"] = r["lr"]
    logger.log_metrics(metrics, step=0)
    if m.version is not None:
        keys = tag_keys(suite.name)
        c = tracking.client(uri)
        for k, v in (
            (keys["sha256"], suite.sha256),
            (keys["score"], f"{m.result['score']:.6g}"),
            (keys["run_id"], m.run_id),
        ):
            c.set_model_version_tag(m.version[0], m.version[1], k, v)
        logger.set_tags({"evaluated_model": f"models:/{m.version[0]}/{m.version[1]}"})


def _log_comparison(suite: Suite, evaluated: list[_Model], out: dict, uri: str, work: str) -> None:
    """Each evaluation run this job made: its scorecard.json and the comparison of all the job's models (markdown
    and PNG); then the run is finished."""
    from pipeline import tracking

    md = Path(work, "scorecard.md")
    md.write_text(f"# Suite {suite.name} (sha256 {suite.sha256})\n\n{table(suite, out['models'], markdown=True)}\n")
    png = Path(work, "scorecard.png")
    chart(suite, out["models"], str(png))
    for m in evaluated:
        logger = tracking.RunLogger(m.run_id, uri)
        js = Path(work, "scorecard.json")
        js.write_text(json.dumps(m.result, indent=1, sort_keys=True))
        for f in (js, md, png):
            logger.log_artifact(str(f))
        logger.finish("FINISHED")


def _local_copy(path: str, work: str) -> str:
    from pipeline.storage.io import read_bytes

    dst = Path(work, Path(path).name)
    dst.write_bytes(read_bytes(path))
    return str(dst)


def chart(suite: Suite, models: dict[str, dict[str, Any]], path: str) -> None:
    """A grouped bar chart: each task's mean (x100) per model, with its sd as an error bar, and the suite score."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [t.name for t in suite.tasks] + ["score"]
    srcs = list(models)
    width = 0.8 / max(1, len(srcs))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(names) * max(1, len(srcs)) / 2 + 2), 3.6), dpi=110)
    for i, s in enumerate(srcs):
        r = models[s]
        means = [100 * r["tasks"][n]["mean"] for n in names[:-1]] + [100 * r["score"]]
        sds = [100 * r["tasks"][n]["sd"] for n in names[:-1]] + [0.0]
        xs = [j + (i - (len(srcs) - 1) / 2) * width for j in range(len(names))]
        ax.bar(xs, means, width, yerr=sds, capsize=3, label=s)
    ax.set_xticks(range(len(names)), [f"{n}\n({t.metric})" for n, t in zip(names, suite.tasks)] + ["suite score"])
    ax.set_ylabel("score x 100 (mean ± sd over seeds)")
    ax.set_title(f"suite {suite.name}")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
