"""What a Ray Train worker reads: its share of each optimizer step's global batch in a phase (`rank_steps`, from
any step on, at any world size) and its share of the held-out batches (`eval_batches`), from the Ray Data shards
the job hands it. The pure pieces (the global order, the split among ranks, collate) are in `loader`.
"""

from __future__ import annotations

import torch

from model.family import BERT, ModelFamily
from pipeline.pretrain.loader import Batches, PhasePlan, StepFeed


def rank_steps(
    plan: PhasePlan,
    phase: int,
    rank: int,
    world: int,
    seed: int,
    shuffle_rows: int,
    done: int,
    pin_memory: bool = False,
    compiled: bool = False,
    unpad: bool = False,
    family: ModelFamily = BERT,
) -> StepFeed:
    """This rank's `Step`s of `phase` after its first `done` optimizer steps, read from the phase's training
    Dataset (`p<phase>_train`, every row in file order; each rank iterates all of it)."""
    import ray.train

    shard = ray.train.get_dataset_shard(f"p{phase}_train")
    to_batch = Batches(
        plan, seed, pin_memory, pad_to=plan.dataset.max_seq_length if compiled else None, unpad=unpad, family=family
    )
    return StepFeed(
        plan,
        phase,
        rank,
        world,
        seed,
        shuffle_rows,
        done,
        lambda: shard.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2),
        to_batch,
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
    plan: PhasePlan,
    phase: int,
    rank: int,
    world: int,
    seed: int,
    limit: int,
    compiled: bool = False,
    unpad: bool = False,
    family: ModelFamily = BERT,
) -> list[dict[str, torch.Tensor]] | None:
    """This rank's share of the held-out batches (fixed masks: epoch 0), read once and kept in memory: the first
    `limit` micro-batches of the held-out rows (all when 0), dealt out to the ranks in turn; their sums are
    all-reduced, so the figures do not depend on the number of ranks. None when nothing is held out
    (`nothing_held_out`): the loop then skips its evaluations."""
    if not plan.eval_files:
        return None
    import ray.train

    to_batch, out = (
        Batches(plan, seed, pad_to=plan.dataset.max_seq_length if compiled else None, unpad=unpad, family=family),
        [],
    )
    tables = ray.train.get_dataset_shard(f"p{phase}_eval").iter_batches(
        batch_size=plan.micro_batch_size, batch_format="pyarrow"
    )
    for i, tbl in enumerate(tables):
        if limit and i >= limit:
            break
        if i % world == rank:  # ranks take turns; their sums are all-reduced
            out.append(to_batch(tbl, 0))
    return out
