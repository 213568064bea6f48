"""Hosts for a real two-host cluster test on one Linux machine (root only): each host is a network namespace of
its own (an address on a veth link, loopback) plus a private mount namespace with its own tmpfs `/tmp` (its
working directory, HOME and Ray's session directory live there) and `/dev/shm` (Ray's object store), so that no
local path is shared between hosts except the read-only repository and virtual environment.

A host is a holder process (`ip netns exec NS unshare --mount ... sleep`) whose namespaces every command enters
with `nsenter`; its files are reachable from outside as `/proc/<holder>/root/...`. `Hosts.close` kills every
process in the namespaces, deletes them and the links (the tmpfs mounts go with the last process in them).
Used by tests/test_two_hosts.py and bench/studies/two_hosts.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

VENV_BIN = str(Path(sys.executable).parent)
CLUSTER_IF = "cl0"  # the cluster link's name inside every host (GLOO_SOCKET_IFNAME), like cluster.yaml's `ens`


def usable() -> str | None:
    """Why this machine cannot run namespaced hosts, or None."""
    if os.geteuid() != 0:
        return "needs root (network and mount namespaces)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"needs `{tool}`"
    for p in (Path(__file__).resolve().parents[1], Path(sys.executable)):
        if str(p).startswith("/tmp/"):
            return f"{p} is under /tmp, which each host replaces with its own tmpfs"
    return None


def sh(cmd: list[str] | str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return r


class Host:
    def __init__(self, ns: str, address: str, env: dict[str, str], tmp_size: str = "2g") -> None:
        self.ns, self.address, self.env, self.tmp_size = ns, address, env, tmp_size
        self.holder: subprocess.Popen | None = None

    def start(self) -> None:
        """The holder: a private /tmp (with work/ and home/) and /dev/shm in the host's network namespace."""
        script = (
            f"mount -t tmpfs -o size={self.tmp_size},mode=1777 tmpfs /tmp && "
            "mount -t tmpfs -o size=1g tmpfs /dev/shm && "
            "mkdir -p /tmp/work /tmp/home/.ray && touch /tmp/.ready && exec sleep 7200"
        )
        self.holder = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            start_new_session=True,
        )
        for _ in range(100):  # `ip netns exec`, `unshare` and `exec sleep` keep the pid: its root is the host's view
            if self.path("/tmp/.ready").exists():
                return
            if self.holder.poll() is not None:
                raise RuntimeError(f"host {self.ns} did not start ({self.holder.returncode})")
            time.sleep(0.1)
        raise RuntimeError(f"host {self.ns} did not start in 10 s")

    def path(self, p: str) -> Path:
        """A path on this host, as seen from outside."""
        return Path(f"/proc/{self.holder.pid}/root{p}")

    def _argv(self, cmd: str, env: dict[str, str] | None) -> list[str]:
        full = {**self.env, **(env or {})}
        return [
            "nsenter",
            "-t",
            str(self.holder.pid),
            "-n",
            "-m",
            "env",
            "-i",
            *[f"{k}={v}" for k, v in full.items()],
            "sh",
            "-c",
            f"cd /tmp/work && {cmd}",
        ]

    def run(self, cmd: str, env: dict[str, str] | None = None, timeout: float = 120, check: bool = True):
        r = subprocess.run(self._argv(cmd, env), capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"[{self.ns}] {cmd} failed ({r.returncode}):\n{(r.stdout + r.stderr)[-4000:]}")
        return r

    def popen(self, cmd: str, log: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """A long-running command; its output goes to `log` (a path on the host, under /tmp)."""
        return subprocess.Popen(self._argv(f"exec {cmd} > {log} 2>&1", env), start_new_session=True)

    def crash(self) -> list[str]:
        """What a host that loses power does to its processes: SIGKILL every one in its namespaces (Ray's raylet,
        its workers and agents) but the holder, so its addresses and /tmp stay for a restart. Returns their names."""
        killed = kill_namespace(self.ns, keep=self.holder.pid)
        sh(["rm", "-rf", str(self.path("/tmp/ray"))])  # a rebooted host comes back without Ray's session files
        return killed


class Hosts:
    """`n` hosts on one link (10.77.0.1, .2, ...) and an uplink from this namespace to the first (the head), so
    that the test reaches the servers on it at `self.uplink`. Names carry the pid: parallel runs do not collide."""

    def __init__(self, n: int, env: dict[str, str], tmp_size: str = "2g") -> None:
        tag = os.getpid()
        self.names = [f"bp{tag}h{i}" for i in range(n)]
        self.up_if = f"bp{tag}up"
        sub = tag % 250
        self.uplink = f"10.213.{sub}.2"  # the head's address on the uplink; this namespace is 10.213.<sub>.1
        self.hosts: list[Host] = []
        try:
            for name in self.names:
                sh(["ip", "netns", "add", name])
            a, b = self.names[0], self.names[1]
            sh(
                [
                    "ip",
                    "link",
                    "add",
                    "name",
                    CLUSTER_IF,
                    "netns",
                    a,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    CLUSTER_IF,
                    "netns",
                    b,
                ]
            )
            sh(["ip", "link", "add", "name", self.up_if, "type", "veth", "peer", "name", "up0", "netns", a])
            sh(["ip", "addr", "add", f"10.213.{sub}.1/30", "dev", self.up_if])
            sh(["ip", "link", "set", self.up_if, "up"])
            sh(["ip", "-n", a, "addr", "add", f"{self.uplink}/30", "dev", "up0"])
            sh(["ip", "-n", a, "link", "set", "up0", "up"])
            for i, name in enumerate(self.names):
                address = f"10.77.0.{i + 1}"
                sh(["ip", "-n", name, "addr", "add", f"{address}/24", "dev", CLUSTER_IF])
                sh(["ip", "-n", name, "link", "set", CLUSTER_IF, "up"])
                sh(["ip", "-n", name, "link", "set", "lo", "up"])
                host = Host(name, address, env, tmp_size)
                self.hosts.append(host)
                host.start()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Kill every process in the namespaces (Ray's daemons included), delete the namespaces and the uplink."""
        for name in self.names:
            kill_namespace(name)
        for h in self.hosts:
            if h.holder is not None:
                try:
                    h.holder.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        sh(["ip", "link", "del", self.up_if], check=False)
        for name in self.names:
            sh(["ip", "netns", "del", name], check=False)


def kill_namespace(ns: str, keep: int | None = None) -> list[str]:
    """SIGKILL every process in network namespace `ns` but `keep`, until none is left (at most 3 rounds, for a
    child forked meanwhile); returns the names of those killed (`raylet`, `ray::RayTrainWorker`, ...)."""
    killed: list[str] = []
    for _ in range(3):
        pids = {int(p) for p in sh(["ip", "netns", "pids", ns], check=False).stdout.split()} - {keep}
        if not pids:
            break
        for p in pids:
            try:
                argv0 = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
                os.kill(p, signal.SIGKILL)
                killed.append(argv0.split(" ")[0].rsplit("/", 1)[-1])
            except (ProcessLookupError, FileNotFoundError):
                pass
        time.sleep(0.5)
    return killed


def wait_http(url: str, seconds: float, proc: subprocess.Popen | None = None) -> None:
    """Until `url` answers (any HTTP status), at most `seconds`."""
    import urllib.error
    import urllib.request

    deadline = time.time() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if (proc is not None and proc.poll() is not None) or time.time() > deadline:
                raise RuntimeError(f"{url} did not answer in {seconds:g} s") from None
            time.sleep(0.5)


def host_env(head: str) -> dict[str, str]:
    """What every host's processes carry (cluster.yaml's start commands export the same kinds of variables):
    token auth, the tracking server and the object store on the head, gloo on the cluster link."""
    return {
        "PATH": f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/tmp/home",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "RAY_AUTH_MODE": "token",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_DEDUP_LOGS": "0",
        "MLFLOW_TRACKING_URI": f"http://{head}:5000",
        "AWS_ENDPOINT_URL": f"http://{head}:5555",
        "MLFLOW_S3_ENDPOINT_URL": f"http://{head}:5555",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "GLOO_SOCKET_IFNAME": CLUSTER_IF,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        # After a host is lost for good, Ray Train's first restart still asks for the full worker group (Ray Data's
        # autoscaling coordinator, which it asks, looks at the nodes every 20 s) and waits this long for it before
        # trying the workers that fit (docs/cluster.md, "preemptible nodes"); Ray's default is 60 s.
        "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "30",
        # No autoscaler drains these hosts: Ray Train's preemption watcher (an actor per worker group start, 10
        # CPU-s of the module's 417) is off, as on the private clusters of pipeline.cluster.connect and the tests.
        "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    }


class TwoHostCluster:
    """Two hosts; on the head a moto S3 server (bucket `bucket`), an MLflow server with its artifacts in that
    bucket and the Ray head (dashboard on its loopback, as in cluster.yaml); Ray token auth on both hosts."""

    def __init__(self, bucket: str = "bert-cluster", tmp_size: str = "2g") -> None:
        import secrets

        self.bucket = bucket
        self.net = Hosts(2, host_env("10.77.0.1"), tmp_size)
        self.head, self.worker = self.net.hosts
        self.s3_url = f"http://{self.net.uplink}:5555"  # from this namespace
        self.mlflow_url = f"http://{self.net.uplink}:5000"
        token = secrets.token_hex(32)  # what `ray get-auth-token --generate` writes
        for h in self.net.hosts:  # cluster.yaml's file_mounts copy ~/.ray/auth_token to every node, mode 0600
            p = h.path("/tmp/home/.ray/auth_token")
            p.write_text(token)
            p.chmod(0o600)

    def start_servers(self) -> None:
        moto = self.head.popen("moto_server -H 0.0.0.0 -p 5555", "/tmp/moto.log")
        wait_http(self.s3_url, 120, moto)
        self.s3_client().create_bucket(Bucket=self.bucket)
        self.mlflow = self.head.popen(
            "mlflow server --host 0.0.0.0 --port 5000 --backend-store-uri sqlite:////tmp/mlflow.db "
            f"--artifacts-destination s3://{self.bucket}/mlflow-artifacts --workers 1",
            "/tmp/mlflow.log",
            env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )  # no GenAI job consumers (tests/conftest.py)

    def s3(self):
        """s3fs on the bucket's server, from this namespace."""
        import s3fs

        return s3fs.S3FileSystem(endpoint_url=self.s3_url, key="testing", secret="testing", skip_instance_cache=True)

    def s3_client(self):
        """boto3 on the bucket's server, from this namespace (uncached listings, for polling)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.s3_url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def s3_env(self) -> dict[str, str]:
        """The bucket's endpoint and credentials from this namespace (for pyarrow/s3fs/boto3 clients)."""
        return {
            "AWS_ENDPOINT_URL": self.s3_url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def wait_mlflow(self, seconds: float = 240) -> None:
        wait_http(self.mlflow_url + "/health", seconds, self.mlflow)

    # The head's GCS marks a node dead after this many failed health checks this far apart (Ray's defaults, 5 every
    # 3 s, take 15 s or more); a crashed host's raylet refuses at once, so 3 a second apart is as sure, sooner
    # (docs/cluster.md, "preemptible nodes").
    HEALTH_CHECKS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}

    def start_head(self, cpus: int = 1, object_store: int = 300_000_000) -> None:
        self.head.run(
            f"ray start --head --node-ip-address={self.head.address} --port=6379 --num-cpus={cpus} "
            f"--dashboard-host=127.0.0.1 --dashboard-port=8265 --object-store-memory={object_store} "
            "--disable-usage-stats",
            env=self.HEALTH_CHECKS,
            timeout=180,
        )

    def start_worker(self, cpus: int = 1, wait: bool = True, object_store: int = 300_000_000) -> None:
        """`ray start --address` on the worker host; with `wait`, until the head counts both hosts."""
        self.worker.run(
            f"ray start --address={self.head.address}:6379 --node-ip-address={self.worker.address} "
            f"--num-cpus={cpus} --object-store-memory={object_store} --disable-usage-stats",
            timeout=180,
        )
        if wait:
            self.wait_nodes(2, "the worker host never joined")

    def wait_nodes(self, n: int, why: str, seconds: int = 60) -> None:
        """Until the head counts `n` alive nodes (a crashed node counts until its health checks fail)."""
        for _ in range(seconds):  # bounded
            if self.alive_nodes() == n:
                return
            time.sleep(1)
        raise RuntimeError(why)

    def alive_nodes(self) -> int:
        r = self.head.run("ray list nodes --filter state=ALIVE --format json", check=False, timeout=60)
        import json

        try:
            return len(json.loads(r.stdout))
        except ValueError:
            return 0

    @staticmethod
    def submit_command(repo: Path, args: list[str], git_sha: str) -> str:
        """`ray job submit` on the head (as through the README's `ray dashboard` tunnel) of `jobs/pretrain.py
        ARGS`, the repository as the working directory."""
        import json
        import shlex

        env_json = json.dumps({"env_vars": {"GIT_SHA": git_sha}})
        return (
            f"ray job submit --address http://127.0.0.1:8265 --working-dir {shlex.quote(str(repo))} "
            f"--runtime-env-json {shlex.quote(env_json)} -- python jobs/pretrain.py "
            + " ".join(shlex.quote(a) for a in args)
        )

    def submit(self, repo: Path, args: list[str], git_sha: str, timeout: float = 600):
        """Submit and wait; returns (exit code, the job's output)."""
        r = self.head.run(self.submit_command(repo, args, git_sha), timeout=timeout, check=False)
        return r.returncode, r.stdout + r.stderr

    def close(self) -> None:
        self.net.close()
