"""Images whose directories are symbolic links through nvc-py-hook with crun on a real GPU
(``make test-gpu``; issue 14).

The variants of tests/harness/symlinks.py (the same as tests/test_rootfs_symlinks.py runs on the
fake driver), each started by crun with ``nvc-py-hook prestart`` as its prestart hook, against the
real driver at the default root and the host's ldconfig (where /sbin/ldconfig is a script, nvc-py
runs /sbin/ldconfig.real). Each case prints one line for the closing note, before its checks:
``SYMLINK <case> reference-behaviour='…' nvc-py=started|refused: <message>|failed: <…>
gpu-listed=yes|no|n/a host-unchanged=yes|no``.

Where nvidia-container-cli is installed, the same image (a fresh copy, bent the same way) is also
started with the reference as the prestart hook (``nvidia-container-cli --load-kmods configure
--ldconfig=@<host ldconfig> --device=0 --compute --utility --pid=PID ROOTFS``, as in the H100
measurements) and what it did is printed as ``reference-observed='…'``: information for the
parity table, never asserted.

Two cases depend on the runtime rather than on nvc-py, and accept either outcome as long as it is
clean: ``root-readonly`` (runc makes / read-only after the prestart hooks, so the hook can still
make its mount points; a runtime that does it before leaves nvc-py a read-only rootfs, which it
must refuse in one line saying so) and ``rootfs-on-readonly-mount`` (the runtime itself may refuse
a rootfs it cannot write before any hook runs; crun 1.8 instead binds the rootfs afresh, and a bind
does not keep the read-only flag of the mount it copies, so the hook finds it writable and the
container must start with its GPU, as on the H100).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.gpufixtures import crun, gpu_driver  # noqa: F401 - fixtures
from harness.hostwatch import HostWatch, canary, entries  # noqa: F401 - canary: fixture
from harness.runtime import Runc
from harness.symlinks import VARIANTS, Variant, gpu_listed, mount_points, start, start_with, summary, unmerge

pytestmark = pytest.mark.gpu

VERSION_FILE = Path("/proc/driver/nvidia/version")


@pytest.fixture(scope="module")
def driver_version(gpu_driver) -> str:
    """The loaded driver's version (580.159.04 on the H100 machine): the libraries' suffix."""
    text = VERSION_FILE.read_text()
    found = re.search(r"Kernel Module(?: for x86_64)?\s+(\d+\.\d+(?:\.\d+)?)\s", text) or re.search(
        r"\s(\d{3}\.\d+(?:\.\d+)?)\s", text.splitlines()[0] + " " if text else ""
    )
    if found is None:
        pytest.fail(f"no driver version in {VERSION_FILE}: {VERSION_FILE.read_text()!r}")
    return found.group(1)


REFERENCE_HOOK = """#!/bin/sh
pid=$(sed -n 's/.*"pid": *\\([0-9]*\\).*/\\1/p')
exec {cli} --load-kmods configure --ldconfig=@{ldconfig} --device=0 --compute --utility --pid="$pid" {rootfs} \\
    2>>{log}
"""


def _reference(crun: Runc, make_rootfs, tmp_path: Path, away: Path, variant: Variant, version: str) -> str:
    """What nvidia-container-cli does with the same image: started (and whether nvidia-smi -L
    listed GPU 0, whether the host canary stayed as it was) or its error line."""
    cli = shutil.which("nvidia-container-cli")
    if cli is None:
        return "n/a (nvidia-container-cli not installed)"
    work = tmp_path / "reference"
    work.mkdir()
    rootfs = make_rootfs(name="reference-rootfs")
    unmerge(rootfs)
    variant.plant(rootfs, away, version)
    ldconfig = "/sbin/ldconfig.real" if Path("/sbin/ldconfig.real").is_file() else "/sbin/ldconfig"
    script, log = work / "hook.sh", work / "hook.log"
    script.write_text(REFERENCE_HOOK.format(cli=cli, ldconfig=ldconfig, rootfs=rootfs, log=log))
    script.chmod(0o755)
    hook = {
        "path": str(script),
        "args": ["hook.sh"],
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
    }
    try:
        result = start_with(crun, work, rootfs, hook, variant)
    except (OSError, subprocess.SubprocessError) as err:  # information only: never fails the case
        return f"could not run: {err}"
    if result.returncode == 0:
        return f"started gpu-listed={'yes' if gpu_listed(result.stdout) else 'no'}"
    lines = (log.read_text().strip().splitlines() if log.exists() else []) or result.stderr.strip().splitlines()
    return f"refused: {lines[-1] if lines else '(no output)'}"


def _outcome(result: subprocess.CompletedProcess[str], error: str) -> str:
    if result.returncode == 0:
        return "started"
    if error:
        return f"refused: {error}"
    last = result.stderr.strip().splitlines()[-1:] or ["(no output)"]
    return f"failed: {last[0]}"


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_crun_hook_symlinked_image(crun, driver_version, make_rootfs, tmp_path, canary, variant):  # noqa: F811
    rootfs = make_rootfs()
    unmerge(rootfs)
    away = canary / "away"  # a host path the image does not have
    variant.plant(rootfs, away, driver_version)
    config = tmp_path / "config.yaml"
    config.write_text(f"log: {{file: {tmp_path / 'hook.log'}}}\n")
    watch = HostWatch(canary)
    before = entries(rootfs)

    result, error = start(crun, tmp_path, rootfs, config, variant)

    listed = gpu_listed(result.stdout)
    changes = watch.changes()
    observed = _reference(crun, make_rootfs, tmp_path, away, variant, driver_version)
    if watch.changes() != changes:
        observed += " (and the host canary changed)"
    print(summary(variant, _outcome(result, error), listed if result.returncode == 0 else None, not changes, observed))
    assert not changes, changes
    assert "Traceback" not in error + result.stderr
    mountinfo = result.stdout.partition("--- mountinfo\n")[2]
    if variant.name == "root-readonly" and result.returncode != 0:
        assert "Read-only file system" in error and "\n" not in error, result.stderr + error
        return
    if variant.name == "rootfs-on-readonly-mount" and result.returncode != 0 and not error:
        # the runtime refused the rootfs before the hook ran (its message is in the line above)
        assert "read-only" in result.stderr.lower(), result.stderr
        return
    if variant.name == "rootfs-on-readonly-mount" and result.returncode == 0:
        assert listed, result.stdout  # the runtime's own bind of the rootfs is writable
        return
    if variant.refusal is not None:
        assert result.returncode != 0 and not listed
        assert variant.refusal in error and "\n" not in error, result.stderr + error
        assert error.startswith(("mount error: cannot mount on /", "mount error: refusing to mount over /")), error
        assert entries(rootfs) == before  # rolled back
        return
    assert result.returncode == 0, result.stderr + error
    assert listed, result.stdout
    under = variant.mounted_under(away)
    assert any(point.startswith(under + "/") for point in mount_points(mountinfo)), (under, mountinfo)
