"""Pretraining on Ray Train: optimizers (AdamW, LAMB), the LR schedule, the data feed, the loop, checkpoints.

Pure pieces first (`lr_lambda`, `make_optimizer`, `Lamb`, `collate`, `rank_row_ranges`, `epoch_micro_batches`),
then the loop that runs in every worker (`train_loop_per_worker`), the driver (`run_training`) and the stage
bodies used by `pipeline.dag.pretrain_stages` (train -> evaluate -> register).

Data order, and why resumption is exact: Ray Data's `streaming_split` hands blocks to whichever worker asks
first, so it cannot say where a worker was. Instead the driver cuts the training shards (the last
`train.num_eval_shards` are held out) into one contiguous, equal row range per rank and gives each rank its own
Ray Dataset (`read_parquet`, `preserve_order`), read with `get_dataset_shard("p<phase>_r<rank>")`. Each epoch a
rank permutes its rows in chunks of `train.shuffle_buffer_rows` with an RNG seeded by (seed, phase, epoch, rank,
chunk) and masks them (dynamic masking) as a function of (seed, epoch, example_id). A worker's position is then
just (phase, epoch, micro-batch index); a checkpoint stores it with the weights, optimizer, scheduler, scaler and
every RNG state, so a restarted worker skips to exactly the next micro-batch. Departure: shuffling is within a
rank's range, not global (shards are written in corpus order), which is weaker mixing than a global shuffle.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterable, Iterator, Literal, Sequence

import numpy as np
import torch
from torch import nn


# --------------------------------------------------------------------------------------------------------------
# Learning-rate schedule
# --------------------------------------------------------------------------------------------------------------
def lr_lambda(
    step: int,
    warmup_steps: int,
    total_steps: int,
    schedule: Literal["linear", "polynomial", "constant"] = "linear",
    power: float = 1.0,
) -> float:
    """LR multiplier after `step` optimizer steps: linear warmup to 1, then linear or polynomial decay to 0.

    Same convention as transformers' `get_linear_schedule_with_warmup` (and Google's BERT): step 0 is 0.

    >>> [round(lr_lambda(s, 2, 6), 3) for s in range(7)]
    [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0]
    >>> round(lr_lambda(4, 2, 6, "polynomial", power=2.0), 3)
    0.25
    """
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    if schedule == "constant":
        return 1.0
    remaining = max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return remaining
    if schedule == "polynomial":
        return remaining**power
    raise ValueError(f"unknown schedule {schedule!r} (linear, polynomial, constant)")


# --------------------------------------------------------------------------------------------------------------
# Optimizers
# --------------------------------------------------------------------------------------------------------------
class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning"), the BERT-large-in-76-minutes optimizer.

    Adam's bias-corrected update `u = m_hat / (sqrt(v_hat) + eps) + wd * w`, scaled per tensor by the trust ratio
    `||w|| / ||u||` (1 when either norm is 0). As in NVIDIA's and timm's implementations the trust ratio is applied
    only to tensors that get weight decay (not biases/LayerNorm), where it is meaningful.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.0):
        if lr <= 0:
            raise ValueError(f"lr {lr} must be > 0")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            wd = group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                # Half-precision params keep fp32 moments; fp32/fp64 ones compute in their own dtype.
                dtype = torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype
                g = p.grad.to(dtype)
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=dtype)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype)
                state["step"] += 1
                t = state["step"].item()
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                m_hat = m / (1 - beta1**t)
                v_hat = v / (1 - beta2**t)
                w = p.to(dtype)
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if wd != 0:
                    update = update + wd * w
                    w_norm, u_norm = w.norm(), update.norm()
                    trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                else:
                    trust = torch.ones((), dtype=dtype)
                p.add_((-group["lr"] * trust * update).to(p.dtype))
        return loss


def _no_decay(name: str, param: nn.Parameter) -> bool:
    # Biases and LayerNorm weights are 1-D; decaying them hurts (Google's BERT excludes "LayerNorm", "bias").
    return param.ndim < 2 or "LayerNorm" in name or "layer_norm" in name or name.endswith(".bias")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed (matrices, embeddings) and not decayed (biases, LayerNorm)."""
    decay, no_decay = [], []
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:  # tied weights appear once
            continue
        seen.add(id(p))
        (no_decay if _no_decay(name, p) else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_optimizer(model: nn.Module, name: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW or LAMB over `model`'s parameters, with no weight decay on biases and LayerNorm.

    >>> opt = make_optimizer(nn.Linear(4, 2), "adamw", 1e-3, 0.01)
    >>> [g["weight_decay"] for g in opt.param_groups], [len(g["params"]) for g in opt.param_groups]
    ([0.01, 0.0], [1, 1])
    """
    groups = param_groups(model, weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6)
    if name == "lamb":
        return Lamb(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6)
    raise ValueError(f"unknown optimizer {name!r} (adamw, lamb)")


# --------------------------------------------------------------------------------------------------------------
# Batches: padding to the batch's longest sequence
# --------------------------------------------------------------------------------------------------------------
def pad_rows(rows: Sequence[np.ndarray], pad: int, dtype=np.int64) -> np.ndarray:
    """Right-pad variable-length rows to the longest one.

    >>> pad_rows([np.array([1, 2, 3]), np.array([4])], 0).tolist()
    [[1, 2, 3], [4, 0, 0]]
    """
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    width = int(lengths.max()) if len(rows) else 0
    out = np.full((len(rows), width), pad, dtype=dtype)
    if width:
        out[np.arange(width)[None, :] < lengths[:, None]] = np.concatenate([np.asarray(r) for r in rows])
    return out


def collate(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Rows (dict of column -> sequence of int arrays) -> padded tensors for `BertForPreTraining`.

    Sequences are padded with 0 ([PAD]) to the longest in this batch (not to max_seq_length), masked positions
    and labels with -1 (ignored by the model); `num_tokens` counts real tokens for throughput.

    >>> b = collate({"input_ids": [np.array([2, 5, 3]), np.array([2, 3])], "token_type_ids": [np.zeros(3), np.zeros(2)],
    ...              "masked_lm_positions": [np.array([1]), np.array([], np.int32)],
    ...              "masked_lm_ids": [np.array([7]), np.array([], np.int32)], "next_sentence_label": np.array([0, -1])})
    >>> b["input_ids"].tolist(), b["attention_mask"].tolist(), b["masked_lm_positions"].tolist(), b["num_tokens"].item()
    ([[2, 5, 3], [2, 3, 0]], [[1, 1, 1], [1, 1, 0]], [[1], [-1]], 5)
    """
    ids = pad_rows(batch["input_ids"], 0)  # (B, L)
    lengths = np.fromiter((len(r) for r in batch["input_ids"]), dtype=np.int64)
    mask = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64)  # (B, L)
    positions = pad_rows(batch["masked_lm_positions"], -1)  # (B, P)
    if positions.shape[1] == 0:  # no masked position in the whole batch: keep a (B, 1) all-ignored column
        positions = np.full((len(ids), 1), -1, dtype=np.int64)
    labels = pad_rows(batch["masked_lm_ids"], -1)
    if labels.shape[1] == 0:
        labels = np.full((len(ids), 1), -1, dtype=np.int64)
    return {
        "input_ids": torch.from_numpy(ids),
        "token_type_ids": torch.from_numpy(pad_rows(batch["token_type_ids"], 0)),
        "attention_mask": torch.from_numpy(mask),
        "masked_lm_positions": torch.from_numpy(positions),
        "masked_lm_ids": torch.from_numpy(labels),
        "next_sentence_label": torch.as_tensor(np.asarray(batch["next_sentence_label"], dtype=np.int64)),
        "num_tokens": torch.tensor(int(lengths.sum())),
    }


def arrow_rows(table) -> dict[str, Any]:
    """A pyarrow Table -> {column: list of numpy arrays (list columns) or a numpy array (scalars)}."""
    import pyarrow as pa

    out: dict[str, Any] = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            values = col.flatten().to_numpy(zero_copy_only=False)
            bounds = np.concatenate([[0], np.cumsum(col.value_lengths().fill_null(0).to_numpy(zero_copy_only=False))])
            out[name] = [values[bounds[i] : bounds[i + 1]] for i in range(len(col))]
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


# --------------------------------------------------------------------------------------------------------------
# Deterministic data order: each rank reads a fixed row range, shuffled per epoch in fixed-size chunks
# --------------------------------------------------------------------------------------------------------------
def rank_row_ranges(file_rows: Sequence[int], world_size: int) -> list[dict[str, Any]]:
    """Split the concatenated rows of `file_rows` into `world_size` equal contiguous ranges (remainder dropped).

    Each range says which files it touches, how many rows to skip at the start of the first, and how many rows
    it has, so every rank runs the same number of steps and no row is read by two ranks.

    >>> rank_row_ranges([5, 5, 4], 2)
    [{'files': [0, 1], 'skip': 0, 'rows': 7}, {'files': [1, 2], 'skip': 2, 'rows': 7}]
    """
    total = sum(file_rows)
    per = total // world_size
    starts = np.concatenate([[0], np.cumsum(file_rows)])
    out = []
    for r in range(world_size):
        a, b = r * per, (r + 1) * per
        files = [i for i in range(len(file_rows)) if starts[i] < b and starts[i + 1] > a and file_rows[i] > 0]
        out.append({"files": files, "skip": int(a - starts[files[0]]) if files else 0, "rows": per})
    return out


def epoch_micro_batches(
    tables: Iterable[Any],
    *,
    skip: int,
    num_rows: int,
    chunk_rows: int,
    micro_batch_size: int,
    seed_key: Sequence[int],
    start: int = 0,
) -> Iterator[tuple[int, Any]]:
    """Yield `(index, micro_batch_table)` for one rank and epoch, from micro-batch `start` on.

    The rank's rows are `num_rows` rows after the first `skip` of the stream `tables` (pyarrow tables in a fixed
    order). They are cut into chunks of `chunk_rows`; each chunk is permuted by an RNG seeded with
    `(*seed_key, chunk_index)` — so the order is a pure function of the seed, the epoch and the rank, and
    resuming at micro-batch `start` reproduces exactly the batches an uninterrupted run would have seen.
    Chunks entirely before `start` are skipped without being permuted. The last partial micro-batch is dropped.

    >>> import pyarrow as pa
    >>> t = [pa.table({"x": list(range(10))})]
    >>> [b["x"].to_pylist() for _, b in epoch_micro_batches(t, skip=1, num_rows=8, chunk_rows=8, micro_batch_size=3, seed_key=[0])]
    [[3, 5, 4], [7, 6, 1]]
    >>> [b["x"].to_pylist() for _, b in epoch_micro_batches(t, skip=1, num_rows=8, chunk_rows=8, micro_batch_size=3, seed_key=[0], start=1)]
    [[7, 6, 1]]
    """
    import pyarrow as pa

    num_micro = num_rows // micro_batch_size
    first_row = start * micro_batch_size  # first row (in permuted order) still to be yielded
    pending: list[Any] = []  # tables of the current chunk, in stream order
    pending_rows = 0
    carry = None  # permuted rows not yet yielded
    index = start
    consumed = -skip  # rows of the rank range seen so far (negative while skipping the head)
    chunk = 0

    def stream():
        nonlocal consumed
        for t in tables:
            n = t.num_rows
            lo = max(0, -consumed)  # rows of this table still in the skipped head
            hi = min(n, num_rows - consumed)
            consumed += n
            if hi > lo:
                yield t.slice(lo, hi - lo)
            if consumed >= num_rows:
                return

    for t in stream():
        pending.append(t)
        pending_rows += t.num_rows
        while pending_rows >= chunk_rows or (consumed >= num_rows and pending_rows > 0):
            whole = pa.concat_tables(pending)
            n = min(chunk_rows, whole.num_rows)
            piece, rest = whole.slice(0, n), whole.slice(n)
            pending, pending_rows = ([rest] if rest.num_rows else []), rest.num_rows
            chunk_start = chunk * chunk_rows
            chunk += 1
            if chunk_start + n <= first_row:
                continue  # entirely before the resume point
            perm = np.random.default_rng([*map(int, seed_key), chunk - 1]).permutation(n)
            piece = piece.take(pa.array(perm))
            if chunk_start < first_row:
                piece = piece.slice(first_row - chunk_start)
            carry = piece if carry is None else pa.concat_tables([carry, piece])
            while carry.num_rows >= micro_batch_size and index < num_micro:
                yield index, carry.slice(0, micro_batch_size)
                carry = carry.slice(micro_batch_size)
                index += 1
            if index >= num_micro:
                return


# --------------------------------------------------------------------------------------------------------------
# The data plan (driver): which files each rank reads in each phase
# --------------------------------------------------------------------------------------------------------------
def shard_files(manifest: dict[str, Any], output: str) -> list[tuple[str, int]]:
    """[(absolute path or URI, rows)] of a prepared dataset's shards, in manifest order."""
    out = []
    for s in manifest["shards"]:
        p = s["path"]
        if "://" not in p and not p.startswith("/"):
            p = f"{output.rstrip('/')}/{p}"
        out.append((p, int(s["rows"])))
    return out


def data_plan(phase_data: list[dict[str, Any]], train_cfg, num_workers: int) -> list[dict[str, Any]]:
    """Per phase: train files split into equal per-rank row ranges, the held-out eval files, masking mode.

    `phase_data[i]` is the data stages' result for phase i ({"output", "manifest", ...}).
    """
    from pipeline.shards import read_manifest

    plan = []
    steps = train_cfg.phase_steps()
    for i, d in enumerate(phase_data):
        output = d["output"]
        manifest = read_manifest(output)
        files = shard_files(manifest, output)
        n_eval = min(train_cfg.num_eval_shards, max(0, len(files) - 1))
        train_files, eval_files = files[: len(files) - n_eval], files[len(files) - n_eval :]
        ranges = rank_row_ranges([r for _, r in train_files], num_workers)
        ph = train_cfg.phases[i] if train_cfg.phases else None
        mb = (ph.micro_batch_size if ph and ph.micro_batch_size else None) or train_cfg.micro_batch_size
        gb = (ph.global_batch_size if ph and ph.global_batch_size else None) or train_cfg.global_batch_size
        if ranges[0]["rows"] < mb:
            raise ValueError(
                f"{output}: {ranges[0]['rows']} training rows per worker is less than one micro-batch of {mb}"
            )
        plan.append({
            "output": output,
            "steps": steps[i],
            "micro_batch_size": mb,
            "accumulation_steps": gb // (mb * num_workers),
            "dynamic_masking": manifest["config"].get("masking") == "dynamic",
            "ranks": [{"files": [train_files[j][0] for j in r["files"]], "skip": r["skip"], "rows": r["rows"]} for r in ranges],
            "train_files": [p for p, _ in train_files],
            "train_rows": sum(r for _, r in train_files),
            "materialized": False,
            "eval_files": [p for p, _ in eval_files],
            "eval_rows": sum(r for _, r in eval_files),
        })
    return plan


# --------------------------------------------------------------------------------------------------------------
# Checkpoints: weights (safetensors), optimizer/scheduler/scaler, train state, and per-rank RNG + data position
# --------------------------------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    import json
    import random

    st = {
        "torch": torch.get_rng_state(),
        "numpy": json.dumps(np.random.get_state(legacy=False), default=lambda a: a.tolist()),
        "python": json.dumps(random.getstate()),
    }
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict[str, Any]) -> None:
    import json
    import random

    torch.set_rng_state(st["torch"])
    np.random.set_state(json.loads(st["numpy"]))
    py = json.loads(st["python"])
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def save_checkpoint(path: str, rank: int, model, optimizer, scheduler, scaler, state: dict[str, Any]) -> None:
    """Rank 0 writes the shared state; every rank writes its own RNG states and data position."""
    import json

    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    if rank == 0:
        sd = {k: v.detach().cpu().contiguous().clone() for k, v in unwrap(model).state_dict().items()}
        save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        torch.save(
            {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "scaler": scaler.state_dict() if scaler is not None else None},
            os.path.join(path, "optimizer.pt"),
        )
        with open(os.path.join(path, "train_state.json"), "w") as f:
            json.dump({k: v for k, v in state.items() if k != "position"}, f)
    torch.save({"rng": rng_state(), "position": state["position"]}, os.path.join(path, f"rank_{rank}.pt"))


