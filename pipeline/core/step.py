"""One optimizer step, shared by pretraining and fine-tuning: micro-batches with gradient accumulation, fp16
scaling, clipping, the optimizer and scheduler step; returns a `StepSums` that is still on the device.

Host syncs only when a figure is read (nanoGPT, torchtitan): a step keeps its sums and gradient norm on the
device, so a GPU step is queued without waiting for the previous one; `StepSums.read` (or `TrainFigures.read`
for throughput over several steps) all-reduces them and copies them to the host once. Loops read on the steps
they log, evaluate or checkpoint, and on the last; every rank must read on the same steps (a collective).

What a task contributes is a `Sums` record: a frozen dataclass whose fields are one forward's float64 sums (loss
sums, correct counts, denominators; `of(out, batch)`), and whose `figures()` turns summed ones into named figures
with "loss" first. Sums (not means) make the result exact under accumulation and across ranks; the all-reduce packs
a reading's records into one tensor in one place (`_sum_over_ranks`).

A non-finite step stops the run (torchtitan's finiteness check, without its sync): each step keeps a flag on the
device, true when its loss sums (and, without a gradient scaler, its gradient norm) are finite; a reading
all-reduces the flags of the steps since the last one with the sums and raises `NonFiniteLoss` naming the first
step that was not, on every rank alike. Loops read on every step they checkpoint, so no checkpoint is written
after a non-finite step; before writing one they also check the weights themselves (`check_finite_weights`),
which a finite loss does not vouch for (an unused row that went to inf).

Metric names are the same for every job and grouped by prefix as the MLflow UI groups them:
`train/loss`, `train/mlm_accuracy`, `train/lr`, `train/grad_norm`, `train/tokens_per_s`, `eval/...`, `system/...`.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable, TypeVar

import torch
from torch import nn

from pipeline.core.precision import Precision, forward
from pipeline.errors import PipelineError

S = TypeVar("S", bound="Sums")


@dataclass(frozen=True)
class Sums:
    """A task's figures of one or more forwards, as named sums: a subclass is a frozen dataclass whose fields are
    () float64 tensors (on the device until a reading), with `of` (one forward's) and `figures` (summed ones ->
    named figures, "loss" first). Records add field by field, also with `sum()`.

    >>> @dataclass(frozen=True)
    ... class Loss(Sums):
    ...     loss_sum: torch.Tensor
    ...     examples: torch.Tensor
    ...     def figures(self):
    ...         return {"loss": (self.loss_sum / self.examples).item()}
    >>> one = Loss.unpack(torch.tensor([3.0, 2.0], dtype=torch.float64))
    >>> (one + one).figures(), sum([one, one]).examples.item(), Loss.zeros(torch.device("cpu")).pack().tolist()
    ({'loss': 1.5}, 4.0, [0.0, 0.0])
    """

    @classmethod
    def of(cls: type[S], out: Any, batch: dict[str, torch.Tensor]) -> S:
        """One forward's sums: the model's output and the batch it read."""
        raise NotImplementedError

    def figures(self) -> dict[str, float]:
        """Summed records -> named figures, "loss" first (reads the tensors: a host sync on a device)."""
        raise NotImplementedError

    def pack(self) -> torch.Tensor:
        """(number of fields,) float64: the fields in order."""
        return torch.stack([getattr(self, f.name).double() for f in fields(self)])

    @classmethod
    def unpack(cls: type[S], packed: torch.Tensor) -> S:
        """The record of a packed (number of fields,) tensor."""
        return cls(*packed.unbind())

    @classmethod
    def zeros(cls: type[S], device: torch.device) -> S:
        return cls.unpack(torch.zeros(len(fields(cls)), dtype=torch.float64, device=device))

    def __add__(self: S, other: S) -> S:
        return type(self).unpack(self.pack() + other.pack())

    def __radd__(self: S, other: Any) -> S:  # sum() starts from 0
        return self if isinstance(other, int) and other == 0 else NotImplemented


@dataclass(frozen=True)
class Work(Sums):
    """What the steps of a reading did, counted on the host: real tokens, examples, model FLOPs (0 when the loop
    counts none). Summed over the ranks with the task's sums."""

    tokens: torch.Tensor
    examples: torch.Tensor
    flops: torch.Tensor

    @classmethod
    def counted(cls, tokens: torch.Tensor, examples: int, flops: float) -> Work:
        f64 = torch.float64
        return cls(tokens.double(), torch.tensor(float(examples), dtype=f64), torch.tensor(float(flops), dtype=f64))


class NonFiniteLoss(PipelineError, RuntimeError):
    """A training step's loss (or gradient norm) or the weights went to NaN or inf: the run stops there, before any
    checkpoint of that state. Not transient: the same data and settings diverge again."""


def _stop(what: str, step: int | None, figures: str = "") -> NonFiniteLoss:
    """The one line a non-finite run stops with (`pipeline.runner.cli` prints it)."""
    at = f"at step {step}" if step is not None else "at this step"
    return NonFiniteLoss(
        f"{what} is not finite {at}{figures}: the run stops; nothing from that step on is "
        "checkpointed or registered, and its earlier checkpoints stay. Re-run with a lower train.lr "
        "(or clipping, train.max_grad_norm > 0): changed settings start a new run from step 0"
    )


