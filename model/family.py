"""A model family is one object (`ModelFamily`) that answers every question the pipeline asks of it: its config
class and presets, its classes per task and the transformers class names they save as, how its checkpoints name
their weights, and what a batch must hold for it. BERT and ModernBERT are the two registered here (`FAMILIES`);
`family_of` is the one way to ask which family something is: a family name (config.json's `model_type`), a preset,
a config, a config's fields, or a model (class or instance). A third family is one more `ModelFamily` passed to
`register` (tests/test_build.py adds a toy one).

Its classes are named as "module:Class" and imported on first use, so this module, like `model.config`, loads
without torch: the data jobs and the config sections ask about families and presets.

    >>> family_of("modernbert-tiny").name, family_of("tiny").name, family_of({"local_attention": 64}).name
    ('modernbert', 'bert', 'modernbert')
    >>> BERT.class_names()["token-classification"]
    'BertForTokenClassification'
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Mapping

from model.config import MODERNBERT_PRESETS, PRESETS, BertConfig, ModernBertConfig, _preset_kwargs

TASKS = ("pretraining", "sequence-classification", "token-classification", "question-answering", "embedding")
"""What a family builds models for; `embedding` is the bare encoder (`model.pooling` turns its states into vectors)."""


@dataclass(frozen=True)
class ModelFamily:
    """One family of encoders: everything that differs between BERT and ModernBERT, in one record."""

    name: str
    """config.json's `model_type` ("bert", "modernbert")."""
    architecture: str
    """Its name in prose (a registered version's description, error messages)."""
    config_class: type
    """The config dataclass (`BertConfig`); it takes the presets' fields, `to_hf_dict` and `from_hf_dict`."""
    presets: Mapping[str, Mapping[str, Any]]
    """Preset name -> config fields; preset names are unique across families (`model.preset` picks the family)."""
    tasks: Mapping[str, str | type]
    """Task (`TASKS`) -> its class, or "module:Class" imported on first use; "pretraining" is what the pretraining
    job trains and registers."""
    base: str | type
    """The bare encoder (`BertModel`): a checkpoint without task heads loads into it."""
    prefix: str
    """The encoder's attribute in a task model, as its weights are named ("bert." in `bert.encoder.layer.0...`)."""
    roots: tuple[str, ...]
    """The bare encoder's top-level modules (their weights carry no prefix in a bare checkpoint)."""
    word_embeddings: str
    """The word embeddings' weight under the encoder, to which the MLM decoder is tied."""
    tied_decoder: str
    """The tied decoder weight transformers may write (dropped on load: ours is the embeddings)."""
    shape_fields: tuple[str, ...]
    """Config fields that decide the weights' shapes and function: a checkpoint and a config must agree on them."""
    token_types: bool = True
    """Its models take `token_type_ids` (segments A/B)."""
    nsp: bool = True
    """Its pretraining model has a next-sentence head (`next_sentence_label`); without, pretraining is MLM only."""
    documents: bool = False
    """Its models keep packed documents apart (`cu_seqlens` from the shards' `doc_lengths`)."""
    unpad: bool = True
    """Its encoder runs on unpadded batches (`train.unpad`, the varlen path) and compiles at one width
    (`train.compile`)."""
    _classes: dict[str, type] = field(default_factory=dict, repr=False, compare=False)

    def _resolve(self, ref: str | type) -> type:
        if isinstance(ref, type):
            return ref
        module, name = ref.split(":")
        return getattr(importlib.import_module(module), name)

    def class_names(self) -> dict[str, str]:
        """Task -> the class name its models save as (config.json's `architectures`), without importing them."""
        return {t: c.__name__ if isinstance(c, type) else c.split(":")[1] for t, c in self.tasks.items()}

    def model_class(self, task: str) -> type:
        """Its class for `task`; a task it has none for is a ValueError naming the ones it has."""
        if task not in self.tasks:
            raise ValueError(f"no {self.architecture} model for task {task!r}; it has {', '.join(self.tasks)}")
        if task not in self._classes:
            self._classes[task] = self._resolve(self.tasks[task])
        return self._classes[task]

    def classes(self) -> dict[str, type]:
        """Class name -> class, the bare encoder and every task's (imports them)."""
        out = {c.__name__: c for c in (self.model_class(t) for t in self.tasks)}
        base = self._resolve(self.base)
        return {base.__name__: base, **out}

    def config(self, preset: str | None, **fields: Any) -> Any:
        """Its config from a preset with `fields` on top, or with preset None from the fields alone."""
        if preset is None:
            return self.config_class(**fields)
        return self.config_class(**_preset_kwargs(self.config_class, self.presets, preset, fields))


