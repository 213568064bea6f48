"""Contrastive fine-tuning to sentence embeddings (`--task embedding`): the training model, its batches, its loss
with in-batch negatives gathered across workers, and the export for sentence-transformers.

The loss is InfoNCE, sentence-transformers' MultipleNegativesRankingLoss: query i's positive is document i, and
every other document of the global batch (the other queries' positives and every hard negative) is a negative;
a score is the cosine of the two unit vectors divided by `embedding.temperature` (0.05: MNRL's scale 20). So the
number of negatives grows with the global batch, and with the cluster.

Across workers each rank embeds its share of the step, `gather` all-gathers the documents (rank-major) and each
rank scores its own queries against all of them. `gather`'s backward all-reduces the gradient of the gathered
documents and keeps its rank's rows: a rank's documents get the gradient of every rank's loss. DDP then averages
the ranks' gradients, which is the gradient of the global batch's mean loss: 2 workers x batch B train as 1 worker
x 2B, to fp32 rounding (tests/test_embedding.py). Every rank must hold the same number of pairs per micro-batch
(`loop.epoch_micro_batches` gives them that).

The trained model is the bare encoder (`BertModel`, `ModernBertModel`: the family's `embedding` class), saved as a
transformers directory that `export_sentence_transformers` makes a sentence-transformers model too: modules.json
(Transformer -> Pooling -> Normalize, the layout all-MiniLM-L6-v2 ships), 1_Pooling/config.json,
sentence_bert_config.json (the max_seq_length the job tokenized at) and config_sentence_transformers.json (cosine).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from model.pooling import Pooling, sentence_embedding
from pipeline.core.step import Sums
from pipeline.finetune.data import pad_batch


def pair_batch(rows: dict[str, list], idx: list[int] | np.ndarray) -> dict[str, np.ndarray]:
    """The queries of `idx` padded to their longest (`input_ids`, `attention_mask`) and their documents, positives
    then hard negatives, padded to theirs (`doc_input_ids`, `doc_attention_mask`); `num_tokens` counts both.

        >>> rows = {"input_ids": [[101, 7, 102], [101, 102]], "positive_ids": [[101, 8, 9, 102], [101, 5, 102]]}
        >>> b = pair_batch(rows, [1, 0])
        >>> b["input_ids"].tolist(), b["doc_input_ids"].tolist(), int(b["num_tokens"])
        ([[101, 102, 0], [101, 7, 102]], [[101, 5, 102, 0], [101, 8, 9, 102]], 12)
    """
    idx = list(idx)
    q = pad_batch({"input_ids": rows["input_ids"]}, idx)
    docs = [rows["positive_ids"][i] for i in idx] + [rows["negative_ids"][i] for i in idx if "negative_ids" in rows]
    d = pad_batch({"input_ids": docs}, range(len(docs)))
    return {
        "input_ids": q["input_ids"],
        "attention_mask": q["attention_mask"],
        "doc_input_ids": d["input_ids"],
        "doc_attention_mask": d["attention_mask"],
        "num_tokens": np.asarray(q["attention_mask"].sum() + d["attention_mask"].sum()),
    }


class _Gather(torch.autograd.Function):
    """All-gather equal-sized (n, H) tensors of every rank, rank-major; the backward sums the gathered gradient
    over the ranks (every rank's loss depends on every rank's rows) and keeps this rank's n rows."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(group.size())]
        group.allgather([parts], [x.contiguous()]).wait()
        ctx.group, ctx.rows = group, slice(group.rank() * x.shape[0], (group.rank() + 1) * x.shape[0])
        return torch.cat(parts)  # (world * n, H)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        ctx.group.allreduce([grad]).wait()
        return grad[ctx.rows], None


def gather(x: torch.Tensor, group=None) -> torch.Tensor:
    """`x` of every rank of `group` (default: the process group Ray Train made, if any), rank-major, with gradients
    to every rank's rows; `x` itself without a group or on one rank."""
    group = group if group is not None else _default_group()
    if group is None or group.size() == 1:
        return x
    return _Gather.apply(x, group)


def _default_group():
    import torch.distributed as dist

    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