def check_finite_weights(model: nn.Module, step: int) -> None:
    """Raise `NonFiniteLoss` when a parameter of `model` holds NaN or inf: called before a checkpoint is written
    (one device reduction and one host sync, on a step that syncs anyway). Every rank holds the same weights, so
    every rank decides alike."""
    finite = torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all()
    if not bool(finite):
        raise _stop("a weight", step)


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
    """From the task's `Sums.figures`: loss first, then e.g. mlm_accuracy, nsp_accuracy."""
    lr: float
    grad_norm: float
    examples: int
    tokens: int
    seconds: float
    extra: dict[str, float] = field(default_factory=dict)
    flops: float = 0.0
    """Model FLOPs done by all ranks (`model.flops.train_flops`), when the loop counted them: for `train/mfu`."""

    @property
    def loss(self) -> float:
        return self.figures["loss"]

    def metrics(self, prefix: str = "train/") -> dict[str, float]:
        """`train/loss`, `train/<figure>`..., `train/lr`, `train/grad_norm`, `train/tokens_per_s`,
        `train/examples_per_s`."""
        secs = max(self.seconds, 1e-9)
        out = {f"{prefix}{k}": v for k, v in self.figures.items()}
        out.update(
            {
                f"{prefix}lr": self.lr,
                f"{prefix}grad_norm": self.grad_norm,
                f"{prefix}tokens_per_s": self.tokens / secs,
                f"{prefix}examples_per_s": self.examples / secs,
            }
        )
        out.update({f"{prefix}{k}": v for k, v in self.extra.items()})
        return out


