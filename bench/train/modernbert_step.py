"""CPU training step of the modern encoder: our ModernBertForMaskedLM against transformers' at the same shapes.

One step = forward + backward + AdamW step, fp32, same weights (copied through save_hf), same batch: rows packed to
--seq tokens from documents of random lengths, 30% of the tokens masked. Ours gets the document boundaries
(`cu_seqlens`: attention stays inside each document) and the masked positions (head and decoder on those rows
only); transformers' SDPA model takes no document boundaries, so it attends across the whole row, with labels
-100 at the unmasked positions. `transformers+sparse` is transformers with its own `sparse_prediction` (head and
decoder on the labelled rows only); `ours-nodoc` is ours without the boundaries (what the document masks cost).
Rounds are interleaved, the order flipping each round (the machine is shared); the table gives medians.

    python bench/train/modernbert_step.py                          # modernbert-tiny, 4 rows x 1024, vocab 8000
    python bench/train/modernbert_step.py --preset modernbert-mini --rounds 3
    python bench/train/modernbert_step.py --threads 1 --attention [--flex-compile]   # the attention kernels compared

On a GPU (the GPU issue's ModernBERT rows; the lease's call is in bench/gpu/gpu_step.sh, STEP_SET=modernbert):

    python bench/train/modernbert_step.py --device cuda --dtype bf16 --preset modernbert-base --rows 32 --seq 1024 \
        --vocab 50368 --impls transformers,ours --mfu --rounds 3 --steps 10

`--dtype bf16` runs forward and loss under autocast (weights and AdamW in fp32, as the training loop does);
`--mfu` adds model FLOPs (`model.flops.train_flops`: the documents as the attention spans, the masked rows through
the head) per second over the device's dense bf16 peak (`model.flops.dense_bf16_peak`, 989.4 TFLOP/s for an
H100/H200); on CUDA the table adds the peak memory (`torch.cuda.max_memory_allocated`) of each implementation's
steps, and each timing waits for the device (`torch.cuda.synchronize`).

`--attention` times one attention call (2 heads of 64, the same packed rows) for each way the issue named:
SDPA with the document (+ window) boolean mask per row, which the model uses; SDPA on jagged tensors (documents as
rows: global layers only, it takes no mask, so no window); FlexAttention with a document (+ window) BlockMask,
eager, or compiled with --flex-compile (forward only: in torch 2.13 it has no backward on the CPU).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402

from model import ModernBertConfig, ModernBertForMaskedLM  # noqa: E402
from model.hf import save_hf  # noqa: E402
from model.modernbert import attention_masks, layer_mask  # noqa: E402
from model.segments import Segments  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure
from measure import interleaved  # noqa: E402

IMPLS = ("transformers", "transformers+sparse", "ours", "ours-nodoc")


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
    return {"input_ids": ids, "cu_seqlens": torch.tensor(bounds), "masked_lm_positions": positions,
            "masked_lm_ids": targets, "labels": labels}


def build(impl: str, cfg: ModernBertConfig, directory: str) -> tuple[torch.nn.Module, Callable]:
    """The model and its loss function on a batch; transformers' models load our weights from `directory`."""
    if impl.startswith("transformers"):
        model = transformers.ModernBertForMaskedLM.from_pretrained(
            directory, attn_implementation="sdpa", sparse_prediction=impl.endswith("sparse"))
        # transformers 4.48-4.x compiled ModernBERT's MLP and head by itself on a GPU with triton when the config's
        # `reference_compile` was unset (its `_maybe_set_compile`, read at each forward); 5.23 has no such field. The
        # GPU image's 5.17 is unchecked, so the rows stay eager against eager whichever it is.
        model.config.reference_compile = False
        return model, lambda m, b: m(input_ids=b["input_ids"], labels=b["labels"]).loss
    model = ModernBertForMaskedLM(cfg)
    model.load_state_dict(torch.load(os.path.join(directory, "ours.pt"), weights_only=True))
    keys = ("masked_lm_positions", "masked_lm_ids") + (("cu_seqlens",) if impl == "ours" else ())
    return model, lambda m, b: m(b["input_ids"], **{k: b[k] for k in keys}).loss


