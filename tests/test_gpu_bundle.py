"""bench/gpu_bundle.py: Ray's wheel repacked without Java workers and source maps, RECORD kept consistent."""

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
    keep = {"ray/__init__.py": b"x = 1\n", "ray/_raylet.so": b"\0" * 100,
            "ray/dashboard/client/build/index.html": b"<html/>", "ray-2.60.0.dist-info/METADATA": b"Name: ray\n",
            # a vendored package's own RECORD: left as it is
            "ray/thirdparty_files/x-1.0.dist-info/RECORD": b"ray/jars/ray_dist.jar,,\n"}
    extra = {"ray/jars/ray_dist.jar": b"J" * 5000, "ray/dashboard/client/build/static/js/main.js.map": b"M" * 3000}
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
    assert bundle.repack(wheel, bundle.ray_extras) == []  # nothing left to drop: the wheel is not rewritten
    assert not [p for p in tmp_path.iterdir() if p != wheel]  # no temporary file left

    assert bundle.main(["--dest", str(tmp_path), "--no-download"]) == 0
    out = capsys.readouterr().out
    assert "1 wheels" in out and "MiB of a call's 64 MiB left" in out
