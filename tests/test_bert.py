"""BertModel: parity with transformers on the real MiniLM checkpoint, padding invariance, init, parameter counts."""

from __future__ import annotations

import pytest
import torch
import transformers

from model import BertConfig, BertForPreTraining, BertModel
from model.bert import padding_mask
from model.hf import load_hf

SENTENCES = [
    "Hello world.",
    "The quick brown fox jumps over the lazy dog while the documentation build keeps running.",
    "Ray Data streams Parquet shards to the training workers.",
    "A dictionary maps hashable keys to arbitrary values; lookups take constant time on average.",
]


@pytest.fixture(scope="module")
def minilm_pair(minilm_dir):
    ours = load_hf(minilm_dir).eval()
    ref = transformers.BertModel.from_pretrained(minilm_dir).eval()
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    return ours, ref, tok


def test_minilm_parity_with_transformers(minilm_pair):
    ours, ref, tok = minilm_pair
    assert ours.load_report == {"missing": [], "unexpected": []}
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    real = batch["attention_mask"].bool()
    assert not real.all(), "the batch must contain padding"
    with torch.no_grad():
        a = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        b = ref(**batch)
    assert (a.last_hidden_state - b.last_hidden_state)[real].abs().max().item() <= 1e-5
    assert (a.pooler_output - b.pooler_output).abs().max().item() <= 1e-5
    # Not trivially equal: the representations are far from zero and differ between sentences.
    assert a.pooler_output.std(0).mean().item() > 1e-2


def test_minilm_sentence_pairs_with_segments(minilm_pair):
    ours, ref, tok = minilm_pair
    batch = tok(SENTENCES[:2], SENTENCES[2:], padding=True, return_tensors="pt")
    assert batch["token_type_ids"].any()
    with torch.no_grad():
        a = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        b = ref(**batch)
    real = batch["attention_mask"].bool()
    assert (a.last_hidden_state - b.last_hidden_state)[real].abs().max().item() <= 1e-5


def _tiny(**kw) -> BertConfig:
    return BertConfig(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        **kw,
    )


def test_padding_does_not_change_real_positions():
    torch.manual_seed(0)
    model = BertModel(_tiny()).eval()
    ids = torch.randint(1, 97, (1, 9))
    with torch.no_grad():
        alone = model(ids)
        # Pad to 16 with arbitrary (non-zero) ids: only the mask may hide them.
        padded_ids = torch.cat([ids, torch.randint(1, 97, (1, 7))], 1)
        mask = torch.cat([torch.ones(1, 9), torch.zeros(1, 7)], 1).long()
        padded = model(padded_ids, attention_mask=mask)
        unmasked = model(padded_ids)
    torch.testing.assert_close(padded.last_hidden_state[:, :9], alone.last_hidden_state, rtol=0, atol=1e-5)
    torch.testing.assert_close(padded.pooler_output, alone.pooler_output, rtol=0, atol=1e-5)
    # Without the mask the extra tokens do change the real positions (the mask is what makes it invariant).
    assert (unmasked.last_hidden_state[:, :9] - alone.last_hidden_state).abs().max() > 1e-3


def test_fully_padded_row_stays_finite_and_leaves_other_rows_alone():
    torch.manual_seed(0)
    model = BertModel(_tiny()).eval()
    ids = torch.randint(1, 97, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
    with torch.no_grad():
        out = model(ids, attention_mask=mask)
        first = model(ids[:1, :4])
    assert torch.isfinite(out.last_hidden_state).all()
    torch.testing.assert_close(out.last_hidden_state[0, :4], first.last_hidden_state[0], rtol=0, atol=1e-5)


def test_padding_mask_shape_and_no_padding_fast_path():
    m = padding_mask(torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert m.shape == (2, 1, 1, 3) and m.dtype == torch.bool
    assert m[0, 0, 0].tolist() == [True, True, False]
    assert padding_mask(torch.ones(2, 3, dtype=torch.long)) is None


def test_bert_initialisation():
    torch.manual_seed(0)
    cfg = BertConfig.from_preset("mini")
    model = BertForPreTraining(cfg)
    emb = model.bert.embeddings
    for w in (
        emb.word_embeddings.weight[1:],
        model.bert.encoder.layer[0].intermediate.dense.weight,
        model.bert.encoder.layer[1].attention.self.query.weight,
        model.cls.predictions.transform.dense.weight,
    ):
        assert abs(w.std().item() - 0.02) < 0.002 and abs(w.mean().item()) < 0.002
    assert emb.word_embeddings.weight[cfg.pad_token_id].abs().max() == 0
    for name, p in model.named_parameters():
        if "LayerNorm.weight" in name:
            assert (p == 1).all(), name
        elif name.endswith("bias"):
            assert (p == 0).all(), name


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once


@pytest.mark.parametrize(("preset", "expected"), [("base", 110_106_428), ("large", 336_226_108)])
def test_parameter_counts_match_transformers(preset, expected):
    cfg = BertConfig.from_preset(preset)
    with torch.device("meta"):  # no memory, no init time
        ours = BertForPreTraining(cfg)
        ref = transformers.BertForPreTraining(transformers.BertConfig(**cfg.to_hf_dict()))
    assert _count(ours) == _count(ref) == expected


def test_sequence_longer_than_positions_is_a_clear_error():
    model = BertModel(_tiny())
    with pytest.raises(ValueError, match="max_position_embeddings 40"):
        model(torch.ones(1, 41, dtype=torch.long))
