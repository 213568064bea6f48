"""Continued pretraining (`model.init`): start from an existing checkpoint instead of random weights.

`resolve_init(cfg)` runs on the driver before any work. It finds the checkpoint (a `models:/` version through
`pipeline.tracking.fetch_registered`, the resolver fine-tuning uses too, or a transformers directory), then:

- architecture: the checkpoint's config.json, BERT's or ModernBERT's (its `model_type`). A `model.preset` or
  `model.overrides` that contradicts it is an error naming both values (`model.preset base: hidden_size 768 != 384
  in <SRC>/config.json`), a preset of the other family too; one that agrees, or none (`preset: null`), is fine.
  Non-architecture overrides (dropout) apply on top.
- vocabulary: the checkpoint's tokenizer.json (else vocab.txt) becomes `data.vocab` unless `data.vocab` already
  names a file with the same bytes; `data.lowercase` follows the checkpoint's tokenizer (tokenizer.json's
  normalizer, else tokenizer_config.json's do_lower_case).
- lineage: the sha256 of the weights file, which joins the run identity and the registry tags.

`load_initial` builds the `BertForPreTraining` (or `ModernBertForMaskedLM`) a worker starts from: the checkpoint's
MLM/NSP heads when it has them, else fresh ones (the MLM decoder is structurally tied to the word embeddings, so a
fresh MLM head is only its transform and bias). Every rank seeds the same way first, so fresh heads are identical across
ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import Config, ConfigError, phase_data_configs
from pipeline.config.sections import _check

# The config fields that decide the shapes and the function of the weights, which must match the checkpoint, are
# each family's `shape_fields` (`model.family`).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


@dataclass(frozen=True)
class InitCheckpoint:
    """A resolved `model.init`: where its files are on this machine and what the lineage records."""

    spec: str
    """`model.init` as given (URI or path): the `init_model` tag."""
    local_dir: str
    """The transformers directory the workers load: `spec` itself, the download of a `models:/` version under
    `<train.storage_path>/init/`, or with a storage URI its copy there (`load_initial` reads a local copy)."""
    weights_sha256: str
    """sha256 of the weights file (`init_model_sha256`; part of the run identity)."""
    heads: str
    """What the checkpoint holds besides the encoder: "mlm+nsp", "mlm" or "none"."""
    source_tags: dict[str, str] = field(default_factory=dict)
    """fetch_registered's tags for a `models:/` version (source_model = the version number, not the alias)."""
    family: str = "bert"
    """config.json's model_type, a `model.family` name ("bert", "modernbert"): whether the model has an NSP head."""

    @property
    def tags(self) -> dict[str, str]:
        return {"init_model": self.spec, "init_model_sha256": self.weights_sha256}

    def describe(self) -> str:
        """One line for the console: where the weights come from and what happened to the heads.

        >>> InitCheckpoint("/m", "/m", "ab" * 32, "none").describe()
        '[init] /m (weights sha256 abababababab): encoder loaded; no MLM head in it, a fresh MLM head tied to its word embeddings (and a fresh NSP head)'
        """  # noqa: E501
        from model.family import family_of

        nsp = family_of(self.family).nsp
        what = {
            "mlm+nsp": "encoder, MLM and NSP heads loaded",
            "mlm": "encoder and MLM head loaded" + ("; a fresh NSP head" if nsp else ""),
            "none": "encoder loaded; no MLM head in it, a fresh MLM head tied to its word embeddings"
            + (" (and a fresh NSP head)" if nsp else ""),
        }
        src = (
            self.spec
            if self.spec == self.local_dir
            else f"{self.spec} ({self.source_tags.get('source_model', self.local_dir)})"
        )
        return f"[init] {src} (weights sha256 {self.weights_sha256[:12]}): {what[self.heads]}"


def weights_file(model_dir: str | Path) -> Path:
    """The file that holds a transformers directory's weights (what `model.hf.read_state_dict` reads first)."""
    for name in WEIGHT_FILES:
        if (Path(model_dir) / name).is_file():
            return Path(model_dir) / name
    raise ConfigError(f"model.init {model_dir}: no {', '.join(WEIGHT_FILES)}")


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def heads_in(model_dir: str | Path) -> str:
    """ "mlm+nsp", "mlm" or "none": which pretraining heads a checkpoint's weights hold (names only, no tensors)."""
    from model.hf import read_state_dict

    path = weights_file(model_dir)
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
    elif path.name.endswith(".index.json"):
        keys = set(json.loads(path.read_text())["weight_map"])
    else:
        keys = set(read_state_dict(path))
    mlm = any(k.startswith(("cls.predictions.transform.", "head.")) for k in keys)  # BERT's, ModernBERT's
    nsp = any(k.startswith("cls.seq_relationship.") for k in keys)
    return "mlm+nsp" if mlm and nsp else "mlm" if mlm else "none"


