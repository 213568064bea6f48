"""CPU training step of the modern encoder: our ModernBertForMaskedLM against transformers' at the same shapes.

One step = forward + backward + AdamW step, fp32, same weights (copied through save_hf), same batch: rows packed to
--seq tokens from documents of random lengths, 30% of the tokens masked. Ours gets the document boundaries
(`cu_seqlens`: attention stays inside each document) and the masked positions (head and decoder on those rows
only); transformers' SDPA model takes no document boundaries, so it attends across the whole row, with labels
-100 at the unmasked positions. `transformers+sparse` is transformers with its own `sparse_prediction` (head and
decoder on the labelled rows only); `ours-nodoc` is ours without the boundaries (what the document masks cost);
`ours+sdpa`, `ours+jagged`, `ours+flex`, `ours+jagged+flex` are ours with other attention kernels
(`KERNEL_IMPLS`: `ModernBertConfig.global_attention_kernel` / `local_attention_kernel`; FlexAttention's train on a
GPU only). Rounds are interleaved, the order flipping each round (the machine is shared); the table gives medians.

    python bench/train/modernbert_step.py                          # modernbert-tiny, 4 rows x 1024, vocab 8000
    python bench/train/modernbert_step.py --preset modernbert-mini --rounds 3
    python bench/train/modernbert_step.py --threads 1 --attention  # the attention kernels compared

On a GPU (issue 61's rows; the lease's calls are in bench/gpu/gpu_step.sh, STEP_SET=modernbert):

    python bench/train/modernbert_step.py --device cuda --dtype bf16 --preset modernbert-base --rows 32 --seq 1024 \
        --vocab 50368 --impls transformers,ours,ours+jagged+flex --mfu --rounds 3 --steps 10
    python bench/train/modernbert_step.py --device cuda --dtype bf16 --preset modernbert-base --rows 32 --seq 1024 \
        --attention --attention-seqs 1024,8192 --json attention.jsonl

`--dtype bf16` runs forward and loss under autocast (weights and AdamW in fp32, as the training loop does);
`--mfu` adds model FLOPs (`model.flops.train_flops`: the documents as the attention spans, the masked rows through
the head) per second over the device's dense bf16 peak (`model.flops.dense_bf16_peak`, 989.4 TFLOP/s for an
H100/H200); on CUDA the table adds the peak memory (`torch.cuda.max_memory_allocated`) of each implementation's
steps, and each timing waits for the device (`torch.cuda.synchronize`).

`--attention` times the model's attention kernels (`model.modernbert.layer_mask` and `LayerMask.attend`, the
preset's heads) on the same packed rows, for a global layer and a local one, at each of --attention-seqs with
--rows x --seq tokens each: building the layer kind's mask from the document ids (once per batch, shared by the
kind's layers: 8 global and 14 local ones in modernbert-base), the first call (FlexAttention's compilation, once
per shape, on CUDA), the forward, the forward + backward, the peak memory on CUDA, and at the first length each
kernel's largest error against the reference attention written out in fp32 (outputs and dq, dk, dv; the check
that FlexAttention's backward, which the CPU lacks, is right on the GPU). Wall time on a synchronised GPU, this
process's CPU time on a CPU (use --threads 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

from model import ModernBertConfig, ModernBertForMaskedLM  # noqa: E402
from model.hf import save_hf  # noqa: E402
from model.modernbert import layer_mask  # noqa: E402
from model.segments import Segments  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure
from measure import interleaved  # noqa: E402

KERNEL_IMPLS = {
    "ours+sdpa": {"local_attention_kernel": "sdpa"},
    "ours+jagged": {"global_attention_kernel": "jagged"},
    "ours+flex": {"global_attention_kernel": "flex", "local_attention_kernel": "flex"},
    "ours+jagged+flex": {"global_attention_kernel": "jagged", "local_attention_kernel": "flex"},
}
"""Ours with other attention kernels than the default ("sdpa" global, "banded" local): `ModernBertConfig` fields."""
IMPLS = ("transformers", "transformers+sparse", "ours", "ours-nodoc", *KERNEL_IMPLS)
CPU_IMPLS = tuple(i for i in IMPLS if "flex" not in i)
"""What trains on a CPU (FlexAttention has no backward there in torch 2.13): the default --impls on one."""


def make_batch(rows: int, seq: int, vocab: int, mask_rate: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """Packed rows: documents of 50 to 600 tokens until each row is full; `mask_rate` of the tokens to predict.
    Returns input_ids (rows, seq), cu_seqlens (D+1,), masked_lm_positions/ids (rows, P) and labels (rows, seq)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (rows, seq), generator=g)
    bounds = [0]
    for r in range(rows):
        end = (r + 1) * seq
        while bounds[-1] < end:
            bounds.append(min(end, bounds[-1] + int(torch.randint(50, 600, (), generator=g))))
    P = int(seq * mask_rate)
    positions = torch.stack([torch.randperm(seq, generator=g)[:P].sort().values for _ in range(rows)])  # (rows, P)
    targets = ids.gather(1, positions)
    labels = torch.full_like(ids, -100).scatter(1, positions, targets)
    ids = ids.scatter(1, positions, 4)  # the [MASK] id of the project's vocabularies
    return {
        "input_ids": ids,
        "cu_seqlens": torch.tensor(bounds),
        "masked_lm_positions": positions,
        "masked_lm_ids": targets,
        "labels": labels,
    }


