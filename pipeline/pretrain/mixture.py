"""A phase's training stream drawn from named sources by weight (`data.sources`, issue 58): how many rows of each
source every optimizer step takes, as a function of the step alone, so that the data order stays a function of
the seed and the step, and a run resumes exactly, at any number of workers (`pipeline.pretrain.loader.StepFeed`).

What a source gets. Its share of the phase's tokens is its weight against the other weighted sources' (a phase's
`source_weights` replace data's), or, for sources given neither weight nor epochs, its tokens to the power
`mix_temperature` (mmBERT's sampling; 1 is in proportion to size, as one stream of `data.inputs` is). A source
with `epochs` E takes E times its training rows over the phase, and the weighted ones share the rest. Shares are
of tokens, drawn as rows: a source of long rows needs fewer of them, so its rows a step are its share over its
mean tokens a row (`Mixture.per_step`, summing to the global batch).

Which rows a step takes. Source i's rows drawn in the phase's first k steps are floor(q_i k) (q_i its rows a
step), every source's but the one of most rows a step, which takes what is left of the k global batches
(`Mixture.before`); step k takes the difference (`Mixture.at`). Closed forms: a resumed run knows where every
source is from its step without replaying the steps before it. Over a phase each source's rows are within one row
of its rate. Each source's rows are its own stream, read pass after pass in an order of its own
(`loader.SourceRows`), so a small source repeats and a large one is read in part; its rows in a step are its next
ones in that stream, and the step's global batch is their concatenation in a seeded order.

    >>> m = Mixture(("books", "wiki"), (0, 1), (100, 40), (1000, 800), (3.0, 1.0), 4, 50)
    >>> m.at(0), m.before(10), [round(e, 2) for e in m.epochs()]
    ([3, 1], [30, 10], [1.5, 1.25])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipeline.config import ConfigError, SourceConfig


@dataclass(frozen=True)
class Mixture:
    """Which rows of which source each step of one phase takes."""

    names: tuple[str, ...]
    """The sources drawn in this phase, in `data.sources` order (one of weight 0 is not drawn)."""
    index: tuple[int, ...]
    """Each one's position in `data.sources`: the seed of its row order (`loader.SourceRows`)."""
    rows: tuple[int, ...]
    """Each one's training rows (its rows in the phase's held-out shards are never drawn)."""
    tokens: tuple[int, ...]
    """Each one's training tokens."""
    per_step: tuple[float, ...]
    """Each one's rows in a global batch, on average; they sum to `global_batch_size`."""
    global_batch_size: int
    steps: int
    """The phase's optimizer steps."""
    weights: tuple[float | None, ...] = ()
    """Each one's weight as given (the phase's `source_weights` or data's); None: it has epochs, or its size
    weighs it (`mix_temperature`)."""

    @property
    def largest(self) -> int:
        """The source of most rows a step (the first of equals): it takes what the others leave of each batch."""
        return max(range(len(self.per_step)), key=lambda i: (self.per_step[i], -i))

    def before(self, step: int) -> list[int]:
        """Rows of each source the phase's first `step` steps drew (and so where each one's stream is at `step`).

        >>> Mixture(("a", "b"), (0, 1), (9, 9), (9, 9), (2.5, 1.5), 4, 8).before(3)
        [8, 4]
        """
        big = self.largest
        out = [math.floor(q * step + 1e-9) for q in self.per_step]  # 1e-9: q x step a hair under a whole number
        out[big] = self.global_batch_size * step - sum(n for i, n in enumerate(out) if i != big)
        return out

    def at(self, step: int) -> list[int]:
        """Rows of each source in step `step`'s global batch (0-based step of the phase)."""
        return [b - a for a, b in zip(self.before(step), self.before(step + 1))]

    def epochs(self, steps: int | None = None) -> list[float]:
        """Passes over each source's training rows in the phase's first `steps` steps (all of them by default)."""
        return [n / rows for n, rows in zip(self.before(self.steps if steps is None else steps), self.rows)]

    def token_shares(self) -> list[float]:
        """Each source's expected share of the phase's tokens (its rows a step times its mean tokens a row)."""
        per = [q * t / r for q, t, r in zip(self.per_step, self.tokens, self.rows)]
        return [p / sum(per) for p in per]

    def describe(self) -> list[dict[str, Any]]:
        """Per source: name, weight as given, training rows and tokens, rows a step, share of the tokens, epochs
        over the phase."""
        weights = self.weights or (None,) * len(self.names)
        return [
            {
                "name": n,
                "weight": w,
                "rows": r,
                "tokens": t,
                "rows_per_step": round(q, 4),
                "token_share": round(s, 4),
                "epochs": round(e, 4),
            }
            for n, w, r, t, q, s, e in zip(
                self.names, weights, self.rows, self.tokens, self.per_step, self.token_shares(), self.epochs()
            )
        ]

    @classmethod
    def build(
        cls,
        sources: list[SourceConfig],
        counts: dict[str, dict[str, int]],
        *,
        steps: int,
        global_batch_size: int,
        temperature: float,
        weights: dict[str, float] | None = None,
        where: str = "data.sources",
    ) -> Mixture:
        """The mixture of one phase from `data.sources` (or, with `weights`, a phase's own `source_weights`) and
        each source's training `counts` ({name: {"rows", "tokens"}}, `PreparedDataset.source_counts`). ConfigError
        (one line) when a drawn source has no training row, the epochs ask for more rows than the steps hold, or
        every source has epochs that leave the global batches part empty.

        >>> srcs = [SourceConfig("books", ["/b"], weight=3), SourceConfig("wiki", ["/w"], weight=1)]
        >>> m = Mixture.build(srcs, {"books": {"rows": 100, "tokens": 10_000}, "wiki": {"rows": 50, "tokens": 2_500}},
        ...                   steps=10, global_batch_size=8, temperature=1.0)
        >>> [round(q, 2) for q in m.per_step], [round(s, 2) for s in m.token_shares()], m.at(0), m.before(5)
        ([4.8, 3.2], [0.75, 0.25], [5, 3], [24, 16])
        """
        chosen = [(i, s) for i, s in enumerate(sources) if weights is None or weights.get(s.name, 0) > 0]
        chosen = [(i, s) for i, s in chosen if weights is not None or s.weight != 0]
        for _, s in chosen:
            if counts.get(s.name, {}).get("rows", 0) == 0:
                raise ConfigError(
                    f"{where}: source {s.name} has no training row (its rows are all in the held-out "
                    "shards, or it wrote none): give it more text, or hold out fewer shards "
                    "(train.num_eval_shards)"
                )
        rows = [counts[s.name]["rows"] for _, s in chosen]
        tokens = [counts[s.name]["tokens"] for _, s in chosen]
        fixed = [
            None if weights is not None or s.epochs is None else s.epochs * r / steps for (_, s), r in zip(chosen, rows)
        ]
        left = global_batch_size - sum(q for q in fixed if q is not None)
        free = [k for k, q in enumerate(fixed) if q is None]
        if left < -1e-9:
            raise ConfigError(
                f"{where}: the sources' epochs need {sum(q for q in fixed if q is not None):.1f} rows a "
                f"step, more than the global batch of {global_batch_size} over {steps} steps"
            )
        if not free and left > 1e-9:
            raise ConfigError(
                f"{where}: every source has epochs, and they fill {global_batch_size - left:.1f} of the "
                f"{global_batch_size} rows a step: give one source a weight to take the rest"
            )

        def share(k: int) -> float:  # the token share a free source asks for, before normalising
            _, s = chosen[k]
            if weights is not None:
                return weights[s.name]
            return s.weight if s.weight is not None else tokens[k] ** temperature

        need = {k: share(k) * rows[k] / tokens[k] for k in free}  # rows that carry its share: share / mean tokens
        per_step = [q if q is not None else left * need[k] / sum(need.values()) for k, q in enumerate(fixed)]
        given = tuple(weights[s.name] if weights is not None else s.weight for _, s in chosen)
        mix = cls(
            tuple(s.name for _, s in chosen),
            tuple(i for i, _ in chosen),
            tuple(rows),
            tuple(tokens),
            tuple(per_step),
            global_batch_size,
            steps,
            given,
        )
        if mix.per_step[mix.largest] < len(per_step) - 1:  # then a step's remainder could be negative
            raise ConfigError(
                f"{where}: a global batch of {global_batch_size} is too small to mix {len(per_step)} "
                f"sources at these weights (its largest takes {mix.per_step[mix.largest]:.2f} rows a "
                f"step, under {len(per_step) - 1}): raise the global batch"
            )
        return mix


def phase_mixture(
    cfg, phase: int, dataset, train_files: tuple[str, ...], steps: int, global_batch_size: int
) -> Mixture | None:
    """Phase `phase`'s mixture (None without `data.sources`): data's sources, weights, epochs and temperature, or
    the phase's own `source_weights` and `mix_temperature`; counted on the phase's training shards."""
    if not cfg.data.sources:
        return None
    ph = cfg.train.phases[phase] if cfg.train.phases else None
    weights = ph.source_weights if ph is not None else None
    temperature = ph.mix_temperature if ph is not None and ph.mix_temperature is not None else cfg.data.mix_temperature
    where = f"train.phases[{phase}]" if weights is not None else "data.sources"
    return Mixture.build(
        cfg.data.sources,
        dataset.source_counts(train_files),
        steps=steps,
        global_batch_size=global_batch_size,
        temperature=temperature,
        weights=weights,
        where=where,
    )
