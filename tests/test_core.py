"""pipeline.core (LR schedule and optimizers against references, checkpoints, the shared train step) and
pipeline.pretrain.loader (batching, deterministic data order)."""

from __future__ import annotations

import copy
import math
import os

import numpy as np
import pyarrow as pa
import pytest
import torch
from optimi import StableAdamW

from model.family import MODERNBERT
from pipeline.core.checkpoint import load_checkpoint, save_checkpoint
from pipeline.core.optim import Lamb, lr_lambda, OptimOptions, make_optimizer
from pipeline.core.precision import HOST_ONLY
from pipeline.core.step import Trainable
from pipeline.pretrain.loader import collate, epoch_batches, split_global_batch


@pytest.mark.parametrize("warmup,total", [(0, 10), (3, 10), (10, 100)])
def test_linear_schedule_matches_transformers(warmup, total):
    from transformers import get_linear_schedule_with_warmup

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    ref = get_linear_schedule_with_warmup(opt, warmup, total)
    for step in range(total + 2):
        assert lr_lambda(step, warmup, total) == pytest.approx(ref.lr_lambdas[0](step), abs=1e-12)


@pytest.mark.parametrize("power", [0.5, 1.0, 2.0])
def test_polynomial_schedule_matches_transformers(power):
    from transformers import get_polynomial_decay_schedule_with_warmup

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    ref = get_polynomial_decay_schedule_with_warmup(opt, 4, 20, lr_end=0.0, power=power)
    for step in range(21):
        assert lr_lambda(step, 4, 20, "polynomial", power) == pytest.approx(ref.lr_lambdas[0](step), abs=1e-12)


@pytest.mark.parametrize("shape", ["linear", "1-sqrt"])
@pytest.mark.parametrize("warmup,decay,total", [(2, 4, 10), (0, 3, 12), (5, 0, 8), (3, 17, 20)])
def test_wsd_schedule_matches_transformers(warmup, decay, total, shape):
    from transformers import get_wsd_schedule

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    ref = get_wsd_schedule(opt, warmup, decay, num_training_steps=total, decay_type=shape)
    for step in range(total + 1):
        assert lr_lambda(step, warmup, total, "wsd", decay_steps=decay, decay_shape=shape) == pytest.approx(
            ref.lr_lambdas[0](step), abs=1e-12
        )


def test_wsd_optimizer_lrs_warm_hold_and_decay():
    opt, sched = make_optimizer(
        torch.nn.Linear(2, 2),
        OptimOptions("adamw", 0.1, 0.0, warmup_steps=2, total_steps=8, schedule="wsd", decay_steps=3),
    )
    lrs = []
    for _ in range(8):
        lrs.append(round(sched.get_last_lr()[0], 6))
        opt.step()
        sched.step()
    assert lrs == [0.0, 0.05, 0.1, 0.1, 0.1, 0.1, 0.066667, 0.033333]


def test_wsd_1_sqrt_decay_drops_early_and_reaches_zero():
    """1 - sqrt(t): half the LR gone a quarter into the decay (linear: a quarter), 0 at the last step; the
    head-only schedule (model.init: heads and body, each with and without decay) decays in the same shape."""
    shape = [lr_lambda(s, 0, 8, "wsd", decay_steps=4, decay_shape="1-sqrt") for s in range(4, 9)]
    assert shape == pytest.approx([1.0, 0.5, 1 - 0.5**0.5, 1 - 0.75**0.5, 0.0])
    with pytest.raises(ValueError, match="unknown decay shape 'cosine'"):
        lr_lambda(6, 0, 8, "wsd", decay_steps=4, decay_shape="cosine")
    model = torch.nn.Sequential()
    model.add_module("body", torch.nn.Linear(2, 2))
    model.add_module("cls", torch.nn.Linear(2, 2))
    _, sched = make_optimizer(
        model,
        OptimOptions(
            "adamw",
            1.0,
            0.0,
            warmup_steps=0,
            total_steps=10,
            schedule="wsd",
            decay_steps=4,
            decay_shape="1-sqrt",
            head_only_steps=2,
        ),
    )
    assert [f(s) for f in sched.lr_lambdas for s in (7, 9)] == pytest.approx([0.5, 1 - 0.75**0.5] * 4)


def test_lamb_one_step_by_hand():
    """Step 1: Adam's bias-corrected update is g/|g| elementwise; plus decay; scaled by ||w|| / ||u||."""
    w0 = [3.0, 4.0]
    p = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float64))
    p.grad = torch.tensor([1.0, -2.0], dtype=torch.float64)
    opt = Lamb([{"params": [p], "weight_decay": 0.1}], lr=0.01, eps=0.0)
    opt.step()
    u = [1.0 + 0.1 * 3.0, -1.0 + 0.1 * 4.0]
    trust = math.hypot(*w0) / math.hypot(*u)
    expected = [w - 0.01 * trust * ui for w, ui in zip(w0, u)]
    assert p.detach().tolist() == pytest.approx(expected, rel=1e-12)


def test_lamb_without_decay_is_adam_direction():
    p = torch.nn.Parameter(torch.tensor([1.0, 1.0], dtype=torch.float64))
    p.grad = torch.tensor([0.5, -3.0], dtype=torch.float64)
    Lamb([{"params": [p], "weight_decay": 0.0}], lr=0.1, eps=0.0).step()
    assert p.detach().tolist() == pytest.approx([0.9, 1.1])


