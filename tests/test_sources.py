"""Readers: every format, local and fsspec URIs, and every bad-input case counted with its reason."""

from __future__ import annotations

import bz2
import gzip
import json
import re
from collections import Counter

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.data.sources import (
    MAX_RECORD_BYTES,
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
    assert reasons == Counter(
        invalid_json=2, missing_text=1, null_text=1, text_not_string=1, empty=1, word_too_long=1, invalid_utf8=1
    )
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


WIKIEXT_DOCS = [
    ("12", "Anarchism", "Anarchism is a political philosophy.\nHistory.\nIt grew &amp; spread."),
    ("25", "Autism", "Autism is a condition."),
    ("39", "Stub", ""),
]


@pytest.mark.parametrize("form", ["doc", "json"])
@pytest.mark.parametrize("compress", [None, "bz2", "gz"])
def test_wikiextractor_output_recognised_by_content(tmp_path, form, compress):
    """WikiExtractor's own layout (text/AA/wiki_00, AB/...; no extension, or .bz2 from --compress) in both of its
    forms: each file read by content, each document named by its id."""
    if form == "doc":
        bodies = ["".join(_wikiext_doc(i, t, b) for i, t, b in WIKIEXT_DOCS[:2]), _wikiext_doc(*WIKIEXT_DOCS[2])]
    else:
        bodies = [
            "".join(json.dumps({"id": i, "url": "u", "title": t, "text": b}) + "\n" for i, t, b in WIKIEXT_DOCS[:2]),
            json.dumps({"id": "39", "url": "u", "title": "Stub", "text": ""}) + "\n",
        ]
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
    (tmp_path / "w.jsonl").write_text(
        json.dumps({"text": "No id."}) + "\n\n" + json.dumps({"id": 7, "text": "Id."}) + "\n"
    )
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
    assert msg.startswith(
        f"no readable input file under {tmp_path} (skipped 7: {tmp_path}/notes0.md (unknown format), "
    )
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
    assert skipped == [
        (str(root / "a.txt"), "symlink loop"),
        (str(root / "b.txt"), "symlink loop"),
        (str(root / "dangling.txt"), "dangling symlink (to /nonexistent/gone.txt)"),
        (str(root / "self.txt"), "symlink loop"),
        (str(root / "sub" / "up"), f"symlink loop (to {root}, a folder above it)"),
    ]
    with pytest.raises(InputError, match=r"dangling.txt is a dangling symlink \(to /nonexistent/gone.txt\)$"):
        expand_inputs([str(root / "dangling.txt")])


# ---------------------------------------------------------------------------------------------- malformed input
# Minimal reproducers of what fuzzing the readers found (issue 38; bench/data/fuzz_readers.py,
# tests/test_fuzz_readers.py): every record read or rejected with a reason, a file that cannot be read named with the
# exception, never raised.


def _items(path, column="text", max_record_bytes=MAX_RECORD_BYTES):
    files, _ = expand_inputs([str(path)])
    return [x for f in files for x in read_documents(f, column, max_record_bytes=max_record_bytes)]


def _summary(items):
    """(documents' texts, rejection reasons in order, skipped files' reasons)"""
    return (
        [x.text for x in items if isinstance(x, Document)],
        [x.reason for x in items if isinstance(x, Rejected)],
        [x.reason for x in items if isinstance(x, Skipped)],
    )


def _parquet_bytes(texts, **kw):
    import io

    buf = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), buf, **kw)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        (lambda d: b"", "ArrowInvalid: Parquet file size is 0 bytes"),
        (lambda d: d[:-4] + b"PAR2", "ArrowInvalid: Parquet magic bytes not found in footer"),
        (lambda d: d[:-8] + (len(d) * 4).to_bytes(4, "little") + b"PAR1", "ArrowInvalid: "),
    ],
)
def test_parquet_whose_footer_cannot_be_read_is_skipped_and_named(tmp_path, damage, error):
    (tmp_path / "p.parquet").write_bytes(damage(_parquet_bytes(["One.", "Two."])))
    docs, reasons, skipped = _summary(_items(tmp_path / "p.parquet"))
    assert not docs and not reasons and len(skipped) == 1
    assert skipped[0].startswith("unreadable: pyarrow.lib.") and error in skipped[0], skipped


