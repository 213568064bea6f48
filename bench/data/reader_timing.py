"""Malformed input (issue 38), the time side: how long wikitext conversion and the readers' long-line checks take
on hostile input as it grows, and whether good inputs still give the same documents.

    python bench/data/reader_timing.py --markup --sizes 20,40,80      # seconds per size: linear, or rejected
    python bench/data/reader_timing.py --same-as ../old --repeats 3    # good inputs: same documents as an old checkout
    python bench/data/reader_timing.py --budget-search 300 --seed 0    # the slowest page the markup budget lets through
    python bench/data/reader_timing.py --technical --old ../old        # long technical pages: rejected before, after
    python bench/data/reader_timing.py --calibrate                     # the markup estimate's prices, measured
    python bench/data/reader_timing.py --unclosed-record 2 --record-cap 64   # memory: an unclosed record in 2 GB

Times are CPU seconds of this process (a shared machine's load does not count). Markup (`--markup`): wikitext
of one hostile pattern repeated to each size goes through `wiki.page_text` (the dump reader's conversion, with its
markup budget); then `check_text` on 1,000-character words (25 x the size: the cost was in each word's length)
and a WikiExtractor file whose `<doc` line is the size in spaces without `>`. A size is not run once the previous
one took over `--cap` seconds.

Budget search (`--budget-search N`): N random pages of 20, 40 or 80 KiB, either real wikitext (the sample's
articles) with 1-30 hostile fragments inserted at random places, or a mixture of 1-4 kinds of fragments alone
(openers, closers, tags, brackets, newlines, text); the pages the markup budget admits are converted and timed.
Reported: how many were admitted, the worst CPU microseconds per character among them, and a clean page's; of the
rejected pages, those estimated under 3x the budget are converted too, and the fastest of them is reported (a
rejected page that converts in up to 10 us a character is one the estimate got wrong); and of the admitted pages
over 10 us a character, how many the budget rejects at twice their length (the page written twice: a quadratic
page's estimate per character doubles with it, so an underestimated one is admitted at one size only).

Technical pages (`--technical`): a MediaWiki dump of long real technical pages, their text written as the wikitext of
a page as it is (XML-escaped, as a dump holds it): every manual page of section 1 on this machine (`man -l -P cat`,
80 columns, C.UTF-8; the 16,631 generated `gcloud` pages left out) and the Python docs' 483 articles
(../shared/corpora/wiki). Each page goes through `wiki.page_text` in a fresh process of this checkout (and of `--old`
with it): the pages rejected, by reason and name, and every admitted page's conversion timed (CPU, best of 2): the
slowest one's microseconds per character, with its estimate (`markup_cost`). `--man-pages N`: the first N only.

Calibration (`--calibrate`): `pipeline.data.wikitext`'s `_PRICES` are the C tokenizer's costs of a failing route per
byte it reads again, per route and per mark it meets (tags, entities, links, list lines, table rows, `|`, `:`, ...).
Pages of 8 and 16 KiB, each one kind of opener never closed followed by text holding one kind of mark at three
densities, and the same pages with no opener, are tokenized (CPU, best of 2); a bounded least squares over their
times (relative error) gives each price, printed beside the code's. Then the estimate against the measured time of
the `--markup` patterns at 8-20 KiB, where the failing routes are nearly all of the time.

Unclosed records (`--unclosed-record GB`): a dump whose first `<page>` never closes, a WikiExtractor file whose first
`<doc>` never closes and a JSON lines file whose first line runs on, each GB gigabytes, then three good records;
each read by `read_documents` with `--record-cap` MiB in a child process sampled by bench/measure.py: its peak RSS
(the larger of the sampled one and its own VmHWM, which no sampling interval misses: unlike ru_maxrss, it
starts at the exec, not at the fork from a larger parent), its RSS after the imports,
what it read.

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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: measure.py
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
    """CPU seconds and outcome per size for each hostile pattern; a size is not run once the previous one took
    over `cap`."""
    rows = [(f"page_text `{p[:12]!r}`", lambda k, p=p: markup_seconds(p, k)) for p in MARKUP]
    rows += [
        ("check_text, 1,000-char words (x 25: MiB)", long_words_seconds),
        ("`<doc` + spaces, no `>`", doc_tag_seconds),
    ]
    lines = ["| case | " + " | ".join(f"{k} KiB" for k in sizes) + " |", "|---|" + "---:|" * len(sizes)]
    for label, fn in rows:
        cells: list[str] = []
        last = 0.0
        for k in sizes:
            if last > cap or (cells and cells[-1] == "-"):
                cells.append("-")
                continue
            last, outcome = fn(k)
            cells.append(f"{last:.3f} {outcome}")
        lines.append(f"| {label} | {' | '.join(cells)} |")
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
        "".join(json.dumps({**r, "text": html.escape(r["text"], quote=False)}) + "\n" for r in recs)
    )
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
    return [
        CORPORA / "books",
        CORPORA / "wiki",
        CORPORA / "wikidump",
        root / "ext",
        root / "ext_json",
        root / "pq",
        root / "dump",
        root / "ms",
    ]


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
                    out = subprocess.run(
                        [sys.executable, "-c", _READ, str(path)],
                        capture_output=True,
                        text=True,
                        check=True,
                        env=env,
                        cwd=d,
                    )  # not the repository: `-c` puts cwd first
                    runs[name].append(out.stdout.split())
            o, n = runs["old"][0], runs["new"][0]
            cpu = {k: statistics.median(float(r[2]) for r in v) for k, v in runs.items()}
            lines.append(
                f"| {path.name} | {n[0]} | {'yes' if o[:2] == n[:2] else f'NO ({o[:2]} / {n[:2]})'} | "
                f"{cpu['old']:.2f} | {cpu['new']:.2f} | {cpu['new'] / cpu['old']:.2f} |"
            )
    return "\n".join(lines)


_FRAGMENTS = [
    "<!--",
    "-->",
    "<ref>",
    "</ref>",
    "<ref ",
    "<ref name=a/>",
    "[[a|",
    "[[",
    "]]",
    "{{a|",
    "{{",
    "}}",
    "<b>",
    "</b>",
    "{|\n",
    "\n|}\n",
    "<p>",
    "<span>",
    "<div>",
    "</div>",
    "[http://x ",
    "]",
    " ",
    "\n",
    "x<y ",
    ">",
    "<",
    "(",
    ")",
    "'''",
    "==",
    "<nowiki>",
    "</nowiki>",
    "&amp;",
    "|",
    "=",
    "text ",
]


def budget_search(pages: int, seed: int) -> str:
    """The slowest conversion among random hostile pages the markup budget admits (see the module docstring)."""
    import random
    import re

    from pipeline.data.wikitext import MARKUP_BUDGET, MARKUP_SLACK, markup_cost, over_budget, wikitext_to_text

    sample = (CORPORA / "wikidump" / "enwiki-sample-pages-articles.xml").read_text()
    clean = "\n\n".join(html.unescape(t) for t in re.findall(r"<text[^>]*>(.*?)</text>", sample, re.S)) * 8
    rng = random.Random(seed)

    def cpu_per_char(text: str) -> float:
        start = time.process_time()
        wikitext_to_text(text)
        return (time.process_time() - start) / len(text) * 1e6

    base = min(cpu_per_char(clean[: 80 * 1024]) for _ in range(3))
    admitted, worst, fastest_rejected = 0, (0.0, ""), (float("inf"), "")
    admitted_over, rejected_timed, rejected_under = 0, 0, 0  # admitted over 10 us/char; rejected, timed, under 10
    doubled_rejected = 0  # of the admitted over 10 us/char: rejected at twice their length (the page twice)
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
        estimate = markup_cost(text) / len(text)
        if estimate > MARKUP_BUDGET + MARKUP_SLACK / len(text):  # over_budget, with the estimate kept
            if estimate < 3 * MARKUP_BUDGET:
                us = cpu_per_char(text)
                fastest_rejected = min(fastest_rejected, (us, text[:40]))
                rejected_timed, rejected_under = rejected_timed + 1, rejected_under + (us <= 10)
            continue
        us = cpu_per_char(text)
        admitted, admitted_over = admitted + 1, admitted_over + (us > 10)
        doubled_rejected += us > 10 and over_budget(text + text)  # estimated only: the rng is not drawn from
        worst = max(worst, (us, text[:40]))
    return (
        f"{admitted} of {pages} pages within the budget ({admitted_over} over 10 us/char); the slowest "
        f"{worst[0]:.2f} CPU us/char ({worst[1]!r}), "
        f"a clean page {base:.2f} us/char: {worst[0] / base:.1f}x; the fastest rejected page (of those estimated "
        f"under 3x the budget) {fastest_rejected[0]:.2f} us/char ({fastest_rejected[1]!r}); converting in up to "
        f"10 us/char: {rejected_under} of the {rejected_timed} rejected pages timed; of the {admitted_over} admitted "
        f"over 10 us/char, {doubled_rejected} rejected at twice their length (the page twice)"
    )


# ---------------------------------------------------------------------------------------------- technical pages


def man_pages(limit: int | None = None) -> list[tuple[str, str]]:
    """(name, text) of section 1's manual pages on this machine, rendered as a reader sees them (`man -l -P cat`,
    80 columns, C.UTF-8), in name order; the generated `gcloud` pages left out. None when `man` is not there."""
    import os
    import shutil
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    root = Path("/usr/share/man/man1")
    if not shutil.which("man") or not root.is_dir():
        return []
    files = sorted(p for p in root.iterdir() if not p.name.startswith("gcloud") and p.is_file())[:limit]
    env = {**os.environ, "MANWIDTH": "80", "LC_ALL": "C.UTF-8", "MAN_KEEP_FORMATTING": ""}

    def render(p: Path) -> tuple[str, str]:
        out = subprocess.run(["man", "-l", "-P", "cat", str(p)], capture_output=True, env=env)
        return p.name.split(".")[0], out.stdout.decode("utf-8", "replace")

    with ThreadPoolExecutor(2) as pool:
        return [(n, t) for n, t in pool.map(render, files) if t.strip()]


def technical_dump(path: Path, man_limit: int | None) -> tuple[int, int]:
    """The `--technical` dump at `path`: (manual pages, Python docs articles) written."""
    import gzip

    with gzip.open(CORPORA / "wiki" / "pydocs.jsonl.gz", "rt") as f:
        docs = [(r["title"], r["text"]) for r in map(json.loads, f)]
    man = man_pages(man_limit)
    with open(path, "w", encoding="utf-8") as f:
        f.write('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">\n')
        for i, (title, text) in enumerate(man + docs, 1):
            f.write(
                f"<page><title>{html.escape(title)}</title><ns>0</ns><id>{i}</id><revision>"
                f"<text>{html.escape(text, quote=False)}</text></revision></page>\n"
            )
        f.write("</mediawiki>\n")
    return len(man), len(docs)


_TECHNICAL = """
import json, sys, time
from pipeline.data import wiki
from pipeline.data.wikitext import markup_cost, wikitext_to_text
rejected, admitted, worst = {}, 0, (0.0, "", 0, 0.0)
for page in wiki.read_pages(sys.argv[1]):
    text, reason = wiki.page_text(page)
    if reason:
        rejected.setdefault(reason, []).append(page.title)
        continue
    admitted += 1
    best = float("inf")
    for _ in range(2):
        start = time.process_time()
        wikitext_to_text(page.wikitext)
        best = min(best, time.process_time() - start)
    n = len(page.wikitext)
    worst = max(worst, (best / n * 1e6, page.title, n, markup_cost(page.wikitext) / n / 1000))
