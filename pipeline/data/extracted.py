"""One read per document: what the dedup pass extracted from a unit, kept for the tokenize pass.

    unit ─► read_documents ─► [sign] ─► dd/<unit>.parquet (keys, signatures)
                                 └────► text/<unit>.parquet (every record read, in order)
                                               └─► [tokenize] reads this instead of the unit; removed when done

With dedup on (the default), pass 0 (`passes.sign_unit`) and pass 1 (`passes.tokenize_file`) both need every
document's text. Reading a unit means decompressing and parsing it, and for a Wikipedia dump converting wikitext to
text: the costliest steps of the whole preparation (bench/studies/one_read.py: reading a dump's unit takes about four
times the CPU time of tokenizing it). So the signing pass writes each record it reads to `text/<unit>.parquet` in the
work directory (zstd level 1: 2.8x smaller than the UTF-8 text of the shared wiki articles, 4.8x on
bench/data/wiki_dump.py's repetitive dump), and the tokenize pass reads that file instead of the unit
(`passes.unit_records`); for the kinds whose reading parses (`KEPT_KINDS`), not for text that is read as cheaply
as its copy would be. A unit's file is written by rename before its signatures (so a unit whose signatures exist has
its text kept, unless its tokens are already done) and removed as soon as the unit's tokenize done marker is
written (`FileMerge.finish`); the work directory, and with it anything an interrupted run left, goes when the
manifest is written. A resumed run signs the units without signatures again (writing their text) and tokenizes
the units without a done marker from their kept text, or from the unit itself when there is none (work of an
earlier version, or a unit that was signed and tokenized already): the records are the same either way.
Between the passes the work directory holds the whole corpus's text, compressed: for English Wikipedia's ~20 GB
of text, about 7 GB.

Why this and not the other way the issue names (signatures computed inside the tokenize pass's one read,
duplicates dropped before examples are built): which documents are dropped depends on every earlier document of
the corpus, so the tokenize pass cannot know them while it reads; and its output depends on them: the token
chunks are cut every `chunk_chars` characters of *kept* text, the random pool is a bottom-k over kept documents,
and the example units follow the chunks. Keeping the shards byte-identical that way takes a further pass over
every token chunk (read, drop, cut again, write, recompute the pool, with its own resume records), after
tokenizing the duplicates for nothing. Measured on four units of bench/data/wiki_dump.py's dump
(bench/studies/one_read.py --components, CPU time against dedup off's read + tokenize of the same units): this
way's extra is 2.0% (writing the records 1.3%, reading them back 0.7%); the other way's floor, only re-reading and
re-writing the token chunks (0.6%) and tokenizing the 9.1% of documents it then drops (1.9%), is 2.5%, before any
of that pass's own work.
With fewer duplicates (under about 7%) that floor falls below 2.0%, but it leaves out the pass itself (a pass
over all chunks on every worker, the pool recomputed, another resume state), which was not built; this way is
measured whole, is the simpler one, and is kept.

A record keeps its fields exactly: `Document(doc_id, source, text, name)`, `Rejected(source, record, reason)`,
`Skipped(path, reason)`, in reading order (tests/test_extracted.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.data.sources import Document, Item, Rejected, Skipped
from pipeline.storage.io import commit, filesystem, make_parent, temp_name, writing

SCHEMA = pa.schema(
    [
        ("kind", pa.int8()),  # DOCUMENT, REJECTED or SKIPPED
        ("id", pa.int64()),  # a document's doc_id, a rejection's record number
        ("source", pa.binary()),  # the file (a skip's path)
        ("name", pa.binary()),  # a document's name
        ("text", pa.large_binary()),  # a document's text (one may exceed 2 GiB of a 32-bit column's offsets)
        ("reason", pa.binary()),  # a rejection's or a skip's reason
    ]
)
"""Strings are kept as their UTF-8 bytes with surrogates passed through (`_encode`): a path decoded with Python's
surrogateescape is no valid UTF-8, and comes back the same str."""
DOCUMENT, REJECTED, SKIPPED = 0, 1, 2

KEPT_KINDS = frozenset({"jsonl", "wikiext_json", "wikiext", "wiki_xml", "wiki_multistream"})
"""The kinds whose records are kept: reading them parses (JSON, `<doc>` blocks, XML and wikitext), which costs
more than writing and reading the records back (per unit, on one core: a dump's 0.34M characters read in 662 ms
against 25 ms kept and read back; pydocs.jsonl.gz's 4.6M in 321 against 85 ms, plain .jsonl 169-281 against 80).
Books (.txt, .txt.gz), Parquet and datasets rows are text already: read again (Genesis, 0.2M characters: 6.6 ms
read against 8.7 kept and read back; gzipped 11.8 against 12.5)."""

ROW_GROUP_CHARS = 1 << 22
"""Characters of text buffered before a row group is written (and read back at a time): memory, not bytes."""


def _encode(s: str | None) -> bytes | None:
    return None if s is None else s.encode("utf-8", "surrogatepass")


def _decode(b: bytes | None) -> str | None:
    return None if b is None else b.decode("utf-8", "surrogatepass")


def _row(item: Item) -> tuple[int, int, str, str | None, str | None, str | None]:
    if isinstance(item, Document):
        return DOCUMENT, item.doc_id, item.source, item.name, item.text, None
    if isinstance(item, Rejected):
        return REJECTED, item.record, item.source, None, None, item.reason
    return SKIPPED, 0, item.path, None, None, item.reason


def _item(kind: int, id_: int, source: str, name: str | None, text: str | None, reason: str | None) -> Item:
    if kind == DOCUMENT:
        return Document(id_, source, text, name)  # type: ignore[arg-type]
    if kind == REJECTED:
        return Rejected(source, id_, reason)  # type: ignore[arg-type]
    return Skipped(source, reason)  # type: ignore[arg-type]


def keep(items: Iterable[Item], path: str) -> Iterator[Item]:
    """`items`, passed through as they come, each also written to `path` (zstd Parquet, by rename after the last
    one). Only the current row group's records are held (`ROW_GROUP_CHARS`). A generator closed before its end
    removes its temporary file and leaves none at `path`.

    >>> items = [Document(7, "a.txt", "Some text.", "a"), Rejected("b.jsonl", 3, "empty"), Skipped("c", "unreadable")]
    >>> list(keep(items, "memory://kept/u.parquet")) == items == list(kept_records("memory://kept/u.parquet"))
    True
    """
    fs, p = filesystem(path)
    tmp = temp_name(p)
    with writing(path, fs, tmp):  # a storage error names the file; the reader's own errors pass unchanged
        make_parent(fs, p)
        out = fs.open(tmp, "wb")
        w = pq.ParquetWriter(out, SCHEMA, compression="zstd")
    try:
        rows: list[tuple] = []
        chars = 0
        for item in items:
            rows.append(_row(item))
            chars += len(rows[-1][4] or "")
            if chars >= ROW_GROUP_CHARS:
                with writing(path, fs, tmp):
                    w.write_table(_table(rows))
                rows, chars = [], 0
            yield item
        with writing(path, fs, tmp):
            w.write_table(_table(rows))
            w.close()
            out.close()
            commit(fs, tmp, p)
    except BaseException:  # GeneratorExit included: an unfinished file is never left behind
        with contextlib.suppress(OSError):
            w.close()
            out.close()
        with contextlib.suppress(FileNotFoundError):
            fs.rm(tmp)
        raise


def _table(rows: list[tuple]) -> pa.Table:
    cols = list(zip(*rows)) if rows else [()] * len(SCHEMA)
    return pa.Table.from_arrays(
        [pa.array(cols[0], pa.int8()), pa.array(cols[1], pa.int64())]
        + [pa.array([_encode(s) for s in col], t.type) for col, t in zip(cols[2:], list(SCHEMA)[2:])],
        schema=SCHEMA,
    )


def kept_records(path: str) -> Iterator[Item]:
    """The records `keep` wrote to `path`, in order, a row group at a time."""
    fs, p = filesystem(path)
    with fs.open(p, "rb") as f:
        pf = pq.ParquetFile(f)
        for g in range(pf.num_row_groups):
            cols: list[list[Any]] = [c.to_pylist() for c in pf.read_row_group(g).columns]
            for kind, id_, *strings in zip(*cols):
                yield _item(kind, id_, *map(_decode, strings))
            del cols
