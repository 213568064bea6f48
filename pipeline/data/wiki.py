"""MediaWiki dumps: pages from `*-pages-articles*.xml[.bz2]`, multistream byte ranges, and wikitext -> text.

Reading. A dump is a stream of `<page>` elements after a `<mediawiki>` + `<siteinfo>` header. Pages are cut out
of the decompressed bytes one at a time (the bytes between `<page>` and `</page>`; wikitext inside `<text>` is
XML-escaped, so these tags never occur in it) and each is parsed alone with `xml.etree.ElementTree.fromstring`:
memory holds one read chunk (64 KiB decompressed; 1 MiB compressed of a multistream unit) plus one page, whatever
the dump's size, and a byte range of a multistream dump (a fragment: some `<page>` elements, maybe the header
before them or `</mediawiki>` after them) needs no special case. `ElementTree.iterparse` with element clearing
reads the same 4,000 pages (14 MiB) in 0.085 s of CPU against 0.099 s here: 3% of what the wikitext costs, so
fragments without special cases won (see bench/RESULTS.md, "Wikipedia").

Multistream. `*-pages-articles-multistream.xml.bz2` is a concatenation of bz2 streams, each of about 100 pages,
each decompressing on its own; `*-pages-articles-multistream-index.txt.bz2` beside it lists every page as
`offset:page_id:title`, offset being the byte position of the stream that holds it. `stream_ranges` turns the
index into `(offset, length, num_pages)` per stream; `dump_units` groups consecutive streams into units of
about N compressed bytes; `read_pages(path, offset, length, first_page)` reads one unit. The header stream
before the first indexed offset holds no page and belongs to no unit; the last unit runs to the end of the file,
so it also holds the `</mediawiki>` stream. Read whole (no index), the same file is a plain bz2 file of several
streams and `read_pages(path)` reads it sequentially.

Page numbers. A page's record number (the low half of its doc_id) is its ordinal position in the dump, 0 for the
first `<page>`, every page counted (other namespaces and redirects too). Read whole, it is the count of pages
before it; read by units, the count of pages the index lists before the unit's offset plus its position in the
unit. Both give the same number, so doc_ids do not depend on how the file was split. The document's name is the
page id (`<id>` of the page), its source the dump file.

Which pages are documents (the rest are yielded as rejections, so read == written + rejected):
  - `wiki_namespace`: a page outside the article namespace (`<ns>` != 0: talk, user, Wikipedia:, Category:, ...);
  - `wiki_redirect`: a page with `<redirect>`;
  - `wiki_empty`: nothing left after the markup removal (a stub of templates only, a deleted revision);
  - `markup_budget`: markup never closed that would make the conversion cost more than `MARKUP_BUDGET` (12 us) a
    character, as its time grows with the square of the page's size (pipeline.data.wikitext, `markup_cost`).

Wikitext to text: pipeline.data.wikitext (mwparserfromhell's tokenizer, the BERT paper's rule, a markup budget).

Damaged dumps. Every `<page>` is a record, whatever its state: a page that does not parse (a raw `<`, a bad
entity, NULs, `<ns>1.5</ns>`) is yielded as a `BrokenPage` (`unparsable_page`), one cut short by the next
`<page>` as `unterminated_page`, one cut by the end of the data as `truncated_page`, one of more than
`max_bytes` (data.max_record_bytes; its XML, escaped as the dump holds it) as `record_too_large` as soon as it is
that long (its bytes are dropped, not buffered, up to the next `<page>`), and reading goes on at the next
`<page>`. A page whose markup is over the budget is `markup_budget` (`page_text`).
"""

from __future__ import annotations

import bz2
import gzip
import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pipeline.data.wikitext import WikiOptions, over_budget, wikitext_to_text
from pipeline.storage.io import filesystem

CHUNK_BYTES = 1 << 20
"""Compressed bytes of a multistream unit read (and decompressed) at a time."""
READ_BYTES = 1 << 16
"""Decompressed bytes read at a time (of a whole dump, or of a unit's stream): a damaged stream loses what its last
read had decoded."""


@dataclass(frozen=True)
class Page:
    ordinal: int
    """Position of the page in the dump, counting every page from 0: the record number of its document."""
    page_id: str
    title: str
    ns: int
    redirect: bool
    wikitext: str
    """The last revision's text, unescaped (empty when the revision's text was deleted)."""


@dataclass(frozen=True)
class BrokenPage:
    """A `<page>` that cannot be read, and why: unparsable_page, unterminated_page, truncated_page,
    record_too_large."""

    ordinal: int
    reason: str


@dataclass(frozen=True)
class DumpUnit:
    """Consecutive bz2 streams of a multistream dump: bytes [offset, offset + length) hold pages
    first_page .. first_page + num_pages - 1."""

    offset: int
    length: int
    first_page: int
    num_pages: int


