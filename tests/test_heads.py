"""Every head against the matching transformers class with copied weights; masked-path MLM; tying; NSP -1."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers

from model import (
    BertConfig,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from model.hf import convert_state_dict
from pipeline.core.precision import HOST_ONLY

# Random tiny configs: different widths, head counts, FFN ratios, segment vocab, activation.
CONFIGS = {
    "h32": dict(
        vocab_size=101,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
    ),
    "h48": dict(
        vocab_size=77,
        hidden_size=48,
        num_hidden_layers=3,
        num_attention_heads=3,
        intermediate_size=80,
        max_position_embeddings=24,
        type_vocab_size=3,
        hidden_act="gelu_new",
        num_labels=3,
    ),
}
B, L = 3, 12


def pair(ours_cls, hf_cls, cfg_kw: dict, seed: int = 0, **extra):
    """A transformers model with random weights and ours with the same weights, both in eval mode."""
    cfg = BertConfig(**cfg_kw, **extra)
    torch.manual_seed(seed)
    ref = hf_cls(transformers.BertConfig(**cfg.to_hf_dict())).eval()
    with torch.no_grad():  # transformers zero-inits biases; make them non-trivial so they are really compared
        for name, p in ref.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    ours = ours_cls(cfg).eval()
    ours.load_state_dict(convert_state_dict(ref.state_dict(), ours), strict=True)
    return ours, ref, cfg


def batch(cfg: BertConfig, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, cfg.vocab_size, (B, L), generator=g)
    lengths = torch.tensor([L, 7, 4])
    mask = (torch.arange(L)[None] < lengths[:, None]).long()
    tt = (torch.arange(L)[None] >= (lengths[:, None] // 2)).long() * mask
    ids = ids * mask  # [PAD] = 0 in padded positions
    return ids, tt, mask


ATOL = 1e-5


@pytest.mark.parametrize("name", CONFIGS)
def test_pretraining_matches_transformers(name):
    ours, ref, cfg = pair(BertForPreTraining, transformers.BertForPreTraining, CONFIGS[name])
    ids, tt, mask = batch(cfg)
    pos = torch.tensor([[1, 5, 9, 11], [0, 3, 6, -1], [2, -1, -1, -1]])
    g = torch.Generator().manual_seed(2)
    mlm_ids = torch.where(pos >= 0, torch.randint(0, cfg.vocab_size, pos.shape, generator=g), -1)
    nsl = torch.tensor([0, 1, 1])
    labels = torch.full((B, L), -100)
    for b in range(B):
        for p, t in zip(pos[b], mlm_ids[b]):
            if p >= 0:
                labels[b, p] = t
    with torch.no_grad():
        r = ref(input_ids=ids, token_type_ids=tt, attention_mask=mask, labels=labels, next_sentence_label=nsl)
        full = ours(ids, tt, mask)
        o = ours(ids, tt, mask, masked_lm_positions=pos, masked_lm_ids=mlm_ids, next_sentence_label=nsl)
    real = mask.bool()
    torch.testing.assert_close(full.mlm_logits[real], r.prediction_logits[real], rtol=0, atol=ATOL)
    torch.testing.assert_close(o.nsp_logits, r.seq_relationship_logits, rtol=0, atol=ATOL)
    valid = pos >= 0
    rows = torch.arange(B)[:, None].expand_as(pos)[valid]
    # Masked path: (N, V) in row-major (b, p) order, the reference's logits at those positions.
    torch.testing.assert_close(o.mlm_logits, r.prediction_logits[rows, pos[valid]], rtol=0, atol=ATOL)
    torch.testing.assert_close(o.loss, r.loss, rtol=0, atol=ATOL)
    ref_mlm = F.cross_entropy(r.prediction_logits.view(-1, cfg.vocab_size), labels.view(-1))
    torch.testing.assert_close(o.mlm_loss, ref_mlm, rtol=0, atol=ATOL)
    torch.testing.assert_close(o.nsp_loss, F.cross_entropy(r.seq_relationship_logits, nsl), rtol=0, atol=ATOL)


def test_masked_path_loss_equals_full_path_loss_at_those_positions():
    torch.manual_seed(0)
    cfg = BertConfig(**CONFIGS["h32"])
    model = BertForPreTraining(cfg).eval()
    ids, tt, mask = batch(cfg)
    pos = torch.tensor([[0, 4, 11, -1], [2, 6, -1, -1], [1, 3, -1, -1]])
    mlm_ids = torch.where(pos >= 0, (pos * 7 + 3) % cfg.vocab_size, -1)
    with torch.no_grad():
        full = model(ids, tt, mask).mlm_logits  # (B, L, V)
        out = model(ids, tt, mask, masked_lm_positions=pos, masked_lm_ids=mlm_ids)
    valid = pos >= 0
    rows = torch.arange(B)[:, None].expand_as(pos)[valid]
    at = full[rows, pos[valid]]  # (N, V)
    torch.testing.assert_close(out.mlm_logits, at, rtol=0, atol=1e-5)
    torch.testing.assert_close(out.mlm_loss, F.cross_entropy(at, mlm_ids[valid]), rtol=0, atol=1e-6)
    assert out.nsp_loss is None and out.loss is out.mlm_loss
    correct = (at.argmax(-1) == mlm_ids[valid]).sum()
    assert out.mlm_correct == correct and out.mlm_count == valid.sum() == 7
    torch.testing.assert_close(out.mlm_accuracy, correct / 7.0)


def test_nsp_minus_one_is_ignored_and_all_minus_one_means_mlm_only():
    torch.manual_seed(0)
    cfg = BertConfig(**CONFIGS["h32"])
    model = BertForPreTraining(cfg).eval()
    ids, tt, mask = batch(cfg)
    pos = torch.tensor([[1, 2], [3, -1], [0, 1]])
    mlm_ids = torch.where(pos >= 0, torch.tensor(5), -1)
    with torch.no_grad():
        some = model(ids, tt, mask, pos, mlm_ids, next_sentence_label=torch.tensor([1, -1, 0]))
        none = model(ids, tt, mask, pos, mlm_ids, next_sentence_label=torch.tensor([-1, -1, -1]))
    want = F.cross_entropy(some.nsp_logits[[0, 2]], torch.tensor([1, 0]))
    torch.testing.assert_close(some.nsp_loss, want)
    torch.testing.assert_close(some.loss, some.mlm_loss + want)
    assert int(some.nsp_count) == 2
    expected_correct = int((some.nsp_logits[[0, 2]].argmax(-1) == torch.tensor([1, 0])).sum())
    assert int(some.nsp_correct) == expected_correct
    assert int(none.nsp_count) == 0 and float(none.nsp_loss) == 0.0
    torch.testing.assert_close(none.loss, none.mlm_loss)


def test_no_masked_positions_gives_zero_mlm_loss_not_nan():
    cfg = BertConfig(**CONFIGS["h32"])
    model = BertForPreTraining(cfg).eval()
    ids, tt, mask = batch(cfg)
    pos = torch.full((B, 3), -1)
    out = model(ids, tt, mask, pos, pos.clone(), torch.tensor([0, 1, 0]))
    assert out.mlm_logits.shape == (0, cfg.vocab_size)
    assert float(out.mlm_loss.detach()) == 0.0 and int(out.mlm_count) == 0 and torch.isfinite(out.loss)
    out.loss.backward()  # still differentiable (through NSP)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("problem", ["single", "regression", "multi"])
def test_sequence_classification_matches_transformers(name, problem):
    kw = dict(CONFIGS[name])
    kw["num_labels"] = 1 if problem == "regression" else kw.get("num_labels", 2)
    extra = {"problem_type": "multi_label_classification"} if problem == "multi" else {}
    ours, ref, cfg = pair(BertForSequenceClassification, transformers.BertForSequenceClassification, kw, **extra)
    ids, tt, mask = batch(cfg)
    g = torch.Generator().manual_seed(3)
    if problem == "single":
        labels = torch.randint(0, cfg.num_labels, (B,), generator=g)
    elif problem == "regression":
        labels = torch.randn(B, generator=g)
    else:
        labels = torch.randint(0, 2, (B, cfg.num_labels), generator=g).float()
    with torch.no_grad():
        r = ref(input_ids=ids, token_type_ids=tt, attention_mask=mask, labels=labels)
        o = ours(ids, tt, mask, labels=labels)
    torch.testing.assert_close(o.logits, r.logits, rtol=0, atol=ATOL)
    torch.testing.assert_close(o.loss, r.loss, rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", CONFIGS)
def test_token_classification_matches_transformers(name):
    ours, ref, cfg = pair(BertForTokenClassification, transformers.BertForTokenClassification, CONFIGS[name])
    ids, tt, mask = batch(cfg)
    g = torch.Generator().manual_seed(4)
    labels = torch.randint(0, cfg.num_labels, (B, L), generator=g).masked_fill(mask == 0, -100)
    labels[0, 0] = -100
    with torch.no_grad():
        r = ref(input_ids=ids, token_type_ids=tt, attention_mask=mask, labels=labels)
        o = ours(ids, tt, mask, labels=labels)
    real = mask.bool()
    torch.testing.assert_close(o.logits[real], r.logits[real], rtol=0, atol=ATOL)
    torch.testing.assert_close(o.loss, r.loss, rtol=0, atol=ATOL)


@pytest.mark.parametrize("name", CONFIGS)
def test_question_answering_matches_transformers(name):
    kw = {**CONFIGS[name], "num_labels": 2}
    ours, ref, cfg = pair(BertForQuestionAnswering, transformers.BertForQuestionAnswering, kw)
    ids, tt, mask = batch(cfg)
    start = torch.tensor([2, 0, 50])  # 50 is outside the input: clamped to L and ignored, as transformers does
    end = torch.tensor([5, 3, 60])
    with torch.no_grad():
        r = ref(input_ids=ids, token_type_ids=tt, attention_mask=mask, start_positions=start, end_positions=end)
        o = ours(ids, tt, mask, start_positions=start, end_positions=end)
    real = mask.bool()
    torch.testing.assert_close(o.start_logits[real], r.start_logits[real], rtol=0, atol=ATOL)
    torch.testing.assert_close(o.end_logits[real], r.end_logits[real], rtol=0, atol=ATOL)
    torch.testing.assert_close(o.loss, r.loss, rtol=0, atol=ATOL)


def test_question_answering_needs_two_labels():
    with pytest.raises(ValueError, match="num_labels must be 2"):
        BertForQuestionAnswering(BertConfig(**{**CONFIGS["h32"], "num_labels": 3}))


def _decoder_is_embeddings(model: BertForPreTraining, ids: torch.Tensor) -> None:
    with torch.no_grad():
        h = model.bert(ids).last_hidden_state
        logits = model(ids).mlm_logits
        want = model.cls.predictions.transform(h) @ model.bert.embeddings.word_embeddings.weight.T
        torch.testing.assert_close(logits, want + model.cls.predictions.bias, rtol=0, atol=1e-5)


def test_decoder_stays_tied_after_an_optimizer_step():
    torch.manual_seed(0)
    cfg = BertConfig(**CONFIGS["h32"], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(cfg)
    assert not any("decoder" in k for k in model.state_dict())  # one copy: save_file / DDP see no shared tensor
    ids, tt, mask = batch(cfg)
    emb = model.bert.embeddings.word_embeddings.weight
    before = emb.detach().clone()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    out = model(ids, tt, mask, torch.tensor([[1], [2], [3]]), torch.tensor([[9], [8], [7]]), torch.tensor([0, 1, 0]))
    out.loss.backward()
    # The decoder's gradient reaches the embedding rows of tokens that never appear in the input.
    unused = torch.ones(cfg.vocab_size, dtype=torch.bool)
    unused[ids.unique()] = False
    assert emb.grad[unused].abs().sum() > 0
    opt.step()
    assert not torch.equal(before, emb.detach())
    _decoder_is_embeddings(model.eval(), ids)


def test_dropout_active_in_training_only():
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(**CONFIGS["h32"]))
    ids, tt, mask = batch(BertConfig(**CONFIGS["h32"]))
    model.train()
    assert not torch.equal(model(ids, tt, mask).logits, model(ids, tt, mask).logits)
    model.eval()
    assert torch.equal(model(ids, tt, mask).logits, model(ids, tt, mask).logits)


def test_shard_dtypes_are_accepted():
    """Shards hold int32 ids/positions and int8 segments/labels; results equal the int64 ones."""
    torch.manual_seed(0)
    cfg = BertConfig(**CONFIGS["h32"])
    model = BertForPreTraining(cfg).eval()
    ids, tt, mask = batch(cfg)
    pos = torch.tensor([[1, 2], [3, -1], [0, 1]])
    mlm_ids = torch.where(pos >= 0, torch.tensor(5), -1)
    nsl = torch.tensor([1, -1, 0])
    with torch.no_grad():
        a = model(ids, tt, mask, pos, mlm_ids, nsl)
        b = model(ids.int(), tt.to(torch.int8), mask.to(torch.int8), pos.int(), mlm_ids.int(), nsl.to(torch.int8))
    torch.testing.assert_close(b.loss, a.loss, rtol=0, atol=0)


@pytest.mark.parametrize("padded", [True, False])
def test_pretraining_step_reads_no_value_off_the_device(padded):
    """Forward and backward on the meta device, which holds shapes and no values: any tensor sized by data (a
    boolean selection, `nonzero`) or value read (`.item()`, `bool()`) raises there. On a GPU each would be a host
    sync in every step; the loop reads its figures only on the steps that log (pipeline/core/step.py)."""
    from pipeline.pretrain.loader import collate

    lengths = [10, 6 if padded else 10]
    rows = {
        "input_ids": [np.arange(2, 2 + n) for n in lengths],
        "token_type_ids": [np.zeros(n) for n in lengths],
        "masked_lm_positions": [np.array([1, 3]), np.array([2])],
        "masked_lm_ids": [np.array([5, 6]), np.array([7])],
        "next_sentence_label": np.array([0, -1]),
    }
    batch = {k: v.to("meta") for k, v in collate(rows).items() if k not in HOST_ONLY}
    assert ("attention_mask" in batch) == padded
    with torch.device("meta"):
        model = BertForPreTraining(BertConfig(**CONFIGS["h32"]))
    out = model(**batch)
    out.loss.backward()
    assert out.slot_logits.shape == (2 * 2, model.config.vocab_size)  # B x P slots, the -1 slot included
    assert model.bert.embeddings.word_embeddings.weight.grad.shape == (model.config.vocab_size, 32)
