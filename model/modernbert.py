"""ModernBERT in plain PyTorch: embeddings + norm, pre-norm layers (fused QKV, RoPE, global/local attention,
GeGLU), final norm, and the MLM and fine-tuning heads.

Module and parameter names follow transformers' `modeling_modernbert.py` (`model.layers.1.attn.Wqkv.weight`,
`head.dense.weight`, `decoder.bias`, ...) so its checkpoints load without renaming; fp32 outputs match it to
1e-5 (tests/test_modernbert.py). Departures from the reference:
- The MLM decoder has no weight of its own: it is `F.linear(h, tok_embeddings.weight, decoder.bias)`, tied
  structurally as in `model.heads` (transformers writes no `decoder.weight` either).
- `ModernBertForMaskedLM` takes `masked_lm_positions`/`masked_lm_ids` like `BertForPreTraining` and runs the head
  and decoder on the masked slots only (`model.heads.masked_lm`); without positions it returns logits at every
  position, as transformers does.
- Packed rows: `cu_seqlens` (D+1,) gives the documents as segments of the batch's real tokens
  (`model.segments.Segments`, the record BERT's unpadded rows use too); `attention_mask` says where the real tokens
  lie when a row has padding. Positions restart at each document and attention never crosses a boundary, so a
  packed row gives each document's outputs as if it ran alone; a local layer's window stays inside its document.

How attention is done: each layer kind builds its mask once per forward, by its kernel (`ModernBertConfig`'s
`global_attention_kernel` and `local_attention_kernel`), and every layer of the kind attends through it
(`LayerMask.attend`):
- "sdpa": `F.scaled_dot_product_attention` on dense (B, nh, L, hd) rows under a boolean (B, 1, L, L) mask of
  document (and window); global layers take none at all without padding or documents.
- "banded" (local layers; the default): once a row holds 4 windows' halves, in chunks (`Banded`): each chunk of
  local_attention // 2 queries against its own and its two neighbouring chunks' keys, under a (chunk, 3 chunks)
  mask of window and document, so a row of 1,024 computes 3/16 of the full scores.
- "flex": FlexAttention under a block mask (document, and window) built once per batch, so that blocks with nothing
  to attend are skipped; compiled on a GPU. torch 2.13 runs it on the CPU eagerly, forward only (no backward).
- "jagged" (global layers): SDPA on jagged nested tensors, one per document, over the real tokens (the varlen
  kernels, no mask: no window can be said there).
The defaults ("sdpa" global, "banded" local) are the CPU's choice; tests/test_modernbert.py holds every kernel to
the reference attention, and bench/results/train.md ("Modern encoder (issue 33): the model") and the GPU lease
(`python bench/train/modernbert_step.py --attention`) measure them. Without padding and without `cu_seqlens` the
global layers take no mask and nothing is computed on pad tokens (there are none); with padding, pad positions are
computed on dense rows but never attended to.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from model.bert import BertModelOutput, activation, padding_mask
from model.config import ModernBertConfig
from model.segments import Segments, jagged_attention
from model.heads import (
    PreTrainingOutput,
    QuestionAnsweringOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
    masked_lm,
    sequence_classification_loss,
    span_loss,
    token_classification_loss,
)

__all__ = [
    "ModernBertConfig",
    "ModernBertModel",
    "ModernBertForMaskedLM",
    "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification",
    "ModernBertForQuestionAnswering",
]


class ModernBertEmbeddings(nn.Module):
    """Token embeddings, then LayerNorm and dropout (no positions: RoPE adds them in attention)."""

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)
        self.drop = nn.Dropout(cfg.embedding_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.dtype not in (torch.int32, torch.int64):  # shards store int32; lookups take int32/int64
            input_ids = input_ids.long()
        return self.drop(self.norm(self.tok_embeddings(input_ids)))  # (B, L, H)


def rotary(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (..., 1, 1, head_dim) of RoPE at `positions` (...,) (L,) or (B, L), fp32, halves repeated as
    transformers lays them out (rotate_half pairs dimension i with i + head_dim/2)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float) / head_dim))
    freqs = positions[..., None].float() * inv_freq  # (..., hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)[..., None, None, :]  # (..., 1, 1, hd): over (q|k, heads)
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin in fp32 (as transformers), back in x's dtype."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


class ModernBertAttention(nn.Module):
    """Fused QKV, RoPE on q and k, attention by the layer kind's mask (its kernel), output projection."""

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.Wqkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=cfg.attention_bias)
        self.Wo = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.attention_bias)
        self.dropout_p = cfg.attention_dropout
        self.out_drop = nn.Dropout(cfg.attention_dropout) if cfg.attention_dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: LayerMask) -> torch.Tensor:
        B, L, H = x.shape
        qkv = self.Wqkv(x).view(B, L, 3, self.num_heads, self.head_dim)
        qk = apply_rotary(qkv[:, :, :2], *rope)  # q and k rotated in one pass: (B, L, 2, nh, hd)
        q, k = qk.transpose(1, 3).unbind(2)  # each (B, nh, L, hd)
        v = qkv[:, :, 2].transpose(1, 2)  # (B, nh, L, hd)
        dropout_p, scale = self.dropout_p if self.training else 0.0, self.head_dim**-0.5
        out = mask.attend(q, k, v, dropout_p, scale)  # (B, nh, L, hd)
        return self.out_drop(self.Wo(out.transpose(1, 2).reshape(B, L, H)))