# ---------------------------------------------------------------------------------------------- file names

_MULTISTREAM = re.compile(r"multistream(\d*)\.xml")
_INDEX = re.compile(r"multistream-index(\d*)\.txt")


def index_name(dump_path: str) -> str | None:
    """The index file's path beside a multistream dump (None when the name is not a multistream dump's).

    >>> index_name("/d/enwiki-20240601-pages-articles-multistream.xml.bz2")
    '/d/enwiki-20240601-pages-articles-multistream-index.txt.bz2'
    >>> index_name("/d/enwiki-20240601-pages-articles-multistream1.xml-p1p41242.bz2")
    '/d/enwiki-20240601-pages-articles-multistream-index1.txt-p1p41242.bz2'
    """
    head, _, base = dump_path.rpartition("/")
    if not _MULTISTREAM.search(base):
        return None
    return (head + "/" if head or dump_path.startswith("/") else "") + _MULTISTREAM.sub(
        r"multistream-index\1.txt", base, count=1
    )


def dump_name(index_path: str) -> str | None:
    """The dump's path for a multistream index file (None when the name is not an index's)."""
    head, _, base = index_path.rpartition("/")
    if not _INDEX.search(base):
        return None
    return (head + "/" if head or index_path.startswith("/") else "") + _INDEX.sub(r"multistream\1.xml", base, count=1)


# ---------------------------------------------------------------------------------------------- bytes


def open_decompressed(fh: io.IOBase) -> io.IOBase:
    """A binary stream decompressed by its magic bytes (bz2, possibly of several streams; gzip; else as is)."""
    head = fh.read(3)
    fh.seek(0)
    if head == b"BZh":
        return bz2.BZ2File(fh)
    if head[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=fh)
    return fh


def _file_chunks(path: str) -> Iterator[bytes]:
    fs, p = filesystem(path)
    with fs.open(p, "rb") as raw, open_decompressed(raw) as fh:
        while chunk := fh.read(READ_BYTES):
            yield chunk


def _range_chunks(path: str, offset: int, length: int) -> Iterator[bytes]:
    """The decompressed bytes of `length` bytes at `offset`: whole bz2 streams, one after another."""
    fs, p = filesystem(path)
    d = bz2.BZ2Decompressor()
    inside = False  # the current stream has had input but not ended
    with fs.open(p, "rb") as fh:
        fh.seek(offset)
        left = length
        while left > 0:
            data = fh.read(min(CHUNK_BYTES, left))
            if not data:
                raise EOFError(f"{path}: range {offset}+{length} runs past the end of the file")
            left -= len(data)
            while data or not (d.eof or d.needs_input):  # READ_BYTES at a time: a bz2 stream may hold far more
                yield d.decompress(data, READ_BYTES)
                inside, data = True, b""
                if d.eof:  # the next stream starts in what is left over
                    data, d, inside = d.unused_data, bz2.BZ2Decompressor(), False
    if inside:
        raise EOFError(f"{path}: range {offset}+{length} ends inside a bz2 stream")


def _page_blocks(chunks: Iterable[bytes], max_bytes: int | None = None) -> Iterator[tuple[bytes, str | None]]:
    """Every `<page>` in decompressed chunks of a dump or of a fragment of one: (its bytes through `</page>`, None),
    or, cut short, (its bytes up to the next `<page>`, "unterminated_page") and (its bytes to the end of the data,
    "truncated_page"), or, once it is over `max_bytes` long with neither `</page>` nor the next `<page>` in them,
    (b"", "record_too_large"): its bytes are dropped as they come up to the next `<page>`. Each byte is searched
    once, however many chunks a page spans; memory holds at most one page of `max_bytes` (None: any) and a chunk."""
    buf = bytearray()
    start = 0  # where the next `<page>` is looked for
    for chunk in chunks:
        seen = len(buf)  # the bytes before the chunk were searched for `</page>` and `<page>` already
        buf += chunk
        while True:
            a = buf.find(b"<page>", start)
            if a < 0:
                del buf[: max(start, len(buf) - 5)]  # a tag may straddle chunks
                start = 0
                break
            look = max(a + 6, seen - 7)
            b = buf.find(b"</page>", look)
            nxt = buf.find(b"<page>", look, len(buf) if b < 0 else b)
            if nxt >= 0:
                yield bytes(buf[a:nxt]), "unterminated_page"
                start = nxt
            elif b >= 0:
                yield bytes(buf[a : b + 7]), None
                start = b + 7
            elif max_bytes is not None and len(buf) - a > max_bytes:
                yield b"", "record_too_large"
                del buf[: len(buf) - 5]  # searched: only the start of a `<page>` straddling chunks is kept
                start = 0
                break
            else:
                del buf[:a]  # the page goes on in the next chunk
                start = 0
                break
            seen = 0
    a = buf.find(b"<page>", start)
    if a >= 0:
        yield bytes(buf[a:]), "truncated_page"


