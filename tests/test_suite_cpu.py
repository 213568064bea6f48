"""bench/cost/suite_cpu.py: how CPU polled per process is charged to tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO, load_bench


def test_cpu_is_charged_to_the_test_its_process_was_running(tmp_path):
    """Two test processes: a tick inside a test goes to that test, one between two tests (a module's fixture) to
    the next, one of a process that is no test process's to 'not charged'; the tables sum to the ticks."""
    sc = load_bench("suite_cpu")
    events = tmp_path / "events.jsonl"
    rows = [
        ("start", "a.py::one", 1, 10.0),
        ("end", "a.py::one", 1, 20.0),
        ("start", "a.py::two", 1, 30.0),
        ("end", "a.py::two", 1, 31.0),
        ("start", "b.py::three", 2, 10.0),
        ("end", "b.py::three", 2, 40.0),
    ]
    events.write_text("".join(json.dumps({"k": k, "id": i, "pid": p, "t": t}) + "\n" for k, i, p, t in rows))
    ticks = [(15.0, {1: 2.0, 2: 1.0}), (25.0, {1: 4.0, "other": 0.5}), (30.5, {1: 1.0, 2: 1.0})]
    out = sc.report(events, ticks, top=5)
    assert "CPU-s charged to tests 9, not charged 0" in out
    table = {line.split(" | ")[0].lstrip("| "): line for line in out.splitlines() if line.startswith("| ")}
    assert table["a.py::one"] == "| a.py::one | 2.0 | 10.0 |"
    assert table["a.py::two"] == "| a.py::two | 5.0 | 1.0 |"  # 4 of it between the two tests: the second's fixture
    assert table["b.py::three"] == "| b.py::three | 2.0 | 30.0 |"
    assert table["a.py"] == "| a.py | 7 |" and table["b.py"] == "| b.py | 2 |"


@pytest.mark.slow  # a pytest process of its own and 1.5 CPU-s burned: kept out of the quick loop
def test_the_plugin_logs_each_test_and_the_poller_finds_its_children(tmp_path):
    """A real pytest with the plugin: each test's start and end from its process; a child process that burns CPU
    is charged to the pytest process it descends from."""
    sc = load_bench("suite_cpu")
    (tmp_path / "test_x.py").write_text(
        "import subprocess, sys\n"
        "def test_burn():\n"
        "    subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
        "while time.process_time() - t < 1.5: pass'], check=True)\n"
    )
    events = tmp_path / "events.jsonl"
    events.touch()
    stop, ticks = threading.Event(), []
    poller = threading.Thread(target=sc.poll, args=(events, 0.2, stop, ticks), daemon=True)
    poller.start()
    env = {**os.environ, sc.EVENTS: str(events), "PYTHONPATH": str(REPO / "bench" / "cost")}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "suite_cpu",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            "-c",
            os.devnull,
            str(tmp_path / "test_x.py"),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    time.sleep(0.3)
    stop.set()
    poller.join()
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    logged = [json.loads(line) for line in events.read_text().splitlines()]
    assert [(e["k"], e["id"].split("::")[-1]) for e in logged] == [("start", "test_burn"), ("end", "test_burn")]
    out = sc.report(events, ticks, top=5)
    burned = float(next(line for line in out.splitlines() if "test_burn |" in line).split(" | ")[1])
    assert 1.0 <= burned <= 3.0, out  # the child's 1.5 s (less its last interval), and the test process's own
