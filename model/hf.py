"""Load and save transformers-format BERT and ModernBERT directories (config.json + model.safetensors [+ tokenizer
files]).

`load_hf(dir, cls)` reads any transformers BERT checkpoint: safetensors (single file or sharded index) or
`pytorch_model.bin` via `torch.load(weights_only=True)` (never arbitrary unpickling). It maps the
base-model prefix both ways (a bare `BertModel` checkpoint such as MiniLM has no `bert.`; a
`BertFor*` checkpoint loaded into `BertModel` drops it), renames old TF-era `LayerNorm.gamma/beta`, and
folds transformers' tied `cls.predictions.decoder.*` keys into our structurally tied decoder. What is
still missing or unexpected is reported by name (`model.load_report`, a logging warning; `strict=True`
raises). `save_hf` writes exactly the key set transformers 5 itself writes for these classes, so
`transformers.AutoModel.from_pretrained(dir)` / `BertFor*.from_pretrained(dir)` load it without warnings.
ModernBERT goes the same way: config.json's model_type picks the family (`model.family`: its config class, its
base-model prefix, `model.` instead of `bert.`, and its tied decoder weight, folded into the token embeddings).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from model.bert import BertModel
from model.family import FAMILIES, family_of
from model.heads import BertForQuestionAnswering, BertForTokenClassification

log = logging.getLogger(__name__)


def model_classes() -> dict[str, type[torch.nn.Module]]:
    """Class name -> class, every registered family's (`model.family`): what `load_hf` and `save_hf` take."""
    return {name: cls for f in FAMILIES.values() for name, cls in f.classes().items()}


