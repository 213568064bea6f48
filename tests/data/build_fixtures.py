"""Build the small real-text fixtures for the fine-tuning tests from ../shared/corpora/books (KJV Bible).

Run from the repo root: `python tests/data/build_fixtures.py` (deterministic; the outputs are committed).

- bible_ner_{train,dev}.conll: CoNLL `token tag` lines, IOB2 tags from a gazetteer: PER (people), LOC (places,
  lands, tribes), DEITY ("LORD", and "LORD God" / "LORD of hosts" as multi-token entities). Sentences are the
  text split at . ; : ? ! and kept when 4-40 words. Train: Ruth, Esther, 1 Samuel 1-10; dev: Jonah, 1 Samuel 11-16.
- bible_squad_{train,dev}.json: SQuAD v2.0-style. Contexts are runs of 5 consecutive sentences (long enough to
  need two 128-token windows); each answerable question is one of the context's sentences with a person's name
  replaced by "who" (a cloze question) and the name as the answer span; each unanswerable question
  (`is_impossible`) is such a question taken from a different chapter, paired with this context.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
BOOKS = HERE.parents[2] / "shared" / "corpora" / "books"

PER = set(
    "Naomi Ruth Boaz Elimelech Mahlon Chilion Orpah Obed Jesse David Jonah Amittai Esther Mordecai Haman Ahasuerus "
    "Vashti Hegai Hatach Zeresh Harbonah Hannah Elkanah Peninnah Samuel Eli Saul Hophni Phinehas Kish Abiel Jonathan "
    "Nahash Agag Eliab Abinadab Shammah Ichabod Joel Abiah Benjamin Abner Zeror Bechorath Aphiah Ahitub Ahiah Pharez "
    "Hezron Ram Amminadab Nahshon Salmon Bigthan Teresh Memucan Abihail".split()
)
LOC = set(
    "Moab Bethlehemjudah Bethlehem Judah Israel Nineveh Tarshish Joppa Shushan India Ethiopia Persia Media Ramah "
    "Ramathaimzophim Shiloh Ephraim Jerusalem Gilgal Mizpeh Ebenezer Ashdod Gath Ekron Bethshemesh Kirjathjearim "
    "Egypt Philistia Jabeshgilead Bezek Zuph Gibeah Bethel Tabor Michmash Amalek Shen Ziph Gilead Ammon".split()
)
WORD = re.compile(r"\w+|[^\w\s]")


def sentences(book: str, chapters: range | None = None) -> list[str]:
    text = (BOOKS / book).read_text(encoding="utf-8")
    chaps = [c.strip() for c in text.split("\n\n") if c.strip()]
    if chapters is not None:
        chaps = [chaps[i] for i in chapters if i < len(chaps)]
    out = []
    for c in chaps:
        for s in re.split(r"(?<=[.;:?!])\s+", " ".join(c.split())):
            if 4 <= len(s.split()) <= 40:
                out.append(s)
    return out


def tag(words: list[str]) -> list[str]:
    tags = []
    for i, w in enumerate(words):
        prev = tags[-1] if tags else "O"
        if w == "LORD":
            tags.append("B-DEITY")
        elif w == "God" and i and words[i - 1] == "LORD":
            tags.append("I-DEITY")
        elif (
            w in ("of", "hosts")
            and prev.endswith("DEITY")
            and (
                (w == "of" and i + 1 < len(words) and words[i + 1] == "hosts")
                or (w == "hosts" and words[i - 1] == "of")
            )
        ):
            tags.append("I-DEITY")
        elif w in PER:
            tags.append("B-PER")
        elif w in LOC:
            tags.append("B-LOC")
        else:
            tags.append("O")
    return tags


def write_conll(path: Path, sents: list[str]) -> None:
    lines = ["-DOCSTART- -X- O", ""]
    for s in sents:
        words = WORD.findall(s)
        lines += [f"{w} {t}" for w, t in zip(words, tag(words))] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")


def chapters_of(book: str, chapters: range) -> list[list[str]]:
    return [sentences(book, range(i, i + 1)) for i in chapters]


def squad(chaps: list[tuple[str, list[str]]], rng: random.Random, prefix: str) -> dict:
    data = []
    pool: list[tuple[str, str, str]] = []  # (chapter key, question, answer)
    paras = []
    for key, sents in chaps:
        for k in range(0, len(sents) - 4, 5):
            ctx = " ".join(sents[k : k + 5])
            qas = []
            for s in sents[k : k + 5]:
                names = [(m.start(), m.group()) for m in re.finditer(r"\b[A-Z][a-z]+\b", s) if m.group() in PER]
                if not names:
                    continue
                pos, name = rng.choice(names)
                q = (s[:pos] + "who" + s[pos + len(name) :]).rstrip(".;:,!") + "?"
                start = ctx.index(s) + pos
                assert ctx[start : start + len(name)] == name
                qas.append(
                    {
                        "id": f"{prefix}-{len(pool)}",
                        "question": q,
                        "answers": [{"text": name, "answer_start": start}],
                        "is_impossible": False,
                    }
                )
                pool.append((key, q, name))
            if qas:
                paras.append((key, ctx, qas))
    n = 0
    for key, ctx, qas in paras:
        others = [p for p in pool if p[0] != key]
        for _ in range(max(1, len(qas) // 2)):
            _, q, _ = rng.choice(others)
            qas.append({"id": f"{prefix}-u{n}", "question": q, "answers": [], "is_impossible": True})
            n += 1
        data.append({"title": key, "paragraphs": [{"context": ctx, "qas": qas}]})
    return {"version": "v2.0", "data": data}


def main() -> None:
    train = sentences("08_Ruth.txt") + sentences("17_Est.txt") + sentences("09_1Sm.txt", range(0, 10))
    dev = sentences("32_Jonah.txt") + sentences("09_1Sm.txt", range(10, 16))
    write_conll(HERE / "bible_ner_train.conll", train)
    write_conll(HERE / "bible_ner_dev.conll", dev)
    rng = random.Random(0)
    tr = [(f"Ruth {i + 1}", s) for i, s in enumerate(chapters_of("08_Ruth.txt", range(4)))]
    tr += [(f"Esther {i + 1}", s) for i, s in enumerate(chapters_of("17_Est.txt", range(10)))]
    tr += [(f"1 Samuel {i + 1}", s) for i, s in enumerate(chapters_of("09_1Sm.txt", range(0, 10)))]
    dv = [(f"1 Samuel {i + 1}", s) for i, s in enumerate(chapters_of("09_1Sm.txt", range(10, 16)), start=10)]
    dv += [(f"Jonah {i + 1}", s) for i, s in enumerate(chapters_of("32_Jonah.txt", range(4)))]
    for name, chaps, prefix in (("bible_squad_train.json", tr, "tr"), ("bible_squad_dev.json", dv, "dv")):
        (HERE / name).write_text(json.dumps(squad(chaps, rng, prefix), indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
