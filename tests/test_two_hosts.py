"""A real two-host cluster on one Linux machine (root only; tests/netns_hosts.py): two network namespaces joined
by a veth link, each with its own address, /tmp, /dev/shm, HOME and working directory, so no local path is shared
between them. On the head: a moto S3 server, an MLflow server (artifacts in the bucket) and the Ray head with token
auth; the second host joins with `ray start --address`. Everything durable is on S3.

`ray job submit` of `jobs/pretrain.py --config configs/tiny.yaml` with test_pretrain_job.py's data and training
settings (data prepared on Ray actors, two Train workers SPREAD, gloo over the veth) must give the shards, the
final weights and the per-step losses of that module's one-host two-worker baseline (reused when it ran in this
session, else run here). The same job again, with the worker host crashing after its first checkpoint and coming
back, must still give them. About 2.5 minutes on 2 cores, most of it the two jobs; bench/two_hosts.py times one
host against two.
"""

from __future__ import annotations

import json
import re
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


@pytest.fixture(scope="module")
def reference(one_host_reference, shared_dir, tmp_path_factory) -> dict:
    """test_pretrain_job.py's one-host baseline (`shards`, `digest`, `losses`), or the same run here once."""
    return dict(one_host_reference) or one_host_run(shared_dir, tmp_path_factory.mktemp("one-host"))


def one_host_run(shared_dir, tmp_path) -> dict:
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
    with pytest.MonkeyPatch.context() as m:
        m.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'one-host.db'}")
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
        try:
            digest, run_id = pj._train({"args": args, "validate": validate}, tmp_path, "one-host")
            losses = pj._history(run_id, "train/loss")
        finally:
            ray.shutdown()
    return {"digest": digest, "shards": validate.manifest["shards"], "losses": losses}


def job_args(bucket: str, run_name: str, checkpoint_every_steps: int = 4) -> list[str]:
    """The baseline's data and training settings with the corpus, the prepared data and the checkpoints on S3, data
    on 2 actors, the Train workers SPREAD. How often it checkpoints changes no weight (resumption is exact)."""
    train = [*pj.FT_ARGS]
    train[train.index("--train.checkpoint_every_steps") + 1] = str(checkpoint_every_steps)
    return ["--config", "configs/tiny.yaml", *pj.DATA_ARGS, "--data.inputs", f"s3://{bucket}/corpus",
            "--data.output", f"s3://{bucket}/data", "--data.num_actors", "2", "--data.local_max_bytes", "0", *train,
            "--train.storage_path", f"s3://{bucket}/runs", "--train.run_name", run_name,
            "--train.placement_strategy", "SPREAD"]


def check_trained_like_reference(cluster, out: str, run_name: str, reference: dict, monkeypatch):
    """The job's registered version, its MLflow run (each train/eval step logged once, the losses the reference's)
    and its final weights (the reference's); returns (MLflow client, run id)."""
    from pipeline import tracking
    from pipeline.core.launcher import checkpoints

    # This namespace stands for a laptop outside the cluster's network: it reaches MLflow (a tunnel) and, here,
    # the bucket at another address than the hosts do.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", cluster.mlflow_url)
    for k, v in cluster.s3_env().items():
        monkeypatch.setenv(k, v)
    registered = [x.split(" ", 1)[1] for x in out.splitlines() if x.startswith("registered models:/")]
    assert registered, out[-3000:]
    run_id = tracking.model_version_info(registered[-1])["run_id"]
    client = tracking.client()
    for key in client.get_run(run_id).data.metrics:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), (key, sorted(steps))  # no step twice
    assert pj._history(run_id, "train/loss") == reference["losses"]  # steps 1..8, the same values
    assert sorted(m.step for m in client.get_metric_history(run_id, "eval/loss")) == [4, 8]
    newest, _, why = checkpoints(f"s3://{cluster.bucket}/runs", run_name)[0]
    assert why is None and pj.weights_digest(newest) == reference["digest"]
    return client, run_id


