"""A mixture in the loader (issue 58): the shares of the trained tokens that each source got, counted from the rows
the loader yielded; the same rows over a resume at another worker count; and what drawing by weight costs.

The shared corpora are prepared as configs/tiny.yaml prepares them (dedup off: its cost is not the loader's), but
as two named sources, `data.sources: [{name: books, inputs: [corpora/books], weight: 3}, {name: wiki, inputs:
[corpora/wiki], weight: 1}]`, into a temporary folder. The run's plan is the job's (`pipeline.pretrain.job.
phase_plans`: tiny's 1,200 steps of 32 rows, its held-out shard, its chunked shuffle). Then, in this process, one
thread for pyarrow and torch, the training shards read once into memory (as `train.materialize_data` has them):

1. shares: every step of the run on one worker through `StepFeed`; each yielded row (its example_id, in the
   table the rank's micro-batches are cut from) looked up for its source and tokens, summed per source, and
   checked against the counts the loop logs (`train/source_tokens/<name>`);
2. resume: steps 0..K on 2 workers, then K..K+R on 3 workers resumed at K, against 2 workers without a stop: the
   rows (example_ids) of every step, all ranks in rank order, must be the same, row for row;
3. cost: loader tokens per CPU-second (Parquet rows -> masked, padded tensors) over the run's steps with the
   mixture and without it (the same shards as one stream: `plan.mixture` None), run after run in turn, `--repeats`
   times each in this one run; the ratio of the best runs (the least disturbed by other work on the machine, as
   timeit takes the fastest) and of the medians (goal >= 0.97).

    python bench/train/mixture_loader.py [--corpora ../shared/corpora] [--steps 1200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WEIGHTS = {"books": 3, "wiki": 1}


def prepare(work: Path, corpora: Path, steps: int | None):
    """The corpora as two sources, with configs/tiny.yaml's data settings, prepared in this process (as the job
    prepares inputs under data.local_max_bytes); the config."""
    from pipeline.config import load_config, resolve_paths
    from pipeline.data.stages import data_stages
    from pipeline.runner.dag import run_graph

    mix = json.dumps([{"name": n, "inputs": [str(corpora / n)], "weight": w} for n, w in WEIGHTS.items()])
    args = ["--data.sources", mix, "--data.output", str(work / "mix"), "--data.dedup", "off"]
    cfg = resolve_paths(
        load_config(REPO / "configs" / "tiny.yaml", args + ([] if steps is None else ["--train.max_steps", str(steps)]))
    )
    run_graph(data_stages(cfg.data), remote=False, log=lambda m: None)
    return cfg


class Recording:
    """A `Batches` that also keeps the example_ids of the rows each step gives its rank (a mixture's global batch
    is its table's rows in `order`)."""

    def __init__(self, inner) -> None:
        self.inner, self.rows = inner, []

    def step(self, table, epoch, slices, order=None):
        lo, hi = slices[0][0], slices[-1][1]
        ids = table["example_id"].to_numpy()
        self.rows.append((ids[lo:hi] if order is None else ids[order[lo:hi]]).tolist())
        return self.inner.step(table, epoch, slices, order)


def feed(plan, tables, rank: int, world: int, done: int, seed: int, chunk: int, record: bool = False):
    from pipeline.pretrain.loader import Batches, StepFeed

    to_batch = Batches(plan, seed)
    batches = Recording(to_batch) if record else to_batch
    return StepFeed(plan, 0, rank, world, seed, chunk, done, lambda: iter(tables), batches), batches


def rows_of_steps(plan, tables, world: int, done: int, steps: int, seed: int, chunk: int) -> list[list[int]]:
    """Every step's rows (example_ids), all ranks' in rank order, for `steps` steps from `done` on."""
    feeds = [feed(plan, tables, r, world, done, seed, chunk, record=True) for r in range(world)]
    its = [iter(f) for f, _ in feeds]
    for _ in range(steps):
        for it in its:
            next(it)
    return [[e for _, rec in feeds for e in rec.rows[k]] for k in range(steps)]


def tokens_per_cpu_s(plan, tables, steps: int, seed: int, chunk: int) -> float:
    """Loader tokens per CPU-second of `plan`'s stream over `steps` steps on one worker."""
    import time

    it = iter(feed(plan, tables, 0, 1, 0, seed, chunk)[0])
    tokens, cpu0 = 0, time.process_time()
    for _ in range(steps):
        tokens += sum(int(b["num_tokens"]) for b in next(it).micro_batches)
    return tokens / (time.process_time() - cpu0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", type=Path, default=REPO.parent / "shared" / "corpora")
    ap.add_argument("--steps", type=int, default=None, help="steps of the run (default: tiny's max_steps)")
    ap.add_argument("--resume-at", type=int, default=300)
    ap.add_argument("--resume-steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)

    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from pipeline.data.dataset import PreparedDataset
    from pipeline.pretrain.job import mixture_lines, phase_plans

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="mixture-bench-") as work:
        t0 = time.perf_counter()
        cfg = prepare(Path(work), a.corpora.resolve(), a.steps)
        print(f"prepared in {time.perf_counter() - t0:.0f}s", flush=True)
        ds = PreparedDataset.load(cfg.data.output)
        plan = phase_plans(cfg, [ds])[0]
        tc = cfg.train
        steps = plan.steps
        tables = [pq.read_table(f, use_threads=False) for f in plan.train_files]
        print("\n".join(mixture_lines([plan])))
        for m in ds.manifest["sources"]:
            print(
                f"source {m['name']}: {m['input_files']} files, {m['documents']:,} documents, "
                f"{m['examples']:,} rows, {m['tokens']:,} tokens"
            )

        # 1. shares of the yielded rows' tokens over the whole run, one worker
        source_of = {
            e: (s, n)
            for t in tables
            for e, s, n in zip(t["example_id"].to_pylist(), t["source"].to_pylist(), t["num_tokens"].to_pylist())
        }
        f, rec = feed(plan, tables, 0, 1, 0, tc.seed, tc.shuffle_buffer_rows, record=True)
        it = iter(f)
        for _ in range(steps):
            last = next(it)
        got = dict.fromkeys(WEIGHTS, 0)
        rows = dict.fromkeys(WEIGHTS, 0)
        for step in rec.rows:
            for e in step:
                s, n = source_of[e]
                got[s] += n
                rows[s] += 1
        assert got == last.source_tokens, (got, last.source_tokens)  # what train/source_tokens/<name> logs
        total = sum(got.values())
        want = {n: w / sum(WEIGHTS.values()) for n, w in WEIGHTS.items()}
        print(f"\n{steps:,} steps of {plan.global_batch_size} rows, one worker:")
        print("\n| source | weight | rows yielded | tokens yielded | share | target | off by (points) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for n in WEIGHTS:
            print(
                f"| {n} | {WEIGHTS[n]} | {rows[n]:,} | {got[n]:,} | {got[n] / total:.2%} | {want[n]:.0%} | "
                f"{100 * (got[n] / total - want[n]):+.2f} |"
            )

        # 2. resume at another worker count: 2 workers, stop at K, go on with 3
        k, r = a.resume_at, a.resume_steps
        whole = rows_of_steps(plan, tables, 2, 0, k + r, tc.seed, tc.shuffle_buffer_rows)
        resumed = rows_of_steps(plan, tables, 3, k, r, tc.seed, tc.shuffle_buffer_rows)
        same = sum(x == y for x, y in zip(whole[k:], resumed))
        print(
            f"\nresume: steps {k + 1}-{k + r} on 3 workers after {k} on 2: {same}/{r} steps the same rows, row for "
            f"row ({sum(len(s) for s in resumed):,} rows)"
        )

        # 3. cost: tokens per CPU-second, with and without the mixture, run after run in turn
        plans = {"mixture": plan, "one stream": dataclasses.replace(plan, mixture=None)}
        rates: dict[str, list[float]] = {name: [] for name in plans}
        for _ in range(a.repeats):
            for name, p in plans.items():
                rates[name].append(tokens_per_cpu_s(p, tables, steps, tc.seed, tc.shuffle_buffer_rows))
        print("\n| loader | tokens / CPU-s (each run) | best | median |")
        print("|---|---|---:|---:|")
        for name, v in rates.items():
            print(f"| {name} | {', '.join(f'{x:,.0f}' for x in v)} | {max(v):,.0f} | {statistics.median(v):,.0f} |")
        best = max(rates["mixture"]) / max(rates["one stream"])
        median = statistics.median(rates["mixture"]) / statistics.median(rates["one stream"])
        print(f"\nmixture / one stream: {best:.3f} best to best, {median:.3f} median to median (goal >= 0.97)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
