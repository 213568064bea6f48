"""What data a run trained on, as MLflow 3 shows it: `mlflow.log_input`'s datasets (the run page's Datasets panel).

A pretraining run logs the prepared data of each phase with context `training`, and its held-out shards (the last
`train.num_eval_shards`) with context `eval`; a fine-tuning run logs its task files the same way. Each dataset
carries:

- a name: the prepared directory's base name (`tiny`), with `-phase<N>` for later phases and `-heldout` for the
  evaluation shards; a task file's name;
- a digest: the manifest's sha256, cut to the 36 characters MLflow's stores keep (the registry tag
  `data_manifest_sha256` holds the whole of it; the profile repeats it); a task file's own sha256, cut alike;
- the source: where the data lives (a path or an s3:// URI), as MLflow's dataset sources say it;
- the schema: the shards' columns (DESIGN.md) as an MLflow schema;
- a profile: documents, examples, tokens, shards, the dedup counts.

In a mixture (`data.sources`) each source is an input of its own as well (`source_datasets`), with its weight.

Why a `Dataset` subclass: `mlflow.data.meta_dataset.MetaDataset` has a schema but no profile, and the pandas or
Hugging Face datasets would load the shards to compute what the manifest already says.
"""

from __future__ import annotations

import json
import posixpath
import warnings
from typing import Any

from mlflow.data.dataset import Dataset
from mlflow.data.dataset_source_registry import resolve_dataset_source
from mlflow.entities import DatasetInput, InputTag
from mlflow.types import ColSpec, DataType, Schema
from mlflow.types.schema import Array

DIGEST_CHARS = 36  # MLflow's datasets.digest column (mlflow.utils.validation.MAX_DATASET_DIGEST_SIZE)
CONTEXT_TAG = "mlflow.data.context"  # what the UI shows as the dataset's context (mlflow.tracking.context)


class PreparedData(Dataset):
    """Data described by what is known of it (digest, schema, profile), never loaded: the prepared shards' manifest
    or a task file."""

    def __init__(self, source: str, name: str, digest: str, schema: Schema | None, profile: dict[str, Any]) -> None:
        self._schema, self._profile = schema, profile
        with warnings.catch_warnings():  # "can be interpreted in multiple ways": two local sources, the same one
            warnings.simplefilter("ignore", UserWarning)
            resolved = resolve_dataset_source(source)
        super().__init__(source=resolved, name=name, digest=digest[:DIGEST_CHARS])

    def _compute_digest(self) -> str:  # the digest is always given
        raise NotImplementedError

    @property
    def schema(self) -> Schema | None:
        return self._schema

    @property
    def profile(self) -> dict[str, Any]:
        return self._profile

    def to_dict(self) -> dict[str, str]:
        config = super().to_dict()
        if self._schema is not None:
            config["schema"] = json.dumps({"mlflow_colspec": self._schema.to_dict()})
        config["profile"] = json.dumps(self._profile)
        return config


def _mlflow_type(t) -> DataType | Array:
    """A pyarrow type as MLflow's: ints up to 32 bits `integer`, 64 `long`, lists `Array`.

    >>> import pyarrow as pa; _mlflow_type(pa.list_(pa.int32())), _mlflow_type(pa.int64())
    (Array(integer), long)
    """
    import pyarrow as pa

    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return Array(_mlflow_type(t.value_type))
    if pa.types.is_integer(t):
        return DataType.long if t.bit_width == 64 else DataType.integer
    if pa.types.is_floating(t):
        return DataType.double if t.bit_width == 64 else DataType.float
    if pa.types.is_boolean(t):
        return DataType.boolean
    return DataType.string


def shard_schema(arrow_schema) -> Schema:
    """The shards' pyarrow schema as an MLflow schema (column names and types, in order)."""
    return Schema([ColSpec(_mlflow_type(f.type), f.name) for f in arrow_schema])


def dataset_name(output: str, phase: int = 0) -> str:
    """The name a phase's prepared data goes by in MLflow: its directory's base name, `-phase<N>` after the first.

    >>> dataset_name("s3://bucket/data/tiny/"), dataset_name("data/tiny-64", 1)
    ('tiny', 'tiny-64-phase1')
    """
    base = posixpath.basename(output.rstrip("/")) or "data"
    return base if phase == 0 else f"{base}-phase{phase}"


