"""The records the dedup pass keeps for the tokenize pass (pipeline/data/extracted.py): every field back exactly, in
order, a row group at a time; nothing left behind by a reader that stops or fails."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from pipeline.data import extracted
from pipeline.data.extracted import keep, kept_records
from pipeline.data.sources import Document, Rejected, Skipped

RECORDS = [
    Document(7 << 32, "/in/a.jsonl", "First line.\n\nSecond — with ünïcode and 漢字. " * 40, "a-1"),
    Rejected("/in/a.jsonl", 1, "invalid_json"),
    Document((7 << 32) | 2, "/in/a.jsonl", "x", ""),  # one character, an empty name
    Skipped("/in/b\udcff.bz2", "truncated_dump: EOFError: compressed file ended"),  # a path from surrogateescape
    Document((7 << 32) | 3, "/in/b\udcff.bz2", "tail " * 3000, "page 12"),
    Rejected("/in/b\udcff.bz2", 4, "truncated_dump"),
]


def test_every_record_comes_back_exactly_in_order_across_row_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(extracted, "ROW_GROUP_CHARS", 1_000)  # a row group ends with each long document
    path = tmp_path / "text" / "u.parquet"
    assert list(keep(iter(RECORDS), str(path))) == RECORDS  # passed through as they come
    assert list(kept_records(str(path))) == RECORDS
    pf = pq.ParquetFile(path)
    assert [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)] == [1, 4, 1]
    assert pf.metadata.row_group(0).column(4).compression == "ZSTD"
    assert [p.name for p in path.parent.iterdir()] == ["u.parquet"]


def test_an_empty_unit_keeps_an_empty_file(tmp_path):
    path = str(tmp_path / "u.parquet")
    assert list(keep(iter([]), path)) == [] and list(kept_records(path)) == []


@pytest.mark.parametrize("stop", ["closed", "failed"])
def test_a_reader_that_stops_early_leaves_nothing(tmp_path, stop):
    """A consumer that stops (a generator closed) or a reader that raises midway: no file at the path, no
    temporary file beside it."""

    def failing():
        yield RECORDS[0]
        raise OSError("disk gone")

    path = str(tmp_path / "u.parquet")
    if stop == "closed":
        gen = keep(iter(RECORDS), path)
        assert next(gen) == RECORDS[0]
        gen.close()
    else:
        with pytest.raises(OSError, match="disk gone"):
            list(keep(failing(), path))
    assert list(tmp_path.iterdir()) == []
