"""The training step's GPU-minded paths, tested on the CPU: sync-free step figures (`pipeline.core.step`) equal
the per-step figures of before, and make no host sync on steps that are not read; batches without padding
(`pipeline.pretrain.loader.collate`) give the same loss and logits as the masked path."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import model as model_pkg
import pipeline as pipeline_pkg
from model import BertConfig, BertForPreTraining
from pipeline.core.optim import make_optimizer
from pipeline.core.precision import forward
from pipeline.core.step import StepStats, Trainable, TrainFigures, all_reduce_sum, train_step
from pipeline.pretrain.loader import Batches, collate
from pipeline.pretrain.metrics import counts, summarise

VOCAB, SEQ = 60, 16


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is fastest, and on a shared machine more spin against each other (8 s vs 0.3 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _rows(rng: np.random.Generator, n: int, lengths: list[int] | None = None, nsp: bool = True) -> dict:
    """`n` rows in the shape the loader reads them: ids, segments, masked positions/ids, NSP labels."""
    lengths = lengths or [SEQ] * n
    ids = [np.concatenate([[2], rng.integers(5, VOCAB, size=L - 2), [3]]) for L in lengths]
    pos = [np.sort(rng.choice(np.arange(1, L - 1), size=3, replace=False)) for L in lengths]
    return {"input_ids": ids, "token_type_ids": [np.zeros(L, np.int64) for L in lengths],
            "masked_lm_positions": pos, "masked_lm_ids": [rng.integers(5, VOCAB, size=3) for _ in lengths],
            "next_sentence_label": rng.integers(0, 2, size=n) if nsp else np.full(n, -1)}


def _batches(seed: int, num: int, padded: bool) -> list[dict[str, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    return [collate(_rows(rng, 4, [SEQ, SEQ - 5, SEQ, SEQ - 2] if padded else None)) for _ in range(num)]


def _trainable(seed: int = 0) -> Trainable:
    torch.manual_seed(seed)
    m = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=VOCAB, max_position_embeddings=SEQ))
    opt, sched = make_optimizer(m, "adamw", 1e-3, 0.01, warmup_steps=2, total_steps=10)
    return Trainable(m, opt, sched)


def _step_as_before(t: Trainable, micro_batches, accumulation: int) -> StepStats:
    """The step as it was before the figures stayed on the device (a copy of the old `train_step`, fp32, one
    rank): every micro-batch's counts copied to the host, `float(grad_norm)` every step."""
    start, sums, tokens, examples = time.perf_counter(), None, 0, 0
    for _ in range(accumulation):
        batch = next(micro_batches)
        out = forward(t.model, batch, torch.device("cpu"), "fp32")
        (out.loss / accumulation).backward()
        c = counts(out, batch).detach().double().cpu()
        sums = c if sums is None else sums + c
        tokens += int(batch["num_tokens"])
        examples += len(batch["input_ids"])
    grad_norm = torch.nn.utils.clip_grad_norm_(t.model.parameters(), 1.0)
    t.optimizer.step()
    t.optimizer.zero_grad(set_to_none=True)
    lr = t.scheduler.get_last_lr()[0]
    t.scheduler.step()
    totals = all_reduce_sum(torch.cat([sums, torch.tensor([tokens, examples], dtype=torch.float64)]), torch.device("cpu"))
    return StepStats(summarise(totals[:-2]), lr, float(grad_norm), int(totals[-1]), int(totals[-2]),
                     time.perf_counter() - start)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("log_every", [1, 3])
def test_sync_free_figures_equal_the_per_step_figures_of_before(padded, log_every):
    steps, accumulation = 6, 2
    data = _batches(1, steps * accumulation, padded)
    before, after = _trainable(), _trainable()
    torch.manual_seed(7)
    feed = iter(data)
    ref = [_step_as_before(before, feed, accumulation) for _ in range(steps)]
    torch.manual_seed(7)  # the same dropout stream
    feed, figures, read = iter(data), TrainFigures(), {}
    for step in range(1, steps + 1):
        figures.add(train_step(after, feed, accumulation=accumulation, counts=counts, summarise=summarise,
                               device=torch.device("cpu")))
        if step % log_every == 0:
            read[step] = figures.read()
    assert sorted(read) == list(range(log_every, steps + 1, log_every))
    for step, got in read.items():
        want = ref[step - 1]
        assert got.figures.keys() == want.figures.keys() == {"loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy"}
        for k in want.figures:
            assert got.figures[k] == pytest.approx(want.figures[k], rel=1e-12, abs=1e-12), k
        assert got.lr == want.lr and got.grad_norm == pytest.approx(want.grad_norm, rel=1e-12)
        # throughput counts every step of the window since the last reading
        assert got.tokens == sum(r.tokens for r in ref[step - log_every : step])
        assert got.examples == sum(r.examples for r in ref[step - log_every : step]) == 4 * accumulation * log_every
        metrics = got.metrics()
        assert set(metrics) == {f"train/{k}" for k in (*want.figures, "lr", "grad_norm", "tokens_per_s", "examples_per_s")}


@contextlib.contextmanager
def _host_syncs(roots: list[Path]):
    """Record every call from code under `roots` that makes a tensor's value a Python one (and so, on a GPU,
    waits for the device): item, tolist, cpu, numpy, float(), int(), bool()."""
    calls: list[str] = []
    patched = {}
    for name in ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__"):
        orig = getattr(torch.Tensor, name)

        def wrapper(self, *a, _orig=orig, _name=name, **k):
            f = sys._getframe(1)
            if any(Path(f.f_code.co_filename).is_relative_to(r) for r in roots):
                calls.append(f"{_name} at {f.f_code.co_filename}:{f.f_lineno}")
            return _orig(self, *a, **k)

        patched[name] = orig
        setattr(torch.Tensor, name, wrapper)
    try:
        yield calls
    finally:
        for name, orig in patched.items():
            setattr(torch.Tensor, name, orig)


