"""The driver of the three passes: plans their units, runs them on an executor, writes the manifest.

    files ─► [tokenize] ─► token chunks + pool candidates ─► pool ─► [examples] ─► example chunks ─► [shards]
          ─► shards/*.parquet ─► manifest.json

The pass bodies are in pipeline.data.passes, the executors (local processes or Ray actors, one interface) in
pipeline.data.executors. One planner makes the units for both: `tokenize_pass` reads a file of more than two
batches (`chunk_chars`) here and sends its batches to the workers as it reads them (one big file then keeps
every worker busy, on every node), and sends the other files whole; `examples` units are runs of token chunks;
`shards` units are the shards. Results come back in call order, so the bytes do not depend on the executor, the
number of workers or nodes.

Everything intermediate lives under `OUT/_work/<config_hash>-<vocab sha256>/` and every file appears by rename,
so a killed run resumes at the last finished file or chunk and writes the same bytes. The work directory is
keyed by the vocabulary too, and every worker checks `tokenizer.json` and `vocab.txt` against that sha256 before
it encodes (`tokenizer.check_pair`): partial work from another vocabulary (or config) is discarded, never
resumed, so ids from two vocabularies never mix. manifest.json is written last and marks completion; `_work` is
removed after it.

On a multi-node cluster the actors spread over the nodes (SPREAD), so inputs, output and `_work` must be on
storage every node reaches (a shared mount or a URI); the bytes do not depend on placement.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.config import DataConfig, config_hash
from pipeline.data.arrow import arrow, numpy_of
from pipeline.data.dedup import Duplicates, resolve
from pipeline.data.executors import make_executor
from pipeline.data.passes import (
    FileMerge,
    chunk_path,
    dedup_params,
    example_units,
    file_batches,
    file_done,
    in_chunk_order,
    read_done,
    shard_plan,
    text_bytes,
    unit_name,
)
from pipeline.data.pool import merge_pool
from pipeline.data.progress import Progress, log
from pipeline.data.sources import (
    MAX_RECORD_BYTES,
    InputError,
    InputFile,
    Skipped,
    skipped_once,
    skipped_summary,
    split_units,
)
from pipeline.data.specials import specials
from pipeline.data.tokenizer import check_pair, read_vocab, sha256_bytes, tokenizer_kind
from pipeline.errors import PipelineError
from pipeline.storage.io import filesystem, join, read_bytes, read_table, write_bytes_atomic


class OutputExistsError(PipelineError, ValueError):
    """The output directory holds a dataset prepared with a different config."""


# Fields that change the bytes of the output. num_actors, output and overwrite do not.
# vocab_sample_chars: tokenizer_sample_bytes's old name, moved to it by DataConfig (always None here)
_NOT_HASHED = ("inputs", "output", "num_actors", "overwrite", "vocab", "local_max_bytes", "vocab_sample_chars")


def output_config_hash(
    cfg: DataConfig, fingerprint: list, vocab_source: str | None, file_sources: dict[int, int] | None = None
) -> str:
    """Hash of what determines the output: config fields, input fingerprint, the given vocabulary's sha256 and, in
    a mixture, which source each input file is of (`file_sources`: its names and their files, not its weights,
    which only the loader reads: the same shards serve any weighting)."""
    d = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _NOT_HASHED}
    if not d["pack_documents"]:  # added in issue 33: off, a config hashes as it did before the field
        del d["pack_documents"]
    del d["mix_temperature"]  # the loader's
    if d["max_record_bytes"] == MAX_RECORD_BYTES:  # added in issue 59: at its default, a config hashes as before
        del d["max_record_bytes"]
    if d["tokenizer"] == "wordpiece" or vocab_source:  # added in issue 57: trained WordPiece hashes as before
        del d["tokenizer"]
    sources = d.pop("sources")  # added in issue 58: without a mixture, a config hashes as it did before the field
    extra = (
        {"sources": [s["name"] for s in sources], "file_sources": sorted((file_sources or {}).items())}
        if sources
        else {}
    )
    return config_hash({"data": d, "inputs": fingerprint, "vocab": vocab_source, "format": 1, **extra})


def _tokenizer_entry(cfg: DataConfig, vocab: list[str]) -> dict[str, Any]:
    """What the manifest says of the tokenizer: its kind, whether it was trained, its size, the [unusedN] tokens
    that round a trained bpe/unigram vocabulary up to a multiple of 64, its report on held-out text, and its
    special tokens (`specials.Specials.to_dict`: each role's token and id, the pair template, the roles made from
    an unused token, the ids never masked): what training, export and fine-tuning read."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(read_bytes(join(cfg.output, "tokenizer.json")).decode("utf-8"))
    unused = sum(1 for t in vocab if t.startswith("[unused") and t.endswith("]"))
    meta = join(cfg.output, "vocab.meta.json")  # the report the vocab stage measured (pipeline/data/stages.py)
    report = json.loads(read_bytes(meta)).get("report") if filesystem(meta)[0].exists(meta) else None
    return {
        "kind": tokenizer_kind(tok),
        "trained": not cfg.vocab,
        "vocab_size": len(vocab),
        "unused_tokens": unused,
        "report": report,
        "special_tokens": specials(tok, join(cfg.output, "tokenizer.json")).to_dict(),
    }