def _num_tokens(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Real tokens of a host batch, as a host tensor (no conversion to a Python int: nothing waits)."""
    if "num_tokens" in batch:
        return batch["num_tokens"].reshape(())
    if "attention_mask" in batch:
        return batch["attention_mask"].sum()
    return torch.tensor(batch["input_ids"].numel())


def all_reduce_sum(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Sum `t` over the ranks of the process group (unchanged when there is none) and copy it to the host:
    the one host sync of a reading."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = t.to(device)
        dist.all_reduce(t)
    return t.cpu()


@dataclass
class StepSums:
    """One optimizer step's figures before any host sync: the task's sums and the gradient norm stay on the
    device; tokens and examples were counted from the host batches."""

    sums: Sums
    """On the device: this rank's sums of the task's record over the micro-batches."""
    grad_norm: torch.Tensor
    """() on the device: the global gradient norm before clipping (the same on every rank)."""
    lr: float
    tokens: torch.Tensor
    """() host tensor: this rank's real tokens."""
    examples: int
    start: float
    """`time.perf_counter()` when the step began."""
    device: torch.device
    flops: float = 0.0
    """This rank's model FLOPs, counted on the host from the batches (0 when the loop counts none)."""
    finite: torch.Tensor | None = None
    """() bool on the device: the loss sums, and without a gradient scaler the gradient norm, are finite (with
    one, a non-finite gradient only skips the optimizer step). None: not checked."""

    def read(
        self,
        *,
        tokens: torch.Tensor | None = None,
        examples: int | None = None,
        start: float | None = None,
        flops: float | None = None,
        window: list[tuple[int | None, torch.Tensor | None]] | None = None,
    ) -> StepStats:
        """All-reduce and copy to the host (waits for the step); throughput over `tokens`/`examples`/`flops`
        since `start` when given (several steps), else over this step. `window`: (step, `finite`) of each step
        since the last reading (default this one's); raises `NonFiniteLoss` naming the first that was not finite
        on some rank."""
        tokens = self.tokens if tokens is None else tokens
        examples = self.examples if examples is None else examples
        flops = self.flops if flops is None else flops
        window = [(None, self.finite)] if window is None else window
        flags = [f for _, f in window if f is not None]
        not_finite = (~torch.stack(flags)).double() if flags else torch.zeros(0, dtype=torch.float64)
        sums, work, not_finite = _sum_over_ranks(
            self.sums, Work.counted(tokens, examples, flops), not_finite, self.device
        )
        grad_norm = float(self.grad_norm.double().cpu())  # already complete: the all-reduce above waited for it
        if bool(not_finite.any()):  # every rank sees the same sums: all stop at this reading
            first = [step for step, f in window if f is not None][int(not_finite.nonzero()[0])]
            last = window[-1][0]
            raise _stop(
                "the training loss or gradient norm",
                first,
                f" ({f'step {last}: ' if last not in (None, first) else ''}train/loss "
                f"{sums.figures()['loss']:.4g}, train/grad_norm {grad_norm:.4g}, train/lr {self.lr:.4g})",
            )
        seconds = time.perf_counter() - (self.start if start is None else start)
        return StepStats(
            sums.figures(),
            self.lr,
            grad_norm,
            examples=int(work.examples),
            tokens=int(work.tokens),
            seconds=seconds,
            flops=float(work.flops),
        )


def _sum_over_ranks(sums: S, work: Work, flags: torch.Tensor, device: torch.device) -> tuple[S, Work, torch.Tensor]:
    """The task's sums, the work and the steps' not-finite flags, summed over the ranks in one all-reduce and
    copied to the host: the one place the records are packed into one tensor."""
    parts = [sums.pack(), work.pack().to(device), flags.to(device)]
    total = all_reduce_sum(torch.cat(parts), device)
    task, host, flags = total.split([len(p) for p in parts])
    return type(sums).unpack(task), Work.unpack(host), flags


class TrainFigures:
    """A loop's training figures between readings: `add` each step (nothing waits), `read` on the steps that
    log. Figures are the last step's (loss, accuracy, lr, grad_norm, as when every step is read); throughput
    counts every step since the previous reading, over the wall time up to the sync, so on a GPU it measures
    the work and not how fast the host queued it. A window starts when its first step starts, so evaluation
    and checkpoints (right after a reading) are not in it.
    """

    def __init__(self) -> None:
        self.last: StepSums | None = None
        self.added = 0
        self.window: list[tuple[int | None, torch.Tensor | None]] = []
        self.tokens, self.examples, self.flops, self.start = torch.zeros((), dtype=torch.int64), 0, 0.0, None

    def add(self, s: StepSums, step: int | None = None) -> None:
        """`s` is optimizer step `step` (by default the count of steps added): the number a non-finite one is
        named by when it is read."""
        self.last, self.added = s, self.added + 1
        self.window.append((self.added if step is None else step, s.finite))  # a device flag: nothing waits
        self.start = s.start if self.start is None else self.start
        self.tokens, self.examples, self.flops = (
            self.tokens + s.tokens,
            self.examples + s.examples,
            self.flops + s.flops,
        )

    def read(self) -> StepStats:
        """The figures since the last reading; `NonFiniteLoss` when a step among them was not finite."""
        assert self.last is not None, "read before any step"
        window, self.window = self.window, []
        stats = self.last.read(
            tokens=self.tokens, examples=self.examples, start=self.start, flops=self.flops, window=window
        )
        self.tokens, self.examples, self.flops, self.start = torch.zeros((), dtype=torch.int64), 0, 0.0, None
        return stats


def train_step(
    t: Trainable,
    micro_batches: Iterable[dict[str, torch.Tensor]],
    *,
    accumulation: int,
    sums: type[Sums],
    device: torch.device,
    precision: Precision = "fp32",
    max_grad_norm: float = 1.0,
    flops: Callable[[dict[str, torch.Tensor]], float] | None = None,
    loss: Callable[[Any], torch.Tensor] | None = None,
) -> StepSums:
    """Forward/backward `accumulation` micro-batches (gradients all-reduced on the last only), clip, step; the
    task's `sums` record (`Sums.of`) of each forward is added up on the device. Nothing here waits for the device
    (fp16's scaler aside: `GradScaler.step` reads its inf check). `flops` counts a host batch's model FLOPs (for
    MFU), from host tensors only. `loss(out)` is what a micro-batch backpropagates (default `out.loss /
    accumulation`, a mean of the micro-batches' means). The result's `finite` flag stays on the device
    (`TrainFigures.read` checks it)."""
    start = time.perf_counter()
    model, total, tokens, examples, work = t.model, None, torch.zeros((), dtype=torch.int64), 0, 0.0
    batches = iter(micro_batches)
    for k in range(accumulation):
        batch = next(batches)
        last = k == accumulation - 1
        sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        with sync:  # DDP all-reduces gradients only on the last micro-step
            out = forward(model, batch, device, precision)
            objective = out.loss / accumulation if loss is None else loss(out)
            (t.scaler.scale(objective) if t.scaler is not None else objective).backward()
        c = sums.of(out, batch).pack().detach()  # stays on the device, packed: one addition per micro-batch
        total = c if total is None else total + c
        tokens = tokens + _num_tokens(batch)
        examples += len(batch["input_ids"])
        if flops is not None:
            work += flops(batch)
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
    finite = torch.isfinite(total).all()  # on the device: read with the sums (a scaler skips a non-finite gradient)
    if t.scaler is None:
        finite = finite & torch.isfinite(grad_norm)
    return StepSums(sums.unpack(total), grad_norm.detach(), lr, tokens, examples, start, device, work, finite.detach())


@torch.no_grad()
def evaluate_sums(
    model: nn.Module,
    batches: Iterable[dict[str, torch.Tensor]],
    *,
    sums: type[S],
    device: torch.device,
    precision: Precision = "fp32",
) -> S:
    """The task's `sums` record summed over `batches` and over all ranks, on the host; every rank must call it,
    also one without batches. The model is left in the mode it was in."""
    was_training = model.training
    model.eval()
    total = sums.zeros(device).pack()
    for b in batches:
        total += sums.of(forward(model, b, device, precision), b).pack().to(device)  # no host copy per batch
    model.train(was_training)
    return sums.unpack(all_reduce_sum(total, device))
