"""Examples to balanced Parquet shards: schema, the three passes on Ray Data, atomic writes, manifest, validation.

    files ─► [tokenize: actors] ─► token chunks + pool candidates ─► pool (bottom-k) ─►
            [examples: actors] ─► example chunks ─► [shards: tasks] ─► shards/*.parquet ─► manifest.json

1. tokenize: one Ray Data row per input file; an actor (holding the tokenizer) reads its documents, rejects bad
   ones with reasons, splits sentences, encodes them (`SentenceEncoder`: the tokenizer's ids, no special tokens) and writes token
   chunks of about `chunk_chars` characters, plus its file's bottom-k random-pool windows, then a done marker.
2. examples: the global pool is merged (bottom-k of hash(seed, doc_id, window), so it does not depend on the
   partitioning); one row per token chunk; an actor builds NSP pairs (or MLM-only packs) per document with an
   RNG from (seed, doc_id, dupe) and masks them (static) with pipeline.masking; writes an example chunk.
3. shards: example chunks (each shuffled inside, put in a hashed order) form one sequence, cut into `num_shards`
   contiguous parts whose sizes differ by at most one row; each shard is streamed to a temporary name, then
   renamed. Mixing beyond a chunk (~1M tokens) is the loader's job (block order + local shuffle buffer).

Inputs up to `data.local_max_bytes` (1 GiB) run the same functions, in the same units, without Ray (`_Local`):
in the calling process, or on spawned local worker processes that each hold a `PassWorker` like an actor does.
There, a file of more than two batches is read by the calling process and its batches (the token chunks to be)
are encoded across the workers; `tokenize_file` runs the same three steps in a row.

Everything intermediate lives under `OUT/_work/<config_hash>-<vocab sha256>/` and every file appears by rename, so a
killed run resumes at the last finished file or chunk and writes the same bytes. The work directory is keyed by
the vocabulary too, and every actor checks `tokenizer.json` and `vocab.txt` against that sha256 before it
encodes (`tokenizer.check_pair`): partial work from another vocabulary (or config) is discarded, never resumed,
so ids from two vocabularies never mix. manifest.json is written last and marks
completion; `_work` is removed after it. Paths are fsspec paths/URIs (local, file://, s3://).

On a multi-node cluster the actors and the shard tasks spread over the nodes (SPREAD), so inputs, output and
`_work` must be on storage every node reaches (a shared mount or a URI); the bytes do not depend on placement.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import random
import sys
import time
import types
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.io import (
    exists,
    filesystem,
    join,
    output_lock,
    read_bytes,
    read_table,
    read_text,
    sha256_file,
    temp_name,
    commit,
    write_bytes_atomic,
    write_parquet_atomic,
)

from pipeline.config import DataConfig, config_hash
from pipeline.dag import Stage
from pipeline.data.dataset import SCHEMA, PreparedDataset
from pipeline.data.examples import (
    RandomPool,
    create_instances_from_document,
    derive_seed,
    group_consecutive,
    pack_sentences,
    piece_id,
    split_document,
    split_sentences,
)
from pipeline.data.masking import MaskingPolicy, mask_rows
from pipeline.data.sources import Document, InputError, InputFile, read_documents
from pipeline.data.tokenizer import SentenceEncoder, check_pair, gather_runs, read_vocab, sha256_bytes

TOKEN_SCHEMA = pa.schema([("doc_id", pa.int64()), ("tokens", pa.list_(pa.int32())), ("sent_lens", pa.list_(pa.int32()))])
POOL_SCHEMA = pa.schema(
    [("priority", pa.int64()), ("doc_id", pa.int64()), ("tokens", pa.list_(pa.int32())), ("sent_lens", pa.list_(pa.int32()))]
)


class OutputExistsError(ValueError):
    """The output directory holds a dataset prepared with a different config."""


# ---------------------------------------------------------------------------------------------- arrow helpers


_NP_DTYPES = {pa.int8(): np.int8, pa.int32(): np.int32, pa.int64(): np.int64}


def arrow(values: Any, dtype: pa.DataType) -> pa.Array:
    """A numpy array (or list) as an Arrow array of `dtype`, zero-copy from one buffer. Not `pa.array`: that asks
    pandas whether the input is a pandas object, which imports pandas (0.2 s) into every worker.

    >>> arrow([1, 2, 3], pa.int8()).to_pylist()
    [1, 2, 3]
    """
    a = np.ascontiguousarray(values, dtype=_NP_DTYPES[dtype])
    return pa.Array.from_buffers(dtype, len(a), [None, pa.py_buffer(a)])


def numpy_of(a: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A null-free primitive Arrow array as a read-only numpy view (`to_numpy` would import pandas).

    >>> numpy_of(arrow([1, 2, 3, 4], pa.int32()).slice(1, 2)).tolist()
    [2, 3]
    """
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    if a.null_count:
        raise ValueError("numpy_of: the array has nulls")
    return np.frombuffer(a.buffers()[1], dtype=_NP_DTYPES[a.type])[a.offset : a.offset + len(a)]


def list_array(rows: list[np.ndarray], dtype: pa.DataType) -> pa.ListArray:
    """Variable-length rows -> Arrow list array, built from one flat buffer (no per-element Python)."""
    np_dtype = _NP_DTYPES[dtype]  # not dtype.to_pandas_dtype(): that imports pandas (0.2 s)
    lens = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    values = np.concatenate(rows).astype(np_dtype, copy=False) if len(rows) and lens.sum() else np.zeros(0, np_dtype)
    return flat_list_array(values, lens, dtype)


def flat_list_array(values: np.ndarray, lens: np.ndarray, dtype: pa.DataType) -> pa.ListArray:
    """Rows given as their values back to back and each row's length -> Arrow list array.

    >>> flat_list_array(np.arange(5), np.array([2, 0, 3]), pa.int32()).to_pylist()
    [[0, 1], [], [2, 3, 4]]
    """
    offsets = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    return pa.ListArray.from_arrays(arrow(offsets, pa.int32()), arrow(values, dtype))


def list_rows(col: pa.ChunkedArray | pa.ListArray) -> list[np.ndarray]:
    """Arrow list column -> list of numpy views (the inverse of `list_array`)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    offsets = numpy_of(col.offsets)
    values = numpy_of(col.values)
    base = offsets[0]
    return [values[offsets[i] - base : offsets[i + 1] - base] for i in range(len(col))] if len(col) else []


def balanced_ranges(n: int, k: int) -> list[tuple[int, int]]:
    """k contiguous [start, stop) ranges covering n rows, sizes differing by at most one.

    >>> balanced_ranges(10, 3)
    [(0, 4), (4, 7), (7, 10)]
    """
    bounds = [0]
    for i in range(k):
        bounds.append(bounds[-1] + n // k + (i < n % k))
    return list(zip(bounds[:-1], bounds[1:]))


# ---------------------------------------------------------------------------------------------- hashing/config

# Fields that change the bytes of the output. num_actors, output and overwrite do not.
_NOT_HASHED = ("inputs", "output", "num_actors", "overwrite", "vocab", "local_max_bytes")


def output_config_hash(cfg: DataConfig, fingerprint: list, vocab_source: str | None) -> str:
    """Hash of what determines the output: config fields, input fingerprint, the given vocabulary's sha256."""
    d = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _NOT_HASHED}
    return config_hash({"data": d, "inputs": fingerprint, "vocab": vocab_source, "format": 1})


