"""The driver and its executors without Ray (pipeline/data/prepare.py, executors.py): the planner's big-file batches
on local workers give the chunks, pool and stats `tokenize_file` gives; results come back in call order with a
bounded number in flight; partial work is keyed by the vocabulary."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pipeline.config import DataConfig
from pipeline.data.executors import LocalExecutor
from pipeline.data.prepare import discard_other_work, tokenize_pass, work_dir
from pipeline.data.sources import expand_inputs
from pipeline.data.tokenizer import load_tokenizer
from pipeline.storage.io import write_bytes_atomic
from conftest import load_bench


@pytest.fixture(scope="module")
def prepared_vocab(minilm_dir, tmp_path_factory):
    """An output directory holding the MiniLM vocabulary pair, as the vocab stage leaves it."""
    from pipeline.data.tokenizer import sha256_bytes

    out = tmp_path_factory.mktemp("out")
    for name in ("vocab.txt", "tokenizer.json"):
        (out / name).write_bytes((minilm_dir / name).read_bytes())
    return out, sha256_bytes((out / "vocab.txt").read_bytes())


def _stats_without_paths(stats):
    return [
        {k: v for k, v in s.items() if k not in ("chunks", "pool", "file")}
        | {"chunks": [{k: v for k, v in c.items() if k != "path"} for c in s["chunks"]]}
        for s in stats
    ]


@pytest.mark.parametrize("workers", [1, 2])
def test_big_file_batches_on_workers_equal_whole_files(shared_dir, prepared_vocab, tmp_path, capfd, workers):
    """Two workers: Genesis and Exodus (over two batches each) are read by the driver and their batches encoded
    on the workers; one worker: every file whole. Chunks, pool files and stats are byte-identical to
    `tokenize_file` in this process."""
    from pipeline.data.passes import tokenize_file

    out, sha = prepared_vocab
    books = [str(shared_dir / "corpora/books" / b) for b in ("01_Ge.txt", "08_Ruth.txt", "02_Exo.txt")]
    files, _ = expand_inputs(books)
    cfg = DataConfig(
        inputs=books,
        output=str(out),
        chunk_chars=60_000,
        max_document_chars=25_000,
        random_pool_size=100,
        num_actors=workers,
    )
    ref_work = str(tmp_path / "ref")
    tok = load_tokenizer(out / "vocab.txt")
    ref = [tokenize_file(f, tok, cfg, ref_work) for f in files]
    work = str(tmp_path / "work")
    with LocalExecutor(workers, (str(out / "tokenizer.json"), dataclasses.asdict(cfg), work, sha)) as ex:
        got = tokenize_pass(ex, files, cfg, work)
    split = [line for line in capfd.readouterr().err.splitlines() if "batches across the workers" in line]
    assert [line.split(": ")[1] for line in split] == ([books[0], books[2]] if workers == 2 else [])
    assert _stats_without_paths(got) == _stats_without_paths(ref)
    assert ref[0]["pieces"] > ref[0]["documents_written"] and len(ref[0]["chunks"]) >= 3  # Genesis was cut
    names = sorted(p.name for p in (tmp_path / "ref" / "tok").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "work" / "tok").iterdir())
    for name in names:
        a, b = (tmp_path / "ref" / "tok" / name).read_bytes(), (tmp_path / "work" / "tok" / name).read_bytes()
        if name.endswith(".json"):  # done markers hold their paths
            a, b = json.loads(a)["tokens"], json.loads(b)["tokens"]
        assert a == b, name


def test_local_executor_results_in_call_order_with_bounded_reading(shared_dir, prepared_vocab, tmp_path):
    """`imap` hands back each call with its result in call order and reads at most per_worker calls per worker
    ahead of the results (a big file is not read into memory ahead of its encoding)."""
    out, sha = prepared_vocab
    cfg = DataConfig(inputs=["x"], output=str(out), num_shards=1)
    pulled = []

    def calls():
        for k in range(9):
            pulled.append(k)
            yield "shard", (str(tmp_path / f"s{k}.parquet"), []), k

    with LocalExecutor(2, (str(out / "tokenizer.json"), dataclasses.asdict(cfg), str(tmp_path), sha)) as ex:
        seen = []
        for call, result in ex.imap(calls()):
            assert len(pulled) - len(seen) <= ex.per_worker * ex.workers
            seen.append(call[2])
            assert result["path"].endswith(f"s{call[2]}.parquet") and result["rows"] == 0
    assert seen == list(range(9))


def test_vocabularies_never_mix(shared_dir, minilm_dir, tmp_path):
    """A vocabulary stage result holds only when vocab.txt, tokenizer.json and vocab.meta.json agree; partial
    work is keyed by the vocabulary and work from another one is discarded; a mismatched pair is refused."""
    from pipeline.data.stages import plan, run_vocab, vocab_done
    from pipeline.data.tokenizer import VocabError, check_pair

    out = tmp_path / "out"
    book = str(shared_dir / "corpora/books/08_Ruth.txt")
    p = plan(DataConfig(inputs=[book], output=str(out), vocab=None, vocab_size=300))
    v = run_vocab(p)
    assert vocab_done(p) == v
    # tokenizer.json of another vocabulary beside this vocab.txt (the meta still names vocab.txt): not done
    good_tj = (out / "tokenizer.json").read_bytes()
    (out / "tokenizer.json").write_bytes((minilm_dir / "tokenizer.json").read_bytes())
    assert vocab_done(p) is None
    with pytest.raises(VocabError, match=r"tokenizer.json holds a vocabulary with sha256 .* not that of"):
        check_pair(str(out / "vocab.txt"), str(out / "tokenizer.json"), v["vocab_sha256"])
    (out / "tokenizer.json").write_bytes(good_tj)
    assert check_pair(str(out / "vocab.txt"), str(out / "tokenizer.json"), v["vocab_sha256"]).get_vocab_size() == 300
    # a deleted meta: the stage runs again (and rewrites all three files)
    (out / "vocab.meta.json").unlink()
    assert vocab_done(p) is None
    assert run_vocab(p) == v and vocab_done(p) == v
    # vocab.txt swapped under the preparation: refused by name
    (out / "vocab.txt").write_bytes((minilm_dir / "vocab.txt").read_bytes())
    with pytest.raises(VocabError, match=r"vocab.txt has sha256 .* the vocabulary changed"):
        check_pair(str(out / "vocab.txt"), str(out / "tokenizer.json"), v["vocab_sha256"])
    # partial work is keyed by the vocabulary; work of another (or another config) is removed, ours kept
    mine = work_dir(p.cfg, p.config_hash, v["vocab_sha256"])
    other = work_dir(p.cfg, p.config_hash, "0" * 64)
    assert mine != other
    for d in (mine, other):
        write_bytes_atomic(d + "/tok/f000000.done.json", b"{}")
    assert discard_other_work(str(out), mine) == [other.rsplit("/", 1)[-1]]
    assert sorted(x.name for x in (out / "_work").iterdir()) == [mine.rsplit("/", 1)[-1]]


# Shards of the six books + 60 wiki articles below, as prepared by the code before the dedup pass existed
# (commit c499024, `data_stages` in this process; sha256 of each shard): dedup off, or near on inputs without
# duplicates, must still write these bytes.
TODAYS_SHARDS = [
    "bfff3b2167e891a778621dca600d559ad1959058b984ddde17f64c88628c246f",
    "c7e30b89ad2fe389d1602a621b356c0a2bb34da7f1087f210a73d7b5672c8d1d",
    "4fa44d550c713c6067b409efc11a4dbf088bda6f80c50e9cb4aee10d46f47024",
    "0d3944feb0db653702777906a46e9dc48d1660b5933f6b1eff3614c49ba75a48",
]


@pytest.fixture(scope="module")
def corpus(small_corpus):
    return small_corpus


def _prepare(inputs, out, minilm_dir, **kw):
    from pipeline.runner.dag import run_graph
    from pipeline.data.stages import data_stages

    cfg = DataConfig(
        inputs=inputs,
        output=str(out),
        vocab=str(minilm_dir / "vocab.txt"),
        **{"num_shards": 4, "chunk_chars": 60_000, "max_document_chars": 20_000, "num_actors": 1, **kw},
    )
    return run_graph(data_stages(cfg), remote=False, log=lambda m: None)


@pytest.mark.parametrize("dedup", ["off", "near"])
def test_dedup_off_or_nothing_found_writes_todays_shards(corpus, minilm_dir, tmp_path, dedup):
    res = _prepare(corpus, tmp_path / "out", minilm_dir, dedup=dedup)
    m = res["validate"].result.manifest
    assert [s["sha256"] for s in m["shards"]] == TODAYS_SHARDS
    assert ("duplicates" in m) == (dedup == "near") and (tmp_path / "out" / "duplicates.jsonl").exists() == (
        dedup == "near"
    )
    if dedup == "near":
        assert m["duplicates"]["exact"] == m["duplicates"]["near"] == 0
        assert (tmp_path / "out" / "duplicates.jsonl").read_bytes() == b""


def test_dedup_drops_planted_copies_and_says_so(shared_dir, minilm_dir, tmp_path, capfd):
    """Ruth under a second name and a case/whitespace variant (exact), Obadiah with a 1% edit (near), a JSONL
    record repeating another: each dropped one counts as a rejection with its reason, is listed in
    duplicates.jsonl against the first in input order, and the manifest holds the file's sha256; 'exact' keeps
    the near copy."""
    import hashlib
    import random

    books = shared_dir / "corpora/books"
    inp = tmp_path / "in"
    inp.mkdir()
    ruth, obad = (books / "08_Ruth.txt").read_text(), (books / "31_Obad.txt").read_text()
    (inp / "a_ruth.txt").write_text(ruth)
    (inp / "b_obad.txt").write_text(obad)
    (inp / "c_ruth_copy.txt").write_text(ruth)
    (inp / "d_ruth_loud.txt").write_text(ruth.upper().replace("\n", "\n\n "))
    words = obad.split(" ")
    for i in random.Random(1).sample(range(len(words)), len(words) // 100):
        words[i] = "edited"
    (inp / "e_obad_edited.txt").write_text(" ".join(words))
    mark = (books / "41_Mark.txt").read_text()
    (inp / "f_records.jsonl").write_text(
        "".join(
            json.dumps({"id": i, "text": t}) + "\n"
            for i, t in [("m1", mark[:30_000]), ("m2", mark[30_000:]), ("m3", mark[:30_000])]
        )
    )
    res = _prepare([str(inp)], tmp_path / "near", minilm_dir, random_pool_size=500)
    m = res["validate"].result.manifest
    lines = [json.loads(x) for x in (tmp_path / "near" / "duplicates.jsonl").read_text().splitlines()]
    short = [(d["source"].rsplit("/", 1)[-1], d["doc"], d["kind"], d["duplicate_of"]["doc"]) for d in lines]
    assert short == [
        ("c_ruth_copy.txt", "c_ruth_copy.txt", "exact", "a_ruth.txt"),
        ("d_ruth_loud.txt", "d_ruth_loud.txt", "exact", "a_ruth.txt"),
        ("e_obad_edited.txt", "e_obad_edited.txt", "near", "b_obad.txt"),
        ("f_records.jsonl", "m3", "exact", "m1"),
    ]
    assert 0.8 <= lines[2]["similarity"] < 1 and lines[0]["similarity"] == 1.0
    assert all(d["duplicate_of"]["source"].endswith(("a_ruth.txt", "b_obad.txt", "f_records.jsonl")) for d in lines)
    assert m["rejected_reasons"] == {"duplicate": 3, "near_duplicate": 1}
    assert m["documents_read"] == 8 == m["documents_written"] + m["documents_rejected"] and m["documents_written"] == 4
    data = (tmp_path / "near" / "duplicates.jsonl").read_bytes()
    assert m["duplicates"] == {
        "path": "duplicates.jsonl",
        "sha256": hashlib.sha256(data).hexdigest(),
        "exact": 3,
        "near": 1,
    }
    assert "3 exact and 1 near duplicates dropped" in capfd.readouterr().err
    exact = _prepare([str(inp)], tmp_path / "exact", minilm_dir, random_pool_size=500, dedup="exact")
    assert exact["validate"].result.manifest["rejected_reasons"] == {"duplicate": 3}


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("dedup", "fuzzy", "data.dedup 'fuzzy' is not one of off, exact, near"),
        ("dedup_threshold", 1.5, "data.dedup_threshold 1.5 is not in (0, 1]"),
        ("dedup_num_perm", 8, "data.dedup_num_perm 8 is not in [16, 1024]"),
    ],
)
def test_bad_dedup_values_name_the_field(field, value, message):
    from pipeline.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:  # as a user gives them: on the command line (the parser checks the type)
        load_config(None, [f"--data.{field}", str(value)])
    assert str(e.value) == message


def test_packed_documents_write_doc_lengths_and_keep_every_token(corpus, minilm_dir, tmp_path):
    """data.pack_documents: full rows of documents back to back, each piece [CLS] ... [SEP], their lengths in
    doc_lengths; the same text tokens as the unpacked preparation, in fewer rows."""
    import numpy as np
    import pyarrow.parquet as pq

    kw = dict(nsp=False, masking="dynamic", max_seq_length=256, short_seq_prob=0.0, dedup="off")
    packed = _prepare(corpus, tmp_path / "packed", minilm_dir, pack_documents=True, **kw)["validate"].result.manifest
    plain = _prepare(corpus, tmp_path / "plain", minilm_dir, **kw)["validate"].result.manifest
    t = pq.read_table([str(tmp_path / "packed" / s["path"]) for s in packed["shards"]])
    ids, lens = t.column("input_ids").to_pylist(), t.column("doc_lengths").to_pylist()
    assert all(sum(d) == len(r) == n <= 256 for r, d, n in zip(ids, lens, t.column("num_tokens").to_pylist()))
    starts = [np.cumsum([0, *d])[:-1] for d in lens]
    assert all(r[a] == 101 and r[a + n - 1] == 102 for r, s, d in zip(ids, starts, lens) for a, n in zip(s, d))
    pieces = sum(len(d) for d in lens)
    assert packed["tokens"] - 2 * pieces == plain["tokens"] - 2 * plain["examples"]  # every text token, once
    # rows are full but for the last of each unit (8 units) and those ended to avoid a piece under 16 tokens
    short = sum(n < 256 - 16 for n in t.column("num_tokens").to_pylist())
    assert short <= 8 and max(len(d) for d in lens) >= 3 and packed["examples"] < plain["examples"]
    plain_table = pq.read_table(str(tmp_path / "plain" / plain["shards"][0]["path"]))
    assert "doc_lengths" not in plain_table.column_names  # unpacked shards keep their columns (and bytes)


def test_sources_name_every_row_and_the_manifest_counts_each(corpus, minilm_dir, tmp_path):
    """data.sources: every row's `source` column is the source its chunks came from (a unit never spans two), the
    manifest holds each source's files, documents, rows and tokens (summing to the whole) and each shard's rows and
    tokens per source; packed rows too; the weights are not in the data's hash (the same shards serve any)."""
    import pyarrow.parquet as pq

    from pipeline.data.dataset import SOURCE_FIELD, PreparedDataset

    books, wiki = corpus[:-1], corpus[-1:]
    mix = [{"name": "books", "inputs": books, "weight": 3}, {"name": "wiki", "inputs": wiki, "weight": 1}]
    kw = dict(nsp=False, masking="dynamic", max_seq_length=128, dedup="off", sources=mix)  # inputs: theirs
    res = _prepare(corpus, tmp_path / "mix", minilm_dir, **kw)["validate"].result
    m = res.manifest
    got = {s["name"]: (s["input_files"], s["documents"], s["examples"], s["tokens"]) for s in m["sources"]}
    assert got["books"][0] == len(books) and got["wiki"][0] == 1 and got["wiki"][1] == 60
    assert (
        sum(v[1] for v in got.values()) == m["documents_written"] and sum(v[2] for v in got.values()) == m["examples"]
    )
    assert sum(v[3] for v in got.values()) == m["tokens"] and (
        m["sources"][0]["weight"],
        m["sources"][1]["weight"],
    ) == (3, 1)
    t = pq.read_table([str(tmp_path / "mix" / s["path"]) for s in m["shards"]])
    assert t.schema.field("source") == SOURCE_FIELD and set(t.column("source").to_pylist()) == {"books", "wiki"}
    for s in m["shards"]:
        shard = pq.read_table(str(tmp_path / "mix" / s["path"]))
        rows = {n: shard.column("source").to_pylist().count(n) for n in ("books", "wiki")}
        assert s["source_rows"] == {k: v for k, v in rows.items() if v} and sum(s["source_tokens"].values()) == sum(
            shard.column("num_tokens").to_pylist()
        )
    counts = res.source_counts(tuple(p for p, _ in res.shards))
    assert {k: (v["rows"], v["tokens"]) for k, v in counts.items()} == {k: v[2:] for k, v in got.items()}
    # books' rows hold books' text alone: its text tokens ([CLS] and [SEP] aside), each once, as books on their own
    alone = _prepare(books, tmp_path / "books", minilm_dir, **{**kw, "sources": [mix[0]]})["validate"].result.manifest
    assert alone["tokens"] - 2 * alone["examples"] == got["books"][3] - 2 * got["books"][2]
    reweighted = _prepare(
        corpus,
        tmp_path / "mix",
        minilm_dir,
        **{**kw, "sources": [{**mix[0], "weight": 1}, {**mix[1], "epochs": 2, "weight": None}], "mix_temperature": 0.5},
    )
    assert reweighted["validate"].result.manifest["config_hash"] == m["config_hash"]  # prepared once: done
    packed = _prepare(corpus, tmp_path / "packed", minilm_dir, **{**kw, "pack_documents": True})["validate"].result
    pt = pq.read_table([p for p, _ in packed.shards])
    assert pt.column_names[-2:] == ["doc_lengths", "source"] and PreparedDataset.load(packed.output).sources == [
        "books",
        "wiki",
    ]


