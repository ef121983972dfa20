"""Hostile ldconfig files through nvc-py-hook with crun on a real GPU (``make test-gpu``; issue 17).

The same images as tests/test_ldconfig_hostile.py (device nodes and FIFOs as ldconfig's files,
a FIFO that ldconfig reads through an include, a kill -9 of configure while ldconfig blocks, a
failure after ldconfig changed the rootfs), against the real driver at the default root and
the host's ldconfig (on the H100 machine /sbin/ldconfig is a script, /sbin/ldconfig.real the
binary). Each case prints one line for the closing note:
``HOSTILE <case> outcome=<...> device-unchanged=<yes|no|n/a> processes-left=<n> seconds=<t>``.
The block device is a loop device over a scratch file, never a disk of the machine.
"""

from __future__ import annotations

import json
import subprocess
import sysconfig
import time
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.gpufixtures import crun, gpu_driver  # noqa: F401 - fixtures
from harness.hostile import (
    CASES,
    PARTIAL_LDCONFIG,
    device_digest,
    kill_during_ldconfig,
    nvc_processes,
    plant,
    plant_fifo_include,
    scratch_block_device,
    tree,
)
from harness.runtime import Runc
from harness.standins import target_process, user_process  # noqa: F401 - fixtures

pytestmark = pytest.mark.gpu

SCRIPTS = Path(sysconfig.get_path("scripts"))
NVC = str(SCRIPTS / "nvc-py")


@pytest.fixture
def block(tmp_path: Path):
    with scratch_block_device(tmp_path) as dev:
        yield dev


def _summary(case: str, outcome: str, unchanged: bool | None, left: list[str], seconds: float) -> None:
    shown = "n/a" if unchanged is None else "yes" if unchanged else "no"
    print(f"HOSTILE {case} outcome={outcome} device-unchanged={shown} processes-left={len(left)} seconds={seconds:.1f}")


def _crun_start(crun: Runc, rootfs: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """Start the image through nvc-py-hook; the result's stderr also holds the hook log's error
    (crun, unlike runc, does not pass a failing hook's stderr on)."""
    config = tmp_path / "config.yaml"
    config.write_text(f"log: {{file: {tmp_path / 'hook.log'}}}\n")
    hook = {
        "path": str(SCRIPTS / "nvc-py-hook"),
        "args": ["nvc-py-hook", "prestart"],
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", f"NVC_PY_CONFIG={config}"],
    }
    bundle = make_bundle(
        tmp_path / "bundle", rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"}, hooks={"prestart": [hook]}
    )
    started = time.monotonic()
    result = crun.create_start(bundle, timeout=60)
    seconds = time.monotonic() - started
    log = tmp_path / "hook.log"
    errors = [json.loads(line).get("error") or "" for line in log.read_text().splitlines()] if log.exists() else []
    result.stderr += "".join(f"hook log: {error}\n" for error in errors if error)
    return result, seconds


def _outcome(result: subprocess.CompletedProcess[str], expect: str) -> str:
    if result.returncode == 0:
        return "started"
    return "refused" if expect in result.stderr else f"failed:{result.stderr.strip().splitlines()[-1:]}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_crun_hook_refuses_hostile_ldconfig_files(crun, make_rootfs, tmp_path, block, case, session_dir):
    rootfs = make_rootfs(name="hostile")
    plant(rootfs, case, block)
    digest, before = device_digest(block), tree(rootfs)

    result, seconds = _crun_start(crun, rootfs, tmp_path)

    unchanged, left = device_digest(block) == digest, nvc_processes(session_dir)
    _summary(case.name, _outcome(result, case.refusal), unchanged, left, seconds)
    assert result.returncode != 0 and case.refusal in result.stderr, result.stderr
    assert unchanged and not left and tree(rootfs) == before
    assert seconds < 10


def test_crun_hook_fifo_read_through_an_include_times_out(crun, make_rootfs, tmp_path, session_dir):
    """ldconfig blocks on a FIFO its checks cannot see: the wall-time limit (20 s) ends the run."""
    rootfs = make_rootfs(name="hostile")
    plant_fifo_include(rootfs)

    result, seconds = _crun_start(crun, rootfs, tmp_path)

    left = nvc_processes(session_dir)
    _summary("fifo-include", _outcome(result, "timed out after 20 s"), None, left, seconds)
    assert result.returncode != 0 and "timed out after 20 s (killed)" in result.stderr, result.stderr
    assert not left and seconds < 40


@pytest.mark.parametrize("owner", ["root", "user"])
def test_killed_configure_leaves_no_process(gpu_driver, make_rootfs, request, owner, session_dir):
    """kill -9 of nvc-py configure (as a runtime's hook timeout does) while ldconfig blocks, run
    as root or (a container of uid 1000) as that user."""
    target_process = request.getfixturevalue("target_process" if owner == "root" else "user_process")
    rootfs = make_rootfs(name="hostile")
    plant_fifo_include(rootfs)
    started = time.monotonic()
    # --no-cgroups: the stand-in shares pytest's cgroup, which a device filter would lock out of /dev.
    below, still = kill_during_ldconfig(
        [
            NVC,
            "configure",
            f"--pid={target_process}",
            "--no-cgroups",
            "--device=0",
            "--compute",
            "--utility",
            str(rootfs),
        ],
        20,
    )
    left = nvc_processes(session_dir)
    _summary(
        f"kill-9-{owner}",
        f"killed-with-{len(below)}-below",
        None,
        left + [str(p) for p in still],
        time.monotonic() - started,
    )
    assert not still and not left


def test_late_failure_leaves_the_rootfs_as_before(gpu_driver, make_rootfs, target_process, tmp_path, session_dir):
    """An ldconfig that replaced the cache and added a link, then failed: everything undone."""
    (tmp_path / "partial.c").write_text(PARTIAL_LDCONFIG)
    subprocess.run(["gcc", "-static", "-O1", "-o", str(tmp_path / "ldconfig"), str(tmp_path / "partial.c")], check=True)
    rootfs = make_rootfs(name="hostile")
    before = tree(rootfs)
    mounts_before = Path(f"/proc/{target_process}/mountinfo").read_text()
    started = time.monotonic()

    result = subprocess.run(
        [
            NVC,
            "configure",
            f"--pid={target_process}",
            "--no-cgroups",
            f"--ldconfig=@{tmp_path / 'ldconfig'}",
            "--device=0",
            "--compute",
            "--utility",
            str(rootfs),
        ],
        capture_output=True,
        text=True,
    )

    same = tree(rootfs) == before and Path(f"/proc/{target_process}/mountinfo").read_text() == mounts_before
    left = nvc_processes(session_dir)
    _summary(
        "rollback",
        f"rc={result.returncode} rootfs-as-before={'yes' if same else 'no'}",
        None,
        left,
        time.monotonic() - started,
    )
    assert result.returncode == 10 and "failed with error code: 1" in result.stderr, result.stderr
    assert same and not left
