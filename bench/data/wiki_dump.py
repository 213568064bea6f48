"""A synthetic multistream Wikipedia dump of any size: the shared sample's pages copied, each copy distinct.

    python bench/data/wiki_dump.py DIR                 # --copies 12000: 132,000 pages, 225 MB of XML, 23 MB of bz2
    python bench/data/wiki_dump.py DIR --copies 2 --parts 2   # two parts named as Wikimedia names the real dump's

The shared sample's 11 pages (4 articles, 7 other namespaces and redirects, about the mix of the real dump) are
written `copies` times, each copy with new page ids and titles and a quarter of the plain-text words of its
articles replaced by words drawn from the shared books (seeded per copy; markup, links, templates and tags
untouched), so that the copies are distinct documents for the default `data.dedup near` (two copies share about
0.75^5 of their word 5-grams; the shortest articles, 5 and 15 words, do repeat now and then and are dropped as
duplicates, the same in every run). Streams of 100 pages each, compressed on their own, with the index beside the
dump (`offset:page_id:title`), as Wikimedia writes them. The input of bench/studies/wiki_scale.py,
wiki_two_hosts.py, one_read.py and dedup_shuffle.py, and of tests/test_wiki.py and tests/test_prepare.py.
"""

from __future__ import annotations

import argparse
import bz2
import random
import re
import sys
import time
from pathlib import Path
from xml.sax.saxutils import escape

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import REPO, SHARED  # noqa: E402

SAMPLE = SHARED / "corpora/wikidump/enwiki-sample-pages-articles.xml"
DUMP = "enwiki-29990101-pages-articles-multistream.xml.bz2"
INDEX = "enwiki-29990101-pages-articles-multistream-index.txt.bz2"
PAGES_PER_STREAM = 100
MARKUP = re.compile(r"(\{\{.*?\}\}|\[\[.*?\]\]|\[.*?\]|<[^>]*>|&\w+;|https?://\S+)", re.S)
WORD = re.compile(r"[A-Za-z]{3,}")


def _pages() -> list:
    sys.path.insert(0, str(REPO))
    from pipeline.data.wiki import read_pages

    return list(read_pages(str(SAMPLE)))


def _word_pool() -> list[str]:
    words = set()
    for p in sorted((SHARED / "corpora/books").glob("*.txt"))[:20]:
        words.update(w.lower() for w in WORD.findall(p.read_text(encoding="utf-8")))
    return sorted(words)


def part_names(part: int, first: int, last: int) -> tuple[str, str]:
    """(dump, index) file names of part `part` of a dump split as Wikimedia splits the real one, pages first..last."""
    return (
        f"enwiki-29990101-pages-articles-multistream{part}.xml-p{first}p{last}.bz2",
        f"enwiki-29990101-pages-articles-multistream-index{part}.txt-p{first}p{last}.bz2",
    )


def build_dump(d: Path, copies: int, seed: int = 0, start: int = 0, part: int | None = None) -> dict:
    """The dump and its index in `d`; returns its figures (pages, articles, XML bytes, bz2 bytes, seconds). With
    `part`, one part of a dump split in several files (`part_names`) holding copies start..start+copies-1: page
    ids, titles and perturbations continue where the previous part's ended."""
    t0 = time.perf_counter()
    pages, pool = _pages(), _word_pool()
    # each article's wikitext as pieces: plain-text words (perturbable) at known positions, the rest as is
    split = {}
    for p in pages:
        pieces: list[str] = []
        for k, text_or_markup in enumerate(MARKUP.split(p.wikitext)):
            if k % 2:
                pieces.append(text_or_markup)
            else:
                pos = 0
                for m in WORD.finditer(text_or_markup):
                    pieces += [text_or_markup[pos : m.start()], m.group()]
                    pos = m.end()
                pieces.append(text_or_markup[pos:])
        words = [i for i, x in enumerate(pieces) if WORD.fullmatch(x) and not MARKUP.fullmatch(x)]
        split[p.page_id] = (pieces, words)
    head = SAMPLE.read_bytes()
    head, tail = head[: head.index(b"  <page>")], b"</mediawiki>\n"
    index = bz2.BZ2Compressor()
    xml_bytes = len(head) + len(tail)
    n = start * len(pages)
    articles = 0
    dump, idx = (DUMP, INDEX) if part is None else part_names(part, n + 1, n + copies * len(pages))
    with open(d / dump, "wb") as f, open(d / idx, "wb") as fi:
        f.write(bz2.compress(head))
        batch: list[str] = []

        def flush() -> None:
            nonlocal xml_bytes
            off = f.tell()
            data = "".join(x for _, _, x in batch).encode()
            xml_bytes += len(data)
            f.write(bz2.compress(data))
            fi.write(index.compress("".join(f"{off}:{pid}:{t}\n" for pid, t, _ in batch).encode()))
            batch.clear()

        for c in range(start, start + copies):
            rng = random.Random(seed * 10**9 + c)
            for p in pages:
                n += 1
                text = p.wikitext
                if p.ns == 0 and not p.redirect:
                    articles += 1
                    pieces, words = split[p.page_id]
                    pieces = list(pieces)
                    for i in words:
                        if rng.random() < 0.25:
                            pieces[i] = rng.choice(pool)
                    text = "".join(pieces)
                title = p.title if c == 0 else f"{p.title} ({c})"
                redirect = f'    <redirect title="{escape(title)}" />\n' if p.redirect else ""
                batch.append(
                    (
                        str(n),
                        title,
                        f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{p.ns}</ns>\n    <id>{n}</id>\n"
                        f'{redirect}    <revision>\n      <id>{n}</id>\n      <text bytes="{len(text)}" '
                        f'xml:space="preserve">{escape(text)}</text>\n    </revision>\n  </page>\n',
                    )
                )
                if len(batch) == PAGES_PER_STREAM:
                    flush()
        if batch:
            flush()
        f.write(bz2.compress(tail))
        fi.write(index.flush())
    return {
        "pages": n - start * len(pages),
        "articles": articles,
        "xml": xml_bytes,
        "bz2": (d / dump).stat().st_size,
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path, help="where the dump and its index are written")
    ap.add_argument("--copies", type=int, default=12000, help="copies of the sample's 11 pages (in all)")
    ap.add_argument("--parts", type=int, default=1, help="files the dump is split into (part_names)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    a.dir.mkdir(parents=True, exist_ok=True)
    each = -(-a.copies // a.parts)
    for k in range(a.parts):
        start = k * each
        n = min(each, a.copies - start)
        b = build_dump(a.dir, n, a.seed, start, None if a.parts == 1 else k + 1)
        print(
            f"{'dump' if a.parts == 1 else f'part {k + 1}'}: {b['pages']:,} pages ({b['articles']:,} articles), "
            f"{b['xml'] / 1e6:.1f} MB of XML, {b['bz2'] / 1e6:.1f} MB of bz2 in streams of {PAGES_PER_STREAM} "
            f"pages; {b['seconds']:.1f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