def build(impl: str, cfg: ModernBertConfig, directory: str) -> tuple[torch.nn.Module, Callable]:
    """The model and its loss function on a batch; transformers' models load our weights from `directory`."""
    if impl.startswith("transformers"):
        model = transformers.ModernBertForMaskedLM.from_pretrained(
            directory, attn_implementation="sdpa", sparse_prediction=impl.endswith("sparse")
        )
        # transformers 4.48-4.x compiled ModernBERT's MLP and head by itself on a GPU with triton when the config's
        # `reference_compile` was unset (its `_maybe_set_compile`, read at each forward); 5.23 has no such field. The
        # GPU image's 5.17 is unchecked, so the rows stay eager against eager whichever it is.
        model.config.reference_compile = False
        return model, lambda m, b: m(input_ids=b["input_ids"], labels=b["labels"]).loss
    model = ModernBertForMaskedLM(dataclasses.replace(cfg, **KERNEL_IMPLS.get(impl, {})))
    model.load_state_dict(torch.load(os.path.join(directory, "ours.pt"), weights_only=True))
    keys = ("masked_lm_positions", "masked_lm_ids") + (("cu_seqlens",) if impl != "ours-nodoc" else ())
    return model, lambda m, b: m(b["input_ids"], **{k: b[k] for k in keys}).loss