def checkpoint_config(model_dir: str | Path) -> dict[str, Any]:
    """The checkpoint's config.json as our BertConfig's or ModernBertConfig's fields (by its model_type;
    transformers' extra keys dropped)."""
    from model.family import family_of
    from model.hf import checkpoint_model_type

    cls = family_of(checkpoint_model_type(model_dir)).config_class
    cfg = cls.from_hf_dict(json.loads((Path(model_dir) / "config.json").read_text()))
    out = dataclasses.asdict(cfg)
    for k in ("num_labels", "id2label", "problem_type", "classifier_dropout"):  # task-head fields
        out.pop(k, None)
    return out


def check_architecture(preset: str | None, overrides: dict[str, Any], ckpt: dict[str, Any], where: str) -> None:
    """Refuse (one line naming both values) a preset or override that contradicts the checkpoint's config.

    >>> check_architecture("mini", {}, {"hidden_size": 384, "num_hidden_layers": 6}, "/m/config.json")
    Traceback (most recent call last):
    ...
    pipeline.config.sections.ConfigError: model.preset mini: hidden_size 256 != 384 in /m/config.json
    >>> check_architecture(None, {"hidden_dropout_prob": 0.0}, {"hidden_size": 384}, "/m/config.json")
    >>> check_architecture("tiny", {}, {"hidden_size": 128, "local_attention": 128}, "/m/config.json")
    Traceback (most recent call last):
    ...
    pipeline.config.sections.ConfigError: model.preset tiny is BERT, /m/config.json is ModernBERT: choose a modernbert-* preset or null
    """  # noqa: E501
    from os.path import commonprefix

    from model.family import encoder_config
    from model.family import family_of

    theirs = family_of(ckpt)
    arch = theirs.shape_fields
    for k in arch:
        if k in overrides and k in ckpt and overrides[k] != ckpt[k] and k != "vocab_size":
            raise ConfigError(f"model.overrides {k}: {overrides[k]} != {ckpt[k]} in {where}")
    if preset is not None:
        if (ours := family_of(preset)) is not theirs:
            common = commonprefix(list(theirs.presets))  # "modernbert-": its presets are named by it
            hint = f"a {common}*" if common.endswith("-") else f"a {theirs.architecture}"
            raise ConfigError(
                f"model.preset {preset} is {ours.architecture}, {where} is {theirs.architecture}: "
                f"choose {hint} preset or null"
            )
        mine = dataclasses.asdict(encoder_config(preset, **{k: v for k, v in overrides.items() if k in arch}))
        for k in arch:
            if k != "vocab_size" and k in ckpt and mine[k] != ckpt[k]:
                raise ConfigError(f"model.preset {preset}: {k} {mine[k]} != {ckpt[k]} in {where}")


def tokenizer_files(model_dir: str | Path) -> tuple[Path, bool]:
    """(the vocabulary file data preparation should use, lowercase) of a checkpoint: tokenizer.json when present
    (its normalizer's lowercase flag), else vocab.txt (tokenizer_config.json's do_lower_case, default true)."""
    d = Path(model_dir)
    tok_cfg = d / "tokenizer_config.json"
    lower_cfg = json.loads(tok_cfg.read_text()).get("do_lower_case") if tok_cfg.is_file() else None
    if (d / "tokenizer.json").is_file():
        norm = json.loads((d / "tokenizer.json").read_text()).get("normalizer") or {}
        lower = norm.get("lowercase") if norm.get("type") == "BertNormalizer" else None
        return d / "tokenizer.json", bool(lower if lower is not None else lower_cfg if lower_cfg is not None else True)
    _check((d / "vocab.txt").is_file(), f"model.init {model_dir}: no tokenizer.json or vocab.txt beside the weights")
    return d / "vocab.txt", bool(lower_cfg if lower_cfg is not None else True)


