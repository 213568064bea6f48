"""Numeric precision for a training or evaluation forward: fp32, bf16 autocast, fp16 autocast + gradient scaler.

    >>> import torch
    >>> make_scaler(torch.device("cpu"), "fp32") is None
    True
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Literal

import torch

Precision = Literal["fp32", "bf16", "fp16"]


def autocast(device: torch.device, precision: Precision):
    """A context for the forward pass: nothing for fp32, autocast to bf16/fp16 otherwise."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_scaler(device: torch.device, precision: Precision) -> torch.amp.GradScaler | None:
    """A gradient scaler for fp16 (its small range underflows gradients otherwise); None for fp32/bf16."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


# Batch keys a model may not take: BERT's segments and NSP labels (ModernBERT has neither), the loader's count.
HOST_ONLY = ("num_tokens", "spans")
"""Batch entries that count the work (real tokens, attention spans) for throughput and MFU: never copied."""
_OPTIONAL = (*HOST_ONLY, "token_type_ids", "next_sentence_label")


@functools.lru_cache(maxsize=None)
def _takes(cls: type, key: str) -> bool:
    return key in inspect.signature(cls.forward).parameters


def forward(model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device, precision: Precision):
    """`model(**batch)` on `device` under `precision`; `num_tokens`, and BERT's `token_type_ids` and
    `next_sentence_label` for a model that takes none (ModernBERT), stay behind.

    >>> class M(torch.nn.Module):
    ...     def forward(self, input_ids): return input_ids.sum()
    >>> forward(M(), {"input_ids": torch.ones(1, 2), "token_type_ids": torch.zeros(1, 2)}, torch.device("cpu"), "fp32").item()
    2.0
    """
    cls = type(getattr(model, "module", model))  # under DDP: the wrapped model's forward says what it takes
    inputs = {k: v.to(device, non_blocking=True) for k, v in batch.items()
              if k not in _OPTIONAL or (k not in HOST_ONLY and _takes(cls, k))}
    with autocast(device, precision):
        return model(**inputs)
