"""MFU: the model-FLOP formula (`model.flops`) against the hand counts in bench/RESULTS.md ("GPU", "The FLOP count
behind MFU"), counted from real collated batches, summed over a loop's window and turned into `train/mfu`."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from model.config import BertConfig, ModernBertConfig
from model.family import MODERNBERT
from model.flops import attended_pairs, dense_bf16_peak, mfu, train_flops
from pipeline.core.optim import OptimOptions, make_optimizer
from pipeline.core.step import Trainable, TrainFigures, train_step
from pipeline.pretrain.loader import collate
from pipeline.pretrain.metrics import MlmSums, flop_counter
from pipeline.tracking.runs import Progress


def test_bert_base_and_large_at_128_match_the_hand_count():
    """One sequence of 128 real tokens with 20 masked positions (RESULTS.md's hand count, written out)."""
    base = (
        6 * 12 * 128 * (4 * 768**2 + 2 * 768 * 3072)  # QKV + output, FFN: 6 x parameters x tokens
        + 6 * 12 * 2 * 768 * 128**2  # attention scores and mix: 12 x layers x seq x hidden per token
        + 6 * (768**2 + 2 * 768)  # pooler + NSP, once per sequence
        + 6 * 20 * (768**2 + 768 * 30522)
    )  # MLM transform + tied decoder at the masked rows only
    assert base == 69_928_989_696
    assert train_flops(BertConfig.from_preset("base"), [128], 20) == base
    large = (
        6 * 24 * 128 * (4 * 1024**2 + 2 * 1024 * 4096)
        + 6 * 24 * 2 * 1024 * 128**2
        + 6 * (1024**2 + 2 * 1024)
        + 6 * 20 * (1024**2 + 1024 * 30522)
    )
    assert train_flops(BertConfig.from_preset("large"), [128], 20) == large == 240_642_748_416
    # per real token at 128: 546 MFLOP (base), 1.88 GFLOP (large): the figures MFU divides
    assert base / 128 == pytest.approx(546.3e6, rel=1e-3) and large / 128 == pytest.approx(1.880e9, rel=1e-3)


def test_modernbert_counts_its_gated_mlp_and_local_windows():
    """ModernBERT-base, one 1,024-token document, 154 masked: 8 global layers (0, 3, ..., 21) see every key, 14
    local ones at most 129 (64 either side), 127,936 pairs in all (the first and last 64 tokens lose the keys past
    the document's ends: 1,024 x 129 - 64 x 65); the GLU feed-forward is 3HI; no pooler, no NSP."""
    cfg = ModernBertConfig.from_preset("modernbert-base")
    want = (
        6 * 22 * 1024 * (4 * 768**2 + 3 * 768 * 1152)
        + 6 * 2 * 768 * (8 * 1024 * 1024 + 14 * (1024 * 129 - 64 * 65))
        + 6 * 154 * (768**2 + 768 * 50368)
    )
    assert train_flops(cfg, [1024], 154) == want == 807_769_276_416
    # two documents of 512 attend half as many pairs in the global layers as one of 1,024, and lose 64 x 65 more
    # in the local ones (one more pair of document ends)
    two = train_flops(cfg, [512, 512], 154)
    assert want - two == 6 * 2 * 768 * (8 * (1024**2 - 2 * 512**2) + 14 * 64 * 65)


@pytest.mark.parametrize("span", [1, 5, 64, 65, 129, 300])
@pytest.mark.parametrize("half", [None, 1, 64])
def test_attended_pairs_count_what_the_attention_mask_lets_through(span, half):
    i = torch.arange(span)
    allowed = (i[:, None] - i[None, :]).abs() <= (span if half is None else half)
    assert attended_pairs(span, half) == int(allowed.sum())


def test_modernbert_mfu_counts_a_packed_batchs_real_tokens_and_windows():
    """What `train/mfu` counts for a collated packed batch with padding: each document's pairs, none for the pad
    slots, the masked rows through the head; at 8,192 tokens the local layers' share stays window x tokens."""
    cfg = ModernBertConfig.from_preset("modernbert-base", vocab_size=100, pad_token_id=0)
    rows = {
        "input_ids": [np.arange(300) % 90 + 5, np.arange(200) % 90 + 5],
        "masked_lm_positions": [np.array([1, 7]), np.array([2])],
        "masked_lm_ids": [np.array([9, 9]), np.array([9])],
        "token_type_ids": [np.zeros(300), np.zeros(200)],
        "next_sentence_label": np.array([-1, -1]),
        "doc_lengths": [np.array([100, 200]), np.array([50, 150])],
    }
    b = collate(rows, family=MODERNBERT)
    assert b["input_ids"].shape == (2, 300) and "attention_mask" in b  # 100 pad slots, counted nowhere
    pairs = 8 * (100**2 + 200**2 + 50**2 + 150**2) + 14 * sum(attended_pairs(k, 64) for k in (100, 200, 50, 150))
    want = 6 * (22 * 500 * (4 * 768**2 + 3 * 768 * 1152) + 2 * 768 * pairs + 3 * (768**2 + 768 * 100))
    assert flop_counter(cfg)(b) == train_flops(cfg, [100, 200, 50, 150], 3) == want
    # one document of 8,192: the global layers grow with its square, the local ones with its length
    long, short = (train_flops(cfg, [n], 0) for n in (8192, 1024))
    local = 6 * 2 * 768 * 14
    assert long - short == (
        6 * 22 * 7168 * (4 * 768**2 + 3 * 768 * 1152) + 6 * 2 * 768 * 8 * (8192**2 - 1024**2) + local * 7168 * 129
    )


def test_peak_table_and_mfu():
    assert dense_bf16_peak("NVIDIA H100 80GB HBM3") == dense_bf16_peak("NVIDIA H200") == 989.4e12
    assert dense_bf16_peak("NVIDIA A100-SXM4-80GB") == 312e12 and dense_bf16_peak("NVIDIA L4") == 121e12
    assert dense_bf16_peak("NVIDIA H100 PCIe") == 756e12  # a slower part than the SXM: matched first
    assert dense_bf16_peak("Tesla V100-SXM2-16GB") is None  # no bf16 tensor cores: no MFU, said once
    # 40% of an H100 for 2 GPUs over half a second
    assert mfu(0.4 * 989.4e12 * 2 * 0.5, 0.5, 989.4e12, devices=2) == pytest.approx(0.4)


def _bert_rows(lengths, masked):
    g = np.random.default_rng(0)
    return {
        "input_ids": [g.integers(5, 90, n) for n in lengths],
        "token_type_ids": [np.zeros(n, np.int64) for n in lengths],
        "masked_lm_positions": [np.arange(1, 1 + k) for k in masked],
        "masked_lm_ids": [g.integers(5, 90, k) for k in masked],
        "next_sentence_label": np.array([0, 1, 1]),
    }


def test_flop_counter_reads_collated_batches():
    """Padded BERT rows count their real tokens; a packed ModernBERT row counts each document's attention."""
    cfg = BertConfig.from_preset("tiny", vocab_size=100, max_position_embeddings=64)
    b = collate(_bert_rows([30, 20, 12], [4, 3, 0]))
    assert b["spans"].tolist() == [30, 20, 12]
    assert flop_counter(cfg)(b) == train_flops(cfg, [30, 20, 12], 7)
    u = collate(_bert_rows([30, 20, 12], [4, 3, 0]), unpad=True)
    assert flop_counter(cfg)(u) == flop_counter(cfg)(b)

    mcfg = ModernBertConfig.from_preset("modernbert-tiny", vocab_size=100)
    rows = {
        "input_ids": [np.arange(10) + 5, np.arange(6) + 5],
        "masked_lm_positions": [np.array([1, 7]), np.array([2])],
        "masked_lm_ids": [np.array([9, 9]), np.array([9])],
        "token_type_ids": [np.zeros(10), np.zeros(6)],
        "next_sentence_label": np.array([-1, -1]),
        "doc_lengths": [np.array([4, 6]), np.array([6])],
    }
    m = collate(rows, family=MODERNBERT)
    assert m["spans"].tolist() == [4, 6, 6]
    assert flop_counter(mcfg)(m) == train_flops(mcfg, [4, 6, 6], 3)


def test_a_loop_window_sums_model_flops_and_the_step_line_shows_mfu():
    torch.manual_seed(0)
    from model import BertForPreTraining

    cfg = BertConfig.from_preset("tiny", vocab_size=100, max_position_embeddings=64)
    m = BertForPreTraining(cfg)
    opt, sched = make_optimizer(m, OptimOptions("adamw", 1e-3, 0.01, warmup_steps=1, total_steps=10))
    t = Trainable(m, opt, sched)
    batches = [collate(_bert_rows([30, 20, 12], [4, 3, 1])), collate(_bert_rows([16, 16, 16], [2, 2, 2]))] * 2
    feed, figures, count = iter(batches), TrainFigures(), flop_counter(cfg)
    for _ in range(2):  # two steps of two micro-batches, read once
        figures.add(train_step(t, feed, accumulation=2, sums=MlmSums, device=torch.device("cpu"), flops=count))
    stats = figures.read()
    want = 2 * (train_flops(cfg, [30, 20, 12], 8) + train_flops(cfg, [16, 16, 16], 6))
    assert stats.flops == want and stats.tokens == 2 * (62 + 48) and stats.examples == 12
    # without a counter (fine-tuning, a CPU run) the figure is 0 and no train/mfu is made
    assert train_step(t, iter(batches), accumulation=1, sums=MlmSums, device=torch.device("cpu")).flops == 0.0
    # the console's step line: after tok/s, one decimal, two under 1% (a tiny model on a big GPU)
    m = mfu(stats.flops, want / (0.412 * 989.4e12), 989.4e12)
    line = Progress(total=4, out=io.StringIO()).update(4, {**stats.metrics(), "train/mfu": m})
    assert line is not None and line.endswith("tok/s  mfu 41.2%")
    line = Progress(total=4, out=io.StringIO()).update(4, {**stats.metrics(), "train/mfu": 0.00041})
    assert line.endswith("mfu 0.04%")
