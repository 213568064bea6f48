"""Deduplication quality and cost: planted copies in the shared corpora, brute-force Jaccard as ground truth.

    python bench/data/dedup_quality.py                  # everything: real corpora, planted grid, LSH weights, speed
    python bench/data/dedup_quality.py --skip-speed

Corpus for quality (deterministic, `--seed`): the shared books split into paragraphs (one document per
non-empty line, so there are ~1,200 of them instead of 66) and the first 383 wiki documents, plus planted
documents in `planted/*.jsonl` (sorted between books/ and wiki/, so wiki originals come AFTER their copies and
the keep-first rule keeps the copy): exact copies, copies with other case and whitespace, copies with 1%, 3%,
5%, 10%, 20% and 40% of their words replaced, one book's paragraphs again under another file name, and the
other 100 wiki documents, each only once, with the same 116-word licence paragraph prepended (distinct
documents sharing boilerplate).

Ground truth: the exact Jaccard of every pair's shingle sets (word 5-grams of the normalised text), all pairs,
by a sparse matrix product of the document x shingle incidence matrix. Measured per setting:
    recall@0.9   documents that have an EARLIER document with true Jaccard >= 0.9 and were dropped (goal >= 0.95)
    false drops  dropped documents with no KEPT document above true Jaccard 0.5 (goal <= 1% of documents)
    below thr    dropped documents whose true Jaccard with their `duplicate_of` is < threshold - 0.1
    est err      mean |estimated - true| Jaccard over the reported (dropped, duplicate_of) pairs
Speed: documents/s and MB/s of signatures on the real shared corpora (66 books + 483 wiki documents), word
5-gram shingles of the normalised text for all: ours (our shingle hashes + rensa's batch matrix), the same
hashes through a vectorised numpy MinHash, datasketch 2.0.0 `MinHash.update_batch` and rensa 0.5.0
`RMinHash.update` on shingle strings.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import scipy.sparse as sp

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared"
if not (SHARED / "corpora").exists():
    SHARED = Path("/work/shared")

from pipeline.data.dedup import dedup_local, find_edges, resolve  # noqa: E402
from pipeline.data.signing import (  # noqa: E402
    DedupParams,
    exact_keys,
    lsh_bands,
    normalise,
    shingle_hashes,
    signatures,
    signatures_of_shingles,
)

LICENCE = (
    "Permission is hereby granted, free of charge, to any person obtaining a copy of this software and associated "
    "documentation files (the Software), to deal in the Software without restriction, including without limitation "
    "the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the Software, and "
    "to permit persons to whom the Software is furnished to do so, subject to the following conditions: The above "
    "copyright notice and this permission notice shall be included in all copies or substantial portions of the "
    "Software. THE SOFTWARE IS PROVIDED AS IS, WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT "
    "LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT."
)


def numpy_minhash(shingles: list[np.ndarray], num_perm: int, seed: int = 0, block: int = 8192) -> np.ndarray:
    """The vectorised numpy MinHash measured against rensa: h_i(x) = (a_i * x + b_i) mod 2**64 >> 32 (a_i odd),
    one (m, num_perm) uint64 product per block of shingles, reduced per document with np.minimum.reduceat."""
    ab = np.random.Generator(np.random.PCG64(seed)).integers(0, 2**64, size=(2, num_perm), dtype=np.uint64)
    a, b = ab[0] | np.uint64(1), ab[1]
    out = np.full((len(shingles), num_perm), np.iinfo(np.uint32).max, dtype=np.uint32)
    flat = np.concatenate(shingles)
    owner = np.repeat(np.arange(len(shingles)), [len(x) for x in shingles])
    for start in range(0, len(flat), block):
        x, doc = flat[start : start + block], owner[start : start + block]
        h = ((x[:, None] * a[None, :] + b[None, :]) >> np.uint64(32)).astype(np.uint32)  # (m, num_perm)
        firsts = np.flatnonzero(np.r_[True, doc[1:] != doc[:-1]])
        docs = doc[firsts]
        out[docs] = np.minimum(out[docs], np.minimum.reduceat(h, firsts, axis=0))
    return out


def real_corpus() -> list[tuple[str, int, str]]:
    """(source, record, text) in input order: sorted book files (one document each), then the wiki lines."""
    docs = [(str(p), 0, p.read_text(encoding="utf-8")) for p in sorted((SHARED / "corpora/books").glob("*.txt"))]
    wiki = SHARED / "corpora/wiki/pydocs.jsonl.gz"
    with gzip.open(wiki, "rt", encoding="utf-8") as f:
        docs += [(str(wiki), i, json.loads(line)["text"]) for i, line in enumerate(f)]
    return docs


def orders_of(docs: list[tuple[str, int, str]]) -> np.ndarray:
    files = {s: i for i, s in enumerate(sorted({s for s, _, _ in docs}))}
    return np.array([(files[s] << 32) | r for s, r, _ in docs], dtype=np.int64)


def _edit(text: str, frac: float, vocab: list[str], rng: random.Random) -> str:
    words = text.split()
    for i in rng.sample(range(len(words)), max(1, round(frac * len(words)))):
        words[i] = rng.choice(vocab)
    return " ".join(words)


def _case_ws(text: str, rng: random.Random) -> str:
    t = text.upper() if rng.random() < 0.5 else text.title()
    return "  \n".join(t.split(" ")) if rng.random() < 0.5 else "\t" + t.replace(" ", "   ") + "\n\n"


def planted_corpus(seed: int) -> tuple[list[tuple[str, int, str]], list[str]]:
    """(source, record, text) sorted in input order, and each document's label (original / planted kind)."""
    rng = random.Random(seed)
    base: list[tuple[str, int, str]] = []
    for p in sorted((SHARED / "corpora/books").glob("*.txt")):
        lines = [ln for ln in p.read_text(encoding="utf-8").split("\n") if ln.strip()]
        base += [(f"books/{p.name}", i, ln) for i, ln in enumerate(lines)]
    with gzip.open(SHARED / "corpora/wiki/pydocs.jsonl.gz", "rt", encoding="utf-8") as f:
        wiki = [json.loads(line)["text"] for line in f]
    base += [("wiki/pydocs.jsonl", i, t) for i, t in enumerate(wiki[:383])]
    labels = ["original"] * len(base)
    vocab = sorted({w for _, _, t in base for w in t.split()})
    usable = [d for d in base if len(d[2].split()) >= 30]
    planted: dict[str, list[str]] = {}
    picks = rng.sample(usable, 40 + 40 + 80 + 5 * 40 + 40)
    planted["a_exact"] = [t for _, _, t in picks[:40]]
    planted["b_case_ws"] = [_case_ws(t, rng) for _, _, t in picks[40:80]]
    planted["c_edit01"] = [_edit(t, 0.01, vocab, rng) for _, _, t in picks[80:160]]
    for k, frac in enumerate((0.03, 0.05, 0.10, 0.20, 0.40)):
        chunk = picks[160 + 40 * k : 200 + 40 * k]
        planted[f"d_edit{round(frac * 100):02d}"] = [_edit(t, frac, vocab, rng) for _, _, t in chunk]
    planted["e_boilerplate"] = [LICENCE + "\n\n" + t for t in wiki[383:]]
    docs = list(base)
    for name, texts in planted.items():
        docs += [(f"planted/{name}.jsonl", i, t) for i, t in enumerate(texts)]
        labels += [name] * len(texts)
    ruth = [d for d in base if d[0] == "books/08_Ruth.txt"]
    docs += [("books/99_Ruth_again.txt", r, t) for _, r, t in ruth]
    labels += ["f_book_copy"] * len(ruth)
    orders = orders_of(docs)
    by = np.argsort(orders, kind="stable")
    return [docs[i] for i in by], [labels[i] for i in by]


