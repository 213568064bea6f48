"""AdamW's update on the CPU: torch's loop over the parameters (its CPU default) against its fused CPU kernel, which
`pipeline.core.optim.make_optimizer` picks for CPU parameters since issue 31 (before: CUDA only).

    python bench/optimizer_step.py [--presets tiny,mini,minilm,base] [--steps 20] [--rounds 3] [--threads 1]

Per preset: a BertForPreTraining (30,522-token vocabulary; `minilm` is all-MiniLM-L6-v2's shape, 6 layers of 384,
the fine-tuning tests' model), its gradients set once, then `--steps` optimizer steps of each kind timed, the kinds
alternating for `--rounds` rounds (the machine is shared and noisy: the ratio is read within a round). The table
gives each kind's median milliseconds a step and the fused kernel's ratio to the loop, and how far apart the two
updates' weights are after five steps from the same start, against how far the weights moved (a run keeps the
kind it started with, which its checkpoints carry).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# torch.optim imports torch._dynamo at the first step, which makes its cache directory (/tmp/torchinductor_<user>):
# here under a temporary directory removed at exit
_CACHE = tempfile.TemporaryDirectory(prefix="optimizer-step-")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_CACHE.name, "inductor"))

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model import BertConfig, BertForPreTraining  # noqa: E402
from pipeline.core.optim import make_optimizer  # noqa: E402

SHAPES = {"minilm": {"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 12}}


def model_for(preset: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = BertConfig(**SHAPES[preset], vocab_size=30522) if preset in SHAPES else BertConfig.from_preset(preset, vocab_size=30522)
    return BertForPreTraining(cfg)


def optimizer(model: torch.nn.Module, fused: bool) -> torch.optim.Optimizer:
    opt, _ = make_optimizer(model, "adamw", 1e-4, 0.01, warmup_steps=0, total_steps=1000, fused=fused)
    return opt


def time_steps(model: torch.nn.Module, fused: bool, steps: int) -> float:
    """Milliseconds a step, median of `steps` after one warm-up step."""
    opt = optimizer(model, fused)
    opt.step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        opt.step()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def set_grads(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g) * 1e-3


def drift(model: torch.nn.Module) -> tuple[float, float]:
    """(largest absolute weight difference between the two kinds, largest absolute change of a weight) after five
    steps of each from the same weights, with the same gradients at each step."""
    a, b = copy.deepcopy(model), copy.deepcopy(model)  # (a deep copy has no gradients)
    oa, ob = optimizer(a, False), optimizer(b, True)
    for step in range(5):
        for m, opt in ((a, oa), (b, ob)):
            set_grads(m, step)
            opt.step()
    pairs = list(zip(a.parameters(), b.parameters(), model.parameters()))
    return (max((x - y).abs().max().item() for x, y, _ in pairs), max((x - w).abs().max().item() for x, _, w in pairs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="tiny,mini,minilm,base")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the tests' workers run on one)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"AdamW step on the CPU, {args.threads} thread(s), torch {torch.__version__}; median ms a step of "
          f"{args.steps}, {args.rounds} alternating rounds")
    print("| model | parameters | tensors | loop (torch's CPU default) ms | fused ms | fused / loop | "
          "largest weight difference after 5 steps (of the largest change) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for preset in args.presets.split(","):
        model = model_for(preset)
        set_grads(model, 99)
        loop, fused = [], []
        for _ in range(args.rounds):
            loop.append(time_steps(model, False, args.steps))
            fused.append(time_steps(model, True, args.steps))
        ratios = [f / u for u, f in zip(loop, fused)]
        diff, moved = drift(model)
        n = sum(p.numel() for p in model.parameters())
        print(f"| {preset} | {n / 1e6:.1f}M | {len(list(model.parameters()))} | {statistics.median(loop):.1f} | "
              f"{statistics.median(fused):.1f} | {statistics.median(ratios):.2f} | {diff:.1e} (of {moved:.1e}) |",
              flush=True)


if __name__ == "__main__":
    main()
