"""Exact and near-duplicate documents: normalisation, MinHash signatures, LSH band keys, and the keep-first rule.

Engine-free: every function takes and returns numpy arrays, so the local pass and the Ray Data pass run the same
code; only the grouping differs (a sort here, `groupby` there).

What counts as a duplicate
    exact: equal `normalise(text)` (case-folded, whitespace runs collapsed to one space, stripped), compared by a
    16-byte blake2b of it (`exact_keys`).
    near: estimated Jaccard similarity >= `threshold` of the sets of word `shingle_size`-grams of the normalised
    text (a text with fewer words than that is one shingle of all its words). Estimated with MinHash
    (`signatures`, `num_perm` values per document); candidate pairs come from LSH banding (`band_keys`: `bands`
    bands of `rows` values) and every candidate is verified against the threshold with the two signatures, so a
    band collision alone never drops a document.

The keep rule (deterministic, partition-free)
    Documents are ordered by `order` = file_index << 32 | record_index (the project's doc_id: sorted input
    files, then document order in a file). A document is dropped iff it duplicates an EARLIER document that is
    KEPT (a verified LSH candidate: see the leaders below); its `duplicate_of` is the earliest such kept document
    and `similarity` their estimated Jaccard. So a dropped document is always within the threshold of the document it is
    reported against. Transitive chains are not followed: with A~B, B~C and A!~C, B is dropped (duplicate of A) and C is
    kept, because the only document C resembles was dropped. (datatrove's union-find would drop C too, against A, which
    it may barely resemble: chains of revisions drift, and the issue's goal is that no document is dropped without a
    kept document near it.) Exact copies are collapsed first: only the first document of each exact group (its
    representative) takes part in the near step; the others follow it: dropped as `exact` duplicates of it
    when it is kept, or as `near` duplicates of the document it was dropped for (same signature, same
    similarity).

How the resolution runs without all-pairs
    1. group by exact key (`exact_edges`): `exact_edges_for_group(orders)` -> edges min order -> every other member.
    2. for the representatives only (`near_edges`), group by each band key (band index mixed into the key, so
       band b of one document only meets band b of another): `edges_for_group(orders, sigs, params)` -> verified edges
       earlier -> later member. Inside a group each member is compared with the group's "leaders" (members that
       matched no earlier leader, at most `max_leaders` of them), so a group of near copies costs one
       comparison per member and a group of unrelated documents at most `max_leaders` per member. (A pair
       whose earlier member is no leader in any band they share is not an edge; measured recall covers it.)
    3. `resolve(exact, near)` on the driver: edges sorted by (dst, src); one pass in order applies the keep rule.
    Each group's edges depend only on the group's members, never on which partition or worker saw them, and
    `resolve` sorts its input, so any partitioning of the groups gives the same result (tests/test_dedup.py
    checks random partitions against `dedup_local`). Only orders, keys and signatures travel; never texts.

The Ray grouping (pipeline/data/grouping.py) shuffles ids, not signatures: at most one signature row a document
    exact:   records (order, exact key) hash-partitioned by the key; `exact_edges` per partition -> Edges
    bands:   each representative's band keys, ids only: rows (key, order), `bands` a document (16 B each), hash-
             partitioned by the key; `candidate_rows` per partition keeps the rows of keys shared by two or more
             rows -> the driver
    plan:    `components(keys, orders)` on the driver: the candidates (documents in a shared band group), each
             labelled with its connected component (documents joined by sharing any band group)
    verify:  each candidate's (order, signature), read once from the records, hash-partitioned by its component;
             `near_edges` per partition -> Edges. A partition holds whole components, so every band group of
             two or more representatives lies wholly inside one partition and `near_edges` there finds exactly the
             groups (and edges) it finds over all representatives.
    driver:  resolve(exact Edges, near Edges) -> Duplicates
So the shuffles carry 24 B (exact) + 16 B x bands (band ids) a document, plus one signature row (512 B at the
default) per candidate: 248-776 B a document against 7,928 B when every band row carried its signature
(bench/RESULTS.md, "Dedup shuffle"). The driver holds the candidate rows (16 B each) and the edges; a verify task
holds its partition's candidates, whole components (528 B a candidate), so one component of a million templated
near-copies would be half a gigabyte in one task. rensa may use Rayon threads for big batches: set
RAYON_NUM_THREADS to the actor's CPUs.
Memory is bounded by the signatures (4 * num_perm bytes a document, 512 B at the default) plus the edges; signing
holds one window of a document's text (pipeline/data/signing.py), never all of its words or shingles.

Defaults (threshold 0.8, num_perm 128, shingle_size 5, bands x rows from `lsh_bands`: 14 x 9 at the default)
were chosen by bench/data/dedup_quality.py on the shared corpora with planted copies (bench/RESULTS.md, section
"Deduplication"): recall of copies with true Jaccard >= 0.9 and documents dropped with no kept document above
Jaccard 0.5 over a grid of threshold x num_perm.

Keys, signatures and their parameters (`normalise`, `exact_keys`, `shingle_hashes`, `signatures`, `records`,
`DedupParams`) are pipeline/data/signing.py's, computed a window of a document at a time: the MinHash implementation
(rensa's R-MinHash over our own shingle hashes) and why signatures are the same on every machine are described there.

    >>> from pipeline.data.signing import normalise
    >>> normalise("  The  LORD\\n\\tsaid ")
    'the lord said'
    >>> p = DedupParams(threshold=0.8, num_perm=128)
    >>> (p.bands, p.rows)
    (14, 9)
    >>> base = " ".join(f"w{i}" for i in range(200))
    >>> texts = [base, "other " * 50, base.upper(), base.replace("w100", "changed")]
    >>> sig = signatures(texts, p)
    >>> sig.shape, sig.dtype.name
    ((4, 128), 'uint32')
    >>> d = dedup_local(np.array([0, 1, 2, 3]), texts, p)
    >>> [(int(o), int(k), kind) for o, k, kind in zip(d.order, d.duplicate_of, d.kind_names())]
    [(2, 0, 'exact'), (3, 0, 'near')]
    >>> DedupParams(threshold=1.5)
    Traceback (most recent call last):
    ...
    ValueError: data.dedup_threshold 1.5 is not in (0, 1]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.data.signing import SHINGLE_MUL, DedupParams, exact_keys, signatures, splitmix

EXACT, NEAR = 0, 1
"""Values of `Duplicates.kind`."""


def similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Estimated Jaccard: the fraction of equal signature values (along the last axis; broadcasts)."""
    return (np.asarray(a) == np.asarray(b)).mean(axis=-1)


