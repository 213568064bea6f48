"""Training-step throughput: our BertForPreTraining against transformers.BertForPreTraining.

One full step = forward + backward + AdamW step, same data, same weights, same thread count. Timing runs both
models in this one process, interleaved round by round (the machine is shared and noisy), and reports
medians. Peak memory is measured per (model, dtype) in a fresh subprocess, because a process's peak RSS only
ever grows: the resident high-water mark (VmHWM) over warmup + 2 steps minus the RSS before the model
was built (weights, grads, AdamW state and activations). On CUDA it is torch.cuda.max_memory_allocated.

    python bench/train_step.py                                   # CPU, mini, B32 L128 P20, fp32 + bf16
    python bench/train_step.py --device cpu --preset tiny --mfu  # the GPU code path, cheaply, on CPU
    python bench/train_step.py --device cuda --preset large --dtype bf16 --mfu

FLOPs are counted analytically (matmuls only, backward = 2x forward): see `step_flops`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import psutil  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere (no install needed)
from model import BertConfig, BertForPreTraining  # noqa: E402

IMPLS = ("ours", "transformers")


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, L)
    token_type_ids: torch.Tensor  # (B, L)
    attention_mask: torch.Tensor  # (B, L)
    masked_lm_positions: torch.Tensor  # (B, P), -1 padded
    masked_lm_ids: torch.Tensor  # (B, P), -1 padded
    next_sentence_label: torch.Tensor  # (B,)
    labels: torch.Tensor  # (B, L): the same targets in transformers' form, -100 elsewhere


def make_batch(cfg: BertConfig, batch: int, seq: int, masked: int, device: str, seed: int = 0) -> Batch:
    """Pretraining-like data: ~90% of sequences nearly full, ~10% short (Google's short-sequence rate)."""
    g = torch.Generator().manual_seed(seed)
    short = torch.rand(batch, generator=g) < 0.1
    lo = max(3, min(16, seq // 2))  # shortest sequence: [CLS] x [SEP] at least
    lengths = torch.where(short, torch.randint(lo, seq, (batch,), generator=g),
                          torch.randint(max(lo, seq - 8), seq + 1, (batch,), generator=g))
    ar = torch.arange(seq)
    mask = (ar[None] < lengths[:, None]).long()
    ids = torch.randint(1000, cfg.vocab_size, (batch, seq), generator=g) * mask
    tt = ((ar[None] >= lengths[:, None] // 2) & mask.bool()).long()
    pos = torch.full((batch, masked), -1, dtype=torch.long)
    mlm = torch.full((batch, masked), -1, dtype=torch.long)
    labels = torch.full((batch, seq), -100, dtype=torch.long)
    for b in range(batch):
        n = min(masked, max(1, round(0.15 * int(lengths[b]))))  # 15% of tokens, at most `masked`
        p = torch.randperm(int(lengths[b]) - 2, generator=g)[:n].sort().values + 1
        t = torch.randint(1000, cfg.vocab_size, (n,), generator=g)
        pos[b, :n], mlm[b, :n], labels[b, p] = p, t, t
    nsl = torch.randint(0, 2, (batch,), generator=g)
    to = lambda t: t.to(device)  # noqa: E731
    return Batch(to(ids), to(tt), to(mask), to(pos), to(mlm), to(nsl), to(labels))


def build(impl: str, cfg: BertConfig, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    ours = BertForPreTraining(cfg)
    if impl == "ours":
        return ours.to(device).train()
    import transformers

    ref = transformers.BertForPreTraining(transformers.BertConfig(**cfg.to_hf_dict(["BertForPreTraining"])))
    missing, unexpected = ref.load_state_dict(ours.state_dict(), strict=False)  # same weights
    assert not unexpected and all("decoder" in k for k in missing), (missing, unexpected)
    return ref.to(device).train()


def loss_of(impl: str, model: torch.nn.Module, b: Batch) -> torch.Tensor:
    if impl == "ours":
        return model(b.input_ids, b.token_type_ids, b.attention_mask, b.masked_lm_positions, b.masked_lm_ids,
                     b.next_sentence_label).loss
    return model(input_ids=b.input_ids, token_type_ids=b.token_type_ids, attention_mask=b.attention_mask,
                 labels=b.labels, next_sentence_label=b.next_sentence_label).loss


def make_step(impl: str, model: torch.nn.Module, b: Batch, dtype: str, device: str):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=dtype == "bf16")

    def step() -> float:
        with autocast:
            loss = loss_of(impl, model, b)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def step_flops(cfg: BertConfig, batch: int, seq: int, mlm_rows: int) -> float:
    """Matmul FLOPs of one training step (x3: forward, input grads, weight grads).

    Per token and layer: QKV + output 4H^2, FFN 2HI multiply-adds; attention scores and mix 2*L*H. Heads: the
    pooler and NSP per sequence; the MLM transform H^2 and decoder H*V per row that gets logits (B*L rows
    for transformers, the valid masked positions for ours).
    """
    H, I, V, n = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    tokens = batch * seq
    macs = tokens * n * (4 * H * H + 2 * H * I + 2 * seq * H)
    macs += batch * (H * H + 2 * H)
    macs += mlm_rows * (H * H + H * V)
    return 3 * 2 * macs


def matmul_rate(device: str, dtype: str) -> float:
    """Measured dense matmul FLOP/s in `dtype` (the MFU denominator): best of several square GEMMs."""
    n = 8192 if device == "cuda" else 2048
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    best = float("inf")
    for _ in range(3 if device == "cpu" else 20):
        sync(device)
        t = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def rss_high_water_mark() -> int:
    """Peak resident bytes of this process image. /proc's VmHWM starts afresh at exec, unlike getrusage's
    ru_maxrss, which a child inherits from the (large) parent that forked it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux, close enough elsewhere


def memory_child(args: argparse.Namespace) -> None:
    """Subprocess: peak memory of one (impl, dtype) over warmup + 2 steps, printed as JSON."""
    torch.set_num_threads(args.threads)
    cfg = BertConfig.from_preset(args.preset)
    b = make_batch(cfg, args.batch, args.seq, args.masked, args.device)
    base = psutil.Process().memory_info().rss  # bytes resident before the model exists
    model = build(args.impl, cfg, args.device)
    step = make_step(args.impl, model, b, args.child_dtype, args.device)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(3):
        step()
    sync(args.device)
    if args.device == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = rss_high_water_mark() - base
    print(json.dumps({"peak_bytes": peak}))


def peak_memory(args: argparse.Namespace, impl: str, dtype: str) -> float:
    cmd = [sys.executable, __file__, "--child-memory", "--impl", impl, "--child-dtype", dtype, "--preset",
           args.preset, "--batch", str(args.batch), "--seq", str(args.seq), "--masked", str(args.masked),
           "--device", args.device, "--threads", str(args.threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_bytes"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="mini")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--masked", type=int, default=20, help="max masked positions per sequence")
    p.add_argument("--dtype", choices=("fp32", "bf16", "both"), default="both")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (ours, theirs alternate)")
    p.add_argument("--impls", default="ours,transformers", help="comma list; 'ours' alone for big GPU presets")
    p.add_argument("--mfu", action="store_true", help="also measure the matmul rate and report MFU")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--child-memory", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", default="ours", help=argparse.SUPPRESS)
    p.add_argument("--child-dtype", default="fp32", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device visible to torch")
    if args.child_memory:
        return memory_child(args)

    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 on both sides
    cfg = BertConfig.from_preset(args.preset)
    b = make_batch(cfg, args.batch, args.seq, args.masked, args.device)
    impls = [i for i in args.impls.split(",") if i]
    dtypes = ["fp32", "bf16"] if args.dtype == "both" else [args.dtype]
    tokens = args.batch * args.seq
    mlm_rows = {"ours": int((b.masked_lm_positions >= 0).sum()), "transformers": tokens}
    print(f"preset={args.preset} ({cfg.num_hidden_layers}L H{cfg.hidden_size} A{cfg.num_attention_heads}) "
          f"batch={args.batch} seq={args.seq} masked<={args.masked} (valid {mlm_rows['ours']}) "
          f"device={args.device} threads={args.threads} torch={torch.__version__}", flush=True)

    rows = []
    paired: dict[str, float] = {}
    for dtype in dtypes:
        steps = {i: make_step(i, build(i, cfg, args.device), b, dtype, args.device) for i in impls}
        for impl, step in steps.items():  # warmup: allocator, autotuning, lazy init
            for _ in range(args.warmup):
                step()
        times: dict[str, list[float]] = {i: [] for i in impls}
        for r in range(args.rounds):
            for impl in impls if r % 2 == 0 else impls[::-1]:
                for _ in range(args.steps):
                    sync(args.device)
                    t = time.perf_counter()
                    steps[impl]()
                    sync(args.device)
                    times[impl].append(time.perf_counter() - t)
            print(f"  {dtype} round {r + 1}/{args.rounds}: " + ", ".join(
                f"{i} {statistics.median(times[i][-args.steps:]) * 1e3:.0f} ms" for i in impls), flush=True)
        del steps
        if len(impls) == 2:
            # Per-round ratio of the two adjacent measurements: load drifts on a shared machine, and pairing
            # cancels it better than comparing two medians taken minutes apart.
            k = args.steps
            per_round = {i: [statistics.median(times[i][r * k:(r + 1) * k]) for r in range(args.rounds)]
                         for i in impls}
            paired[dtype] = statistics.median(t / o for o, t in zip(per_round[impls[0]], per_round[impls[1]]))
        rate = matmul_rate(args.device, dtype) if args.mfu else None
        for impl in impls:
            sec = statistics.median(times[impl])
            flops = step_flops(cfg, args.batch, args.seq, mlm_rows[impl])
            mem = None if args.no_memory else peak_memory(args, impl, dtype)
            rows.append({"impl": impl, "dtype": dtype, "ms": sec * 1e3, "best_ms": min(times[impl]) * 1e3,
                         "tok_s": tokens / sec,
                         "seq_s": args.batch / sec, "gflop": flops / 1e9, "tflops": flops / sec / 1e12,
                         "mfu": flops / sec / rate if rate else None, "peak_mib": mem / 2**20 if mem else None,
                         "rate": rate})

    print()
    print("| model | dtype | step ms (median) | best ms | tokens/s | seq/s | GFLOP/step | achieved TFLOP/s | MFU "
          "| peak MiB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        mem = f"{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "-"
        print(f"| {r['impl']} | {r['dtype']} | {r['ms']:.0f} | {r['best_ms']:.0f} | {r['tok_s']:.0f} | "
              f"{r['seq_s']:.1f} | "
              f"{r['gflop']:.1f} | {r['tflops']:.3f} | {mfu} | {mem} |")
    if args.mfu:
        for dtype in dtypes:
            rate = next(r["rate"] for r in rows if r["dtype"] == dtype)
            print(f"measured {dtype} matmul rate: {rate / 1e12:.3f} TFLOP/s")
    if len(impls) == 2:
        print()
        for dtype in dtypes:
            a, t = (next(r for r in rows if r["impl"] == i and r["dtype"] == dtype) for i in impls)
            ratio_mem = (f", transformers needs {t['peak_mib'] / a['peak_mib']:.2f}x our peak memory"
                         if a["peak_mib"] and t["peak_mib"] else "")
            print(f"{dtype}: ours / transformers throughput = {a['tok_s'] / t['tok_s']:.2f}x (medians), "
                  f"{paired[dtype]:.2f}x (median of per-round ratios), {t['best_ms'] / a['best_ms']:.2f}x (best) "
                  f"(FLOP ratio {t['gflop'] / a['gflop']:.2f}x{ratio_mem})")


if __name__ == "__main__":
    main()
