"""The console: every line a job prints, from the driver, a stage's Ray task or a Ray Train worker, goes out through
`say`, once; progress lines at most every so many seconds, by `Every`.

Why the real stdout: in a Ray Train worker `print()` to `sys.stdout` is patched to go both to the worker's stdout
and to its logger on stderr, and Ray forwards both streams, so every line would appear twice; `sys.__stdout__`
bypasses the patch. Lines for stderr (the data stages' `[data] ...`) go to `sys.stderr` as it is, so that a test's
capture sees them.

    >>> say("step 3/10  loss 7.1000", file=sys.stdout)
    step 3/10  loss 7.1000
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def say(line: str, file: TextIO | None = None) -> None:
    """Print one console line to `file` (the real stdout when None) and flush it."""
    print(line, file=file or sys.__stdout__, flush=True)


class Every:
    """The rate limit of every progress line (the data passes', the training loops'): `due()` is true at most once
    per `seconds` of the monotonic clock, counted from the last time it was true, or from `start()`.

        >>> e = Every(60.0); e.due(), e.due(now=e.last + 61), e.due(now=e.last + 1)
        (False, True, False)
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start()

    def start(self, now: float | None = None) -> None:
        self.first = self.last = time.monotonic() if now is None else now

    def elapsed(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.first

    def due(self, now: float | None = None, *, force: bool = False) -> bool:
        """True (and the clock restarts) when `seconds` have passed since the last true, or `force`."""
        now = time.monotonic() if now is None else now
        if force or now - self.last >= self.seconds:
            self.last = now
            return True
        return False
