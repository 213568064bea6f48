"""The pretraining figures: MLM/NSP outputs -> summed counts (`MlmSums`) -> named metrics.

The figures are kept as sums (`MlmSums`: the MLM loss sum, correct predictions and masked tokens, the same for NSP)
so that they are exact over accumulation micro-steps and ranks; the loss a micro-batch backpropagates is its share
of the global batch's (`step_loss`). The loop (`loop`) keeps them on the device and reads them on the host only on
the steps that log, evaluate or checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from pipeline import console
from pipeline.core.step import Sums


@dataclass(frozen=True)
class MlmSums(Sums):
    """The pretraining figures of one or more forwards, float64 sums (an MLM-only model has no NSP: its three NSP
    sums are 0).

    >>> f64 = lambda *v: MlmSums.unpack(torch.tensor(v, dtype=torch.float64))
    >>> f64(6.0, 1, 4, 0, 0, 0).figures()
    {'loss': 1.5, 'mlm_loss': 1.5, 'mlm_accuracy': 0.25}
    >>> f64(6.0, 1, 3, 1.4, 1, 2).figures()["nsp_accuracy"]
    0.5
    """

    mlm_loss_sum: torch.Tensor
    """The MLM loss summed over the masked tokens."""
    mlm_correct: torch.Tensor
    mlm_count: torch.Tensor
    """Masked tokens."""
    nsp_loss_sum: torch.Tensor
    """The NSP loss summed over the examples with a next-sentence label."""
    nsp_correct: torch.Tensor
    nsp_count: torch.Tensor
    """Examples with a next-sentence label."""

    @classmethod
    def of(cls, out, batch: dict[str, torch.Tensor]) -> MlmSums:
        """One forward's sums, on the device."""
        mc = out.mlm_count.double()
        mlm = (out.mlm_loss.detach().double() * mc, out.mlm_correct.double(), mc)
        if out.nsp_count is None:  # an MLM-only model (ModernBertForMaskedLM): no NSP figures, counted as none
            none = torch.zeros((), dtype=torch.float64, device=mc.device)
            return cls(*mlm, none, none, none)
        nc = out.nsp_count.double()
        return cls(*mlm, out.nsp_loss.detach().double() * nc, out.nsp_correct.double(), nc)

    def figures(self) -> dict[str, float]:
        """Loss (MLM + NSP), mlm_loss, mlm_accuracy and, when the batches had next-sentence labels (`data.nsp`),
        nsp_loss and nsp_accuracy: MLM-only data has none, and a 0 would read as a model that fails NSP."""
        mlm_loss = (self.mlm_loss_sum / self.mlm_count.clamp(min=1)).item()
        out = {
            "loss": mlm_loss,
            "mlm_loss": mlm_loss,
            "mlm_accuracy": (self.mlm_correct / self.mlm_count.clamp(min=1)).item(),
        }
        if self.nsp_count > 0:
            nsp_loss = (self.nsp_loss_sum / self.nsp_count).item()
            out.update(
                {
                    "loss": mlm_loss + nsp_loss,
                    "nsp_loss": nsp_loss,
                    "nsp_accuracy": (self.nsp_correct / self.nsp_count).item(),
                }
            )
        return out

    def eval_metrics(self) -> dict[str, float]:
        """`eval/...` figures of summed held-out sums."""
        return {**{f"eval/{k}": v for k, v in self.figures().items()}, "eval/masked_tokens": self.mlm_count.item()}


def step_loss(out, masked_tokens: int, nsp_examples: int, world: int) -> torch.Tensor:
    """What one micro-batch backpropagates: its share of the global batch's loss, the MLM loss summed over its
    masked tokens over the global batch's `masked_tokens`, plus the NSP loss likewise over `nsp_examples`, times
    `world` because DDP averages the ranks' gradients. Summed over a rank's micro-batches and averaged over the
    ranks it is the gradient of the global batch's mean loss, however the batch was split (a mean of per-micro-
    batch means would weigh a token by the size of the micro-batch it fell in).

    >>> from types import SimpleNamespace as NS
    >>> t = torch.tensor
    >>> step_loss(NS(mlm_loss=t(2.0), mlm_count=t(3), nsp_loss=t(0.5), nsp_count=t(1)), 6, 2, 2).item()
    2.5
    """
    loss = out.mlm_loss * out.mlm_count / max(masked_tokens, 1)
    if out.nsp_count is not None:  # also without any NSP label (MLM-only data): the zero term keeps the pooler and
        # the NSP head in the graph, and DDP fails a step in which a parameter got no gradient
        loss = loss + out.nsp_loss * out.nsp_count / max(nsp_examples, 1)
    return loss * world


def flop_counter(model_cfg) -> Callable[[dict[str, torch.Tensor]], float]:
    """A host batch (`pipeline.pretrain.loader.collate`'s: `spans`, `masked_lm_positions`) -> its model FLOPs for
    `model_cfg` (`model.flops.train_flops`), read from host tensors only: nothing waits for the device.

    >>> from model.config import BertConfig
    >>> from model.flops import train_flops
    >>> cfg = BertConfig.from_preset("tiny", vocab_size=100)
    >>> b = {"input_ids": torch.zeros(2, 4), "spans": torch.tensor([4, 2]), "masked_lm_positions": torch.tensor([[1, 2], [0, -1]])}
    >>> flop_counter(cfg)(b) == train_flops(cfg, [4, 2], 3)
    True
    """  # noqa: E501
    from model.flops import train_flops

    def count(batch: dict[str, torch.Tensor]) -> float:
        rows = int((batch["masked_lm_positions"] >= 0).sum())
        return train_flops(model_cfg, batch["spans"].tolist(), rows, sequences=len(batch["input_ids"]))

    return count


def device_peak(device: torch.device, say: Callable[[str], None] | None = console.say) -> float | None:
    """The dense bf16 peak FLOP/s of a CUDA `device` (`model.flops.dense_bf16_peak`) for `train/mfu`; None on a
    CPU, and None with one line through `say` for a GPU the table does not know.

    >>> device_peak(torch.device("cpu")) is None
    True
    """
    if device.type != "cuda":
        return None
    from model.flops import dense_bf16_peak

    name = torch.cuda.get_device_name(device)
    peak = dense_bf16_peak(name)
    if peak is None and say is not None:
        say(f"[train] no train/mfu: the dense bf16 peak of {name!r} is not in model.flops.DENSE_BF16_PEAK")
    return peak
