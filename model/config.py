"""BertConfig: the model's hyper-parameters, validated at construction, with the paper's presets.

Field names are transformers' `BertConfig` names so `config.json` maps one to one (`to_hf_dict` /
`from_hf_dict`). Departures: only absolute position embeddings and an encoder (no decoder/cross-attention
options), because that is all BERT pretraining and fine-tuning here use; `from_hf_dict` rejects the rest
with a clear error instead of silently building a different model.

>>> BertConfig.from_preset("tiny").hidden_size
128
>>> BertConfig.from_preset("base", num_labels=3).intermediate_size
3072
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# name -> (num_hidden_layers, hidden_size, num_attention_heads); intermediate is 4*hidden (BERT, Turc et al. 2019).
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2},
    "mini": {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4},
    "small": {"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8},
    "medium": {"num_hidden_layers": 8, "hidden_size": 512, "num_attention_heads": 8},
    "base": {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12},
    "large": {"num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16},
}

# Activations transformers' BERT configs use in practice; "gelu" is the exact erf GELU of the paper.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


@dataclass
class BertConfig:
    """BERT hyper-parameters (transformers' names). Defaults are BERT-base's except the sizes (see PRESETS)."""

    vocab_size: int = 30522
    """WordPiece vocabulary size (bert-base-uncased's 30522 by default)."""
    hidden_size: int = 768
    """Width of every token representation."""
    num_hidden_layers: int = 12
    """Number of encoder layers."""
    num_attention_heads: int = 12
    """Attention heads per layer; must divide hidden_size."""
    intermediate_size: int | None = None
    """Feed-forward width; None or 0 means 4 * hidden_size (the paper's ratio)."""
    hidden_act: str = "gelu"
    """Feed-forward and MLM-transform activation; "gelu" is the exact erf GELU."""
    hidden_dropout_prob: float = 0.1
    """Dropout on embeddings and on each sub-layer output."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on attention probabilities."""
    max_position_embeddings: int = 512
    """Longest sequence the learned position table covers."""
    type_vocab_size: int = 2
    """Number of segment (token type) ids: 2 for sentence A/B."""
    initializer_range: float = 0.02
    """Std of the normal initialisation of weights and embeddings."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon (1e-12 as in Google's BERT)."""
    pad_token_id: int = 0
    """Id of [PAD]; its word-embedding row starts at zero."""
    num_labels: int = 2
    """Output width of classification heads (1 = regression for sequence classification)."""
    id2label: dict[int, str] | None = None
    """Optional label names, index -> name; its length must equal num_labels."""
    problem_type: str | None = None
    """Sequence-classification loss: None (inferred as transformers does) or one of PROBLEM_TYPES."""
    classifier_dropout: float | None = None
    """Dropout before classification heads; None means hidden_dropout_prob."""

    def __post_init__(self) -> None:
        if not self.intermediate_size:
            self.intermediate_size = 4 * self.hidden_size
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size", "num_labels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not one of {', '.join(ACTIVATIONS)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and 0.0 <= value < 1.0):
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        if not (isinstance(self.initializer_range, (int, float)) and self.initializer_range > 0):
            raise ValueError(f"initializer_range must be > 0, got {self.initializer_range!r}")
        if not (isinstance(self.layer_norm_eps, (int, float)) and self.layer_norm_eps > 0):
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        if not isinstance(self.pad_token_id, int) or not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id!r} is not in [0, vocab_size={self.vocab_size})")
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise ValueError(f"problem_type {self.problem_type!r} is not one of {', '.join(PROBLEM_TYPES)}")
        if self.id2label is not None:
            try:
                self.id2label = {int(k): str(v) for k, v in dict(self.id2label).items()}
            except (TypeError, ValueError) as e:
                raise ValueError(f"id2label must map integer ids to names: {e}") from None
            if sorted(self.id2label) != list(range(self.num_labels)):
                raise ValueError(f"id2label has ids {sorted(self.id2label)} but num_labels is {self.num_labels} "
                                 f"(ids must be 0..num_labels-1)")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def label2id(self) -> dict[str, int] | None:
        return None if self.id2label is None else {v: k for k, v in self.id2label.items()}

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> BertConfig:
        """`BertConfig.from_preset("mini", hidden_dropout_prob=0.0)`; unknown names list the presets."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ValueError(f"unknown BertConfig field(s) {', '.join(unknown)}")
        # A size preset with an explicit hidden_size override must recompute the 4x intermediate width.
        return cls(**{**PRESETS[name], **overrides})

    def to_hf_dict(self, architectures: list[str] | None = None) -> dict[str, Any]:
        """A transformers `config.json` dict (model_type "bert"); id2label/label2id keys as JSON strings."""
        d: dict[str, Any] = {
            "architectures": list(architectures) if architectures else ["BertModel"],
            "model_type": "bert",
            "position_embedding_type": "absolute",
            "tie_word_embeddings": True,
            "is_decoder": False,
            "add_cross_attention": False,
        }
        for f in dataclasses.fields(self):
            if f.name == "id2label":
                continue
            d[f.name] = getattr(self, f.name)
        if self.id2label is not None:
            d["id2label"] = {str(k): v for k, v in sorted(self.id2label.items())}
            d["label2id"] = {v: k for k, v in sorted(self.id2label.items())}
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], **overrides: Any) -> BertConfig:
        """Build from a transformers config.json dict; unknown keys are ignored, overrides win.

        `num_labels` falls back to len(id2label) (transformers writes id2label, not always num_labels); an
        overridden num_labels without id2label drops the file's label names, which no longer fit.
        """
        model_type = d.get("model_type", "bert")
        if model_type != "bert":
            raise ValueError(f"model_type {model_type!r} is not 'bert'")
        pet = d.get("position_embedding_type", "absolute")
        if pet != "absolute":
            raise ValueError(f"position_embedding_type {pet!r} is not supported (only 'absolute')")
        if d.get("is_decoder") or d.get("add_cross_attention"):
            raise ValueError("is_decoder/add_cross_attention configs are not supported (encoder only)")
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        if "id2label" in kwargs and "num_labels" not in kwargs and kwargs["id2label"] is not None:
            kwargs["num_labels"] = len(kwargs["id2label"])
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown BertConfig field(s) {', '.join(unknown)}")
        if "num_labels" in overrides and "id2label" not in overrides:
            kwargs.pop("id2label", None)
        kwargs.update(overrides)
        return cls(**kwargs)
