"""The pass bodies without Ray (pipeline/data/passes.py, pool.py, arrow.py): balancing, Arrow round trips, atomic
writes on fsspec filesystems, the partition-independent random pool, and the per-file / per-chunk passes (resume
markers, determinism)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import DataConfig
from pipeline.data.masking import MaskingPolicy
from pipeline.data.dataset import SCHEMA
from pipeline.data.examples import group_consecutive
from pipeline.data.arrow import fixed_rows, list_array, list_rows
from pipeline.data.passes import (
    balanced_ranges,
    dedup_params,
    examples_for_chunks,
    shard_plan,
    sign_unit,
    tokenize_file,
    write_shard,
)
from pipeline.data.pool import merge_pool
from pipeline.storage.io import write_bytes_atomic, write_parquet_atomic
from pipeline.data.sources import expand_inputs
from pipeline.data.signing import records
from pipeline.data.tokenizer import load_tokenizer

from conftest import load_bench


def test_group_consecutive_covers_everything_in_order():
    sizes = [3, 50, 1, 1, 1, 7, 0, 2]
    groups = group_consecutive(sizes, 5)
    assert [i for g in groups for i in g] == list(range(len(sizes)))
    assert all(sum(sizes[i] for i in g) >= 5 for g in groups[:-1])
    assert all(sum(sizes[i] for i in g[:-1]) < 5 for g in groups)


@pytest.mark.parametrize("n,k", [(10, 3), (7, 7), (1000, 8), (12345, 16), (5, 1)])
def test_balanced_ranges(n, k):
    r = balanced_ranges(n, k)
    sizes = [b - a for a, b in r]
    assert len(r) == k and r[0][0] == 0 and r[-1][1] == n and max(sizes) - min(sizes) <= 1
    assert all(r[i][1] == r[i + 1][0] for i in range(k - 1))


def test_list_array_round_trip():
    rows = [np.array([1, 2, 3], np.int32), np.zeros(0, np.int32), np.array([7], np.int32)]
    arr = list_array(rows, pa.int32())
    assert arr.to_pylist() == [[1, 2, 3], [], [7]]
    assert [r.tolist() for r in list_rows(arr)] == [[1, 2, 3], [], [7]]
    assert [r.tolist() for r in list_rows(pa.chunked_array([arr.slice(1, 2)]))] == [[], [7]]


def test_atomic_writes_on_memory_filesystem():
    fs = fsspec.filesystem("memory")
    write_bytes_atomic("memory://atomic/x.json", b"{}")
    write_parquet_atomic("memory://atomic/t.parquet", pa.table({"a": [1, 2]}))
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls("/atomic", detail=False)) == ["t.parquet", "x.json"]
    with fs.open("/atomic/t.parquet", "rb") as f:
        assert pq.read_table(f).column("a").to_pylist() == [1, 2]


def test_shard_plan_and_streamed_shards_are_balanced(tmp_path):
    chunks = []
    k = 0
    for i, n in enumerate([5, 0, 17, 3, 40]):
        rows = [np.arange(k + j, k + j + 4, dtype=np.int32) for j in range(n)]
        t = pa.table(
            [
                list_array(rows, pa.int32()),
                list_array([np.zeros(4, np.int8)] * n, pa.int8()),
                list_array([np.zeros(0, np.int32)] * n, pa.int32()),
                list_array([np.zeros(0, np.int32)] * n, pa.int32()),
                pa.array([0] * n, pa.int8()),
                pa.array([4] * n, pa.int32()),
                pa.array(range(k, k + n), pa.int64()),
            ],
            schema=SCHEMA,
        )
        path = str(tmp_path / f"e{i}.parquet")
        write_parquet_atomic(path, t)
        chunks.append({"path": path, "rows": n})
        k += n
    plan = shard_plan(chunks, 4, str(tmp_path / "out"))
    results = [write_shard(p, parts) for p, parts in plan]
    sizes = [r["rows"] for r in results]
    assert sum(sizes) == 65 and max(sizes) - min(sizes) <= 1
    got = []
    for r in results:
        assert r["sha256"] == hashlib.sha256(open(r["path"], "rb").read()).hexdigest()
        md = pq.ParquetFile(r["path"])
        assert md.schema_arrow == SCHEMA and md.metadata.row_group(0).column(0).compression == "ZSTD"
        got += pq.read_table(r["path"]).column("example_id").to_pylist()
    assert got == list(range(65))  # contiguous, in order, nothing lost or duplicated
    assert len(shard_plan(chunks[:1], 8, str(tmp_path / "o2"))) == 5  # never more shards than rows
    assert not list((tmp_path / "out" / "shards").glob(".*tmp*"))


@pytest.fixture(scope="module")
def tokenized(minilm_dir, shared_dir, tmp_path_factory):
    work = str(tmp_path_factory.mktemp("work"))
    cfg = DataConfig(inputs=[], chunk_chars=20_000, random_pool_size=50)
    files, _ = expand_inputs(
        [str(shared_dir / "corpora/books" / b) for b in ("08_Ruth.txt", "31_Obad.txt", "41_Mark.txt")]
    )
    tok = load_tokenizer(minilm_dir / "vocab.txt")
    return cfg, files, tok, work, [tokenize_file(f, tok, cfg, work) for f in files]


def test_tokenize_file_chunks_and_resume_marker(tokenized):
    cfg, files, tok, work, stats = tokenized
    assert [s["documents_written"] for s in stats] == [1, 1, 1]
    assert len(stats[2]["chunks"]) == 1 and stats[2]["tokens"] > 10_000
    table = pq.read_table(stats[0]["chunks"][0]["path"])
    assert int(pa.compute.sum(table.column("sent_lens").combine_chunks().flatten()).as_py()) == stats[0]["tokens"]
    # a second call finds the done marker and does no work (the resume path)
    assert tokenize_file(files[0], None, cfg, work) == stats[0]


def test_pool_is_bottom_k_whatever_the_partitioning(tokenized):
    cfg, files, tok, work, stats = tokenized
    pools = [s["pool"] for s in stats]
    a = merge_pool(pools, 50)
    b = merge_pool(list(reversed(pools)), 50)
    assert len(a) == 50 and a.doc_ids.tolist() == b.doc_ids.tolist() and np.array_equal(a.tokens, b.tokens)
    assert len(set(a.doc_ids.tolist())) == 3  # windows from every document, not one neighbour


def test_examples_for_chunks_is_deterministic(tokenized, minilm_dir, tmp_path):
    cfg, files, tok, work, stats = tokenized
    pool = merge_pool([s["pool"] for s in stats], 50)
    policy = MaskingPolicy.from_vocab(minilm_dir / "vocab.txt")
    chunk = [stats[0]["chunks"][0]["path"], stats[2]["chunks"][0]["path"]]
    m1 = examples_for_chunks(chunk, pool, cfg, policy, 101, 102, str(tmp_path / "a" / "e0.parquet"))
    m2 = examples_for_chunks(chunk, pool, cfg, policy, 101, 102, str(tmp_path / "b" / "e0.parquet"))
    assert (tmp_path / "a" / "e0.parquet").read_bytes() == (tmp_path / "b" / "e0.parquet").read_bytes()
    assert m1["rows"] == m2["rows"] > 50 and m1["masked_tokens"] > 0
    t = pq.read_table(tmp_path / "a" / "e0.parquet")
    assert t.schema == SCHEMA and max(t.column("num_tokens").to_pylist()) <= cfg.max_seq_length
    random.seed(0)  # global random state plays no part
    assert examples_for_chunks(chunk, pool, cfg, policy, 101, 102, str(tmp_path / "a" / "e0.parquet")) == m1


def test_sign_unit_writes_the_records_of_its_documents(tmp_path):
    """Documents signed one at a time from the unit's reader: the rows are `records` of all the texts at once;
    a rejected record has none."""
    texts = ["The LORD said unto Moses, " * 50, "short", "the lord  SAID unto moses, " * 50]
    lines = [
        json.dumps({"id": "a", "text": texts[0]}),
        "not json",
        json.dumps({"text": texts[1]}),
        json.dumps({"id": "c", "text": texts[2]}),
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    files, _ = expand_inputs([str(tmp_path / "in.jsonl")])
    cfg = DataConfig(inputs=[], dedup_num_perm=64)
    t = pq.read_table(sign_unit(files[0], cfg, str(tmp_path / "s.parquet"))["path"])
    keys, sigs = records(texts, dedup_params(cfg))
    assert t.column("doc_id").to_pylist() == [0, 2, 3]
    assert t.column("name").to_pylist() == ["a", "in.jsonl:3", "c"]
    assert np.array_equal(np.stack([t.column("exact_hi").to_numpy(), t.column("exact_lo").to_numpy()], 1), keys)
    assert np.array_equal(fixed_rows(t.column("sig"), np.uint32), sigs)


def test_signing_one_big_document_is_bounded(shared_dir, tmp_path):
    """Issue 37: signing held ~20x a document (all its words and shingles at once): this 16 MB book took 410 MiB,
    a 100 MB one 2 GiB. A window at a time it holds the text and a constant (170 MiB measured, 76 MiB of it the
    imports): the child's largest RSS, sampled as bench/data/big_document_memory.py samples it, stays under a fixed
    cap."""
    bench = load_bench("big_document_memory")
    doc = tmp_path / "book.txt"
    bench.build_document(doc, 16)
    code = (
        "from pipeline.config import DataConfig; from pipeline.data.passes import sign_unit; "
        "from pipeline.data.sources import InputFile; "
        f"sign_unit(InputFile({str(doc)!r}, 'txt', 0), DataConfig(inputs=[]), {str(tmp_path / 's.parquet')!r})"
    )
    run = bench.run_sampled([sys.executable, "-c", code], env=dict(os.environ))
    assert run.returncode == 0, run.log
    assert len(pq.read_table(tmp_path / "s.parquet")) == 1
    assert run.sampler.peak_one < 280 * 2**20, f"{run.sampler.peak_one / 2**20:.0f} MiB"
