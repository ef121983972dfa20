"""pytest fixtures for the hook and its server on the fake driver: the hook's configuration and
hooks.d (and the log line it wrote last), a running ``nvc-py-hook serve``, and /run/nvc-py as a
tmpfs of the test's own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvc.hook.server import handover

from .hookserver import hook_server, umount_when_free
from .installed import HOOK, SCRIPTS


def oci_hooks(config: Path) -> dict[str, list[dict]]:
    """A bundle's prestart and poststop hooks: the installed nvc-py-hook with the configuration ``config``."""
    hook = {
        "path": str(SCRIPTS / "nvc-py-hook"),
        "args": ["nvc-py-hook", "prestart"],
        "env": [f"NVC_PY_CONFIG={config}"],
    }
    return {"prestart": [hook], "poststop": [{**hook, "args": ["nvc-py-hook", "poststop"]}]}


def fake_driver_config(path: Path, root: Path) -> Path:
    """The hook's configuration at ``path``: the fake driver at ``root``, its log beside the file (not the host's)."""
    path.write_text(f"root: {root}\nload-kmods: false\nlog: {{file: {path.parent / 'hook.log'}}}\n")
    return path


@pytest.fixture(scope="module")
def setup_dir(fake_2gpu, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A configuration for the fake driver, and the hooks.d dir `nvc-py setup podman` writes for it."""
    work = tmp_path_factory.mktemp("hook")
    (work / "config.yaml").write_text(
        f"root: {fake_2gpu.root}\nload-kmods: false\nlog: {{file: {work / 'hook.log'}}}\n"
    )
    subprocess.run(
        [
            str(SCRIPTS / "nvc-py"),
            "setup",
            "podman",
            "--hooks-dir",
            str(work / "hooks.d"),
            "--config",
            str(work / "config.yaml"),
        ],
        check=True,
        capture_output=True,
    )
    return work


def last_log_line(setup_dir: Path) -> dict:
    return json.loads((setup_dir / "hook.log").read_text().splitlines()[-1])


@pytest.fixture
def served(active_2gpu) -> Iterator[Path]:
    """A running ``nvc-py-hook serve`` (in this test's mount namespace); yields its socket, in a
    directory of its own under /tmp (which other users can reach, once it is opened to them)."""
    top = Path(tempfile.mkdtemp(prefix="nvc-hook-server-"))
    sock = top / "run" / "hook.sock"
    try:
        with hook_server(HOOK, sock) as proc:
            yield sock
        assert proc.returncode == 0 and not sock.exists()
    finally:
        shutil.rmtree(top)


@pytest.fixture
def default_run_dir(active_2gpu) -> Iterator[Path]:
    """/run/nvc-py, where the registered client looks for the server by default, as a tmpfs seen only
    in this test's private mount namespace (a server of the host's own stays out of sight)."""
    run_dir = Path(handover.DEFAULT_SOCKET).parent
    created = not run_dir.exists()
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0700", "tmpfs", str(run_dir)], check=True)
    try:
        yield run_dir
    finally:
        sched = run_dir / "gpu-sched"  # the scheduler's tmpfs, mounted at a weighted container's first start
        if os.path.ismount(sched):
            subprocess.run(["umount", "-l", str(sched)], check=True)
        umount_when_free(run_dir)
        if created:
            run_dir.rmdir()