def prepared_datasets(ds, *, phase: int, num_eval_shards: int, arrow_schema) -> list[tuple[PreparedData, str]]:
    """(dataset, context) for one phase's prepared data (`pipeline.data.dataset.PreparedDataset`): its training
    shards, and its held-out ones (the last `num_eval_shards`). `documents` and `tokens` are the prepared data's;
    `examples` and `shards` the context's own."""
    m = ds.manifest
    name = dataset_name(ds.output, phase)
    held = ds.shards[len(ds.shards) - num_eval_shards :] if num_eval_shards > 0 else ()
    train = ds.shards[: len(ds.shards) - len(held)]
    common = {
        "documents": m["documents_written"],
        "tokens": m["tokens"],
        "manifest_sha256": ds.manifest_sha256,
        "vocab_sha256": ds.vocab_sha256,
        "max_seq_length": m["config"].get("max_seq_length"),
    }
    profile = {
        **common,
        "examples": sum(rows for _, rows in train),
        "shards": len(train),
        "duplicates_exact": m.get("duplicates", {}).get("exact", 0),
        "duplicates_near": m.get("duplicates", {}).get("near", 0),
    }
    schema = shard_schema(arrow_schema)
    out = [(PreparedData(ds.output, name, ds.manifest_sha256, schema, profile), "training")]
    if held:
        eval_profile = {
            **common,
            "examples": sum(rows for _, rows in held),
            "shards": len(held),
            "shard_files": [posixpath.basename(p) for p, _ in held],
        }
        out.append((PreparedData(ds.output, f"{name}-heldout", ds.manifest_sha256, schema, eval_profile), "eval"))
    return out


Logged = tuple[PreparedData, str] | tuple[PreparedData, str, dict[str, str]]
"""A dataset to log: (dataset, context) or (dataset, context, more input tags)."""


def source_datasets(ds, sources: list[dict[str, Any]], *, phase: int, arrow_schema) -> list[Logged]:
    """(dataset, context, tags) for each source of a phase's mixture (issue 58): `<name>[<source>]`, its text's
    first input as the source, a digest of the manifest's and the source's name, and a profile of what it holds
    (the manifest's counts) and what the run draws of it (`sources`: `pipeline.pretrain.mixture.Mixture.describe`
    with the source's `weight` and `epochs` given); its weight and the epochs the phase reads of it are also tags.

    >>> from types import SimpleNamespace as NS
    >>> ds = NS(output="/d/tiny", manifest_sha256="f" * 64, manifest={"sources": [{"name": "wiki", "inputs": ["/w"],
    ...          "documents": 3, "tokens": 90}]})
    >>> [(d.name, ctx, tags) for d, ctx, tags in source_datasets(ds, [{"name": "wiki", "weight": 1, "epochs": 2.5}],
    ...                                                          phase=0, arrow_schema=None)]
    [('tiny[wiki]', 'training', {'mixture.weight': '1', 'mixture.epochs': '2.5'})]
    """
    import hashlib

    held = {s["name"]: s for s in ds.manifest.get("sources", [])}
    schema = shard_schema(arrow_schema) if arrow_schema is not None else None
    out = []
    for s in sources:
        m = held[s["name"]]
        digest = hashlib.sha256(f"{ds.manifest_sha256}:{s['name']}".encode()).hexdigest()
        profile = {
            "documents": m["documents"],
            "tokens": m["tokens"],
            "inputs": m["inputs"],
            "manifest_sha256": ds.manifest_sha256,
            **{k: v for k, v in s.items() if k != "name"},
        }
        data = PreparedData(m["inputs"][0], f"{dataset_name(ds.output, phase)}[{s['name']}]", digest, schema, profile)
        weight = s.get("weight")
        out.append(
            (
                data,
                "training",
                {"mixture.weight": "" if weight is None else f"{weight:g}", "mixture.epochs": f"{s['epochs']:.4g}"},
            )
        )
    return out


def log_datasets(client, run_id: str, datasets: list[Logged]) -> None:
    """Log each (dataset, context[, more tags]) as an input of the run, in one call."""

    def tags(d: Logged) -> list[InputTag]:
        return [InputTag(CONTEXT_TAG, d[1]), *(InputTag(k, v) for k, v in (d[2] if len(d) > 2 else {}).items())]

    client.log_inputs(run_id, datasets=[DatasetInput(d[0]._to_mlflow_entity(), tags=tags(d)) for d in datasets])
