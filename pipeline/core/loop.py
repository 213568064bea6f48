"""The training loop's skeleton, shared by pretraining (`pipeline.pretrain.loop`) and fine-tuning
(`pipeline.finetune.loop`): for each optimizer step a job plans, train it (`pipeline.core.step.train_step`), read
and log its figures when due, evaluate, checkpoint and report, then call the test hook. A job says only what is its
own: the data order and which steps evaluate and checkpoint (the `Planned` steps it yields, one at a time, after the
previous one is done), its evaluation, and what its checkpoints hold beyond the weights.

On a step that checkpoints the figures are read first (on every rank: a collective; `NonFiniteLoss` when a step
since the last reading was not finite), then the weights are checked (`check_finite_weights`), then the job
evaluates, then the checkpoint is written and reported: nothing is evaluated, checkpointed or registered from a
non-finite state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch

from model.flops import mfu
from pipeline import cluster
from pipeline.core.checkpoint import save_checkpoint
from pipeline.core.precision import Precision
from pipeline.core.step import Sums, Trainable, TrainFigures, check_finite_weights, train_step
from pipeline.tracking.outbox import write_pending

if TYPE_CHECKING:
    from pipeline.tracking import RunLogger


@dataclass
class Planned:
    """One optimizer step as a job plans it."""

    step: int
    """Its number, counted from 1 over the whole run."""
    micro_batches: Iterable[dict[str, torch.Tensor]]
    accumulation: int
    """Micro-batches it takes from `micro_batches`."""
    evaluating: bool = False
    checkpointing: bool = False
    loss: Callable[[Any], torch.Tensor] | None = None
    """What a micro-batch backpropagates (None: `train_step`'s mean of the micro-batches' means)."""
    figures: dict[str, float] = field(default_factory=dict)
    """The job's own `train/*` figures of this step (its phase or epoch, a mixture's tokens), logged with it."""
    state: dict[str, Any] = field(default_factory=dict)
    """What a checkpoint of this step keeps beyond the step, the run and the weights: the data position (and
    pretraining's world size, vocabulary and a mixture's finished phases)."""
    report: dict[str, Any] = field(default_factory=dict)
    """What the checkpoint's report to Ray Train carries beyond the step and the loss."""
    where: Any = None
    """The job's own record of where the step is, for its evaluation (pretraining: the phase)."""


@dataclass
class Loop:
    """One worker's loop: what it trains, with which figures, where it logs and checkpoints."""

    trainable: Trainable
    sums: type[Sums]
    """The task's figures (`pipeline.core.step.Sums`)."""
    device: torch.device
    rank: int
    world: int
    log: RunLogger | None
    """Rank 0's logger; None on the other ranks (and for a run that logs nothing)."""
    run_id: str | None
    max_steps: int
    precision: Precision = "fp32"
    max_grad_norm: float = 1.0
    log_every_steps: int = 1
    background: bool = False
    """Checkpoints uploaded in the background (`cluster.uploads_in_background`)."""
    flops: Callable[[dict[str, torch.Tensor]], float] | None = None
    """A host batch's model FLOPs, with `peak` for `train/mfu`."""
    peak: float | None = None
    """The device's dense bf16 peak FLOP/s (`model.flops`); None: no `train/mfu`."""
    on_step: Callable[[int, int], None] | None = None
    """Test hook called with (step, rank) after each step (fault injection)."""

    def run(
        self,
        planned: Iterable[Planned],
        evaluate: Callable[[Planned], dict[str, Any]],
        state: Callable[[], dict[str, Any]] = dict,
        write: Callable[[str], None] | None = None,
    ) -> None:
        """Train the `planned` steps. `evaluate(p)` on the steps that evaluate (every rank calls it): what it
        returns joins the checkpoint's report. `state()`: the job's checkpoint fields read when one is written
        (fine-tuning's best score so far); `write(directory)` adds the job's own files to every checkpoint."""
        t, figures = self.trainable, TrainFigures()  # sums stay on the device between the steps that read them
        for p in planned:
            figures.add(
                train_step(
                    t,
                    p.micro_batches,
                    accumulation=p.accumulation,
                    sums=self.sums,
                    device=self.device,
                    precision=self.precision,
                    max_grad_norm=self.max_grad_norm,
                    flops=self.flops,
                    loss=p.loss,
                ),
                p.step,
            )
            if p.step % self.log_every_steps == 0 or p.evaluating or p.checkpointing:  # the host syncs, every rank
                stats = figures.read()  # NonFiniteLoss (every rank) if a step since the last reading was not finite
                if self.log is not None:
                    metrics = {**stats.metrics(), **p.figures}
                    if self.peak:  # on the datasheet's dense bf16 basis (model.flops), per GPU
                        metrics["train/mfu"] = mfu(stats.flops, stats.seconds, self.peak, self.world)
                    self.log.step(p.step, metrics)
            if p.checkpointing:
                check_finite_weights(t.model, p.step)  # never an evaluation or a checkpoint of NaN or inf weights
            evaluated = evaluate(p) if p.evaluating else {}
            if p.checkpointing:
                with cluster.checkpoint_dir(self.background) as d:  # kept until its upload is done
                    if self.log is not None:  # what the tracking server has not got yet travels with the checkpoint
                        write_pending(d, self.run_id, self.log.pending())
                    kept = {"step": p.step, **p.state, "run_id": self.run_id, "max_steps": self.max_steps, **state()}
                    # in the background rank 0's weights and optimizer state are a snapshot, written by the upload
                    deferred = save_checkpoint(d, self.rank, t, kept, background=self.background)
                    if write is not None:
                        write(d)
                    report = {"step": p.step, **p.report, "loss": stats.loss, **evaluated}
                    cluster.report(report, d, background=self.background, deferred=deferred)
            if self.on_step is not None:
                self.on_step(p.step, self.rank)
        if self.log is not None:
            self.log.close(wait_s=5)  # what is still unsent, the last checkpoint holds
