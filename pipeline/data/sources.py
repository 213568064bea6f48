"""Readers: input paths -> input files -> documents `(doc_id, source, text, name)` or rejections `(reason)`.

Formats (kinds):
  - `txt`: plain-text books (`.txt`, `.txt.gz`, one document per file);
  - `jsonl`: JSON lines (`.jsonl`, `.jsonl.gz`, `.json.gz`, e.g. `{"id","url","title","text"}`), read as they are;
    `wikiext_json`: WikiExtractor's `--json` output, recognised by content under any other name
    (`text/AA/wiki_00`, and `wiki_00.bz2` from `--compress`), its text HTML-unescaped as WikiExtractor escapes it;
  - `wikiext`: WikiExtractor's default output, `<doc id=".." url=".." title="..">` blocks, recognised by content
    (plain, .bz2 or .gz); the text is HTML-unescaped (WikiExtractor escapes it by default) and its first line,
    the title WikiExtractor repeats there, is left out, as in its JSON form;
  - `wiki_xml`: a MediaWiki dump (`*-pages-articles*.xml`, `.xml.bz2`, a multistream dump without its index),
    recognised by content, read sequentially; `wiki_multistream`: a multistream dump with its index beside it
    (`...-multistream-index.txt.bz2`), which `split_units` cuts into byte ranges (pipeline.data.wiki);
  - `parquet`: Parquet files with a text column; `hf`: `datasets` directories written by `save_to_disk`
    (Arrow stream files listed in state.json).
A file whose name has none of the known extensions is recognised by its first bytes (decompressed when bz2 or
gzip): a dump, WikiExtractor output of either form, or it is skipped. Paths are local or fsspec URIs
(`file://`, `s3://`, `memory://`); nothing assumes a local disk.

A document's id is `file_index << 32 | record_index` where file_index is the position of its file in the sorted
input list: stable whatever worker reads it. A dump page's record index is its ordinal position in the dump
(pipeline.data.wiki), so it does not depend on the units the dump was read in. A document's name is its
record's own id (WikiExtractor's id, a dump's page id, an `id` column or key), else the file's name for a book,
`file:line` for a JSON line, `file:row` for a Parquet or datasets row. Bad documents are never fatal: each is
yielded as a `Rejected` with a reason (invalid_utf8, binary, empty, word_too_long, invalid_json, missing_text,
null_text, text_not_string, truncated_gzip, unreadable, and for dumps wiki_namespace, wiki_redirect,
wiki_empty). Files not read are returned by `expand_inputs` with a reason (`Skipped`).

    >>> expand_inputs(["/no/such/dir"])
    Traceback (most recent call last):
    ...
    pipeline.data.sources.InputError: input path /no/such/dir does not exist
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import html
import io
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, NamedTuple

import fsspec

from pipeline.errors import PipelineError
from pipeline.data import wiki
from pipeline.data.wiki import WikiOptions
from pipeline.storage.io import broken_link, find_files, is_local

Kind = Literal["txt", "jsonl", "wikiext_json", "parquet", "hf", "wikiext", "wiki_xml", "wiki_multistream"]

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


class InputError(PipelineError, ValueError):
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
    offset: int = 0
    """A unit of a multistream dump (`split_units`): its byte range [offset, offset + length) ..."""
    length: int = 0
    """... (0: the whole file) ..."""
    first_record: int = 0
    """... and the record number (dump page ordinal) of its first page."""


@dataclass(frozen=True)
class Document:
    doc_id: int
    source: str
    text: str
    name: str = ""
    """The document's own name: its record's id when it has one, else file name, `file:line` or `file:row`."""


class Skipped(NamedTuple):
    """An input file not read, and why."""

    path: str
    reason: str


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


_SNIFF_BYTES = 4096
_JSON_RECORD = re.compile(rb'\{\s*"(id|text|title|url|revid)"\s*:')


def sniff_kind(path: str) -> Kind | None:
    """The kind of a file by its first bytes (decompressed when bz2 or gzip), or None when not recognised:
    a MediaWiki dump, WikiExtractor's `<doc ...>` blocks or JSON lines. Only files whose name has no known
    extension are sniffed."""
    fs, p = _fs(path)
    try:
        with fs.open(p, "rb") as raw, wiki.open_decompressed(raw) as fh:
            head = fh.read(_SNIFF_BYTES)
    except (OSError, EOFError, zlib.error, ValueError):
        return None
    head = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"<mediawiki") or (head.startswith(b"<?xml") and b"<mediawiki" in head):
        return "wiki_xml"
    if head.startswith((b"<doc ", b"<doc\t")):
        return "wikiext"
    if _JSON_RECORD.match(head):
        return "wikiext_json"
    return None


def _kind_and_reason(fs: fsspec.AbstractFileSystem, path: str, explicit: bool) -> tuple[Kind | None, str]:
    """(kind, "") for a file to read, or (None, reason) for one to skip."""
    k = kind_of(path)
    if k is not None:
        return k, ""
    dump = wiki.dump_name(path)
    if dump is not None:
        if fs.exists(dump):
            return None, "index of a multistream dump"
        return None, "index of a multistream dump that is not there"
    k = sniff_kind(path)
    if k == "wiki_xml":
        index = wiki.index_name(path)
        return ("wiki_multistream" if index and fs.exists(index) else "wiki_xml"), ""
    if k is None:
        return ("txt", "") if explicit else (None, "unknown format")
    return k, ""


def expand_inputs(paths: list[str]) -> tuple[list[InputFile], list[Skipped]]:
    """Files to read (sorted, indexed) and the files not read, each with its reason (sorted).

    A folder is walked recursively; a folder holding `state.json` + `dataset_info.json` is a `datasets`
    save_to_disk directory. A file whose name has no known extension is recognised by content (`sniff_kind`);
    in a folder one that is not recognised is skipped ("unknown format"), named explicitly it is read as a
    text book. A multistream dump's index is no input of its own ("index of a multistream dump"): the dump
    beside it is read as `wiki_multistream`.
    """
    if not paths:
        raise InputError("no input given (--input PATH)")
    found: list[tuple[str, Kind, int, str]] = []
    skipped: list[Skipped] = []
    for raw in paths:
        fs, p = _fs(raw)
        if not fs.exists(p):
            why = (broken_link(p) if is_local(fs) else None) or "does not exist"
            raise InputError(f"input path {raw} {why}")
        if fs.isdir(p):
            hf_dirs = set()
            listing, broken = find_files(fs, p)
            skipped += [Skipped(_unstrip(fs, raw, f), reason) for f, reason in broken]
            for f in listing:
                base = f.rsplit("/", 1)[-1]
                parent = f.rsplit("/", 1)[0]
                if base == "state.json" and fs.exists(f"{parent}/dataset_info.json"):
                    hf_dirs.add(parent)
            for d in sorted(hf_dirs):
                found.append((_unstrip(fs, raw, d), "hf", 0, ""))
            for f in listing:
                if any(f.startswith(d + "/") for d in hf_dirs):
                    continue
                k, reason = _kind_and_reason(fs, f, explicit=False)
                if k is None:
                    skipped.append(Skipped(_unstrip(fs, raw, f), reason))
                    continue
                info = fs.info(f)
                found.append((_unstrip(fs, raw, f), k, int(info.get("size") or 0), str(info.get("mtime", ""))))
        else:
            k, reason = _kind_and_reason(fs, p, explicit=True)
            if k is None:
                skipped.append(Skipped(raw, reason))
                continue
            info = fs.info(p)
            found.append((raw, k, int(info.get("size") or 0), str(info.get("mtime", ""))))
    found = sorted(set(found))
    files = [InputFile(p, k, i, s, m) for i, (p, k, s, m) in enumerate(found)]
    return files, sorted(set(skipped))


def no_readable_input(inputs: list[str], skipped: list[Skipped], show: int = 5) -> InputError:
    """The error for inputs that hold no file to read, naming the first `show` skipped files and why.

    >>> str(no_readable_input(["text"], [Skipped("text/AA/notes", "unknown format")]))
    'no readable input file under text (skipped 1: text/AA/notes (unknown format))'
    """
    named = ", ".join(f"{s.path} ({s.reason})" for s in skipped[:show])
    more = f", and {len(skipped) - show} more" if len(skipped) > show else ""
    detail = f"skipped {len(skipped)}: {named}{more}" if skipped else "no file found"
    return InputError(f"no readable input file under {', '.join(inputs)} ({detail})")


def split_units(f: InputFile, target_bytes: int) -> list[InputFile]:
    """The units `f` can be read in apart, each an InputFile: byte ranges of about `target_bytes` compressed
    bytes for a multistream dump with its index (same index, so the same doc_ids, whatever the split), else
    `[f]`. Read whole, a multistream dump gives the same documents."""
    if f.kind != "wiki_multistream":
        return [f]
    index = wiki.index_name(f.path)
    assert index is not None
    return [
        dataclasses.replace(f, offset=u.offset, length=u.length, first_record=u.first_page)
        for u in wiki.dump_units(index, f.size, target_bytes)
    ]


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
    """A file's bytes, decompressed by extension (.gz, .bz2), or by its magic bytes when the name has no known
    extension (a file recognised by content)."""
    fs, p = _fs(path)
    f = fs.open(p, "rb")
    low = path.lower()
    if low.endswith(".gz"):
        return gzip.GzipFile(fileobj=f)
    if low.endswith(".bz2"):
        return bz2.BZ2File(f)
    return f if kind_of(path) else wiki.open_decompressed(f)


def _base(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


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
    yield Rejected(f.path, 0, reason) if reason else Document(doc_id, f.path, text, _base(f.path))  # type: ignore[arg-type]


def _record(f: InputFile, i: int, rec: object, column: str, where: str = "", unescape: bool = False
            ) -> Document | Rejected:
    """`rec`'s document: named by its `id` when it has one, else `where` (`file:line`, `file:row`). `unescape`:
    the text is HTML-escaped (WikiExtractor escapes &, < and > in every output form)."""
    if not isinstance(rec, dict):
        return Rejected(f.path, i, "invalid_json")
    if column not in rec:
        return Rejected(f.path, i, "missing_text")
    text = rec[column]
    if text is None:
        return Rejected(f.path, i, "null_text")
    if not isinstance(text, str):
        return Rejected(f.path, i, "text_not_string")
    if unescape:
        text = html.unescape(text)
    reason = check_text(text)
    if reason:
        return Rejected(f.path, i, reason)
    rid = rec.get("id")
    return Document((f.index << 32) | i, f.path, text, where if rid is None else str(rid))


def _read_jsonl(f: InputFile, column: str) -> Iterator[Document | Rejected]:
    """JSON lines, one record a line. WikiExtractor's `--json` output (recognised by content under its own names,
    kind `wikiext_json`) is HTML-unescaped, as its `<doc>` form is; a `.jsonl` file is read as it is."""
    i = 0
    unescape = f.kind == "wikiext_json"
    base = _base(f.path)
    try:
        with _open(f.path) as fh:
            for n, line in enumerate(fh, 1):
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
                yield _record(f, i, rec, column, f"{base}:{n}", unescape)
                i += 1
    except EOFError:
        yield Rejected(f.path, i, "truncated_gzip")  # the partial tail after the last complete line
    except (zlib.error, gzip.BadGzipFile, OSError):
        yield Rejected(f.path, i, "unreadable")


_DOC_TAG = re.compile(r'<doc\s+([^>]*)>')
_ATTR = re.compile(r'(\w+)="([^"]*)"')


def _read_wikiext(f: InputFile) -> Iterator[Document | Rejected]:
    """WikiExtractor's `<doc id=".." url=".." title="..">` ... `</doc>` blocks: one document each, named by its id."""
    i = 0
    attrs: dict[str, str] | None = None
    lines: list[str] = []
    try:
        with _open(f.path) as fh:
            for raw in fh:
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    line = None
                if attrs is None:
                    m = _DOC_TAG.match(line or "")
                    if m:
                        attrs = {k: html.unescape(v) for k, v in _ATTR.findall(m.group(1))}
                        lines = []
                    continue  # text between blocks is not a record
                if line is None:
                    attrs["bad"] = "1"
                elif line.startswith("</doc>"):
                    yield _wikiext_doc(f, i, attrs, lines)
                    i, attrs = i + 1, None
                else:
                    lines.append(line)
    except EOFError:
        yield Rejected(f.path, i, "truncated_gzip")
        return
    except (zlib.error, gzip.BadGzipFile, OSError):
        yield Rejected(f.path, i, "unreadable")
        return
    if attrs is not None:
        yield Rejected(f.path, i, "truncated_doc")  # a block without its </doc>


