"""The dedup pass's grouping: the records `sign` wrote (doc_id, exact key, MinHash signature) -> the (exact, near)
candidate edges that `dedup.resolve` turns into dropped documents. Two ways, the same edges (tests/test_executors.py):

- `memory_duplicate_edges`: every record in this process, grouped by a sort (`dedup.find_edges`): the local
  executor's way, and the Ray executor's up to MEMORY_GROUPING_MAX_RECORDS records;
- `ray_duplicate_edges`: past that, Ray Data's hash shuffles across the cluster, which ship ids and one signature
  per candidate document, a bounded batch at a time (bench/RESULTS.md "Dedup shuffle", "A gigabyte on two hosts").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from pipeline import cluster
from pipeline.data.arrow import arrow, fixed_rows, numpy_of
from pipeline.data.dedup import Edges, find_edges
from pipeline.data.signing import DedupParams
from pipeline.storage.io import filesystem, read_table

MEMORY_GROUPING_MAX_RECORDS = 250_000
"""Up to this many records the Ray executor groups them on the driver as the local executor does (0.65 KB a record),
not by Ray Data's three hash shuffles, whose fixed cost is tens of CPU-seconds at any size (bench/RESULTS.md
"Corpus scale"); past it one process's memory would grow with the corpus, the shuffles' does not."""


SIGNATURE_BATCH = 16_384
"""Records a Ray Data task turns into band rows (or candidates' signatures) at a time: 8 MB of signatures. Without
it a task took its whole read block, up to Ray Data's 128 MB target, with its band keys' intermediates: the largest
process of the gigabyte run, 0.93 GiB less shared pages; 0.52 with this and SHUFFLE_INPUT_BYTES (bench/RESULTS.md,
"A gigabyte on two hosts")."""


def memory_duplicate_edges(paths: list[str], params: DedupParams) -> tuple[Edges, Edges]:
    """The dedup pass's grouping in this process: every record's keys and signature in memory (648 bytes a
    document at the default), grouped by a sort (`dedup.find_edges`)."""
    tables = [read_table(p, columns=["doc_id", "exact_hi", "exact_lo"]) for p in paths]
    orders = np.concatenate([numpy_of(t.column("doc_id")) for t in tables])
    exact = np.stack([np.concatenate([numpy_of(t.column(c)) for t in tables]) for c in ("exact_hi", "exact_lo")], 1)
    sigs = (
        np.concatenate([fixed_rows(read_table(p, columns=["sig"]).column("sig"), np.uint32) for p in paths])
        if params.mode == "near"
        else None
    )
    return find_edges(orders, exact, sigs, params)


def count_records(paths: list[str]) -> int:
    """Rows of the record files at `paths`, from their Parquet footers."""
    import pyarrow.parquet as pq

    total = 0
    for path in paths:
        fs, p = filesystem(path)
        with fs.open(p, "rb") as f:
            total += pq.read_metadata(f).num_rows
    return total


def _partitions(rows: int) -> int:
    """Shuffle partitions: Ray Data's default (200) costs seconds of task overhead on a small corpus; one per CPU,
    or one per ~20k documents on a large one."""
    import ray

    return int(max(ray.cluster_resources().get("CPU", 1), min(200, rows // 20_000)))


def _edges_of(ds: Any) -> Edges:
    """The Edges a dataset of edge tables holds, gathered on the driver."""
    parts = [
        Edges(numpy_of(t["src"]), numpy_of(t["dst"]), numpy_of(t["similarity"]))
        for t in ds.iter_batches(batch_format="pyarrow", batch_size=None)
        if t.num_rows
    ]
    return Edges.concat(parts)


def _edge_table(e: Edges) -> pa.Table:
    return pa.table(
        [arrow(e.src, pa.int64()), arrow(e.dst, pa.int64()), arrow(e.similarity, pa.float32())],
        names=["src", "dst", "similarity"],
    )


def _key_table(keys: np.ndarray, orders: np.ndarray) -> pa.Table:
    return pa.table([arrow(keys, pa.uint64()), arrow(orders, pa.int64())], names=["key", "doc_id"])


SHUFFLE_INPUT_BYTES = 64 << 20
"""Input a hash shuffle's map task partitions at once. Ray Data's default (`shuffle_input_batch_bytes`, 1 GiB) buffers
a node's input blocks up to 1 GiB for one task, so that task's memory grew with the corpus. On a million synthetic
records (2 CPUs, the largest process's RSS less its shared pages): 0.87 GiB before either, 0.58 with SIGNATURE_BATCH
(then a shuffle map task's), 0.49 with both; 0.55 at two million (bench/RESULTS.md, "A gigabyte on two hosts")."""


def _read_records(paths: list[str], columns: list[str]) -> Any:
    """The record files' `columns` as a Ray Data dataset whose shuffles take SHUFFLE_INPUT_BYTES a map task. The
    setting goes on the dataset's own DataContext (a copy taken as it is read, which the datasets derived from it
    share), not on the process's current one."""
    ds = cluster.read_parquet(paths, columns=columns)
    ds.context.shuffle_input_batch_bytes = SHUFFLE_INPUT_BYTES
    return ds


def ray_duplicate_edges(paths: list[str], params: DedupParams, rows: int | None = None) -> tuple[Edges, Edges]:
    """(exact, near) edges of the `rows` records (counted here when None) `sign` wrote to `paths`, on Ray Data
    (dedup.py's module docstring has the steps). Three hash shuffles: exact keys with ids; band keys with ids (`bands`
    rows of 16 B a representative); and each candidate's signature once, partitioned by its component. A partition is
    one block (`repartition(keys=...)`, as under `groupby().map_groups`): each function below sees whole groups and
    whole components. The same edges as `dedup.find_edges` over all records."""
    from pipeline.data import dedup

    parts = _partitions(count_records(paths) if rows is None else rows)

    def exact_part(t: pa.Table) -> pa.Table:
        keys = np.stack([numpy_of(t["exact_hi"]), numpy_of(t["exact_lo"])], 1)
        return _edge_table(dedup.exact_edges(numpy_of(t["doc_id"]), keys))

    ids = _read_records(paths, ["doc_id", "exact_hi", "exact_lo"])
    exact = _edges_of(
        ids.repartition(parts, keys=["exact_hi", "exact_lo"]).map_batches(
            exact_part, batch_format="pyarrow", batch_size=None
        )
    )
    if params.mode != "near":
        return exact, Edges.empty()
    followers = np.unique(exact.dst)  # members of an exact group other than its first: not in the near step

    def band_rows(t: pa.Table) -> pa.Table:
        orders = numpy_of(t["doc_id"])
        keep = ~np.isin(orders, followers)
        keys = dedup.band_keys(fixed_rows(t["sig"], np.uint32)[keep], params)  # (n, bands); the signature stays
        return _key_table(keys.T.ravel(), np.tile(orders[keep], params.bands))

    def candidates(t: pa.Table) -> pa.Table:
        return _key_table(*dedup.candidate_rows(numpy_of(t["key"]), numpy_of(t["doc_id"])))

    sigs = _read_records(paths, ["doc_id", "sig"])
    bands = sigs.map_batches(band_rows, batch_format="pyarrow", batch_size=SIGNATURE_BATCH).repartition(
        parts, keys=["key"]
    )
    found = list(
        bands.map_batches(candidates, batch_format="pyarrow", batch_size=None).iter_batches(
            batch_format="pyarrow", batch_size=None
        )
    )
    shared = pa.concat_tables([_key_table(np.zeros(0, np.uint64), np.zeros(0, np.int64)), *found])
    if shared.num_rows == 0:
        return exact, Edges.empty()
    cands, label = dedup.components(numpy_of(shared["key"]), numpy_of(shared["doc_id"]))
    del shared, found

    def fetch(t: pa.Table) -> pa.Table:
        orders = numpy_of(t["doc_id"])
        at = np.minimum(np.searchsorted(cands, orders), len(cands) - 1)
        hit = np.flatnonzero(cands[at] == orders)
        return pa.table(
            [arrow(orders[hit], pa.int64()), arrow(label[at[hit]], pa.int64()), t["sig"].take(arrow(hit, pa.int64()))],
            names=["doc_id", "component", "sig"],
        )

    def verify(t: pa.Table) -> pa.Table:
        return _edge_table(dedup.near_edges(numpy_of(t["doc_id"]), fixed_rows(t["sig"], np.uint32), params))

    near = _edges_of(
        sigs.map_batches(fetch, batch_format="pyarrow", batch_size=SIGNATURE_BATCH)
        .repartition(_partitions(len(cands)), keys=["component"])
        .map_batches(verify, batch_format="pyarrow", batch_size=None)
    )
    return exact, near
