"""The Debian package as the tests build it (``make deb``): once from the clone (``deb``), and once more
at a lower version from the tree a release tarball holds (``debs``: old and new, the two builds side
by side), for the tests of tests/test_deb*.py; built once per session."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness import debroot, progress

REPO = debroot.REPO
PIP_CACHE = debroot.CACHE / "deb-pip"  # the builds' own pip cache (tools/debpkg.py says why), kept between runs
# The release tree's build, beside the clone's, has one of its own: pip's wheel cache is not safe for two
# installs at once (each builds python-prctl and records the download's origin in the same file).
RELEASE_PIP_CACHE = debroot.CACHE / "deb-pip-release"
# What the tests check is the package's files and what installing it does, not its size: xz's default level
# is a third of a build's time, level 1 a few percent of it (docs/install.md).
XZ_LEVEL = 1


def version() -> str:
    text = (REPO / "nvc/__init__.py").read_text()
    return text.split('__version__ = "', 1)[1].split('"', 1)[0]


def _make_deb(tree: Path, out: Path, version: str, pip_cache: Path = PIP_CACHE) -> list[str]:
    return [
        "make",
        "-C",
        str(tree),
        "--no-print-directory",
        "deb",
        f"DEB_DIR={out}",
        f"DEB_VERSION={version}",
        f"DEB_PIP_CACHE={pip_cache}",
        f"DEB_XZ_LEVEL={XZ_LEVEL}",
    ]


def _what(tree: Path, version: str) -> str:
    return f"make deb: the package at version {version} from {tree}"


def build_deb(tree: Path, out: Path, version: str) -> Path:
    with progress.phase(_what(tree, version)):
        debroot.run(_make_deb(tree, out, version), 600)
    return next(out.glob("nvc-py_*.deb"))


@contextmanager
def building_deb(tree: Path, out: Path, version: str, pip_cache: Path) -> Iterator[Callable[[], Path]]:
    """``build_deb`` begun in the background: the body runs beside it (the other build: on two cores
    the two take about half as long as one after the other) and calls what it yields to wait for
    the package. A build still running when the body fails is killed."""
    with progress.phase(_what(tree, version) + ", in the background"), tempfile.TemporaryFile("w+") as log:
        build = subprocess.Popen(
            _make_deb(tree, out, version, pip_cache), stdout=log, stderr=subprocess.STDOUT, text=True
        )

        def package() -> Path:
            status = build.wait(600)
            log.seek(0)
            assert status == 0, f"make deb in {tree} failed ({status}):\n{log.read()[-8000:]}"
            return next(out.glob("nvc-py_*.deb"))

        try:
            yield package
        finally:
            if build.poll() is None:
                build.kill()
                build.wait()


def _git(*args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()


def release_tree(dest: Path) -> Path:
    """This tree as a release tarball holds it: ``git archive`` of a commit of the working tree as it
    is (untracked files too, through a temporary index: the repository's index and branches are not
    touched), unpacked into ``dest``; no .git."""
    with tempfile.TemporaryDirectory(prefix="nvc-deb-index-") as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": f"{tmp}/index"}
        _git("read-tree", "HEAD", env=env)
        _git("add", "-A", env=env)
        tree = _git("write-tree", env=env)
    when = _git("log", "-1", "--format=%cI")
    who = {
        "GIT_AUTHOR_NAME": "test_deb",
        "GIT_AUTHOR_EMAIL": "test@nvc-py.invalid",
        "GIT_AUTHOR_DATE": when,
        "GIT_COMMITTER_NAME": "test_deb",
        "GIT_COMMITTER_EMAIL": "test@nvc-py.invalid",
        "GIT_COMMITTER_DATE": when,
    }
    commit = _git("commit-tree", tree, "-p", "HEAD", "-m", "test_deb: the working tree", env={**os.environ, **who})
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit], capture_output=True, check=True
    ).stdout
    dest.mkdir()
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


@pytest.fixture(scope="session")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built from the clone."""
    return build_deb(REPO, tmp_path_factory.mktemp("deb-new"), version())


@pytest.fixture(scope="session")
def debs(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> dict[str, Path]:
    """The package built twice: ``old``, at a lower version, from this tree as a release tarball
    holds it (no .git), and ``new`` from the clone (``deb``, built meanwhile where no test has yet)."""
    base = tmp_path_factory.mktemp("deb")
    release = release_tree(base / "release")
    assert not (release / ".git").exists() and (release / "Makefile").is_file()
    with building_deb(release, base / "old", f"{version()}~test1", RELEASE_PIP_CACHE) as old:
        new = request.getfixturevalue("deb")
        return {"old": old(), "new": new}
