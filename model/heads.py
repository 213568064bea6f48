"""Task heads on top of BertModel: pretraining (MLM + NSP), sequence/token classification, question answering.

Names and losses follow transformers' `modeling_bert.py` so checkpoints and results carry over. Departures:
- `BertForPreTraining` takes `masked_lm_positions`/`masked_lm_ids` (B, P), padded with -1, as Google's
  original does, and gathers the P hidden states BEFORE the MLM transform and the vocabulary decoder. The
  reference computes (B, L, V) logits and throws away all but ~15% of them; with L=128, P=20 this removes
  ~84% of the head's FLOPs and its (B, L, V) activation memory. Every (b, p) slot gets a row, the -1 ones too
  (ignored by the loss): a forward never reads a value off the device to size a tensor.
- The MLM decoder has no weight of its own: it is `F.linear(h, word_embeddings.weight, cls.predictions.bias)`.
  Tying is structural, so it survives `load_state_dict`, optimizer steps, DDP, and `safetensors.save_file`
  (there is no shared tensor to deduplicate). transformers' `cls.predictions.decoder.*` keys are handled in
  `model/hf.py`.
- NSP label -1 means "no NSP for this example" (MLM-only packing) and is ignored; losses are means over the
  valid entries, with counts returned so a training loop can aggregate exactly over micro-batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.bert import BertModel, BertPreTrainedModel, activation
from model.config import BertConfig


@dataclass
class PreTrainingOutput:
    loss: torch.Tensor | None
    """mlm_loss + nsp_loss (nsp_loss is 0 when no example has an NSP label); None without labels."""
    mlm_loss: torch.Tensor | None
    """Mean cross-entropy over valid masked positions (0 when there are none)."""
    nsp_loss: torch.Tensor | None
    """Mean cross-entropy over examples with next_sentence_label >= 0 (0 when there are none); None without
    next_sentence_label."""
    slot_logits: torch.Tensor
    """(B*P, V), a row per masked-position slot (b, p) in row-major order when masked_lm_positions is given, the
    padding slots included (theirs are position 0's logits); else (B, L, V) at every position (fill-mask inference)."""
    nsp_logits: torch.Tensor | None
    """(B, 2): index 0 = B follows A, 1 = B is random; None for MLM-only models (ModernBertForMaskedLM)."""
    mlm_accuracy: torch.Tensor | None = None
    mlm_correct: torch.Tensor | None = None
    mlm_count: torch.Tensor | None = None
    nsp_accuracy: torch.Tensor | None = None
    nsp_correct: torch.Tensor | None = None
    nsp_count: torch.Tensor | None = None
    slot_valid: torch.Tensor | None = None
    """(B*P,) True at the slots of valid masked positions; None for the every-position logits."""

    @property
    def mlm_logits(self) -> torch.Tensor:
        """(N, V) at the N valid masked positions in row-major (b, p) order when masked_lm_positions is given;
        else (B, L, V) at every position. Selecting the valid rows reads their count off the device (a host sync
        on a GPU): training reads the sums (`mlm_correct`, `mlm_count`) instead, which never do."""
        return self.slot_logits if self.slot_valid is None else self.slot_logits[self.slot_valid]


@dataclass
class SequenceClassifierOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor
    """(B, num_labels)"""


@dataclass
class TokenClassifierOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor
    """(B, L, num_labels)"""


@dataclass
class QuestionAnsweringOutput:
    loss: torch.Tensor | None
    start_logits: torch.Tensor
    """(B, L)"""
    end_logits: torch.Tensor
    """(B, L)"""


class BertPredictionHeadTransform(nn.Module):
    """dense -> activation -> LayerNorm, applied before the tied vocabulary decoder."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.act = activation(cfg.hidden_act)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(h)))


class BertLMPredictionHead(nn.Module):
    """transform, then logits = h @ word_embeddings.T + bias (decoder weight passed in: tied)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(cfg)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, h: torch.Tensor, decoder_weight: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(h), decoder_weight, self.bias)  # (..., V)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(cfg)
        self.seq_relationship = nn.Linear(cfg.hidden_size, 2)