def time_steps(
    cfg: ModernBertConfig,
    batch: dict[str, torch.Tensor],
    rounds: int,
    steps: int,
    impls: tuple[str, ...] = IMPLS,
    device: str = "cpu",
    dtype: str = "fp32",
) -> tuple[dict[str, list], dict[str, float]]:
    """(wall, CPU) seconds per step of each implementation and round, `steps` timed steps per round after one
    warm-up step, and on CUDA each implementation's peak MiB ({} on a CPU). CPU time is this process's: on a shared
    machine it counts the work, not the waiting. On CUDA each timing waits for the device."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    with tempfile.TemporaryDirectory() as d:
        ref = ModernBertForMaskedLM(cfg)
        save_hf(ref, d)
        torch.save(ref.state_dict(), os.path.join(d, "ours.pt"))
        built = {impl: build(impl, cfg, d) for impl in impls}
    built = {impl: (m.to(dev), fn) for impl, (m, fn) in built.items()}
    batch = {k: v.to(dev) for k, v in batch.items()}
    opts = {
        impl: torch.optim.AdamW(m.parameters(), lr=1e-4, **({"fused": True} if cuda else {}))
        for impl, (m, _) in built.items()
    }
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dtype == "bf16")

    def step(impl: str) -> None:
        model, loss_fn = built[impl]
        with autocast:
            loss = loss_fn(model.train(), batch)
        loss.backward()
        opts[impl].step()
        opts[impl].zero_grad(set_to_none=True)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    peak: dict[str, float] = {}
    for impl in impls:
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        step(impl)
        sync()
        if cuda:
            peak[impl] = torch.cuda.max_memory_allocated(dev) / 2**20
    each = interleaved({impl: lambda impl=impl: step(impl) for impl in impls}, rounds, steps, sync=sync)
    times = {
        impl: [
            tuple(statistics.fmean(x[k] for x in t[r * steps : (r + 1) * steps]) for k in (0, 1)) for r in range(rounds)
        ]
        for impl, t in each.items()
    }  # each round's mean step
    return times, peak


def check_losses_agree(cfg: ModernBertConfig, batch: dict[str, torch.Tensor], device: str = "cpu") -> float:
    """|our loss - transformers' loss| on the batch's first two rows without document boundaries (same weights,
    eval mode, fp32, on `device`: a base model on a whole GPU batch would take minutes on the host)."""
    with tempfile.TemporaryDirectory() as d:
        ours = ModernBertForMaskedLM(cfg).eval()
        save_hf(ours, d)
        theirs = transformers.ModernBertForMaskedLM.from_pretrained(d, attn_implementation="sdpa").eval()
    ours, theirs = ours.to(device), theirs.to(device)
    b = {k: batch[k][:2].to(device) for k in ("input_ids", "masked_lm_positions", "masked_lm_ids", "labels")}
    with torch.no_grad():
        a = ours(b["input_ids"], masked_lm_positions=b["masked_lm_positions"], masked_lm_ids=b["masked_lm_ids"]).loss
        t = theirs(input_ids=b["input_ids"], labels=b["labels"]).loss
    return abs(float(a) - float(t))


KERNELS = {"global": ("sdpa", "jagged", "flex"), "local": ("banded", "sdpa", "flex")}
"""The attention kernels of each layer kind (`ModernBertConfig.global_attention_kernel`, `local_attention_kernel`),
the model's default first."""


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, doc: torch.Tensor, half: int | None, scale: float
) -> torch.Tensor:
    """Softmax attention written out, in fp32: each query over the keys of its own document (`doc` (B, L)), within
    `half` of it on a local layer; (B, nh, L, hd). What every kernel is checked against (tests/test_modernbert.py
    holds the same on the CPU)."""
    i = torch.arange(q.shape[2], device=q.device)
    allowed = (doc[:, :, None] == doc[:, None, :]) & (doc[:, None, :] >= 0)  # (B, L, L)
    if half is not None:
        allowed &= (i[:, None] - i[None, :]).abs() <= half
    scores = q.float() @ k.float().transpose(-1, -2) * scale  # (B, nh, L, L)
    return scores.masked_fill(~allowed[:, None], torch.finfo(torch.float).min).softmax(-1) @ v.float()


@dataclass
class AttentionRow:
    """One kernel of one layer kind at one length: what `--attention` prints and writes to --json."""

    seq: int
    rows: int
    kind: str
    kernel: str
    build_ms: float
    """Building the layer kind's mask from the document ids (`model.modernbert.layer_mask`): once per batch, shared
    by every layer of the kind."""
    first_s: float
    """The first forward + backward, warm-up and any compilation (FlexAttention's, once per shape) included."""
    forward_ms: float
    step_ms: float | None
    """Forward + backward; None where the device has no backward for the kernel (FlexAttention on a CPU)."""
    peak_mib: float | None
    """CUDA: the forward + backward's peak allocation above what was allocated before it (inputs, the mask); None
    on a CPU."""
    mask_mib: float | None
    """CUDA: what the built mask holds on the device (for the whole forward and backward); None on a CPU."""
    build_peak_mib: float | None
    """CUDA: the build's peak allocation above what was allocated before it; None on a CPU."""
    max_err: float | None
    """fp32, against `reference_attention` on two rows of this length: the largest |difference| of the output and of
    dq, dk, dv at the real tokens (the forward's alone where there is no backward); None when not checked."""


