"""The pretraining data feed: which rows each rank reads (`PhasePlan`), in which order each epoch
(`epoch_micro_batches`), masked how (dynamic masking), and padded into tensors (`collate`).

Data order, and why resumption is exact: Ray Data's `streaming_split` hands blocks to whichever worker asks
first, so it cannot say where a worker was. Instead the driver cuts the training shards (the last
`train.num_eval_shards` are held out) into one contiguous, equal row range per rank and gives each rank its own
Ray Dataset (`read_parquet`, `preserve_order`), read with `get_dataset_shard("p<phase>_r<rank>")`. Each epoch a
rank permutes its rows in chunks of `train.shuffle_buffer_rows` with an RNG seeded by (seed, phase, epoch, rank,
chunk) and masks them (dynamic masking) as a function of (seed, epoch, example_id). A worker's position is then
just (phase, epoch, micro-batch index); a checkpoint stores it with the weights, optimizer, scheduler, scaler and
every RNG state, so a restarted worker skips to exactly the next micro-batch. Departure: shuffling is within a
rank's range, not global (shards are written in corpus order), which is weaker mixing than a global shuffle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from pipeline.data.dataset import PreparedDataset
from pipeline.core.precision import HOST_ONLY
from pipeline.data.masking import MaskingPolicy, mask_batch


def pad_rows(rows: Sequence[np.ndarray], pad: int, dtype=np.int64, width: int | None = None) -> np.ndarray:
    """Right-pad variable-length rows to the longest one, or to `width` when that is longer.

    >>> pad_rows([np.array([1, 2, 3]), np.array([4])], 0).tolist()
    [[1, 2, 3], [4, 0, 0]]
    >>> pad_rows([np.array([1, 2, 3])], 0, width=4).tolist()
    [[1, 2, 3, 0]]
    """
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    width = max(int(lengths.max()) if len(rows) else 0, width or 0)
    out = np.full((len(rows), width), pad, dtype=dtype)
    if width:
        out[np.arange(width)[None, :] < lengths[:, None]] = np.concatenate([np.asarray(r) for r in rows])
    return out


def document_boundaries(doc_lengths: Sequence[np.ndarray], lengths: np.ndarray, width: int) -> np.ndarray:
    """`cu_seqlens` (D+1,) int32 of a batch padded to `width`: every row's documents (`doc_lengths`; an empty one
    is the whole row) as offsets into the flattened (B*width) batch, and a row's padding as a segment of its own
    (attended by nothing real), so that each segment lies in one row as ModernBERT's `document_layout` wants.

    >>> document_boundaries([np.array([2, 3]), np.array([], np.int32)], np.array([5, 4]), 6).tolist()
    [0, 2, 5, 6, 10, 12]
    """
    cuts = [0]
    for b, (docs, n) in enumerate(zip(doc_lengths, lengths)):
        row = b * width
        cuts.extend((row + np.cumsum(docs if len(docs) else [n])).tolist())
        if n < width:
            cuts.append(row + width)
    return np.asarray(cuts, dtype=np.int32)


def collate(batch: dict[str, Any], pad_to: int | None = None, unpad: bool = False,
            modernbert: bool = False) -> dict[str, torch.Tensor]:
    """Rows (dict of column -> sequence of int arrays) -> padded tensors for `BertForPreTraining`.

    Sequences are padded with 0 ([PAD]) to the longest in this batch (not to max_seq_length), masked positions
    and labels with -1 (ignored by the model); `num_tokens` counts real tokens for throughput. A batch without
    padding (packed MLM-only rows are all full length) has no `attention_mask`: the model then passes SDPA no
    mask, so it may take its flash kernel, and nothing on the device has to check the mask. `pad_to` pads to that
    width instead (a compiled encoder then sees one shape: no recompilation per batch width). `unpad` gives a batch
    with padding `unpad_indices` (T,) int64, the real tokens' indices into the flattened (B*L), and `cu_seqlens`
    (B+1,) int32 (what the varlen kernels take) instead of the mask: the model then runs on the real tokens only.
    `spans` (host, never copied, like `num_tokens`) holds the real-token lengths of what attention runs over (each
    row; each document of a packed ModernBERT row): the step's model FLOPs (`model.flops.train_flops`) for
    `train/mfu`. `modernbert` makes the batch `ModernBertForMaskedLM` takes: no token types or NSP labels, and when a row holds
    several documents (the `doc_lengths` column) their boundaries as `cu_seqlens` (`document_boundaries`) instead
    of the mask, so attention stays inside each document.

    >>> rows = {"input_ids": [np.array([2, 5, 3]), np.array([2, 3])], "token_type_ids": [np.zeros(3), np.zeros(2)],
    ...         "masked_lm_positions": [np.array([1]), np.array([], np.int32)],
    ...         "masked_lm_ids": [np.array([7]), np.array([], np.int32)], "next_sentence_label": np.array([0, -1])}
    >>> b = collate(rows)
    >>> b["input_ids"].tolist(), b["attention_mask"].tolist(), b["masked_lm_positions"].tolist(), b["num_tokens"].item()
    ([[2, 5, 3], [2, 3, 0]], [[1, 1, 1], [1, 1, 0]], [[1], [-1]], 5)
    >>> "attention_mask" in collate({**{k: v[:1] for k, v in b.items() if k != "num_tokens"}, "input_ids": [np.array([2, 5, 3])],
    ...                              "token_type_ids": [np.zeros(3)], "next_sentence_label": np.array([-1])})
    False
    >>> u = collate(rows, unpad=True)
    >>> "attention_mask" in u, u["unpad_indices"].tolist(), u["cu_seqlens"].tolist()
    (False, [0, 1, 2, 3, 4], [0, 3, 5])
    """
    ids = pad_rows(batch["input_ids"], 0, width=pad_to)  # (B, L)
    lengths = np.fromiter((len(r) for r in batch["input_ids"]), dtype=np.int64)
    mask = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64)  # (B, L)
    positions = pad_rows(batch["masked_lm_positions"], -1)  # (B, P)
    if positions.shape[1] == 0:  # no masked position in the whole batch: keep a (B, 1) all-ignored column
        positions = np.full((len(ids), 1), -1, dtype=np.int64)
    labels = pad_rows(batch["masked_lm_ids"], -1)
    if labels.shape[1] == 0:
        labels = np.full((len(ids), 1), -1, dtype=np.int64)
    out = {
        "input_ids": torch.from_numpy(ids),
        "token_type_ids": torch.from_numpy(pad_rows(batch["token_type_ids"], 0, width=pad_to)),
        "masked_lm_positions": torch.from_numpy(positions),
        "masked_lm_ids": torch.from_numpy(labels),
        "next_sentence_label": torch.as_tensor(np.asarray(batch["next_sentence_label"], dtype=np.int64)),
        "num_tokens": torch.tensor(int(lengths.sum())),
        "spans": torch.from_numpy(lengths),
    }
    if modernbert:
        del out["token_type_ids"], out["next_sentence_label"]  # no segments, no NSP head
        docs = batch.get("doc_lengths")
        if docs is not None and any(len(d) > 1 for d in docs):
            out["cu_seqlens"] = torch.from_numpy(document_boundaries(docs, lengths, ids.shape[1]))
            out["spans"] = torch.from_numpy(np.concatenate(
                [np.asarray(d, dtype=np.int64) if len(d) else lengths[i:i + 1] for i, d in enumerate(docs)]))
            return out
        unpad = False  # its unpadded attention is the documents'
    if mask.all():
        return out
    if unpad and lengths.min() > 0:  # the varlen kernels take no empty row; one would take the mask instead
        out["unpad_indices"] = torch.from_numpy(np.flatnonzero(mask).astype(np.int64))
        out["cu_seqlens"] = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    else:  # padding somewhere: the model needs the mask
        out["attention_mask"] = torch.from_numpy(mask)
    return out


def arrow_rows(table) -> dict[str, Any]:
    """A pyarrow Table -> {column: list of numpy arrays (list columns) or a numpy array (scalars)}."""
    import pyarrow as pa

    out: dict[str, Any] = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            values = col.flatten().to_numpy(zero_copy_only=False)
            bounds = np.concatenate([[0], np.cumsum(col.value_lengths().fill_null(0).to_numpy(zero_copy_only=False))])
            out[name] = [values[bounds[i] : bounds[i + 1]] for i in range(len(col))]
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


def rank_row_ranges(file_rows: Sequence[int], world_size: int) -> list[dict[str, Any]]:
    """Split the concatenated rows of `file_rows` into `world_size` equal contiguous ranges (remainder dropped).

    Each range says which files it touches, how many rows to skip at the start of the first, and how many rows
    it has, so every rank runs the same number of steps and no row is read by two ranks.

    >>> rank_row_ranges([5, 5, 4], 2)
    [{'files': [0, 1], 'skip': 0, 'rows': 7}, {'files': [1, 2], 'skip': 2, 'rows': 7}]
    """
    total = sum(file_rows)
    per = total // world_size
    starts = np.concatenate([[0], np.cumsum(file_rows)])
    out = []
    for r in range(world_size):
        a, b = r * per, (r + 1) * per
        files = [i for i in range(len(file_rows)) if starts[i] < b and starts[i + 1] > a and file_rows[i] > 0]
        out.append({"files": files, "skip": int(a - starts[files[0]]) if files else 0, "rows": per})
    return out


def epoch_micro_batches(
    tables: Iterable[Any],
    *,
    skip: int,
    num_rows: int,
    chunk_rows: int,
    micro_batch_size: int,
    seed_key: Sequence[int],
    start: int = 0,
) -> Iterator[tuple[int, Any]]:
    """Yield `(index, micro_batch_table)` for one rank and epoch, from micro-batch `start` on.

    The rank's rows are `num_rows` rows after the first `skip` of the stream `tables` (pyarrow tables in a fixed
    order). They are cut into chunks of `chunk_rows`; each chunk is permuted by an RNG seeded with
    `(*seed_key, chunk_index)` — so the order is a pure function of the seed, the epoch and the rank, and
    resuming at micro-batch `start` reproduces exactly the batches an uninterrupted run would have seen.
    Chunks entirely before `start` are skipped without being permuted. The last partial micro-batch is dropped.

    >>> import pyarrow as pa
    >>> t = [pa.table({"x": list(range(10))})]
    >>> [b["x"].to_pylist() for _, b in epoch_micro_batches(t, skip=1, num_rows=8, chunk_rows=8, micro_batch_size=3, seed_key=[0])]
    [[3, 5, 4], [7, 6, 1]]
    >>> [b["x"].to_pylist() for _, b in epoch_micro_batches(t, skip=1, num_rows=8, chunk_rows=8, micro_batch_size=3, seed_key=[0], start=1)]
    [[7, 6, 1]]
    """
    import pyarrow as pa

    num_micro = num_rows // micro_batch_size
    first_row = start * micro_batch_size  # first row (in permuted order) still to be yielded
    pending: list[Any] = []  # tables of the current chunk, in stream order
    pending_rows = 0
    carry = None  # permuted rows not yet yielded
    index = start
    consumed = -skip  # rows of the rank range seen so far (negative while skipping the head)
    chunk = 0

    def stream():
        nonlocal consumed
        for t in tables:
            n = t.num_rows
            lo = max(0, -consumed)  # rows of this table still in the skipped head
            hi = min(n, num_rows - consumed)
            consumed += n
            if hi > lo:
                yield t.slice(lo, hi - lo)
            if consumed >= num_rows:
                return

    for t in stream():
        pending.append(t)
        pending_rows += t.num_rows
        while pending_rows >= chunk_rows or (consumed >= num_rows and pending_rows > 0):
            whole = pa.concat_tables(pending)
            n = min(chunk_rows, whole.num_rows)
            piece, rest = whole.slice(0, n), whole.slice(n)
            pending, pending_rows = ([rest] if rest.num_rows else []), rest.num_rows
            chunk_start = chunk * chunk_rows
            chunk += 1
            if chunk_start + n <= first_row:
                continue  # entirely before the resume point
            perm = np.random.default_rng([*map(int, seed_key), chunk - 1]).permutation(n)
            piece = piece.take(pa.array(perm))
            if chunk_start < first_row:
                piece = piece.slice(first_row - chunk_start)
            carry = piece if carry is None else pa.concat_tables([carry, piece])
            while carry.num_rows >= micro_batch_size and index < num_micro:
                yield index, carry.slice(0, micro_batch_size)
                carry = carry.slice(micro_batch_size)
                index += 1
            if index >= num_micro:
                return


@dataclass(frozen=True)
class RankRange:
    """One rank's contiguous rows: the files they lie in, rows to skip in the first, and how many."""

    files: tuple[str, ...]
    skip: int
    rows: int


