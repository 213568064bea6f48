"""BertConfig: presets, validation naming the field, transformers config.json round trips."""

from __future__ import annotations

import json

import pytest
import transformers

from model import PRESETS, BertConfig


@pytest.mark.parametrize(
    ("name", "layers", "hidden", "heads"),
    [
        ("tiny", 2, 128, 2),
        ("mini", 4, 256, 4),
        ("small", 4, 512, 8),
        ("medium", 8, 512, 8),
        ("base", 12, 768, 12),
        ("large", 24, 1024, 16),
    ],
)
def test_presets_match_the_paper_sizes(name, layers, hidden, heads):
    cfg = BertConfig.from_preset(name)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (layers, hidden, heads)
    assert cfg.intermediate_size == 4 * hidden
    assert (cfg.vocab_size, cfg.max_position_embeddings, cfg.type_vocab_size) == (30522, 512, 2)
    assert cfg.hidden_dropout_prob == cfg.attention_probs_dropout_prob == 0.1
    assert cfg.layer_norm_eps == 1e-12
    assert set(PRESETS) == {"tiny", "mini", "small", "medium", "base", "large"}


def test_preset_overrides_and_hidden_override_recomputes_intermediate():
    cfg = BertConfig.from_preset("tiny", hidden_size=64, hidden_dropout_prob=0.0, num_labels=3)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.hidden_dropout_prob, cfg.num_labels) == (64, 256, 0.0, 3)
    assert BertConfig(hidden_size=64, num_attention_heads=4, intermediate_size=100).intermediate_size == 100


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"hidden_size": 100, "num_attention_heads": 12}, "hidden_size 100 is not divisible by num_attention_heads 12"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"num_hidden_layers": -1}, "num_hidden_layers"),
        ({"num_labels": 1.5}, "num_labels"),
        ({"hidden_dropout_prob": 1.0}, "hidden_dropout_prob"),
        ({"attention_probs_dropout_prob": -0.1}, "attention_probs_dropout_prob"),
        ({"classifier_dropout": 2}, "classifier_dropout"),
        ({"hidden_act": "tanh"}, "hidden_act"),
        ({"layer_norm_eps": 0}, "layer_norm_eps"),
        ({"initializer_range": -1}, "initializer_range"),
        ({"pad_token_id": 30522}, "pad_token_id"),
        ({"problem_type": "ranking"}, "problem_type"),
        ({"num_labels": 3, "id2label": {0: "a", 1: "b"}}, "id2label"),
    ],
)
def test_invalid_fields_are_named(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BertConfig(**kwargs)


def test_unknown_preset_and_override_are_named():
    with pytest.raises(ValueError, match="unknown preset 'huge'.*tiny"):
        BertConfig.from_preset("huge")
    with pytest.raises(ValueError, match="hiden_size"):
        BertConfig.from_preset("tiny", hiden_size=3)


def test_to_hf_dict_builds_the_same_transformers_config():
    cfg = BertConfig.from_preset("mini", num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"}, classifier_dropout=0.2)
    d = json.loads(json.dumps(cfg.to_hf_dict(architectures=["BertForSequenceClassification"])))
    assert d["model_type"] == "bert" and d["architectures"] == ["BertForSequenceClassification"]
    hf = transformers.BertConfig(**d)
    for name in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "max_position_embeddings",
        "type_vocab_size",
        "layer_norm_eps",
        "pad_token_id",
        "classifier_dropout",
    ):
        assert getattr(hf, name) == getattr(cfg, name), name
    assert hf.num_labels == 3 and hf.id2label == {0: "neg", 1: "neu", 2: "pos"}
    assert hf.label2id == {"neg": 0, "neu": 1, "pos": 2}
    assert BertConfig.from_hf_dict(d) == cfg


def test_from_hf_dict_reads_minilm_and_ignores_unknown_keys(minilm_dir):
    d = json.loads((minilm_dir / "config.json").read_text())
    assert "gradient_checkpointing" in d  # an unknown key the loader must skip
    cfg = BertConfig.from_hf_dict(d)
    sizes = (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size)
    assert sizes == (384, 6, 12, 1536)


def test_from_hf_dict_labels_and_overrides():
    d = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "id2label": {"0": "x", "1": "y", "2": "z"},
        "label2id": {"x": 0, "y": 1, "z": 2},
    }
    cfg = BertConfig.from_hf_dict(d)
    assert cfg.num_labels == 3 and cfg.id2label == {0: "x", 1: "y", 2: "z"}
    # A new label count without names drops the file's names, which no longer fit.
    cfg6 = BertConfig.from_hf_dict(d, num_labels=6)
    assert cfg6.num_labels == 6 and cfg6.id2label is None
    cfg2 = BertConfig.from_hf_dict(d, num_labels=2, id2label={0: "a", 1: "b"})
    assert cfg2.label2id == {"a": 0, "b": 1}


@pytest.mark.parametrize(
    ("key", "value", "msg"),
    [
        ("model_type", "roberta", "model_type"),
        ("position_embedding_type", "relative_key", "position_embedding_type"),
        ("is_decoder", True, "is_decoder"),
    ],
)
def test_from_hf_dict_rejects_other_architectures(key, value, msg):
    with pytest.raises(ValueError, match=msg):
        BertConfig.from_hf_dict({key: value})


def test_docstring_examples_in_model_modules_hold():
    import doctest

    import model.bert
    import model.build
    import model.config
    import model.family
    import model.flops
    import model.heads
    import model.hf
    import model.modernbert
    import model.segments

    for module in (
        model.config,
        model.bert,
        model.build,
        model.family,
        model.flops,
        model.heads,
        model.hf,
        model.modernbert,
        model.segments,
    ):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, module.__name__
