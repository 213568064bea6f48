"""What a Ray Train worker reads: its share of each optimizer step's global batch in a phase (`rank_steps`, from
any step on, at any world size) and its share of the held-out batches (`eval_batches`), from the Ray Data shards
the job hands it. The pure pieces (the global order, the split among ranks, collate) are in `loader`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from model.family import BERT, ModelFamily
from pipeline.pretrain.loader import Batches, PhasePlan, StepFeed

if TYPE_CHECKING:
    from pipeline.config import Config


@dataclass(frozen=True)
class LoaderOptions:
    """How a worker turns a phase's rows into batches, made once from the config (`of`)."""

    seed: int
    """The run's seed: the shuffle and the dynamic masks are functions of it."""
    shuffle_rows: int
    """`train.shuffle_buffer_rows`: rows per chunk of the seeded permutation."""
    compiled: bool = False
    """`train.compile`: every batch padded to the phase's max_seq_length (one shape, no recompilation)."""
    unpad: bool = False
    """`train.unpad`: padding passed as real tokens (the unpadded path)."""
    family: ModelFamily = BERT
    """What the model's batches hold (`pipeline.pretrain.loader.collate`)."""
    pin_memory: bool = False
    """Page-locked training batches, for a CUDA device's asynchronous copies."""

    @classmethod
    def of(cls, cfg: Config, device: torch.device) -> LoaderOptions:
        tc = cfg.train
        return cls(tc.seed, tc.shuffle_buffer_rows, tc.compile, tc.unpad, cfg.model.family, device.type == "cuda")

    def batches(self, plan: PhasePlan, pin_memory: bool) -> Batches:
        """Rows of `plan` -> batches (`Batches`)."""
        pad_to = plan.dataset.max_seq_length if self.compiled else None
        return Batches(plan, self.seed, pin_memory, pad_to=pad_to, unpad=self.unpad, family=self.family)


def rank_steps(plan: PhasePlan, phase: int, rank: int, world: int, done: int, options: LoaderOptions) -> StepFeed:
    """This rank's `Step`s of `phase` after its first `done` optimizer steps, read from the phase's training
    Dataset (`p<phase>_train`, every row in file order; each rank iterates all of it)."""
    import ray.train

    shard = ray.train.get_dataset_shard(f"p{phase}_train")
    return StepFeed(
        plan,
        phase,
        rank,
        world,
        options.seed,
        options.shuffle_rows,
        done,
        lambda: shard.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2),
        options.batches(plan, options.pin_memory),
    )


def nothing_held_out(plan: PhasePlan, num_eval_shards: int) -> str | None:
    """Why `plan` holds no rows out (None when it does). Then nothing is evaluated, in the loop or at the end
    (`pipeline.pretrain.job.evaluate_stage`): an evaluation on training rows would read as a held-out figure.

    >>> nothing_held_out(PhasePlan(None, 1, 1, 1, ("a", "b"), 2, (), False), 0)
    'train.num_eval_shards is 0'
    >>> nothing_held_out(PhasePlan(None, 1, 1, 1, ("a",), 1, (), False), 1)
    'train.num_eval_shards 1 holds out no shard of a dataset of 1 shard: one is always left to train on'
    """
    if plan.eval_files:
        return None
    if num_eval_shards == 0:
        return "train.num_eval_shards is 0"
    return (
        f"train.num_eval_shards {num_eval_shards} holds out no shard of a dataset of {len(plan.train_files)} "
        "shard: one is always left to train on"
    )


def eval_batches(
    plan: PhasePlan, phase: int, rank: int, world: int, limit: int, options: LoaderOptions
) -> list[dict[str, torch.Tensor]] | None:
    """This rank's share of the held-out batches (fixed masks: epoch 0), read once and kept in memory: the first
    `limit` micro-batches of the held-out rows (all when 0), dealt out to the ranks in turn; their sums are
    all-reduced, so the figures do not depend on the number of ranks. None when nothing is held out
    (`nothing_held_out`): the loop then skips its evaluations."""
    if not plan.eval_files:
        return None
    import ray.train

    to_batch, out = options.batches(plan, pin_memory=False), []  # kept for the phase: not page-locked
    tables = ray.train.get_dataset_shard(f"p{phase}_eval").iter_batches(
        batch_size=plan.micro_batch_size, batch_format="pyarrow"
    )
    for i, tbl in enumerate(tables):
        if limit and i >= limit:
            break
        if i % world == rank:  # ranks take turns; their sums are all-reduced
            out.append(to_batch(tbl, 0))
    return out
