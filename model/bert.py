"""The BERT encoder in plain PyTorch: embeddings, self-attention (torch SDPA), post-LN layers, tanh pooler.

Module and parameter names follow transformers' `modeling_bert.py` (`embeddings.word_embeddings.weight`,
`encoder.layer.0.attention.self.query.weight`, ...) so its checkpoints load without renaming.
Departures from the reference, all for speed with identical fp32 numerics:
- Q, K and V are one GEMM: the three `nn.Linear` weights stay separate parameters (checkpoint names,
  DDP, optimizers see nothing unusual) and are concatenated in forward (3*H*H copy, tiny next to the GEMM).
- Attention is `F.scaled_dot_product_attention`; the padding mask is a boolean (B, 1, 1, L) mask, absent when
  a batch has no padding (no `attention_mask`, or on the CPU an all-ones one), which lets SDPA take its fastest
  kernel.
- Unpadded path (`unpad_indices`, `cu_seqlens`): the encoder runs on the (T, H) real tokens only and attention on
  jagged nested tensors (SDPA's varlen kernels), then scatters back to (B, L, H); numerics as the masked path.
  `cu_seqlens` is `model.segments.Segments`' offsets, one segment per row: the record ModernBERT's documents use.
- No attention-probability outputs, caches, cross-attention or decoder mode (BERT does not use them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.config import BertConfig
from model.segments import Segments, jagged_attention


def activation(name: str):
    """The activation function transformers' ACT2FN maps `name` to ("gelu" is the exact erf GELU)."""
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    if name in ("silu", "swish"):
        return F.silu
    raise ValueError(f"hidden_act {name!r} is not supported")


@dataclass
class BertModelOutput:
    last_hidden_state: torch.Tensor
    """(B, L, H) final-layer token representations."""
    pooler_output: torch.Tensor | None
    """(B, H) tanh(dense(h[:, 0])); None for models built without a pooler (token/QA heads)."""


class BertEmbeddings(nn.Module):
    """word + position + token-type embeddings, then LayerNorm and dropout."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=cfg.pad_token_id)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        L = input_ids.shape[1]
        if L > self.position_embeddings.num_embeddings:
            raise ValueError(
                f"sequence length {L} exceeds max_position_embeddings {self.position_embeddings.num_embeddings}"
            )
        # Shards store int32 ids and int8 segments; embedding lookups take int32/int64 only.
        if input_ids.dtype not in (torch.int32, torch.int64):
            input_ids = input_ids.long()
        x = self.word_embeddings(input_ids)  # (B, L, H)
        # Position rows broadcast over the batch: (L, H) -> no (B, L) index tensor needed.
        x = x + self.position_embeddings.weight[:L]
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]  # transformers' default: all segment 0
        else:
            if token_type_ids.dtype not in (torch.int32, torch.int64):
                token_type_ids = token_type_ids.long()
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention; fused QKV GEMM, SDPA kernel."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.head_dim
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout_p = cfg.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, mask: torch.Tensor | Segments | None) -> torch.Tensor:
        w = torch.cat([self.query.weight, self.key.weight, self.value.weight])  # (3H, H)
        b = torch.cat([self.query.bias, self.key.bias, self.value.bias])  # (3H,)
        dropout_p, scale = self.dropout_p if self.training else 0.0, 1.0 / math.sqrt(self.head_dim)
        if isinstance(mask, Segments):
            return self._jagged(F.linear(x, w, b), mask, dropout_p, scale)
        B, L, H = x.shape
        qkv = F.linear(x, w, b).view(B, L, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, nh, L, hd), strided views, no copy
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
        return out.transpose(1, 2).reshape(B, L, H)  # (B, L, nh*hd)

    def _jagged(self, qkv: torch.Tensor, segments: Segments, dropout_p: float, scale: float) -> torch.Tensor:
        """(T, 3H) packed QKV -> (T, H): `model.segments.jagged_attention`, one segment per sequence."""
        T = qkv.shape[0]
        qkv = qkv.view(T, 3, self.num_heads, self.head_dim)
        if qkv.is_cuda:  # flash / memory-efficient kernels read the strided (T, nh, hd) views as they are
            parts = qkv.unbind(1)
        else:  # the math fallback (the CPU's only NJT kernel) wants contiguous values: one copy for the three
            parts = qkv.transpose(0, 1).contiguous().unbind(0)
        return jagged_attention(*parts, segments, dropout_p, scale).reshape(T, self.num_heads * self.head_dim)


class BertSelfOutput(nn.Module):
    """Attention output projection, dropout, residual, post-LayerNorm."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | Segments | None) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))  # (B, L, I)


