"""BERT in plain PyTorch: config, encoder, task heads, and transformers-format load/save (model.hf)."""

from model.bert import BertModel
from model.config import PRESETS, BertConfig
from model.heads import (
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)

__all__ = [
    "PRESETS",
    "BertConfig",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
]
