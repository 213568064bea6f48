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
    DenseMask,
    FlexMask,
    JaggedRows,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    attention_masks,
    layer_mask,
)
from model.segments import Segments

VOCAB, WINDOW = 80, 16  # half-window 8: sequences of 40 put most pairs outside a local layer's reach


def tiny_cfg(**kw) -> ModernBertConfig:
    """4 layers (global, local, local, global), window 16, every bias and norm bias on unless kw says otherwise."""
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=48,
        num_hidden_layers=4,
        local_attention=WINDOW,
        max_position_embeddings=128,
        norm_bias=True,
        attention_bias=True,
        mlp_bias=True,
        classifier_bias=True,
    )
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


@pytest.mark.parametrize(
    ("name", "layers", "hidden", "inter", "count"),
    [("modernbert-base", 22, 768, 1152, 149_655_232), ("modernbert-large", 28, 1024, 2624, 395_881_664)],
)
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


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hidden_size": 100}, "hidden_size 100 is not divisible by num_attention_heads 12"),
        ({"local_attention": 0}, "local_attention"),
        ({"mlp_dropout": 1.0}, "mlp_dropout"),
        ({"global_rope_theta": 0}, "global_rope_theta"),
        ({"hidden_activation": "tanh"}, "hidden_activation"),
        ({"classifier_pooling": "max"}, "classifier_pooling"),
        ({"vocab_size": 100}, "pad_token_id 50283"),
    ],
)
def test_invalid_fields_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModernBertConfig(**kwargs)


def test_config_json_both_spellings_and_transformers_reads_ours():
    cfg = tiny_cfg(
        global_attn_every_n_layers=2, global_rope_theta=80000.0, num_labels=3, id2label={0: "a", 1: "b", 2: "c"}
    )
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
        assert (
            ours(ids, attention_mask=mask).mlm_logits - theirs.eval()(ids, attention_mask=mask).logits
        ).abs().max() <= 1e-5
        assert (ours(ids).mlm_logits - theirs(ids).logits).abs().max() <= 1e-5  # no mask: the band alone

    theirs = randomise(transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**cfg.to_hf_dict())))
    theirs.save_pretrained(tmp_path / "theirs")
    back = load_hf(tmp_path / "theirs", ModernBertForMaskedLM, strict=True).eval()
    with torch.no_grad():
        diff = (back(ids, attention_mask=mask).mlm_logits - theirs(ids, attention_mask=mask).logits).abs().max()
    assert diff <= 1e-5
    assert torch.equal(back.model.embeddings.tok_embeddings.weight, theirs.decoder.weight)  # tied on load


HEADS = [
    (ModernBertForSequenceClassification, transformers.ModernBertForSequenceClassification, "cls"),
    (ModernBertForSequenceClassification, transformers.ModernBertForSequenceClassification, "mean"),
    (ModernBertForTokenClassification, transformers.ModernBertForTokenClassification, "cls"),
    (ModernBertForQuestionAnswering, transformers.ModernBertForQuestionAnswering, "cls"),
]


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


# crosses a row; not from 0; empty; past the real tokens
@pytest.mark.parametrize("cu", [[0, 5, 14, 24], [1, 24], [0, 6, 6, 24], [0, 30]])
def test_segments_are_checked(cu):
    with pytest.raises(ValueError, match="a segment per row"):
        Segments(torch.tensor(cu), 12).layout(2, 12)


