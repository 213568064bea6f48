"""The stages that cannot go on without the tracking server (evaluate, register; fine-tuning's export and
register): a bounded wait for it (`tracking.server_wait_s`), then one line that says what could not be done and
that a re-run completes it. Training itself never waits: its metrics wait in `pipeline.tracking.outbox.Outbox`.
"""

from __future__ import annotations

import contextlib
import sys
import time

from mlflow.exceptions import MlflowException

from pipeline.console import say
from pipeline.tracking import server as tracking_server


def wait_for_server(uri: str, wait_s: float, what: str) -> None:
    """Return once an http(s) tracking server answers; while it does not, say so once and poll for up to `wait_s`
    seconds, then raise a one-line `TrackingError` that says what could not be done and that a re-run completes it.
    Local stores and a server that answers return at once."""
    if not uri.startswith(("http://", "https://")):
        return
    since = None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            tracking_server.check_tracking_server(uri, timeout=10)
        except tracking_server.ServerUnreachable:
            if since is None:
                since = time.time()
                say(
                    f"[tracking] MLflow server {uri} unreachable at {time.strftime('%H:%M:%S')}; waiting up to "
                    f"{wait_s:.0f}s to {what}",
                    sys.stdout,
                )
            if time.monotonic() >= deadline:
                raise tracking_server.ServerUnreachable(
                    f"MLflow tracking server {uri} unreachable since {time.strftime('%H:%M:%S', time.localtime(since))} "  # noqa: E501
                    f"(waited {wait_s:.0f}s), so could not {what}; checkpoints and unsent metrics are kept: re-run the "
                    "same command once the server is back (tracking.server_wait_s sets the wait)"
                ) from None
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
            continue
        if since is not None:
            say(f"[tracking] MLflow server {uri} answers again at {time.strftime('%H:%M:%S')}", sys.stdout)
        return


@contextlib.contextmanager
def server_needed(uri: str, wait_s: float, what: str):
    """A block that needs the tracking server: `wait_for_server` first, and an MLflow error inside it while the
    server does not answer becomes the same one-line `TrackingError` (the server went away meanwhile)."""
    wait_for_server(uri, wait_s, what)
    try:
        yield
    except MlflowException:
        try:
            tracking_server.check_tracking_server(uri, timeout=10)
        except tracking_server.ServerUnreachable as e:
            raise tracking_server.ServerUnreachable(
                f"{e}".split(";")[0] + f" while trying to {what}; re-run the same command once the server is back"
            ) from None
        raise
