"""BERT and ModernBERT in plain PyTorch: configs, encoders, task heads, transformers-format load/save (model.hf).

The names below load on first use (PEP 562), so `model.config` (plain dataclasses) can be imported without
torch: the data jobs read model presets and would otherwise pay torch's ~1.2 s import for nothing
(tests/test_prepare_data.py checks that preparing data imports neither torch nor pandas).
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "PRESETS": "model.config",
    "BertConfig": "model.config",
    "BertModel": "model.bert",
    "BertForPreTraining": "model.heads",
    "BertForQuestionAnswering": "model.heads",
    "BertForSequenceClassification": "model.heads",
    "BertForTokenClassification": "model.heads",
    "MODERNBERT_PRESETS": "model.config",
    "build_model": "model.build",
    "encoder_config": "model.family",
    "load_model": "model.build",
    "ModernBertConfig": "model.config",
    "ModernBertModel": "model.modernbert",
    "ModernBertForMaskedLM": "model.modernbert",
    "ModernBertForQuestionAnswering": "model.modernbert",
    "ModernBertForSequenceClassification": "model.modernbert",
    "ModernBertForTokenClassification": "model.modernbert",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'model' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
