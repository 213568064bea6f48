"""Ray Train retries what can mend, never the user's own error.

A worker that raises a bad file, a bad value or a vocabulary mismatch (a `PipelineError` that is not transient,
`pipeline.errors.is_transient`) fails the same way on every attempt; Ray Train would restart the worker group
`train.max_failures` times before saying so. `FailFast`, a Ray Train callback that runs in its controller, raises
that error there instead: Ray Train's failure policy stops at once on a controller error (it retries worker-group
errors, not controller ones), and `pipeline.errors.root_cause` finds the worker's error inside it, so the user
reads its one line after one attempt. Crashes, lost nodes and transient errors keep their `max_failures` retries.
"""

from __future__ import annotations

import logging

from ray.train import UserCallback

from pipeline.errors import is_transient, root_cause

_CONTROLLER_LOGGER = "ray.train.v2._internal.execution.controller.controller"


class FailFast(UserCallback):
    """Raise a worker's non-transient PipelineError in the controller (lowest rank first): no retry."""

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:  # noqa: ARG002
        for rank in sorted(worker_exceptions):
            if not is_transient(root_cause(worker_exceptions[rank])):
                # The controller would log this error's traceback on the console ("Error in control loop
                # iteration"); the job prints it as one line and keeps the traceback in its failure log.
                logging.getLogger(_CONTROLLER_LOGGER).setLevel(logging.CRITICAL)
                raise worker_exceptions[rank]  # Ray's wrapper, whose text is the worker's traceback