def band_keys(sig: np.ndarray, params: DedupParams) -> np.ndarray:
    """(n, bands) uint64: band b's key mixes its `rows` values with b, so it only meets band b of another doc.

    >>> p = DedupParams(num_perm=16, bands=4, rows=4)
    >>> s = np.zeros((2, 16), dtype=np.uint32); s[1, 15] = 1
    >>> k = band_keys(s, p)
    >>> k.shape, (k[0] == k[1]).tolist(), bool(k[0, 0] != k[0, 1])
    ((2, 4), [True, True, True, False], True)
    """
    n = sig.shape[0]
    v = sig[:, : params.bands * params.rows].astype(np.uint64).reshape(n, params.bands, params.rows)
    with np.errstate(over="ignore"):
        acc = np.broadcast_to(splitmix(np.arange(params.bands, dtype=np.uint64) + np.uint64(1)), (n, params.bands))
        for r in range(params.rows):
            acc = splitmix(acc * SHINGLE_MUL + v[:, :, r])
    return np.ascontiguousarray(acc)


@dataclass(frozen=True)
class Edges:
    """Candidate duplicate edges: `dst` (later) duplicates `src` (earlier) with estimated Jaccard `similarity`."""

    src: np.ndarray  # (e,) int64 orders
    dst: np.ndarray  # (e,) int64 orders, dst > src
    similarity: np.ndarray  # (e,) float32

    @staticmethod
    def empty() -> Edges:
        return Edges(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))

    @staticmethod
    def concat(parts: Iterable[Edges]) -> Edges:
        parts = list(parts)
        if not parts:
            return Edges.empty()
        return Edges(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("src", "dst", "similarity")))

    def __len__(self) -> int:
        return len(self.src)


