"""The Makefile's install step (run by `make test`, `demo` and `try`): skipped while nothing of the
package changed since this tree installed it, done again once a file of it is newer or gone."""

from __future__ import annotations

import json
import os
import subprocess
import time
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
STAMP = Path("/usr/lib/nvc-py/.installed")  # the Makefile's INSTALL_STAMP: the files it installed from
PACKAGE_BUILD = "--no-deps --no-index --no-build-isolation ."  # the recipe line that builds and installs nvc-py


def _installs() -> bool:
    """Whether `make install` would install the package again (its dry run names the build)."""
    dry = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(REPO), "install"], capture_output=True, text=True, timeout=60
    )
    assert dry.returncode == 0, dry.stderr
    return PACKAGE_BUILD in dry.stdout


def test_install_again_only_once_a_file_of_the_package_changed() -> None:
    origin = json.loads(metadata.distribution("nvc-py").read_text("direct_url.json") or "{}").get("url")
    if origin != f"file://{REPO}":
        pytest.skip(f"the installed nvc-py is not this tree's ({origin}): nothing to compare with")
    assert not _installs()
    source = REPO / "nvc" / "errors.py"
    before = source.stat()
    try:
        later = time.time() + 5
        os.utime(source, (later, later))
        assert _installs()
    finally:
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert not _installs()
    installed = STAMP.read_text()
    try:
        STAMP.write_text(installed + "nvc/removed_since.py\n")  # a file the install had, gone from the tree
        assert _installs()
    finally:
        STAMP.write_text(installed)
    assert not _installs()


def test_make_uninstall_names_every_file_the_programs_keep_in_the_run_directory() -> None:
    """What the programs write to /run/nvc-py beside the containers' sharing state (caches, the
    server's socket, the device plugin's file) is each in the Makefile's RUN_FILES, which `make
    uninstall` removes; else the run directory outlives the uninstall."""
    import re

    from nvc.config import yamlfile
    from nvc.discover import elf, keptfiles, procfs
    from nvc.hook.oci import runtimecache
    from nvc.k8s import published
    from nvc.system import confinement, programs

    listed = re.search(r"^RUN_FILES := ((?:.*\\\n)*.*)$", (REPO / "Makefile").read_text(), re.M)
    assert listed is not None
    names = set(listed[1].replace("\\\n", " ").split())
    kept = [
        yamlfile.CACHE_PATH,
        elf.LINKS_CACHE,
        procfs.MIG_MINORS_KEPT,
        keptfiles.DIRECTORY,
        runtimecache.CACHE_PATH,
        programs.DEFAULT_SOCKET,
        published.FILE,
        *(confinement.SECCOMP_CACHE.format(name) for name in confinement.SECCOMP_FILTERS),
    ]
    assert all(path.startswith("/run/nvc-py/") for path in kept)
    assert {path.removeprefix("/run/nvc-py/") for path in kept} - names == set()
