# Finished study, ran at 0f10964 (2026-11-27): Ray dedup shuffles 14.25x -> 0.46x the signatures' bytes
"""The dedup pass's Ray Data grouping alone: shuffle bytes and the largest process, this tree's code against another
tree's (e.g. a worktree of the commit before), on the same records of bench/data/wiki_dump.py's dump.

    python bench/studies/dedup_shuffle.py --copies 3000 --against ../wt-base     # 33,000 pages: ~3 min on 2 cores
    python bench/studies/dedup_shuffle.py --copies 12000 --against ../wt-base    # wiki_scale's dump (132,000 pages)

1. The dump of bench/data/wiki_dump.py (`--copies` copies of the sample's 11 pages, a quarter of the article words
   replaced per copy), cut into the job's units (~1 MB of bz2) and signed once by `passes.sign_unit` on two
   processes: the records (doc_id, name, exact key, 512-byte signature) both trees then group.
2. For each tree, in turn (`--rounds` times, alternating): a child process with PYTHONPATH at that tree starts a
   private local Ray (2 CPUs) and runs `RayExecutor.duplicate_edges` on the records, then `resolve`. Measured:
   - shuffle bytes: Ray Data's own stats of every dataset the grouping iterates (`Dataset.stats()`, captured by
     wrapping `Dataset.iter_batches`): for each hash shuffle, the rows and bytes its map side wrote (operator
     `HashShuffleMap`, "Output num rows/size bytes ... total"): what crosses the shuffle;
   - the largest process: peak RSS (and RSS less shared pages: a Ray worker maps the object store) of every
     process in the child's tree (the driver, Ray's GCS/raylet, its workers), sampled every 0.2 s from the
     child's start (Ray's start included) to its end;
   - wall time of `duplicate_edges`, and the dropped documents (must be the same for both trees and equal to
     `dedup.find_edges`, the local executor's sort, run here).
The signatures' own bytes, the reference for the shuffle: 4 * num_perm bytes a signed document.
Everything goes to a temporary directory (Ray's session directories too), removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from measure import GIB, REPO, Sampler, captured_shuffles  # noqa: E402


def sign(dump_dir: Path, out: Path) -> tuple[list[str], float]:
    """Every unit of the dump signed once (`sign_unit`, default dedup settings) on two processes: record paths."""
    from concurrent.futures import ProcessPoolExecutor

    from pipeline.config import DataConfig
    from pipeline.data.passes import sign_unit, unit_name
    from pipeline.data.sources import expand_inputs, split_units

    files, _ = expand_inputs([str(dump_dir)])
    units = [u for f in files for u in split_units(f, 1_000_000)]
    cfg = DataConfig(inputs=[str(dump_dir)])
    paths = [str(out / f"{unit_name(u)}.parquet") for u in units]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(2) as pool:
        list(pool.map(sign_unit, units, [cfg] * len(units), paths))
    return paths, time.perf_counter() - t0


def digest(d) -> str:
    return hashlib.sha256(
        b"".join(getattr(d, f).tobytes() for f in ("order", "duplicate_of", "kind", "similarity"))
    ).hexdigest()[:16]


def child(paths: list[str]) -> None:
    """In the tree PYTHONPATH names: its RayExecutor's grouping on a private local Ray; one JSON line out."""
    import ray

    from pipeline.config import DataConfig
    from pipeline.data.dedup import resolve
    from pipeline.data.executors import RayExecutor
    from pipeline.data.passes import dedup_params

    import pipeline

    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    ex = RayExecutor.__new__(RayExecutor)  # no PassWorker actors: the grouping alone
    ex.workers, ex.actors, ex.nodes = 0, [], []
    with captured_shuffles() as seen:
        t0 = time.perf_counter()
        exact, near = ex.duplicate_edges(paths, dedup_params(DataConfig(inputs=[])))
        wall = time.perf_counter() - t0
    d = resolve(exact, near)
    print(
        json.dumps(
            {
                "tree": str(Path(pipeline.__file__).parents[1]),
                "wall": wall,
                "shuffles": seen,
                "dropped": len(d),
                "near_edges": len(near),
                "digest": digest(d),
            }
        )
    )
    ray.shutdown()


