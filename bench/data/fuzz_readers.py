"""Malformed input (issue 38): seeded mutations of small real inputs through every reader, each case judged for
unhandled exceptions, records lost without a reason, and time.

    python bench/data/fuzz_readers.py --cases 3000 --seed 0         # fuzz counts: unhandled, lost records, slow cases

Fuzzing. Seed inputs are built from ../shared/corpora in a temporary folder: a book (`.txt`, `.txt.gz`), JSON lines
(`.jsonl`, `.jsonl.gz`), WikiExtractor's `<doc>` form (plain, .bz2, .gz) and `--json` form (plain, .bz2), the
sample MediaWiki dump (`.xml`, `.xml.bz2`, `.xml.gz`), the same dump as a multistream dump with its index, and
Parquet. Each case takes one seed and one mutation drawn by `random.Random(seed + case)`: byte flips, truncation,
NULs, invalid UTF-8, dropped or misspelt closing tags, damaged opening tags, raw `<` and bad entities in a page,
`<ns>1.5</ns>`, nested `<page>`, deep JSON (900-5,000 levels), lone surrogate escapes, hostile markup in a page,
garbage compression headers, flips and truncation of the compressed bytes, lying extensions, damaged Parquet
footers and invalid UTF-8 in a Parquet string column, and a damaged, truncated or empty multistream index. The
file then goes through `expand_inputs` -> `split_units` (units of one bz2 stream) -> `read_documents`.

Each case is one of:
  - crash: an exception escaped the readers;
  - lost: fewer records (documents + rejections) than the file holds, with no reason. What the file holds is
    counted from its (mutated) plain bytes by the kind the reader chose: one record for a book, a record per
    non-blank line of JSON, per `<doc` opening line, per `<page>`, per Parquet row. When the container itself is
    damaged (compressed bytes, a Parquet footer) the plain bytes are not known: a shortfall then needs a reason
    (the file named as skipped, or a `truncated_*`/`unreadable` rejection of the record where reading stopped);
  - extra: more records than the file holds (unexplained, as for lost), or two documents with one doc_id;
  - bad_text: a document whose text cannot be encoded as UTF-8 (a lone surrogate);
  - slow: the case took more than `--slow` CPU seconds (CPU, not wall time: a shared machine's load does not count);
  - ok.
Reported: counts per outcome, per input form and per mutation, and the first cases of each bad outcome (seed and
case number reproduce them: `--only CASE`). tests/test_fuzz_readers.py runs `fuzz` with a small budget in CI.

bench/data/reader_timing.py measures the time side (hostile markup, long lines) and checks that good inputs give the
same documents as before. Everything is written under a temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import html
import io
import json
import random
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
CORPORA = REPO.parent / "shared" / "corpora"

# ---------------------------------------------------------------------------------------------- seed inputs


@dataclass(frozen=True)
class Seed:
    form: str
    """The input form: book, jsonl, wikiext, wikiext_json, xml, multistream, parquet."""
    name: str
    """The file's name (its extension, or none, as a user would have it)."""
    plain: bytes
    """Its content before compression (a Parquet file's bytes; the multistream dump's XML)."""
    pack: str = ""
    """"", "gz" or "bz2"."""


def _records(n: int = 6, chars: int = 1500) -> list[dict]:
    with gzip.open(CORPORA / "wiki" / "pydocs.jsonl.gz", "rt") as f:
        recs = [json.loads(line) for _, line in zip(range(n), f)]
    return [{**r, "text": r["text"][:chars]} for r in recs]


def _doc_block(r: dict) -> str:
    body = html.escape(r["text"], quote=False)
    head = f'<doc id="{r["id"]}" url="{html.escape(r["url"])}" title="{html.escape(r["title"])}">'
    return f"{head}\n{r['title']}\n\n{body}\n</doc>\n"