def load_checkpoint(path: str, rank: int, model, optimizer, scheduler, scaler) -> dict[str, Any]:
    """Restore everything `save_checkpoint` wrote; returns the train state with this rank's data position."""
    import json

    from safetensors.torch import load_file

    unwrap(model).load_state_dict(load_file(os.path.join(path, "model.safetensors")))
    opt = torch.load(os.path.join(path, "optimizer.pt"), map_location="cpu", weights_only=True)
    optimizer.load_state_dict(opt["optimizer"])
    scheduler.load_state_dict(opt["scheduler"])
    if scaler is not None and opt["scaler"]:
        scaler.load_state_dict(opt["scaler"])
    with open(os.path.join(path, "train_state.json")) as f:
        state = json.load(f)
    mine = torch.load(os.path.join(path, f"rank_{rank}.pt"), map_location="cpu", weights_only=True)
    set_rng_state(mine["rng"])
    state["position"] = mine["position"]
    return state


def unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)


# --------------------------------------------------------------------------------------------------------------
# One step and one evaluation
# --------------------------------------------------------------------------------------------------------------
def autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def forward(model: nn.Module, batch: dict[str, torch.Tensor], device: torch.device, precision: str):
    inputs = {k: v.to(device, non_blocking=True) for k, v in batch.items() if k != "num_tokens"}
    with autocast(device, precision):
        return model(**inputs)


