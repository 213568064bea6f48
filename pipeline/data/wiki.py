"""MediaWiki dumps: pages from `*-pages-articles*.xml[.bz2]`, multistream byte ranges, and wikitext -> text.

Reading. A dump is a stream of `<page>` elements after a `<mediawiki>` + `<siteinfo>` header. Pages are cut out
of the decompressed bytes one at a time (the bytes between `<page>` and `</page>`; wikitext inside `<text>` is
XML-escaped, so these tags never occur in it) and each is parsed alone with `xml.etree.ElementTree.fromstring`:
memory holds one read chunk (1 MiB) plus one page, whatever the dump's size, and a byte range of a multistream
dump (a fragment: some `<page>` elements, maybe the header before them or `</mediawiki>` after them) needs no
special case. `ElementTree.iterparse` with element clearing reads the same 4,000 pages (14 MiB) in 0.085 s of CPU
against 0.099 s here: 3% of what the wikitext below costs, so fragments without special cases won (see
bench/RESULTS.md, "Wikipedia").

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
  - `wiki_empty`: nothing left after the markup removal below (a stub of templates only, a deleted revision).

Wikitext to text: mwparserfromhell's C tokenizer, and a walk over its flat token stream. Its full parse (the
node tree its Python builder makes) costs about 0.7 ms a page on the sample against 0.13 ms for the tokens, and
wikitextparser's parse is as slow (4.3 ms for the 11 pages, either library); walking the tokens makes the
conversion 1.5x WikiExtractor's instead of 0.36x (bench/wiki_compare.py). The rule is the BERT paper's
"extract only the text passages and ignore lists, tables, and headers":
  kept:    text; the text of internal links (`[[target|text]]` -> text, `[[target]]` -> target) and of
           external links with a label (`[http://x label]` -> label); the content of formatting tags
           (`''`/`'''` quotes are removed, `<b>`, `<i>`, `<span>`, `<sup>`, `<small>`, `<div>`, `<blockquote>`, ...);
           HTML entities decoded (`&nbsp;` -> U+00A0); `<nowiki>` content as written.
  dropped: templates (`{{...}}`, so infoboxes, navboxes, citations, and every template that renders text too:
           `{{convert}}`, `{{lang}}`; no template is expanded), template arguments (`{{{x}}}`); references
           (`<ref>...</ref>`, `<ref/>`, `<references/>`); tables (`{| ... |}`, `<table>`); files and images
           (`[[File:...]]`, `[[Image:...]]`, `[[Media:...]]`, with their captions); categories (`[[Category:...]]`;
           `[[:Category:X]]`, a visible link, is kept as text); interlanguage links (`[[de:...]]`: a prefix of 2-3
           letters or `simple`); bare URLs and label-less `[http://x]`; comments; behaviour switches
           (`__NOTOC__`); the tags math, chem, ce, score, graph, timeline, gallery, imagemap, syntaxhighlight,
           source, pre, code, hiero, inputbox, templatedata, mapframe, maplink, includeonly, indicator;
           lists (every line that starts with `*`, `#`, `;` or `:`, and `<ul>`/`<ol>`/`<dl>` elements) unless
           `WikiOptions.keep_lists` (then each item is its own paragraph, without its marker); headings
           (`== X ==`) unless `WikiOptions.keep_headings` (then the title is its own paragraph).
Paragraphs are separated by a blank line (a dropped line ends a paragraph too); lines within one are joined
by `\\n`, which the sentence splitter reads as a space.

    >>> wikitext_to_text("'''Archer''' is a [[slab serif|slab]] face.<ref>{{cite web}}</ref>\\n== Uses ==\\n* a list")
    'Archer is a slab face.'
"""

from __future__ import annotations

import bz2
import html
import gzip
import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import fsspec
from mwparserfromhell.parser import Parser
from mwparserfromhell.parser import tokens as T

_TOKENIZER = Parser()._tokenizer  # mwparserfromhell's own choice: the C tokenizer when built (the wheels)
CHUNK_BYTES = 1 << 20
"""Bytes read (and, compressed, decompressed) at a time."""


@dataclass(frozen=True)
class WikiOptions:
    """What of a page's wikitext becomes text beyond the paragraphs (the BERT paper keeps neither)."""

    keep_lists: bool = False
    """Keep list items (`*`, `#`, `;`, `:` lines), each as its own paragraph."""
    keep_headings: bool = False
    """Keep section headings, each as its own paragraph."""


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

