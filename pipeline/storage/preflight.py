"""Storage preflight: every URI a job will read or write is checked before any work, in one line per failure.

For each `scheme://` URI (inputs, outputs, `train.storage_path`, task files, `--vocab`, `--config`, the tracking
server's artifact root where the client knows it) `check_storage` checks, on the driver and before Ray starts:

- the scheme's filesystem is installed (s3:// needs s3fs: the project's `s3` extra);
- for s3://, with one `HeadBucket` per bucket: the credentials resolve, the endpoint answers (AWS_ENDPOINT_URL for
  S3-compatible stores such as MinIO), the bucket exists and these credentials may use it;
- a URI the job reads exists.

It never creates anything: a misspelt bucket is refused, not made (see also `pipeline.storage.io.make_parent`). A
failure is a StorageError naming the field, the URI and the cause:

    data.output s3://corpp/prep: bucket corpp does not exist (endpoint http://10.0.0.5:9000)

Local paths are left to each job's own checks (`pipeline.data.stages.check_paths` and the readers). Other schemes
(gs://, az://, ...) get the installed check and, for reads, an existence check through fsspec.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Literal

from pipeline.storage.io import StorageError, is_uri, missing_filesystem

Mode = Literal["read", "write"]
Target = tuple[str, str | None, Mode]  # (the field or flag that names it, the path or URI, read or write)

S3_SCHEMES = ("s3", "s3a")
# One quick attempt per request: a wrong endpoint is reported in about a second, not after botocore's and s3fs's
# retries with backoff (the jobs' own filesystems keep their retries).
_S3_CONFIG = {"retries": {"max_attempts": 1}, "connect_timeout": 5, "read_timeout": 10}


def check_storage(targets: Iterable[Target]) -> None:
    """Raise StorageError (one line) for the first target that cannot be used; None and local paths pass."""
    buckets: dict[tuple[str, str], None] = {}  # each bucket is checked once per call
    filesystems: dict[str, object] = {}  # one per scheme and call: making an S3 client costs ~0.3 s
    for what, uri, mode in targets:
        if uri is None or not is_uri(uri) or uri.startswith("file://"):
            continue
        scheme = uri.split("://", 1)[0]
        if scheme not in filesystems:
            filesystems[scheme] = _filesystem(what, uri, scheme)
        fs = filesystems[scheme]
        path = fs._strip_protocol(uri)
        if scheme in S3_SCHEMES:
            bucket = path.split("/", 1)[0]
            if (scheme, bucket) not in buckets:
                _check_bucket(fs, what, uri, bucket)
                buckets[(scheme, bucket)] = None
        if mode == "read":
            try:
                found = fs.exists(path)
            except Exception as e:  # noqa: BLE001 - any backend's error, in one line
                raise StorageError(f"{what} {uri}: {_first_line(e)}") from None
            if not found:
                raise StorageError(f"{what} {uri}: does not exist")


def _filesystem(what: str, uri: str, scheme: str):
    import fsspec

    try:
        cls = fsspec.get_filesystem_class(scheme)
    except ImportError as e:
        raise StorageError(f"{what} {uri}: {missing_filesystem(uri, e)}") from None
    except ValueError:
        raise StorageError(f"{what} {uri}: unknown storage scheme {scheme}://") from None
    try:
        if scheme in S3_SCHEMES:  # a private instance with quick failures, not the cached one the job uses
            fs = cls(skip_instance_cache=True, config_kwargs=_S3_CONFIG)
            fs.retries = 1  # s3fs's own retry loop (class attribute, 5 by default)
            return fs
        return fsspec.core.url_to_fs(uri)[0]
    except Exception as e:  # noqa: BLE001 - bad storage options and the like
        raise StorageError(f"{what} {uri}: {_first_line(e)}") from None


def _check_bucket(fs, what: str, uri: str, bucket: str) -> None:
    """One HeadBucket: credentials, endpoint and bucket in one request; each failure named."""
    from botocore.exceptions import (
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        PartialCredentialsError,
        ReadTimeoutError,
    )

    if not bucket:
        raise StorageError(f"{what} {uri}: no bucket in the URI (s3://BUCKET/path)")
    try:
        fs.call_s3("head_bucket", Bucket=bucket)
        return
    except (NoCredentialsError, PartialCredentialsError) as e:
        cause = (
            f"no S3 credentials ({_first_line(e)}): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
            "AWS_PROFILE, or an instance role) on every node"
        )
    except (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError):
        cause = f"the S3 endpoint {_endpoint(fs)} does not answer (AWS_ENDPOINT_URL={os.environ.get('AWS_ENDPOINT_URL', '')!r})"  # noqa: E501
    except FileNotFoundError:  # s3fs maps 404 / NoSuchBucket here
        cause = f"bucket {bucket} does not exist (endpoint {_endpoint(fs)}); create it first, this job never does"
    except PermissionError as e:  # 403: a wrong key, or a bucket these credentials may not use
        cause = f"access to bucket {bucket} denied ({_first_line(e)}); check the credentials"
    except Exception as e:  # noqa: BLE001 - anything else from botocore or the server, in one line
        cause = f"{type(e).__name__}: {_first_line(e)} (endpoint {_endpoint(fs)})"
    raise StorageError(f"{what} {uri}: {cause}")


def _endpoint(fs) -> str:
    try:
        return fs.s3.meta.endpoint_url
    except Exception:  # noqa: BLE001 - no session yet (credentials failed first)
        return os.environ.get("AWS_ENDPOINT_URL") or "AWS's default"


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def data_targets(data, field: str = "data") -> list[Target]:
    """A DataConfig's inputs and vocabulary (read) and output (write)."""
    return [(f"{field}.inputs", p, "read") for p in data.inputs] + [
        (f"{field}.vocab", data.vocab, "read"),
        (f"{field}.output", data.output, "write"),
    ]


