"""The data stages' console lines: `[data] ...` on stderr, and a pass's progress at most every PROGRESS_EVERY_S.

>>> p = Progress("shard", "units", total=2); p.step(); p.done
1
"""

from __future__ import annotations

import sys

from pipeline.console import Every, say

PROGRESS_EVERY_S = 10.0  # a "[data] <pass>: k/n ..." line at most this often while a pass runs


def log(msg: str) -> None:
    say(f"[data] {msg}", sys.stderr)


class Progress:
    """Counts a pass's finished units and logs `what: done[/total] unit done (Ns)` at most every PROGRESS_EVERY_S
    (the pass's own line says when it ends)."""

    def __init__(self, what: str, unit: str, total: int | None = None) -> None:
        self.what, self.unit, self.total = what, unit, total
        self.done = 0
        self.every = Every(PROGRESS_EVERY_S)

    def step(self) -> None:
        self.done += 1
        if self.done != self.total and self.every.due():
            of = f"/{self.total}" if self.total is not None else ""
            log(f"{self.what}: {self.done}{of} {self.unit} done ({self.every.elapsed():.0f}s)")
