"""The one base of every error a user can cause: bad input, a bad config, an unusable environment (storage, the
tracking server, the Ray cluster). The command line (`pipeline.runner.cli`) reports any `PipelineError` as one line
with exit code 1; anything else is a bug and is reported as an internal error. Each subclass keeps the built-in
base it always had (ValueError, RuntimeError), so `except ValueError` around a config still works.

`transient` says whether trying again can help: false for the user's own input and config (a bad file, a bad
value, a vocabulary mismatch: the same every time), true for an environment that may come back (the tracking
server, the Ray cluster, an I/O error of storage other than a full or read-only disk or a refused permission). Ray
Train retries a worker's error `train.max_failures` times only when it is not a PipelineError, or a transient one
(`pipeline.cluster.failfast.FailFast`). `root_cause` finds the error a stage's Ray task or a Train worker raised
inside Ray's wrappers.

    >>> from pipeline.config import ConfigError
    >>> issubclass(ConfigError, PipelineError) and issubclass(ConfigError, ValueError)
    True
"""


class PipelineError(Exception):
    """An error the user can mend (the message says what and where), never a bug in the pipeline."""

    transient: bool = False
    """True when the same work may succeed if tried again (the class's default; an instance may say otherwise)."""


def is_transient(e: BaseException) -> bool:
    """Whether retrying can mend `e`: anything that is not a PipelineError (a crash, a lost node), or a transient one.

    >>> is_transient(RuntimeError("worker died")), is_transient(PipelineError("bad value"))
    (True, False)
    """
    return not isinstance(e, PipelineError) or bool(getattr(e, "transient", False))


def is_ray_wrapper(e: BaseException) -> bool:
    """True for Ray's own exception types (and the RayTaskError subclasses Ray makes of a task's error)."""
    return any(c.__module__.startswith("ray.") for c in type(e).__mro__[:-1])


def _wrapped(e: BaseException) -> BaseException | None:
    """The exception one Ray wrapper holds, or None. Where each lives (Ray 2.60):
    RayTaskError `.cause`; Ray Train V2's WorkerGroupError `.worker_failures` ({rank: the worker's exception},
    UserExceptionWithTraceback already unwrapped), ControllerError `.controller_failure`,
    WorkerHealthCheckFailedError `.failure`, UserExceptionWithTraceback `._base_exc`; Train V1's
    TrainingFailedError `__cause__`."""
    if not is_ray_wrapper(e):
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
