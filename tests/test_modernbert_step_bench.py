"""bench/train/modernbert_step.py at the smallest shapes: the packed batch it builds, and every implementation steps and
lands in the table."""

from __future__ import annotations

import pytest

from conftest import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("modernbert_step")


def test_batch_packs_documents_into_full_rows_and_masks_its_share(bench):
    b = bench.make_batch(rows=3, seq=700, vocab=100, mask_rate=0.3)
    cu = b["cu_seqlens"].tolist()
    assert cu[0] == 0 and cu[-1] == 2100 and all(x < y for x, y in zip(cu, cu[1:]))
    assert {700, 1400} <= set(cu)  # no document crosses a row
    assert b["masked_lm_positions"].shape == (3, 210)
    rows = b["masked_lm_positions"]
    assert (b["input_ids"].gather(1, rows) == 4).all()  # [MASK] at the masked positions
    assert (b["labels"] != -100).sum(1).tolist() == [210] * 3
    assert (b["labels"].gather(1, rows) == b["masked_lm_ids"]).all()


def test_every_implementation_steps_and_is_timed(bench, capsys):
    """On a CPU by default every implementation that trains there: all but FlexAttention's (no CPU backward)."""
    out = bench.main(["--rows", "1", "--seq", "64", "--vocab", "100", "--rounds", "1", "--steps", "1"])
    assert list(out) == list(bench.CPU_IMPLS) and "ours+jagged" in out and "ours+flex" not in out
    assert all(wall > 0 and cpu > 0 for wall, cpu in out.values())
    text = capsys.readouterr().out
    loss_gap = float(text.split("|ours - transformers| = ")[1].split()[0])
    assert loss_gap <= 1e-5
    assert text.count("\n| ") == 2 + len(bench.CPU_IMPLS) and "| transformers | " in text


def test_chosen_implementations_in_bf16_with_the_flop_columns(bench, capsys):
    """The GPU lease's form (bench/gpu/gpu_step.sh STEP_SET=modernbert) at CPU shapes: only the implementations asked
    for, bf16 autocast, and the TFLOP/s and MFU columns (no MFU on a CPU: not in the peak table, said once)."""
    out = bench.main(
        [
            "--rows",
            "1",
            "--seq",
            "64",
            "--vocab",
            "100",
            "--rounds",
            "1",
            "--steps",
            "1",
            "--dtype",
            "bf16",
            "--impls",
            "ours",
            "--mfu",
        ]
    )
    assert list(out) == ["ours"]
    text = capsys.readouterr().out
    assert "no MFU: cpu is not in model.flops.DENSE_BF16_PEAK" in text and "loss check" not in text
    header = next(line for line in text.splitlines() if line.startswith("| implementation"))
    assert header.endswith("| TFLOP/s | MFU |") and "vs ours" in header
    row = next(line for line in text.splitlines() if line.startswith("| ours |")).split("|")
    assert float(row[-3]) >= 0 and row[-2].strip() == "-"
    with pytest.raises(SystemExit):
        bench.main(["--impls", "ours,turbo"])
    assert "--impls: unknown turbo" in capsys.readouterr().err


def test_attention_kernels_are_checked_and_timed_at_each_length(bench, capsys, tmp_path):
    """--attention at CPU shapes, as the lease runs it on the GPU (bench/gpu/gpu_step.sh STEP_SET=modernbert): every
    kernel of each layer kind at two lengths with the same tokens, the first length checked against the reference
    attention in fp32 (FlexAttention's forward alone on a CPU), the build, the calls, and the rows in --json."""
    json_path = tmp_path / "attention.jsonl"
    bench.main(
        [
            "--attention",
            "--rows",
            "2",
            "--seq",
            "128",
            "--attention-seqs",
            "128,256",
            "--vocab",
            "100",
            "--json",
            str(json_path),
        ]
    )
    text = capsys.readouterr().out
    import json

    line = json.loads(json_path.read_text())
    rows = line["rows"]
    assert [(r["seq"], r["rows"]) for r in rows] == [(128, 2)] * 6 + [(256, 1)] * 6
    assert [(r["kind"], r["kernel"]) for r in rows[:6]] == [(k, n) for k, ks in bench.KERNELS.items() for n in ks]
    checked = [r for r in rows if r["seq"] == 128]
    assert all(r["max_err"] is not None and r["max_err"] <= 1e-5 for r in checked)
    assert all(r["max_err"] is None for r in rows if r["seq"] == 256)
    assert all((r["step_ms"] is None) == (r["kernel"] == "flex") for r in rows)  # no CPU backward for FlexAttention
    assert all(r["build_ms"] >= 0 and r["forward_ms"] > 0 and r["peak_mib"] is r["mask_mib"] is None for r in rows)
    assert text.count("fastest ") == 4 and "| 256 x 1 | local | flex |" in text and "no backward here" in text