def run_tree(tree: Path, paths_file: Path, env: dict) -> dict:
    sampler = Sampler()
    sampler.start()
    r = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", str(paths_file)],
        env={**env, "PYTHONPATH": str(tree)},
        cwd=tree,
        capture_output=True,
        text=True,
    )
    sampler.stop()
    if r.returncode:
        raise SystemExit(f"child in {tree} failed:\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out.update(
        peak=sampler.peak_one,
        peak_name=sampler.peak_name,
        private=sampler.peak_private,
        private_name=sampler.private_name,
        cpu=sampler.cpu_seconds,
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--copies", type=int, default=3000, help="copies of the sample's 11 pages (data/wiki_dump.py's dump)"
    )
    ap.add_argument("--against", type=Path, required=False, help="the other tree (e.g. a worktree of main)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each tree, alternating")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child.read_text()))
        return 0
    sys.path.insert(0, str(REPO))
    import numpy as np

    from pipeline.data.arrow import fixed_rows, numpy_of
    from pipeline.data.dedup import find_edges, resolve
    from pipeline.data.passes import dedup_params
    from pipeline.config import DataConfig
    from pipeline.storage.io import read_table
    from wiki_dump import build_dump

    tmp = Path(tempfile.mkdtemp(prefix="dedup_shuffle-"))
    (tmp / "t").mkdir()
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "disabled",
        "TMPDIR": str(tmp / "t"),
        "RAY_TMPDIR": str(tmp / "t"),
    }
    env.pop("RAY_ADDRESS", None)
    try:
        (tmp / "dump").mkdir()
        (tmp / "records").mkdir()
        b = build_dump(tmp / "dump", args.copies)
        paths, sign_s = sign(tmp / "dump", tmp / "records")
        tables = [read_table(p) for p in paths]
        orders = np.concatenate([numpy_of(t["doc_id"]) for t in tables])
        exact = np.stack([np.concatenate([numpy_of(t[c]) for t in tables]) for c in ("exact_hi", "exact_lo")], 1)
        sigs = np.concatenate([fixed_rows(t["sig"], np.uint32) for t in tables])
        params = dedup_params(DataConfig(inputs=[]))
        t0 = time.perf_counter()
        local = resolve(*find_edges(orders, exact, sigs, params))
        local_s = time.perf_counter() - t0
        sig_bytes = sigs.nbytes
        print(
            f"dump: {b['pages']:,} pages, {b['xml'] / 1e6:.1f} MB XML, {b['bz2'] / 1e6:.1f} MB bz2; {len(paths)} units "
            f"signed in {sign_s:.0f} s: {len(orders):,} documents, signatures {sig_bytes / 1e6:.1f} MB "
            f"({sigs.shape[1] * 4} B each); local sort (find_edges + resolve) {local_s:.1f} s, {len(local):,} dropped",
            flush=True,
        )
        del tables, sigs
        (tmp / "paths.json").write_text(json.dumps(paths))
        trees = [("this tree", REPO)] + ([("against", args.against.resolve())] if args.against else [])
        rows = []
        for r in range(args.rounds):
            for name, tree in trees if r % 2 == 0 else trees[::-1]:
                out = run_tree(tree, tmp / "paths.json", env)
                total = sum(s["bytes"] for s in out["shuffles"])
                rows.append((name, out))
                print(
                    f"{name} ({out['tree']}): wall {out['wall']:.1f} s; shuffles "
                    + "; ".join(f"[{s['keys']}] {s['rows']:,} rows {s['bytes'] / 1e6:.1f} MB" for s in out["shuffles"])
                    + f"; total {total / 1e6:.1f} MB = {total / sig_bytes:.2f}x the signatures, "
                    f"{total / len(orders):,.0f} B a document; largest process {out['peak'] / GIB:.2f} GiB "
                    f"({out['peak_name']}), less shared {out['private'] / GIB:.2f} GiB ({out['private_name']}); "
                    f"CPU {out['cpu']:.0f} s; dropped {out['dropped']:,} ({out['digest']}, "
                    f"{'same as' if out['digest'] == digest(local) else 'DIFFERENT from'} the local sort)",
                    flush=True,
                )
        same = all(o["digest"] == digest(local) for _, o in rows)
        print("dropped documents equal in every run and to the local sort:", "yes" if same else "NO")
        return 0 if same else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
