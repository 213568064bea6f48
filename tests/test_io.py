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
        holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], cwd=repo_root, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline() == "held\n"
            with pytest.raises(OutputLockedError, match=rf"output {out} is being written by another preparation "
                                                        rf"\(pid {holder.pid} on .+\)"):
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
