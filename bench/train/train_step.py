"""Training-step throughput: our BertForPreTraining against transformers.BertForPreTraining, and our variants.

One full step = forward + backward + optimizer step, same data, same weights, same thread count. Timing runs every
implementation in this one process, interleaved round by round (the machine is shared and noisy; the order flips
each round), and reports medians. Peak memory (weights, grads, optimizer state and activations) is,
on CUDA, torch.cuda.max_memory_allocated while one implementation is built and warmed up, above what was allocated
before it; on the CPU a process's peak RSS only ever grows, so it is measured per (implementation, dtype) in a fresh
subprocess: the resident high-water mark (VmHWM) over warmup + 2 steps minus the RSS before the model was built.

    python bench/train/train_step.py                                   # CPU, mini, B32 L128 P20, fp32 + bf16
    python bench/train/train_step.py --device cpu --preset tiny --mfu  # the GPU code path, cheaply, on CPU
    python bench/train/train_step.py --device cuda --preset large --dtype bf16 --mfu
    python bench/train/train_step.py --device cuda --preset base --batch 256 --dtype bf16 --mfu --data packed \\
        --impls transformers,ours,ours+real,ours+real+compile,ours+real+cudagraphs   # the GPU issue's tries

An implementation is `transformers`, or `ours` with `+feature`s (issue 18's tries, each one row of the table):

    real        the product's step: pipeline.core.step.train_step with make_optimizer (fused AdamW on CUDA),
                gradient clipping, figures kept on the device; batches made by the loader's `collate`
    fused       fused AdamW in the bare step (`real` is fused on CUDA already)
    mask        pass the attention mask even when no row is padded (the old behaviour: no flash kernel)
    unpad       padded batches as `unpad_indices`/`cu_seqlens`: dense layers on real tokens, jagged SDPA
    compile     torch.compile the encoder's layers (static shapes: batches padded to --seq), default mode, as
                `train.compile` does: one graph shared by the layers (regional compilation)
    autotune    the same with mode max-autotune-no-cudagraphs
    cudagraphs  the same with mode reduce-overhead (CUDA graphs)
    whole       with one of the three above: the whole encoder as one graph instead (compiles every layer)
    drop0       attention-probability dropout 0 (MosaicBERT)
    nodrop      every dropout 0, hidden and attention (ModernBERT's recipe): a recipe change, not a kernel
    vocab64     the vocabulary rounded up to a multiple of 64 (the embedding and decoder GEMMs' shapes)
    fp8         FP8 GEMMs (torchao's float8 training, tensorwise scaling) in the encoder's nn.Linear layers: the
                attention output and both feed-forward projections (QKV is one F.linear over the three weights
                and stays bf16, as do the embeddings and the MLM head); never a bf16 row. CUDA (sm89+) only,
                and torchao must be importable (bench/gpu/gpu_step.sh installs the carried wheel)

Data (`--data`): `padded` is Google-like NSP data (~10% short sequences, a padding mask in play); `packed` is
MLM-only data packed to full length (no row padded, no mask passed unless `+mask`).

`--profile` then runs `--steps` more steps of each implementation under torch.profiler and prints where a step's
time goes: on CUDA the kernels' time per step by kind (GEMM, attention, fused Triton code, the optimizer, norms and
reductions, embedding and indexing, copies and casts, other element-wise), the GPU's idle time (the step's wall time
less its kernels'), and the longest kernels; on the CPU the operators' own time.

The "warm-up s" column is the time to build an implementation and run its warm-up steps: for the compiled ones,
mostly compilation (with inductor's caches as they were: empty on a fresh machine).

FLOPs are counted analytically (matmuls only, backward = 2x forward) on the real tokens (`model.flops.train_flops`,
the formula the training loop's `train/mfu` uses).
MFU is achieved FLOP/s over `--peak-tflops`, by default on CUDA the H100 SXM's dense bf16 datasheet figure
(989.4 TFLOP/s: the basis of the published references, ../shared/GPU.md). `--mfu` also measures the dense
matmul rate of this device and prints the fraction of it ("of GEMM"): how close the step is to what the chip
delivers here, which is not MFU.
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere (no install needed)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure
from model import BertConfig, BertForPreTraining  # noqa: E402
from model.flops import train_flops  # noqa: E402
from measure import interleaved  # noqa: E402

FEATURES = (
    "real",
    "fused",
    "mask",
    "unpad",
    "compile",
    "autotune",
    "cudagraphs",
    "whole",
    "drop0",
    "vocab64",
    "nodrop",
    "fp8",
)
COMPILE_MODES = {"compile": None, "autotune": "max-autotune-no-cudagraphs", "cudagraphs": "reduce-overhead"}
H100_BF16_PEAK_TFLOPS = 989.4
"""The H100 SXM's dense bf16 peak from its datasheet: the one MFU basis (../shared/GPU.md)."""