def _wikiext_doc(f: InputFile, i: int, attrs: dict[str, str], lines: list[str]) -> Document | Rejected:
    if "bad" in attrs:
        return Rejected(f.path, i, "invalid_utf8")
    if lines and lines[0].strip() == attrs.get("title", "").strip():
        lines = lines[1:]  # the title line WikiExtractor writes first
    text = html.unescape("".join(lines)).strip("\n")
    reason = check_text(text)
    if reason:
        return Rejected(f.path, i, reason)
    return Document((f.index << 32) | i, f.path, text, attrs.get("id") or f"{_base(f.path)}:{i}")


def _read_wiki(f: InputFile, options: WikiOptions) -> Iterator[Document | Rejected]:
    """A MediaWiki dump, whole or one unit (`split_units`): every page a record numbered by its position."""
    pages = wiki.read_pages(f.path, f.offset, f.length, f.first_record) if f.length else wiki.read_pages(f.path)
    last = f.first_record
    try:
        for page in pages:
            last = page.ordinal + 1
            text, reason = wiki.page_text(page, options)
            reason = reason or check_text(text)  # type: ignore[arg-type]
            if reason:
                yield Rejected(f.path, page.ordinal, reason)
            else:
                yield Document((f.index << 32) | page.ordinal, f.path, text, page.page_id)  # type: ignore[arg-type]
    except EOFError:
        yield Rejected(f.path, last, "truncated_dump")
    except (OSError, ValueError, SyntaxError):  # ET.ParseError is a SyntaxError
        yield Rejected(f.path, last, "unreadable")


