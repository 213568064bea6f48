# Finished study, ran at bbc8c71 (2026-11-24): two nodes write one node's shards; largest process 1.39 GiB (goal 1.5)
"""A multistream Wikipedia dump through `jobs/prepare_data.py` on Ray: two nodes against one, memory, rate.

    python bench/studies/wiki_scale.py                     # --copies 12000: 132,000 pages, 225 MB of XML
    python bench/studies/wiki_scale.py --copies 500        # a quick look

The dump: bench/data/wiki_dump.py's (the shared sample's 11 pages `copies` times, each copy distinct to dedup),
streams of 100 pages each with the index beside the dump, as Wikimedia writes them.

The same command, `prepare_data.py --data.local_max_bytes 0 --data.num_actors 2 --num-cpus 2` (default
chunk_chars: units of about 1 MB of bz2), runs twice: against a `ray.cluster_utils.Cluster` of two nodes of 1 CPU
(RAY_ADDRESS), and on the local Ray the job starts itself (2 CPUs). Measured: the Ray state API's finished tasks
by name and node (both nodes must have worked every pass), the manifests' shard sha256s (must be equal), the peak
RSS of the largest process among this process's descendants (the job, its local Ray, and the Cluster's GCS,
raylets and workers, which this process started: all `ray::` workers are in that tree) sampled every 0.2 s
(and the peak of RSS less the process's shared resident pages: a Ray worker's RSS counts the pages of the shared
object store it has touched),
their CPU-seconds (minus what the Cluster's processes had used before the job), and pages/s, MB/s. Last, the
dump -> text step alone (`read_documents` on the dump's units, this process, CPU time) on the first units.
A third run, one node with `--data.dedup off`, shows what the dedup pass costs (time and memory).
A dump of one or two units (under about 2 MB of bz2, `--copies` below about 1,000) cannot spread every pass over
both nodes: the bench then exits 1. Everything is written to a temporary directory (Ray's session directories
too: RAY_TMPDIR), removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from measure import GIB, REPO, Sampler, minilm_vocab  # noqa: E402
from wiki_dump import PAGES_PER_STREAM, build_dump  # noqa: E402


def prepare(
    dump_dir: Path, out: Path, env: dict[str, str], extra: tuple[str, ...] = ()
) -> tuple[list[str], dict, str, float, Sampler]:
    cmd = [
        sys.executable,
        str(REPO / "jobs/prepare_data.py"),
        "--input",
        str(dump_dir),
        "--output",
        str(out),
        "--vocab",
        str(minilm_vocab()),
        "--data.local_max_bytes",
        "0",
        "--data.num_actors",
        "2",
        "--num-cpus",
        "2",
        *extra,
    ]
    sampler = Sampler()
    sampler.start()
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    sampler.stop()
    log = r.stdout + r.stderr
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{log[-3000:]}")
    return cmd, json.loads((out / "manifest.json").read_text()), log, wall, sampler


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def text_rate(dump_dir: Path, max_units: int) -> tuple[int, int, float]:
    """(pages, articles, CPU s) of `read_documents` over the dump's first `max_units` units, in this process."""
    from pipeline.data.sources import Document, expand_inputs, read_documents, split_units

    files, _ = expand_inputs([str(dump_dir)])
    units = split_units(files[0], 1_000_000)[:max_units]
    t0 = time.process_time()
    pages = articles = 0
    for u in units:
        for d in read_documents(u):
            pages += 1
            articles += isinstance(d, Document)
    return pages, articles, time.process_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--copies", type=int, default=12000, help="copies of the sample's 11 pages")
    ap.add_argument("--text-units", type=int, default=4, help="units of ~1 MB bz2 timed for dump -> text alone")
    args = ap.parse_args()
    from ray.cluster_utils import Cluster
    from ray.util.state import list_nodes, list_tasks

    tmp = Path(tempfile.mkdtemp(prefix="wiki_scale-"))
    # Ray's session directories (the Cluster's and the jobs' own) and any temporary files inside tmp too
    (tmp / "t").mkdir()
    os.environ["RAY_TMPDIR"] = str(tmp / "t")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "TMPDIR": str(tmp / "t")}
    env.pop("RAY_ADDRESS", None)
    try:
        dump_dir = tmp / "dump"
        dump_dir.mkdir()
        b = build_dump(dump_dir, args.copies)
        print(
            f"dump: {b['pages']:,} pages ({b['articles']:,} articles), {b['xml'] / 1e6:.1f} MB of XML, "
            f"{b['bz2'] / 1e6:.1f} MB of bz2 in streams of {PAGES_PER_STREAM} pages (x{b['xml'] / b['bz2']:.1f}); "
            f"built in {b['seconds']:.0f} s",
            flush=True,
        )

        dashboard = _free_port()
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "include_dashboard": True,
                "dashboard_host": "127.0.0.1",
                "dashboard_port": dashboard,
                "dashboard_agent_listen_port": _free_port(),
            },
        )
        try:
            cluster.add_node(num_cpus=1)
            cluster.wait_for_nodes()
            cmd, two, log2, wall2, s2 = prepare(dump_dir, tmp / "two", {**env, "RAY_ADDRESS": cluster.address})
            state = f"http://127.0.0.1:{dashboard}"
            nodes = sorted(n.node_id for n in list_nodes(address=state) if n.state == "ALIVE")
            tasks = list_tasks(
                address=state, filters=[("state", "=", "FINISHED")], limit=10_000, raise_on_missing_output=False
            )
        finally:
            cluster.shutdown()
        print("command:", " ".join(cmd[1:]), flush=True)
        print("two nodes:", [line for line in log2.splitlines() if "[stage shards] done" in line][-1], flush=True)
        _, one, log1, wall1, s1 = prepare(dump_dir, tmp / "one", env)
        print("one node: ", [line for line in log1.splitlines() if "[stage shards] done" in line][-1], flush=True)
        _, off, _, wall0, s0 = prepare(dump_dir, tmp / "off", env, ("--data.dedup", "off"))
        print(
            f"one node, dedup off: {off['documents_written']:,} documents written, {off['examples']:,} examples",
            flush=True,
        )
        pages, arts, cpu_text = text_rate(dump_dir, args.text_units)

        per = Counter((t.name, t.node_id) for t in tasks if t.name.startswith("_RayWorker."))
        names = sorted({n for n, _ in per if n not in ("_RayWorker.__init__", "_RayWorker.node")})  # the passes
        print(f"\nRay state API, finished tasks per node (two-node run; nodes {', '.join(n[:8] for n in nodes)}):")
        print(f"  {'task':28s} " + " ".join(f"{n[:8]:>9s}" for n in nodes))
        for name in names:
            print(f"  {name:28s} " + " ".join(f"{per[name, n]:9d}" for n in nodes))
        every = all(per[name, n] > 0 for name in names for n in nodes)
        same = [s["sha256"] for s in two["shards"]] == [s["sha256"] for s in one["shards"]]
        dropped = {k: v for k, v in two["rejected_reasons"].items()}
        xml_mb, bz2_mb = b["xml"] / 1e6, b["bz2"] / 1e6

        def rates(wall: float, s: Sampler) -> str:
            return (
                f"{b['pages'] / wall:,.0f} pages/s, {bz2_mb / wall:.2f} MB/s bz2, {xml_mb / wall:.2f} MB/s XML "
                f"(wall {wall:.0f} s); {b['pages'] / s.cpu_seconds:,.0f} pages per CPU-s "
                f"({s.cpu_seconds:.0f} CPU-s)"
            )

        rows = [
            ("dump", f"{b['pages']:,} pages, {b['articles']:,} articles; {xml_mb:.1f} MB XML, {bz2_mb:.1f} MB bz2"),
            (
                "documents read / written",
                f"{two['documents_read']:,} / {two['documents_written']:,}; rejected {dropped}",
            ),
            ("examples / tokens in shards", f"{two['examples']:,} / {two['tokens']:,}"),
            (
                "both nodes did every pass",
                f"{'yes' if every and len(nodes) == 2 else 'NO'} ({len(names)} task names, "
                f"{sum(per.values()):,} tasks)",
            ),
            (
                "shard sha256s, two nodes = one node",
                f"{'equal' if same else 'DIFFERENT'} ({len(one['shards'])} shards)",
            ),
            ("two nodes (1 CPU each)", rates(wall2, s2)),
            ("one node (local Ray, 2 CPUs)", rates(wall1, s1)),
            (
                "one node, --data.dedup off",
                rates(wall0, s0) + f"; peak RSS {s0.peak_one / GIB:.2f} GiB "
                f"({s0.peak_name}), less shared {s0.peak_private / GIB:.2f} GiB",
            ),
            (
                "largest process peak RSS, two nodes",
                f"{s2.peak_one / GIB:.2f} GiB ({s2.peak_name}); "
                f"sum {s2.peak_sum / GIB:.2f} GiB; {len(s2.ray_workers)} ray:: seen",
            ),
            (
                "largest process peak RSS, one node",
                f"{s1.peak_one / GIB:.2f} GiB ({s1.peak_name}); "
                f"sum {s1.peak_sum / GIB:.2f} GiB; {len(s1.ray_workers)} ray:: seen",
            ),
            (
                "largest process peak RSS less shared",
                f"two nodes {s2.peak_private / GIB:.2f} GiB ({s2.private_name}); "
                f"one node {s1.peak_private / GIB:.2f} GiB ({s1.private_name})",
            ),
            ("goal: largest process <= 1.5 GiB", "met" if max(s1.peak_one, s2.peak_one) <= 1.5 * GIB else "NOT met"),
            (
                "dump -> text alone (1 process)",
                f"{pages:,} pages ({arts:,} articles) in {cpu_text:.2f} CPU-s: {pages / cpu_text:,.0f} pages per CPU-s",
            ),
            (
                "whole pipeline, per CPU-s",
                f"{b['pages'] / s2.cpu_seconds:,.0f} / {b['pages'] / s1.cpu_seconds:,.0f} "
                f"pages, {xml_mb / s2.cpu_seconds:.3f} / {xml_mb / s1.cpu_seconds:.3f} MB XML "
                f"(two / one node)",
            ),
        ]
        w = max(len(k) for k, _ in rows)
        print("\n" + "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows))
        stages = [
            line
            for line in log1.splitlines()
            if re.match(r"^\S+\s+(ran|skipped)\s+[\d.]+", line) or line.startswith("[data] dedup:")
        ]
        print("\none node, the job's stage table:\n" + "\n".join(stages))
        return 0 if every and same else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
