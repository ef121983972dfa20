"""Images whose directories are symbolic links, through ``nvc-py-hook prestart`` in runc (issue 14).

Every variant of tests/harness/symlinks.py on the fake driver (a test double: nothing here is a GPU
result): an absolute link is resolved as the container sees it (the rootfs as ``/``), what is
missing is made inside the rootfs (0755, the container's owner), and the container starts and
lists its GPU with ``nvidia-smi -L``; where a component cannot be used (a loop, a file where a
directory is needed, a dangling link into a read-only place, a link into procfs, a read-only
rootfs) the start fails
with one line naming the path inside the image and why, and the rollback leaves the image as it
was. In every case the host (a canary directory the links point at, driver-named files in host
directories, the host's ld cache) is unchanged and the container's mount table shows no host path.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sysconfig
from pathlib import Path

import pytest

from harness.fakegpus import DRIVER_VERSION
from harness.hostwatch import HostWatch, canary, entries, host_paths_in  # noqa: F401 - canary: fixture
from harness.standins import user_process  # noqa: F401 - fixture
from harness.symlinks import VARIANTS, gpu_listed, mount_points, start, summary, unmerge

SCRIPTS = Path(sysconfig.get_path("scripts"))
H100 = "GPU-4f6a2c1e-8b3d-5e7f-9a1b-2c3d4e5f6a7b"  # the fake machine's GPU 0


@pytest.fixture
def hook_config(active_2gpu, tmp_path: Path) -> Path:
    config = tmp_path / "config.yaml"
    config.write_text(f"root: {active_2gpu.root}\nload-kmods: false\nlog: {{file: {tmp_path / 'hook.log'}}}\n")
    return config


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_symlinked_image(active_2gpu, hook_config, make_rootfs, runc, tmp_path, canary, variant):  # noqa: F811
    rootfs = make_rootfs()
    unmerge(rootfs)
    away = canary / "away"  # a host path the image does not have
    variant.plant(rootfs, away, DRIVER_VERSION)
    watch = HostWatch(canary)
    before = entries(rootfs)

    result, error = start(runc, tmp_path, rootfs, hook_config, variant)

    listed = gpu_listed(result.stdout, H100)
    print(summary(variant, "started" if result.returncode == 0 else f"refused: {error}", listed, not watch.changes()))
    watch.assert_unchanged()
    if variant.refusal is not None:
        assert result.returncode != 0 and not listed
        # the errno's text may follow where the kernel gave one (it differs between sysfs and overlayfs)
        assert re.fullmatch(
            rf"mount error: (cannot mount on|refusing to mount over) /\S+: {re.escape(variant.refusal)}"
            r"(: [^:]+)?",
            error,
        ), error
        assert f"nvc-py-hook: {error}" in result.stderr, result.stderr  # runc passes the hook's line on
        assert entries(rootfs) == before  # rolled back: every directory and mount point made is gone
        return
    assert result.returncode == 0, result.stderr + error
    assert listed, result.stdout
    mountinfo = result.stdout.partition("--- mountinfo\n")[2]
    assert not host_paths_in(mountinfo, (rootfs, active_2gpu.root, active_2gpu.proc))
    under = variant.mounted_under(away)
    assert any(point.startswith(under + "/") for point in mount_points(mountinfo)), (under, mountinfo)
    made = [path for path in entries(rootfs) if path not in before]
    for path in made:  # what nvc-py made: mount points, their directories, links, ldconfig's files
        st = (rootfs / path).lstat()
        assert (st.st_uid, st.st_gid) == (0, 0), path
        if stat.S_ISDIR(st.st_mode):
            assert stat.S_IMODE(st.st_mode) == 0o755, path
    if variant.readonly:  # only what the reference writes into an image too
        unexpected = [path for path in made if not REFERENCE_WRITES.match(path)]
        assert not unexpected, unexpected


# Mount points of driver files (firmware with its directories) and the library links next to
# them (ldconfig's SONAME links, libcuda.so); ldconfig rewrites /etc/ld.so.cache, which exists already.
# And compute's OpenCL vendor file, which NVIDIA's toolkit injects too (#54).
REFERENCE_WRITES = re.compile(
    r"^usr/bin/nv|^usr/lib/x86_64-linux-gnu/lib(nvidia|cuda)|^usr/lib/firmware(/|$)|^etc/OpenCL(/vendors(/nvidia\.icd)?)?$"
)


def test_made_directories_and_mount_points_belong_to_the_container(
    active_2gpu, make_rootfs, user_process, canary, tmp_path
):  # noqa: F811
    """As the reference makes them (under the usual umask 022): the directories a dangling absolute
    lib dir link needs, 0755, and the mount points, with their source's mode less group/other
    write, owned by the container's user (uid 1000 here: a stand-in process in a mount namespace
    of its own), whatever the caller's umask (077 here)."""
    rootfs = make_rootfs()
    unmerge(rootfs)
    away = canary / "away"
    next(v for v in VARIANTS if v.name == "libdir-abs-absent").plant(rootfs, away, DRIVER_VERSION)
    for path in (rootfs / "etc", rootfs / "etc/ld.so.cache"):  # ldconfig runs as the user too
        os.chown(path, 1000, 1000)
    watch = HostWatch(canary)
    inside = rootfs / str(away / "lib").lstrip("/")
    existed = {p for p in (inside, *inside.parents) if p.exists()}  # the image's own (its /var, its /tmp)

    done = subprocess.run(
        [
            str(SCRIPTS / "nvc-py"),
            "--root",
            str(active_2gpu.root),
            "configure",
            f"--pid={user_process}",
            "--no-cgroups",
            "--device=0",
            "--compute",
            "--utility",
            str(rootfs),
        ],
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.umask(0o077),
    )

    assert done.returncode == 0, done.stderr
    made_dirs = [p for p in (inside, *inside.parents) if p.is_relative_to(rootfs) and p != rootfs and p not in existed]
    assert inside in made_dirs
    for path in made_dirs:
        st = path.lstat()
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755, path
        assert (st.st_uid, st.st_gid) == (1000, 1000), path
    lib = inside / f"libnvidia-ml.so.{DRIVER_VERSION}"
    source = active_2gpu.root / "usr/lib/x86_64-linux-gnu" / lib.name
    st = lib.lstat()  # the mount point under the mount (this namespace does not see the mount)
    assert stat.S_ISREG(st.st_mode) and (st.st_uid, st.st_gid) == (1000, 1000)
    assert stat.S_IMODE(st.st_mode) == stat.S_IMODE(source.stat().st_mode) & 0o755
    watch.assert_unchanged()