def work_dir(cfg: DataConfig, chash: str, vocab_sha: str) -> str:
    """Where the passes keep their partial work: one directory per (config, vocabulary)."""
    return join(cfg.output, "_work", f"{chash[:16]}-{vocab_sha[:16]}")


def discard_other_work(output: str, keep: str) -> list[str]:
    """Remove partial work under `output/_work` that is not `keep` (another config or vocabulary): it can never
    be resumed into this dataset. Returns the names removed."""
    fs, root = filesystem(join(output, "_work"))
    if not fs.exists(root):
        return []
    keep_name = keep.rstrip("/").rsplit("/", 1)[-1]
    gone = []
    for entry in sorted(fs.ls(root, detail=False)):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if name != keep_name:
            fs.rm(entry, recursive=True)
            gone.append(name)
    if gone:
        log(f"discarded partial work from another config or vocabulary: {', '.join(gone)}")
    return gone


def log_skipped(skipped: list[Skipped], show: int = 5) -> None:
    """Name the first `show` files not read (or not read to their end) and why, and how many more there are."""
    for sk in skipped[:show]:
        log(f"skipped {sk.path}: {sk.reason}")
    if len(skipped) > show:
        log(f"skipped {len(skipped) - show} more file(s) (manifest.json: skipped_files)")


def read_skips(file_stats: list[dict[str, Any]]) -> list[Skipped]:
    """The files the tokenize pass could not read (or not to their end), from its units' stats, in order."""
    return sorted({Skipped(*s) for st in file_stats for s in st.get("skipped_files", [])})


def runs_in_process(cfg: DataConfig, files: list[InputFile]) -> bool:
    """Inputs up to data.local_max_bytes are prepared on this machine without Ray (LocalExecutor): Ray's
    processes, actor pools and object transfers cost more than the work itself (tens of CPU-seconds). The same
    units run in the same order, so the bytes are the same."""
    return sum(f.size for f in files) <= cfg.local_max_bytes


