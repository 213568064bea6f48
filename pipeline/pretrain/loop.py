"""The pretraining loop that runs in every Ray Train worker, top to bottom: build, resume, step, log, evaluate,
checkpoint. The pieces it calls are shared with fine-tuning (`pipeline.core`) or are the data feed (`loader`).

The MLM/NSP figures are kept as sums — (mlm_loss_sum, mlm_correct, mlm_count, nsp_loss_sum, nsp_correct,
nsp_count) — so that they are exact over accumulation micro-steps and ranks (`counts`, `summarise`). They stay on
the device (`TrainFigures`) and are all-reduced and copied to the host only on the steps that log
(`train.log_every_steps`), evaluate or checkpoint, and on the last: a GPU never waits for the host in between.
"""

from __future__ import annotations

import tempfile
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import nn

from pipeline.core import launcher
from pipeline.core.checkpoint import check_vocab, load_checkpoint, save_checkpoint
from pipeline.core.optim import make_optimizer
from pipeline.core.precision import make_scaler
from pipeline.core.step import Trainable, TrainFigures, evaluate_sums, train_step
from pipeline.outage import read_pending, write_pending
from pipeline.pretrain.loader import Batches, PhasePlan, epoch_micro_batches

NUM_COUNTS = 6


def counts(out, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(mlm_loss_sum, mlm_correct, mlm_count, nsp_loss_sum, nsp_correct, nsp_count) of one forward, float64."""
    mc, nc = out.mlm_count.double(), out.nsp_count.double()
    return torch.stack([out.mlm_loss.detach().double() * mc, out.mlm_correct.double(), mc,
                        out.nsp_loss.detach().double() * nc, out.nsp_correct.double(), nc])


def summarise(c: torch.Tensor) -> dict[str, float]:
    """Summed counts -> loss (MLM + NSP), mlm_loss, mlm_accuracy and, when the batches had next-sentence labels
    (`data.nsp`), nsp_loss and nsp_accuracy: MLM-only data has none, and a 0 would read as a model that fails NSP.

    >>> summarise(torch.tensor([6.0, 1, 4, 0, 0, 0], dtype=torch.float64))
    {'loss': 1.5, 'mlm_loss': 1.5, 'mlm_accuracy': 0.25}
    >>> summarise(torch.tensor([6.0, 1, 3, 1.4, 1, 2]))["nsp_accuracy"]
    0.5
    """
    mlm_loss = (c[0] / c[2].clamp(min=1)).item()
    out = {"loss": mlm_loss, "mlm_loss": mlm_loss, "mlm_accuracy": (c[1] / c[2].clamp(min=1)).item()}
    if c[5] > 0:
        nsp_loss = (c[3] / c[5]).item()
        out.update({"loss": mlm_loss + nsp_loss, "nsp_loss": nsp_loss, "nsp_accuracy": (c[4] / c[5]).item()})
    return out


def eval_metrics(c: torch.Tensor) -> dict[str, float]:
    """`eval/...` figures of summed held-out counts."""
    return {**{f"eval/{k}": v for k, v in summarise(c).items()}, "eval/masked_tokens": c[2].item()}


def build_model(model_cfg, vocab_size: int) -> nn.Module:
    from model import BertForPreTraining

    if model_cfg.init is not None:  # continued pretraining: a local transformers directory here (pretrain/init.py)
        from pipeline.pretrain.init import load_initial

        return load_initial(model_cfg, vocab_size)
    return BertForPreTraining(model_cfg.bert_config(vocab_size=vocab_size))


class RankFeed:
    """This rank's micro-batches of one phase from `position` on, epoch after epoch; `position` is always the
    one after the last micro-batch handed out (what a checkpoint stores)."""

    def __init__(self, plan: PhasePlan, phase: int, rank: int, seed: int, shuffle_rows: int, position: dict[str, int],
                 pin_memory: bool = False, compiled: bool = False):
        import ray.train

        self.plan, self.phase, self.rank, self.seed, self.shuffle_rows = plan, phase, rank, seed, shuffle_rows
        self.position = dict(position)
        self.shard = ray.train.get_dataset_shard(f"p{phase}_r{rank}")
        self.to_batch = Batches(plan, seed, pin_memory, pad_to=plan.dataset.max_seq_length if compiled else None)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        mine, mb = self.plan.ranks[self.rank], self.plan.micro_batch_size
        epoch, start = self.position["epoch"], self.position["micro"]
        while True:
            if start < mine.rows // mb:
                tables = self.shard.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2)
                for idx, tbl in epoch_micro_batches(
                    tables, skip=0 if self.plan.materialized else mine.skip, num_rows=mine.rows, chunk_rows=self.shuffle_rows,
                    micro_batch_size=mb, seed_key=[self.seed, self.phase, epoch, self.rank], start=start,
                ):
                    self.position = {"phase": self.phase, "epoch": epoch, "micro": idx + 1}
                    yield self.to_batch(tbl, epoch)
            epoch, start = epoch + 1, 0


def eval_batches(plan: PhasePlan, phase: int, rank: int, world: int, seed: int, limit: int,
                 compiled: bool = False) -> list[dict[str, torch.Tensor]]:
    """This rank's share of the held-out batches (fixed masks: epoch 0), read once and kept in memory."""
    import ray.train

    if not plan.eval_files:
        return []
    to_batch, out = Batches(plan, seed, pad_to=plan.dataset.max_seq_length if compiled else None), []
    tables = ray.train.get_dataset_shard(f"p{phase}_eval").iter_batches(batch_size=plan.micro_batch_size, batch_format="pyarrow")
    for i, tbl in enumerate(tables):
        if limit and i >= limit * world:
            break
        if i % world == rank:  # ranks take turns; their sums are all-reduced
            out.append(to_batch(tbl, 0))
    return out


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Pretrain with DDP; resumes from `ray.train.get_checkpoint()` (or, when the driver found that one damaged,
    the newest intact one) exactly (weights, optimizer, RNGs, data)."""
    from pipeline.tracking import RunLogger

    cfg, plans, vocab_sha = config["cfg"], config["plans"], config["vocab_sha256"]
    on_step: Callable[[int, int], None] | None = config.get("on_step")  # test hook: fault injection
    tc = cfg.train
    launcher.quiet_ray_data()
    rank, world, device = launcher.worker()
    torch.set_num_threads(max(1, int(tc.cpus_per_worker)))  # fixed thread count: bit-identical CPU math on restart
    torch.manual_seed(tc.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
    model = build_model(cfg.model, plans[0].dataset.vocab_size)
    if tc.compile:  # in place: parameter names (checkpoints) unchanged; batches come at one width (RankFeed)
        model.bert.encoder.compile(dynamic=False)
    model = launcher.prepare_model(model)
    optimizer, scheduler = make_optimizer(model, tc.optimizer, tc.lr, tc.weight_decay, warmup_steps=tc.warmup_steps,
                                          total_steps=tc.max_steps, schedule=tc.schedule, power=tc.poly_power)
    t = Trainable(model, optimizer, scheduler, make_scaler(device, tc.precision))
    state: dict[str, Any] = {"step": 0, "position": {"phase": 0, "epoch": 0, "micro": 0}}
    pending = None  # metrics rank 0 could not send before the checkpoint (the tracking server was away)
    if (ckpt := launcher.resume_checkpoint(config.get("damaged", ()), config.get("resume_from"))) is not None:
        with ckpt.as_directory() as d:
            state = load_checkpoint(d, rank, t)
            pending = read_pending(d, config["run_id"]) if rank == 0 else None
        check_vocab(state, vocab_sha, ckpt.path)
        launcher.say(f"[rank {rank}] resumed at step {state['step']} position {state['position']}")
    else:
        torch.manual_seed(tc.seed * 1000 + rank + 1)  # each rank its own dropout stream
    nodes = launcher.num_nodes(world)  # a collective: every rank takes part
    log = RunLogger(config["run_id"], config["tracking_uri"], cfg.tracking.system_metrics_every_s, total_steps=tc.max_steps,
                    log_every_steps=tc.log_every_steps, background=True, pending=pending) if rank == 0 else None
    if log is not None:  # where the workers ran: a multi-node run shows num_nodes > 1
        log.set_tags({"world_size": world, "num_nodes": nodes, "device": str(device)})

    ends = np.cumsum([p.steps for p in plans]).tolist()
    step, position, evals = state["step"], state["position"], {}
    figures = TrainFigures()  # sums stay on the device between the steps that read them
    while step < tc.max_steps:
        phase = next(i for i, e in enumerate(ends) if step < e)
        plan = plans[phase]
        if position["phase"] != phase:
            position = {"phase": phase, "epoch": 0, "micro": 0}
        feed = RankFeed(plan, phase, rank, tc.seed, tc.shuffle_buffer_rows, position, pin_memory=device.type == "cuda",
                        compiled=tc.compile)
        batches = iter(feed)
        while step < ends[phase]:
            figures.add(train_step(t, batches, accumulation=plan.accumulation_steps, counts=counts, summarise=summarise,
                                   device=device, precision=tc.precision, max_grad_norm=tc.max_grad_norm))
            step += 1
            evaluating = (tc.eval_every_steps and step % tc.eval_every_steps == 0) or step == tc.max_steps
            checkpointing = step % tc.checkpoint_every_steps == 0 or step == tc.max_steps
            if step % tc.log_every_steps == 0 or evaluating or checkpointing:  # the host syncs, on every rank
                stats = figures.read()
                if log is not None:
                    log.step(step, {**stats.metrics(), "train/phase": phase})
            if evaluating:
                if phase not in evals:
                    evals[phase] = eval_batches(plan, phase, rank, world, tc.seed, tc.eval_batches, tc.compile)
                sums = evaluate_sums(t.model, evals[phase], counts=counts, size=NUM_COUNTS, device=device, precision=tc.precision)
                if log is not None:
                    log.log_metrics(eval_metrics(sums), step)
            if checkpointing:
                with tempfile.TemporaryDirectory() as d:
                    if log is not None:  # what the tracking server has not got yet travels with the checkpoint
                        write_pending(d, config["run_id"], log.pending())
                    save_checkpoint(d, rank, t, {"step": step, "position": feed.position, "vocab_sha256": vocab_sha,
                                                 "run_id": config["run_id"], "max_steps": tc.max_steps})
                    launcher.report({"step": step, "loss": stats.loss}, d)
            if on_step is not None:
                on_step(step, rank)
    if log is not None:
        log.close(wait_s=5)  # what is still unsent, the last checkpoint holds
