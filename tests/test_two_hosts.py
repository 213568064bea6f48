"""A real two-host cluster on one Linux machine (root only; tests/netns_hosts.py): two network namespaces joined
by a veth link, each with its own address, /tmp, /dev/shm, HOME and working directory, so no local path is shared
between them. On the head: a moto S3 server, an MLflow server (artifacts in the bucket) and the Ray head with token
auth; the second host joins with `ray start --address`. Everything durable is on S3.

`ray job submit` of `jobs/pretrain.py --config configs/tiny.yaml` with test_pretrain_job.py's data and training
settings (data prepared on Ray actors, two Train workers SPREAD, gloo over the veth); the worker host crashes
after the first checkpoint and comes back. The job must still give the shards, the final weights and the per-step
losses of that module's one-host two-worker baseline (reused when it ran in this session, else run here), with
each step logged once. About 2 minutes on 2 cores, most of it the job itself (about 30 s of it the crash and
Ray's recovery); bench/two_hosts.py times one host against two.
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
    from pipeline.runner.dag import run_graph
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


def job_args(bucket: str, run_name: str) -> list[str]:
    """The baseline's data and training settings with the corpus, the prepared data and the checkpoints on S3, data
    on 2 actors, the Train workers SPREAD, and a checkpoint every step (not every 4): Ray Train records a
    checkpoint only when its controller next polls the workers (every 2 s), and the crash must still find steps to
    cut short; how often a run checkpoints changes no weight (resumption is exact)."""
    train = [*pj.FT_ARGS]
    train[train.index("--train.checkpoint_every_steps") + 1] = "1"
    return ["--config", "configs/tiny.yaml", *pj.DATA_ARGS, "--data.inputs", f"s3://{bucket}/corpus",
            "--data.output", f"s3://{bucket}/data", "--data.num_actors", "2", "--data.local_max_bytes", "0", *train,
            "--train.storage_path", f"s3://{bucket}/runs", "--train.run_name", run_name,
            "--train.placement_strategy", "SPREAD"]


def newest_step(s3, bucket: str, prefix: str) -> int:
    """The highest step of the checkpoints under `prefix` (one Ray Train may be deleting is skipped)."""
    steps = [0]
    for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []):
        if o["Key"].endswith("/train_state.json"):
            try:
                steps.append(json.loads(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())["step"])
            except s3.exceptions.NoSuchKey:
                pass
    return max(steps)


def run_with_crash(cluster, repo_root, args: list[str], run_name: str) -> tuple[str, dict]:
    """Submit the job in the background; as soon as Ray Train has recorded its first checkpoint on S3
    (`checkpoint_manager_snapshot.json`), crash the worker host (every process on it SIGKILLed: the raylet, its
    Train worker, Ray's agents; Ray's session files gone) and bring it back with `ray start --address`, as an
    operator (or the autoscaler) would. Ray Train (`train.max_failures`) restarts the worker group from the S3
    checkpoint; where Ray cannot recover within the job, it must fail in one line and the same command resume.
    Returns the output of the job that succeeded and the figures of the crash."""
    sha, s3 = pj.head_sha(repo_root), cluster.s3_client()
    log = cluster.head.path("/tmp/job.log")
    t0 = time.time()
    job = cluster.head.popen(cluster.submit_command(repo_root, args, sha), "/tmp/job.log")
    snapshot = f"runs/{run_name}/checkpoint_manager_snapshot.json"
    while not s3.list_objects_v2(Bucket=cluster.bucket, Prefix=snapshot).get("KeyCount"):  # bounded: 420 s
        assert job.poll() is None, f"the job ended before its first checkpoint:\n{log.read_text()[-5000:]}"
        assert time.time() < t0 + 420, "no checkpoint in 420 s"
        time.sleep(0.1)
    t_crash = time.time()
    killed = cluster.worker.crash()
    on_s3 = newest_step(s3, cluster.bucket, f"runs/{run_name}/")  # how far training had got: the margin
    cluster.start_worker(wait=False)
    t_back, t_resumed = time.time(), None
    while job.poll() is None:  # bounded: 300 s after the crash
        if t_resumed is None and "resumed at step" in log.read_text():
            t_resumed = time.time()
        assert time.time() < t_crash + 300, f"the job did not end 300 s after the crash:\n{log.read_text()[-5000:]}"
        time.sleep(0.2)
    t_end, rc, out = time.time(), job.returncode, log.read_text()
    crash = {"killed": killed, "on_s3": on_s3, "at_s": t_crash - t0, "back_s": t_back - t_crash, "rc": rc,
             "resumed_s": (t_resumed or t_end) - t_crash, "ended_s": t_end - t_crash, "job_s": t_end - t0}
    if rc != 0:  # Ray could not recover within the job: one line says why, and the same command resumes
        failures = [x for x in out.splitlines() if x.startswith("pretrain: ")]
        assert len(failures) == 1 and "error" in failures[0], out[-5000:]
        cluster.wait_nodes(2, "the worker host did not come back")
        rc, out = cluster.submit(repo_root, args, sha, timeout=420)
    assert rc == 0 and "succeeded" in out, out[-5000:]
    return out, crash


def test_two_hosts_train_like_one(cluster, reference, repo_root, monkeypatch):
    """`ray job submit` on the head of test_pretrain_job.py's baseline (same data settings, same training), with
    the corpus, the prepared data and the checkpoints on S3, checkpointing every step: the data actors and the
    two Train workers run on both hosts; the worker host crashes after the first checkpoint and comes back
    (`run_with_crash`); training resumes from S3. The shards, the per-step losses and the final weights are the
    uninterrupted baseline's (one host, two workers), each step is logged once in one MLflow run, and one model
    version is registered."""
    from pipeline import tracking
    from pipeline.cluster import checkpoints

    b, name = cluster.bucket, "two-hosts"
    out, crash = run_with_crash(cluster, repo_root, job_args(b, name), name)
    print(f"[two hosts] job {crash['job_s']:.1f}s; " + "; ".join(re.findall(r"\[stage \w+\] done in [0-9.]+s", out))
          + f"; the worker host crashed {crash['at_s']:.1f}s after the submit ({len(crash['killed'])} processes), back"
          f" in {crash['back_s']:.1f}s; the resumed line in the job's log {crash['resumed_s']:.1f}s and the job ended"
          f" {crash['ended_s']:.1f}s (rc {crash['rc']}) after the crash")
    assert "on 2 Ray actor(s) on 2 node(s)" in out, out[-5000:]  # the data passes ran on both hosts
    assert any(k.startswith("ray::RayTrainWorker") for k in crash["killed"]), crash["killed"]  # it trained there
    resumed = [int(s) for s in re.findall(r"\[rank 0\] resumed at step (\d+)", out)]
    assert resumed and 1 <= resumed[-1] < 8, out[-5000:]  # the crash hit training, which resumed from S3

    # This namespace stands for a laptop outside the cluster's network: it reaches MLflow (a tunnel) and, here,
    # the bucket at another address than the hosts do.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", cluster.mlflow_url)
    for k, v in cluster.s3_env().items():
        monkeypatch.setenv(k, v)
    registered = [x.split(" ", 1)[1] for x in out.splitlines() if x.startswith("registered models:/")]
    assert registered, out[-3000:]
    run_id = tracking.model_version_info(registered[-1])["run_id"]
    client = tracking.client()
    run = client.get_run(run_id)
    assert run.data.tags["world_size"] == "2"  # gloo across the veth (before the crash: the killed Train worker)
    print(f"[two hosts] killed {sorted(crash['killed'])} with steps 1-{crash['on_s3']} checkpointed; "
          f"resumed at step {resumed[-1]} on "
          f"{run.data.tags['num_nodes']} node(s)")
    for key in run.data.metrics:
        steps = [m.step for m in client.get_metric_history(run_id, key)]
        assert len(steps) == len(set(steps)), (key, sorted(steps))  # no step twice
    assert pj._history(run_id, "train/loss") == reference["losses"]  # steps 1..8, the baseline's values
    assert sorted(m.step for m in client.get_metric_history(run_id, "eval/loss")) == [4, 8]
    assert len(client.search_model_versions(f"run_id = '{run_id}'")) == 1
    assert len(client.search_runs([run.info.experiment_id], f"attributes.run_name = '{name}'")) == 1

    manifest = json.loads(cluster.s3().cat_file(f"{b}/data/manifest.json"))
    assert manifest["shards"] == reference["shards"]
    # The newest intact checkpoint is the last step's. A directory the crash cut short (a file of the killed host's
    # rank written, rank 0's train_state.json never) is listed as unreadable, as the job's own resume sees it.
    found = checkpoints(f"s3://{b}/runs", name)
    newest, state, _ = next(c for c in found if c[2] is None)
    assert state["step"] == 8 and pj.weights_digest(newest) == reference["digest"], [(u, w) for u, _, w in found]
    print(f"[two hosts] checkpoints on S3: {[(u.rsplit('/', 1)[-1], (s or {}).get('step'), w) for u, s, w in found]}")
    cluster.wait_nodes(2, "the worker host did not come back")  # the dead node gone, the restarted one alive
