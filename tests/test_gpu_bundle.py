"""bench/gpu/gpu_bundle.py: Ray's wheel repacked without what a Python job never loads (RECORD kept consistent), wheels
recompressed with LZMA byte for byte, the corpora staged for a device call."""

from __future__ import annotations

import zipfile

import pytest

from conftest import load_bench


@pytest.fixture(scope="module")
def bundle():
    return load_bench("gpu_bundle")


def _wheel(path, members: dict[str, bytes]) -> None:
    """A wheel-shaped zip: the members and a RECORD that lists each of them (and itself, without a hash)."""
    record = "ray-2.60.0.dist-info/RECORD"
    lines = [f"{n},sha256=x,{len(d)}\n" for n, d in members.items()] + [f"{record},,\n"]
    with zipfile.ZipFile(path, "w") as z:
        for n, d in members.items():
            z.writestr(n, d)
        z.writestr(record, "".join(lines))


def test_repack_drops_jars_and_source_maps_and_their_record_lines(bundle, tmp_path, capsys):
    wheel = tmp_path / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl"
    keep = {
        "ray/__init__.py": b"x = 1\n",
        "ray/_raylet.so": b"\0" * 100,
        "ray/dashboard/client/build/index.html": b"<html/>",
        "ray-2.60.0.dist-info/METADATA": b"Name: ray\n",
        # a vendored package's own RECORD: left as it is
        "ray/thirdparty_files/x-1.0.dist-info/RECORD": b"ray/jars/ray_dist.jar,,\n",
    }
    extra = {
        "ray/jars/ray_dist.jar": b"J" * 5000,
        "ray/dashboard/client/build/static/js/main.js.map": b"M" * 3000,
        "ray/rllib/__init__.py": b"",
        "ray/llm/__init__.py": b"",
    }
    _wheel(wheel, {**keep, **extra})
    before = wheel.stat().st_size

    assert sorted(bundle.repack(wheel, bundle.ray_extras)) == sorted(extra)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = z.read("ray-2.60.0.dist-info/RECORD").decode()
        for name in ("ray/_raylet.so", "ray/thirdparty_files/x-1.0.dist-info/RECORD"):
            assert z.read(name) == keep[name]
    assert names == set(keep) | {"ray-2.60.0.dist-info/RECORD"}
    assert {ln.split(",")[0] for ln in record.splitlines()} == names  # what pip checks: RECORD == members
    assert wheel.stat().st_size < before
    mtime = wheel.stat().st_mtime_ns
    assert bundle.repack(wheel, bundle.ray_extras) == []  # nothing left to drop: the wheel is not rewritten
    assert wheel.stat().st_mtime_ns == mtime
    assert not [p for p in tmp_path.iterdir() if p != wheel]  # no temporary file left

    assert bundle.main(["--dest", str(tmp_path), "--no-download", "--corpus", ""]) == 0
    out = capsys.readouterr().out
    assert "1 wheels" in out and "MiB of a call's 64 MiB left" in out


def test_repack_recompresses_with_lzma_keeping_every_byte(bundle, tmp_path):
    wheel = tmp_path / "big-1.0-py3-none-any.whl"
    members = {"big/__init__.py": b"x = 1\n" * 5000, "big/data.bin": bytes(range(256)) * 400}
    _wheel(wheel, members)
    with zipfile.ZipFile(wheel) as z:
        before = {n: z.read(n) for n in z.namelist()}

    assert bundle.repack(wheel, lambda _: False, zipfile.ZIP_LZMA) == []
    with zipfile.ZipFile(wheel) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_LZMA}
        assert {n: z.read(n) for n in z.namelist()} == before  # what pip unpacks is unchanged
    mtime = wheel.stat().st_mtime_ns
    assert bundle.repack(wheel, lambda _: False, zipfile.ZIP_LZMA) == []
    assert wheel.stat().st_mtime_ns == mtime  # already LZMA, nothing to drop: not rewritten


def test_stage_corpus_gzips_books_and_copies_the_rest(bundle, tmp_path):
    import gzip

    src = tmp_path / "corpora"
    (src / "books").mkdir(parents=True)
    (src / "wiki").mkdir()
    (src / "books" / "01_Ge.txt").write_text("In the beginning.\n" * 100)
    (src / "wiki" / "pages.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a"}\n'))
    dest = tmp_path / "staged"
    (dest / "stale").mkdir(parents=True)

    written = bundle.stage_corpus(src, dest)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == [
        "books/01_Ge.txt.gz",
        "wiki/pages.jsonl.gz",
    ]
    assert gzip.decompress((dest / "books" / "01_Ge.txt.gz").read_bytes()) == (src / "books" / "01_Ge.txt").read_bytes()
    assert (dest / "wiki" / "pages.jsonl.gz").read_bytes() == (src / "wiki" / "pages.jsonl.gz").read_bytes()
    assert written == bundle.folder_bytes(dest) < (src / "books" / "01_Ge.txt").stat().st_size
