# Finished study, ran at 7313bd2 (2026-11-28): 1,015 MB of bz2 dump on two hosts, dedup on: 1,256 s
"""A gigabyte of multistream Wikipedia dump prepared on two hosts, dedup on: wall, CPU-seconds per host, the
largest process, shuffle bytes, the rate per core (issue 36, bench/RESULTS.md "Corpus scale").

    sudo .venv/bin/python bench/studies/wiki_two_hosts.py                  # 520,000 copies in 2 parts: ~1 GB of bz2
    sudo .venv/bin/python bench/studies/wiki_two_hosts.py --copies 2000    # a quick look (~4 MB)

The dump is bench/studies/wiki_scale.py's (the shared sample's 11 pages copied with a quarter of each article's words
replaced, so that dedup keeps the copies), split in `--parts` files named as Wikimedia names the parts of the real
dump (`...-multistream1.xml-p1p2860000.bz2` with its index), built in parallel under `--work` (not /tmp: each host
has its own). The hosts are tests/netns_hosts.py's two network + mount namespaces joined by a veth link, one Ray
CPU each (both share this machine's cores), and the job is the README's data command submitted to the head with
`ray job submit`, reading the dump from and writing the shards to a directory both hosts mount (`--work`, as a
cluster's shared filesystem):

    python jobs/prepare_data.py --input DUMP --output OUT --vocab VOCAB --data.local_max_bytes 0 --data.num_actors 2

Measured: every process in each host's namespaces sampled every second (psutil): CPU-seconds per host since the
submit, peak RSS of the largest process (and less its shared pages: a Ray worker maps the object store), the sum's
peak; the bytes out of each hash shuffle's map side (`HashShuffleMap`, from the metrics Ray Data's executor logs
as the operator completes, in the head's session log: the figure bench/studies/dedup_shuffle.py reads); the finished
tasks per node (the state API); the manifest's counts. Everything the bench makes (dump, output, the hosts) is
removed at the end unless `--keep`.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from measure import GIB, REPO, Sampler, minilm_vocab  # noqa: E402
from wiki_dump import build_dump  # noqa: E402

# Words of text a page of this dump: the sample's 4 articles hold 552 words of text in its 11 pages (bench/RESULTS.md,
# "Capacity on paper: English Wikipedia from its dump"); the perturbation swaps words, it adds none.
WORDS_PER_PAGE = 552 / 11
# --memory-grouping-max: the job's driver with the product's limit changed, so that a small dump is grouped by Ray
# Data as a large one is (a quick look at the shuffles)
PATCHED = (
    "import runpy, sys, pipeline.data.grouping as g; g.MEMORY_GROUPING_MAX_RECORDS = {}; "
    "sys.argv = ['jobs/prepare_data.py', *sys.argv[1:]]; runpy.run_path(sys.argv[0], run_name='__main__')"
)
# Ray Data's DEBUG line in the driver's session log (logs/ray-data/) as each operator completes: its metrics
SHUFFLE_MAP = re.compile(
    r"Operator ShuffleMapOp\[(HashShuffleMap\(keys=\([^)]*\))[^\]]*\] completed\. Operator "
    r"Metrics:\n(\{.*)"
)


def netns_procs(namespace: str) -> list[psutil.Process]:
    """Every process in a network namespace (`ip netns pids`): a host's, which `ray start` daemonizes out of this
    process's tree; `measure.Sampler` samples them."""
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout
    procs = []
    for pid in out.split():
        try:
            procs.append(psutil.Process(int(pid)))
        except psutil.Error:
            pass
    return procs