BERT = ModelFamily(
    name="bert",
    architecture="BERT",
    config_class=BertConfig,
    presets=PRESETS,
    tasks={
        "pretraining": "model.heads:BertForPreTraining",
        "sequence-classification": "model.heads:BertForSequenceClassification",
        "token-classification": "model.heads:BertForTokenClassification",
        "question-answering": "model.heads:BertForQuestionAnswering",
        "embedding": "model.bert:BertModel",
    },
    base="model.bert:BertModel",
    prefix="bert.",
    roots=("embeddings.", "encoder.", "pooler."),
    word_embeddings="embeddings.word_embeddings.weight",
    tied_decoder="cls.predictions.decoder.weight",
    shape_fields=(
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "max_position_embeddings",
        "type_vocab_size",
        "vocab_size",
        "layer_norm_eps",
    ),
)

MODERNBERT = ModelFamily(
    name="modernbert",
    architecture="ModernBERT",
    config_class=ModernBertConfig,
    presets=MODERNBERT_PRESETS,
    tasks={
        "pretraining": "model.modernbert:ModernBertForMaskedLM",
        "sequence-classification": "model.modernbert:ModernBertForSequenceClassification",
        "token-classification": "model.modernbert:ModernBertForTokenClassification",
        "question-answering": "model.modernbert:ModernBertForQuestionAnswering",
        "embedding": "model.modernbert:ModernBertModel",
    },
    base="model.modernbert:ModernBertModel",
    prefix="model.",
    roots=("embeddings.", "layers.", "final_norm."),
    word_embeddings="embeddings.tok_embeddings.weight",
    tied_decoder="decoder.weight",
    shape_fields=(
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_activation",
        "max_position_embeddings",
        "vocab_size",
        "norm_eps",
        "norm_bias",
        "attention_bias",
        "mlp_bias",
        "global_attn_every_n_layers",
        "local_attention",
        "global_rope_theta",
        "local_rope_theta",
        "decoder_bias",
        "classifier_bias",
        "classifier_activation",
    ),
    token_types=False,
    nsp=False,
    documents=True,
    unpad=False,
)

FAMILIES: dict[str, ModelFamily] = {f.name: f for f in (BERT, MODERNBERT)}
"""name -> family, in the order `family_of` prefers them (the first is the default of a config's fields)."""


def register(family: ModelFamily) -> ModelFamily:
    """Add a family: its name and preset names must be new."""
    taken = sorted(set(family.presets) & {p for f in FAMILIES.values() for p in f.presets})
    if family.name in FAMILIES or taken:
        raise ValueError(f"family {family.name!r} or its presets {taken} are registered already")
    FAMILIES[family.name] = family
    return family


def presets() -> list[str]:
    """Every family's preset names."""
    return [p for f in FAMILIES.values() for p in f.presets]


def family_of(x: Any) -> ModelFamily:
    """The family of `x`: a family, its name (config.json's `model_type`) or one of its presets, a config (or the
    dict of a config's fields: the first family whose config takes them all), or a model class or instance."""
    if isinstance(x, ModelFamily):
        return x
    if isinstance(x, str):
        for f in FAMILIES.values():
            if x == f.name or x in f.presets:
                return f
        raise ValueError(f"unknown preset {x!r}; choose one of {', '.join(presets())}")
    if isinstance(x, Mapping):
        for f in FAMILIES.values():
            if set(x) <= {fl.name for fl in dataclasses.fields(f.config_class)}:
                return f
        raise ValueError(f"no model family's config takes the fields {', '.join(sorted(x))}")
    cls = x if isinstance(x, type) else type(x)
    for klass in cls.__mro__:  # the class itself first: a family's subclass of another's is its own
        for f in FAMILIES.values():
            if klass is f.config_class or _ref(klass) in (_ref(f.base), *map(_ref, f.tasks.values())):
                return f
    raise ValueError(f"{cls.__name__} is of no registered model family ({', '.join(FAMILIES)})")


def _ref(c: str | type) -> str:
    """A class as "module:Class"."""
    return c if isinstance(c, str) else f"{c.__module__}:{c.__qualname__}"


def encoder_config(preset: str | None, **fields: Any) -> BertConfig | ModernBertConfig:
    """The config of any family's encoder (`model.family`): a preset (its name picks the family) with `fields` on
    top, or with preset None a whole config given by its fields.

    >>> type(encoder_config("modernbert-tiny", vocab_size=100)).__name__, encoder_config("tiny").hidden_size
    ('ModernBertConfig', 128)
    """
    return family_of(fields if preset is None else preset).config(preset, **fields)