@dataclass(frozen=True)
class Impl:
    """`transformers`, or `ours` with a set of features (`ours+real+compile`)."""

    name: str
    features: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, spec: str) -> Impl:
        """
        >>> Impl.parse("ours+real+unpad").features == {"real", "unpad"}
        True
        >>> Impl.parse("ours+turbo")
        Traceback (most recent call last):
        ...
        ValueError: --impls: unknown feature 'turbo' in 'ours+turbo' (real, fused, mask, unpad, compile, autotune, cudagraphs, whole, drop0, vocab64, nodrop, fp8)
        """  # noqa: E501
        name, *feats = spec.strip().split("+")
        if name not in ("ours", "transformers"):
            raise ValueError(f"--impls: {spec!r} is neither ours[+feature...] nor transformers")
        if name == "transformers" and feats:
            raise ValueError(f"--impls: {spec!r}: features apply to ours only")
        for f in feats:
            if f not in FEATURES:
                raise ValueError(f"--impls: unknown feature {f!r} in {spec!r} ({', '.join(FEATURES)})")
        modes = [f for f in feats if f in COMPILE_MODES]
        if len(modes) > 1:
            raise ValueError(f"--impls: {spec!r}: one of {', '.join(COMPILE_MODES)}")
        if "real" in feats and "fused" in feats:
            raise ValueError(f"--impls: {spec!r}: real takes make_optimizer's AdamW (fused on CUDA, as the loop)")
        if "whole" in feats and not modes:
            raise ValueError(f"--impls: {spec!r}: whole goes with one of {', '.join(COMPILE_MODES)}")
        if "fp8" in feats and "unpad" in feats:
            raise ValueError(
                f"--impls: {spec!r}: fp8 wants static shapes (its scales), unpad gives a new one per batch"
            )
        if modes and "unpad" in feats:
            raise ValueError(
                f"--impls: {spec!r}: a compiled encoder wants one shape, unpad gives it a new one per batch"
            )
        return cls(name, frozenset(feats))

    def __str__(self) -> str:
        return "+".join([self.name, *sorted(self.features, key=FEATURES.index)])

    @property
    def compile_mode(self) -> str | None | bool:
        """False when not compiled, else the torch.compile mode (None = default)."""
        mode = next((f for f in self.features if f in COMPILE_MODES), None)
        return False if mode is None else COMPILE_MODES[mode]