def check_on_every_node(targets: list[Target]) -> list[tuple[str, str | None]]:
    """Run `check_storage(targets)` on every alive node of the connected Ray cluster (one zero-CPU task pinned
    to each): each node's own s3fs, credentials and route to the endpoint. [(node IP, error line or None)]."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    check_here = ray.remote(num_cpus=0, max_retries=0)(_error_of)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    refs = [
        check_here.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(targets)
        for n in nodes
    ]
    return [(n["NodeManagerAddress"], err) for n, err in zip(nodes, ray.get(refs))]


def main(argv: list[str] | None = None) -> int:
    """`python -m pipeline.storage.preflight --read s3://b/corpora --write s3://b/prep [--every-node]`: the jobs'
    storage check on its own, before a long run; with --every-node on each node of the Ray cluster in RAY_ADDRESS."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m pipeline.storage.preflight", description=main.__doc__)
    ap.add_argument("--read", action="append", default=[], help="a URI the job will read (must exist)")
    ap.add_argument("--write", action="append", default=[], help="a URI the job will write (its bucket must exist)")
    ap.add_argument("--every-node", action="store_true", help="check from every node of the Ray cluster (RAY_ADDRESS)")
    args = ap.parse_args(argv)
    targets: list[Target] = [("--read", u, "read") for u in args.read] + [("--write", u, "write") for u in args.write]
    if not args.every_node:
        results = [("this machine", _error_of(targets))]
    else:
        import ray

        if not ray.is_initialized():
            ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), log_to_driver=False, configure_logging=False)
        results = check_on_every_node(targets)
    for node, err in results:
        print(f"{node}: {err or 'ok'}", file=sys.stderr if err else sys.stdout, flush=True)
    return 1 if any(err for _, err in results) else 0


def _error_of(targets: list[Target]) -> str | None:
    try:
        check_storage(targets)
    except StorageError as e:
        return str(e)
    return None


if __name__ == "__main__":
    raise SystemExit(main())
