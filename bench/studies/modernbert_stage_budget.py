# Finished study, ran at 0e51689 (2026-11-29): modernbert-tiny's train stage 1.25x tiny's; equal at 949 steps
"""modernbert-tiny's budget from the jobs' own train stage: configs/tiny.yaml and configs/modernbert-tiny.yaml run
as a user runs them (`jobs/pretrain.py`, a private local Ray; each config's first run prepares its data, before
its train stage), one after the other in alternating order (tiny, modernbert-tiny, then modernbert-tiny, tiny,
...), so that a machine whose load drifts weighs on both alike. Each run is cut to `--steps`, with its evaluations
and checkpoints at the same share of its steps as at the config's own length (every 300 of 1,200 steps: every
quarter), and no scorecard (`--eval.suite null`).

What is timed. The train stage's wall time, as the job prints it (`[stage train] done in X s`), and in it the
loop's time a step: the MLflow timestamps of `train/loss` from the first logged step to the last (evaluations and
checkpoints inside). The rest of the stage (Ray Train's start, the workers' setup, the data put in the object
store) does not grow with the steps: `fixed = stage - steps x loop s/step`. A run of N steps then takes
`fixed + N x loop s/step`; the table gives that at each config's own max_steps, their ratio, and the steps at which
modernbert-tiny's stage takes tiny's time.

    python bench/studies/modernbert_stage_budget.py --steps 150 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRESETS = ("tiny", "modernbert-tiny")
STAGE = re.compile(r"\[stage train\] done in ([0-9.]+)s")


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


def job(args: list[str], cwd: Path, log: Path) -> str:
    """Run one job in `cwd` (its own MLflow store, mlflow.db there); its output goes to `log` and is returned."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    cwd.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        p = subprocess.run([sys.executable, *args], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    text = log.read_text()
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args[:3])} failed (exit {p.returncode}); its output: {log}\n{text[-3000:]}")
    return text


def loop_s_per_step(cwd: Path, experiment: str) -> tuple[float, int]:
    """(seconds a step between the first and the last logged `train/loss`, steps logged) of the run in `cwd`."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    (run,) = [r for r in client.search_runs([exp.experiment_id]) if r.data.metrics.get("train/loss") is not None]
    hist = sorted(client.get_metric_history(run.info.run_id, "train/loss"), key=lambda m: m.step)
    first, last = hist[0], hist[-1]
    return (last.timestamp - first.timestamp) / 1000 / (last.step - first.step), len(hist)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150, help="each run's max_steps")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each config")
    ap.add_argument("--corpora", default=str(REPO.parent / "shared" / "corpora"))
    ap.add_argument("--keep", action="store_true", help="keep the runs' directory (else deleted)")
    args = ap.parse_args(argv)
    from pipeline.config import load_config

    cfgs = {p: load_config(REPO / "configs" / f"{p}.yaml") for p in PRESETS}
    work = Path(tempfile.mkdtemp(prefix="stage-budget-"))
    print(f"runs in {work}; load average (1/5/15 min) at the start: {load()}", flush=True)
    got: dict[str, list[dict]] = {p: [] for p in PRESETS}
    try:
        for r in range(args.rounds):
            for p in PRESETS if r % 2 == 0 else tuple(reversed(PRESETS)):
                tc = cfgs[p].train
                every = max(1, round(tc.eval_every_steps * args.steps / tc.max_steps))
                ckpt = max(1, round(tc.checkpoint_every_steps * args.steps / tc.max_steps))
                cwd = work / f"{p}-{r}"
                t0 = time.time()
                text = job(
                    [str(REPO / "jobs/pretrain.py"), "--config", str(REPO / "configs" / f"{p}.yaml")]
                    + ["--data.inputs", args.corpora, "--data.output", str(work / f"data-{p}")]
                    + ["--train.storage_path", str(cwd / "runs"), "--train.max_steps", str(args.steps)]
                    + ["--train.eval_every_steps", str(every), "--train.checkpoint_every_steps", str(ckpt)]
                    + ["--eval.suite", "null"],
                    cwd,
                    work / f"{p}-{r}.log",
                )
                stage = float(STAGE.findall(text)[-1])
                per, logged = loop_s_per_step(cwd, cfgs[p].tracking.experiment)
                got[p].append({"stage": stage, "per_step": per, "fixed": stage - per * args.steps})
                print(
                    f"round {r} {p:16s} train stage {stage:6.1f} s, loop {per:.3f} s/step ({logged} steps logged), "
                    f"fixed {stage - per * args.steps:5.1f} s; job {time.time() - t0:5.0f} s; load {load()}",
                    flush=True,
                )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    med = {p: {k: statistics.median(g[k] for g in got[p]) for k in ("stage", "per_step", "fixed")} for p in PRESETS}
    full = {p: med[p]["fixed"] + med[p]["per_step"] * cfgs[p].train.max_steps for p in PRESETS}
    t, m = "tiny", "modernbert-tiny"
    equal = (full[t] - med[m]["fixed"]) / med[m]["per_step"]
    print()
    print(
        f"| config | runs | train stage at {args.steps} steps, s | loop s/step | fixed s | max_steps "
        "| stage at max_steps, s |"
    )
    print("|---|---|---|---|---|---|---|")
    for p in PRESETS:
        stages = ", ".join(f"{g['stage']:.0f}" for g in got[p])
        print(
            f"| {p} | {len(got[p])} | {stages} | {med[p]['per_step']:.3f} | {med[p]['fixed']:.0f} | "
            f"{cfgs[p].train.max_steps:,} | {full[p]:.0f} |"
        )
    ratio = full[m] / full[t]
    print(
        f"\nmodernbert-tiny's train stage / tiny's, each at its max_steps: {ratio:.2f}; loop s/step "
        f"{med[m]['per_step'] / med[t]['per_step']:.2f}x; modernbert-tiny's stage takes tiny's time at "
        f"{equal:,.0f} steps"
    )
    print(f"load average (1/5/15 min) at the end: {load()}")
    return {"ratio": ratio, "equal_steps": equal, "medians": med}


if __name__ == "__main__":
    main()
