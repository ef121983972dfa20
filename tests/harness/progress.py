"""Lines on the terminal while a long phase of a test runs (debootstrap, a chroot's install, an image
or package build): what it is doing when it starts, and how long it took when it ends, shown at once
although pytest captures the test's own output, so that a test of a minute is not one silent dot.
Outside pytest (demo/run.py) they go to stdout."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

_config: pytest.Config | None = None


def attach(config: pytest.Config) -> None:
    """Write through this session's terminal (tests/conftest.py's pytest_configure)."""
    global _config
    _config = config


def say(line: str) -> None:
    reporter = _config.pluginmanager.get_plugin("terminalreporter") if _config is not None else None
    if reporter is None:
        print(line, flush=True)
        return
    capture = _config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else nullcontext():
        reporter.ensure_newline()
        reporter.write_line(line)


@contextmanager
def phase(what: str) -> Iterator[None]:
    """``what`` said as the body starts, and again with its duration (or its failure) as it ends."""
    say(f"  {what} ...")
    started = time.monotonic()
    try:
        yield
    except BaseException:
        say(f"  {what}: failed after {time.monotonic() - started:.0f} s")
        raise
    say(f"  {what}: {time.monotonic() - started:.0f} s")
