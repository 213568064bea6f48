"""The one place a model is built: the class a config's family (BERT or ModernBERT) and a task make, built fresh
(`build_model`) or read from a transformers directory (`load_model`, its config.json's model_type picks the
family). Pretraining, its export and fine-tuning all build their models here.

    >>> from model.config import encoder_config
    >>> type(build_model(encoder_config("modernbert-tiny", vocab_size=64))).__name__
    'ModernBertForMaskedLM'
    >>> model_class("bert", "token-classification").__name__
    'BertForTokenClassification'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from torch import nn

from model.config import BertConfig, ModernBertConfig
from model.hf import CLASSES as BY_NAME, load_hf

Task = Literal["pretraining", "sequence-classification", "token-classification", "question-answering"]
Family = Literal["bert", "modernbert"]

# (family, task) -> class; "pretraining" is MLM + NSP for BERT, MLM alone for ModernBERT (no NSP head).
_NAMES = {"pretraining": ("BertForPreTraining", "ModernBertForMaskedLM"),
          "sequence-classification": ("BertForSequenceClassification", "ModernBertForSequenceClassification"),
          "token-classification": ("BertForTokenClassification", "ModernBertForTokenClassification"),
          "question-answering": ("BertForQuestionAnswering", "ModernBertForQuestionAnswering")}
CLASSES: dict[tuple[str, str], type[nn.Module]] = {
    (family, task): BY_NAME[names[i]] for task, names in _NAMES.items() for i, family in enumerate(("bert", "modernbert"))}


def family_of(cfg: BertConfig | ModernBertConfig) -> Family:
    return "modernbert" if isinstance(cfg, ModernBertConfig) else "bert"


def model_class(family: str, task: str) -> type[nn.Module]:
    """The class for a family and a task; unknown ones are a ValueError that lists the known."""
    if (family, task) not in CLASSES:
        raise ValueError(f"no model for family {family!r} and task {task!r}; known: "
                         f"{', '.join(sorted({f for f, _ in CLASSES}))} x {', '.join(sorted({t for _, t in CLASSES}))}")
    return CLASSES[(family, task)]


def build_model(cfg: BertConfig | ModernBertConfig, task: str = "pretraining") -> nn.Module:
    """A freshly initialised model of `cfg`'s family for `task`."""
    return model_class(family_of(cfg), task)(cfg)


def rebuild(class_name: str, config: dict[str, Any]) -> nn.Module:
    """A fresh model from its class name and config fields, what crosses a process boundary (fine-tuning's
    hand-off to its workers): `rebuild(type(m).__name__, dataclasses.asdict(m.config))`."""
    for (family, _), cls in CLASSES.items():
        if cls.__name__ == class_name:
            return cls((ModernBertConfig if family == "modernbert" else BertConfig)(**config))
    raise ValueError(f"unknown model class {class_name!r}; choose one of {', '.join(c.__name__ for c in CLASSES.values())}")


def checkpoint_family(path: str | Path) -> Family:
    """The family of a transformers directory, from its config.json's model_type (BERT when it names none)."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} not found")
    model_type = json.loads(config_file.read_text()).get("model_type", "bert")
    if model_type not in ("bert", "modernbert"):
        raise ValueError(f"{config_file}: model_type {model_type!r} is not bert or modernbert")
    return model_type


def load_model(path: str | Path, task: str = "pretraining", **config_overrides: Any) -> nn.Module:
    """The model for `task` of the family a transformers directory holds, its weights loaded (`model.hf.load_hf`:
    weights it lacks, such as a new task head, stay freshly initialised and are listed in `load_report`)."""
    return load_hf(path, model_class(checkpoint_family(path), task), **config_overrides)
