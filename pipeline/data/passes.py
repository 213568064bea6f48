"""The three passes' bodies, engine-free: each function takes one unit of work and writes its result by rename.

    files ─► [tokenize] ─► token chunks + pool candidates ─► pool (bottom-k, pipeline.data.pool) ─►
            [examples] ─► example chunks ─► [shards] ─► shards/*.parquet

1. tokenize: a file's documents are read, bad ones rejected with reasons, split into pieces and batches of about
   `chunk_chars` characters (`file_batches`); each batch's sentences are encoded (`SentenceEncoder`: the
   tokenizer's ids, no special tokens) into one token chunk plus its bottom-k random-pool windows
   (`encode_pieces`); a file's batches are merged in order into its stats, pool file and done marker
   (`FileMerge`). `tokenize_file` runs the three in a row; the driver may instead spread one big file's batches
   over several workers (pipeline.data.prepare) with the same chunks, pool and stats.
2. examples: one unit is a run of consecutive token chunks; NSP pairs (or MLM-only packs) per document with an
   RNG from (seed, doc_id, dupe) (with `data.pack_documents`: documents back to back in full rows, their pieces'
   lengths in `doc_lengths`), masked (static) with pipeline.masking, shuffled within the unit; one example
   chunk (`examples_for_chunks`).
3. shards: example chunks (in a hashed order, `in_chunk_order`) form one sequence cut into `num_shards`
   contiguous parts whose sizes differ by at most one row (`shard_plan`); each shard is streamed to a temporary
   name, then renamed (`write_shard`). Mixing beyond a chunk (~1M tokens) is the loader's job.

Every file appears by rename and every unit first looks for its finished result, so a killed run resumes at the
last finished unit and writes the same bytes. Paths are fsspec paths/URIs (local, file://, s3://).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import DataConfig
from pipeline.data.arrow import arrow, fixed_rows_array, list_array, list_rows, numpy_of, string_array
from pipeline.data.dataset import SOURCE_FIELD, schema_of, shard_schema
from pipeline.data.examples import (
    RandomPool,
    derive_seed,
    group_consecutive,
    piece_id,
    split_document,
    split_sentences,
    unit_rows,
)
from pipeline.data.extracted import KEPT_KINDS, keep, kept_records
from pipeline.data.masking import MaskingPolicy, mask_rows
from pipeline.data.pool import PoolCandidates, write_pool
from pipeline.data.signing import DedupParams, records
from pipeline.data.sources import Document, InputFile, Rejected, Skipped, read_documents, read_records
from pipeline.data.tokenizer import SentenceEncoder
from pipeline.data.wiki import WikiOptions
from pipeline.storage.io import (
    commit,
    exists,
    filesystem,
    join,
    make_parent,
    read_table,
    read_text,
    remove,
    sha256_file,
    temp_name,
    write_bytes_atomic,
    write_parquet_atomic,
    writing,
)

TOKEN_SCHEMA = pa.schema(
    [("doc_id", pa.int64()), ("tokens", pa.list_(pa.int32())), ("sent_lens", pa.list_(pa.int32()))]
)


# ---------------------------------------------------------------------------------------------- pass 0: dedup


def dedup_params(cfg: DataConfig) -> DedupParams:
    """The dedup pass's parameters from data.dedup, data.dedup_threshold, data.dedup_num_perm."""
    return DedupParams(mode=cfg.dedup, threshold=cfg.dedup_threshold, num_perm=cfg.dedup_num_perm)