def work_dir(cfg: DataConfig, chash: str, vocab_sha: str) -> str:
    """Where the passes keep their partial work: one directory per (config, vocabulary)."""
    return join(cfg.output, "_work", f"{chash[:16]}-{vocab_sha[:16]}")


# ---------------------------------------------------------------------------------------------- pass 1


def tokenize_file(f: InputFile, tok: SentenceEncoder | Any, cfg: DataConfig, work: str) -> dict[str, Any]:
    """Read, check, split and encode one input file into token chunks and pool candidates; returns its stats.
    `tok` is a SentenceEncoder (its word cache lasts across files) or a `tokenizers.Tokenizer`.

    Skipped (stats read back) when the file's done marker exists, so a resumed run does not redo it. The same
    three steps also run apart, the batches of one big file on several local workers (`_Local.tokenize`).
    """
    if file_done(f, work):
        return json.loads(read_text(_done_path(f, work)))
    if not isinstance(tok, SentenceEncoder):
        tok = SentenceEncoder(tok)
    merge = FileMerge(f, cfg, work)
    for b, batch in enumerate(file_batches(f, cfg, merge)):
        merge.add(encode_pieces(batch, chunk_path(f, work, b), tok, cfg))
    return merge.finish()


def _done_path(f: InputFile, work: str) -> str:
    return join(work, "tok", f"f{f.index:06d}.done.json")


def file_done(f: InputFile, work: str) -> bool:
    return exists(_done_path(f, work))


def chunk_path(f: InputFile, work: str, b: int) -> str:
    """Batch `b` of file `f`'s token chunk (a batch whose pieces have no token writes none: numbers may skip)."""
    return join(work, "tok", f"f{f.index:06d}-c{b:05d}.parquet")


Batch = list[tuple[Document, bool]]  # (piece, whether it is its document's last piece)


def file_batches(f: InputFile, cfg: DataConfig, merge: FileMerge) -> Iterator[Batch]:
    """The pieces of a file's documents in batches of about `chunk_chars` characters, in order (each batch is one
    token chunk). Records read and rejected are counted into `merge`."""
    batch: Batch = []
    chars = 0
    for item in read_documents(f, cfg.text_column):
        merge.stats["documents_read"] += 1
        if isinstance(item, Document):
            pieces = split_document(item.text, cfg.max_document_chars)
            piece = next(pieces)
            for k in itertools.count():  # one piece ahead, to know which is last
                following = next(pieces, None)
                batch.append((Document(piece_id(item.doc_id, k), item.source, piece), following is None))
                chars += len(piece)
                if chars >= cfg.chunk_chars:
                    yield batch
                    batch, chars = [], 0
                if following is None:
                    break
                piece = following
            del item, piece, pieces  # the whole text is not kept while the next document is read
        else:
            merge.reasons[item.reason] += 1
    if batch:
        yield batch


def encode_pieces(batch: Batch, path: str, tok: SentenceEncoder, cfg: DataConfig) -> dict[str, Any]:
    """Split one batch's pieces into sentences and encode them; write the token chunk to `path` (when any piece
    has tokens); return per-piece flags, counts and the batch's own bottom-k pool candidates."""
    sents_per_doc = [split_sentences(d.text) for d, _ in batch]
    flat = [s for ss in sents_per_doc for s in ss]
    all_ids, sent_lens = tok.encode(flat)
    sent_ends = np.cumsum(sent_lens)
    out: dict[str, Any] = {"flags": [], "pieces": 0, "sentences": 0, "tokens": 0, "chunk": None}
    prio, docs, wins, n_sents = [], [], [], []  # the pool candidates: every window of every piece
    doc_ids, tokens, lens = [], [], []
    k = 0
    for (d, last), ss in zip(batch, sents_per_doc):
        dl = sent_lens[k : k + len(ss)]
        lo = int(sent_ends[k - 1]) if k else 0
        hi = int(sent_ends[k + len(ss) - 1]) if len(ss) else lo
        k += len(ss)
        dl = dl[dl > 0]
        out["flags"].append((len(dl) > 0, last))
        if len(dl) == 0:
            continue
        out["pieces"] += 1
        doc_ids.append(d.doc_id)
        tokens.append(all_ids[lo:hi])
        lens.append(dl)
        out["sentences"] += len(dl)
        out["tokens"] += hi - lo
        for w, g in enumerate(group_consecutive(dl.tolist(), cfg.max_seq_length)):  # document_windows' groups
            prio.append(derive_seed(cfg.seed, "pool", d.doc_id, w))
            docs.append(d.doc_id)
            wins.append(w)
            n_sents.append(len(g))
    if doc_ids:
        table = pa.table(
            [arrow(doc_ids, pa.int64()), list_array(tokens, pa.int32()), list_array(lens, pa.int32())],
            schema=TOKEN_SCHEMA,
        )
        write_parquet_atomic(path, table, compression="lz4")
        out["chunk"] = {"path": path, "docs": len(doc_ids), "tokens": int(sum(len(t) for t in tokens))}
    # The windows tile each piece's non-empty sentences in order, so their sentences are those, and their tokens
    # all of the batch's tokens.
    cands = PoolCandidates(np.array(prio, np.int64), np.array(docs, np.int64), np.array(wins, np.int64),
                           np.array(n_sents, np.int64), sent_lens[sent_lens > 0], all_ids)
    out["pool"] = cands.bottom(cfg.random_pool_size)
    return out


class FileMerge:
    """One file's stats from its batches' results, added in batch order: documents (one counts once, written
    when any of its pieces has tokens), pieces, tokens, chunks, and the file's bottom-k pool candidates."""

    def __init__(self, f: InputFile, cfg: DataConfig, work: str) -> None:
        self.f, self.cfg, self.work = f, cfg, work
        self.stats: dict[str, Any] = {"file": f.path, "documents_read": 0, "documents_written": 0, "pieces": 0,
                                      "tokens": 0, "sentences": 0, "chunks": []}
        self.reasons: Counter[str] = Counter()
        self.pool = PoolCandidates.empty()
        self.doc_has_tokens = False  # of the document whose pieces are being added

    def add(self, r: dict[str, Any]) -> None:
        for has_tokens, last in r["flags"]:
            self.doc_has_tokens |= has_tokens
            if last:
                if self.doc_has_tokens:
                    self.stats["documents_written"] += 1
                else:
                    self.reasons["no_tokens"] += 1
                self.doc_has_tokens = False
        for key in ("pieces", "sentences", "tokens"):
            self.stats[key] += r[key]
        if r["chunk"] is not None:
            self.stats["chunks"].append(r["chunk"])
        self.pool = PoolCandidates.concat([self.pool, r["pool"]])
        if len(self.pool) > 2 * self.cfg.random_pool_size:
            self.pool = self.pool.bottom(self.cfg.random_pool_size)

    def finish(self) -> dict[str, Any]:
        """Write the pool candidates and the done marker; the file's stats."""
        stats = self.stats
        pool = self.pool.bottom(self.cfg.random_pool_size)
        stats["pool"] = _write_pool(join(self.work, "tok", f"f{self.f.index:06d}.pool.parquet"), pool)
        stats["rejected_reasons"] = dict(sorted(self.reasons.items()))
        stats["documents_rejected"] = sum(self.reasons.values())
        write_bytes_atomic(_done_path(self.f, self.work), json.dumps(stats).encode())
        return stats


