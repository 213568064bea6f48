"""The console: every line a job prints, from the driver, a stage's Ray task or a Ray Train worker, goes out through
`say`, once.

Why the real stdout: in a Ray Train worker `print()` to `sys.stdout` is patched to go both to the worker's stdout
and to its logger on stderr, and Ray forwards both streams, so every line would appear twice; `sys.__stdout__`
bypasses the patch. Lines for stderr (the data stages' `[data] ...`) go to `sys.stderr` as it is, so that a test's
capture sees them.

    >>> say("step 3/10  loss 7.1000", file=sys.stdout)
    step 3/10  loss 7.1000
"""

from __future__ import annotations

import sys
from typing import TextIO


def say(line: str, file: TextIO | None = None) -> None:
    """Print one console line to `file` (the real stdout when None) and flush it."""
    print(line, file=file or sys.__stdout__, flush=True)
