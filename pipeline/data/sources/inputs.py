"""Input paths -> input files: folders walked, kinds by extension or by content, the files skipped and why, and a
multistream dump cut into units (`split_units`)."""

from __future__ import annotations

import dataclasses
import re

import fsspec

from pipeline.data import wiki
from pipeline.data.sources.records import READ_ERRORS, InputError, InputFile, Kind, Skipped, error_text
from pipeline.storage.io import broken_link, filesystem, find_files, is_local

_KINDS: dict[str, Kind] = {
    ".txt": "txt",
    ".txt.gz": "txt",
    ".jsonl": "jsonl",
    ".jsonl.gz": "jsonl",
    ".json.gz": "jsonl",
    ".parquet": "parquet",
}


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
_INDEX_REASON = "index of a multistream dump"  # no input of its own: its dump is read with it
_JSON_RECORD = re.compile(rb'\{\s*"(id|text|title|url|revid)"\s*:')


def sniff_kind(path: str) -> Kind | None:
    """The kind of a file by its first bytes (decompressed when bz2 or gzip), or None when not recognised:
    a MediaWiki dump, WikiExtractor's `<doc ...>` blocks or JSON lines. Only files whose name has no known
    extension are sniffed."""
    return _sniff(path)[0]


def _sniff(path: str) -> tuple[Kind | None, str]:
    """(`sniff_kind`, "") or, when the first bytes cannot be read or decompressed, (None, why)."""
    fs, p = filesystem(path)
    try:
        with fs.open(p, "rb") as raw, wiki.open_decompressed(raw) as fh:
            head = fh.read(_SNIFF_BYTES)
    except READ_ERRORS + (ValueError,) as e:
        return None, f"unreadable: {error_text(e)}"
    head = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"<mediawiki") or (head.startswith(b"<?xml") and b"<mediawiki" in head):
        return "wiki_xml", ""
    if head.startswith((b"<doc ", b"<doc\t")):
        return "wikiext", ""
    if _JSON_RECORD.match(head):
        return "wikiext_json", ""
    return None, ""