def _counts(out) -> torch.Tensor:
    """(mlm_loss_sum, mlm_correct, mlm_count, nsp_loss_sum, nsp_correct, nsp_count) of one forward, float64."""
    mc, nc = out.mlm_count.double(), out.nsp_count.double()
    return torch.stack([out.mlm_loss.detach().double() * mc, out.mlm_correct.double(), mc,
                        out.nsp_loss.detach().double() * nc, out.nsp_correct.double(), nc])


def _summarise(c: torch.Tensor, prefix: str = "") -> dict[str, float]:
    mlm_loss = (c[0] / c[2].clamp(min=1)).item()
    nsp_loss = (c[3] / c[5].clamp(min=1)).item()
    return {f"{prefix}loss": mlm_loss + nsp_loss, f"{prefix}mlm_loss": mlm_loss, f"{prefix}nsp_loss": nsp_loss,
            f"{prefix}mlm_accuracy": (c[1] / c[2].clamp(min=1)).item(),
            f"{prefix}nsp_accuracy": (c[4] / c[5].clamp(min=1)).item()}


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], device: torch.device,
             precision: str = "fp32", all_reduce: bool = False) -> dict[str, float]:
    """Masked-LM loss/accuracy and NSP loss/accuracy summed over `batches` (and over ranks when `all_reduce`)."""
    was_training = model.training
    model.eval()
    c = torch.zeros(6, dtype=torch.float64)
    for b in batches:
        c += _counts(forward(model, b, device, precision)).cpu()
    if all_reduce:
        import torch.distributed as dist

        c = c.to(device)
        dist.all_reduce(c)
        c = c.cpu()
    model.train(was_training)
    return {**_summarise(c, "eval_"), "eval_masked_tokens": c[2].item()}


