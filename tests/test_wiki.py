"""MediaWiki dumps: the plain and multistream forms read whole and by units, wikitext -> text, rejections, and
WikiExtractor's own output of the same sample read back."""

from __future__ import annotations

import bz2
import html
import re
import subprocess
import sys
from collections import Counter

import pytest

from pipeline.data import wiki
from pipeline.data.sources import Document, Rejected, Skipped, expand_inputs, read_documents, split_units
from pipeline.data.wiki import WikiOptions, page_text, read_pages, stream_ranges, wikitext_to_text

ARTICLES = {"7697605": 0, "7697611": 2, "7697612": 3, "7697626": 6}  # page id -> ordinal in the sample dump
REASONS = Counter(wiki_namespace=4, wiki_redirect=3)


@pytest.fixture(scope="module")
def sample(shared_dir):
    return shared_dir / "corpora/wikidump/enwiki-sample-pages-articles.xml"


def _read(paths, options=WikiOptions()):
    files, skipped = expand_inputs([str(p) for p in paths])
    items = [x for f in files for x in read_documents(f, wiki_options=options)]
    return files, skipped, items


def _docs(items):
    return [(d.doc_id, d.name, d.text) for d in items if isinstance(d, Document)]


def _split_sample(sample) -> tuple[bytes, list[bytes], bytes]:
    """(header up to the first <page>, every page's bytes with its indentation, the tail)."""
    raw = sample.read_bytes()
    starts = [m.start() for m in re.finditer(rb"  <page>", raw)]
    ends = [m.end() for m in re.finditer(rb"</page>\n", raw)]
    return raw[: starts[0]], [raw[a:b] for a, b in zip(starts, ends)], raw[ends[-1] :]


def _multistream(tmp_path, sample, per_stream=3, header_alone=True):
    """A multistream dump of the sample (streams of `per_stream` pages; the header in a stream of its own, as in
    Wikimedia's dumps, or in the first page stream) and its index, in `tmp_path/dump`."""
    header, pages, tail = _split_sample(sample)
    groups = [pages[i : i + per_stream] for i in range(0, len(pages), per_stream)]
    streams = ([header] if header_alone else []) + [b"".join(g) for g in groups] + [tail]
    if not header_alone:
        streams[0] = header + streams[0]
    blobs = [bz2.compress(s) for s in streams]
    offsets = [sum(len(b) for b in blobs[:k]) for k in range(len(blobs))]
    first = 1 if header_alone else 0
    lines = []
    for k, g in enumerate(groups):
        for page in g:
            pid = re.search(rb"<id>(\d+)</id>", page).group(1).decode()
            title = html.unescape(re.search(rb"<title>(.*?)</title>", page).group(1).decode())
            lines.append(f"{offsets[first + k]}:{pid}:{title}\n")
    d = tmp_path / "dump"
    d.mkdir(exist_ok=True)
    dump = d / "enwiki-20990101-pages-articles-multistream.xml.bz2"
    dump.write_bytes(b"".join(blobs))
    (d / "enwiki-20990101-pages-articles-multistream-index.txt.bz2").write_bytes(bz2.compress("".join(lines).encode()))
    return dump


@pytest.mark.parametrize("compress", [False, True])
def test_plain_dump(tmp_path, sample, compress):
    path = tmp_path / ("enwiki-pages-articles.xml" + (".bz2" if compress else ""))
    path.write_bytes(bz2.compress(sample.read_bytes()) if compress else sample.read_bytes())
    files, skipped, items = _read([tmp_path])
    assert [f.kind for f in files] == ["wiki_xml"] and not skipped
    docs = _docs(items)
    assert {name: doc_id & 0xFFFFFFFF for doc_id, name, _ in docs} == ARTICLES  # named by page id, numbered by ordinal
    assert Counter(x.reason for x in items if isinstance(x, Rejected)) == REASONS
    assert len(items) == 11  # every page counts as a record read
    archer = next(t for _, n, t in docs if n == "7697611")
    assert archer.startswith("Archer is a slab serif typeface designed in 2001 by Tobias Frere-Jones")
    assert "Hoefler & Frere-Jones designs" in archer  # entities decoded
    for gone in ("{{", "[[", "<ref", "Category:", "Structure", "Infobox", "ArcherSpec", "http"):
        assert gone not in archer


