"""model/build.py: the one model builder (family x task, fresh or from a transformers directory)."""

from __future__ import annotations

import pytest
import torch

from model.build import build_model, load_model, model_class
from model.config import BertConfig, ModernBertConfig
from model.family import encoder_config

TASKS = ("pretraining", "sequence-classification", "token-classification", "question-answering")


@pytest.mark.parametrize("preset,family", [("tiny", "Bert"), ("modernbert-tiny", "ModernBert")])
@pytest.mark.parametrize("task", TASKS)
def test_preset_and_task_pick_the_class(preset, family, task):
    cfg = encoder_config(preset, vocab_size=64, **({"num_labels": 2} if task == "question-answering" else {}))
    name = {"pretraining": "ForPreTraining" if family == "Bert" else "ForMaskedLM"}.get(task) or "For" + "".join(
        w.capitalize() for w in task.split("-")
    )
    assert type(build_model(cfg, task)).__name__ == family + name
    assert model_class(family.lower(), task).__name__ == family + name


def test_encoder_config_families_and_unknown_presets():
    assert isinstance(encoder_config("modernbert-mini", vocab_size=100), ModernBertConfig)
    assert isinstance(encoder_config("mini"), BertConfig)
    assert isinstance(
        encoder_config(None, hidden_size=64, num_attention_heads=2, global_attn_every_n_layers=2), ModernBertConfig
    )  # a whole config by its fields (model.init's): ModernBERT by its own fields
    with pytest.raises(ValueError, match="unknown preset 'huge'; choose one of tiny, .*modernbert-tiny"):
        encoder_config("huge")
    with pytest.raises(ValueError, match="no model for family 'bert' and task 'fill-mask'"):
        model_class("bert", "fill-mask")


@pytest.mark.parametrize("preset", ["tiny", "modernbert-tiny"])
def test_load_model_reads_the_family_from_config_json(tmp_path, preset):
    """A registered pretraining export starts any task: the family comes from config.json, the encoder's weights
    from the file, and only the new task head is fresh."""
    from model.hf import save_hf

    torch.manual_seed(0)
    pre = build_model(encoder_config(preset, vocab_size=64))
    save_hf(pre, tmp_path)
    clf = load_model(tmp_path, "sequence-classification", num_labels=3)
    assert type(clf).__name__ == type(pre).__name__.replace("ForPreTraining", "ForSequenceClassification").replace(
        "ForMaskedLM", "ForSequenceClassification"
    )
    body = "bert." if preset == "tiny" else "model."
    mine, theirs = clf.state_dict(), pre.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs if k.startswith(body))
    assert {k for k in clf.load_report["missing"]} >= {"classifier.weight", "classifier.bias"}


def test_a_third_family_is_one_new_object(tmp_path):
    """A toy family (BERT's layers under other names, presets and model_type) is one `ModelFamily`, registered:
    presets, configs, every builder and the transformers round trip find it, and the config sections check a run
    of it by what it says (no NSP head, no unpadded path), with nothing edited in model/ or pipeline/."""
    import dataclasses

    from model.bert import BertModel
    from model.family import BERT, FAMILIES, ModelFamily, family_of, register
    from model.heads import BertForPreTraining, BertForSequenceClassification
    from model.hf import save_hf
    from pipeline.config import ConfigError, load_config

    class ToyConfig(BertConfig):
        def to_hf_dict(self, architectures=None):
            return {**super().to_hf_dict(architectures), "model_type": "toy"}

        @classmethod
        def from_hf_dict(cls, d, **overrides):
            return super().from_hf_dict({**d, "model_type": "bert"}, **overrides)

    class ToyModel(BertModel): ...

    class ToyForMaskedLM(BertForPreTraining): ...

    class ToyForSequenceClassification(BertForSequenceClassification): ...

    toy = ModelFamily(
        **{
            **{f.name: getattr(BERT, f.name) for f in dataclasses.fields(BERT) if f.init},
            **dict(
                name="toy",
                architecture="Toy",
                config_class=ToyConfig,
                presets={"toy-tiny": {"num_hidden_layers": 1}},
                tasks={"pretraining": ToyForMaskedLM, "sequence-classification": ToyForSequenceClassification},
                base=ToyModel,
                nsp=False,
                unpad=False,
                _classes={},
            ),
        }
    )
    register(toy)
    try:
        cfg = encoder_config("toy-tiny", vocab_size=64)
        assert type(cfg) is ToyConfig and family_of("toy-tiny") is family_of(cfg) is toy
        model = build_model(cfg)
        assert type(model) is ToyForMaskedLM and family_of(model) is toy and family_of(BertModel) is BERT
        assert type(build_model(cfg, "sequence-classification")) is ToyForSequenceClassification
        with pytest.raises(ValueError, match="no model for family 'toy' and task 'token-classification'"):
            model_class("toy", "token-classification")
        save_hf(model, tmp_path)
        back = load_model(tmp_path)
        assert type(back) is ToyForMaskedLM and back.load_report == {"missing": [], "unexpected": []}
        assert all(torch.equal(v, back.state_dict()[k]) for k, v in model.state_dict().items())
        run = load_config(None, ["--model.preset", "toy-tiny", "--data.nsp", "false"])
        assert run.model.family is toy and run.model.encoder_config().num_hidden_layers == 1
        with pytest.raises(ConfigError, match="^model.preset toy-tiny is MLM-only"):
            load_config(None, ["--model.preset", "toy-tiny", "--data.nsp", "true"])
    finally:
        del FAMILIES["toy"]
