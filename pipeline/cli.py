"""One command-line convention for every job: bad input is exit code 1 with one line on stderr (no traceback),
Ctrl-C and SIGTERM end the job with exit code 130 after its cleanup ran, a bug keeps its full traceback.

    >>> run_job("demo", lambda: 0)
    0
"""

from __future__ import annotations

import signal
import sys
from typing import Callable


def user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean bad input or an unusable environment (not a bug): reported in one line."""
    from pipeline.config import ConfigError
    from pipeline.core.checkpoint import CheckpointMismatch
    from pipeline.core.launcher import RayStartError
    from pipeline.data.dataset import DataValidationError
    from pipeline.data.prepare import OutputExistsError
    from pipeline.data.sources import InputError
    from pipeline.data.tokenizer import VocabError
    from pipeline.io import StorageError
    from pipeline.tracking import TrackingError

    return (ConfigError, CheckpointMismatch, RayStartError, DataValidationError, OutputExistsError, InputError,
            VocabError, StorageError, TrackingError)


def root_cause(e: BaseException) -> BaseException:
    """A stage's own exception out of Ray's wrappers (RayTaskError and Train errors keep it as .cause)."""
    for _ in range(10):
        nxt = getattr(e, "cause", None) or (e.__cause__ if type(e).__name__.startswith(("RayTaskError", "TrainingFailed", "WorkerGroupError")) else None)
        if nxt is None or nxt is e:
            break
        e = nxt
    return e


def _terminate(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt(f"signal {signum}")


def run_job(name: str, body: Callable[[], int], *, extra_errors: tuple[type[BaseException], ...] = (),
            on_abort: Callable[[str], None] | None = None) -> int:
    """Run `body()`; map user errors to one stderr line + exit 1, Ctrl-C/SIGTERM to exit 130. `on_abort(status)`
    runs first on either path (status "FAILED" or "KILLED"), e.g. to end the job's MLflow runs."""
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
    except Exception as e:
        if on_abort is not None:
            on_abort("FAILED")
        cause = root_cause(e)
        if isinstance(cause, user_errors() + extra_errors):
            print(f"{name}: error: {cause}".splitlines()[0], file=sys.stderr, flush=True)
            return 1
        raise
