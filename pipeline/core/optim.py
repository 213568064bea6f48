"""Optimisation shared by pretraining and fine-tuning: the LR schedule, AdamW/LAMB with decay groups.

Schedules: linear or polynomial decay after warmup (BERT), constant, and warmup-stable-decay (`wsd`, the
"trapezoidal" schedule of ModernBERT: peak LR held after warmup, then a decay to 0 over the last `decay_steps`,
linear or `1-sqrt` (lr x (1 - sqrt(t)), t going 0 -> 1 over the decay: ModernBERT's and Ettin's shape)).

    >>> opt, sched = make_optimizer(nn.Linear(4, 2), OptimOptions("adamw", 1e-3, 0.01, warmup_steps=1, total_steps=4))
    >>> [round(lr_lambda(s, 1, 4), 3) for s in range(5)]
    [0.0, 1.0, 0.667, 0.333, 0.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

if TYPE_CHECKING:
    from pipeline.config import TrainConfig
    from pipeline.finetune.config import FtTrainConfig

Schedule = Literal["linear", "polynomial", "constant", "wsd"]
DecayShape = Literal["linear", "1-sqrt"]


@dataclass(frozen=True)
class OptimOptions:
    """What `make_optimizer` builds, made once from a job's train section (`pretraining`, `finetuning`): the update
    rule, its peak LR and weight decay, and the LR schedule (`lr_lambda`)."""

    name: str
    """adamw, lamb or stableadamw."""
    lr: float
    """The peak LR."""
    weight_decay: float
    warmup_steps: int
    total_steps: int
    """The LR reaches 0 here."""
    schedule: Schedule = "linear"
    power: float = 1.0
    """schedule polynomial: the decay's exponent."""
    decay_steps: int = 0
    """schedule wsd: the final decay's steps."""
    decay_shape: DecayShape = "linear"
    head_only_steps: int = 0
    """Steps during which only the pretraining heads (`cls.*`) learn."""
    fused: bool | None = None
    """AdamW's fused kernel: None chooses by the parameters' devices."""

    @classmethod
    def pretraining(cls, tc: TrainConfig) -> OptimOptions:
        """Pretraining's: one schedule over `train.max_steps`, whatever the phases."""
        return cls(
            tc.optimizer,
            tc.lr,
            tc.weight_decay,
            warmup_steps=tc.warmup_steps,
            total_steps=tc.max_steps,
            schedule=tc.schedule,
            power=tc.poly_power,
            decay_steps=tc.decay_steps,
            decay_shape=tc.decay_shape,
            head_only_steps=tc.head_only_steps,
        )

    @classmethod
    def finetuning(cls, tc: FtTrainConfig, total_steps: int) -> OptimOptions:
        """Fine-tuning's, over the run's `total_steps` (`train.max_steps`, or its epochs' steps) with
        `train.warmup_ratio` of them in the warmup."""
        return cls(
            tc.optimizer,
            tc.lr,
            tc.weight_decay,
            warmup_steps=int(tc.warmup_ratio * total_steps),
            total_steps=total_steps,
            schedule=tc.schedule,
        )


def lr_lambda(
    step: int,
    warmup_steps: int,
    total_steps: int,
    schedule: Schedule = "linear",
    power: float = 1.0,
    decay_steps: int = 0,
    decay_shape: DecayShape = "linear",
) -> float:
    """LR multiplier after `step` optimizer steps: linear warmup to 1, then linear or polynomial decay to 0, or
    (wsd) 1 until the last `decay_steps` steps and a decay to 0 over them: linear (1 - t) or `1-sqrt` (1 - sqrt(t)),
    t the share of the decay done.

    Same convention as transformers' `get_linear_schedule_with_warmup` (and Google's BERT): step 0 is 0.

    >>> [round(lr_lambda(s, 2, 6), 3) for s in range(7)]
    [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0]
    >>> round(lr_lambda(4, 2, 6, "polynomial", power=2.0), 3)
    0.25
    >>> [round(lr_lambda(s, 2, 10, "wsd", decay_steps=4), 2) for s in range(11)]
    [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    >>> [round(lr_lambda(s, 2, 10, "wsd", decay_steps=4, decay_shape="1-sqrt"), 2) for s in range(6, 11)]
    [1.0, 0.5, 0.29, 0.13, 0.0]
    """
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    if schedule == "constant":
        return 1.0
    if schedule == "wsd":  # stable at 1 until the decay starts, then to 0 at total_steps
        left = min(1.0, max(0.0, (total_steps - step) / max(1, decay_steps)))  # 1 - t
        if decay_shape == "1-sqrt":
            return 1.0 - math.sqrt(1.0 - left)
        if decay_shape != "linear":
            raise ValueError(f"unknown decay shape {decay_shape!r} (linear, 1-sqrt)")
        return left
    remaining = max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return remaining
    if schedule == "polynomial":
        return remaining**power
    raise ValueError(f"unknown schedule {schedule!r} (linear, polynomial, constant, wsd)")


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