# --------------------------------------------------------------------------------------------------------------
# The loop (runs in every Ray Train worker)
# --------------------------------------------------------------------------------------------------------------
def config_from_dict(d: dict[str, Any]):
    from pipeline.config import SECTIONS, Config, build_section

    return Config(**{name: build_section(cls, d.get(name), name) for name, cls in SECTIONS.items()})


def build_model(cfg, vocab_size: int) -> nn.Module:
    from model import BertConfig, BertForPreTraining

    overrides = {**cfg.model.overrides, "vocab_size": vocab_size}
    return BertForPreTraining(BertConfig.from_preset(cfg.model.preset, **overrides))


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Pretrain with DDP; resumes from `ray.train.get_checkpoint()` exactly (weights, optimizer, RNGs, data)."""
    import signal
    import tempfile
    import time

    import ray.data
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    from pipeline.tracking import RunLogger

    cfg, plan = config_from_dict(config["cfg"]), config["plan"]
    tc = cfg.train
    ray.data.DataContext.get_current().enable_progress_bars = False  # progress is the per-step MLflow metrics
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(max(1, int(tc.cpus_per_worker)))  # fixed thread count: bit-identical CPU math on restart
    device = ray.train.torch.get_device()

    torch.manual_seed(tc.seed)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
    model = ray.train.torch.prepare_model(build_model(cfg, config["vocab_size"]))
    optimizer = make_optimizer(model, tc.optimizer, tc.lr, tc.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_lambda(s, tc.warmup_steps, tc.max_steps, tc.schedule, tc.poly_power)
    )
    scaler = torch.amp.GradScaler(device.type) if tc.precision == "fp16" else None
    state: dict[str, Any] = {"step": 0, "position": {"phase": 0, "epoch": 0, "micro": 0}}
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = load_checkpoint(d, rank, model, optimizer, scheduler, scaler)
        print(f"[rank {rank}] resumed at step {state['step']} position {state['position']}", flush=True)
    else:
        torch.manual_seed(tc.seed * 1000 + rank + 1)  # each rank its own dropout stream
    logger = RunLogger(config["run_id"], config["tracking_uri"], cfg.tracking.system_metrics_every_s) if rank == 0 else None
    nodes = [ray.get_runtime_context().get_node_id()] * world
    if world > 1:
        dist.all_gather_object(nodes, nodes[0])
    if logger is not None:  # where the workers ran: a multi-node run shows num_nodes > 1
        logger.set_tags({"world_size": world, "num_nodes": len(set(nodes)), "device": str(device)})
    policies: dict[int, Any] = {}

    def rows_to_batch(phase: int, tbl, epoch: int) -> dict[str, torch.Tensor]:
        rows = arrow_rows(tbl)
        if plan[phase]["dynamic_masking"]:  # a fresh mask per epoch, a function of (seed, epoch, example_id)
            from pipeline.masking import MaskingPolicy, mask_batch

            if phase not in policies:
                policies[phase] = MaskingPolicy.from_manifest(plan[phase]["output"])
            rows = mask_batch(rows, policies[phase], seed=tc.seed, epoch=epoch)
        return collate(rows)

    def train_batches(pos: dict[str, int]) -> Iterator[tuple[dict[str, int], dict[str, torch.Tensor]]]:
        phase, p = pos["phase"], plan[pos["phase"]]
        mine, mb = p["ranks"][rank], p["micro_batch_size"]
        shard = ray.train.get_dataset_shard(f"p{phase}_r{rank}")
        epoch, start = pos["epoch"], pos["micro"]
        while True:
            if start < mine["rows"] // mb:
                tables = shard.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2)
                for idx, tbl in epoch_micro_batches(
                    tables, skip=0 if p["materialized"] else mine["skip"], num_rows=mine["rows"], chunk_rows=tc.shuffle_buffer_rows,
                    micro_batch_size=mb, seed_key=[tc.seed, phase, epoch, rank], start=start,
                ):
                    yield {"phase": phase, "epoch": epoch, "micro": idx + 1}, rows_to_batch(phase, tbl, epoch)
            epoch, start = epoch + 1, 0

    eval_cache: dict[int, list[dict[str, torch.Tensor]]] = {}

    def eval_batches(phase: int) -> list[dict[str, torch.Tensor]]:
        """This rank's share of the held-out batches (fixed masks), read once per phase and kept in memory."""
        if phase in eval_cache:
            return eval_cache[phase]
        p, out = plan[phase], []
        if p["eval_files"]:
            shard = ray.train.get_dataset_shard(f"p{phase}_eval")
            for i, tbl in enumerate(shard.iter_batches(batch_size=p["micro_batch_size"], batch_format="pyarrow")):
                if tc.eval_batches and i >= tc.eval_batches * world:
                    break
                if i % world == rank:  # ranks take turns; their sums are all-reduced
                    out.append(rows_to_batch(phase, tbl, 0))
        eval_cache[phase] = out
        return out

    def log(metrics: dict[str, float], step: int) -> None:
        if logger is not None:
            logger.log_metrics(metrics, step)

    ends = np.cumsum([p["steps"] for p in plan]).tolist()
    step, pos = state["step"], state["position"]
    if logger is not None and step == 0:
        logger.log_system_metrics()
    while step < tc.max_steps:
        phase = next(i for i, e in enumerate(ends) if step < e)
        if pos["phase"] != phase:
            pos = {"phase": phase, "epoch": 0, "micro": 0}
        batches, accumulation = train_batches(pos), plan[phase]["accumulation_steps"]
        while step < ends[phase]:
            t0 = time.perf_counter()
            counts, tokens, examples = torch.zeros(6, dtype=torch.float64), 0, 0
            for k in range(accumulation):
                pos, batch = next(batches)
                sync = contextlib.nullcontext() if k == accumulation - 1 or world == 1 else model.no_sync()
                with sync:  # all-reduce gradients only on the last micro-step
                    out = forward(model, batch, device, tc.precision)
                    loss = out.loss / accumulation
                    (scaler.scale(loss) if scaler is not None else loss).backward()
                counts += _counts(out).cpu()
                tokens += int(batch["num_tokens"])
                examples += len(batch["input_ids"])
            if scaler is not None:
                scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.max_grad_norm or float("inf"))
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            step += 1

            if step % tc.log_every_steps == 0 or step == tc.max_steps:
                totals = torch.cat([counts, torch.tensor([tokens, examples], dtype=torch.float64)])
                if world > 1:
                    totals = totals.to(device)
                    dist.all_reduce(totals)
                    totals = totals.cpu()
                secs = time.perf_counter() - t0
                log({**_summarise(totals[:6]), "lr": lr, "grad_norm": float(grad_norm),
                     "tokens_per_s": totals[6].item() / secs, "examples_per_s": totals[7].item() / secs,
                     "phase": phase}, step)
            if (tc.eval_every_steps and step % tc.eval_every_steps == 0) or step == tc.max_steps:
                log(evaluate(model, eval_batches(phase), device, tc.precision, all_reduce=world > 1), step)
            if step % tc.checkpoint_every_steps == 0 or step == tc.max_steps:
                with tempfile.TemporaryDirectory() as d:
                    save_checkpoint(d, rank, model, optimizer, scheduler, scaler, {"step": step, "position": pos})
                    ray.train.report({"step": step, "loss": (counts[0] / counts[2].clamp(min=1)).item()},
                                     checkpoint=ray.train.Checkpoint.from_directory(d))
            if tc.fail_at_step == step and rank == 0 and config.get("fail_marker"):
                marker = config["fail_marker"]
                if not os.path.exists(marker):  # once per run: the restarted attempt goes on
                    os.makedirs(os.path.dirname(marker), exist_ok=True)
                    open(marker, "w").close()
                    print(f"[rank 0] fault injection: SIGKILL at step {step}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
    if logger is not None:
        logger.log_system_metrics()
        logger.close()


# --------------------------------------------------------------------------------------------------------------
# The driver side: datasets, trainer, result
# --------------------------------------------------------------------------------------------------------------
def vocab_size_of(output: str) -> int:
    from pipeline.shards import read_text

    return len([t for t in read_text(f"{output.rstrip('/')}/vocab.txt").split("\n") if t])


def run_training(cfg, phase_data: list[dict[str, Any]], run_id: str, run_name: str, tracking_uri: str) -> dict[str, Any]:
    """Fit with Ray Train (resuming `run_name` in `train.storage_path` if it exists); returns the final checkpoint."""
    import ray
    import ray.data
    from ray.data import ExecutionOptions, ExecutionResources
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    tc = cfg.train
    plan = data_plan(phase_data, tc, tc.num_workers)
    # preserve_order: each rank's rows arrive in file order, which is what makes resumption exact.
    limits = ExecutionResources(cpu=tc.data_cpus) if tc.data_cpus else ExecutionResources()
    exec_opts = ExecutionOptions(preserve_order=True, resource_limits=limits)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options = exec_opts  # also for materialize() here
    ctx.enable_progress_bars = False  # the datasets carry this context to the workers: no bars in the job log

    datasets = {}
    for i, p in enumerate(plan):
        if tc.materialize_data:
            # One read of every shard into the object store, cut by row index into each rank's range, the
            # remainder and the held-out rows (split_at_indices is exact and ordered on materialized data).
            every = ray.data.read_parquet(p["train_files"] + p["eval_files"], shuffle=None).materialize()
            per = p["ranks"][0]["rows"]
            pieces = every.split_at_indices([per * (r + 1) for r in range(len(p["ranks"]))] + [p["train_rows"]])
            for r in range(len(p["ranks"])):
                datasets[f"p{i}_r{r}"] = pieces[r]
            if p["eval_files"]:
                datasets[f"p{i}_eval"] = pieces[-1]
            p["materialized"] = True
        else:
            for r, mine in enumerate(p["ranks"]):
                datasets[f"p{i}_r{r}"] = ray.data.read_parquet(mine["files"], shuffle=None)
            if p["eval_files"]:
                datasets[f"p{i}_eval"] = ray.data.read_parquet(p["eval_files"], shuffle=None)
    fail_marker = None
    if tc.fail_at_step is not None:
        base = tc.storage_path if "://" not in tc.storage_path else os.path.join(os.path.expanduser("~"), ".cache")
        fail_marker = os.path.join(base, run_name, "fault_injected")
    resources = {"CPU": tc.cpus_per_worker, **({"GPU": 1} if tc.use_gpu else {})}
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"cfg": cfg.to_dict(), "plan": plan, "run_id": run_id, "tracking_uri": tracking_uri,
                           "vocab_size": vocab_size_of(phase_data[0]["output"]), "fail_marker": fail_marker},
        scaling_config=ScalingConfig(num_workers=tc.num_workers, use_gpu=tc.use_gpu, resources_per_worker=resources,
                                     placement_strategy=tc.placement_strategy),
        run_config=RunConfig(
            name=run_name,
            storage_path=tc.storage_path,
            failure_config=FailureConfig(max_failures=tc.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=tc.num_to_keep),
        ),
        datasets=datasets,
        dataset_config=DataConfig(datasets_to_split=[], execution_options=exec_opts),
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    ckpt = result.checkpoint
    # A URI storage path gives a path inside its filesystem: s3 "bucket/runs/..." or file "/tmp/runs/...".
    uri = ckpt.path if "://" not in tc.storage_path else f"{tc.storage_path.split('://', 1)[0]}://{ckpt.path}"
    return {"checkpoint": uri, "metrics": dict(result.metrics or {}), "run_id": run_id, "run_name": run_name}


