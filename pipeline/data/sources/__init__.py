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
`file:line` for a JSON line, `file:row` for a Parquet or datasets row.

Bad input is never fatal, and no record goes uncounted: every record is yielded as a Document or as a `Rejected`
with its reason: invalid_utf8, binary, empty, word_too_long, lone_surrogate, invalid_json, missing_text,
null_text, text_not_string, record_too_large (over data.max_record_bytes, `records.MAX_RECORD_BYTES`: a record
never closed costs that much memory at most, not the rest of its file); for WikiExtractor's `<doc>` blocks
bad_doc_tag, unterminated_doc, truncated_doc; for dumps wiki_namespace, wiki_redirect, wiki_empty, markup_budget,
unparsable_page, unterminated_page, truncated_page, index_mismatch;
and where a file cannot be read on, truncated_gzip, truncated_dump or unreadable for the record being read. Each
reader resyncs where its format allows (the next line, `<doc`, `<page>`, Parquet row group). A file that cannot be
read, or not to its end (a damaged compressed stream, a broken Parquet footer), is also yielded as a `Skipped`
naming it, the exception type and its message: the manifest lists it in `skipped_files` with the files
`expand_inputs` did not read. Modules: records (the types and checks), inputs (paths -> files, units), text,
tables (Parquet, datasets); dumps are read here with pipeline.data.wiki.
"""

from __future__ import annotations

from collections.abc import Iterator

from pipeline.data import wiki
from pipeline.data.sources.inputs import (
    check_sources,
    expand_inputs,
    fingerprint,
    kind_of,
    no_readable_input,
    skipped_once,
    skipped_summary,
    sniff_kind,
    split_units,
)
from pipeline.data.sources.records import (
    MAX_RECORD_BYTES,
    MAX_WORD_CHARS,
    READ_ERRORS,
    Document,
    InputError,
    InputFile,
    Item,
    Kind,
    Rejected,
    Skipped,
    check_text,
    decode_text,
    stopped,
)
from pipeline.data.sources.tables import read_hf, read_parquet
from pipeline.data.sources.text import read_jsonl, read_txt, read_wikiext
from pipeline.data.wiki import WikiOptions

__all__ = [
    "MAX_RECORD_BYTES",
    "MAX_WORD_CHARS",
    "Document",
    "InputError",
    "InputFile",
    "Item",
    "Kind",
    "Rejected",
    "Skipped",
    "check_text",
    "decode_text",
    "check_sources",
    "expand_inputs",
    "fingerprint",
    "kind_of",
    "no_readable_input",
    "read_documents",
    "read_records",
    "skipped_once",
    "skipped_summary",
    "sniff_kind",
    "split_units",
]


def _read_wiki(f: InputFile, options: WikiOptions, max_bytes: int) -> Iterator[Item]:
    """A MediaWiki dump, whole or one unit (`split_units`): every page a record numbered by its position. A damaged
    page is rejected and the next `<page>` read; a stream that cannot be read on rejects the page being read (in
    a unit, every page the index lists after it too) and names the file."""
    pages = (
        wiki.read_pages(f.path, f.offset, f.length, f.first_record, max_bytes)
        if f.length
        else wiki.read_pages(f.path, max_bytes=max_bytes)
    )
    last = f.first_record
    end = f.first_record + f.num_records if f.length else 0  # in a unit: past the pages its index lists
    try:
        for page in pages:
            last = page.ordinal + 1
            if isinstance(page, wiki.BrokenPage):
                yield Rejected(f.path, page.ordinal, page.reason)
                continue
            if end and page.ordinal >= end:  # a page the index does not list: it would take the next unit's doc_id
                yield Rejected(f.path, page.ordinal, "index_mismatch")
                continue
            text, reason = wiki.page_text(page, options)
            reason = reason or check_text(text)  # type: ignore[arg-type]
            if reason:
                yield Rejected(f.path, page.ordinal, reason)
            else:
                yield Document((f.index << 32) | page.ordinal, f.path, text, page.page_id)  # type: ignore[arg-type]
    except READ_ERRORS as e:
        reason = "truncated_dump" if isinstance(e, EOFError) else "unreadable"
        yield from stopped(f, last, e, reason, end)


def read_documents(
    f: InputFile,
    text_column: str = "text",
    wiki_options: WikiOptions = WikiOptions(),
    max_record_bytes: int = MAX_RECORD_BYTES,
) -> Iterator[Item]:
    """Every record of one input file (or of one unit of it, `split_units`), in order, as a Document or a
    Rejected, and a Skipped where the file cannot be read (on). `wiki_options` say what of a dump page's wikitext
    is kept (lists, headings); a record of more than `max_record_bytes` is `record_too_large`."""
    if f.note:  # a multistream dump read whole: its index is named, with why
        yield Skipped(wiki.index_name(f.path) or f.path, f.note)
    if f.kind == "txt":
        yield from read_txt(f, max_record_bytes)
    elif f.kind in ("jsonl", "wikiext_json"):
        yield from read_jsonl(f, text_column, max_record_bytes)
    elif f.kind == "parquet":
        yield from read_parquet(f, text_column, max_record_bytes)
    elif f.kind == "wikiext":
        yield from read_wikiext(f, max_record_bytes)
    elif f.kind in ("wiki_xml", "wiki_multistream"):
        yield from _read_wiki(f, wiki_options, max_record_bytes)
    else:
        yield from read_hf(f, text_column, max_record_bytes)


def read_records(
    f: InputFile,
    text_column: str,
    wiki_options: WikiOptions,
    skipped: list[Skipped],
    max_record_bytes: int = MAX_RECORD_BYTES,
) -> Iterator[Document | Rejected]:
    """`read_documents` without its `Skipped` items, which are appended to `skipped` (the manifest's skipped_files)."""
    for item in read_documents(f, text_column, wiki_options, max_record_bytes):
        if isinstance(item, Skipped):
            skipped.append(item)
        else:
            yield item
