"""Fine-tuning on Ray Train: sequence classification, token classification and extractive QA from a checkpoint.

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

The peak LR is `train.lr`, by default `auto` (`resolve_lr`: by the model's hidden size, `AUTO_LR`). With `tune.lr`
set, steps 3-4 become a Ray Tune sweep (`pipeline.finetune.sweep`): one trial per LR, each through the same
`fit_run`, and only the best trial's model registered.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import torch

from pipeline.config import ConfigError, flatten, load_sections, resolve_path
from pipeline.core.precision import Precision
from pipeline.finetune.metrics import primary_metric
from pipeline.finetune.data import TaskData, load_tokenizer, prepare_task
from pipeline.finetune.runs import Job, fit_run, with_lr

TASKS = ("sequence-classification", "token-classification", "question-answering")
DEFAULT_SCRATCH_TOKENIZER = "models:/bert-pretrain@latest-pretrain"


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


# ---------------------------------------------------------------------------------------------------------------
# configuration


@dataclass
class FtDataConfig:
    """How task files are tokenized and subsetted."""

    max_seq_length: int = 128
    """Tokens per example (per QA window) including [CLS]/[SEP]; batches are padded to their longest row."""
    doc_stride: int = 32
    """QA: context tokens shared by consecutive windows (transformers' run_qa `doc_stride`)."""
    max_query_length: int = 64
    """QA: question tokens kept."""
    max_train_examples: int | None = None
    """Seeded random subset of the training file (null: all); for quick runs and CI."""
    max_eval_examples: int | None = None
    """First N eval examples (null: all)."""
    tokenizer: str | None = None
    """scratch:<preset> only: vocab.txt / tokenizer.json / checkpoint dir / models:/ URI; null means
    models:/bert-pretrain@latest-pretrain so the baseline uses the pretrained model's vocabulary."""

    def __post_init__(self) -> None:
        _check(16 <= self.max_seq_length <= 4096, f"data.max_seq_length {self.max_seq_length} is not in [16, 4096]")
        _check(self.doc_stride >= 0, f"data.doc_stride {self.doc_stride} < 0")  # QA checks it against the window


@dataclass
class FtModelConfig:
    """BertConfig fields that differ from the checkpoint's (e.g. `--model.overrides.hidden_dropout_prob 0.0`)."""

    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class FtTrainConfig:
    """Ray Train scale, optimisation, precision, checkpoints and fault tolerance."""

    num_workers: int = 1
    """Ray Train workers (DDP across them)."""
    use_gpu: bool = False
    """One GPU per worker when true; the job fails at once (one line) on a cluster without one."""
    cpus_per_worker: float = 0.5
    """CPUs reserved per worker; fractional so a 2-core machine can hold the workers and Ray's own actors."""
    torch_threads: int | None = None
    """Intra-op threads per CPU worker; null: this machine's cores divided by num_workers."""
    epochs: int = 3
    max_steps: int | None = None
    """Optimizer steps in total; when set it overrides `epochs` (the last epoch may be partial)."""
    batch_size: int = 32
    """Examples per forward/backward (micro-batch) on each worker."""
    accumulation_steps: int = 1
    """Micro-batches per optimizer step; the global batch is batch_size * num_workers * accumulation_steps."""
    eval_batch_size: int = 64
    optimizer: Literal["adamw", "lamb"] = "adamw"
    lr: float | Literal["auto"] = "auto"
    """Peak LR; `auto` picks it by the model's hidden size (`AUTO_LR`); a number wins."""
    warmup_ratio: float = 0.1
    """Fraction of the total steps with linear warmup."""
    weight_decay: float = 0.01
    schedule: Literal["linear", "polynomial", "constant"] = "linear"
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 disables clipping)."""
    precision: Precision = "fp32"
    """bf16 autocast (GPU or CPU), fp16 autocast with a gradient scaler (GPU), or fp32."""
    log_every_steps: int = 1
    checkpoint_every_steps: int | None = None
    """Also checkpoint every N steps within an epoch (null: at the end of each epoch only)."""
    max_failures: int = 0
    """Worker failures Ray Train recovers from (restart from the last checkpoint); -1 = unlimited."""
    seed: int = 42
    storage_path: str = "runs"
    """Where Ray Train keeps the run's checkpoints (local path, relative to the current directory, or URI)."""

    def __post_init__(self) -> None:
        _check(self.num_workers >= 1, f"train.num_workers {self.num_workers} < 1")
        _check(self.cpus_per_worker > 0, f"train.cpus_per_worker {self.cpus_per_worker} must be > 0")
        _check(self.epochs >= 1, f"train.epochs {self.epochs} < 1")
        _check(self.max_steps is None or self.max_steps >= 1, f"train.max_steps {self.max_steps} < 1")
        _check(self.batch_size >= 1, f"train.batch_size {self.batch_size} < 1")
        _check(self.accumulation_steps >= 1, f"train.accumulation_steps {self.accumulation_steps} < 1")
        _check(self.eval_batch_size >= 1, f"train.eval_batch_size {self.eval_batch_size} < 1")
        _check(self.lr == "auto" or 0 < self.lr < math.inf, f"train.lr {self.lr} must be > 0")
        _check(0 <= self.warmup_ratio < 1, f"train.warmup_ratio {self.warmup_ratio} not in [0, 1)")
        _check(self.max_grad_norm >= 0, f"train.max_grad_norm {self.max_grad_norm} < 0")
        _check(self.log_every_steps >= 1, f"train.log_every_steps {self.log_every_steps} < 1")
        _check(self.checkpoint_every_steps is None or self.checkpoint_every_steps >= 1,
               f"train.checkpoint_every_steps {self.checkpoint_every_steps} < 1")
        _check(self.max_failures >= -1, f"train.max_failures {self.max_failures} < -1")

    @property
    def global_batch_size(self) -> int:
        """Examples per optimizer step over all workers."""
        return self.batch_size * self.num_workers * self.accumulation_steps


