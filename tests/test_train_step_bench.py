"""bench/train/train_step.py, the GPU issue's measuring tool, run on the CPU at the smallest shapes: every try builds,
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
    rows = bench.main(
        [
            "--preset",
            "tiny",
            "--batch",
            "3",
            "--seq",
            "24",
            "--masked",
            "4",
            "--dtype",
            "fp32",
            "--warmup",
            "1",
            "--steps",
            "1",
            "--rounds",
            "2",
            "--no-memory",
            "--peak-tflops",
            "2",
            "--impls",
            "transformers,ours,ours+real+unpad,ours+mask+drop0+vocab64",
            "--json",
            str(out),
        ]
    )
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


def test_a_try_that_cannot_run_here_costs_only_its_row(bench, monkeypatch, capsys):
    """`+fp8` needs torchao and an FP8 GPU: where either is missing the row is left out, named, and the others
    are measured (a lease's run keeps its other rows). `nodrop` turns every dropout off in its own model."""
    import builtins

    real_import = builtins.__import__

    def no_torchao(name, *args, **kwargs):  # this machine may have torchao or not: make it absent either way
        if name.startswith("torchao"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchao)
    rows = bench.main(
        [
            "--preset",
            "tiny",
            "--batch",
            "2",
            "--seq",
            "16",
            "--masked",
            "3",
            "--dtype",
            "fp32",
            "--warmup",
            "1",
            "--steps",
            "1",
            "--rounds",
            "1",
            "--no-memory",
            "--impls",
            "ours+fp8,ours,ours+nodrop",
        ]
    )
    assert [r["impl"] for r in rows] == ["ours", "ours+nodrop"] and rows[0]["vs_first"] == 1.0
    out = capsys.readouterr().out
    assert "ours+fp8: failed, left out: ImportError" in out and "speed ÷ ours (paired)" in out
    cfg = bench.model_config(bench.Impl.parse("ours+nodrop"), bench.BertConfig.from_preset("tiny"))
    assert cfg.hidden_dropout_prob == cfg.attention_probs_dropout_prob == 0.0


@pytest.mark.parametrize(
    "spec, message",
    [
        ("ours+turbo", "unknown feature 'turbo'"),
        ("transformers+real", "features apply to ours only"),
        ("ours+compile+unpad", "one shape"),
        ("ours+compile+cudagraphs", "one of compile"),
        ("ours+real+whole", "whole goes with one of compile"),
        ("ours+real+fused", "make_optimizer"),
        ("mine", "neither"),
    ],
)
def test_bad_implementations_are_refused_by_name(bench, spec, message, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--impls", f"ours,{spec}"])
    assert message in capsys.readouterr().err
