"""Configuration: the sections' dataclasses (`sections`) and the one parser that reads them from a YAML preset and
`--section.field value` flags (`parser`). A config file has the sections `data`, `model`, `train`, `tracking`
(DESIGN.md); fine-tuning's are `pipeline.finetune.config`. Relative paths resolve against the directory the command
runs in (`resolve_paths`).

    >>> cfg = load_config(None, ["--train.max_steps", "30", "--data.inputs", "/data/books"])
    >>> cfg.train.max_steps, cfg.data.inputs
    (30, ['/data/books'])
"""

from __future__ import annotations

import os

from pipeline.config.parser import alias, config_parser, config_path, load_sections, parse
from pipeline.config.paths import phase_data_configs, resolve_path, resolve_paths
from pipeline.config.sections import (
    SECTIONS,
    BaseTrainConfig,
    Config,
    ConfigError,
    DataConfig,
    ModelConfig,
    PhaseConfig,
    SourceConfig,
    TrackingConfig,
    TrainConfig,
    config_hash,
    flatten,
)


def load_config(path: str | os.PathLike | None, overrides: list[str] | None = None) -> Config:
    """Read a YAML preset (or the defaults when `path` is None) and apply `--section.field value` overrides."""
    return Config(**load_sections(path, overrides, SECTIONS))


__all__ = [
    "SECTIONS",
    "BaseTrainConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "PhaseConfig",
    "SourceConfig",
    "TrackingConfig",
    "TrainConfig",
    "alias",
    "config_hash",
    "config_parser",
    "config_path",
    "flatten",
    "load_config",
    "load_sections",
    "parse",
    "phase_data_configs",
    "resolve_path",
    "resolve_paths",
]
