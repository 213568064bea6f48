"""How every job ends (`run_job`): every failure, raised on the driver, in a stage's Ray task or in a Ray Train worker,
ends as exit code 1 and one line on stderr naming the log that holds its traceback (a `PipelineError`, which the
user can mend, as its message; anything else as an internal error); Ctrl-C and SIGTERM end the job with exit code
130 after its cleanup ran. Each job's command line is `pipeline.config.parser`'s.

    >>> run_job("demo", lambda: 0)
    0
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path
from typing import Callable

from pipeline.errors import PipelineError


def _is_ray_wrapper(e: BaseException) -> bool:
    """True for Ray's own exception types (and the RayTaskError subclasses Ray makes of a task's error)."""
    return any(c.__module__.startswith("ray.") for c in type(e).__mro__[:-1])


def _wrapped(e: BaseException) -> BaseException | None:
    """The exception one Ray wrapper holds, or None. Where each lives (Ray 2.60):
    RayTaskError `.cause`; Ray Train V2's WorkerGroupError `.worker_failures` ({rank: the worker's exception},
    UserExceptionWithTraceback already unwrapped), ControllerError `.controller_failure`,
    WorkerHealthCheckFailedError `.failure`, UserExceptionWithTraceback `._base_exc`; Train V1's
    TrainingFailedError `__cause__`."""
    if not _is_ray_wrapper(e):
        return None
    failures = getattr(e, "worker_failures", None)
    if isinstance(failures, dict) and failures:
        # One rank's own error is usually the story; the others often died of it (a collective that timed out).
        # The lowest rank whose error is a user error, else the lowest rank.
        causes = [root_cause(failures[r]) for r in sorted(failures)]
        return next((c for c in causes if isinstance(c, PipelineError)), causes[0])
    for attr in ("cause", "controller_failure", "failure", "_base_exc"):
        inner = getattr(e, attr, None)
        if isinstance(inner, BaseException):
            return inner
    return e.__cause__


def root_cause(e: BaseException) -> BaseException:
    """A stage's or a Train worker's own exception, out of Ray's wrappers (see `_wrapped`), however nested
    (a RayTaskError of the train stage holds Ray Train's WorkerGroupError, which holds the worker's error)."""
    for _ in range(20):
        inner = _wrapped(e)
        if inner is None or inner is e:
            break
        e = inner
    return e


def log_dir() -> Path:
    """Where a failed job writes its traceback: `$PIPELINE_LOG_DIR`, else `$XDG_STATE_HOME/bert-pipeline/logs`
    (`~/.local/state/bert-pipeline/logs`).

    Why there: it is known before the config is read (a failure while reading it has a log too), always on the
    machine that prints the line (a run's storage may be s3://), never inside a data output (whose contents are
    checked) or a run directory (Ray Train owns it), and it survives the job (not /tmp, which is shared and
    cleaned). XDG's state directory is where logs a user may want later belong.
    """
    if os.environ.get("PIPELINE_LOG_DIR"):
        return Path(os.environ["PIPELINE_LOG_DIR"])
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "bert-pipeline" / "logs"


def write_failure_log(name: str, e: BaseException) -> str:
    """The full traceback of `e` (Ray's wrappers carry the remote ones in their text), credentials redacted, in a
    new file `<log_dir>/<name>-<time>-<pid>.log`; returns its path, or a note when it cannot be written."""
    import datetime
    import traceback

    from pipeline.tracking.server import redact

    text = redact(f"{name} {' '.join(sys.argv[1:])}\n\n" + "".join(traceback.format_exception(e)))
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # Ray colours the remote tracebacks it carries
    try:
        d = log_dir()
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"{name}-{datetime.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}.log"
        path.write_text(text)
        return str(path)
    except OSError as err:
        return f"not written: {err}"


def failure_line(name: str, e: BaseException) -> str:
    """The one stderr line of a failed job: a user error's message, or a bug's type and message; then the log."""
    from pipeline.tracking.server import redact

    cause = root_cause(e)
    msg = (str(cause).strip().splitlines() or [""])[0]
    log = write_failure_log(name, e)
    if isinstance(cause, PipelineError):
        return redact(f"{name}: error: {msg} (log: {log})")
    what = f"{type(cause).__name__}: {msg}" if msg else type(cause).__name__
    if _is_ray_wrapper(cause):  # the cluster's own failure (a node out of memory, an actor that died), no bug
        return redact(f"{name}: error: Ray: {what} (log: {log})")
    return redact(f"{name}: internal error: {what} (a bug; traceback in {log})")


def _terminate(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt(f"signal {signum}")


def run_job(name: str, body: Callable[[], int], *, on_abort: Callable[[str], None] | None = None) -> int:
    """Run `body()`; any exception becomes one stderr line (`failure_line`) and exit 1, Ctrl-C/SIGTERM exit 130.
    `on_abort(status)` runs first on either path (status "FAILED" or "KILLED"), e.g. to end the job's MLflow runs."""
    signal.signal(signal.SIGTERM, _terminate)
    import logging

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # its INFO chatter (DB migrations, waits) is not progress
    try:
        return body()
    except KeyboardInterrupt:
        if on_abort is not None:
            on_abort("KILLED")
        print(f"{name}: interrupted; re-running the same command resumes", file=sys.stderr, flush=True)
        return 130
    except Exception as e:  # noqa: BLE001 - every failure, bugs included, ends as one line; the log keeps the rest
        if on_abort is not None:
            on_abort("FAILED")
        print(failure_line(name, e), file=sys.stderr, flush=True)
        return 1
