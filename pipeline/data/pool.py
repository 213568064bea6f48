"""The random pool: sentence windows sampled from the whole corpus, the source of NSP's random-next segments.

Every window of every document gets a priority, hash(seed, doc_id, window); the pool is the bottom
`random_pool_size` windows by (priority, doc_id, window), so it does not depend on how files are split over
workers. Each tokenize unit keeps its own bottom-k (`PoolCandidates.bottom`), each file writes its candidates
(`write_pool`), and the driver merges them (`merge_pool`) into the `RandomPool` the examples pass reads.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from pipeline.data.arrow import arrow, flat_list_array, numpy_of
from pipeline.data.examples import RandomPool
from pipeline.data.tokenizer import gather_runs
from pipeline.storage.io import read_table, write_parquet_atomic

POOL_SCHEMA = pa.schema(
    [
        ("priority", pa.int64()),
        ("doc_id", pa.int64()),
        ("tokens", pa.list_(pa.int32())),
        ("sent_lens", pa.list_(pa.int32())),
    ]
)


@dataclasses.dataclass
class PoolCandidates:
    """Random-pool windows, compact (numpy arrays, no object per window): each window's priority, document, index
    in its document and sentence count; all windows' sentence lengths, and their tokens, back to back."""

    prio: np.ndarray  # (W,) int64
    doc: np.ndarray  # (W,) int64
    win: np.ndarray  # (W,) int64
    n_sents: np.ndarray  # (W,) int64
    sent_lens: np.ndarray  # (S,) int32
    tokens: np.ndarray  # (T,) int32

    @classmethod
    def empty(cls) -> PoolCandidates:
        z = np.zeros(0, np.int64)
        return cls(z, z, z, z, np.zeros(0, np.int32), np.zeros(0, np.int32))

    def __len__(self) -> int:
        return len(self.prio)

    @classmethod
    def concat(cls, parts: list[PoolCandidates]) -> PoolCandidates:
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(cls)))

    def window_tokens(self) -> np.ndarray:
        """Tokens per window (the sum of its sentences' lengths)."""
        if not len(self):
            return np.zeros(0, np.int64)
        return np.add.reduceat(self.sent_lens.astype(np.int64), np.cumsum(self.n_sents) - self.n_sents)

    def bottom(self, k: int) -> PoolCandidates:
        """The `k` windows of lowest (priority, doc, window), in that order, as new arrays.

        >>> c = PoolCandidates(np.array([9, 1, 5]), np.array([0, 0, 1]), np.array([0, 1, 0]), np.array([1, 2, 1]),
        ...                    np.array([2, 1, 1, 3], np.int32), np.arange(7, dtype=np.int32))
        >>> b = c.bottom(2); b.prio.tolist(), b.sent_lens.tolist(), b.tokens.tolist()
        ([1, 5], [1, 1, 3], [2, 3, 4, 5, 6])
        """
        order = np.lexsort((self.win, self.doc, self.prio))[:k]
        sent_start = np.cumsum(self.n_sents) - self.n_sents
        win_tokens = self.window_tokens()
        tok_start = np.cumsum(win_tokens) - win_tokens
        return PoolCandidates(
            self.prio[order],
            self.doc[order],
            self.win[order],
            self.n_sents[order],
            gather_runs(self.sent_lens, sent_start[order], self.n_sents[order]),
            gather_runs(self.tokens, tok_start[order], win_tokens[order]),
        )


def write_pool(path: str, pool: PoolCandidates) -> str:
    """A file's random-pool candidates, in (priority, doc_id, window) order."""
    table = pa.table(
        [
            arrow(pool.prio, pa.int64()),
            arrow(pool.doc, pa.int64()),
            flat_list_array(pool.tokens, pool.window_tokens(), pa.int32()),
            flat_list_array(pool.sent_lens, pool.n_sents, pa.int32()),
        ],
        schema=POOL_SCHEMA,
    )
    write_parquet_atomic(path, table, compression="lz4")
    return path


def merge_pool(pool_paths: list[str], size: int) -> RandomPool:
    """Global bottom-`size` windows by (priority, doc_id) over every file's candidates (partition-independent).

    The keys of all candidates are read first (16 bytes a window), then only the chosen windows' tokens, one
    file at a time: memory stays near `size` windows however many files there are."""
    keys = [read_table(p, columns=["priority", "doc_id"]) for p in pool_paths]
    if not sum(k.num_rows for k in keys):
        return RandomPool.from_windows([])
    prio = np.concatenate([numpy_of(k.column("priority")) for k in keys])
    docs = np.concatenate([numpy_of(k.column("doc_id")) for k in keys])
    src = np.repeat(np.arange(len(keys)), [k.num_rows for k in keys])
    row = np.concatenate([np.arange(k.num_rows) for k in keys])
    chosen = np.lexsort((docs, prio))[:size]
    src, row = src[chosen], row[chosen]
    parts = []
    for i in np.unique(src):
        rows = np.sort(row[src == i])
        parts.append(read_table(pool_paths[i]).take(arrow(rows, pa.int64())).combine_chunks())
    kept = pa.concat_tables(parts).sort_by([("priority", "ascending"), ("doc_id", "ascending")])
    lens = kept.column("sent_lens").combine_chunks()
    sent_ends = np.cumsum(numpy_of(lens.flatten()), dtype=np.int64)
    win_starts = np.concatenate([[0], np.cumsum(numpy_of(lens.value_lengths()), dtype=np.int64)])
    tokens = numpy_of(kept.column("tokens").combine_chunks().flatten()).astype(np.int32)
    return RandomPool(numpy_of(kept.column("doc_id")).astype(np.int64), win_starts, sent_ends, tokens)