def test_two_hosts_train_like_one(cluster, reference, repo_root, monkeypatch):
    """`ray job submit` on the head of test_pretrain_job.py's baseline (same data settings, same training), with
    the corpus, the prepared data and the checkpoints on S3: the data actors and the two Train workers run on both
    hosts; the shards, the losses and the final weights are the baseline's (one host, two workers); the model
    registers and every step is logged once."""
    b = cluster.bucket
    t = time.time()
    rc, out = cluster.submit(repo_root, job_args(b, "two-hosts"), pj.head_sha(repo_root), timeout=420)
    assert rc == 0 and "succeeded" in out, out[-5000:]
    print(f"[two hosts] job {time.time() - t:.1f}s; " + "; ".join(re.findall(r"\[stage \w+\] done in [0-9.]+s", out)))
    assert "on 2 Ray actor(s) on 2 node(s)" in out, out[-5000:]  # the data passes ran on both hosts

    client, run_id = check_trained_like_reference(cluster, out, "two-hosts", reference, monkeypatch)
    run = client.get_run(run_id)
    assert run.data.tags["num_nodes"] == "2" and run.data.tags["world_size"] == "2"  # gloo across the veth
    manifest = json.loads(cluster.s3().cat_file(f"{b}/data/manifest.json"))
    assert manifest["shards"] == reference["shards"]


def test_worker_host_crash_mid_training(cluster, reference, repo_root, monkeypatch):
    """The same job under its own run name, checkpointing every 2 steps. As soon as Ray Train has recorded its
    first checkpoint on S3 (`checkpoint_manager_snapshot.json`), the worker host crashes: every process on it is
    SIGKILLed (the raylet, the Train worker, Ray's agents) and Ray's session files go; then it rejoins with `ray
    start --address`. Ray Train (`train.max_failures`) restarts the worker group from the S3 checkpoint and the
    job succeeds; or, where Ray cannot recover in the job, it fails in one line and the same command resumes. The
    final weights and the per-step losses are the uninterrupted baseline's, each step is logged once in one MLflow
    run, and one model version is registered. About 50 s."""
    b, name = cluster.bucket, "two-hosts-crash"
    args, sha = job_args(b, name, checkpoint_every_steps=2), pj.head_sha(repo_root)
    s3, log = cluster.s3_client(), cluster.head.path("/tmp/crash-job.log")
    t0 = time.time()
    job = cluster.head.popen(cluster.submit_command(repo_root, args, sha), "/tmp/crash-job.log")
    snapshot = f"runs/{name}/checkpoint_manager_snapshot.json"
    while not s3.list_objects_v2(Bucket=b, Prefix=snapshot).get("KeyCount"):  # bounded: the job ends or 300 s
        assert job.poll() is None, f"the job ended before its first checkpoint:\n{log.read_text()[-5000:]}"
        assert time.time() < t0 + 300, "no checkpoint in 300 s"
        time.sleep(0.1)
    t_kill = time.time()
    killed = cluster.worker.crash()
    cluster.start_worker(wait=False)  # `ray start --address` on the host, as an operator (or autoscaler) would
    t_back, t_resumed = time.time(), None
    while job.poll() is None:  # bounded: 300 s after the crash
        if t_resumed is None and "resumed at step" in log.read_text():
            t_resumed = time.time()
        assert time.time() < t_kill + 300, f"the job did not end in 300 s after the crash:\n{log.read_text()[-5000:]}"
        time.sleep(0.2)
    t_end, rc, out = time.time(), job.returncode, log.read_text()
    print(f"[two hosts crash] {killed} processes killed {t_kill - t0:.1f}s after the submit; the host back in "
          f"{t_back - t_kill:.1f}s; training resumed {(t_resumed or t_end) - t_kill:.1f}s and the job ended "
          f"{t_end - t_kill:.1f}s (rc {rc}) after the crash; job {t_end - t0:.1f}s; "
          + "; ".join(re.findall(r"\[stage \w+\] done in [0-9.]+s", out)))
    if rc != 0:  # Ray could not recover within the job: one line says why, and the same command resumes
        failures = [x for x in out.splitlines() if x.startswith("pretrain: ")]
        assert len(failures) == 1 and "error" in failures[0], out[-5000:]
        cluster.wait_nodes(2, "the worker host did not come back")
        rc, out = cluster.submit(repo_root, args, sha, timeout=420)
    assert rc == 0 and "succeeded" in out, out[-5000:]
    resumed = [int(s) for s in re.findall(r"\[rank 0\] resumed at step (\d+)", out)]
    assert resumed and 2 <= resumed[-1] < 8, out[-5000:]  # the crash hit training, which resumed from S3

    client, run_id = check_trained_like_reference(cluster, out, name, reference, monkeypatch)
    assert len(client.search_model_versions(f"run_id = '{run_id}'")) == 1
    exp = client.get_experiment(client.get_run(run_id).info.experiment_id)
    assert len(client.search_runs([exp.experiment_id], f"attributes.run_name = '{name}'")) == 1
    cluster.wait_nodes(2, "the worker host did not come back")  # the dead node gone, the restarted one alive
