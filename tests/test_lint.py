"""`make lint` passes on the tree: CI runs the suite, so a lint or type error fails CI as a test
failure does (ruff's lint and format check, mypy strict on the pure layers; pyproject.toml)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_make_lint_passes() -> None:
    done = subprocess.run(["make", "-s", "-C", str(REPO), "lint"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