def unit_bytes(cfg: DataConfig) -> int:
    """Compressed bytes per unit of a multistream dump: about `chunk_chars` characters of text once bz2 (~5x)
    and the markup (~1.5x) are gone."""
    return max(1, cfg.chunk_chars // 4)


@dataclasses.dataclass
class DedupResult:
    """The dedup pass's outcome: the dropped documents and, for duplicates.jsonl, every involved doc's name."""

    dups: Duplicates
    names: dict[int, str]

    def dropped_by_file(self) -> dict[int, dict[int, str]]:
        """file index -> {doc_id: rejection reason} (a unit's tokenize call gets its file's part only)."""
        out: dict[int, dict[int, str]] = {}
        for o, k in zip(self.dups.order.tolist(), self.dups.kind_names()):
            out.setdefault(o >> 32, {})[o] = "duplicate" if k == "exact" else "near_duplicate"
        return out

    def write(self, files: list[InputFile], output: str) -> dict[str, Any]:
        """OUT/duplicates.jsonl, one line per dropped document in input order; returns the manifest's summary."""
        path = {f.index: f.path for f in files}
        kinds = self.dups.kind_names()
        lines = []
        for o, d, k, sim in zip(
            self.dups.order.tolist(), self.dups.duplicate_of.tolist(), kinds, self.dups.similarity.tolist()
        ):
            lines.append(
                json.dumps(
                    {
                        "source": path[o >> 32],
                        "doc": self.names[o],
                        "duplicate_of": {"source": path[d >> 32], "doc": self.names[d]},
                        "kind": k,
                        "similarity": round(sim, 4),
                    }
                )
                + "\n"
            )
        data = "".join(lines).encode()
        write_bytes_atomic(join(output, "duplicates.jsonl"), data)
        return {
            "path": "duplicates.jsonl",
            "sha256": sha256_bytes(data),
            "exact": kinds.count("exact"),
            "near": kinds.count("near"),
        }


def dedup_pass(ex: Any, units: list[InputFile], cfg: DataConfig, work: str) -> DedupResult | None:
    """Pass 0, before tokenizing (data.dedup exact or near; None when off): each unit's documents become compact
    records on the workers (`sign_unit`: doc_id, name, exact key, MinHash signature); the executor groups them
    into candidate edges (`duplicate_edges`: a sort in memory; on Ray past `grouping.MEMORY_GROUPING_MAX_RECORDS`,
    Ray Data's hash shuffles of ids and of one signature a candidate document), and the keep-first rule is applied
    here (`resolve`). Texts never leave the workers."""
    if cfg.dedup == "off":
        return None
    params = dedup_params(cfg)
    start = time.perf_counter()
    paths = [join(work, "dd", f"{unit_name(u)}.parquet") for u in units]
    log(
        f"dedup: {cfg.dedup} duplicates of {len(units)} unit(s) {ex.where()}"
        + (
            f" (threshold {params.threshold}, {params.num_perm} permutations, {params.bands}x{params.rows} bands)"
            if params.mode == "near"
            else ""
        )
    )
    ex.map("sign", list(zip(units, paths)), [text_bytes(u) for u in units])
    edges = ex.duplicate_edges(paths, params)
    dups = resolve(*edges)
    wanted = np.union1d(dups.order, dups.duplicate_of)
    names: dict[int, str] = {}
    docs = 0
    for p in paths:
        t = read_table(p, columns=["doc_id", "name"])
        ids = numpy_of(t.column("doc_id"))
        docs += len(ids)
        hit = np.flatnonzero(np.isin(ids, wanted))
        if len(hit):  # indices as an Arrow array: a numpy one goes through pa.array, which imports pandas
            names.update(zip(ids[hit].tolist(), t.column("name").take(arrow(hit, pa.int64())).to_pylist()))
    kinds = dups.kind_names()
    log(
        f"dedup: {docs} documents, {kinds.count('exact')} exact and {kinds.count('near')} near duplicates "
        f"dropped ({time.perf_counter() - start:.1f}s)"
    )
    return DedupResult(dups, names)


def tokenize_pass(
    ex: Any, files: list[InputFile], cfg: DataConfig, work: str, dropped: dict[int, dict[int, str]] | None = None
) -> list[dict[str, Any]]:
    """Pass 1; each unit's stats, in the order of `files` (whole files, or a file's units, `split_units`). With
    more than one worker, a unit of more than two batches is read here and its batches are encoded on the
    workers as they are read (at most `per_worker` per worker in flight); the other units go whole, costliest
    first, after them. A unit already done is read back. The chunks, pool files and stats are the ones
    `tokenize_file` makes, whoever encodes which batch. `dropped` (file index -> {doc_id: reason}) are the dedup
    pass's duplicates, rejected with their reason."""
    dropped = dropped or {}
    cost = [text_bytes(f) for f in files]
    stats: dict[int, dict[str, Any]] = {i: read_done(f, work) for i, f in enumerate(files) if file_done(f, work)}
    todo = sorted((i for i in range(len(files)) if i not in stats), key=lambda i: -cost[i])
    big = [i for i in todo if ex.workers > 1 and cost[i] > 2 * cfg.chunk_chars]
    whole = [i for i in todo if i not in big]
    merges = {i: FileMerge(files[i], cfg, work) for i in big}
    batches = dict.fromkeys(big, 0)
    log(
        f"tokenize: {len(files)} input file(s) {ex.where()}"
        + (f"; resuming, {len(stats)} already done" if stats else "")
        + (f"; {len(big)} big file(s) split into batches" if big else "")
    )

    def calls():  # (method, args, file); the executor passes the third element back with the result
        for i in big:
            for b, batch in enumerate(file_batches(files[i], cfg, merges[i], dropped.get(files[i].index))):
                batches[i] = b + 1
                yield "encode", (batch, chunk_path(files[i], work, b)), i
        for i in whole:
            yield "tokenize", (files[i], dropped.get(files[i].index)), i

    progress = {
        "encode": Progress("tokenize", f"batches of {len(big)} big file(s)"),
        "tokenize": Progress("tokenize", "whole files", len(whole)),
    }
    for (method, _, i), result in ex.imap(calls()):
        if method == "encode":
            merges[i].add(result)  # results come in call order: a file's batches complete into its merge in order
        else:
            stats[i] = result
        progress[method].step()
    for i in big:
        stats[i] = merges[i].finish()
        log(f"tokenize: {files[i].path}: {batches[i]} batches across the workers")
    return [stats[i] for i in range(len(files))]


def prepare_shards(
    cfg: DataConfig,
    files: list[InputFile],
    skipped: list[Skipped],
    chash: str,
    vocab_sha: str,
    tokenizer_path: str,
    file_sources: dict[int, int] | None = None,
) -> dict[str, Any]:
    """The three passes, on this machine (inputs up to data.local_max_bytes) or on the Ray cluster; writes
    shards and the manifest; returns the manifest. In a mixture `file_sources` maps each input file's index to its
    source's (`pipeline.data.stages.file_sources`): every row is then of one source, named in its `source`."""
    start = time.perf_counter()
    work = work_dir(cfg, chash, vocab_sha)
    check_pair(join(cfg.output, "vocab.txt"), tokenizer_path, vocab_sha)  # one line on the driver, before workers
    discard_other_work(cfg.output, work)
    worker_args = (tokenizer_path, dataclasses.asdict(cfg), work, vocab_sha)
    units = [u for f in files for u in split_units(f, unit_bytes(cfg))]
    with make_executor(cfg, files, worker_args, local=runs_in_process(cfg, files)) as ex:
        dups = dedup_pass(ex, units, cfg, work)
        unit_stats = tokenize_pass(ex, units, cfg, work, dups.dropped_by_file() if dups else None)
        if file_sources is not None:  # each chunk of a file is of the file's source
            for u, st in zip(units, unit_stats):
                st["source"] = file_sources[u.index]
                st["chunks"] = [{**c, "source": file_sources[u.index]} for c in st["chunks"]]
        file_stats = sorted(unit_stats, key=lambda s: s["pool"])
        unread = read_skips(file_stats)
        log_skipped(unread)
        skipped = skipped_once([*skipped, *unread])  # each file once, with every reason it was named for
        reasons: Counter[str] = Counter()
        for s in file_stats:
            reasons.update(s["rejected_reasons"])
        docs_read = sum(s["documents_read"] for s in file_stats)
        docs_written = sum(s["documents_written"] for s in file_stats)
        if docs_written == 0:
            detail = ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())) or "no records"
            named = f"; {skipped_summary(unread)}" if unread else ""
            raise InputError(f"no usable document in {len(files)} input file(s) ({docs_read} read: {detail}{named})")
        chunks = [c for s in file_stats for c in s["chunks"]]
        log(
            f"tokenize: {docs_written}/{docs_read} documents, {sum(s['tokens'] for s in file_stats)} tokens, "
            f"{len(chunks)} chunks"
        )

        pool = merge_pool([s["pool"] for s in file_stats], cfg.random_pool_size)
        pa.default_memory_pool().release_unused()  # Arrow's allocator keeps freed pages otherwise (~250 MB at 8x)
        units = example_units(cfg, chunks, work)
        log(f"examples: {len(chunks)} chunk(s) in {len(units)} unit(s), random pool of {len(pool)} windows")
        shared_pool = ex.share(pool)
        metas = ex.map(
            "examples",
            [(u["chunks"], shared_pool, u["dest"], *([u["source"]] if "source" in u else [])) for u in units],
            [u["tokens"] for u in units],
        )
        ex_chunks = in_chunk_order(cfg, metas)
        examples = sum(m["rows"] for m in ex_chunks)
        if examples == 0:
            raise InputError(f"the {docs_written} usable document(s) produced no example")

        plan = shard_plan(ex_chunks, cfg.num_shards, cfg.output)
        log(f"shards: {examples} examples into {len(plan)} shard(s)")
        fs, out_p = filesystem(cfg.output)
        if fs.exists(join(out_p, "shards")):
            fs.rm(join(out_p, "shards"), recursive=True)  # leftovers of an interrupted run with this config
        shards = sorted(ex.map("shard", plan), key=lambda s: s["path"])
    manifest = _manifest(cfg, files, skipped, chash, vocab_sha, file_stats, reasons, ex_chunks, shards, start)
    if cfg.sources:
        manifest["sources"] = source_summary(cfg, file_sources or {}, file_stats, ex_chunks)
    if dups is not None:
        manifest["duplicates"] = dups.write(files, cfg.output)
    write_bytes_atomic(join(cfg.output, "manifest.json"), json.dumps(manifest, indent=2, sort_keys=True).encode())
    try:
        fs.rm(join(out_p, "_work"), recursive=True)
    except FileNotFoundError:
        pass
    return manifest


