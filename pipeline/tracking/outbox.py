"""Training that outlives the tracking server: a run's metrics and tags on their way to MLflow, sent by a
background thread (`Outbox`, used by `pipeline.tracking.RunLogger(background=True)` on rank 0 of the training
loops); the stages that cannot go on without the server wait for it in `pipeline.tracking.wait`.

MLflow's own async logging (`log_batch(synchronous=False)`) does not do this: a batch that fails is logged as an
error and dropped (`AsyncLoggingQueue._log_run_data` in mlflow/utils/async_logging). Here a batch that fails stays
queued and is retried, with backoff up to `max_backoff_s`, until the server answers; the console says once when it
went away (with the time) and once when it is back.

- Exactly once per step: a key's rows are sent in step order, and a row at a step the server already has for that
  key is dropped. The server's newest step per key is read before a key's first send and again after any failure
  (a batch whose reply was lost may have been stored). A row's timestamp is taken when it is queued, so a batch sent
  twice is identical, which MLflow's SQL store also deduplicates.
- Bounded: at most `max_in_memory` rows are held in memory; the older ones are spilled to a JSON-lines file in a
  private temporary directory (removed by `close`) and sent first.
- Durable: `pending()` is everything not yet known sent. The training loops write it into each checkpoint
  (`write_pending`, `PENDING_FILE`), so a restarted worker, or the evaluate stage of a re-run, sends what a worker
  could not (`read_pending`); what was sent meanwhile is dropped as above.

    >>> box = Outbox(client(), run_id)                                      # doctest: +SKIP
    >>> box.put([("train/loss", 7.1, 1700000000000, 1)]); box.close(10)   # doctest: +SKIP
    True
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from typing import Any, Callable

from pipeline.console import say

Row = tuple[str, float, int, int]
"""(key, value, timestamp in ms, step)"""

PENDING_FILE = "mlflow_pending.json"
"""The unsent metrics and tags of a run, in a checkpoint directory (written by rank 0)."""


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _duration(s: float) -> str:
    """`_duration(75)` -> '1m15s'."""
    return f"{int(s // 60)}m{int(s % 60):02d}s" if s >= 60 else f"{s:.0f}s"


class Outbox:
    """Queue of one run's metric rows and tags; a daemon thread sends them with `client.log_batch`."""

    def __init__(
        self,
        client,
        run_id: str,
        *,
        say: Callable[[str], None] = say,
        max_in_memory: int = 100_000,
        batch_size: int = 1000,
        max_backoff_s: float = 30.0,
    ):
        self.client, self.run_id, self.say = client, run_id, say
        self.max_in_memory, self.batch_size, self.max_backoff_s = max(1, max_in_memory), batch_size, max_backoff_s
        self._rows: deque[Row] = deque()  # the newest rows
        self._spill_dir: str | None = None
        self._spill_pos = 0  # byte offset of the first unsent row in the spill file
        self._spills = 0  # how many times rows moved to the spill file (a batch taken from memory may move with them)
        self._tags: dict[str, str] = {}
        self._server_step: dict[str, int] = {}  # the newest step the server has, per key (read lazily)
        self._cv = threading.Condition()
        self._closing = self._abandon = False
        self._sending = False
        self._away_since: float | None = None
        self.rejected = 0
        self._thread = threading.Thread(target=self._loop, name="mlflow-outbox", daemon=True)
        self._thread.start()

    # -- the caller's side ---------------------------------------------------------------------------------------
    def put(self, rows: list[Row]) -> None:
        """Queue rows (never blocks on the server, never raises for it)."""
        if not rows:
            return
        with self._cv:
            self._rows.extend(rows)
            if len(self._rows) > self.max_in_memory:
                self._spill()
            self._cv.notify_all()

    def put_tags(self, tags: dict[str, Any]) -> None:
        with self._cv:
            self._tags.update({k: str(v) for k, v in tags.items()})
            self._cv.notify_all()

    def pending(self) -> dict[str, Any]:
        """{"metrics": [[key, value, timestamp, step], ...], "tags": {...}}: what is not known sent, oldest first."""
        with self._cv:
            spilled = [json.loads(line) for line in self._read_spill(None)[0]]
            return {"metrics": spilled + [list(r) for r in self._rows], "tags": dict(self._tags)}

    @property
    def away_since(self) -> float | None:
        """When the server stopped answering (time.time()), or None while it answers."""
        return self._away_since

    def flush(self, timeout: float, away_timeout: float | None = None) -> bool:
        """Wait up to `timeout` s for everything queued to be sent (retrying at once); True when it was. Once the
        server is found away (before or during the wait), wait at most `away_timeout` s more."""
        deadline = time.monotonic() + timeout
        with self._cv:
            self._cv.notify_all()  # a sender waiting out its backoff tries again now
            while self._has_work() or self._sending:
                if away_timeout is not None and self._away_since is not None:
                    deadline, away_timeout = min(deadline, time.monotonic() + away_timeout), None
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cv.wait(min(left, 1.0))
                self._cv.notify_all()
            return True

    def close(self, timeout: float, away_timeout: float | None = None) -> bool:
        """Send what is queued (for up to `timeout` s; `away_timeout` as in `flush`), stop the thread and remove the
        spill; True when all was sent."""
        with self._cv:
            self._closing = True
        done = self.flush(timeout, away_timeout)
        with self._cv:
            self._abandon = True
            self._cv.notify_all()
        self._thread.join(timeout=1.0)  # a send in flight is bounded by MLflow's HTTP retries; the thread is a daemon
        return done

    # -- the spill file (all under self._cv) -----------------------------------------------------------------------
    def _spill_path(self) -> str | None:
        return os.path.join(self._spill_dir, "rows.jsonl") if self._spill_dir else None

    def _spill(self) -> None:
        """Move the rows held in memory to the end of the spill file (they are newer than what it holds)."""
        if self._spill_dir is None:
            self._spill_dir = tempfile.mkdtemp(prefix="mlflow-outbox-")
        with open(self._spill_path(), "a") as f:
            f.writelines(json.dumps(list(r)) + "\n" for r in self._rows)
        self._rows.clear()
        self._spills += 1

    def _read_spill(self, limit: int | None) -> tuple[list[str], int]:
        """Up to `limit` unsent lines of the spill file and the offset after them."""
        path = self._spill_path()
        if path is None or not os.path.exists(path):
            return [], self._spill_pos
        with open(path) as f:
            f.seek(self._spill_pos)
            lines = []
            while limit is None or len(lines) < limit:
                line = f.readline()
                if not line:
                    break
                lines.append(line)
            return lines, f.tell()

    def _has_work(self) -> bool:
        path = self._spill_path()
        return bool(self._rows or self._tags) or (
            path is not None and os.path.exists(path) and os.path.getsize(path) > self._spill_pos
        )

    # -- the sender thread -----------------------------------------------------------------------------------------
    def _take(self) -> tuple[list[Row], dict[str, str], int | None, int]:
        """The next batch (oldest first), the tags, the spill offset after the batch (None: from memory) and the
        spill count."""
        lines, pos = self._read_spill(self.batch_size)
        if lines:
            return [tuple(json.loads(line)) for line in lines], dict(self._tags), pos, self._spills
        return (
            [self._rows[i] for i in range(min(self.batch_size, len(self._rows)))],
            dict(self._tags),
            None,
            self._spills,
        )

    def _done(self, rows: list[Row], tags: dict[str, str], pos: int | None, spills: int) -> None:
        if pos is None and spills != self._spills:  # the batch moved from memory to the head of the spill file
            pos = self._spill_pos
            with open(self._spill_path()) as f:
                f.seek(pos)
                for _ in rows:
                    f.readline()
                pos = f.tell()
        if pos is not None:
            self._spill_pos = pos
            path = self._spill_path()
            if path and pos >= os.path.getsize(path):  # all of it sent
                os.remove(path)
                self._spill_pos = 0
        else:
            for _ in rows:
                self._rows.popleft()
        for k, v in tags.items():
            if self._tags.get(k) == v:
                del self._tags[k]

    def _loop(self) -> None:
        try:
            self._send_until_closed()
        finally:  # closed (or a bug): the spill file goes; `pending()` was the way to keep its rows
            if self._spill_dir is not None:
                shutil.rmtree(self._spill_dir, ignore_errors=True)

    def _send_until_closed(self) -> None:
        backoff = 1.0
        while True:
            with self._cv:
                while not self._has_work() and not self._abandon:
                    self._cv.wait()
                if self._abandon:
                    return
                rows, tags, pos, spills = self._take()
                self._sending = True
            attempt = time.time()
            try:
                self._send(rows, tags)
            except Exception as e:  # noqa: BLE001 - whatever went wrong, training goes on and the rows stay queued
                if _rejected(e):  # the server answered and refused this batch: retrying cannot help
                    self.rejected += len(rows)
                    self.say(f"[tracking] MLflow rejected {len(rows)} metric values: {str(e).splitlines()[0][:300]}")
                else:
                    self._went_away(attempt)
                    self._server_step.clear()  # a batch whose reply was lost may be stored: re-read the steps
                    with self._cv:
                        self._sending = False
                        self._cv.notify_all()
                        if not self._abandon:
                            self._cv.wait(backoff)  # flush() wakes it to try again at once
                    backoff = min(backoff * 2, self.max_backoff_s)
                    continue
            else:
                backoff = 1.0
                self._came_back()
            with self._cv:
                self._done(rows, tags, pos, spills)
                self._sending = False
                self._cv.notify_all()

    def _send(self, rows: list[Row], tags: dict[str, str]) -> None:
        from mlflow.entities import Metric, RunTag  # here: the other ranks read the outbox without mlflow

        sent: dict[str, int] = {}
        metrics = []
        for key, value, ts, step in rows:
            if key not in self._server_step:
                self._server_step[key] = max(
                    (m.step for m in self.client.get_metric_history(self.run_id, key)), default=-1
                )
            if step > sent.get(key, self._server_step[key]):
                metrics.append(Metric(key, float(value), int(ts), int(step)))
                sent[key] = int(step)
        if metrics or tags:
            self.client.log_batch(self.run_id, metrics=metrics, tags=[RunTag(k, v) for k, v in tags.items()])
        self._server_step.update(sent)

    def _went_away(self, since: float) -> None:
        if self._away_since is None:
            self._away_since = since
            self.say(
                f"[tracking] MLflow server {self.client.tracking_uri} unreachable since {_clock(self._away_since)}; "
                "training goes on, metrics are kept and sent when it answers"
            )

    def _came_back(self) -> None:
        if self._away_since is not None:
            now = time.time()
            with self._cv:
                waiting = len(self._rows)
            self.say(
                f"[tracking] MLflow server {self.client.tracking_uri} answers again at {_clock(now)} (away "
                f"{_duration(now - self._away_since)}); sending the metrics kept meanwhile ({waiting:,} still queued)"
            )
            self._away_since = None