def test_parquet_damaged_row_group_rejects_its_rows_and_reads_the_next(tmp_path):
    data = bytearray(
        _parquet_bytes(
            [f"Row {i} " + "words " * 20 for i in range(6)],
            row_group_size=2,
            compression="snappy",
            use_dictionary=False,
        )
    )
    import io

    c = pq.ParquetFile(io.BytesIO(bytes(data))).metadata.row_group(1).column(0)
    end = c.data_page_offset + c.total_compressed_size
    for k in range(end - 12, end - 2):  # the second row group's compressed values
        data[k] ^= 0xFF
    (tmp_path / "p.parquet").write_bytes(bytes(data))
    items = _items(tmp_path / "p.parquet")
    docs, reasons, skipped = _summary(items)
    assert [t.split()[1] for t in docs] == ["0", "1", "4", "5"] and reasons == ["unreadable", "unreadable"]
    assert [x.record for x in items if isinstance(x, Rejected)] == [2, 3]
    assert skipped == ["unreadable from record 2: OSError: Corrupt snappy compressed data."]


def test_parquet_row_group_that_decodes_to_no_rows_has_them_rejected(tmp_path):
    """A flipped byte in a data page header (fuzz case 1778): Arrow read the row group as 0 rows, with no error."""
    import io

    data = bytearray(_parquet_bytes([f"Row {i} words." for i in range(6)], row_group_size=2, compression="none"))
    data[pq.ParquetFile(io.BytesIO(bytes(data))).metadata.row_group(1).column(0).data_page_offset + 1] = 41
    (tmp_path / "p.parquet").write_bytes(bytes(data))
    items = _items(tmp_path / "p.parquet")
    assert _summary(items) == (
        ["Row 0 words.", "Row 1 words.", "Row 4 words.", "Row 5 words."],
        ["unreadable"] * 2,
        ["unreadable from record 2: row group 1 gave 0 of its 2 rows"],
    )
    assert [x.record for x in items if isinstance(x, Rejected)] == [2, 3]


def test_parquet_string_that_is_not_utf8_rejects_its_row(tmp_path):
    data = _parquet_bytes(["Good one.", "Python here.", "Good two."], compression="none")
    (tmp_path / "p.parquet").write_bytes(data.replace(b"Python", b"Pyth\xff\xfe", 1))
    assert _summary(_items(tmp_path / "p.parquet")) == (["Good one.", "Good two."], ["invalid_utf8"], [])


@pytest.mark.parametrize("name", ["w.jsonl", "wiki_00"])  # JSON lines, WikiExtractor's --json form
def test_json_nested_a_thousand_deep_and_lone_surrogates_are_rejected(tmp_path, name):
    lines = [
        '{"id": "1", "text": "Good."}',
        "[" * 1000 + "]" * 1000,
        '{"id": "3", "text": ' + "[" * 5000 + "]" * 5000 + "}",
        '{"id": "4", "text": "lone \\ud800 surrogate"}',
        '{"id": "\\udc00", "text": "An id that is not UTF-8."}',
        '{"id": "6", "text": "Good \\u00e9 \\ud83d\\ude00."}',
    ]  # a surrogate pair is one character: kept
    (tmp_path / name).write_text("\n".join(lines) + "\n")
    docs, reasons, skipped = _summary(_items(tmp_path / name))
    assert docs == ["Good.", "Good é 😀."] and not skipped
    assert reasons == ["invalid_json", "invalid_json", "lone_surrogate", "lone_surrogate"]


@pytest.mark.parametrize("name", ["notes.bz2", "notes.gz", "notes.txt.gz"])
def test_book_named_alone_whose_extension_lies_is_rejected_and_named(tmp_path, name):
    """Plain text under a compressed name, given as --input (in a folder it is an unknown format)."""
    (tmp_path / name).write_text("Plain words under a compressed name.")
    items = _items(tmp_path / name)
    assert [type(x).__name__ for x in items] == ["Rejected", "Skipped"]
    assert items[0].reason == "unreadable" and items[1].path == str(tmp_path / name)
    error = r"(OSError: Invalid data stream|gzip\.BadGzipFile: Not a gzipped file.*)"
    assert re.fullmatch(f"unreadable from record 0: {error}", items[1].reason), items[1].reason