@dataclass
class ContrastiveOutput:
    loss: torch.Tensor
    """Mean InfoNCE over this rank's queries."""
    logits: torch.Tensor
    """(B, world * k * B) scaled cosines of this rank's queries against the global batch's documents."""
    labels: torch.Tensor
    """(B,) the column of each query's positive."""


class ContrastiveModel(nn.Module):
    """A bare encoder trained with in-batch negatives: what the fine-tuning loop runs (and DDP wraps) for
    `--task embedding`; `encoder` is what is saved and registered.

    BERT's tanh pooler is not used by either pooling: it is frozen, so that DDP finds a gradient for every
    parameter it syncs, and is kept in the export (transformers' `BertModel` loads it without a warning)."""

    def __init__(self, encoder: nn.Module, pooling: Pooling = "mean", temperature: float = 0.05, group=None):
        super().__init__()
        self.encoder = encoder
        self.pooling, self.temperature, self.group = pooling, temperature, group
        pooler = getattr(encoder, "pooler", None)
        if pooler is not None:
            pooler.requires_grad_(False)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        doc_input_ids: torch.Tensor,
        doc_attention_mask: torch.Tensor,
    ) -> ContrastiveOutput:
        q = sentence_embedding(self.encoder, input_ids, attention_mask, self.pooling)  # (B, H)
        d = sentence_embedding(self.encoder, doc_input_ids, doc_attention_mask, self.pooling)  # (k*B, H)
        group = self.group if self.group is not None else _default_group()
        rank = group.rank() if group is not None else 0
        docs = gather(d, group)  # (world * k * B, H): rank 0's positives, its negatives, rank 1's, ...
        logits = q @ docs.T / self.temperature  # (B, world * k * B)
        labels = torch.arange(q.shape[0], device=q.device) + rank * d.shape[0]
        return ContrastiveOutput(F.cross_entropy(logits, labels), logits.detach(), labels)


@dataclass(frozen=True)
class PairSums(Sums):
    """The training figures of one or more contrastive forwards, float64 sums: `correct` counts the queries whose
    positive scores highest among the global batch's documents (the loop's `train/accuracy`).

    >>> PairSums.unpack(torch.tensor([1.0, 2.0, 1.0], dtype=torch.float64)).figures()
    {'loss': 0.5, 'accuracy': 0.5}
    """

    loss_sum: torch.Tensor
    queries: torch.Tensor
    correct: torch.Tensor

    @classmethod
    def of(cls, out: ContrastiveOutput, batch: dict[str, torch.Tensor]) -> PairSums:
        """One forward's sums, on the device."""
        n = torch.full((), float(out.labels.shape[0]), dtype=torch.float64, device=out.loss.device)
        correct = (out.logits.argmax(-1) == out.labels).sum().double()
        return cls(out.loss.detach().double() * n, n, correct)

    def figures(self) -> dict[str, float]:
        out = {"loss": (self.loss_sum / self.queries.clamp(min=1)).item()}
        if self.queries > 0:
            out["accuracy"] = (self.correct / self.queries).item()
        return out


def encoder_of(model: nn.Module) -> nn.Module:
    """What a fine-tuning model saves: a `ContrastiveModel`'s encoder, any other model itself."""
    return model.encoder if isinstance(model, ContrastiveModel) else model


def export_sentence_transformers(directory: str | Path, pooling: Pooling, max_seq_length: int) -> None:
    """Make a transformers directory holding a bare encoder (config.json, weights, tokenizer files) a
    sentence-transformers model too, in the layout sentence-transformers 2 and later read (all-MiniLM-L6-v2's):
    Transformer (this directory) -> Pooling -> Normalize, cosine similarity."""
    d = Path(directory)
    hidden = json.loads((d / "config.json").read_text())["hidden_size"]
    modules: list[dict[str, Any]] = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (d / "1_Pooling").mkdir(exist_ok=True)  # Normalize has no settings: no directory (MLflow keeps no empty one)
    files = {
        "modules.json": modules,
        "sentence_bert_config.json": {"max_seq_length": max_seq_length, "do_lower_case": False},
        "config_sentence_transformers.json": {
            "prompts": {},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
        "1_Pooling/config.json": {
            "word_embedding_dimension": hidden,
            "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
    }
    for name, obj in files.items():
        (d / name).write_text(json.dumps(obj, indent=2) + "\n")
