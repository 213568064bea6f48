"""One command-line convention for every job: each job's parser (jsonargparse: `--config FILE`, every
`--section.field` with its doc line and default in `--help`, the job's own flags; the overrides themselves are
coerced by pipeline.config, see its docstring for why), and its outcome (`run_job`): every failure, raised on the
driver, in a stage's Ray task or in a Ray Train worker, ends as exit code 1 and one line on stderr naming the log
that holds its traceback; Ctrl-C and SIGTERM end the job with exit code 130 after its cleanup ran.

    >>> run_job("demo", lambda: 0)
    0
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any, Callable

from pipeline.config import ConfigError
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


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(`--section.field value` overrides, the job's own arguments): an option whose name has a dot is an override.

    >>> split_overrides(["--config", "c.yaml", "--train.lr", "1e-4", "--data.inputs=/a", "--input", "x.txt"])
    (['--train.lr', '1e-4', '--data.inputs=/a'], ['--config', 'c.yaml', '--input', 'x.txt'])
    """
    overrides: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        key, eq, _ = argv[i].partition("=")
        n = 1 if eq or i + 1 == len(argv) else 2
        if key.startswith("--") and "." in key:
            overrides += argv[i:i + n]
            i += n
        else:
            rest.append(argv[i])
            i += 1
    return overrides, rest


class _NoSectionFile(argparse.Action):
    """Stands in for the `--<section> FILE` option jsonargparse adds per section: --config is the one config file."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ARG002 - argparse's signature
        raise ConfigError(f"unrecognised argument {option_string!r} (expected --section.field value)")


def config_parser(sections: dict[str, type], description: str | None = None) -> Any:
    """A job's jsonargparse parser: `--config FILE` and, per section, every `--section.field` with its doc line, type
    and default (read from the dataclass). The job adds its own flags to it and parses with `parse_cli`."""
    from jsonargparse import ArgumentParser, DefaultHelpFormatter, set_parsing_settings

    class Formatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
        """Keeps the job docstring's own line breaks."""

    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = ArgumentParser(description=description, exit_on_error=False, conflict_handler="resolve",
                            usage="%(prog)s [options] [--config FILE] [--section.field VALUE ...]",
                            formatter_class=Formatter, env_prefix=False, default_env=False)
    parser.add_argument("--config", default=None, help="YAML preset (sections: " + ", ".join(sections) + "); "
                        "`--section.field value` overrides it, the value read as YAML")
    for name, cls in sections.items():
        parser.add_class_arguments(cls, name, instantiate=False)
        # jsonargparse adds `--<section> FILE` (a file for one section); one --config file is this project's way
        parser.add_argument(f"--{name}", dest=f"{name}_section_file", action=_NoSectionFile, nargs="?",
                            default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def parse_cli(parser: Any, argv: list[str]) -> tuple[Any, list[str]]:
    """(the job's own arguments, parsed by `parser`; its `--section.field value` overrides, for `load_config`).

    jsonargparse prints `--help`; the overrides are not parsed by it: its type checks reject what this project's
    syntax accepts (see the module docstring), so `load_sections` coerces them. A bad argument is a ConfigError.
    """
    overrides, rest = split_overrides(list(argv))
    try:
        args = parser.parse_args(rest)
    except argparse.ArgumentError as e:
        raise ConfigError(" ".join(line.strip() for line in str(e).splitlines())) from None
    return args, overrides
