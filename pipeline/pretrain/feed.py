"""What a Ray Train worker reads: its training micro-batches of a phase (`RankFeed`, resumable at a checkpoint's
position) and its share of the held-out batches (`eval_batches`), from the Ray Data shards the job hands it. The
pure pieces (rank row ranges, epoch order, collate) are in `loader`.
"""

from __future__ import annotations

from typing import Iterator

import torch

from pipeline.pretrain.loader import Batches, PhasePlan, epoch_micro_batches


class RankFeed:
    """This rank's micro-batches of one phase from `position` on, epoch after epoch; `position` is always the
    one after the last micro-batch handed out (what a checkpoint stores)."""

    def __init__(self, plan: PhasePlan, phase: int, rank: int, seed: int, shuffle_rows: int, position: dict[str, int],
                 pin_memory: bool = False, compiled: bool = False, unpad: bool = False, modernbert: bool = False):
        import ray.train

        self.plan, self.phase, self.rank, self.seed, self.shuffle_rows = plan, phase, rank, seed, shuffle_rows
        self.position = dict(position)
        self.shard = ray.train.get_dataset_shard(f"p{phase}_r{rank}")
        self.to_batch = Batches(plan, seed, pin_memory, pad_to=plan.dataset.max_seq_length if compiled else None,
                                unpad=unpad, modernbert=modernbert)

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
                 compiled: bool = False, unpad: bool = False, modernbert: bool = False) -> list[dict[str, torch.Tensor]]:
    """This rank's share of the held-out batches (fixed masks: epoch 0), read once and kept in memory."""
    import ray.train

    if not plan.eval_files:
        return []
    to_batch, out = Batches(plan, seed, pad_to=plan.dataset.max_seq_length if compiled else None, unpad=unpad,
                            modernbert=modernbert), []
    tables = ray.train.get_dataset_shard(f"p{phase}_eval").iter_batches(batch_size=plan.micro_batch_size, batch_format="pyarrow")
    for i, tbl in enumerate(tables):
        if limit and i >= limit * world:
            break
        if i % world == rank:  # ranks take turns; their sums are all-reduced
            out.append(to_batch(tbl, 0))
    return out