class ModernBertMLP(nn.Module):
    """GeGLU: Wi makes value and gate in one GEMM, act(value) * gate, Wo back to hidden."""

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.Wi = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.act = activation(cfg.hidden_activation)
        self.drop = nn.Dropout(cfg.mlp_dropout)
        self.Wo = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.Wi(x).chunk(2, dim=-1)  # (B, L, I) each
        return self.Wo(self.drop(self.act(value) * gate))


class ModernBertEncoderLayer(nn.Module):
    """Pre-norm: x += attn(norm(x)); x += mlp(norm(x)). Layer 0 has no attention norm (the embeddings end in
    one), as in transformers; `attention_type` picks the RoPE θ and the mask."""

    def __init__(self, cfg: ModernBertConfig, layer_idx: int):
        super().__init__()
        self.attention_type = cfg.layer_types[layer_idx]
        self.attn_norm = (
            nn.Identity() if layer_idx == 0 else nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)
        )
        self.attn = ModernBertAttention(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)
        self.mlp = ModernBertMLP(cfg)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: LayerMask) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, mask)
        return x + self.mlp(self.mlp_norm(x))


@dataclass(frozen=True)
class DenseMask:
    """SDPA under a boolean mask (True = attend) broadcast to (B, nh, L, L), or no mask at all (None)."""

    mask: torch.Tensor | None
    """(B or 1, 1, L, L) / (B, 1, 1, L) boolean, or None."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, scale: float) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, dropout_p=dropout_p, scale=scale)


@dataclass(frozen=True)
class Banded:
    """A local layer's attention in chunks: the queries in chunks of `size` (= local_attention // 2), each chunk
    against the keys of itself and its two neighbours (3 * size), which hold every key in its queries' windows.
    On a row of L tokens that is L * 3 * size scores instead of L * L (a third at 1,024 tokens and window 128)."""

    mask: torch.Tensor
    """(B * C, 1, size, 3 * size) boolean, C = ceil(L / size) chunks: True = attend."""
    size: int

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, scale: float) -> torch.Tensor:
        return banded_attention(q, k, v, self, dropout_p, scale)


@dataclass(frozen=True)
class FlexMask:
    """FlexAttention under a block mask: blocks of 128 x 128 (query, key) pairs with no pair to attend are skipped,
    not computed and masked; compiled on a GPU (eager FlexAttention materialises every score), eager on the CPU,
    where torch (2.13) runs its forward only. It has no dropout (`ModernBertConfig` refuses one with it)."""

    block_mask: Any
    """`torch.nn.attention.flex_attention.BlockMask` of (B, 1, L, L), built once per batch (`flex_block_mask`)."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, scale: float) -> torch.Tensor:
        return flex_kernel(q.is_cuda)(q, k, v, block_mask=self.block_mask, scale=scale)