@pytest.mark.parametrize("name,cls", [("adamw", torch.optim.AdamW), ("lamb", Lamb), ("stableadamw", StableAdamW)])
def test_make_optimizer_excludes_bias_and_layernorm_from_decay(name, cls):
    from model import BertConfig, BertForPreTraining

    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=64))
    opt, _ = make_optimizer(model, OptimOptions(name, 1e-3, 0.01, warmup_steps=0, total_steps=10))
    assert isinstance(opt, cls)
    by_id = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    names = dict(model.named_parameters())
    assert len(by_id) == len({id(p) for p in names.values()})  # every parameter once (tied decoder once)
    for n, p in names.items():
        no_decay = n.endswith("bias") or "LayerNorm" in n
        assert by_id[id(p)] == (0.0 if no_decay else 0.01), n
    with pytest.raises(ValueError, match="sgd"):
        make_optimizer(model, OptimOptions("sgd", 1e-3, 0.0, warmup_steps=0, total_steps=10))


def test_stableadamw_steps_like_adamw_until_a_gradient_spike_which_it_caps():
    """A steady gradient: StableAdamW's steps are AdamW's (same betas, eps, decoupled decay scaled by the LR; its
    eps inside the square root differs by far less than the tolerance). A gradient 100x the usual after them:
    AdamW's second moment lags and its step jumps; StableAdamW divides that tensor's step by RMS(g^2 / v) and
    moves it less. Its state survives a checkpoint: a copy loaded from `state_dict` steps to the same values."""
    torch.manual_seed(0)
    w0 = torch.randn(64, dtype=torch.float64)
    grads = [torch.randn(64, dtype=torch.float64) * 0.1] * 20  # steady: v is g^2 (bias-corrected), RMS(g^2 / v) 1
    params, opts = {}, {}
    for name in ("adamw", "stableadamw"):
        params[name] = torch.nn.Parameter(w0.clone())
        opts[name], _ = make_optimizer(
            torch.nn.ParameterList([params[name]]), OptimOptions(name, 1e-2, 0.01, warmup_steps=0, total_steps=100)
        )
    for g in grads:
        for name, opt in opts.items():
            params[name].grad = g.clone()
            opt.step()
    torch.testing.assert_close(params["stableadamw"].detach(), params["adamw"].detach(), rtol=1e-6, atol=1e-8)

    spike, before = grads[0] * 100, {n: p.detach().clone() for n, p in params.items()}
    copy_p = torch.nn.Parameter(params["stableadamw"].detach().clone())
    copy_opt, _ = make_optimizer(
        torch.nn.ParameterList([copy_p]), OptimOptions("stableadamw", 1e-2, 0.01, warmup_steps=0, total_steps=100)
    )
    copy_opt.load_state_dict(copy.deepcopy(opts["stableadamw"].state_dict()))
    for name, opt in [*opts.items(), ("copy", copy_opt)]:
        p = copy_p if name == "copy" else params[name]
        p.grad = spike.clone()
        opt.step()
    moved = {n: (params[n].detach() - before[n]).norm().item() for n in params}
    assert moved["stableadamw"] < 0.5 * moved["adamw"], moved
    assert torch.equal(copy_p.detach(), params["stableadamw"].detach())


def test_head_only_steps_train_the_heads_alone_then_the_encoder_warms_up_from_there():
    from model import BertConfig, BertForPreTraining

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=64))
    opt, sched = make_optimizer(
        model, OptimOptions("adamw", 1e-2, 0.01, warmup_steps=2, total_steps=10, head_only_steps=3)
    )
    names = dict(model.named_parameters())
    group = {id(p): i for i, g in enumerate(opt.param_groups) for p in g["params"]}
    assert len(group) == len({id(p) for p in names.values()})  # every parameter once
    heads = {n for n in names if n.startswith("cls.")}
    assert heads and "bert.embeddings.word_embeddings.weight" in names  # the tied decoder: frozen with the encoder
    start = {n: p.detach().clone() for n, p in names.items()}
    ids = torch.randint(5, 64, (4, 16))
    lrs = []
    for step in range(6):
        lrs.append({("head" if n in heads else "body"): opt.param_groups[group[id(p)]]["lr"] for n, p in names.items()})
        out = model(ids, masked_lm_positions=torch.tensor([[1, 2]] * 4), masked_lm_ids=ids[:, 1:3])
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        changed = {n for n, p in names.items() if not torch.equal(p, start[n])}
        if step < 3:  # only the heads have moved (step 0's LR is 0: the warmup's first step)
            assert changed <= heads and (step == 0 or changed), (step, sorted(changed - heads)[:3])
    assert "bert.encoder.layer.0.attention.self.query.weight" in changed  # the encoder learns from step 3 on
    assert [round(x["head"] / 1e-2, 3) for x in lrs] == [round(lr_lambda(s, 2, 10), 3) for s in range(6)]
    assert [round(x["body"] / 1e-2, 3) for x in lrs] == [0.0, 0.0, 0.0, 0.0, 0.5, 1.0]  # its own warmup after 3
    with pytest.raises(Exception, match=r"train.head_only_steps 10 must be >= 0 and < max_steps 10"):
        from pipeline.config import load_config

        load_config(None, ["--train.max_steps", "10", "--train.head_only_steps", "10"])


