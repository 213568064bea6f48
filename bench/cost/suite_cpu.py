"""Each test's CPU-seconds in a pytest run (issue 31: the suite is bound by CPU, so CPU is what a test costs).

    python bench/cost/suite_cpu.py --top 25 -- -q -p no:cacheprovider        # the whole suite, as CI runs it
    python bench/cost/suite_cpu.py --top 15 -- -q -m "not slow"              # the quick loop

Runs pytest with the given arguments and this module as a plugin (`-p suite_cpu`): each test process writes when
each test starts and ends. Meanwhile a thread here polls every process's CPU time (psutil) every `--every` seconds
and charges each increase to the pytest process (a pytest-xdist worker, or pytest itself with `-n 0`) the process
descends from, and so to the test that process was running then; CPU between tests (a module's fixtures made or
torn down) goes to the next test of that process. What is not charged: processes that left the tree (daemonized
ones: `ray start`'s, PostgreSQL's), the poller itself, other work on the machine, and the last interval of a
process that exits between two polls. Prints the modules and the tests by CPU-seconds, with each test's wall time.
Everything is written under one temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

EVENTS = "SUITE_CPU_EVENTS"


# --- the pytest plugin (loaded in every test process through `-p suite_cpu`) ---


def _event(kind: str, nodeid: str) -> None:
    with open(os.environ[EVENTS], "a") as f:  # one short line per write: appends from two processes do not mix
        f.write(json.dumps({"k": kind, "id": nodeid, "pid": os.getpid(), "t": time.time()}) + "\n")


def pytest_runtest_logstart(nodeid, location):  # noqa: ARG001 - pytest's hook signature
    if EVENTS in os.environ:
        _event("start", nodeid)


def pytest_runtest_logfinish(nodeid, location):  # noqa: ARG001 - pytest's hook signature
    if EVENTS in os.environ:
        _event("end", nodeid)


# --- the poller and the report ---


def _owners(events: Path) -> set[int]:
    try:
        return {json.loads(line)["pid"] for line in events.read_text().splitlines() if line.strip()}
    except OSError:
        return set()


def poll(events: Path, every: float, stop: threading.Event, ticks: list) -> None:
    """Every `every` s: each process's CPU increase, summed per owning test process (its pid; 'other' when none)."""
    import psutil

    last: dict[tuple[int, float], float] = {}
    owner: dict[tuple[int, float], int] = {}
    first = True
    while not stop.is_set():
        t, deltas, owners = time.time(), collections.Counter(), _owners(events)
        procs = {p.info["pid"]: p.info for p in psutil.process_iter(["pid", "ppid", "create_time", "cpu_times"])}
        for pid, info in procs.items():
            if info["cpu_times"] is None:
                continue
            key, cpu = (pid, info["create_time"]), info["cpu_times"].user + info["cpu_times"].system
            if key not in owner:
                q, hops = pid, 0
                while q in procs and hops < 64:  # the nearest ancestor that is a test process
                    if q in owners:
                        owner[key] = q
                        break
                    q, hops = procs[q]["ppid"], hops + 1
            delta = cpu - last.get(key, cpu if first else 0.0)  # what ran before the first poll is not counted
            last[key] = cpu
            if delta > 0:
                deltas[owner.get(key, "other")] += delta
        ticks.append((t, dict(deltas)))
        first = False
        stop.wait(max(0.0, every - (time.time() - t)))


def report(events: Path, ticks: list, top: int) -> str:
    spans: dict[int, list[tuple[float, float, str]]] = collections.defaultdict(list)
    started: dict[tuple[int, str], float] = {}
    for e in map(json.loads, events.read_text().splitlines()):
        if e["k"] == "start":
            started[(e["pid"], e["id"])] = e["t"]
        elif (e["pid"], e["id"]) in started:
            spans[e["pid"]].append((started.pop((e["pid"], e["id"])), e["t"], e["id"]))
    for v in spans.values():
        v.sort()
    starts = {pid: [s for s, _, _ in v] for pid, v in spans.items()}
    cpu, wall, other = collections.Counter(), collections.Counter(), 0.0
    for pid, v in spans.items():
        for s, e, test in v:
            wall[test] = max(wall[test], e - s)  # with xdist the controller logs each test too
    for t, deltas in ticks:
        for pid, d in deltas.items():
            v = spans.get(pid) if pid != "other" else None
            if not v:
                other += d
                continue
            i = bisect.bisect_right(starts[pid], t) - 1
            test = v[i][2] if i >= 0 and t <= v[i][1] + 1.0 else v[min(i + 1, len(v) - 1)][2]
            cpu[test] += d
    modules = collections.Counter()
    for test, c in cpu.items():
        modules[test.split("::")[0]] += c
    lines = [
        f"CPU-s charged to tests {sum(cpu.values()):.0f}, not charged {other:.0f}",
        "",
        "| module | CPU-s |",
        "|---|---:|",
    ]
    lines += [f"| {m} | {c:.0f} |" for m, c in modules.most_common(top)]
    lines += ["", "| test | CPU-s | wall s |", "|---|---:|---:|"]
    lines += [f"| {t} | {c:.1f} | {wall[t]:.1f} |" for t, c in cpu.most_common(top)]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=float, default=0.5, help="seconds between polls")
    ap.add_argument("--top", type=int, default=25, help="how many modules and tests to print")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: pytest's arguments")
    a = ap.parse_args()
    args = a.pytest_args[1:] if a.pytest_args[:1] == ["--"] else a.pytest_args
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as d:
        events = Path(d) / "events.jsonl"
        events.touch()
        here = str(Path(__file__).resolve().parent)
        env = {
            **os.environ,
            EVENTS: str(events),
            "PYTHONPATH": os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])]),
        }
        stop, ticks = threading.Event(), []
        poller = threading.Thread(target=poll, args=(events, a.every, stop, ticks), daemon=True)
        poller.start()
        rc = subprocess.call([sys.executable, "-m", "pytest", "-p", "suite_cpu", *args], env=env)
        stop.set()
        poller.join()
        print(report(events, ticks, a.top))
    return rc


if __name__ == "__main__":
    sys.exit(main())
