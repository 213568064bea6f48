"""A pretraining worker's setup, before its first step: the model (fresh, or `model.init`'s weights through
`init`), DDP, the optimizer, the resumed state (weights, optimizer, RNGs, data position) and rank 0's logger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from pipeline import cluster
from pipeline.core.checkpoint import check_vocab, resume, trust
from pipeline.core.optim import OptimOptions, make_optimizer
from pipeline.core.precision import make_scaler
from pipeline.core.step import Trainable

if TYPE_CHECKING:
    from pipeline.config import Config
    from pipeline.pretrain.loader import PhasePlan
    from pipeline.tracking import RunLogger


@dataclass(frozen=True)
class PretrainHandoff:
    """What the driver gives every pretraining worker (`pipeline.pretrain.job.run_training`)."""

    cfg: Config
    """The run's config, `model.init` resolved to a local directory (`pipeline.pretrain.job.worker_config`)."""
    plans: list[PhasePlan]
    """Each phase's data: its shards, global batch and steps (the same for any number of workers)."""
    run_id: str
    """The MLflow run rank 0 logs into (created on the driver)."""
    tracking_uri: str
    vocab_sha256: str
    """The vocabulary the data was prepared with: a checkpoint of another one is refused."""
    at_start: tuple[str, ...] = ()
    """The run's checkpoint directory names in storage when the job started (`cluster.resume_checkpoint`)."""
    resume_from: str | None = None
    """The newest intact checkpoint then (path or URI), the driver's choice; None: none yet."""
    verified: tuple = ()
    """The checkpoint files the driver hashed (`core.checkpoint.verified`): not read again while unchanged."""
    on_step: Callable[[int, int], None] | None = None
    """Test hook called in every worker after each step (fault injection)."""


def initial_model(model_cfg, vocab_size: int, pad_token_id: int = 0) -> nn.Module:
    """The model pretraining starts from: `model.init`'s weights (pretrain/init.py) or a fresh model of the config's
    family (`model.build.build_model`: BertForPreTraining or ModernBertForMaskedLM), its vocabulary and pad id the
    prepared data's tokenizer's (`PreparedDataset.pad_id`), never the preset's."""
    from model.build import build_model

    if model_cfg.init is not None:  # continued pretraining: a local transformers directory here (pretrain/init.py)
        from pipeline.pretrain.init import load_initial

        return load_initial(model_cfg, vocab_size, pad_token_id)
    return build_model(model_cfg.encoder_config(vocab_size=vocab_size, pad_token_id=pad_token_id), "pretraining")


@dataclass
class Worker:
    """What `start_worker` sets up: where this worker is, what it trains, where it resumes, and (rank 0) its logger."""

    rank: int
    world: int
    device: torch.device
    trainable: Trainable
    step: int
    """Optimizer steps done: the data position follows from it (`PhasePlan.position`)."""
    log: RunLogger | None
    """Rank 0's; None on the other ranks."""
    source_tokens: dict[str, int] = field(default_factory=dict)
    """A mixture's tokens per source in the phases finished before `step` (the checkpoint's `source_tokens_before`)."""


def start_worker(h: PretrainHandoff) -> Worker:
    """This worker's model, optimizer and logger, resumed exactly (weights, optimizer, step, and the RNGs when the
    checkpoint was written by as many workers: `core.checkpoint.resume`) from the newest intact checkpoint: the
    driver's choice at the job's start, or Ray Train's when this job reported it (`cluster.resume_checkpoint`)."""
    cfg, plans = h.cfg, h.plans
    tc = cfg.train
    cluster.quiet_ray_data()
    rank, world, device = cluster.worker()
    torch.set_num_threads(max(1, int(tc.cpus_per_worker)))  # fixed thread count: bit-identical CPU math on restart
    torch.manual_seed(tc.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
    model = initial_model(cfg.model, plans[0].dataset.vocab_size, plans[0].dataset.pad_id)
    if tc.compile:  # each layer in place: names (checkpoints) unchanged; batches come at one width (rank_steps)
        model.bert.encoder.compile_layers()
    model = cluster.prepare_model(model)
    optimizer, scheduler = make_optimizer(model, OptimOptions.pretraining(tc))
    t = Trainable(model, optimizer, scheduler, make_scaler(device, tc.precision))
    trust(h.verified)  # the files the driver hashed: not read again while unchanged
    # pending: the metrics rank 0 could not send before the checkpoint (the tracking server was away)
    state, pending = resume(
        cluster.resume_checkpoint(h.at_start, h.resume_from),
        rank,
        t,
        {"step": 0},
        seed=tc.seed,
        run_id=h.run_id,
        world=world,
        check=lambda st, path: check_vocab(st, h.vocab_sha256, path),
    )
    nodes = cluster.num_nodes(world)  # a collective: every rank takes part
    log = None
    if rank == 0:  # mlflow loads on the logging rank only (seconds of CPU per process)
        from pipeline.tracking import RunLogger

        log = RunLogger(
            h.run_id,
            h.tracking_uri,
            cfg.tracking.system_metrics_every_s,
            total_steps=tc.max_steps,
            log_every_steps=tc.log_every_steps,
            background=True,
            pending=pending,
        )
        # where the workers ran: a multi-node run shows num_nodes > 1
        log.set_tags({"world_size": world, "num_nodes": nodes, "device": str(device)})
    return Worker(rank, world, device, t, state["step"], log, state.get("source_tokens_before", {}))
