"""What one device call carries besides the tracked files, to run the main job on the lent GPU machine
(bench/gpu/gpu_e2e.sh): the wheels its image lacks (Ray, mlflow-skinny, the SQLite store, the project's own needs) as
manylinux wheels in `.whl/`, and the shared corpora, books gzipped, in `.e2e/corpora/` (git ignores both: never
commit wheels or corpus copies). It prints what a call would carry against the 64 MiB limit.

    python bench/gpu/gpu_bundle.py                          # cp312 wheels into .whl/, corpora into .e2e/, sizes
    python bench/gpu/gpu_bundle.py --no-download            # repack and size what .whl/ already holds
    python bench/gpu/gpu_bundle.py --python-version 3.11 --dest /tmp/whl311   # the same bundle for a dry run here

The package list is the image's gaps on the pretraining path (jobs/pretrain.py: data stage, Ray Train, the default
`sqlite:///mlflow.db` store, the registry, the export), found by running bench/gpu/gpu_e2e.sh in a venv that holds only
the image's packages (/work/.library/device/KINDS.md): every ImportError there was a wheel missing here. The SQLite
store costs SQLAlchemy + alembic + Mako + greenlet + cryptography (+ cffi, pycparser), 8.8 MB; Ray's dashboard, which
the job starts, needs aiohttp-cors, opencensus (+ context), googleapis-common-protos and the Prometheus exporter.
Measured 2026-11-25: 41 wheels, 48.9 MiB; with the corpora (2.6 MiB) and the tracked files (2.4 MiB), 53.9 MiB.
Ray's wheel carries Java workers (`ray/jars/`), the dashboard's source maps, RLlib and Ray LLM, which this project
never loads: they are taken out, their RECORD lines with them, so pip installs the wheel cleanly (79.3 MB -> 42.4 MB).
Every wheel over 1 MiB is then recompressed with LZMA, which pip installs like any zip (Python's zipfile reads it): Ray
42.4 -> 31.4 MB. On the GPU machine, with `.whl` carried:

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
# Ray refuses to start its dashboard unless ray/dashboard/optional_deps.py imports, which needs these beyond the
# image. The job's private local cluster has run without a dashboard since Ray Train's placement-group cleaner went
# (pipeline.cluster.train.trainer_class); these stay until a GPU call shows Ray starts without them.
DASHBOARD_DEPS = [
    "aiohttp-cors",
    "opencensus",
    "opencensus-context",
    "googleapis-common-protos",
    "opentelemetry-exporter-prometheus",
]
MLFLOW_DEPS = [
    "cachetools",
    "databricks-sdk",
    "fastapi",
    "starlette",
    "uvicorn",
    "gitpython",
    "gitdb",
    "smmap",
    "importlib_metadata",
    "opentelemetry-api",
    "opentelemetry-proto",
    "opentelemetry-sdk",
    "opentelemetry-semantic-conventions",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "python-dotenv",
    "sqlparse",
]
# mlflow's SQLAlchemy store (sqlite:///mlflow.db); its registry tables import cryptography (Fernet).
SQLITE_DEPS = ["sqlalchemy", "alembic", "mako", "greenlet", "cryptography", "cffi", "pycparser"]
PROJECT_DEPS = ["jsonargparse", "docstring-parser", "mwparserfromhell", "rensa"]  # pyproject.toml's, not in the image
PLATFORMS = [
    "manylinux2014_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_28_x86_64",
]
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


def requirements() -> list[str]:
    """Every wheel the bundle holds, pinned to this virtualenv's versions where it has them."""
    return [RAY, MLFLOW, *map(pinned, RAY_DEPS + DASHBOARD_DEPS + MLFLOW_DEPS + SQLITE_DEPS + PROJECT_DEPS)]