def sign_unit(f: InputFile, cfg: DataConfig, path: str, kept: str | None = None) -> dict[str, Any]:
    """Pass 0 (dedup): every document of one unit as a compact record, written to `path`: its doc_id (the keep
    rule's order), its name (for duplicates.jsonl), the 16-byte key of its normalised text and, for near
    duplicates, its MinHash signature. Documents are signed one at a time, each a window at a time
    (`signing.records`), and dropped after, so memory is bounded by the records, whatever a document's size.
    With `kept` (`text_path`), every record read is also written there for the tokenize pass, before `path`
    (pipeline.data.extracted: one read per document). Skipped when `path` exists (resume)."""
    if exists(path):
        return {"path": path}
    ids: list[int] = []
    names: list[str] = []
    items = read_documents(f, cfg.text_column, wiki_options(cfg), cfg.max_record_bytes)

    def texts() -> Iterator[str]:
        for item in items if kept is None else keep(items, kept):
            if isinstance(item, Document):
                ids.append(item.doc_id)
                names.append(item.name)
                yield item.text
            del item  # the text is not held while the next document is read

    key, sig = records(texts(), dedup_params(cfg))
    cols = [arrow(ids, pa.int64()), string_array(names), arrow(key[:, 0], pa.uint64()), arrow(key[:, 1], pa.uint64())]
    names_ = ["doc_id", "name", "exact_hi", "exact_lo"]
    if sig is not None:
        cols.append(fixed_rows_array(sig))
        names_.append("sig")
    write_parquet_atomic(path, pa.table(cols, names=names_), compression="lz4")
    return {"path": path}


def text_path(f: InputFile, work: str) -> str | None:
    """Where the dedup pass keeps unit `f`'s records for the tokenize pass (pipeline.data.extracted); None for a
    kind that is read again (a book, Parquet or datasets rows: `KEPT_KINDS`)."""
    return join(work, "text", f"{unit_name(f)}.parquet") if f.kind in KEPT_KINDS else None


def unit_records(f: InputFile, cfg: DataConfig, work: str, skipped: list[Skipped]) -> Iterator[Document | Rejected]:
    """`read_records` of unit `f`: from the records the dedup pass kept when it kept them (one read per
    document), else from the unit itself; the same records either way."""
    kept = text_path(f, work)
    if kept is None or not exists(kept):
        yield from read_records(f, cfg.text_column, wiki_options(cfg), skipped, cfg.max_record_bytes)
        return
    for item in kept_records(kept):
        if isinstance(item, Skipped):
            skipped.append(item)
        else:
            yield item


# ---------------------------------------------------------------------------------------------- pass 1: tokenize


def tokenize_file(
    f: InputFile, tok: SentenceEncoder | Any, cfg: DataConfig, work: str, dropped: Mapping[int, str] | None = None
) -> dict[str, Any]:
    """Read, check, split and encode one input file into token chunks and pool candidates; returns its stats.
    `tok` is a SentenceEncoder (its word cache lasts across files) or a `tokenizers.Tokenizer`.

    Skipped (stats read back) when the file's done marker exists, so a resumed run does not redo it. The same
    three steps also run apart, the batches of one big file on several workers (`prepare.tokenize_pass`).
    """
    if file_done(f, work):
        return read_done(f, work)
    if not isinstance(tok, SentenceEncoder):
        tok = SentenceEncoder(tok)
    merge = FileMerge(f, cfg, work)
    for b, batch in enumerate(file_batches(f, cfg, merge, dropped)):
        merge.add(encode_pieces(batch, chunk_path(f, work, b), tok, cfg))
    return merge.finish()


def unit_name(f: InputFile) -> str:
    """A unit's name in the work directory: its file's index, and for a byte range of a file (a multistream
    dump's streams, `sources.split_units`) the range's offset.

    >>> unit_name(InputFile("a", "txt", 3)), unit_name(InputFile("d", "wiki_multistream", 0, offset=591, length=9))
    ('f000003', 'f000000-o0000000000591')
    """
    return f"f{f.index:06d}" + (f"-o{f.offset:013d}" if f.length else "")


def wiki_options(cfg: DataConfig) -> WikiOptions:
    """What of a dump page's wikitext is kept (data.wiki_keep_lists, data.wiki_keep_headings)."""
    return WikiOptions(keep_lists=cfg.wiki_keep_lists, keep_headings=cfg.wiki_keep_headings)


