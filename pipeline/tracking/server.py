"""Reaching the MLflow tracking store: which one (`tracking_uri`), a client for it (`client`), a probe that says in one
line why a server cannot be used (`check_tracking_server`), and URIs with their passwords redacted for messages.

`client()` is where connecting is tuned once per process: MLflow's HTTP retries cut to a few quick ones (a longer
outage is the callers' business, pipeline.tracking.outbox), urllib3's per-retry warnings about MLflow's API dropped, and
a new SQLite store created under a file lock. pipeline.tracking (runs, logging, the registry) builds on this module
and never the other way round.

    >>> redact("http://user:pw@head:5000")
    'http://user:***@head:5000'
"""

from __future__ import annotations

import logging
import os
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import PipelineError
from pipeline.storage.io import is_uri

if TYPE_CHECKING:  # mlflow costs seconds to import: a job that fails on its input never needs it
    from mlflow import MlflowClient


class TrackingError(PipelineError, RuntimeError):
    """The tracking server or registry cannot be used; the message is one line that says why."""

    transient = True  # a server may come back


class ServerUnreachable(TrackingError):
    """The tracking server does not answer (as opposed to answering with a refusal)."""


# MLflow's HTTP client retries a failed request 7 times with a backoff factor of 2 (minutes against a server that is
# down). A few quick retries cover a blip; a longer outage is handled by the callers: rank 0's metrics wait in an
# Outbox, and the stages that need the server wait `tracking.server_wait_s` (pipeline.tracking.outbox). Set either
# variable in the environment to override.
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


def _absolute_store_uri(uri: str) -> str:
    """Make a local store URI absolute: `sqlite:///mlflow.db` -> `sqlite:////cwd/mlflow.db`, `./mlruns` -> `file:///cwd/mlruns`.

    >>> _absolute_store_uri("http://127.0.0.1:5000")
    'http://127.0.0.1:5000'
    """
    if uri.startswith("sqlite:///"):
        path = uri[len("sqlite:///") :]
        if not path.startswith("/") and path != ":memory:":
            path = str(Path(path).resolve())
        return f"sqlite:///{path}"
    if uri.startswith("file:"):
        path = uri[len("file:") :]
        path = path[2:] if path.startswith("//") else path
        return Path(path).resolve().as_uri()
    if "://" not in uri:  # a bare directory: MLflow's file store
        return Path(uri).resolve().as_uri()
    return uri


