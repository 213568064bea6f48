"""Fine-tuning configuration: sections data/model/train/eval/tracking/tune/embedding (configs/finetune.yaml holds the
defaults).

Loaded like pretraining's (`pipeline.config.load_sections`: YAML plus `--section.field value`, checked by field
type, validated); `jobs/finetune.py --help` lists every field. `FtTrainConfig` extends the training fields shared
with pretraining (`pipeline.config.BaseTrainConfig`) with epochs, batch sizes and the warmup ratio, and makes
`lr` default to `auto` (`resolve_lr`). Imports only `pipeline.config`, never `pipeline.pretrain`.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pipeline.config import BaseTrainConfig, ConfigError, flatten, load_sections
from pipeline.config.sections import _check


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
        _check(16 <= self.max_seq_length <= 8192, f"data.max_seq_length {self.max_seq_length} is not in [16, 8192]")
        _check(self.doc_stride >= 0, f"data.doc_stride {self.doc_stride} < 0")  # QA checks it against the window


@dataclass
class FtModelConfig:
    """BertConfig fields that differ from the checkpoint's (e.g. `--model.overrides.hidden_dropout_prob 0.0`)."""

    overrides: dict[str, Any] = field(default_factory=dict)
    """BertConfig fields to change on the loaded checkpoint's config (dropout, for instance)."""


