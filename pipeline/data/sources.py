"""Readers: input paths -> input files -> documents `(doc_id, source, text)` or rejections `(reason)`.

Formats: plain-text books (`.txt`, `.txt.gz`, one document per file), WikiExtractor JSON lines (`.jsonl`,
`.jsonl.gz`, `{"id","url","title","text"}`), Parquet files with a text column, and `datasets` directories
written by `save_to_disk` (Arrow stream files listed in state.json). Paths are local or fsspec URIs
(`file://`, `s3://`, `memory://`); nothing assumes a local disk.

A document's id is `file_index << 32 | record_index` where file_index is the position of its file in the sorted
input list: stable whatever worker reads it. Bad documents are never fatal: each is yielded as a `Rejected`
with a reason (invalid_utf8, binary, empty, word_too_long, invalid_json, missing_text, null_text,
text_not_string, truncated_gzip, unreadable).

    >>> expand_inputs(["/no/such/dir"])
    Traceback (most recent call last):
    ...
    pipeline.data.sources.InputError: input path /no/such/dir does not exist
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import fsspec

Kind = Literal["txt", "jsonl", "parquet", "hf"]

_KINDS: dict[str, Kind] = {
    ".txt": "txt",
    ".txt.gz": "txt",
    ".jsonl": "jsonl",
    ".jsonl.gz": "jsonl",
    ".json.gz": "jsonl",
    ".parquet": "parquet",
}
MAX_WORD_CHARS = 1000
"""A whitespace-free run longer than this is not language (base64, minified data): the document is rejected."""

_LONG_WORD = re.compile(r"\S{%d}" % (MAX_WORD_CHARS + 1))


class InputError(ValueError):
    """A missing input path or an unusable corpus; the message names it."""


@dataclass(frozen=True)
class InputFile:
    path: str
    """Full path or URI."""
    kind: Kind
    index: int
    """Position in the sorted input list: the high half of its documents' ids."""
    size: int = 0
    mtime: str = ""


@dataclass(frozen=True)
class Document:
    doc_id: int
    source: str
    text: str


@dataclass(frozen=True)
class Rejected:
    source: str
    record: int
    reason: str