def local_checkpoint(uri: str) -> str:
    """A local directory with the checkpoint's files (copied when `uri` is remote)."""
    if "://" not in uri:
        return uri
    import tempfile

    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(uri)
    dst = tempfile.mkdtemp(prefix="ckpt-")
    pafs.copy_files(path, dst, source_filesystem=fs)
    return dst


def load_trained(cfg, checkpoint_uri: str, vocab_size: int) -> nn.Module:
    """The final weights from a checkpoint, as a plain `BertForPreTraining` (no DDP)."""
    from safetensors.torch import load_file

    model = build_model(cfg, vocab_size)
    model.load_state_dict(load_file(os.path.join(local_checkpoint(checkpoint_uri), "model.safetensors")))
    return model.eval()


# --------------------------------------------------------------------------------------------------------------
# Stage bodies (pipeline.dag.pretrain_stages): train, evaluate, register
# --------------------------------------------------------------------------------------------------------------
def default_run_name(cfg) -> str:
    """`<preset>-<first 10 hex of the config hash>`: the same command gets the same name, hence resumes."""
    from pipeline.config import config_hash

    return f"{cfg.model.preset}-{config_hash(cfg.to_dict())[:10]}"


def train_stage(cfg, phase_data: list[dict[str, Any]], run_name: str, git_sha: str, uri: str) -> dict[str, Any]:
    """Create (or reopen) the MLflow run here on the driver, log params and artifacts, then fit."""
    os.environ["MLFLOW_TRACKING_URI"] = uri
    import json
    import tempfile

    import yaml

    from pipeline import tracking
    from pipeline.config import config_hash

    tracking.check_tracking_server(uri)
    first = phase_data[0]
    run_id = tracking.start_run(
        cfg.tracking.experiment, run_name,
        {"git_sha": git_sha, "config_hash": config_hash(cfg.to_dict()), "data_manifest_sha256": first.get("manifest_sha256", ""),
         "vocab_sha256": first.get("vocab_sha256", ""), "model_preset": cfg.model.preset},
    )
    log = tracking.RunLogger(run_id, uri)
    log.log_params(cfg.flat())
    with tempfile.TemporaryDirectory() as d:
        cfg_path = os.path.join(d, "config.yaml")
        with open(cfg_path, "w") as f:
            yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)
        log.log_artifact(cfg_path)
        from pipeline.shards import read_bytes

        for i, pd in enumerate(phase_data):
            sub = "data" if i == 0 else f"data_phase{i}"
            for name in ("manifest.json", "vocab.txt"):
                local = os.path.join(d, sub, name)
                os.makedirs(os.path.dirname(local), exist_ok=True)
                with open(local, "wb") as f:
                    f.write(read_bytes(f"{pd['output'].rstrip('/')}/{name}"))
                log.log_artifact(local, sub)
    print(f"[train] MLflow run {run_id} ({run_name}) at {uri}", flush=True)
    try:
        res = run_training(cfg, phase_data, run_id, run_name, uri)
    except BaseException:
        log.finish("FAILED")
        raise
    return json.loads(json.dumps(res, default=str))