@dataclass
class FtEvalConfig:
    """QA decoding."""

    n_best: int = 20
    max_answer_length: int = 30
    """In WordPiece tokens."""
    null_score_diff_threshold: float = 0.0
    """SQuAD v2: answer "" when null score − best span score exceeds this."""

    def __post_init__(self) -> None:
        _check(self.n_best >= 1, f"eval.n_best {self.n_best} < 1")
        _check(self.max_answer_length >= 1, f"eval.max_answer_length {self.max_answer_length} < 1")


@dataclass
class FtTuneConfig:
    """An LR sweep with Ray Tune (`pipeline.finetune.sweep`); no LRs = one run at train.lr."""

    lr: list[float] | None = None
    """Peak LRs to try, one trial each (`--tune.lr 1e-4,3e-4,1e-3`); the best trial's model is registered."""
    max_concurrent_trials: int = 1
    """Trials at once; 1 keeps a small machine's cores for one trial's workers."""

    def __post_init__(self) -> None:
        for x in self.lr or []:
            _check(0 < x < math.inf, f"tune.lr {x:g} must be > 0")
        _check(len(set(self.lr or [])) == len(self.lr or []), f"tune.lr {self.lr} lists an LR twice")
        _check(self.max_concurrent_trials >= 1, f"tune.max_concurrent_trials {self.max_concurrent_trials} < 1")


@dataclass
class FtTrackingConfig:
    experiment: str = "bert-finetune"
    model_name: str | None = None
    """Registered model name; null: `bert-finetune-<task>`."""
    alias: str | None = "latest-finetune"
    register: bool = True
    run_name: str | None = None


@dataclass
class FinetuneConfig:
    data: FtDataConfig = field(default_factory=FtDataConfig)
    model: FtModelConfig = field(default_factory=FtModelConfig)
    train: FtTrainConfig = field(default_factory=FtTrainConfig)
    eval: FtEvalConfig = field(default_factory=FtEvalConfig)
    tracking: FtTrackingConfig = field(default_factory=FtTrackingConfig)
    tune: FtTuneConfig = field(default_factory=FtTuneConfig)

    def flat(self) -> dict[str, Any]:
        return flatten(asdict(self))


