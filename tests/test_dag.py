"""pipeline.runner.dag: the thin stage graph — order, skipping by a stage's own output check, errors. No Ray needed
(remote=False runs the same graph in-process; tests/test_data_stages.py runs stages as Ray tasks)."""

from __future__ import annotations

import pytest

from pipeline.runner.dag import Stage, run_graph, summary_table


def test_dependencies_run_first_and_receive_results():
    seen: list[str] = []

    def fn(name, value):
        return lambda deps: (seen.append(name), value + sum(deps.values()))[1]

    g = [Stage("c", fn("c", 100), deps=("a", "b")), Stage("b", fn("b", 10), deps=("a",)), Stage("a", fn("a", 1))]
    res = run_graph(g, remote=False, log=lambda m: None)
    assert seen == ["a", "b", "c"] and [r.name for r in res.values()] == ["a", "b", "c"]
    assert res["c"].result == 100 + 1 + 11 and all(r.status == "ran" for r in res.values())


def test_done_check_skips_a_stage_with_its_dependencies_results():
    logs: list[str] = []
    calls: list[dict] = []

    def done(deps):
        calls.append(deps)
        return "from output" if deps["a"] == 1 else None

    g = [
        Stage("a", lambda deps: 1),
        Stage(
            "b",
            lambda deps: pytest.fail("b must be skipped"),
            deps=("a",),
            done=done,
            describe=lambda r: f"figures of {r}",
        ),
    ]
    res = run_graph(g, remote=False, log=logs.append)
    assert calls == [{"a": 1}] and res["b"].status == "skipped" and res["b"].result == "from output"
    assert "[stage b] up to date, skipped: figures of from output" in logs
    assert "skipped" in summary_table(res)


def test_a_failing_stage_stops_everything_downstream():
    ran: list[str] = []

    def boom(deps):
        raise ValueError("bad input")

    g = [Stage("a", boom), Stage("b", lambda deps: ran.append("b"), deps=("a",))]
    with pytest.raises(ValueError, match="bad input"):
        run_graph(g, remote=False, log=lambda m: None)
    assert ran == []


@pytest.mark.parametrize(
    "stages,message",
    [
        ([Stage("a", lambda d: 1, deps=("x",))], "depends on unknown stage 'x'"),
        ([Stage("a", lambda d: 1, deps=("b",)), Stage("b", lambda d: 1, deps=("a",))], "cycle"),
        ([Stage("a", lambda d: 1), Stage("a", lambda d: 2)], "unique"),
    ],
)
def test_malformed_graphs_are_refused(stages, message):
    with pytest.raises(ValueError, match=message):
        run_graph(stages, remote=False, log=lambda m: None)