def _fs(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    return fsspec.core.url_to_fs(path)


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
    fs, p = _fs(path)
    with fs.open(p, "rb") as raw, open_decompressed(raw) as fh:
        while chunk := fh.read(CHUNK_BYTES):
            yield chunk


def _range_chunks(path: str, offset: int, length: int) -> Iterator[bytes]:
    """The decompressed bytes of `length` bytes at `offset`: whole bz2 streams, one after another."""
    fs, p = _fs(path)
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
            while data:
                yield d.decompress(data)
                inside = True
                if d.eof:  # the next stream starts in what is left over
                    data, d, inside = d.unused_data, bz2.BZ2Decompressor(), False
                else:
                    data = b""
    if inside:
        raise EOFError(f"{path}: range {offset}+{length} ends inside a bz2 stream")


def _page_blocks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The bytes `<page>...</page>` of every page in decompressed chunks of a dump or of a fragment of one."""
    buf = b""
    for chunk in chunks:
        buf = buf + chunk if buf else chunk
        pos = 0
        while True:
            a = buf.find(b"<page>", pos)
            if a < 0:
                buf = buf[max(pos, len(buf) - 5):]  # a tag may straddle chunks
                break
            b = buf.find(b"</page>", a)
            if b < 0:
                buf = buf[a:]
                break
            yield buf[a : b + 7]
            pos = b + 7


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


def read_pages(path: str, offset: int = 0, length: int | None = None, first_page: int = 0) -> Iterator[Page]:
    """The pages of a dump, in order: the whole file (plain, .bz2 of one or several streams, .gz) when `length`
    is None, else the bz2 streams in bytes [offset, offset + length) of a multistream dump, whose first page is
    page number `first_page` of the dump (`DumpUnit.first_page`)."""
    chunks = _file_chunks(path) if length is None else _range_chunks(path, offset, length)
    for i, block in enumerate(_page_blocks(chunks)):
        yield parse_page(block, first_page + i)


# ---------------------------------------------------------------------------------------------- the index

def _index_lines(index_path: str) -> Iterator[bytes]:
    fs, p = _fs(index_path)
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


# ---------------------------------------------------------------------------------------------- wikitext

_DROP_TAGS = frozenset(
    "ref references table gallery imagemap timeline graph score math chem ce syntaxhighlight source pre code hiero "
    "inputbox templatedata mapframe maplink includeonly indicator".split()
)
_LIST_TAGS = frozenset({"ul", "ol", "dl"})
_LIST_ITEM = frozenset({"li", "dt", "dd"})
_HIDDEN_NS = frozenset({"file", "image", "media", "category"})
_INTERLANGUAGE = re.compile(r"[a-z]{2,3}(-[a-z0-9]+)*|simple")
_SWITCH_OR_QUOTES = re.compile(r"__[A-Z]+__|'{2,}")  # behaviour switches; bold and italic quotes
_EMPTY_PARENS = re.compile(r" ?\([ \t]*[,;:]?[ \t]*\)")  # what is left of "(; {{birth date|..}})"
_SPACE_PUNCT = re.compile(r" +([,.;:!?])")
_LIST = "\x01"  # marks the start of a list item in the rendered text: its line is dropped (or kept)
_HEAD = "\x02"  # marks a heading


def _tokenize(text: str) -> list:
    """mwparserfromhell's token stream (its C tokenizer, built in the wheels): the parse without the node tree,
    which costs five times the tokenizing and which the walk below does not need."""
    return _TOKENIZER.tokenize(text, 0, True)  # context 0; skip_style_tags: bold/italic quotes stay text


# Token classes, compared by identity in the walk below.
TEXT, TPL_OPEN, TPL_CLOSE = T.Text, T.TemplateOpen, T.TemplateClose
WL_OPEN, WL_SEP, WL_CLOSE = T.WikilinkOpen, T.WikilinkSeparator, T.WikilinkClose
EL_OPEN, EL_SEP, EL_CLOSE = T.ExternalLinkOpen, T.ExternalLinkSeparator, T.ExternalLinkClose
ENT_START, ENT_END, HEAD_START, HEAD_END = T.HTMLEntityStart, T.HTMLEntityEnd, T.HeadingStart, T.HeadingEnd
TAG_OPEN, TAG_CLOSE_OPEN, TAG_SELFCLOSE = T.TagOpenOpen, T.TagCloseOpen, T.TagCloseSelfclose
TAG_OPEN_CLOSE, TAG_CLOSE_CLOSE = T.TagOpenClose, T.TagCloseClose
_DROPPED = {TPL_OPEN: (TPL_OPEN, TPL_CLOSE), T.ArgumentOpen: (T.ArgumentOpen, T.ArgumentClose),
            T.CommentStart: (T.CommentStart, T.CommentEnd)}


def _skip(toks: list, i: int, open_: type, close: type) -> int:
    """The index after the `close` that balances the `open_` at i."""
    depth = 0
    n = len(toks)
    while i < n:
        k = type(toks[i])
        if k is open_:
            depth += 1
        elif k is close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def _walk(toks: list, i: int, out: list[str], stop: tuple[type, ...]) -> int:
    """Render tokens from i into `out` until a token of a kind in `stop` (returned, not consumed) or the end.
    Every construct consumes its own closing token, so nesting (a link in a file caption) needs no care."""
    n = len(toks)
    while i < n:
        k = type(toks[i])
        if k in stop:
            return i
        if k is TEXT:
            out.append(toks[i]["text"])
            i += 1
        elif k in _DROPPED:  # templates, template arguments, comments: dropped whole
            i = _skip(toks, i, *_DROPPED[k])
        elif k is WL_OPEN:
            title: list[str] = []
            i = _walk(toks, i + 1, title, (WL_SEP, WL_CLOSE))
            label: list[str] | None = None
            if i < n and type(toks[i]) is WL_SEP:
                label = []
                i = _walk(toks, i + 1, label, (WL_CLOSE,))
            i += 1
            t = "".join(title).strip()
            if not t.startswith(":") and ":" in t:
                prefix = t.split(":", 1)[0].strip().lower()
                if prefix in _HIDDEN_NS or _INTERLANGUAGE.fullmatch(prefix):
                    continue
            if label is not None:
                out.extend(label)
            else:
                out.append(t.lstrip(":").strip().lstrip("#"))
        elif k is EL_OPEN:
            i = _walk(toks, i + 1, [], (EL_SEP, EL_CLOSE))  # the URL: dropped
            if i < n and type(toks[i]) is EL_SEP:
                i = _walk(toks, i + 1, out, (EL_CLOSE,))  # the label: kept
            i += 1
        elif k is ENT_START:
            j = i + 1
            while j < n and type(toks[j]) is not ENT_END:
                j += 1
            out.append(_entity(toks[i + 1 : j]))
            i = j + 1
        elif k is HEAD_START:
            out.append("\n" + _HEAD)
            i = _walk(toks, i + 1, out, (HEAD_END,)) + 1
            out.append("\n")
        elif k is TAG_OPEN:
            i = _tag(toks, i, out)
        else:  # separators and attribute tokens outside what consumes them: nothing to render
            i += 1
    return i


def _tag(toks: list, i: int, out: list[str]) -> int:
    """A tag from its TagOpenOpen at i: its name, attributes skipped, its contents rendered or dropped."""
    markup = toks[i].get("wiki_markup")
    n = len(toks)
    tag = toks[i + 1]["text"].strip().lower() if i + 1 < n and type(toks[i + 1]) is TEXT else ""
    i = _walk(toks, i + 1, [], (TAG_CLOSE_OPEN, TAG_SELFCLOSE))  # the name and attributes: not text
    if i >= n:
        return i
    if type(toks[i]) is TAG_SELFCLOSE:
        if markup and tag in _LIST_ITEM:
            out.append("\n" + _LIST)  # `*`, `#`, `;`, `:` at a line start (`;a:b` puts dd mid-line)
        elif tag in ("br", "hr"):
            out.append("\n")
        return i + 1
    listy = tag in _LIST_ITEM or tag in _LIST_TAGS  # an HTML list: each item a line of its own
    if listy:
        out.append("\n" + _LIST if tag in _LIST_ITEM else "\n")
    i = _walk(toks, i + 1, [] if tag in _DROP_TAGS else out, (TAG_OPEN_CLOSE,))
    if listy:
        out.append("\n")
    while i < n and type(toks[i]) is not TAG_CLOSE_CLOSE:
        i += 1
    return i + 1


def _entity(parts: list) -> str:
    s = "".join("#" if isinstance(t, T.HTMLEntityNumeric) else t.get("char", "x") if isinstance(t, T.HTMLEntityHex)
                else t.get("text", "") for t in parts)
    return html.unescape(f"&{s};")


def wikitext_to_text(wikitext: str, options: WikiOptions = WikiOptions()) -> str:
    """A page's text passages (see the module docstring for what is kept and dropped)."""
    out: list[str] = []
    _walk(_tokenize(wikitext), 0, out, ())
    text = "".join(out)
    text = _SPACE_PUNCT.sub(r"\1", _EMPTY_PARENS.sub("", _SWITCH_OR_QUOTES.sub("", text)))
    paras: list[list[str]] = [[]]
    for line in text.split("\n"):
        line = " ".join(line.split())  # runs of spaces, tabs, no-break spaces: one space
        kind = line[:1]
        if kind in (_LIST, _HEAD):
            body = line.lstrip(_LIST + _HEAD).strip()
            keep = options.keep_lists if kind == _LIST else options.keep_headings
            paras.append([body] if keep and body else [])
            paras.append([])
        elif line:
            paras[-1].append(line)
        elif paras[-1]:
            paras.append([])
    return "\n\n".join("\n".join(p) for p in paras if p).replace(_LIST, "").replace(_HEAD, "")


def page_text(page: Page, options: WikiOptions = WikiOptions()) -> tuple[str | None, str | None]:
    """(text, None) for an article, or (None, reason): wiki_namespace, wiki_redirect, wiki_empty."""
    if page.ns != 0:
        return None, "wiki_namespace"
    if page.redirect:
        return None, "wiki_redirect"
    text = wikitext_to_text(page.wikitext, options)
    return (text, None) if text.strip() else (None, "wiki_empty")
