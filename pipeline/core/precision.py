"""Numeric precision for a training or evaluation forward: fp32, bf16 autocast, fp16 autocast + gradient scaler.

>>> import torch
>>> make_scaler(torch.device("cpu"), "fp32") is None
True
"""

from __future__ import annotations

import contextlib
import functools
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


HOST_ONLY = ("num_tokens", "spans")
"""Batch entries that count the work (real tokens, attention spans) for throughput and MFU: never copied."""


@functools.lru_cache(maxsize=None)
def _left_behind(cls: type) -> frozenset[str]:
    """The batch keys a model of `cls` takes none of: the host's counts, and BERT's segments and NSP labels for a
    family without them (`model.family.ModelFamily.token_types`, `nsp`: ModernBERT).

    >>> sorted(_left_behind(torch.nn.Identity))
    ['num_tokens', 'spans']
    """
    from model.family import family_of

    try:
        family = family_of(cls)
    except ValueError:  # a wrapper of no family's (finetune.embedding.ContrastiveModel): its batches are its own
        return frozenset(HOST_ONLY)
    return frozenset(
        (
            *HOST_ONLY,
            *(() if family.token_types else ("token_type_ids",)),
            *(() if family.nsp else ("next_sentence_label",)),
        )
    )


def forward(model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device, precision: Precision):
    """`model(**batch)` on `device` under `precision`; `num_tokens` and `spans`, and BERT's `token_type_ids` and
    `next_sentence_label` for a family that takes none (ModernBERT), stay behind.

    >>> from model import build_model, encoder_config
    >>> m = build_model(encoder_config("modernbert-tiny", vocab_size=64))
    >>> type(forward(m, {"input_ids": torch.ones(1, 2, dtype=torch.long), "token_type_ids": torch.zeros(1, 2)},
    ...              torch.device("cpu"), "fp32")).__name__
    'PreTrainingOutput'
    """
    skip = _left_behind(type(getattr(model, "module", model)))  # under DDP: the wrapped model's family
    inputs = {k: v.to(device, non_blocking=True) for k, v in batch.items() if k not in skip}
    with autocast(device, precision):
        return model(**inputs)
