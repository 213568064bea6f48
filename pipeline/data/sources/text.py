"""Readers of the text formats: books, JSON lines (and WikiExtractor's `--json` form), WikiExtractor's `<doc>` form.

Each resyncs where the format allows: a bad JSON line is one rejected record and the next line is read; a damaged
`<doc>` block is one rejected record and the next `<doc` line starts the next. A file that cannot be read on (a
damaged or truncated compressed stream) rejects the record it was reading and is named (`records.stopped`). No
record takes more than `max_record_bytes` of memory (`records.MAX_RECORD_BYTES`): lines are read at most that long
(`lines`), a longer one, a longer `<doc>` block or book is rejected as `record_too_large`.
"""

from __future__ import annotations

import bz2
import gzip
import html
import io
import json
import re
from collections.abc import Iterator

from pipeline.data import wiki
from pipeline.data.sources.inputs import kind_of
from pipeline.data.sources.records import (
    MAX_RECORD_BYTES,
    READ_ERRORS,
    Document,
    InputFile,
    Item,
    Rejected,
    check_text,
    decode_text,
    has_surrogate,
    stopped,
)
from pipeline.storage.io import filesystem


def open_bytes(path: str) -> io.IOBase:
    """A file's bytes, decompressed by extension (.gz, .bz2), or by its magic bytes when the name has no known
    extension (a file recognised by content)."""
    fs, p = filesystem(path)
    f = fs.open(p, "rb")
    low = path.lower()
    if low.endswith(".gz"):
        return gzip.GzipFile(fileobj=f)
    if low.endswith(".bz2"):
        return bz2.BZ2File(f)
    return f if kind_of(path) else wiki.open_decompressed(f)


def base_name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


SKIP_BYTES = 1 << 20
"""Bytes read at a time past a record over the cap, looking for its end."""