@dataclass(frozen=True)
class JaggedRows:
    """SDPA on jagged nested tensors, one per segment (`model.segments.jagged_attention`): the varlen kernels,
    no mask, no score across segments or on padding. Global layers only: it cannot say a window."""

    segments: Segments
    index: torch.Tensor | None
    """(T,) the real tokens' indices into the flattened B*L; None when every slot is real."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, scale: float) -> torch.Tensor:
        B, nh, L, hd = q.shape
        q, k, v = (t.transpose(1, 2).reshape(B * L, nh, hd) for t in (q, k, v))  # (B*L, nh, hd): views, no copy
        if self.index is not None:
            q, k, v = (t.index_select(0, self.index) for t in (q, k, v))  # (T, nh, hd)
        out = jagged_attention(q, k, v, self.segments, dropout_p, scale)  # (T, nh, hd)
        if self.index is not None:  # padding's outputs are 0
            out = out.new_zeros(B * L, nh, hd).index_copy(0, self.index, out)
        return out.view(B, L, nh, hd).transpose(1, 2)  # (B, nh, L, hd)


LayerMask = DenseMask | Banded | FlexMask | JaggedRows
"""How one layer kind attends for a batch: built once per forward, shared by every layer of the kind."""
Masks = dict[str, LayerMask]  # layer kind ("full_attention", "sliding_attention") -> its mask


def banded_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, band: Banded, dropout_p: float, scale: float
) -> torch.Tensor:
    """SDPA of (B, nh, L, hd) q, k, v chunk by chunk under `band` -> (B, nh, L, hd)."""
    B, nh, L, hd = q.shape
    c = band.size
    C = -(-L // c)
    tail = C * c - L  # the last chunk padded up to c queries
    # Keys/values padded by a chunk on each side, as C + 2 chunks; chunk i's keys are chunks i, i+1, i+2 of that.
    # Three slices and a cat, not unfold: unfold's backward was a third of the step's attention time on the CPU.
    kb, vb = (F.pad(t, (0, 0, c, c + tail)).view(B, nh, C + 2, c, hd) for t in (k, v))
    kb, vb = (
        torch.cat((t[:, :, :-2], t[:, :, 1:-1], t[:, :, 2:]), dim=3)  # (B, nh, C, 3c, hd)
        .transpose(1, 2)
        .reshape(B * C, nh, 3 * c, hd)
        for t in (kb, vb)
    )
    qb = F.pad(q, (0, 0, 0, tail)).view(B, nh, C, c, hd).transpose(1, 2).reshape(B * C, nh, c, hd)
    out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=band.mask, dropout_p=dropout_p, scale=scale)
    return out.view(B, C, nh, c, hd).transpose(1, 2).reshape(B, nh, C * c, hd)[:, :, :L]


def banded_mask(doc: torch.Tensor, half: int, documents: bool) -> Banded:
    """The Banded mask of rows whose tokens carry document ids `doc` (B, L) (-1 = padding): keys that are real,
    within `half` of the query and, when `documents`, of the query's document."""
    B, L = doc.shape
    c = half
    C = -(-L // c)
    tail = C * c - L
    dk = F.pad(doc, (c, c + tail), value=-1).unfold(1, 3 * c, c)[:, :, None, :]  # (B, C, 1, 3c): the keys' docs
    r, t = torch.arange(c, device=doc.device), torch.arange(3 * c, device=doc.device)
    near = (r[:, None] + c - t[None, :]).abs() <= half  # (c, 3c): query c*i + r vs key c*(i-1) + t
    keep = near & (dk >= 0)  # (B, C, c, 3c)
    if documents:
        keep = keep & (F.pad(doc, (0, tail), value=-1).view(B, C, c, 1) == dk)
    return Banded(keep.reshape(B * C, 1, c, 3 * c), c)


def flex_block_mask(ids: torch.Tensor, half: int | None, documents: bool) -> Any:
    """The block mask of rows whose tokens carry document ids `ids` (B, L) (-1 = padding): a query attends to real
    keys, of its own document when `documents`, and at most `half` away when `half` is given (a local layer).
    `create_block_mask` evaluates the rule on every (query, key) pair once, on the ids' device: the build cost the
    lease measures (bench/train/modernbert_step.py --attention), paid once per batch and layer kind."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q, k):
        keep = ids[b, k] >= 0
        if documents:
            keep = keep & (ids[b, q] == ids[b, k])
        if half is not None:
            keep = keep & ((q - k).abs() <= half)
        return keep

    B, L = ids.shape
    return create_block_mask(mask_mod, B, None, L, L, device=ids.device)


@functools.cache
def flex_kernel(compiled: bool) -> Callable[..., torch.Tensor]:
    """FlexAttention, compiled (one fused kernel per shape: what makes it fast on a GPU) or eager."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False) if compiled else flex_attention


def attention_masks(
    cfg: ModernBertConfig,
    B: int,
    L: int,
    device: torch.device,
    attention_mask: torch.Tensor | None,
    doc: torch.Tensor | None,
    segments: Segments | None = None,
) -> Masks:
    """Each layer kind's mask for a (B, L) batch, by the config's kernel for it (`global_attention_kernel`,
    `local_attention_kernel`; `layer_mask`): real keys of the same document (`doc` (B, L), -1 = padding, from
    `segments`), and on local layers only those at most local_attention // 2 away. Without documents a pad query
    attends to real keys on dense rows, as in transformers (FlexAttention's and the jagged kernel's pad queries
    attend to none); a query with nothing to attend gets zeros (SDPA since torch 2.5, FlexAttention), not NaN."""
    if doc is None:
        ids = torch.zeros(B, L, dtype=torch.long, device=device)
        ids = ids if attention_mask is None else ids.masked_fill(~attention_mask.bool(), -1)
    else:
        ids = doc if attention_mask is None else doc.masked_fill(~attention_mask.bool(), -1)
    documents = doc is not None
    return {
        "full_attention": layer_mask(cfg.global_attention_kernel, ids, None, documents, attention_mask, segments),
        "sliding_attention": layer_mask(
            cfg.local_attention_kernel, ids, cfg.local_attention // 2, documents, attention_mask, segments
        ),
    }


def layer_mask(
    kernel: str,
    ids: torch.Tensor,
    half: int | None,
    documents: bool,
    attention_mask: torch.Tensor | None = None,
    segments: Segments | None = None,
) -> LayerMask:
    """One layer kind's mask for rows whose tokens carry document ids `ids` (B, L) (-1 = padding): a global layer's
    (`half` None) or a local one's (keys at most `half` away), by `kernel`. "sdpa" gives a boolean (B, 1, L, L)
    mask, or none for a global layer without documents or padding (the mask's (B, 1, 1, L) with padding);
    "banded" a Banded one once rows reach 4 halves (below that the whole row costs little more: then as "sdpa");
    "flex" a block mask; "jagged" the segments (one a row without documents) and, with padding, the real tokens'
    indices, found with one `nonzero` (a read of the device: packed pretraining rows are full and have none).
    What `bench/train/modernbert_step.py --attention` times as the build, paid once per batch and layer kind."""
    B, L = ids.shape
    if kernel == "flex":
        return FlexMask(flex_block_mask(ids, half, documents))
    if kernel == "jagged":
        if half is not None:
            raise ValueError("the jagged kernel takes no mask, so no window: local layers take banded, sdpa or flex")
        index = None if attention_mask is None else attention_mask.to(ids.device).reshape(-1).nonzero().squeeze(1)
        segs = segments if segments is not None else Segments.rows(B, L, attention_mask, ids.device)
        return JaggedRows(segs, index)
    if kernel == "banded" and L >= 4 * half:
        return banded_mask(ids, half, documents=documents)
    same = ((ids[:, :, None] == ids[:, None, :]) & (ids[:, None, :] >= 0))[:, None] if documents else None  # (B,1,L,L)
    if half is None:
        return DenseMask(padding_mask(attention_mask) if same is None else same)
    i = torch.arange(L, device=ids.device)
    band = ((i[:, None] - i[None, :]).abs() <= half)[None, None]  # (1, 1, L, L)
    if same is not None:
        return DenseMask(same & band)
    return DenseMask(band if attention_mask is None else band & (ids >= 0)[:, None, None, :])


def init_modernbert_weights(model: nn.Module, cfg: ModernBertConfig) -> None:
    """transformers' ModernBERT initialisation: truncated normals (cut at +-cutoff*std), std for inputs and
    embeddings, std / sqrt(2 * layers) for output projections, hidden**-0.5 for classifiers; zero biases, unit
    norms, zero pad row."""
    std, cut = cfg.initializer_range, cfg.initializer_cutoff_factor
    out_std = std / math.sqrt(2.0 * cfg.num_hidden_layers)

    def normal(module: nn.Module, s: float) -> None:
        nn.init.trunc_normal_(module.weight, mean=0.0, std=s, a=-cut * s, b=cut * s)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)

    for m in model.modules():
        if isinstance(m, ModernBertEmbeddings):
            normal(m.tok_embeddings, std)
            with torch.no_grad():
                m.tok_embeddings.weight[cfg.pad_token_id].zero_()
        elif isinstance(m, (ModernBertAttention, ModernBertMLP)):
            normal(m.Wqkv if isinstance(m, ModernBertAttention) else m.Wi, std)
            normal(m.Wo, out_std)
        elif isinstance(m, ModernBertPredictionHead):
            normal(m.dense, out_std)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, TiedDecoder) and m.bias is not None:
            nn.init.zeros_(m.bias)
    classifier = getattr(model, "classifier", None)
    if classifier is not None:
        normal(classifier, cfg.hidden_size**-0.5)


