"""The wheels the lent GPU machine lacks (Ray, mlflow-skinny and their missing dependencies), downloaded here as
cp312 manylinux wheels into `.whl/` (git ignores it: never commit wheels) and trimmed to fit a call's 64 MiB.

    python bench/gpu_bundle.py                  # download into .whl/, repack Ray, print sizes
    python bench/gpu_bundle.py --no-download    # repack and size what .whl/ already holds

Ray's wheel carries Java workers (`ray/jars/ray_dist.jar`) and the dashboard's source maps (`*.js.map`), which a
Python job never loads: they are taken out and their RECORD lines with them, so pip installs the wheel cleanly
(79.3 MB -> 45.6 MB, /work/shared/GPU.md). On the GPU machine, with `.whl` carried:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

# Versions as in the project's virtualenv (the GPU image has the rest: /work/shared/GPU.md).
RAY = "ray==2.60.0"
MLFLOW = "mlflow-skinny==3.17.2"
RAY_DEPS = ["jsonschema", "jsonschema-specifications", "referencing", "rpds-py"]
MLFLOW_DEPS = ["cachetools", "databricks-sdk", "fastapi", "starlette", "uvicorn", "gitpython", "gitdb", "smmap",
               "importlib_metadata", "opentelemetry-api", "opentelemetry-proto", "opentelemetry-sdk",
               "opentelemetry-semantic-conventions", "pydantic", "pydantic-core", "annotated-types",
               "typing-inspection", "python-dotenv", "sqlparse"]
PLATFORMS = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"]
CARRY_LIMIT = 64 * 2**20  # bytes one `run` call carries, wheels and working tree together


def pinned(name: str) -> str:
    """`name==<version installed here>` so the GPU machine gets what the tests ran with; bare when absent.

    >>> pinned("surely-not-installed-xyz")
    'surely-not-installed-xyz'
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{name}=={version(name)}"
    except PackageNotFoundError:
        return name


def download(dest: Path, requirements: list[str]) -> None:
    """`pip download` cp312 manylinux wheels of exactly `requirements` (no dependencies resolved) into `dest`."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(dest), *requirements]
    subprocess.run(cmd, check=True)


def ray_extras(name: str) -> bool:
    """What Ray's wheel need not carry: Java workers and the dashboard's source maps.

    >>> [ray_extras(n) for n in ("ray/jars/ray_dist.jar", "ray/dashboard/client/build/static/js/main.js.map", "ray/_raylet.so")]
    [True, True, False]
    """
    return name.startswith("ray/jars/") or name.endswith(".js.map")


def is_record(name: str) -> bool:
    """The wheel's own RECORD, at its top level (Ray vendors packages with RECORDs of their own).

    >>> is_record("ray-2.60.0.dist-info/RECORD"), is_record("ray/thirdparty_files/psutil-7.2.2.dist-info/RECORD")
    (True, False)
    """
    return "/" not in name.removesuffix("/RECORD") and name.endswith(".dist-info/RECORD")


def repack(wheel: Path, drop: Callable[[str], bool]) -> list[str]:
    """Rewrite `wheel` in place without the members `drop` selects, and without their lines in the
    top-level `*.dist-info/RECORD` (pip checks it); returns the dropped names. Untouched (no rewrite) when nothing matches."""
    with zipfile.ZipFile(wheel) as src:
        dropped = [i.filename for i in src.infolist() if drop(i.filename)]
        if not dropped:
            return []
        gone = set(dropped)
        fd, tmp = tempfile.mkstemp(suffix=".whl", dir=wheel.parent)  # same folder: the replace is a rename
        os.close(fd)
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
                for info in src.infolist():
                    if info.filename in gone:
                        continue
                    data = src.read(info)
                    if is_record(info.filename):
                        lines = data.decode().splitlines(keepends=True)
                        data = "".join(ln for ln in lines if ln.split(",", 1)[0] not in gone).encode()
                    out.writestr(info, data)
            os.replace(tmp, wheel)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return dropped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", default=".whl", help="folder for the wheels (git ignores .whl/)")
    ap.add_argument("--no-download", action="store_true", help="only repack and size what --dest holds")
    a = ap.parse_args(argv)
    dest = Path(a.dest)
    dest.mkdir(exist_ok=True)
    if not a.no_download:
        download(dest, [RAY, MLFLOW, *map(pinned, RAY_DEPS + MLFLOW_DEPS)])
    for wheel in sorted(dest.glob("ray-*.whl")):
        before = wheel.stat().st_size
        dropped = repack(wheel, ray_extras)
        print(f"{wheel.name}: {before / 1e6:.1f} MB -> {wheel.stat().st_size / 1e6:.1f} MB ({len(dropped)} members dropped)")
    wheels = sorted(dest.glob("*.whl"))
    for w in wheels:
        print(f"  {w.stat().st_size / 1e6:7.2f} MB  {w.name}")
    total = sum(w.stat().st_size for w in wheels)
    print(f"{len(wheels)} wheels, {total / 1e6:.1f} MB = {total / 2**20:.1f} MiB; "
          f"{(CARRY_LIMIT - total) / 2**20:.1f} MiB of a call's 64 MiB left for the tree and data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