def attention_inputs(batch: dict[str, torch.Tensor], nh: int, hd: int, dtype: torch.dtype, device: torch.device):
    """(q, k, v) (B, nh, L, hd) as the model makes them (views of one (B, L, 3, nh, hd) projection), the leaf to
    take gradients of, the document ids (B, L) and the segments of the packed rows."""
    B, L = batch["input_ids"].shape
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(B, L, 3, nh, hd, generator=g).to(device=device, dtype=dtype).requires_grad_()
    q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
    segments = Segments(batch["cu_seqlens"].to(device=device, dtype=torch.int32), L)
    doc, _ = segments.layout(B, L)
    return (q, k, v), qkv, doc, segments


def measure_memory(fn: Callable[[], object], device: torch.device) -> tuple[float, float] | None:
    """CUDA: (MiB still allocated after fn(), its peak MiB above what was allocated before); None on a CPU."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    kept = fn()
    torch.cuda.synchronize(device)
    after, peak = torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)
    del kept
    return (after - before) / 2**20, (peak - before) / 2**20


def check_kernel(
    batch: dict[str, torch.Tensor], kind: str, kernel: str, half: int, nh: int, hd: int, device: torch.device
) -> float:
    """The kernel's largest |difference| from `reference_attention`, fp32, forward and (where the device runs it)
    backward, on the batch's first two rows."""
    two = {"input_ids": batch["input_ids"][:2], "cu_seqlens": batch["cu_seqlens"]}
    L = two["input_ids"].shape[1]
    two["cu_seqlens"] = batch["cu_seqlens"][batch["cu_seqlens"] <= 2 * L]
    (q, k, v), qkv, doc, segments = attention_inputs(two, nh, hd, torch.float32, device)
    h = half if kind == "local" else None
    mask = layer_mask(kernel, doc, h, True, None, segments)
    backward = kernel != "flex" or device.type != "cpu"
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(device)
    got = mask.attend(*((q, k, v) if backward else (q.detach(), k.detach(), v.detach())), 0.0, hd**-0.5)
    ref_in = qkv.detach().clone().requires_grad_()
    ref = reference_attention(*(t.transpose(1, 2) for t in ref_in.unbind(2)), doc, h, hd**-0.5)
    err = (got - ref).abs().max().item()
    if backward:
        got.backward(grad)
        ref.backward(grad)
        err = max(err, (qkv.grad - ref_in.grad).abs().max().item())
    return err


def attention_rows(
    batch: dict[str, torch.Tensor],
    cfg: ModernBertConfig,
    device: torch.device,
    dtype: torch.dtype,
    repeats: int = 3,
    check: bool = True,
) -> list[AttentionRow]:
    """Each kernel of each layer kind on the batch's packed rows, with the preset's heads: the mask's build, the
    first call, the forward and the forward + backward (median of `repeats` after the first call; wall time with the
    device synchronised on CUDA, this process's CPU time on a CPU), peak memory on CUDA, and the fp32 check."""
    B, L = batch["input_ids"].shape
    nh, hd, half = cfg.num_attention_heads, cfg.head_dim, cfg.local_attention // 2
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    pick = 0 if cuda else 1  # interleaved's (wall, CPU) seconds: wall on a synchronised GPU, CPU time on a CPU
    (q, k, v), qkv, doc, segments = attention_inputs(batch, nh, hd, dtype, device)
    grad = torch.randn(q.shape, device=device, dtype=dtype)
    out = []
    for kind, kernels in KERNELS.items():
        h = half if kind == "local" else None
        for kernel in kernels:

            def build(kernel=kernel, h=h):
                return layer_mask(kernel, doc, h, True, None, segments)

            held = measure_memory(build, device)
            mask = build()
            trains = kernel != "flex" or cuda

            def forward(mask=mask):
                with torch.no_grad():  # detached: FlexAttention on a CPU refuses inputs that want a gradient
                    return mask.attend(q.detach(), k.detach(), v.detach(), 0.0, hd**-0.5)

            def step(mask=mask):
                mask.attend(q, k, v, 0.0, hd**-0.5).backward(grad)
                qkv.grad = None

            sync()
            t = time.perf_counter()
            (step if trains else forward)()
            sync()
            first = time.perf_counter() - t
            used = measure_memory(step if trains else forward, device)
            fns = {"build": build, "forward": forward, **({"step": step} if trains else {})}
            times = interleaved(fns, 1, repeats, sync=sync)
            ms = {name: 1000 * statistics.median(x[pick] for x in t) for name, t in times.items()}
            err = check_kernel(batch, kind, kernel, half, nh, hd, device) if check else None
            out.append(
                AttentionRow(
                    L,
                    B,
                    kind,
                    kernel,
                    ms["build"],
                    first,
                    ms["forward"],
                    ms.get("step"),
                    used and used[1],
                    held and held[0],
                    held and held[1],
                    err,
                )
            )
    return out


