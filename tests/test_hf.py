"""load_hf / save_hf: transformers directories both ways, prefixes, reports, no pickle, tokenizer files."""

from __future__ import annotations

import json
import logging

import pytest
import tokenizers
import torch
import transformers
from safetensors.torch import load_file, save_file

from model import (
    BertConfig,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from model.hf import load_hf, save_hf

HF_CLASSES = {
    BertModel: transformers.BertModel,
    BertForPreTraining: transformers.BertForPreTraining,
    BertForSequenceClassification: transformers.BertForSequenceClassification,
    BertForTokenClassification: transformers.BertForTokenClassification,
    BertForQuestionAnswering: transformers.BertForQuestionAnswering,
}


def tiny_cfg(**kw) -> BertConfig:
    return BertConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=16,
        **kw,
    )


def inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 60, (2, 10), generator=g)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 6:] = 0
    return ids, torch.zeros_like(ids), mask


def randomise(model: torch.nn.Module) -> None:
    torch.manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)


def test_minilm_into_heads_reports_only_new_head_weights(minilm_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="model.hf"):
        m = load_hf(minilm_dir, BertForSequenceClassification, num_labels=6, id2label={i: f"c{i}" for i in range(6)})
    assert m.load_report == {"missing": ["classifier.bias", "classifier.weight"], "unexpected": []}
    assert "classifier.weight" in caplog.text
    assert m.classifier.weight.shape == (6, 384) and m.config.id2label[5] == "c5"
    ref = load_hf(minilm_dir)
    torch.testing.assert_close(m.bert.embeddings.word_embeddings.weight, ref.embeddings.word_embeddings.weight)
    # Token/QA heads have no pooler (as transformers): MiniLM's pooler is not reported as unexpected.
    tok = load_hf(minilm_dir, BertForTokenClassification, num_labels=5)
    assert tok.load_report == {"missing": ["classifier.bias", "classifier.weight"], "unexpected": []}


def test_strict_names_the_missing_weights(minilm_dir):
    with pytest.raises(ValueError, match="classifier.weight"):
        load_hf(minilm_dir, BertForSequenceClassification, strict=True)


def test_prefixed_checkpoint_into_bare_model_reports_head_weights(tmp_path):
    pre = BertForPreTraining(tiny_cfg())
    randomise(pre)
    save_hf(pre, tmp_path)
    bare = load_hf(tmp_path, "BertModel")
    assert bare.load_report["missing"] == []
    assert "cls.predictions.bias" in bare.load_report["unexpected"]
    assert all(k.startswith("cls.") for k in bare.load_report["unexpected"])
    torch.testing.assert_close(bare.encoder.layer[1].output.dense.weight, pre.bert.encoder.layer[1].output.dense.weight)