def test_fused_adamw_is_chosen_on_the_cpu_matches_the_loop_and_a_checkpoint_keeps_its_kind():
    """Fused AdamW is what a CPU (and a CUDA) run gets: five steps agree with torch's loop over the parameters
    (its CPU default, `fused=False`). An optimizer state written by the loop resumes as the loop, so a run
    started before the default changed goes on with the update it started with."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    fused = copy.deepcopy(ref)
    loop, _ = make_optimizer(ref, OptimOptions("adamw", 1e-2, 0.01, warmup_steps=0, total_steps=10, fused=False))
    assert not loop.defaults["fused"]
    auto, _ = make_optimizer(fused, OptimOptions("adamw", 1e-2, 0.01, warmup_steps=0, total_steps=10))
    assert auto.defaults["fused"] is True  # CPU parameters
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    for _ in range(5):
        for m, opt in ((ref, loop), (fused, auto)):
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(ref.parameters(), fused.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    resumed, _ = make_optimizer(copy.deepcopy(ref), OptimOptions("adamw", 1e-2, 0.01, warmup_steps=0, total_steps=10))
    resumed.load_state_dict(loop.state_dict())
    assert not resumed.param_groups[0]["fused"] and not resumed.param_groups[1]["fused"]


def test_collate_pads_to_longest_in_batch():
    rows = {
        "input_ids": [np.array([2, 9, 4, 3], np.int32), np.array([2, 8, 3], np.int32)],
        "token_type_ids": [np.array([0, 0, 1, 1], np.int8), np.array([0, 0, 1], np.int8)],
        "masked_lm_positions": [np.array([2], np.int32), np.array([1, 2], np.int32)],
        "masked_lm_ids": [np.array([7], np.int32), np.array([8, 3], np.int32)],
        "next_sentence_label": np.array([1, 0], np.int8),
    }
    b = collate(rows)
    assert b["input_ids"].tolist() == [[2, 9, 4, 3], [2, 8, 3, 0]]
    assert b["token_type_ids"].tolist() == [[0, 0, 1, 1], [0, 0, 1, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert b["masked_lm_positions"].tolist() == [[2, -1], [1, 2]]
    assert b["masked_lm_ids"].tolist() == [[7, -1], [8, 3]]
    assert b["next_sentence_label"].tolist() == [1, 0] and b["num_tokens"].item() == 7
    assert all(v.dtype == torch.int64 for v in b.values())


def _packed_rows(doc_lengths):
    """Two rows: documents [2 5 3] + [2 6 7 3] in one, [2 8 9 3] alone (padded), as packed shards hold them."""
    return {
        "input_ids": [np.array([2, 5, 3, 2, 6, 7, 3], np.int32), np.array([2, 8, 9, 3], np.int32)],
        "token_type_ids": [np.zeros(7, np.int8), np.zeros(4, np.int8)],
        "masked_lm_positions": [np.array([1, 5], np.int32), np.array([2], np.int32)],
        "masked_lm_ids": [np.array([9, 4], np.int32), np.array([5], np.int32)],
        "next_sentence_label": np.array([-1, -1], np.int8),
        **({"doc_lengths": doc_lengths} if doc_lengths is not None else {}),
    }


def test_collate_for_modernbert_turns_doc_lengths_into_cu_seqlens():
    b = collate(_packed_rows([np.array([3, 4], np.int32), np.array([4], np.int32)]), family=MODERNBERT)
    # segments of the real tokens (BERT's unpadded cu_seqlens' meaning): row 0's documents at 0..3 and 3..7, row 1's
    # at 7..11; its padding is no segment, the mask says where it is
    assert b["cu_seqlens"].tolist() == [0, 3, 7, 11]
    assert b["input_ids"].tolist() == [[2, 5, 3, 2, 6, 7, 3], [2, 8, 9, 3, 0, 0, 0]]
    assert b["attention_mask"].tolist() == [[1] * 7, [1, 1, 1, 1, 0, 0, 0]]
    assert set(b) == {
        "input_ids",
        "masked_lm_positions",
        "masked_lm_ids",
        "num_tokens",
        "spans",
        "cu_seqlens",
        "attention_mask",
    }
    assert b["spans"].tolist() == [3, 4, 4]  # attention's spans (for MFU): each document, the padding none
    # shards without the column (written before it, or not packed): one document a row, BERT's mask for padding
    old = collate(_packed_rows(None), family=MODERNBERT)
    assert "cu_seqlens" not in old and old["attention_mask"].tolist() == [[1] * 7, [1, 1, 1, 1, 0, 0, 0]]
    assert "token_type_ids" not in old and "next_sentence_label" not in old


def test_modernbert_on_a_collated_packed_batch_equals_each_document_alone():
    """cu_seqlens from the loader keep documents apart: every masked slot's logits equal its document's run alone."""
    from model import ModernBertConfig, ModernBertForMaskedLM
    from pipeline.core.precision import forward

    torch.manual_seed(0)
    m = ModernBertForMaskedLM(ModernBertConfig.from_preset("modernbert-tiny", vocab_size=16, local_attention=4)).eval()
    b = collate(_packed_rows([np.array([3, 4], np.int32), np.array([4], np.int32)]), family=MODERNBERT)
    with torch.no_grad():
        packed = forward(m, b, torch.device("cpu"), "fp32").slot_logits  # (B*P, V): slots (0,0) (0,1) (1,0) (1,1)
        alone = [m(torch.tensor([ids])).mlm_logits[0] for ids in ([2, 5, 3], [2, 6, 7, 3], [2, 8, 9, 3])]
    torch.testing.assert_close(packed[0], alone[0][1], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[1], alone[1][2], atol=1e-5, rtol=0)  # position 5 of the row: 2 of its document
    torch.testing.assert_close(packed[2], alone[2][2], atol=1e-5, rtol=0)
    assert (packed[1] - m(torch.tensor([[2, 5, 3, 2, 6, 7, 3]])).mlm_logits[0, 5]).abs().max() > 1e-3


def test_pretraining_counts_of_an_mlm_only_model_have_no_nsp():
    from pipeline.pretrain.metrics import MlmSums
    from model import ModernBertConfig, ModernBertForMaskedLM

    torch.manual_seed(0)
    m = ModernBertForMaskedLM(ModernBertConfig.from_preset("modernbert-tiny", vocab_size=16))
    b = collate(_packed_rows([np.array([3, 4], np.int32), np.array([4], np.int32)]), family=MODERNBERT)
    out = m(**{k: v for k, v in b.items() if k not in HOST_ONLY})
    c = MlmSums.of(out, b)
    assert c.mlm_count.item() == 3 and [c.nsp_loss_sum.item(), c.nsp_correct.item(), c.nsp_count.item()] == [0, 0, 0]
    assert set(c.figures()) == {"loss", "mlm_loss", "mlm_accuracy"}
    assert c.figures()["loss"] == pytest.approx(out.mlm_loss.item(), rel=1e-6)


@pytest.mark.parametrize("batch,world,cap", [(32, 2, 16), (32, 1, 16), (32, 3, 16), (10, 3, 2), (7, 7, 1), (9, 2, 8)])
def test_a_global_batch_is_dealt_out_once_in_equal_micro_batch_counts(batch, world, cap):
    split = split_global_batch(batch, world, cap)
    rows = [r for micro in split for a, b in micro for r in range(a, b)]
    assert rows == list(range(batch))  # every row once, in order: rank 0's share first
    assert len({len(micro) for micro in split}) == 1  # the same accumulation on every rank (DDP syncs the last)
    sizes = [b - a for micro in split for a, b in micro]
    assert max(sizes) <= cap and max(sizes) - min(sizes) <= 1
    assert len(split[0]) == -(-(-(-batch // world)) // cap)  # as few micro-batches as the largest share needs
    with pytest.raises(ValueError, match=f"{batch + 1} workers cannot share a global batch of {batch} rows"):
        split_global_batch(batch, batch + 1, cap)


def _stream(n_rows: int, block: int) -> list[pa.Table]:
    return [pa.table({"x": list(range(i, min(i + block, n_rows)))}) for i in range(0, n_rows, block)]


@pytest.mark.parametrize("chunk", [7, 16, 1000])
def test_epoch_order_is_a_seeded_permutation_and_resumes_exactly(chunk):
    kw = dict(num_rows=90, chunk_rows=chunk, batch_size=4)
    full = [b["x"].to_pylist() for _, b in epoch_batches(_stream(120, 9), seed_key=[1, 0, 0], **kw)]
    flat = sum(full, [])
    assert len(full) == 90 // 4 and len(set(flat)) == len(flat) and set(flat) <= set(range(90))
    assert flat != sorted(flat)  # shuffled
    # another epoch (seed key) gives another order of the same rows
    other = sum((b["x"].to_pylist() for _, b in epoch_batches(_stream(120, 9), seed_key=[1, 0, 1], **kw)), [])
    assert other != flat
    for start in range(len(full) + 1):  # resuming at any batch yields exactly the rest, however the stream is cut
        rest = [
            (i, b["x"].to_pylist()) for i, b in epoch_batches(_stream(120, 13), seed_key=[1, 0, 0], start=start, **kw)
        ]
        assert [b for _, b in rest] == full[start:] and [i for i, _ in rest] == list(range(start, len(full)))


@pytest.mark.parametrize("preset", ["tiny", "modernbert-tiny"])
def test_checkpoint_round_trip_restores_weights_optimizer_and_rngs(tmp_path, preset):
    import random

    from model.build import build_model
    from model.family import encoder_config
    from pipeline.core.precision import forward

    def step(m, o, s):  # BERT's batch keys; ModernBERT's forward leaves token types and NSP labels behind
        ids = torch.arange(5, 21).view(2, 8)
        batch = {
            "input_ids": ids,
            "token_type_ids": torch.zeros_like(ids),
            "masked_lm_positions": torch.tensor([[1], [2]]),
            "masked_lm_ids": ids[:, 1:2],
            "next_sentence_label": torch.tensor([0, 1]),
        }
        forward(m, batch, torch.device("cpu"), "fp32").loss.backward()
        o.step()
        s.step()
        o.zero_grad()

    torch.manual_seed(0)
    model = build_model(encoder_config(preset, vocab_size=64))
    opt, sched = make_optimizer(model, OptimOptions("adamw", 1e-3, 0.01, warmup_steps=2, total_steps=10))
    step(model, opt, sched)
    np.random.seed(3)
    random.seed(4)
    save_checkpoint(
        str(tmp_path), 0, Trainable(model, opt, sched), {"step": 1, "position": {"phase": 0, "epoch": 2, "batch": 5}}
    )
    expect = (torch.rand(3), np.random.rand(), random.random())
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    step(model, opt, sched)  # the uninterrupted run's next step (dropout draws from the RNG after `expect`)

    torch.manual_seed(99)
    fresh = build_model(encoder_config(preset, vocab_size=64))
    opt2, sched2 = make_optimizer(fresh, OptimOptions("adamw", 1e-3, 0.01, warmup_steps=2, total_steps=10))
    state = load_checkpoint(str(tmp_path), 0, Trainable(fresh, opt2, sched2))
    assert state == {
        "step": 1,
        "position": {"phase": 0, "epoch": 2, "batch": 5},
        "world_size": 1,
    }  # the hashes left out
    assert (torch.rand(3), np.random.rand(), random.random()) == (pytest.approx(expect[0]), expect[1], expect[2])
    for (n, a), b in zip(saved.items(), fresh.state_dict().values()):
        assert torch.equal(a, b), n
    assert sched2.last_epoch == 1 and opt2.state_dict()["state"][0]["step"] == 1
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "rank_0.pt").is_file()
    step(fresh, opt2, sched2)  # the resumed run's next step is the uninterrupted run's, bit for bit
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))


def test_a_background_checkpoint_holds_its_steps_state_while_training_goes_on(tmp_path):
    """`save_checkpoint(background=True)` leaves rank 0's files to `DeferredFiles.write` (Ray Train's upload thread
    on object storage): written after two more steps changed the weights and Adam's moments in place, they are
    byte for byte the foreground checkpoint of the same step. A second background checkpoint waits until the first
    is written (one snapshot in memory); one dropped unwritten refuses a later write."""
    import os
    import threading

    from model import BertConfig, BertForPreTraining

    def step(m, o, s):
        ids = torch.arange(5, 21).view(2, 8)
        m(
            ids,
            torch.zeros_like(ids),
            torch.ones_like(ids),
            masked_lm_positions=torch.tensor([[1], [2]]),
            masked_lm_ids=ids[:, 1:2],
            next_sentence_label=torch.tensor([0, 1]),
        ).loss.backward()
        o.step()
        s.step()
        o.zero_grad()

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=64))
    t = Trainable(model, *make_optimizer(model, OptimOptions("adamw", 1e-3, 0.01, warmup_steps=2, total_steps=10)))
    step(model, t.optimizer, t.scheduler)
    state = {"step": 1, "position": {"phase": 0, "epoch": 0, "batch": 1}, "world_size": 1}
    assert save_checkpoint(str(tmp_path / "fg"), 0, t, state) is None
    deferred = save_checkpoint(str(tmp_path / "bg"), 0, t, state, background=True)
    assert os.listdir(tmp_path / "bg") == ["rank_0.pt"]  # the rest is written by the upload
    step(model, t.optimizer, t.scheduler)
    step(model, t.optimizer, t.scheduler)

    second: list = []
    waiting = threading.Thread(
        target=lambda: second.append(
            save_checkpoint(str(tmp_path / "next"), 0, t, {**state, "step": 3}, background=True)
        )
    )
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive() and not second  # until the first snapshot is written
    deferred.write()
    waiting.join(30)
    deferred.write()  # a retried upload: already written
    names = ["model.safetensors", "optimizer.pt", "rank_0.pt", "train_state.json"]
    assert sorted(os.listdir(tmp_path / "bg")) == sorted(os.listdir(tmp_path / "fg")) == names
    for name in names:
        assert (tmp_path / "bg" / name).read_bytes() == (tmp_path / "fg" / name).read_bytes(), name
    second[0].drop()  # an upload that never runs
    with pytest.raises(RuntimeError, match="not written"):
        second[0].write()
    assert os.listdir(tmp_path / "next") == ["rank_0.pt"]


def _tiny_checkpoint(path, step: int, seed: int = 0) -> None:
    from model import BertConfig, BertForPreTraining

    torch.manual_seed(seed)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=64))
    opt, sched = make_optimizer(model, OptimOptions("adamw", 1e-3, 0.01, warmup_steps=2, total_steps=10))
    save_checkpoint(
        str(path), 0, Trainable(model, opt, sched), {"step": step, "position": {"phase": 0, "epoch": 0, "batch": step}}
    )


def test_a_damaged_checkpoint_is_refused_in_one_line_naming_it(tmp_path):
    """Every file's sha256 is recorded in train_state.json; loading checks them first. A checkpoint written before
    hashes were recorded still loads."""
    import json

    from model import BertConfig, BertForPreTraining
    from pipeline.core.checkpoint import CheckpointCorrupt

    _tiny_checkpoint(tmp_path, 3)
    state = json.loads((tmp_path / "train_state.json").read_text())
    assert set(state["files"]) == {"model.safetensors", "optimizer.pt", "rank_0.pt"} and state["step"] == 3
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=64))
    t = Trainable(model, *make_optimizer(model, OptimOptions("adamw", 1e-3, 0.01, warmup_steps=2, total_steps=10)))
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a truncated copy
    with pytest.raises(
        CheckpointCorrupt,
        match=rf"^checkpoint {tmp_path} is damaged: model.safetensors has sha256 "
        r"[0-9a-f]{12}, not the [0-9a-f]{12} recorded when it was written$",
    ):
        load_checkpoint(str(tmp_path), 0, t)
    _tiny_checkpoint(tmp_path, 3)
    (tmp_path / "train_state.json").write_text(json.dumps({"step": 3}))  # an old checkpoint: no hashes
    assert load_checkpoint(str(tmp_path), 0, t)["step"] == 3


def test_resuming_skips_damaged_newer_checkpoints_and_says_so(tmp_path, capsys):
    """The driver's choice: the newest intact checkpoint, one console line for the damaged newer ones; with none
    intact, one line that says how to start over."""
    import json

    from pipeline.core.checkpoint import CheckpointCorrupt
    from pipeline.pretrain.identity import resume_point

    run = tmp_path / "run"
    for i, step in enumerate((4, 8, 12)):
        _tiny_checkpoint(run / f"checkpoint_2026-01-0{i + 1}_00-00-00.000000", step)
    # Ray Train's list of the run's checkpoints, beside them (its snapshot names each checkpoint directory)
    (run / "checkpoint_manager_snapshot.json").write_text(
        json.dumps(
            {
                "ray_version": "2.60.0",
                "checkpoint_results": [
                    {"version": 0, "checkpoint_dir_name": d.name, "metrics": {}} for d in run.glob("checkpoint_*")
                ],
            }
        )
    )
    assert resume_point(str(tmp_path), "run")[0][1]["step"] == 12 and capsys.readouterr().out == ""
    newest, middle, oldest = sorted(run.glob("checkpoint_*/"), reverse=True)
    (newest / "model.safetensors").write_bytes(b"")
    (middle / "train_state.json").write_text("{")  # garbled
    good, damaged = resume_point(str(tmp_path), "run")
    assert good[0] == str(oldest) and good[1]["step"] == 4 and damaged == [str(middle), str(newest)]
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(
        f"[train] damaged checkpoints {middle} ({middle}/train_state.json is not valid JSON"
    )
    assert f"; {newest} (model.safetensors has sha256 " in out[0] and out[0].endswith(
        f"resuming from step 4 ({oldest})"
    )
    cut = run / "checkpoint_2026-01-04_00-00-00.000000"
    cut.mkdir()  # an upload a crash cut short: no train_state.json, and Ray Train's snapshot never listed it
    (cut / "model.safetensors").write_bytes(b"half")
    assert resume_point(str(tmp_path), "run")[1] == [str(middle), str(newest)] and not cut.exists()  # removed
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == (
        f"[train] removed 1 checkpoint a crashed run left half-written: {cut} ({cut}/train_state.json does not exist)"
    ) and out[1].startswith("[train] damaged checkpoints ")
    (oldest / "optimizer.pt").unlink()
    with pytest.raises(
        CheckpointCorrupt,
        match=rf"^run {run} has no intact checkpoint: .*{oldest} \(optimizer.pt is "
        rf"missing\); to start over, delete {run} \(or use another --train.run_name\)$",
    ):
        resume_point(str(tmp_path), "run")
    assert resume_point(str(tmp_path), "none") == (None, [])


def test_a_worker_resumes_from_the_newest_intact_checkpoint_whatever_ray_train_recorded(tmp_path, monkeypatch):
    """`cluster.resume_checkpoint`: Ray Train's checkpoint when this job reported it (a retry); else the driver's
    newest intact one at the job's start, also when Ray's run snapshot names an older one, a damaged one, or none
    (a job stopped between writing a checkpoint and Ray's record of it started over before)."""
    import ray.train

    from pipeline.cluster import resume_checkpoint

    run = tmp_path / "run"
    old, new, later = (str(run / f"checkpoint_2026-01-0{d}_00-00-00.000000") for d in (1, 2, 3))
    at_start = (old.rsplit("/", 1)[1], new.rsplit("/", 1)[1])
    for ray_has, resume_from, want in (
        (None, None, None),  # a new run
        (None, new, new),  # no snapshot: Ray hands none
        (old, new, new),  # the snapshot's newest is older (or damaged) than the newest intact one
        (new, new, new),  # the usual resume
        (later, new, later),  # reported by this job: a retry after a worker failed
        (later, None, later),
    ):
        monkeypatch.setattr(ray.train, "get_checkpoint", lambda c=ray_has: c and ray.train.Checkpoint(c))
        got = resume_checkpoint(at_start, resume_from)
        assert (got and got.path) == want, (ray_has, resume_from)


def test_a_checkpoint_is_hashed_once_per_process_and_handed_over_until_it_changes(tmp_path, monkeypatch):
    """The driver's checks (done, resume point) hash each file once; a worker given what the driver verified
    (`trust`) hashes nothing; a file damaged since is hashed again and refused."""
    import json

    from model import BertConfig, BertForPreTraining
    from pipeline.core import checkpoint
    from pipeline.core.checkpoint import CheckpointCorrupt, trust, verified
    from pipeline.storage.io import sha256_file
    from pipeline.pretrain.identity import newest_intact, resume_point

    ckpt = tmp_path / "run" / "checkpoint_2026-01-01_00-00-00.000000"
    _tiny_checkpoint(ckpt, 4)
    monkeypatch.setattr(checkpoint, "_verified", {})
    hashed = []
    monkeypatch.setattr(checkpoint, "sha256_file", lambda p: hashed.append(p) or sha256_file(p))
    files = sorted(json.loads((ckpt / "train_state.json").read_text())["files"])
    assert newest_intact(str(tmp_path), "run")[0][1]["step"] == 4
    assert sorted(p.rsplit("/", 1)[1] for p in hashed) == files == ["model.safetensors", "optimizer.pt", "rank_0.pt"]
    assert resume_point(str(tmp_path), "run")[0][0] == str(ckpt) and len(hashed) == 3  # not hashed again
    handed = verified(str(ckpt))
    assert sorted(f for f, _, _ in handed) == [str(ckpt / n) for n in files]

    monkeypatch.setattr(checkpoint, "_verified", {})  # a worker: another process
    trust(handed)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=64))
    t = Trainable(model, *make_optimizer(model, OptimOptions("adamw", 1e-3, 0.01, warmup_steps=2, total_steps=10)))
    assert load_checkpoint(str(ckpt), 0, t)["step"] == 4 and len(hashed) == 3
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # damaged after the driver checked it
    with pytest.raises(CheckpointCorrupt, match=r"model.safetensors has sha256 [0-9a-f]{12}, not the"):
        load_checkpoint(str(ckpt), 0, t)
    assert hashed[3:] == [str(weights)]