def print_attention(rows: list[AttentionRow], device: str) -> None:
    clock = "ms (wall, synchronised)" if device.startswith("cuda") else "CPU ms"
    print(
        f"\n| length x rows | layer | kernel | mask build {clock} (once a batch) | first call s | forward {clock} "
        f"| forward + backward {clock} | peak MiB | mask MiB (build's peak) | max error, fp32 |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    mib = lambda x: "-" if x is None else f"{x:,.0f}"  # noqa: E731
    for r in rows:
        step = "no backward here" if r.step_ms is None else f"{r.step_ms:.2f}"
        err = "-" if r.max_err is None else f"{r.max_err:.1e}"
        mask = "-" if r.mask_mib is None else f"{r.mask_mib:,.0f} ({r.build_peak_mib:,.0f})"
        print(
            f"| {r.seq:,} x {r.rows} | {r.kind} | {r.kernel} | {r.build_ms:.2f} | {r.first_s:.1f} "
            f"| {r.forward_ms:.2f} | {step} | {mib(r.peak_mib)} | {mask} | {err} |"
        )


def main(argv: list[str] | None = None) -> dict[str, tuple[float, float]]:
    """Prints the table; returns {implementation: (median wall s, median CPU s)} ({} with --attention)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="modernbert-tiny")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8000, help="configs/tiny.yaml's trained WordPiece size")
    p.add_argument("--mask-rate", type=float, default=0.3)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=2, help="timed steps per implementation per round")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, one per core)")
    p.add_argument("--attention", action="store_true", help="time the attention kernels instead of the step")
    p.add_argument(
        "--attention-seqs",
        default="",
        help="with --attention: comma list of lengths (default --seq), each with --rows x --seq tokens",
    )
    p.add_argument("--no-check", action="store_true", help="with --attention: no fp32 check against the reference")
    p.add_argument("--json", help="with --attention: append one JSON line of the rows to this file")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument(
        "--dtype",
        default="fp32",
        choices=("fp32", "bf16"),
        help="bf16: forward and loss under autocast; with --attention, the inputs' dtype",
    )
    p.add_argument(
        "--impls",
        default=None,
        help=f"comma list of {', '.join(IMPLS)} (default: all on CUDA, {', '.join(CPU_IMPLS)} on a CPU)",
    )
    p.add_argument("--mfu", action="store_true", help="model FLOPs per second over the device's dense bf16 peak")
    args = p.parse_args(argv)
    impls = tuple(x for x in (args.impls or ",".join(CPU_IMPLS if args.device == "cpu" else IMPLS)).split(",") if x)
    bad = [x for x in impls if x not in IMPLS]
    if bad or not impls:
        p.error(f"--impls: unknown {', '.join(bad) or '(none given)'}; choose from {', '.join(IMPLS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModernBertConfig.from_preset(args.preset, vocab_size=args.vocab)
    batch = make_batch(args.rows, args.seq, args.vocab, args.mask_rate)
    print(
        f"{args.preset}, {args.rows} rows x {args.seq} tokens, {len(batch['cu_seqlens']) - 1} documents, "
        f"vocab {args.vocab}, {args.mask_rate:.0%} masked, {args.dtype}, {torch.get_num_threads()} threads, "
        f"device {device_name(args.device)}, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    if args.attention:
        attention(args, cfg)
        return {}
    if "transformers" in impls and "ours" in impls:
        gap = check_losses_agree(cfg, batch, args.device)
        print(f"loss check without documents: |ours - transformers| = {gap:.2e}")
    times, peak_mib = time_steps(cfg, batch, args.rounds, args.steps, impls, args.device, args.dtype)
    tokens = args.rows * args.seq
    wall = {impl: statistics.median(w for w, _ in times[impl]) for impl in impls}
    cpu = {impl: statistics.median(c for _, c in times[impl]) for impl in impls}
    ref = "transformers" if "transformers" in impls else impls[0]
    flops = peak = None
    if args.mfu:
        from model.flops import dense_bf16_peak, train_flops

        cu = batch["cu_seqlens"]
        flops = train_flops(cfg, (cu[1:] - cu[:-1]).tolist(), batch["masked_lm_positions"].numel())
        peak = dense_bf16_peak(device_name(args.device))
        if peak is None:
            print(f"no MFU: {device_name(args.device)} is not in model.flops.DENSE_BF16_PEAK")
    extra = (" | TFLOP/s | MFU" if flops else "") + (" | peak MiB" if peak_mib else "")
    print(
        f"\n| implementation | step s (median of {args.rounds}) | tokens/s | vs {ref} "
        f"| CPU s / step | vs {ref} (CPU time){extra} |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---:" + " | ---:" * extra.count("|") + " |")
    for impl in impls:
        cells = ""
        if flops:
            cells += f" | {flops / wall[impl] / 1e12:.1f} | " + (f"{flops / wall[impl] / peak:.1%}" if peak else "-")
        if peak_mib:
            cells += f" | {peak_mib[impl]:,.0f}"
        print(
            f"| {impl} | {wall[impl]:.3f} | {tokens / wall[impl]:,.0f} | {wall[ref] / wall[impl]:.2f}x "
            f"| {cpu[impl]:.3f} | {cpu[ref] / cpu[impl]:.2f}x{cells} |"
        )
    return {impl: (wall[impl], cpu[impl]) for impl in impls}


def attention(args: argparse.Namespace, cfg: ModernBertConfig) -> list[AttentionRow]:
    """--attention: the kernels at each length (the first one also checked in fp32), the table, the fastest kernel
    per layer kind and length, and the rows as one JSON line in --json."""
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    seqs = [int(x) for x in args.attention_seqs.split(",") if x] or [args.seq]
    rows: list[AttentionRow] = []
    for n, L in enumerate(seqs):
        batch = make_batch(max(1, args.rows * args.seq // L), L, args.vocab, args.mask_rate)
        rows += attention_rows(batch, cfg, device, dtype, check=n == 0 and not args.no_check)
    print_attention(rows, args.device)
    for L in seqs:
        for kind in KERNELS:
            mine = [r for r in rows if r.seq == L and r.kind == kind]
            best = min(mine, key=lambda r: (r.step_ms is None, r.step_ms or r.forward_ms))
            print(
                f"fastest {kind} kernel at {L:,}: {best.kernel} "
                f"({'forward + backward' if best.step_ms is not None else 'forward'})"
            )
    if args.json:
        with open(args.json, "a") as f:
            f.write(
                json.dumps(
                    {
                        "setting": {
                            "preset": args.preset,
                            "device": device_name(args.device),
                            "dtype": args.dtype,
                            "tokens": args.rows * args.seq,
                        },
                        "rows": [dataclasses.asdict(r) for r in rows],
                    }
                )
                + "\n"
            )
    return rows


def device_name(device: str) -> str:
    """The device as torch names it (a GPU's product name), or "cpu"."""
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"


if __name__ == "__main__":
    main()
