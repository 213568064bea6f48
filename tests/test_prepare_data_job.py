"""`jobs/prepare_data.py` as users run it: the full shared corpus end to end on a real local Ray, re-run no-op,
a killed run resumed to the same bytes, and bad input exiting with one clear line."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest


def _cmd(repo_root, *args):
    return [sys.executable, str(repo_root / "jobs" / "prepare_data.py"), *map(str, args)]


def _env():
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.update(RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0")
    return env


def _run(repo_root, *args, timeout=600):
    return subprocess.run(
        _cmd(repo_root, *args), capture_output=True, text=True, env=_env(), timeout=timeout, cwd=repo_root
    )


def _assert_clean_error(p, pattern):
    assert p.returncode != 0, p.stdout + p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("prepare_data: error:") and pattern in last, last


def _shard_hashes(out):
    return [hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((out / "shards").iterdir())]


def test_missing_path(repo_root, tmp_path):
    p = _run(repo_root, "--input", tmp_path / "nope", "--output", tmp_path / "out")
    _assert_clean_error(p, "does not exist")
    assert len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_missing_vocab(repo_root, shared_dir, tmp_path):
    p = _run(
        repo_root,
        "--input",
        shared_dir / "corpora/books/08_Ruth.txt",
        "--output",
        tmp_path / "o",
        "--vocab",
        tmp_path / "v.txt",
    )
    _assert_clean_error(p, "vocabulary")
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_corpus_with_no_usable_document(repo_root, minilm_dir, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "empty.txt").write_text("   \n")
    (bad / "bin.txt").write_bytes(bytes(range(256)) * 4)
    (bad / "w.jsonl").write_text('{"text": null}\n{oops\n')
    (bad / "t.txt.gz").write_bytes(gzip.compress(b"text " * 10000)[:100])
    p = _run(repo_root, "--input", bad, "--output", tmp_path / "o", "--vocab", minilm_dir / "vocab.txt")
    _assert_clean_error(p, "no usable document")
    assert "5 read" in p.stderr and "binary=1" in p.stderr and "truncated_gzip=1" in p.stderr
    assert not (tmp_path / "o" / "manifest.json").exists()


@pytest.mark.slow
def test_full_corpus_end_to_end_rerun_and_killed_resume(repo_root, shared_dir, minilm_dir, tmp_path):
    corpora, vocab = shared_dir / "corpora", minilm_dir / "vocab.txt"
    common = ["--vocab", vocab, "--data.chunk_chars", "200000", "--num-cpus", "2"]
    # 1. the whole shared corpus, 2 actors
    ref = tmp_path / "ref"
    p = _run(
        repo_root,
        "--input",
        corpora / "books",
        "--input",
        corpora / "wiki",
        "--output",
        ref,
        *common,
        "--data.num_actors",
        "2",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.loads((ref / "manifest.json").read_text())
    assert m["documents_read"] == m["documents_written"] == 549 and m["documents_rejected"] == 0
    assert m["examples"] > 20_000 and abs(m["nsp_random_fraction"] - 0.5) <= 0.03
    assert "examples" in p.stdout and "nsp random fraction" in p.stdout and "shards" in p.stdout
    assert sorted(os.listdir(ref)) == [
        "duplicates.jsonl",
        "manifest.json",
        "shards",
        "tokenizer.json",
        "vocab.meta.json",
        "vocab.txt",
    ]
    # 2. re-run: nothing to do
    p = _run(repo_root, "--input", corpora / "books", "--input", corpora / "wiki", "--output", ref, *common)
    assert p.returncode == 0 and "is up to date" in p.stdout, p.stderr[-2000:]
    assert json.loads((ref / "manifest.json").read_text()) == m
    # 3. a run on Ray (1 actor) killed mid-way, then resumed: the same bytes as the reference (in-process: small)
    out = tmp_path / "killed"
    args = [
        "--input",
        corpora / "books",
        "--input",
        corpora / "wiki",
        "--output",
        out,
        *common,
        "--data.num_actors",
        "1",
        "--data.local_max_bytes",
        "0",
    ]
    proc = subprocess.Popen(
        _cmd(repo_root, *args),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(),
        cwd=repo_root,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if len(list(out.glob("_work/*/tok/*.done.json"))) >= 8:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run finished before it could be killed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the job and every process it started (its own local Ray)
        proc.wait()
    assert not (out / "manifest.json").exists()
    p = _run(repo_root, *args)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resuming" in p.stderr
    assert _shard_hashes(out) == _shard_hashes(ref)
    assert json.loads((out / "manifest.json").read_text())["config_hash"] == m["config_hash"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_trained_vocab_and_shards_identical_in_independent_runs(repo_root, shared_dir, tmp_path, kind):
    """Two separate jobs (each its own Ray, its own hash seeds) training a vocabulary of each kind: the same bytes,
    and the manifest says which kind, with its report."""
    books = shared_dir / "corpora/books"
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        p = _run(
            repo_root,
            "--input",
            books / "08_Ruth.txt",
            "--input",
            books / "31_Obad.txt",
            "--input",
            books / "57_Phmn.txt",
            "--output",
            out,
            "--vocab-size",
            "1500",
            "--num-cpus",
            "2",
            "--tokenizer",
            kind,
        )
        assert p.returncode == 0, p.stderr[-3000:]
    a, b = outs
    t = json.loads((a / "manifest.json").read_text())["tokenizer"]
    assert t["kind"] == kind and t["trained"] and (kind == "wordpiece" or t["vocab_size"] % 64 == 0)
    assert t["report"]["fertility"] >= 1 and (kind != "bpe" or t["report"]["unknown_rate"] == 0)
    assert "tokenizer   " in p.stdout and f"{kind}, {t['vocab_size']} tokens" in p.stdout
    for name in ("vocab.txt", "tokenizer.json", "vocab.meta.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert _shard_hashes(a) == _shard_hashes(b) and len(_shard_hashes(a)) >= 1


@pytest.mark.slow
def test_second_concurrent_preparation_fails_at_once(repo_root, shared_dir, minilm_dir, tmp_path):
    """While another preparation holds the output's lock (this process holds it, a real `flock` through
    `pipeline.storage.io.output_lock`, as a running job's driver does), a real job on that output exits 1 at once
    with one line naming the directory and the holder's pid, and writes nothing. Once the lock is free the same
    command takes it itself (the lock file names its pid while it runs) and writes a complete, valid dataset with
    nothing half-written beside it. (A first job on Ray held the lock here before: a Ray start for one line.)"""
    from pipeline.data.dataset import validate_output
    from pipeline.storage.io import output_lock

    out = tmp_path / "out"
    args = [
        "--input",
        shared_dir / "corpora/books/08_Ruth.txt",
        "--input",
        shared_dir / "corpora/books/41_Mark.txt",
        "--output",
        out,
        "--vocab",
        minilm_dir / "vocab.txt",
        "--num-cpus",
        "2",
    ]
    with output_lock(str(out)):
        t0 = time.time()
        second = _run(repo_root, *args)
        took = time.time() - t0
        _assert_clean_error(second, f"output {out} is being written by another preparation (pid {os.getpid()} on ")
        assert len(second.stderr.strip().splitlines()) == 1 and took < 60, (took, second.stderr)
        assert os.listdir(out) == [".lock"]  # the refused job wrote nothing
    first = subprocess.Popen(
        _cmd(repo_root, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=repo_root
    )
    held = False
    try:
        while first.poll() is None:
            with contextlib.suppress(OSError):
                held = held or (out / ".lock").read_text().startswith(f"pid {first.pid} on ")
            time.sleep(0.02)
        stdout, stderr = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, stderr[-3000:]
    assert held  # the job took the output's lock while it wrote
    assert sorted(os.listdir(out)) == [
        "duplicates.jsonl",
        "manifest.json",
        "shards",
        "tokenizer.json",
        "vocab.meta.json",
        "vocab.txt",
    ]
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name]
    assert validate_output(str(out))["documents_written"] == 2


def test_a_local_preparation_imports_neither_ray_nor_torch_nor_pandas(repo_root, shared_dir, minilm_dir, tmp_path):
    """What a small preparation pays at start-up: the job on one book, run through runpy in a fresh
    interpreter, then the modules it loaded. torch (~1.2 s, via model/__init__) and pandas (~0.2 s, via
    pyarrow's pa.array, pq.read_table and to_numpy) once were; ray is not needed without Ray work."""
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['prepare_data.py', '--input', {str(shared_dir / 'corpora/books/08_Ruth.txt')!r}, "
        f"'--output', {str(tmp_path / 'out')!r}, '--vocab', {str(minilm_dir / 'vocab.txt')!r}]\n"
        "try:\n    runpy.run_path('jobs/prepare_data.py', run_name='__main__')\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "print('LOADED', sorted(m for m in ('ray', 'torch', 'pandas', 'mlflow') if m in sys.modules))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=repo_root, timeout=300
    )
    assert p.returncode == 0, p.stderr
    assert "LOADED []" in p.stdout, p.stdout[-500:]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["examples"] > 0


@pytest.fixture()
def full_disk(tmp_path):
    """A real 144 KiB tmpfs (36 pages) mounted on a temporary directory, unmounted at teardown; skipped where
    this process may not mount (not root, or a container without CAP_SYS_ADMIN)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={36 * 4096}", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_disk_full_is_one_line_and_a_moved_output_resumes_to_the_same_bytes(repo_root, shared_dir, tmp_path, full_disk):
    """The disk fills up while the shards are written: one line naming the operation and the file, no traceback.
    The unfinished output, moved to a disk with room (another path, as a shared mount seen elsewhere), resumes
    its finished units (the `_work` records hold paths relative to the output) and gives the clean run's bytes."""
    books = shared_dir / "corpora/books"
    args = [
        "--input",
        books / "08_Ruth.txt",
        "--input",
        books / "31_Obad.txt",
        "--input",
        books / "32_Jonah.txt",
        "--vocab-size",
        "600",
        "--data.num_shards",
        "4",
    ]
    clean = tmp_path / "clean"
    assert _run(repo_root, *args, "--output", clean).returncode == 0
    out = full_disk / "out"
    p = _run(repo_root, *args, "--output", out)
    _assert_clean_error(p, f"prepare_data: error: no space left on device writing {out}/shards/shard-0000")
    assert re.search(r"/shard-0000\d-of-00004\.parquet \(log: /\S+\.log\)$", p.stderr)  # the file, not a temporary name
    assert len(list(out.glob("_work/*/tok/*.done.json"))) == 3 and not (out / "manifest.json").exists()
    assert not list(out.rglob(".*.tmp-*"))  # the failed write's temporary file is gone: its space is free again

    moved = tmp_path / "moved"
    shutil.move(out, moved)
    p = _run(repo_root, *args, "--output", moved)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resuming, 3 already done" in p.stderr
    assert _shard_hashes(moved) == _shard_hashes(clean)


def test_broken_symlinks_in_an_input_folder_are_printed_and_in_the_manifest(repo_root, shared_dir, tmp_path):
    """A dangling symlink and a symlink loop beside a book: the job reads the book, prints each skipped link
    with its reason and lists both in the manifest's skipped_files (about 2 s)."""
    src = tmp_path / "in"
    src.mkdir()
    shutil.copyfile(shared_dir / "corpora/books/08_Ruth.txt", src / "08_Ruth.txt")
    os.symlink("/nonexistent/gone.txt", src / "dangling.txt")
    os.symlink("loop.txt", src / "loop.txt")
    p = _run(repo_root, "--input", src, "--output", tmp_path / "out", "--vocab-size", "600")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert f"skipped {src}/dangling.txt: dangling symlink (to /nonexistent/gone.txt)" in p.stderr
    assert f"skipped {src}/loop.txt: symlink loop" in p.stderr
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["skipped_files"] == [
        {"path": f"{src}/dangling.txt", "reason": "dangling symlink (to /nonexistent/gone.txt)"},
        {"path": f"{src}/loop.txt", "reason": "symlink loop"},
    ]
    assert m["input_files"] == 1 and m["documents_written"] == 1


# ---------------------------------------------------------------------------------------------- malformed input


def _xml_dump(lang: str, texts: list[str], damage=lambda page, k: page) -> bytes:
    """A MediaWiki dump of one article per text; `damage(page_xml, k)` may spoil page k."""
    import html

    pages = [
        damage(
            f"  <page>\n    <title>{lang} {k}</title>\n    <ns>0</ns>\n    <id>{k + 1}</id>\n"
            f"    <revision><id>9</id><text>{html.escape(t, quote=False)}</text></revision>\n  </page>\n",
            k,
        )
        for k, t in enumerate(texts)
    ]
    return ("<mediawiki>\n" + "".join(pages) + "</mediawiki>\n").encode()


def _damaged_folder(root, fuzz):
    """Every kind of damaged file fuzzing found (bench/data/fuzz_readers.py), beside good ones, each text distinct.
    Returns (documents that must be written, rejection reasons, {path: the start of its skipped reason})."""
    import bz2

    recs = fuzz._records(28, 1500)
    good, bad = root / "good", root / "bad"
    (good / "AA").mkdir(parents=True)
    (bad / "AB").mkdir(parents=True)
    (good / "ruth.txt").write_bytes((fuzz.CORPORA / "books/08_Ruth.txt").read_bytes())
    (good / "w.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[0:6]))
    (good / "AA" / "wiki_00").write_text("".join(fuzz._doc_block(r) for r in recs[6:12]))
    sample = fuzz.CORPORA / "wikidump/enwiki-sample-pages-articles.xml"
    (good / "enwiki-pages-articles.xml").write_bytes(sample.read_bytes())
    (good / "p.parquet").write_bytes(fuzz._parquet(recs[12:18]))
    # Parquet: a footer that is not Parquet's; a string value that is not UTF-8
    (bad / "footer.parquet").write_bytes(fuzz._parquet(recs[18:20])[:-4] + b"PAR2")
    (bad / "utf8.parquet").write_bytes(fuzz._parquet(recs[20:22]).replace(b"Python", b"Pyth\xff\xfe", 1))
    assert b"Pyth\xff" in (bad / "utf8.parquet").read_bytes()
    # JSON nested 1,000 deep; a lone surrogate
    (bad / "deep.jsonl").write_text(
        "\n".join(
            [
                json.dumps(recs[22]),
                "[" * 1000 + "]" * 1000,
                '{"text": "A lone \\ud800 surrogate."}',
                json.dumps(recs[23]),
            ]
        )
        + "\n"
    )
    # WikiExtractor <doc> blocks: no `>`, `</DOC>` (read), `</dco>` (unterminated), cut inside the last
    blocks = [fuzz._doc_block(r) for r in recs[24:28]]
    blocks[0] = blocks[0].replace('">\n', '"\n', 1)
    blocks[1] = blocks[1].replace("</doc>", "</DOC>")
    blocks[2] = blocks[2].replace("</doc>", "</dco>")
    (bad / "AB" / "wiki_00").write_text("".join(blocks[:3]) + blocks[3][:300])
    texts = [
        f"Article {k} of the {{lang}} dump tells of {w}. " * 8
        for k, w in enumerate(["rivers", "mountains", "cities", "forests", "deserts", "islands"])
    ]
    # a .xml.gz whose deflate data is damaged half-way; a dump of unparsable, nested, hostile and cut pages
    gz = bytearray(gzip.compress(_xml_dump("de", [t.format(lang="de") for t in texts]), mtime=0))
    gz[len(gz) // 2 : len(gz) // 2 + 40] = bytes(b ^ 0x5A for b in gz[len(gz) // 2 : len(gz) // 2 + 40])
    (bad / "dewiki-pages-articles.xml.gz").write_bytes(bytes(gz))
    spoil = {
        1: lambda p: p.replace("</text>", " a < b</text>"),
        2: lambda p: p.replace("<title>", "<page>\n<title>"),
        3: lambda p: p.replace("<ns>0</ns>", "<ns>1.5</ns>"),
        4: lambda p: p.replace("<text>", "<text>" + "{{a|" * 5000),
    }
    fr = _xml_dump("fr", [t.format(lang="fr") for t in texts], lambda p, k: spoil.get(k, lambda p: p)(p))
    (bad / "frwiki-pages-articles.xml").write_bytes(fr[: fr.rindex(b"<revision>")])  # the last page cut
    # a multistream dump whose index is a truncated .bz2
    dump, index = fuzz.multistream(_xml_dump("es", [t.format(lang="es") for t in texts]))
    (bad / "eswiki-20990101-pages-articles-multistream.xml.bz2").write_bytes(dump)
    index_path = bad / "eswiki-20990101-pages-articles-multistream-index.txt.bz2"
    index_path.write_bytes(bz2.compress(index)[:40])
    (bad / "notes.bz2").write_text("Plain words under a .bz2 name.")
    written = 1 + 6 + 6 + 4 + 6 + 1 + 2 + 1 + 2 + 6  # good files; utf8.parquet, deep.jsonl, AB, fr, es
    reasons = {
        "wiki_redirect": 3,
        "wiki_namespace": 4,
        "invalid_utf8": 1,
        "invalid_json": 1,
        "lone_surrogate": 1,
        "bad_doc_tag": 1,
        "unterminated_doc": 1,
        "truncated_doc": 1,
        "unparsable_page": 2,
        "unterminated_page": 1,
        "markup_budget": 1,
        "truncated_page": 1,
    }
    skipped = {
        bad / "footer.parquet": "unreadable: pyarrow.lib.ArrowInvalid: Parquet magic bytes not found",
        bad / "dewiki-pages-articles.xml.gz": "unreadable: zlib.error: Error -3 while decompressing data",
        index_path: "damaged index, its dump read whole: EOFError",
        bad / "notes.bz2": "unknown format",
    }
    return written, reasons, {str(k): v for k, v in skipped.items()}


def test_a_folder_of_damaged_files_beside_good_ones_is_prepared(repo_root, minilm_dir, tmp_path):
    """Five bad files beside three good ones once gave exit 1 (`internal error: error: Error -3 while
    decompressing data`), naming no file, and no output at all. Now: exit 0, every good document written, every
    damaged file named or its records rejected with reasons, documents_read what the files hold (issue 38)."""
    fuzz = _load_fuzz()
    written, reasons, skipped = _damaged_folder(tmp_path / "in", fuzz)
    start = time.perf_counter()
    p = _run(
        repo_root,
        "--input",
        tmp_path / "in",
        "--output",
        tmp_path / "out",
        "--vocab",
        minilm_dir / "vocab.txt",
        "--data.dedup",
        "exact",
    )
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert time.perf_counter() - start < 120
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["documents_written"] == written and m["rejected_reasons"] == reasons
    assert m["documents_read"] == written + sum(reasons.values()) == m["documents_written"] + m["documents_rejected"]
    named = {s["path"]: s["reason"] for s in m["skipped_files"]}
    assert len(named) == len(m["skipped_files"])  # each file once: the damaged index was named twice (issue 59)
    assert named.keys() == skipped.keys()
    for path, reason in skipped.items():
        assert named[path].startswith(reason), (path, named[path])
        if reason != "unknown format":
            assert f"skipped {path}: {named[path]}" in p.stderr  # printed as it is found


def _load_fuzz():
    from conftest import load_bench

    return load_bench("fuzz_readers")


@pytest.mark.parametrize(
    ("name", "error"),
    [
        (
            "p.parquet",
            "no usable document in 1 input file(s) (0 read: no records; skipped 1: {path} (unreadable: "
            "pyarrow.lib.ArrowInvalid: Parquet magic bytes not found in footer.",
        ),
        (
            "enwiki-pages-articles.xml.gz",
            "no readable input file under {path} (skipped 1: {path} (unreadable: zlib.error: "
            "Error -3 while decompressing data",
        ),
    ],
)
def test_a_broken_file_named_alone_is_one_line_naming_it(repo_root, minilm_dir, tmp_path, name, error):
    """Such a file killed the job as an internal error naming no file; now one line names it and why."""
    fuzz = _load_fuzz()
    path = tmp_path / name
    if name.endswith(".parquet"):
        path.write_bytes(fuzz._parquet(fuzz._records(2))[:-4] + b"PAR2")
    else:
        gz = bytearray(gzip.compress(_xml_dump("en", ["Some text. " * 50] * 3), mtime=0))
        gz[10:] = bytes(b ^ 0x5A for b in gz[10:])
        path.write_bytes(bytes(gz))
    p = _run(repo_root, "--input", path, "--output", tmp_path / "out", "--vocab", minilm_dir / "vocab.txt")
    _assert_clean_error(p, error.format(path=path))
    last = p.stderr.strip().splitlines()[-1]
    assert [line for line in p.stderr.splitlines() if line.startswith("prepare_data:")] == [last]
