# Finished study, ran at f63fead (2026-11-28): without two Ray Train helper actors, 0.91 / 0.88 of a job's CPU-s
"""What a small job costs beyond its own work: the CPU-seconds of every process that a few-step pretraining job and
a few-step fine-tuning job take in a warm local Ray cluster, for one or more source trees, in one run.

    python bench/studies/job_cost.py --tree base=../wt-base --tree new=. --rounds 2 --jobs 2

The jobs have the test suite's shapes, where a job's fixed costs are most of what it costs (issue 31):
- pretraining: `jobs/pretrain.py --config configs/tiny.yaml` on seven shared books (vocabulary 600, 4 shards, NSP,
  15% masking), 24 steps of 32 rows on two Ray Train workers, then the final evaluation and the registration;
- fine-tuning: `jobs/finetune.py --model scratch:tiny` on 48 pydocs_topic rows, 6 steps on two workers, with a
  checkpoint every 2 steps and an evaluation each epoch, not registered.

For each round and tree (the order of the trees alternates from round to round, so that a change in the machine's
load falls on both sides of the ratio), a runner process with PYTHONPATH at the tree starts a local Ray cluster
(2 CPUs), runs one pretraining job that prepares the data, warms the cluster and leaves the tree's modules
compiled in its bytecode cache, as the test suite does (not counted), then `--jobs` jobs
of each kind, each a child process that joins the cluster (RAY_ADDRESS). Measured per job: wall time, and the
CPU-seconds of the runner's whole process tree while the job ran (bench/measure.py's Sampler over it, every
0.2 s: the job's driver, the Ray Train controller, workers and helper actors, Ray's daemons; a process that exits
loses at most its last 0.2 s).
Everything is written under one temporary directory, removed at the end (Ray's session logs too).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import REPO, Sampler, print_table  # noqa: E402
from measure import tree as process_tree  # noqa: E402 - `tree` here is a source tree
from two_hosts import BOOKS  # noqa: E402 - test_pretrain_job's seven books, as bench/studies/two_hosts.py runs them

SHARED = REPO.parent / "shared"


def job_commands(tree: Path, work: Path, name: str) -> dict[str, list[str]]:
    """The two jobs' command lines for `tree`'s code, writing under `work` (run `name`)."""
    data = [
        "--data.inputs",
        json.dumps([str(SHARED / "corpora/books" / b) for b in BOOKS]),
        "--data.output",
        str(work / "data"),
        "--data.vocab_size",
        "600",
        "--data.num_shards",
        "4",
        "--data.num_actors",
        "1",
        "--data.nsp",
        "true",
        "--data.mask_rate",
        "0.15",
        "--data.max_predictions_per_seq",
        "20",
    ]
    task = SHARED / "tasks/pydocs_topic"
    return {
        "pretrain": [
            sys.executable,
            str(tree / "jobs/pretrain.py"),
            "--config",
            str(tree / "configs/tiny.yaml"),
            *data,
            "--train.storage_path",
            str(work / "runs"),
            "--train.run_name",
            f"p-{name}",
            "--train.max_steps",
            "24",
            "--train.warmup_steps",
            "4",
            "--train.eval_every_steps",
            "8",
            "--train.checkpoint_every_steps",
            "12",
            "--train.micro_batch_size",
            "16",
            "--train.global_batch_size",
            "32",
            "--tracking.system_metrics_every_s",
            "2",
        ],
        "finetune": [
            sys.executable,
            str(tree / "jobs/finetune.py"),
            "--model",
            "scratch:tiny",
            "--task",
            "sequence-classification",
            "--train",
            str(task / "train.tsv"),
            "--eval",
            str(task / "dev.tsv"),
            "--data.tokenizer",
            str(work / "data/vocab.txt"),
            "--data.max_seq_length",
            "32",
            "--data.max_train_examples",
            "48",
            "--data.max_eval_examples",
            "24",
            "--train.epochs",
            "2",
            "--train.num_workers",
            "2",
            "--train.torch_threads",
            "1",
            "--train.batch_size",
            "4",
            "--train.accumulation_steps",
            "2",
            "--train.checkpoint_every_steps",
            "2",
            "--train.storage_path",
            str(work / "ftruns"),
            "--tracking.register",
            "false",
            "--tracking.run_name",
            f"f-{name}",
        ],
    }


def runner(tree: Path, work: Path, jobs: int) -> None:
    """(In the runner process) a local cluster, one warm-up job, then `jobs` jobs of each kind; BEGIN/END lines on
    stdout mark each measured job for the parent's sampler."""
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        configure_logging=False,
        log_to_driver=False,
        _temp_dir=str(work / "ray"),
    )
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONUNBUFFERED": "1"}
    try:
        for i in range(jobs + 1):
            for kind, cmd in job_commands(tree, work, str(i)).items():
                if i == 0 and kind == "finetune":
                    continue  # the warm-up is one pretraining job, which also prepares the data
                print(f"BEGIN {kind} {i}", flush=True)
                p = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True)
                if p.returncode != 0:
                    raise SystemExit(f"{kind} job failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
                print(f"END {kind} {i} {p.stdout.strip().splitlines()[-1]}", flush=True)
    finally:
        ray.shutdown()


def measure(tree: Path, jobs: int, tmp: Path, extra: dict[str, str]) -> dict[str, list[tuple[float, float]]]:
    """One runner for `tree` (`extra`: more environment for the cluster and the jobs): {kind: [(wall s, CPU s) per
    measured job]}."""
    work = Path(tempfile.mkdtemp(dir=tmp))
    env = {
        **os.environ,
        **extra,
        "PYTHONPATH": str(tree),
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(work),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("RAY_ADDRESS", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as the test suite does: each tree's modules compiled once, cached
    proc = subprocess.Popen(
        [sys.executable, __file__, "--runner", str(tree), str(work), str(jobs)],
        env=env,
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    sampler = Sampler(process_tree(proc.pid), count_from="process")
    sampler.start()
    out: dict[str, list[tuple[float, float]]] = {"pretrain": [], "finetune": []}
    start: tuple[float, float] = (0.0, 0.0)
    log = []
    for line in proc.stdout:
        log.append(line)
        if line.startswith("BEGIN "):
            time.sleep(0.3)  # one sampling period: the CPU before the job is all read
            start = (time.perf_counter(), sampler.cpu_seconds)
        elif line.startswith("END "):
            time.sleep(0.3)
            kind, i = line.split()[1:3]
            if i != "0":
                out[kind].append((time.perf_counter() - start[0] - 0.3, sampler.cpu_seconds - start[1]))
    proc.wait()
    sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: the runner failed:\n{''.join(log)[-4000:]}")
    shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a source tree to run (repeat; default: this one); the first is the reference",
    )
    ap.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME:VAR=VALUE",
        help="an environment variable for tree NAME's cluster and jobs (repeat); two names may give the "
        "same path, to compare settings",
    )
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2, help="measured jobs of each kind per round and tree")
    ap.add_argument("--runner", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.runner:
        runner(Path(args.runner[0]), Path(args.runner[1]), int(args.runner[2]))
        return 0
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree] or [("this", REPO)]
    extra: dict[str, dict[str, str]] = {name: {} for name, _ in trees}
    for e in args.env:
        name, _, var = e.partition(":")
        if name not in extra or "=" not in var:
            ap.error(f"--env {e}: expected NAME:VAR=VALUE with NAME one of {sorted(extra)}")
        extra[name][var.split("=", 1)[0]] = var.split("=", 1)[1]
    tmp = Path(tempfile.mkdtemp(prefix="job-cost-"))
    res: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for r in range(args.rounds):
            for name, tree in trees if r % 2 == 0 else trees[::-1]:
                load = os.getloadavg()[0]
                for kind, xs in measure(tree, args.jobs, tmp, extra[name]).items():
                    res.setdefault((kind, name), []).extend(xs)
                    print(
                        f"round {r + 1} {name:>6} {kind:>8}: "
                        + ", ".join(f"{c:.1f} CPU-s / {w:.1f} s" for w, c in xs)
                        + f"  (load {load:.1f})",
                        flush=True,
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for kind in ("pretrain", "finetune"):
        ref = statistics.median(c for _, c in res[kind, trees[0][0]])
        for name, _ in trees:
            xs = res[kind, name]
            cpu = statistics.median(c for _, c in xs)
            rows.append(
                (
                    kind,
                    name,
                    f"{cpu:.1f}",
                    " ".join(f"{c:.1f}" for _, c in xs),
                    f"{statistics.median(w for w, _ in xs):.1f}",
                    f"{cpu / ref:.2f}",
                )
            )
    print()
    print_table(("job", "tree", "CPU-s (median)", "CPU-s each job", "wall s (median)", f"CPU ÷ {trees[0][0]}"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