def tracking_uri() -> str:
    """`MLFLOW_TRACKING_URI` (made absolute when it is a local store) or `sqlite:///<abs cwd>/mlflow.db`."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    return _absolute_store_uri(uri)


# `scheme://user:password@` in any text (a URI in a message, a traceback, a log line).
_CREDENTIALS = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*):[^@/\s]*@")


def redact(text: str) -> str:
    """`text` with the password of every URI in it replaced by `***`; the user name stays (it says whose).

    >>> redact("server http://user:pw@host:9 is unreachable; s3://k:s%2Fx@bucket/p, http://host:5000")
    'server http://user:***@host:9 is unreachable; s3://k:***@bucket/p, http://host:5000'
    """
    return _CREDENTIALS.sub(r"\1:***@", text)


def split_credentials(uri: str) -> tuple[str, str | None, str | None]:
    """(the URI without its user and password, user, password): urllib reads `host` out of `user:pw@host:9` only
    once they are gone.

    >>> split_credentials("http://user:p%40ss@host:9/x"), split_credentials("http://host:9")
    (('http://host:9/x', 'user', 'p@ss'), ('http://host:9', None, None))
    """
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri, None, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=hostport)), unquote(user), unquote(password) if password else None


def _basic_auth_header(uri_user: str | None = None, uri_password: str | None = None) -> dict[str, str]:
    """`Authorization: Basic ...` from MLFLOW_TRACKING_USERNAME/PASSWORD, as MLflow's own client sends it, else from
    the URI's own `user:password@`; {} if neither."""
    import base64

    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if not user and not password:
        user, password = uri_user, uri_password
    if not user and not password:
        return {}
    token = base64.b64encode(f"{user or ''}:{password or ''}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def check_tracking_server(uri: str | None = None, timeout: float = 30.0) -> None:
    """Raise `TrackingError` (one line) when an http(s) tracking server does not answer or refuses this job's
    credentials (MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD); local stores always pass.

    An authenticated read (`experiments/search`, one result) is the probe: `/health` answers without credentials
    even on a basic-auth server. The message names the server and the problem, never the password. The timeout is
    generous because the server hashes the password on every request (slow on a busy head); a refused connection
    still fails at once.
    """
    uri = uri or tracking_uri()
    if not uri.startswith(("http://", "https://")):
        return
    path = "/api/2.0/mlflow/experiments/search"
    bare, uri_user, uri_password = split_credentials(uri)
    url = f"{bare.rstrip('/')}{path}?max_results=1"
    user = os.environ.get("MLFLOW_TRACKING_USERNAME") or uri_user
    req = urllib.request.Request(url, headers=_basic_auth_header(uri_user, uri_password))
    uri = redact(uri)  # the URI as messages show it
    try:
        with urllib.request.urlopen(req, timeout=timeout):  # noqa: S310 - the user's own server
            return
    except urllib.error.HTTPError as e:
        if e.code == 401:
            problem = (
                (
                    f"rejected the credentials of user {user!r} (HTTP 401); check MLFLOW_TRACKING_USERNAME and "
                    "MLFLOW_TRACKING_PASSWORD"
                )
                if user or os.environ.get("MLFLOW_TRACKING_PASSWORD") or uri_password
                else ("requires a login (HTTP 401); set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD")
            )
        elif e.code == 403:
            problem = f"refused user {user!r} (HTTP 403): no permission to read experiments"
        else:
            problem = f"answered HTTP {e.code} on {path}"
        raise TrackingError(f"MLflow tracking server {uri} {problem}") from None
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        reason = getattr(e, "reason", e)
        raise ServerUnreachable(
            redact(f"MLflow tracking server {uri} is unreachable ({reason}); start it or fix MLFLOW_TRACKING_URI")
        ) from None


_STORES_READY: set[str] = set()  # SQLite stores this process has opened (created or migrated) under the lock


def _open_sqlite_store(uri: str) -> None:
    """Open (and on first use create) a SQLite store under a file lock beside it (`mlflow.db.lock`), once per
    process: two jobs that both find the store new would otherwise both run MLflow's schema migration, and one of
    them die in it (`duplicate column name: ...`)."""
    from filelock import FileLock  # a dependency of ray and torch
    from mlflow import MlflowClient

    db = uri[len("sqlite:///") :]
    if db != ":memory:":
        Path(db).parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{db}.lock"):
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)  # builds the store: tables, migrations
    _STORES_READY.add(uri)


class _NoMlflowRetryWarnings(logging.Filter):
    """Drops urllib3's "Retrying (...) after connection broken ..." warnings about MLflow's REST API: a server that is
    away is said once (pipeline.tracking.outbox), not three times per request; other hosts' retries still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "/api/2.0/mlflow" not in record.getMessage()


def client(uri: str | None = None) -> MlflowClient:
    from mlflow import MlflowClient

    for k, v in _HTTP_DEFAULTS.items():
        os.environ.setdefault(k, v)
    pool_log = logging.getLogger("urllib3.connectionpool")
    if not any(isinstance(f, _NoMlflowRetryWarnings) for f in pool_log.filters):
        pool_log.addFilter(_NoMlflowRetryWarnings())
    uri = uri or tracking_uri()
    if uri.startswith("sqlite:///") and uri not in _STORES_READY:
        _open_sqlite_store(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def artifact_root(tracking_uri: str, experiment: str) -> str | None:
    """The experiment's artifact location on a tracking server when the client writes there itself (s3://... and
    the like); None when the server proxies artifacts (mlflow-artifacts:/), the experiment does not exist yet, or the
    store is a local database (its artifacts are local files beside it; opening it here would create it)."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    try:
        exp = client(tracking_uri).get_experiment_by_name(experiment)
    except Exception:  # noqa: BLE001 - the tracking check itself reports an unreachable server
        return None
    loc = exp.artifact_location if exp else None
    if not loc or not is_uri(loc) or loc.startswith(("file:", "mlflow-artifacts:", "http:", "https:")):
        return None
    return loc
