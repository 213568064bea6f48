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

from pipeline.console import say
from pipeline.errors import PipelineError, is_ray_wrapper, root_cause


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

    text = f"{name} {' '.join(sys.argv[1:])}\n\n" + "".join(traceback.format_exception(e))
    for note in getattr(root_cause(e), "__notes__", ()):  # a Train worker's own traceback (pipeline.cluster.train)
        if note not in text:
            text += f"\n{note}"
    text = redact(text)
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
    if is_ray_wrapper(cause):  # the cluster's own failure (a node out of memory, an actor that died), no bug
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
        say(f"{name}: interrupted; re-running the same command resumes", sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every failure, bugs included, ends as one line; the log keeps the rest
        if on_abort is not None:
            on_abort("FAILED")
        say(failure_line(name, e), sys.stderr)
        return 1
