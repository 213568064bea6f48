"""pipeline.data.stages (vocab -> shards -> validate) on a real local Ray cluster: byte-identical across executors, runs
and actor counts, up-to-date skips, config protection, validation, statistics of the written shards, dynamic masking at load time, trained vocab."""  # noqa: E501

from __future__ import annotations

import dataclasses
from collections import Counter
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline import cluster
from pipeline.config import DataConfig
from pipeline.runner.dag import Stage, run_graph
from pipeline.data.dataset import DataValidationError, PreparedDataset, read_manifest, validate_output
from pipeline.data.masking import mask_batch
from pipeline.data.prepare import OutputExistsError
from pipeline.data.stages import data_stages

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_local():
    """A private local Ray (2 CPUs) for this module. Unlike conftest's fixture it passes address="local", so it
    never joins a `ray start` cluster that happens to run on the machine (ray.init() would, and then refuse
    num_cpus)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()


ARTICLES = ("7697605", "7697611", "7697612", "7697626")  # the page ids of the shared wikidump sample's articles


@pytest.fixture(scope="module")
def inputs(small_corpus):
    return small_corpus


def _cfg(inputs, out, minilm_dir, **kw):
    base = dict(
        inputs=inputs,
        output=str(out),
        vocab=str(minilm_dir / "vocab.txt"),
        num_shards=4,
        chunk_chars=200_000,
        num_actors=1,
        local_max_bytes=0,
    )  # on Ray unless a test says otherwise
    return DataConfig(**{**base, **kw})


def _run(cfg, tmp, remote=False, extra=()):
    logs: list[str] = []
    res = run_graph(data_stages(cfg) + list(extra), remote=remote, log=logs.append)
    return res, logs


@pytest.fixture(scope="module")
def ray_prepared(ray_local, inputs, minilm_dir, tmp_path_factory):
    """The small corpus prepared on Ray by two actors (`a`), the reference of the module's comparisons: local
    workers (test_local_preparation_is_byte_identical_to_ray), one Ray actor (test_documents_cut_across_batches_
    count_once_on_every_path), two nodes (test_two_nodes_spread_the_work_and_write_the_same_bytes)."""
    tmp = tmp_path_factory.mktemp("dag")
    a, _ = _run(_cfg(inputs, tmp / "a", minilm_dir, num_actors=2), tmp)
    return tmp, a


def _bytes(v):
    return [open(path, "rb").read() for path, _ in v.shards]


@pytest.mark.parametrize("workers", [1, 2])
def test_local_preparation_is_byte_identical_to_ray(ray_prepared, inputs, minilm_dir, monkeypatch, capfd, workers):
    """Inputs up to data.local_max_bytes run without Ray: in the calling process, or on spawned local worker
    processes (one per LOCAL_WORKER_BYTES of input, here forced to two); the same shards as on Ray."""
    import pipeline.data.executors as executors
    import pipeline.data.progress as progress

    tmp, a = ray_prepared
    monkeypatch.setattr(executors, "LOCAL_WORKER_BYTES", 1 if workers == 2 else 10**12)
    monkeypatch.setattr(progress, "PROGRESS_EVERY_S", 0.0)  # a progress line after every unit but the last
    here, logs = _run(_cfg(inputs, tmp / f"here{workers}", minilm_dir, local_max_bytes=10**9, num_actors=2), tmp)
    assert _bytes(here["validate"].result) == _bytes(a["validate"].result)
    where = "on 2 local worker processes" if workers == 2 else "in this process"
    err = capfd.readouterr().err
    assert f"input file(s) {where}" in err
    n = len(inputs)  # no file is over two batches (chunk_chars 200k): all go whole
    assert [f"[data] tokenize: {k}/{n} whole files" in err for k in range(1, n + 1)] == [True] * (n - 1) + [False]
    assert "[data] shard: 1/4 units done" in err


_STATS = (
    "documents_read",
    "documents_written",
    "documents_rejected",
    "rejected_reasons",
    "examples",
    "tokens",
    "masked_tokens",
    "source_tokens",
    "document_pieces",
    "shards",
)


def test_documents_cut_across_batches_count_once_on_every_path(
    ray_local, inputs, minilm_dir, tmp_path, monkeypatch, capfd
):
    """Documents cut into pieces (max_document_chars) whose pieces fall into different batches (chunk_chars), the
    batches encoded on two local workers: the same shards and the same manifest figures (documents, pieces,
    tokens) as one Ray actor reading each file whole. (With test_local_preparation_is_byte_identical_to_ray's
    two actors: one Ray actor or two give the same bytes.)"""
    import pipeline.data.executors as executors

    kw = dict(chunk_chars=60_000, max_document_chars=20_000)
    on_ray, _ = _run(_cfg(inputs, tmp_path / "ray", minilm_dir, num_actors=1, **kw), tmp_path)
    assert "batches across the workers" not in capfd.readouterr().err
    monkeypatch.setattr(executors, "LOCAL_WORKER_BYTES", 1)
    local, _ = _run(_cfg(inputs, tmp_path / "local", minilm_dir, local_max_bytes=10**9, num_actors=2, **kw), tmp_path)
    assert "batches across the workers" in capfd.readouterr().err
    a, b = on_ray["validate"].result, local["validate"].result
    assert _bytes(a) == _bytes(b)
    assert a.config_hash == b.config_hash  # num_actors (1 here, 2 there) is not part of the output's identity
    assert {k: a.manifest[k] for k in _STATS} == {k: b.manifest[k] for k in _STATS}
    assert a.manifest["document_pieces"] > a.manifest["documents_written"]  # documents were cut
    m = a.manifest  # and each cut document still counts once
    assert (
        m["documents_read"] == m["documents_written"] + m["documents_rejected"] == 6 + 60
    )  # six books, 60 wiki articles (small_corpus)


def test_rerun_is_a_noop_and_says_up_to_date(ray_prepared, inputs, minilm_dir):
    tmp, a = ray_prepared
    before = {p.name: p.stat().st_mtime_ns for p in (tmp / "a" / "shards").iterdir()}
    res, logs = _run(_cfg(inputs, tmp / "a", minilm_dir), tmp)
    assert res["vocab"].status == "skipped" and res["shards"].status == "skipped"
    assert any("[stage shards] up to date" in line for line in logs)
    assert before == {p.name: p.stat().st_mtime_ns for p in (tmp / "a" / "shards").iterdir()}
    assert res["validate"].result.manifest_sha256 == a["validate"].result.manifest_sha256


def test_different_config_never_overwrites_silently(ray_prepared, inputs, minilm_dir):
    tmp, a = ray_prepared
    with pytest.raises(OutputExistsError, match="different config"):
        data_stages(_cfg(inputs, tmp / "a", minilm_dir, seed=99))
    assert validate_output(str(tmp / "a"))["config_hash"] == a["validate"].result.config_hash


def test_manifest_and_shard_statistics(ray_prepared):
    tmp, a = ray_prepared
    m = validate_output(str(tmp / "a"))
    assert (
        m["documents_read"] == m["documents_written"] + m["documents_rejected"] == 6 + 60
    )  # six books, 60 wiki articles (small_corpus)
    rows = [s["rows"] for s in m["shards"]]
    assert len(rows) == 4 and max(rows) - min(rows) <= 1 and sum(rows) == m["examples"]
    policy = PreparedDataset.load(str(tmp / "a")).policy()
    special, _, _ = policy.tables()
    t = pq.read_table([str(tmp / "a" / s["path"]) for s in m["shards"]][0])
    for s in m["shards"][1:]:
        import pyarrow as pa

        t = pa.concat_tables([t, pq.read_table(str(tmp / "a" / s["path"]))])
    ids = t.column("input_ids").to_pylist()
    pos = t.column("masked_lm_positions").to_pylist()
    lab = t.column("masked_lm_ids").to_pylist()
    nsp = np.array(t.column("next_sentence_label").to_pylist())
    assert t.column("num_tokens").to_pylist() == [len(x) for x in ids]
    assert max(len(x) for x in ids) <= 128 and sum(len(x) for x in ids) == m["tokens"] >= 100_000
    assert abs((nsp == 1).mean() - 0.5) <= 0.03 and set(nsp.tolist()) == {0, 1}
    assert abs(m["nsp_random_fraction"] - (nsp == 1).mean()) < 1e-9
    masked = sum(len(p) for p in pos)
    assert masked == m["masked_tokens"] and abs(masked / m["tokens"] - 0.15) <= 0.005
    n_mask = sum(int(ids[i][j] == policy.mask_token_id) for i in range(len(ids)) for j in pos[i])
    assert abs(n_mask / masked - 0.8) <= 0.02
    assert all(not special[x].any() for x in map(np.asarray, lab) if len(x))
    assert all(len(p) <= 20 for p in pos)
    assert len(set(t.column("example_id").to_pylist())) == len(ids)


def test_validation_detects_corruption(ray_prepared, tmp_path):
    tmp, _ = ray_prepared
    c = tmp_path / "c"
    shutil.copytree(tmp / "a", c)
    shard = sorted((c / "shards").iterdir())[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DataValidationError, match=rf"shard .*{shard.name}: sha256 differs"):
        validate_output(str(c))
    shard.unlink()
    with pytest.raises(DataValidationError, match="does not exist"):
        validate_output(str(c))
    (c / "manifest.json").unlink()
    with pytest.raises(DataValidationError, match="manifest.json does not exist"):
        read_manifest(str(c))


def test_dynamic_masking_remote_stages_and_downstream_interface(ray_local, shared_dir, minilm_dir, tmp_path):
    """Stages as Ray tasks, a downstream stage consuming "validate", and load-time masking through Ray Data."""
    inputs = [str(shared_dir / "corpora/books" / b) for b in ("08_Ruth.txt", "41_Mark.txt")]
    cfg = _cfg(inputs, tmp_path / "dyn", minilm_dir, masking="dynamic", whole_word_mask=True, num_shards=2)
    consumer = Stage("train", lambda deps: deps["validate"].examples, deps=("validate",))
    res, _ = _run(cfg, tmp_path, remote=True, extra=[consumer])
    v = res["validate"].result
    assert isinstance(v, PreparedDataset) and res["train"].result == v.examples > 0
    assert len(v.manifest_sha256) == 64 and len(v.vocab_sha256) == 64 and v.tokens > 0 and v.dynamic_masking
    assert [r for _, r in v.shards] and all(p.startswith(str(tmp_path)) for p, _ in v.shards)
    m = read_manifest(v.output)
    assert m["masked_tokens"] == 0 and m["masking"] == "dynamic"
    policy = v.policy()
    assert policy.whole_word and policy.mask_token_id == 103 and policy.vocab_size == 30522
    ds = cluster.read_parquet([p for p, _ in v.shards])  # as the pretraining job reads shards on Ray

    def masked(epoch):
        out, n_tok = {}, 0
        for batch in ds.iter_batches(batch_size=64, batch_format="numpy"):
            assert all(len(p) == 0 for p in batch["masked_lm_positions"])  # stored unmasked
            b = mask_batch(batch, policy, seed=cfg.seed, epoch=epoch)
            out.update((int(e), tuple(p)) for e, p in zip(b["example_id"], b["masked_lm_positions"]))
            n_tok += sum(len(x) for x in batch["input_ids"])
        return out, n_tok

    (e0, n_tok), (e1, _) = masked(0), masked(1)
    assert sum(e0[k] != e1[k] for k in e0) > 0.9 * len(e0)  # a fresh mask each epoch
    assert abs(sum(len(p) for p in e0.values()) / n_tok - 0.15) < 0.01
    # epoch 0 again, in other batches (another batch size): the same masks, example by example
    again = {}
    for batch in ds.iter_batches(batch_size=17, batch_format="numpy"):
        b = mask_batch(batch, policy, seed=cfg.seed, epoch=0)
        again.update((int(e), tuple(p)) for e, p in zip(b["example_id"], b["masked_lm_positions"]))
    assert again == e0


def test_trained_vocab_and_file_uri_output(ray_local, shared_dir, tmp_path):
    inputs = [str(shared_dir / "corpora/books" / b) for b in ("08_Ruth.txt", "57_Phmn.txt")]
    cfg = DataConfig(
        inputs=inputs,
        output=f"file://{tmp_path}/tv",
        vocab=None,
        vocab_size=800,
        num_shards=3,
        lowercase=False,
        num_actors=1,
        max_seq_length=64,
        nsp=False,
    )
    res, _ = _run(cfg, tmp_path)
    vocab = (tmp_path / "tv" / "vocab.txt").read_text().split("\n")[:-1]
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(vocab) <= 800 and "Boaz" in vocab
    assert (tmp_path / "tv" / "tokenizer.json").is_file() and not (tmp_path / "tv" / "_work").exists()
    m = validate_output(f"file://{tmp_path}/tv")
    assert m["nsp_random_fraction"] is None and m["vocab_size"] == len(vocab)
    t = pq.read_table(str(tmp_path / "tv" / m["shards"][0]["path"]))
    assert set(t.column("next_sentence_label").to_pylist()) == {-1}
    assert max(t.column("num_tokens").to_pylist()) <= 64
    again, _ = _run(dataclasses.replace(cfg), tmp_path)
    assert again["vocab"].status == "skipped" and again["shards"].status == "skipped"


def test_manifest_shard_paths_stay_inside_the_output(ray_prepared, tmp_path):
    """A manifest may only describe its own directory: absolute, URI and ../ shard paths are refused."""
    import json

    tmp, _ = ray_prepared
    c = tmp_path / "escape"
    shutil.copytree(tmp / "a", c)
    m = json.loads((c / "manifest.json").read_text())
    for bad in ("../elsewhere/x.parquet", "/etc/passwd", "s3://bucket/x.parquet", "shards/../../x.parquet"):
        m["shards"][0]["path"] = bad
        (c / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(DataValidationError, match="is not a relative path inside"):
            read_manifest(str(c))


def test_truncated_shard_is_one_line_naming_the_file(ray_prepared, tmp_path):
    from pipeline.storage.io import StorageError, read_table

    tmp, _ = ray_prepared
    c = tmp_path / "trunc"
    shutil.copytree(tmp / "a", c)
    shard = sorted((c / "shards").iterdir())[0]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(DataValidationError, match=rf"shard .*{shard.name} is not a readable Parquet file"):
        validate_output(str(c), checksums=False)
    with pytest.raises(StorageError, match=rf"{shard.name} is not a readable Parquet file"):
        read_table(str(shard))


def test_partial_work_from_another_vocabulary_is_never_resumed(ray_local, shared_dir, minilm_dir, tmp_path):
    """The issue-10 scenario: a killed run left token chunks of vocabulary A, vocab.meta.json was deleted, and
    the re-run has vocabulary B. The chunks of A are discarded; the shards equal a clean run's, byte for byte."""
    from pipeline.data.passes import tokenize_file
    from pipeline.data.prepare import work_dir
    from pipeline.data.stages import plan
    from pipeline.data.sources import expand_inputs
    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.storage.io import sha256_file

    inputs = [str(shared_dir / "corpora/books" / b) for b in ("08_Ruth.txt", "57_Phmn.txt")]

    def cfg(out):
        return DataConfig(
            inputs=inputs, output=str(out), vocab=None, vocab_size=800, num_shards=2, num_actors=1, chunk_chars=50_000
        )

    clean, _ = _run(cfg(tmp_path / "clean"), tmp_path)
    dirty = tmp_path / "dirty"
    p = plan(cfg(dirty))
    dirty.mkdir()
    for name in ("vocab.txt", "tokenizer.json"):  # vocabulary A, and no vocab.meta.json
        shutil.copy(minilm_dir / name, dirty / name)
    stale = work_dir(p.cfg, p.config_hash, sha256_file(str(dirty / "vocab.txt")))
    files, _ = expand_inputs(inputs)
    tokenize_file(files[0], load_tokenizer(minilm_dir / "vocab.txt"), p.cfg, stale)  # A's ids, marked done
    res, _ = _run(cfg(dirty), tmp_path)
    assert res["vocab"].status == "ran"
    assert (dirty / "vocab.txt").read_bytes() == (tmp_path / "clean" / "vocab.txt").read_bytes()
    assert _bytes(res["validate"].result) == _bytes(clean["validate"].result)
    assert not (dirty / "_work").exists()


