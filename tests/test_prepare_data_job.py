"""`jobs/prepare_data.py` as users run it: the full shared corpus end to end on a real local Ray, re-run no-op,
a killed run resumed to the same bytes, and bad input exiting with one clear line."""

from __future__ import annotations

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
    return subprocess.run(_cmd(repo_root, *args), capture_output=True, text=True, env=_env(), timeout=timeout,
                          cwd=repo_root)


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
    p = _run(repo_root, "--input", shared_dir / "corpora/books/08_Ruth.txt", "--output", tmp_path / "o",
             "--vocab", tmp_path / "v.txt")
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
    p = _run(repo_root, "--input", corpora / "books", "--input", corpora / "wiki", "--output", ref, *common,
             "--data.num_actors", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.loads((ref / "manifest.json").read_text())
    assert m["documents_read"] == m["documents_written"] == 549 and m["documents_rejected"] == 0
    assert m["examples"] > 20_000 and abs(m["nsp_random_fraction"] - 0.5) <= 0.03
    assert "examples" in p.stdout and "nsp random fraction" in p.stdout and "shards" in p.stdout
    assert sorted(os.listdir(ref)) == ["duplicates.jsonl", "manifest.json", "shards", "tokenizer.json", "vocab.meta.json", "vocab.txt"]
    # 2. re-run: nothing to do
    p = _run(repo_root, "--input", corpora / "books", "--input", corpora / "wiki", "--output", ref, *common)
    assert p.returncode == 0 and "is up to date" in p.stdout, p.stderr[-2000:]
    assert json.loads((ref / "manifest.json").read_text()) == m
    # 3. a run on Ray (1 actor) killed mid-way, then resumed: the same bytes as the reference (in-process: small)
    out = tmp_path / "killed"
    args = ["--input", corpora / "books", "--input", corpora / "wiki", "--output", out, *common, "--data.num_actors", "1",
            "--data.local_max_bytes", "0"]
    proc = subprocess.Popen(_cmd(repo_root, *args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=_env(), cwd=repo_root, start_new_session=True)
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
def test_trained_vocab_and_shards_identical_in_independent_runs(repo_root, shared_dir, tmp_path):
    """Two separate jobs (each its own Ray, its own hash seeds) training a vocabulary: the same bytes."""
    books = shared_dir / "corpora/books"
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        p = _run(repo_root, "--input", books / "08_Ruth.txt", "--input", books / "31_Obad.txt", "--input",
                 books / "57_Phmn.txt", "--output", out, "--vocab-size", "1500", "--num-cpus", "2")
        assert p.returncode == 0, p.stderr[-3000:]
    a, b = outs
    for name in ("vocab.txt", "tokenizer.json", "vocab.meta.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert _shard_hashes(a) == _shard_hashes(b) and len(_shard_hashes(a)) >= 1


@pytest.mark.slow
def test_second_concurrent_preparation_fails_at_once(repo_root, shared_dir, minilm_dir, tmp_path):
    """Two real jobs on one output: the second exits 1 at once with one line naming the directory and the first
    job's pid; the first finishes a complete, valid dataset with nothing half-written beside it."""
    from pipeline.data.dataset import validate_output

    out = tmp_path / "out"
    args = ["--input", shared_dir / "corpora/books/08_Ruth.txt", "--input", shared_dir / "corpora/books/41_Mark.txt",
            "--output", out, "--vocab", minilm_dir / "vocab.txt", "--num-cpus", "2",
            "--data.local_max_bytes", "0"]  # on Ray: the first job lasts long enough for the second to meet it
    first = subprocess.Popen(_cmd(repo_root, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=_env(), cwd=repo_root)
    try:
        deadline = time.time() + 120
        while not ((out / ".lock").is_file() and (out / ".lock").read_text()):  # the first holds the lock
            assert first.poll() is None and time.time() < deadline, first.communicate()
            time.sleep(0.05)
        t0 = time.time()
        second = _run(repo_root, *args)
        took = time.time() - t0
        _assert_clean_error(second, f"output {out} is being written by another preparation (pid {first.pid} on ")
        assert len(second.stderr.strip().splitlines()) == 1 and took < 60, (took, second.stderr)
        stdout, stderr = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, stderr[-3000:]
    assert sorted(os.listdir(out)) == ["duplicates.jsonl", "manifest.json", "shards", "tokenizer.json", "vocab.meta.json", "vocab.txt"]
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
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=repo_root,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert "LOADED []" in p.stdout, p.stdout[-500:]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["examples"] > 0


@pytest.fixture()
def full_disk(tmp_path):
    """A real 144 KiB tmpfs (36 pages) mounted on a temporary directory, unmounted at teardown; skipped where
    this process may not mount (not root, or a container without CAP_SYS_ADMIN)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={36 * 4096}", "tmpfs", str(mnt)], capture_output=True, text=True)
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
    args = ["--input", books / "08_Ruth.txt", "--input", books / "31_Obad.txt", "--input", books / "32_Jonah.txt",
            "--vocab-size", "600", "--data.num_shards", "4"]
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
    assert m["skipped_files"] == [{"path": f"{src}/dangling.txt", "reason": "dangling symlink (to /nonexistent/gone.txt)"},
                                  {"path": f"{src}/loop.txt", "reason": "symlink loop"}]
    assert m["input_files"] == 1 and m["documents_written"] == 1
