"""What the readers deal in: input files, documents, rejections, skipped files, and the checks every text passes.

A reader yields, for each record of a file, a `Document` or a `Rejected` (with its reason); when the file itself
cannot be read on (a damaged compressed stream, a broken Parquet footer, an unreadable disk), it rejects the record
it was reading and yields a `Skipped` naming the file, the exception type and its message (`stopped`), which the
manifest lists in `skipped_files`. Errors are caught by what the libraries raise (`READ_ERRORS`, and pyarrow's
`ArrowException` where Arrow reads), never as bare `Exception`: a bug in the readers still surfaces as one.
"""

from __future__ import annotations

import lzma
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, NamedTuple

from pipeline.errors import PipelineError

Kind = Literal["txt", "jsonl", "wikiext_json", "parquet", "hf", "wikiext", "wiki_xml", "wiki_multistream"]

MAX_RECORD_BYTES = 128 * 2**20
"""The most bytes one record may hold (data.max_record_bytes): a dump's `<page>` element, a WikiExtractor `<doc>`
block, a JSON line, a book's file (its bytes once decompressed), a Parquet or datasets row's text. A longer record is
rejected as `record_too_large`, and the reader goes on at the next record: a record never closed (a `<page>` without
`</page>`, a last line without its newline) costs at most this much memory, not the rest of its file. 128 MiB is
64 times a MediaWiki page's limit (2 MiB) and holds the 100 MB single-document book of bench/RESULTS.md."""

MAX_WORD_CHARS = 1000
"""A whitespace-free run longer than this is not language (base64, minified data): the document is rejected."""

# Anchored at a run's start (the lookbehind), so each run is scanned once: `\S{1001}` alone restarts at every
# character of a long run, which made 2 MiB of 1,000-character words take seconds (issue 38).
_LONG_WORD = re.compile(r"(?<!\S)\S{%d}" % (MAX_WORD_CHARS + 1))
_SURROGATE = re.compile("[\ud800-\udfff]")

READ_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    UnicodeError,
    RecursionError,
)
"""What reading a file may raise when its bytes are damaged: I/O and decompression errors (gzip's BadGzipFile and
bz2's "Invalid data stream" are OSErrors), a truncated stream (EOFError), bytes that are not UTF-8, nesting too
deep to decode."""


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
    """... the record number (dump page ordinal) of its first page ..."""
    num_records: int = 0
    """... and how many pages the index lists in it."""
    note: str = ""
    """Why the file is read otherwise than its kind says (a multistream dump whose index is damaged is read whole):
    yielded first as a `Skipped` of the index, so the manifest names it."""


@dataclass(frozen=True)
class Document:
    doc_id: int
    source: str
    text: str
    name: str = ""
    """The document's own name: its record's id when it has one, else file name, `file:line` or `file:row`."""


class Skipped(NamedTuple):
    """An input file not read (or not read to its end), and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class Rejected:
    source: str
    record: int
    reason: str


Item = Document | Rejected | Skipped


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


def has_surrogate(text: str) -> bool:
    """Whether `text` holds a lone surrogate (JSON's `"\\ud800"` decodes to one): it cannot be written as UTF-8.

    >>> has_surrogate("caf\\u00e9"), has_surrogate("a\\ud800b")
    (False, True)
    """
    return not text.isascii() and _SURROGATE.search(text) is not None


def decode_text(data: bytes) -> tuple[str | None, str | None]:
    """(text, None) or (None, reason) for raw bytes of a text document."""
    if b"\x00" in data[:65536]:
        return None, "binary"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "invalid_utf8"
    return text, None


def error_text(e: BaseException) -> str:
    """An exception as one short line: its type as Python names it (a library's with its module) and message.

    >>> import zlib
    >>> error_text(zlib.error("Error -3 while decompressing data: invalid block type")), error_text(EOFError())
    ('zlib.error: Error -3 while decompressing data: invalid block type', 'EOFError')
    """
    t = type(e)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    msg = " ".join(str(e).split())
    msg = msg if len(msg) <= 160 else msg[:157] + "..."
    return f"{name}: {msg}" if msg else name


def stopped(
    f: InputFile, record: int, e: BaseException, reason: str = "", last: int = 0
) -> Iterator[Rejected | Skipped]:
    """What a reader yields when `f` cannot be read on at `record`: that record (through `last`, exclusive, when
    more are known to follow) rejected as `reason` (default: `truncated_gzip` for a truncated stream, else
    `unreadable`), then `f` named with the error.

    >>> list(stopped(InputFile("w.jsonl.gz", "jsonl", 0), 3, EOFError("ended early")))  # doctest: +NORMALIZE_WHITESPACE
    [Rejected(source='w.jsonl.gz', record=3, reason='truncated_gzip'),
     Skipped(path='w.jsonl.gz', reason='unreadable from record 3: EOFError: ended early')]
    """
    reason = reason or ("truncated_gzip" if isinstance(e, EOFError) else "unreadable")
    for k in range(record, max(last, record + 1)):
        yield Rejected(f.path, k, reason)
    yield unreadable(f, e, f"record {record}")


def unreadable(f: InputFile, e: BaseException, where: str = "") -> Skipped:
    """`f` named as not read (from `where` on) because of `e`; a unit of a dump says its byte range too."""
    where = ", ".join(w for w in (f"bytes {f.offset}+{f.length}" if f.length else "", where) if w)
    return Skipped(f.path, f"unreadable{' from ' + where if where else ''}: {error_text(e)}")