def test_a_source_without_files_or_sharing_one_is_one_line(corpus, tmp_path):
    from pipeline.config import DataConfig
    from pipeline.data.sources import InputError
    from pipeline.data.stages import plan

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.bin").write_bytes(b"\x00\x01")
    cfg = DataConfig(
        sources=[{"name": "books", "inputs": corpus[:1]}, {"name": "news", "inputs": str(tmp_path / "empty")}],
        output=str(tmp_path / "out"),
    )
    with pytest.raises(InputError, match=r"^data.sources\[news\]: no readable input file under .*empty"):
        plan(cfg)
    both = DataConfig(
        sources=[{"name": "a", "inputs": corpus[:2]}, {"name": "b", "inputs": corpus[1:3]}],
        output=str(tmp_path / "out"),
    )
    with pytest.raises(InputError, match=r"^data.sources\[b\] and data.sources\[a\] both hold .*: a file is of one"):
        plan(both)


def test_pack_documents_needs_mlm_only_rows():
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError, match="data.pack_documents needs data.nsp false"):
        DataConfig(pack_documents=True)


# bench/data/wiki_dump.py's dump at 100 copies prepared by main's code before one read per document (5e49c2c, `_prepare`
# below with chunk_chars 200,000: 4 units): the shards' sha256, and duplicates.jsonl's (doc, kind, duplicate_of
# doc, similarity) rows as the sha256 of their JSON list (its sources are this run's paths).
DUMP_SHARDS = [
    "627b2529c63fea13fbfabb347ae8e7726c39c0795c2f34fa49d818ef814f2dbc",
    "8f312bf6527a70f9072b9980984739c1f4df4296536d3abad1df4ea06b423d60",
    "f693461a91b33cffccef125752a830f070939105a18d93a7c0dcb06975352021",
    "4ce9ba751163e561e695fc653700bb66dfb3a135c8489741dd7e688203b01a32",
]
DUMP_DUPLICATES = "7b9a243aa6a60e8c541e517bfa3a422b4912996d540ac1a89c888edb7a671c05"


