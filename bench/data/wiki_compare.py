"""Dump -> text: agreement with WikiExtractor 3.1.0 and speed against it, on the shared sample dump.

    python bench/data/wiki_compare.py [--copies 1000] [--repeats 3]
    python bench/data/wiki_compare.py --shards            # 3. only: agreement through the shards

1. Agreement: WikiExtractor (`--json`, its defaults: no lists, headings kept as "Title.", templates expanded from
   the dump's own Template: pages, of which the sample has none) and pipeline.data.wiki (default options, the BERT
   rule: no lists, no headings; and with keep_headings) on the sample's 4 articles. Each text becomes a multiset
   of WordPiece tokens (the all-MiniLM-L6-v2 vocabulary, lowercased); F1 = 2 |ours & theirs| / (|ours| + |theirs|),
   per article and over all (micro). WikiExtractor's text is HTML-escaped by default (`&amp;`): unescaped first.
2. Speed: the sample's articles replicated to `4 * copies` pages (new page ids) in one plain .xml dump;
   (a) end to end, each a fresh process reading the dump and writing/yielding text: `read_documents` on the dump
   vs `python -m wikiextractor.WikiExtractor --processes 1 --json` (a reader process, one extraction process and a
   writer; CPU time is summed over them); (b) the text conversion alone, in this process, on the same wikitext:
   `wikitext_to_text` vs WikiExtractor's `Extractor.clean_text`.
3. Agreement through the shards (`--shards`): `jobs/prepare_data.py` on the sample dump and, separately, on
   WikiExtractor's `--json` output of the same dump (read as JSON lines, as a user would give it), both with the
   all-MiniLM-L6-v2 vocab, `--data.nsp false --data.masking dynamic` (MLM only, no masks written); the multisets
   of token ids in the shards' `input_ids` without [CLS]/[SEP]/[PAD] are compared: precision (of ours against
   WikiExtractor's), recall, F1. The same bags taken from the documents' texts before examples are made show what
   the example builder itself drops (truncation), which the shards' F1 includes.
Everything is written to a temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import REPO, SHARED, minilm_vocab, run_sampled  # noqa: E402

SAMPLE = SHARED / "corpora/wikidump/enwiki-sample-pages-articles.xml"


def _vocab() -> str:
    return str(minilm_vocab())


def wikiextractor_texts(dump: Path, out: Path) -> dict[str, str]:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "wikiextractor.WikiExtractor",
            str(dump),
            "-o",
            str(out),
            "--json",
            "--processes",
            "1",
            "-q",
        ],
        check=True,
        capture_output=True,
    )
    texts = {}
    for f in sorted(out.rglob("wiki_*")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            texts[rec["id"]] = html.unescape(rec["text"])
    return texts


def our_texts(dump: Path, options) -> dict[str, str]:
    from pipeline.data.wiki import page_text, read_pages

    out = {}
    for p in read_pages(str(dump)):
        text, _ = page_text(p, options)
        if text is not None:
            out[p.page_id] = text
    return out


def f1(ours: Counter, theirs: Counter) -> tuple[float, int, int, int]:
    common = sum((ours & theirs).values())
    n_o, n_t = sum(ours.values()), sum(theirs.values())
    return (2 * common / (n_o + n_t) if n_o + n_t else 1.0), common, n_o, n_t


def agreement(tmp: Path) -> None:
    from tokenizers import BertWordPieceTokenizer

    from pipeline.data.wiki import WikiOptions

    tok = BertWordPieceTokenizer(_vocab(), lowercase=True)
    theirs = wikiextractor_texts(SAMPLE, tmp / "we_sample")
    bag = lambda t: Counter(tok.encode(t, add_special_tokens=False).tokens)  # noqa: E731
    for label, opts in [
        ("default (BERT rule: no lists, no headings)", WikiOptions()),
        ("keep_headings=True (as WikiExtractor)", WikiOptions(keep_headings=True)),
    ]:
        ours = our_texts(SAMPLE, opts)
        print(
            f"\nagreement, ours {label}: articles ours {len(ours)}, WikiExtractor {len(theirs)}, "
            f"both {len(ours.keys() & theirs.keys())}"
        )
        tot = [0, 0, 0]
        for pid in sorted(ours.keys() | theirs.keys()):
            s, common, n_o, n_t = f1(bag(ours.get(pid, "")), bag(theirs.get(pid, "")))
            tot = [tot[0] + common, tot[1] + n_o, tot[2] + n_t]
            print(f"  page {pid}: F1 {s:.4f}  (tokens ours {n_o}, WikiExtractor {n_t}, common {common})")
        print(f"  micro F1 {2 * tot[0] / (tot[1] + tot[2]):.4f}  (tokens ours {tot[1]}, WikiExtractor {tot[2]})")


def replicate(dst: Path, copies: int) -> int:
    """The sample's articles, `copies` times each with new page ids, as one dump; returns the page count."""
    raw = SAMPLE.read_text()
    head = raw[: raw.index("  <page>")]
    pages = re.findall(r"  <page>.*?</page>\n", raw, re.S)
    articles = [p for p in pages if "<ns>0</ns>" in p and "<redirect" not in p]
    with open(dst, "w") as f:
        f.write(head)
        n = 0
        for c in range(copies):
            for p in articles:
                n += 1
                f.write(re.sub(r"<id>\d+</id>", f"<id>{n}</id>", p, count=1).replace("<title>", f"<title>{c} ", 1))
        f.write("</mediawiki>\n")
    return n


