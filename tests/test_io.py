"""pipeline/storage/io.py: the output directory's writer lock across real processes."""

from __future__ import annotations

import pytest

_HOLD = """
import sys
from pipeline.storage.io import output_lock
with output_lock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_output_lock_one_writer_per_directory(repo_root, tmp_path):
    """A second writer (a real second process) fails at once naming the directory and the holder; the lock is
    re-entrant in its own process, gone with its holder (even a killed one), and a no-op on object stores."""
    import os
    import signal
    import subprocess
    import sys

    from pipeline.storage.io import OutputLockedError, output_lock

    out = tmp_path / "out"
    for kill in (False, True):
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(out)],
            cwd=repo_root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout.readline() == "held\n"
            with pytest.raises(
                OutputLockedError,
                match=rf"output {out} is being written by another preparation "
                rf"\(pid {holder.pid} on .+\)",
            ):
                with output_lock(str(out)):
                    pass
        finally:
            holder.send_signal(signal.SIGKILL) if kill else holder.stdin.close()
            holder.wait()
        assert (out / ".lock").exists() == kill  # a killed holder leaves the file, but not the lock
        with output_lock(str(out)):
            with output_lock(f"file://{out}"):  # re-entrant, and file:// is the same directory
                assert (out / ".lock").read_text() == f"pid {os.getpid()} on {os.uname().nodename}"
        assert not (out / ".lock").exists()
    with output_lock("memory://nolock/out"):
        pass


@pytest.mark.parametrize(
    "err, transient",
    [
        (OSError(28, "No space left on device"), False),  # the same next time: the user frees space
        (OSError(13, "Permission denied"), False),
        (OSError(104, "Connection reset by peer"), True),  # object storage hiccup: worth a retry
    ],
)
def test_a_write_error_says_whether_trying_again_can_help(err, transient):
    """What Ray Train retries (pipeline.cluster.failfast): a user's error never, the environment's yes."""
    from pipeline.errors import PipelineError, is_transient
    from pipeline.storage.io import StorageError, writing

    with pytest.raises(StorageError) as caught:
        with writing("s3://b/out/shard-0.parquet"):
            raise err
    assert is_transient(caught.value) is transient and caught.value.__cause__ is err
    assert is_transient(RuntimeError("a worker died")) and not is_transient(PipelineError("bad value"))