@pytest.mark.parametrize("padded", [False, True])
def test_no_host_sync_on_steps_that_are_not_read(padded):
    """Packed batches: nothing in pipeline/ or model/ syncs. Padded ones: the model checks an all-ones mask,
    but only on the CPU (`padding_mask`), so only pipeline/ is watched there."""
    roots = [Path(pipeline_pkg.__file__).parent] + ([] if padded else [Path(model_pkg.__file__).parent])
    t, data = _trainable(), _batches(2, 8, padded)
    feed, figures = iter(data), TrainFigures()
    with _host_syncs(roots) as calls:
        for _ in range(3):
            figures.add(train_step(t, feed, accumulation=2, counts=counts, summarise=summarise, device=torch.device("cpu")))
        assert calls == []
        stats = figures.read()
        assert calls, "the reading is where the host syncs"
    assert stats.examples == 3 * 2 * 4 and np.isfinite(stats.loss)


def test_batch_without_padding_has_no_mask_and_matches_the_masked_path():
    """Full-length rows collate without `attention_mask` (SDPA may take its flash kernel); next to a shorter row
    the same rows go through the masked path: loss and logits agree within 1e-3."""
    torch.manual_seed(0)
    m = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=VOCAB, max_position_embeddings=SEQ)).eval()
    rows = _rows(np.random.default_rng(3), 4, nsp=False)
    packed = collate(rows)
    assert "attention_mask" not in packed and int(packed["num_tokens"]) == 4 * SEQ
    short = _rows(np.random.default_rng(4), 1, [SEQ - 6], nsp=False)
    short["masked_lm_ids"] = [np.full(3, -1)]  # the extra row adds no masked position
    both = collate({k: list(rows[k]) + list(short[k]) for k in rows})
    assert both["attention_mask"][:4].all() and not both["attention_mask"][4].all()
    with torch.no_grad():
        a = m(**{k: v for k, v in packed.items() if k != "num_tokens"})
        b = m(**{k: v for k, v in both.items() if k != "num_tokens"})
        h_packed = m.bert(packed["input_ids"], packed["token_type_ids"]).last_hidden_state
        h_masked = m.bert(both["input_ids"], both["token_type_ids"], both["attention_mask"]).last_hidden_state[:4]
    assert a.mlm_loss.item() == pytest.approx(b.mlm_loss.item(), abs=1e-3)
    assert torch.allclose(a.mlm_logits, b.mlm_logits, atol=1e-3)
    assert torch.allclose(h_packed, h_masked, atol=1e-3)
    assert int(a.mlm_count) == int(b.mlm_count) == 12


def test_batches_pin_memory_only_for_cuda_and_change_nothing_else():
    """The loop pins batches only for a CUDA device (`pin_memory=device.type == "cuda"`); on the CPU the batches
    are exactly `collate`'s. Where CUDA is there, pinned batches hold the same values."""
    import types

    import pyarrow as pa

    plan = types.SimpleNamespace(dataset=types.SimpleNamespace(dynamic_masking=False))
    rows = _rows(np.random.default_rng(5), 3, [SEQ, SEQ - 3, SEQ])
    table = pa.table({k: [list(map(int, r)) for r in v] if isinstance(v, list) else v.tolist() for k, v in rows.items()})
    want = collate(rows)
    for pin in [False] + ([True] if torch.cuda.is_available() else []):
        got = Batches(plan, seed=0, pin_memory=pin)(table, epoch=0)
        assert got.keys() == want.keys()
        for k in want:
            assert torch.equal(got[k], want[k]), k
            assert got[k].is_pinned() == (pin and k != "num_tokens"), k


@pytest.mark.slow  # about 35 s of inductor compilation on a shared 2-core machine
def test_compiled_encoder_trains_like_eager(tmp_path, monkeypatch):
    """`train.compile`: the encoder compiled in place (parameter names unchanged) gives the eager losses within
    1e-4 over 2 steps, on batches padded to one width as the loop feeds it. Dropout is off: inductor draws its
    random numbers differently from eager."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # inductor's caches under tmp_path: nothing left in /tmp
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # and in inductor's compile workers
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    from torch._inductor import codecache

    monkeypatch.setattr(codecache, "_HEADER_DIR", str(tmp_path / "headers"), raising=False)
    monkeypatch.setattr(codecache, "_HEADER_LOCK_DIR", str(tmp_path / "headers" / "locks"), raising=False)
    data = [collate(_rows(np.random.default_rng(6 + i), 4, [SEQ - 4, SEQ - 5, SEQ - 4, SEQ - 2]), pad_to=SEQ)
            for i in range(2)]
    assert all(b["input_ids"].shape == (4, SEQ) for b in data)
    runs = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        m = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=VOCAB, max_position_embeddings=SEQ,
                                                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
        if compiled:
            m.bert.encoder.compile(dynamic=False)
        opt, sched = make_optimizer(m, "adamw", 1e-3, 0.01, warmup_steps=0, total_steps=10)
        t, feed = Trainable(m, opt, sched), iter(data)
        runs[compiled] = [train_step(t, feed, accumulation=1, counts=counts, summarise=summarise,
                                     device=torch.device("cpu")).read() for _ in range(2)]
        assert "encoder.layer.0.attention.self.query.weight" in dict(m.bert.named_parameters())
    for eager, comp in zip(runs[False], runs[True]):
        assert comp.loss == pytest.approx(eager.loss, abs=1e-4)
        assert comp.grad_norm == pytest.approx(eager.grad_norm, rel=1e-3)
