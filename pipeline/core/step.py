"""One optimizer step, shared by pretraining and fine-tuning: micro-batches with gradient accumulation, fp16
scaling, clipping, the optimizer and scheduler step; returns a `StepStats` summed over all ranks.

What a task contributes is a `counts` function: a forward's output and batch -> a float64 vector of sums
(loss sums, correct counts, denominators), and a `summarise` function that turns the summed vector into named
figures with "loss" first. Sums (not means) make the result exact under accumulation and across ranks.

Metric names are the same for every job and grouped by prefix as the MLflow UI groups them:
`train/loss`, `train/mlm_accuracy`, `train/lr`, `train/grad_norm`, `train/tokens_per_s`, `eval/...`, `system/...`.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import nn

from pipeline.core.precision import Precision, forward

Counts = Callable[[Any, dict[str, torch.Tensor]], torch.Tensor]
Summarise = Callable[[torch.Tensor], dict[str, float]]


@dataclass
class Trainable:
    """Everything a step changes and a checkpoint saves."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None = None


@dataclass(frozen=True)
class StepStats:
    """What one optimizer step did, over all its micro-batches and all ranks."""

    figures: dict[str, float]
    """From the task's `summarise`: loss first, then e.g. mlm_accuracy, nsp_accuracy."""
    lr: float
    grad_norm: float
    examples: int
    tokens: int
    seconds: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def loss(self) -> float:
        return self.figures["loss"]

    def metrics(self, prefix: str = "train/") -> dict[str, float]:
        """`train/loss`, `train/<figure>`..., `train/lr`, `train/grad_norm`, `train/tokens_per_s`, `train/examples_per_s`."""
        secs = max(self.seconds, 1e-9)
        out = {f"{prefix}{k}": v for k, v in self.figures.items()}
        out.update({f"{prefix}lr": self.lr, f"{prefix}grad_norm": self.grad_norm,
                    f"{prefix}tokens_per_s": self.tokens / secs, f"{prefix}examples_per_s": self.examples / secs})
        out.update({f"{prefix}{k}": v for k, v in self.extra.items()})
        return out


def _num_tokens(batch: dict[str, torch.Tensor]) -> int:
    if "num_tokens" in batch:
        return int(batch["num_tokens"])
    return int(batch["attention_mask"].sum()) if "attention_mask" in batch else int(batch["input_ids"].numel())


def all_reduce_sum(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Sum a CPU tensor over the ranks of the process group (unchanged when there is none)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t
    t = t.to(device)
    dist.all_reduce(t)
    return t.cpu()


def train_step(
    t: Trainable,
    micro_batches: Iterable[dict[str, torch.Tensor]],
    *,
    accumulation: int,
    counts: Counts,
    summarise: Summarise,
    device: torch.device,
    precision: Precision = "fp32",
    max_grad_norm: float = 1.0,
) -> StepStats:
    """Forward/backward `accumulation` micro-batches (gradients all-reduced on the last only), clip, step."""
    start = time.perf_counter()
    model, sums, tokens, examples = t.model, None, 0, 0
    batches = iter(micro_batches)
    for k in range(accumulation):
        batch = next(batches)
        last = k == accumulation - 1
        sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        with sync:  # DDP all-reduces gradients only on the last micro-step
            out = forward(model, batch, device, precision)
            loss = out.loss / accumulation
            (t.scaler.scale(loss) if t.scaler is not None else loss).backward()
        c = counts(out, batch).detach().double().cpu()
        sums = c if sums is None else sums + c
        tokens += _num_tokens(batch)
        examples += len(batch["input_ids"])
    if t.scaler is not None:
        t.scaler.unscale_(t.optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm or float("inf"))
    if t.scaler is not None:
        t.scaler.step(t.optimizer)
        t.scaler.update()
    else:
        t.optimizer.step()
    t.optimizer.zero_grad(set_to_none=True)
    lr = t.scheduler.get_last_lr()[0]
    t.scheduler.step()
    totals = all_reduce_sum(torch.cat([sums, torch.tensor([tokens, examples], dtype=torch.float64)]), device)
    return StepStats(summarise(totals[:-2]), lr, float(grad_norm), int(totals[-1]), int(totals[-2]),
                     time.perf_counter() - start)


@torch.no_grad()
def evaluate_sums(
    model: nn.Module,
    batches: Iterable[dict[str, torch.Tensor]],
    *,
    counts: Counts,
    size: int,
    device: torch.device,
    precision: Precision = "fp32",
) -> torch.Tensor:
    """The task's count vector (`size` entries) summed over `batches` and over all ranks; every rank must call
    it, also one without batches. The model is left in the mode it was in."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(size, dtype=torch.float64)
    for b in batches:
        sums += counts(forward(model, b, device, precision), b).double().cpu()
    model.train(was_training)
    return all_reduce_sum(sums, device)
