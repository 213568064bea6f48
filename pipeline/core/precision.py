"""Numeric precision for a training or evaluation forward: fp32, bf16 autocast, fp16 autocast + gradient scaler.

    >>> import torch
    >>> make_scaler(torch.device("cpu"), "fp32") is None
    True
"""

from __future__ import annotations

import contextlib
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


def forward(model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device, precision: Precision):
    """`model(**batch)` on `device` under `precision`; keys the model does not take (`num_tokens`) stay behind."""
    inputs = {k: v.to(device, non_blocking=True) for k, v in batch.items() if k != "num_tokens"}
    with autocast(device, precision):
        return model(**inputs)
