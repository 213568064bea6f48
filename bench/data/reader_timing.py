"""Malformed input (issue 38), the time side: how long wikitext conversion and the readers' long-line checks take
on hostile input as it grows, and whether good inputs still give the same documents.

    python bench/data/reader_timing.py --markup --sizes 20,40,80      # seconds per size: linear, or rejected
    python bench/data/reader_timing.py --same-as ../old --repeats 3    # good inputs: same documents as an old checkout
    python bench/data/reader_timing.py --budget-search 300 --seed 0    # the slowest page the markup budget lets through

Times are CPU seconds of this process (a shared machine's load does not count). Markup (`--markup`): wikitext
of one hostile pattern repeated to each size goes through `wiki.page_text` (the dump reader's conversion, with its
markup budget); then `check_text` on 1,000-character words (25 x the size: the cost was in each word's length)
and a WikiExtractor file whose `<doc` line is the size in spaces without `>`. A size is not run once the previous
one took over `--cap` seconds.

Budget search (`--budget-search N`): N random pages of 20, 40 or 80 KiB, either real wikitext (the sample's
articles) with 1-30 hostile fragments inserted at random places, or a mixture of 1-4 kinds of fragments alone
(openers, closers, tags, brackets, newlines, text); the pages the markup budget admits are converted and timed.
Reported: how many were admitted, the worst CPU microseconds per character among them, and a clean page's.

Good inputs (`--same-as OLD`): the shared corpora, WikiExtractor's two forms and Parquet of the 483 wiki articles,
and a 4,000-page dump (the sample's articles replicated with new ids, as bench/wiki_compare.py makes it) plain and
as a multistream dump with its index, each read by this checkout and by OLD (a fresh process each, interleaved,
`--repeats` times): a digest of every record (doc_id, name, text or reason) must be the same; CPU seconds are
compared (the median of each). Everything is written under a temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import bz2
import html
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_readers import CORPORA, REPO, _doc_block, _parquet, _records, multistream  # noqa: E402


MARKUP = ["<!--", "<ref>", "<ref ", "[[a|", "{{a|", "<b>", "{|\n", "<p>", "[http://x ", " ", "(" + " " * 200]


def _repeat(pattern: str, kib: int) -> str:
    return (pattern * (kib * 1024 // len(pattern) + 1))[: kib * 1024]


def markup_seconds(pattern: str, kib: int) -> tuple[float, str]:
    """(seconds, outcome) of `wiki.page_text` on a page of `pattern` repeated to `kib` KiB."""
    from pipeline.data.wiki import Page, page_text

    text = _repeat(pattern, kib) + "x"
    start = time.process_time()
    _, reason = page_text(Page(0, "1", "T", 0, False, text))
    return time.process_time() - start, reason or "converted"


def long_words_seconds(kib: int) -> tuple[float, str]:
    """`check_text` on 25 x `kib` KiB of 1,000-character words (the longest a document may hold): 0.5, 1, 2 MiB
    for 20, 40, 80 (the cost was in each word's length, so it takes MiB to show)."""
    from pipeline.data.sources import check_text

    text = _repeat("a" * 1000 + " ", 25 * kib)
    start = time.process_time()
    reason = check_text(text)
    return time.process_time() - start, reason or "accepted"


def doc_tag_seconds(kib: int) -> tuple[float, str]:
    """Reading a WikiExtractor file whose second line is `<doc` and `kib` KiB of spaces without `>`."""
    from pipeline.data.sources import Rejected, expand_inputs, read_documents

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "wiki_00"
        path.write_bytes(b'<doc id="1" url="u" title="T">\nT\n\nText.\n</doc>\n<doc' + b" " * (kib * 1024) + b"\n")
        start = time.process_time()
        files, _ = expand_inputs([str(path)])
        items = [x for f in files for x in read_documents(f)]
        seconds = time.process_time() - start
    return seconds, ", ".join(x.reason for x in items if isinstance(x, Rejected)) or f"{len(items)} record(s)"


def markup_table(sizes: list[int], cap: float) -> str:
    """CPU seconds per size for each hostile pattern; a size is not run once the previous one took over `cap`."""
    rows = [(f"page_text `{p[:12]!r}`", lambda k, p=p: markup_seconds(p, k)) for p in MARKUP]
    rows += [("check_text, 1,000-char words (x 25: MiB)", long_words_seconds),
             ("`<doc` + spaces, no `>`", doc_tag_seconds)]
    lines = ["| case | " + " | ".join(f"{k} KiB" for k in sizes) + " | outcome |",
             "|---|" + "---:|" * len(sizes) + "---|"]
    for label, fn in rows:
        times: list[float | None] = []
        outcome = ""
        for k in sizes:
            if times and (times[-1] is None or times[-1] > cap):
                times.append(None)
                continue
            s, outcome = fn(k)
            times.append(s)
        cells = " | ".join("-" if s is None else f"{s:.3f}" for s in times)
        lines.append(f"| {label} | {cells} | {outcome} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- good inputs

_READ = """
import hashlib, sys, time
from pipeline.data.sources import Document, Rejected, expand_inputs, read_documents, split_units
start = time.process_time()
h, n = hashlib.sha256(), 0
files, _ = expand_inputs([sys.argv[1]])
for f in files:
    for u in split_units(f, 250_000):
        for x in read_documents(u):
            if isinstance(x, (Document, Rejected)):
                n += 1
                h.update(repr((x.doc_id, x.name, x.text) if isinstance(x, Document) else (x.record, x.reason)).encode())
print(n, h.hexdigest()[:16], round(time.process_time() - start, 3))
"""


def good_inputs(root: Path) -> list[Path]:
    """The inputs `--same-as` reads: real, undamaged, every reader."""
    recs = _records(483, 10**9)
    (root / "ext" / "AA").mkdir(parents=True)
    (root / "ext" / "AA" / "wiki_00").write_text("".join(_doc_block(r) for r in recs))
    (root / "ext_json" / "AA").mkdir(parents=True)
    (root / "ext_json" / "AA" / "wiki_00").write_text(
        "".join(json.dumps({**r, "text": html.escape(r["text"], quote=False)}) + "\n" for r in recs))
    (root / "pq").mkdir()
    (root / "pq" / "w.parquet").write_bytes(_parquet(recs))
    sys.path.insert(0, str(REPO / "bench" / "data"))
    from wiki_compare import replicate

    (root / "dump").mkdir()
    replicate(root / "dump" / "enwiki-pages-articles.xml", 1000)
    ms = root / "ms"
    ms.mkdir()
    dump, index = multistream((root / "dump" / "enwiki-pages-articles.xml").read_bytes(), per_stream=100)
    (ms / "enwiki-20990101-pages-articles-multistream.xml.bz2").write_bytes(dump)
    (ms / "enwiki-20990101-pages-articles-multistream-index.txt.bz2").write_bytes(bz2.compress(index))
    return [CORPORA / "books", CORPORA / "wiki", CORPORA / "wikidump", root / "ext", root / "ext_json", root / "pq",
            root / "dump", root / "ms"]


def same_as(old: Path, repeats: int) -> str:
    """The `--same-as` table: per input, records, whether the digests agree, CPU seconds new / old."""
    import statistics
    import subprocess

    lines = ["| input | records | same records | CPU s old | CPU s new | new / old |", "|---|---:|---|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as d:
        for path in good_inputs(Path(d)):
            runs: dict[str, list[list[str]]] = {"old": [], "new": []}
            for _ in range(repeats):
                for name, checkout in (("old", old), ("new", REPO)):
                    env = {"PYTHONPATH": str(checkout.resolve()), "PATH": "/usr/bin:/bin"}
                    out = subprocess.run([sys.executable, "-c", _READ, str(path)], capture_output=True, text=True,
                                         check=True, env=env)
                    runs[name].append(out.stdout.split())
            o, n = runs["old"][0], runs["new"][0]
            cpu = {k: statistics.median(float(r[2]) for r in v) for k, v in runs.items()}
            lines.append(f"| {path.name} | {n[0]} | {'yes' if o[:2] == n[:2] else f'NO ({o[:2]} / {n[:2]})'} | "
                         f"{cpu['old']:.2f} | {cpu['new']:.2f} | {cpu['new'] / cpu['old']:.2f} |")
    return "\n".join(lines)


_FRAGMENTS = ["<!--", "-->", "<ref>", "</ref>", "<ref ", "<ref name=a/>", "[[a|", "[[", "]]", "{{a|", "{{", "}}", "<b>",
              "</b>", "{|\n", "\n|}\n", "<p>", "<span>", "<div>", "</div>", "[http://x ", "]", " ", "\n", "x<y ", ">", "<",
              "(", ")", "'''", "==", "<nowiki>", "</nowiki>", "&amp;", "|", "=", "text "]


def budget_search(pages: int, seed: int) -> str:
    """The slowest conversion among random hostile pages the markup budget admits (see the module docstring)."""
    import random
    import re

    from pipeline.data.wikitext import over_budget, wikitext_to_text

    sample = (CORPORA / "wikidump" / "enwiki-sample-pages-articles.xml").read_text()
    clean = "\n\n".join(html.unescape(t) for t in re.findall(r"<text[^>]*>(.*?)</text>", sample, re.S)) * 8
    rng = random.Random(seed)

    def cpu_per_char(text: str) -> float:
        start = time.process_time()
        wikitext_to_text(text)
        return (time.process_time() - start) / len(text) * 1e6

    base = min(cpu_per_char(clean[: 80 * 1024]) for _ in range(3))
    admitted, worst = 0, (0.0, "")
    for _ in range(pages):
        size = rng.choice([20, 40, 80]) * 1024
        if rng.random() < 0.3:
            text = clean[:size]
            for _ in range(rng.randint(1, 30)):
                k = rng.randrange(len(text))
                text = text[:k] + rng.choice(_FRAGMENTS) + text[k:]
        else:
            kinds = rng.sample(_FRAGMENTS, rng.randint(1, 4))
            text = "".join(rng.choice(kinds) for _ in range(size // 3))[:size]
        if over_budget(text):
            continue
        admitted += 1
        worst = max(worst, (cpu_per_char(text), text[:40]))
    return (f"{admitted} of {pages} pages within the budget; the slowest {worst[0]:.2f} CPU us/char ({worst[1]!r}), "
            f"a clean page {base:.2f} us/char: {worst[0] / base:.1f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--markup", action="store_true", help="the hostile-markup timing table")
    ap.add_argument("--sizes", default="20,40,80", help="page sizes in KiB for --markup")
    ap.add_argument("--cap", type=float, default=30.0, help="--markup: no larger size after one this slow (s)")
    ap.add_argument("--same-as", type=Path, default=None, help="an old checkout: read good inputs with both")
    ap.add_argument("--repeats", type=int, default=3, help="--same-as: runs of each checkout per input")
    ap.add_argument("--budget-search", type=int, default=0, help="random hostile pages to try against the budget")
    ap.add_argument("--seed", type=int, default=0, help="--budget-search: the random pages' seed")
    args = ap.parse_args(argv)
    if args.markup:
        print(markup_table([int(k) for k in args.sizes.split(",")], args.cap))
    if args.same_as:
        print(same_as(args.same_as, args.repeats))
    if args.budget_search:
        print(budget_search(args.budget_search, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