def _accuracy(correct: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    return correct.float() / count.clamp(min=1).float()


def masked_lm(
    h: torch.Tensor,
    predict: Callable[[torch.Tensor], torch.Tensor],
    masked_lm_positions: torch.Tensor | None,
    masked_lm_ids: torch.Tensor | None,
) -> PreTrainingOutput:
    """The MLM half of a PreTrainingOutput: `predict` (hidden -> vocabulary logits) on the (B, P) masked slots of
    h (B, L, H) when positions are given, else at every position; loss, accuracy and counts when ids are given.
    loss is mlm_loss; the NSP fields stay None."""
    B, L, H = h.shape
    mlm_loss = mlm_correct = mlm_count = mlm_accuracy = slot_valid = None
    if masked_lm_positions is not None:
        pos = masked_lm_positions.long()  # (B, P), -1 = padding
        valid = pos >= 0
        if masked_lm_ids is not None:
            valid = valid & (masked_lm_ids >= 0)
        # A row for every (b, p) slot, the padding slots pointing at position 0, and the gather first: the
        # transform and decoder run on B*P rows, not B*L. Selecting only the valid rows would read their count
        # off the device, a host sync in every forward on a GPU.
        flat = (torch.arange(B, device=pos.device)[:, None] * L + pos.clamp(min=0)).reshape(-1)  # (B*P,)
        logits = predict(h.reshape(B * L, H).index_select(0, flat))  # (B*P, V)
        slot_valid = valid.reshape(-1)
        if masked_lm_ids is not None:
            labels = torch.where(slot_valid, masked_lm_ids.reshape(-1).long(), -100)  # (B*P,), -100 = ignored
            # Loss and argmax in fp32: under bf16 autocast cross-entropy upcasts anyway, and CPU argmax
            # over bf16 is several times slower than over fp32.
            logits32 = logits.float()
            with torch.no_grad():
                mlm_count = slot_valid.sum()
                mlm_correct = (logits32.argmax(-1) == labels).sum()  # -100 matches nothing
                mlm_accuracy = _accuracy(mlm_correct, mlm_count)
            # Sum / max(N, 1): a batch without masked positions gives 0, not NaN.
            mlm_loss = F.cross_entropy(logits32, labels, ignore_index=-100, reduction="sum") / mlm_count.clamp(min=1)
    else:
        if masked_lm_ids is not None:
            raise ValueError("masked_lm_ids needs masked_lm_positions (B, P); see PreTrainingOutput")
        logits = predict(h)  # (B, L, V)
    return PreTrainingOutput(
        loss=mlm_loss,
        mlm_loss=mlm_loss,
        nsp_loss=None,
        slot_logits=logits,
        nsp_logits=None,
        mlm_accuracy=mlm_accuracy,
        mlm_correct=mlm_correct,
        mlm_count=mlm_count,
        slot_valid=slot_valid,
    )


class BertForPreTraining(BertPreTrainedModel):
    """BERT with the MLM (tied decoder) and NSP heads.

    >>> cfg = BertConfig.from_preset("tiny", vocab_size=50)
    >>> m = BertForPreTraining(cfg).eval()
    >>> ids = torch.tensor([[2, 7, 4, 9, 3]])
    >>> out = m(ids, masked_lm_positions=torch.tensor([[2, -1]]), masked_lm_ids=torch.tensor([[8, -1]]),
    ...         next_sentence_label=torch.tensor([-1]))
    >>> tuple(out.mlm_logits.shape), int(out.mlm_count), int(out.nsp_count), float(out.nsp_loss.detach())
    ((1, 50), 1, 0, 0.0)
    """

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.config = cfg
        self.bert = BertModel(cfg)
        self.cls = BertPreTrainingHeads(cfg)
        self.init_weights()
        nn.init.zeros_(self.cls.predictions.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        masked_lm_positions: torch.Tensor | None = None,
        masked_lm_ids: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        unpad_indices: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
    ) -> PreTrainingOutput:
        out = self.bert(input_ids, token_type_ids, attention_mask, unpad_indices=unpad_indices, cu_seqlens=cu_seqlens)
        h = out.last_hidden_state  # (B, L, H)
        decoder_weight = self.bert.embeddings.word_embeddings.weight  # (V, H), tied

        mlm = masked_lm(h, lambda x: self.cls.predictions(x, decoder_weight), masked_lm_positions, masked_lm_ids)

        nsp_logits = self.cls.seq_relationship(out.pooler_output)  # (B, 2)
        nsp_loss = nsp_correct = nsp_count = nsp_accuracy = None
        if next_sentence_label is not None:
            nsl = next_sentence_label.long().reshape(-1)  # (B,), -1 = no NSP
            nsp_valid = nsl >= 0
            with torch.no_grad():
                nsp_count = nsp_valid.sum()
                nsp_correct = ((nsp_logits.argmax(-1) == nsl) & nsp_valid).sum()
                nsp_accuracy = _accuracy(nsp_correct, nsp_count)
            nsp_loss = F.cross_entropy(nsp_logits.float(), nsl, ignore_index=-1, reduction="sum") / nsp_count.clamp(
                min=1
            )

        if mlm.mlm_loss is not None:
            loss = mlm.mlm_loss if nsp_loss is None else mlm.mlm_loss + nsp_loss
        else:
            loss = nsp_loss
        return dataclasses.replace(
            mlm,
            loss=loss,
            nsp_loss=nsp_loss,
            nsp_logits=nsp_logits,
            nsp_accuracy=nsp_accuracy,
            nsp_correct=nsp_correct,
            nsp_count=nsp_count,
        )


def sequence_classification_loss(logits: torch.Tensor, labels: torch.Tensor, problem: str | None) -> torch.Tensor:
    """transformers' loss for (B, num_labels) logits: `problem` (the config's problem_type), else regression (MSE)
    for one label, cross-entropy for integer labels, BCE-with-logits for float multi-hot labels."""
    num_labels = logits.shape[-1]
    if problem is None:
        if num_labels == 1:
            problem = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem = "single_label_classification"
        else:
            problem = "multi_label_classification"
    if problem == "regression":
        if num_labels == 1:
            return F.mse_loss(logits.float().squeeze(), labels.float().squeeze())
        return F.mse_loss(logits.float(), labels.float())
    if problem == "single_label_classification":
        return F.cross_entropy(logits.float().view(-1, num_labels), labels.long().view(-1))
    return F.binary_cross_entropy_with_logits(logits.float(), labels.to(torch.float32))


def token_classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of (B, L, num_labels) logits against (B, L) labels, -100 ignored."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.long().view(-1), ignore_index=-100)


def span_loss(
    start_logits: torch.Tensor, end_logits: torch.Tensor, start_positions: torch.Tensor, end_positions: torch.Tensor
) -> torch.Tensor:
    """Extractive-QA loss as transformers: mean of start and end cross-entropies over (B, L) logits; positions
    outside the input are clamped to L and ignored."""
    ignored = start_logits.shape[1]
    start = start_positions.reshape(-1).long().clamp(0, ignored)
    end = end_positions.reshape(-1).long().clamp(0, ignored)
    return (
        F.cross_entropy(start_logits.float(), start, ignore_index=ignored)
        + F.cross_entropy(end_logits.float(), end, ignore_index=ignored)
    ) / 2


def _classifier_dropout(cfg: BertConfig) -> float:
    return cfg.classifier_dropout if cfg.classifier_dropout is not None else cfg.hidden_dropout_prob


class BertForSequenceClassification(BertPreTrainedModel):
    """Pooled [CLS] -> dropout -> linear; single sentences or pairs (token_type_ids), regression if num_labels=1.

    The loss follows transformers: problem_type from the config, else regression (MSE) for one label,
    cross-entropy for integer labels, BCE-with-logits for float multi-hot labels.
    """

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.config = cfg
        self.num_labels = cfg.num_labels
        self.bert = BertModel(cfg)
        self.dropout = nn.Dropout(_classifier_dropout(cfg))
        self.classifier = nn.Linear(cfg.hidden_size, cfg.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> SequenceClassifierOutput:
        pooled = self.bert(input_ids, token_type_ids, attention_mask).pooler_output  # (B, H)
        logits = self.classifier(self.dropout(pooled))  # (B, num_labels)
        loss = None if labels is None else sequence_classification_loss(logits, labels, self.config.problem_type)
        return SequenceClassifierOutput(loss=loss, logits=logits)


class BertForTokenClassification(BertPreTrainedModel):
    """Per-token dropout -> linear; labels (B, L) with -100 ignored. No pooler, as in transformers."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.config = cfg
        self.num_labels = cfg.num_labels
        self.bert = BertModel(cfg, add_pooling_layer=False)
        self.dropout = nn.Dropout(_classifier_dropout(cfg))
        self.classifier = nn.Linear(cfg.hidden_size, cfg.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> TokenClassifierOutput:
        h = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state  # (B, L, H)
        logits = self.classifier(self.dropout(h))  # (B, L, num_labels)
        loss = None if labels is None else token_classification_loss(logits, labels)
        return TokenClassifierOutput(loss=loss, logits=logits)


class BertForQuestionAnswering(BertPreTrainedModel):
    """Extractive QA: per-token start/end logits; loss as transformers (positions clamped to L, ignored there)."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        if cfg.num_labels != 2:
            raise ValueError(f"num_labels must be 2 (start, end) for question answering, got {cfg.num_labels}")
        self.config = cfg
        self.num_labels = cfg.num_labels
        self.bert = BertModel(cfg, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(cfg.hidden_size, cfg.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
    ) -> QuestionAnsweringOutput:
        h = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state  # (B, L, H)
        logits = self.qa_outputs(h)  # (B, L, 2)
        start_logits, end_logits = logits[..., 0].contiguous(), logits[..., 1].contiguous()  # (B, L) each
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = span_loss(start_logits, end_logits, start_positions, end_positions)
        return QuestionAnsweringOutput(loss=loss, start_logits=start_logits, end_logits=end_logits)
