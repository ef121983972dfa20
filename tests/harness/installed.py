"""Where the tests find nvc-py's installed commands: pip's scripts directory (where make install
replaced nvc-py and nvc-py-hook by the native front), and the nvc-py console script itself."""

from __future__ import annotations

import shutil
import sys
import sysconfig
from pathlib import Path

SCRIPTS = Path(sysconfig.get_path("scripts"))
HOOK = SCRIPTS / "nvc-py-hook"
FRONT = HOOK.with_name("nvc-py")  # the native front, once make install replaced the console script (so is HOOK)


def _console_script() -> str:
    """The installed nvc-py itself, not a wrapper (a pyenv shim runs bash and pyenv first, which
    the loader-variable cases would count as processes that nvc-py started)."""
    beside = Path(sys.executable).with_name("nvc-py")
    return str(beside) if beside.exists() else shutil.which("nvc-py") or "nvc-py"


NVC = _console_script()