def done_path(f: InputFile, work: str) -> str:
    return join(work, "tok", f"{unit_name(f)}.done.json")


def file_done(f: InputFile, work: str) -> bool:
    return exists(done_path(f, work))


# The work records (done markers, example chunks' metas) name the work's files relative to the work directory, so
# an unfinished output that was moved, or a shared mount seen at another path on another node, still resumes.
def relative_to(work: str, path: str) -> str:
    """`path` relative to `work` when it is inside it (else unchanged).

    >>> relative_to("/out/_work/ab", "/out/_work/ab/tok/f000001.pool.parquet"), relative_to("/out/_work/ab", "/x/y")
    ('tok/f000001.pool.parquet', '/x/y')
    """
    prefix = work.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def located(work: str, path: str) -> str:
    """A work record's path back under `work`; a record from before paths were relative keeps its absolute path.

    >>> located("/moved/_work/ab", "tok/f000001.pool.parquet"), located("/moved/_work/ab", "/out/_work/ab/x")
    ('/moved/_work/ab/tok/f000001.pool.parquet', '/out/_work/ab/x')
    """
    return path if path.startswith("/") or "://" in path else join(work, path)


def read_done(f: InputFile, work: str) -> dict[str, Any]:
    """A finished file's stats from its done marker, with its chunks' and pool's paths under `work`."""
    stats = json.loads(read_text(done_path(f, work)))
    stats["pool"] = located(work, stats["pool"])
    stats["chunks"] = [{**c, "path": located(work, c["path"])} for c in stats["chunks"]]
    return stats


def chunk_path(f: InputFile, work: str, b: int) -> str:
    """Batch `b` of file `f`'s token chunk (a batch whose pieces have no token writes none: numbers may skip)."""
    return join(work, "tok", f"{unit_name(f)}-c{b:05d}.parquet")


Batch = list[tuple[Document, bool]]  # (piece, whether it is its document's last piece)


def file_batches(
    f: InputFile, cfg: DataConfig, merge: FileMerge, dropped: Mapping[int, str] | None = None
) -> Iterator[Batch]:
    """The pieces of a file's documents in batches of about `chunk_chars` characters, in order (each batch is one
    token chunk). Records read and rejected are counted into `merge`; a document in `dropped` (doc_id -> reason,
    from the dedup pass) is rejected with its reason."""
    batch: Batch = []
    chars = 0
    dropped = dropped or {}
    for item in unit_records(f, cfg, merge.work, merge.stats["skipped_files"]):
        merge.stats["documents_read"] += 1
        if isinstance(item, Document) and item.doc_id in dropped:
            merge.reasons[dropped[item.doc_id]] += 1
        elif isinstance(item, Document):
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
    cands = PoolCandidates(
        np.array(prio, np.int64),
        np.array(docs, np.int64),
        np.array(wins, np.int64),
        np.array(n_sents, np.int64),
        sent_lens[sent_lens > 0],
        all_ids,
    )
    out["pool"] = cands.bottom(cfg.random_pool_size)
    return out


class FileMerge:
    """One file's stats from its batches' results, added in batch order: documents (one counts once, written
    when any of its pieces has tokens), pieces, tokens, chunks, and the file's bottom-k pool candidates."""

    def __init__(self, f: InputFile, cfg: DataConfig, work: str) -> None:
        self.f, self.cfg, self.work = f, cfg, work
        self.stats: dict[str, Any] = {
            "file": f.path,
            "documents_read": 0,
            "documents_written": 0,
            "pieces": 0,
            "tokens": 0,
            "sentences": 0,
            "chunks": [],
            "skipped_files": [],
        }
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
        stats["pool"] = write_pool(join(self.work, "tok", f"{unit_name(self.f)}.pool.parquet"), pool)
        stats["rejected_reasons"] = dict(sorted(self.reasons.items()))
        stats["documents_rejected"] = sum(self.reasons.values())
        record = {
            **stats,
            "pool": relative_to(self.work, stats["pool"]),
            "chunks": [{**c, "path": relative_to(self.work, c["path"])} for c in stats["chunks"]],
        }
        write_bytes_atomic(done_path(self.f, self.work), json.dumps(record).encode())
        if (kept := text_path(self.f, self.work)) is not None:
            remove(kept)  # the unit's kept records: read for the last time
        return stats