@pytest.mark.parametrize("window", [4, 8])  # half 2: banded chunks (12 >= 4 * 2); half 4: a dense band mask
def test_document_layout_and_masks_keep_documents_and_windows(window):
    pad = torch.tensor([[1] * 12, [1] * 10 + [0, 0]])
    doc, pos = Segments(torch.tensor([0, 3, 12, 22]), 12).layout(2, 12, pad)  # row 0: 3 + 9 tokens; row 1: 10 + 2 pad
    assert doc.tolist() == [[0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1], [2] * 10 + [-1, -1]]
    assert pos.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8], list(range(10)) + [0, 0]]
    cfg, half = tiny_cfg(local_attention=window), window // 2
    masks = attention_masks(cfg, 2, 12, torch.device("cpu"), pad, doc)
    i = torch.arange(12)
    same = (doc[:, :, None] == doc[:, None, :]) & (doc[:, None, :] >= 0)  # (2, 12, 12)
    assert torch.equal(masks["full_attention"].mask[:, 0], same)
    assert not masks["full_attention"].mask[1, 0, :, 10:].any()  # nobody attends to padding
    local = same & ((i[:, None] - i[None]).abs() <= half)
    assert local[0, 4].nonzero().flatten().tolist() == list(range(3, 5 + half))  # 2 is the previous document
    assert isinstance(masks["sliding_attention"], Banded) == (half == 2)
    # The local layer's attention equals SDPA under the full (12 x 12) local mask, computed here independently.
    q, k, v = torch.randn(3, 2, 3, 12, 16).unbind(0)
    got = masks["sliding_attention"].attend(q, k, v, 0.0, 0.25)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=local[:, None], scale=0.25)
    real = doc >= 0
    assert (got - want).abs().amax(dim=(1, 3))[real].max() <= 1e-6
    plain = attention_masks(cfg, 2, 12, torch.device("cpu"), None, None)
    assert plain["full_attention"].mask is None  # no padding, no documents: no mask, nothing masked or wasted


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
                assert (packed[r, start : start + len(d)] - alone).abs().max() <= 1e-5
    assert (packed[0, 37:] - unbounded[0, 37:]).abs().max() > 1e-2  # without boundaries they would mix


# The attention kernels (issue 61) against the reference attention on packed rows: row 0 holds documents of 9, 20
# and 11 tokens, row 1 one of 26 then 14 pad; half-window 4, so the local layers see a fraction of each document.
LENGTHS, PAD_ROW, HALF = [[9, 20, 11], [26]], 26, 4
KERNELS = [
    ("full_attention", "sdpa"),
    ("full_attention", "flex"),
    ("full_attention", "jagged"),
    ("sliding_attention", "banded"),
    ("sliding_attention", "sdpa"),
    ("sliding_attention", "flex"),
]


def reference_attention(q, k, v, doc, half, scale):
    """Softmax attention written out: each query over the real keys of its own document, within `half` of it on a
    local layer; (B, nh, L, hd). A pad query's row is uniform (never compared, its gradient in is 0)."""
    i = torch.arange(q.shape[2])
    allowed = (doc[:, :, None] == doc[:, None, :]) & (doc[:, None, :] >= 0)  # (B, L, L)
    if half is not None:
        allowed &= (i[:, None] - i[None, :]).abs() <= half
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~allowed[:, None], torch.finfo(q.dtype).min)
    return scores.softmax(-1) @ v


def packed_rows():
    """(doc ids (B, L) by hand, attention mask, Segments) of LENGTHS."""
    L = sum(LENGTHS[0])
    doc = torch.full((2, L), -1)
    doc[0] = torch.repeat_interleave(torch.arange(3), torch.tensor(LENGTHS[0]))
    doc[1, :PAD_ROW] = 3
    mask = (doc >= 0).long()
    cu = torch.tensor([0, 9, 29, 40, 66], dtype=torch.int32)  # segments of the 66 real tokens
    return doc, mask, Segments(cu, L)