@dataclass
class FtTrainConfig(BaseTrainConfig):
    """Ray Train fine-tuning: the training fields shared with pretraining, plus epochs, batch sizes and warmup."""

    torch_threads: int | None = None
    """Intra-op threads per CPU worker; null: this machine's cores divided by num_workers."""
    epochs: int = 3
    """Passes over the training file (the best epoch's model is kept)."""
    max_steps: int | None = None
    """Optimizer steps in total; when set it overrides `epochs` (the last epoch may be partial)."""
    batch_size: int = 32
    """Examples per forward/backward (micro-batch) on each worker."""
    accumulation_steps: int = 1
    """Micro-batches per optimizer step; the global batch is batch_size * num_workers * accumulation_steps."""
    eval_batch_size: int = 64
    """Examples per evaluation batch on each worker."""
    lr: float | Literal["auto"] = "auto"
    """Peak LR; `auto` picks it by the model's hidden size (`AUTO_LR`); a number wins."""
    warmup_ratio: float = 0.1
    """Fraction of the total steps with linear warmup."""
    schedule: Literal["linear", "polynomial", "constant"] = "linear"
    """Decay after warmup (to 0 at the last step), or constant."""
    checkpoint_every_steps: int | None = None
    """Also checkpoint every N steps within an epoch (null: at the end of each epoch only)."""
    seed: int = 42
    """Seeds the head's init, dropout and the data order."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.epochs >= 1, f"train.epochs {self.epochs} < 1")
        _check(self.batch_size >= 1, f"train.batch_size {self.batch_size} < 1")
        _check(self.accumulation_steps >= 1, f"train.accumulation_steps {self.accumulation_steps} < 1")
        _check(self.eval_batch_size >= 1, f"train.eval_batch_size {self.eval_batch_size} < 1")
        _check(0 <= self.warmup_ratio < 1, f"train.warmup_ratio {self.warmup_ratio} not in [0, 1)")
        _check(
            self.checkpoint_every_steps is None or self.checkpoint_every_steps >= 1,
            f"train.checkpoint_every_steps {self.checkpoint_every_steps} < 1",
        )

    @property
    def global_batch_size(self) -> int:
        """Examples per optimizer step over all workers."""
        return self.batch_size * self.num_workers * self.accumulation_steps


@dataclass
class FtEvalConfig:
    """QA decoding."""

    n_best: int = 20
    """Start and end logits considered per window when searching for the best answer span."""
    max_answer_length: int = 30
    """In WordPiece tokens."""
    null_score_diff_threshold: float = 0.0
    """SQuAD v2: answer "" when null score − best span score exceeds this."""

    def __post_init__(self) -> None:
        _check(self.n_best >= 1, f"eval.n_best {self.n_best} < 1")
        _check(self.max_answer_length >= 1, f"eval.max_answer_length {self.max_answer_length} < 1")


@dataclass
class FtEmbeddingConfig:
    """`--task embedding`: how a text becomes one vector, and how sharply the contrastive loss ranks them."""

    pooling: Literal["mean", "cls"] = "mean"
    """The mean of the final token states (sentence-transformers' default, all-MiniLM-L6-v2's) or the first token's
    ([CLS]); the registered sentence-transformers model pools the same way."""
    temperature: float = 0.05
    """Cosine similarities are divided by this in the InfoNCE loss (MultipleNegativesRankingLoss's scale 20)."""

    def __post_init__(self) -> None:
        _check(self.pooling in ("mean", "cls"), f"embedding.pooling {self.pooling!r} is not mean or cls")
        _check(0 < self.temperature <= 1, f"embedding.temperature {self.temperature} is not in (0, 1]")


@dataclass
class FtTuneConfig:
    """An LR sweep with Ray Tune (`pipeline.finetune.sweep`); no LRs = one run at train.lr."""

    lr: list[float] | str | None = None
    """Peak LRs to try, one trial each (`--tune.lr 1e-4,3e-4,1e-3` or a list); the best trial's model is registered."""
    max_concurrent_trials: int = 1
    """Trials at once; 1 keeps a small machine's cores for one trial's workers."""

    def __post_init__(self) -> None:
        if isinstance(self.lr, (str, float, int)):  # `1e-4,3e-4`: numbers never hold a comma
            self.lr = [_number(x.strip(), f"tune.lr[{i}]") for i, x in enumerate(str(self.lr).split(","))]
        for x in self.lr or []:
            _check(0 < x < math.inf, f"tune.lr {x:g} must be > 0")
        _check(len(set(self.lr or [])) == len(self.lr or []), f"tune.lr {self.lr} lists an LR twice")
        _check(self.max_concurrent_trials >= 1, f"tune.max_concurrent_trials {self.max_concurrent_trials} < 1")


def _number(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{where} {text!r} is not a number") from None


@dataclass
class FtTrackingConfig:
    """MLflow: experiment, registered model name and alias of the fine-tuned model."""

    experiment: str = "bert-finetune"
    """MLflow experiment the fine-tuning runs go to."""
    model_name: str | None = None
    """Registered model name; null: `bert-finetune-<task>`."""
    alias: str | None = "latest-finetune"
    """Alias moved to the new version; null moves none."""
    register: bool = True
    """Register the best epoch's model in the MLflow registry."""
    run_name: str | None = None
    """MLflow run name; null derives one from the task and the source model."""
    server_wait_s: float = 300.0
    """How long exporting and registering wait for the tracking server to answer before the job fails; training
    itself never waits (rank 0 keeps its metrics until the server is back)."""


@dataclass
class FinetuneConfig:
    data: FtDataConfig = field(default_factory=FtDataConfig)
    model: FtModelConfig = field(default_factory=FtModelConfig)
    train: FtTrainConfig = field(default_factory=FtTrainConfig)
    eval: FtEvalConfig = field(default_factory=FtEvalConfig)
    tracking: FtTrackingConfig = field(default_factory=FtTrackingConfig)
    tune: FtTuneConfig = field(default_factory=FtTuneConfig)
    embedding: FtEmbeddingConfig = field(default_factory=FtEmbeddingConfig)

    def flat(self) -> dict[str, Any]:
        return flatten(asdict(self))


FT_SECTIONS: dict[str, type] = {
    "data": FtDataConfig,
    "model": FtModelConfig,
    "train": FtTrainConfig,
    "eval": FtEvalConfig,
    "tracking": FtTrackingConfig,
    "tune": FtTuneConfig,
    "embedding": FtEmbeddingConfig,
}

# `train.lr: auto`: the peak LR by hidden size, the largest key <= the model's. BERT-base's 5e-5 (Devlin et al.) is
# for base/large only: a tiny model fine-tuned at 5e-5 stays near chance (bench/results/quality.md, "Recipe study").
AUTO_LR: dict[int, float] = {0: 1e-3, 256: 3e-4, 384: 1e-4, 768: 5e-5}
"""Lower bound of the hidden size -> fine-tuning LR. tiny (128): 1e-3 was the best of 1e-4..3e-3 for every source in
the recipe study (bench/results/quality.md, 3 seeds each); mini (256): 3e-4; MiniLM-L6-H384: 1e-4 and 3e-4 tie
(0.75); base/large: Devlin et al.'s 2e-5..5e-5."""


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
    """YAML (sections data/model/train/eval/tracking/tune/embedding) plus `--section.field value` overrides.

    >>> load_finetune_config(None, ["--train.max_steps", "20", "--data.max_seq_length", "64"]).train.max_steps
    20
    """
    return FinetuneConfig(**load_sections(path, overrides, FT_SECTIONS))
