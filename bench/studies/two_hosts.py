# Finished study, ran at 4577376 (2026-11-25): two hosts ÷ one: training tokens/s 1.00, data stage 1.78x slower
"""Two hosts vs one, on one machine: the tiny job (`configs/tiny.yaml`'s model, batch 32 x 128, two workers) and
its data stage on Ray actors, first on the head host alone (two workers PACKed), then with the worker host
joined (two workers SPREAD, gloo over the veth). Each host has 1 CPU slot of the machine's cores; the hosts are
tests/netns_hosts.py's network + mount namespaces (root only), data and checkpoints on a moto S3 server.

    sudo .venv/bin/python bench/studies/two_hosts.py [--steps 60]

Prints the data stage's wall time and the median train/tokens_per_s (steps after the first 10) of each run.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))
BOOKS = ["08_Ruth.txt", "31_Obad.txt", "32_Jonah.txt", "34_Nahum.txt", "35_Hab.txt", "36_Zep.txt", "37_Hag.txt"]


def main() -> None:
    import os

    import netns_hosts

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    a = p.parse_args()
    if why := netns_hosts.usable():
        sys.exit(why)
    c = netns_hosts.TwoHostCluster()
    try:
        c.start_servers()
        c.start_head()
        c.wait_mlflow()
        fs = c.s3()
        for book in BOOKS:
            fs.put_file(str(REPO.parent / "shared/corpora/books" / book), f"{c.bucket}/corpus/books/{book}")
        os.environ["MLFLOW_TRACKING_URI"] = c.mlflow_url
        from pipeline import tracking

        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        rows = []
        for name, placement in (("one-host", "PACK"), ("two-hosts", "SPREAD")):
            if name == "two-hosts":
                c.start_worker()
            args = [
                "--config",
                "configs/tiny.yaml",
                "--data.inputs",
                f"s3://{c.bucket}/corpus",
                "--data.output",
                f"s3://{c.bucket}/data/{name}",
                "--data.local_max_bytes",
                "0",
                "--data.num_actors",
                "2",
                "--train.storage_path",
                f"s3://{c.bucket}/runs",
                "--train.run_name",
                name,
                "--train.placement_strategy",
                placement,
                "--train.max_steps",
                str(a.steps),
                "--train.eval_every_steps",
                str(a.steps),
                "--train.eval_batches",
                "2",
                "--train.checkpoint_every_steps",
                str(a.steps),
                "--tracking.system_metrics_every_s",
                "0",
            ]
            t = time.time()
            rc, out = c.submit(REPO, args, sha, timeout=900)
            wall = time.time() - t
            if rc != 0 or "succeeded" not in out:
                sys.exit(out[-5000:])
            shards = float(re.search(r"\[stage shards\] done in ([0-9.]+)s", out).group(1))
            train = float(re.search(r"\[stage train\] done in ([0-9.]+)s", out).group(1))
            version = tracking.model_version_info(re.findall(r"registered (models:/\S+)", out)[-1])
            run = tracking.client().get_run(version["run_id"])
            hist = tracking.client().get_metric_history(version["run_id"], "train/tokens_per_s")
            tps = statistics.median(m.value for m in hist if m.step > 10)
            rows.append((name, run.data.tags["num_nodes"], shards, train, tps, wall))
        print(f"{'run':10} {'nodes':>5} {'data stage s':>12} {'train stage s':>13} {'tokens/s':>9} {'job s':>6}")
        for r in rows:
            print(f"{r[0]:10} {r[1]:>5} {r[2]:12.1f} {r[3]:13.1f} {r[4]:9,.0f} {r[5]:6.1f}")
        print(
            f"two hosts / one host: data stage x{rows[1][2] / rows[0][2]:.2f}, tokens/s x{rows[1][4] / rows[0][4]:.2f}"
        )
    finally:
        c.close()


if __name__ == "__main__":
    main()