class ModernBertPreTrainedModel(nn.Module):
    """Shared base: the config, the initialisation, and the names `model.hf` maps checkpoints with."""

    config: ModernBertConfig
    config_class = ModernBertConfig
    base_model_prefix = "model"

    def init_weights(self) -> None:
        init_modernbert_weights(self, self.config)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device


class ModernBertModel(ModernBertPreTrainedModel):
    """Embeddings -> pre-norm layers -> final norm.

    >>> m = ModernBertModel(ModernBertConfig.from_preset("modernbert-tiny", vocab_size=50)).eval()
    >>> tuple(m(torch.tensor([[2, 7, 9, 0]]), attention_mask=torch.tensor([[1, 1, 1, 0]])).last_hidden_state.shape)
    (1, 4, 128)
    """

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = ModernBertEmbeddings(cfg)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> BertModelOutput:
        """`attention_mask` (B, L): 1 = real, 0 = pad. `cu_seqlens` (D+1,): packed rows' documents as segments of
        the real tokens (`model.segments.Segments`); positions then restart at every document."""
        B, L = input_ids.shape
        if L > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {L} exceeds max_position_embeddings {self.config.max_position_embeddings}"
            )
        doc = segments = None
        if cu_seqlens is None:
            positions = torch.arange(L, device=input_ids.device)  # (L,): one RoPE table for every row
        else:
            segments = Segments(cu_seqlens.to(input_ids.device), L)
            doc, positions = segments.layout(B, L, attention_mask)  # (B, L) each
        masks = attention_masks(self.config, B, L, input_ids.device, attention_mask, doc, segments)
        hd = self.config.head_dim
        ropes = {
            "full_attention": rotary(positions, hd, self.config.global_rope_theta),
            "sliding_attention": rotary(positions, hd, self.config.local_rope_theta),
        }
        x = self.embeddings(input_ids)  # (B, L, H)
        for layer in self.layers:
            x = layer(x, ropes[layer.attention_type], masks[layer.attention_type])
        return BertModelOutput(last_hidden_state=self.final_norm(x), pooler_output=None)


