"""Scale curve of `jobs/prepare_data.py`: tokens/s at 1x, 4x and 16x the shared corpora, and peak memory (issue 10).

    python bench/data/data_scale.py                                   # 1x, 4x, 16x; 1x on Ray too; memory at 8x / 1x
    python bench/data/data_scale.py --factors 1,2 --ray-factors 1 --memory-factor 2 --write-results /tmp/scale.md

Each point is one run of the README's data preparation with the main job's settings (`--config
configs/tiny.yaml`, copied once at the start so every point has the same: an 8k WordPiece vocabulary trained on
the input, dynamic masking, 4 shards) on an input of
N copies of ../shared/corpora (every file copied N times under distinct names into a temporary directory, so each
copy's documents are distinct documents), into a fresh output, as a child process with a fresh local Ray when
it needs one. Measured: the child's wall time (start-up, vocabulary, passes, validation: what a user waits for),
tokens/s = the input's tokens (manifest `source_tokens`) / wall, the ratio of each point's tokens/s to 1x on the
same path and to the default command's 1x, the CPU-seconds of the child's process tree (tokens per CPU-second
moves less with other jobs' load than wall time does), and the peak RSS of the child's whole process tree (and of
its largest process), sampled every 0.2 s (measure.run_sampled). Goals: tokens/s at 1x, 4x, 16x within +-15% of each
other; peak tree memory at 8x <= 1.5x that at 1x.

Inputs up to data.local_max_bytes (1 GiB) are prepared without Ray (in the job's process, or on local worker
processes from 2 MiB up), larger ones on Ray; the table names each point's path, and `--ray-factors` adds
points forced onto Ray (`--data.local_max_bytes 0`) so both paths are on the curve. Ray's session files go to
the temporary directory (RAY_TMPDIR), which is removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import GIB, PREPARE_INPUTS, REPO, SHARED, data_config, run_sampled  # noqa: E402


def build_corpus(corpora: Path, dest: Path, factor: int) -> int:
    """`factor` copies of every file of `corpora` under dest, named r000_<name>, r001_<name>, ...; bytes."""
    size = 0
    for src in sorted(corpora.rglob("*")):
        if src.is_file():
            rel = src.relative_to(corpora)
            (dest / rel.parent).mkdir(parents=True, exist_ok=True)
            for r in range(factor):
                shutil.copyfile(src, dest / rel.parent / f"r{r:03d}_{rel.name}")
                size += src.stat().st_size
    return size


def stage_seconds(log: str) -> dict[str, float]:
    """The job's stage table (`vocab ran 12.3`) -> {stage: seconds}."""
    return {m[1]: float(m[3]) for m in re.finditer(r"^(vocab|shards|validate)\s+(ran|skipped)\s+([\d.]+)", log, re.M)}