def test_truncated_or_damaged_gzip_names_the_file(tmp_path):
    body = "".join(json.dumps({"text": f"Record {i} " + "words " * 50}) + "\n" for i in range(500)).encode()
    data = bytearray(gzip.compress(body))
    (tmp_path / "t.jsonl.gz").write_bytes(bytes(data[: len(data) // 2]))
    data[len(data) // 2 :] = bytes(b ^ 0x55 for b in data[len(data) // 2 :])
    (tmp_path / "d.jsonl.gz").write_bytes(bytes(data))
    for name, reason, error in [
        ("t", "truncated_gzip", r"EOFError: Compressed file ended"),
        ("d", "unreadable", r"(zlib\.error|gzip\.BadGzipFile): "),
    ]:  # bad data or CRC
        items = _items(tmp_path / f"{name}.jsonl.gz")
        assert [x.reason for x in items if isinstance(x, Rejected)] == [reason]
        (skip,) = [x for x in items if isinstance(x, Skipped)]
        n = sum(isinstance(x, Document) for x in items)
        assert re.match(f"unreadable from record {n}: {error}", skip.reason), skip


def _doc(i, body="Text", open_=">", close="</doc>"):
    return f'<doc id="{i}" url="u" title="T{i}"{open_}\nT{i}\n\n{body} {i}.\n{close}\n'


@pytest.mark.parametrize(
    ("block", "outcome"),
    [
        (_doc(2), "Text 2."),
        (_doc(2, close="</DOC>"), "Text 2."),
        (_doc(2, close="</doc >"), "Text 2."),
        (_doc(2, close="  </doc>"), "Text 2."),
        (_doc(2, open_=""), "bad_doc_tag"),  # the opening line without `>`
        ("  " + _doc(2), "Text 2."),  # an indented opening line
        (_doc(2).replace('title="T2"', 'title="T\xff"'), "invalid_utf8"),
        (_doc(2, body="Bad \xff byte"), "invalid_utf8"),
        (_doc(2, close="</dco>"), "unterminated_doc"),  # the next <doc> line ends it
        (_doc(2, close=""), "unterminated_doc"),
    ],
)
def test_wikiextractor_block_is_read_or_rejected_and_the_next_one_read(tmp_path, block, outcome):
    raw = (_doc(1) + block + _doc(3)).encode("utf-8", "surrogateescape")
    raw = raw.replace("\xff".encode(), b"\xff")  # the invalid byte itself, not its UTF-8 encoding
    (tmp_path / "wiki_00").write_bytes(raw)
    items = _items(tmp_path / "wiki_00")
    assert [x.record if isinstance(x, Rejected) else x.doc_id for x in items] == [0, 1, 2]  # each <doc line: a record
    middle = items[1].text if isinstance(items[1], Document) else items[1].reason
    assert (items[0].text, middle, items[2].text) == ("Text 1.", outcome, "Text 3.")


def test_wikiextractor_file_cut_inside_a_block(tmp_path):
    (tmp_path / "wiki_00").write_text(_doc(1) + _doc(2)[:40])  # inside its text
    assert _summary(_items(tmp_path / "wiki_00")) == (["Text 1."], ["truncated_doc"], [])


def test_checks_of_long_lines_take_linear_time(tmp_path):
    """Were quadratic: the long-word check on 2 MiB of 1,000-character words (3.3 s), a `<doc` line of 20,000
    spaces and no `>` (1.9 s). Each now takes a few milliseconds; the bounds leave room for a loaded machine."""
    import time

    from pipeline.data.sources import check_text

    start = time.process_time()
    assert check_text(("a" * 1000 + " ") * 2100) is None and check_text("a " + "b" * 1001) == "word_too_long"
    (tmp_path / "wiki_00").write_text(_doc(1) + "<doc" + " " * 20000 + "\n" + _doc(3))
    assert _summary(_items(tmp_path / "wiki_00")) == (["Text 1.", "Text 3."], ["bad_doc_tag"], [])
    assert time.process_time() - start < 1.0


def test_datasets_directory_whose_state_cannot_be_read_is_named(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "dataset_info.json").write_text("{}")
    (tmp_path / "hf" / "state.json").write_text('{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}')
    (tmp_path / "hf" / "data-00000-of-00001.arrow").write_bytes(b"not an Arrow stream")
    docs, reasons, skipped = _summary(_items(tmp_path / "hf"))
    assert not docs and not reasons and skipped[0].startswith("unreadable from record 0: pyarrow.lib.ArrowInvalid")
    (tmp_path / "hf" / "state.json").write_text("{not json")
    docs, reasons, skipped = _summary(_items(tmp_path / "hf"))
    assert not docs and skipped[0].startswith("unreadable from state.json: json.decoder.JSONDecodeError")


# ---------------------------------------------------------------------------------------------- data.max_record_bytes


def _page(i, text, close=True):
    page = f"<page><title>P{i}</title><ns>0</ns><id>{i}</id><revision><text>{text}</text></revision></page>\n"
    return page if close else page[: page.index("</text>")]


_BIG = "A long line of words. " * 60  # 1,320 bytes: over the cap of 1,000 in the cases below


@pytest.mark.parametrize(
    ("name", "records"),
    [
        (
            "w.jsonl",
            [
                json.dumps({"text": "Text 1."}) + "\n",
                json.dumps({"text": _BIG}) + "\n",
                json.dumps({"text": "Text 3."}) + "\n",
            ],
        ),
        (
            "w.jsonl",
            [json.dumps({"text": "Text 1."}) + "\n", '{"text": "' + _BIG + "\n", json.dumps({"text": "Text 3."})],
        ),
        ("wiki_00", [_doc(1), _doc(2, body="\n".join([_BIG[:100]] * 12)), _doc(3)]),  # lines of 100 bytes
        ("wiki_00", [_doc(1), _doc(2, body=_BIG, close=""), _doc(3)]),  # one long line, never closed
        ("enwiki-pages-articles.xml", ["<mediawiki>\n" + _page(1, "Text 1."), _page(2, _BIG), _page(3, "Text 3.")]),
        (
            "enwiki-pages-articles.xml",
            ["<mediawiki>\n" + _page(1, "Text 1."), _page(2, _BIG, close=False), _page(3, "Text 3.")],
        ),
    ],
)
def test_a_record_over_the_cap_is_rejected_and_the_next_one_read(tmp_path, name, records):
    """Issue 59: a record longer than data.max_record_bytes (a JSON line, one without its newline, a `<doc>` block,
    a dump's `<page>`, closed or not) is `record_too_large`; the records after it are read, numbered as before."""
    (tmp_path / name).write_text("".join(records))
    items = _items(tmp_path / name, max_record_bytes=1000)
    assert _summary(items) == (["Text 1.", "Text 3."], ["record_too_large"], [])
    assert [x.record if isinstance(x, Rejected) else x.doc_id & 0xFFFFFFFF for x in items] == [0, 1, 2]
    assert _summary(_items(tmp_path / name))[1] != ["record_too_large"]  # the default cap takes it


def test_the_readers_default_cap_is_the_configs():
    from pipeline.config import DataConfig

    assert DataConfig(inputs=[]).max_record_bytes == MAX_RECORD_BYTES


@pytest.mark.parametrize("name", ["book.txt", "book.txt.gz"])
def test_a_book_is_one_record_a_book_over_the_cap_is_rejected_whole(tmp_path, name):
    text = "A sentence of the book. " * 50  # 1,200 bytes
    if name.endswith(".gz"):
        with gzip.open(tmp_path / name, "wt") as f:
            f.write(text)
    else:
        (tmp_path / name).write_text(text)
    assert _summary(_items(tmp_path / name, max_record_bytes=1000)) == ([], ["record_too_large"], [])
    assert _summary(_items(tmp_path / name, max_record_bytes=1200)) == ([text], [], [])


def test_a_parquet_row_over_the_cap_is_rejected(tmp_path):
    (tmp_path / "t.parquet").write_bytes(_parquet_bytes(["Text 1.", "é" * 600, "Text 3."]))  # 1,200 bytes
    assert _summary(_items(tmp_path / "t.parquet", max_record_bytes=1000)) == (
        ["Text 1.", "Text 3."],
        ["record_too_large"],
        [],
    )


def test_a_dump_page_over_the_cap_is_dropped_as_it_streams():
    """The page's bytes are not kept once it is over the cap: the chunks after it are searched for the next
    `<page>` only (a `<page>` straddling two chunks is found)."""
    from pipeline.data.wiki import _page_blocks

    chunks = [b"<page>" + b"x" * 50, b"x" * 50, b"</page><pa", b"ge>ok</page>"]
    assert list(_page_blocks(chunks, max_bytes=60)) == [(b"", "record_too_large"), (b"<page>ok</page>", None)]
    assert list(_page_blocks(chunks))[0][1] is None  # no cap: the whole page


_UNCLOSED = {  # a file of its kind whose first record is never closed (it runs `mb` MB), then three records
    "enwiki-pages-articles.xml": lambda f, mb: (
        f.write(b"<mediawiki>\n<page><title>Big</title><ns>0</ns><id>1</id><revision><text>"),
        [f.write(b"Words of an unclosed page, line after line.\n" * 23_000) for _ in range(mb)],
        [f.write(_page(i, f"Text {i}.").encode()) for i in (2, 3, 4)],
    ),
    "wiki_00": lambda f, mb: (
        f.write(b'<doc id="1" url="u" title="Big">\n'),
        [f.write(b"Words of an unclosed block, line after line.\n" * 23_000) for _ in range(mb)],
        [f.write(_doc(i).encode()) for i in (2, 3, 4)],
    ),
    "w.jsonl": lambda f, mb: (
        f.write(b'{"text": "'),
        [f.write(b"Words of a line that does not end. " * 30_000) for _ in range(mb)],
        f.write(b"\n" + b"".join(json.dumps({"text": f"Text {i}."}).encode() + b"\n" for i in (2, 3, 4))),
    ),
}


@pytest.mark.parametrize("name", list(_UNCLOSED))
def test_an_unclosed_record_at_the_start_of_a_large_file_takes_the_cap_not_the_file(tmp_path, name):
    """Issue 59: an unclosed `<page>`, `<doc>` or JSON line made its reader buffer the rest of the file. Here 64 MB
    of it with a 16 MiB cap: the record is `record_too_large`, the three after it are read, and the reading
    child's peak RSS (sampled as test_signing_one_big_document_is_bounded samples it, and its own VmHWM) stays
    within the cap and 8 MiB of its RSS after the imports (a JSON line read by `readline(cap + 1)` held twice the
    cap: 32 MiB here)."""
    import os
    import sys

    from conftest import load_bench

    with open(tmp_path / name, "wb") as f:
        _UNCLOSED[name](f, 64)
    assert (tmp_path / name).stat().st_size > 60e6
    cap = 16 * 2**20
    code = (
        "import json, psutil; from pipeline.data.sources import Document, Rejected, expand_inputs, "
        "read_documents; base = psutil.Process().memory_info().rss; "
        f"files, _ = expand_inputs([{str(tmp_path / name)!r}]); "
        f"items = [x for f in files for x in read_documents(f, max_record_bytes={cap})]; "
        "hwm = next(x for x in open('/proc/self/status') if x.startswith('VmHWM:')); "
        "print(json.dumps({'base': base, 'hwm': 1024 * int(hwm.split()[1]), "
        "'texts': [x.text for x in items if isinstance(x, Document)], "
        "'reasons': [x.reason for x in items if isinstance(x, Rejected)]}))"
    )
    run = load_bench("big_document_memory").run_sampled([sys.executable, "-c", code], env=dict(os.environ))
    assert run.returncode == 0, run.log
    out = json.loads(run.log.strip().splitlines()[-1])
    assert out["reasons"] == ["record_too_large"] and out["texts"] == ["Text 2.", "Text 3.", "Text 4."]
    grown = max(run.sampler.peak_one, out["hwm"]) - out["base"]  # VmHWM: the peak no sampling can miss
    assert grown < cap + 8 * 2**20, f"{grown / 2**20:.0f} MiB over the imports"  # without the cap: over 64
