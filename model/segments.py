"""Packed segments: the one record of where the sequences that attention keeps apart lie in a batch, which both
encoders consume (`cu_seqlens` in a batch, one meaning for every model), and the kernel that runs on it alone.

A segment is a run of real tokens that attends only within itself: a BERT row, or a document of a packed
ModernBERT row. `Segments.offsets` are cumulative segment lengths over the batch's real tokens, in row-major order
(padding is never a segment). BERT's unpadding is the one-segment-per-row case of ModernBERT's packing:

    rows [a b c . .] [d e f g h] (two pad slots) ->  BERT:       offsets [0, 3, 8]
    the second row holding documents "d e" + "f g h" ->  ModernBERT: offsets [0, 3, 5, 8]

Where the real tokens lie in the padded (B, L) batch is the caller's other input: the attention mask, or the
unpadded path's indices into the flattened B*L (`pipeline.pretrain.loader.collate` gives one or the other).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Segments:
    """Segments over a batch's real tokens: what the encoders take instead of (or with) a padding mask.

    >>> doc, pos = Segments(torch.tensor([0, 3, 5, 8]), 5).layout(2, 5, torch.tensor([[1, 1, 1, 0, 0], [1] * 5]))
    >>> doc.tolist(), pos.tolist()
    ([[0, 0, 0, -1, -1], [1, 1, 2, 2, 2]], [[0, 1, 2, 0, 0], [0, 1, 0, 1, 2]])
    """

    offsets: torch.Tensor
    """(S+1,) cumulative segment lengths from 0 over the real tokens (`cu_seqlens`), on the device; every segment
    holds at least one token and lies in one row."""
    max_len: int
    """An upper bound on a segment's length (the padded L unless a tighter one is known): given, so that nothing
    reads the offsets on the host."""

    @classmethod
    def rows(cls, B: int, L: int, attention_mask: torch.Tensor | None, device: torch.device) -> Segments:
        """One segment per row (unpacked rows: BERT's case): each row's real tokens, from the mask (1 = real) or
        all L of them; computed on the device, nothing read back."""
        if attention_mask is None:
            return cls(torch.arange(0, (B + 1) * L, L, device=device, dtype=torch.int32), L)
        lengths = attention_mask.to(device).sum(1, dtype=torch.int32)
        return cls(F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0)), L)

    def layout(self, B: int, L: int, attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Segment index (B, L) of every slot of a (B, L) batch (-1 at padding) and its position in its segment
        (0 at padding): where positions restart and which keys a query may see. The real tokens are the mask's
        1s (all B*L without one). The offsets are checked on the CPU only (on an accelerator the check would
        wait for the device every forward)."""
        cu = self.offsets.long()
        real = None if attention_mask is None else attention_mask.to(cu.device).reshape(-1).bool()  # (B*L,)
        T = B * L if real is None else None
        if cu.device.type == "cpu":
            T = B * L if real is None else int(real.sum())
            row = torch.arange(B * L) // L if real is None else (torch.arange(B * L) // L)[real]  # real token -> row
            if (
                cu[0] != 0
                or cu[-1] != T
                or bool((cu[1:] <= cu[:-1]).any())
                or bool((row[cu[:-1].clamp(max=T - 1)] != row[(cu[1:] - 1).clamp(min=0)]).any())
            ):
                raise ValueError(f"cu_seqlens {cu.tolist()} must rise from 0 to the {T} real tokens, a segment per row")
        # Each slot's rank among the real tokens (a cumulative sum, no nonzero: nothing read off the device).
        rank = torch.arange(B * L, device=cu.device) if real is None else real.long().cumsum(0) - 1  # (B*L,)
        doc = torch.searchsorted(cu[1:], rank, right=True)  # (B*L,)
        pos = rank - cu[doc.clamp(max=cu.numel() - 2)]
        if real is not None:
            doc, pos = doc.masked_fill(~real, -1), pos.masked_fill(~real, 0)
        return doc.view(B, L), pos.view(B, L)


def jagged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: Segments, dropout_p: float, scale: float
) -> torch.Tensor:
    """SDPA of packed (T, nh, hd) q, k, v, each segment attending within itself -> (T, nh, hd): jagged nested
    tensors (S, nh, j, hd), one row per segment, so that SDPA takes its varlen kernels and computes no score
    across segments or on padding. They take no mask: a local layer's window cannot be said here."""
    T, nh, hd = q.shape
    if not q.is_cuda:  # the math fallback (the CPU's only NJT kernel) wants contiguous values
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    # min/max seqlen given: kernel selection and the varlen kernels would otherwise read them off the device.
    q, k, v = (
        torch.nested.nested_tensor_from_jagged(
            t, offsets=segments.offsets, min_seqlen=1, max_seqlen=segments.max_len
        ).transpose(1, 2)
        for t in (q, k, v)
    )
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)  # (S, nh, j, hd)
    return out.transpose(1, 2).values()  # (T, nh, hd)
