"""BertConfig and ModernBertConfig: the encoders' hyper-parameters, validated at construction, with presets.

Both live here, not beside their modules, so the pipeline's config sections can validate a preset without
importing torch (model/__init__.py loads lazily for the same reason); `model.modernbert` re-exports
ModernBertConfig.

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
from typing import Any, Literal

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


class _EncoderConfig:
    """What both encoders' configs derive the same way from their fields."""

    hidden_size: int
    num_attention_heads: int
    id2label: dict[int, str] | None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def label2id(self) -> dict[str, int] | None:
        return None if self.id2label is None else {v: k for k, v in self.id2label.items()}


@dataclass
class BertConfig(_EncoderConfig):
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
        _check_common(
            self,
            ("max_position_embeddings", "type_vocab_size"),
            ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"),
        )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not one of {', '.join(ACTIVATIONS)}")
        if not (isinstance(self.layer_norm_eps, (int, float)) and self.layer_norm_eps > 0):
            raise ValueError(f"layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> BertConfig:
        """`BertConfig.from_preset("mini", hidden_dropout_prob=0.0)`; unknown names list the presets."""
        # A size preset with an explicit hidden_size override must recompute the 4x intermediate width.
        return cls(**_preset_kwargs(cls, PRESETS, name, overrides))

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
        return _with_fields(self, d)

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
        return cls(**_hf_kwargs(cls, d, overrides))


# name -> sizes; the rest are ModernBertConfig's defaults (ModernBERT's: GeGLU width 1.5x hidden at base, head
# dim 64, vocab 50,368, 8,192 positions). base and large are the paper's (149M and 395M parameters at its
# vocabulary); tiny and mini are this project's CPU sizes, head dim 64 with 1.5x GeGLU like base, three layers
# so one is global and two local (tiny: 0.4M non-embedding parameters, as BERT-tiny's 0.4M). The small ones take
# BERT's WordPiece conventions ([PAD] = 0, vocabulary 30,522 until the prepared data's replaces it); the other
# special ids are tokenizer metadata the model never reads, so they are left unset there.
_WORDPIECE = {
    "vocab_size": 30522,
    "pad_token_id": 0,
    "bos_token_id": None,
    "eos_token_id": None,
    "cls_token_id": None,
    "sep_token_id": None,
}
MODERNBERT_PRESETS: dict[str, dict[str, Any]] = {
    "modernbert-tiny": {
        "num_hidden_layers": 3,
        "hidden_size": 128,
        "num_attention_heads": 2,
        "intermediate_size": 192,
        **_WORDPIECE,
    },
    "modernbert-mini": {
        "num_hidden_layers": 6,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "intermediate_size": 384,
        **_WORDPIECE,
    },
    "modernbert-base": {
        "num_hidden_layers": 22,
        "hidden_size": 768,
        "num_attention_heads": 12,
        "intermediate_size": 1152,
    },
    "modernbert-large": {
        "num_hidden_layers": 28,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "intermediate_size": 2624,
    },
}


@dataclass
class ModernBertConfig(_EncoderConfig):
    """ModernBERT hyper-parameters under transformers' `ModernBertConfig` names; defaults are ModernBERT-base's.

    Departures: the layer pattern is `global_attn_every_n_layers` (what configs on the Hub carry; transformers 5
    writes the `layer_types` list it stands for, and `from_hf_dict` reads either), RoPE is the default kind only,
    with one θ per layer kind; multiple-choice and sparse-prediction options are not modelled.

    >>> cfg = ModernBertConfig.from_preset("modernbert-tiny", vocab_size=100)
    >>> cfg.layer_types
    ['full_attention', 'sliding_attention', 'sliding_attention']
    """

    vocab_size: int = 50368
    """Vocabulary size (ModernBERT's BPE: 50,368, a multiple of 64)."""
    hidden_size: int = 768
    """Width of every token representation."""
    intermediate_size: int = 1152
    """GeGLU width: Wi projects to 2x this (value and gate), Wo back from it."""
    num_hidden_layers: int = 22
    """Number of encoder layers."""
    num_attention_heads: int = 12
    """Attention heads per layer; must divide hidden_size."""
    hidden_activation: str = "gelu"
    """The GLU's activation ("gelu": exact erf GELU, GeGLU)."""
    max_position_embeddings: int = 8192
    """Longest sequence the model is meant for (RoPE has no table; inputs longer than this are refused)."""
    initializer_range: float = 0.02
    """Std of the truncated-normal initialisation (output projections get std / sqrt(2 * layers))."""
    initializer_cutoff_factor: float = 2.0
    """Initial weights are cut at +-cutoff * std."""
    norm_eps: float = 1e-5
    """LayerNorm epsilon."""
    norm_bias: bool = False
    """Whether the LayerNorms have a bias (ModernBERT: no)."""
    pad_token_id: int = 50283
    """Id of the padding token; its embedding row starts at zero."""
    bos_token_id: int | None = 50281
    """Metadata for transformers (the model does not read it)."""
    eos_token_id: int | None = 50282
    """Metadata for transformers (the model does not read it)."""
    cls_token_id: int | None = 50281
    """Metadata for transformers (the model does not read it)."""
    sep_token_id: int | None = 50282
    """Metadata for transformers (the model does not read it)."""
    attention_bias: bool = False
    """Whether Wqkv and the attention output projection have biases."""
    attention_dropout: float = 0.0
    """Dropout on attention probabilities and on the attention output."""
    global_attn_every_n_layers: int = 3
    """Layer i attends globally when i % n == 0, else within a local_attention window."""
    local_attention: int = 128
    """Total sliding window of local layers: a token sees those at most local_attention // 2 away."""
    global_rope_theta: float = 160000.0
    """RoPE base of global layers (ModernBERT: 160,000; context extension raises it)."""
    local_rope_theta: float = 10000.0
    """RoPE base of local layers."""
    global_attention_kernel: Literal["sdpa", "flex", "jagged"] = "sdpa"
    """How global layers attend (`model.modernbert`): "sdpa" under a dense document mask, "flex" FlexAttention
    under a block mask (no dropout), "jagged" SDPA's varlen kernels on one nested tensor per document. How the model
    runs, not what it is: not written to config.json."""
    local_attention_kernel: Literal["banded", "sdpa", "flex"] = "banded"
    """How local layers attend: "banded" in chunks of half a window against three, "sdpa" under a dense document
    and window mask, "flex" FlexAttention under a block mask (no dropout). Not written to config.json."""
    embedding_dropout: float = 0.0
    """Dropout after the embedding norm."""
    mlp_bias: bool = False
    """Whether the GeGLU projections have biases."""
    mlp_dropout: float = 0.0
    """Dropout inside the MLP, after the gated activation."""
    decoder_bias: bool = True
    """Whether the tied MLM decoder has a bias."""
    classifier_pooling: Literal["cls", "mean"] = "cls"
    """Sequence classification reads the first token ("cls") or the mean over real tokens ("mean")."""
    classifier_dropout: float = 0.0
    """Dropout before classification heads."""
    classifier_bias: bool = False
    """Whether the prediction head's dense layer has a bias."""
    classifier_activation: str = "gelu"
    """The prediction head's activation."""
    num_labels: int = 2
    """Output width of classification heads (1 = regression for sequence classification)."""
    id2label: dict[int, str] | None = None
    """Optional label names, index -> name; its length must equal num_labels."""
    problem_type: str | None = None
    """Sequence-classification loss: None (inferred as transformers does) or one of PROBLEM_TYPES."""

    def __post_init__(self) -> None:
        _check_common(
            self,
            ("max_position_embeddings", "global_attn_every_n_layers", "local_attention"),
            ("attention_dropout", "embedding_dropout", "mlp_dropout", "classifier_dropout"),
        )
        for name in ("hidden_activation", "classifier_activation"):
            if getattr(self, name) not in ACTIVATIONS:
                raise ValueError(f"{name} {getattr(self, name)!r} is not one of {', '.join(ACTIVATIONS)}")
        for name in ("norm_eps", "global_rope_theta", "local_rope_theta", "initializer_cutoff_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if self.classifier_pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling {self.classifier_pooling!r} is not 'cls' or 'mean'")
        for name, kinds in (
            ("global_attention_kernel", ("sdpa", "flex", "jagged")),
            ("local_attention_kernel", ("banded", "sdpa", "flex")),
        ):
            if getattr(self, name) not in kinds:
                raise ValueError(f"{name} {getattr(self, name)!r} is not one of {', '.join(kinds)}")
            if getattr(self, name) == "flex" and self.attention_dropout:
                raise ValueError(
                    f"{name} 'flex' has no attention dropout; attention_dropout is {self.attention_dropout}"
                )

    @property
    def layer_types(self) -> list[str]:
        """transformers' per-layer kinds: "full_attention" every n-th layer from 0, else "sliding_attention"."""
        n = self.global_attn_every_n_layers
        return ["sliding_attention" if i % n else "full_attention" for i in range(self.num_hidden_layers)]

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ModernBertConfig:
        """`ModernBertConfig.from_preset("modernbert-mini", vocab_size=8000)`; unknown names list the presets."""
        return cls(**_preset_kwargs(cls, MODERNBERT_PRESETS, name, overrides))

    def to_hf_dict(self, architectures: list[str] | None = None) -> dict[str, Any]:
        """A transformers 5 `config.json` dict (model_type "modernbert", layer_types and rope_parameters)."""
        d = _with_fields(
            self,
            {
                "architectures": list(architectures) if architectures else ["ModernBertModel"],
                "model_type": "modernbert",
                "tie_word_embeddings": True,
            },
        )
        for name in ("global_attention_kernel", "local_attention_kernel"):
            del d[name]  # how this run attends, not the model: a loaded model takes the defaults or overrides
        for name in ("global_attn_every_n_layers", "global_rope_theta", "local_rope_theta"):
            del d[name]  # transformers 5 spells these as the two entries below
        d["layer_types"] = self.layer_types
        d["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": self.global_rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": self.local_rope_theta},
        }
        return d

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], **overrides: Any) -> ModernBertConfig:
        """Build from a transformers ModernBERT config.json, old (`global_rope_theta`, `global_attn_every_n_layers`)
        or new (`rope_parameters`, `layer_types`) spelling; unknown keys are ignored, overrides win."""
        if d.get("model_type") != "modernbert":
            raise ValueError(f"model_type {d.get('model_type')!r} is not 'modernbert'")
        d = dict(d)
        for kind, name in (("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta")):
            rope = (d.get("rope_parameters") or {}).get(kind) or {}
            if rope.get("rope_type", "default") != "default":
                raise ValueError(
                    f"rope_parameters.{kind}.rope_type {rope['rope_type']!r} is not supported (only 'default')"
                )
            if "rope_theta" in rope:
                d[name] = rope["rope_theta"]
        types = d.get("layer_types")
        if types is not None:
            n = types[1:].index("full_attention") + 1 if "full_attention" in types[1:] else len(types)
            mine = cls(num_hidden_layers=len(types), global_attn_every_n_layers=n).layer_types
            if list(types) != mine:
                raise ValueError(f"layer_types {types} is not 'full_attention' every n-th layer from 0")
            d["global_attn_every_n_layers"] = n
        return cls(**_hf_kwargs(cls, d, overrides))


