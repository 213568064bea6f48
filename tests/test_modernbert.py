"""model.modernbert against transformers' ModernBERT: presets, config.json both ways, fp32 parity of the MLM and
task heads through save_hf/load_hf in both directions, packed rows keeping documents apart, the local window."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import transformers

from model import (
    ModernBertConfig,
    ModernBertForMaskedLM,
    ModernBertModel,
)
from model.hf import load_hf, save_hf
from model.modernbert import (
    Banded,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    attention_masks,
    banded_attention,
    document_layout,
)

VOCAB, WINDOW = 80, 16  # half-window 8: sequences of 40 put most pairs outside a local layer's reach


def tiny_cfg(**kw) -> ModernBertConfig:
    """4 layers (global, local, local, global), window 16, every bias and norm bias on unless kw says otherwise."""
    base = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=2, intermediate_size=48,
                num_hidden_layers=4, local_attention=WINDOW, max_position_embeddings=128, norm_bias=True,
                attention_bias=True, mlp_bias=True, classifier_bias=True)
    return ModernBertConfig.from_preset("modernbert-tiny", **{**base, **kw})


def randomise(model: torch.nn.Module) -> torch.nn.Module:
    """Weights far from their initial values (norms and biases included), so nothing agrees by accident."""
    torch.manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """(3, 40) ids, rows of 40, 29 and 5 real tokens (right padding), longer than the window."""
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(3, 40, dtype=torch.long)
    mask[1, 29:] = 0
    mask[2, 5:] = 0
    return torch.randint(1, VOCAB, (3, 40), generator=g) * mask, mask


@pytest.mark.parametrize(("name", "layers", "hidden", "inter", "count"), [
    ("modernbert-base", 22, 768, 1152, 149_655_232), ("modernbert-large", 28, 1024, 2624, 395_881_664)])
def test_paper_presets_have_the_paper_sizes(name, layers, hidden, inter, count):
    """The paper's 149M and 395M; the counts are transformers' ModernBertForMaskedLM's at these configs."""
    cfg = ModernBertConfig.from_preset(name)
    with torch.device("meta"):  # counts without allocating 1.6 GB
        m = ModernBertForMaskedLM(cfg)
    n = sum(p.numel() for p in m.parameters())
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (layers, hidden, inter)
    assert n == count
    assert cfg.layer_types.count("full_attention") == -(-layers // 3)
    assert (cfg.global_rope_theta, cfg.local_rope_theta, cfg.local_attention) == (160000.0, 10000.0, 128)


@pytest.mark.parametrize("name", ["modernbert-tiny", "modernbert-mini"])
def test_cpu_presets_take_any_wordpiece_vocabulary(name):
    cfg = ModernBertConfig.from_preset(name, vocab_size=8000)
    assert cfg.pad_token_id == 0 and cfg.head_dim == 64
    assert cfg.layer_types[:3] == ["full_attention", "sliding_attention", "sliding_attention"]
    with pytest.raises(ValueError, match="unknown preset 'tiny'"):
        ModernBertConfig.from_preset("tiny")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"hidden_size": 100}, "hidden_size 100 is not divisible by num_attention_heads 12"),
    ({"local_attention": 0}, "local_attention"),
    ({"mlp_dropout": 1.0}, "mlp_dropout"),
    ({"global_rope_theta": 0}, "global_rope_theta"),
    ({"hidden_activation": "tanh"}, "hidden_activation"),
    ({"classifier_pooling": "max"}, "classifier_pooling"),
    ({"vocab_size": 100}, "pad_token_id 50283"),
])
def test_invalid_fields_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModernBertConfig(**kwargs)


def test_config_json_both_spellings_and_transformers_reads_ours():
    cfg = tiny_cfg(global_attn_every_n_layers=2, global_rope_theta=80000.0, num_labels=3,
                   id2label={0: "a", 1: "b", 2: "c"})
    d = cfg.to_hf_dict(["ModernBertForMaskedLM"])
    theirs = transformers.ModernBertConfig(**d)
    assert theirs.layer_types == ["full_attention", "sliding_attention"] * 2
    assert theirs.rope_parameters["full_attention"]["rope_theta"] == 80000.0
    assert theirs.sliding_window == WINDOW // 2 and theirs.id2label == {0: "a", 1: "b", 2: "c"}
    assert ModernBertConfig.from_hf_dict(theirs.to_dict()) == cfg
    old = {k: v for k, v in d.items() if k not in ("layer_types", "rope_parameters")}
    old.update(global_attn_every_n_layers=2, global_rope_theta=80000.0, local_rope_theta=10000.0)
    assert ModernBertConfig.from_hf_dict(old) == cfg
    with pytest.raises(ValueError, match="layer_types"):
        ModernBertConfig.from_hf_dict({**d, "layer_types": ["sliding_attention"] * 4})


