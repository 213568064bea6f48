"""A prepared dataset as one object: manifest + vocabulary + masking policy + shard files, read and checked once.

    >>> ds = PreparedDataset.load("data/prepared")          # doctest: +SKIP
    >>> ds.examples, ds.vocab_sha256[:8], ds.shards[0]      # doctest: +SKIP
    (21052, '3f1c...', ('data/prepared/shards/part-00000.parquet', 2632))

The shard format (DESIGN.md): `SCHEMA` below, with its optional columns (`shard_schema`); `manifest.json` holds
`MANIFEST_KEYS` at top level, shard paths relative to the output directory. `validate_output` is the stage-truth
check for data: keys, document accounting, the vocabulary's sha256, each shard's schema, rows and sha256. A shard
path that is absolute, a URI or leaves the output directory (`../x.parquet`) is a validation error: a manifest only
describes its own directory.
"""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.data.masking import MaskingPolicy
from pipeline.data.specials import Specials
from pipeline.data.tokenizer import read_vocab
from pipeline.errors import PipelineError
from pipeline.storage.io import StorageError, exists, filesystem, join, read_bytes, read_json, sha256_file

SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("token_type_ids", pa.list_(pa.int8())),
        ("masked_lm_positions", pa.list_(pa.int32())),
        ("masked_lm_ids", pa.list_(pa.int32())),
        ("next_sentence_label", pa.int8()),
        ("num_tokens", pa.int32()),
        ("example_id", pa.int64()),  # extension: identity for dynamic-masking seeds
    ]
)
# Extension (issue 33), only in shards of `data.pack_documents` (others keep their bytes): the lengths of the
# documents packed into each row, in order, summing to num_tokens. A shard without it holds a document a row.
PACKED_SCHEMA = SCHEMA.append(pa.field("doc_lengths", pa.list_(pa.int32())))
# Extension (issue 58), only in shards of a mixture (`data.sources`; others keep their bytes): the name of the source
# each row was built from (its first segment's: NSP's random B may come from another source).
SOURCE_FIELD = pa.field("source", pa.string())


def shard_schema(packed: bool = False, sourced: bool = False) -> pa.Schema:
    """The shards' schema: `SCHEMA`, then `doc_lengths` when documents are packed, then `source` in a mixture.

    >>> shard_schema(sourced=True).names[-2:]
    ['example_id', 'source']
    """
    schema = PACKED_SCHEMA if packed else SCHEMA
    return schema.append(SOURCE_FIELD) if sourced else schema


def schema_of(names: list[str]) -> pa.Schema:
    """The schema a shard with these column names must have (its optional columns by their presence)."""
    return shard_schema("doc_lengths" in names, SOURCE_FIELD.name in names)


MANIFEST_KEYS = (
    "documents_read",
    "documents_written",
    "documents_rejected",
    "rejected_reasons",
    "examples",
    "tokens",
    "masked_tokens",
    "nsp_random_fraction",
    "seconds",
    "config",
    "config_hash",
    "vocab_sha256",
    "shards",
)


class DataValidationError(PipelineError, ValueError):
    """A prepared dataset that fails its manifest's checks; the message names the file and the problem."""


def _confined(directory: str, rel: str, manifest_path: str) -> str:
    """`directory/rel` for a relative shard path that stays inside `directory`; else DataValidationError.

    >>> _confined("/d", "shards/a.parquet", "/d/manifest.json")
    '/d/shards/a.parquet'
    """
    norm = posixpath.normpath(rel)
    if "://" in rel or rel.startswith("/") or norm == ".." or norm.startswith("../"):
        raise DataValidationError(f"{manifest_path}: shard path {rel!r} is not a relative path inside {directory}")
    return join(directory, norm)


def read_manifest(directory: str) -> dict[str, Any]:
    """The manifest of a prepared dataset; raises DataValidationError naming what is missing or wrong."""
    directory = str(directory)
    path = join(directory, "manifest.json")
    if not exists(path):
        raise DataValidationError(f"{path} does not exist (not a prepared dataset, or preparation did not finish)")
    try:
        m = read_json(path)
    except StorageError as e:
        raise DataValidationError(str(e)) from None
    missing = [k for k in MANIFEST_KEYS if k not in m]
    if missing:
        raise DataValidationError(f"{path} lacks key(s) {', '.join(missing)}")
    for s in m["shards"]:
        _confined(directory, str(s["path"]), path)
    m["output"] = directory
    return m


def shard_paths(directory: str, manifest: dict[str, Any] | None = None) -> list[str]:
    manifest = manifest or read_manifest(directory)
    return [_confined(str(directory), s["path"], join(str(directory), "manifest.json")) for s in manifest["shards"]]