def time_steps(cfg: ModernBertConfig, batch: dict[str, torch.Tensor], rounds: int, steps: int,
               impls: tuple[str, ...] = IMPLS, device: str = "cpu",
               dtype: str = "fp32") -> tuple[dict[str, list], dict[str, float]]:
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
    opts = {impl: torch.optim.AdamW(m.parameters(), lr=1e-4, **({"fused": True} if cuda else {}))
            for impl, (m, _) in built.items()}
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
    times = {impl: [tuple(statistics.fmean(x[k] for x in t[r * steps:(r + 1) * steps]) for k in (0, 1))
                    for r in range(rounds)] for impl, t in each.items()}  # each round's mean step
    return times, peak


def check_losses_agree(cfg: ModernBertConfig, batch: dict[str, torch.Tensor]) -> float:
    """|our loss - transformers' loss| on the batch without document boundaries (same weights, eval mode)."""
    with tempfile.TemporaryDirectory() as d:
        ours = ModernBertForMaskedLM(cfg).eval()
        save_hf(ours, d)
        theirs = transformers.ModernBertForMaskedLM.from_pretrained(d, attn_implementation="sdpa").eval()
    with torch.no_grad():
        a = ours(batch["input_ids"], masked_lm_positions=batch["masked_lm_positions"],
                 masked_lm_ids=batch["masked_lm_ids"]).loss
        b = theirs(input_ids=batch["input_ids"], labels=batch["labels"]).loss
    return abs(float(a) - float(b))


def median_ms(fn: Callable[[], torch.Tensor], backward: bool, repeats: int = 3) -> float:
    """Median CPU milliseconds of fn() (and .sum().backward() when `backward`), after one warm-up call: this
    process's CPU time, which on a shared machine counts the work and not the waiting (use --threads 1)."""
    def once() -> None:
        out = fn()
        if backward:
            out.sum().backward()
    once()
    return 1000 * statistics.median(cpu for _, cpu in interleaved({"fn": once}, 1, repeats)["fn"])