@dataclasses.dataclass
class PoolCandidates:
    """Random-pool windows, compact (numpy arrays, no object per window): each window's priority, document, index
    in its document and sentence count; all windows' sentence lengths, and their tokens, back to back."""

    prio: np.ndarray  # (W,) int64
    doc: np.ndarray  # (W,) int64
    win: np.ndarray  # (W,) int64
    n_sents: np.ndarray  # (W,) int64
    sent_lens: np.ndarray  # (S,) int32
    tokens: np.ndarray  # (T,) int32

    @classmethod
    def empty(cls) -> PoolCandidates:
        z = np.zeros(0, np.int64)
        return cls(z, z, z, z, np.zeros(0, np.int32), np.zeros(0, np.int32))

    def __len__(self) -> int:
        return len(self.prio)

    @classmethod
    def concat(cls, parts: list[PoolCandidates]) -> PoolCandidates:
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(cls)))

    def window_tokens(self) -> np.ndarray:
        """Tokens per window (the sum of its sentences' lengths)."""
        if not len(self):
            return np.zeros(0, np.int64)
        return np.add.reduceat(self.sent_lens.astype(np.int64), np.cumsum(self.n_sents) - self.n_sents)

    def bottom(self, k: int) -> PoolCandidates:
        """The `k` windows of lowest (priority, doc, window), in that order, as new arrays.

        >>> c = PoolCandidates(np.array([9, 1, 5]), np.array([0, 0, 1]), np.array([0, 1, 0]), np.array([1, 2, 1]),
        ...                    np.array([2, 1, 1, 3], np.int32), np.arange(7, dtype=np.int32))
        >>> b = c.bottom(2); b.prio.tolist(), b.sent_lens.tolist(), b.tokens.tolist()
        ([1, 5], [1, 1, 3], [2, 3, 4, 5, 6])
        """
        order = np.lexsort((self.win, self.doc, self.prio))[:k]
        sent_start = np.cumsum(self.n_sents) - self.n_sents
        win_tokens = self.window_tokens()
        tok_start = np.cumsum(win_tokens) - win_tokens
        return PoolCandidates(
            self.prio[order], self.doc[order], self.win[order], self.n_sents[order],
            gather_runs(self.sent_lens, sent_start[order], self.n_sents[order]),
            gather_runs(self.tokens, tok_start[order], win_tokens[order]),
        )


def _write_pool(path: str, pool: PoolCandidates) -> str:
    """A file's random-pool candidates, in (priority, doc_id, window) order."""
    table = pa.table(
        [
            arrow(pool.prio, pa.int64()),
            arrow(pool.doc, pa.int64()),
            flat_list_array(pool.tokens, pool.window_tokens(), pa.int32()),
            flat_list_array(pool.sent_lens, pool.n_sents, pa.int32()),
        ],
        schema=POOL_SCHEMA,
    )
    write_parquet_atomic(path, table, compression="lz4")
    return path


def _split(tokens: np.ndarray, lens: np.ndarray) -> list[np.ndarray]:
    """Views of `tokens`, one per length (slices: np.split costs ~20x more per piece)."""
    ends = np.cumsum(lens).tolist()
    return [tokens[a:b] for a, b in zip([0, *ends[:-1]], ends)]


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
        _log(f"discarded partial work from another config or vocabulary: {', '.join(gone)}")
    return gone


def merge_pool(pool_paths: list[str], size: int) -> RandomPool:
    """Global bottom-`size` windows by (priority, doc_id) over every file's candidates (partition-independent).

    The keys of all candidates are read first (16 bytes a window), then only the chosen windows' tokens, one
    file at a time: memory stays near `size` windows however many files there are."""
    keys = [read_table(p, columns=["priority", "doc_id"]) for p in pool_paths]
    if not sum(k.num_rows for k in keys):
        return RandomPool.from_windows([])
    prio = np.concatenate([numpy_of(k.column("priority")) for k in keys])
    docs = np.concatenate([numpy_of(k.column("doc_id")) for k in keys])
    src = np.repeat(np.arange(len(keys)), [k.num_rows for k in keys])
    row = np.concatenate([np.arange(k.num_rows) for k in keys])
    chosen = np.lexsort((docs, prio))[:size]
    src, row = src[chosen], row[chosen]
    parts = []
    for i in np.unique(src):
        rows = np.sort(row[src == i])
        parts.append(read_table(pool_paths[i]).take(arrow(rows, pa.int64())).combine_chunks())
    kept = pa.concat_tables(parts).sort_by([("priority", "ascending"), ("doc_id", "ascending")])
    lens = kept.column("sent_lens").combine_chunks()
    sent_ends = np.cumsum(numpy_of(lens.flatten()), dtype=np.int64)
    win_starts = np.concatenate([[0], np.cumsum(numpy_of(lens.value_lengths()), dtype=np.int64)])
    tokens = numpy_of(kept.column("tokens").combine_chunks().flatten()).astype(np.int32)
    return RandomPool(numpy_of(kept.column("doc_id")).astype(np.int64), win_starts, sent_ends, tokens)


# ---------------------------------------------------------------------------------------------- pass 2


