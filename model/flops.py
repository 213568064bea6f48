"""Model FLOPs of a training step and the device's dense bf16 peak: MFU, one formula for the benchmark
(`bench/train/train_step.py`) and the training loop's `train/mfu` (bench/RESULTS.md, "GPU", keeps the hand count).

Counted as the references count (MLPerf, ModernBERT, MosaicBERT, ../shared/GPU.md): matmuls only, forward + both
backward GEMMs (3 x the forward's 2 FLOPs per multiply-add: 6 per matmul parameter and token), on the real
(non-pad) tokens only. Per real token and layer: the attention projections (Q, K, V, output: 4H^2) and the
feed-forward (BERT: 2HI; ModernBERT's gated one: 3HI), plus the attention scores and mix, 2 x H multiply-adds per
key the token attends to (`attended_pairs`): every token of its own sequence (12 x layers x seq x hidden per token),
or of its own document in a packed ModernBERT row, and on a local layer only those at most local_attention // 2
away (a window of 2 x 64 + 1 keys, fewer at a document's ends: window x tokens, not seq^2). Heads: BERT's pooler
and NSP per sequence; the MLM transform (H^2) and the tied decoder (H x V) only at the rows that get logits (the
valid masked positions in this project's heads). Embedding lookups, norms, activations, softmax and the optimizer
count nothing.

The peak is the datasheet's dense (no sparsity) bf16 tensor rate; MFU is always on that basis, whatever the run's
precision, so figures compare across runs (the H100 SXM's 989.4 TFLOP/s is the references' basis).
"""

from __future__ import annotations

from typing import Iterable

from model.config import BertConfig, ModernBertConfig

# Dense bf16 tensor-core peaks, FLOP/s, from the vendors' datasheets; matched against torch.cuda.get_device_name()
# in order (the first substring found wins: the PCIe and NVL H100s are slower parts than the SXM).
DENSE_BF16_PEAK = (
    ("H100 PCIe", 756.0e12),
    ("H100 NVL", 835.0e12),
    ("H100", 989.4e12),
    ("H200", 989.4e12),
    ("H800", 989.4e12),
    ("GH200", 989.4e12),
    ("A100", 312.0e12),
    ("A800", 312.0e12),
    ("L40S", 362.1e12),
    ("L4", 121.0e12),
    ("A10G", 70.0e12),
)


def dense_bf16_peak(device_name: str) -> float | None:
    """The datasheet's dense bf16 FLOP/s of a GPU named as torch names it, or None for a device not in the table.

    >>> dense_bf16_peak("NVIDIA H100 80GB HBM3"), dense_bf16_peak("NVIDIA H200"), dense_bf16_peak("NVIDIA L4")
    (989400000000000.0, 989400000000000.0, 121000000000000.0)
    >>> dense_bf16_peak("NVIDIA H100 PCIe"), dense_bf16_peak("Tesla T4")
    (756000000000000.0, None)
    """
    for name, peak in DENSE_BF16_PEAK:
        if name in device_name:
            return peak
    return None


def attended_pairs(span: int, half: int | None = None) -> int:
    """(query, key) pairs attention computes in a span of `span` tokens: every pair (span^2), or on a local layer
    those at most `half` apart: span x (2 half + 1) less the keys the window loses past the span's two ends.

    >>> attended_pairs(5), attended_pairs(5, 1), attended_pairs(3, 64), attended_pairs(1024, 64)
    (25, 13, 9, 127936)
    """
    if half is None:
        return span * span
    m = min(half, span - 1)
    return span * (2 * m + 1) - m * (m + 1)


def train_flops(
    cfg: BertConfig | ModernBertConfig, spans: Iterable[int], mlm_rows: int, sequences: int | None = None
) -> float:
    """Model FLOPs of one training step (forward + backward) over `spans`, the lengths in real tokens of what
    attention runs over (a sequence; a document of a packed ModernBERT row), with `mlm_rows` rows through the MLM
    head and, for BERT, `sequences` rows through the pooler and NSP head (default: one per span).

    >>> cfg = BertConfig.from_preset("tiny", vocab_size=100)   # H 128, I 512, 2 layers
    >>> train_flops(cfg, [4, 2], 3) == 6 * (2 * (6 * (4 * 128**2 + 2 * 128 * 512) + 2 * 128 * (16 + 4))
    ...                                     + 2 * (128**2 + 2 * 128) + 3 * (128**2 + 128 * 100))
    True
    """
    spans = [int(k) for k in spans]
    H, V, n = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers
    tokens = sum(spans)
    if isinstance(cfg, ModernBertConfig):
        inter, half = cfg.intermediate_size, cfg.local_attention // 2
        n_global = len(range(0, n, cfg.global_attn_every_n_layers))
        # A local layer's token attends to the keys at most half away inside its document: the pairs that are
        # computed are those, whatever a kernel computes and masks beside them (a model FLOP is a useful one).
        pairs = n_global * sum(attended_pairs(k) for k in spans) + (n - n_global) * sum(
            attended_pairs(k, half) for k in spans
        )
        macs = n * tokens * (4 * H * H + 3 * H * inter) + 2 * H * pairs
    else:
        inter = cfg.intermediate_size
        macs = n * (tokens * (4 * H * H + 2 * H * inter) + 2 * H * sum(attended_pairs(k) for k in spans))
        macs += (len(spans) if sequences is None else sequences) * (H * H + 2 * H)  # pooler + NSP
    macs += mlm_rows * (H * H + H * V)
    return 3 * 2 * macs


def mfu(flops: float, seconds: float, peak: float, devices: int = 1) -> float:
    """Model FLOPs utilisation: `flops` done by `devices` devices in `seconds`, over their peak.

    >>> round(mfu(989.4e12 * 0.5, 1.0, 989.4e12), 6), round(mfu(2e12, 2.0, 1e12, devices=2), 6)
    (0.5, 0.5)
    """
    return flops / max(seconds, 1e-12) / (peak * devices)
