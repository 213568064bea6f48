"""The one base of every error a user can cause: bad input, a bad config, an unusable environment (storage, the
tracking server, the Ray cluster). The command line (`pipeline.runner.cli`) reports any `PipelineError` as one line
with exit code 1; anything else is a bug and is reported as an internal error. Each subclass keeps the built-in
base it always had (ValueError, RuntimeError), so `except ValueError` around a config still works.

    >>> from pipeline.config import ConfigError
    >>> issubclass(ConfigError, PipelineError) and issubclass(ConfigError, ValueError)
    True
"""


class PipelineError(Exception):
    """An error the user can mend (the message says what and where), never a bug in the pipeline."""
