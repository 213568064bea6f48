# Finished study, ran at 1195949 (2026-11-27): modernbert-tiny's step 1.23x tiny's CPU; the jobs set 1,200 steps
"""The compute side of configs/modernbert-tiny.yaml's budget: its training step's CPU time against configs/tiny.yaml's,
each as one of the job's two workers runs it (one intra-op thread, the config's micro-batch, forward + backward +
AdamW). In the jobs themselves per-step costs outside the model hide this difference; the budget (1,200 steps) was
set by running both jobs (bench/RESULTS.md, "Modern encoder": the pipeline and the budget).

Batches are what the loader makes of each config's shards (`collate`): tiny's rows of 128 one document each,
modernbert-tiny's rows of 1,024 packed from documents of random lengths (`doc_lengths` -> `cu_seqlens`), 30% of the
text tokens masked. Rounds alternate the two and use process CPU time, so a loaded machine's waiting does not count.

    python bench/studies/modernbert_budget.py --rounds 5 --steps 10
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from model.build import build_model
from pipeline.config import load_config
from pipeline.core.optim import OptimOptions, make_optimizer
from pipeline.core.precision import forward
from pipeline.pretrain.loader import collate

REPO = Path(__file__).resolve().parents[2]


def rows(cfg, rng: np.random.Generator) -> dict:
    """One worker's micro-batch of `cfg`'s shape: full rows (packed by document when data.pack_documents)."""
    d, n, L = cfg.data, cfg.train.micro_batch_size, cfg.data.max_seq_length
    ids, docs, pos, lab = [], [], [], []
    for _ in range(n):
        row = rng.integers(5, cfg.data.vocab_size, L).astype(np.int32)
        lens = []
        while d.pack_documents and sum(lens) < L:  # documents of 50-1,500 tokens, the last one cut at the row's end
            lens.append(int(min(rng.integers(50, 1500), L - sum(lens))))
        k = min(d.max_predictions_per_seq, int(round(d.mask_rate * L)))
        p = np.sort(rng.choice(np.arange(1, L - 1), k, replace=False)).astype(np.int32)
        ids.append(row), docs.append(np.asarray(lens, np.int32)), pos.append(p), lab.append(row[p])
    batch = {
        "input_ids": ids,
        "token_type_ids": [np.zeros(L, np.int8)] * n,
        "masked_lm_positions": pos,
        "masked_lm_ids": lab,
        "next_sentence_label": np.full(n, -1),
    }
    if d.pack_documents:
        batch["doc_lengths"] = docs
    return collate(batch, family=cfg.model.family)


def step_cpu_s(cfg, steps: int, seed: int) -> float:
    """Median process CPU seconds of one optimizer step (the micro-steps of one worker's accumulation)."""
    torch.manual_seed(seed)
    model = build_model(cfg.model.encoder_config(vocab_size=cfg.data.vocab_size)).train()
    tc = cfg.train
    opt, sched = make_optimizer(
        model, OptimOptions(tc.optimizer, tc.lr, tc.weight_decay, warmup_steps=1, total_steps=steps + 1)
    )
    batch = rows(cfg, np.random.default_rng(seed))
    times = []
    for _ in range(steps):
        t0 = time.process_time()
        for _ in range(tc.accumulation_steps):
            forward(model, batch, torch.device("cpu"), "fp32").loss.backward()
        opt.step(), sched.step(), opt.zero_grad()
        times.append(time.process_time() - t0)
    return statistics.median(times[1:])  # the first step pays allocation


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # as a worker of cpus_per_worker 0.5 runs (pipeline/pretrain/worker.py)
    cfgs = {name: load_config(REPO / "configs" / f"{name}.yaml") for name in ("tiny", "modernbert-tiny")}
    got: dict[str, list[float]] = {name: [] for name in cfgs}
    for r in range(args.rounds):
        for name in list(cfgs) if r % 2 == 0 else list(reversed(cfgs)):
            got[name].append(step_cpu_s(cfgs[name], args.steps, seed=r))
    med = {name: statistics.median(v) for name, v in got.items()}
    tiny, mb = cfgs["tiny"].train, cfgs["modernbert-tiny"].train
    for name, cfg in cfgs.items():
        tokens = cfg.train.global_batch_size * cfg.data.max_seq_length
        print(
            f"{name:16s} {med[name] * 1000:7.1f} ms CPU / step (rounds {[round(v * 1000) for v in got[name]]}), "
            f"{tokens:,} token slots / step, {cfg.train.max_steps:,} steps: {med[name] * cfg.train.max_steps:6.1f} CPU s"  # noqa: E501
        )
    ratio = med["modernbert-tiny"] * mb.max_steps / (med["tiny"] * tiny.max_steps)
    same = tiny.max_steps * med["tiny"] / med["modernbert-tiny"]
    print(f"modernbert-tiny's steps cost {ratio:.2f}x tiny's compute; equal compute: {same:,.0f} steps")
    return {"ratio": ratio, "equal_steps": same, **med}


if __name__ == "__main__":
    main()