def run_point(
    work: Path, corpora: Path, config: Path, factor: int, force_ray: bool, num_cpus: int, env: dict[str, str]
) -> dict:
    """One preparation of `factor` x the corpus (built here, removed after) with `config`; its figures."""
    corpus, out = work / f"corpus{factor}", work / f"out{factor}{'-ray' if force_ray else ''}"
    size = build_corpus(corpora, corpus, factor)
    # dedup off: the copies are exact duplicates of each other, which the default (near) would drop
    cmd = [
        sys.executable,
        str(REPO / "jobs/prepare_data.py"),
        "--config",
        str(config),
        "--data.inputs",
        str(corpus),
        *PREPARE_INPUTS,
        "--data.output",
        str(out),
        "--num-cpus",
        str(num_cpus),
        "--data.dedup",
        "off",
    ]
    if force_ray:
        cmd += ["--data.local_max_bytes", "0"]
    try:
        run = run_sampled(cmd, env, cwd=REPO)
        log, sampler = run.log, run.sampler
        if run.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({run.returncode}):\n{log[-3000:]}")
        m = json.loads((out / "manifest.json").read_text())
    finally:
        shutil.rmtree(corpus, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    on_ray = re.search(r"input file\(s\) on \d+ actor\(s\)", log)  # vs "in this process" / "on N local worker ..."
    return {
        "factor": factor,
        "bytes": size,
        "path": "Ray" if on_ray else "local",
        "forced": force_ray,
        "wall": run.wall,
        "tokens": m["source_tokens"],
        "examples": m["examples"],
        "stages": stage_seconds(log),
        "cpu": sampler.cpu_seconds,
        "peak_tree": sampler.peak_sum,
        "peak_one": sampler.peak_one,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpora", type=Path, default=SHARED / "corpora", help="the corpus copied (a directory)")
    ap.add_argument("--factors", default="1,4,16", help="corpus copies for the default command's curve")
    ap.add_argument("--ray-factors", default="1", help="corpus copies also run with --data.local_max_bytes 0")
    ap.add_argument("--memory-factor", type=int, default=8, help="peak memory at this many copies vs 1x")
    ap.add_argument("--num-cpus", type=int, default=2, help="CPUs of each run's local Ray")
    ap.add_argument("--write-results", metavar="FILE", help="also write the table and the command to FILE (markdown)")
    a = ap.parse_args()
    factors = [int(x) for x in a.factors.split(",")]
    ray_factors = [int(x) for x in a.ray_factors.split(",") if x]
    plan = [(f, False) for f in factors] + [(f, True) for f in ray_factors]
    if a.memory_factor not in factors:
        plan.append((a.memory_factor, False))
    plan.sort()

    work = Path(tempfile.mkdtemp(prefix="data_scale_"))
    # One snapshot of the main job's config for every point: the file may be edited while the curve runs.
    config = data_config("tiny.yaml", work / "tiny.yaml")
    config_sha = hashlib.sha256((REPO / "configs/tiny.yaml").read_bytes()).hexdigest()[:12]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": str(work)}
    env.pop("RAY_ADDRESS", None)  # a private local Ray per run, never a cluster running on the machine
    points: list[dict] = []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load0 = os.getloadavg()[0]
    try:
        for f, force in plan:
            p = run_point(work, a.corpora, config, f, force, a.num_cpus, env)
            points.append(p)
            print(
                f"{f}x{' (forced Ray)' if force else ''}: {p['path']}, {p['tokens']:,} tokens in {p['wall']:.1f} s "
                f"= {p['tokens'] / p['wall']:,.0f} tok/s, {p['cpu']:.1f} CPU-s, peak tree {p['peak_tree'] / GIB:.2f} GiB, "  # noqa: E501
                f"stages {p['stages']}",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg()[0]

    def tps(p: dict) -> float:
        return p["tokens"] / p["wall"]

    def ref(path: str) -> dict | None:
        return next((p for p in points if p["factor"] == 1 and p["path"] == path), None)

    def tpc(p: dict) -> float:
        return p["tokens"] / p["cpu"]

    rows = [
        "| input | path | MB | tokens | wall s | vocab s | shards s | tokens/s | ÷ 1x same path | ÷ 1x default "
        "| CPU-s | tokens/CPU-s ÷ 1x same path | peak RSS tree GiB | largest process GiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    default_1x = next(p for p in points if p["factor"] == 1 and not p["forced"])
    for p in points:
        same = ref(p["path"])
        rows.append(
            f"| {p['factor']}x{' (forced Ray)' if p['forced'] else ''} | {p['path']} | {p['bytes'] / 1e6:.1f} "
            f"| {p['tokens']:,} | {p['wall']:.1f} | {p['stages'].get('vocab', 0):.1f} | {p['stages'].get('shards', 0):.1f} "  # noqa: E501
            f"| {tps(p):,.0f} | {f'{tps(p) / tps(same):.2f}' if same else '-'} | {tps(p) / tps(default_1x):.2f} "
            f"| {p['cpu']:.1f} | {f'{tpc(p) / tpc(same):.2f}' if same else '-'} "
            f"| {p['peak_tree'] / GIB:.2f} | {p['peak_one'] / GIB:.2f} |"
        )
    curve = [tps(p) / tps(default_1x) for p in points if p["factor"] in factors and not p["forced"]]
    within = all(0.85 <= r <= 1.15 for r in curve)
    lines = [
        f"tokens/s of the default command at {', '.join(f'{f}x' for f in factors)} ÷ 1x: "
        f"{', '.join(f'{r:.2f}' for r in curve)} (goal: all within 0.85-1.15: {'met' if within else 'NOT met'})"
    ]
    cpu_curve = [tpc(p) / tpc(default_1x) for p in points if p["factor"] in factors and not p["forced"]]
    lines.append(
        f"tokens per CPU-second of the default command at the same points ÷ 1x: "
        f"{', '.join(f'{r:.2f}' for r in cpu_curve)}"
    )
    mem = next(p for p in points if p["factor"] == a.memory_factor and not p["forced"])
    for base in [p for p in points if p["factor"] == 1]:
        r = mem["peak_tree"] / base["peak_tree"]
        lines.append(
            f"peak RSS tree {a.memory_factor}x ({mem['path']}) ÷ 1x ({base['path']}): {r:.2f} "
            f"(goal <= 1.5: {'met' if r <= 1.5 else 'NOT met'})"
        )
    lines.append(f"configs/tiny.yaml as of the start (sha256 {config_sha}) for every point")
    lines.append(f"1-min load average {load0:.1f} at the start, {load1:.1f} at the end; {os.cpu_count()} cores")
    table = "\n".join(rows)
    print(table)
    print("\n".join(lines))
    if a.write_results:
        cmd = "python bench/data/data_scale.py " + " ".join(sys.argv[1:])
        Path(a.write_results).write_text(
            f"Command: `{cmd}` (run {started})\n\n{table}\n\n" + "\n".join(f"- {x}" for x in lines) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