@pytest.mark.parametrize(("kind", "kernel"), KERNELS)
def test_every_attention_kernel_equals_the_reference_on_packed_rows(kind, kernel):
    """Forward and backward (dq, dk, dv), fp32, <= 1e-5 at every real token; padding's outputs are never read.
    FlexAttention has no backward on the CPU in torch 2.13 (NotImplementedError): there its forward is compared,
    and its block mask's rule as a dense mask, which is what its backward applies too; a GPU runs its backward
    (bench/train/modernbert_step.py --attention checks it on the lease)."""
    doc, mask, segments = packed_rows()
    layout, _ = segments.layout(2, doc.shape[1], mask)
    assert torch.equal(layout, doc)
    field = "global_attention_kernel" if kind == "full_attention" else "local_attention_kernel"
    cfg = tiny_cfg(local_attention=2 * HALF, **{field: kernel})
    layer_mask = attention_masks(cfg, 2, doc.shape[1], torch.device("cpu"), mask, doc, segments)[kind]
    assert isinstance(layer_mask, {"sdpa": DenseMask, "flex": FlexMask, "jagged": JaggedRows, "banded": Banded}[kernel])
    g = torch.Generator().manual_seed(2)
    q, k, v, grad = (torch.randn(2, 2, doc.shape[1], 8, generator=g) for _ in range(4))
    grad = grad * mask[:, None, :, None]  # a loss that reads real tokens only
    half = HALF if kind == "sliding_attention" else None
    want_in = [t.clone().requires_grad_() for t in (q, k, v)]
    want = reference_attention(*want_in, doc, half, 0.3)
    want.backward(grad)
    real = mask.bool()
    if kernel == "flex":
        with torch.no_grad():
            got = layer_mask.attend(q, k, v, 0.0, 0.3)
        assert (got - want).abs().amax(dim=(1, 3))[real].max() <= 1e-5
        from torch.nn.attention.flex_attention import create_mask

        i = torch.arange(doc.shape[1])
        rule = (doc[:, :, None] == doc[:, None, :]) & (doc[:, None, :] >= 0)
        rule &= (i[:, None] - i[None]).abs() <= (half if half is not None else doc.shape[1])
        dense = create_mask(layer_mask.block_mask.mask_mod, 2, 1, doc.shape[1], doc.shape[1], device="cpu")
        assert torch.equal(dense[:, 0] & real[:, :, None], rule)
        with pytest.raises(NotImplementedError, match="backward on CPU"):
            layer_mask.attend(*(t.clone().requires_grad_() for t in (q, k, v)), 0.0, 0.3)
        return
    got_in = [t.clone().requires_grad_() for t in (q, k, v)]
    got = layer_mask.attend(*got_in, 0.0, 0.3)
    got.backward(grad)
    assert (got - want).abs().amax(dim=(1, 3))[real].max() <= 1e-5
    for a, b in zip(got_in, want_in):
        assert (a.grad - b.grad).abs().max() <= 1e-5


def test_flex_block_masks_skip_the_blocks_outside_documents_and_windows():
    """At 128-token blocks, a row of 512 tokens holding documents of 200 and 312 tokens: each query block of the
    global layer visits only the key blocks its documents reach, those of the local one (half-window 64) its
    neighbours at most; the blocks wholly inside one document are told apart (no mask applied there)."""
    cfg = tiny_cfg(
        local_attention=128, max_position_embeddings=512, global_attention_kernel="flex", local_attention_kernel="flex"
    )
    doc, _ = Segments(torch.tensor([0, 200, 512]), 512).layout(1, 512)
    masks = attention_masks(cfg, 1, 512, torch.device("cpu"), None, doc, None)
    glob, loc = (masks[k].block_mask for k in ("full_attention", "sliding_attention"))
    # Blocks 0-1 hold document 0 (tokens 0-199), blocks 1-3 document 1: query block 1 reaches blocks 0-3.
    assert (glob.kv_num_blocks + glob.full_kv_num_blocks)[0, 0].tolist() == [2, 4, 3, 3]
    assert glob.full_kv_num_blocks[0, 0].tolist() == [1, 0, 2, 2]  # block 0 x 0 and blocks 2-3 x 2-3 are whole
    assert (loc.kv_num_blocks + loc.full_kv_num_blocks)[0, 0].tolist() == [2, 3, 3, 2]  # its neighbours at most


