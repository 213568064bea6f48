"""The pretraining data feed: which rows form each optimizer step (`PhasePlan`, `epoch_batches`), how a step's
global batch is dealt out to the ranks present (`split_global_batch`, `StepFeed`), masked how (dynamic masking),
and padded into tensors (`collate`).

Data order, and why resumption is exact at any number of workers: Ray Data's `streaming_split` hands blocks to
whichever worker asks first, so it cannot say where a worker was. Instead every rank reads the same ordered Ray
Dataset of the training shards (the last `train.num_eval_shards` are held out; `read_parquet`, `preserve_order`,
`get_dataset_shard("p<phase>_train")`). Each epoch the rows are permuted in chunks of `train.shuffle_buffer_rows`
with an RNG seeded by (seed, phase, epoch, chunk), masked (dynamic masking) as a function of (seed, epoch,
example_id), and cut into global batches of `train.global_batch_size` rows: which samples form each step is a
function of the seed, the phase, the epoch and the global batch, never of the world size. Each rank takes its
contiguous share of every global batch, cut into micro-batches of at most `train.micro_batch_size` rows; the
loss is the global batch's mean (`pipeline.pretrain.metrics.step_loss`), so the gradient does not depend on the
split either. The position is then a function of the step alone (`PhasePlan.position`); a checkpoint stores the
step with the weights, optimizer, scheduler, scaler and RNG states, so a restarted run — on as many workers or
on others — goes on with exactly the next global batch. Departures: shuffling is within chunks of the corpus in
file order, not global (shards are written in corpus order), so a step's rows come from one region of
`shuffle_buffer_rows` rows; and every rank reads every row (the global batch's, a few MB/s at BERT's rates).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from model.family import BERT, ModelFamily
from pipeline.config import ConfigError
from pipeline.core.precision import HOST_ONLY
from pipeline.data.dataset import PreparedDataset
from pipeline.data.masking import MaskingPolicy, mask_batch
from pipeline.pretrain.mixture import Mixture


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


def document_boundaries(doc_lengths: Sequence[np.ndarray], lengths: np.ndarray) -> np.ndarray:
    """`cu_seqlens` (D+1,) int32: every row's documents (`doc_lengths`; an empty one is the whole row) as segments
    of the batch's real tokens (`model.segments.Segments`), padding no segment; each lies in one row.

    >>> document_boundaries([np.array([2, 3]), np.array([], np.int32)], np.array([5, 4])).tolist()
    [0, 2, 5, 9]
    """
    docs = np.concatenate(
        [np.asarray(d, dtype=np.int64) if len(d) else lengths[i : i + 1] for i, d in enumerate(doc_lengths)]
    )
    return np.concatenate([[0], np.cumsum(docs[docs > 0])]).astype(np.int32)  # an empty row: no segment


def collate(
    batch: dict[str, Any],
    pad_to: int | None = None,
    unpad: bool = False,
    family: ModelFamily = BERT,
    pad_id: int = 0,
) -> dict[str, torch.Tensor]:
    """Rows (dict of column -> sequence of int arrays) -> padded tensors for `BertForPreTraining`.

    Sequences are padded with `pad_id` (the tokenizer's pad token, `PreparedDataset.pad_id`) to the longest in this
    batch (not to max_seq_length), masked positions and labels with -1 (ignored by the model); `num_tokens` counts
    real tokens for throughput. A batch without
    padding (packed MLM-only rows are all full length) has no `attention_mask`: the model then passes SDPA no
    mask, so it may take its flash kernel, and nothing on the device has to check the mask. `pad_to` pads to that
    width instead (a compiled encoder then sees one shape: no recompilation per batch width). `unpad` gives a batch
    with padding `unpad_indices` (T,) int64, the real tokens' indices into the flattened (B*L), and `cu_seqlens`
    (B+1,) int32 (what the varlen kernels take) instead of the mask: the model then runs on the real tokens only.
    `spans` (host, never copied, like `num_tokens`) holds the real-token lengths of what attention runs over (each
    row; each document of a packed ModernBERT row): the step's model FLOPs (`model.flops.train_flops`) for
    `train/mfu`. `family` (`model.family.ModelFamily`) says what its models take: token types and NSP labels only
    when it has them; when it keeps documents apart and a row holds several (the `doc_lengths` column), the
    documents as `cu_seqlens` (`document_boundaries`: segments of the real tokens, the meaning `cu_seqlens` has for
    BERT's unpadded rows too), beside the mask when a row has padding, so attention stays inside each document;
    `unpad` only for a family whose encoder runs unpadded (its documents are then its segments).

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
    """  # noqa: E501
    ids = pad_rows(batch["input_ids"], pad_id, width=pad_to)  # (B, L)
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
    if not family.token_types:
        del out["token_type_ids"]
    if not family.nsp:
        del out["next_sentence_label"]
    if family.documents:
        docs = batch.get("doc_lengths")
        if docs is not None and any(len(d) > 1 for d in docs):
            out["cu_seqlens"] = torch.from_numpy(document_boundaries(docs, lengths))
            out["spans"] = torch.from_numpy(np.diff(out["cu_seqlens"].numpy()).astype(np.int64))
    unpad = unpad and family.unpad  # ModernBERT's unpadded attention is the documents'
    if mask.all():
        return out
    if unpad and lengths.min() > 0:  # the varlen kernels take no empty row; one would take the mask instead
        out["unpad_indices"] = torch.from_numpy(np.flatnonzero(mask).astype(np.int64))
        out["cu_seqlens"] = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    else:  # padding somewhere: the model needs the mask
        out["attention_mask"] = torch.from_numpy(mask)
    return out


def arrow_rows(table, order: np.ndarray | None = None) -> dict[str, Any]:
    """A pyarrow Table -> {column: list of numpy arrays (list columns) or a numpy array (scalars)}; with `order`,
    the rows at those indices, in that order (a mixture's global batch: no copy of the table to reorder it).

    >>> import pyarrow as pa
    >>> arrow_rows(pa.table({"a": [[1], [2, 3], []], "b": [7, 8, 9]}), np.array([1, 0]))["a"]
    [array([2, 3]), array([1])]
    """
    import pyarrow as pa

    out: dict[str, Any] = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            values = col.flatten().to_numpy(zero_copy_only=False)
            bounds = np.concatenate([[0], np.cumsum(col.value_lengths().fill_null(0).to_numpy(zero_copy_only=False))])
            out[name] = [values[bounds[i] : bounds[i + 1]] for i in (range(len(col)) if order is None else order)]
        else:
            scalars = col.to_numpy(zero_copy_only=False)
            out[name] = scalars if order is None else scalars[order]
    return out


def split_global_batch(global_batch: int, world: int, cap: int) -> list[list[tuple[int, int]]]:
    """Each rank's micro-batches of one global batch, as (start, stop) row offsets into it.

    The rows are dealt out in order: rank r takes the r-th of `world` nearly equal contiguous shares (the first
    `global_batch % world` ranks one row more), cut into as many micro-batches as the largest share needs at `cap`
    rows each, so that every rank runs the same number of forward/backward passes (DDP all-reduces on the last);
    a rank's micro-batches differ in size by at most one row.

    >>> split_global_batch(10, 3, 2)
    [[(0, 2), (2, 4)], [(4, 6), (6, 7)], [(7, 9), (9, 10)]]
    >>> split_global_batch(8, 1, 8), split_global_batch(8, 2, 8)
    ([[(0, 8)]], [[(0, 4)], [(4, 8)]])
    """
    if not 1 <= world <= global_batch:
        raise ValueError(f"{world} workers cannot share a global batch of {global_batch} rows (one row each at least)")
    shares = [global_batch // world + (r < global_batch % world) for r in range(world)]
    micro = -(-shares[0] // cap)  # accumulation steps: the largest share's micro-batches at the cap
    out, row = [], 0
    for share in shares:
        sizes = [share // micro + (k < share % micro) for k in range(micro)]
        bounds = np.concatenate([[0], np.cumsum(sizes)]) + row
        out.append([(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])])
        row += share
    return out


def permuted_rows(
    tables: Iterable[Any],
    *,
    num_rows: int,
    chunk_rows: int,
    seed_key: Sequence[int],
    first_row: int = 0,
    skipped: Callable[[Any], None] | None = None,
    keep: Callable[[Any], np.ndarray] | None = None,
) -> Iterator[Any]:
    """One pass's rows, permuted: the first `num_rows` rows of the stream `tables` (pyarrow tables in a fixed
    order; with `keep`, only the rows at the indices it gives of each table), cut into chunks of `chunk_rows`, each
    permuted by an RNG seeded with `(*seed_key, chunk_index)`, yielded as tables from row `first_row` of the
    permuted order on. Chunks entirely before `first_row` are not permuted; `skipped` is called with the rows before
    `first_row` (whole chunks in stream order, then the permuted head of the chunk `first_row` falls in). A chunk's
    rows are copied once (one take), kept rows or not.

    >>> import pyarrow as pa
    >>> [t["x"].to_pylist() for t in permuted_rows([pa.table({"x": list(range(10))})], num_rows=8, chunk_rows=8,
    ...                                             seed_key=[0], first_row=5)]
    [[0, 1, 7]]
    >>> [t["x"].to_pylist() for t in permuted_rows([pa.table({"x": list(range(10))})], num_rows=3, chunk_rows=8,
    ...                                             seed_key=[0], keep=lambda t: np.arange(1, t.num_rows, 3))]
    [[7, 1, 4]]
    """
    import pyarrow as pa

    pending: list[tuple[Any, np.ndarray]] = []  # (table, its rows) of the current chunk, in stream order
    pending_rows = 0
    consumed = 0  # rows of the pass seen so far
    chunk = 0

    def stream():
        nonlocal consumed
        for t in tables:
            rows = np.arange(t.num_rows) if keep is None else keep(t)
            rows = rows[: num_rows - consumed]
            consumed += len(rows)
            if len(rows):
                yield t, rows
            if consumed >= num_rows:
                return

    def gather(parts: list[tuple[Any, np.ndarray]], order: np.ndarray | None = None):
        """The rows of `parts`, in stream order or in `order` of it: one take from their tables side by side."""
        starts = np.cumsum([0] + [t.num_rows for t, _ in parts[:-1]])
        index = np.concatenate([rows + start for (_, rows), start in zip(parts, starts)])
        return pa.concat_tables([t for t, _ in parts]).take(pa.array(index if order is None else index[order]))

    for t, rows in stream():
        pending.append((t, rows))
        pending_rows += len(rows)
        while pending_rows >= chunk_rows or (consumed >= num_rows and pending_rows > 0):
            n = min(chunk_rows, pending_rows)
            parts, rest, got = [], [], 0  # the chunk's first n rows, and what is left of pending
            for t, rows in pending:
                k = min(n - got, len(rows))
                if k:
                    parts.append((t, rows[:k]))
                if k < len(rows):
                    rest.append((t, rows[k:]))
                got += k
            pending, pending_rows = rest, pending_rows - n
            chunk_start = chunk * chunk_rows
            chunk += 1
            if chunk_start + n <= first_row:
                if skipped is not None:
                    skipped(gather(parts))
                continue  # entirely before the resume point
            perm = np.random.default_rng([*map(int, seed_key), chunk - 1]).permutation(n)
            if chunk_start < first_row:
                head = first_row - chunk_start
                if skipped is not None:
                    skipped(gather(parts, perm[:head]))
                perm = perm[head:]
            yield gather(parts, perm)


def epoch_batches(
    tables: Iterable[Any],
    *,
    num_rows: int,
    chunk_rows: int,
    batch_size: int,
    seed_key: Sequence[int],
    start: int = 0,
) -> Iterator[tuple[int, Any]]:
    """Yield `(index, batch_table)` for one epoch, from batch `start` on.

    The epoch's rows are the first `num_rows` rows of the stream `tables` (pyarrow tables in a fixed order). They
    are cut into chunks of `chunk_rows`; each chunk is permuted by an RNG seeded with `(*seed_key, chunk_index)` —
    so the order is a pure function of the seed key (seed, phase, epoch), and resuming at batch `start` reproduces
    exactly the batches an uninterrupted run would have seen (`permuted_rows`). The last partial batch is dropped.

    >>> import pyarrow as pa
    >>> t = [pa.table({"x": list(range(10))})]
    >>> [b["x"].to_pylist() for _, b in epoch_batches(t, num_rows=8, chunk_rows=8, batch_size=3, seed_key=[0])]
    [[2, 4, 3], [6, 5, 0]]
    >>> [b["x"].to_pylist() for _, b in epoch_batches(t, num_rows=8, chunk_rows=8, batch_size=3, seed_key=[0], start=1)]
    [[6, 5, 0]]
    """
    import pyarrow as pa

    num_batches = num_rows // batch_size
    index = start
    carry = None  # permuted rows not yet yielded
    if index >= num_batches:
        return
    for piece in permuted_rows(
        tables, num_rows=num_rows, chunk_rows=chunk_rows, seed_key=seed_key, first_row=start * batch_size
    ):
        carry = piece if carry is None else pa.concat_tables([carry, piece])
        while carry.num_rows >= batch_size and index < num_batches:
            yield index, carry.slice(0, batch_size)
            carry = carry.slice(batch_size)
            index += 1
        if index >= num_batches:
            return


SOURCE_KEY = 0x534F55  # "SOU": a source's pass order is seeded apart from the epochs of one stream


class SourceRows:
    """One source's rows of a phase as an endless stream, from row `start` of it on: its training rows (those of
    `tables()` whose `source` is `name`, in file order; `rows` of them, `tokens` tokens) read pass after pass, each
    pass permuted in chunks of `chunk_rows` seeded by (seed, phase, SOURCE_KEY + index, pass) (`permuted_rows`).
    Where it starts is a number of rows (`mixture.Mixture.before`), a function of the step alone. `tokens`: the
    tokens of the rows before where the stream is (those before `start` included, once the first rows are taken).

    >>> import pyarrow as pa
    >>> t = pa.table({"source": ["a", "b", "a", "a"], "num_tokens": [1, 2, 3, 4]})
    >>> s = SourceRows(lambda: [t], "a", 0, 3, 8, 3, seed=0, phase=0, start=5)
    >>> [s.take(2)["num_tokens"].to_pylist() for _ in range(2)], s.tokens
    ([[3, 1], [3, 4]], 24)
    """

    def __init__(
        self,
        tables: Callable[[], Iterable[Any]],
        name: str,
        index: int,
        rows: int,
        tokens: int,
        chunk_rows: int,
        *,
        seed: int,
        phase: int,
        start: int,
    ) -> None:
        self.tables, self.name, self.rows, self.chunk_rows = tables, name, rows, chunk_rows
        self.key = [seed, phase, SOURCE_KEY + index]
        self._passes, self._first = divmod(start, rows)
        self.tokens = self._passes * tokens  # + the head of the pass it starts in, as that is read
        self._pieces = self._stream()
        self._piece, self._at, self._cum = None, 0, np.zeros(1, np.int64)

    def _stream(self) -> Iterator[Any]:
        import pyarrow.compute as pc

        def count(t) -> None:
            self.tokens += int(pc.sum(t["num_tokens"]).as_py() or 0)

        def mine(t) -> np.ndarray:  # this source's rows of a table
            return np.flatnonzero(pc.equal(t["source"], self.name).to_numpy(zero_copy_only=False))

        passes, first = self._passes, self._first
        while True:
            yield from permuted_rows(
                self.tables(),
                num_rows=self.rows,
                chunk_rows=self.chunk_rows,
                keep=mine,
                seed_key=[*self.key, passes],
                first_row=first,
                skipped=count if first else None,
            )
            passes, first = passes + 1, 0

    def take(self, n: int) -> Any:
        """The stream's next `n` rows, as one table (their tokens counted into `tokens`)."""
        import pyarrow as pa

        parts, have = [], 0
        while have < n:
            if self._piece is None or self._at == self._piece.num_rows:
                self._piece, self._at = next(self._pieces), 0
                self._cum = np.concatenate([[0], np.cumsum(self._piece["num_tokens"].to_numpy(), dtype=np.int64)])
            k = min(n - have, self._piece.num_rows - self._at)
            parts.append(self._piece.slice(self._at, k))
            self.tokens += int(self._cum[self._at + k] - self._cum[self._at])
            self._at += k
            have += k
        return pa.concat_tables(parts) if len(parts) != 1 else parts[0]


@dataclass(frozen=True)
class PhasePlan:
    """What every worker reads in one phase, whatever their number: the training rows (all of them, in file
    order), the held-out files, the global batch and the per-worker micro-batch cap.

    An epoch is `batches_per_epoch` global batches; optimizer step k of the phase trains on global batch
    k % batches_per_epoch of epoch k // batches_per_epoch (`position`), so where a run is follows from its step."""

    dataset: PreparedDataset
    steps: int
    global_batch_size: int
    micro_batch_size: int
    """The cap on the rows of one forward/backward on one worker (`split_global_batch`)."""
    train_files: tuple[str, ...]
    train_rows: int
    eval_files: tuple[str, ...]
    materialized: bool
    """True: the driver reads the shards once into the object store (the training rows, then the held-out ones)."""
    mixture: Mixture | None = None
    """With `data.sources`: which rows of which source each step takes (`pipeline.pretrain.mixture`)."""
    mask_rate: float | None = None
    """Dynamic masking at this rate in this phase (`train.phases[].mask_rate`); None: the data's."""

    @property
    def batches_per_epoch(self) -> int:
        return self.train_rows // self.global_batch_size

    def position(self, step: int) -> dict[str, Any]:
        """Where the data is after `step` optimizer steps of this phase: epoch, global batches done in it, and
        the samples the phase consumed (`step * global_batch_size`); in a mixture also the rows each source gave.

        >>> PhasePlan(None, 10, 4, 4, (), 10, (), False).position(5)
        {'epoch': 2, 'batch': 1, 'samples': 20}
        """
        epoch, batch = divmod(step, self.batches_per_epoch)
        out: dict[str, Any] = {"epoch": epoch, "batch": batch, "samples": step * self.global_batch_size}
        if self.mixture is not None:
            out["source_rows"] = dict(zip(self.mixture.names, self.mixture.before(step)))
        return out

    @classmethod
    def build(
        cls,
        ds: PreparedDataset,
        *,
        steps: int,
        micro_batch_size: int,
        global_batch_size: int,
        num_eval_shards: int,
        materialized: bool,
        field: str = "train.global_batch_size",
    ) -> PhasePlan:
        """The training shards (all but the last `num_eval_shards`) and the held-out ones. Fewer training rows than
        one global batch is one ConfigError line naming `field` (the global batch's) and the data."""
        files = list(ds.shards)
        n_eval = min(num_eval_shards, max(0, len(files) - 1))
        train, held = files[: len(files) - n_eval], files[len(files) - n_eval :]
        rows = sum(r for _, r in train)
        if rows < global_batch_size:
            kept = f" ({n_eval} of its {len(files)} shards held out: train.num_eval_shards)" if n_eval else ""
            raise ConfigError(
                f"{field} {global_batch_size} is more than the {rows} training rows of {ds.output}{kept}: "
                "give more input text, or a smaller global batch"
            )
        return cls(
            ds,
            steps,
            global_batch_size,
            micro_batch_size,
            tuple(p for p, _ in train),
            rows,
            tuple(p for p, _ in held),
            materialized,
        )


@dataclass
class Step:
    """One optimizer step's data on one rank: its micro-batches, and the global batch's loss denominators."""

    micro_batches: list[dict[str, torch.Tensor]]
    masked_tokens: int
    """Masked positions in the whole global batch (every rank's): the MLM loss is their mean."""
    nsp_examples: int
    """Examples with a next-sentence label in the whole global batch: the NSP loss is their mean."""
    source_tokens: dict[str, int] | None = None
    """In a mixture: each source's tokens the phase trained on up to this step, this one included."""


class Batches:
    """Rows -> padded tensors for one phase, masking them first when the data is dynamically masked.

    `pin_memory` (for a CUDA device) puts the tensors in page-locked memory, so that the step's
    `.to(device, non_blocking=True)` is an asynchronous DMA and the host goes on building the next batch;
    `pad_to` pads every batch to that width, `unpad` passes batches with padding as real tokens, `family` says what
    its models' batches hold (`collate`)."""

    def __init__(
        self,
        plan: PhasePlan,
        seed: int,
        pin_memory: bool = False,
        pad_to: int | None = None,
        unpad: bool = False,
        family: ModelFamily = BERT,
    ) -> None:
        self.seed, self.pin_memory, self.pad_to, self.unpad = seed, pin_memory, pad_to, unpad
        self.family = family
        self.pad_id = getattr(plan.dataset, "pad_id", 0)  # a stand-in dataset (tests) pads with BERT's 0
        self.policy: MaskingPolicy | None = None
        if plan.dataset.dynamic_masking:  # at the phase's own rate when it has one
            self.policy = plan.dataset.policy() if plan.mask_rate is None else plan.dataset.policy(plan.mask_rate)

    def rows(self, table, epoch: int, order: np.ndarray | None = None) -> dict[str, Any]:
        rows = arrow_rows(table, order)
        if self.policy is not None:  # a fresh mask per epoch, a function of (seed, epoch, example_id)
            rows = mask_batch(rows, self.policy, seed=self.seed, epoch=epoch)
        return rows

    def collate(self, rows: dict[str, Any]) -> dict[str, torch.Tensor]:
        batch = collate(rows, self.pad_to, self.unpad, self.family, self.pad_id)
        if self.pin_memory:  # `num_tokens` and `spans` stay on the host: they are never copied
            batch = {k: v if k in HOST_ONLY else v.pin_memory() for k, v in batch.items()}
        return batch

    def __call__(self, table, epoch: int) -> dict[str, torch.Tensor]:
        return self.collate(self.rows(table, epoch))

    def step(self, table, epoch: int, slices: Sequence[tuple[int, int]], order: np.ndarray | None = None) -> Step:
        """A global batch (`table`) -> this rank's micro-batches (`slices` of its rows) and the whole batch's loss
        denominators, counted by every rank from all the rows: no collective is needed to know them. Static masks
        are counted in the table; dynamic ones are drawn for every row first (masks are per row, so a slice's are
        what masking it alone gives), the rank's share only converted otherwise. `order`: the global batch is the
        table's rows in this order (a mixture's), applied to the converted rows (no copy of the table)."""
        import pyarrow.compute as pc

        lo, hi = slices[0][0], slices[-1][1]
        nsp = int(pc.sum(pc.greater_equal(table["next_sentence_label"], 0)).as_py() or 0)
        if self.policy is None:
            masked = int(pc.sum(pc.list_value_length(table["masked_lm_positions"])).as_py() or 0)
            rows = arrow_rows(table.slice(lo, hi - lo)) if order is None else arrow_rows(table, order[lo:hi])
        else:
            every = self.rows(table, epoch, order)
            masked = int(sum(len(p) for p in every["masked_lm_positions"]))
            rows = {k: v[lo:hi] for k, v in every.items()}
        return Step([self.collate({k: v[a - lo : b - lo] for k, v in rows.items()}) for a, b in slices], masked, nsp)


class StepFeed:
    """One rank's `Step`s of one phase, from optimizer step `done` of the phase on, epoch after epoch.

    Every rank reads every training row (`tables()` streams them in file order, once per epoch) and keeps its
    share of each global batch: the batches do not depend on how many ranks there are, so a run resumes at any
    world size with the same data. What reading everything costs: each rank reads the global batch's rows per
    step, not only its own (BERT-base at 128 tokens: about 256 rows of 1 KB per step, a few MB/s per worker)."""

    def __init__(
        self,
        plan: PhasePlan,
        phase: int,
        rank: int,
        world: int,
        seed: int,
        shuffle_rows: int,
        done: int,
        tables: Callable[[], Iterable[Any]],
        to_batch: Batches,
    ) -> None:
        self.plan, self.phase, self.seed, self.shuffle_rows, self.done = plan, phase, seed, shuffle_rows, done
        self.tables, self.to_batch = tables, to_batch
        self.slices = split_global_batch(plan.global_batch_size, world, plan.micro_batch_size)[rank]

    def __iter__(self) -> Iterator[Step]:
        if self.plan.mixture is not None:
            yield from self._mixed(self.plan.mixture)
            return
        epoch, start = divmod(self.done, self.plan.batches_per_epoch)
        while True:
            for _, tbl in epoch_batches(
                self.tables(),
                num_rows=self.plan.train_rows,
                chunk_rows=self.shuffle_rows,
                batch_size=self.plan.global_batch_size,
                seed_key=[self.seed, self.phase, epoch],
                start=start,
            ):
                yield self.to_batch.step(tbl, epoch, self.slices)
            epoch, start = epoch + 1, 0

    def _mixed(self, mix: Mixture) -> Iterator[Step]:
        """A mixture's steps: step k's global batch is each source's next `mix.at(k)` rows (its own stream,
        `SourceRows`, where `mix.before(k)` says it is), the sources' rows spread evenly through it (`interleave`),
        so that every rank's share holds each source in proportion; its dynamic masks are drawn for step k (a row
        drawn again gets a fresh one). Each Step counts the tokens every source gave the phase up to it."""
        import pyarrow as pa

        before = mix.before(self.done)
        streams = [
            SourceRows(
                self.tables, name, i, rows, tokens, self.shuffle_rows, seed=self.seed, phase=self.phase, start=start
            )
            for name, i, rows, tokens, start in zip(mix.names, mix.index, mix.rows, mix.tokens, before)
        ]
        step = self.done
        while True:
            after = mix.before(step + 1)
            counts = [b - a for a, b in zip(before, after)]
            parts = [s.take(n) for s, n in zip(streams, counts) if n]
            table = pa.concat_tables(parts).drop_columns(["source"])  # known: not converted
            out = self.to_batch.step(table, step, self.slices, interleave(tuple(counts)))
            out.source_tokens = {s.name: s.tokens for s in streams}
            yield out
            step, before = step + 1, after


@functools.lru_cache(maxsize=256)
def interleave(counts: tuple[int, ...]) -> np.ndarray:
    """The order that spreads consecutive parts of these sizes evenly through one batch: row j of a part of n rows
    goes to where (j + 1/2) / n of the way through the batch falls (ties: the earlier part first).

    >>> interleave((4, 2)).tolist()
    [0, 4, 1, 2, 5, 3]
    """
    keys = np.concatenate([(np.arange(n) + 0.5) / n for n in counts]) if sum(counts) else np.zeros(0)
    return np.argsort(keys, kind="stable")
