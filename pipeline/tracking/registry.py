"""The MLflow Model Registry: a transformers-format directory registered as a version with lineage tags and a
description, the alias moved to it; `models:/name@alias` and `models:/name/version` resolved and downloaded
(`fetch_registered`, the one resolver fine-tuning's `--model` and pretraining's `model.init` share)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException

from pipeline.tracking.server import TrackingError, client, redact, tracking_uri


def register_hf_model(
    local_dir: str,
    name: str,
    alias: str | None,
    tags: dict[str, Any],
    run_id: str,
    artifact_path: str = "model",
    description: str | None = None,
) -> str:
    """Log a transformers-format directory as run artifacts, register it as a new version of `name` (with a
    description, if given), move `alias`. Returns the new version number as a string.
    """
    c = client()
    if not (Path(local_dir) / "config.json").is_file():
        raise TrackingError(f"{local_dir} is not a transformers model directory (no config.json)")
    c.log_artifacts(run_id, local_dir, artifact_path)
    try:
        c.get_registered_model(name)
    except MlflowException:
        try:
            c.create_registered_model(name)
        except MlflowException:  # created concurrently
            c.get_registered_model(name)
    source = f"{c.get_run(run_id).info.artifact_uri.rstrip('/')}/{artifact_path}"
    tags = {k: str(v) for k, v in tags.items()}
    mv = c.create_model_version(
        name, source=source, run_id=run_id, tags=tags, description=description, await_creation_for=60
    )
    if alias:
        c.set_registered_model_alias(name, alias, mv.version)
    return str(mv.version)


def find_version(name: str, run_id: str, uri: str | None = None) -> str | None:
    """The newest version of registered model `name` in the store at `uri` whose `run_id` tag is `run_id`."""
    c = client(uri)
    try:
        versions = c.search_model_versions(f"name = '{name}' and tags.run_id = '{run_id}'")
    except MlflowException:
        return None
    return str(max(int(v.version) for v in versions)) if versions else None


def write_tokenizer_config(
    model_dir: str, *, model_max_length: int, lowercase: bool, special_tokens: dict[str, str] | None = None
) -> None:
    """tokenizer_config.json + special_tokens_map.json, so `AutoTokenizer` loads the right class, case, length and
    special tokens: `special_tokens` {role: token} (cls, sep, pad, mask, unk: `pipeline.data.specials.Specials`),
    BERT's when None; a role the tokenizer lacks (a byte-level BPE's unk) is left out.

    A WordPiece vocabulary loads as BertTokenizer(Fast); a byte-level BPE or Unigram tokenizer.json (data.tokenizer
    bpe | unigram, or a given one) as PreTrainedTokenizerFast, which takes the tokenizer.json as it is (normalizer,
    template)."""
    import json

    roles = special_tokens or {"unk": "[UNK]", "sep": "[SEP]", "pad": "[PAD]", "cls": "[CLS]", "mask": "[MASK]"}
    special = {f"{r}_token": roles[r] for r in ("unk", "sep", "pad", "cls", "mask") if roles.get(r)}
    tj = Path(model_dir) / "tokenizer.json"
    kind = (json.loads(tj.read_text(encoding="utf-8")).get("model") or {}).get("type") if tj.is_file() else "WordPiece"
    cls = (
        ("BertTokenizerFast" if tj.is_file() else "BertTokenizer") if kind == "WordPiece" else "PreTrainedTokenizerFast"
    )
    cfg = {"tokenizer_class": cls, "do_lower_case": lowercase, "model_max_length": model_max_length, **special}
    (Path(model_dir) / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (Path(model_dir) / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def version_description(
    name: str,
    *,
    data: dict[str, Any],
    steps: int,
    final_eval: dict[str, float],
    command: str,
    init: str | None = None,
    architecture: str = "BERT",
) -> str:
    """The Markdown a registered version carries: its architecture, data, steps, final accuracy, command, how to
    load it, and (`init`, e.g. "models:/bert-pretrain/3 (weights sha256 0123abcd...)") what it continued from.

    >>> d = {"documents": 1, "tokens": 10, "examples": 2}
    >>> version_description("m", data=d, steps=5, final_eval={}, command="c", architecture="ModernBERT").split(" for")[0]
    'ModernBERT pretrained'
    """  # noqa: E501
    acc = ", ".join(f"{k.rsplit('/', 1)[-1]} {v:.4f}" for k, v in final_eval.items() if k.endswith("accuracy"))
    start = f"Continued from {init}: pretrained" if init else f"{architecture} pretrained"
    return "\n".join(
        [
            f"{start} for {steps} steps on {data.get('documents', '?')} documents "
            f"({data.get('tokens', '?'):,} tokens, {data.get('examples', '?'):,} examples; data manifest sha256 "
            f"`{str(data.get('manifest_sha256', ''))[:16]}`"
            + (f"; the run's dataset `{data['dataset']}`" if data.get("dataset") else "")
            + ").",
            "",
            f"Final held-out evaluation: {acc or 'n/a'}.",
            "",
            f"Produced by: `{command}`",
            "",
            "Load it: `mlflow artifacts download -u models:/" + name + "/<version> -d model/` then "
            "`transformers.AutoModel.from_pretrained('model/')`, or fine-tune it with "
            f"`python jobs/finetune.py --model models:/{name}/<version> ...`.",
        ]
    )


def _parse_models_uri(uri: str) -> tuple[str, str | None, str | None]:
    """`models:/name@alias` -> (name, None, alias); `models:/name/3` -> (name, "3", None).

    >>> _parse_models_uri("models:/bert-pretrain@latest-pretrain")
    ('bert-pretrain', None, 'latest-pretrain')
    >>> _parse_models_uri("models:/bert-pretrain/3")
    ('bert-pretrain', '3', None)
    """
    if not uri.startswith("models:/"):
        raise TrackingError(f"{uri!r} is not a models:/name@alias or models:/name/version URI")
    rest = uri[len("models:/") :].strip("/")
    if "@" in rest:
        name, alias = rest.split("@", 1)
        return name, None, alias
    name, _, version = rest.rpartition("/")
    if not name or not version:
        raise TrackingError(f"{uri!r} is not a models:/name@alias or models:/name/version URI")
    return name, version, None


def model_version_info(uri: str) -> dict[str, Any]:
    """{name, version, run_id, tags, source} of a registered version given as `models:/name@alias` or `/version`."""
    name, version, alias = _parse_models_uri(uri)
    c = client()
    try:
        mv = c.get_model_version_by_alias(name, alias) if alias else c.get_model_version(name, version)
    except MlflowException as e:
        raise TrackingError(
            redact(f"{uri} not found in the registry at {c.tracking_uri}: {e.message.splitlines()[0]}")
        ) from None
    return {
        "name": mv.name,
        "version": str(mv.version),
        "run_id": mv.run_id,
        "tags": dict(mv.tags),
        "source": mv.source,
    }


def download_model(uri: str, dst: str | None = None) -> str:
    """Download a registered version's files; returns the local directory that holds config.json."""
    info = model_version_info(uri)
    # Always a fresh copy: for a local store MLflow would otherwise hand back the registry's own directory.
    dst = dst or tempfile.mkdtemp(prefix=f"{info['name']}-v{info['version']}-")
    Path(dst).mkdir(parents=True, exist_ok=True)
    local = mlflow.artifacts.download_artifacts(
        artifact_uri=f"models:/{info['name']}/{info['version']}", dst_path=dst, tracking_uri=tracking_uri()
    )
    p = Path(local)
    if not (p / "config.json").is_file():
        found = sorted(p.rglob("config.json"))
        if not found:
            raise TrackingError(f"{uri} has no config.json in its artifacts ({local})")
        p = found[0].parent
    return str(p)


def fetch_registered(uri: str, download_dir: str | None) -> tuple[str, dict[str, str]]:
    """(local transformers directory, lineage tags) of a registered version given as `models:/name@alias` or
    `models:/name/version`, downloaded into `download_dir/<name>-v<version>` (a new temporary directory when
    None). The one resolver of registry sources: fine-tuning's `--model` and pretraining's `model.init`.
    The tags name the version (`source_model` with the number, not the alias) and its pretraining run."""
    info = model_version_info(uri)
    dst = os.path.join(download_dir, f"{info['name']}-v{info['version']}") if download_dir else None
    local = download_model(f"models:/{info['name']}/{info['version']}", dst)
    tags = {
        "source_model": f"models:/{info['name']}/{info['version']}",
        "source_model_name": info["name"],
        "source_model_version": info["version"],
        # the pretraining run: its lineage tag when present, else the run that created the version
        "pretrain_run_id": info["tags"].get("run_id") or info.get("run_id") or "",
    }
    for k in ("config_hash", "data_manifest_sha256", "vocab_sha256", "git_sha"):
        if k in info["tags"]:
            tags[f"source_{k}"] = info["tags"][k]
    return local, tags