def exact_edges_for_group(orders: np.ndarray) -> Edges:
    """One exact-key group: the earliest member -> every other member, similarity 1.

    >>> e = exact_edges_for_group(np.array([7, 3, 9]))
    >>> e.src.tolist(), e.dst.tolist(), e.similarity.tolist()
    ([3, 3], [7, 9], [1.0, 1.0])
    """
    orders = np.sort(np.asarray(orders, dtype=np.int64))
    return Edges(np.full(len(orders) - 1, orders[0]), orders[1:], np.ones(len(orders) - 1, np.float32))


def edges_for_group(orders: np.ndarray, sigs: np.ndarray, params: DedupParams) -> Edges:
    """One LSH band group (same band key): verified edges earlier -> later member with similarity >= threshold.

    Members are taken in order; each is compared with the group's leaders (earlier members that matched no
    earlier leader, the first `params.max_leaders` of them) and gets an edge from every leader it matches; a
    member that matches none becomes a leader. Depends only on the group's members, not on their row order.

    >>> p = DedupParams(num_perm=16, bands=4, rows=4)
    >>> s = np.zeros((3, 16), dtype=np.uint32); s[2, :8] = 1        # 2 shares half its values with 0 and 1
    >>> e = edges_for_group(np.array([5, 1, 9]), s, p)
    >>> e.src.tolist(), e.dst.tolist(), e.similarity.tolist()
    ([1], [5], [1.0])
    """
    orders = np.asarray(orders, dtype=np.int64)
    by_order = np.argsort(orders, kind="stable")
    orders, sigs = orders[by_order], np.asarray(sigs)[by_order]
    # The common case, a group of near copies, in one vectorised step: everything against the earliest member.
    sim0 = similarity(sigs[1:], sigs[0])
    hit0 = sim0 >= params.threshold
    src, dst, sims = [np.full(int(hit0.sum()), orders[0])], [orders[1:][hit0]], [sim0[hit0]]
    leaders = [0]
    for i in np.flatnonzero(~hit0) + 1:  # members the earliest one did not match
        if len(leaders) > 1:
            s = similarity(sigs[leaders[1:]], sigs[i])
            hit = s >= params.threshold
        else:
            hit = np.zeros(0, bool)
        if hit.any():
            lead = np.asarray(leaders[1:])[hit]
            src.append(orders[lead])
            dst.append(np.full(len(lead), orders[i]))
            sims.append(s[hit])
        elif len(leaders) < params.max_leaders:
            leaders.append(int(i))
    return Edges(
        np.concatenate(src).astype(np.int64),
        np.concatenate(dst).astype(np.int64),
        np.concatenate(sims).astype(np.float32),
    )


def groups(keys: np.ndarray) -> list[np.ndarray]:
    """Row indices of each key value shared by two or more rows (keys (n,) or (n, w)), in first-row order.

    >>> [g.tolist() for g in groups(np.array([4, 2, 4, 3, 2, 4]))]
    [[0, 2, 5], [1, 4]]
    """
    keys = np.asarray(keys)
    if keys.ndim == 1:
        keys = keys[:, None]
    if len(keys) == 0:
        return []
    idx = np.lexsort(keys.T[::-1])
    k = keys[idx]
    new = np.r_[True, (k[1:] != k[:-1]).any(axis=1)]
    starts = np.flatnonzero(new)
    ends = np.r_[starts[1:], len(k)]
    out = [np.sort(idx[s:e]) for s, e in zip(starts, ends) if e - s > 1]
    return sorted(out, key=lambda g: g[0])


