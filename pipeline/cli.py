"""One command-line convention for every job: each job's parser (jsonargparse: `--config FILE`, every
`--section.field` with its doc line and default in `--help`, the job's own flags; the overrides themselves are
coerced by pipeline.config, see its docstring for why), and its outcome: bad input is exit code 1 with one line on
stderr (no traceback), Ctrl-C and SIGTERM end the job with exit code 130 after its cleanup ran, a bug keeps its
full traceback.

    >>> run_job("demo", lambda: 0)
    0
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any, Callable

from pipeline.config import ConfigError


def user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean bad input or an unusable environment (not a bug): reported in one line."""
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