def _fs(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    return fsspec.core.url_to_fs(path)


def _unstrip(fs: fsspec.AbstractFileSystem, original: str, p: str) -> str:
    """Re-attach the protocol fsspec strips, so Ray workers can reopen the path."""
    if "://" not in original:
        return p
    proto = original.split("://", 1)[0]
    return p if p.startswith(proto + "://") else f"{proto}://{p.lstrip('/') if proto != 'file' else p}"


def kind_of(path: str) -> Kind | None:
    low = path.lower()
    for ext in sorted(_KINDS, key=len, reverse=True):
        if low.endswith(ext):
            return _KINDS[ext]
    return None


def expand_inputs(paths: list[str]) -> tuple[list[InputFile], list[str]]:
    """Files to read (sorted, indexed) and files skipped in folders for an unknown extension.

    A folder is walked recursively; a folder holding `state.json` + `dataset_info.json` is a `datasets`
    save_to_disk directory. A file named explicitly with an unknown extension is read as a text book.
    """
    if not paths:
        raise InputError("no input given (--input PATH)")
    found: list[tuple[str, Kind, int, str]] = []
    skipped: list[str] = []
    for raw in paths:
        fs, p = _fs(raw)
        if not fs.exists(p):
            raise InputError(f"input path {raw} does not exist")
        if fs.isdir(p):
            hf_dirs = set()
            for f in sorted(fs.find(p)):
                base = f.rsplit("/", 1)[-1]
                parent = f.rsplit("/", 1)[0]
                if base == "state.json" and fs.exists(f"{parent}/dataset_info.json"):
                    hf_dirs.add(parent)
            for d in sorted(hf_dirs):
                found.append((_unstrip(fs, raw, d), "hf", 0, ""))
            for f in sorted(fs.find(p)):
                if any(f.startswith(d + "/") for d in hf_dirs):
                    continue
                k = kind_of(f)
                if k is None:
                    skipped.append(_unstrip(fs, raw, f))
                    continue
                info = fs.info(f)
                found.append((_unstrip(fs, raw, f), k, int(info.get("size") or 0), str(info.get("mtime", ""))))
        else:
            info = fs.info(p)
            found.append((raw, kind_of(p) or "txt", int(info.get("size") or 0), str(info.get("mtime", ""))))
    found = sorted(set(found))
    return [InputFile(p, k, i, s, m) for i, (p, k, s, m) in enumerate(found)], skipped


def check_text(text: str) -> str | None:
    """The reason a decoded text is unusable, or None.

    >>> check_text("  \\n "), check_text("x" * 2000), check_text("ok")
    ('empty', 'word_too_long', None)
    """
    if not text.strip():
        return "empty"
    if "\x00" in text:
        return "binary"
    if _LONG_WORD.search(text):
        return "word_too_long"
    return None


def decode_text(data: bytes) -> tuple[str | None, str | None]:
    """(text, None) or (None, reason) for raw bytes of a text document."""
    if b"\x00" in data[:65536]:
        return None, "binary"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "invalid_utf8"
    return text, None


def _open(path: str) -> io.IOBase:
    fs, p = _fs(path)
    f = fs.open(p, "rb")
    return gzip.GzipFile(fileobj=f) if path.lower().endswith(".gz") else f


def _read_txt(f: InputFile) -> Iterator[Document | Rejected]:
    doc_id = f.index << 32
    try:
        with _open(f.path) as fh:
            data = fh.read()
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        yield Rejected(f.path, 0, "truncated_gzip" if isinstance(e, EOFError) else "unreadable")
        return
    text, reason = decode_text(data)
    del data  # a book can be 100s of MB: keep the text only, not its bytes too, while it is being consumed
    reason = reason or check_text(text)  # type: ignore[arg-type]
    yield Rejected(f.path, 0, reason) if reason else Document(doc_id, f.path, text)  # type: ignore[arg-type]


def _record(f: InputFile, i: int, rec: object, column: str) -> Document | Rejected:
    if not isinstance(rec, dict):
        return Rejected(f.path, i, "invalid_json")
    if column not in rec:
        return Rejected(f.path, i, "missing_text")
    text = rec[column]
    if text is None:
        return Rejected(f.path, i, "null_text")
    if not isinstance(text, str):
        return Rejected(f.path, i, "text_not_string")
    reason = check_text(text)
    return Rejected(f.path, i, reason) if reason else Document((f.index << 32) | i, f.path, text)


def _read_jsonl(f: InputFile, column: str) -> Iterator[Document | Rejected]:
    i = 0
    try:
        with _open(f.path) as fh:
            for line in fh:
                if not line.strip():
                    continue  # a blank line is not a record
                try:
                    s = line.decode("utf-8")
                except UnicodeDecodeError:
                    yield Rejected(f.path, i, "invalid_utf8")
                    i += 1
                    continue
                try:
                    rec = json.loads(s)
                except ValueError:
                    yield Rejected(f.path, i, "invalid_json")
                    i += 1
                    continue
                yield _record(f, i, rec, column)
                i += 1
    except EOFError:
        yield Rejected(f.path, i, "truncated_gzip")  # the partial tail after the last complete line
    except (zlib.error, gzip.BadGzipFile, OSError):
        yield Rejected(f.path, i, "unreadable")


def _read_arrow_batches(f: InputFile, batches: Iterator, column: str) -> Iterator[Document | Rejected]:
    import pyarrow as pa

    i = 0
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
        for v in col.to_pylist():
            yield _record(f, i, {column: v}, column)
            i += 1


def _read_parquet(f: InputFile, column: str) -> Iterator[Document | Rejected]:
    import pyarrow.parquet as pq

    fs, p = _fs(f.path)
    try:
        with fs.open(p, "rb") as fh:
            pf = pq.ParquetFile(fh)
            cols = [column] if column in pf.schema_arrow.names else None
            yield from _read_arrow_batches(f, pf.iter_batches(batch_size=1024, columns=cols), column)
    except OSError:
        yield Rejected(f.path, 0, "unreadable")


def _read_hf(f: InputFile, column: str) -> Iterator[Document | Rejected]:
    """A `datasets` save_to_disk directory: Arrow stream files in state.json's order."""
    import pyarrow as pa

    fs, p = _fs(f.path)
    with fs.open(f"{p}/state.json", "rb") as fh:
        state = json.load(fh)
    files = [d["filename"] for d in state.get("_data_files", [])]
    offset = 0  # record numbers continue across the Arrow files of one dataset
    for name in files:
        with fs.open(f"{p}/{name}", "rb") as fh:
            n = 0
            for item in _read_arrow_batches(f, iter(pa.ipc.open_stream(fh)), column):
                if isinstance(item, Document):
                    yield Document(item.doc_id + offset, item.source, item.text)
                else:
                    yield Rejected(item.source, item.record + offset, item.reason)
                n += 1
            offset += n


def read_documents(f: InputFile, text_column: str = "text") -> Iterator[Document | Rejected]:
    """Every record of one input file, in order, as a Document or a Rejected."""
    if f.kind == "txt":
        return _read_txt(f)
    if f.kind == "jsonl":
        return _read_jsonl(f, text_column)
    if f.kind == "parquet":
        return _read_parquet(f, text_column)
    return _read_hf(f, text_column)


def fingerprint(files: list[InputFile]) -> list[tuple[str, str, int, str]]:
    """What identifies the inputs cheaply (path, kind, size, mtime); part of the output's config hash."""
    return [(f.path, f.kind, f.size, f.mtime) for f in files]