def build(dump: Path, copies: int, parts: int) -> dict:
    """The dump in `parts` files, built in parallel; the figures summed."""
    per = [copies // parts + (k < copies % parts) for k in range(parts)]
    starts = [sum(per[:k]) for k in range(parts)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(min(parts, psutil.cpu_count())) as pool:
        figs = list(pool.map(build_dump, [dump] * parts, per, [0] * parts, starts, range(1, parts + 1)))
    return {k: sum(f[k] for f in figs) for k in ("pages", "articles", "xml", "bz2")} | {
        "seconds": time.perf_counter() - t0
    }


def shuffle_bytes(logs: Path) -> list[tuple[str, int, int]]:
    """(operator, rows, bytes) out of every hash shuffle's map side (what crosses it), from the Ray Data logs under
    `logs` (bench/studies/dedup_shuffle.py reads the same figure from `Dataset.stats()`)."""
    found = []
    for f in sorted((logs / "ray-data").glob("ray-data-*.log")):  # a log per dataset (ray-data.log repeats them)
        for m in SHUFFLE_MAP.finditer(f.read_text(errors="replace")):
            rows, size = (re.search(rf"'{k}': (\d+)", m.group(2)) for k in ("row_outputs_taken", "bytes_outputs_taken"))
            found.append((m.group(1), int(rows.group(1)), int(size.group(1))))
    return found


def main() -> int:
    import netns_hosts

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--copies", type=int, default=520_000, help="copies of the sample's 11 pages (1,950 B of bz2 each)")
    ap.add_argument("--parts", type=int, default=2, help="dump files (Wikimedia's parts), built in parallel")
    ap.add_argument("--work", type=Path, default=REPO.parent, help="a directory both hosts see (not under /tmp)")
    ap.add_argument("--object-store", type=int, default=1_000_000_000, help="bytes of object store a host")
    ap.add_argument("--keep", action="store_true", help="keep the dump and the output")
    ap.add_argument(
        "--memory-grouping-max",
        type=int,
        help="records grouped in the driver's memory (default: the "
        "product's MEMORY_GROUPING_MAX_RECORDS); lower, for a quick look at Ray Data's shuffles",
    )
    args = ap.parse_args()
    if why := netns_hosts.usable():
        sys.exit(why)
    work = Path(tempfile.mkdtemp(prefix="wiki_two_hosts-", dir=args.work))
    c = None
    try:
        dump, out = work / "dump", work / "out"
        dump.mkdir()
        b = build(dump, args.copies, args.parts)
        print(
            f"dump: {b['pages']:,} pages ({b['articles']:,} articles), {b['xml'] / 1e6:,.1f} MB of XML, "
            f"{b['bz2'] / 1e6:,.1f} MB of bz2 in {args.parts} parts; built in {b['seconds']:.0f} s",
            flush=True,
        )
        c = netns_hosts.TwoHostCluster(tmp_size="8g")
        c.start_head(object_store=args.object_store)
        c.start_worker(object_store=args.object_store)
        cmd = [
            "--input",
            str(dump),
            "--output",
            str(out),
            "--vocab",
            str(minilm_vocab()),
            "--data.local_max_bytes",
            "0",
            "--data.num_actors",
            "2",
        ]
        driver = (
            "jobs/prepare_data.py"
            if args.memory_grouping_max is None
            else "-c " + shlex.quote(PATCHED.format(args.memory_grouping_max))
        )
        submit = (
            f"ray job submit --address http://127.0.0.1:8265 --working-dir {shlex.quote(str(REPO))} -- "
            f"python {driver} " + " ".join(shlex.quote(a) for a in cmd)
        )
        samplers = {
            "head": Sampler(partial(netns_procs, c.head.ns), 1.0),
            "worker": Sampler(partial(netns_procs, c.worker.ns), 1.0),
        }
        for s in samplers.values():
            s.start()
        t0 = time.perf_counter()
        r = c.head.run(submit, timeout=4 * 3600, check=False)
        wall = time.perf_counter() - t0
        for s in samplers.values():
            s.stop()
        log = r.stdout + r.stderr
        if args.keep:
            (work / "job.log").write_text(log)
        if r.returncode != 0 or "succeeded" not in log:
            print(log[-6000:])
            return 1
        tasks = json.loads(
            c.head.run("ray list tasks --filter state=FINISHED --limit 10000 --format json", timeout=300).stdout
        )
        nodes = json.loads(c.head.run("ray list nodes --format json", timeout=60).stdout)
        # the head's session directories (not `session_latest`: its link is absolute, to the head's own /tmp)
        shuffles = [x for d in c.head.path("/tmp/ray").glob("session_2*") for x in shuffle_bytes(d / "logs")]
        m = json.loads((out / "manifest.json").read_text())
    finally:
        if c is not None:
            c.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print("job:", " ".join(cmd))
    for line in log.splitlines():
        if line.startswith("[data]") or re.match(r"^\S+\s+(ran|skipped)\s+[\d.]+", line) or "[stage " in line:
            print("  ", line)
    ip = {n["node_id"]: n["node_ip"] for n in nodes}
    per = Counter((t["name"], ip.get(t["node_id"], "?")) for t in tasks)
    hosts = sorted(set(ip.values()))
    capped = "; the list is capped" if len(tasks) >= 10000 else ""
    print(f"\nfinished tasks per node (state API, {len(tasks):,} listed{capped}):")
    for name in sorted({n for n, _ in per}):
        print(f"  {name[:60]:60s} " + " ".join(f"{h}: {per[name, h]:6d}" for h in hosts))
    cpu = {h: s.cpu_seconds for h, s in samplers.items()}
    total = sum(cpu.values())
    xml, bz2 = b["xml"] / 1e6, b["bz2"] / 1e6
    rows = [
        ("dump", f"{b['pages']:,} pages, {b['articles']:,} articles; {xml:,.1f} MB XML, {bz2:,.1f} MB bz2"),
        (
            "documents read / written",
            f"{m['documents_read']:,} / {m['documents_written']:,}; rejected {m['rejected_reasons']}",
        ),
        ("examples / tokens / shards", f"{m['examples']:,} / {m['tokens']:,} / {len(m['shards'])}"),
        (
            "wall, the job (submit to end)",
            f"{wall:,.0f} s: {b['pages'] / wall:,.0f} pages/s, {bz2 / wall:.3f} MB/s bz2, {xml / wall:.2f} MB/s XML",
        ),
        ("CPU-seconds, head / worker host", f"{cpu['head']:,.0f} / {cpu['worker']:,.0f} (sum {total:,.0f})"),
        (
            "per CPU-second (both hosts)",
            f"{b['pages'] / total:,.0f} pages, {b['articles'] / total:,.0f} articles, "
            f"{xml / total:.3f} MB XML, {bz2 / total:.4f} MB bz2, "
            f"{b['pages'] * WORDS_PER_PAGE / total:,.0f} words",
        ),
    ]
    for h, s in samplers.items():
        rows.append(
            (
                f"largest process, {h}",
                f"{s.peak_one / GIB:.2f} GiB ({s.peak_name}); less shared "
                f"{s.peak_private / GIB:.2f} GiB ({s.private_name}); host sum {s.peak_sum / GIB:.2f} GiB",
            )
        )
    shuffled = sum(x for _, _, x in shuffles)
    signed = m["documents_read"] - sum(v for k, v in m["rejected_reasons"].items() if "duplicate" not in k)
    sigs = signed * m["config"]["dedup_num_perm"] * 4  # the signatures' own bytes (uint32 each), documents signed
    for name, n, x in shuffles:
        rows.append((f"shuffle {name[:40]}", f"{n:,} rows, {x / 1e6:,.1f} MB"))
    rows.append(
        (
            "all shuffles",
            f"{shuffled / 1e6:,.1f} MB"
            + (f" = {shuffled / sigs:.2f}x the signatures' {sigs / 1e6:,.1f} MB" if sigs else "")
            if shuffles
            else "none logged (grouped in memory?)",
        )
    )
    w = max(len(k) for k, _ in rows)
    print("\n" + "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