@dataclass(frozen=True)
class PhasePlan:
    """What every worker reads in one phase: its rank's range, the held-out files, the batch shape."""

    dataset: PreparedDataset
    steps: int
    micro_batch_size: int
    accumulation_steps: int
    ranks: tuple[RankRange, ...]
    train_files: tuple[str, ...]
    train_rows: int
    eval_files: tuple[str, ...]
    materialized: bool
    """True: the driver read the shards once into the object store and cut them per rank (no `skip`)."""

    @classmethod
    def build(cls, ds: PreparedDataset, *, steps: int, micro_batch_size: int, global_batch_size: int,
              num_workers: int, num_eval_shards: int, materialized: bool) -> PhasePlan:
        """Split the training shards (all but the last `num_eval_shards`) into equal per-rank row ranges."""
        files = list(ds.shards)
        n_eval = min(num_eval_shards, max(0, len(files) - 1))
        train, held = files[: len(files) - n_eval], files[len(files) - n_eval :]
        ranges = rank_row_ranges([r for _, r in train], num_workers)
        if ranges[0]["rows"] < micro_batch_size:
            raise ValueError(f"{ds.output}: {ranges[0]['rows']} training rows per worker is less than one "
                             f"micro-batch of {micro_batch_size}")
        ranks = tuple(RankRange(tuple(train[j][0] for j in r["files"]), r["skip"], r["rows"]) for r in ranges)
        return cls(ds, steps, micro_batch_size, global_batch_size // (micro_batch_size * num_workers), ranks,
                   tuple(p for p, _ in train), sum(r for _, r in train), tuple(p for p, _ in held), materialized)