def test_docstring_examples_in_pipeline_modules_hold():
    """Every `>>>` example in pipeline/ is run (the model/ ones are in test_model_config.py)."""
    import doctest
    import importlib
    import pkgutil

    import pipeline

    attempted = 0
    for info in pkgutil.walk_packages(pipeline.__path__, "pipeline."):
        result = doctest.testmod(importlib.import_module(info.name), optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, info.name
        attempted += result.attempted
    assert attempted >= 40


def test_free_port_skips_rays_default_ports_and_the_avoided(monkeypatch):
    """A port the OS draws that Ray's components use by default (or one already handed out) is drawn again: Ray
    refuses to start when two of its components are given one port."""
    import socket

    from pipeline import cluster

    drawn = iter([52365, 6379, 41000, 41001])

    class FakeSocket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, addr):
            self.port = next(drawn)

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(socket, "socket", FakeSocket)
    assert cluster.free_port(avoid=frozenset({41000})) == 41001


@pytest.mark.parametrize(
    "files,preset,actors",
    [(1, None, "1"), (10, None, "1"), (11, None, "2"), (25, None, "3"), (5000, None, "32"), (3, "7", "7")],
)
def test_ray_data_parquet_reads_start_footer_readers_for_the_files_only(monkeypatch, files, preset, actors):
    """Ray Data lists parquet files on a pool of footer-reading actors, 32 by default (each a worker process, for
    every read): `cluster.read_parquet` asks for one per 10 files, at most 32, unless the user set the variable,
    and leaves the environment as it was. (Its reads against a real Ray: tests/test_executors.py.)"""
    import ray.data

    from pipeline import cluster

    if preset is None:
        monkeypatch.delenv("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", raising=False)
    else:
        monkeypatch.setenv("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", preset)
    seen = []
    monkeypatch.setattr(
        ray.data,
        "read_parquet",
        lambda paths, **kw: (
            seen.append((len(paths), kw, os.environ["RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"])) or "dataset"
        ),
    )
    assert cluster.read_parquet([f"f{i}.parquet" for i in range(files)], shuffle=None) == "dataset"
    assert seen == [(files, {"shuffle": None}, actors)]
    assert os.environ.get("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS") == preset


