"""Hostile images against ``nvc-py configure --pid`` run as a runc prestart hook (fake driver).

Each attack is one image (a rootfs copy) bent the way a CVE of the reference tool exploited
(see the security history in the reference notes), pointed at a host "canary" directory
whose every file, directory and link is snapshotted before and compared after. Each test
asserts that no host file was created or changed and, where the container started, that no
host path shows in its mountinfo; where configure refuses instead, it must say so in one
line and the runtime must not start the container.

Runtime versus nvc-py: what runc itself does with a hostile layout (it follows some image
symlinks on its own, see ``test_runc_itself_follows_a_dev_symlink``) is told apart from
what nvc-py does, by running the same bundle without the hook.

Test double: the GPUs and driver files are the fake driver's; nothing here is a GPU result.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from harness.bundle import make_bundle
from harness.fakegpus import DRIVER_VERSION
from harness.hostwatch import HostWatch, canary, host_paths_in, snapshot  # noqa: F401 - canary: fixture
from harness.installed import NVC
from harness.markerlib import build_marker_library
from harness.standins import target_process  # noqa: F401 - fixture
from nvc.system import syscalls

LIBDIR = "usr/lib/x86_64-linux-gnu"
HOOK = """#!/bin/sh
pid=$(sed -n 's/.*"pid": *\\([0-9]*\\).*/\\1/p')
{env} exec {nvc} --root {root} configure --pid "$pid" {args} {rootfs} 2>>{log}
"""
# What the container prints: its own mount table, for the host-path check.
SHOW_MOUNTS = ["cat", "/proc/self/mountinfo"]
AT_FDCWD = -100
RENAME_EXCHANGE = 1 << 1


# ---- the host side: the canary (tests/harness/hostwatch.py) ------------------------------


@pytest.fixture
def watch(canary: Path) -> HostWatch:
    return HostWatch(canary)


# ---- running the attack -----------------------------------------------------------------------


def hook(tmp_path: Path, fake, rootfs: Path | str, args: str = "--device=0 --compute --utility", env: str = "") -> dict:
    script = tmp_path / "hook.sh"
    script.write_text(
        HOOK.format(env=env, nvc=NVC, root=fake.root, args=args, rootfs=rootfs, log=tmp_path / "hook.log")
    )
    script.chmod(0o755)
    return {"path": str(script), "args": ["hook.sh"], "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}


def start(runc, tmp_path: Path, rootfs: Path, the_hook: dict | None, args=SHOW_MOUNTS, **bundle_args):
    """runc create + start; returns (result, hook log)."""
    hooks = {"prestart": [the_hook]} if the_hook else None
    bundle = make_bundle(tmp_path / "bundle", rootfs, args, hooks=hooks, **bundle_args)
    result = runc.create_start(bundle)
    log = tmp_path / "hook.log"
    return result, log.read_text() if log.exists() else ""


def started_clean(result, log: str, rootfs: Path, fake, mountinfo: str | None = None) -> None:
    """The container ran, and its mount table (its whole output by default) shows no host path
    beyond the rootfs and the driver's files."""
    assert result.returncode == 0, result.stderr + log
    leaks = host_paths_in(result.stdout if mountinfo is None else mountinfo, (rootfs, fake.root, fake.proc))
    assert not leaks, "host paths in the container's mountinfo:\n" + "\n".join(leaks)


def refused(result, log: str, message: str) -> None:
    """configure said no in one line with ``message``, and runc did not start the container."""
    assert result.returncode != 0
    lines = [line for line in log.splitlines() if line.startswith("nvc-py:")]
    assert len(lines) == 1 and message in lines[0], log
    assert "Traceback" not in log


def library_names(mountinfo: str) -> set[str]:
    return {line.split()[4] for line in mountinfo.splitlines() if f".so.{DRIVER_VERSION}" in line.split()[4]}


def replace_with_symlink(path: Path, target: str) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