def true_jaccard(texts: list[str], k: int = 5) -> np.ndarray:
    """(n, n) float32 exact Jaccard of the shingle sets, all pairs (sparse incidence matrix product)."""
    sets = [np.unique(shingle_hashes(t, k)) for t in texts]
    cols, inv = np.unique(np.concatenate(sets), return_inverse=True)
    rows = np.repeat(np.arange(len(sets)), [len(s) for s in sets])
    x = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, inv)), shape=(len(sets), len(cols)))
    inter = (x @ x.T).toarray()
    size = np.array([len(s) for s in sets], np.float32)
    union = size[:, None] + size[None, :] - inter
    return inter / np.maximum(union, 1)


def quality(orders, texts, jac, params: DedupParams, sigs=None) -> dict:
    t0 = time.perf_counter()
    if sigs is None:
        sigs = signatures(texts, params)
    t_sig = time.perf_counter() - t0
    exact, near = find_edges(orders, exact_keys(texts), sigs, params)
    dup = resolve(exact, near)
    pos = {int(o): i for i, o in enumerate(orders)}
    dropped = np.zeros(len(orders), bool)
    dropped[[pos[int(o)] for o in dup.order]] = True
    n = len(orders)
    earlier = np.tril(np.ones((n, n), bool), -1)  # rows sorted by order: j < i is earlier
    worthy = ((jac >= 0.9) & earlier).any(axis=1)
    kept_j = np.where(~dropped[None, :], jac, 0.0)
    np.fill_diagonal(kept_j, 0.0)
    false = dropped & (kept_j.max(axis=1) <= 0.5)
    di = np.array([pos[int(o)] for o in dup.order], dtype=np.int64)
    ki = np.array([pos[int(o)] for o in dup.duplicate_of], dtype=np.int64)
    tj = jac[di, ki] if len(di) else np.zeros(0)
    return {
        "dropped": int(dropped.sum()),
        "recall": float(dropped[worthy].mean()),
        "worthy": int(worthy.sum()),
        "false": int(false.sum()),
        "false_pct": 100.0 * false.sum() / n,
        "below": int((tj < params.threshold - 0.1).sum()),
        "err": float(np.abs(dup.similarity - tj).mean()) if len(tj) else 0.0,
        "edges": len(near),
        "sig_s": t_sig,
        "dup": dup,
        "dropped_mask": dropped,
    }


