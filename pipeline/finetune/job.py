"""Fine-tuning on Ray Train: sequence classification, token classification, extractive QA and sentence embeddings
from a checkpoint.

`run_finetune(cfg, source, task, train, eval)` is the whole job; `jobs/finetune.py` is its command line.

1. Resolve the source (`resolve_source`): `models:/name@alias` / `models:/name/version` (downloaded from the
   MLflow registry into a temporary directory the job removes; lineage tags from its version), a local
   transformers directory, or `scratch:<preset>` (random init; its vocabulary comes from `data.tokenizer`, by
   default the tokenizer of `models:/bert-pretrain@latest-pretrain` — the model the baseline is compared
   against — so both see the same WordPieces).
2. Read, validate and tokenize on the driver (`pipeline.finetune.data.prepare_task`): bad data fails before any
   worker starts. Features and the initial weights go to the workers through the object store, so nothing
   assumes a shared file system.
3. `pipeline.finetune.loop.train_loop_per_worker` trains on the shared core (`pipeline.core`: optimizer and
   schedule, precision, accumulation, checkpoints that resume exactly), evaluates after each epoch and keeps
   the best epoch's model in every checkpoint under `train.storage_path`.
4. The driver adds the tokenizer files and registers the best model (HF directory, safetensors) with tags
   naming the source model version and the pretraining run. A failed run ends FAILED, an interrupted one KILLED.
   An embedding model (`--task embedding`, `pipeline.finetune.embedding`) is registered as a sentence-transformers
   model too, after its retrieval metrics are measured again with the corpus embedded on the cluster
   (`pipeline.finetune.retrieval.evaluate_on_cluster`): those are the job's metrics.

The peak LR is `train.lr`, by default `auto` (`pipeline.finetune.config.resolve_lr`: by the model's hidden size).
With `tune.lr` set, steps 3-4 become a Ray Tune sweep (`pipeline.finetune.sweep`): one trial per LR, each through the
same `fit_run`, and only the best trial's model registered.
"""

from __future__ import annotations

import os
import sys
import shutil
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pipeline.config import ConfigError, resolve_path
from pipeline.console import say
from pipeline.config.sections import _check
from pipeline.finetune.config import FinetuneConfig, resolve_lr
from pipeline.finetune.data import TaskData, load_tokenizer, prepare_task
from pipeline.storage.io import exists, is_uri, local_copy
from pipeline.storage.preflight import check_storage
from pipeline.tracking.server import artifact_root

if TYPE_CHECKING:
    import torch

    from pipeline.finetune.runs import Job

# torch, mlflow, scikit-learn and the loop are imported where training starts: bad input fails in a second or two

TASKS = (
    "sequence-classification",
    "sentence-pair-classification",
    "token-classification",
    "question-answering",
    "embedding",
)
"""`sentence-pair-classification` is sequence classification that requires two text columns (sentence1, sentence2);
`embedding` trains sentence embeddings on query/positive pairs and evaluates them by retrieval on a BEIR set."""
DEFAULT_SCRATCH_TOKENIZER = "models:/bert-pretrain@latest-pretrain"


# ---------------------------------------------------------------------------------------------------------------
# the source checkpoint


@dataclass
class Source:
    """Where the initial weights and the tokenizer come from, and the lineage tags for MLflow."""

    spec: str
    model_dir: str | None  # transformers directory, None for scratch
    preset: str | None  # scratch preset
    tokenizer_path: str  # dir or file holding vocab.txt/tokenizer.json
    tags: dict[str, str] = field(default_factory=dict)


def resolve_source(spec: str, tokenizer: str | None = None, download_dir: str | None = None) -> Source:
    """`models:/...` | local transformers dir | `scratch:<preset>` -> Source. Registry versions are downloaded
    into `download_dir` (the caller removes it), or a new temporary directory when it is None."""
    from pipeline import tracking  # its registry (and mlflow) loads only for models:/ specs

    if spec.startswith("scratch:"):
        from model import MODERNBERT_PRESETS, PRESETS

        preset = spec.split(":", 1)[1]
        known = [*PRESETS, *MODERNBERT_PRESETS]
        _check(preset in known, f"--model {spec}: unknown preset {preset!r}; choose one of {', '.join(known)}")
        tok_spec = tokenizer or DEFAULT_SCRATCH_TOKENIZER
        tags = {"source_model": spec, "scratch_tokenizer": tok_spec}
        if tok_spec.startswith("models:/"):
            try:
                tok_path, tok_tags = tracking.fetch_registered(tok_spec, download_dir)
            except Exception as e:  # noqa: BLE001 - one line for the user
                raise ConfigError(
                    f"--model {spec} takes its vocabulary from {tok_spec}, which failed ({str(e).splitlines()[0]}); "
                    f"pass --data.tokenizer PATH (vocab.txt, tokenizer.json or a checkpoint dir)"
                ) from None
            tags["scratch_tokenizer_model"] = tok_tags["source_model"]
        elif is_uri(tok_spec):  # tokenizers reads local files only: a copy beside the downloads
            _check(exists(tok_spec), f"--data.tokenizer {tok_spec} does not exist")
            tok_dir = download_dir or tempfile.mkdtemp(prefix="finetune-tok-")
            os.makedirs(tok_dir, exist_ok=True)
            tok_path = local_copy(tok_spec, tok_dir)
        else:
            tok_path = resolve_path(tok_spec)
            _check(Path(tok_path).exists(), f"--data.tokenizer {tok_spec} does not exist")
        return Source(spec, None, preset, tok_path, tags)
    if spec.startswith("models:/"):
        local, tags = tracking.fetch_registered(spec, download_dir)
        return Source(spec, local, None, local, tags)
    p = Path(spec)
    _check(
        (p / "config.json").is_file(),
        f"--model {spec}: not models:/name@alias, models:/name/version, "
        f"scratch:<preset>, or a directory with config.json",
    )
    return Source(spec, str(p.resolve()), None, str(p.resolve()), {"source_model": str(p.resolve())})


