# Finished study, ran at e89e7d1 (2026-11-24): issue 19's split, new ÷ old CPU-s: 1.04 local, 0.64 Ray; same shards
"""Two checkouts of this project, the same data preparation: wall and CPU-seconds of `jobs/prepare_data.py` from
each, interleaved in one run (a shared machine's load then falls on both alike), as ratios new / old.

    git worktree add --detach ../old c499024          # the code before issue 19's split
    python bench/studies/prepare_ab.py ../old . --copies 4 --runs 3

Input: N copies of ../shared/corpora/books and wiki under distinct names (the copies are duplicates of each other,
so the new code runs with `--data.dedup off` unless `--new-args` says otherwise: the restructure is compared,
not the dedup pass; bench/data/dedup_cost.py measures that). Both checkouts get MiniLM's vocabulary and the default
settings, on the local path (default) and, with `--ray-too`, on Ray (`--data.local_max_bytes 0`, a fresh local
Ray per run). Also checks that both write the same shards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import SHARED, minilm_vocab, print_table, run_sampled  # noqa: E402


def build_corpus(dest: Path, copies: int) -> int:
    size = 0
    for sub in ("books", "wiki"):
        for src in sorted((SHARED / "corpora" / sub).iterdir()):
            (dest / sub).mkdir(parents=True, exist_ok=True)
            for r in range(copies):
                shutil.copyfile(src, dest / sub / f"r{r:03d}_{src.name}")
                size += src.stat().st_size
    return size


def run(checkout: Path, corpus: Path, out: Path, extra: list[str], env: dict[str, str]) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        sys.executable,
        str(checkout / "jobs/prepare_data.py"),
        "--input",
        str(corpus),
        "--output",
        str(out),
        "--vocab",
        str(minilm_vocab()),
        "--num-cpus",
        "2",
        *extra,
    ]
    # PYTHONPATH: the checkout's packages in every process the job starts (local workers, Ray workers), whatever
    # an editable install points at
    run = run_sampled(cmd, {**env, "PYTHONPATH": str(checkout)}, cwd=checkout)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({run.returncode}):\n{run.log[-3000:]}")
    m = json.loads((out / "manifest.json").read_text())
    return {"wall": run.wall, "cpu": run.sampler.cpu_seconds, "shards": [s["sha256"] for s in m["shards"]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ray-too", action="store_true")
    ap.add_argument("--new-args", default="--data.dedup off")
    args = ap.parse_args()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    tmp = Path(tempfile.mkdtemp(prefix="prepare-ab-"))
    rows = []
    try:
        size = build_corpus(tmp / "corpus", args.copies)
        paths = [("local", [])] + ([("Ray", ["--data.local_max_bytes", "0"])] if args.ray_too else [])
        for name, path_args in paths:
            res: dict[str, list[dict]] = {"old": [], "new": []}
            for k in range(args.runs):
                order = ["old", "new"] if k % 2 == 0 else ["new", "old"]
                for which in order:
                    checkout = (args.old if which == "old" else args.new).resolve()
                    extra = path_args + (args.new_args.split() if which == "new" else [])
                    res[which].append(run(checkout, tmp / "corpus", tmp / f"out-{which}", extra, env))
            same = res["old"][0]["shards"] == res["new"][0]["shards"]
            o, n = (statistics.median(r["wall"] for r in res[w]) for w in ("old", "new"))
            oc, nc = (statistics.median(r["cpu"] for r in res[w]) for w in ("old", "new"))
            rows.append(
                (
                    name,
                    f"{size / 1e6:.1f} MB",
                    f"{o:.1f}",
                    f"{n:.1f}",
                    f"{n / o:.2f}",
                    f"{oc:.1f} / {nc:.1f}",
                    f"{nc / oc:.2f}",
                    ", ".join(f"{r['wall']:.1f}" for r in res["old"]),
                    ", ".join(f"{r['wall']:.1f}" for r in res["new"]),
                    "yes" if same else "NO",
                )
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_table(
        (
            "path",
            "input",
            "old wall (s, median)",
            "new wall (s, median)",
            "new / old",
            "CPU-s old / new",
            "CPU new / old",
            "old runs",
            "new runs",
            "same shards",
        ),
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