print(json.dumps({"rejected": rejected, "admitted": admitted, "worst": worst}))
"""


def technical(man_limit: int | None, old: Path | None) -> str:
    """The `--technical` report: pages rejected (by reason) by this checkout and by `old`, and the slowest page
    each admits."""
    import subprocess

    lines = []
    with tempfile.TemporaryDirectory() as d:
        dump = Path(d) / "techwiki-pages-articles.xml"
        n_man, n_docs = technical_dump(dump, man_limit)
        lines.append(f"{n_man} manual pages and {n_docs} Python docs articles, {dump.stat().st_size / 1e6:.1f} MB")
        for name, checkout in (("before (--old)", old), ("this checkout", REPO)):
            if checkout is None:
                continue
            env = {"PYTHONPATH": str(Path(checkout).resolve()), "PATH": "/usr/bin:/bin"}
            out = json.loads(
                subprocess.run(
                    [sys.executable, "-c", _TECHNICAL, str(dump)],
                    capture_output=True,
                    text=True,
                    check=True,
                    env=env,
                    cwd=d,
                ).stdout
            )  # cwd: as in same_as
            rejected = {k: len(v) for k, v in out["rejected"].items() if k != "markup_budget"}
            us, title, n, est = out["worst"]
            budget = out["rejected"].get("markup_budget", [])
            lines.append(
                f"{name}: markup_budget {len(budget)} of {n_man + n_docs} ({', '.join(budget[:12])}"
                f"{', ...' if len(budget) > 12 else ''}); other rejections {rejected}; "
                f"{out['admitted']} converted, the slowest {us:.2f} CPU us/char ({title}, {n:,} chars, "
                f"estimated {est:.2f})"
            )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- calibration

_OPENERS = {
    "comment": "<!--",
    "opaque": "<nowiki>",
    "attrs": "<ref ",
    "body": "<b>",
    "template": "{{a|",
    "wikilink": "[[a|",
    "table": "\n{|\n",
    "extlink": "[http://x ",
}
_SNIPPETS = {
    "plain": "xxxxxxx ",
    "word": "x x x x ",
    "pipe": "x|x|x|x|",
    "equals": "x=x=x=x=",
    "colon": "a:b:c:d:",
    "entity": "&amp; &#123; ",
    "tag": "<i>x</i> ",
    "endtag": "x</i> ",
    "link": "[[x]] {{x}} ",
    "line": "\n* x\n== x ==\n",
    "row": "\n|x\n!x\n|-\n",
}


def _features(text: str) -> dict[str, int]:
    """What the estimate counts on a page, per route kind (bytes, routes, marks) and for the page's first reading."""
    import numpy as np

    from pipeline.data import wikitext as W

    raw = text.encode("utf-8", "surrogatepass")
    routes = W._routes(raw)
    openers = np.sort(np.concatenate([s for s, _ in routes.values()])) if routes else np.zeros(0, np.int64)
    f = {"page|byte": len(raw)}
    for mark in ("word", "pipe", "equals", "colon", "entity", "tag", "endtag", "link", "line", "row"):
        at = W._marks(raw, mark, openers)
        f[f"page|{mark}"] = len(at)
        for kind, (starts, ends) in routes.items():
            f[f"{kind}|{mark}"] = int((np.searchsorted(at, ends) - np.searchsorted(at, starts)).sum())
    for kind, (starts, ends) in routes.items():
        f[f"{kind}|byte"], f[f"{kind}|route"] = int((ends - starts).sum()), len(starts)
    return f