@pytest.mark.parametrize("header_alone", [True, False])
def test_multistream_whole_and_by_units_agree(tmp_path, sample, header_alone):
    dump = _multistream(tmp_path, sample, per_stream=3, header_alone=header_alone)
    files, skipped, items = _read([tmp_path / "dump"])
    assert [f.kind for f in files] == ["wiki_multistream"]  # one input: the dump; its index is no document
    assert skipped == [Skipped(str(dump).replace("multistream.xml", "multistream-index.txt"),
                               "index of a multistream dump")]
    whole = _docs(items)
    assert {n: i & 0xFFFFFFFF for i, n, _ in whole} == ARTICLES
    ranges = stream_ranges(wiki.index_name(str(dump)), dump.stat().st_size)
    assert [n for _, _, n in ranges] == [3, 3, 3, 2]
    assert all(o + n == o2 for (o, n, _), (o2, _, _) in zip(ranges, ranges[1:]))
    assert ranges[-1][0] + ranges[-1][1] == dump.stat().st_size
    for target in (1, 2 * ranges[0][1], 10**9):  # a unit per stream, two streams a unit, one unit
        units = split_units(files[0], target)
        assert sum(u.length for u in units) == dump.stat().st_size - ranges[0][0]
        by_units = [x for u in units for x in read_documents(u)]
        assert _docs(by_units) == whole
        assert Counter(x.reason for x in by_units if isinstance(x, Rejected)) == REASONS
    assert [u.first_record for u in split_units(files[0], 1)] == [0, 3, 6, 9]
    # read as a plain bz2 file (no index beside it): the same documents
    lone = tmp_path / "lone" / dump.name
    lone.parent.mkdir()
    lone.write_bytes(dump.read_bytes())
    files, _, items = _read([lone])
    assert [f.kind for f in files] == ["wiki_xml"] and _docs(items) == [(i & 0xFFFFFFFF, n, t) for i, n, t in whole]


def test_read_pages_of_one_range(tmp_path, sample):
    dump = _multistream(tmp_path, sample, per_stream=4)
    o, n, count = stream_ranges(wiki.index_name(str(dump)), dump.stat().st_size)[1]
    pages = list(read_pages(str(dump), o, n, first_page=4))
    assert [(p.ordinal, p.page_id) for p in pages] == [(4, "7697615"), (5, "7697617"), (6, "7697626"), (7, "7697627")]
    assert [(p.ns, p.redirect) for p in pages] == [(14, False), (0, True), (0, False), (4, False)]
    with pytest.raises(EOFError, match="inside a bz2 stream"):
        list(read_pages(str(dump), o, n - 10))


def test_index_without_dump_and_unknown_files_are_skipped_with_reasons(tmp_path):
    (tmp_path / "enwiki-x-pages-articles-multistream-index.txt.bz2").write_bytes(bz2.compress(b"600:1:A\n"))
    (tmp_path / "notes").write_text("plain words, no known format")
    files, skipped = expand_inputs([str(tmp_path)])
    assert not files
    assert [s.reason for s in skipped] == ["index of a multistream dump that is not there", "unknown format"]


def _page(text, ns=0, redirect=False, pid=1):
    body = html.escape(text, quote=False)
    red = '<redirect title="X" />' if redirect else ""
    return (f"  <page>\n    <title>T{pid}</title>\n    <ns>{ns}</ns>\n    <id>{pid}</id>\n    {red}\n"
            f"    <revision><id>9</id><text xml:space=\"preserve\">{body}</text></revision>\n  </page>\n")


def test_rejection_reasons(tmp_path):
    pages = [_page("A real article. It has text.", pid=1), _page("Talk.", ns=1, pid=2),
             _page("#REDIRECT [[X]]", redirect=True, pid=3), _page("{{stub}}\n[[Category:X]]", pid=4),
             _page("== Only a heading ==\n* and a list", pid=5), _page("x" * 2000, pid=6)]
    (tmp_path / "d.xml").write_text("<mediawiki>\n" + "".join(pages) + "</mediawiki>\n")
    _, _, items = _read([tmp_path / "d.xml"])
    assert [getattr(x, "reason", None) for x in items] == [None, "wiki_namespace", "wiki_redirect", "wiki_empty",
                                                            "wiki_empty", "word_too_long"]
    assert [x.record for x in items if isinstance(x, Rejected)] == [1, 2, 3, 4, 5]
    _, _, items = _read([tmp_path / "d.xml"], WikiOptions(keep_lists=True, keep_headings=True))
    assert items[4].text == "Only a heading\n\nand a list"


