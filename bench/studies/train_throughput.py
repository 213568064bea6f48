# Finished study, ran at 8f1c1ec (2026-11-22): Ray Train ÷ a plain loop, tokens/s 0.95; loader 36x the tiny model
"""Pretraining throughput and learning, each as a ratio against a reference measured in the same run.

1. Ray Train overhead: tokens/s of `pipeline.pretrain.job.run_training` (1 worker) / tokens/s of the same loop in plain
   PyTorch in this process (same model, data order, masking, batch size, thread count). Goal >= 0.9.
2. Loader headroom: micro-batches/s the Ray Data loader path delivers (read_parquet -> per-rank order ->
   dynamic masking -> padding) / micro-batches/s the tiny model consumes (forward + backward + step). Goal >= 5.
3. Learning: held-out MLM accuracy of the tiny preset after a fixed budget (configs/tiny.yaml as shipped, or
   --learn-steps) / the accuracy of always predicting the most frequent masked token (unigram baseline).

    python bench/studies/train_throughput.py                       # all three on ../shared/corpora (~10 min on 2 cores)
    python bench/studies/train_throughput.py --skip-learning --steps 60
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def prepare(work: Path, inputs: list[str], seq: int) -> tuple[object, dict]:
    from pipeline.config import load_config, resolve_paths
    from pipeline.runner.dag import run_graph
    from pipeline.data.stages import data_stages

    cfg = resolve_paths(
        load_config(
            REPO / "configs" / "tiny.yaml",
            [
                "--data.inputs",
                json.dumps(inputs),
                "--data.output",
                str(work / "data"),
                "--data.max_seq_length",
                str(seq),
                "--train.storage_path",
                str(work / "runs"),
                "--train.num_workers",
                "1",
                "--train.cpus_per_worker",
                "1",
                "--train.micro_batch_size",
                "32",
                "--train.global_batch_size",
                "32",
                "--tracking.system_metrics_every_s",
                "0",
            ],
        )
    )
    res = run_graph(data_stages(cfg.data), remote=False, log=lambda m: None)
    return cfg, res["validate"].result


def ray_train_tokens_per_s(cfg, data, steps: int, skip: int) -> float:
    import dataclasses

    from pipeline import tracking
    from pipeline.pretrain.job import run_training

    tc = dataclasses.replace(
        cfg.train,
        max_steps=steps,
        warmup_steps=2,
        warmup_fraction=None,
        eval_every_steps=0,
        checkpoint_every_steps=steps,
        run_name=f"bench-{time.time_ns()}",
    )
    cfg = dataclasses.replace(cfg, train=tc)
    run_id = tracking.start_run("bench", tc.run_name, {})
    run_training(cfg, [data], run_id, tc.run_name, tracking.tracking_uri())
    c = tracking.client()
    tps = {m.step: m.value for m in c.get_metric_history(run_id, "train/tokens_per_s")}
    # total tokens / total time over the measured steps = harmonic mean of per-step rates weighted by tokens
    return statistics.median(tps[s] for s in range(skip + 1, steps + 1))


def _plan(cfg, data):
    from pipeline.pretrain.job import phase_plans

    return phase_plans(cfg, [data])[0]


def _plain_batches(cfg, data):
    """The exact micro-batches rank 0 of a 1-worker Ray Train run sees, read with pyarrow in this process."""
    import pyarrow.parquet as pq

    from pipeline.pretrain.loader import Batches, StepFeed

    plan = _plan(cfg, data)
    feed = StepFeed(
        plan,
        0,
        0,
        1,
        cfg.train.seed,
        cfg.train.shuffle_buffer_rows,
        0,
        lambda: (pq.read_table(f) for f in plan.train_files),
        Batches(plan, cfg.train.seed),
    )
    for step in feed:
        yield from step.micro_batches


def plain_tokens_per_s(cfg, data, steps: int, skip: int) -> tuple[float, float]:
    """(tokens/s of the plain loop including its data loading, model-only micro-batches/s)."""
    from pipeline.core.optim import OptimOptions, make_optimizer
    from pipeline.core.precision import forward
    from pipeline.pretrain.worker import initial_model

    tc = cfg.train
    torch.set_num_threads(max(1, int(tc.cpus_per_worker)))
    torch.manual_seed(tc.seed)
    model = initial_model(cfg.model, data.vocab_size).train()
    opt, sched = make_optimizer(
        model, OptimOptions(tc.optimizer, tc.lr, tc.weight_decay, warmup_steps=2, total_steps=steps)
    )
    rates, model_secs = [], []
    batches = _plain_batches(cfg, data)
    for step in range(steps):
        t0 = time.perf_counter()
        b = next(batches)
        t1 = time.perf_counter()
        out = forward(model, b, torch.device("cpu"), tc.precision)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        t2 = time.perf_counter()
        if step >= skip:
            rates.append(int(b["num_tokens"]) / (t2 - t0))
            model_secs.append(t2 - t1)
    return statistics.median(rates), 1.0 / statistics.median(model_secs)


def loader_batches_per_s(cfg, data, n: int) -> float:
    """The Ray Data loader path of a worker (streamed read_parquet, per-rank order, masking, padding)."""
    import ray

    from pipeline.pretrain.loader import Batches, StepFeed

    plan = _plan(cfg, data)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    files = list(plan.train_files)
    ds = ray.data.read_parquet(files).materialize() if cfg.train.materialize_data else ray.data.read_parquet(files)
    it = ds.iterator()
    feed = StepFeed(
        plan,
        0,
        0,
        1,
        0,
        cfg.train.shuffle_buffer_rows,
        0,
        lambda: it.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2),
        Batches(plan, 0),
    )
    got, t0 = 0, None
    for step in feed:
        if t0 is None:
            t0 = time.perf_counter()  # from the first batch on: steady state, not start-up
        got += len(step.micro_batches)
        if got >= n:
            break
    return (got - 1) / (time.perf_counter() - t0)


def unigram_accuracy(output: str) -> float:
    """Accuracy of predicting the most frequent training label at every held-out masked position."""
    import pyarrow.parquet as pq

    from pipeline.data.dataset import PreparedDataset
    from pipeline.data.masking import mask_batch
    from pipeline.pretrain.loader import arrow_rows

    ds = PreparedDataset.load(output, validate=False)
    files = [p for p, _ in ds.shards]
    policy = ds.policy() if ds.dynamic_masking else None

    def labels(path: str) -> list[int]:
        rows = arrow_rows(pq.read_table(path))
        if policy is not None:
            rows = mask_batch(rows, policy, seed=0, epoch=0)
        return [int(x) for r in rows["masked_lm_ids"] for x in r]

    counts = collections.Counter(x for f in files[:-1] for x in labels(f))
    top = counts.most_common(1)[0][0]
    held = labels(files[-1])
    return sum(x == top for x in held) / max(1, len(held))


def learning(work: Path, inputs: list[str], steps: int | None) -> tuple[float, float, str]:
    """Run the real job (configs/tiny.yaml) and read the final held-out MLM accuracy from MLflow."""
    import subprocess

    cmd = [
        sys.executable,
        str(REPO / "jobs" / "pretrain.py"),
        "--config",
        str(REPO / "configs" / "tiny.yaml"),
        "--data.inputs",
        json.dumps(inputs),
        "--data.output",
        str(work / "data"),  # prepared above: up to date
        "--train.storage_path",
        str(work / "learn-runs"),
        "--tracking.model_name",
        "bench-tiny",
    ]
    if steps:
        cmd += ["--train.max_steps", str(steps)]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'learn.db'}"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    os.environ["MLFLOW_TRACKING_URI"] = env["MLFLOW_TRACKING_URI"]
    from pipeline import tracking

    info = tracking.model_version_info("models:/bench-tiny@latest-pretrain")
    metrics = tracking.client().get_run(info["run_id"]).data.metrics
    acc = metrics["eval/final/mlm_accuracy"]
    base = unigram_accuracy(str(work / "data"))
    return acc, base, " ".join(cmd[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", nargs="+", default=[str(REPO.parent / "shared" / "corpora")])
    ap.add_argument("--steps", type=int, default=80, help="optimizer steps per throughput measurement")
    ap.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the medians")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--skip-learning", action="store_true")
    ap.add_argument("--learn-steps", type=int, default=None, help="override configs/tiny.yaml max_steps")
    ap.add_argument("--work", default=None)
    args = ap.parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-train-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'bench.db'}"
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        cfg, data = prepare(work, args.inputs, args.seq)
        print(f"data: {data.output} ({data.examples} examples, {data.tokens} tokens)", flush=True)
        # plain before and after Ray Train, averaged: the machine's load drifts during the run
        load = [os.getloadavg()[0]]
        plain_a, model_a = plain_tokens_per_s(cfg, data, args.steps, args.skip)
        ray_tps = ray_train_tokens_per_s(cfg, data, args.steps, args.skip)
        plain_b, model_b = plain_tokens_per_s(cfg, data, args.steps, args.skip)
        plain_tps, model_bps = (plain_a + plain_b) / 2, (model_a + model_b) / 2
        loader_bps = loader_batches_per_s(cfg, data, 200)
        load.append(os.getloadavg()[0])
        print(f"plain tokens/s before/after: {plain_a:,.0f} / {plain_b:,.0f}; Ray Train: {ray_tps:,.0f}", flush=True)
    finally:
        ray.shutdown()
    rows = [
        (
            "Ray Train tokens/s / plain PyTorch tokens/s (1 worker, 1 thread)",
            f"{ray_tps:,.0f} / {plain_tps:,.0f}",
            ray_tps / plain_tps,
            ">= 0.9",
        ),
        (
            "loader micro-batches/s / tiny model micro-batches/s (B=32)",
            f"{loader_bps:,.1f} / {model_bps:,.1f}",
            loader_bps / model_bps,
            ">= 5",
        ),
    ]
    if not args.skip_learning:
        acc, base, cmd = learning(work, args.inputs, args.learn_steps)
        rows.append(("tiny held-out MLM accuracy / unigram baseline", f"{acc:.4f} / {base:.4f}", acc / base, "> 1"))
    w = max(len(r[0]) for r in rows)
    print(f"\n{'measure'.ljust(w)}  {'values':>22}  {'ratio':>7}  goal")
    for name, vals, ratio, goal in rows:
        print(f"{name.ljust(w)}  {vals:>22}  {ratio:7.2f}  {goal}")
    print(
        f"\ntorch {torch.__version__}, {os.cpu_count()} CPUs, steps={args.steps} (first {args.skip} left out), seq={args.seq}, "  # noqa: E501
        f"1-min load average {load[0]:.1f} -> {load[1]:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