def climbing(rootfs: Path, link: Path, target: Path) -> str:
    """A relative link at ``link`` that climbs above the rootfs (more ``..`` than it is deep) to ``target``."""
    depth = len(link.relative_to(rootfs).parts) - 1
    return "../" * (depth + 12) + str(target).lstrip("/")


# ---- attacks: library and binary directories (CVE-2024-0133) --------------------------------


@pytest.mark.parametrize("form", ["absolute", "climbing"])
def test_lib_dir_symlinked_to_a_host_dir(active_2gpu, debian_rootfs, runc, tmp_path, canary, watch, form):
    """The lib dir points at a host dir: the libraries land where that path leads inside the rootfs."""
    link = debian_rootfs / LIBDIR
    # The image's own libc must stay reachable for the container's shell: copy it next to the link target.
    inside = debian_rootfs / str(canary).lstrip("/")
    shutil.copytree(link, inside, symlinks=True)
    replace_with_symlink(link, str(canary) if form == "absolute" else climbing(debian_rootfs, link, canary))

    result, log = start(runc, tmp_path, debian_rootfs, hook(tmp_path, active_2gpu, debian_rootfs))

    started_clean(result, log, debian_rootfs, active_2gpu)
    # Mounted where the container itself reaches through its link: the same path, inside its root.
    assert f"{canary}/libcuda.so.{DRIVER_VERSION}" in library_names(result.stdout)
    assert (inside / "libcuda.so").is_symlink()
    watch.assert_unchanged()


@pytest.mark.parametrize("form", ["absolute", "climbing"])
def test_usr_bin_symlinked_to_a_host_dir(active_2gpu, debian_rootfs, runc, tmp_path, canary, watch, form):
    link = debian_rootfs / "usr/bin"
    inside = debian_rootfs / str(canary).lstrip("/")
    shutil.copytree(link, inside, symlinks=True)  # the container's busybox, reached through the link
    replace_with_symlink(link, str(canary) if form == "absolute" else climbing(debian_rootfs, link, canary))

    result, log = start(runc, tmp_path, debian_rootfs, hook(tmp_path, active_2gpu, debian_rootfs))

    started_clean(result, log, debian_rootfs, active_2gpu)
    assert any(line.split()[4] == f"{canary}/nvidia-smi" for line in result.stdout.splitlines())
    assert (inside / "nvidia-smi").is_file()  # the mount point, made inside the rootfs
    watch.assert_unchanged()


def test_lib_dir_symlinked_to_host_etc(active_2gpu, debian_rootfs, runc, tmp_path, watch):
    """The CVE-2024-0133 layout, aimed at the real /etc: files appear in the image's /etc only."""
    link = debian_rootfs / LIBDIR
    etc = debian_rootfs / "etc"
    for entry in link.iterdir():  # the image keeps a working libc in its /etc, as the link says
        shutil.copy2(entry, etc / entry.name, follow_symlinks=False)
    replace_with_symlink(link, "/etc")

    result, log = start(runc, tmp_path, debian_rootfs, hook(tmp_path, active_2gpu, debian_rootfs))

    started_clean(result, log, debian_rootfs, active_2gpu)
    assert (etc / f"libcuda.so.{DRIVER_VERSION}").is_file()
    watch.assert_unchanged()


def test_mount_target_is_a_symlink_to_a_host_file(active_2gpu, debian_rootfs, runc, tmp_path, canary, watch):
    """A library's mount point ships as a link to a host file: followed inside the rootfs (as runc
    and the reference follow a mount destination), never to the host file."""
    lib = debian_rootfs / LIBDIR / f"libcuda.so.{DRIVER_VERSION}"
    replace_with_symlink(lib, str(canary / "passwd"))

    result, log = start(runc, tmp_path, debian_rootfs, hook(tmp_path, active_2gpu, debian_rootfs))

    started_clean(result, log, debian_rootfs, active_2gpu)
    assert f"{canary}/passwd" in {line.split()[4] for line in result.stdout.splitlines()}
    assert lib.is_symlink()  # left as the image had it
    assert (debian_rootfs / str(canary).lstrip("/") / "passwd").is_file()  # the mount point, inside
    watch.assert_unchanged()


