"""Readers of Arrow tables: Parquet files and `datasets` save_to_disk directories, one record a row.

A Parquet file whose footer or schema cannot be read (empty, bad magic, a footer longer than the file) is named
as skipped with no record. A row group that cannot be decoded (a corrupt page), or that decodes to fewer rows
than the footer says, has its missing rows rejected as `unreadable` (their number is in the footer) and the file
is named; the next row group is read. A string value
that is not UTF-8 (Arrow does not check when reading) is its row's `invalid_utf8`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pipeline.data.sources.records import (
    MAX_RECORD_BYTES,
    READ_ERRORS,
    InputFile,
    Item,
    Rejected,
    Skipped,
    stopped,
    unreadable,
)
from pipeline.data.sources.text import base_name, record
from pipeline.storage.io import filesystem

_NOT_UTF8 = object()  # a value whose bytes are not UTF-8


def _values(col: Any) -> list:
    """A column's values as Python objects; a string that is not UTF-8 becomes `_NOT_UTF8`."""
    try:
        return col.to_pylist()
    except UnicodeDecodeError:
        out = []
        for k in range(len(col)):
            try:
                out.append(col[k].as_py())
            except UnicodeDecodeError:
                out.append(_NOT_UTF8)
        return out


def _read_arrow_batches(
    f: InputFile, batches: Iterator, column: str, start: int = 0, max_bytes: int = MAX_RECORD_BYTES
) -> Iterator[Item]:
    """Rows as records numbered from `start`, named by an `id` column when there is one, else `file:row`; a text of
    more than `max_bytes` is `record_too_large` (Arrow has read it by then, a row group at a time: the cap keeps
    such a text out of the pipeline, as in every other format)."""
    import pyarrow as pa

    i = start
    base = base_name(f.path)
    for batch in batches:
        if column not in batch.schema.names:
            for _ in range(batch.num_rows):
                yield Rejected(f.path, i, "missing_text")
                i += 1
            continue
        col = batch.column(column)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            for v in col.to_pylist():
                yield Rejected(f.path, i, "null_text" if v is None else "text_not_string")
                i += 1
            continue
        names = _values(batch.column("id")) if "id" in batch.schema.names and column != "id" else None
        for k, v in enumerate(_values(col)):
            if v is _NOT_UTF8 or (names is not None and names[k] is _NOT_UTF8):
                yield Rejected(f.path, i, "invalid_utf8")
            else:
                rec = {column: v} if names is None or names[k] is None else {column: v, "id": names[k]}
                yield record(f, i, rec, column, f"{base}:{i}", max_bytes=max_bytes)
            i += 1


def read_parquet(f: InputFile, column: str, max_bytes: int = MAX_RECORD_BYTES) -> Iterator[Item]:
    """A Parquet file, row group by row group (see the module docstring for damaged files)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    errors = READ_ERRORS + (pa.ArrowException,)
    fs, p = filesystem(f.path)
    try:
        fh = fs.open(p, "rb")
    except errors as e:
        yield unreadable(f, e)
        return
    with fh:
        try:
            pf = pq.ParquetFile(fh)
            names = pf.schema_arrow.names
            sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
        except errors as e:
            yield unreadable(f, e)
            return
        cols = ([column] + (["id"] if "id" in names and column != "id" else [])) if column in names else None
        i = 0
        for g, size in enumerate(sizes):
            start, end = i, i + size
            try:
                for item in _read_arrow_batches(
                    f, pf.iter_batches(batch_size=1024, row_groups=[g], columns=cols), column, i, max_bytes
                ):
                    if i == end:  # more rows than the footer says: they would take the next group's numbers
                        break
                    yield item
                    i += 1
            except errors as e:  # a corrupt page: the rest of this row group's rows, and the file named
                yield from stopped(f, i, e, "unreadable", end)
                i = end
            if i < end:  # a damaged page can decode to fewer rows than the footer says, with no error
                yield from (Rejected(f.path, k, "unreadable") for k in range(i, end))
                yield Skipped(f.path, f"unreadable from record {i}: row group {g} gave {i - start} of its {size} rows")
            i = end


def read_hf(f: InputFile, column: str, max_bytes: int = MAX_RECORD_BYTES) -> Iterator[Item]:
    """A `datasets` save_to_disk directory: Arrow stream files in state.json's order. A state.json or Arrow file
    that cannot be read stops the directory there, named as skipped."""
    import pyarrow as pa

    fs, p = filesystem(f.path)
    offset = 0  # record numbers continue across the Arrow files of one dataset
    try:
        with fs.open(f"{p}/state.json", "rb") as fh:
            state = json.load(fh)
        files = [d["filename"] for d in state.get("_data_files", [])]
    except READ_ERRORS + (ValueError, KeyError, TypeError, AttributeError) as e:  # not the JSON datasets writes
        yield unreadable(f, e, "state.json")
        return
    try:
        for name in files:
            with fs.open(f"{p}/{name}", "rb") as fh:
                for item in _read_arrow_batches(f, iter(pa.ipc.open_stream(fh)), column, offset, max_bytes):
                    yield item
                    offset += 1
    except READ_ERRORS + (pa.ArrowException,) as e:
        yield unreadable(f, e, f"record {offset}")
