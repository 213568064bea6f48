"""Storage: fsspec paths and URIs (local, file://, s3://, ...), atomic writes, text/JSON/Parquet reads.

The only module that touches storage. Every write goes to a temporary name beside its target and is renamed
into place, so a reader sees a whole file or none; every read error names the file.

    >>> import tempfile; tmp = tempfile.TemporaryDirectory(); d = tmp.name
    >>> write_bytes_atomic(join(d, "a", "x.json"), b'{"k": 1}'); read_json(join(d, "a", "x.json"))
    {'k': 1}
    >>> tmp.cleanup()
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import socket
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.console import say
from pipeline.errors import PipelineError


class StorageError(PipelineError, ValueError):
    """A file that cannot be read as what it should be, or written; the message names the file."""


# OSErrors a user can act on (free space, fix permissions), said in words; others keep their own strerror.
_REASONS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}


def os_reason(e: OSError) -> str:
    """An OSError in words, without its path (the caller names the path and the operation).

    >>> os_reason(OSError(errno.ENOSPC, "No space left on device")), os_reason(OSError("[Errno 28] No space left on device"))
    ('no space left on device', 'no space left on device')
    """  # noqa: E501
    if e.errno in _REASONS:
        return _REASONS[e.errno]
    text = str(e.strerror or e).splitlines()[0] if (e.strerror or str(e)) else type(e).__name__
    for code, words in _REASONS.items():  # pyarrow re-raises the writer's OSError as text: "[Errno 28] ..."
        if os.strerror(code).lower() in text.lower():
            return words
    return text


@contextlib.contextmanager
def writing(
    path: str, fs: fsspec.AbstractFileSystem | None = None, tmp: str | None = None, operation: str = "writing"
) -> Iterator[None]:
    """Turn an OSError of the block into a StorageError naming the operation and `path`
    (`no space left on device writing /data/out/shards/shard-00003-of-00008.parquet`), removing the temporary
    file `tmp` (on `fs`) first so that a full disk gets its space back. Other errors pass unchanged."""
    try:
        yield
    except OSError as e:
        if tmp is not None and fs is not None:
            with contextlib.suppress(OSError):
                fs.rm(tmp)
        reason = os_reason(e)
        err = StorageError(f"{reason} {operation} {path}")
        err.transient = reason not in _REASONS.values()  # a full or read-only disk, a refused permission: not
        raise err from e


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


def filesystem(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(the fsspec filesystem, the path within it); a scheme whose package is missing is one StorageError line."""
    try:
        return fsspec.core.url_to_fs(path)
    except ImportError as e:
        raise StorageError(f"{path}: {missing_filesystem(path, e)}") from None


def missing_filesystem(path: str, e: ImportError) -> str:
    """What to install for `path`'s scheme: the project's `s3` extra for s3://, else fsspec's own hint."""
    if path.split("://", 1)[0] in ("s3", "s3a"):
        return 's3:// needs s3fs, which is not installed: pip install -e ".[s3]"'
    return str(e).splitlines()[0]


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocols or "local" in protocols