FT_SECTIONS: dict[str, type] = {
    "data": FtDataConfig, "model": FtModelConfig, "train": FtTrainConfig, "eval": FtEvalConfig, "tracking": FtTrackingConfig,
    "tune": FtTuneConfig,
}

# `train.lr: auto`: the peak LR by hidden size, the largest key <= the model's. BERT-base's 5e-5 (Devlin et al.) is
# for base/large only: a tiny model fine-tuned at 5e-5 stays near chance (bench/RESULTS.md, "Recipe study").
AUTO_LR: dict[int, float] = {0: 1e-3, 256: 3e-4, 384: 1e-4, 768: 5e-5}
"""Lower bound of the hidden size -> fine-tuning LR. tiny (128): 1e-3 was the best of 1e-4..3e-3 for every source in
bench/recipe_study.py (3 seeds each); mini (256): 3e-4; MiniLM-L6-H384: 1e-4 and 3e-4 tie (0.75); base/large:
Devlin et al.'s 2e-5..5e-5."""


def resolve_lr(lr: float | str, hidden_size: int) -> tuple[float, str]:
    """(LR, why) for `train.lr`: a number as given, `auto` from `AUTO_LR` by the model's hidden size.

    >>> resolve_lr("auto", 128), resolve_lr("auto", 384)[0], resolve_lr("auto", 1024)[0], resolve_lr(1e-3, 128)
    ((0.001, 'auto: hidden size 128 < 256'), 0.0001, 5e-05, (0.001, 'train.lr'))
    """
    if lr != "auto":
        return float(lr), "train.lr"
    keys = sorted(AUTO_LR)
    i = max(j for j, k in enumerate(keys) if k <= hidden_size)
    band = f">= {keys[i]}" if i == len(keys) - 1 else (f"< {keys[1]}" if i == 0 else f"in [{keys[i]}, {keys[i + 1]})")
    return AUTO_LR[keys[i]], f"auto: hidden size {hidden_size} {band}"


def load_finetune_config(path: str | os.PathLike | None, overrides: list[str] | None = None) -> FinetuneConfig:
    """YAML (sections data/model/train/eval/tracking/tune) plus `--section.field value` overrides.

    >>> load_finetune_config(None, ["--train.max_steps", "20", "--data.max_seq_length", "64"]).train.max_steps
    20
    """
    return FinetuneConfig(**load_sections(path, overrides, FT_SECTIONS))


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


def _from_registry(uri: str, download_dir: str | None) -> tuple[str, dict[str, str]]:
    from pipeline.tracking import download_model, model_version_info

    info = model_version_info(uri)
    dst = os.path.join(download_dir, f"{info['name']}-v{info['version']}") if download_dir else None
    local = download_model(f"models:/{info['name']}/{info['version']}", dst)
    tags = {
        "source_model": f"models:/{info['name']}/{info['version']}",
        "source_model_name": info["name"],
        "source_model_version": info["version"],
        # the pretraining run: its lineage tag when present, else the run that created the version
        "pretrain_run_id": info["tags"].get("run_id") or info.get("run_id") or "",
    }
    for k in ("config_hash", "data_manifest_sha256", "vocab_sha256", "git_sha"):
        if k in info["tags"]:
            tags[f"source_{k}"] = info["tags"][k]
    return local, tags


