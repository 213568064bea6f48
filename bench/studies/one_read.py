# Finished study, ran at 7da71cc (2026-11-28): dedup near ÷ off wall on a dump (Ray path): 1.75 Ray Data, 1.14 in memory
"""What the dedup pass costs on a multistream Wikipedia dump: `prepare_data.py` with `--data.dedup near` (the
default) against `off`, for one or more source trees (this one and, say, a worktree of main), in one run.

    python bench/studies/one_read.py --copies 12000 --tree main=../wt-base --tree new=. --rounds 2
    python bench/studies/one_read.py --copies 3000 --paths ray --tree main=../wt-base --tree new=.

The dump is bench/data/wiki_dump.py's (`--copies` copies of the shared sample's 11 pages, a quarter of the article
words replaced per copy; 12,000 copies: 132,000 pages, 225 MB of XML, 23 MB of bz2; streams of 100 pages with their
index). Each round runs, for every path (`local`: the job's default, inputs under data.local_max_bytes prepared on
local worker processes; `ray`: `--data.local_max_bytes 0`, two actors on a local Ray the job starts), every tree
and both modes, in an order that alternates from round to round (off first, then near first), so that a change in
the machine's load falls on both sides of each ratio. Each run is the README's data command in a child process
with PYTHONPATH at its tree (`--num-cpus 2`, MiniLM's vocabulary), into a fresh output, with TMPDIR a fresh empty
directory. Measured: wall time (what a user waits for), the shards stage's seconds (manifest `seconds`), the
child tree's CPU-seconds and largest process (measure.run_sampled); checked: every tree writes the same
shards and duplicates.jsonl for a mode, no `_work` is left in the output and nothing in TMPDIR.

`--components K` then times the pieces on K units of the dump (after one that warms up), in this process, on this
tree's code, CPU seconds: reading a unit (bz2, XML, wikitext -> text), signing it, keeping its records
(pipeline.data.extracted: write, then read back), tokenizing it. This way's extra over dedup off, besides signing,
is keeping and reading back; the other way's (signatures computed in the tokenize pass's one read, duplicates
dropped after) is at least reading back and writing again every token chunk, which the pass that would cut the
chunks again without the duplicates must do, plus tokenizing the documents it then drops (their share from the
runs). The load average is printed with each run: other jobs share the cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from measure import GIB, REPO, minilm_vocab, print_table, run_sampled  # noqa: E402
from wiki_dump import build_dump  # noqa: E402

PATHS = {"local": (), "ray": ("--data.local_max_bytes", "0", "--data.num_actors", "2")}


def run(tree: Path, dump: Path, out: Path, mode: str, path: str, tmp: Path) -> dict:
    """One `prepare_data.py` run of `tree`'s code: wall, shard stage seconds, CPU, peak, what it wrote."""
    shutil.rmtree(out, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix="run-", dir=tmp))
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "disabled",
        "TMPDIR": str(scratch),
        "RAY_TMPDIR": str(scratch),
    }
    env.pop("RAY_ADDRESS", None)
    cmd = [
        sys.executable,
        str(tree / "jobs/prepare_data.py"),
        "--input",
        str(dump),
        "--output",
        str(out),
        "--vocab",
        str(minilm_vocab()),
        "--num-cpus",
        "2",
        "--data.dedup",
        mode,
        *PATHS[path],
    ]
    run = run_sampled(cmd, env, cwd=tree)
    wall, sampler = run.wall, run.sampler
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({run.returncode}):\n{run.log[-3000:]}")
    m = json.loads((out / "manifest.json").read_text())
    dups = out / "duplicates.jsonl"
    left = [p.name for p in scratch.iterdir() if p.name != "ray"]  # Ray keeps its session directories
    shutil.rmtree(scratch, ignore_errors=True)
    return {
        "wall": wall,
        "stage": m["seconds"],
        "cpu": sampler.cpu_seconds,
        "peak": sampler.peak_one / GIB,
        "shards": [s["sha256"] for s in m["shards"]],
        "work_left": (out / "_work").exists(),
        "tmp_left": left,
        "dups": hashlib.sha256(dups.read_bytes()).hexdigest() if dups.exists() else None,
        "read": m["documents_read"],
        "written": m["documents_written"],
    }


