"""Print the Python requirements of nvc-py that the running interpreter's environment lacks.

``make pip-deps`` asks this before it runs pip: resolving ``.[test]`` with pip builds the
project and costs seconds even when everything is installed. The requirements come from the
files pip itself would read (setup.cfg's install_requires and test extra, pyproject.toml's
build requirements, needed by ``pip install --no-build-isolation .``), so there is no second
list to keep in step. Only ``name>=version`` and bare names occur there; that is all this reads.
"""

from __future__ import annotations

import configparser
import re
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:>=\s*([0-9][0-9.]*))?\s*$")


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg", encoding="utf-8")
    return cfg


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def runtime_requirements() -> list[str]:
    """What nvc-py needs to run (install_requires): what the Debian package bundles (tools/debpkg.py)."""
    return _lines(_setup_cfg()["options"]["install_requires"])


def requirements() -> list[str]:
    """Every requirement string: runtime, test extra, build system."""
    build = re.search(r"requires\s*=\s*\[(.*?)\]", (REPO / "pyproject.toml").read_text(encoding="utf-8"), re.S)
    return (runtime_requirements() + _lines(_setup_cfg()["options.extras_require"]["test"])
            + (re.findall(r'"([^"]+)"', build.group(1)) if build else []))


def numbers(version: str) -> tuple[int, ...]:
    """The leading numeric release of ``version`` (``8.1.7`` → (8, 1, 7); ``2.0rc1`` → (2, 0))."""
    return tuple(int(part) for part in re.findall(r"\d+", re.match(r"[\d.]*", version).group(0)))


def split(req: str) -> tuple[str, str | None]:
    """(name, least version or None) of a requirement string."""
    match = _REQUIREMENT.match(req)
    if match is None:
        raise SystemExit(f"missing_deps: cannot read requirement {req!r} (only NAME or NAME>=VERSION)")
    name, least = match.groups()
    return name, least


def missing(reqs: list[str]) -> list[str]:
    """The requirements not installed, or installed at a lower version than asked."""
    out = []
    for req in reqs:
        name, least = split(req)
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            out.append(req)
            continue
        if least and numbers(have) < numbers(least):
            out.append(req)
    return out


if __name__ == "__main__":
    print(" ".join(missing(requirements())))
    sys.exit(0)