@pytest.mark.parametrize(
    ("global_kernel", "local_kernel"), [("jagged", "banded"), ("sdpa", "sdpa"), ("jagged", "sdpa"), ("flex", "flex")]
)
def test_the_model_gives_the_same_loss_and_gradients_with_every_kernel(global_kernel, local_kernel):
    """ModernBertForMaskedLM on a collated packed batch (documents, one padded row), training mode: each kernel
    pair's loss and every gradient within 1e-5 of the default's (FlexAttention: the loss, without gradients, on the
    CPU)."""
    import numpy as np

    from model.family import MODERNBERT
    from pipeline.pretrain.loader import collate

    g = np.random.default_rng(0)
    rows = {
        "input_ids": [g.integers(5, VOCAB, n) for n in (40, 26)],
        "masked_lm_positions": [np.array([1, 12, 33]), np.array([0, 20])],
        "masked_lm_ids": [g.integers(5, VOCAB, 3), g.integers(5, VOCAB, 2)],
        "token_type_ids": [np.zeros(40), np.zeros(26)],
        "next_sentence_label": np.array([-1, -1]),
        "doc_lengths": [np.array(LENGTHS[0]), np.array([26])],
    }
    batch = collate(rows, family=MODERNBERT)
    assert batch["cu_seqlens"].tolist() == [0, 9, 29, 40, 66] and "attention_mask" in batch
    inputs = {
        k: batch[k] for k in ("input_ids", "attention_mask", "cu_seqlens", "masked_lm_positions", "masked_lm_ids")
    }

    def run(**kernels):
        torch.manual_seed(0)
        m = randomise(ModernBertForMaskedLM(tiny_cfg(local_attention=2 * HALF, **kernels))).train()
        if "flex" in kernels.values():
            with torch.no_grad():
                return m(**inputs).loss, {}
        loss = m(**inputs).loss
        loss.backward()
        return loss, {n: p.grad for n, p in m.named_parameters() if p.grad is not None}

    want, want_grads = run()
    got, got_grads = run(global_attention_kernel=global_kernel, local_attention_kernel=local_kernel)
    assert abs(got.item() - want.item()) <= 1e-5
    assert got_grads.keys() == (want_grads.keys() if got_grads else set())
    for name, grad in got_grads.items():
        assert (grad - want_grads[name]).abs().max() <= 1e-5, name


def test_kernel_fields_are_checked_and_stay_out_of_config_json():
    with pytest.raises(ValueError, match="global_attention_kernel 'xformers' is not one of sdpa, flex, jagged"):
        tiny_cfg(global_attention_kernel="xformers")
    with pytest.raises(ValueError, match="local_attention_kernel 'jagged' is not one of banded, sdpa, flex"):
        tiny_cfg(local_attention_kernel="jagged")  # jagged SDPA takes no mask: no window
    with pytest.raises(ValueError, match="local_attention_kernel 'flex' has no attention dropout"):
        tiny_cfg(local_attention_kernel="flex", attention_dropout=0.1)
    with pytest.raises(ValueError, match="the jagged kernel takes no mask, so no window"):
        layer_mask("jagged", torch.zeros(1, 8, dtype=torch.long), 4, True)
    d = tiny_cfg(global_attention_kernel="jagged").to_hf_dict()
    assert "global_attention_kernel" not in d and "local_attention_kernel" not in d
    assert ModernBertConfig.from_hf_dict(d).global_attention_kernel == "sdpa"


def test_names_import_from_model_and_config_needs_no_torch():
    assert ModernBertModel.__module__ == "model.modernbert"
    code = (
        "import sys, model.config; model.config.ModernBertConfig.from_preset('modernbert-base'); "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_load_hf_names_the_family_it_found(tmp_path):
    save_hf(ModernBertModel(tiny_cfg()), tmp_path)
    with pytest.raises(ValueError, match="holds a modernbert model; BertModel is a bert class.*ModernBertModel"):
        load_hf(tmp_path)
    bare = load_hf(tmp_path, "ModernBertForMaskedLM")  # a bare encoder into the MLM class: only the head is new
    assert bare.load_report["missing"] == [
        "decoder.bias",
        "head.dense.bias",
        "head.dense.weight",
        "head.norm.bias",
        "head.norm.weight",
    ]
