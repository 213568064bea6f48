"""pipeline/data/dedup.py without Ray: normalisation, exact and near duplicates against brute-force Jaccard,
the keep-first rule, independence from partitioning, the Ray executor's id-only band shuffle + component
verification against the band grouping with signatures, parameter validation."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest

from pipeline.data.dedup import (
    EXACT,
    NEAR,
    Edges,
    band_keys,
    candidate_rows,
    components,
    dedup_local,
    edges_for_group,
    exact_edges_for_group,
    find_edges,
    groups,
    near_edges,
    resolve,
)
from pipeline.data.signing import DedupParams, exact_keys, normalise, shingle_hashes, signatures


def _jaccard(a: str, b: str) -> float:
    x, y = set(shingle_hashes(a).tolist()), set(shingle_hashes(b).tolist())
    return len(x & y) / len(x | y)


def _edit(text: str, frac: float, rng: random.Random) -> str:
    words = text.split()
    for i in rng.sample(range(len(words)), max(1, round(frac * len(words)))):
        words[i] = f"zz{rng.randrange(10**6)}"
    return " ".join(words)


@pytest.fixture(scope="module")
def paragraphs(shared_dir) -> list[str]:
    """Real, mutually distinct paragraphs of 150+ words (Genesis and Exodus)."""
    text = "\n".join(
        (shared_dir / "corpora/books" / n).read_text(encoding="utf-8") for n in ("01_Ge.txt", "02_Exo.txt")
    )
    paras = [p for p in text.split("\n") if len(p.split()) >= 150]
    assert len(paras) >= 60
    return paras


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Hello  World", "hello world"),
        ("\tA\r\nB\u00a0 C \n", "a b c"),
        ("STRASSE straße", "strasse strasse"),
        ("", ""),
    ],
)
def test_normalise(text, expected):
    assert normalise(text) == expected


def test_exact_keys_follow_normalisation():
    k = exact_keys(["The LORD said", "the   lord\nsaid ", "the lord says", ""])
    assert k.shape == (4, 2) and k.dtype == np.uint64
    assert (k[0] == k[1]).all()
    assert not (k[0] == k[2]).all() and not (k[0] == k[3]).all()


def test_shingles_and_signature_estimate(paragraphs):
    a = paragraphs[0]
    assert len(shingle_hashes(a)) == len(a.split()) - 4
    assert len(shingle_hashes("one two")) == 1 and len(shingle_hashes("")) == 1
    b = _edit(a, 0.05, random.Random(0))
    sig = signatures([a, b, paragraphs[1]], DedupParams(num_perm=256))
    est = (sig[0] == sig[1]).mean()
    assert abs(est - _jaccard(a, b)) < 0.1  # sd at J ~ 0.6, 256 slots: 0.03
    assert (sig[0] == sig[2]).mean() < 0.1


def test_signatures_same_in_another_process():
    """No salted hash() anywhere: a child with another PYTHONHASHSEED computes the same signatures."""
    texts = ["In the beginning God created the heaven and the earth.", "short", "Was ist das? Das ist Straße."]
    code = (
        "import sys, hashlib; from pipeline.data.signing import *; "
        f"print(hashlib.sha256(signatures({texts!r}, DedupParams()).tobytes()).hexdigest())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    import hashlib

    assert out.strip() == hashlib.sha256(signatures(texts, DedupParams()).tobytes()).hexdigest()


def test_band_keys_separate_bands():
    p = DedupParams(num_perm=16, bands=4, rows=4)
    sig = np.tile(np.arange(4, dtype=np.uint32), 4)[None, :]  # the four bands hold the same values
    k = band_keys(sig, p)
    assert len(set(k[0].tolist())) == 4  # ... yet their keys differ: band b only meets band b


def test_exact_duplicates_keep_first():
    texts = ["alpha beta gamma", "Alpha  BETA gamma", "delta", "alpha beta gamma\n"]
    d = dedup_local(np.array([10, 11, 12, 13]), texts, DedupParams(mode="exact"))
    assert d.order.tolist() == [11, 13]
    assert d.duplicate_of.tolist() == [10, 10]
    assert d.kind.tolist() == [EXACT, EXACT] and d.similarity.tolist() == [1.0, 1.0]


def test_modes(paragraphs):
    a = paragraphs[0]
    texts = [a, a.upper(), _edit(a, 0.01, random.Random(1))]
    orders = np.arange(3)
    assert len(dedup_local(orders, texts, DedupParams(mode="off"))) == 0
    assert dedup_local(orders, texts, DedupParams(mode="exact")).order.tolist() == [1]
    near = dedup_local(orders, texts, DedupParams(mode="near"))
    assert near.order.tolist() == [1, 2] and near.kind_names() == ["exact", "near"]
    assert near.duplicate_of.tolist() == [0, 0] and 0.8 <= near.similarity[1] < 1.0


def test_planted_near_duplicates_against_brute_force(paragraphs):
    """Copies at 1% edits (J ~ 0.9+) are found; 20% edits and distinct paragraphs (J < 0.5) are never dropped."""
    rng = random.Random(7)
    base = paragraphs[:60]
    close = [_edit(t, 0.01, rng) for t in base[:20]]
    far = [_edit(t, 0.2, rng) for t in base[20:40]]
    texts = base + close + far
    rng.shuffle(texts)  # originals and copies in any order: the keep rule works on order, whatever comes first
    orders = np.arange(len(texts), dtype=np.int64)
    d = dedup_local(orders, texts, DedupParams())
    dropped = set(d.order.tolist())
    kept = [i for i in range(len(texts)) if i not in dropped]
    n = len(texts)
    sets = [set(shingle_hashes(t).tolist()) for t in texts]
    jac = np.array([[len(a & b) / len(a | b) if a is not b else 0.0 for b in sets] for a in sets])  # brute force
    should = [i for i in range(n) if any(jac[i, j] >= 0.9 for j in range(i))]
    assert len(should) >= 15
    recall = sum(i in dropped for i in should) / len(should)
    assert recall >= 0.95
    for o, k, s in zip(d.order.tolist(), d.duplicate_of.tolist(), d.similarity.tolist()):
        assert k < o and k in kept
        assert jac[o, k] >= 0.7 and abs(s - jac[o, k]) < 0.12
        assert jac[o, kept].max() > 0.5  # never a false drop
    assert len(dropped) <= 20  # the 20% edits (J ~ 0.2) stay


def test_keep_first_is_by_order_not_by_row(paragraphs):
    a, b = paragraphs[0], paragraphs[1]
    texts = [_edit(a, 0.01, random.Random(2)), b, a, b.lower()]
    orders = np.array([(3 << 32) | 5, (0 << 32) | 1, (1 << 32) | 0, (2 << 32) | 9], dtype=np.int64)
    d = dedup_local(orders, texts, DedupParams())
    # a's first occurrence is file 1; the edited copy (file 3) is its near duplicate; b.lower() exact of file 0
    assert d.order.tolist() == [(2 << 32) | 9, (3 << 32) | 5]
    assert d.duplicate_of.tolist() == [(0 << 32) | 1, (1 << 32) | 0]
    assert d.kind.tolist() == [EXACT, NEAR]
    perm = np.random.default_rng(0).permutation(4)
    assert dedup_local(orders[perm], [texts[i] for i in perm], DedupParams()).equals(d)


def test_resolve_chain_is_not_followed():
    """A~B, B~C, A!~C: B is dropped against A and C is kept (its only near document was dropped)."""
    near = Edges(np.array([1, 2]), np.array([2, 3]), np.array([0.85, 0.85], np.float32))
    d = resolve(Edges.empty(), near)
    assert d.order.tolist() == [2] and d.duplicate_of.tolist() == [1]
    # An exact copy (9) of a representative (2) dropped as near follows it: near of 1, same similarity.
    d = resolve(Edges(np.array([2]), np.array([9]), np.ones(1, np.float32)), near)
    assert d.order.tolist() == [2, 9] and d.duplicate_of.tolist() == [1, 1]
    assert d.kind.tolist() == [NEAR, NEAR] and d.similarity[1] == np.float32(0.85)


def test_edges_for_group_leaders():
    """Each member is verified against the leaders; a third cluster finds no free leader slot (max_leaders 2)."""
    orders = np.array([40, 10, 30, 20, 50, 60])
    cluster = np.array([0, 1, 1, 2, 2, 0])  # by order: 10:1, 20:2, 30:1, 40:0, 50:2, 60:0
    s = np.repeat(cluster[:, None], 16, axis=1).astype(np.uint32)
    e = edges_for_group(orders, s, DedupParams(num_perm=16, bands=4, rows=4, max_leaders=2))
    assert sorted(zip(e.src.tolist(), e.dst.tolist())) == [(10, 30), (20, 50)]  # 40 -> 60 lost to the cap
    e = edges_for_group(orders, s, DedupParams(num_perm=16, bands=4, rows=4, max_leaders=3))
    assert sorted(zip(e.src.tolist(), e.dst.tolist())) == [(10, 30), (20, 50), (40, 60)]
    assert e.similarity.tolist() == [1.0, 1.0, 1.0]
    assert exact_edges_for_group(np.array([5])).src.size == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_partitioned_groups_give_the_local_result(paragraphs, seed):
    """Groups spread over random partitions, edges concatenated in any order: identical to dedup_local."""
    rng = random.Random(seed)
    base = paragraphs[:40]
    texts = base + [_edit(t, 0.01, rng) for t in base[:15]] + [t.upper() for t in base[10:20]] + base[30:35]
    texts += [_edit(t, 0.03, rng) for t in base[5:15]]
    rng.shuffle(texts)
    orders = np.array(sorted(rng.sample(range(1 << 40), len(texts))), dtype=np.int64)
    params = DedupParams()
    expected = dedup_local(orders, texts, params)
    assert len(expected) >= 25

    exact, sigs = exact_keys(texts), signatures(texts, params)
    parts = 4

    def spread(items):
        buckets = [[] for _ in range(parts)]
        for it in items:
            buckets[rng.randrange(parts)].append(it)
        return buckets

    ex_parts = spread(groups(exact))
    exact_edges = Edges.concat(exact_edges_for_group(orders[g]) for b in ex_parts for g in b)
    reps = np.flatnonzero(~np.isin(orders, exact_edges.dst))
    keys = band_keys(sigs[reps], params)
    band_groups = [reps[g] for b in range(params.bands) for g in groups(keys[:, b])]
    rng.shuffle(band_groups)
    near_parts = [[edges_for_group(orders[g], sigs[g], params) for g in b] for b in spread(band_groups)]
    flat = [e for part in near_parts[::-1] for e in part]
    got = resolve(exact_edges, Edges.concat(flat))
    assert got.equals(expected)
    assert resolve(*find_edges(orders, exact, sigs, params)).equals(expected)


def _band_grouping_with_signatures(orders, sigs, params) -> Edges:
    """The Ray executor's grouping before issue 36, as it ran: every band row (key, order, signature) grouped by
    key alone (across bands), `edges_for_group` on each group of two or more rows."""
    keys = band_keys(sigs, params).T.ravel()  # band-major rows, as `band_rows` made them
    rows_order, rows_sig = np.tile(orders, params.bands), np.tile(sigs, (params.bands, 1))
    return Edges.concat(edges_for_group(rows_order[g], rows_sig[g], params) for g in groups(keys))


def _id_shuffle_and_verify(orders, sigs, params, rng, parts=4):
    """The Ray executor's grouping now, with random hash partitions: band rows (key, order) partitioned by key ->
    `candidate_rows` per partition -> `components` of them all -> each candidate's (order, signature) once,
    partitioned by component -> `near_edges` per partition. Returns (edges, signature rows shipped)."""
    keys = band_keys(sigs, params).T.ravel()
    rows_order = np.tile(orders, params.bands)
    assert keys.dtype == np.uint64 and rows_order.dtype == np.int64  # 16 bytes a band row, no signature
    salt = rng.randrange(1 << 30)
    part = (keys ^ np.uint64(salt)) % np.uint64(parts)
    found = [candidate_rows(keys[part == p], rows_order[part == p]) for p in range(parts)]
    cand, label = components(np.concatenate([k for k, _ in found]), np.concatenate([o for _, o in found]))
    where = {int(o): i for i, o in enumerate(orders)}
    vpart = (label * 7919 + salt) % parts
    edges = []
    for p in rng.sample(range(parts), parts):  # partitions finish in any order
        mine = cand[vpart == p]
        edges.append(near_edges(mine, sigs[[where[int(o)] for o in mine]], params))
    return Edges.concat(edges), cand


def _edge_set(e: Edges) -> set:
    return set(zip(e.src.tolist(), e.dst.tolist(), e.similarity.tolist()))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_id_shuffle_verifies_the_same_edges_as_the_band_grouping(paragraphs, seed):
    """Crafted near duplicates (1% and 3% edits, case copies, exact copies, chains of edits of edits, distinct
    paragraphs): the id-only band shuffle + per-component verification gives exactly the edges of the band
    grouping that shipped signatures, hence the same kept set as `dedup_local`; and each candidate's signature
    is shipped once (one row a candidate, no more rows than documents)."""
    rng = random.Random(seed)
    base = paragraphs[:40]
    chain = [_edit(base[0], 0.02, rng)]
    for _ in range(4):
        chain.append(_edit(chain[-1], 0.02, rng))  # each near the one before, drifting away from the first
    texts = base + [_edit(t, 0.01, rng) for t in base[:15]] + [t.upper() for t in base[10:20]] + base[30:35]
    texts += [_edit(t, 0.03, rng) for t in base[5:15]] + chain
    rng.shuffle(texts)
    orders = np.array(sorted(rng.sample(range(1 << 40), len(texts))), dtype=np.int64)
    params = DedupParams()
    exact, sigs = exact_keys(texts), signatures(texts, params)
    exact_e, _ = find_edges(orders, exact, sigs, params)
    reps = ~np.isin(orders, exact_e.dst)
    old = _band_grouping_with_signatures(orders[reps], sigs[reps], params)
    new, cand = _id_shuffle_and_verify(orders[reps], sigs[reps], params, rng)
    assert len(old) >= 40 and _edge_set(new) == _edge_set(old)
    assert resolve(exact_e, new).equals(dedup_local(orders, texts, params))
    assert len(cand) == len(np.unique(cand)) and 0 < len(cand) < reps.sum()  # one signature row per candidate


def test_components_join_groups_through_shared_documents():
    """A~B share band 0, B~C band 1, D~E band 0 elsewhere: two components; the leaders' cap still applies per
    band group inside a component (a partition holding the component verifies each group as before)."""
    p = DedupParams(num_perm=16, bands=4, rows=4, threshold=0.5)
    rng = np.random.default_rng(0)
    s = rng.integers(0, 2**32, (5, 16), dtype=np.uint32)
    s[1, :4] = s[0, :4]  # B shares A's band 0 only (similarity 0.25: a candidate, not an edge)
    s[2, 4:16] = s[1, 4:16]  # C shares B's bands 1-3 (0.75: an edge)
    s[4, :12] = s[3, :12]  # E shares D's bands 0-2
    orders = np.array([10, 20, 30, 40, 50])
    keys = band_keys(s, p).T.ravel()
    k, o = candidate_rows(keys, np.tile(orders, p.bands))
    assert sorted(set(o.tolist())) == [10, 20, 30, 40, 50] and len(k) == 2 + 3 * 2 + 3 * 2
    cand, label = components(k, o)
    assert cand.tolist() == [10, 20, 30, 40, 50] and label.tolist() == [10, 10, 10, 40, 40]
    e = near_edges(cand, s, p)
    assert _edge_set(e) == _edge_set(_band_grouping_with_signatures(orders, s, p))
    assert sorted(set(zip(e.src.tolist(), e.dst.tolist()))) == [(20, 30), (40, 50)]
    assert components(np.zeros(0, np.uint64), np.zeros(0, np.int64))[0].size == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"threshold": 1.5}, "data.dedup_threshold 1.5 is not in (0, 1]"),
        ({"threshold": 0.0}, "data.dedup_threshold 0.0 is not in (0, 1]"),
        ({"num_perm": 8}, "data.dedup_num_perm 8 is not in [16, 1024]"),
        ({"mode": "fuzzy"}, "data.dedup 'fuzzy' is not one of off, exact, near"),
        ({"bands": 20, "rows": 0}, "data.dedup_bands 20 and data.dedup_rows 0: give both or neither"),
        ({"bands": 20, "rows": 7}, "data.dedup_bands 20 x data.dedup_rows 7 must be >= 1 and fit in"),
        ({"shingle_size": 0}, "data.dedup_shingle_size 0 is not >= 1"),
    ],
)
def test_bad_params(kwargs, message):
    with pytest.raises(ValueError) as e:
        DedupParams(**kwargs)
    assert str(e.value).startswith(message)


def test_default_bands():
    p = DedupParams()
    assert (p.threshold, p.num_perm, p.shingle_size, p.bands, p.rows) == (0.8, 128, 5, 14, 9)