# ---- attacks: CUDA compat libraries (CVE-2024-0132, CVE-2025-23359) --------------------------


@pytest.mark.parametrize("mode", ["ldconfig", "mount"])
@pytest.mark.parametrize("shape", ["symlink-to-root", "climbing-symlink", "directory"])
def test_compat_libs_that_are_not_files(active_2gpu, debian_rootfs, runc, tmp_path, canary, watch, mode, shape):
    """Compat libs that are symlinks to / or ../.. or directories are ignored in both modes."""
    compat = debian_rootfs / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    lib = compat / "libcuda.so.999.1.1"
    if shape == "directory":
        lib.mkdir()
    else:
        os.symlink("/" if shape == "symlink-to-root" else climbing(debian_rootfs, lib, canary), lib)

    the_hook = hook(tmp_path, active_2gpu, debian_rootfs, f"--device=0 --compute --cuda-compat-mode={mode}")
    result, log = start(runc, tmp_path, debian_rootfs, the_hook)

    started_clean(result, log, debian_rootfs, active_2gpu)
    assert "libcuda.so.999" not in result.stdout
    watch.assert_unchanged()


# ---- attacks: the ld cache and its configuration (CVE-2025-23267) ------------------------------


@pytest.mark.parametrize("form", ["absolute", "climbing"])
def test_ld_so_cache_symlinked_to_a_host_file(active_2gpu, debian_rootfs, runc, tmp_path, canary, watch, form):
    cache = debian_rootfs / "etc/ld.so.cache"
    replace_with_symlink(
        cache,
        str(canary / "ld.so.cache") if form == "absolute" else climbing(debian_rootfs, cache, canary / "ld.so.cache"),
    )

    result, log = start(
        runc,
        tmp_path,
        debian_rootfs,
        hook(tmp_path, active_2gpu, debian_rootfs),
        args=["sh", "-c", "ldconfig -p | grep -c libcuda.so.1; cat /proc/self/mountinfo"],
    )

    count, _, mountinfo = result.stdout.partition("\n")
    started_clean(result, log, debian_rootfs, active_2gpu, mountinfo)
    assert count == "1"  # the container's new cache knows libcuda
    assert not cache.is_symlink()  # ldconfig replaced the link inside the rootfs
    watch.assert_unchanged()


def test_ld_so_conf_d_symlinked_to_a_host_dir(active_2gpu, debian_rootfs, runc, tmp_path, canary, watch):
    replace_with_symlink(debian_rootfs / "etc/ld.so.conf.d", str(canary / "ld.so.conf.d"))

    result, log = start(runc, tmp_path, debian_rootfs, hook(tmp_path, active_2gpu, debian_rootfs))

    started_clean(result, log, debian_rootfs, active_2gpu)
    watch.assert_unchanged()


# ---- attacks: /proc/driver --------------------------------------------------------------------


def test_runc_refuses_a_proc_symlink_by_itself(debian_rootfs, runc, tmp_path, canary):
    """Runtime behaviour: runc will not mount procfs over an image's /proc that is a link, so in a
    runc container /proc/driver is the kernel's; the image reaches it only without a runtime (below)."""
    replace_with_symlink(debian_rootfs / "proc", str(canary))
    result, _ = start(runc, tmp_path, debian_rootfs, None, args=["true"])
    assert result.returncode != 0 and "must be mounted on ordinary directory" in result.stderr


