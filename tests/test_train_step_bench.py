"""bench/train_step.py, the GPU issue's measuring tool, run on the CPU at the smallest shapes: every try builds,
steps and lands in the table with the FLOPs of its own model, and bad implementation names are refused."""

from __future__ import annotations

import doctest
import json

import pytest

from conftest import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("train_step")


def test_docstring_examples(bench):
    result = doctest.testmod(bench)  # the FLOP formula's examples moved with it to model/flops.py (tests/test_flops.py)
    assert result.attempted >= 2 and result.failed == 0


def test_tries_run_and_count_the_flops_of_their_own_model(bench, tmp_path):
    out = tmp_path / "rows.jsonl"
    rows = bench.main(["--preset", "tiny", "--batch", "3", "--seq", "24", "--masked", "4", "--dtype", "fp32",
                       "--warmup", "1", "--steps", "1", "--rounds", "2", "--no-memory", "--peak-tflops", "2",
                       "--impls", "transformers,ours,ours+real+unpad,ours+mask+drop0+vocab64", "--json", str(out)])
    by = {r["impl"]: r for r in rows}
    assert list(by) == ["transformers", "ours", "ours+real+unpad", "ours+mask+drop0+vocab64"]
    assert by["transformers"]["vs_first"] == 1.0
    # ours counts the MLM head at the masked rows only, transformers at every position; vocab64 grows the decoder
    assert by["transformers"]["gflop"] > by["ours+mask+drop0+vocab64"]["gflop"] > by["ours"]["gflop"]
    assert by["ours+real+unpad"]["gflop"] == by["ours"]["gflop"]
    for r in rows:
        assert r["ms"] > 0 and r["mfu"] == pytest.approx(r["tflops"] / 2)
        assert r["tok_s"] <= r["slots_s"]  # real tokens only: the padded rows' pads do not count
        assert r["warmup_s"] > 0
    line = json.loads(out.read_text())
    assert line["setting"]["impls"].startswith("transformers,") and len(line["rows"]) == 4


@pytest.mark.parametrize("spec, message", [
    ("ours+turbo", "unknown feature 'turbo'"),
    ("transformers+real", "features apply to ours only"),
    ("ours+compile+unpad", "one shape"),
    ("ours+compile+cudagraphs", "one of compile"),
    ("ours+real+whole", "whole goes with one of compile"),
    ("ours+real+fused", "make_optimizer"),
    ("mine", "neither"),
])
def test_bad_implementations_are_refused_by_name(bench, spec, message, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--impls", f"ours,{spec}"])
    assert message in capsys.readouterr().err
