"""The root of a test helper: an empty directory the unprivileged helper can write to (tests/test_rpc_*.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def jail(tmp_path: Path) -> Path:
    """An empty directory the unprivileged helper can write to, as its root."""
    root = tmp_path / "root"
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    return root