def download(dest: Path, requirements: list[str], python_version: str = "3.12") -> None:
    """`pip download` cp<python_version> manylinux wheels of exactly `requirements` (no dependencies resolved)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        *[a for p in PLATFORMS for a in ("--platform", p)],
        "-d",
        str(dest),
        *requirements,
    ]
    subprocess.run(cmd, check=True)


def other_python(wheel: str, python_version: str) -> bool:
    """A compiled wheel for another CPython than `python_version` (left in the folder by an earlier bundle): two
    versions of a package stop the whole install, so it goes. A stable-ABI (abi3) wheel serves every later CPython.

    >>> [other_python(w, "3.12") for w in ("ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl",
    ...     "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl", "mako-1.4.3-py3-none-any.whl",
    ...     "cryptography-50.0.2-cp311-abi3-manylinux2014_x86_64.whl")]
    [True, False, False, False]
    """
    tags = wheel.removesuffix(".whl").split("-")
    python_tag, abi = (tags[-3], tags[-2]) if len(tags) >= 5 else ("", "")
    return python_tag.startswith("cp") and abi != "abi3" and python_tag != "cp" + python_version.replace(".", "")


def ray_extras(name: str) -> bool:
    """What Ray's wheel need not carry: Java workers, the dashboard's source maps, RLlib, Ray LLM. (The dashboard's
    web client stays: its head refuses to start without `ray/dashboard/client/build/`.)

    >>> [ray_extras(n) for n in ("ray/jars/ray_dist.jar", "ray/dashboard/client/build/static/js/main.js.map",
    ...                          "ray/rllib/algorithms/ppo.py", "ray/llm/__init__.py", "ray/_raylet.so",
    ...                          "ray/train/__init__.py",
    ...                          "ray/dashboard/client/build/index.html")]
    [True, True, True, True, False, False, False]
    """
    return name.startswith(("ray/jars/", "ray/rllib/", "ray/llm/")) or name.endswith(".js.map")


def is_record(name: str) -> bool:
    """The wheel's own RECORD, at its top level (Ray vendors packages with RECORDs of their own).

    >>> is_record("ray-2.60.0.dist-info/RECORD"), is_record("ray/thirdparty_files/psutil-7.2.2.dist-info/RECORD")
    (True, False)
    """
    return "/" not in name.removesuffix("/RECORD") and name.endswith(".dist-info/RECORD")


def repack(wheel: Path, drop: Callable[[str], bool], compression: int = zipfile.ZIP_DEFLATED) -> list[str]:
    """Rewrite `wheel` in place without the members `drop` selects, and without their lines in the top-level
    `*.dist-info/RECORD` (pip checks it), every member compressed with `compression`; returns the dropped names.
    Untouched (no rewrite) when nothing matches and every member is already so compressed."""
    with zipfile.ZipFile(wheel) as src:
        dropped = [i.filename for i in src.infolist() if drop(i.filename)]
        if not dropped and all(i.compress_type == compression for i in src.infolist()):
            return []
        gone = set(dropped)
        fd, tmp = tempfile.mkstemp(suffix=".whl", dir=wheel.parent)  # same folder: the replace is a rename
        os.close(fd)
        try:
            with zipfile.ZipFile(tmp, "w", compression) as out:
                for info in src.infolist():
                    if info.filename in gone:
                        continue
                    data = src.read(info)
                    if is_record(info.filename):
                        lines = data.decode().splitlines(keepends=True)
                        data = "".join(ln for ln in lines if ln.split(",", 1)[0] not in gone).encode()
                    info.compress_type = compression
                    out.writestr(info, data)
            os.replace(tmp, wheel)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return dropped


def stage_corpus(src: Path, dest: Path) -> int:
    """Copy the corpora under `src` into `dest` for a device call: `.txt` books gzipped (the readers take `.txt.gz`),
    everything else as it is; returns the bytes written. An existing `dest` is replaced."""
    import gzip
    import shutil

    if dest.exists():
        shutil.rmtree(dest)
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        out = dest / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        if f.suffix == ".txt":
            with open(f, "rb") as i, gzip.GzipFile(out.with_name(out.name + ".gz"), "wb", mtime=0) as o:
                shutil.copyfileobj(i, o)
        else:
            shutil.copyfile(f, out)
    return folder_bytes(dest)


def folder_bytes(path: Path) -> int:
    """Bytes of the files under `path` (0 when it is absent)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def tracked_bytes(repo: Path) -> int:
    """Bytes of the files git tracks in `repo` (what every call carries); 0 outside a git checkout."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, text=True)
    return sum((repo / n).stat().st_size for n in out.stdout.split("\0") if n and (repo / n).is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", default=".whl", help="folder for the wheels (git ignores .whl/)")
    ap.add_argument("--no-download", action="store_true", help="only repack and size what --dest holds")
    ap.add_argument(
        "--python-version", default="3.12", help="CPython of the wheels: the image's 3.12, or 3.11 for a dry run here"
    )
    ap.add_argument("--corpus", default="../shared/corpora", help="corpora to stage for the call ('' to skip)")
    ap.add_argument("--corpus-dest", default=".e2e/corpora", help="where they are staged (git ignores .e2e/)")
    a = ap.parse_args(argv)
    dest = Path(a.dest)
    dest.mkdir(parents=True, exist_ok=True)
    if not a.no_download:
        download(dest, requirements(), a.python_version)
    for wheel in sorted(dest.glob("*.whl")):
        if other_python(wheel.name, a.python_version):
            print(f"removed {wheel.name}: not for CPython {a.python_version}")
            wheel.unlink()
    for wheel in sorted(dest.glob("*.whl")):  # LZMA: pip reads it (zipfile); Ray's 42 MB deflated -> 31 MB
        if wheel.stat().st_size < 2**20:
            continue
        before = wheel.stat().st_size
        dropped = repack(wheel, ray_extras if wheel.name.startswith("ray-") else lambda _: False, zipfile.ZIP_LZMA)
        print(
            f"{wheel.name}: {before / 1e6:.1f} MB -> {wheel.stat().st_size / 1e6:.1f} MB ({len(dropped)} members dropped)"  # noqa: E501
        )
    wheels = sorted(dest.glob("*.whl"))
    for w in wheels:
        print(f"  {w.stat().st_size / 1e6:7.2f} MB  {w.name}")
    total = sum(w.stat().st_size for w in wheels)
    print(
        f"{len(wheels)} wheels, {total / 1e6:.1f} MB = {total / 2**20:.1f} MiB; "
        f"{(CARRY_LIMIT - total) / 2**20:.1f} MiB of a call's 64 MiB left for the tree and data"
    )
    if a.corpus:
        corpus = stage_corpus(Path(a.corpus), Path(a.corpus_dest))
        tree = tracked_bytes(Path.cwd())
        carried = total + corpus + tree
        print(
            f"carried: wheels {total / 2**20:.1f} MiB + corpora ({a.corpus_dest}) {corpus / 2**20:.1f} MiB + tracked files "  # noqa: E501
            f"{tree / 2**20:.1f} MiB = {carried / 2**20:.1f} MiB of 64 MiB"
        )
        if carried > CARRY_LIMIT:
            print("over a call's 64 MiB: carry fewer corpus files", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