@pytest.mark.parametrize("biases", [True, False])
def test_masked_lm_matches_transformers_both_ways(tmp_path, biases):
    """Ours -> save_hf -> transformers, and transformers -> save_pretrained -> load_hf: logits within 1e-5 on a
    padded batch longer than the window, at every position (padding too)."""
    cfg = tiny_cfg(norm_bias=biases, attention_bias=biases, mlp_bias=biases, classifier_bias=biases)
    ours = randomise(ModernBertForMaskedLM(cfg))
    save_hf(ours, tmp_path / "ours")
    theirs, info = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert type(theirs) is transformers.ModernBertForMaskedLM
    assert not any(info.values())
    ids, mask = padded_batch()
    with torch.no_grad():
        assert (ours(ids, attention_mask=mask).mlm_logits - theirs.eval()(ids, attention_mask=mask).logits
                ).abs().max() <= 1e-5
        assert (ours(ids).mlm_logits - theirs(ids).logits).abs().max() <= 1e-5  # no mask: the band alone

    theirs = randomise(transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**cfg.to_hf_dict())))
    theirs.save_pretrained(tmp_path / "theirs")
    back = load_hf(tmp_path / "theirs", ModernBertForMaskedLM, strict=True).eval()
    with torch.no_grad():
        diff = (back(ids, attention_mask=mask).mlm_logits - theirs(ids, attention_mask=mask).logits).abs().max()
    assert diff <= 1e-5
    assert torch.equal(back.model.embeddings.tok_embeddings.weight, theirs.decoder.weight)  # tied on load


HEADS = [(ModernBertForSequenceClassification, transformers.ModernBertForSequenceClassification, "cls"),
         (ModernBertForSequenceClassification, transformers.ModernBertForSequenceClassification, "mean"),
         (ModernBertForTokenClassification, transformers.ModernBertForTokenClassification, "cls"),
         (ModernBertForQuestionAnswering, transformers.ModernBertForQuestionAnswering, "cls")]


@pytest.mark.parametrize(("ours_cls", "hf_cls", "pooling"), HEADS)
def test_task_heads_match_transformers(tmp_path, ours_cls, hf_cls, pooling):
    ours = randomise(ours_cls(tiny_cfg(num_labels=2, classifier_pooling=pooling)))
    save_hf(ours, tmp_path)
    theirs, info = hf_cls.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values())
    ids, mask = padded_batch()
    if ours_cls is ModernBertForSequenceClassification:
        kw = {"labels": torch.tensor([0, 1, 1])}
    elif ours_cls is ModernBertForTokenClassification:
        kw = {"labels": torch.where(mask.bool(), ids % 2, -100)}
    else:
        kw = {"start_positions": torch.tensor([3, 1, 2]), "end_positions": torch.tensor([9, 50, 4])}
    with torch.no_grad():
        a, b = ours(ids, attention_mask=mask, **kw), theirs.eval()(ids, attention_mask=mask, **kw)
    logits = ("start_logits", "end_logits") if ours_cls is ModernBertForQuestionAnswering else ("logits",)
    for name in logits:
        assert (getattr(a, name) - getattr(b, name)).abs().max() <= 1e-5
    assert abs(float(a.loss) - float(b.loss)) <= 1e-5


def test_masked_positions_give_the_full_logits_rows_and_their_loss():
    m = randomise(ModernBertForMaskedLM(tiny_cfg()))
    ids, mask = padded_batch()
    pos = torch.tensor([[0, 17, 39], [3, 28, -1], [4, -1, -1]])
    labels = torch.tensor([[5, 6, 7], [8, 9, -1], [10, -1, -1]])
    with torch.no_grad():
        full = m(ids, attention_mask=mask).mlm_logits  # (3, 40, V)
        out = m(ids, attention_mask=mask, masked_lm_positions=pos, masked_lm_ids=labels)
    rows = torch.tensor([0, 0, 0, 1, 1, 2]), torch.tensor([0, 17, 39, 3, 28, 4])
    assert torch.allclose(out.mlm_logits, full[rows], atol=1e-6)
    assert int(out.mlm_count) == 6 and out.nsp_logits is None
    expected = F.cross_entropy(full[rows], labels[labels >= 0])
    assert torch.allclose(out.loss, expected, atol=1e-6)