@pytest.mark.slow  # a local Ray cluster's start and stop, ~15 s
def test_a_private_cluster_runs_no_dashboard_leaves_nothing_in_tmp_and_keeps_idle_workers(monkeypatch):
    """`connect`'s private local cluster has no dashboard (nothing of a job reads Ray's state API since Ray Train
    runs without its placement-group cleaner: `pipeline.cluster.train.trainer_class`), so no multiprocessing
    forkserver leaves a `pymp-*` directory behind (the dashboard's did, one a job); a live program's `pymp-*`
    directory beside it is untouched. And the cluster keeps idle worker processes 10 s beyond Ray's soft limit
    (Ray's default: 1 s), so a burst of tasks after a pause reuses them."""
    import contextlib
    import shutil
    import tempfile
    import time
    from multiprocessing.connection import Listener
    from pathlib import Path

    import psutil
    import ray

    from pipeline import cluster

    tmp_path = Path(tempfile.mkdtemp(prefix="dc-", dir="/tmp"))  # short: Ray's socket paths under it have a limit
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(
        "RAY_idle_worker_killing_time_threshold_ms", raising=False
    )  # connect's own default, not conftest's
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the cluster's processes inherit it
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    live_dir = tmp_path / "pymp-live"
    live_dir.mkdir()
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp_path, True)
        stack.enter_context(Listener(str(live_dir / "listener-x"), family="AF_UNIX"))
        assert not ray.is_initialized()
        cluster.connect(1)
        try:
            session = cluster.session_log_dir()
            assert session.startswith(str(tmp_path)), session
            procs = []
            for p in psutil.process_iter():
                with contextlib.suppress(psutil.Error):
                    procs.append(" ".join(p.cmdline()))
            ours = [c for c in procs if session.rsplit("/logs", 1)[0] in c]
            assert any("gcs_server" in c for c in ours), ours  # the cluster's own processes are seen
            # Ray still runs dashboard.py in its minimal form (usage stats only): no frontend, no head modules
            dashboards = [c for c in ours if "dashboard/dashboard.py" in c]
            minimal = ("--disable-frontend", "--modules-to-load=UsageStatsHead")
            assert all(all(flag in c for flag in minimal) for c in dashboards), dashboards

            # four zero-CPU tasks at once on a 1-CPU cluster: several worker processes; 3 s after they end, Ray's
            # default would have killed all but one (its soft limit is the CPU count)
            @ray.remote(num_cpus=0)
            def pid() -> int:
                time.sleep(2)
                return os.getpid()

            pids = set(ray.get([pid.remote() for _ in range(4)]))
            assert len(pids) >= 3, pids
            time.sleep(3)
            assert all(psutil.pid_exists(p) for p in pids), [p for p in pids if not psutil.pid_exists(p)]
        finally:
            cluster.disconnect()
        assert not ray.is_initialized()
        assert [d.name for d in tmp_path.glob("pymp-*")] == ["pymp-live"]
        assert (live_dir / "listener-x").exists()


