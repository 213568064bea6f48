"""A real two-host cluster on one Linux machine (root only; tests/netns_hosts.py): two network namespaces joined
by a veth link, each with its own address, /tmp, /dev/shm, HOME and working directory, so no local path is shared
between them. On the head: a moto S3 server, an MLflow server (artifacts in the bucket) and the Ray head with token
auth; the second host joins with `ray start --address`. Everything durable is on S3.

The same `ray job submit` of `jobs/pretrain.py --config configs/tiny.yaml` (data prepared on Ray actors, storage
on S3) runs first on the head alone (one host, two workers), then, with the worker host joined, on two hosts
(two workers SPREAD, gloo over the veth). The shards are the same bytes, the final weights are equal, both
models register; the test prints the figures bench/RESULTS.md records ("Two hosts").
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time

import pytest

from tests import netns_hosts

pytestmark = pytest.mark.slow

BOOKS = ["08_Ruth.txt", "31_Obad.txt", "32_Jonah.txt", "34_Nahum.txt", "35_Hab.txt", "36_Zep.txt", "37_Hag.txt"]
ARGS = ["--config", "configs/tiny.yaml", "--data.vocab_size", "600", "--data.num_actors", "2",
        "--data.local_max_bytes", "0", "--train.max_steps", "40", "--train.warmup_steps", "4",
        "--train.eval_every_steps", "40", "--train.eval_batches", "2", "--train.checkpoint_every_steps", "10",
        "--tracking.system_metrics_every_s", "0"]


@pytest.fixture(scope="module")
def cluster(shared_dir):
    why = netns_hosts.usable()
    if why:
        pytest.skip(why)
    c = netns_hosts.TwoHostCluster()
    try:
        c.start_servers()
        c.start_head()
        c.wait_mlflow()
        fs = c.s3()
        for b in BOOKS:
            fs.put_file(str(shared_dir / "corpora/books" / b), f"{c.bucket}/corpus/books/{b}")
        yield c
    finally:
        c.close()


def test_two_hosts_train_like_one(cluster, repo_root, monkeypatch, tmp_path):
    from pipeline import tracking

    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root, capture_output=True, text=True).stdout.strip()
    b = cluster.bucket
    monkeypatch.setenv("MLFLOW_TRACKING_URI", cluster.mlflow_url)
    # This namespace stands for a laptop outside the cluster's network: it reaches MLflow (a tunnel) but not the
    # bucket's endpoint, so downloads stream through the server instead of MLflow 3's presigned S3 URLs.
    monkeypatch.setenv("MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD", "false")

    def job(name: str, *extra: str) -> tuple[str, dict]:
        args = [*ARGS, "--data.inputs", f"s3://{b}/corpus", "--data.output", f"s3://{b}/data/{name}",
                "--train.storage_path", f"s3://{b}/runs", "--train.run_name", name, *extra]
        t = time.time()
        rc, out = cluster.submit(repo_root, args, sha, timeout=420)
        assert rc == 0 and "succeeded" in out, out[-5000:]
        last = [x for x in out.splitlines() if x.startswith("registered models:/")]
        assert last, out[-3000:]
        version = tracking.model_version_info(last[-1].split(" ", 1)[1])
        print(f"[{name}] job {time.time() - t:.1f}s; " + "; ".join(
            re.findall(r"\[stage (?:shards|train)\] done in [0-9.]+s", out)))
        return out, version

    one_out, one = job("one-host", "--train.placement_strategy", "PACK")
    cluster.start_worker()
    two_out, two = job("two-hosts", "--train.placement_strategy", "SPREAD")

    assert "on 2 Ray actor(s) on 1 node(s)" in one_out and "on 2 Ray actor(s) on 2 node(s)" in two_out
    fs = cluster.s3()
    m1, m2 = (json.loads(fs.cat_file(f"{b}/data/{n}/manifest.json")) for n in ("one-host", "two-hosts"))
    assert m1["shards"] == m2["shards"] and m1["vocab_sha256"] == m2["vocab_sha256"]
    client = tracking.client()
    runs = {n: client.get_run(v["tags"]["run_id"]) for n, v in (("one", one), ("two", two))}
    assert (runs["one"].data.tags["num_nodes"], runs["two"].data.tags["num_nodes"]) == ("1", "2")
    assert runs["two"].data.tags["world_size"] == "2"
    weights = {}
    for n, v in (("one", one), ("two", two)):  # the registered files, through the MLflow server from the bucket
        local = tracking.download_model(f"models:/{v['name']}/{v['version']}", str(tmp_path / n))
        weights[n] = hashlib.sha256((tmp_path / n / local / "model.safetensors").read_bytes()).hexdigest()
    assert weights["one"] == weights["two"]
