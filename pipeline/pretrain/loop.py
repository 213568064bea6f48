"""The pretraining loop that runs in every Ray Train worker, top to bottom: step, log, evaluate, checkpoint.
Its setup (build, resume, logger) is `worker`, its data `feed`, its figures `metrics`; the step itself is shared
with fine-tuning (`pipeline.core`). The MLM/NSP sums stay on the device (`TrainFigures`) and are all-reduced and
copied to the host only on the steps that log (`train.log_every_steps`), evaluate or checkpoint, and on the last:
a GPU never waits for the host in between. On a GPU the step line also carries `train/mfu`: model FLOPs counted on
the host from each batch (`metrics.flop_counter`) over the device's dense bf16 peak (`model.flops`). A step
whose loss is not finite stops the run at the next reading, before any checkpoint (`pipeline.core.step`).
"""

from __future__ import annotations

import numpy as np

from model.flops import mfu
from pipeline import cluster
from pipeline.console import say
from pipeline.core.checkpoint import save_checkpoint
from pipeline.core.step import TrainFigures, check_finite_weights, evaluate_sums, train_step
from pipeline.pretrain.feed import LoaderOptions, eval_batches, nothing_held_out, rank_steps
from pipeline.pretrain.metrics import MlmSums, device_peak, flop_counter, step_loss
from pipeline.pretrain.worker import PretrainHandoff, start_worker
from pipeline.tracking.outbox import write_pending


def plus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """Tokens per source, added.

    >>> plus({"a": 1}, {"a": 2, "b": 3})
    {'a': 3, 'b': 3}
    """
    return {n: a.get(n, 0) + b.get(n, 0) for n in {**a, **b}}


def finished(earlier: dict[str, int], s, last_of_phase: bool) -> dict[str, dict[str, int]]:
    """What a checkpoint keeps of a mixture's counts: each source's tokens in the phases finished at its step
    (`source_tokens_before`, with this phase when the step is its last); nothing without a mixture."""
    if s.source_tokens is None and not earlier:
        return {}
    return {"source_tokens_before": plus(earlier, s.source_tokens or {}) if last_of_phase else earlier}


def train_loop_per_worker(h: PretrainHandoff) -> None:
    """Pretrain with DDP from where `start_worker` resumed (step 0, or a checkpoint exactly)."""
    cfg, plans, vocab_sha, on_step = h.cfg, h.plans, h.vocab_sha256, h.on_step
    tc = cfg.train
    w = start_worker(h)
    rank, world, device, t, log = w.rank, w.world, w.device, w.trainable, w.log

    ends = np.cumsum([p.steps for p in plans]).tolist()
    step, evals = w.step, {}
    earlier = dict(w.source_tokens)  # a mixture's tokens per source in the phases finished before this one
    background = cluster.uploads_in_background(tc.checkpoint_upload, tc.storage_path)
    figures = TrainFigures()  # sums stay on the device between the steps that read them
    peak = device_peak(device, say=say if rank == 0 else None)  # a GPU's: train/mfu; None on a CPU
    loader = LoaderOptions.of(cfg, device)
    flops = flop_counter(getattr(t.model, "module", t.model).config) if peak else None
    while step < tc.max_steps:
        phase = next(i for i, e in enumerate(ends) if step < e)
        plan, begun = plans[phase], ends[phase] - plans[phase].steps  # the phase's first step
        steps = iter(rank_steps(plan, phase, rank, world, step - begun, loader))
        if log is not None and (why := nothing_held_out(plan, tc.num_eval_shards)) is not None:
            say(f"[train] phase {phase}: no evaluation, nothing is held out ({why})")
        while step < ends[phase]:
            s = next(steps)  # this rank's share of the step's global batch; the loss is the whole batch's mean
            step += 1
            figures.add(
                train_step(
                    t,
                    s.micro_batches,
                    accumulation=len(s.micro_batches),
                    sums=MlmSums,
                    device=device,
                    precision=tc.precision,
                    max_grad_norm=tc.max_grad_norm,
                    flops=flops,
                    loss=lambda out, s=s: step_loss(out, s.masked_tokens, s.nsp_examples, world),
                ),
                step,
            )
            evaluating = (tc.eval_every_steps and step % tc.eval_every_steps == 0) or step == tc.max_steps
            checkpointing = step % tc.checkpoint_every_steps == 0 or step == tc.max_steps
            if step % tc.log_every_steps == 0 or evaluating or checkpointing:  # the host syncs, on every rank
                stats = figures.read()  # NonFiniteLoss (every rank) if a step since the last reading was not finite
                if log is not None:
                    metrics = {**stats.metrics(), "train/phase": phase}
                    if peak:  # on the datasheet's dense bf16 basis (model.flops), per GPU
                        metrics["train/mfu"] = mfu(stats.flops, stats.seconds, peak, world)
                    if s.source_tokens is not None:  # a mixture: each source's tokens trained on so far
                        so_far = plus(earlier, s.source_tokens)
                        metrics.update({f"train/source_tokens/{n}": v for n, v in so_far.items()})
                    log.step(step, metrics)
            if evaluating:
                if phase not in evals:  # None: nothing held out, nothing evaluated (never the training rows)
                    evals[phase] = eval_batches(plan, phase, rank, world, tc.eval_batches * tc.num_workers, loader)
                if evals[phase] is not None:
                    sums = evaluate_sums(t.model, evals[phase], sums=MlmSums, device=device, precision=tc.precision)
                    if log is not None:
                        log.log_metrics(sums.eval_metrics(), step)
            if checkpointing:
                check_finite_weights(t.model, step)  # never a checkpoint of NaN or inf weights
                with cluster.checkpoint_dir(background) as d:  # kept until its upload is done
                    if log is not None:  # what the tracking server has not got yet travels with the checkpoint
                        write_pending(d, h.run_id, log.pending())
                    # in the background rank 0's weights and optimizer state are a snapshot, written by the upload
                    deferred = save_checkpoint(
                        d,
                        rank,
                        t,
                        {
                            "step": step,
                            "position": {"phase": phase, **plan.position(step - begun)},
                            "world_size": world,
                            "vocab_sha256": vocab_sha,
                            "run_id": h.run_id,
                            "max_steps": tc.max_steps,
                            **finished(earlier, s, step == ends[phase]),
                        },
                        background=background,
                    )
                    cluster.report({"step": step, "loss": stats.loss}, d, background=background, deferred=deferred)
            if on_step is not None:
                on_step(step, rank)
        earlier = plus(earlier, s.source_tokens or {})  # the phase is done: its tokens join the earlier ones
    if log is not None:
        log.close(wait_s=5)  # what is still unsent, the last checkpoint holds