def calibrate() -> str:
    """The `--calibrate` report: each route kind's fitted prices beside `_PRICES`, and the estimate against the
    measured time of the hostile patterns."""
    import numpy as np
    from scipy.optimize import lsq_linear

    from pipeline.data import wikitext as W

    def cpu(text: str) -> float:
        best = float("inf")
        for _ in range(2):
            start = time.process_time()
            W._tokenize(text)
            best = min(best, time.process_time() - start)
        return best * 1e9

    pages = []
    for n in (8192, 16384):
        for kind, opener in _OPENERS.items():
            for snippet in _SNIPPETS.values():
                for reps, pad in ((1, 8), (4, 0), (2, 40)):
                    unit = opener + ("x" * pad + " " + snippet) * reps
                    text = (unit * (n // len(unit) + 1))[:n]
                    pages.append(text)
                    if kind == "comment":  # the same text with no opener: the first reading's prices
                        pages.append(text.replace(opener, "x" * len(opener)))
    rows = [(_features(t), cpu(t)) for t in pages]
    keys = sorted({k for f, _ in rows for k in f})
    x = np.array([[f.get(k, 0) for k in keys] for f, _ in rows], float)
    y = np.array([t for _, t in rows])
    w = 1 / np.maximum(y, 1e6)
    fit = dict(zip(keys, lsq_linear(x * w[:, None], y * w, bounds=(0, np.inf)).x))
    ratio = (x @ np.array([fit[k] for k in keys])) / y
    lines = [
        f"{len(rows)} pages, fitted time / measured: median {np.median(ratio):.2f}, 10-90% "
        f"{np.percentile(ratio, 10):.2f}-{np.percentile(ratio, 90):.2f}",
        "",
        "| kind | | byte | route | "
        + " | ".join(m for m in ("word", "pipe", "equals", "colon", "entity", "tag", "endtag", "link", "line", "row"))
        + " |",
        "|---|---|" + "---:|" * 12,
    ]
    for kind in _OPENERS:
        price = W._PRICES[kind]
        code = {"byte": price.byte, "route": price.route, **dict(price.each)}
        for name, values in (
            ("fitted", {k.split("|")[1]: v for k, v in fit.items() if k.startswith(kind + "|")}),
            ("code", code),
        ):
            cells = [
                f"{values.get(m, 0):.0f}"
                for m in (
                    "byte",
                    "route",
                    "word",
                    "pipe",
                    "equals",
                    "colon",
                    "entity",
                    "tag",
                    "endtag",
                    "link",
                    "line",
                    "row",
                )
            ]
            lines.append(f"| {kind} | {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| pattern | " + " | ".join(f"{k} KiB: estimate / measured us/char" for k in (8, 12, 16, 20)) + " |",
        "|---|" + "---:|" * 4,
    ]
    for pattern in MARKUP[:-2] + ["<nowiki>", "x<y "]:
        cells = []
        for kib in (8, 12, 16, 20):
            text = _repeat(pattern, kib)
            estimate = W.markup_cost(text) / len(text) / 1000
            if estimate > 60:  # several seconds: the estimate alone
                cells.append(f"{estimate:.1f} / -")
                continue
            start = time.process_time()
            W.wikitext_to_text(text)
            cells.append(f"{estimate:.1f} / {(time.process_time() - start) / len(text) * 1e6:.1f}")
        lines.append(f"| `{pattern!r}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- unclosed records


def _unclosed_file(path: Path, form: str, gb: float) -> None:
    """A file of `form` (dump, wikiext, jsonl) whose first record runs `gb` GB without closing, then 3 good ones."""
    line = {
        "dump": b"Words of an unclosed page, line after line.\n",
        "wikiext": b"Words of an unclosed block.\n",
        "jsonl": b"Words of a line that does not end. ",
    }[form]
    block = line * (2**20 // len(line))
    with open(path, "wb") as f:
        f.write(
            {
                "dump": b"<mediawiki>\n<page><title>Big</title><ns>0</ns><id>1</id><revision><text>",
                "wikiext": b'<doc id="1" url="u" title="Big">\n',
                "jsonl": b'{"text": "',
            }[form]
        )
        for _ in range(int(gb * 1e9 / len(block))):
            f.write(block)
        for i in (2, 3, 4):
            f.write(
                {
                    "dump": f"<page><title>P{i}</title><ns>0</ns><id>{i}</id><revision><text>Text {i}.</text>"
                    "</revision></page>\n",
                    "wikiext": f'<doc id="{i}" url="u" title="T{i}">\nT{i}\n\nText {i}.\n</doc>\n',
                    "jsonl": ("\n" if i == 2 else "") + json.dumps({"text": f"Text {i}."}) + "\n",
                }[form].encode()
            )


_READ_CAPPED = """
import json, psutil, sys, time
from pipeline.data.sources import Document, Rejected, expand_inputs, read_documents
base = psutil.Process().memory_info().rss
start = time.process_time()
files, _ = expand_inputs([sys.argv[1]])
items = [x for f in files for x in read_documents(f, max_record_bytes=int(sys.argv[2]))]
print(json.dumps({"base": base, "cpu": time.process_time() - start, "hwm": 1024 * int(
    next(x for x in open("/proc/self/status") if x.startswith("VmHWM:")).split()[1]),
                  "texts": [x.text for x in items if isinstance(x, Document)],
                  "reasons": [x.reason for x in items if isinstance(x, Rejected)]}))
"""


def unclosed_records(gb: float, cap_mib: int) -> str:
    """The `--unclosed-record` table: per form, the reading child's peak RSS against its RSS after the imports."""
    from measure import run_sampled

    lines = [
        "| file | size | cap | peak RSS | RSS after imports | peak - imports | read | CPU s |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    names = {"dump": "enwiki-pages-articles.xml", "wikiext": "wiki_00", "jsonl": "w.jsonl"}
    with tempfile.TemporaryDirectory() as d:
        for form, name in names.items():
            path = Path(d) / name
            _unclosed_file(path, form, gb)
            run = run_sampled(
                [sys.executable, "-c", _READ_CAPPED, str(path), str(cap_mib * 2**20)],
                env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                cwd=d,
            )
            out = json.loads(run.log.strip().splitlines()[-1])
            peak, base = max(run.sampler.peak_one, out["hwm"]) / 2**20, out["base"] / 2**20  # VmHWM: exact
            lines.append(
                f"| {name} (unclosed first record) | {path.stat().st_size / 1e9:.2f} GB | {cap_mib} MiB | "
                f"{peak:.0f} MiB | {base:.0f} MiB | {peak - base:.0f} MiB | {out['reasons']} + "
                f"{len(out['texts'])} documents | {out['cpu']:.1f} |"
            )
            path.unlink()
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--markup", action="store_true", help="the hostile-markup timing table")
    ap.add_argument("--sizes", default="20,40,80", help="page sizes in KiB for --markup")
    ap.add_argument("--cap", type=float, default=30.0, help="--markup: no larger size after one this slow (s)")
    ap.add_argument("--same-as", type=Path, default=None, help="an old checkout: read good inputs with both")
    ap.add_argument("--repeats", type=int, default=3, help="--same-as: runs of each checkout per input")
    ap.add_argument("--budget-search", type=int, default=0, help="random hostile pages to try against the budget")
    ap.add_argument("--seed", type=int, default=0, help="--budget-search: the random pages' seed")
    ap.add_argument("--technical", action="store_true", help="a dump of long real technical pages: rejected, slowest")
    ap.add_argument("--man-pages", type=int, default=None, help="--technical: the first N manual pages only")
    ap.add_argument("--old", type=Path, default=None, help="--technical: an old checkout to read the dump with too")
    ap.add_argument("--calibrate", action="store_true", help="the markup estimate's prices against the tokenizer")
    ap.add_argument("--unclosed-record", type=float, default=0, help="GB of an unclosed first record, per form")
    ap.add_argument("--record-cap", type=int, default=64, help="--unclosed-record: data.max_record_bytes in MiB")
    args = ap.parse_args(argv)
    if args.markup:
        print(markup_table([int(k) for k in args.sizes.split(",")], args.cap))
    if args.same_as:
        print(same_as(args.same_as, args.repeats))
    if args.budget_search:
        print(budget_search(args.budget_search, args.seed))
    if args.technical:
        print(technical(args.man_pages, args.old))
    if args.calibrate:
        print(calibrate())
    if args.unclosed_record:
        print(unclosed_records(args.unclosed_record, args.record_cap))
    return 0


if __name__ == "__main__":
    sys.exit(main())