def checkpoint_model_type(path: str | Path) -> str:
    """A transformers directory's config.json `model_type` ("bert" when it names none), one of a registered family's."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} not found")
    model_type = json.loads(config_file.read_text()).get("model_type", "bert")
    if model_type not in FAMILIES:
        raise ValueError(f"{config_file}: model_type {model_type!r} is not one of {', '.join(FAMILIES)}")
    return model_type


# Keys transformers may hold that carry no information for us: tied copies (the decoder's weight: each family's
# `tied_decoder`) and non-persistent buffers.
_TIED_DECODER_BIAS = "cls.predictions.decoder.bias"
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Weights of a transformers directory (or a weights file) as a CPU state dict, without unpickling objects."""
    path = Path(path)
    if path.is_file():
        files = [path]
    elif (path / "model.safetensors").is_file():
        files = [path / "model.safetensors"]
    elif (path / "model.safetensors.index.json").is_file():
        index = json.loads((path / "model.safetensors.index.json").read_text())
        files = [path / f for f in sorted(set(index["weight_map"].values()))]
    elif (path / "pytorch_model.bin").is_file():
        files = [path / "pytorch_model.bin"]
    else:
        raise FileNotFoundError(f"{path}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        if f.suffix == ".safetensors":
            sd.update(load_file(str(f), device="cpu"))
        else:
            obj = torch.load(f, map_location="cpu", weights_only=True)
            if not isinstance(obj, dict):
                raise ValueError(f"{f}: expected a state dict, got {type(obj).__name__}")
            sd.update(obj)
    return sd


def convert_state_dict(sd: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Rename a transformers/old/wrapped BERT state dict to `model`'s key names (missing keys stay missing).

    >>> from model.config import BertConfig
    >>> m = BertModel(BertConfig.from_preset("tiny", vocab_size=10, num_hidden_layers=1))
    >>> sorted(convert_state_dict({"bert.pooler.dense.bias": torch.zeros(128)}, m))
    ['pooler.dense.bias']
    """
    target = model.state_dict()
    family = family_of(model)
    prefix, roots = family.prefix, family.roots
    has_prefix = any(k.startswith(prefix) for k in target)
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        for wrapper in ("module.", "_orig_mod."):  # DDP / torch.compile wrappers
            k = k.removeprefix(wrapper)
        if k.endswith(".gamma"):
            k = k[: -len("gamma")] + "weight"
        elif k.endswith(".beta"):
            k = k[: -len("beta")] + "bias"
        if has_prefix and k.startswith(roots):
            k = prefix + k
        elif not has_prefix and k.startswith(prefix):
            k = k.removeprefix(prefix)
        out[k] = v
    # transformers ties decoder.weight to the word embeddings and decoder.bias to cls.predictions.bias; we
    # keep one copy. An old checkpoint with only decoder.bias still provides the bias.
    bias = out.pop(_TIED_DECODER_BIAS, None)
    if bias is not None and "cls.predictions.bias" in target:
        out.setdefault("cls.predictions.bias", bias)
    dec = out.pop(family.tied_decoder, None)
    emb_key = (prefix if has_prefix else "") + family.word_embeddings
    if dec is not None and emb_key in out and not torch.equal(dec, out[emb_key]):
        log.warning(
            "checkpoint's %s differs from %s; this model ties them and keeps the embeddings",
            family.tied_decoder,
            emb_key,
        )
    for k in list(out):
        if k.endswith(_BUFFERS) and k not in target:
            del out[k]
    if isinstance(model, (BertForTokenClassification, BertForQuestionAnswering)):
        # These heads have no pooler (as in transformers, which ignores a checkpoint's pooler for them too).
        out = {k: v for k, v in out.items() if not k.startswith("bert.pooler.")}
    return out


def load_hf(
    path: str | Path, cls: type[torch.nn.Module] | str = BertModel, *, strict: bool = False, **config_overrides: Any
) -> torch.nn.Module:
    """Build `cls` from a transformers BERT or ModernBERT directory (its config.json's model_type must be `cls`'s);
    `config_overrides` (e.g. num_labels=6) beat config.json.

    `cls` is one of our classes or its name (e.g. config.json's `architectures[0]`). Weights the checkpoint
    lacks (e.g. a new classifier) keep BERT's initialisation; missing and unexpected names go to
    `model.load_report` and a warning, or raise ValueError with `strict=True`.
    """
    if isinstance(cls, str):
        classes = model_classes()
        if cls not in classes:
            raise ValueError(f"unknown model class {cls!r}; choose one of {', '.join(classes)}")
        cls = classes[cls]
    path = Path(path)
    model_type = checkpoint_model_type(path)
    config = json.loads((path / "config.json").read_text())
    if family_of(cls).name != model_type:
        raise ValueError(
            f"{path} holds a {model_type} model; {cls.__name__} is a {family_of(cls).name} class "
            f"(choose one of {', '.join(FAMILIES[model_type].classes())})"
        )
    model = cls(FAMILIES[model_type].config_class.from_hf_dict(config, **config_overrides))
    sd = convert_state_dict(read_state_dict(path), model)
    target = model.state_dict()
    missing = sorted(k for k in target if k not in sd)
    unexpected = sorted(k for k in sd if k not in target)
    bad_shape = sorted(
        f"{k}: checkpoint {tuple(sd[k].shape)} vs model {tuple(target[k].shape)}"
        for k in sd
        if k in target and sd[k].shape != target[k].shape
    )
    if bad_shape:
        raise ValueError(f"{path}: shape mismatch for {'; '.join(bad_shape)}")
    if strict and (missing or unexpected):
        raise ValueError(f"{path} into {cls.__name__}: missing weights {missing}, unexpected weights {unexpected}")
    model.load_state_dict({k: v for k, v in sd.items() if k in target}, strict=False)
    if missing or unexpected:
        log.warning(
            "%s into %s: newly initialised (missing) %s; unused (unexpected) %s",
            path,
            cls.__name__,
            missing,
            unexpected,
        )
    model.load_report = {"missing": missing, "unexpected": unexpected}
    return model


def save_hf(model: torch.nn.Module, path: str | Path, tokenizer: Any = None) -> Path:
    """Write a transformers directory: config.json, model.safetensors and, if given, the tokenizer files.

    `tokenizer` is a `tokenizers.Tokenizer` (written as tokenizer.json, plus vocab.txt for WordPiece) or a
    path to a directory/file holding vocab.txt and/or tokenizer.json (copied).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = getattr(model, "module", model)  # DDP wrapper
    model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
    name = type(model).__name__
    if name not in model_classes():
        raise TypeError(f"save_hf: {name} is not one of {', '.join(model_classes())}")
    config = model.config.to_hf_dict(architectures=[name])
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    # Contiguous CPU copies: safetensors refuses views/shared storage, and the decoder is tied structurally
    # (no duplicate key), so this is exactly transformers' own key set.
    sd = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    if tokenizer is not None:
        _save_tokenizer(tokenizer, path)
    return path


def _save_tokenizer(tokenizer: Any, path: Path) -> None:
    if isinstance(tokenizer, (str, Path)):
        src = Path(tokenizer)
        if src.is_dir():
            files = [src / f for f in TOKENIZER_FILES if (src / f).is_file()]
            if not any(f.name in ("vocab.txt", "tokenizer.json") for f in files):
                raise FileNotFoundError(f"{src}: no vocab.txt or tokenizer.json")
        elif src.is_file():
            files = [src]
        else:
            raise FileNotFoundError(f"tokenizer {src} not found")
        for f in files:
            if f.resolve() != (path / f.name).resolve():
                shutil.copyfile(f, path / f.name)
        return
    if not hasattr(tokenizer, "to_str"):
        raise TypeError(f"tokenizer must be a tokenizers.Tokenizer or a path, got {type(tokenizer).__name__}")
    (path / "tokenizer.json").write_text(tokenizer.to_str())
    model = json.loads(tokenizer.to_str()).get("model", {})
    if model.get("type") == "WordPiece":
        vocab = tokenizer.get_vocab()
        # vocab.txt lists tokens by id, one a line; ids must be 0..n-1 without gaps for it to mean anything.
        by_id = sorted(vocab, key=vocab.get)
        if [vocab[t] for t in by_id] == list(range(len(by_id))):
            (path / "vocab.txt").write_text("".join(t + "\n" for t in by_id))