def test_ray_train_runs_without_a_placement_group_cleaner_or_a_dataset_manager_without_datasets(tmp_path):
    """`trainer_class` leaves out Ray Train's placement-group cleaner on every run, and its dataset manager on a run
    without Ray Datasets (fine-tuning's); the rest of Ray's default callbacks stay. Ray's private names it relies on
    are imported here, so a Ray that renames them fails this test."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from pipeline.cluster.train import trainer_class

    def callbacks(cls, datasets):
        t = cls(
            lambda: None,
            scaling_config=ScalingConfig(num_workers=1),
            datasets=datasets,
            run_config=RunConfig(name="callbacks", storage_path=str(tmp_path)),
        )
        return [type(c) for c in t._create_default_callbacks()]

    ds = {"p1_train": lambda: None}  # a dataset factory: nothing is read or started
    ray_own = callbacks(DataParallelTrainer, ds)
    assert PlacementGroupCleanerCallback in ray_own and DatasetsCallback in ray_own  # what Ray would start
    assert callbacks(trainer_class(), ds) == [c for c in ray_own if c is not PlacementGroupCleanerCallback]
    assert callbacks(trainer_class(), None) == [
        c for c in ray_own if c not in (PlacementGroupCleanerCallback, DatasetsCallback)
    ]


@pytest.mark.parametrize(
    "raised, shown",
    [
        (
            RuntimeError("\nFailed to start the dashboard, return code 1\nmore"),
            "Failed to start the dashboard, return code 1",
        ),
        (TimeoutError(), "TimeoutError"),
    ],
)
def test_a_failed_ray_start_is_one_line_that_says_why(monkeypatch, raised, shown):
    """`connect`'s error when ray.init fails: the first line of the exception that says something (a dashboard
    that failed to start raises a message starting with an empty line: the job printed "...(local): " and
    nothing more), else the exception's type."""

    import ray

    from pipeline import cluster
    from pipeline.cluster.connect import RayStartError

    def fail(**_kwargs):
        raise raised

    monkeypatch.setattr(os, "environ", dict(os.environ))  # connect's setdefaults stay in this test
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fail)
    with pytest.raises(RayStartError) as e:
        cluster.connect(1)
    assert str(e.value) == f"could not start or join Ray (local): {shown}"


