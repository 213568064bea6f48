"""What a Ray Train worker reads: its share of each optimizer step's global batch in a phase (`rank_steps`, from
any step on, at any world size) and its share of the held-out batches (`eval_batches`), from the Ray Data shards
the job hands it. The pure pieces (the global order, the split among ranks, collate) are in `loader`.
"""

from __future__ import annotations

import torch

from pipeline.pretrain.loader import Batches, PhasePlan, StepFeed


def rank_steps(plan: PhasePlan, phase: int, rank: int, world: int, seed: int, shuffle_rows: int, done: int,
               pin_memory: bool = False, compiled: bool = False, unpad: bool = False,
               modernbert: bool = False) -> StepFeed:
    """This rank's `Step`s of `phase` after its first `done` optimizer steps, read from the phase's training
    Dataset (`p<phase>_train`, every row in file order; each rank iterates all of it)."""
    import ray.train

    shard = ray.train.get_dataset_shard(f"p{phase}_train")
    to_batch = Batches(plan, seed, pin_memory, pad_to=plan.dataset.max_seq_length if compiled else None,
                       unpad=unpad, modernbert=modernbert)
    return StepFeed(plan, phase, rank, world, seed, shuffle_rows, done,
                    lambda: shard.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2), to_batch)


def eval_batches(plan: PhasePlan, phase: int, rank: int, world: int, seed: int, limit: int,
                 compiled: bool = False, unpad: bool = False, modernbert: bool = False) -> list[dict[str, torch.Tensor]]:
    """This rank's share of the held-out batches (fixed masks: epoch 0), read once and kept in memory: the first
    `limit` micro-batches of the held-out rows (all when 0), dealt out to the ranks in turn; their sums are
    all-reduced, so the figures do not depend on the number of ranks."""
    import ray.train

    if not plan.eval_files:
        return []
    to_batch, out = Batches(plan, seed, pad_to=plan.dataset.max_seq_length if compiled else None, unpad=unpad,
                            modernbert=modernbert), []
    tables = ray.train.get_dataset_shard(f"p{phase}_eval").iter_batches(batch_size=plan.micro_batch_size, batch_format="pyarrow")
    for i, tbl in enumerate(tables):
        if limit and i >= limit:
            break
        if i % world == rank:  # ranks take turns; their sums are all-reduced
            out.append(to_batch(tbl, 0))
    return out