def text_bytes(f: InputFile) -> float:
    """About how much text a file (or a unit of one) holds, for scheduling only: compressed files hold ~3x their
    size."""
    return (f.length or f.size) * (3 if f.path.endswith((".gz", ".bz2", ".xz", ".zst")) else 1)


def split_rows(tokens: np.ndarray, lens: np.ndarray) -> list[np.ndarray]:
    """Views of `tokens`, one per length (slices: np.split costs ~20x more per piece)."""
    ends = np.cumsum(lens).tolist()
    return [tokens[a:b] for a, b in zip([0, *ends[:-1]], ends)]


# ---------------------------------------------------------------------------------------------- pass 2: examples


def example_units(cfg: DataConfig, chunks: list[dict[str, Any]], work: str) -> list[dict[str, Any]]:
    """Pass 2's units of work: consecutive token chunks of ~chunk_chars of text, each with its output path. In a
    mixture (chunks with a `source`) a unit never spans two sources, so each row has one (`source`, its name)."""
    target = max(1, cfg.chunk_chars // 4)
    if cfg.sources:  # runs of one source's chunks, each grouped on its own
        runs = [list(g) for _, g in itertools.groupby(range(len(chunks)), key=lambda i: chunks[i]["source"])]
        units = [
            [run[i] for i in u] for run in runs for u in group_consecutive([chunks[i]["tokens"] for i in run], target)
        ]
    else:
        units = group_consecutive([c["tokens"] for c in chunks], target)
    return [
        {
            "chunks": [chunks[i]["path"] for i in u],
            "dest": join(work, "ex", f"e{k:06d}.parquet"),
            "tokens": sum(chunks[i]["tokens"] for i in u),
            **({"source": cfg.sources[chunks[u[0]]["source"]].name} if cfg.sources else {}),
        }
        for k, u in enumerate(units)
    ]


def in_chunk_order(cfg: DataConfig, metas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Example chunks in a hashed order, which mixes sources across shards (books and wiki not apart)."""
    return sorted(metas, key=lambda m: (derive_seed(cfg.seed, "chunk-order", m["path"].rsplit("/", 1)[-1]), m["path"]))


def examples_for_chunks(
    chunk_paths: list[str],
    pool: RandomPool,
    cfg: DataConfig,
    policy: MaskingPolicy,
    cls_id: int,
    sep_id: int,
    out_path: str,
    source: str | None = None,
    middle: int = 1,
) -> dict[str, Any]:
    """Build (and, for static masking, mask) the examples of some token chunks; write them; return counts.
    `source`: in a mixture, the name of the one source the chunks are of, written in every row's `source`;
    `middle`: separators between A and B in an NSP pair (the tokenizer's template, `specials.Specials`).

    Skipped (counts read back) when `out_path` is already complete, so a resumed run does not redo it.
    """
    meta_path = out_path + ".json"
    if exists(meta_path):
        return {**json.loads(read_text(meta_path)), "path": out_path}  # its own path, wherever the output is now
    t = pa.concat_tables([read_table(p) for p in chunk_paths])
    doc_ids = numpy_of(t.column("doc_id"))
    toks = list_rows(t.column("tokens"))
    lens = list_rows(t.column("sent_lens"))
    docs = [(int(d), split_rows(tk, ln)) for d, tk, ln in zip(doc_ids, toks, lens)]
    ids, types, nsp, ex_ids, doc_lens = unit_rows(docs, pool, cfg, cls_id, sep_id, out_path.rsplit("/", 1)[-1], middle)
    # Google shuffles all instances; here each unit's examples are shuffled (a deterministic permutation keyed
    # by the unit's name) and the units themselves are put in a hashed order before sharding (prepare_shards).
    perm = np.random.default_rng(derive_seed(cfg.seed, "shuffle", out_path.rsplit("/", 1)[-1])).permutation(len(ids))
    ids, types = [ids[i] for i in perm], [types[i] for i in perm]
    nsp, ex_ids, doc_lens = [nsp[i] for i in perm], [ex_ids[i] for i in perm], [doc_lens[i] for i in perm]
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
            *([list_array(doc_lens, pa.int32())] if cfg.pack_documents else []),
            *([pa.array([source] * len(ids), SOURCE_FIELD.type)] if source is not None else []),
        ],
        schema=shard_schema(cfg.pack_documents, source is not None),
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
        **({"source": source} if source is not None else {}),
    }
    write_bytes_atomic(meta_path, json.dumps({**meta, "path": out_path.rsplit("/", 1)[-1]}).encode())
    return meta


# ---------------------------------------------------------------------------------------------- pass 3: shards


def balanced_ranges(n: int, k: int) -> list[tuple[int, int]]:
    """k contiguous [start, stop) ranges covering n rows, sizes differing by at most one.

    >>> balanced_ranges(10, 3)
    [(0, 4), (4, 7), (7, 10)]
    """
    bounds = [0]
    for i in range(k):
        bounds.append(bounds[-1] + n // k + (i < n % k))
    return list(zip(bounds[:-1], bounds[1:]))


def write_shard(path: str, parts: list[tuple[str, int, int]]) -> dict[str, Any]:
    """Stream row slices [(chunk path, start, stop), ...] into one zstd Parquet shard, atomically. In a mixture
    (rows with a `source`) it also counts each source's rows and tokens (`source_rows`, `source_tokens`)."""
    fs, p = filesystem(path)
    tmp = temp_name(p)
    rows = 0
    per_source: dict[str, list[int]] = {}
    with writing(path, fs, tmp):
        make_parent(fs, p)
        tables = (read_table(chunk).slice(a, b - a) for chunk, a, b in parts)
        first = next(tables, None)  # its columns say whether the rows are packed (doc_lengths), sourced (source)
        schema = schema_of(first.column_names if first is not None else [])
        with fs.open(tmp, "wb") as f, pq.ParquetWriter(f, schema, compression="zstd") as w:
            for t in itertools.chain([first] if first is not None else [], tables):
                w.write_table(t)
                rows += t.num_rows
                if SOURCE_FIELD.name in t.column_names:  # a chunk's rows are of one source
                    for name, n, tokens in source_sums(t):
                        got = per_source.setdefault(name, [0, 0])
                        got[0], got[1] = got[0] + n, got[1] + tokens
        commit(fs, tmp, p)
    out = {"path": path, "rows": rows, "sha256": sha256_file(path)}
    if schema.get_field_index(SOURCE_FIELD.name) >= 0:
        out["source_rows"] = {k: v[0] for k, v in sorted(per_source.items())}
        out["source_tokens"] = {k: v[1] for k, v in sorted(per_source.items())}
    return out


def source_sums(table: pa.Table) -> list[tuple[str, int, int]]:
    """(source, rows, tokens) of a table with a `source` column, by source name.

    >>> source_sums(pa.table({"source": ["b", "a", "b"], "num_tokens": pa.array([3, 4, 5], pa.int32())}))
    [('a', 1, 4), ('b', 2, 8)]
    """
    g = (
        table.select(["source", "num_tokens"])
        .group_by("source")
        .aggregate([("num_tokens", "count"), ("num_tokens", "sum")])
    )
    return sorted(zip(g["source"].to_pylist(), g["num_tokens_count"].to_pylist(), g["num_tokens_sum"].to_pylist()))


def shard_plan(
    chunks: list[dict[str, Any]], num_shards: int, out_dir: str
) -> list[tuple[str, list[tuple[str, int, int]]]]:
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
