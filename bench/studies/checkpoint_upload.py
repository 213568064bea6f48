# Finished study, ran at 8153aed (2026-11-27): a BERT-base checkpoint to S3 stalls the loop 10.4 steps sync, 0.05 async
"""What a checkpoint costs the training loop when `train.storage_path` is on object storage: the wall time of the
steps before, at and after a checkpoint, uploaded in the foreground (`train.checkpoint_upload sync`) against in
the background (`async`, Ray Train's CheckpointUploadMode.ASYNC), in one run (issue 34's goal: a checkpoint
costs the loop no more than one step's time).

    python bench/studies/checkpoint_upload.py                          # BERT-base weights + AdamW state (~1.3 GB)
    python bench/studies/checkpoint_upload.py --preset small --steps 8

A real local Ray (2 CPUs) and a real `moto_server` on a loopback port (its objects in memory, as in the tests'
`s3_server`); each mode is one Ray Train run (TorchTrainer, 1 worker) whose loop trains BertForPreTraining with
the project's AdamW on random batches and, after step `--checkpoint-at`, writes the project's checkpoint
(`save_checkpoint`: safetensors weights, optimizer state, RNGs, sha256 of every file) into `cluster.checkpoint_dir`
and reports it with `cluster.report` as the pretraining loop does; in the background, rank 0's files are a
snapshot in memory that the upload thread writes and hashes (`DeferredFiles`). Each step's wall time includes the
checkpoint on the step that takes it. The stall is that step's time less one step without a checkpoint (the sync
run's median, as no upload runs beside its other steps); "extra" is the time of steps 2.. less as many such steps
(it includes what a background upload costs the steps it overlaps on a shared CPU). After the run the checkpoint is
read back from S3, its hashes checked (`damage`) and its weights and Adam moments compared with the model's at the
checkpoint step (sums in float64: a snapshot that is not a copy would carry the later steps' values).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def state_sums(weights: dict, optimizer: dict) -> list[float]:
    """Sum of the weights, of Adam's exp_avg, of its exp_avg_sq (float64): what the checkpoint must hold."""
    moments = optimizer["state"].values()
    return [
        sum(float(v.double().sum()) for _, v in sorted(weights.items())),
        *(sum(float(m[k].double().sum()) for m in moments) for k in ("exp_avg", "exp_avg_sq")),
    ]


def loop(cfg: dict) -> None:
    """One Ray Train worker: steps of BERT pretraining on random batches, one checkpoint, per-step wall times."""
    import torch

    from model import BertConfig, BertForPreTraining
    from pipeline import cluster
    from pipeline.core.checkpoint import save_checkpoint
    from pipeline.core.optim import OptimOptions, make_optimizer
    from pipeline.core.step import Trainable

    torch.manual_seed(0)
    torch.set_num_threads(1)  # the other core: the upload thread and the S3 server
    bc = BertConfig.from_preset(cfg["preset"])
    model = BertForPreTraining(bc)
    t = Trainable(model, *make_optimizer(model, OptimOptions("adamw", 1e-4, 0.01, warmup_steps=1, total_steps=100)))
    B, L = cfg["batch"], cfg["seq"]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, bc.vocab_size, (B, L), generator=g)
    pos = torch.arange(1, 1 + L // 8).repeat(B, 1)
    times, ckpt = [], {}
    for step in range(1, cfg["steps"] + 1):
        t0 = time.perf_counter()
        out = model(
            ids,
            torch.zeros_like(ids),
            torch.ones_like(ids),
            masked_lm_positions=pos,
            masked_lm_ids=torch.randint(5, bc.vocab_size, pos.shape, generator=g),
            next_sentence_label=torch.zeros(B, dtype=torch.long),
        )
        out.loss.backward()
        t.optimizer.step()
        t.scheduler.step()
        t.optimizer.zero_grad(set_to_none=True)
        if step == cfg["checkpoint_at"]:
            c0 = time.perf_counter()
            with cluster.checkpoint_dir(cfg["background"]) as d:
                deferred = save_checkpoint(d, 0, t, {"step": step, "world_size": 1}, background=cfg["background"])
                ckpt["save_s"] = time.perf_counter() - c0
                cluster.report({"step": step}, d, background=cfg["background"], deferred=deferred)
            ckpt["report_s"] = time.perf_counter() - c0 - ckpt["save_s"]
        times.append(time.perf_counter() - t0)
        if step == cfg["checkpoint_at"]:  # (outside the step's time)
            ckpt["sums"] = state_sums(model.state_dict(), t.optimizer.state_dict())
    Path(cfg["out"]).write_text(json.dumps({"times": times, **ckpt}))  # (Result.metrics: the checkpoint's report)


def run(mode: str, args, storage: str) -> dict:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from pipeline import cluster

    out = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
    cfg = {
        "out": out,
        "preset": args.preset,
        "batch": args.batch,
        "seq": args.seq,
        "steps": args.steps,
        "checkpoint_at": args.checkpoint_at,
        "background": cluster.uploads_in_background(mode, storage),
    }
    w0 = time.perf_counter()
    result = TorchTrainer(
        loop,
        train_loop_config=cfg,
        scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=f"upload-{mode}", storage_path=storage),
    ).fit()
    wall = time.perf_counter() - w0
    if result.error is not None:
        raise result.error
    m = json.loads(Path(out).read_text())
    os.unlink(out)
    return {**m, "wall_s": wall, "checkpoint": cluster.checkpoint_uri(result, storage) if result.checkpoint else None}