def _special_difference(given: str, theirs: Path, lowercase: bool) -> str:
    """`: its special tokens differ (mask <mask> vs [MASK])` when `given` holds the checkpoint's tokens in the same
    order but other special tokens; empty otherwise (another vocabulary altogether, or one not read here)."""
    from pipeline.data.specials import VocabError, specials
    from pipeline.data.tokenizer import load_tokenizer, vocab_list
    from pipeline.storage.io import is_uri

    if is_uri(given):
        return ""
    try:
        mine, ckpt = load_tokenizer(given, lowercase=lowercase), load_tokenizer(str(theirs), lowercase=lowercase)
        if vocab_list(mine) != vocab_list(ckpt):
            return ""
        a, b = ({**sp.tokens, "template": sp.template} for sp in (specials(mine), specials(ckpt)))
    except VocabError as e:
        return f": {e}"
    diff = [f"{r} {a.get(r)} vs {b.get(r)}" for r in sorted(set(a) | set(b)) if a.get(r) != b.get(r)]
    return f": the same tokens, but its special tokens differ ({', '.join(diff)})" if diff else ""


def check_prepared(outputs: list[str], vocab_sha256: str, spec: str) -> None:
    """Refuse (one line naming both) a prepared data directory whose vocabulary is not the checkpoint's: its ids
    would mean other words to the loaded embeddings. A directory not prepared yet passes."""
    from pipeline.storage.io import exists, join, read_json

    for out in outputs:
        if exists(join(out, "manifest.json")):
            had = read_json(join(out, "manifest.json")).get("vocab_sha256")
            _check(
                had == vocab_sha256,
                f"data.output {out} was prepared with vocabulary sha256 {str(had)[:12]}, "
                f"model.init {spec} has {vocab_sha256[:12]}; choose another data.output or "
                f"pass --data.overwrite true",
            )


def resolve_init(cfg: Config) -> tuple[Config, InitCheckpoint | None]:
    """(the config the job runs with, the checkpoint) for `model.init`; `(cfg, None)` without it.

    The returned config takes the architecture (model.overrides = the checkpoint's config plus the user's
    non-architecture overrides, preset as given), the vocabulary (data.vocab) and lowercasing (data.lowercase)
    from the checkpoint. Everything contradicting it is a ConfigError (one line), raised before any work.
    A `models:/` version is downloaded into `<train.storage_path>/init/<name>-v<version>` (shared storage on a
    multi-node cluster, where every worker reads it). With a storage URI (s3://...) it is downloaded into a
    temporary directory, checked there, copied to that place in the storage and the temporary copy removed.
    """
    spec = cfg.model.init
    if spec is None:
        return cfg, None
    from pipeline.storage.io import is_uri

    if spec.startswith("models:/") and is_uri(cfg.train.storage_path):
        import tempfile

        with tempfile.TemporaryDirectory(prefix="init-") as download:  # then copied to the storage, read from there
            return _resolve(cfg, *_fetch(spec, download), shared=cfg.train.storage_path)
    if spec.startswith("models:/"):
        return _resolve(cfg, *_fetch(spec, os.path.join(cfg.train.storage_path, "init")))
    return _resolve(cfg, spec, {})


def _fetch(spec: str, download: str) -> tuple[str, dict[str, str]]:
    from pipeline.tracking import fetch_registered

    try:
        return fetch_registered(spec, download)
    except Exception as e:  # noqa: BLE001 - one line for the user
        raise ConfigError(f"model.init {spec}: {str(e).splitlines()[0]}") from None


