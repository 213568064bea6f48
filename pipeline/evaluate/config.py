"""The evaluation job's configuration: fine-tuning's sections (every trial is a fine-tuning run) with the defaults
that fill a cluster with trials, plus `suite` (how the trials run and where the scorecards go).

The suite file's protocol sets each trial's LR, seed, epochs, batch size, max length and subsets; every other
field (warmup, schedule, weight decay, precision, workers) is the config's, as `finetune.py` would take it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pipeline.config import ConfigError, flatten
from pipeline.config.sections import _check
from pipeline.finetune.config import FtDataConfig, FtEvalConfig, FtModelConfig, FtTrackingConfig, FtTrainConfig


@dataclass
class EvTrainConfig(FtTrainConfig):
    """Each trial's Ray Train run: fine-tuning's fields, with one torch thread and 0.95 CPU per worker, so that
    a trial holds one core (with its actor's 0.05) and a cluster runs as many trials at once as it has cores."""

    cpus_per_worker: float = 0.95
    """CPUs reserved per worker of a trial; with the trial's own 0.05, one trial per core."""
    torch_threads: int | None = 1
    """Intra-op threads per CPU worker (1: trials side by side on the cores, each bit-reproducible)."""
    storage_path: str = "runs/evaluate"
    """Where each trial's Ray Train checkpoints live while it runs (removed when it has reported)."""


@dataclass
class EvTrackingConfig(FtTrackingConfig):
    """MLflow: the experiment of the evaluation runs (one per model and suite, each trial a nested run)."""

    experiment: str = "bert-evaluate"
    """MLflow experiment the evaluation runs and their trials go to."""
    register: bool = False
    """Trials never register their fine-tuned models (the scorecard goes on the evaluated version)."""


@dataclass
class SuiteRunConfig:
    """How the suite's trials run."""

    max_concurrent_trials: int | None = None
    """Trials at once; null: as many as the cluster's CPUs hold (each trial takes num_workers x cpus_per_worker
    + 0.05)."""
    force: bool = False
    """Evaluate a registered version again even when it has a scorecard of the same suite sha256."""

    def __post_init__(self) -> None:
        _check(
            self.max_concurrent_trials is None or self.max_concurrent_trials >= 1,
            f"suite.max_concurrent_trials {self.max_concurrent_trials} < 1",
        )


@dataclass
class EvaluateConfig:
    data: FtDataConfig = field(default_factory=FtDataConfig)
    model: FtModelConfig = field(default_factory=FtModelConfig)
    train: EvTrainConfig = field(default_factory=EvTrainConfig)
    eval: FtEvalConfig = field(default_factory=FtEvalConfig)
    tracking: EvTrackingConfig = field(default_factory=EvTrackingConfig)
    suite: SuiteRunConfig = field(default_factory=SuiteRunConfig)

    def flat(self) -> dict:
        return flatten(asdict(self))


EV_SECTIONS: dict[str, type] = {
    "data": FtDataConfig,
    "model": FtModelConfig,
    "train": EvTrainConfig,
    "eval": FtEvalConfig,
    "tracking": EvTrackingConfig,
    "suite": SuiteRunConfig,
}


PROTOCOL_OWNED = {
    "train.lr": "lrs",
    "train.seed": "seeds",
    "train.epochs": "epochs",
    "train.batch_size": "batch_size",
    "train.max_steps": "epochs",
    "data.max_seq_length": "max_seq_length",
    "data.max_train_examples": "max_train_examples",
    "data.max_eval_examples": "max_eval_examples",
}
"""Fine-tuning fields that each trial takes from the suite's protocol: set here they would be ignored, so they are
refused (`check_protocol_owned`)."""


def check_protocol_owned(cfg: EvaluateConfig) -> None:
    """One ConfigError line for a config field that the suite's protocol sets for every trial.

    >>> from dataclasses import replace
    >>> c = EvaluateConfig()
    >>> check_protocol_owned(replace(c, train=replace(c.train, epochs=5)))
    Traceback (most recent call last):
    ...
    pipeline.config.sections.ConfigError: train.epochs 5: each trial takes it from the suite's protocol (epochs); set it there, for the suite or for one task
    """  # noqa: E501
    default = EvaluateConfig().flat()
    for key, value in cfg.flat().items():
        if key in PROTOCOL_OWNED and value != default[key]:
            raise ConfigError(
                f"{key} {value}: each trial takes it from the suite's protocol ({PROTOCOL_OWNED[key]}); "
                "set it there, for the suite or for one task"
            )