@pytest.mark.parametrize(
    "address, use_gpu, gpus, refused",
    [
        (None, True, 0, True),
        ("local", True, 0, True),
        ("", True, 0, True),  # a private local cluster: this machine's GPUs
        (None, True, 1, False),
        (None, False, 0, False),
        ("10.0.0.5:6379", True, 0, False),  # a cluster: asked after connecting (check_resources)
    ],
)
def test_check_local_gpu_before_a_private_cluster_starts(monkeypatch, address, use_gpu, gpus, refused):
    from pipeline import cluster
    from pipeline.config import ConfigError

    if address is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", address)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    if refused:
        with pytest.raises(
            ConfigError,
            match=r"^train\.use_gpu is true but the Ray cluster has no GPU \(a private "
            r"local cluster: torch \S+ sees no CUDA device on this machine\)$",
        ):
            cluster.check_local_gpu("train", use_gpu)
    else:
        assert cluster.check_local_gpu("train", use_gpu) is None


def test_checkpoint_dirs_a_dead_process_left_are_removed_by_the_next_one(tmp_path, monkeypatch):
    """A worker stopped while it wrote a checkpoint (a Ctrl-C a moment after one, seen in bench/gpu/gpu_e2e.sh's dry
    run: three 17 MB directories left in /tmp) never cleans up; the next process's first checkpoint directory removes
    those whose process is gone, and keeps a live process's own and anything named otherwise."""
    import subprocess
    import sys
    import tempfile

    from pipeline.cluster import train

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(train, "_swept", False)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    for name in (f"checkpoint-write-{pid}-a1", f"checkpoint-upload-{pid}-b2", f"checkpoint-upload-{os.getpid()}-c3"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"x")
    (tmp_path / "tmpzz").mkdir()  # an unnamed one: not ours to judge
    with train.checkpoint_dir(False) as d:
        assert os.path.basename(d).startswith(f"checkpoint-write-{os.getpid()}-") and os.path.isdir(d)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [f"checkpoint-upload-{os.getpid()}-c3", "tmpzz", os.path.basename(d)]
        )
    assert not os.path.exists(d)
    with train.checkpoint_dir(True) as d:
        assert os.path.basename(d).startswith(f"checkpoint-upload-{os.getpid()}-")
    assert os.path.isdir(d)  # Ray Train deletes it after the upload
