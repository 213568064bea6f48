"""The LR curve of every pretraining preset (configs/*.yaml), as its run follows it: each step's learning rate from
the preset's own `train` section through `pipeline.core.optim.lr_lambda`, the function the training's scheduler
calls. Prints each curve's landmarks and draws them, one panel a preset, into docs/lr-curves.png
(docs/pretraining.md shows it). A run logs the same curve as its `train/lr` metric.

    python docs/lr_curves.py [--out docs/lr-curves.png] [--max-steps N]

`--max-steps N` draws every preset at N steps instead of its own (warmup and decay are fractions: the shape stays).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from pipeline.config import TrainConfig, load_config
from pipeline.core.optim import lr_lambda

REPO = Path(__file__).resolve().parents[1]


def presets() -> list[Path]:
    """The pretraining presets: every configs/*.yaml but fine-tuning's (it has a `tune` section)."""
    return sorted(p for p in (REPO / "configs").glob("*.yaml") if "tune" not in yaml.safe_load(p.read_text()))


def curve(tc: TrainConfig) -> list[float]:
    """The LR after each of steps 0..max_steps, as the run's scheduler sets it (the encoder's: with
    head_only_steps its warmup starts that many steps later, as `make_optimizer` does).

    >>> curve(TrainConfig(max_steps=10, warmup_fraction=0.2, lr=1.0, schedule="wsd", decay_fraction=0.4))
    [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    """
    k = tc.head_only_steps
    return [
        0.0
        if s < k
        else tc.lr
        * lr_lambda(
            s - k, tc.warmup_steps, tc.max_steps - k, tc.schedule, tc.poly_power, tc.decay_steps, tc.decay_shape
        )
        for s in range(tc.max_steps + 1)
    ]


def describe(tc: TrainConfig) -> str:
    """A panel's subtitle: the schedule in words."""
    decay = (
        f"wsd: {tc.decay_shape} decay over the last {tc.decay_fraction:.0%}"
        if tc.schedule == "wsd"
        else f"polynomial decay (power {tc.poly_power:g})"
        if tc.schedule == "polynomial"
        else f"{tc.schedule} decay"
    )
    return f"lr {tc.lr:g}, warmup {tc.warmup_steps:,} of {tc.max_steps:,} steps; {decay}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "lr-curves.png")
    ap.add_argument("--max-steps", type=int, default=None)
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = presets()
    cols = 3
    fig, axes = plt.subplots(-(-len(paths) // cols), cols, figsize=(12, 3.5 * -(-len(paths) // cols)), squeeze=False)
    for ax, path in zip(axes.flat, paths):
        # continue.yaml needs a checkpoint: any name does for its train section (nothing is resolved here)
        init = ["--model.init", "models:/bert-pretrain@latest-pretrain"] if path.stem == "continue" else []
        steps = ["--train.max_steps", str(args.max_steps)] if args.max_steps else []
        tc = load_config(path, init + steps).train
        lrs = curve(tc)
        peak = max(range(len(lrs)), key=lrs.__getitem__)
        print(
            f"{path.name:22} {describe(tc)}; peak {lrs[peak]:g} at step {peak:,}, "
            f"half of it from step {next(s for s in range(peak, len(lrs)) if lrs[s] <= lrs[peak] / 2):,}"
        )
        ax.plot(range(len(lrs)), lrs, lw=1.6)
        ax.set_title(f"{path.name}\n{describe(tc).replace('; ', chr(10))}", fontsize=8.5)
        ax.set_xlabel("optimizer step", fontsize=8)
        ax.set_ylabel("learning rate", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    for ax in list(axes.flat)[len(paths) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
