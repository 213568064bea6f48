"""Readers: every format, local and fsspec URIs, and every bad-input case counted with its reason."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.data.sources import Document, InputError, Rejected, Skipped, expand_inputs, read_documents


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