class BertOutput(nn.Module):
    """Feed-forward down projection, dropout, residual, post-LayerNorm."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertLayer(nn.Module):
    """Post-LN transformer layer: x = LN(x + attn(x)); x = LN(x + ffn(x))."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutput(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | Segments | None) -> torch.Tensor:
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | Segments | None) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x

    def compile_layers(self, mode: str | None = None) -> None:
        """`torch.compile` each layer in place, for one input shape (regional compilation, PyTorch's recipe for
        repeated blocks). The layers run the same code at the same shapes with their weights as graph inputs, so
        they share one compiled graph: compilation costs one layer's, not the whole stack's (bench/RESULTS.md,
        "Regional compilation"). Parameter names are unchanged (checkpoints, DDP, optimizers see nothing new)."""
        for layer in self.layer:
            layer.compile(dynamic=False, mode=mode)


class BertPooler(nn.Module):
    """tanh(dense(h[:, 0])): the [CLS] representation used by NSP and sequence classification."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(h[:, 0]))  # (B, H)


def padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, L) 1 = real / 0 = pad -> boolean (B, 1, 1, L) SDPA mask (True = attend), or None without padding.

    >>> padding_mask(torch.tensor([[1, 1, 0]])).tolist()
    [[[[True, True, False]]]]
    >>> padding_mask(torch.ones(2, 3)) is None
    True
    """
    if attention_mask is None:
        return None
    keep = attention_mask.bool()
    # A mask of all True changes nothing but forces SDPA's masked (slower) path; drop it. Checked on the CPU
    # only: on an accelerator the check would wait for the device every forward, so there the data pipeline
    # leaves the mask out of batches without padding (`pipeline.pretrain.loader.collate`).
    if keep.device.type == "cpu" and bool(keep.all()):
        return None
    # A row with no real token would softmax over nothing (NaN); like transformers' additive mask, let it
    # attend uniformly instead. Rows with any real token are unchanged.
    keep = keep | ~keep.any(dim=-1, keepdim=True)
    return keep[:, None, None, :]


def init_bert_weights(module: nn.Module, std: float) -> None:
    """BERT's initialisation: N(0, std) weights and embeddings, zero biases, LayerNorm 1/0, zero pad row."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class BertPreTrainedModel(nn.Module):
    """Shared base: holds the config and applies BERT's initialisation after construction."""

    config: BertConfig

    def init_weights(self) -> None:
        self.apply(lambda m: init_bert_weights(m, self.config.initializer_range))

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device


class BertModel(BertPreTrainedModel):
    """Embeddings -> encoder -> (optional) pooler.

    >>> m = BertModel(BertConfig.from_preset("tiny", vocab_size=50)).eval()
    >>> out = m(torch.tensor([[2, 7, 9, 0]]), attention_mask=torch.tensor([[1, 1, 1, 0]]))
    >>> tuple(out.last_hidden_state.shape), tuple(out.pooler_output.shape)
    ((1, 4, 128), (1, 128))
    """

    def __init__(self, cfg: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg) if add_pooling_layer else None
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        unpad_indices: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> BertModelOutput:
        """`unpad_indices` (T,) (the real tokens' indices into the flattened B*L) with `cu_seqlens` (B+1,) (each
        row's real tokens one segment, `model.segments.Segments`) instead of `attention_mask`: the encoder runs
        on the T real tokens only (`pipeline.pretrain.loader.collate` builds both); padded positions of
        `last_hidden_state` are then 0."""
        x = self.embeddings(input_ids, token_type_ids)  # (B, L, H)
        if unpad_indices is None:
            x = self.encoder(x, padding_mask(attention_mask))
        else:
            if cu_seqlens is None:
                raise ValueError("unpad_indices needs cu_seqlens (B+1,)")
            B, L, H = x.shape
            packed = self.encoder(x.reshape(B * L, H).index_select(0, unpad_indices), Segments(cu_seqlens, L))  # (T, H)
            x = packed.new_zeros(B * L, H).index_copy(0, unpad_indices, packed).view(B, L, H)
        pooled = self.pooler(x) if self.pooler is not None else None
        return BertModelOutput(last_hidden_state=x, pooler_output=pooled)