def make_rows(batch: int, seq: int, masked: int, vocab: int, packed: bool, seed: int = 0) -> dict[str, Any]:
    """Pretraining-like rows in the shards' form (what `collate` takes). `packed`: every row full length, no NSP
    label (MLM-only data); else ~90% of rows nearly full and ~10% short (Google's short-sequence rate), NSP labels.
    15% of each row's tokens are masked, at most `masked`."""
    g = np.random.default_rng(seed)
    lo = max(3, min(16, seq // 2))  # shortest sequence: [CLS] x [SEP] at least
    if packed:
        lengths = np.full(batch, seq)
    else:
        short = g.random(batch) < 0.1
        lengths = np.where(short, g.integers(lo, seq, batch), g.integers(max(lo, seq - 8), seq + 1, batch))
    rows: dict[str, Any] = {k: [] for k in ("input_ids", "token_type_ids", "masked_lm_positions", "masked_lm_ids")}
    for n in map(int, lengths):
        k = min(masked, max(1, round(0.15 * n)))
        rows["input_ids"].append(g.integers(1000, vocab, n))
        rows["token_type_ids"].append((np.arange(n) >= n // 2).astype(np.int64) * (not packed))
        rows["masked_lm_positions"].append(np.sort(g.permutation(n - 2)[:k] + 1))
        rows["masked_lm_ids"].append(g.integers(1000, vocab, k))
    rows["next_sentence_label"] = np.full(batch, -1) if packed else g.integers(0, 2, batch)
    return rows


def make_batch(impl: Impl, rows: dict[str, Any], seq: int, device: str) -> dict[str, torch.Tensor]:
    """The keyword arguments of one step's forward, on `device`: ours through the loader's `collate` (as the
    training loop makes them), transformers' with (B, L) labels (-100 where nothing is masked)."""
    from pipeline.core.precision import HOST_ONLY
    from pipeline.pretrain.loader import collate

    b = collate(rows, pad_to=seq if impl.compile_mode is not False else None, unpad="unpad" in impl.features)
    if impl.name == "ours":
        if "mask" in impl.features and "attention_mask" not in b and "unpad_indices" not in b:
            b["attention_mask"] = torch.ones_like(b["input_ids"])
        if "real" not in impl.features:  # the bare model's forward takes no host-only entries
            for k in HOST_ONLY:
                b.pop(k)
        return {k: v if k in HOST_ONLY else v.to(device) for k, v in b.items()}
    labels = torch.full_like(b["input_ids"], -100)
    pos, ids = b["masked_lm_positions"], b["masked_lm_ids"]
    rows_, cols = (pos >= 0).nonzero(as_tuple=True)
    labels[rows_, pos[rows_, cols]] = ids[rows_, cols]
    # MLM-only rows (label -1) get NSP label 0: transformers returns no loss without one; its head costs ~nothing.
    out = {
        "input_ids": b["input_ids"],
        "token_type_ids": b["token_type_ids"],
        "labels": labels,
        "next_sentence_label": b["next_sentence_label"].clamp(min=0),
    }
    if "attention_mask" in b:
        out["attention_mask"] = b["attention_mask"]
    return {k: v.to(device) for k, v in out.items()}


def model_config(impl: Impl, cfg: BertConfig) -> BertConfig:
    if "drop0" in impl.features or "nodrop" in impl.features:
        cfg = replace(cfg, attention_probs_dropout_prob=0.0)
    if "nodrop" in impl.features:
        cfg = replace(cfg, hidden_dropout_prob=0.0)
    if "vocab64" in impl.features:
        cfg = replace(cfg, vocab_size=-(-cfg.vocab_size // 64) * 64)
    return cfg


def build(impl: Impl, cfg: BertConfig, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    ours = BertForPreTraining(model_config(impl, cfg))
    if impl.name == "ours":
        model = ours.to(device).train()
        if "fp8" in impl.features:  # before compiling: the compiled layers then fuse FP8's casts and scales
            from torchao.float8 import convert_to_float8_training

            convert_to_float8_training(
                model.bert.encoder,
                module_filter_fn=lambda m, _name: (
                    isinstance(m, torch.nn.Linear) and m.in_features % 16 == 0 and m.out_features % 16 == 0
                ),
            )
        if impl.compile_mode is not False and "whole" in impl.features:
            model.bert.encoder.compile(dynamic=False, mode=impl.compile_mode)
        elif impl.compile_mode is not False:  # in place, as the worker does (`train.compile`)
            model.bert.encoder.compile_layers(mode=impl.compile_mode)
        return model
    import transformers

    ref = transformers.BertForPreTraining(transformers.BertConfig(**cfg.to_hf_dict(["BertForPreTraining"])))
    missing, unexpected = ref.load_state_dict(ours.state_dict(), strict=False)  # same weights
    assert not unexpected and all("decoder" in k for k in missing), (missing, unexpected)
    return ref.to(device).train()


def make_step(
    impl: Impl, model: torch.nn.Module, batch: dict[str, torch.Tensor], dtype: str, device: str
) -> Callable[[], Any]:
    if "real" in impl.features:  # the product's step, exactly as the pretraining loop calls it
        from pipeline.core.optim import OptimOptions, make_optimizer
        from pipeline.core.step import Trainable, train_step
        from pipeline.pretrain.metrics import MlmSums, flop_counter

        opt, sched = make_optimizer(
            model, OptimOptions("adamw", 1e-4, 0.01, warmup_steps=0, total_steps=10**9, schedule="constant")
        )
        t = Trainable(model, opt, sched)
        # The loop counts train/mfu on a GPU, from the host batch; this batch is already on the device, so its count
        # is taken once here (counting it each step read it off the device: a host sync the loop does not have).
        host = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        work = flop_counter(model.config)(host) if device == "cuda" else None
        flops = (lambda _b: work) if work is not None else None
        return lambda: train_step(
            t,
            [batch],
            accumulation=1,
            sums=MlmSums,
            device=torch.device(device),
            precision=dtype,
            flops=flops,
        )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused="fused" in impl.features or None)
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=dtype == "bf16")

    def step() -> torch.Tensor:
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def matmul_rate(device: str, dtype: str) -> float:
    """Measured dense matmul FLOP/s in `dtype` (the "of GEMM" denominator): best of several square GEMMs."""
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
    impl, cfg = Impl.parse(args.impl), BertConfig.from_preset(args.preset)
    rows = make_rows(args.batch, args.seq, args.masked, cfg.vocab_size, args.data == "packed")
    batch = make_batch(impl, rows, args.seq, args.device)
    base = psutil.Process().memory_info().rss  # bytes resident before the model exists
    model = build(impl, cfg, args.device)
    step = make_step(impl, model, batch, args.child_dtype, args.device)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(3):
        step()
    sync(args.device)
    peak = torch.cuda.max_memory_allocated() if args.device == "cuda" else rss_high_water_mark() - base
    print(json.dumps({"peak_bytes": peak}))


def peak_memory(args: argparse.Namespace, impl: Impl, dtype: str) -> float:
    cmd = [
        sys.executable,
        __file__,
        "--child-memory",
        "--impl",
        str(impl),
        "--child-dtype",
        dtype,
        "--preset",
        args.preset,
        "--batch",
        str(args.batch),
        "--seq",
        str(args.seq),
        "--masked",
        str(args.masked),
        "--device",
        args.device,
        "--threads",
        str(args.threads),
        "--data",
        args.data,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_bytes"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="mini")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--masked", type=int, default=20, help="max masked positions per sequence")
    p.add_argument(
        "--data",
        choices=("padded", "packed"),
        default="padded",
        help="padded: NSP-like, ~10%% short rows; packed: MLM-only, every row full length",
    )
    p.add_argument("--dtype", choices=("fp32", "bf16", "both"), default="both")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (the order flips each round)")
    p.add_argument(
        "--impls",
        default="transformers,ours",
        help="comma list of transformers and ours[+feature...] (module docstring); the first is the "
        "reference of the ratios",
    )
    p.add_argument("--mfu", action="store_true", help="also measure this device's matmul rate (the 'of GEMM' column)")
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help=f"the MFU denominator (default on cuda: {H100_BF16_PEAK_TFLOPS}, the H100 SXM's dense bf16 "
        "datasheet peak; on cpu: none, no MFU column)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="after timing, profile --steps more steps of each implementation: where the time goes",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--json", help="also append the setting and the rows to this file, as one JSON line")
    p.add_argument("--child-memory", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", default="ours", help=argparse.SUPPRESS)
    p.add_argument("--child-dtype", default="fp32", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peak_tflops is None and args.device == "cuda":
        args.peak_tflops = H100_BF16_PEAK_TFLOPS
    try:
        args.impl_list = [Impl.parse(s) for s in args.impls.split(",") if s.strip()]
    except ValueError as e:
        p.error(str(e))
    if not args.impl_list:
        p.error("--impls: empty")
    return args


def warm_up(
    args: argparse.Namespace, cfg: BertConfig, rows_in: dict[str, Any], dtype: str
) -> tuple[dict[Impl, Callable[[], Any]], dict[Impl, float], dict[Impl, float]]:
    """Build each implementation's step and warm it up (allocator, autotuning, compilation, lazy init), one after
    the other; returns the steps, the peak memory (CUDA) and the seconds each took to build and warm up. On CUDA
    its peak memory is measured here, in this process: the most allocated while it was built and warmed up, above
    what was allocated before (the others stay idle meanwhile, their gradients freed)."""
    steps, peaks, warm_s = {}, {}, {}
    for impl in args.impl_list:
        t0 = time.perf_counter()
        if args.device == "cuda":
            sync(args.device)
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        try:
            steps[impl] = make_step(
                impl,
                build(impl, cfg, args.device),
                make_batch(impl, rows_in, args.seq, args.device),
                dtype,
                args.device,
            )
            for _ in range(args.warmup):
                steps[impl]()
        except Exception as e:  # a try that cannot run here (no torchao, no FP8 on this device) costs its own row only
            steps.pop(impl, None)
            print(
                f"  {impl}: failed, left out: {type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}",  # noqa: E501
                flush=True,
            )
            if args.device == "cuda":
                torch.cuda.empty_cache()
            continue
        if args.device == "cuda":
            sync(args.device)
            peaks[impl] = float(torch.cuda.max_memory_allocated() - before)
        sync(args.device)
        warm_s[impl] = time.perf_counter() - t0
        print(f"  {impl}: built and warmed up in {warm_s[impl]:.1f} s", flush=True)
    return steps, peaks, warm_s


def host_syncs(steps: dict[Impl, Callable[[], Any]]) -> dict[Impl, str]:
    """CUDA only: run one more step of each under `torch.cuda.set_sync_debug_mode("error")`, which raises at the
    first operation that waits for the device (a value read, a data-sized tensor, a blocking copy). "none" means the
    host queued the whole step without waiting: the loop's figures are read only on the steps that log."""
    out = {}
    for impl, step in steps.items():
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
            out[impl] = "none"
        except RuntimeError as e:
            out[impl] = str(e).strip().splitlines()[0][:80]
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return out


KERNEL_KINDS = (  # (kind, substrings of a kernel's lower-cased name), first match wins
    ("attention", ("flash", "fmha", "attn", "attention", "sdpa")),
    ("GEMM", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "triton_tem", "matmul", "sm90_", "sm100_")),
    ("optimizer, grad norm", ("adam", "multi_tensor", "foreach")),
    ("fused (Triton)", ("triton",)),
    ("norm / softmax / reduce", ("layer_norm", "layernorm", "softmax", "reduce", "norm", "cross_entropy", "nll")),
    ("embedding / index", ("embedding", "index", "gather", "scatter")),
    ("copy / cast / fill", ("copy", "cast", "memcpy", "memset", "fill", "convert")),
    ("element-wise", ("elementwise", "vectorized", "unrolled")),
)


def kernel_kind(name: str) -> str:
    """
    >>> kernel_kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"), kernel_kind("triton_per_fused_add_0")
    ('GEMM', 'fused (Triton)')
    >>> kernel_kind("pytorch_flash::flash_fwd_kernel<...>"), kernel_kind("void at::native::vectorized_elementwise_kernel")
    ('attention', 'element-wise')
    """  # noqa: E501
    low = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in low for k in keys)), "other")


def profile_steps(args: argparse.Namespace, impl: Impl, step: Callable[[], Any]) -> dict[str, Any]:
    """`args.steps` steps of one implementation under torch.profiler: where a step's time goes (see the module
    docstring). Returns {"wall_ms", "busy_ms", "kinds": {kind: ms per step}, "top": [(ms per step, name)]}."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = args.device == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    n = args.steps
    sync(args.device)
    with profile(activities=acts) as prof:
        t = time.perf_counter()
        for _ in range(n):
            step()
        sync(args.device)
        wall = (time.perf_counter() - t) / n * 1e3
    per: dict[str, float] = {}
    for e in prof.key_averages():
        if (cuda and e.device_type != DeviceType.CUDA) or getattr(e, "is_user_annotation", False):
            continue  # on CUDA only kernels; user annotations (a region's span on the GPU's timeline) double-count
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us > 0:
            per[e.key] = per.get(e.key, 0.0) + us / 1e3 / n
    kinds: dict[str, float] = {}
    for name, ms in per.items():
        kind = kernel_kind(name) if cuda else "CPU operators"
        kinds[kind] = kinds.get(kind, 0.0) + ms
    busy = sum(per.values())
    top = sorted(((ms, name) for name, ms in per.items()), reverse=True)[:12]
    print(
        f"\nprofile of {impl} ({n} steps): wall {wall:.1f} ms a step, "
        + (
            f"kernels {busy:.1f} ms, GPU idle {max(0.0, wall - busy):.1f} ms"
            if cuda
            else f"operators' own {busy:.1f} ms"
        )
    )
    print("| kind | ms per step | share of the step |\n|---|---:|---:|")
    for kind, ms in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"| {kind} | {ms:.2f} | {ms / wall:.1%} |")
    if cuda:
        print(f"| (GPU idle) | {max(0.0, wall - busy):.2f} | {max(0.0, wall - busy) / wall:.1%} |")
    print("longest:" + "".join(f"\n  {ms:7.2f} ms  {name[:110]}" for ms, name in top))
    return {"wall_ms": wall, "busy_ms": busy, "kinds": kinds, "top": [[ms, name[:200]] for ms, name in top]}


def time_steps(args: argparse.Namespace, steps: dict[Impl, Callable[[], Any]]) -> dict[Impl, list[float]]:
    """Wall seconds of each timed step: `rounds` rounds of `steps` steps of each, the order reversed every other
    round (`measure.interleaved`)."""

    def progress(r: int, times: dict) -> None:
        print(
            f"  round {r + 1}/{args.rounds}: "
            + ", ".join(f"{i} {statistics.median(w for w, _ in times[i][-args.steps :]) * 1e3:.1f} ms" for i in times),
            flush=True,
        )

    times = interleaved(steps, args.rounds, args.steps, sync=lambda: sync(args.device), on_round=progress)
    return {impl: [wall for wall, _ in t] for impl, t in times.items()}


def paired_ratio(times: dict[Impl, list[float]], ref: Impl, impl: Impl, k: int) -> float:
    """Median over rounds of (reference's round median / impl's round median): adjacent measurements, so load
    drift on a shared machine cancels better than in two medians taken minutes apart."""
    rounds = len(times[ref]) // k
    med = lambda i, r: statistics.median(times[i][r * k : (r + 1) * k])  # noqa: E731
    return statistics.median(med(ref, r) / med(impl, r) for r in range(rounds))


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device visible to torch")
    if args.child_memory:
        memory_child(args)
        return []

    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 on both sides
    cfg = BertConfig.from_preset(args.preset)
    impls = args.impl_list
    rows_in = make_rows(args.batch, args.seq, args.masked, cfg.vocab_size, args.data == "packed")
    lengths = [len(r) for r in rows_in["input_ids"]]
    real, slots = sum(lengths), args.batch * args.seq
    valid = sum(len(r) for r in rows_in["masked_lm_positions"])
    dtypes = ["fp32", "bf16"] if args.dtype == "both" else [args.dtype]
    print(
        f"preset={args.preset} ({cfg.num_hidden_layers}L H{cfg.hidden_size} A{cfg.num_attention_heads} "
        f"V{cfg.vocab_size}) batch={args.batch} seq={args.seq} data={args.data} ({real} real tokens of {slots}) "
        f"masked<={args.masked} (valid {valid}) device={args.device} threads={args.threads} "
        f"torch={torch.__version__}" + (f" gpu={torch.cuda.get_device_name()}" if args.device == "cuda" else ""),
        flush=True,
    )

    rows: list[dict[str, Any]] = []
    for dtype in dtypes:
        print(f"{dtype}:", flush=True)
        steps, peaks, warm_s = warm_up(args, cfg, rows_in, dtype)
        if not steps:
            continue
        impls = list(steps)  # those that built and warmed up, in --impls order
        times = time_steps(args, steps)
        profiles = {}
        if args.profile:
            for impl in impls:
                try:
                    profiles[impl] = profile_steps(args, impl, steps[impl])
                except Exception as e:  # a profiler failure costs its table, not the run's figures
                    print(f"profile of {impl} failed: {type(e).__name__}: {e}", flush=True)
        syncs = host_syncs(steps) if args.device == "cuda" else {}  # after the timing: a raise may leave grads behind
        del steps
        rate = matmul_rate(args.device, dtype) if args.mfu else None
        for impl in impls:
            sec = statistics.median(times[impl])
            mlm_rows = valid if impl.name == "ours" else slots
            flops = train_flops(model_config(impl, cfg), lengths, mlm_rows)
            mem = None if args.no_memory else peaks.get(impl) or peak_memory(args, impl, dtype)
            rows.append(
                {
                    "impl": str(impl),
                    "dtype": dtype,
                    "ms": sec * 1e3,
                    "best_ms": min(times[impl]) * 1e3,
                    "tok_s": real / sec,
                    "slots_s": slots / sec,
                    "seq_s": args.batch / sec,
                    "gflop": flops / 1e9,
                    "tflops": flops / sec / 1e12,
                    "mfu": flops / sec / (args.peak_tflops * 1e12) if args.peak_tflops else None,
                    "of_gemm": flops / sec / rate if rate else None,
                    "gemm_tflops": rate / 1e12 if rate else None,
                    "peak_mib": mem / 2**20 if mem else None,
                    "warmup_s": warm_s[impl],
                    "vs_first": paired_ratio(times, impls[0], impl, args.steps),
                    "host_sync": syncs.get(impl),
                    "profile": profiles.get(impl),
                }
            )
    print_table(args, rows)
    if args.json:
        setting = {k: v for k, v in vars(args).items() if k not in ("impl_list", "impl") and not k.startswith("child")}
        with open(args.json, "a") as f:
            f.write(json.dumps({"setting": {**setting, "torch": torch.__version__}, "rows": rows}) + "\n")
    return rows


def print_table(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    peak = f"MFU ({args.peak_tflops:g} TFLOP/s peak)" if args.peak_tflops else "MFU"
    first = rows[0]["impl"] if rows else str(args.impl_list[0])  # the reference each row's ratio is against
    print()
    print(
        f"| impl | dtype | step ms (median) | best ms | real tokens/s | seq/s | GFLOP/step | achieved TFLOP/s | {peak} "
        f"| of GEMM | peak MiB | warm-up s | speed ÷ {first} (paired) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    pct = lambda x: f"{x:.1%}" if x is not None else "-"  # noqa: E731
    for r in rows:
        mem = f"{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "-"
        print(
            f"| {r['impl']} | {r['dtype']} | {r['ms']:.1f} | {r['best_ms']:.1f} | {r['tok_s']:,.0f} | "
            f"{r['seq_s']:,.1f} | {r['gflop']:.1f} | {r['tflops']:.3f} | {pct(r['mfu'])} | {pct(r['of_gemm'])} | "
            f"{mem} | {r['warmup_s']:.1f} | {r['vs_first']:.2f}x |"
        )
    for r in rows:
        if r["host_sync"] is not None:
            print(f"host syncs in a step of {r['impl']} ({r['dtype']}): {r['host_sync']}")
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        gemm = next(r["gemm_tflops"] for r in rows if r["dtype"] == dtype)
        if gemm:
            print(f"measured {dtype} matmul rate: {gemm:.3f} TFLOP/s")


if __name__ == "__main__":
    main()