@dataclass(frozen=True)
class Duplicates:
    """The dropped documents, sorted by order: each a duplicate of the KEPT document `duplicate_of`."""

    order: np.ndarray  # (d,) int64
    duplicate_of: np.ndarray  # (d,) int64, always a kept document's order
    kind: np.ndarray  # (d,) int8: EXACT or NEAR
    similarity: np.ndarray  # (d,) float32: 1 for exact, the estimated Jaccard for near

    def kind_names(self) -> list[str]:
        return ["exact" if k == EXACT else "near" for k in self.kind]

    def __len__(self) -> int:
        return len(self.order)

    def equals(self, other: Duplicates) -> bool:
        return all(
            np.array_equal(getattr(self, f), getattr(other, f)) for f in ("order", "duplicate_of", "kind", "similarity")
        )


def resolve(exact: Edges, near: Edges) -> Duplicates:
    """Apply the keep-first rule to all edges (any order, repeats allowed) -> the dropped documents.

    near edges join representatives (first of each exact group): in increasing dst, a document is dropped iff
    an edge comes to it from a document not dropped, the earliest such one (src < dst, so it is already
    decided). exact edges then drop every other member of an exact group: `exact` of its representative when
    that is kept, else `near` of the document the representative was dropped for.

    >>> near = Edges(np.array([1, 2, 1]), np.array([2, 3, 4]), np.array([0.9, 0.85, 0.95], np.float32))
    >>> exact = Edges(np.array([2, 1]), np.array([7, 8]), np.ones(2, np.float32))
    >>> d = resolve(exact, near)
    >>> d.order.tolist(), d.duplicate_of.tolist(), d.kind_names(), [round(float(s), 2) for s in d.similarity]
    ([2, 4, 7, 8], [1, 1, 1, 1], ['near', 'near', 'near', 'exact'], [0.9, 0.95, 0.9, 1.0])
    """
    dropped: dict[int, tuple[int, float]] = {}
    by = np.lexsort((near.src, near.dst))  # by dst, then src: the earliest kept source wins
    for s, d, sim in zip(near.src[by].tolist(), near.dst[by].tolist(), near.similarity[by].tolist()):
        if d not in dropped and s not in dropped:
            dropped[d] = (s, sim)
    rows: dict[int, tuple[int, int, float]] = {d: (s, NEAR, sim) for d, (s, sim) in dropped.items()}
    for rep, d in zip(exact.src.tolist(), exact.dst.tolist()):
        rows[d] = (dropped[rep][0], NEAR, dropped[rep][1]) if rep in dropped else (rep, EXACT, 1.0)
    order = np.array(sorted(rows), dtype=np.int64)
    vals = [rows[o] for o in order.tolist()]
    return Duplicates(
        order,
        np.array([v[0] for v in vals], dtype=np.int64),
        np.array([v[1] for v in vals], dtype=np.int8),
        np.array([v[2] for v in vals], dtype=np.float32),
    )


def exact_edges(orders: np.ndarray, exact: np.ndarray) -> Edges:
    """The exact edges of records (orders, exact keys (n, 2)): `exact_edges_for_group` of each key shared by two or
    more of them. Whole groups in, their edges out: the same for any partition of the records by key."""
    orders = np.asarray(orders, dtype=np.int64)
    return Edges.concat(exact_edges_for_group(orders[g]) for g in groups(exact))