OURS = """
import sys
from pipeline.data.sources import Document, expand_inputs, read_documents
files, _ = expand_inputs([sys.argv[1]])
n = sum(isinstance(d, Document) for f in files for d in read_documents(f))
print(n)
"""


def _timed(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU user+sys of the process and its children: getrusage) of one run."""
    run = run_sampled(cmd, cwd=cwd)
    if run.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({run.returncode}):\n{run.log[-2000:]}")
    return run.wall, run.child_cpu


def speed(tmp: Path, copies: int, repeats: int) -> None:
    dump = tmp / "enwiki-replicated-pages-articles.xml"
    n = replicate(dump, copies)
    print(f"\nspeed: {n} article pages, {dump.stat().st_size / 2**20:.1f} MiB of XML, best of {repeats}")
    runs = {
        "ours (read_documents, 1 process)": [sys.executable, "-c", OURS, str(dump)],
        "wikiextractor --processes 1": [
            sys.executable,
            "-m",
            "wikiextractor.WikiExtractor",
            str(dump),
            "-o",
            str(tmp / "we_out"),
            "--json",
            "--processes",
            "1",
            "-q",
        ],
    }
    best = {}
    for _ in range(repeats):
        for name, cmd in runs.items():
            shutil.rmtree(tmp / "we_out", ignore_errors=True)
            wall, cpu = _timed(cmd, REPO)
            old = best.get(name, (float("inf"), float("inf")))
            best[name] = (min(old[0], wall), min(old[1], cpu))
    for name, (wall, cpu) in best.items():
        print(f"  {name:36s} wall {wall:6.2f} s  {n / wall:7.0f} pages/s   CPU {cpu:6.2f} s  {n / cpu:7.0f} pages/s")
    (o_wall, o_cpu), (w_wall, w_cpu) = best.values()
    print(f"  ours / wikiextractor: {w_wall / o_wall:.2f}x by wall, {w_cpu / o_cpu:.2f}x by CPU")

    # the conversion alone, same wikitext, this process
    from wikiextractor.extract import Extractor

    from pipeline.data.wiki import read_pages, wikitext_to_text

    pages = [p for p in read_pages(str(SAMPLE)) if p.ns == 0 and not p.redirect]
    loops = max(1, copies // 4)
    timing = {}
    for name, fn in [
        ("ours wikitext_to_text", lambda p: wikitext_to_text(p.wikitext)),
        (
            "WikiExtractor Extractor.clean_text",
            lambda p: Extractor(p.page_id, "0", "", p.title, [p.wikitext]).clean_text(p.wikitext),
        ),
    ]:
        best_t = float("inf")
        for _ in range(repeats):
            t0 = time.process_time()
            for _ in range(loops):
                for p in pages:
                    fn(p)
            best_t = min(best_t, time.process_time() - t0)
        timing[name] = best_t
        print(f"  conversion only, {name:36s} {loops * len(pages) / best_t:7.0f} pages/s (CPU)")
    a, b = timing.values()
    print(f"  conversion only, ours / WikiExtractor: {b / a:.2f}x")


def prepare(inputs: list[Path], out: Path, vocab: str) -> list[Path]:
    """`jobs/prepare_data.py` MLM-only with dynamic masking (ids as tokenized, no [MASK]); the shard paths."""
    cmd = [
        sys.executable,
        str(REPO / "jobs/prepare_data.py"),
        *[a for i in inputs for a in ("--input", str(i))],
        "--output",
        str(out),
        "--vocab",
        vocab,
        "--data.nsp",
        "false",
        "--data.masking",
        "dynamic",
        "--data.num_shards",
        "1",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if r.returncode:
        raise SystemExit(r.stdout[-2000:] + r.stderr[-2000:])
    done = [line for line in (r.stdout + r.stderr).splitlines() if "[stage shards] done" in line]
    print(f"  {' '.join(c if ' ' not in c else repr(c) for c in cmd[1:])}\n    {done[-1] if done else ''}")
    m = json.loads((out / "manifest.json").read_text())
    return [out / s["path"] for s in m["shards"]]


def shard_bag(shards: list[Path], drop: set[int]) -> Counter:
    import pyarrow.parquet as pq

    bag: Counter = Counter()
    for s in shards:
        for row in pq.read_table(s, columns=["input_ids"]).column("input_ids").to_pylist():
            bag.update(i for i in row if i not in drop)
    return bag


def shards_agreement(tmp: Path) -> None:
    from tokenizers import BertWordPieceTokenizer

    vocab = _vocab()
    tok = BertWordPieceTokenizer(vocab, lowercase=True)
    special = {t: tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]")}
    drop = {special["[CLS]"], special["[SEP]"], special["[PAD]"]}
    we_dir = tmp / "we_json"
    theirs_text = wikiextractor_texts(SAMPLE, we_dir)
    print(
        f"\nagreement through the shards: WikiExtractor --json wrote {len(theirs_text)} articles "
        f"({', '.join(str(p.relative_to(we_dir)) for p in sorted(we_dir.rglob('wiki_*')))})"
    )
    ours = shard_bag(prepare([SAMPLE], tmp / "ours", vocab), drop)
    theirs = shard_bag(prepare([we_dir], tmp / "theirs", vocab), drop)
    # the same bags from the texts (ours: pipeline.data.wiki; theirs: the JSON's text as the pipeline reads it,
    # HTML-escaped or not), before the example builder cuts them into sequences
    from pipeline.data.wiki import WikiOptions

    text_bag = lambda texts: Counter(i for t in texts for i in tok.encode(t, add_special_tokens=False).ids)  # noqa: E731
    raw = [json.loads(line)["text"] for f in sorted(we_dir.rglob("wiki_*")) for line in f.read_text().splitlines()]
    rows = [
        ("shards' input_ids", ours, theirs),
        ("documents' texts (before examples)", text_bag(our_texts(SAMPLE, WikiOptions()).values()), text_bag(raw)),
    ]
    print(
        f"  {'bag of token ids':36s} {'ours':>6s} {'theirs':>6s} {'common':>6s} {'precision':>9s} "
        f"{'recall':>6s} {'F1':>6s}"
    )
    for label, a, b in rows:
        s, common, n_a, n_b = f1(a, b)
        print(f"  {label:36s} {n_a:6d} {n_b:6d} {common:6d} {common / n_a:9.4f} {common / n_b:6.4f} {s:6.4f}")
    print(f"  [MASK] ids in the shards: ours {ours[special['[MASK]']]}, theirs {theirs[special['[MASK]']]}")
    only = lambda a, b: ", ".join(f"{tok.id_to_token(i)} x{n}" for i, n in (a - b).most_common(12))  # noqa: E731
    print(f"  only in ours:   {only(ours, theirs)}\n  only in theirs: {only(theirs, ours)}")
    s = f1(ours, theirs)[0]
    print(f"  goal F1 >= 0.95: {'met' if s >= 0.95 else 'NOT met'} ({s:.4f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--copies", type=int, default=1000, help="copies of the sample's 4 articles in the speed dump")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shards", action="store_true", help="only the agreement through prepare_data's shards")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="wiki_compare-"))
    try:
        if args.shards:
            shards_agreement(tmp)
            return
        agreement(tmp)
        speed(tmp, args.copies, args.repeats)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
