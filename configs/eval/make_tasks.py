"""Make the derived tasks of configs/eval/shared.yaml from ../shared/corpora/wiki/pydocs.jsonl.gz (the Python 3.11
documentation as WikiExtractor JSON lines). Their labels come from the documents themselves:

- same_page (sentence-pair-classification): two paragraphs; label 1 when both come from the same documentation
  page, 0 when from two different pages. Pages are split by a hash of their URL into train (70%), dev (15%) and test
  (15%), so no page of dev or test is seen in training. Balanced: each positive pair has a negative pair whose
  first paragraph is the same. Each paragraph is cut to its first 48 words.
- code_spans (token-classification, CoNLL): a paragraph's words with the reST inline markup removed; a word that
  the authors marked as code (``literal`` or a role such as :func:`len`, its link target dropped) is tagged
  B-CODE / I-CODE, any other O. The model must tell code from prose by context and form, not by markup. Pieces of
  at most 40 words; the same page split as same_page.
- pydocs_search (retrieval, BEIR's layout): a paragraph's first sentence is a query, and the rest of that paragraph
  (its first 48 words) the one relevant document, in a corpus of every such rest from the dev and test pages
  (the others are the distractors); dev and test queries come from their pages (qrels/dev.tsv, qrels/test.tsv
  over one corpus.jsonl and queries.jsonl). Its training pairs (query, positive) are made the same way from the
  train pages only, so no test page is seen in training. Markup removed as in code_spans; a paragraph counts when
  its first sentence has 6-40 words and the rest at least 12.

    python configs/eval/make_tasks.py [--shared ../shared] [--out configs/eval/tasks]

Deterministic: the same corpus gives byte-identical files (sha256 of each URL, a seeded numpy generator).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
from pathlib import Path

import numpy as np

ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`([^`]+)`|``([^`]+)``")
SIZES = {
    "same_page": {"train": 1200, "dev": 300, "test": 300},
    "code_spans": {"train": 800, "dev": 200, "test": 200},
    "pydocs_search": {"train": 1200, "dev": 150, "test": 150},
}
SENTENCE_END = re.compile(r"(?<=[a-z0-9)\]][.!?])\s+(?=[A-Z])")
"""Where a paragraph's first sentence ends: '.', '!' or '?' after a lower-case letter, digit or bracket, then a
capital (so `e.g. Foo` and `os.path.join` do not end one)."""


def split_of(url: str) -> str:
    h = int(hashlib.sha256(url.encode()).hexdigest()[:8], 16) % 100
    return "train" if h < 70 else ("dev" if h < 85 else "test")


def paragraphs(text: str, min_words: int = 12) -> list[str]:
    out = []
    for p in re.split(r"\n\s*\n", text):
        p = " ".join(p.split())
        if len(p.split()) >= min_words:
            out.append(p)
    return out


def clean(text: str) -> str:
    """reST inline markup removed, as a reader sees the text: `:func:`len`` -> `len`."""
    return " ".join(_spans(text)[0])


def _span_text(m: re.Match) -> str:
    s = m.group(1) if m.group(1) is not None else m.group(2)
    s = re.sub(r"\s*<[^>]*>$", "", s).lstrip("~!")  # `text <target>` shows text; ~ and ! change the display only
    return s


def _spans(text: str) -> tuple[list[str], list[str]]:
    """(words, tags): B-CODE/I-CODE for the words of inline code, O for the rest."""
    words, tags, pos = [], [], 0
    for m in ROLE.finditer(text):
        for w in text[pos : m.start()].split():
            words.append(w), tags.append("O")
        for i, w in enumerate(_span_text(m).split()):
            words.append(w), tags.append("B-CODE" if i == 0 else "I-CODE")
        pos = m.end()
    for w in text[pos:].split():
        words.append(w), tags.append("O")
    return words, tags


def same_page(pages: dict[str, list[list[str]]], n: int, rng: np.random.Generator) -> list[tuple[str, str, int]]:
    """`n` pairs, half from one page and half from two, from pages with at least two paragraphs."""
    urls = sorted(u for u, ps in pages.items() if len(ps) >= 2)
    rows = []
    while len(rows) < n:
        u = urls[rng.integers(len(urls))]
        i, j = rng.choice(len(pages[u]), 2, replace=False)
        a, b = pages[u][i], pages[u][j]
        v = urls[rng.integers(len(urls))]
        if v == u:
            continue
        c = pages[v][rng.integers(len(pages[v]))]
        cut = lambda p: " ".join(clean(p).split()[:48])  # noqa: E731
        rows += [(cut(a), cut(b), 1), (cut(a), cut(c), 0)]
    return rows[:n]


def code_spans(pages: dict[str, list[str]], n: int, rng: np.random.Generator) -> list[tuple[list[str], list[str]]]:
    """`n` pieces of <= 40 words with at least one code word, drawn from the pages' paragraphs."""
    pieces = []
    for u in sorted(pages):
        for p in pages[u]:
            words, tags = _spans(p)
            for k in range(0, len(words), 40):
                w, t = words[k : k + 40], tags[k : k + 40]
                # markup the pattern does not read (an unclosed ``, a nested role) leaves the piece out
                if len(w) >= 8 and any(x != "O" for x in t) and not any("`" in x for x in w):
                    if t[0] == "I-CODE":
                        t = ["B-CODE", *t[1:]]
                    pieces.append((w, t))
    idx = sorted(rng.choice(len(pieces), min(n, len(pieces)), replace=False))
    return [pieces[i] for i in idx]