class Batches:
    """Rows -> padded tensors for one phase, masking them first when the data is dynamically masked.

    `pin_memory` (for a CUDA device) puts the tensors in page-locked memory, so that the step's
    `.to(device, non_blocking=True)` is an asynchronous DMA and the host goes on building the next batch;
    `pad_to` pads every batch to that width, `unpad` passes batches with padding as real tokens, `modernbert` makes
    ModernBERT's batches (`collate`)."""

    def __init__(self, plan: PhasePlan, seed: int, pin_memory: bool = False, pad_to: int | None = None,
                 unpad: bool = False, modernbert: bool = False) -> None:
        self.seed, self.pin_memory, self.pad_to, self.unpad = seed, pin_memory, pad_to, unpad
        self.modernbert = modernbert
        self.policy: MaskingPolicy | None = plan.dataset.policy() if plan.dataset.dynamic_masking else None

    def __call__(self, table, epoch: int) -> dict[str, torch.Tensor]:
        rows = arrow_rows(table)
        if self.policy is not None:  # a fresh mask per epoch, a function of (seed, epoch, example_id)
            rows = mask_batch(rows, self.policy, seed=self.seed, epoch=epoch)
        batch = collate(rows, self.pad_to, self.unpad, self.modernbert)
        if self.pin_memory:  # `num_tokens` and `spans` stay on the host: they are never copied
            batch = {k: v if k in HOST_ONLY else v.pin_memory() for k, v in batch.items()}
        return batch
