"""pipeline/data/executors.py: the dedup pass's grouping on a real local Ray (Ray Data's hash shuffles) against the
local executor's sort: the same edges and dropped documents, and a shuffle of ids plus at most one signature row
a document (measured with Ray Data's own stats, as bench/measure.py's captured_shuffles measures it)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.data.arrow import arrow, fixed_rows_array
from pipeline.data.dedup import find_edges, resolve
from pipeline.data.grouping import ray_duplicate_edges
from pipeline.data.signing import DedupParams

pytestmark = pytest.mark.slow


def _records(tmp_path, units: int = 3, per_unit: int = 400, seed: int = 0):
    """Records as `sign_unit` writes them, with planted duplicates: random signatures (distinct documents), 200
    near copies of earlier documents (0 to 40 of 128 slots changed: similarity 1 down to 0.69, some copies of
    copies), 40 documents sharing only band 0 with an earlier one (candidates that fail verification), 30 exact
    copies (same key and signature: 29 exact groups followers, one copy copied from another)."""
    rng = np.random.default_rng(seed)
    n = units * per_unit
    sigs = rng.integers(0, 2**32, (n, 128), dtype=np.uint32)
    exact = rng.integers(0, 2**63, (n, 2)).astype(np.uint64)
    later = rng.permutation(np.arange(50, n))
    for i in later[:200]:
        j = rng.integers(0, i)
        sigs[i] = sigs[j]
        slots = rng.choice(128, rng.integers(0, 41), replace=False)
        sigs[i, slots] = rng.integers(0, 2**32, len(slots), dtype=np.uint32)
    for i in later[200:240]:
        sigs[i, :9] = sigs[rng.integers(0, i), :9]  # band 0 (9 rows at the default 14 x 9)
    for i in later[240:270]:
        j = rng.integers(0, i)
        sigs[i], exact[i] = sigs[j], exact[j]
    orders = np.array([(u << 32) | k for u in range(units) for k in range(per_unit)], dtype=np.int64)
    paths = []
    for u in range(units):
        s = slice(u * per_unit, (u + 1) * per_unit)
        t = pa.table(
            [
                arrow(orders[s], pa.int64()),
                pa.array([f"d{o}" for o in orders[s]]),
                arrow(exact[s, 0], pa.uint64()),
                arrow(exact[s, 1], pa.uint64()),
                fixed_rows_array(sigs[s]),
            ],
            names=["doc_id", "name", "exact_hi", "exact_lo", "sig"],
        )
        paths.append(str(tmp_path / f"f{u:06d}.parquet"))
        pq.write_table(t, paths[-1], compression="lz4")
    return paths, orders, exact, sigs


@pytest.mark.parametrize("mode", ["near", "exact"])
def test_ray_grouping_equals_the_local_sort_and_ships_a_signature_once(ray_local, tmp_path, mode, monkeypatch):
    import ray.data
    from conftest import load_bench

    from pipeline.data.grouping import SHUFFLE_INPUT_BYTES

    bench = load_bench("measure")
    params = DedupParams(mode=mode)
    paths, orders, exact, sigs = _records(tmp_path)
    want_exact, want_near = find_edges(orders, exact, sigs, params)
    # each shuffle's map-task input: (its dataset's context, the process's current context) as it is made
    plain, batch_bytes = ray.data.Dataset.repartition, []
    current = ray.data.DataContext.get_current
    monkeypatch.setattr(
        ray.data.Dataset,
        "repartition",
        lambda ds, *a, **k: (
            batch_bytes.append((ds.context.shuffle_input_batch_bytes, current().shuffle_input_batch_bytes))
            or plain(ds, *a, **k)
        ),
    )
    default = current().shuffle_input_batch_bytes
    with bench.captured_shuffles() as seen:
        got_exact, got_near = ray_duplicate_edges(paths, params)
    assert SHUFFLE_INPUT_BYTES < default and batch_bytes == [(SHUFFLE_INPUT_BYTES, default)] * len(seen)
    assert current().shuffle_input_batch_bytes == default
    want, got = resolve(want_exact, want_near), resolve(got_exact, got_near)
    assert got.equals(want)
    assert sorted(zip(got_exact.src.tolist(), got_exact.dst.tolist())) == sorted(
        zip(want_exact.src.tolist(), want_exact.dst.tolist())
    )
    assert set(zip(got_near.src.tolist(), got_near.dst.tolist(), got_near.similarity.tolist())) == set(
        zip(want_near.src.tolist(), want_near.dst.tolist(), want_near.similarity.tolist())
    )
    n, reps = len(orders), len(orders) - len(np.unique(want_exact.dst))
    by_keys = {s["keys"]: s for s in seen}
    assert (
        by_keys["'exact_hi', 'exact_lo'"]["rows"] == n and by_keys["'exact_hi', 'exact_lo'"]["bytes"] <= 24 * n + 4096
    )
    if mode == "exact":
        assert len(seen) == 1 and len(got) == 29  # 30 planted exact copies, one of them copied from another
        return
    assert len(want.order) == 134 and (want.kind == 1).sum() == 109  # the planted near copies at similarity >= 0.8
    assert len(seen) == 3
    band, verify = by_keys["'key',"], by_keys["'component',"]
    assert band["rows"] == 14 * reps and band["bytes"] <= 16 * band["rows"] + 4096  # ids only: 16 B a band row
    # one signature row per candidate document: the near copies, their originals, the band-0 sharers
    assert 250 < verify["rows"] <= reps and verify["bytes"] <= verify["rows"] * (512 + 16) + 4096
    assert sum(s["bytes"] for s in seen) <= 2 * sigs.nbytes  # the goal of issue 36: <= 2x the signatures' bytes


def test_the_ray_executor_groups_up_to_the_limit_in_memory_and_past_it_on_ray_data(tmp_path, monkeypatch):
    """RayExecutor.duplicate_edges: records up to MEMORY_GROUPING_MAX_RECORDS are grouped in the driver's memory
    (no Ray Data, the actors kept for the tokenize pass), more go to `ray_duplicate_edges` (the actors ended
    first). Both give the local sort's edges (`ray_duplicate_edges` itself: the test above)."""
    from types import SimpleNamespace

    from pipeline.data import executors, grouping

    paths, orders, exact, sigs = _records(tmp_path)
    params = DedupParams(mode="near")
    want = resolve(*find_edges(orders, exact, sigs, params))
    released, on_ray = [], []
    executor = SimpleNamespace(release=lambda: released.append(True))  # what duplicate_edges uses of the executor
    monkeypatch.setattr(
        grouping,
        "ray_duplicate_edges",
        lambda p, prm, rows: on_ray.append((p, rows)) or grouping.memory_duplicate_edges(p, prm),
    )
    monkeypatch.setattr(grouping, "MEMORY_GROUPING_MAX_RECORDS", len(orders))
    assert resolve(*executors.RayExecutor.duplicate_edges(executor, paths, params)).equals(want)
    assert on_ray == [] and released == []
    monkeypatch.setattr(grouping, "MEMORY_GROUPING_MAX_RECORDS", len(orders) - 1)
    assert resolve(*executors.RayExecutor.duplicate_edges(executor, paths, params)).equals(want)
    assert on_ray == [(paths, len(orders))] and released == [True]  # the count read once, handed on