def _resolve(cfg: Config, local: str, source_tags: dict[str, str], shared: str | None = None):
    """resolve_init for a checkpoint in the local directory `local`; with `shared` (a storage URI) the checkpoint
    is copied to `<shared>/init/<its directory name>` and the workers and the data stage read it there."""
    spec = cfg.model.init
    if not spec.startswith("models:/"):
        local = spec
        _check(
            (Path(local) / "config.json").is_file(),
            f"model.init {spec}: not models:/name@alias, models:/name/version, or a directory with config.json",
        )
    where = f"{spec}/config.json" if not spec.startswith("models:/") else f"{spec} config.json"
    ckpt = checkpoint_config(local)
    from model.family import family_of
    from model.hf import checkpoint_model_type

    family = checkpoint_model_type(local)
    check_architecture(cfg.model.preset, cfg.model.overrides, ckpt, where)
    max_pos = ckpt["max_position_embeddings"]
    lengths = [cfg.data.max_seq_length] + [ph.max_seq_length for ph in cfg.train.phases]
    _check(
        max(lengths) <= max_pos, f"data.max_seq_length {max(lengths)} > max_position_embeddings {max_pos} in {where}"
    )

    vocab, lower = tokenizer_files(local)
    if cfg.data.vocab is not None:
        from pipeline.storage.io import read_bytes

        given, theirs = hashlib.sha256(read_bytes(cfg.data.vocab)).hexdigest(), sha256_file(vocab)
        other = Path(local) / ("vocab.txt" if vocab.name == "tokenizer.json" else "tokenizer.json")
        same = given == theirs or (other.is_file() and given == sha256_file(other))
        _check(
            same,
            f"data.vocab {cfg.data.vocab} (sha256 {given[:12]}) is not the vocabulary of model.init {spec} "
            f"({vocab}, sha256 {theirs[:12]}){'' if same else _special_difference(cfg.data.vocab, vocab, lower)}; "
            "leave data.vocab out to use the checkpoint's",
        )
    from pipeline.data.tokenizer import load_tokenizer, vocab_bytes

    tok = load_tokenizer(str(vocab), lowercase=lower)
    _check(
        tok.get_vocab_size() == ckpt["vocab_size"],
        f"model.init {spec}: its tokenizer has {tok.get_vocab_size()} "
        f"tokens but config.json's vocab_size is {ckpt['vocab_size']}",
    )

    arch = family_of(family).shape_fields
    keep = {k: v for k, v in cfg.model.overrides.items() if k not in arch}
    model = dataclasses.replace(cfg.model, overrides={**ckpt, **keep})
    data = dataclasses.replace(cfg.data, vocab=cfg.data.vocab or str(vocab), lowercase=lower)
    resolved = dataclasses.replace(cfg, model=model, data=data)
    if not cfg.data.overwrite:
        check_prepared(
            [d.output for d in phase_data_configs(resolved)], hashlib.sha256(vocab_bytes(tok)).hexdigest(), spec
        )
    init = InitCheckpoint(
        spec, str(Path(local).resolve()), sha256_file(weights_file(local)), heads_in(local), source_tags, family
    )
    if shared is not None:
        from pipeline.storage.io import filesystem, join

        remote = join(shared, "init", Path(local).name)
        fs, path = filesystem(remote)
        fs.put(local.rstrip("/") + "/", path, recursive=True)
        resolved = dataclasses.replace(
            resolved, data=dataclasses.replace(resolved.data, vocab=cfg.data.vocab or join(remote, vocab.name))
        )
        init = dataclasses.replace(init, local_dir=remote)
    return resolved, init


def load_initial(model_cfg, vocab_size: int, pad_token_id: int | None = None):
    """The `BertForPreTraining` (or `ModernBertForMaskedLM`) a run starts from: `model_cfg.init` is a local
    transformers directory here (the train stage hands the workers the resolved one). Missing heads keep their fresh
    initialisation, so call it after seeding, identically on every rank."""
    from model.build import load_model
    from pipeline.storage.io import is_uri

    if is_uri(model_cfg.init):  # a models:/ version copied to the run's storage (resolve_init): read a local copy
        import shutil

        from pipeline.storage.io import local_checkpoint_dir

        local = local_checkpoint_dir(model_cfg.init)
        try:
            return load_initial(dataclasses.replace(model_cfg, init=local), vocab_size, pad_token_id)
        finally:
            shutil.rmtree(local, ignore_errors=True)
    pad = {} if pad_token_id is None else {"pad_token_id": pad_token_id}  # the tokenizer's (its roles checked)
    model = load_model(model_cfg.init, "pretraining", **{**model_cfg.overrides, "vocab_size": vocab_size, **pad})
    heads = ("cls.", "bert.pooler.", "head.", "decoder.")  # BERT's MLM/NSP heads and pooler, ModernBERT's MLM head
    missing = [k for k in model.load_report["missing"] if not k.startswith(heads)]
    if missing:  # an encoder weight the checkpoint lacks would silently stay random
        raise ValueError(f"model.init {model_cfg.init}: the checkpoint lacks encoder weights {missing[:5]}")
    return model
