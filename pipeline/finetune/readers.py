"""Fine-tuning task files, read into plain Python examples: GLUE-style tables (TSV/CSV/JSONL), CoNLL tags and
SQuAD JSON, local or through fsspec (s3://...). Every problem is a `FinetuneDataError` with one line naming the file,
the row (1-based line number for text files, question id for SQuAD) and the problem.

- Sequence classification: header row with `sentence` (or `sentence1`/`sentence2`) and `label`. String labels get
  ids in sorted order (numeric order when all are integers) and travel with the model as `id2label`. When every
  label parses as a number and at least one is not an integer (`3.8`, `5.000`), the task is regression.
- Token classification: CoNLL (token first column, tag last column, blank line between sentences, `-DOCSTART-`
  skipped).
- QA: SQuAD v1.1/v2.0.
- Embeddings: training pairs (`query`, `positive` [, `negative`] columns, in any of the table formats) and
  retrieval sets in BEIR's layout (`corpus.jsonl`, `queries.jsonl`, `qrels/<split>.tsv`), whose qrels may name
  only documents and queries that exist.

Why not `datasets` (considered in issue 31): `import datasets` took 3.3 s here (pandas, multiprocess, the hub
client), its CSV/JSON loaders go through a builder that writes an Arrow cache under ~/.cache/huggingface for every
file, and their errors name no row. The task files are small; the standard library's csv and json read them, and
every problem is one line naming its row. (`save_to_disk` directories are a data-preparation input, read with
pyarrow by pipeline/data/sources.)
"""

from __future__ import annotations

import csv
import json
import math
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import PipelineError
from pipeline.storage.io import filesystem


class FinetuneDataError(PipelineError, ValueError):
    """Bad fine-tuning data; the message is one line naming file, row and problem."""


def _err(path: str | Path, row: int | str | None, problem: str) -> FinetuneDataError:
    where = f"{path}" if row is None else f"{path}: row {row}"
    return FinetuneDataError(f"{where}: {problem}")


def _read_text(path: str) -> str:
    """The file's text, local or a URI (fsspec: s3://...); one-line errors for a missing, empty or non-UTF-8 file."""
    fs, p = filesystem(path)
    if not fs.isfile(p):
        raise _err(path, None, "file does not exist")
    try:
        text = fs.cat_file(p).decode("utf-8")
    except UnicodeDecodeError as e:
        raise _err(path, None, f"not valid UTF-8 (byte {e.start})") from None
    if not text.strip():
        raise _err(path, None, "file is empty")
    return text


# ---------------------------------------------------------------------------------------------------------------
# sequence classification


@dataclass
class TextExample:
    text_a: str
    text_b: str | None
    label: str
    row: int