class ModernBertPredictionHead(nn.Module):
    """dense -> activation -> LayerNorm: before the MLM decoder and the classifiers."""

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.classifier_bias)
        self.act = activation(cfg.classifier_activation)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.norm_bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(h)))


class TiedDecoder(nn.Module):
    """The vocabulary decoder's bias alone (`decoder.bias`); its weight is the token embeddings, passed in."""

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if cfg.decoder_bias else None

    def forward(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(h, weight, self.bias)  # (..., V)


class ModernBertForMaskedLM(ModernBertPreTrainedModel):
    """ModernBERT with the MLM head (tied decoder); no NSP.

    >>> m = ModernBertForMaskedLM(ModernBertConfig.from_preset("modernbert-tiny", vocab_size=50)).eval()
    >>> out = m(torch.tensor([[2, 7, 4, 9]]), masked_lm_positions=torch.tensor([[2, -1]]),
    ...         masked_lm_ids=torch.tensor([[8, -1]]))
    >>> tuple(out.mlm_logits.shape), int(out.mlm_count), tuple(m(torch.tensor([[2, 7]])).mlm_logits.shape)
    ((1, 50), 1, (1, 2, 50))
    """

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.config = cfg
        self.model = ModernBertModel(cfg)
        self.head = ModernBertPredictionHead(cfg)
        self.decoder = TiedDecoder(cfg)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        masked_lm_positions: torch.Tensor | None = None,
        masked_lm_ids: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> PreTrainingOutput:
        """As `BertForPreTraining` without NSP: `.mlm_logits` at the masked slots when `masked_lm_positions`
        (B, P, -1 = padding) is given, else (B, L, V) at every position; `.loss` is the MLM loss."""
        h = self.model(input_ids, attention_mask, cu_seqlens).last_hidden_state  # (B, L, H)
        weight = self.model.embeddings.tok_embeddings.weight  # (V, H), tied
        return masked_lm(h, lambda x: self.decoder(self.head(x), weight), masked_lm_positions, masked_lm_ids)


class ModernBertWithClassifier(ModernBertPreTrainedModel):
    """Shared body of the fine-tuning heads: encoder, then prediction head -> dropout -> `classifier`."""

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.config = cfg
        self.num_labels = cfg.num_labels
        self.model = ModernBertModel(cfg)
        self.head = ModernBertPredictionHead(cfg)
        self.drop = nn.Dropout(cfg.classifier_dropout)
        self.classifier = nn.Linear(cfg.hidden_size, cfg.num_labels)
        self.init_weights()

    def classify(self, h: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.drop(self.head(h)))  # (..., num_labels)


class ModernBertForSequenceClassification(ModernBertWithClassifier):
    """First-token ("cls") or mean pooling -> head -> dropout -> linear; losses as `BertForSequenceClassification`."""

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None
    ) -> SequenceClassifierOutput:
        h = self.model(input_ids, attention_mask).last_hidden_state  # (B, L, H)
        if self.config.classifier_pooling == "cls":
            pooled = h[:, 0]
        else:
            keep = torch.ones(h.shape[:2], device=h.device) if attention_mask is None else attention_mask.to(h.dtype)
            pooled = (h * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)  # (B, H)
        logits = self.classify(pooled)  # (B, num_labels)
        loss = None if labels is None else sequence_classification_loss(logits, labels, self.config.problem_type)
        return SequenceClassifierOutput(loss=loss, logits=logits)


