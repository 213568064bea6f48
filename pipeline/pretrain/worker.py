"""A pretraining worker's setup, before its first step: the model (fresh, or `model.init`'s weights through
`init`), DDP, the optimizer, the resumed state (weights, optimizer, RNGs, data position) and rank 0's logger.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pipeline import cluster
from pipeline.core.checkpoint import check_vocab, load_checkpoint, trust
from pipeline.core.optim import make_optimizer
from pipeline.core.precision import make_scaler
from pipeline.core.step import Trainable
from pipeline.tracking.outbox import read_pending

if TYPE_CHECKING:
    from pipeline.tracking import RunLogger


def build_model(model_cfg, vocab_size: int) -> nn.Module:
    from model import BertForPreTraining

    if model_cfg.init is not None:  # continued pretraining: a local transformers directory here (pretrain/init.py)
        from pipeline.pretrain.init import load_initial

        return load_initial(model_cfg, vocab_size)
    return BertForPreTraining(model_cfg.bert_config(vocab_size=vocab_size))


@dataclass
class Worker:
    """What `start_worker` sets up: where this worker is, what it trains, where it resumes, and (rank 0) its logger."""

    rank: int
    world: int
    device: torch.device
    trainable: Trainable
    step: int
    position: dict[str, int]
    """The data position after the last micro-batch trained: phase, epoch, micro."""
    log: RunLogger | None
    """Rank 0's; None on the other ranks."""


def start_worker(config: dict[str, Any]) -> Worker:
    """This worker's model, optimizer and logger, resumed from `ray.train.get_checkpoint()` (or, when the driver
    found that one damaged, the newest intact one) exactly: weights, optimizer, RNGs, data position."""
    from pipeline.tracking import RunLogger

    cfg, plans = config["cfg"], config["plans"]
    tc = cfg.train
    cluster.quiet_ray_data()
    rank, world, device = cluster.worker()
    torch.set_num_threads(max(1, int(tc.cpus_per_worker)))  # fixed thread count: bit-identical CPU math on restart
    torch.manual_seed(tc.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
    model = build_model(cfg.model, plans[0].dataset.vocab_size)
    if tc.compile:  # each layer in place: names (checkpoints) unchanged; batches come at one width (RankFeed)
        model.bert.encoder.compile_layers()
    model = cluster.prepare_model(model)
    optimizer, scheduler = make_optimizer(model, tc.optimizer, tc.lr, tc.weight_decay, warmup_steps=tc.warmup_steps,
                                          total_steps=tc.max_steps, schedule=tc.schedule, power=tc.poly_power,
                                          head_only_steps=tc.head_only_steps)
    t = Trainable(model, optimizer, scheduler, make_scaler(device, tc.precision))
    state: dict[str, Any] = {"step": 0, "position": {"phase": 0, "epoch": 0, "micro": 0}}
    pending = None  # metrics rank 0 could not send before the checkpoint (the tracking server was away)
    trust(config.get("verified", ()))  # the files the driver hashed: not read again while unchanged
    if (ckpt := cluster.resume_checkpoint(config.get("damaged", ()), config.get("resume_from"))) is not None:
        with ckpt.as_directory() as d:
            state = load_checkpoint(d, rank, t)
            pending = read_pending(d, config["run_id"]) if rank == 0 else None
        check_vocab(state, config["vocab_sha256"], ckpt.path)
        cluster.say(f"[rank {rank}] resumed at step {state['step']} position {state['position']}")
    else:
        torch.manual_seed(tc.seed * 1000 + rank + 1)  # each rank its own dropout stream
    nodes = cluster.num_nodes(world)  # a collective: every rank takes part
    log = RunLogger(config["run_id"], config["tracking_uri"], cfg.tracking.system_metrics_every_s, total_steps=tc.max_steps,
                    log_every_steps=tc.log_every_steps, background=True, pending=pending) if rank == 0 else None
    if log is not None:  # where the workers ran: a multi-node run shows num_nodes > 1
        log.set_tags({"world_size": world, "num_nodes": nodes, "device": str(device)})
    return Worker(rank, world, device, t, state["step"], state["position"], log)