def examples_for_chunks(
    chunk_paths: list[str], pool: RandomPool, cfg: DataConfig, policy: MaskingPolicy, cls_id: int, sep_id: int,
    out_path: str,
) -> dict[str, Any]:
    """Build (and, for static masking, mask) the examples of some token chunks; write them; return counts.

    Skipped (counts read back) when `out_path` is already complete, so a resumed run does not redo it.
    """
    meta_path = out_path + ".json"
    if exists(meta_path):
        return json.loads(read_text(meta_path))
    t = pa.concat_tables([read_table(p) for p in chunk_paths])
    doc_ids = numpy_of(t.column("doc_id"))
    toks = list_rows(t.column("tokens"))
    lens = list_rows(t.column("sent_lens"))
    docs = [(int(d), _split(tk, ln)) for d, tk, ln in zip(doc_ids, toks, lens)]
    dupes = cfg.dupe_factor if cfg.masking == "static" else 1
    ids: list[np.ndarray] = []
    types, nsp, ex_ids = [], [], []
    for dupe in range(dupes):  # dupe-major, as Google: copies of one document are not adjacent
        for doc_id, sents in docs:
            rng = random.Random(derive_seed(cfg.seed, "pairs", doc_id, dupe))
            if cfg.nsp:
                insts = create_instances_from_document(
                    sents, doc_id, pool, max_seq_length=cfg.max_seq_length, short_seq_prob=cfg.short_seq_prob,
                    rng=rng, cls_id=cls_id, sep_id=sep_id,
                )
            else:
                insts = pack_sentences(
                    sents, max_seq_length=cfg.max_seq_length, short_seq_prob=cfg.short_seq_prob, rng=rng,
                    cls_id=cls_id, sep_id=sep_id,
                )
            for k, inst in enumerate(insts):
                ids.append(inst.input_ids)
                types.append(inst.token_type_ids)
                nsp.append(inst.next_sentence_label)
                ex_ids.append(derive_seed(cfg.seed, "example", doc_id, dupe, k))
    # Google shuffles all instances; here each unit's examples are shuffled (a deterministic permutation keyed
    # by the unit's name) and the units themselves are put in a hashed order before sharding (prepare_shards).
    perm = np.random.default_rng(derive_seed(cfg.seed, "shuffle", out_path.rsplit("/", 1)[-1])).permutation(len(ids))
    ids, types = [ids[i] for i in perm], [types[i] for i in perm]
    nsp, ex_ids = [nsp[i] for i in perm], [ex_ids[i] for i in perm]
    if cfg.masking == "static":  # the same function the loader uses for dynamic masking, at epoch 0
        ids, positions, labels = mask_rows(ids, np.asarray(ex_ids, np.int64), policy, seed=cfg.seed, epoch=0)
    else:
        positions = labels = [np.zeros(0, np.int32)] * len(ids)
    table = pa.table(
        [
            list_array(ids, pa.int32()),
            list_array(types, pa.int8()),
            list_array(positions, pa.int32()),
            list_array(labels, pa.int32()),
            arrow(nsp, pa.int8()),
            arrow(np.fromiter((len(x) for x in ids), np.int32, len(ids)), pa.int32()),
            arrow(ex_ids, pa.int64()),
        ],
        schema=SCHEMA,
    )
    write_parquet_atomic(out_path, table, compression="lz4")
    nsp_arr = np.asarray(nsp, dtype=np.int8)
    meta = {
        "path": out_path,
        "rows": len(ids),
        "tokens": int(sum(len(x) for x in ids)),
        "masked_tokens": int(sum(len(x) for x in positions)),
        "nsp_random": int((nsp_arr == 1).sum()),
        "nsp_pairs": int((nsp_arr >= 0).sum()),
    }
    write_bytes_atomic(meta_path, json.dumps(meta).encode())
    return meta


# ---------------------------------------------------------------------------------------------- pass 3


def write_shard(path: str, parts: list[tuple[str, int, int]]) -> dict[str, Any]:
    """Stream row slices [(chunk path, start, stop), ...] into one zstd Parquet shard, atomically."""
    fs, p = filesystem(path)
    fs.makedirs(p.rpartition("/")[0], exist_ok=True)
    tmp = temp_name(p)
    rows = 0
    with fs.open(tmp, "wb") as f, pq.ParquetWriter(f, SCHEMA, compression="zstd") as w:
        for chunk, a, b in parts:
            t = read_table(chunk).slice(a, b - a)
            w.write_table(t)
            rows += t.num_rows
    commit(fs, tmp, p)
    return {"path": path, "rows": rows, "sha256": sha256_file(path)}


def shard_plan(chunks: list[dict[str, Any]], num_shards: int, out_dir: str) -> list[tuple[str, list[tuple[str, int, int]]]]:
    """Which chunk rows go into which shard: contiguous, balanced to one row."""
    total = sum(c["rows"] for c in chunks)
    k = max(1, min(num_shards, total))
    plan = []
    starts = np.cumsum([0] + [c["rows"] for c in chunks])
    for s, (a, b) in enumerate(balanced_ranges(total, k)):
        parts = []
        for c, c0, c1 in zip(chunks, starts[:-1], starts[1:]):
            lo, hi = max(a, c0), min(b, c1)
            if lo < hi:
                parts.append((c["path"], int(lo - c0), int(hi - c0)))
        plan.append((join(out_dir, "shards", f"shard-{s:05d}-of-{k:05d}.parquet"), parts))
    return plan


# ---------------------------------------------------------------------------------------------- Ray wiring


def _log(msg: str) -> None:
    print(f"[data] {msg}", file=sys.stderr, flush=True)


class PassWorker:
    """What one process needs for passes 1 and 2: the checked tokenizer (its word cache lasts across calls), the
    config, the masking policy. A local worker process or a Ray actor holds one; small arguments only."""

    def __init__(self, tokenizer_path: str, cfg: dict, work: str, vocab_sha: str) -> None:
        os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one thread per worker; the workers are the parallelism
        self.cfg = DataConfig(**cfg)
        self.work = work
        vocab_path = join(self.cfg.output, "vocab.txt")
        self.tok = SentenceEncoder(check_pair(vocab_path, tokenizer_path, vocab_sha))  # both files vs the sha256
        vocab = read_vocab(vocab_path)
        self.policy = MaskingPolicy.from_vocab(
            vocab, mask_rate=self.cfg.mask_rate, max_predictions_per_seq=self.cfg.max_predictions_per_seq,
            whole_word=self.cfg.whole_word_mask,
        )
        self.cls_id, self.sep_id = vocab.index("[CLS]"), vocab.index("[SEP]")

    def tokenize(self, f: InputFile) -> dict[str, Any]:
        return tokenize_file(f, self.tok, self.cfg, self.work)

    def encode(self, batch: Batch, path: str) -> dict[str, Any]:
        return encode_pieces(batch, path, self.tok, self.cfg)

    def examples(self, chunks: list[str], pool: RandomPool, dest: str) -> dict[str, Any]:
        return examples_for_chunks(chunks, pool, self.cfg, self.policy, self.cls_id, self.sep_id, dest)

    def shard(self, path: str, parts: list[tuple[str, int, int]]) -> dict[str, Any]:
        return write_shard(path, parts)


class _TokenizeActor:
    """Pass 1 on Ray Data: a PassWorker; several small input files per call (fewer Ray round trips)."""

    def __init__(self, **kw: Any) -> None:
        self.w = PassWorker(**kw)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = [json.dumps([self.w.tokenize(InputFile(**f)) for f in json.loads(str(group))]) for group in batch["files"]]
        return {"stats": np.array(out, dtype=object)}


