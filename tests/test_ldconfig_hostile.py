"""Images whose ldconfig files are device nodes or FIFOs (issue 17, findings 1, 2 and 5's rollback).

Through real containers: runc with nvc-py-hook as the prestart hook, podman with the hooks.d
file of ``nvc-py setup podman``, the CDI ``update-ldcache`` hook; and ``configure --pid``
killed with SIGKILL while ldconfig blocks, and failing after ldconfig changed the rootfs.
Each case asserts that the scratch block device's bytes are unchanged, that configure ended
at once with one line naming the file, that the rootfs is as before (rolled back), and that
no process nvc-py started is left. Test double: the fake driver; nothing here is a GPU result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sysconfig
import time
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.hostile import (
    CASES,
    PARTIAL_LDCONFIG,
    Case,
    device_digest,
    kill_during_ldconfig,
    nvc_processes,
    plant,
    plant_fifo_include,
    scratch_block_device,
    tree,
)
from harness.installed import NVC
from harness.rootfs import tar_rootfs
from harness.standins import target_process, user_process  # noqa: F401 - fixtures

SCRIPTS = Path(sysconfig.get_path("scripts"))
QUICK = 10.0  # seconds: a refusal takes well under one; a hang would reach the runtime's limits


@pytest.fixture
def block(tmp_path: Path):
    with scratch_block_device(tmp_path) as dev:
        yield dev


@pytest.fixture
def config(tmp_path: Path, fake_2gpu) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"root: {fake_2gpu.root}\nload-kmods: false\n")
    return path


def _assert_refused(case: Case, code: int, stderr: str, elapsed: float) -> None:
    assert code != 0, stderr
    assert case.refusal in stderr, stderr
    assert "Traceback" not in stderr
    assert elapsed < QUICK, elapsed


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_runc_hook_refuses_hostile_ldconfig_files(
    active_2gpu, debian_rootfs, runc, tmp_path, block, config, case, session_dir
):
    plant(debian_rootfs, case, block)
    digest, before = device_digest(block), tree(debian_rootfs)
    hook = {
        "path": str(SCRIPTS / "nvc-py-hook"),
        "args": ["nvc-py-hook", "prestart"],
        "env": [f"NVC_PY_CONFIG={config}", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
    }
    bundle = make_bundle(
        tmp_path / "bundle", debian_rootfs, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"}, hooks={"prestart": [hook]}
    )

    started = time.monotonic()
    result = runc.create_start(bundle)

    _assert_refused(case, result.returncode, result.stderr, time.monotonic() - started)
    assert device_digest(block) == digest
    assert tree(debian_rootfs) == before
    assert nvc_processes(session_dir) == []


@pytest.fixture(scope="module")
def hooks_dir(fake_2gpu, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("hostile-hooks")
    (work / "config.yaml").write_text(f"root: {fake_2gpu.root}\nload-kmods: false\n")
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
    return work / "hooks.d"


@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=[CASES[0].name, CASES[2].name])
def test_podman_hooks_d_refuses_hostile_ldconfig_files(
    active_2gpu, make_rootfs, podman, tmp_path, block, hooks_dir, case, session_dir
):
    """Plain ``podman run IMAGE`` (vfs storage) through setup podman's hooks.d file."""
    rootfs = make_rootfs(name="hostile")
    plant(rootfs, case, block)
    image = podman.import_tarball(tar_rootfs(rootfs, tmp_path / "hostile.tar"), f"localhost/nvc-hostile:{case.name}")
    digest = device_digest(block)

    started = time.monotonic()
    result = podman.run(image, ["true"], env={"NVIDIA_VISIBLE_DEVICES": "0"}, hooks_dirs=[hooks_dir])

    _assert_refused(case, result.returncode, result.stderr, time.monotonic() - started)
    assert device_digest(block) == digest
    assert nvc_processes(session_dir) == []


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cdi_update_ldcache_hook_refuses_hostile_ldconfig_files(
    debian_rootfs, target_process, tmp_path, block, config, case, session_dir
):
    """The CDI createContainer hook, given the OCI state of a container whose rootfs is hostile."""
    plant(debian_rootfs, case, block)
    digest, before = device_digest(block), tree(debian_rootfs)
    bundle = make_bundle(tmp_path / "bundle", debian_rootfs, ["true"])
    state = json.dumps(
        {"ociVersion": "1.0.2", "id": "hostile", "status": "creating", "pid": target_process, "bundle": str(bundle)}
    )

    started = time.monotonic()
    result = subprocess.run(
        [str(SCRIPTS / "nvc-py-hook"), "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"],
        input=state,
        capture_output=True,
        text=True,
        env={**os.environ, "NVC_PY_CONFIG": str(config)},
    )

    _assert_refused(case, result.returncode, result.stderr, time.monotonic() - started)
    assert device_digest(block) == digest
    assert tree(debian_rootfs) == before
    assert nvc_processes(session_dir) == []