def _kind_and_reason(fs: fsspec.AbstractFileSystem, path: str, explicit: bool) -> tuple[Kind | None, str]:
    """(kind, "") for a file to read, or (None, reason) for one to skip."""
    k = kind_of(path)
    if k is not None:
        return k, ""
    dump = wiki.dump_name(path)
    if dump is not None:
        if fs.exists(dump):
            return None, _INDEX_REASON
        return None, "index of a multistream dump that is not there"
    k, error = _sniff(path)
    if error:  # a damaged compressed file: named with why, in a folder or alone
        return None, error
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
    text book; one whose first bytes cannot be decompressed is skipped ("unreadable: zlib.error: ..."). A
    multistream dump's index is no input of its own ("index of a multistream dump"): the dump beside it is read as
    `wiki_multistream`.

    >>> expand_inputs(["/no/such/dir"])
    Traceback (most recent call last):
    ...
    pipeline.data.sources.records.InputError: input path /no/such/dir does not exist
    """
    if not paths:
        raise InputError("no input given (--input PATH)")
    found: list[tuple[str, Kind, int, str]] = []
    skipped: list[Skipped] = []
    for raw in paths:
        fs, p = filesystem(raw)
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


def skipped_once(skipped: list[Skipped]) -> list[Skipped]:
    """Each file once, sorted by path (the manifest's skipped_files): a file named more than once (at planning and
    again by its reader, or by several units of one dump) keeps its reasons in the order given, joined by "; ".
    Planning names every multistream index "index of a multistream dump"; when its reader found it damaged too,
    that reason (which says so, and that the dump was read whole) replaces the planning one.

    >>> once = skipped_once([Skipped("i", "index of a multistream dump"), Skipped("i", "damaged index: EOFError"),
    ...                      Skipped("d", "unreadable from bytes 0+9: EOFError"), Skipped("d", "unreadable: OSError")])
    >>> [f"{s.path}: {s.reason}" for s in once]
    ['d: unreadable from bytes 0+9: EOFError; unreadable: OSError', 'i: damaged index: EOFError']
    """
    reasons: dict[str, list[str]] = {}
    for s in skipped:
        if s.reason not in reasons.setdefault(s.path, []):
            reasons[s.path].append(s.reason)
    for path, rs in reasons.items():
        if len(rs) > 1 and _INDEX_REASON in rs:
            rs.remove(_INDEX_REASON)
    return [Skipped(path, "; ".join(rs)) for path, rs in sorted(reasons.items())]


def skipped_summary(skipped: list[Skipped], show: int = 5) -> str:
    """The first `show` skipped files and why, for a one-line message.

    >>> skipped_summary([Skipped("a", "unknown format"), Skipped("b", "symlink loop")], show=1)
    'skipped 2: a (unknown format), and 1 more'
    """
    named = ", ".join(f"{s.path} ({s.reason})" for s in skipped[:show])
    more = f", and {len(skipped) - show} more" if len(skipped) > show else ""
    return f"skipped {len(skipped)}: {named}{more}"


def no_readable_input(inputs: list[str], skipped: list[Skipped], show: int = 5) -> InputError:
    """The error for inputs that hold no file to read, naming the first `show` skipped files and why.

    >>> str(no_readable_input(["text"], [Skipped("text/AA/notes", "unknown format")]))
    'no readable input file under text (skipped 1: text/AA/notes (unknown format))'
    """
    detail = skipped_summary(skipped, show) if skipped else "no file found"
    return InputError(f"no readable input file under {', '.join(inputs)} ({detail})")


def check_sources(sources) -> None:
    """Each source of a mixture (`data.sources`) has a file to read: a job checks this on its driver before Ray
    starts (the plan lists the inputs again, `pipeline.data.stages.file_sources`). InputError, one line naming
    the source, when one has none.

    >>> from pipeline.config import SourceConfig
    >>> check_sources([SourceConfig("news", ["/no/such/dir"], weight=1)])
    Traceback (most recent call last):
    ...
    pipeline.data.sources.records.InputError: data.sources[news]: input path /no/such/dir does not exist
    """
    for s in sources:
        try:
            files, skipped = expand_inputs(list(s.inputs))
        except InputError as e:
            raise InputError(f"data.sources[{s.name}]: {e}") from None
        if not files:
            raise InputError(f"data.sources[{s.name}]: {no_readable_input(list(s.inputs), skipped)}")


def split_units(f: InputFile, target_bytes: int) -> list[InputFile]:
    """The units `f` can be read in apart, each an InputFile: byte ranges of about `target_bytes` compressed
    bytes for a multistream dump with its index (same index, so the same doc_ids, whatever the split), else
    `[f]`. Read whole, a multistream dump gives the same documents: so a dump whose index cannot be read, or lists
    no page, is read whole (kind `wiki_xml`), with a `note` that says why (the index is named as skipped)."""
    if f.kind != "wiki_multistream":
        return [f]
    index = wiki.index_name(f.path)
    assert index is not None
    try:
        units = wiki.dump_units(index, f.size, target_bytes)
    except READ_ERRORS + (ValueError,) as e:  # ValueError: stream_ranges' own check of each line
        return [dataclasses.replace(f, kind="wiki_xml", note=f"damaged index, its dump read whole: {error_text(e)}")]
    if not units:
        return [dataclasses.replace(f, kind="wiki_xml", note="the index lists no page, its dump read whole")]
    return [
        dataclasses.replace(f, offset=u.offset, length=u.length, first_record=u.first_page, num_records=u.num_pages)
        for u in units
    ]


def fingerprint(files: list[InputFile]) -> list[tuple[str, str, int, str]]:
    """What identifies the inputs cheaply (path, kind, size, mtime); part of the output's config hash."""
    return [(f.path, f.kind, f.size, f.mtime) for f in files]