def _planted(inputs, shared_dir, tmp_path):
    """The inputs plus planted duplicates: Ruth under another name (exact), Mark in capitals with its spaces
    doubled (exact after normalising), Mark with 1% of its words changed (near), and a multistream Wikipedia dump
    (with its index) of the shared sample's pages three times over under new page ids (the copies are exact
    duplicates of the first, in other streams)."""
    import bz2
    import html
    import random
    import re

    d = tmp_path / "planted"
    (d / "dump").mkdir(parents=True)
    books = shared_dir / "corpora/books"
    (d / "zz_ruth_again.txt").write_bytes((books / "08_Ruth.txt").read_bytes())
    mark = (books / "41_Mark.txt").read_text()
    (d / "zz_mark_shouted.txt").write_text(mark.upper().replace(" ", "  "))
    words = mark.split(" ")
    rng = random.Random(0)
    for i in rng.sample(range(len(words)), len(words) // 100):
        words[i] = "changed"
    (d / "zz_mark_edited.txt").write_text(" ".join(words))
    raw = (shared_dir / "corpora/wikidump/enwiki-sample-pages-articles.xml").read_bytes()
    starts = [m.start() for m in re.finditer(rb"  <page>", raw)]
    ends = [m.end() for m in re.finditer(rb"</page>\n", raw)]
    pages = [raw[a:b] for a, b in zip(starts, ends)]
    pages = [
        re.sub(rb"<id>(\d+)</id>", lambda m: b"<id>%d</id>" % (int(m.group(1)) + copy * 10**8), p, count=1)
        for copy in range(3)
        for p in pages
    ]
    streams = [raw[: starts[0]]] + [b"".join(pages[i : i + 4]) for i in range(0, len(pages), 4)] + [raw[ends[-1] :]]
    blobs = [bz2.compress(x) for x in streams]
    offsets = [sum(len(b) for b in blobs[:k]) for k in range(len(blobs))]
    ids = [re.search(rb"<id>(\d+)</id>", p).group(1).decode() for p in pages]
    titles = [html.unescape(re.search(rb"<title>(.*?)</title>", p).group(1).decode()) for p in pages]
    index = "".join(f"{offsets[1 + i // 4]}:{ids[i]}:{titles[i]}\n" for i in range(len(pages)))
    (d / "dump/enwiki-20990101-pages-articles-multistream.xml.bz2").write_bytes(b"".join(blobs))
    (d / "dump/enwiki-20990101-pages-articles-multistream-index.txt.bz2").write_bytes(bz2.compress(index.encode()))
    return [*inputs, str(d)]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_two_nodes_spread_the_work_and_write_the_same_bytes(inputs, shared_dir, repo_root, tmp_path, kind):
    """`jobs/prepare_data.py` on Ray (local_max_bytes 0) against a two-node cluster (1 CPU each), with planted
    duplicates and a multistream dump, training a vocabulary of each kind: the Ray state API shows that the dedup
    records, the batches of the big files (Genesis, Exodus: over two batches each), the whole small files and the
    dump's stream units, the examples units and the shards were each worked on both nodes; the dropped documents
    (duplicates.jsonl), vocab.txt, tokenizer.json, the shards and the manifest's checksums are byte-identical to
    the same command on local worker processes (no Ray). (Single-node Ray against local, with a given WordPiece:
    test_local_preparation_is_byte_identical_to_ray; the job on a private local Ray:
    tests/test_prepare_data_job.py's killed and resumed run.)"""
    import json
    import os
    import re
    import subprocess
    import sys

    from ray.util.state import list_nodes, list_tasks

    given = _planted(inputs, shared_dir, tmp_path)

    def prepare(out, env, on_ray=True):
        # chunk_chars 60k: Genesis and Exodus are over two batches (split across the actors), the dump is cut
        # into several units of ~15 kB of bz2 streams, and there are several example units
        cmd = [
            sys.executable,
            "jobs/prepare_data.py",
            *[a for p in given for a in ("--input", p)],
            "--output",
            str(out),
            "--tokenizer",  # trained on the driver, then used on both nodes
            kind,
            "--vocab-size",
            "1024",
            "--num-cpus",
            "2",
            "--data.local_max_bytes",
            "0" if on_ray else str(2**30),
            "--data.num_actors",
            "2",
            "--data.num_shards",
            "4",
            "--data.chunk_chars",
            "60000",
        ]
        r = subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert ("on 2 Ray actor(s)" in r.stderr) == on_ray  # locally: in its process (~1.4 MB, one worker)
        assert bool(re.search(r"01_Ge.txt: \d batches across the workers", r.stderr)) == on_ray
        assert "skipped " in r.stderr and "index of a multistream dump" in r.stderr
        return json.loads((out / "manifest.json").read_text())

    from conftest import dashboard_head

    two, dashboard = dashboard_head(num_cpus=1)  # the dashboard serves the state API
    try:
        two.add_node(num_cpus=1)
        two.wait_for_nodes()
        multi = prepare(tmp_path / "two", {**os.environ, "RAY_ADDRESS": two.address})
        state = f"http://127.0.0.1:{dashboard}"
        nodes = {n.node_id for n in list_nodes(address=state) if n.state == "ALIVE"}
        tasks = list_tasks(
            address=state, filters=[("state", "=", "FINISHED")], limit=10_000, raise_on_missing_output=False
        )
    finally:
        two.shutdown()
    assert len(nodes) == 2
    passes = ("sign", "encode", "tokenize", "examples", "shard")
    ran_on = {p: {t.node_id for t in tasks if t.name == f"_RayWorker.{p}"} for p in passes}
    assert ran_on == dict.fromkeys(passes, nodes), (ran_on, nodes)

    # Input order is sorted paths: the small corpus (one directory of the session's) comes before the planted
    # files (under this test's tmp_path), so the shared Ruth and Mark are kept and their planted copies dropped
    # (the shouted Mark is exact after normalising, the edited one near); the dump's second and third copies of
    # its 4 articles go.
    dups = (tmp_path / "two" / "duplicates.jsonl").read_text().splitlines()
    got = [
        (lambda d: (d["source"].rsplit("/", 1)[-1], d["doc"], d["kind"], d["duplicate_of"]["doc"]))(json.loads(x))
        for x in dups
    ]
    dump = "enwiki-20990101-pages-articles-multistream.xml.bz2"
    assert got == [(dump, str(c * 10**8 + int(a)), "exact", a) for c in (1, 2) for a in sorted(ARTICLES)] + [
        ("zz_mark_edited.txt", "zz_mark_edited.txt", "near", "41_Mark.txt"),
        ("zz_mark_shouted.txt", "zz_mark_shouted.txt", "exact", "41_Mark.txt"),
        ("zz_ruth_again.txt", "zz_ruth_again.txt", "exact", "08_Ruth.txt"),
    ]
    kinds = Counter(g[2] for g in got)
    assert multi["rejected_reasons"]["duplicate"] == kinds["exact"]
    assert multi["rejected_reasons"]["near_duplicate"] == kinds["near"]
    assert {s["reason"] for s in multi["skipped_files"]} == {"index of a multistream dump"}
    local = prepare(tmp_path / "local", {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, on_ray=False)
    for name in ("vocab.txt", "tokenizer.json"):
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    assert multi["tokenizer"]["kind"] == kind and multi["tokenizer"]["trained"]
    assert (tmp_path / "local" / "duplicates.jsonl").read_text().splitlines() == dups
    assert multi["shards"] == local["shards"] and multi["config_hash"] == local["config_hash"]
    assert multi["duplicates"] == local["duplicates"]
    for s in local["shards"]:
        assert (tmp_path / "two" / s["path"]).read_bytes() == (tmp_path / "local" / s["path"]).read_bytes()


def test_local_workers_do_not_rerun_the_callers_script(inputs, minilm_dir, tmp_path):
    """Spawned processes normally re-run the parent's __main__ first: a user's script without an
    `if __name__ == "__main__"` guard would start the preparation again in every worker. Here such a script
    prepares on two local workers once, and a script read from stdin (which cannot be re-run) works too."""
    script = (
        "import pipeline.data.executors as executors\n"
        "from pipeline.config import DataConfig\n"
        "from pipeline.runner.dag import run_graph\n"
        "from pipeline.data.stages import data_stages\n"
        "executors.LOCAL_WORKER_BYTES = 1\n"
        "print('SCRIPT RAN', flush=True)\n"
        f"cfg = DataConfig(inputs={inputs!r}, output=OUT, vocab={str(minilm_dir / 'vocab.txt')!r}, num_actors=2,\n"
        "                 chunk_chars=200_000, num_shards=4)\n"
        "print(run_graph(data_stages(cfg), remote=False, log=lambda m: None)['shards'].result['examples'])\n"
    )
    for how in ("file", "stdin"):
        code = script.replace("OUT", repr(str(tmp_path / f"out-{how}")))
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        if how == "file":
            (tmp_path / "unguarded.py").write_text(code)
            p = subprocess.run(
                [sys.executable, str(tmp_path / "unguarded.py")], capture_output=True, text=True, env=env, timeout=300
            )
        else:
            p = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        assert p.stdout.count("SCRIPT RAN") == 1, p.stdout
        assert "on 2 local worker processes" in p.stderr
        assert int(p.stdout.strip().splitlines()[-1]) > 1000