@pytest.mark.parametrize("owner", ["root", "user"])
def test_killed_configure_leaves_no_process(active_2gpu, debian_rootfs, request, owner, session_dir):
    """The runtime's hook timeout kills nvc-py (SIGKILL) while ldconfig blocks on an image FIFO:
    ldconfig (pid 1 of its sandbox, also when it runs as the container's user) and the container
    helper die with it."""
    target = request.getfixturevalue("target_process" if owner == "root" else "user_process")
    plant_fifo_include(debian_rootfs)
    # --no-cgroups: the stand-in shares pytest's cgroup, which a v2 device filter would lock out of /dev.
    below, left = kill_during_ldconfig(
        [
            NVC,
            "--root",
            str(active_2gpu.root),
            "configure",
            f"--pid={target}",
            "--no-cgroups",
            "--device=0",
            "--compute",
            "--utility",
            str(debian_rootfs),
        ],
        10,
    )
    assert len(below) >= 2, below  # the container helper, ldconfig
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes() for p in left]
    assert nvc_processes(session_dir) == []


@pytest.fixture(scope="module")
def partial_ldconfig(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("partial")
    (work / "partial.c").write_text(PARTIAL_LDCONFIG)
    subprocess.run(["gcc", "-static", "-O1", "-o", str(work / "ldconfig"), str(work / "partial.c")], check=True)
    return work / "ldconfig"


@pytest.mark.parametrize("cache", ["regular", "absent", "symlink"])
def test_late_failure_leaves_the_rootfs_as_before(
    active_2gpu, debian_rootfs, target_process, partial_ldconfig, cache, session_dir
):
    """ldconfig fails after the mounts (and after changing the rootfs itself): every mount point,
    directory, link and file made is gone, the cache is back as it was (type, content, mode,
    owner), the mounts are undone."""
    cache_path = debian_rootfs / "etc/ld.so.cache"
    if cache == "absent":
        cache_path.unlink()
    elif cache == "symlink":
        cache_path.rename(debian_rootfs / "etc/ld.so.cache.real")
        cache_path.symlink_to("ld.so.cache.real")
    os.chmod(debian_rootfs / "etc", 0o751)
    before = tree(debian_rootfs)
    mounts_before = Path(f"/proc/{target_process}/mountinfo").read_text()

    result = subprocess.run(
        [
            NVC,
            "--root",
            str(active_2gpu.root),
            "configure",
            f"--pid={target_process}",
            "--no-cgroups",
            f"--ldconfig=@{partial_ldconfig}",
            "--device=all",
            "--compute",
            "--utility",
            str(debian_rootfs),
        ],
        capture_output=True,
        text=True,
    )

    assert (result.returncode, result.stderr) == (
        10,
        f"nvc-py: ldcache error: process {partial_ldconfig} failed with error code: 1\n",
    )
    assert Path(f"/proc/{target_process}/mountinfo").read_text() == mounts_before
    after = tree(debian_rootfs)
    assert {k: v for k, v in after.items() if v != before.get(k)} == {}
    assert after == before
    assert nvc_processes(session_dir) == []


@pytest.mark.parametrize(
    "path", ["usr/local/cuda/compat", "usr/local/cuda/compat/libcuda.so.999.1.1", "etc/debian_version", "usr/lib32"]
)
@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_configure_opens_no_fifo_or_device_of_the_image(
    active_2gpu, debian_rootfs, target_process, path, kind, session_dir
):
    """What configure itself inspects in the rootfs (compat dir and libraries, distribution
    markers, library dirs) is looked at through O_PATH or O_DIRECTORY: a FIFO or device node
    there neither blocks it nor is opened."""
    where = debian_rootfs / path
    where.parent.mkdir(parents=True, exist_ok=True)
    if where.exists():
        where.unlink()
    plant(debian_rootfs, Case("", "/" + path, kind, ""), None)

    result = subprocess.run(
        [
            NVC,
            "--root",
            str(active_2gpu.root),
            "configure",
            f"--pid={target_process}",
            "--no-cgroups",
            "--device=0",
            "--compute",
            "--utility",
            str(debian_rootfs),
        ],
        capture_output=True,
        text=True,
        timeout=QUICK,
    )

    assert result.returncode == 0, result.stderr
    assert nvc_processes(session_dir) == []