def source_summary(
    cfg: DataConfig, file_sources: dict[int, int], file_stats: list[dict[str, Any]], ex_chunks: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The manifest's `sources`: per source of the mixture, in `data.sources` order, its name, inputs, weight or
    epochs, and what it holds: input files, documents read and written, examples (rows) and tokens of the rows.

    >>> from pipeline.config import DataConfig
    >>> cfg = DataConfig(sources=[{"name": "a", "inputs": "/a", "weight": 3}, {"name": "b", "inputs": "/b", "epochs": 2}])
    >>> stats = [{"source": 0, "documents_read": 2, "documents_written": 2}, {"source": 1, "documents_read": 1,
    ...          "documents_written": 0}]
    >>> [(s["name"], s["input_files"], s["documents"], s["examples"], s["tokens"]) for s in source_summary(
    ...  cfg, {0: 0, 1: 1}, stats, [{"source": "a", "rows": 5, "tokens": 50}])]
    [('a', 1, 2, 5, 50), ('b', 1, 0, 0, 0)]
    """  # noqa: E501
    out = []
    for k, s in enumerate(cfg.sources):
        mine = [st for st in file_stats if st["source"] == k]
        chunks = [m for m in ex_chunks if m.get("source") == s.name]
        out.append(
            {
                "name": s.name,
                "inputs": list(s.inputs),
                "weight": s.weight,
                "epochs": s.epochs,
                "input_files": sum(v == k for v in file_sources.values()),
                "documents_read": sum(st["documents_read"] for st in mine),
                "documents": sum(st["documents_written"] for st in mine),
                "examples": sum(m["rows"] for m in chunks),
                "tokens": sum(m["tokens"] for m in chunks),
            }
        )
    return out


def _manifest(
    cfg: DataConfig,
    files: list[InputFile],
    skipped: list[Skipped],
    chash: str,
    vocab_sha: str,
    file_stats: list[dict[str, Any]],
    reasons: Counter[str],
    ex_chunks: list[dict[str, Any]],
    shards: list[dict[str, Any]],
    start: float,
) -> dict[str, Any]:
    """manifest.json (DESIGN.md's keys at top level); checks the document accounting."""
    vocab = read_vocab(join(cfg.output, "vocab.txt"))
    docs_read = sum(s["documents_read"] for s in file_stats)
    docs_written = sum(s["documents_written"] for s in file_stats)
    nsp_pairs = sum(m["nsp_pairs"] for m in ex_chunks)
    manifest = {
        "documents_read": docs_read,
        "documents_written": docs_written,
        "documents_rejected": docs_read - docs_written,
        "rejected_reasons": dict(sorted(reasons.items())),
        "examples": sum(m["rows"] for m in ex_chunks),
        "tokens": sum(m["tokens"] for m in ex_chunks),
        "masked_tokens": sum(m["masked_tokens"] for m in ex_chunks),
        "nsp_random_fraction": (sum(m["nsp_random"] for m in ex_chunks) / nsp_pairs) if nsp_pairs else None,
        "seconds": round(time.perf_counter() - start, 3),
        "config": dataclasses.asdict(cfg),
        "config_hash": chash,
        "vocab_sha256": vocab_sha,
        "shards": [
            {
                "path": f"shards/{s['path'].rsplit('/', 1)[-1]}",
                "rows": s["rows"],
                "sha256": s["sha256"],
                **{k: s[k] for k in ("source_rows", "source_tokens") if k in s},
            }
            for s in shards
        ],
        "output": cfg.output,
        "masking": cfg.masking,
        "vocab_size": len(vocab),
        "tokenizer": (tokenizer := _tokenizer_entry(cfg, vocab)),
        "special_token_ids": tokenizer["special_tokens"]["ids"],  # by role: cls, sep, pad, mask (, unk)
        "input_files": len(files),
        "files_skipped": [s.path for s in skipped],
        "skipped_files": [{"path": s.path, "reason": s.reason} for s in skipped],
        "source_tokens": sum(s["tokens"] for s in file_stats),
        "document_pieces": sum(s.get("pieces", 0) for s in file_stats),
    }
    if (
        manifest["documents_read"] != manifest["documents_written"] + manifest["documents_rejected"]
        or sum(reasons.values()) != manifest["documents_rejected"]
    ):
        raise AssertionError("document accounting is inconsistent")  # a bug, not bad input
    return manifest