def test_one_read_per_unit_resumed_after_a_crash_writes_todays_shards(minilm_dir, tmp_path, monkeypatch):
    """With dedup near, each unit of a multistream dump is decompressed and parsed once: by the dedup pass, which
    keeps its records for the tokenize pass (pipeline/data/extracted.py). A run killed in the tokenize pass
    resumes from the kept records (still one read per unit over both runs), removes each unit's records once its
    tokens are done and the work directory at the end, and writes the shards and duplicates main's code wrote."""
    import hashlib
    from collections import Counter

    from pipeline.data import passes, wiki

    dump = tmp_path / "dump"
    dump.mkdir()
    load_bench("wiki_dump").build_dump(dump, 100)
    reads: Counter[int] = Counter()
    read_pages = wiki.read_pages
    # units only (each starts past the dump's header stream): offset 0 is the whole file, which the vocab stage's
    # tokenizer report (issue 57) starts to read for its bounded sample, as vocab training reads its own
    monkeypatch.setattr(
        wiki,
        "read_pages",
        lambda path, offset=0, *a, **kw: (
            (reads.update([offset]) if offset else None) or read_pages(path, offset, *a, **kw)
        ),
    )
    finish = passes.FileMerge.finish
    calls = []

    def crash_at_the_second_unit(merge):
        calls.append(merge.f)
        if len(calls) == 2:
            raise RuntimeError("killed")
        return finish(merge)

    monkeypatch.setattr(passes.FileMerge, "finish", crash_at_the_second_unit)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="killed"):
        _prepare([str(dump)], out, minilm_dir, chunk_chars=200_000)
    [work] = (out / "_work").iterdir()
    units = sorted(p.name for p in (work / "dd").iterdir())
    assert len(units) == 4 and sorted(reads) == sorted(int(u.split("-o")[1].split(".")[0]) for u in units)
    done = {p.name.split(".")[0] for p in (work / "tok").glob("*.done.json")}
    kept = {p.name.split(".")[0] for p in (work / "text").iterdir()}
    assert len(done) == 1 and kept == {u.split(".")[0] for u in units} - done  # the done unit's records removed
    monkeypatch.setattr(passes.FileMerge, "finish", finish)
    m = _prepare([str(dump)], out, minilm_dir, chunk_chars=200_000)["validate"].result.manifest
    assert [s["sha256"] for s in m["shards"]] == DUMP_SHARDS
    lines = [json.loads(x) for x in (out / "duplicates.jsonl").read_text().splitlines()]
    rows = [(d["doc"], d["kind"], d["duplicate_of"]["doc"], d["similarity"]) for d in lines]
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest() == DUMP_DUPLICATES
    assert m["duplicates"]["exact"] == 26 and m["duplicates"]["near"] == 2 and m["documents_read"] == 1100
    assert set(reads.values()) == {1} and len(reads) == 4  # every unit read once over both runs
    assert not (out / "_work").exists()


def test_a_damaged_index_is_listed_once_in_skipped_files(minilm_dir, tmp_path):
    """Issue 59: a multistream dump's index cut short was named twice in the manifest's skipped_files (at planning,
    as an index with no input of its own, and by its reader, as damaged); now once, with the reader's reason, and
    the dump is read whole."""
    dump = tmp_path / "dump"
    dump.mkdir()
    wiki_dump = load_bench("wiki_dump")
    wiki_dump.build_dump(dump, 10)
    index = dump / wiki_dump.INDEX
    index.write_bytes(index.read_bytes()[:40])
    m = _prepare([str(dump)], tmp_path / "out", minilm_dir, dedup="off")["validate"].result.manifest
    assert [s["path"] for s in m["skipped_files"]] == [str(index)], m["skipped_files"]
    assert m["skipped_files"][0]["reason"].startswith("damaged index, its dump read whole: ")
    assert m["documents_read"] == 110