def components(dump: Path, units: int, tmp: Path, dropped: float) -> list[tuple[str, str]]:
    """CPU seconds of one read per document's pieces, and of the other way's floor, on the first `units` units (the
    first of them only warms up). `dropped`: the share of documents the dedup pass drops (from the runs)."""
    sys.path.insert(0, str(REPO))
    import pyarrow.parquet as pq

    from pipeline.config import DataConfig
    from pipeline.data.extracted import keep, kept_records
    from pipeline.data.passes import dedup_params, text_path, tokenize_file
    from pipeline.data.prepare import unit_bytes
    from pipeline.data.signing import records
    from pipeline.data.sources import Document, expand_inputs, read_documents, split_units
    from pipeline.data.tokenizer import SentenceEncoder, load_tokenizer

    cfg = DataConfig(inputs=[str(dump)])
    files, _ = expand_inputs([str(dump)])
    todo = split_units(files[0], unit_bytes(cfg))[: units + 1]
    tok = SentenceEncoder(load_tokenizer(minilm_vocab()))
    work = str(tmp / "components")
    t: dict[str, float] = dict.fromkeys(["read", "sign", "keep", "kept", "tokenize", "rechunk"], 0.0)
    chars = chunk_bytes = tokens = kept_bytes = 0
    for k, u in enumerate(todo):
        c0 = time.process_time()
        items = list(read_documents(u))
        c1 = time.process_time()
        records((d.text for d in items if isinstance(d, Document)), dedup_params(cfg))
        c2 = time.process_time()
        path = text_path(u, work)
        for _ in keep(iter(items), path):
            pass
        c3 = time.process_time()
        for _ in kept_records(path):
            pass
        c4 = time.process_time()
        size = os.path.getsize(path)
        stats = tokenize_file(u, tok, cfg, work)  # from the kept records (read again), which it then removes
        c5 = time.process_time()
        for c in stats["chunks"]:  # the other way's floor: every token chunk read and written once more
            pq.write_table(pq.ParquetFile(c["path"]).read(), c["path"] + ".again", compression="lz4")
        c6 = time.process_time()
        if k == 0:
            continue  # the first unit warms up: imports, codecs, the tokenizer's caches
        for key, dt in zip(t, (c1 - c0, c2 - c1, c3 - c2, c4 - c3, c5 - c4 - (c4 - c3), c6 - c5)):
            t[key] += dt
        chars += sum(len(d.text) for d in items if isinstance(d, Document))
        tokens += stats["tokens"]
        kept_bytes += size
        chunk_bytes += sum(os.path.getsize(c["path"]) for c in stats["chunks"])
    shutil.rmtree(work, ignore_errors=True)
    off = t["read"] + t["tokenize"]  # what dedup off does per unit: read it, tokenize (t["tokenize"]: less the read)
    this_way = t["keep"] + t["kept"]
    other_floor = t["rechunk"] + dropped * t["tokenize"]

    def share(x: float) -> str:
        return f"{x:.2f} CPU-s ({x / off:.1%} of dedup off's read + tokenize)"

    return [
        (
            "units, text",
            f"{len(todo) - 1} units (after one more to warm up) of ~{unit_bytes(cfg) / 1e6:.0f} MB bz2, "
            f"{chars / 1e6:.1f}M characters, {tokens:,} tokens",
        ),
        ("read: bz2 + XML + wikitext -> text", share(t["read"])),
        ("tokenize: split + encode + write chunks", share(t["tokenize"])),
        ("sign: exact key + MinHash (both ways)", share(t["sign"])),
        ("keep: write the records (zstd Parquet)", share(t["keep"]) + f", {kept_bytes / 1e6:.1f} MB"),
        ("kept: read them back (the tokenize pass)", share(t["kept"])),
        ("**this way's extra**: keep + kept", share(this_way)),
        ("other way: token chunks read + written again", share(t["rechunk"]) + f", {chunk_bytes / 1e6:.1f} MB"),
        (f"other way: tokenize the dropped documents ({dropped:.1%})", share(dropped * t["tokenize"])),
        ("**other way's floor**: the two above", share(other_floor)),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--copies", type=int, default=12000, help="copies of the sample's 11 pages")
    ap.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a source tree to run (repeat; default: this one)",
    )
    ap.add_argument("--paths", default="local", help="comma-separated: local, ray")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--components", type=int, default=0, metavar="K", help="time the pieces on K units (0: no)")
    args = ap.parse_args()
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree] or [("this", REPO)]
    paths = args.paths.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="one-read-"))
    try:
        dump = tmp / "dump"
        dump.mkdir()
        b = build_dump(dump, args.copies)
        print(
            f"dump: {b['pages']:,} pages ({b['articles']:,} articles), {b['xml'] / 1e6:.1f} MB of XML, "
            f"{b['bz2'] / 1e6:.1f} MB of bz2",
            flush=True,
        )
        res: dict[tuple[str, str, str], list[dict]] = {}
        for r in range(args.rounds):
            for path in paths:
                for name, tree in trees:
                    for mode in ("off", "near") if r % 2 == 0 else ("near", "off"):
                        x = run(tree, dump, tmp / "out", mode, path, tmp)
                        res.setdefault((path, name, mode), []).append(x)
                        print(
                            f"round {r + 1} {path:5s} {name:6s} {mode:4s} wall {x['wall']:6.1f} s  stage "
                            f"{x['stage']:6.1f} s  cpu {x['cpu']:6.1f} s  peak {x['peak']:.2f} GiB  load "
                            f"{os.getloadavg()[0]:.1f}",
                            flush=True,
                        )
        rows, ok = [], True
        for path in paths:
            for mode in ("off", "near"):
                outs = {(tuple(x["shards"]), x["dups"]) for name, _ in trees for x in res[path, name, mode]}
                if len(outs) != 1:
                    print(f"{path} {mode}: different outputs: {outs}")
                    ok = False
            for name, _ in trees:
                off, near = res[path, name, "off"], res[path, name, "near"]
                ratio = [n["wall"] / o["wall"] for o, n in zip(off, near)]
                stage = [n["stage"] / o["stage"] for o, n in zip(off, near)]
                left = [x for x in off + near if x["work_left"] or x["tmp_left"]]
                if left:
                    print(f"{path} {name}: left behind: {[(x['work_left'], x['tmp_left']) for x in left]}")
                    ok = False
                rows.append(
                    (
                        path,
                        name,
                        f"{statistics.median(o['wall'] for o in off):.1f}",
                        f"{statistics.median(n['wall'] for n in near):.1f}",
                        f"**{statistics.median(ratio):.2f}** ({', '.join(f'{x:.2f}' for x in ratio)})",
                        f"{statistics.median(stage):.2f}",
                        f"{statistics.median(o['cpu'] for o in off):.0f} / "
                        f"{statistics.median(n['cpu'] for n in near):.0f}",
                        f"{max(o['peak'] for o in off):.2f} / {max(n['peak'] for n in near):.2f}",
                        "yes" if left else "no",
                    )
                )
        print(
            f"\nsame shards and duplicates.jsonl in every run of a mode: {'yes' if ok else 'NO'}; "
            f"documents read {res[paths[0], trees[0][0], 'near'][0]['read']:,}, written "
            f"{res[paths[0], trees[0][0], 'off'][0]['written']:,} (off) / "
            f"{res[paths[0], trees[0][0], 'near'][0]['written']:,} (near)\n"
        )
        print_table(
            (
                "path",
                "tree",
                "wall off (s)",
                "wall near (s)",
                "near / off, wall (each round)",
                "near / off, shards stage",
                "CPU-s off / near",
                "largest process GiB off / near",
                "work or temp files left",
            ),
            rows,
        )
        if args.components:
            first = res[paths[0], trees[0][0], "near"][0]
            dropped = 1 - first["written"] / res[paths[0], trees[0][0], "off"][0]["written"]
            print()
            print_table(
                ("piece", f"{args.components} units, this tree, one process, CPU time"),
                components(dump, args.components, tmp, dropped),
            )
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