def _read_rows(path: str) -> list[tuple[int, dict[str, Any]]]:
    """Rows of a TSV/CSV (header row) or JSONL file as `(line_number, mapping)`."""
    suffix = posixpath.splitext(path)[1].lower()
    text = _read_text(path)
    rows: list[tuple[int, dict[str, Any]]] = []
    if suffix == ".jsonl" or suffix == ".json":
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise _err(path, i, f"malformed JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise _err(path, i, "malformed row: expected a JSON object")
            rows.append((i, obj))
        return rows
    if suffix not in (".tsv", ".csv", ".txt"):
        raise _err(path, None, f"unsupported extension {suffix!r} (expected .tsv, .csv or .jsonl)")
    # GLUE TSVs contain bare quotes inside sentences: no quoting for TSV; standard quoting for CSV.
    reader = (
        csv.reader(text.splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE)
        if suffix != ".csv"
        else csv.reader(text.splitlines())
    )
    header: list[str] | None = None
    for i, fields in enumerate(reader, start=1):
        if not fields or all(not f.strip() for f in fields):
            continue
        if header is None:
            header = [f.strip() for f in fields]
            continue
        if len(fields) != len(header):
            raise _err(path, i, f"malformed row: {len(fields)} fields, header has {len(header)}")
        rows.append((i, dict(zip(header, fields))))
    if not rows:
        raise _err(path, None, "file has a header but no rows")
    return rows


def read_classification(
    path: str | Path, text_columns: list[str] | None = None, label_column: str = "label"
) -> list[TextExample]:
    """Examples of a TSV/CSV/JSONL file with `sentence` or `sentence1`/`sentence2` and `label`.

    `text_columns` overrides the detection (one or two names).
    """
    path = str(path)  # a URI stays one (Path would fold s3:// into s3:/)
    rows = _read_rows(path)
    first_line, first = rows[0]
    if text_columns:
        cols = list(text_columns)
    elif "sentence1" in first:
        cols = ["sentence1", "sentence2"]
    else:
        cols = ["sentence"]
    out = []
    for line, row in rows:
        missing = [c for c in [*cols, label_column] if c not in row]
        if missing:
            raise _err(path, line, f"missing column(s) {', '.join(missing)}; has {', '.join(map(str, row))}")
        label = row[label_column]
        if label is None or str(label).strip() == "":
            raise _err(path, line, f"empty {label_column!r}")
        a = row[cols[0]]
        b = row[cols[1]] if len(cols) > 1 else None
        if not isinstance(a, str) or (b is not None and not isinstance(b, str)):
            raise _err(path, line, "malformed row: text is not a string")
        out.append(TextExample(a, b, str(label).strip(), line))
    return out


def _is_number(s: str) -> bool:
    try:
        return math.isfinite(float(s))
    except ValueError:
        return False


def infer_labels(labels: list[str]) -> tuple[str, list[str]]:
    """`("regression", [])` for non-integer numeric labels, else `("classification", sorted label names)`.

    `infer_labels(["b", "a", "b"]) -> ("classification", ["a", "b"])`;
    `infer_labels(["10", "2"]) -> ("classification", ["2", "10"])`; `infer_labels(["0.5", "3"]) -> ("regression", [])`
    """
    if labels and all(_is_number(x) for x in labels):
        if any(float(x) != int(float(x)) or "." in x or "e" in x.lower() for x in labels):
            return "regression", []
        return "classification", sorted(set(labels), key=lambda x: float(x))
    return "classification", sorted(set(labels))


def label_ids(examples: list[TextExample], problem: str, label2id: dict[str, int], path: str | Path) -> np.ndarray:
    """Label array: float for regression, ids for classification (unknown label -> error naming the row)."""
    if problem == "regression":
        out = []
        for ex in examples:
            if not _is_number(ex.label):
                raise _err(path, ex.row, f"label {ex.label!r} is not a number (regression task)")
            out.append(float(ex.label))
        return np.asarray(out, dtype=np.float32)
    ids = []
    for ex in examples:
        if ex.label not in label2id:
            raise _err(path, ex.row, f"unknown label {ex.label!r} (not in the training labels: {', '.join(label2id)})")
        ids.append(label2id[ex.label])
    return np.asarray(ids, dtype=np.int64)


# ---------------------------------------------------------------------------------------------------------------
# token classification


@dataclass
class TaggedSentence:
    words: list[str]
    tags: list[str]
    row: int  # line number of the first word


def read_conll(path: str | Path) -> list[TaggedSentence]:
    """Sentences of a CoNLL file: `token ... tag` per line, blank line between sentences.

    Tags must be `O` or `B-X`/`I-X`.
    """
    path = str(path)  # a URI stays one (Path would fold s3:// into s3:/)
    text = _read_text(path)
    out: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    start = 0
    for i, line in enumerate(text.splitlines() + [""], start=1):
        parts = line.split()
        if not parts or parts[0] == "-DOCSTART-":
            if words:
                out.append(TaggedSentence(words, tags, start))
            words, tags = [], []
            continue
        if len(parts) < 2:
            raise _err(path, i, f"malformed row: expected 'token tag', got {line.strip()!r}")
        tag = parts[-1]
        if not (tag == "O" or (tag[:2] in ("B-", "I-") and len(tag) > 2)):
            raise _err(path, i, f"malformed tag {tag!r} (expected O, B-TYPE or I-TYPE)")
        if not words:
            start = i
        words.append(parts[0])
        tags.append(tag)
    if not out:
        raise _err(path, None, "no sentences")
    return out


def tag_labels(sentences: list[TaggedSentence]) -> list[str]:
    """Label list with `O` first, then entity tags sorted by type then B before I."""
    tags = {t for s in sentences for t in s.tags} - {"O"}
    return ["O"] + sorted(tags, key=lambda t: (t[2:], t[0]))


def check_tags(sentences: list[TaggedSentence], label2id: dict[str, int], path: str | Path) -> None:
    for s in sentences:
        for k, t in enumerate(s.tags):
            if t not in label2id:
                raise _err(path, s.row + k, f"unknown label {t!r} (not in the training tags: {', '.join(label2id)})")


# ---------------------------------------------------------------------------------------------------------------
# question answering


@dataclass
class QAExample:
    qid: str
    question: str
    context: str
    answers: list[dict[str, Any]]  # [{"text", "answer_start"}]; empty for unanswerable
    is_impossible: bool = False


def read_squad(path: str | Path) -> tuple[list[QAExample], bool]:
    """Questions of a SQuAD v1.1/v2.0 JSON file and whether it is v2 (`version` "v2.0" or any `is_impossible`).

    Each answer's `answer_start` must point at its `text` inside the context.
    """
    path = str(path)  # a URI stays one (Path would fold s3:// into s3:/)
    text = _read_text(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise _err(path, e.lineno, f"malformed JSON ({e.msg})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise _err(path, None, "missing top-level 'data' list (SQuAD format)")
    v2 = str(doc.get("version", "")).startswith("v2")
    out: list[QAExample] = []
    for a, article in enumerate(doc["data"]):
        for p, para in enumerate(article.get("paragraphs", []) if isinstance(article, dict) else []):
            if not isinstance(para, dict) or not isinstance(para.get("context"), str) or "qas" not in para:
                raise _err(path, f"data[{a}].paragraphs[{p}]", "malformed paragraph: needs 'context' and 'qas'")
            ctx = para["context"]
            for q, qa in enumerate(para["qas"]):
                qid = str(qa.get("id", f"data[{a}].paragraphs[{p}].qas[{q}]"))
                if not isinstance(qa.get("question"), str):
                    raise _err(path, qid, "missing 'question'")
                impossible = bool(qa.get("is_impossible", False))
                v2 = v2 or impossible
                answers = qa.get("answers", [])
                if not isinstance(answers, list) or (not impossible and not answers):
                    raise _err(path, qid, "answerable question without 'answers'")
                for ans in answers:
                    if not isinstance(ans, dict) or "text" not in ans or "answer_start" not in ans:
                        raise _err(path, qid, "malformed answer: needs 'text' and 'answer_start'")
                    s = ans["answer_start"]
                    if not isinstance(s, int) or ctx[s : s + len(ans["text"])] != ans["text"]:
                        raise _err(path, qid, f"answer {ans['text']!r} is not at answer_start {s} of the context")
                out.append(QAExample(qid, qa["question"], ctx, [] if impossible else answers, impossible))
    if not out:
        raise _err(path, None, "no questions")
    return out, v2


# ---------------------------------------------------------------------------------------------------------------
# sentence embeddings: training pairs and BEIR retrieval sets


@dataclass
class PairExample:
    query: str
    positive: str
    negative: str | None
    row: int


PAIR_COLUMNS = ("query", "positive")


def read_pairs(path: str | Path) -> list[PairExample]:
    """Training pairs of a TSV/CSV/JSONL file with columns `query`, `positive` and optionally `negative` (a hard
    negative: then every row has one). Every text must be non-empty."""
    path = str(path)
    rows = _read_rows(path)
    with_negative = "negative" in rows[0][1]
    out = []
    for line, row in rows:
        cols = [*PAIR_COLUMNS, "negative"] if with_negative else list(PAIR_COLUMNS)
        missing = [c for c in cols if c not in row]
        if missing:
            raise _err(
                path,
                line,
                f"missing column(s) {', '.join(missing)}; has {', '.join(map(str, row))} "
                "(a pairs file has query, positive [, negative])",
            )
        for c in cols:
            if not isinstance(row[c], str) or not row[c].strip():
                raise _err(path, line, f"empty or non-text {c!r}")
        out.append(PairExample(row["query"], row["positive"], row["negative"] if with_negative else None, line))
    return out


@dataclass
class BeirSet:
    """A retrieval set in BEIR's layout: every document, the queries that have a relevant document in the qrels
    (in queries.jsonl's order), and the qrels (query id -> {document id: relevance > 0})."""

    corpus: dict[str, str]
    """Document id -> its text: BEIR's `(title + " " + text).strip()`."""
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def beir_files(path: str | Path) -> tuple[str, str, str]:
    """(corpus.jsonl, queries.jsonl, qrels file) of a BEIR directory (its `qrels/test.tsv`) or of a qrels file
    inside one (`DIR/qrels/dev.tsv`: another split of the same corpus and queries).

    >>> beir_files("data/scifact")
    ('data/scifact/corpus.jsonl', 'data/scifact/queries.jsonl', 'data/scifact/qrels/test.tsv')
    >>> beir_files("data/scifact/qrels/dev.tsv")[2]
    'data/scifact/qrels/dev.tsv'
    """
    path = str(path).rstrip("/")
    if path.endswith(".tsv"):
        root, qrels = posixpath.dirname(posixpath.dirname(path)), path
    else:
        root, qrels = path, posixpath.join(path, "qrels", "test.tsv")
    return posixpath.join(root, "corpus.jsonl"), posixpath.join(root, "queries.jsonl"), qrels


def _read_ids(path: str, what: str) -> dict[str, tuple[str, int]]:
    """{_id: (text, line)} of a BEIR corpus or queries file; its text is `title text` for a document."""
    out: dict[str, tuple[str, int]] = {}
    for line, obj in _read_rows(path):
        if not isinstance(obj.get("_id"), (str, int)) or str(obj["_id"]) == "":
            raise _err(path, line, "missing '_id'")
        if not isinstance(obj.get("text"), str):
            raise _err(path, line, "missing 'text'")
        title = obj.get("title") or ""
        if not isinstance(title, str):
            raise _err(path, line, "'title' is not a string")
        key = str(obj["_id"])
        if key in out:
            raise _err(path, line, f"_id {key!r} again (first at row {out[key][1]})")
        out[key] = ((title + " " + obj["text"]).strip(), line)
    if not out:
        raise _err(path, None, f"no {what}")
    return out


def read_beir(path: str | Path) -> BeirSet:
    """Read and check a BEIR set (`beir_files`): unique ids, and qrels (header `query-id corpus-id score`, integer
    scores) that name only documents and queries that exist, with at least one relevant (score > 0) pair."""
    corpus_file, queries_file, qrels_file = beir_files(path)
    corpus = _read_ids(corpus_file, "documents")
    queries = _read_ids(queries_file, "queries")
    text = _read_text(qrels_file)
    qrels: dict[str, dict[str, int]] = {}
    header = None
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.rstrip("\r").split("\t")
        if header is None:
            header = fields
            if [f.strip() for f in fields] != ["query-id", "corpus-id", "score"]:
                raise _err(qrels_file, i, f"header {line.strip()!r} is not 'query-id<TAB>corpus-id<TAB>score'")
            continue
        if len(fields) != 3:
            raise _err(qrels_file, i, f"malformed row: {len(fields)} fields, not 3 (tab-separated)")
        qid, did, score = (f.strip() for f in fields)
        if qid not in queries:
            raise _err(qrels_file, i, f"query-id {qid!r} is not in {queries_file}")
        if did not in corpus:
            raise _err(qrels_file, i, f"corpus-id {did!r} is not in {corpus_file}")
        try:
            rel = int(score)
        except ValueError:
            raise _err(qrels_file, i, f"score {score!r} is not an integer") from None
        if rel > 0:
            qrels.setdefault(qid, {})[did] = rel
    if not qrels:
        raise _err(qrels_file, None, "no relevant (score > 0) query-document pair")
    return BeirSet(
        {k: t for k, (t, _) in corpus.items()},
        {k: t for k, (t, _) in queries.items() if k in qrels},
        {q: qrels[q] for q in queries if q in qrels},
    )