def run_real() -> None:
    docs = real_corpus()
    orders, texts = orders_of(docs), [t for _, _, t in docs]
    params = DedupParams()
    dup = dedup_local(orders, texts, params)
    jac = true_jaccard(texts)
    pos = {int(o): i for i, o in enumerate(orders)}
    names = [f"{Path(s).name}#{r}" for s, r, _ in docs]
    with gzip.open(SHARED / "corpora/wiki/pydocs.jsonl.gz", "rt", encoding="utf-8") as f:
        titles = [json.loads(line)["title"] for line in f]
    label = lambda i: names[i] + (f" '{titles[docs[i][1]]}'" if "pydocs" in names[i] else "")  # noqa: E731
    print(f"\n## The shared corpora themselves: {len(docs)} documents (66 books + {len(docs) - 66} wiki)")
    print(f"defaults {params}")
    kinds = dup.kind_names()
    print(f"dropped {len(dup)}: exact {kinds.count('exact')}, near {kinds.count('near')}")
    for o, k, kind, s in zip(dup.order, dup.duplicate_of, kinds, dup.similarity):
        i, j = pos[int(o)], pos[int(k)]
        print(
            f"  {kind:5s} est {s:.3f} true {jac[i, j]:.3f}  {label(i)} ({len(texts[i].split())} words)"
            f"  dup of {label(j)} ({len(texts[j].split())} words)"
        )
    np.fill_diagonal(jac, 0)
    iu = np.triu_indices(len(texts), 1)
    for lo in (0.9, 0.8, 0.5, 0.3):
        print(f"  pairs with true Jaccard >= {lo}: {int((jac[iu] >= lo).sum())}")
    top = np.argsort(-jac[iu])[:8]
    print("  most similar pairs (true Jaccard):")
    for t in top:
        i, j = iu[0][t], iu[1][t]
        print(f"    {jac[i, j]:.3f}  {label(i)}  ~  {label(j)}")