def _rejected(e: Exception) -> bool:
    """True for an HTTP 4xx answer (other than 429, too many requests): the server is there and refuses the batch."""
    from mlflow.exceptions import MlflowException

    code = e.get_http_status_code() if isinstance(e, MlflowException) else None
    return code is not None and 400 <= code < 500 and code != 429


def write_pending(directory: str, run_id: str, pending: dict[str, Any]) -> None:
    """`PENDING_FILE` in a (local) checkpoint directory, when anything is pending."""
    if pending["metrics"] or pending["tags"]:
        with open(os.path.join(directory, PENDING_FILE), "w") as f:
            json.dump({"run_id": run_id, **pending}, f)


def read_pending(checkpoint: str, run_id: str) -> dict[str, Any] | None:
    """The pending metrics and tags of `run_id` stored in a checkpoint (a local path or a URI), or None."""
    from pipeline.storage.io import exists, join, read_bytes

    path = join(checkpoint, PENDING_FILE)
    if not exists(path):
        return None
    try:
        data = json.loads(read_bytes(path))
    except ValueError as e:  # unreadable: training must not stop for it (those metric values stay missing)
        say(f"[tracking] ignoring {path}: not JSON ({e}); the metric values it held are not sent")
        return None
    return data if isinstance(data, dict) and data.get("run_id") == run_id else None
