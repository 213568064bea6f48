"""bench/gpu/gpu_e2e.py's loop-vs-step check: the loop's steady tokens/s over the product step's alone, read from
bench/train/train_step.py's --json line; at the goal it passes, under it or without a reference it fails and says
why."""

from __future__ import annotations

import json

import pytest

from conftest import load_bench


@pytest.fixture(scope="module")
def e2e():
    return load_bench("gpu_e2e")


def _loopref(path, tok_s: float) -> None:
    rows = [
        {"impl": "ours", "tok_s": 1.0},
        {"impl": "ours+real", "tok_s": tok_s},
        {"impl": "ours+real+compile", "tok_s": 2 * tok_s},
    ]
    path.write_text(json.dumps({"setting": {"batch": 32}, "rows": rows}) + "\n")


@pytest.mark.parametrize("loop, ok", [(95_000.0, True), (90_000.0, True), (89_000.0, False)])
def test_loop_vs_step_ratio_against_the_goal(e2e, tmp_path, loop, ok):
    _loopref(tmp_path / "loopref.jsonl", 100_000.0)
    checks, summary = [], {"tokens_per_s_median": {0: loop, 1: 50_000.0}}
    e2e.loop_vs_step(
        lambda name, good, figure: checks.append((name, good, figure)), summary, tmp_path / "loopref.jsonl"
    )
    ((name, good, figure),) = checks
    assert good is ok and name == "loop keeps >= 90% of the step's tokens/s"
    assert summary["loop_vs_step"]["ratio"] == pytest.approx(loop / 100_000.0)
    assert (
        figure.startswith(f"{loop / 100_000:.2f} = loop {loop:,.0f} / step ours+real 100,000 tok/s")
        and "32 x 128" in figure
    )


def test_a_compiled_run_is_compared_with_the_compiled_step(e2e, tmp_path):
    _loopref(tmp_path / "loopref.jsonl", 100_000.0)
    checks, summary = [], {"tokens_per_s_median": {0: 190_000.0}, "compile": True}
    e2e.loop_vs_step(lambda *c: checks.append(c), summary, tmp_path / "loopref.jsonl")
    ((_, good, figure),) = checks
    assert good and summary["loop_vs_step"]["ratio"] == pytest.approx(0.95)
    assert figure.startswith("0.95 = loop 190,000 / step ours+real+compile 200,000 tok/s")


def test_loop_vs_step_fails_without_a_reference(e2e, tmp_path):
    checks = []
    e2e.loop_vs_step(lambda *c: checks.append(c), {"tokens_per_s_median": {0: 9.0}}, tmp_path / "missing.jsonl")
    assert checks == [("loop keeps >= 90% of the step's tokens/s", False, "loop 9 tok/s; step reference missing")]
