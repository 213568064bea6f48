# Finished study, ran at 0470d62 (2026-11-24): checking a job's four S3 URIs costs about 1 s (goal < 2 s)
"""What the storage preflight (pipeline/storage/preflight.py) costs a job, on a local S3 server (issue 26's goal:
under 2 s for a job with 4 URIs).

    python bench/studies/preflight_cost.py             # 5 runs per case, median and max
    python bench/studies/preflight_cost.py --runs 3

A real `moto_server` on a loopback port (moto 5.2.5, s3fs 2026.9). Each run is a fresh interpreter, as a job is:
it times `import pipeline.storage.preflight` plus the first `check_storage` call (what the job pays: s3fs and
botocore are imported by it) and then the same call again in the same process (warm). The job's URIs: two inputs (read:
the object must exist), the output and `train.storage_path` (write: the bucket must exist). Failure cases time how
long a mistake takes to be reported: a misspelt bucket, a wrong endpoint (nothing listens), no credentials.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys, time
t0 = time.perf_counter()
from pipeline.storage.io import StorageError
from pipeline.storage.preflight import check_storage
targets = json.loads(sys.argv[1])
def once():
    try:
        check_storage(targets)
        return "ok"
    except StorageError as e:
        return str(e)
first = once()
t1 = time.perf_counter()
second = once()
t2 = time.perf_counter()
print(json.dumps({"cold": t1 - t0, "warm": t2 - t1, "result": first}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    try:
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        import boto3

        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
            region_name="us-east-1",
        )
        for b in ("corpus", "runs"):
            s3.create_bucket(Bucket=b)
        for k in ("books/a.txt", "wiki/w.jsonl"):
            s3.put_object(Bucket="corpus", Key=k, Body=b"text\n")
        job = [
            ["data.inputs", "s3://corpus/books", "read"],
            ["data.inputs", "s3://corpus/wiki/w.jsonl", "read"],
            ["data.output", "s3://corpus/prep", "write"],
            ["train.storage_path", "s3://runs/ckpt", "write"],
        ]
        no_creds = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        cases = [
            ("4 URIs, 2 buckets (ok)", job, env),
            ("misspelt output bucket", job[:2] + [["data.output", "s3://corpuss/prep", "write"]], env),
            ("wrong endpoint", job, {**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}),
            ("no credentials", job, no_creds),
        ]
        rows = []
        for name, targets, case_env in cases:
            res = []
            for _ in range(args.runs):
                p = subprocess.run(
                    [sys.executable, "-c", CHILD, json.dumps(targets)],
                    env=case_env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=True,
                )
                res.append(json.loads(p.stdout))
            cold = [r["cold"] for r in res]
            warm = [r["warm"] for r in res]
            rows.append((name, statistics.median(cold), max(cold), statistics.median(warm), res[0]["result"]))
    finally:
        os.killpg(server.pid, 9)
        server.wait()

    print(f"preflight cost, {args.runs} fresh interpreters per case, local moto_server ({endpoint})")
    print(f"{'case':<26} {'cold median':>11} {'cold max':>9} {'warm median':>11}  result")
    for name, cm, cx, wm, result in rows:
        print(f"{name:<26} {cm:>10.2f}s {cx:>8.2f}s {wm:>10.3f}s  {result[:110]}")


if __name__ == "__main__":
    main()
