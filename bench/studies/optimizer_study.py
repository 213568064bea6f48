# Finished study, ran at b50b91b (2026-11-27): StableAdamW 2.2 points of held-out MLM accuracy behind AdamW
"""StableAdamW against AdamW at the main job's budget (issue 33): the real job (`jobs/pretrain.py`, a private local
Ray, MLflow on SQLite) once per optimizer, everything else the config's, then held-out MLM loss and accuracy of each
final model on the same held-out rows (the job's own final evaluation: the whole held-out shard, one seed's masks).

    python bench/studies/optimizer_study.py --config configs/modernbert-tiny.yaml --out DIR
        [--optimizers adamw,stableadamw] [--parallel] [--set --train.lr 1e-3 ...]

The data is prepared once (the first job's stages; the others find it up to date). With `--parallel` the jobs
after the first start once the first is training, so they share the machine: their wall times are not
comparable then, their results are (each run is deterministic: fp32, seeded). Prints a table, AdamW as the
reference, and writes DIR/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def start(name: str, a: argparse.Namespace, out: Path) -> tuple[subprocess.Popen, Path]:
    log = out / f"{name}.log"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{out / 'mlflow.db'}", "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)  # a private local Ray per job
    cmd = [
        sys.executable,
        str(REPO / "jobs" / "pretrain.py"),
        "--config",
        a.config,
        "--data.output",
        str(out / "data"),
        "--train.storage_path",
        str(out / "runs"),
        "--train.optimizer",
        name,
        "--tracking.model_name",
        f"study-{name}",
        *a.set,
    ]
    with open(log, "w") as f:  # the job keeps its own copy of the descriptor
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT), log


def result(name: str, log: Path, rc: int, wall: float) -> dict:
    text = log.read_text()
    if rc != 0:
        raise SystemExit(f"{name}: the job failed (exit {rc}); see {log}")
    final = json.loads(re.findall(r"^\[evaluate\] (\{.*\})$", text, re.M)[-1])
    train_s = float(re.findall(r"\[stage train\] done in ([0-9.]+)s", text)[-1])
    return {
        "optimizer": name,
        "wall_s": round(wall, 1),
        "train_s": train_s,
        "loss": final["eval/final/mlm_loss"],
        "mlm_accuracy": final["eval/final/mlm_accuracy"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs" / "modernbert-tiny.yaml"))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--optimizers", default="adamw,stableadamw")
    ap.add_argument("--parallel", action="store_true", help="start the other jobs once the first is training")
    ap.add_argument("--set", nargs=argparse.REMAINDER, default=[], help="more flags for every job (last)")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    names = a.optimizers.split(",")
    results, running = [], []
    for i, name in enumerate(names):
        proc, log = start(name, a, a.out)
        running.append((name, proc, log, time.time()))
        if i + 1 < len(names):  # the next job once this one's data is there (or, in series, once it is done)
            while proc.poll() is None and (not a.parallel or "[stage train] running" not in log.read_text()):
                time.sleep(2)
        print(f"[study] {name}: started ({log})", flush=True)
    for name, proc, log, t0 in running:
        rc = proc.wait()
        results.append(result(name, log, rc, time.time() - t0))
        print(f"[study] {name}: done", flush=True)
    ref = results[0]
    print(
        f"\n| optimizer | train stage (s) | held-out MLM loss | held-out MLM accuracy | accuracy - {ref['optimizer']} |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r['optimizer']} | {r['train_s']:.1f} | {r['loss']:.4f} | {r['mlm_accuracy']:.4f} | "
            f"{r['mlm_accuracy'] - ref['mlm_accuracy']:+.4f} |"
        )
    (a.out / "results.json").write_text(json.dumps({"config": a.config, "set": a.set, "results": results}, indent=1))


if __name__ == "__main__":
    main()
