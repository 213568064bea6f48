"""bench/cost/capacity.py: the capacity tables' arithmetic, checked by hand on one figure of each table."""

from __future__ import annotations

import doctest

import pytest

from conftest import load_bench


@pytest.fixture(scope="module")
def capacity():
    return load_bench("capacity")


def test_docstring_examples(capacity):
    result = doctest.testmod(capacity)
    assert result.attempted >= 4 and result.failed == 0


def test_bert_large_phase_1_on_the_paper_schedule(capacity):
    # 900,000 steps x 256 x 128 = 29,491,200,000 slots; at 96,376 slots/s: 306,001 s = 85.0 GPU-hours
    assert capacity.gpu_hours(900_000, 256, 128, 96_376) == pytest.approx(29_491_200_000 / 96_376 / 3600)
    assert capacity.gpu_hours(900_000, 256, 128, 96_376) == pytest.approx(85.0, abs=0.05)


def test_ray_path_on_four_nodes(capacity):
    # 4.4834e9 tokens / (370,319 tokens/CPU-s x 0.969 x 128 cores) = 97.6 s = 0.0271 h
    hours = capacity.prep_hours(4.4834e9, 370_319, 128, 0.969)
    assert hours == pytest.approx(4.4834e9 / (370_319 * 0.969 * 128) / 3600)
    assert hours == pytest.approx(0.0271, abs=0.0001)


def test_tables_follow_the_options(capacity, capsys):
    capacity.main([])
    default = capsys.readouterr().out
    # BERT-large, LAMB phase 2 at the H200's 176,172 slots/s (32 x 512, compiled):
    # 1,563 x 32,768 x 512 / 176,172 / 3600 = 41.35 GPU-hours (20.67 at 2x); BERT-base at 411,034 slots/s: 17.71
    assert "| NVIDIA LAMB | phase 2 | 1,563 x 32,768 x 512 | 26.2B | 5.8 | 17.7 | 41.3 |" in default
    assert "| 4 | 128 | - (one machine) | 0.027 (1.6 min) |" in default
    capacity.main(["--large-512", str(2 * 176_172), "--ray-rate", str(2 * 370_319)])
    faster = capsys.readouterr().out
    assert "| NVIDIA LAMB | phase 2 | 1,563 x 32,768 x 512 | 26.2B | 5.8 | 17.7 | 20.7 |" in faster
    assert "| 1 | 32 | 0.070 (4.2 min) | 0.053 (3.2 min) |" in faster


def test_raw_sources_table_from_the_gigabyte_run(capacity):
    # Wikipedia: 4.5e9 words / 127,262 words per CPU-s = 35,360 s = 9.82 CPU-h (by XML: 95,000 / 4.342 = 6.08);
    # on 4 nodes of 32 cores 9.82 / 128 = 0.0767 h. BooksCorpus: 0.8e9 x 1.273 x 1.07 / 397,305 / 3600 = 0.762
    # CPU-h, on one node / 32 = 0.0238 h.
    table = capacity.raw_sources_table(capacity.parse_args([]))
    assert "dump -> shards 9.8 (by words 9.8, by XML bytes 6.1), BooksCorpus -> shards 0.76" in table
    assert "| 4 | 128 | 0.077 (4.6 min) |" in table and "| 1 | 32 | 0.31 (18 min) | 0.024 (1.4 min) |" in table
    slower = capacity.raw_sources_table(capacity.parse_args(["--dump-word-rate", str(127_262 / 2)]))
    assert "| 4 | 128 | 0.15 (9 min) |" in slower  # twice the CPU-hours by words: 19.6 / 128
