"""Print the Python requirements of nvc-py that the running interpreter's environment lacks.

``make pip-deps`` asks this before it runs pip: resolving ``.[test]`` with pip builds the
project and costs seconds even when everything is installed. The requirements come from the
files pip itself would read (setup.cfg's install_requires and test extra, pyproject.toml's
build requirements, needed by ``pip install --no-build-isolation .``), so there is no second
list to keep in step, and they are judged as pip judges them: PEP 508 requirements, PEP 440
versions and specifiers (``packaging``), markers evaluated for this interpreter.

Reading the lists needs only the standard library (configparser, tomllib): tools/debpkg.py reads
the runtime list with the system's Python, which may lack ``packaging``. Judging them needs it;
``make pip-deps`` installs it first where the environment lacks it.
"""

from __future__ import annotations

import configparser
import sys
from importlib import metadata
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg", encoding="utf-8")
    return cfg


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def runtime_requirements() -> list[str]:
    """What nvc-py needs to run (install_requires): what the Debian package bundles (tools/debpkg.py)."""
    return _lines(_setup_cfg()["options"]["install_requires"])


def build_requirements() -> list[str]:
    """pyproject.toml's build-system requirements."""
    with open(REPO / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f).get("build-system", {}).get("requires", []))


def requirements() -> list[str]:
    """Every requirement string: runtime, test extra, build system."""
    return runtime_requirements() + _lines(_setup_cfg()["options.extras_require"]["test"]) + build_requirements()


def missing(reqs: list[str]) -> list[str]:
    """The requirements that apply to this interpreter (their markers) and are not installed, or
    installed at a version their specifier excludes (a pre-release counts as what it is:
    ``2.0rc1`` does not satisfy ``>=2.0``)."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for text in reqs:
        try:
            req = Requirement(text)
        except InvalidRequirement as err:
            raise SystemExit(f"missing_deps: cannot read requirement {text!r}: {err}") from None
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            out.append(text)
            continue
        if not req.specifier.contains(have, prereleases=True):
            out.append(text)
    return out


def extra_requirements(extra: str) -> list[str]:
    """An extra of setup.cfg's beside test: ``lint`` (make lint's tools)."""
    return _lines(_setup_cfg()["options.extras_require"][extra])


if __name__ == "__main__":
    # no argument: what make pip-deps installs; --extra NAME: that extra alone (make lint)
    wanted = extra_requirements(sys.argv[2]) if sys.argv[1:2] == ["--extra"] else requirements()
    print(" ".join(missing(wanted)))
    sys.exit(0)