def task_model(source: Source, td: TaskData, overrides: dict[str, Any], vocab_size: int) -> torch.nn.Module:
    """The class for the task data's task (`td.task`: a pair task trains a sequence-classification head) of the
    source's family with the task's labels: the source's weights (`model.build.load_model`), or a fresh preset
    for scratch (`model.build.build_model`, its pad id the tokenizer's); for `embedding` the bare encoder."""
    from model.build import build_model, load_model
    from model.family import encoder_config

    task = td.task
    head: dict[str, Any] = {"num_labels": td.num_labels, "id2label": td.id2label or None}
    if task == "sequence-classification":
        head["problem_type"] = td.problem_type
    if task == "question-answering":
        head = {"num_labels": 2, "id2label": None}
    if task == "embedding":
        head = {}  # the bare encoder (the family's `embedding` class): no head to initialise
    if source.model_dir is None:  # its vocabulary and pad id are the tokenizer's, not the preset's
        from pipeline.data.specials import specials
        from pipeline.data.tokenizer import load_tokenizer

        pad = specials(load_tokenizer(source.tokenizer_path)).ids["pad"]
        fields = {"vocab_size": vocab_size, "pad_token_id": pad, **head, **overrides}
        return build_model(encoder_config(source.preset, **fields), task)
    model = load_model(source.model_dir, task, **head, **overrides)
    _check(
        model.config.vocab_size >= vocab_size,
        f"the tokenizer has {vocab_size} tokens but the model's vocab_size is {model.config.vocab_size}",
    )
    return model


# ---------------------------------------------------------------------------------------------------------------
# evaluation (pure: model + features -> metrics)

_TASK_SHORT = {
    "sequence-classification": "cls",
    "sentence-pair-classification": "pair",
    "token-classification": "tok",
    "question-answering": "qa",
    "embedding": "emb",
}


def run_name_for(task: str, source: Source) -> str:
    """`<task>-<source>-<6 hex>`, short and safe as a directory name.

    >>> import re; n = run_name_for("sequence-classification", Source("models:/bert-pretrain@latest", "/tmp/x", None,
    ...     "/tmp/x", {"source_model_name": "bert-pretrain", "source_model_version": "3"}))
    >>> re.sub("[0-9a-f]{6}$", "*", n)
    'cls-bert-pretrain-v3-*'
    """
    if "source_model_version" in source.tags:
        src = f"{source.tags['source_model_name']}-v{source.tags['source_model_version']}"
    elif source.preset is not None:
        src = f"scratch-{source.preset}"
    else:
        src = Path(source.spec.rstrip("/")).name
    from pipeline.tracking.runs import run_name

    return run_name(
        _TASK_SHORT[task], src, tag=uuid.uuid4().hex[:6]
    )  # a new run each time: fine-tuning never resumes by name