def summary(m: dict, at: int, normal: float) -> dict:
    """`normal`: one step's time without a checkpoint or an upload beside it (the sync run's median)."""
    times = m["times"]
    steady = times[1:]  # step 1: warm-up
    return {
        "median": statistics.median(x for i, x in enumerate(times, 1) if i not in (1, at)),
        "stall": times[at - 1] - normal,
        "extra": sum(steady) - len(steady) * normal,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="base")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--checkpoint-at", type=int, default=3)
    args = ap.parse_args()

    port = free_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    os.environ.update(env)
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        import boto3
        import ray

        boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(Bucket="bench")
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            runtime_env={"env_vars": {**env, "PYTHONPATH": str(REPO)}},
            log_to_driver=False,
        )
        import fsspec
        import torch
        from safetensors.torch import load

        from pipeline.core.checkpoint import damage, read_train_state

        results, fs = {}, fsspec.filesystem("s3")
        for mode in ("sync", "async"):
            m = run(mode, args, "s3://bench/runs")
            state = read_train_state(m["checkpoint"])
            where = m["checkpoint"].split("://", 1)[1]
            opt = torch.load(io.BytesIO(fs.cat(f"{where}/optimizer.pt")), weights_only=True)["optimizer"]
            results[mode] = {
                **m,
                "bytes": fs.du(where),
                "intact": damage(m["checkpoint"], state) is None and state["step"] == args.checkpoint_at,
                "same": state_sums(load(fs.cat(f"{where}/model.safetensors")), opt) == m["sums"],
            }
        normal = statistics.median(
            x for i, x in enumerate(results["sync"]["times"], 1) if i not in (1, args.checkpoint_at)
        )
        for r in results.values():
            r.update(summary(r, args.checkpoint_at, normal))
        ray.shutdown()
    finally:
        os.killpg(server.pid, 9)
        server.wait()

    at = args.checkpoint_at
    s, a = results["sync"], results["async"]
    print(
        f"\ncheckpoint: {args.preset} weights + AdamW state, {s['bytes'] / 1e9:.2f} GB, at step {at} of {args.steps}, "
        f"batch {args.batch} x {args.seq}, to moto S3 (s3://bench/runs), 1 Ray Train worker, 2 CPUs"
    )
    print(f"{'step':>14} | {'sync s':>8} | {'async s':>8}")
    for i in range(1, args.steps + 1):
        label = f"{i}" + (" (checkpoint)" if i == at else "")
        print(f"{label:>14} | {s['times'][i - 1]:8.2f} | {a['times'][i - 1]:8.2f}")
    rows = [
        ("median step", "median"),
        ("stall at ckpt", "stall"),
        ("extra, run", "extra"),
        ("save_checkpoint", "save_s"),
        ("report call", "report_s"),
        ("run wall", "wall_s"),
    ]
    for name, k in rows:
        print(f"{name:>14} | {s[k]:8.2f} | {a[k]:8.2f}")
    print(f"{'intact on S3':>14} | {str(s['intact']):>8} | {str(a['intact']):>8}")
    print(f"{f'step-{at} state':>14} | {str(s['same']):>8} | {str(a['same']):>8}")
    print(
        f"\none step without a checkpoint: {normal:.2f} s (the sync run's median). Stall async/sync: "
        f"{a['stall'] / s['stall']:.2f}x; async stall in steps: {a['stall'] / normal:.2f} (goal <= 1.00: "
        f"{'met' if a['stall'] <= normal else 'missed'}); sync stall in steps: {s['stall'] / normal:.2f}; "
        f"extra over the run, async/sync: {a['extra'] / s['extra']:.2f}x"
    )


if __name__ == "__main__":
    main()