def search_pairs(pages: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """(id, first sentence, rest cut to 48 words) of every paragraph that splits so; id `<page path>#<paragraph>`."""
    out = []
    for u in sorted(pages):
        for k, p in enumerate(pages[u]):
            text = clean(p)
            m = SENTENCE_END.search(text)
            if m is None:
                continue
            query, rest = text[: m.start()], text[m.end() :].split()
            if 6 <= len(query.split()) <= 40 and len(rest) >= 12:
                out.append((f"{u.split('/3.11/', 1)[-1]}#{k}", query.replace("\t", " "), " ".join(rest[:48])))
    return out


def pydocs_search(by_split: dict[str, dict[str, list[str]]], out: Path) -> None:
    """The retrieval task's files under `out` (module docstring): train.tsv, corpus.jsonl, queries.jsonl, qrels/."""
    rng = np.random.default_rng(4)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    train = search_pairs(by_split["train"])
    with open(out / "train.tsv", "w") as f:
        f.write("query\tpositive\n")
        for i in sorted(rng.choice(len(train), SIZES["pydocs_search"]["train"], replace=False)):
            f.write(f"{train[i][1]}\t{train[i][2]}\n")
    held = {split: search_pairs(by_split[split]) for split in ("dev", "test")}
    with open(out / "corpus.jsonl", "w") as f:
        for split in ("dev", "test"):
            f.writelines(json.dumps({"_id": i, "title": "", "text": d}) + "\n" for i, _, d in held[split])
    with open(out / "queries.jsonl", "w") as fq:
        for split in ("dev", "test"):
            pick = sorted(rng.choice(len(held[split]), SIZES["pydocs_search"][split], replace=False))
            with open(out / "qrels" / f"{split}.tsv", "w") as fr:
                fr.write("query-id\tcorpus-id\tscore\n")
                for j in pick:
                    i, q, _ = held[split][j]
                    fq.write(json.dumps({"_id": i, "text": q}) + "\n")
                    fr.write(f"{i}\t{i}\t1\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = Path(__file__).resolve().parent
    ap.add_argument("--shared", default=str(here.parents[1].parent / "shared"))
    ap.add_argument("--out", default=str(here / "tasks"))
    a = ap.parse_args()
    rows = [json.loads(line) for line in gzip.open(Path(a.shared, "corpora/wiki/pydocs.jsonl.gz"), "rt")]
    by_split: dict[str, dict[str, list[str]]] = {"train": {}, "dev": {}, "test": {}}
    for r in rows:
        ps = paragraphs(r["text"])
        if ps:
            by_split[split_of(r["url"])][r["url"]] = ps
    for split, seed in (("train", 1), ("dev", 2), ("test", 3)):
        rng = np.random.default_rng(seed)
        out = Path(a.out, "same_page")
        out.mkdir(parents=True, exist_ok=True)
        with open(out / f"{split}.tsv", "w") as f:
            f.write("sentence1\tsentence2\tlabel\n")
            for s1, s2, y in same_page(by_split[split], SIZES["same_page"][split], rng):
                f.write(f"{s1.replace(chr(9), ' ')}\t{s2.replace(chr(9), ' ')}\t{y}\n")
        out = Path(a.out, "code_spans")
        out.mkdir(parents=True, exist_ok=True)
        with open(out / f"{split}.conll", "w") as f:
            for words, tags in code_spans(by_split[split], SIZES["code_spans"][split], rng):
                f.writelines(f"{w}\t{t}\n" for w, t in zip(words, tags))
                f.write("\n")
        print(split, {k: len(v) for k, v in [("pages", by_split[split])]})
    pydocs_search(by_split, Path(a.out, "pydocs_search"))


if __name__ == "__main__":
    main()