def validate_output(directory: str, *, checksums: bool = True) -> dict[str, Any]:
    """Check a prepared dataset: manifest keys, accounting, each shard's schema, rows and sha256, the vocab."""
    directory = str(directory)
    m = read_manifest(directory)
    if m["documents_read"] != m["documents_written"] + m["documents_rejected"]:
        raise DataValidationError(
            f"{directory}/manifest.json: documents_read != documents_written + documents_rejected"
        )
    vocab_path = join(directory, "vocab.txt")
    if not exists(vocab_path):
        raise DataValidationError(f"{vocab_path} does not exist")
    if checksums and hashlib.sha256(read_bytes(vocab_path)).hexdigest() != m["vocab_sha256"]:
        raise DataValidationError(f"{vocab_path}: sha256 differs from the manifest's vocab_sha256")
    if not m["shards"]:
        raise DataValidationError(f"{directory}/manifest.json lists no shard")
    rows = 0
    for s, path in zip(m["shards"], shard_paths(directory, m)):
        if not exists(path):
            raise DataValidationError(f"shard {path} listed in the manifest does not exist")
        fs, p = filesystem(path)
        try:
            with fs.open(p, "rb") as f:
                md = pq.ParquetFile(f)
                schema, n = md.schema_arrow, md.metadata.num_rows
        except (pa.ArrowInvalid, OSError) as e:
            raise DataValidationError(
                f"shard {path} is not a readable Parquet file ({str(e).splitlines()[0]})"
            ) from None
        for field in schema_of(schema.names):
            if field.name not in schema.names or schema.field(field.name).type != field.type:
                got = schema.field(field.name).type if field.name in schema.names else "missing"
                raise DataValidationError(f"shard {path}: column {field.name} is {got}, expected {field.type}")
        if n != s["rows"]:
            raise DataValidationError(f"shard {path}: {n} rows, the manifest says {s['rows']}")
        if checksums and sha256_file(path) != s["sha256"]:
            raise DataValidationError(f"shard {path}: sha256 differs from the manifest (corrupt or modified)")
        rows += n
    if rows != m["examples"]:
        raise DataValidationError(f"{directory}: shards hold {rows} rows, the manifest says {m['examples']} examples")
    return m


@dataclass(frozen=True)
class PreparedDataset:
    """What training needs of a prepared directory, read once on the driver and shipped to the workers."""

    output: str
    manifest: dict[str, Any]
    manifest_sha256: str
    vocab: tuple[str, ...]
    shards: tuple[tuple[str, int], ...]
    """(path or URI, rows) in manifest order."""

    @classmethod
    def load(cls, output: str, *, validate: bool = True) -> PreparedDataset:
        """Read (and by default fully validate: checksums, schema, rows) the dataset in `output`."""
        output = str(output)
        m = validate_output(output) if validate else read_manifest(output)
        manifest_sha = hashlib.sha256(read_bytes(join(output, "manifest.json"))).hexdigest()
        paths = shard_paths(output, m)
        return cls(
            output,
            m,
            manifest_sha,
            tuple(read_vocab(join(output, "vocab.txt"))),
            tuple((p, int(s["rows"])) for p, s in zip(paths, m["shards"])),
        )

    @property
    def config_hash(self) -> str:
        return self.manifest["config_hash"]

    @property
    def vocab_sha256(self) -> str:
        return self.manifest["vocab_sha256"]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def examples(self) -> int:
        return int(self.manifest["examples"])

    @property
    def tokens(self) -> int:
        return int(self.manifest["tokens"])

    @property
    def max_seq_length(self) -> int:
        return int(self.manifest["config"]["max_seq_length"])

    @property
    def dynamic_masking(self) -> bool:
        return self.manifest["config"].get("masking") == "dynamic"

    @property
    def sources(self) -> list[str]:
        """The mixture's source names, in `data.sources` order (empty for data prepared without sources)."""
        return [s["name"] for s in self.manifest.get("sources", [])]

    def source_counts(self, shards: tuple[str, ...]) -> dict[str, dict[str, int]]:
        """{source: {"rows", "tokens"}} summed over these of its shards (paths, as in `shards`): a mixture's
        training shards, say. Empty for data prepared without sources.

        >>> ds = PreparedDataset("d", {"sources": [{"name": "a"}], "shards": [{"source_rows": {"a": 3},
        ...     "source_tokens": {"a": 30}}]}, "", (), (("d/s0", 3),))
        >>> ds.source_counts(("d/s0",))
        {'a': {'rows': 3, 'tokens': 30}}
        """
        out = {name: {"rows": 0, "tokens": 0} for name in self.sources}
        entries = dict(zip((p for p, _ in self.shards), self.manifest["shards"]))
        for path in shards:
            for name in out:
                out[name]["rows"] += int(entries[path].get("source_rows", {}).get(name, 0))
                out[name]["tokens"] += int(entries[path].get("source_tokens", {}).get(name, 0))
        return out

    def policy(self, mask_rate: float | None = None) -> MaskingPolicy:
        """The masking policy the data was prepared with (dynamic masking applies it at load time); `mask_rate`
        replaces its rate (a phase's own, `train.phases[].mask_rate`)."""
        c = self.manifest["config"]
        rate = c["mask_rate"] if mask_rate is None else mask_rate
        return MaskingPolicy.from_vocab(
            list(self.vocab),
            mask_rate=rate,
            max_predictions_per_seq=c["max_predictions_per_seq"],
            whole_word=c["whole_word_mask"],
            specials=self.specials,
        )

    @property
    def specials(self) -> Specials:
        """The tokenizer's special tokens as the manifest records them (BERT's by name in older manifests)."""
        entry = (self.manifest.get("tokenizer") or {}).get("special_tokens")
        return Specials.from_dict(entry) if entry else Specials.bert(list(self.vocab))

    @property
    def pad_id(self) -> int:
        """The tokenizer's pad token id: the loader pads with it, the model's pad_token_id is it (0, BERT's, for a
        manifest without the tokenizer's roles and a vocabulary without [PAD])."""
        if not (self.manifest.get("tokenizer") or {}).get("special_tokens") and "[PAD]" not in self.vocab:
            return 0
        return self.specials.ids["pad"]

    def file(self, name: str) -> str:
        """Path of a file beside the shards (vocab.txt, tokenizer.json, manifest.json)."""
        return join(self.output, name)