def _parquet(recs: list[dict]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    table = pa.table({"id": [r["id"] for r in recs], "text": [r["text"] for r in recs]})
    pq.write_table(table, buf, row_group_size=2, compression="none")  # the text bytes lie in the file as they are
    return buf.getvalue()


def seeds() -> list[Seed]:
    """The seed inputs, small and real (the shared corpora)."""
    book = (CORPORA / "books" / "08_Ruth.txt").read_bytes()[:4000]
    recs = _records()
    jsonl = "".join(json.dumps(r) + "\n" for r in recs).encode()
    wikiext = "".join(_doc_block(r) for r in recs).encode()
    ext_json = "".join(json.dumps({**r, "text": html.escape(r["text"], quote=False)}) + "\n" for r in recs).encode()
    dump = (CORPORA / "wikidump" / "enwiki-sample-pages-articles.xml").read_bytes()
    return [
        Seed("book", "ruth.txt", book),
        Seed("book", "ruth.txt.gz", book, "gz"),
        Seed("jsonl", "w.jsonl", jsonl),
        Seed("jsonl", "w.jsonl.gz", jsonl, "gz"),
        Seed("wikiext", "wiki_00", wikiext),
        Seed("wikiext", "wiki_00.bz2", wikiext, "bz2"),
        Seed("wikiext", "wiki_00.gz", wikiext, "gz"),
        Seed("wikiext_json", "wiki_01", ext_json),
        Seed("wikiext_json", "wiki_01.bz2", ext_json, "bz2"),
        Seed("xml", "enwiki-pages-articles.xml", dump),
        Seed("xml", "enwiki-pages-articles.xml.bz2", dump, "bz2"),
        Seed("xml", "enwiki-pages-articles.xml.gz", dump, "gz"),
        Seed("multistream", "enwiki-20990101-pages-articles-multistream.xml.bz2", dump, "bz2"),
        Seed("parquet", "p.parquet", _parquet(recs)),
    ]


def pack(data: bytes, how: str) -> bytes:
    return gzip.compress(data, mtime=0) if how == "gz" else bz2.compress(data) if how == "bz2" else data


def multistream(xml: bytes, per_stream: int = 3) -> tuple[bytes, bytes]:
    """(dump, index) of `xml` as Wikimedia writes them: the header in a stream of its own, then streams of
    `per_stream` pages, then the tail; the index lists `offset:page_id:title` per page. Pages are cut at each
    `<page>`, so a damaged page stays in its stream."""
    starts = [m.start() for m in re.finditer(rb"<page>", xml)] or [len(xml)]
    end = xml.rfind(b"</page>")
    end = len(xml) if end < starts[-1] else xml.index(b"\n", end) + 1 if b"\n" in xml[end:] else len(xml)
    pages = [xml[a:b] for a, b in zip(starts, starts[1:] + [end])] if starts[0] < len(xml) else []
    groups = [pages[i : i + per_stream] for i in range(0, len(pages), per_stream)]
    blobs = [bz2.compress(s) for s in [xml[: starts[0]]] + [b"".join(g) for g in groups] + [xml[end:]]]
    offsets = [sum(len(b) for b in blobs[:k]) for k in range(len(blobs))]
    lines = []
    for k, g in enumerate(groups):
        for page in g:
            pid = re.search(rb"<id>(\d+)</id>", page)
            lines.append(b"%d:%s:T\n" % (offsets[1 + k], pid.group(1) if pid else b"0"))
    return b"".join(blobs), b"".join(lines)


# ---------------------------------------------------------------------------------------------- mutations


def _at(rng: random.Random, data: bytes) -> int:
    return rng.randrange(len(data) + 1)


def _replace_one(rng: random.Random, data: bytes, old: bytes, new: bytes) -> bytes:
    spots = [m.start() for m in re.finditer(re.escape(old), data)]
    if not spots:
        return data
    k = rng.choice(spots)
    return data[:k] + new + data[k + len(old) :]


def _flip(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if b:
            b[rng.randrange(len(b))] ^= rng.randint(1, 255)
    return bytes(b)


def _insert(rng: random.Random, data: bytes, what: bytes) -> bytes:
    k = _at(rng, data)
    return data[:k] + what + data[k:]


def _deep_json(rng: random.Random, data: bytes) -> bytes:
    d = rng.choice([900, 990, 1000, 1100, 5000])
    lines = data.split(b"\n")
    k = rng.randrange(len(lines))
    deep = [b'{"text": ' + b"[" * d + b"]" * d + b"}", b"[" * d + b"]" * d, b'{"a":' * d + b"1" + b"}" * d]
    lines[k] = rng.choice(deep)
    return b"\n".join(lines)


_NOT_UTF8 = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]
_DOC_CLOSERS = [b"</DOC>", b"</doc >", b"  </doc>", b"</dco>"]  # the first three close a block, the last does not
_HOSTILE = [b"<!--", b"<ref ", b"[[a|", b"{{a|", b"<b>", b"{|\n", b"<p>", b"[http://x ", b" "]


def _hostile_page(rng: random.Random, data: bytes) -> bytes:
    """One page's text replaced by a hostile pattern of 8-16 KiB (XML-escaped as a dump holds it)."""
    p = rng.choice(_HOSTILE)
    text = html.escape((p * (rng.randint(8, 16) * 1024 // len(p))).decode(), quote=False).encode()
    m = list(re.finditer(rb"(<text[^>]*>)(.*?)(</text>)", data, re.S))
    if not m:
        return data
    t = rng.choice(m)
    return data[: t.start(2)] + text + data[t.end(2) :]


CONTENT = {  # mutation -> (forms it applies to, function of (rng, plain bytes))
    "flip": (None, _flip),
    "truncate": (None, lambda r, d: d[: _at(r, d)]),
    "nul": (None, lambda r, d: _insert(r, d, b"\x00" * r.randint(1, 4))),
    "invalid_utf8": (None, lambda r, d: _insert(r, d, r.choice(_NOT_UTF8))),
    "splice": (None, lambda r, d: _insert(r, d, d[_at(r, d) :][: r.randint(1, 400)])),
    "drop_close": (
        {"wikiext", "xml", "multistream"},
        lambda r, d: _replace_one(r, d, r.choice([b"</doc>", b"</page>", b"</text>", b"</revision>"]), b""),
    ),
    "misspell_close": (
        {"wikiext", "xml", "multistream"},
        lambda r, d: _replace_one(
            r,
            _replace_one(r, d, b"</doc>", r.choice(_DOC_CLOSERS)),
            b"</page>",
            r.choice([b"</Page>", b"</page >", b"</pgae>"]),
        ),
    ),
    "open_tag": (
        {"wikiext"},
        lambda r, d: re.sub(rb"(<doc [^>\n]*)>", lambda m: m.group(1 if r.random() < 0.3 else 0), d),
    ),
    "long_doc_tag": ({"wikiext"}, lambda r, d: _insert(r, d, b"\n<doc" + b" " * 20000 + b"\n")),
    "nested_page": ({"xml", "multistream"}, lambda r, d: _replace_one(r, d, b"<title>", b"<page>\n<title>")),
    "raw_lt": ({"xml", "multistream"}, lambda r, d: _replace_one(r, d, b"</text>", b" a < b </text>")),
    "bad_entity": ({"xml", "multistream"}, lambda r, d: _replace_one(r, d, b"</text>", b"&bogus;</text>")),
    "ns_float": ({"xml", "multistream"}, lambda r, d: _replace_one(r, d, b"<ns>0</ns>", b"<ns>1.5</ns>")),
    "hostile_markup": ({"xml"}, _hostile_page),
    "deep_json": ({"jsonl", "wikiext_json"}, _deep_json),
    "surrogate": ({"jsonl", "wikiext_json"}, lambda r, d: _replace_one(r, d, b'"text": "', b'"text": "\\ud800')),
    "long_words": ({"book"}, lambda r, d: d + (b"a" * 1000 + b" ") * r.randint(100, 400)),
}
PACKED = {  # mutations of the bytes as stored (compressed, Parquet), for seeds with a container
    "garbage_header": lambda r, d: bytes(r.randrange(256) for _ in range(r.randint(2, 12))) + d[r.randint(2, 12) :],
    "packed_flip": _flip,
    "packed_truncate": lambda r, d: d[: _at(r, d)],
}
PARQUET = {
    "empty_file": lambda r, d: b"",
    "bad_magic": lambda r, d: d[:-4] + b"PAR2",
    "footer_too_long": lambda r, d: d[:-8] + (len(d) * 4).to_bytes(4, "little") + b"PAR1",
    "bad_utf8_value": lambda r, d: _replace_one(r, d, b"Python", b"Pyth\xff\xfe"),
}
INDEX = {
    "index_garbage": lambda r, d: bytes(r.randrange(256) for _ in range(64)),
    "index_truncate": lambda r, d: d[: r.randrange(1, len(d))],
    "index_empty": lambda r, d: b"",
    "index_flip": _flip,
    "index_plain_garbage": lambda r, d: bz2.compress(b"not:an:index\n" + bz2.decompress(d)),
}
LIES = {"book": ["notes.bz2", "notes.gz", "notes.txt.gz"], "jsonl": ["w.jsonl.gz"]}


@dataclass
class Case:
    number: int
    seed: Seed
    mutation: str
    files: dict[str, bytes]
    """File name -> bytes, as written."""
    plain: bytes | None
    """The plain bytes the reader should find (None when the container itself is damaged)."""


def make_case(number: int, seed: int, pool: list[Seed]) -> Case:
    """Case `number` of run `seed`: one seed input, one mutation, deterministic."""
    rng = random.Random(seed * 1_000_003 + number)
    s = rng.choice(pool)
    kinds = [m for m, (forms, _) in CONTENT.items() if forms is None or s.form in forms]
    if s.form == "parquet":
        kinds = ["flip", "truncate"] + list(PARQUET)
    elif s.pack:
        kinds += list(PACKED) * 2
    if s.form == "multistream":
        kinds += list(INDEX) * 2
    kinds += ["lying_name"] if s.form in LIES else []
    mutation = rng.choice(kinds)
    plain, name = s.plain, s.name
    if mutation in CONTENT and s.form != "parquet":
        plain = CONTENT[mutation][1](rng, s.plain)
    if mutation == "lying_name":  # the bytes are not what the name says: a damaged container for the reader
        name = rng.choice(LIES[s.form])
    if s.form == "multistream":
        dump, index = multistream(plain)
        if mutation in PACKED:
            dump, plain = PACKED[mutation](rng, dump), None
        if mutation in INDEX:
            index = INDEX[mutation](rng, bz2.compress(index))
        else:
            index = bz2.compress(index)
        return Case(
            number, s, mutation, {name: dump, name.replace("multistream.xml", "multistream-index.txt"): index}, plain
        )
    data = pack(plain, "" if mutation == "lying_name" else s.pack)
    if s.form == "parquet":
        fn = PARQUET.get(mutation) or CONTENT[mutation][1]
        data = fn(rng, s.plain)
        plain = s.plain if mutation == "bad_utf8_value" else None
    elif mutation in PACKED:
        data, plain = PACKED[mutation](rng, data), None
    return Case(number, s, mutation, {name: data}, None if mutation == "lying_name" else plain)


# ---------------------------------------------------------------------------------------------- running a case

STOPPED = {"truncated_gzip", "truncated_dump", "unreadable", "truncated_doc", "truncated_page"}
"""Rejection reasons that say reading stopped where the record was damaged (the records after it are gone)."""


def records_in(kind: str, plain: bytes, seed: Seed) -> int:
    """How many records a file of this kind holding `plain` has (see the module docstring)."""
    if kind == "txt":
        return 1
    if kind in ("jsonl", "wikiext_json"):
        return sum(1 for line in plain.split(b"\n") if line.strip())
    if kind == "wikiext":
        return sum(1 for line in plain.split(b"\n") if re.match(rb"[ \t]*<doc(?:[\s>]|$)", line))
    if kind in ("wiki_xml", "wiki_multistream"):
        return plain.count(b"<page>")
    if kind == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(io.BytesIO(seed.plain)).metadata.num_rows
    raise ValueError(kind)


@dataclass
class Outcome:
    case: Case
    verdict: str
    detail: str = ""
    records: int = 0
    expected: int = 0
    missing: int = 0
    seconds: float = 0.0
    skipped: list = field(default_factory=list)


def run_case(case: Case, root: Path, slow: float) -> Outcome:
    """Write the case's files under `root`, read them as the pipeline does, and judge the result."""
    from pipeline.data.sources import Document, Rejected, Skipped, expand_inputs, read_documents, split_units

    d = root / f"c{case.number:06d}"
    d.mkdir(parents=True)
    for name, data in case.files.items():
        (d / name).write_bytes(data)
    main = str(d / next(iter(case.files)))
    start = time.process_time()
    items: list = []
    try:
        files, skipped = expand_inputs([main])
        for f in files:
            for u in split_units(f, 1):
                items.extend(read_documents(u))
    except Exception as e:  # noqa: BLE001 - what escapes the readers is what this harness counts
        t = type(e)
        name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
        return Outcome(case, "crash", f"{name}: {str(e)[:120]}", seconds=time.process_time() - start)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    seconds = time.process_time() - start
    docs = [x for x in items if isinstance(x, Document)]
    rejected = [x for x in items if isinstance(x, Rejected)]
    named = [x for x in items if isinstance(x, Skipped)] + [s for s in skipped if "index" not in s.reason]
    records = len(docs) + len(rejected)
    kind = files[0].kind if files else "txt"
    plain = case.plain if case.plain is not None else case.seed.plain
    expected = records_in(kind, plain, case.seed) if files else 0
    out = Outcome(case, "ok", records=records, expected=expected, seconds=seconds, skipped=named)
    bad = [x for x in docs if not _encodes(x.text)]
    # a damaged container (compressed bytes, a Parquet footer): its plain bytes are not known, so a count other
    # than the intact file's needs a reason: the file named, or the record where reading stopped rejected
    excused = case.plain is None and bool(named or (rejected and rejected[-1].reason in STOPPED))
    if records < expected:
        out.missing = expected - records
    if bad:
        out.verdict, out.detail = "bad_text", f"{len(bad)} document(s) not UTF-8 encodable"
    elif len({x.doc_id for x in docs}) < len(docs) or (records > expected and not excused):
        out.verdict, out.detail = "extra", f"{records} records of {expected}, {len(docs)} documents"
    elif records < expected and not excused:
        out.verdict, out.detail = "lost", f"{records} records of {expected}"
    if out.verdict == "ok" and seconds > slow:
        out.verdict, out.detail = "slow", f"{seconds:.2f} CPU s"
    return out


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def fuzz(
    cases: int, seed: int = 0, seconds: float | None = None, slow: float = 2.0, only: int | None = None
) -> list[Outcome]:
    """Run up to `cases` cases (or until `seconds` have passed); every case's outcome."""
    pool = seeds()
    out: list[Outcome] = []
    start = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="fuzz-readers-"))
    try:
        for n in [only] if only is not None else range(cases):
            out.append(run_case(make_case(n, seed, pool), root, slow))
            if seconds is not None and time.perf_counter() - start > seconds:
                break
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def report(outcomes: list[Outcome], show: int = 3) -> str:
    verdicts = Counter(o.verdict for o in outcomes)
    lines = [
        f"{len(outcomes)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items())),
        f"records lost without a reason: {sum(o.expected - o.records for o in outcomes if o.verdict == 'lost')}"
        f" in {verdicts['lost']} files; records of named (skipped) files not read: "
        f"{sum(o.missing for o in outcomes if o.verdict == 'ok' and o.missing)}",
        f"slowest case: {max((o.seconds for o in outcomes), default=0):.2f} CPU s",
        "",
    ]
    by = Counter((o.case.seed.form, o.verdict) for o in outcomes)
    forms = sorted({o.case.seed.form for o in outcomes})
    cols = sorted(verdicts)
    lines.append("| form | " + " | ".join(cols) + " |")
    lines.append("|---|" + "---:|" * len(cols))
    lines += [f"| {f} | " + " | ".join(str(by[f, c]) for c in cols) + " |" for f in forms]
    bad = Counter((o.case.mutation, o.verdict) for o in outcomes if o.verdict != "ok")
    if bad:
        lines += ["", "by mutation: " + ", ".join(f"{m}/{v} {n}" for (m, v), n in sorted(bad.items()))]
    for v in sorted(verdicts):
        if v == "ok":
            continue
        for o in [o for o in outcomes if o.verdict == v][:show]:
            lines.append(f"  {v}: case {o.case.number} {o.case.seed.name} {o.case.mutation}: {o.detail}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=None, help="stop after this long (wall time)")
    ap.add_argument("--slow", type=float, default=2.0, help="a case taking more CPU seconds than this is `slow`")
    ap.add_argument("--only", type=int, default=None, help="run this case number alone")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    outcomes = fuzz(args.cases, args.seed, args.seconds, args.slow, args.only)
    print(report(outcomes, show=3 if args.only is None else 1))
    print(f"\n{time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
