"""Sentence embeddings from an encoder's token states: sentence-transformers' `Pooling` (mean or CLS) and `Normalize`
modules as functions. A bare encoder (`BertModel`, `ModernBertModel`: the family's `embedding` class) followed by
`sentence_embedding` gives what `SentenceTransformer` gives for a directory whose modules are Transformer ->
Pooling -> Normalize (all-MiniLM-L6-v2's layout).

CLS pooling is the first token's final hidden state, as sentence-transformers takes it, not BERT's tanh pooler.

    >>> h = torch.tensor([[[1.0, 0.0], [3.0, 4.0], [9.0, 9.0]]])  # (B=1, L=3, H=2), the last token is padding
    >>> pool(h, torch.tensor([[1, 1, 0]]), "mean").tolist(), pool(h, torch.tensor([[1, 1, 0]]), "cls").tolist()
    ([[2.0, 2.0]], [[1.0, 0.0]])
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Pooling = Literal["mean", "cls"]
POOLING: tuple[str, ...] = ("mean", "cls")


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: Pooling = "mean") -> torch.Tensor:
    """(B, L, H) token states -> (B, H): the mean over real tokens (`attention_mask` 1), or the first token's."""
    if mode == "cls":
        return hidden[:, 0]
    if mode != "mean":
        raise ValueError(f"pooling {mode!r} is not one of {', '.join(POOLING)}")
    m = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)  # sentence-transformers' clamp, for an empty row


def sentence_embedding(
    encoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, pooling: Pooling = "mean"
) -> torch.Tensor:
    """(B, H) unit-length float32 sentence vectors of a bare encoder's batch; segment ids stay 0 (one text)."""
    h = encoder(input_ids, attention_mask=attention_mask).last_hidden_state  # (B, L, H)
    return F.normalize(pool(h.float(), attention_mask, pooling), dim=-1)