@pytest.mark.parametrize("cu", [[0, 5, 14], [1, 6], [0, 6, 6], [0, 30]])  # crosses a row; not from 0; empty; too long
def test_document_boundaries_are_checked(cu):
    with pytest.raises(ValueError, match="a document per row"):
        document_layout(2, 12, torch.tensor(cu))


@pytest.mark.parametrize("window", [4, 8])  # half 2: banded chunks (12 >= 4 * 2); half 4: a dense band mask
def test_document_layout_and_masks_keep_documents_and_windows(window):
    doc, pos = document_layout(2, 12, torch.tensor([0, 3, 12, 22]))  # row 0: 3 + 9 tokens; row 1: 10 + 2 pad
    assert doc.tolist() == [[0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1], [2] * 10 + [-1, -1]]
    assert pos.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8], list(range(10)) + [0, 0]]
    cfg, half = tiny_cfg(local_attention=window), window // 2
    masks = attention_masks(cfg, 2, 12, torch.device("cpu"), None, doc)
    i = torch.arange(12)
    same = (doc[:, :, None] == doc[:, None, :]) & (doc[:, None, :] >= 0)  # (2, 12, 12)
    assert torch.equal(masks["full_attention"][:, 0], same)
    assert not masks["full_attention"][1, 0, :, 10:].any()  # nobody attends to padding
    local = same & ((i[:, None] - i[None]).abs() <= half)
    assert local[0, 4].nonzero().flatten().tolist() == list(range(3, 5 + half))  # 2 is the previous document
    assert isinstance(masks["sliding_attention"], Banded) == (half == 2)
    # The local layer's attention equals SDPA under the full (12 x 12) local mask, computed here independently.
    q, k, v = torch.randn(3, 2, 3, 12, 16).unbind(0)
    got = (banded_attention(q, k, v, masks["sliding_attention"], 0.0, 0.25) if half == 2
           else F.scaled_dot_product_attention(q, k, v, attn_mask=masks["sliding_attention"], scale=0.25))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=local[:, None], scale=0.25)
    real = doc >= 0
    assert (got - want).abs().amax(dim=(1, 3))[real].max() <= 1e-6
    plain = attention_masks(cfg, 2, 12, torch.device("cpu"), None, None)
    assert plain["full_attention"] is None  # no padding, no documents: no mask, nothing masked or wasted


def test_packed_rows_give_each_document_its_own_outputs():
    """Row 0 packs documents of 37, 5 and 42 tokens, row 1 one of 60 and then 24 pad: each document's logits
    equal those of the document alone (positions restart, attention and windows stay inside it)."""
    m = randomise(ModernBertForMaskedLM(tiny_cfg()))
    g = torch.Generator().manual_seed(1)
    lengths = [[37, 5, 42], [60]]
    docs = [[torch.randint(1, VOCAB, (n,), generator=g) for n in row] for row in lengths]
    ids = torch.zeros(2, 84, dtype=torch.long)
    ids[0] = torch.cat(docs[0])
    ids[1, :60] = docs[1][0]
    cu = torch.tensor([0, 37, 42, 84, 144])
    mask = (torch.arange(84) < torch.tensor([[84], [60]])).long()
    with torch.no_grad():
        packed = m(ids, attention_mask=mask, cu_seqlens=cu).mlm_logits
        unbounded = m(ids, attention_mask=mask).mlm_logits
        starts = [[0, 37, 42], [0]]
        for r, row in enumerate(docs):
            for start, d in zip(starts[r], row):
                alone = m(d[None]).mlm_logits[0]
                assert (packed[r, start:start + len(d)] - alone).abs().max() <= 1e-5
    assert (packed[0, 37:] - unbounded[0, 37:]).abs().max() > 1e-2  # without boundaries they would mix


def test_names_import_from_model_and_config_needs_no_torch():
    assert ModernBertModel.__module__ == "model.modernbert"
    code = "import sys, model.config; model.config.ModernBertConfig.from_preset('modernbert-base'); " \
           "assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_load_hf_names_the_family_it_found(tmp_path):
    save_hf(ModernBertModel(tiny_cfg()), tmp_path)
    with pytest.raises(ValueError, match="holds a modernbert model; BertModel is a bert class.*ModernBertModel"):
        load_hf(tmp_path)
    bare = load_hf(tmp_path, "ModernBertForMaskedLM")  # a bare encoder into the MLM class: only the head is new
    assert bare.load_report["missing"] == ["decoder.bias", "head.dense.bias", "head.dense.weight", "head.norm.bias",
                                           "head.norm.weight"]