class _ExamplesActor:
    """Pass 2 on Ray Data: a PassWorker and the random pool (fetched once from the object store)."""

    def __init__(self, pool_ref: list, **kw: Any) -> None:
        import ray

        self.w = PassWorker(**kw)
        self.pool = ray.get(pool_ref[0])

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = [json.dumps(self.w.examples(json.loads(str(c)), self.pool, str(d))) for c, d in zip(batch["chunks"], batch["dest"])]
        return {"meta": np.array(out, dtype=object)}


def _pool(num_actors: int) -> Any:
    """A fixed pool of `num_actors` actors, one unit of work in flight per actor. Units are coarse (whole files,
    ~1M tokens), so queueing several on one actor (Ray Data's default) can leave the others idle: 3 example units
    all went to one of two actors in a two-node run. Ray Data places the actors SPREAD over the nodes."""
    import ray

    return ray.data.ActorPoolStrategy(size=num_actors, max_tasks_in_flight_per_actor=1)


def _actor_cpus(num_actors: int) -> float:
    import ray

    total = ray.cluster_resources().get("CPU", 1.0)
    return min(1.0, total / max(1, num_actors))


def _tokenize_pass(
    cfg: DataConfig, files: list[InputFile], work: str, tokenizer_path: str, vocab_sha: str, cpus: float
) -> list[dict[str, Any]]:
    """Pass 1 on an actor pool: one row per group of whole input files; returns each file's stats (pool order)."""
    import ray

    fs, _ = filesystem(cfg.output)
    done_before = len(fs.glob(join(filesystem(work)[1], "tok", "*.done.json")))
    _log(f"tokenize: {len(files)} input file(s) on {cfg.num_actors} actor(s)"
         + (f"; resuming, {done_before} already done" if done_before else ""))
    # Groups of whole files, about chunk_chars bytes each but at least 4 groups per actor (balance at the tail).
    target = max(1, min(cfg.chunk_chars, sum(f.size for f in files) // (4 * cfg.num_actors)))
    groups = group_consecutive([f.size for f in files], target)
    items = [{"files": json.dumps([{"path": files[i].path, "kind": files[i].kind, "index": files[i].index} for i in g])}
             for g in groups]
    stats_rows = (
        ray.data.from_items(items, override_num_blocks=max(1, len(items)))
        .map_batches(
            _TokenizeActor,
            fn_constructor_kwargs={"tokenizer_path": tokenizer_path, "cfg": dataclasses.asdict(cfg), "work": work,
                                   "vocab_sha": vocab_sha},
            batch_size=1,
            compute=_pool(cfg.num_actors),
            num_cpus=cpus,
        )
        .take_all()
    )
    return sorted((s for r in stats_rows for s in json.loads(r["stats"])), key=lambda s: s["pool"])


def _examples_pass(
    cfg: DataConfig, chunks: list[dict[str, Any]], pool: RandomPool, work: str, tokenizer_path: str, vocab_sha: str,
    cpus: float,
) -> list[dict[str, Any]]:
    """Pass 2 on an actor pool: NSP pairs / packs + static masks per unit of token chunks; returns the example
    chunks' metadata in a hashed order that mixes sources across shards."""
    import ray

    ex_items = _example_units(cfg, chunks, pool, work)
    metas = (
        ray.data.from_items(ex_items, override_num_blocks=max(1, len(ex_items)))
        .map_batches(
            _ExamplesActor,
            fn_constructor_kwargs={"pool_ref": [ray.put(pool)], "tokenizer_path": tokenizer_path,
                                   "cfg": dataclasses.asdict(cfg), "work": work, "vocab_sha": vocab_sha},
            batch_size=1,
            compute=_pool(cfg.num_actors),
            num_cpus=cpus,
        )
        .take_all()
    )
    return _in_chunk_order(cfg, [json.loads(r["meta"]) for r in metas])


def _example_units(cfg: DataConfig, chunks: list[dict[str, Any]], pool: RandomPool, work: str) -> list[dict[str, str]]:
    """Pass 2's units of work: consecutive token chunks of ~chunk_chars of text, each with its output path."""
    units = group_consecutive([c["tokens"] for c in chunks], max(1, cfg.chunk_chars // 4))
    _log(f"examples: {len(chunks)} chunk(s) in {len(units)} unit(s), random pool of {len(pool)} windows")
    return [{"chunks": json.dumps([chunks[i]["path"] for i in u]), "dest": join(work, "ex", f"e{k:06d}.parquet"),
             "tokens": sum(chunks[i]["tokens"] for i in u)} for k, u in enumerate(units)]


def _in_chunk_order(cfg: DataConfig, metas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Example chunks in a hashed order, which mixes sources across shards (books and wiki not apart)."""
    return sorted(metas, key=lambda m: (derive_seed(cfg.seed, "chunk-order", m["path"].rsplit("/", 1)[-1]), m["path"]))


def runs_in_process(cfg: DataConfig, files: list[InputFile]) -> bool:
    """Small inputs are prepared in the calling process: Ray's processes, actor pools and object transfers cost
    more than the work itself (tens of CPU-seconds), while tokenization still uses every core through the
    tokenizer's own threads. The same pure functions run in the same order, so the bytes are the same."""
    return sum(f.size for f in files) <= cfg.local_max_bytes


def needs_ray(cfg: DataConfig) -> bool:
    """Whether preparing `cfg` starts Ray work (the job connects to Ray only then)."""
    from pipeline.data.sources import expand_inputs

    return not runs_in_process(cfg, expand_inputs(list(cfg.inputs))[0])


# Bytes of input per local worker process: a worker costs ~0.4 CPU-s to start (interpreter, imports, tokenizer)
# and prepares ~1.4 MB per CPU-second here, so a second one pays off from about 2 MiB.
LOCAL_WORKER_BYTES = 2 * 2**20


def _text_bytes(f: InputFile) -> float:
    """About how much text a file holds, for scheduling only: compressed files hold ~3x their size."""
    return f.size * (3 if f.path.endswith((".gz", ".bz2", ".xz", ".zst")) else 1)


def local_workers(cfg: DataConfig, files: list[InputFile]) -> int:
    """Processes for a preparation on this machine: data.num_actors, at most the cores, and one per
    LOCAL_WORKER_BYTES of input (a small corpus is prepared in the job's own process, no worker started).

    >>> local_workers(DataConfig(num_actors=8), [InputFile("a", "text", 0, size=5 * 2**20)]) <= 3
    True
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cfg.num_actors, cores, -(-sum(f.size for f in files) // LOCAL_WORKER_BYTES)))


_WORKER: PassWorker | None = None  # in a local worker process


def _start_worker(*args: Any) -> None:
    global _WORKER
    _WORKER = PassWorker(*args)


def _in_worker(method: str, *args: Any) -> Any:
    try:
        return getattr(_WORKER, method)(*args)
    finally:
        pa.default_memory_pool().release_unused()  # between tasks: Arrow's allocator keeps freed pages otherwise


def _started() -> None:
    """A no-op task: submitting one per worker starts them all (ProcessPoolExecutor spawns in `submit`)."""


@contextlib.contextmanager
def _without_main() -> Iterator[None]:
    """Spawned processes re-run the parent's __main__ script (as __mp_main__) before they work: a caller's script
    without an `if __name__ == "__main__"` guard would prepare again in every worker, and a main read from stdin
    cannot be re-run at all. The workers need only this module, so their start sees a bare __main__."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


PROGRESS_EVERY_S = 10.0  # a "[data] <pass>: k/n ..." line at most this often while a local pass runs


class _Progress:
    """Counts a pass's finished units and logs `what: done[/total] unit done (Ns)` at most every PROGRESS_EVERY_S
    (the pass's own line says when it ends)."""

    def __init__(self, what: str, unit: str, total: int | None = None) -> None:
        self.what, self.unit, self.total = what, unit, total
        self.done = 0
        self.start = self.last = time.monotonic()

    def step(self) -> None:
        self.done += 1
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S and self.done != self.total:
            self.last = now
            of = f"/{self.total}" if self.total is not None else ""
            _log(f"{self.what}: {self.done}{of} {self.unit} done ({now - self.start:.0f}s)")


class _Local:
    """The passes on this machine, without Ray: in this process, or on `n` spawned worker processes (spawn, not
    fork: the job may itself run inside a Ray worker, whose threads a fork would copy mid-flight). Results come
    back in submission order, so the bytes equal the Ray path's (tests/test_data_stages.py)."""

    def __init__(self, n: int, worker_args: tuple) -> None:
        self.n = n
        if n == 1:
            self.here: PassWorker | None = PassWorker(*worker_args)
            self.pool = None
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self.here = None
            self.pool = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_start_worker, initargs=worker_args)
            with _without_main():  # all n start here, and load the tokenizer while this process plans
                for _ in range(n):
                    self.pool.submit(_started)

    def where(self) -> str:
        return "in this process" if self.n == 1 else f"on {self.n} local worker processes"

    def map(self, method: str, calls: list[tuple], cost: list[float] | None = None) -> list[Any]:
        """`method(*call)` for each call, results in call order; on workers, the costliest calls go first (a big
        file started last would run alone at the end)."""
        progress = _Progress(method, "units", len(calls))
        if self.pool is None:
            run = [lambda a=a: getattr(self.here, method)(*a) for a in calls]
        else:
            order = sorted(range(len(calls)), key=lambda i: -cost[i]) if cost else range(len(calls))
            futures = {i: self.pool.submit(_in_worker, method, *calls[i]) for i in order}
            run = [futures[i].result for i in range(len(calls))]
        results = []
        for get in run:
            results.append(get())
            progress.step()
        return results

    def tokenize(self, files: list[InputFile], cfg: DataConfig, work: str) -> list[dict[str, Any]]:
        """Pass 1; each file's stats, in file order. On workers, a file of more than two batches (`chunk_chars`) is
        read here and its batches are encoded on the workers, at most 2 per worker in flight (one big file does
        not keep one worker busy while the others wait); the other files go whole, costliest first, after them.
        The batches, chunks and stats are the ones `tokenize_file` makes."""
        cost = [_text_bytes(f) for f in files]
        if self.pool is None:
            return self.map("tokenize", [(f,) for f in files])
        # Reading a file here delays its first batch by the reading of that batch; from three batches on it pays.
        big = sorted((i for i, f in enumerate(files) if cost[i] > 2 * cfg.chunk_chars and not file_done(f, work)),
                     key=lambda i: -cost[i])
        merges = {i: FileMerge(files[i], cfg, work) for i in big}
        batches = dict.fromkeys(big, 0)
        pending: collections.deque = collections.deque()  # (file, future) in submission order
        progress = _Progress("tokenize", f"batches of {len(big)} big file(s)")  # how many: known only at the end

        def merge_oldest() -> None:
            i, future = pending.popleft()
            merges[i].add(future.result())  # a file's batches complete into its merge in order
            progress.step()

        for i in big:
            for b, batch in enumerate(file_batches(files[i], cfg, merges[i])):
                while len(pending) >= 2 * self.n:
                    merge_oldest()
                pending.append((i, self.pool.submit(_in_worker, "encode", batch, chunk_path(files[i], work, b))))
                batches[i] = b + 1
        small = sorted((i for i in range(len(files)) if i not in merges), key=lambda i: -cost[i])
        whole = {i: self.pool.submit(_in_worker, "tokenize", files[i]) for i in small}
        while pending:
            merge_oldest()
        stats = {i: merges[i].finish() for i in big}
        for i in big:
            _log(f"tokenize: {files[i].path}: {batches[i]} batches across the workers")
        progress = _Progress("tokenize", "whole files", len(whole))
        for i, future in whole.items():
            stats[i] = future.result()
            progress.step()
        return [stats[i] for i in range(len(files))]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


def prepare_shards(
    cfg: DataConfig, files: list[InputFile], skipped: list[str], chash: str, vocab_sha: str, tokenizer_path: str
) -> dict[str, Any]:
    """The three passes, on the running Ray cluster or (inputs up to data.local_max_bytes, `runs_in_process`) on
    this machine without Ray (`_Local`); writes shards and the manifest; returns the manifest."""
    start = time.perf_counter()
    work = work_dir(cfg, chash, vocab_sha)
    check_pair(join(cfg.output, "vocab.txt"), tokenizer_path, vocab_sha)  # one line on the driver, before actors
    discard_other_work(cfg.output, work)

    worker_args = (tokenizer_path, dataclasses.asdict(cfg), work, vocab_sha)
    local = _Local(local_workers(cfg, files), worker_args) if runs_in_process(cfg, files) else None
    try:
        return _three_passes(cfg, files, skipped, chash, vocab_sha, tokenizer_path, work, local, start)
    finally:
        if local is not None:
            local.close()


def _three_passes(
    cfg: DataConfig, files: list[InputFile], skipped: list[str], chash: str, vocab_sha: str, tokenizer_path: str,
    work: str, local: _Local | None, start: float,
) -> dict[str, Any]:
    cfg_dict = dataclasses.asdict(cfg)
    fs, out_p = filesystem(cfg.output)
    if local is not None:
        done_before = len(fs.glob(join(filesystem(work)[1], "tok", "*.done.json")))
        _log(f"tokenize: {len(files)} input file(s) {local.where()} ({sum(f.size for f in files)} bytes <= "
             f"data.local_max_bytes)" + (f"; resuming, {done_before} already done" if done_before else ""))
        file_stats = sorted(local.tokenize(files, cfg, work), key=lambda s: s["pool"])
    else:
        import ray

        from pipeline.core.launcher import quiet_ray_data

        cpus = _actor_cpus(cfg.num_actors)
        quiet_ray_data()  # the "[data]" lines are this stage's progress
        ray.data.DataContext.get_current().execution_options.preserve_order = True  # results in input order
        file_stats = _tokenize_pass(cfg, files, work, tokenizer_path, vocab_sha, cpus)
    reasons: Counter[str] = Counter()
    for s in file_stats:
        reasons.update(s["rejected_reasons"])
    docs_read = sum(s["documents_read"] for s in file_stats)
    docs_written = sum(s["documents_written"] for s in file_stats)
    if docs_written == 0:
        detail = ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())) or "no records"
        raise InputError(f"no usable document in {len(files)} input file(s) ({docs_read} read: {detail})")
    chunks = [c for s in file_stats for c in s["chunks"]]
    _log(f"tokenize: {docs_written}/{docs_read} documents, {sum(s['tokens'] for s in file_stats)} tokens, {len(chunks)} chunks")

    pool = merge_pool([s["pool"] for s in file_stats], cfg.random_pool_size)
    pa.default_memory_pool().release_unused()  # Arrow's allocator keeps freed pages otherwise (~250 MB at 8x)
    vocab = read_vocab(join(cfg.output, "vocab.txt"))
    if local is not None:
        units = _example_units(cfg, chunks, pool, work)
        calls = [(json.loads(u["chunks"]), pool, u["dest"]) for u in units]
        ex_chunks = _in_chunk_order(cfg, local.map("examples", calls, [u["tokens"] for u in units]))
    else:
        ex_chunks = _examples_pass(cfg, chunks, pool, work, tokenizer_path, vocab_sha, cpus)
    examples = sum(m["rows"] for m in ex_chunks)
    if examples == 0:
        raise InputError(f"the {docs_written} usable document(s) produced no example")

    plan = shard_plan(ex_chunks, cfg.num_shards, cfg.output)
    _log(f"shards: {examples} examples into {len(plan)} shard(s)")
    if fs.exists(join(out_p, "shards")):
        fs.rm(join(out_p, "shards"), recursive=True)  # leftovers of an interrupted run with this config
    if local is not None:
        results = local.map("shard", plan)
    else:  # plain tasks: a few shards do not need Ray Data's streaming machinery
        # SPREAD over the cluster's nodes, like Ray Data's actors (its default): plain tasks would otherwise fill
        # the driver's node first. Which node writes a shard never changes its bytes (two-node test).
        write = ray.remote(num_cpus=cpus, max_retries=2, scheduling_strategy="SPREAD")(write_shard)
        results = ray.get([write.remote(p, parts) for p, parts in plan])
    shards = sorted(results, key=lambda s: s["path"])
    nsp_pairs = sum(m["nsp_pairs"] for m in ex_chunks)
    manifest = {
        "documents_read": docs_read,
        "documents_written": docs_written,
        "documents_rejected": docs_read - docs_written,
        "rejected_reasons": dict(sorted(reasons.items())),
        "examples": examples,
        "tokens": sum(m["tokens"] for m in ex_chunks),
        "masked_tokens": sum(m["masked_tokens"] for m in ex_chunks),
        "nsp_random_fraction": (sum(m["nsp_random"] for m in ex_chunks) / nsp_pairs) if nsp_pairs else None,
        "seconds": round(time.perf_counter() - start, 3),
        "config": cfg_dict,
        "config_hash": chash,
        "vocab_sha256": vocab_sha,
        "shards": [{"path": f"shards/{s['path'].rsplit('/', 1)[-1]}", "rows": s["rows"], "sha256": s["sha256"]} for s in shards],
        "output": cfg.output,
        "masking": cfg.masking,
        "vocab_size": len(vocab),
        "special_token_ids": {t: vocab.index(t) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")},
        "input_files": len(files),
        "files_skipped": skipped,
        "source_tokens": sum(s["tokens"] for s in file_stats),
        "document_pieces": sum(s.get("pieces", 0) for s in file_stats),
    }
    if manifest["documents_read"] != manifest["documents_written"] + manifest["documents_rejected"] or sum(
        reasons.values()
    ) != manifest["documents_rejected"]:
        raise AssertionError("document accounting is inconsistent")  # a bug, not bad input
    write_bytes_atomic(join(cfg.output, "manifest.json"), json.dumps(manifest, indent=2, sort_keys=True).encode())
    try:
        fs.rm(join(out_p, "_work"), recursive=True)
    except FileNotFoundError:
        pass
    return manifest


# ---------------------------------------------------------------------------------------------- stage functions


@dataclasses.dataclass
class Plan:
    """What the data stages need, computed once on the driver: inputs, hashes, the output check."""

    cfg: DataConfig
    files: list[InputFile]
    skipped: list[str]
    vocab_source_sha: str | None
    config_hash: str
    vocab_key: str


def plan(cfg: DataConfig) -> Plan:
    """List the inputs, hash the config, and refuse an output prepared with a different config."""
    from pipeline.data.sources import expand_inputs, fingerprint

    files, skipped = expand_inputs(list(cfg.inputs))
    if not files:
        raise InputError(f"no readable input file under {', '.join(cfg.inputs)} (skipped: {len(skipped)})")
    vocab_sha = None
    if cfg.vocab:
        if not exists(cfg.vocab):
            raise InputError(f"vocabulary {cfg.vocab} does not exist")
        vocab_sha = hashlib.sha256(read_bytes(cfg.vocab)).hexdigest()
    chash = output_config_hash(cfg, fingerprint(files), vocab_sha)
    if cfg.vocab:
        vocab_key = config_hash({"vocab": vocab_sha, "lowercase": cfg.lowercase})
    else:
        vocab_key = config_hash(
            {"train": cfg.vocab_size, "lowercase": cfg.lowercase, "sample": cfg.vocab_sample_chars,
             "column": cfg.text_column, "inputs": fingerprint(files)}
        )
    manifest_path = join(cfg.output, "manifest.json")
    if exists(manifest_path) and not cfg.overwrite:
        try:
            old = json.loads(read_text(manifest_path)).get("config_hash", "?")
        except ValueError:
            old = "unreadable"
        if old != chash:
            raise OutputExistsError(
                f"output {cfg.output} holds a dataset prepared with a different config or inputs "
                f"(config_hash {str(old)[:12]} != {chash[:12]}); choose another --output or pass --data.overwrite true"
            )
    return Plan(cfg, files, skipped, vocab_sha, chash, vocab_key)


def _vocab_result(cfg: DataConfig, sha: str) -> dict[str, Any]:
    return {"vocab": join(cfg.output, "vocab.txt"), "tokenizer": join(cfg.output, "tokenizer.json"), "vocab_sha256": sha}


def vocab_done(p: Plan) -> dict[str, Any] | None:
    """The vocabulary result when vocab.txt, tokenizer.json and vocab.meta.json agree with each other and with
    this plan's vocabulary key; otherwise None and the stage runs again (it rewrites all three)."""
    meta = join(p.cfg.output, "vocab.meta.json")
    if not (exists(meta) and exists(join(p.cfg.output, "tokenizer.json")) and exists(join(p.cfg.output, "vocab.txt"))):
        return None
    try:
        m = json.loads(read_text(meta))
    except ValueError:
        return None
    sha = sha256_bytes(read_bytes(join(p.cfg.output, "vocab.txt")))
    tok_sha = sha256_bytes(read_bytes(join(p.cfg.output, "tokenizer.json")))
    if m.get("key") != p.vocab_key or m.get("vocab_sha256") != sha or m.get("tokenizer_sha256") != tok_sha:
        return None
    return _vocab_result(p.cfg, sha)


class _Sample:
    """The vocabulary-training sample, re-iterable (the trainer reads it twice) without holding it in memory."""

    def __init__(self, p: Plan) -> None:
        self.p = p

    def __iter__(self) -> Any:
        return _sample_texts(self.p)


def _sample_texts(p: Plan) -> Any:
    """Documents for vocabulary training: up to vocab_sample_chars, spread evenly over the input files, in
    file order (sorted paths) and record order, so the sample is a function of the inputs."""
    budget = p.cfg.vocab_sample_chars // max(1, len(p.files)) + 1
    for f in p.files:
        used = 0
        for item in read_documents(f, p.cfg.text_column):
            if isinstance(item, Document):
                yield item.text[: budget - used]
                used += len(item.text)
                if used >= budget:
                    break


def run_vocab(p: Plan) -> dict[str, Any]:
    """Load the given vocabulary or train one; write vocab.txt + tokenizer.json (+ a key marker) to the output,
    holding the output's writer lock (a second writer fails at once, see `pipeline.io.output_lock`)."""
    with output_lock(p.cfg.output):
        return _run_vocab(p)


def _run_vocab(p: Plan) -> dict[str, Any]:
    from pipeline.data.tokenizer import load_tokenizer, tokenizer_json, train_wordpiece, vocab_bytes

    cfg = p.cfg
    fs, out = filesystem(cfg.output)
    if cfg.overwrite:
        for stale in ("manifest.json", "shards", "_work"):
            if fs.exists(join(out, stale)):
                fs.rm(join(out, stale), recursive=True)
    if cfg.vocab:
        local = cfg.vocab
        if "://" in cfg.vocab:  # tokenizers reads local files only
            import tempfile

            local = os.path.join(tempfile.mkdtemp(), cfg.vocab.rsplit("/", 1)[-1])
            with open(local, "wb") as fh:
                fh.write(read_bytes(cfg.vocab))
        tok = load_tokenizer(local, lowercase=cfg.lowercase)
        _log(f"vocab: using {cfg.vocab} ({tok.get_vocab_size()} tokens)")
    else:
        _log(f"vocab: training a WordPiece vocabulary of {cfg.vocab_size} on up to {cfg.vocab_sample_chars} chars")
        tok = train_wordpiece(_Sample(p), cfg.vocab_size, cfg.lowercase)
    vb = vocab_bytes(tok)
    sha = hashlib.sha256(vb).hexdigest()
    write_bytes_atomic(join(cfg.output, "vocab.txt"), vb)
    tj = tokenizer_json(tok).encode()
    write_bytes_atomic(join(cfg.output, "tokenizer.json"), tj)
    meta = {"key": p.vocab_key, "vocab_sha256": sha, "tokenizer_sha256": sha256_bytes(tj)}
    write_bytes_atomic(join(cfg.output, "vocab.meta.json"), json.dumps(meta).encode())
    return _vocab_result(cfg, sha)


def _summary(m: dict[str, Any]) -> dict[str, Any]:
    keys = ("documents_read", "documents_written", "documents_rejected", "rejected_reasons", "examples", "tokens",
            "masked_tokens", "nsp_random_fraction", "config_hash", "vocab_sha256", "seconds")
    return {k: m[k] for k in keys}


def shards_done(p: Plan) -> dict[str, Any] | None:
    path = join(p.cfg.output, "manifest.json")
    if not exists(path) or not exists(join(p.cfg.output, "vocab.txt")):
        return None
    try:
        m = json.loads(read_text(path))
    except ValueError:
        return None
    sha = hashlib.sha256(read_bytes(join(p.cfg.output, "vocab.txt"))).hexdigest()
    if m.get("config_hash") != p.config_hash or m.get("vocab_sha256") != sha:
        return None
    return _summary(m)


def run_shards(p: Plan, vocab: dict[str, Any]) -> dict[str, Any]:
    """The three passes, holding the output's writer lock."""
    with output_lock(p.cfg.output):
        if not runs_in_process(p.cfg, p.files):
            import ray

            if not ray.is_initialized():
                ray.init()
        m = prepare_shards(p.cfg, p.files, p.skipped, p.config_hash, vocab["vocab_sha256"], vocab["tokenizer"])
    return _summary(m)


def run_validate(p: Plan) -> PreparedDataset:
    """Validate the output (schema, rows, sha256): the dataset downstream stages consume."""
    return PreparedDataset.load(p.cfg.output)


def check_paths(cfg: DataConfig) -> None:
    """Every input (and a given vocabulary) exists: checked on the driver before Ray starts."""
    import os

    _check_given = [("data.inputs", p) for p in cfg.inputs] + ([("data.vocab: vocabulary", cfg.vocab)] if cfg.vocab else [])
    if not cfg.inputs:
        raise InputError("data.inputs is empty: give at least one file or folder (--data.inputs PATH)")
    for field_name, path in _check_given:
        if not exists(path):
            raise InputError(f"{field_name}: {path} does not exist (relative paths resolve against the current "
                             f"directory, {os.getcwd()})")


def data_stages(cfg: DataConfig, prefix: str = "") -> list[Stage]:
    """vocab -> shards -> validate for one DataConfig (paths already absolute, see config.resolve_paths).

    Planning lists the inputs and checks the output directory here, before any stage runs. The shards stage is
    done when `output/manifest.json` carries the same config hash (config fields, input fingerprint, given
    vocabulary) and the vocabulary it was built with; "validate" always runs (checksums) and returns the
    `PreparedDataset`. `prefix` names a later phase's stages apart (`phase1/vocab`, ...).
    """
    p = plan(cfg)
    vocab, shards = f"{prefix}vocab", f"{prefix}shards"
    return [
        Stage(vocab, lambda deps: run_vocab(p), done=lambda deps: vocab_done(p),
              describe=lambda r: f"vocab_sha256 {r['vocab_sha256'][:12]}"),
        Stage(shards, lambda deps: run_shards(p, deps[vocab]), deps=(vocab,), done=lambda deps: shards_done(p),
              describe=lambda r: (f"documents read/written/rejected {r['documents_read']}/{r['documents_written']}/"
                                  f"{r['documents_rejected']}, {r['examples']:,} examples, {r['tokens']:,} tokens")),
        Stage(f"{prefix}validate", lambda deps: run_validate(p), deps=(shards,),
              describe=lambda d: f"{len(d.shards)} shards checked, {d.output}"),
    ]