def make_parent(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Create `path`'s parent directory on a local filesystem. Object stores have no directories, and s3fs's
    makedirs would create a missing bucket: a misspelt bucket must fail on the write, never be created."""
    if is_local(fs):
        fs.makedirs(path.rpartition("/")[0], exist_ok=True)


def local_copy(path: str, directory: str) -> str:
    """`path` itself when it is local, else a copy of it in `directory` (for readers that open local files only,
    such as tokenizers)."""
    if not is_uri(path) or path.startswith("file://"):
        return filesystem(path)[1]
    local = os.path.join(directory, path.rstrip("/").rsplit("/", 1)[-1])
    with open(local, "wb") as fh:
        fh.write(read_bytes(path))
    return local


def exists(path: str) -> bool:
    fs, p = filesystem(path)
    return fs.exists(p)


def remove(path: str, recursive: bool = False) -> None:
    """Delete the file `path` (a directory and all it holds with `recursive`); nothing when there is none."""
    fs, p = filesystem(path)
    with contextlib.suppress(FileNotFoundError):
        fs.rm(p, recursive=recursive)


def read_bytes(path: str) -> bytes:
    fs, p = filesystem(path)
    with fs.open(p, "rb") as f:
        return f.read()


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def temp_name(path: str) -> str:
    d, _, name = path.rpartition("/")
    return f"{d}/.{name}.tmp-{uuid.uuid4().hex[:8]}"


def commit(fs: fsspec.AbstractFileSystem, tmp: str, final: str) -> None:
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if "file" in protocols:
        os.replace(tmp, final)  # atomic on POSIX
    else:
        fs.mv(tmp, final)  # object stores: the object appears whole on completion of the copy


@contextlib.contextmanager
def open_atomic(path: str) -> Iterator[Any]:
    """A binary file to write `path` through: written under a temporary name beside it and renamed when the block
    ends, so readers see all of it or nothing; an OSError is one StorageError naming `path` (`writing`)."""
    fs, p = filesystem(path)
    tmp = temp_name(p)
    with writing(path, fs, tmp):
        make_parent(fs, p)
        with fs.open(tmp, "wb") as f:
            yield f
        commit(fs, tmp, p)


def write_bytes_atomic(path: str, data: bytes) -> None:
    with open_atomic(path) as f:
        f.write(data)


def write_parquet_atomic(path: str, table: pa.Table, compression: str = "zstd") -> None:
    with open_atomic(path) as f:
        pq.write_table(table, f, compression=compression)


def sha256_file(path: str) -> str:
    fs, p = filesystem(path)
    h = hashlib.sha256()
    with fs.open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_table(path: str, columns: list[str] | None = None) -> pa.Table:
    """A Parquet file as a table; a truncated or unreadable file is a StorageError that names it."""
    fs, p = filesystem(path)
    try:
        with fs.open(p, "rb") as f:
            return pq.ParquetFile(f).read(columns=columns)  # not pq.read_table: its dataset layer imports pandas
    except FileNotFoundError:
        raise StorageError(f"{path} does not exist") from None
    except (pa.ArrowInvalid, OSError) as e:
        raise StorageError(f"{path} is not a readable Parquet file ({str(e).splitlines()[0]})") from None


def read_json(path: str) -> Any:
    """Parsed JSON of `path`; a StorageError naming the file when it is missing or not JSON."""
    try:
        return json.loads(read_text(path))
    except FileNotFoundError:
        raise StorageError(f"{path} does not exist") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise StorageError(f"{path} is not valid JSON: {str(e).splitlines()[0]}") from None


def broken_link(path: str) -> str | None:
    """Why a local symlink cannot be read (it dangles, or it loops), or None when `path` is no broken link.

    >>> import tempfile; d = tempfile.mkdtemp(); os.symlink("gone.txt", f"{d}/a.txt"); broken_link(f"{d}/a.txt")
    'is a dangling symlink (to gone.txt)'
    >>> os.symlink("b", f"{d}/b"); broken_link(f"{d}/b"); import shutil; shutil.rmtree(d)
    'is a symlink loop'
    """
    if not os.path.islink(path):
        return None
    try:
        os.stat(path)
    except FileNotFoundError:
        return f"is a dangling symlink (to {os.readlink(path)})"
    except OSError as e:
        return "is a symlink loop" if e.errno == errno.ELOOP else f"cannot be read ({e.strerror})"
    return None


def find_files(fs: fsspec.AbstractFileSystem, root: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(every file under folder `root`, sorted; [(path, why it cannot be read)]). On a local disk symlinks are
    followed (a linked folder is walked under the link's name); a dangling symlink, a symlink loop and a link back
    to a folder being walked are returned with their reason instead of failing the walk (fsspec's `find` stats
    every entry and raises on a dangling one)."""
    if not is_local(fs):
        return sorted(fs.find(root)), []
    files: list[str] = []
    broken: list[tuple[str, str]] = []
    above: list[tuple[int, int]] = []  # (device, inode) of the folders being walked: a link to one is a loop

    def walk(d: str) -> None:
        st = os.stat(d)
        above.append((st.st_dev, st.st_ino))
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as e:
            broken.append((d, f"folder cannot be read ({e.strerror})"))
            entries = []
        for e in entries:
            if (reason := broken_link(e.path)) is not None:
                broken.append((e.path, reason.removeprefix("is a ")))
            elif e.is_dir():  # follows a link to a folder
                target = os.stat(e.path)
                if (target.st_dev, target.st_ino) in above:
                    broken.append((e.path, f"symlink loop (to {os.path.realpath(e.path)}, a folder above it)"))
                else:
                    walk(e.path)
            else:
                files.append(e.path)
        above.pop()

    walk(root)
    return sorted(files), broken


def is_uri(path: str) -> bool:
    """True for `scheme://...` paths (object stores, file://), False for plain local paths."""
    return "://" in str(path)


class OutputLockedError(StorageError):
    """Another process is writing the same output directory; the message names the directory and the holder."""


_HELD: dict[str, list] = {}  # lock file -> [fd, depth]: re-entrant within one process (flock is per open file)
_NO_LOCK_NOTICED: set[str] = set()  # object-store outputs whose no-lock notice this process has printed


@contextlib.contextmanager
def output_lock(directory: str, busy: str | None = None) -> Iterator[None]:
    """One writer per output directory: an advisory, non-blocking `fcntl.flock` on `DIR/.lock`.

    A second writer (another process, on this host or another host sharing a POSIX filesystem that supports
    flock, e.g. a local disk; NFS only where the server maps flock to fcntl locks) fails at once with
    OutputLockedError naming the directory and the holder (pid@host). Re-entrant within one process. The lock
    file holds the holder's pid and host and is removed on release; the kernel drops the lock when the holder
    dies, so a killed run never leaves a stale lock. On a URI other than file:// (s3://, gs://, ...) there is
    no lock: object stores have no atomic create-if-absent across fsspec backends, so this is a documented
    no-op that says so on stderr; run one preparation per output URI. `busy` is the error message when the
    lock is held, `{holder}` in it replaced by the holder (default: the data output's).
    """
    fs, p = filesystem(directory)
    if not is_local(fs):
        if directory not in _NO_LOCK_NOTICED:  # once per run, not once per stage that takes the lock
            _NO_LOCK_NOTICED.add(directory)
            scheme = fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol
            say(
                f"[io] no lock on {directory}: {scheme}:// has no advisory locks; run one writer per output",
                sys.stderr,
            )
        yield
        return
    import fcntl

    os.makedirs(p, exist_ok=True)
    path = os.path.realpath(os.path.join(p, ".lock"))
    if path in _HELD:
        _HELD[path][1] += 1
        try:
            yield
        finally:
            _HELD[path][1] -= 1
        return
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = (
                os.read(fd, 200).decode("utf-8", "replace").strip() or "a process that has not written its name yet"
            )
            os.close(fd)
            busy = busy or (
                f"output {directory} is being written by another preparation ({{holder}}); "
                "wait for it to finish or choose another output"
            )
            raise OutputLockedError(busy.replace("{holder}", holder)) from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file between our open and flock: lock the new one
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
    _HELD[path] = [fd, 1]
    try:
        yield
    finally:
        del _HELD[path]
        os.unlink(path)  # before unlocking: a waiter that opened this file sees it gone and retries
        os.close(fd)


def local_checkpoint_dir(uri: str) -> str:
    """A local directory with the files of a checkpoint: `uri` itself when it is local, else a copy of the whole
    directory in a new temporary directory (the caller removes it). `pipeline.storage.io.local_copy` copies one file."""
    if "://" not in uri:
        return uri
    import tempfile

    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(uri)
    dst = tempfile.mkdtemp(prefix="ckpt-")
    pafs.copy_files(path, dst, source_filesystem=fs)
    return dst
