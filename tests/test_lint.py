"""ruff over the whole tree, as configured in pyproject.toml ([tool.ruff]: line length 120; pyflakes, pycodestyle
and `print` outside pipeline.console.say in the packages): `ruff check` and `ruff format --check` both pass."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff_passes(args):
    r = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", "."], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_ruff_flags_a_print_in_the_packages(tmp_path):
    """The `print` rule is on where it matters: a module in pipeline/ that prints is refused, one that says is not."""
    cases = [("bad.py", 'print("x")\n', 1), ("good.py", 'from pipeline.console import say\n\nsay("x")\n', 0)]
    for name, body, code in cases:
        (tmp_path / "pipeline").mkdir(exist_ok=True)
        (tmp_path / "pipeline" / name).write_text(body)
        r = subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(REPO / "pyproject.toml"),
             str(tmp_path / "pipeline" / name)],
            cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert r.returncode == code, r.stdout
        assert ("T201" in r.stdout) == bool(code)