def _check_common(cfg: BertConfig | ModernBertConfig, counts: tuple[str, ...], dropouts: tuple[str, ...]) -> None:
    """The checks both encoders' configs share: positive sizes, heads dividing the width, dropouts in [0, 1),
    the pad id inside the vocabulary, the problem type, and id2label (normalised to {int: str}) fitting num_labels."""
    for name in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        *counts,
        "num_labels",
    ):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if cfg.hidden_size % cfg.num_attention_heads:
        raise ValueError(
            f"hidden_size {cfg.hidden_size} is not divisible by num_attention_heads {cfg.num_attention_heads}"
        )
    for name in dropouts:
        value = getattr(cfg, name)
        if value is not None and not (isinstance(value, (int, float)) and 0.0 <= value < 1.0):
            raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    if not (isinstance(cfg.initializer_range, (int, float)) and cfg.initializer_range > 0):
        raise ValueError(f"initializer_range must be > 0, got {cfg.initializer_range!r}")
    if not isinstance(cfg.pad_token_id, int) or not 0 <= cfg.pad_token_id < cfg.vocab_size:
        raise ValueError(f"pad_token_id {cfg.pad_token_id!r} is not in [0, vocab_size={cfg.vocab_size})")
    if cfg.problem_type is not None and cfg.problem_type not in PROBLEM_TYPES:
        raise ValueError(f"problem_type {cfg.problem_type!r} is not one of {', '.join(PROBLEM_TYPES)}")
    if cfg.id2label is not None:
        try:
            cfg.id2label = {int(k): str(v) for k, v in dict(cfg.id2label).items()}
        except (TypeError, ValueError) as e:
            raise ValueError(f"id2label must map integer ids to names: {e}") from None
        if sorted(cfg.id2label) != list(range(cfg.num_labels)):
            raise ValueError(
                f"id2label has ids {sorted(cfg.id2label)} but num_labels is {cfg.num_labels} "
                f"(ids must be 0..num_labels-1)"
            )