def run_planted(seed: int) -> None:
    docs, labels = planted_corpus(seed)
    orders, texts = orders_of(docs), [t for _, _, t in docs]
    print(f"\n## Planted corpus: {len(docs)} documents ({labels.count('original')} originals), seed {seed}")
    t0 = time.perf_counter()
    jac = true_jaccard(texts)
    print(f"brute-force Jaccard of all {len(docs) * (len(docs) - 1) // 2:,} pairs: {time.perf_counter() - t0:.1f} s")
    # How similar each planted kind really is to its nearest earlier/later document.
    np.fill_diagonal(jac, 0)
    print("\ntrue Jaccard of each planted document with its most similar other document:")
    print("| kind | docs | min | median | max |")
    print("|---|---:|---:|---:|---:|")
    lab = np.array(labels)
    for name in sorted(set(labels) - {"original"}):
        m = jac[lab == name].max(axis=1)
        print(f"| {name} | {len(m)} | {m.min():.3f} | {np.median(m):.3f} | {m.max():.3f} |")
    np.fill_diagonal(jac, 1)

    print("\ngrid (LSH bands x rows from lsh_bands(threshold, num_perm), fn_weight 0.9):")
    print(
        "| threshold | num_perm | bands x rows | dropped | recall@0.9 (of n) | false drops (% of docs) | "
        "below thr-0.1 | est err | verified edges | signature s |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    results = {}
    for num_perm in (64, 128, 256):
        sigs = None
        for threshold in (0.7, 0.8, 0.9):
            p = DedupParams(threshold=threshold, num_perm=num_perm)
            if sigs is None:
                t0 = time.perf_counter()
                sigs = signatures(texts, p)
                t_sig = time.perf_counter() - t0
            q = quality(orders, texts, jac, p, sigs)
            results[(threshold, num_perm)] = q
            print(
                f"| {threshold} | {num_perm} | {p.bands} x {p.rows} | {q['dropped']} | {q['recall']:.3f} "
                f"({q['worthy']}) | {q['false']} ({q['false_pct']:.2f}%) | {q['below']} | {q['err']:.3f} | "
                f"{q['edges']} | {t_sig:.1f} |"
            )

    print("\nLSH weights at threshold 0.8, num_perm 128 (candidates verified either way):")
    print(
        "| fn_weight | bands x rows | P(cand at J=0.8) | P(cand at J=0.9) | recall@0.9 | false drops | verified edges |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|")
    sigs = signatures(texts, DedupParams())
    for w in (0.5, 0.7, 0.9, 0.97):
        b, r = lsh_bands(0.8, 128, fn_weight=w)
        p = DedupParams(bands=b, rows=r)
        q = quality(orders, texts, jac, p, sigs)
        pc = lambda j: 1 - (1 - j**r) ** b  # noqa: E731
        print(f"| {w} | {b} x {r} | {pc(0.8):.3f} | {pc(0.9):.4f} | {q['recall']:.3f} | {q['false']} | {q['edges']} |")
    for b, r in ((14, 9), (20, 6)):
        # threshold ~0: every band collision is accepted as a duplicate, as a pass without verification does
        q = quality(orders, texts, jac, DedupParams(threshold=0.01, bands=b, rows=r), sigs)
        print(
            f"| unverified | {b} x {r} | | | {q['recall']:.3f} | {q['false']} ({q['false_pct']:.2f}%) | {q['edges']} |"
        )

    q = results[(0.8, 128)]
    print("\nat the defaults (0.8, 128), per planted kind: dropped / docs (each planted doc or its original):")
    dropped = q["dropped_mask"]
    for name in sorted(set(labels) - {"original"}):
        idx = np.flatnonzero(lab == name)
        # a planted copy counts as found when it or its most similar partner was dropped
        partner = np.argmax(np.where(np.eye(len(texts), dtype=bool)[idx], 0, jac[idx]), axis=1)
        found = dropped[idx] | dropped[partner]
        print(f"  {name:14s} found {int(found.sum())}/{len(idx)}")


def run_speed(num_perm: int = 128) -> None:
    docs = real_corpus()
    texts = [t for _, _, t in docs]
    mb = sum(len(t.encode()) for t in texts) / 1e6
    params = DedupParams(num_perm=num_perm)

    def shingle_strings(t: str) -> list[str]:
        w = normalise(t).split(" ")
        k = min(5, len(w))
        return [" ".join(w[i : i + k]) for i in range(len(w) - k + 1)]

    def ours():
        return signatures(texts, params)

    hashes = [shingle_hashes(t, 5) for t in texts]

    def our_hashes():
        return [shingle_hashes(t, 5) for t in texts]

    def rensa_sketch():
        return signatures_of_shingles(hashes, params)

    def numpy_sketch():
        return numpy_minhash(hashes, num_perm)

    def ds():
        from datasketch import MinHash

        out = []
        for t in texts:
            m = MinHash(num_perm=num_perm, seed=1)
            m.update_batch([s.encode("utf-8") for s in shingle_strings(t)])
            out.append(m.hashvalues)
        return out

    def rensa_strings():
        from rensa import RMinHash

        out = []
        for t in texts:
            m = RMinHash(num_perm=num_perm, seed=1)
            m.update(shingle_strings(t))
            out.append(m.digest())
        return out

    def shingles_only():
        return [shingle_strings(t) for t in texts]

    print(
        f"\n## Signature speed: {len(texts)} real documents, {mb:.1f} MB, num_perm {num_perm} (best of 3, wall and CPU)"
    )
    print("| implementation | docs/s | MB/s | wall s | CPU s |")
    print("|---|---:|---:|---:|---:|")
    for name, fn in [
        ("signatures(): our shingle hashes + rensa matrix (chosen)", ours),
        ("  of which our shingle hashes (normalise, blake2b words, 5-gram polynomial)", our_hashes),
        ("  of which rensa digest_matrix_from_flat_token_hashes", rensa_sketch),
        ("  numpy MinHash on the same shingle hashes (instead of rensa)", numpy_sketch),
        ("datasketch 2.0.0 update_batch on shingle strings", ds),
        ("rensa 0.5.0 RMinHash.update on shingle strings", rensa_strings),
        ("  of which the shingle strings (normalise, join 5-grams)", shingles_only),
    ]:
        try:
            walls, cpus = [], []
            for _ in range(3):
                t0, c0 = time.perf_counter(), time.process_time()
                fn()
                walls.append(time.perf_counter() - t0)
                cpus.append(time.process_time() - c0)
            w, c = min(walls), min(cpus)
            print(f"| {name} | {len(texts) / w:,.0f} | {mb / w:.2f} | {w:.2f} | {c:.2f} |")
        except ImportError as e:
            print(f"| {name} | not installed ({e}) | | | |")

    tracemalloc.start()
    sigs = signatures(texts, params)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"\nsignatures of the {len(texts)} documents: {sigs.nbytes / 1e3:.0f} kB "
        f"({sigs.nbytes // len(texts)} B/doc); tracemalloc peak while computing them {peak / 2**20:.1f} MiB "
        f"(the batch's shingle hashes, 8 B each, and rensa's rows; the texts themselves are not counted)"
    )
    keys = 8 * params.bands
    print(
        f"per document in the pass: signature {4 * num_perm} B + band keys {keys} B + order and exact key 24 B; "
        f"1e9 documents -> {(4 * num_perm + keys + 24) * 1e9 / 2**30:.0f} GiB spread over the cluster"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-real", action="store_true")
    ap.add_argument("--skip-planted", action="store_true")
    args = ap.parse_args()
    if not args.skip_real:
        run_real()
    if not args.skip_planted:
        run_planted(args.seed)
    if not args.skip_speed:
        run_speed()


if __name__ == "__main__":
    main()
