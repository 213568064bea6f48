"""A real two-host cluster on one Linux machine (root only; tests/netns_hosts.py): two network namespaces joined
by a veth link, each with its own address, /tmp, /dev/shm, HOME and working directory, so no local path is shared
between them. On the head: a moto S3 server, an MLflow server (artifacts in the bucket) and the Ray head with token
auth; the second host joins with `ray start --address`. Everything durable is on S3.

`ray job submit` of `jobs/pretrain.py --config configs/tiny.yaml` with test_pretrain_job.py's data and training
settings (data prepared on Ray actors, two Train workers SPREAD, gloo over the veth) must give the shards and the
final weights of that module's one-host two-worker baseline (reused when it ran in this session, else run here).
About 2 minutes on 2 cores, most of it the job itself; bench/two_hosts.py times one host against two.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

import netns_hosts
import test_pretrain_job as pj

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(shared_dir):
    why = netns_hosts.usable()
    if why:
        pytest.skip(why)
    c = netns_hosts.TwoHostCluster()
    try:
        c.start_servers()
        c.start_head()
        c.start_worker()
        c.wait_mlflow()
        fs = c.s3()
        for b in pj.BOOKS:  # test_pretrain_job's books, in the same sorted order under one prefix
            fs.put_file(str(shared_dir / "corpora/books" / b), f"{c.bucket}/corpus/books/{b}")
        yield c
    finally:
        c.close()


def one_host_run(shared_dir, tmp_path, monkeypatch) -> dict:
    """test_pretrain_job.py's baseline, when this module runs without it: the same data prepared on this host
    (no Ray) and the same two-worker training on a private local Ray."""
    import ray

    from pipeline.config import load_config, resolve_paths
    from pipeline.dag import run_graph
    from pipeline.data.stages import data_stages

    inputs = [str(shared_dir / "corpora/books" / b) for b in pj.BOOKS]
    args = ["--data.inputs", json.dumps(inputs), "--data.output", str(tmp_path / "data"), *pj.DATA_ARGS]
    cfg = resolve_paths(load_config(Path(pj.__file__).parents[1] / "configs/tiny.yaml", args))
    validate = run_graph(data_stages(cfg.data), remote=False, log=lambda m: None)["validate"].result
    with monkeypatch.context() as m:
        m.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'one-host.db'}")
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
        try:
            digest, _ = pj._train({"args": args, "validate": validate}, tmp_path, "one-host")
        finally:
            ray.shutdown()
    return {"digest": digest, "shards": validate.manifest["shards"]}


def test_two_hosts_train_like_one(cluster, one_host_reference, shared_dir, repo_root, monkeypatch, tmp_path):
    """`ray job submit` on the head of test_pretrain_job.py's baseline (same data settings, same training), with
    the corpus, the prepared data and the checkpoints on S3: the data actors and the two Train workers run on both
    hosts; the shards and the final weights are the baseline's (one host, two workers); the model registers and
    every step is logged once."""
    from pipeline import tracking
    from pipeline.core.launcher import checkpoints

    reference = dict(one_host_reference) or one_host_run(shared_dir, tmp_path, monkeypatch)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root, capture_output=True, text=True).stdout.strip()
    b = cluster.bucket
    args = ["--config", "configs/tiny.yaml", *pj.DATA_ARGS, "--data.inputs", f"s3://{b}/corpus",
            "--data.output", f"s3://{b}/data", "--data.num_actors", "2", "--data.local_max_bytes", "0", *pj.FT_ARGS,
            "--train.storage_path", f"s3://{b}/runs", "--train.run_name", "two-hosts",
            "--train.placement_strategy", "SPREAD"]
    t = time.time()
    rc, out = cluster.submit(repo_root, args, sha, timeout=420)
    assert rc == 0 and "succeeded" in out, out[-5000:]
    print(f"[two hosts] job {time.time() - t:.1f}s; " + "; ".join(re.findall(r"\[stage \w+\] done in [0-9.]+s", out)))
    assert "on 2 Ray actor(s) on 2 node(s)" in out, out[-5000:]  # the data passes ran on both hosts

    # This namespace stands for a laptop outside the cluster's network: it reaches MLflow (a tunnel) and, here,
    # the bucket at another address than the hosts do.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", cluster.mlflow_url)
    for k, v in cluster.s3_env().items():
        monkeypatch.setenv(k, v)
    registered = [x.split(" ", 1)[1] for x in out.splitlines() if x.startswith("registered models:/")]
    assert registered, out[-3000:]
    version = tracking.model_version_info(registered[-1])
    client = tracking.client()
    run = client.get_run(version["run_id"])
    assert run.data.tags["num_nodes"] == "2" and run.data.tags["world_size"] == "2"  # gloo across the veth
    steps = [m.step for m in client.get_metric_history(version["run_id"], "train/loss")]
    assert sorted(steps) == list(range(1, 9))

    manifest = json.loads(cluster.s3().cat_file(f"{b}/data/manifest.json"))
    assert manifest["shards"] == reference["shards"]
    checkpoint = checkpoints(f"s3://{b}/runs", "two-hosts")[0][0]
    assert pj.weights_digest(checkpoint) == reference["digest"]