class ModernBertForTokenClassification(ModernBertWithClassifier):
    """Per-token head -> dropout -> linear; labels (B, L) with -100 ignored."""

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None
    ) -> TokenClassifierOutput:
        logits = self.classify(self.model(input_ids, attention_mask).last_hidden_state)  # (B, L, num_labels)
        loss = None if labels is None else token_classification_loss(logits, labels)
        return TokenClassifierOutput(loss=loss, logits=logits)


class ModernBertForQuestionAnswering(ModernBertWithClassifier):
    """Extractive QA: per-token head -> dropout -> linear to start/end logits; loss as transformers."""

    def __init__(self, cfg: ModernBertConfig):
        if cfg.num_labels != 2:
            raise ValueError(f"num_labels must be 2 (start, end) for question answering, got {cfg.num_labels}")
        super().__init__(cfg)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
    ) -> QuestionAnsweringOutput:
        logits = self.classify(self.model(input_ids, attention_mask).last_hidden_state)  # (B, L, 2)
        start_logits, end_logits = logits[..., 0].contiguous(), logits[..., 1].contiguous()  # (B, L) each
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = span_loss(start_logits, end_logits, start_positions, end_positions)
        return QuestionAnsweringOutput(loss=loss, start_logits=start_logits, end_logits=end_logits)