def evaluate_stage(cfg, train_result: dict[str, Any], data: dict[str, Any], uri: str) -> dict[str, float]:
    """Evaluate the final weights on the whole held-out set of the last phase; log `final_eval_*` into the run."""
    os.environ["MLFLOW_TRACKING_URI"] = uri

    from pipeline import tracking

    tc = cfg.train
    plan = data_plan([data], _single_phase(tc), 1)[0]
    model = load_trained(cfg, train_result["checkpoint"], vocab_size_of(data["output"]))
    torch.manual_seed(tc.seed)
    policy = None
    if plan["dynamic_masking"]:
        from pipeline.masking import MaskingPolicy

        policy = MaskingPolicy.from_manifest(data["output"])

    def batches() -> Iterator[dict[str, torch.Tensor]]:
        from pipeline.masking import mask_batch
        from pipeline.shards import read_table

        for path in plan["eval_files"] or [f for f in plan["ranks"][0]["files"][-1:]]:
            table = read_table(path)
            for i in range(0, table.num_rows, plan["micro_batch_size"]):
                rows = arrow_rows(table.slice(i, plan["micro_batch_size"]))
                if policy is not None:
                    rows = mask_batch(rows, policy, seed=tc.seed, epoch=0)
                yield collate(rows)

    metrics = evaluate(model, batches(), torch.device("cpu"))
    final = {f"final_{k}": v for k, v in metrics.items()}
    tracking.RunLogger(train_result["run_id"]).log_metrics(final, step=tc.max_steps)
    print(f"[evaluate] {json.dumps({k: round(v, 4) for k, v in final.items()})}", flush=True)
    return final