def make_optimizer(
    model: nn.Module, options: OptimOptions
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW, LAMB or StableAdamW over `model`'s parameters (no weight decay on biases and LayerNorm) and its LR
    schedule. All three take the same betas (0.9, 0.999), eps 1e-6 and weight decay scaled by the LR (torch's AdamW
    convention), so a run's recipe changes only in the update rule. StableAdamW is torch-optimi's (Wortsman et al.
    2023, ModernBERT's optimizer): AdamW whose step is divided, per tensor, by max(1, RMS(g^2 / v)), which caps the
    update when the second moment lags a sudden large gradient (what warmup otherwise guards against).

    `options.head_only_steps` K > 0: for the first K steps only the pretraining heads (`cls.*`) learn; every other
    parameter (the encoder, and the word embeddings the MLM decoder is tied to) has LR 0, then warms up over
    `warmup_steps` from step K and decays to 0 at `total_steps` like the heads. For a checkpoint continued with
    fresh heads: their random gradients would otherwise reach the pretrained encoder first (LP-FT, Kumar et al.
    2022, "Fine-Tuning can Distort Pretrained Features").

    `options.fused` (AdamW only): one kernel for the whole update instead of a loop of small ones, and no host read of
    the step count. None = fused when every parameter is on a CUDA device (as torchtitan does) or on the CPU
    (torch's CPU kernel: 0.14-0.21 of the loop's time a step on one thread; bench/RESULTS.md, "Job cost"),
    torch's default otherwise: build the optimizer after the model is on its device. A checkpoint keeps the
    choice it was written with (the optimizer's state_dict carries it): a run resumes with the update it started
    with.

    >>> opt, _ = make_optimizer(nn.Linear(4, 2), OptimOptions("adamw", 1e-3, 0.01, warmup_steps=0, total_steps=10))
    >>> [g["weight_decay"] for g in opt.param_groups], [len(g["params"]) for g in opt.param_groups], opt.defaults["fused"]
    ([0.01, 0.0], [1, 1], True)
    """  # noqa: E501
    o = options
    groups = param_groups(model, o.weight_decay)

    def every(s: int) -> float:  # a function, not a callable object: a checkpoint's scheduler state holds none
        return lr_lambda(s, o.warmup_steps, o.total_steps, o.schedule, o.power, o.decay_steps, o.decay_shape)

    schedules = [every] * len(groups)
    if o.head_only_steps > 0:
        heads = {id(p) for n, p in model.named_parameters() if n.startswith("cls.") or ".cls." in n}
        groups = [
            {**g, "params": [p for p in g["params"] if (id(p) in heads) == is_head]}
            for is_head in (True, False)
            for g in groups
        ]
        k = o.head_only_steps

        def body(s: int) -> float:
            if s < k:
                return 0.0
            return lr_lambda(
                s - k, o.warmup_steps, o.total_steps - k, o.schedule, o.power, o.decay_steps, o.decay_shape
            )

        pairs = [(g, schedules[0] if i < len(groups) // 2 else body) for i, g in enumerate(groups) if g["params"]]
        groups, schedules = [g for g, _ in pairs], [f for _, f in pairs]
    lr, betas, eps = o.lr, (0.9, 0.999), 1e-6
    if o.name == "adamw":
        fused = o.fused
        if fused is None:
            fused = all(p.device.type in ("cuda", "cpu") for g in groups for p in g["params"]) or None  # None: default
        opt: torch.optim.Optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused)
    elif o.name == "lamb":
        opt = Lamb(groups, lr=lr, betas=betas, eps=eps)
    elif o.name == "stableadamw":
        from optimi import StableAdamW

        opt = StableAdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=o.weight_decay)
    else:
        raise ValueError(f"unknown optimizer {o.name!r} (adamw, lamb, stableadamw)")
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedules)