def resolve_source(spec: str, tokenizer: str | None = None, download_dir: str | None = None) -> Source:
    """`models:/...` | local transformers dir | `scratch:<preset>` -> Source. Registry versions are downloaded
    into `download_dir` (the caller removes it), or a new temporary directory when it is None."""
    if spec.startswith("scratch:"):
        from model import PRESETS

        preset = spec.split(":", 1)[1]
        _check(preset in PRESETS, f"--model {spec}: unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        tok_spec = tokenizer or DEFAULT_SCRATCH_TOKENIZER
        tags = {"source_model": spec, "scratch_tokenizer": tok_spec}
        if tok_spec.startswith("models:/"):
            try:
                tok_path, tok_tags = _from_registry(tok_spec, download_dir)
            except Exception as e:  # noqa: BLE001 - one line for the user
                raise ConfigError(
                    f"--model {spec} takes its vocabulary from {tok_spec}, which failed ({str(e).splitlines()[0]}); "
                    f"pass --data.tokenizer PATH (vocab.txt, tokenizer.json or a checkpoint dir)"
                ) from None
            tags["scratch_tokenizer_model"] = tok_tags["source_model"]
        else:
            tok_path = resolve_path(tok_spec)
            _check(Path(tok_path).exists(), f"--data.tokenizer {tok_spec} does not exist")
        return Source(spec, None, preset, tok_path, tags)
    if spec.startswith("models:/"):
        local, tags = _from_registry(spec, download_dir)
        return Source(spec, local, None, local, tags)
    p = Path(spec)
    _check((p / "config.json").is_file(), f"--model {spec}: not models:/name@alias, models:/name/version, "
           f"scratch:<preset>, or a directory with config.json")
    return Source(spec, str(p.resolve()), None, str(p.resolve()), {"source_model": str(p.resolve())})


def build_model(source: Source, task: str, td: TaskData, overrides: dict[str, Any], vocab_size: int) -> torch.nn.Module:
    """The head class for `task` with the source's weights (or random for scratch) and the task's labels."""
    from model import BertConfig, BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
    from model.hf import load_hf

    cls = {
        "sequence-classification": BertForSequenceClassification,
        "token-classification": BertForTokenClassification,
        "question-answering": BertForQuestionAnswering,
    }[task]
    head: dict[str, Any] = {"num_labels": td.num_labels, "id2label": td.id2label or None}
    if task == "sequence-classification":
        head["problem_type"] = td.problem_type
    if task == "question-answering":
        head = {"num_labels": 2, "id2label": None}
    if source.model_dir is None:
        cfg = BertConfig.from_preset(source.preset, vocab_size=vocab_size, **head, **overrides)
        return cls(cfg)
    model = load_hf(source.model_dir, cls, **head, **overrides)
    _check(model.config.vocab_size >= vocab_size,
           f"the tokenizer has {vocab_size} tokens but the model's vocab_size is {model.config.vocab_size}")
    return model


# ---------------------------------------------------------------------------------------------------------------
# evaluation (pure: model + features -> metrics)

_TASK_SHORT = {"sequence-classification": "cls", "token-classification": "tok", "question-answering": "qa"}


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
    src = re.sub(r"[^A-Za-z0-9._-]+", "-", src).strip("-")[:40] or "model"
    return f"{_TASK_SHORT[task]}-{src}-{uuid.uuid4().hex[:6]}"


def run_finetune(
    cfg: FinetuneConfig, source_spec: str, task: str, train_path: str, eval_path: str, output_dir: str | None = None,
    *, on_step: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Fine-tune, evaluate, log and register; returns `{"metrics", "model_dir", "registered", "run_id", "run_name"}`
    (`model_dir` is `output_dir`, or None: without it the exported model lives only in the registry). With
    `tune.lr` set these describe the best trial (its child run), plus `parent_run_id` and `lr`.

    Connects to Ray (`launcher.connect`) unless it already is. `on_step(step, rank)` is a test hook called in
    every worker after each optimizer step (fault injection). Raises FinetuneDataError / ConfigError /
    TrackingError with one-line messages for bad input; the MLflow run ends FAILED on an error and KILLED on
    KeyboardInterrupt (jobs/finetune.py turns SIGTERM into one).
    """
    import ray

    from pipeline import tracking
    from pipeline.core import launcher

    _check(task in TASKS, f"--task {task!r} is not one of {', '.join(TASKS)}")
    d, t = cfg.data, cfg.train
    uri = tracking.tracking_uri()
    tracking.check_tracking_server(uri)
    work = tempfile.mkdtemp(prefix="finetune-")  # registry downloads and the export; removed in every case
    try:
        # every input is checked here, on the driver, before Ray starts: source, data, then the cluster
        source = resolve_source(source_spec, d.tokenizer, os.path.join(work, "source"))
        print(f"[finetune] {task} from {source_spec}: reading {train_path} and {eval_path}", flush=True)
        td = prepare_task(task, train_path, eval_path, source.tokenizer_path, d.max_seq_length, d.doc_stride,
                          d.max_query_length, d.max_train_examples, d.max_eval_examples, t.seed)
        print(f"[finetune] {len(td.train['input_ids'])} train / {len(td.eval['input_ids'])} eval features, "
              f"labels {td.id2label or td.problem_type}", flush=True)
        started_ray = not ray.is_initialized()
        launcher.connect()
        try:
            launcher.check_resources("train", use_gpu=t.use_gpu, num_workers=t.num_workers,
                                     cpus_per_worker=t.cpus_per_worker)
            return _train_and_register(cfg, source, td, task, train_path, eval_path, output_dir, on_step, uri, work)
        finally:
            if started_ray:
                ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _train_and_register(cfg: FinetuneConfig, source: Source, td: TaskData, task: str, train_path: str, eval_path: str,
                        output_dir: str | None, on_step: Callable[[int, int], None] | None, uri: str,
                        work: str) -> dict[str, Any]:
    """The initial model, then one run at `train.lr` (resolved when `auto`) or a Ray Tune sweep over `tune.lr`."""
    import ray

    torch.manual_seed(cfg.train.seed)  # the new head's initialisation
    vocab_size = load_tokenizer(source.tokenizer_path).get_vocab_size()
    model = build_model(source, task, td, dict(cfg.model.overrides), vocab_size)
    init = {"class": type(model).__name__, "config": asdict(model.config), "state_dict": model.state_dict()}
    primary = primary_metric(task, td.problem_type)
    tags = {**source.tags, "task": task, "train_file": str(Path(train_path).resolve()),
            "eval_file": str(Path(eval_path).resolve())}
    shared = {"data_ref": ray.put(td), "init_ref": ray.put(init), "tracking_uri": uri, "primary": primary, "on_step": on_step}
    job = Job(cfg, source, task, td, primary, tags, shared, work, output_dir)
    run_name = cfg.tracking.run_name or run_name_for(task, source)
    if cfg.tune.lr:
        from pipeline.finetune.sweep import run_sweep

        print(f"[finetune] LR from a Ray Tune sweep over tune.lr {', '.join(f'{x:g}' for x in cfg.tune.lr)}", flush=True)
        return run_sweep(job, run_name)
    lr, why = resolve_lr(cfg.train.lr, model.config.hidden_size)
    print(f"[finetune] LR {lr:g} ({why})", flush=True)
    job.cfg = with_lr(cfg, lr)
    return _single_run(job, run_name, why)


def _single_run(job: Job, run_name: str, lr_source: str) -> dict[str, Any]:
    """The MLflow run around one Ray Train run: params, label map, fit, the best model exported and registered."""
    from pipeline import tracking

    run_id = tracking.start_run(job.cfg.tracking.experiment, run_name, job.tags)
    logger = tracking.RunLogger(run_id, job.shared["tracking_uri"])
    print(f"[finetune] MLflow run {run_id} ({run_name}) at {job.shared['tracking_uri']}", flush=True)
    status = "FAILED"
    try:
        job.log_inputs(logger, job.cfg, {"train.lr_source": lr_source})
        result = fit_run(job.cfg, job.shared, run_id, run_name)
        best, out = job.export(result.checkpoint)
        logger.log_metrics({f"best/{k}": v for k, v in best.items()}, step=int(best["step"]))
        registered = job.register(out, best, run_id, logger)
        status = "FINISHED"
        return {"metrics": best, "model_dir": str(out) if job.output_dir else None, "registered": registered,
                "run_id": run_id, "run_name": run_name}
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        logger.finish(status)