def lines(fh: io.IOBase, max_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """The lines of a binary stream as (line, True), a line longer than `max_bytes` (its newline left out) as (its
    first bytes, at most `SKIP_BYTES` of them, False): the rest of it is read past `SKIP_BYTES` at a time. A long
    line is read `SKIP_BYTES` at a time, so one over the cap holds at most max_bytes + 1 bytes, however long (one
    within it, twice its length while its pieces are joined). `readline(max_bytes + 1)` held twice the cap of any
    line over it: a buffered file gathers a long line's pieces, then joins them into a new object (issue 59).

    >>> list(lines(io.BytesIO(b"ab\\nabcdef\\ncd"), 3))
    [(b'ab\\n', True), (b'abcd', False), (b'cd', True)]
    """
    readline, limit = fh.readline, max_bytes + 1  # looked up once: fsspec's local files delegate each lookup
    step = min(limit, SKIP_BYTES)
    while line := readline(step):
        if len(line) < step or line[-1] == 10:  # 10: a newline
            yield line, True
            continue
        pieces, n = [line], len(line)  # a line of more than SKIP_BYTES
        while n < limit and (more := readline(min(SKIP_BYTES, limit - n))):
            pieces.append(more)
            n += len(more)
            if more[-1] == 10:
                break
        if n < limit or pieces[-1][-1] == 10:  # its newline within the cap, or the file's end
            yield b"".join(pieces), True
            continue
        del pieces[1:]
        yield pieces.pop(), False
        while (rest := readline(SKIP_BYTES)) and rest[-1] != 10:
            pass


def read_txt(f: InputFile, max_bytes: int = MAX_RECORD_BYTES) -> Iterator[Item]:
    """A book: the whole file is one document, named by the file; a file of more than `max_bytes` (decompressed) is
    rejected as `record_too_large`, after reading `max_bytes` + 1 of them."""
    doc_id = f.index << 32
    try:
        with open_bytes(f.path) as fh:
            data = fh.read(max_bytes + 1)
    except READ_ERRORS as e:  # a truncated or damaged .gz, a name whose extension lies (`notes.bz2` of plain text)
        yield from stopped(f, 0, e)
        return
    if len(data) > max_bytes:
        yield Rejected(f.path, 0, "record_too_large")
        return
    text, reason = decode_text(data)
    del data  # a book can be 100s of MB: keep the text only, not its bytes too, while it is being consumed
    reason = reason or check_text(text)  # type: ignore[arg-type]
    if reason:
        yield Rejected(f.path, 0, reason)
    else:
        yield Document(doc_id, f.path, text, base_name(f.path))  # type: ignore[arg-type]


def record(
    f: InputFile,
    i: int,
    rec: object,
    column: str,
    where: str = "",
    unescape: bool = False,
    max_bytes: int = MAX_RECORD_BYTES,
) -> Document | Rejected:
    """`rec`'s document: named by its `id` when it has one, else `where` (`file:line`, `file:row`). `unescape`:
    the text is HTML-escaped (WikiExtractor escapes &, < and > in every output form). A text or id holding a lone
    surrogate (JSON's `"\\ud800"`) cannot be written as UTF-8: `lone_surrogate`; a text of more than `max_bytes`
    (a Parquet or datasets row's: a JSON line's is no longer than its line) is `record_too_large`."""
    if not isinstance(rec, dict):
        return Rejected(f.path, i, "invalid_json")
    if column not in rec:
        return Rejected(f.path, i, "missing_text")
    text = rec[column]
    if text is None:
        return Rejected(f.path, i, "null_text")
    if not isinstance(text, str):
        return Rejected(f.path, i, "text_not_string")
    if 4 * len(text) > max_bytes and len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        return Rejected(f.path, i, "record_too_large")
    if unescape:
        text = html.unescape(text)
    rid = rec.get("id")
    name = where if rid is None else str(rid)
    reason = check_text(text) or ("lone_surrogate" if has_surrogate(text) or has_surrogate(name) else None)
    if reason:
        return Rejected(f.path, i, reason)
    return Document((f.index << 32) | i, f.path, text, name)


def _parse_line(line: bytes) -> tuple[object, str | None]:
    """(the JSON value of one line, None) or (None, reason)."""
    try:
        s = line.decode("utf-8")
    except UnicodeDecodeError:
        return None, "invalid_utf8"
    try:
        return json.loads(s), None
    except (ValueError, RecursionError):  # RecursionError: nesting about 1,000 deep
        return None, "invalid_json"


def read_jsonl(f: InputFile, column: str, max_bytes: int = MAX_RECORD_BYTES) -> Iterator[Item]:
    """JSON lines, one record a line. WikiExtractor's `--json` output (recognised by content under its own names,
    kind `wikiext_json`) is HTML-unescaped, as its `<doc>` form is; a `.jsonl` file is read as it is. A line of
    more than `max_bytes` is `record_too_large` (a last line without its newline: the rest of the file)."""
    i = 0
    unescape = f.kind == "wikiext_json"
    base = base_name(f.path)
    try:
        with open_bytes(f.path) as fh:
            for n, (line, whole) in enumerate(lines(fh, max_bytes), 1):
                if not whole:
                    yield Rejected(f.path, i, "record_too_large")
                    i += 1
                    continue
                if not line.strip():
                    continue  # a blank line is not a record
                rec, reason = _parse_line(line)
                yield Rejected(f.path, i, reason) if reason else record(f, i, rec, column, f"{base}:{n}", unescape)
                i += 1
    except READ_ERRORS as e:  # the partial tail after the last complete line, or a stream that cannot be read
        yield from stopped(f, i, e)


# A line that opens a `<doc>` block, whole or damaged (no `>`, invalid UTF-8, indented): each is a record.
_DOC_OPEN = re.compile(rb"[ \t]*<doc(?:[\s>]|$)")
_DOC_CLOSE = re.compile(rb"[ \t]*</doc\s*>", re.IGNORECASE)  # `</doc>`, and `</DOC>`, `</doc >`, indented
# Linear on a `<doc` line of spaces without `>`: one \s, then [^>]* runs once (`<doc\s+([^>]*)>` backtracked
# through every split of the spaces: 1.9 s at 20,000). Attributes start after a non-word character (the lookbehind),
# so a long run of word characters is scanned once, not from each of its characters.
_DOC_TAG = re.compile(r"[ \t]*<doc\s([^>]*)>")
_ATTR = re.compile(r'(?<!\w)(\w+)="([^"]*)"')


def _doc_attrs(raw: bytes) -> tuple[dict[str, str], str | None]:
    """The attributes of a `<doc ...>` line, and the reason its block is rejected when the line is damaged."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return {}, "invalid_utf8"
    m = _DOC_TAG.match(line)
    if not m:
        return {}, "bad_doc_tag"
    return {k: html.unescape(v) for k, v in _ATTR.findall(m.group(1))}, None


def read_wikiext(f: InputFile, max_bytes: int = MAX_RECORD_BYTES) -> Iterator[Item]:
    """WikiExtractor's `<doc id=".." url=".." title="..">` ... `</doc>` blocks: one document each, named by its id.

    Every line that opens a block is a record. A block is rejected as `bad_doc_tag` (its line has no `>`),
    `invalid_utf8`, `record_too_large` (more than `max_bytes`, its lines from `<doc` to `</doc>`: its text is
    dropped as it is read), `unterminated_doc` (the next `<doc` line came before its `</doc>`) or `truncated_doc`
    (the file ended inside it), the first of these it has; text between blocks is no record."""
    i = 0
    inside = False
    attrs: dict[str, str] = {}
    bad: str | None = None
    body = bytearray()  # the block's lines, checked as UTF-8 one by one: bytes, not a str object a line (3x)
    try:
        with open_bytes(f.path) as fh:
            for raw, whole in lines(fh, max_bytes):
                if _DOC_OPEN.match(raw):
                    if inside:  # a block's first damage is its reason
                        yield Rejected(f.path, i, bad or "unterminated_doc")
                        i += 1
                    inside, body = True, bytearray()
                    attrs, bad = _doc_attrs(raw) if whole else ({}, "record_too_large")
                    continue
                if not inside:
                    continue  # text between blocks is not a record
                if _DOC_CLOSE.match(raw):
                    yield Rejected(f.path, i, bad) if bad else _wikiext_doc(f, i, attrs, body)
                    i, inside, body = i + 1, False, bytearray()
                elif bad:
                    continue
                elif not whole or len(body) + len(raw) > max_bytes:
                    bad, body = "record_too_large", bytearray()
                else:
                    try:
                        raw.decode("utf-8")
                    except UnicodeDecodeError:
                        bad, body = "invalid_utf8", bytearray()
                        continue
                    body += raw
    except READ_ERRORS as e:
        yield from stopped(f, i, e)
        return
    if inside:
        yield Rejected(f.path, i, bad or "truncated_doc")  # a block without its </doc>


def _wikiext_doc(f: InputFile, i: int, attrs: dict[str, str], body: bytearray) -> Document | Rejected:
    text = body.decode("utf-8")
    first, newline, rest = text.partition("\n")
    if newline and first.strip() == attrs.get("title", "").strip():
        text = rest  # the title line WikiExtractor writes first
    text = html.unescape(text).strip("\n")
    reason = check_text(text)
    if reason:
        return Rejected(f.path, i, reason)
    return Document((f.index << 32) | i, f.path, text, attrs.get("id") or f"{base_name(f.path)}:{i}")