@pytest.mark.parametrize("cls", list(HF_CLASSES), ids=lambda c: c.__name__)
def test_save_hf_loads_in_transformers_without_missing_weights(cls, tmp_path):
    cfg = tiny_cfg(num_labels=2, id2label={0: "no", 1: "yes"})
    ours = cls(cfg).eval()
    randomise(ours)
    save_hf(ours, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [cls.__name__] and config["label2id"] == {"no": 0, "yes": 1}
    ref, info = HF_CLASSES[cls].from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ref.eval()
    ids, tt, mask = inputs()
    with torch.no_grad():
        a, b = ours(ids, tt, mask), ref(input_ids=ids, token_type_ids=tt, attention_mask=mask)
    real = mask.bool()
    if cls is BertModel:
        torch.testing.assert_close(a.last_hidden_state[real], b.last_hidden_state[real], rtol=0, atol=1e-5)
    elif cls is BertForPreTraining:
        torch.testing.assert_close(a.mlm_logits[real], b.prediction_logits[real], rtol=0, atol=1e-5)
        torch.testing.assert_close(a.nsp_logits, b.seq_relationship_logits, rtol=0, atol=1e-5)
    elif cls is BertForQuestionAnswering:
        torch.testing.assert_close(a.start_logits[real], b.start_logits[real], rtol=0, atol=1e-5)
    else:
        torch.testing.assert_close(
            a.logits[real] if a.logits.dim() == 3 else a.logits,
            b.logits[real] if b.logits.dim() == 3 else b.logits,
            rtol=0,
            atol=1e-5,
        )
    # AutoModel reads the same directory without remote code.
    auto = transformers.AutoModel.from_pretrained(tmp_path)
    assert type(auto) is transformers.BertModel


def test_round_trip_through_transformers_pretraining_and_back(tmp_path):
    ours = BertForPreTraining(tiny_cfg()).eval()
    randomise(ours)
    save_hf(ours, tmp_path / "ours")
    ref = transformers.BertForPreTraining.from_pretrained(tmp_path / "ours").eval()
    # transformers ties its decoder to our embeddings on load.
    assert torch.equal(ref.cls.predictions.decoder.weight, ours.bert.embeddings.word_embeddings.weight)
    ref.save_pretrained(tmp_path / "theirs")
    back = load_hf(tmp_path / "theirs", BertForPreTraining, strict=True).eval()
    ids, tt, mask = inputs()
    with torch.no_grad():
        a = ours(ids, tt, mask)
        b = ref(input_ids=ids, token_type_ids=tt, attention_mask=mask)
        c = back(ids, tt, mask)
    torch.testing.assert_close(a.mlm_logits, b.prediction_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(c.mlm_logits, a.mlm_logits, rtol=0, atol=0)
    # Tied after load: the decoder is the loaded embedding matrix.
    h = back.cls.predictions.transform(back.bert(ids, tt, mask).last_hidden_state)
    want = h @ back.bert.embeddings.word_embeddings.weight.T + back.cls.predictions.bias
    torch.testing.assert_close(c.mlm_logits, want.detach(), rtol=0, atol=1e-5)


def test_pytorch_model_bin_with_old_names_and_no_pickle(tmp_path):
    ours = BertForPreTraining(tiny_cfg())
    randomise(ours)
    sd = {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in ours.state_dict().items()
    }
    sd["cls.predictions.decoder.weight"] = ours.bert.embeddings.word_embeddings.weight.detach().clone()
    sd["bert.embeddings.position_ids"] = torch.arange(16)[None]
    (tmp_path / "config.json").write_text(json.dumps(ours.config.to_hf_dict(["BertForPreTraining"])))
    torch.save(sd, tmp_path / "pytorch_model.bin")
    back = load_hf(tmp_path, BertForPreTraining, strict=True)
    for k, v in ours.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    # An arbitrary pickled object is refused (weights_only=True), not executed.
    torch.save({"x": torch.nn.Linear(2, 2)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(Exception, match="[Ww]eights only"):
        load_hf(tmp_path, BertForPreTraining)


def test_missing_files_and_bad_shapes_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf(tmp_path)
    save_hf(BertModel(tiny_cfg()), tmp_path)
    with pytest.raises(ValueError, match="shape mismatch.*word_embeddings"):
        load_hf(tmp_path, vocab_size=61)


def test_plain_state_dict_saves_with_safetensors_save_file(tmp_path):
    """The training loop saves model.state_dict() with save_file: no shared tensors, tie survives reload."""
    model = BertForPreTraining(tiny_cfg())
    randomise(model)
    save_file(model.state_dict(), str(tmp_path / "m.safetensors"))
    fresh = BertForPreTraining(tiny_cfg())
    fresh.load_state_dict(load_file(str(tmp_path / "m.safetensors")), strict=True)
    ids, tt, mask = inputs()
    with torch.no_grad():
        torch.testing.assert_close(fresh.eval()(ids).mlm_logits, model.eval()(ids).mlm_logits, rtol=0, atol=0)


def test_tokenizer_files_are_written(minilm_dir, tmp_path):
    model = BertModel(tiny_cfg())
    save_hf(model, tmp_path / "from_dir", tokenizer=minilm_dir)
    assert (tmp_path / "from_dir" / "vocab.txt").read_text() == (minilm_dir / "vocab.txt").read_text()
    assert (tmp_path / "from_dir" / "tokenizer.json").is_file()
    tok = tokenizers.Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    save_hf(model, tmp_path / "from_obj", tokenizer=tok)
    assert (tmp_path / "from_obj" / "vocab.txt").read_text() == (minilm_dir / "vocab.txt").read_text()
    again = tokenizers.Tokenizer.from_file(str(tmp_path / "from_obj" / "tokenizer.json"))
    assert again.encode("Hello world").ids == tok.encode("Hello world").ids
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "from_obj")  # a usable transformers dir
    assert auto("Hello world")["input_ids"] == [101, 7592, 2088, 102]
    save_hf(model, tmp_path / "from_file", tokenizer=minilm_dir / "vocab.txt")
    assert sorted(p.name for p in (tmp_path / "from_file").iterdir()) == [
        "config.json",
        "model.safetensors",
        "vocab.txt",
    ]
