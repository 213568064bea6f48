"""The pretraining loop that runs in every Ray Train worker: its data order over the phases, its step and its
evaluation, on the skeleton it shares with fine-tuning (`pipeline.core.loop`: step, log, evaluate, checkpoint).
Its setup (build, resume, logger) is `worker`, its data `feed`, its figures `metrics`. The MLM/NSP sums stay on the
device and are all-reduced and copied to the host only on the steps that log (`train.log_every_steps`), evaluate
or checkpoint, and on the last: a GPU never waits for the host in between. On a GPU the step line also carries
`train/mfu`: model FLOPs counted on the host from each batch (`metrics.flop_counter`) over the device's dense bf16
peak (`model.flops`). A step whose loss is not finite stops the run at the next reading, before any checkpoint
(`pipeline.core.step`).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from pipeline import cluster
from pipeline.console import say
from pipeline.core.loop import Loop, Planned
from pipeline.core.step import evaluate_sums
from pipeline.pretrain.feed import LoaderOptions, eval_batches, nothing_held_out, rank_steps
from pipeline.pretrain.loader import Step
from pipeline.pretrain.metrics import MlmSums, device_peak, flop_counter, step_loss
from pipeline.pretrain.worker import PretrainHandoff, start_worker


def plus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """Tokens per source, added.

    >>> plus({"a": 1}, {"a": 2, "b": 3})
    {'a': 3, 'b': 3}
    """
    return {n: a.get(n, 0) + b.get(n, 0) for n in {**a, **b}}


def finished(earlier: dict[str, int], batch: Step, last_of_phase: bool) -> dict[str, dict[str, int]]:
    """What a checkpoint keeps of a mixture's counts: each source's tokens in the phases finished at its step
    (`source_tokens_before`, with this phase when the step is its last); nothing without a mixture."""
    if batch.source_tokens is None and not earlier:
        return {}
    return {"source_tokens_before": plus(earlier, batch.source_tokens or {}) if last_of_phase else earlier}


def train_loop_per_worker(handoff: PretrainHandoff) -> None:
    """Pretrain with DDP from where `start_worker` resumed (step 0, or a checkpoint exactly)."""
    cfg, plans = handoff.cfg, handoff.plans
    tc = cfg.train
    worker = start_worker(handoff)
    rank, world, device, log = worker.rank, worker.world, worker.device, worker.log
    model = worker.trainable.model
    ends = np.cumsum([p.steps for p in plans]).tolist()  # each phase's last step
    loader = LoaderOptions.of(cfg, device)
    peak = device_peak(device, say=say if rank == 0 else None)  # a GPU's: train/mfu; None on a CPU
    evals: dict[int, list | None] = {}  # each phase's held-out batches, read at its first evaluation

    def planned() -> Iterator[Planned]:
        """The run's steps from where it resumed: each phase's global batches in their order (`rank_steps`)."""
        step = worker.step
        earlier = dict(worker.source_tokens)  # a mixture's tokens per source in the phases finished before this one
        while step < tc.max_steps:
            phase = next(i for i, e in enumerate(ends) if step < e)
            plan, begun = plans[phase], ends[phase] - plans[phase].steps  # the phase's first step
            batches = iter(rank_steps(plan, phase, rank, world, step - begun, loader))
            if log is not None and (why := nothing_held_out(plan, tc.num_eval_shards)) is not None:
                say(f"[train] phase {phase}: no evaluation, nothing is held out ({why})")
            while step < ends[phase]:
                batch = next(batches)  # this rank's share of the step's global batch; the loss is the whole batch's
                step += 1
                figures: dict[str, float] = {"train/phase": phase}
                if batch.source_tokens is not None:  # a mixture: each source's tokens trained on so far
                    so_far = plus(earlier, batch.source_tokens)
                    figures.update({f"train/source_tokens/{n}": v for n, v in so_far.items()})
                yield Planned(
                    step,
                    batch.micro_batches,
                    len(batch.micro_batches),
                    evaluating=bool(tc.eval_every_steps and step % tc.eval_every_steps == 0) or step == tc.max_steps,
                    checkpointing=step % tc.checkpoint_every_steps == 0 or step == tc.max_steps,
                    loss=lambda out, b=batch: step_loss(out, b.masked_tokens, b.nsp_examples, world),
                    figures=figures,
                    state={
                        "position": {"phase": phase, **plan.position(step - begun)},
                        "world_size": world,
                        "vocab_sha256": handoff.vocab_sha256,
                        **finished(earlier, batch, step == ends[phase]),
                    },
                    where=phase,
                )
            earlier = plus(earlier, batch.source_tokens or {})  # the phase is done: its tokens join the earlier ones

    def evaluate(p: Planned) -> dict[str, float]:
        """The phase's held-out figures, on every rank (their sums are all-reduced); rank 0 logs them. None held
        out: nothing evaluated (never the training rows)."""
        phase = p.where
        if phase not in evals:
            evals[phase] = eval_batches(plans[phase], phase, rank, world, tc.eval_batches * tc.num_workers, loader)
        if evals[phase] is not None:
            sums = evaluate_sums(model, evals[phase], sums=MlmSums, device=device, precision=tc.precision)
            if log is not None:
                log.log_metrics(sums.eval_metrics(), p.step)
        return {}  # the report carries the step and the training loss only

    Loop(
        worker.trainable,
        MlmSums,
        device,
        rank,
        world,
        log,
        handoff.run_id,
        tc.max_steps,
        precision=tc.precision,
        max_grad_norm=tc.max_grad_norm,
        log_every_steps=tc.log_every_steps,
        background=cluster.uploads_in_background(tc.checkpoint_upload, tc.storage_path),
        flops=flop_counter(getattr(model, "module", model).config) if peak else None,
        peak=peak,
        on_step=handoff.on_step,
    ).run(planned(), evaluate)
