"""A mixture in the loader (issue 58): the shares of the trained tokens that each source got, counted from the rows
the loader yielded; the same rows over a resume at another worker count; and what drawing by weight costs.

The shared corpora are prepared as configs/tiny.yaml prepares them (dedup off: its cost is not the loader's), but
as two named sources, `data.sources: [{name: books, inputs: [corpora/books], weight: 3}, {name: wiki, inputs:
[corpora/wiki], weight: 1}]`, into a temporary folder. The run's plan is the job's (`pipeline.pretrain.job.
phase_plans`: tiny's 1,200 steps of 32 rows, its held-out shard, its chunked shuffle). Then, in this process, one
thread for pyarrow and torch, the training shards read once into memory (as `train.materialize_data` has them):

1. shares: every step of the run on one worker through `StepFeed`; each yielded row's source and tokens are read
   from the table the rank's micro-batches are cut from (its share of the global batch), summed per source;
2. resume: steps 0..K on 2 workers, then K..K+R on 3 workers resumed at K, against 2 workers without a stop: the
   rows (source, example_id) of every step, all ranks in rank order, must be the same, row for row;
3. cost: loader tokens per CPU-second (Parquet rows -> masked, padded tensors) with the mixture and without it
   (the same shards as one stream: `plan.mixture` None), alternated `--repeats` times in this one run; the ratio
   of the medians (goal >= 0.97).

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
    cfg = resolve_paths(load_config(REPO / "configs" / "tiny.yaml",
                                    args + ([] if steps is None else ["--train.max_steps", str(steps)])))
    run_graph(data_stages(cfg.data), remote=False, log=lambda m: None)
    return cfg


class Recording:
    """A `Batches` that also keeps (source, example_id, num_tokens) of the rows each step gives its rank."""

    def __init__(self, inner) -> None:
        self.inner, self.rows = inner, []

    def step(self, table, epoch, slices):
        lo, hi = slices[0][0], slices[-1][1]
        mine = table.slice(lo, hi - lo)
        self.rows.append(list(zip(mine["source"].to_pylist(), mine["example_id"].to_pylist(),
                                  mine["num_tokens"].to_pylist())))
        return self.inner.step(table, epoch, slices)


def feed(plan, tables, rank: int, world: int, done: int, seed: int, chunk: int, record: bool = False):
    from pipeline.pretrain.loader import Batches, StepFeed

    to_batch = Batches(plan, seed)
    batches = Recording(to_batch) if record else to_batch
    return StepFeed(plan, 0, rank, world, seed, chunk, done, lambda: iter(tables), batches), batches


def rows_of_steps(plan, tables, world: int, done: int, steps: int, seed: int, chunk: int) -> list[list]:
    """Every step's rows (source, example_id), all ranks' in rank order, for `steps` steps from `done` on."""
    feeds = [feed(plan, tables, r, world, done, seed, chunk, record=True) for r in range(world)]
    its = [iter(f) for f, _ in feeds]
    for _ in range(steps):
        for it in its:
            next(it)
    return [[(s, e) for _, rec in feeds for s, e, _ in rec.rows[k]] for k in range(steps)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", type=Path, default=REPO.parent / "shared" / "corpora")
    ap.add_argument("--steps", type=int, default=None, help="steps of the run (default: tiny's max_steps)")
    ap.add_argument("--resume-at", type=int, default=300)
    ap.add_argument("--resume-steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
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
            print(f"source {m['name']}: {m['input_files']} files, {m['documents']:,} documents, {m['examples']:,} rows, "
                  f"{m['tokens']:,} tokens")

        # 1. shares of the yielded rows' tokens over the whole run, one worker
        f, rec = feed(plan, tables, 0, 1, 0, tc.seed, tc.shuffle_buffer_rows, record=True)
        it = iter(f)
        for _ in range(steps):
            next(it)
        got = {n: 0 for n in WEIGHTS}
        rows = {n: 0 for n in WEIGHTS}
        for step in rec.rows:
            for s, _, n in step:
                got[s] += n
                rows[s] += 1
        total = sum(got.values())
        want = {n: w / sum(WEIGHTS.values()) for n, w in WEIGHTS.items()}
        print("\n| source | weight | rows yielded | tokens yielded | share | target | off by (points) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for n in WEIGHTS:
            print(f"| {n} | {WEIGHTS[n]} | {rows[n]:,} | {got[n]:,} | {got[n] / total:.2%} | {want[n]:.0%} | "
                  f"{100 * (got[n] / total - want[n]):+.2f} |")

        # 2. resume at another worker count: 2 workers, stop at K, go on with 3
        k, r = a.resume_at, a.resume_steps
        whole = rows_of_steps(plan, tables, 2, 0, k + r, tc.seed, tc.shuffle_buffer_rows)
        resumed = rows_of_steps(plan, tables, 3, k, r, tc.seed, tc.shuffle_buffer_rows)
        same = sum(x == y for x, y in zip(whole[k:], resumed))
        print(f"\nresume: steps {k + 1}-{k + r} on 3 workers after {k} on 2: {same}/{r} steps the same rows, row for "
              f"row ({sum(len(s) for s in resumed):,} rows)")

        # 3. cost: tokens per CPU-second, with and without the mixture, alternated
        one = dataclasses.replace(plan, mixture=None)
        rates: dict[str, list[float]] = {"mixture": [], "one stream": []}
        for _ in range(a.repeats):
            for name, p in (("mixture", plan), ("one stream", one)):
                f, _ = feed(p, tables, 0, 1, 0, tc.seed, tc.shuffle_buffer_rows)
                it = iter(f)
                tokens, cpu0 = 0, time.process_time()
                for _ in range(steps):
                    s = next(it)
                    tokens += sum(int(b["num_tokens"]) for b in s.micro_batches)
                rates[name].append(tokens / (time.process_time() - cpu0))
        print("\n| loader | tokens / CPU-s (each run) | median |")
        print("|---|---|---:|")
        for name, v in rates.items():
            print(f"| {name} | {', '.join(f'{x:,.0f}' for x in v)} | {statistics.median(v):,.0f} |")
        ratio = statistics.median(rates["mixture"]) / statistics.median(rates["one stream"])
        print(f"\nmixture / one stream: {ratio:.3f} (goal >= 0.97)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
