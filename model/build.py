"""The one place a model is built: the class a config's family (`model.family`) has for a task, built fresh
(`build_model`) or read from a transformers directory (`load_model`, its config.json's model_type picks the
family). Pretraining, its export and fine-tuning all build their models here.

    >>> from model.family import encoder_config
    >>> type(build_model(encoder_config("modernbert-tiny", vocab_size=64))).__name__
    'ModernBertForMaskedLM'
    >>> model_class("bert", "token-classification").__name__
    'BertForTokenClassification'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from torch import nn

from model.family import FAMILIES, ModelFamily, family_of
from model.hf import checkpoint_model_type, load_hf

Task = Literal["pretraining", "sequence-classification", "token-classification", "question-answering", "embedding"]


def model_class(family: str | ModelFamily, task: str) -> type[nn.Module]:
    """The class a family has for a task; an unknown family or task is a ValueError that lists the known."""
    try:
        return family_of(family).model_class(task)
    except ValueError as e:
        raise ValueError(
            f"no model for family {getattr(family, 'name', family)!r} and task {task!r} ({e}); known: "
            f"{', '.join(FAMILIES)} x {', '.join(sorted({t for f in FAMILIES.values() for t in f.tasks}))}"
        ) from None


def build_model(cfg: Any, task: str = "pretraining") -> nn.Module:
    """A freshly initialised model of `cfg`'s family for `task`."""
    return model_class(family_of(cfg), task)(cfg)


def rebuild(class_name: str, config: dict[str, Any]) -> nn.Module:
    """A fresh model from its class name and config fields, what crosses a process boundary (fine-tuning's
    hand-off to its workers): `rebuild(type(m).__name__, dataclasses.asdict(m.config))`."""
    for family in FAMILIES.values():
        for task, name in family.class_names().items():
            if name == class_name:
                return family.model_class(task)(family.config_class(**config))
    names = [n for f in FAMILIES.values() for n in f.class_names().values()]
    raise ValueError(f"unknown model class {class_name!r}; choose one of {', '.join(names)}")


def load_model(path: str | Path, task: str = "pretraining", **config_overrides: Any) -> nn.Module:
    """The model for `task` of the family a transformers directory holds, its weights loaded (`model.hf.load_hf`:
    weights it lacks, such as a new task head, stay freshly initialised and are listed in `load_report`)."""
    return load_hf(path, model_class(checkpoint_model_type(path), task), **config_overrides)
