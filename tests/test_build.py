"""model/build.py: the one model builder (family x task, fresh or from a transformers directory)."""

from __future__ import annotations

import pytest
import torch

from model.build import build_model, load_model, model_class
from model.config import BertConfig, ModernBertConfig, encoder_config

TASKS = ("pretraining", "sequence-classification", "token-classification", "question-answering")


@pytest.mark.parametrize("preset,family", [("tiny", "Bert"), ("modernbert-tiny", "ModernBert")])
@pytest.mark.parametrize("task", TASKS)
def test_preset_and_task_pick_the_class(preset, family, task):
    cfg = encoder_config(preset, vocab_size=64, **({"num_labels": 2} if task == "question-answering" else {}))
    name = {"pretraining": "ForPreTraining" if family == "Bert" else "ForMaskedLM"}.get(task) or \
        "For" + "".join(w.capitalize() for w in task.split("-"))
    assert type(build_model(cfg, task)).__name__ == family + name
    assert model_class(family.lower(), task).__name__ == family + name


def test_encoder_config_families_and_unknown_presets():
    assert isinstance(encoder_config("modernbert-mini", vocab_size=100), ModernBertConfig)
    assert isinstance(encoder_config("mini"), BertConfig)
    assert isinstance(encoder_config(None, hidden_size=64, num_attention_heads=2, global_attn_every_n_layers=2),
                      ModernBertConfig)  # a whole config by its fields (model.init's): ModernBERT by its own fields
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
        "ForMaskedLM", "ForSequenceClassification")
    body = "bert." if preset == "tiny" else "model."
    mine, theirs = clf.state_dict(), pre.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs if k.startswith(body))
    assert {k for k in clf.load_report["missing"]} >= {"classifier.weight", "classifier.bias"}