def _read_arrow_batches(f: InputFile, batches: Iterator, column: str, start: int = 0) -> Iterator[Document | Rejected]:
    """Rows as records numbered from `start`, named by an `id` column when there is one, else `file:row`."""
    import pyarrow as pa

    i = start
    base = _base(f.path)
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
        names = batch.column("id").to_pylist() if "id" in batch.schema.names and column != "id" else None
        for k, v in enumerate(col.to_pylist()):
            rec = {column: v} if names is None or names[k] is None else {column: v, "id": names[k]}
            yield _record(f, i, rec, column, f"{base}:{i}")
            i += 1


def _read_parquet(f: InputFile, column: str) -> Iterator[Document | Rejected]:
    import pyarrow.parquet as pq

    fs, p = _fs(f.path)
    try:
        with fs.open(p, "rb") as fh:
            pf = pq.ParquetFile(fh)
            names = pf.schema_arrow.names
            cols = ([column] + (["id"] if "id" in names and column != "id" else [])) if column in names else None
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
            for item in _read_arrow_batches(f, iter(pa.ipc.open_stream(fh)), column, offset):
                yield item
                n += 1
            offset += n


def read_documents(
    f: InputFile, text_column: str = "text", wiki_options: WikiOptions = WikiOptions()
) -> Iterator[Document | Rejected]:
    """Every record of one input file (or of one unit of it, `split_units`), in order, as a Document or a
    Rejected. `wiki_options` say what of a dump page's wikitext is kept (lists, headings)."""
    if f.kind == "txt":
        return _read_txt(f)
    if f.kind in ("jsonl", "wikiext_json"):
        return _read_jsonl(f, text_column)
    if f.kind == "parquet":
        return _read_parquet(f, text_column)
    if f.kind == "wikiext":
        return _read_wikiext(f)
    if f.kind in ("wiki_xml", "wiki_multistream"):
        return _read_wiki(f, wiki_options)
    return _read_hf(f, text_column)


def fingerprint(files: list[InputFile]) -> list[tuple[str, str, int, str]]:
    """What identifies the inputs cheaply (path, kind, size, mtime); part of the output's config hash."""
    return [(f.path, f.kind, f.size, f.mtime) for f in files]