@pytest.mark.parametrize(
    ("wikitext", "expected"),
    [
        ("'''Bold''' and ''italic'' [[Target page|shown text]] and [[Plain]]s.", "Bold and italic shown text and Plains."),
        ("Before{{Infobox x\n| a = [[B]]\n}} after.", "Before after."),
        ("Claim.<ref name=a>{{cite web|url=http://x}}</ref> Next.<ref name=a/>", "Claim. Next."),
        ("[[File:A.jpg|thumb|A [[caption]] here]]Text [[Image:B.png]]stays.", "Text stays."),
        ("Text.\n[[Category:Things]]\n[[de:Ding]]\n[[simple:Thing]]", "Text."),
        ("See [[:Category:Things|the category]] and [[wikt:word|word]].", "See the category and word."),
        ("Intro.\n{| class=wikitable\n|-\n| cell || cell\n|}\nOutro.", "Intro.\n\nOutro."),
        ("Para one\ncontinues.\n\n== Head ==\nPara two.", "Para one\ncontinues.\n\nPara two."),
        ("List:\n* one\n* two [[x]]\n# three\n; term : def\nAfter.", "List:\n\nAfter."),
        ("A [http://example.com label] and http://bare.example.com and [http://x.org].", "A label and and."),
        ("Heat<!-- hidden --> &amp; light&nbsp;now __NOTOC__", "Heat & light now"),
        ("Born (; {{birth date|1982}}) here. <math>x^2</math>", "Born here."),
    ],
)
def test_wikitext_to_text(wikitext, expected):
    assert wikitext_to_text(wikitext) == expected


def test_wikitext_options():
    text = "Intro.\n== Early life ==\n* one\n* two\nEnd."
    assert wikitext_to_text(text) == "Intro.\n\nEnd."
    assert wikitext_to_text(text, WikiOptions(keep_headings=True)) == "Intro.\n\nEarly life\n\nEnd."
    assert wikitext_to_text(text, WikiOptions(keep_lists=True)) == "Intro.\n\none\n\ntwo\n\nEnd."


def test_page_text_reasons():
    p = wiki.Page(0, "1", "T", 0, False, "{{only a template}}")
    assert page_text(p) == (None, "wiki_empty")
    assert page_text(wiki.Page(0, "1", "T", 2, False, "Text."))[1] == "wiki_namespace"


@pytest.mark.parametrize("form", [[], ["--json"], ["--compress"], ["--json", "--compress"]])
def test_wikiextractor_output_is_read_back(tmp_path, sample, form):
    """The real WikiExtractor (3.1.0) on the sample dump: its `text/AA/wiki_00[.bz2]` is recognised by content and
    gives the same articles, named by the same page ids, as our reading of the dump."""
    pytest.importorskip("wikiextractor")
    out = tmp_path / "text"
    subprocess.run([sys.executable, "-m", "wikiextractor.WikiExtractor", str(sample), "-o", str(out), "--processes",
                    "1", "-q", *form], check=True, capture_output=True, cwd=tmp_path)
    files, skipped, items = _read([out])
    suffix = ".bz2" if "--compress" in form else ""
    assert [f.path for f in files] == [str(out / "AA" / f"wiki_00{suffix}")] and not skipped
    assert [f.kind for f in files] == ["wikiext_json" if "--json" in form else "wikiext"]
    docs = [x for x in items if isinstance(x, Document)]
    assert [d.name for d in docs] == list(ARTICLES)
    assert [d.doc_id for d in docs] == [0, 1, 2, 3]  # record numbers of the file, not page ordinals
    archer = docs[1].text
    assert archer.startswith("Archer is a slab serif typeface") and "\nStructure.\n" in archer
    assert "Hoefler & Frere-Jones" in archer and "&amp;" not in archer  # WikiExtractor escapes &: both forms undo it
