"""A script of bench/ loaded as a module, for the tests of its pure parts (the scripts are not a package's)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent.parent


def load(name: str) -> ModuleType:
    """bench/NAME.py, run as the module ``bench_NAME``."""
    loader = importlib.machinery.SourceFileLoader(f"bench_{name}", str(REPO / "bench" / f"{name}.py"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(f"bench_{name}", loader))
    loader.exec_module(module)
    return module