def attention_table(batch: dict[str, torch.Tensor], cfg: ModernBertConfig, flex_compile: bool) -> None:
    """Prints ms of one attention call, forward and forward+backward, per kernel and layer kind."""
    B, L = batch["input_ids"].shape
    nh, hd, half = 2, 64, cfg.local_attention // 2
    q, k, v = (torch.randn(B, nh, L, hd, requires_grad=True) for _ in range(3))
    doc, _ = Segments(batch["cu_seqlens"], L).layout(B, L)
    masks = attention_masks(cfg, B, L, torch.device("cpu"), None, doc)
    cu = batch["cu_seqlens"]
    flat = doc.flatten()

    def jagged() -> torch.Tensor:  # documents as the rows of (D, nh, j, hd) nested tensors
        return layer_mask("jagged", doc, None, True, None, Segments(cu, L)).attend(q, k, v, 0.0, hd ** -0.5)

    def flex_mask(window: bool):
        def mask_mod(b, h, qi, ki):
            same = flat[b * L + qi] == flat[b * L + ki]
            return same & ((qi - ki).abs() <= half) if window else same
        return create_block_mask(mask_mod, B, None, L, L, device="cpu")

    flex = torch.compile(flex_attention, dynamic=False) if flex_compile else flex_attention
    i = torch.arange(L)
    dense_local = masks["full_attention"].mask & ((i[:, None] - i[None, :]).abs() <= half)  # (B, 1, L, L)
    kind = "flex compiled" if flex_compile else "flex eager"
    rows = [("global: SDPA + boolean document mask (chosen)",
             lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=masks["full_attention"].mask), True),
            ("global: SDPA, no mask (rows not packed)", lambda: F.scaled_dot_product_attention(q, k, v), True),
            ("global: SDPA on jagged tensors (documents as rows)", jagged, True),
            (f"global: FlexAttention, document BlockMask ({kind})",
             lambda b=flex_mask(False): flex(q.detach(), k.detach(), v.detach(), block_mask=b), False),
            ("local: banded SDPA, chunks of 64 against 192 keys (chosen)",
             lambda: masks["sliding_attention"].attend(q, k, v, 0.0, hd ** -0.5), True),
            ("local: SDPA + boolean document & window mask (L x L)",
             lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense_local), True),
            ("local: SDPA on jagged tensors", None, False),
            (f"local: FlexAttention, document & window BlockMask ({kind})",
             lambda b=flex_mask(True): flex(q.detach(), k.detach(), v.detach(), block_mask=b), False)]
    print("\n| attention (one call) | forward CPU ms | forward + backward CPU ms |\n| --- | ---: | ---: |")
    for name, fn, trains in rows:
        if fn is None:
            print(f"| {name} | takes no mask: no window | |")
            continue
        fwd = median_ms(lambda f=fn: f().detach(), backward=False)
        both = f"{median_ms(fn, backward=True):.1f}" if trains else "no CPU backward"
        print(f"| {name} | {fwd:.1f} | {both} |")


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
    p.add_argument("--flex-compile", action="store_true", help="with --attention: compile FlexAttention (slow)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="bf16: forward and loss under autocast")
    p.add_argument("--impls", default=",".join(IMPLS), help=f"comma list of {', '.join(IMPLS)}")
    p.add_argument("--mfu", action="store_true", help="model FLOPs per second over the device's dense bf16 peak")
    args = p.parse_args(argv)
    impls = tuple(x for x in args.impls.split(",") if x)
    bad = [x for x in impls if x not in IMPLS]
    if bad or not impls:
        p.error(f"--impls: unknown {', '.join(bad) or '(none given)'}; choose from {', '.join(IMPLS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModernBertConfig.from_preset(args.preset, vocab_size=args.vocab)
    batch = make_batch(args.rows, args.seq, args.vocab, args.mask_rate)
    print(f"{args.preset}, {args.rows} rows x {args.seq} tokens, {len(batch['cu_seqlens']) - 1} documents, "
          f"vocab {args.vocab}, {args.mask_rate:.0%} masked, {args.dtype}, {torch.get_num_threads()} threads, "
          f"device {device_name(args.device)}, torch {torch.__version__}, transformers {transformers.__version__}")
    if args.attention:
        attention_table(batch, cfg, args.flex_compile)
        return {}
    if "transformers" in impls and "ours" in impls:
        print(f"loss check without documents: |ours - transformers| = {check_losses_agree(cfg, batch):.2e}")
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
    print(f"\n| implementation | step s (median of {args.rounds}) | tokens/s | vs {ref} "
          f"| CPU s / step | vs {ref} (CPU time){extra} |")
    print("| --- | ---: | ---: | ---: | ---: | ---:" + " | ---:" * extra.count("|") + " |")
    for impl in impls:
        cells = ""
        if flops:
            cells += f" | {flops / wall[impl] / 1e12:.1f} | " + (f"{flops / wall[impl] / peak:.1%}" if peak else "-")
        if peak_mib:
            cells += f" | {peak_mib[impl]:,.0f}"
        print(f"| {impl} | {wall[impl]:.3f} | {tokens / wall[impl]:,.0f} | {wall[ref] / wall[impl]:.2f}x "
              f"| {cpu[impl]:.3f} | {cpu[ref] / cpu[impl]:.2f}x{cells} |")
    return {impl: (wall[impl], cpu[impl]) for impl in impls}


def device_name(device: str) -> str:
    """The device as torch names it (a GPU's product name), or "cpu"."""
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"


if __name__ == "__main__":
    main()
