"""Two pretrained encoders on pydocs_topic, each at its best fine-tuning LR, several seeds (issue 33's quality check).

    python bench/encoder_quality.py --model tiny=models:/q33-tiny/1 --model modernbert-tiny=models:/q33-modernbert-tiny/1

Each `--model NAME=SPEC` is a registered version (`models:/...`, read from MLFLOW_TRACKING_URI) or a transformers
directory: what the main job registers. Every model is fine-tuned with `bench/recipe_study.py`'s protocol (the
product's data preparation, head, optimizer, step and evaluation, in this process: the full train set of 3,600,
3 epochs, batch 32, max_seq_length 128, AdamW with 10% warmup and linear decay, the best epoch's dev accuracy)
at every LR of `--lrs` and every seed of `--seeds`; the best LR is the one with the highest mean over the seeds.
The head is the checkpoint's family's (`model.build.load_model`), as `jobs/finetune.py` builds it. Prints a
markdown table per model (mean over seeds at each LR) and one line per model at its best LR; writes the figures
as JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def resolve(spec: str, into: str) -> str:
    if spec.startswith("models:/"):
        from pipeline import tracking

        return tracking.download_model(spec, into)
    return spec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", required=True, help="NAME=SPEC (models:/name/version or a directory)")
    ap.add_argument("--task", default=str(REPO.parent / "shared" / "tasks" / "pydocs_topic"))
    ap.add_argument("--lrs", default="1e-4,3e-4,1e-3,3e-3")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="JSON file for the figures")
    a = ap.parse_args()

    import torch

    from recipe_study import finetune_grid

    torch.set_num_threads(a.threads)
    lrs = [float(x) for x in a.lrs.split(",")]
    seeds = [int(s) for s in a.seeds.split(",")]
    results = {}
    with tempfile.TemporaryDirectory(prefix="encoder-quality-") as tmp:
        for item in a.model:
            name, _, spec = item.partition("=")
            local = resolve(spec, str(Path(tmp) / name))
            t0 = time.perf_counter()
            ft = finetune_grid(local, local, Path(a.task), lrs, seeds, "cpu",
                               say=lambda line, name=name: print(f"  {name} {line}", flush=True))
            results[name] = {"spec": spec, "grid": ft["grid"], "best_lr": ft["best_lr"], "mean": ft["accuracy_mean"],
                             "sd": ft["accuracy_sd"], "seconds": time.perf_counter() - t0}
    for name, r in results.items():
        print(f"\n{name} ({r['spec']}): dev accuracy, mean over seeds {seeds}")
        print("| LR | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |\n|---:|" + "---:|" * (len(seeds) + 1))
        for lr, accs in r["grid"].items():
            print(f"| {float(lr):g} | " + " | ".join(f"{x:.4f}" for x in accs) + f" | {statistics.mean(accs):.4f} |")
    print("\n| model | best LR | dev accuracy (mean ± sd over seeds) | fine-tuning s |\n|---|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['best_lr']:g} | {r['mean']:.4f} ± {r['sd']:.4f} | {r['seconds']:.0f} |")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