def _preset_kwargs(
    cls: type, presets: dict[str, dict[str, Any]], name: str, overrides: dict[str, Any]
) -> dict[str, Any]:
    """A preset's fields with `overrides` on top; unknown preset and field names are errors that list them."""
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(presets)}")
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s) {', '.join(unknown)}")
    return {**presets[name], **overrides}


def _with_fields(cfg: BertConfig | ModernBertConfig, d: dict[str, Any]) -> dict[str, Any]:
    """`d` plus every dataclass field, id2label/label2id written as transformers does (string keys)."""
    for f in dataclasses.fields(cfg):
        if f.name != "id2label":
            d[f.name] = getattr(cfg, f.name)
    if cfg.id2label is not None:
        d["id2label"] = {str(k): v for k, v in sorted(cfg.id2label.items())}
        d["label2id"] = {v: k for k, v in sorted(cfg.id2label.items())}
    return d


def _hf_kwargs(cls: type, d: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The fields of `cls` a config.json dict holds, overrides on top. `num_labels` falls back to len(id2label);
    an overridden num_labels without id2label drops the file's label names, which no longer fit."""
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in d.items() if k in names}
    if "id2label" in kwargs and "num_labels" not in kwargs and kwargs["id2label"] is not None:
        kwargs["num_labels"] = len(kwargs["id2label"])
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s) {', '.join(unknown)}")
    if "num_labels" in overrides and "id2label" not in overrides:
        kwargs.pop("id2label", None)
    kwargs.update(overrides)
    return kwargs