def run_finetune(
    cfg: FinetuneConfig,
    source_spec: str,
    task: str,
    train_path: str,
    eval_path: str,
    output_dir: str | None = None,
    *,
    on_step: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Fine-tune, evaluate, log and register; returns `{"metrics", "model_dir", "registered", "run_id", "run_name"}`
    (`model_dir` is `output_dir`, or None: without it the exported model lives only in the registry). With
    `tune.lr` set these describe the best trial (its child run), plus `parent_run_id` and `lr`.

    Connects to Ray (`cluster.connect`) unless it already is. `on_step(step, rank)` is a test hook called in
    every worker after each optimizer step (fault injection). Raises FinetuneDataError / ConfigError /
    TrackingError with one-line messages for bad input; the MLflow run ends FAILED on an error and KILLED on
    KeyboardInterrupt (jobs/finetune.py turns SIGTERM into one).
    """
    import ray

    from pipeline import cluster
    from pipeline.tracking import server as tracking_server

    _check(task in TASKS, f"--task {task!r} is not one of {', '.join(TASKS)}")
    d, t = cfg.data, cfg.train
    uri = tracking_server.tracking_uri()
    tracking_server.check_tracking_server(uri)
    check_storage([("MLflow artifact root", artifact_root(uri, cfg.tracking.experiment), "write")])
    work = tempfile.mkdtemp(prefix="finetune-")  # registry downloads and the export; removed in every case
    try:
        # every input is checked here, on the driver, before Ray starts: source, data, then the cluster
        source = resolve_source(source_spec, d.tokenizer, os.path.join(work, "source"))
        say(f"[finetune] {task} from {source_spec}: reading {train_path} and {eval_path}", sys.stdout)
        td = prepare_task(
            task,
            train_path,
            eval_path,
            source.tokenizer_path,
            d.max_seq_length,
            d.doc_stride,
            d.max_query_length,
            d.max_train_examples,
            d.max_eval_examples,
            t.seed,
        )
        if td.retrieval is not None:
            say(
                f"[finetune] {len(td.train['input_ids'])} training pairs; {len(td.eval['input_ids'])} eval queries "
                f"against {len(td.retrieval.doc_ids)} documents",
                sys.stdout,
            )
        else:
            say(
                f"[finetune] {len(td.train['input_ids'])} train / {len(td.eval['input_ids'])} eval features, "
                f"labels {td.id2label or td.problem_type}",
                sys.stdout,
            )
        started_ray = not ray.is_initialized()
        cluster.check_local_gpu("train", t.use_gpu)
        cluster.connect()
        try:
            cluster.check_resources(
                "train", use_gpu=t.use_gpu, num_workers=t.num_workers, cpus_per_worker=t.cpus_per_worker
            )
            return _train_and_register(cfg, source, td, task, train_path, eval_path, output_dir, on_step, uri, work)
        finally:
            if started_ray:
                cluster.disconnect()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _train_and_register(
    cfg: FinetuneConfig,
    source: Source,
    td: TaskData,
    task: str,
    train_path: str,
    eval_path: str,
    output_dir: str | None,
    on_step: Callable[[int, int], None] | None,
    uri: str,
    work: str,
) -> dict[str, Any]:
    """The initial model, then one run at `train.lr` (resolved when `auto`) or a Ray Tune sweep over `tune.lr`."""
    import ray
    import torch

    from pipeline.finetune.loop import FinetuneHandoff
    from pipeline.finetune.metrics import primary_metric
    from pipeline.finetune.runs import Job, with_lr

    torch.manual_seed(cfg.train.seed)  # the new head's initialisation
    vocab_size = load_tokenizer(source.tokenizer_path).get_vocab_size()
    model = task_model(source, td, dict(cfg.model.overrides), vocab_size)
    init = {"class": type(model).__name__, "config": asdict(model.config), "state_dict": model.state_dict()}
    primary = primary_metric(task, td.problem_type)
    tags = {**source.tags, "task": task, "train_file": resolve_path(train_path), "eval_file": resolve_path(eval_path)}
    shared = FinetuneHandoff(ray.put(td), ray.put(init), uri, primary, on_step)
    job = Job(cfg, source, task, td, primary, tags, shared, work, output_dir)
    run_name = cfg.tracking.run_name or run_name_for(task, source)
    if cfg.tune.lr:
        from pipeline.finetune.sweep import run_sweep

        say(f"[finetune] LR from a Ray Tune sweep over tune.lr {', '.join(f'{x:g}' for x in cfg.tune.lr)}", sys.stdout)
        return run_sweep(job, run_name)
    lr, why = resolve_lr(cfg.train.lr, model.config.hidden_size)
    say(f"[finetune] LR {lr:g} ({why})", sys.stdout)
    job.cfg = with_lr(cfg, lr)
    return _single_run(job, run_name, why)


def _single_run(job: Job, run_name: str, lr_source: str) -> dict[str, Any]:
    """The MLflow run around one Ray Train run: params, label map, fit, the best model exported and registered."""
    from pipeline import tracking
    from pipeline.finetune.runs import fit_run
    from pipeline.tracking import server as tracking_server
    from pipeline.tracking.wait import server_needed

    run_id = tracking.start_run(job.cfg.tracking.experiment, run_name, job.tags)
    logger = tracking.RunLogger(run_id, job.shared.tracking_uri)
    say(f"[finetune] MLflow run {run_id} ({run_name}) at {tracking_server.redact(job.shared.tracking_uri)}", sys.stdout)
    status = "FAILED"
    try:
        job.log_inputs(logger, job.cfg, {"train.lr_source": lr_source})
        result = fit_run(job.cfg, job.shared, run_id, run_name)
        with server_needed(job.shared.tracking_uri, job.cfg.tracking.server_wait_s, "register the fine-tuned model"):
            best, out = job.export(result.checkpoint)
            logger.log_metrics({f"best/{k}": v for k, v in best.items()}, step=int(best["step"]))
            registered = job.register(out, best, run_id, logger)
            logger.finish("FINISHED")
        status = "FINISHED"
        return {
            "metrics": best,
            "model_dir": str(out) if job.output_dir else None,
            "registered": registered,
            "run_id": run_id,
            "run_name": run_name,
        }
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if status != "FINISHED":
            try:
                logger.finish(status)
            except Exception:  # noqa: BLE001 - the server may be away; the job's own error matters more
                pass