def parse_page(block: bytes, ordinal: int) -> Page:
    el = ET.fromstring(block)
    revisions = el.findall("revision")
    text = (revisions[-1].findtext("text") or "") if revisions else ""
    return Page(
        ordinal=ordinal,
        page_id=(el.findtext("id") or "").strip(),
        title=el.findtext("title") or "",
        ns=int(el.findtext("ns") or 0),
        redirect=el.find("redirect") is not None,
        wikitext=text,
    )


def read_pages(
    path: str, offset: int = 0, length: int | None = None, first_page: int = 0, max_bytes: int | None = None
) -> Iterator[Page | BrokenPage]:
    """The pages of a dump, in order: the whole file (plain, .bz2 of one or several streams, .gz) when `length`
    is None, else the bz2 streams in bytes [offset, offset + length) of a multistream dump, whose first page is
    page number `first_page` of the dump (`DumpUnit.first_page`). A page that cannot be read, or is over
    `max_bytes` (None: no cap; the readers pass data.max_record_bytes), is a `BrokenPage` and the next one is read;
    a stream that cannot be decompressed raises (OSError, EOFError, zlib.error)."""
    chunks = _file_chunks(path) if length is None else _range_chunks(path, offset, length)
    for i, (block, broken) in enumerate(_page_blocks(chunks, max_bytes)):
        if max_bytes is not None and len(block) > max_bytes:  # ended in the read that took it over
            broken = "record_too_large"
        if broken:
            yield BrokenPage(first_page + i, broken)
            continue
        try:
            page: Page | BrokenPage = parse_page(block, first_page + i)
        except (ET.ParseError, ValueError):  # ValueError: `<ns>` not an integer
            page = BrokenPage(first_page + i, "unparsable_page")
        yield page


# ---------------------------------------------------------------------------------------------- the index


def _index_lines(index_path: str) -> Iterator[bytes]:
    fs, p = filesystem(index_path)
    with fs.open(p, "rb") as raw, open_decompressed(raw) as fh:
        yield from fh


def stream_ranges(index_path: str, dump_size: int) -> list[tuple[int, int, int]]:
    """(offset, length, num_pages) of every bz2 stream that holds pages, in file order, from the index
    (`offset:page_id:title` lines, one per page); the last stream runs to `dump_size`."""
    offsets: list[int] = []
    counts: list[int] = []
    for n, line in enumerate(_index_lines(index_path)):
        if not line.strip():
            continue
        head = line.split(b":", 1)[0]
        try:
            off = int(head)
        except ValueError:
            raise ValueError(f"{index_path} line {n + 1}: not offset:page_id:title: {line[:80]!r}") from None
        if offsets and off == offsets[-1]:
            counts[-1] += 1
        elif offsets and off < offsets[-1]:
            raise ValueError(f"{index_path} line {n + 1}: offset {off} before the previous stream's {offsets[-1]}")
        else:
            offsets.append(off)
            counts.append(1)
    if offsets and offsets[-1] >= dump_size:
        raise ValueError(f"{index_path}: offset {offsets[-1]} is past the dump's {dump_size} bytes")
    ends = offsets[1:] + [dump_size]
    return [(o, e - o, c) for o, e, c in zip(offsets, ends, counts)]


def dump_units(index_path: str, dump_size: int, target_bytes: int) -> list[DumpUnit]:
    """Consecutive streams grouped into units of at least `target_bytes` compressed bytes (the last may be less).

    Example: streams of 40, 40 and 30 bytes holding 100, 100 and 60 pages, target 64 ->
    [DumpUnit(o, 80, 0, 200), DumpUnit(o + 80, 30, 200, 60)].
    """
    units: list[DumpUnit] = []
    start = size = pages = 0
    first = 0
    for off, length, n in stream_ranges(index_path, dump_size):
        if size == 0:
            start, first = off, first + pages
            pages = 0
        size += length
        pages += n
        if size >= target_bytes:
            units.append(DumpUnit(start, size, first, pages))
            first, size, pages = first + pages, 0, 0
    if size:
        units.append(DumpUnit(start, size, first, pages))
    return units


# ---------------------------------------------------------------------------------------------- text


def page_text(page: Page, options: WikiOptions = WikiOptions()) -> tuple[str | None, str | None]:
    """(text, None) for an article, or (None, reason): wiki_namespace, wiki_redirect, markup_budget, wiki_empty."""
    if page.ns != 0:
        return None, "wiki_namespace"
    if page.redirect:
        return None, "wiki_redirect"
    if over_budget(page.wikitext):
        return None, "markup_budget"
    text = wikitext_to_text(page.wikitext, options)
    return (text, None) if text.strip() else (None, "wiki_empty")