def _single_phase(tc):
    """The last phase's batch settings as a one-phase TrainConfig (for evaluation/export on the driver)."""
    import dataclasses

    if not tc.phases:
        return tc
    last = tc.phases[-1]
    mb = last.micro_batch_size or tc.micro_batch_size
    return dataclasses.replace(tc, phases=[], micro_batch_size=mb, global_batch_size=mb * tc.num_workers)


def register_stage(cfg, train_result: dict[str, Any], data: dict[str, Any], git_sha: str, uri: str) -> dict[str, Any]:
    """Export the final weights in transformers format, register them with lineage tags, move the alias."""
    os.environ["MLFLOW_TRACKING_URI"] = uri
    import tempfile

    from model.hf import save_hf
    from pipeline import tracking
    from pipeline.config import config_hash
    from pipeline.shards import read_bytes

    model = load_trained(cfg, train_result["checkpoint"], vocab_size_of(data["output"]))
    run_id = train_result["run_id"]
    with tempfile.TemporaryDirectory() as d:
        tok = os.path.join(d, "tokenizer")
        os.makedirs(tok)
        for name in ("vocab.txt", "tokenizer.json"):
            try:
                with open(os.path.join(tok, name), "wb") as f:
                    f.write(read_bytes(f"{data['output'].rstrip('/')}/{name}"))
            except FileNotFoundError:
                os.remove(os.path.join(tok, name))
        export = save_hf(model, os.path.join(d, "export"), tokenizer=tok)
        tags = {
            "data_manifest_sha256": data.get("manifest_sha256", ""),
            "vocab_sha256": data.get("vocab_sha256", ""),
            "config_hash": config_hash(cfg.to_dict()),
            "git_sha": git_sha,
            "run_id": run_id,
        }
        version = tracking.register_hf_model(str(export), cfg.tracking.model_name, cfg.tracking.alias, tags, run_id)
    logger = tracking.RunLogger(run_id)
    logger.set_tags({"registered_model": f"models:/{cfg.tracking.model_name}/{version}"})
    logger.finish("FINISHED")
    return {"name": cfg.tracking.model_name, "version": version, "uri": f"models:/{cfg.tracking.model_name}/{version}"}
