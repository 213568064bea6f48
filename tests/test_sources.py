"""Readers: every format, local and fsspec URIs, and every bad-input case counted with its reason."""

from __future__ import annotations

import bz2
import gzip
import json
from collections import Counter

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.data.sources import (
    Document,
    InputError,
    Rejected,
    Skipped,
    expand_inputs,
    no_readable_input,
    read_documents,
)


def _read_all(paths, column="text"):
    files, skipped = expand_inputs([str(p) for p in paths])
    items = [x for f in files for x in read_documents(f, column)]
    docs = [x for x in items if isinstance(x, Document)]
    reasons = Counter(x.reason for x in items if isinstance(x, Rejected))
    return files, skipped, docs, reasons


def test_books_folder_recursive_with_gz(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.txt").write_text("First book. Two sentences.\n\nPara two.")
    with gzip.open(tmp_path / "two.txt.gz", "wt") as f:
        f.write("Second book.")
    (tmp_path / "notes.md").write_text("not a corpus file")
    files, skipped, docs, reasons = _read_all([tmp_path])
    assert [f.kind for f in files] == ["txt", "txt"]
    assert sorted(d.text for d in docs) == ["First book. Two sentences.\n\nPara two.", "Second book."]
    assert skipped == [Skipped(str(tmp_path / "notes.md"), "unknown format")] and not reasons
    assert len({d.doc_id for d in docs}) == 2


def test_shared_corpora_are_read_completely(shared_dir):
    files, skipped, docs, reasons = _read_all([shared_dir / "corpora"])
    assert len(files) == 66 + 1 + 1 and not skipped  # books, the pydocs JSON lines, the sample dump
    assert [f.kind for f in files if not f.path.endswith(".txt")] == ["jsonl", "wiki_xml"]
    assert len(docs) == 66 + 483 + 4  # the dump's 11 pages: 4 articles, 3 redirects, 4 other namespaces
    assert reasons == Counter(wiki_redirect=3, wiki_namespace=4)
    wiki = [d for d in docs if d.source.endswith("pydocs.jsonl.gz")]
    assert wiki[0].text.startswith("These documents are generated")


def test_jsonl_bad_records_are_counted(tmp_path):
    lines = [
        json.dumps({"id": "1", "text": "Good one."}),
        "{not json",
        json.dumps({"id": "3", "title": "no text"}),
        json.dumps({"id": "4", "text": None}),
        json.dumps({"id": "5", "text": 42}),
        json.dumps({"id": "6", "text": "   \n  "}),
        json.dumps({"id": "7", "text": "x" * 200_000}),
        json.dumps(["a", "list"]),
        "",
        json.dumps({"id": "9", "text": "Good two."}),
    ]
    raw = "\n".join(lines).encode() + b"\n" + b'{"text": "bad \xff\xfe utf8"}\n'
    (tmp_path / "w.jsonl").write_bytes(raw)
    _, _, docs, reasons = _read_all([tmp_path / "w.jsonl"])
    assert [d.text for d in docs] == ["Good one.", "Good two."]
    assert reasons == Counter(invalid_json=2, missing_text=1, null_text=1, text_not_string=1, empty=1,
                              word_too_long=1, invalid_utf8=1)
    # record numbers (the low half of doc_id) count records, so ids are stable
    assert [d.doc_id & 0xFFFFFFFF for d in docs] == [0, 8]


def test_text_files_bad_cases(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "bin.txt").write_bytes(bytes(range(256)) * 10)
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "ws.txt").write_text(" \n\t\n ")
    (tmp_path / "word.txt").write_text("a" * 200_000)
    (tmp_path / "ok.txt").write_text("Fine text.")
    data = gzip.compress(b"A long gzipped book. " * 5000)
    (tmp_path / "trunc.txt.gz").write_bytes(data[: len(data) // 2])
    _, _, docs, reasons = _read_all([tmp_path])
    assert [d.text for d in docs] == ["Fine text."]
    assert reasons == Counter(invalid_utf8=1, binary=1, empty=2, word_too_long=1, truncated_gzip=1)


def test_truncated_jsonl_gz_keeps_complete_records(tmp_path):
    body = "".join(json.dumps({"text": f"Record {i} " + "words " * 50}) + "\n" for i in range(500)).encode()
    data = gzip.compress(body)
    (tmp_path / "t.jsonl.gz").write_bytes(data[: int(len(data) * 0.6)])
    _, _, docs, reasons = _read_all([tmp_path / "t.jsonl.gz"])
    assert 100 < len(docs) < 500 and reasons == Counter(truncated_gzip=1)
    assert all(d.text.startswith(f"Record {i} ") for i, d in enumerate(docs))


def test_parquet_and_configurable_column(tmp_path):
    t = pa.table({"body": ["One.", None, "Two.", ""], "other": [1, 2, 3, 4]})
    pq.write_table(t, tmp_path / "p.parquet")
    _, _, docs, reasons = _read_all([tmp_path / "p.parquet"], column="body")
    assert [d.text for d in docs] == ["One.", "Two."] and reasons == Counter(null_text=1, empty=1)
    _, _, docs, reasons = _read_all([tmp_path / "p.parquet"], column="text")
    assert not docs and reasons == Counter(missing_text=4)
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "n.parquet")
    _, _, docs, reasons = _read_all([tmp_path / "n.parquet"])
    assert reasons == Counter(text_not_string=2)


def test_datasets_save_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": [f"Doc {i}." for i in range(30)] + [None], "id": list(range(31))})
    ds.save_to_disk(str(tmp_path / "hf"), num_shards=3)
    files, _, docs, reasons = _read_all([tmp_path / "hf"])
    assert [f.kind for f in files] == ["hf"]
    assert [d.text for d in docs] == [f"Doc {i}." for i in range(30)] and reasons == Counter(null_text=1)
    assert [d.doc_id & 0xFFFFFFFF for d in docs] == list(range(30))


def test_fsspec_uris(tmp_path):
    """memory:// and file:// go through fsspec: the reader never assumes a local disk."""
    fs = fsspec.filesystem("memory")
    fs.pipe("/corp/b1.txt", b"Memory book one.")
    fs.pipe("/corp/sub/w.jsonl", (json.dumps({"text": "Mem wiki."}) + "\n").encode())
    files, _, docs, _ = _read_all(["memory://corp"])
    assert all(f.path.startswith("memory://") for f in files)
    assert sorted(d.text for d in docs) == ["Mem wiki.", "Memory book one."]
    (tmp_path / "x.txt").write_text("File uri.")
    _, _, docs, _ = _read_all([f"file://{tmp_path}"])
    assert [d.text for d in docs] == ["File uri."]


def test_missing_path_is_one_clear_error(tmp_path):
    with pytest.raises(InputError, match=r"input path .*nope does not exist"):
        expand_inputs([str(tmp_path / "nope")])


def _wikiext_doc(i, title, body):
    return f'<doc id="{i}" url="https://en.wikipedia.org/wiki?curid={i}" title="{title}">\n{title}\n\n{body}\n</doc>\n'


WIKIEXT_DOCS = [("12", "Anarchism", "Anarchism is a political philosophy.\nHistory.\nIt grew &amp; spread."),
                ("25", "Autism", "Autism is a condition."), ("39", "Stub", "")]


@pytest.mark.parametrize("form", ["doc", "json"])
@pytest.mark.parametrize("compress", [None, "bz2", "gz"])
def test_wikiextractor_output_recognised_by_content(tmp_path, form, compress):
    """WikiExtractor's own layout (text/AA/wiki_00, AB/...; no extension, or .bz2 from --compress) in both of its
    forms: each file read by content, each document named by its id."""
    if form == "doc":
        bodies = ["".join(_wikiext_doc(i, t, b) for i, t, b in WIKIEXT_DOCS[:2]), _wikiext_doc(*WIKIEXT_DOCS[2])]
    else:
        bodies = ["".join(json.dumps({"id": i, "url": "u", "title": t, "text": b}) + "\n" for i, t, b in WIKIEXT_DOCS[:2]),
                  json.dumps({"id": "39", "url": "u", "title": "Stub", "text": ""}) + "\n"]
    suffix = {"bz2": ".bz2", "gz": ".gz", None: ""}[compress]
    pack = {"bz2": bz2.compress, "gz": gzip.compress, None: lambda b: b}[compress]
    for sub, body in zip(["AA", "AB"], bodies):
        (tmp_path / "text" / sub).mkdir(parents=True)
        (tmp_path / "text" / sub / f"wiki_00{suffix}").write_bytes(pack(body.encode()))
    files, skipped, docs, reasons = _read_all([tmp_path / "text"])
    assert [f.kind for f in files] == ["wikiext" if form == "doc" else "wikiext_json"] * 2 and not skipped
    assert [d.name for d in docs] == ["12", "25"] and reasons == Counter(empty=1)
    assert [d.doc_id for d in docs] == [0, 1]
    first = "Anarchism is a political philosophy.\nHistory.\nIt grew & spread."  # both forms HTML-unescaped
    assert [d.text for d in docs] == [first, "Autism is a condition."]


def test_document_names(tmp_path):
    (tmp_path / "book.txt").write_text("A book.")
    (tmp_path / "w.jsonl").write_text(json.dumps({"text": "No id."}) + "\n\n" + json.dumps({"id": 7, "text": "Id."}) + "\n")
    pq.write_table(pa.table({"text": ["R0.", "R1."]}), tmp_path / "p.parquet")
    pq.write_table(pa.table({"text": ["R0.", "R1."], "id": ["a", None]}), tmp_path / "q.parquet")
    _, _, docs, _ = _read_all([tmp_path])
    assert [d.name for d in docs] == ["book.txt", "p.parquet:0", "p.parquet:1", "a", "q.parquet:1", "w.jsonl:1", "7"]
    # the ids are as before names existed: file index << 32 | record number
    assert [d.doc_id for d in docs] == [0, 1 << 32, 1 << 32 | 1, 2 << 32, 2 << 32 | 1, 3 << 32, 3 << 32 | 1]


def test_skipped_files_are_named_with_their_reasons(tmp_path):
    for k in range(7):
        (tmp_path / f"notes{k}.md").write_text("not a corpus")
    files, skipped = expand_inputs([str(tmp_path)])
    assert not files and skipped[0] == Skipped(str(tmp_path / "notes0.md"), "unknown format")
    msg = str(no_readable_input([str(tmp_path)], skipped))
    assert msg.startswith(f"no readable input file under {tmp_path} (skipped 7: {tmp_path}/notes0.md (unknown format), ")
    assert msg.endswith("notes4.md (unknown format), and 2 more)")


def test_dangling_symlinks_and_loops_are_skipped_with_their_reason(shared_dir, tmp_path):
    """A dangling link, a link to itself, two links to each other and a link to a folder above: each skipped with
    why, never a traceback; a link to a real folder elsewhere is walked under its own name."""
    import os

    from pipeline.data.sources import InputError

    root = tmp_path / "in"
    (root / "sub").mkdir(parents=True)
    (root / "book.txt").write_text("A book. " * 50)
    os.symlink("/nonexistent/gone.txt", root / "dangling.txt")
    os.symlink("self.txt", root / "self.txt")
    os.symlink("b.txt", root / "a.txt")
    os.symlink("a.txt", root / "b.txt")
    os.symlink("..", root / "sub" / "up")
    os.symlink(shared_dir / "corpora" / "books", root / "linked")
    files, skipped = expand_inputs([str(root)])
    assert [f.path for f in files][:2] == [str(root / "book.txt"), str(root / "linked" / "01_Ge.txt")]
    assert len(files) == 1 + len(os.listdir(shared_dir / "corpora" / "books"))
    assert skipped == [(str(root / "a.txt"), "symlink loop"), (str(root / "b.txt"), "symlink loop"),
                       (str(root / "dangling.txt"), "dangling symlink (to /nonexistent/gone.txt)"),
                       (str(root / "self.txt"), "symlink loop"),
                       (str(root / "sub" / "up"), f"symlink loop (to {root}, a folder above it)")]
    with pytest.raises(InputError, match=r"dangling.txt is a dangling symlink \(to /nonexistent/gone.txt\)$"):
        expand_inputs([str(root / "dangling.txt")])