def near_edges(orders: np.ndarray, sigs: np.ndarray, params: DedupParams) -> Edges:
    """The verified LSH edges among representatives (orders, signatures): `edges_for_group` of every band group of
    two or more of them. The same for any subset that holds each such group whole (the verify step on Ray).

    >>> p = DedupParams(num_perm=16, bands=4, rows=4)
    >>> s = np.zeros((3, 16), np.uint32); s[1, 15] = 1; s[2] = 7    # 0 and 1 share 3 bands, 2 none
    >>> e = near_edges(np.array([4, 2, 9]), s, p)
    >>> e.src.tolist(), e.dst.tolist(), e.similarity.tolist()
    ([2, 2, 2], [4, 4, 4], [0.9375, 0.9375, 0.9375])
    """
    orders = np.asarray(orders, dtype=np.int64)
    keys = band_keys(sigs, params)
    return Edges.concat(
        edges_for_group(orders[g], sigs[g], params) for b in range(params.bands) for g in groups(keys[:, b])
    )


def candidate_rows(keys: np.ndarray, orders: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The band rows (key, order) whose key two or more rows share, sorted by (key, order): one shuffle partition's
    candidates (a partition holds every row of its keys).

    >>> k, o = candidate_rows(np.array([5, 3, 5, 8], np.uint64), np.array([10, 11, 12, 13]))
    >>> k.tolist(), o.tolist()
    ([5, 5], [10, 12])
    """
    keys, orders = np.asarray(keys, dtype=np.uint64), np.asarray(orders, dtype=np.int64)
    by = np.lexsort((orders, keys))
    k = keys[by]
    shared = np.r_[k[1:] == k[:-1], False] | np.r_[False, k[1:] == k[:-1]]  # equal to the row before or after
    return k[shared], orders[by][shared]


def components(keys: np.ndarray, orders: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(candidates, label): the distinct orders of candidate rows (key, order), sorted, and for each the smallest
    candidate order of its connected component (documents joined by sharing a band key, directly or through
    others). A component holds every band group of each of its documents.

    >>> c, label = components(np.array([7, 7, 9, 9, 4, 4], np.uint64), np.array([1, 5, 5, 8, 3, 6]))
    >>> c.tolist(), label.tolist()
    ([1, 3, 5, 6, 8], [1, 3, 1, 3, 1])
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    keys, orders = np.asarray(keys, dtype=np.uint64), np.asarray(orders, dtype=np.int64)
    cands, node = np.unique(orders, return_inverse=True)
    by = np.lexsort((orders, keys))
    k, v = keys[by], node[by]
    link = np.flatnonzero(k[1:] == k[:-1])  # each row to the next row of its key: a chain through the group
    n = len(cands)
    graph = coo_matrix((np.ones(len(link), np.int8), (v[link], v[link + 1])), shape=(n, n))
    _, comp = connected_components(graph, directed=False)
    first = np.full(comp.max(initial=-1) + 1, n, np.int64)
    np.minimum.at(first, comp, np.arange(n))  # candidates are sorted: a component's first index is its smallest
    return cands, cands[first[comp]]


def find_edges(
    orders: np.ndarray, exact: np.ndarray, sigs: np.ndarray | None, params: DedupParams
) -> tuple[Edges, Edges]:
    """Local grouping: (exact edges, near edges) for records (orders, exact keys (n, 2), signatures or None)."""
    orders = np.asarray(orders, dtype=np.int64)
    exact_e = exact_edges(orders, exact)
    if params.mode != "near" or sigs is None:
        return exact_e, Edges.empty()
    reps = ~np.isin(orders, exact_e.dst)
    return exact_e, near_edges(orders[reps], sigs[reps], params)


def dedup_local(orders: np.ndarray, texts: Sequence[str], params: DedupParams) -> Duplicates:
    """The whole pass in one process: what any partitioning of the same groups gives (see the module docstring)."""
    if params.mode == "off":
        return resolve(Edges.empty(), Edges.empty())
    sigs = signatures(texts, params) if params.mode == "near" else None
    return resolve(*find_edges(orders, exact_keys(texts), sigs, params))