@pytest.mark.parametrize("in_image", [False, True], ids=["dangling", "target-in-image"])
@pytest.mark.parametrize("link", ["proc/driver", "proc/driver/nvidia"])
@pytest.mark.parametrize("form", ["absolute", "climbing"])
def test_proc_driver_symlinked_to_a_host_dir(
    active_2gpu, debian_rootfs, target_process, canary, watch, link, form, in_image
):
    """No procfs over the image's /proc (configure --pid for a bare mount namespace, as a
    runtime-less caller would): its /proc/driver(/nvidia) links to a host dir. Where the link
    leads to nothing inside the rootfs nothing is mounted through it (with /proc/driver dangling
    there is no driver state to hide; with /proc/driver/nvidia dangling the tmpfs covers the
    real /proc/driver above it); where it leads to a directory of the image, the tmpfs goes on
    that directory, inside the rootfs, as the link says. Either way nothing reaches the host dir."""
    path = debian_rootfs / link
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_with_symlink(path, str(canary) if form == "absolute" else climbing(debian_rootfs, path, canary))
    if in_image:
        (debian_rootfs / str(canary).lstrip("/")).mkdir(parents=True)
    mounts_before = Path(f"/proc/{target_process}/mountinfo").read_text()

    done = subprocess.run(
        [
            NVC,
            "--root",
            str(active_2gpu.root),
            "configure",
            f"--pid={target_process}",
            "--device=0",
            "--utility",
            str(debian_rootfs),
        ],
        capture_output=True,
        text=True,
    )

    mounts = Path(f"/proc/{target_process}/mountinfo").read_text()
    assert done.returncode == 0, done.stderr
    new = [line for line in mounts.splitlines() if line not in mounts_before.splitlines()]
    assert not host_paths_in("\n".join(new), (debian_rootfs, active_2gpu.root, active_2gpu.proc))
    if in_image:
        assert any(line.split()[4] == f"{debian_rootfs}{canary}" for line in new), new
    watch.assert_unchanged()


# ---- attacks: the caller's environment (CVE-2025-23266) ---------------------------------------


def test_ld_preload_from_the_caller_reaches_no_process_nvc_py_starts(active_2gpu, debian_rootfs, runc, tmp_path, watch):
    """LD_PRELOAD naming an image file, handed to the hook (the runtime's choice; hooks set their env
    explicitly): the static front never runs the loader and drops the variable before it executes the
    Python program, so neither it nor anything nvc-py starts (helpers, the sandboxed ldconfig) loads it."""
    marker = tmp_path / "marks"
    build_marker_library(debian_rootfs / "p.so", marker, "p.so")
    env = f"LD_PRELOAD={debian_rootfs}/p.so"

    result, log = start(runc, tmp_path, debian_rootfs, hook(tmp_path, active_2gpu, debian_rootfs, env=env))

    started_clean(result, log, debian_rootfs, active_2gpu)
    assert not marker.exists(), marker.read_text()
    watch.assert_unchanged()


def test_ld_library_path_from_the_caller_loads_nothing_from_the_image(
    active_2gpu, debian_rootfs, runc, tmp_path, watch
):
    """LD_LIBRARY_PATH naming an image dir that holds libraries nvc-py loads after start-up (NVML,
    needed here as MIG devices exist; libseccomp for the ldconfig sandbox, as root in the host's
    namespaces): none of them is loaded from there, by nvc-py or by anything it starts."""
    marker = tmp_path / "marks"
    evil = debian_rootfs / "evil"
    evil.mkdir()
    for soname in ("libnvidia-ml.so.1", "libseccomp.so.2", "libffi.so.8"):
        build_marker_library(evil / soname, marker, soname)
    os.chmod(tmp_path, 0o777)  # a confined helper could leave its mark too
    env = f"LD_LIBRARY_PATH={evil}"

    result, log = start(
        runc,
        tmp_path,
        debian_rootfs,
        hook(tmp_path, active_2gpu, debian_rootfs, args="--device=all --utility", env=env),
    )

    started_clean(result, log, debian_rootfs, active_2gpu)
    assert not marker.exists(), marker.read_text()
    watch.assert_unchanged()


# ---- attacks: races ---------------------------------------------------------------------------


