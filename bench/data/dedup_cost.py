"""What removing duplicates costs: `jobs/prepare_data.py` with `--data.dedup near` (the default) against `off`
(issue 20's goal: near adds at most 30% to the wall time, on the shared corpora and at 16x).

    python bench/data/dedup_cost.py                         # 1x (3 runs each, median) and 16x (1 run each)
    python bench/data/dedup_cost.py --factors 1 --runs 1

Input: the shared books and wiki articles; at Nx, N copies of each file, copy r > 0 with every third word tagged
(`word` -> `word~r`), so every 5-gram shingle differs between copies and nothing is a duplicate: the bench measures
the pass's cost, not what dropping saves. Each point runs the README's data command (MiniLM's vocabulary, the
default settings otherwise) as a child process, off and near alternating, into fresh outputs. Measured: wall time
(what a user waits for), the dedup pass's own seconds and documents/s (its `[data] dedup:` line), the peak RSS of
the child's process tree (measure.run_sampled), and that both runs write the same shards.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import GIB, REPO, SHARED, minilm_vocab, print_table, run_sampled  # noqa: E402

_WORD = re.compile(r"\S+")


def tag_words(text: str, r: int) -> str:
    """Every third word tagged with the copy number: no 5-gram of one copy appears in another.

    >>> tag_words("a b c d", 2)
    'a b c~2 d'
    """
    if r == 0:
        return text
    k = iter(range(1, 10**12))
    return _WORD.sub(lambda m: f"{m.group(0)}~{r}" if next(k) % 3 == 0 else m.group(0), text)


def build_corpus(corpora: Path, dest: Path, factor: int) -> tuple[int, int]:
    """`factor` distinct copies of the books (*.txt) and wiki articles (*.jsonl.gz) under `corpora` in dest;
    (bytes, documents)."""
    size = docs = 0
    for r in range(factor):
        for book in sorted(corpora.rglob("*.txt")):
            out = dest / "books" / f"r{r:03d}_{book.name}"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(tag_words(book.read_text(), r))
            size, docs = size + out.stat().st_size, docs + 1
        for wiki in sorted(corpora.rglob("*.jsonl.gz")):
            out = dest / "wiki" / f"r{r:03d}_{wiki.name}"
            out.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(wiki, "rt") as src, gzip.open(out, "wt") as dst:
                for line in src:
                    rec = json.loads(line)
                    rec["id"], rec["text"] = f"{rec['id']}~{r}", tag_words(rec["text"], r)
                    dst.write(json.dumps(rec) + "\n")
                    docs += 1
            size += out.stat().st_size
    return size, docs


def run(corpus: Path, out: Path, dedup: str, env: dict[str, str]) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        sys.executable,
        str(REPO / "jobs/prepare_data.py"),
        "--input",
        str(corpus),
        "--output",
        str(out),
        "--vocab",
        str(minilm_vocab()),
        "--num-cpus",
        "2",
        "--data.dedup",
        dedup,
    ]
    job = run_sampled(cmd, env, cwd=REPO)
    log = job.log
    if job.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({job.returncode}):\n{log[-3000:]}")
    m = json.loads((out / "manifest.json").read_text())
    found = re.search(
        r"\[data\] dedup: (\d+) documents, (\d+) exact and (\d+) near duplicates dropped \(([\d.]+)s\)", log
    )
    return {
        "wall": job.wall,
        "peak_gib": job.sampler.peak_sum / GIB,
        "shards": [s["sha256"] for s in m["shards"]],
        "dedup_s": float(found[4]) if found else 0.0,
        "docs": int(found[1]) if found else m["documents_read"],
        "dropped": int(found[2]) + int(found[3]) if found else 0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpora", type=Path, default=SHARED / "corpora", help="books (*.txt) and wiki (*.jsonl.gz)")
    ap.add_argument("--factors", default="1,16")
    ap.add_argument("--runs", type=int, default=3, help="runs of each setting at 1x (larger factors: one)")
    args = ap.parse_args()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    tmp = Path(tempfile.mkdtemp(prefix="dedup-cost-"))
    rows = []
    try:
        for factor in (int(f) for f in args.factors.split(",")):
            corpus = tmp / f"corpus{factor}"
            size, docs = build_corpus(args.corpora, corpus, factor)
            res: dict[str, list[dict]] = {"off": [], "near": []}
            for k in range(args.runs if factor == 1 else 1):
                for mode in ("off", "near") if k % 2 == 0 else ("near", "off"):
                    res[mode].append(run(corpus, tmp / f"out-{mode}", mode, env))
            assert all(r["shards"] == res["off"][0]["shards"] for r in res["off"] + res["near"]), "shards differ"
            assert all(r["dropped"] == 0 for r in res["near"]), "the distinct copies were taken for duplicates"
            off = statistics.median(r["wall"] for r in res["off"])
            near = statistics.median(r["wall"] for r in res["near"])
            dd = statistics.median(r["dedup_s"] for r in res["near"])
            rows.append(
                (
                    f"{factor}x",
                    f"{size / 1e6:.1f} MB, {docs} docs",
                    f"{off:.1f}",
                    f"{near:.1f}",
                    f"{near / off:.2f}",
                    f"{dd:.1f}",
                    f"{docs / dd:,.0f}" if dd else "-",
                    f"{max(r['peak_gib'] for r in res['off']):.2f} / {max(r['peak_gib'] for r in res['near']):.2f}",
                )
            )
            shutil.rmtree(corpus)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(
        (
            "input",
            "size",
            "wall off (s)",
            "wall near (s)",
            "near / off",
            "dedup pass (s)",
            "docs/s of the pass",
            "peak tree GiB off / near",
        ),
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