@pytest.mark.parametrize("swapped", [LIBDIR, "usr/bin"])
def test_path_component_swapped_for_a_symlink_while_configure_runs(
    active_2gpu, debian_rootfs, runc, tmp_path, canary, watch, swapped
):
    """A host thread flips a directory of the image between itself and a link to a host dir as fast
    as it can while configure runs (CVE-2025-23359 and the race seen against the reference)."""
    real = debian_rootfs / swapped
    link = real.with_name(real.name + ".link")
    os.symlink(str(canary), link)
    # Where the link leads inside the rootfs exists too, so that configure gets through at times.
    shutil.copytree(real, debian_rootfs / str(canary).lstrip("/"), symlinks=True)
    stop = threading.Event()

    def flip() -> None:  # atomic exchanges: the path always exists, as a directory or as the link
        while not stop.is_set():
            syscalls.renameat2(AT_FDCWD, str(real), AT_FDCWD, str(link), RENAME_EXCHANGE)

    for attempt in range(3):
        flipper = threading.Thread(target=flip)
        flipper.start()
        try:
            result, log = start(
                runc,
                tmp_path / str(attempt),
                debian_rootfs,
                hook(_mkdir(tmp_path / str(attempt)), active_2gpu, debian_rootfs),
            )
        finally:
            stop.set()
            flipper.join()
            stop.clear()
            _single_threaded()
        if result.returncode == 0:  # the race may also make configure or the runtime fail: both fine
            leaks = host_paths_in(result.stdout, (debian_rootfs, active_2gpu.root, active_2gpu.proc))
            assert not leaks, leaks
        else:
            assert "Traceback" not in log
        watch.assert_unchanged()


def _single_threaded() -> None:
    """Wait until the joined thread is gone from the kernel's view too: the fake driver's
    teardown setns()es this process back, which the kernel refuses while it has threads."""
    for _ in range(1000):
        if len(os.listdir("/proc/self/task")) == 1:
            return
        time.sleep(0.001)
    raise AssertionError("a thread of this process did not end")


def _mkdir(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    return path


# ---- attacks: the rootfs itself ---------------------------------------------------------------


def test_rootfs_given_as_a_symlink_to_a_host_dir(active_2gpu, debian_rootfs, runc, tmp_path, canary, watch):
    """configure is told a rootfs path that is a link to a host dir: refused, nothing made there."""
    link = tmp_path / "rootfs-link"
    os.symlink(str(canary), link)

    result, log = start(runc, tmp_path, debian_rootfs, hook(tmp_path, active_2gpu, link))

    refused(result, log, "rootfs-link")
    watch.assert_unchanged()


def test_standalone_rootfs_symlink_is_refused(active_2gpu, tmp_path, canary, watch):
    link = tmp_path / "rootfs-link"
    os.symlink(str(canary), link)

    done = subprocess.run(
        [NVC, "--root", str(active_2gpu.root), "configure", "--device=0", "--utility", str(link)],
        capture_output=True,
        text=True,
    )

    assert done.returncode != 0 and done.stderr.startswith("nvc-py: ") and "rootfs-link" in done.stderr
    assert done.stderr.count("\n") == 1
    watch.assert_unchanged()


def test_runc_refuses_a_symlinked_rootfs_by_itself(debian_rootfs, runc, tmp_path):
    """Runtime behaviour, for contrast: runc validates root.path before any hook could run."""
    link = tmp_path / "rootfs-link"
    os.symlink(str(debian_rootfs), link)
    bundle = make_bundle(tmp_path / "bundle", link, ["true"])
    result = runc.create_start(bundle)
    assert result.returncode != 0 and "symlink" in result.stderr


def test_runc_itself_follows_a_dev_symlink(debian_rootfs, runc, tmp_path, canary):
    """Runtime behaviour, not nvc-py's (see the reference notes): Debian's runc 1.1.5 follows an
    image's /dev that links to a host dir and makes its nodes there, with no hook at all. Kept
    as a check so that a change of runtime shows up here, not as an nvc-py failure elsewhere."""
    replace_with_symlink(debian_rootfs / "dev", str(canary))
    before = snapshot(canary)

    start(runc, tmp_path, debian_rootfs, None, args=["true"])

    assert snapshot(canary) != before
