"""Images whose directories are symbolic links (issue 14), for tests/test_rootfs_symlinks.py (fake
driver, runc) and tests/test_rootfs_symlinks_gpu.py (real driver, crun).

Each :class:`Variant` bends a debian rootfs (tests/harness/rootfs.py) one way. Its absolute links
point at ``away``, a host directory that the image does not have, so that following them on the
host would show as a change there. Every variant first gets a shell and a C library outside
/usr (:func:`unmerge`), so that an image whose /usr, /usr/bin or library directory is bent still
runs ``sh -c 'nvidia-smi -L'``. ``reference`` says what nvidia-container-cli 1.17 does with the
same image, from its path resolution (libnvidia-container src/utils.c do_path_resolve: chroot
semantics, the last component followed too, a ``..`` above the root refused, ELOOP after 20
links) and file creation (file_create: missing directories made 0755, owned by the container's
owner); the README's parity table repeats it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sysconfig
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .bundle import make_bundle
from .fakegpus import DRIVER_VERSION
from .runtime import Runc

LIBDIR = "usr/lib/x86_64-linux-gnu"
APPLETS = ("sh", "cat", "ls", "grep", "readlink", "stat", "true", "echo")
# What every container of these tests runs: the GPUs it sees, then its own mount table.
SHOW = ["/bin/sh", "-c", "nvidia-smi -L 2>&1; echo '--- mountinfo'; cat /proc/self/mountinfo"]


def unmerge(rootfs: Path) -> None:
    """A shell in a real /bin (busybox, its applets as absolute links ``/bin/sh -> /bin/busybox``
    as busybox images have them) and the C library in a real /lib64 named in ld.so.conf: the
    image's commands then work whatever a variant does to /usr."""
    bin_dir, lib_dir = rootfs / "bin", rootfs / "lib64"
    for link in (bin_dir, lib_dir):
        link.unlink()
        link.mkdir()
    shutil.copy2(rootfs / "usr/bin/busybox", bin_dir / "busybox")
    for applet in APPLETS:
        os.symlink("/bin/busybox", bin_dir / applet)
    for entry in (rootfs / LIBDIR).iterdir():
        if ".so" in entry.name:
            shutil.copy2(entry, lib_dir / entry.name)  # the file itself, not a link into /usr
    (rootfs / "etc/ld.so.conf.d/base.conf").write_text("/lib64\n")
    subprocess.run([str(rootfs / "usr/sbin/ldconfig"), "-r", str(rootfs)], check=True, capture_output=True)


def _replace(path: Path, target: str) -> None:
    """``path`` (a directory or file of the image) becomes a symlink to ``target``."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    os.symlink(target, path)


def _move(rootfs: Path, inner: str, to: str) -> None:
    """Move the image's ``inner`` to ``to`` and leave an absolute link to it behind."""
    dest = rootfs / to.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(rootfs / inner), dest)
    os.symlink(to, rootfs / inner)


def _applets_absolute(rootfs: Path) -> None:
    """Every busybox applet link of /usr/bin made absolute (``/usr/bin/cat -> /bin/busybox``)."""
    for entry in (rootfs / "usr/bin").iterdir():
        if entry.is_symlink() and os.readlink(entry).endswith("busybox"):
            entry.unlink()
            os.symlink("/bin/busybox", entry)


def _loop(rootfs: Path) -> None:
    _replace(rootfs / LIBDIR, "/opt/x")
    (rootfs / "opt").mkdir(exist_ok=True)
    os.symlink("/" + LIBDIR, rootfs / "opt/x")


def _file_for_dir(rootfs: Path) -> None:
    shutil.rmtree(rootfs / LIBDIR)
    (rootfs / LIBDIR).write_text("not a directory\n")


@dataclass(frozen=True)
class Variant:
    """One bent image.

    ``plant(rootfs, away, version)`` bends it (``version``: the driver's, for library names);
    ``mounted_under(away)``: a directory (inside the container) under which some driver file must be
    mounted when it starts; ``refusal``: what nvc-py's one-line error must say instead (None: it
    must start and list its GPU); ``readonly``: ``root.readonly`` in config.json; ``ro_mount``:
    the rootfs directory itself sits on a read-only mount.
    """

    name: str
    reference: str
    plant: Callable[[Path, Path, str], None]
    mounted_under: Callable[[Path], str] | None = None
    refusal: str | None = None
    readonly: bool = False
    ro_mount: bool = False


VARIANTS = (
    Variant(
        "libdir-abs-absent",
        "started (mkdir -p of the target inside the rootfs)",
        lambda r, away, v: _replace(r / LIBDIR, str(away / "lib")),
        lambda away: f"{away}/lib",
    ),
    Variant(
        "libdir-abs-elsewhere",
        "started (mounted where the link leads)",
        lambda r, away, v: _move(r, LIBDIR, "/opt/x86_64-linux-gnu"),
        lambda away: "/opt/x86_64-linux-gnu",
    ),
    Variant(
        "usr-bin-abs-absent",
        "started (mkdir -p of the target inside the rootfs)",
        lambda r, away, v: _replace(r / "usr/bin", str(away / "bin")),
        lambda away: f"{away}/bin",
    ),
    Variant(
        "usr-abs-absent",
        "started (mkdir -p of the target inside the rootfs)",
        lambda r, away, v: _replace(r / "usr", str(away / "usr")),
        lambda away: f"{away}/usr/lib/x86_64-linux-gnu",
    ),
    Variant(
        "usr-abs-elsewhere",
        "started (mounted where the link leads)",
        lambda r, away, v: _move(r, "usr", "/opt/usr"),
        lambda away: "/opt/usr/lib/x86_64-linux-gnu",
    ),
    Variant(
        "dotdot-beyond-root",
        "refused (path error: ... resolves outside of <rootfs>)",
        lambda r, away, v: _replace(r / LIBDIR, "../" * 12 + str(away / "lib").lstrip("/")),
        lambda away: f"{away}/lib",
    ),
    Variant(
        "loop",
        "refused (path error: ...: Too many levels of symbolic links)",
        lambda r, away, v: _loop(r),
        refusal="/usr/lib/x86_64-linux-gnu is a symbolic link to /opt/x that loops",
    ),
    Variant(
        "file-for-dir",
        "refused (path error: ...: Not a directory)",
        lambda r, away, v: _file_for_dir(r),
        refusal="/usr/lib/x86_64-linux-gnu is a regular file where a directory is needed",
    ),
    Variant(
        "dangling-lib-name",
        "started (the library mounted where the link leads, made inside the rootfs)",
        lambda r, away, v: _replace(r / LIBDIR / f"libnvidia-ml.so.{v}", str(away / f"libnvidia-ml.so.{v}")),
        lambda away: str(away),
    ),
    Variant(
        "lib-name-into-proc",
        "started (the library mounted over the container's /proc/sys/kernel/core_pattern)",
        lambda r, away, v: _replace(r / LIBDIR / f"libnvidia-ml.so.{v}", "/proc/sys/kernel/core_pattern"),
        refusal="it leads to /proc/sys/kernel/core_pattern, on the container's procfs",
    ),
    Variant(
        "dangling-into-readonly",
        "refused (file creation failed: <rootfs>/sys/nvidia-libs: Read-only file system)",
        lambda r, away, v: _replace(r / LIBDIR, "/sys/nvidia-libs"),
        refusal="/usr/lib/x86_64-linux-gnu is a symbolic link to /sys/nvidia-libs: /sys/nvidia-libs does not "
        "exist and cannot be created",
    ),
    Variant(
        "root-readonly",
        "started (runc makes / read-only after the prestart hooks)",
        lambda r, away, v: None,
        lambda away: "/usr/lib/x86_64-linux-gnu",
        readonly=True,
    ),
    Variant(
        "rootfs-on-readonly-mount",
        "refused (file creation failed: ...: Read-only file system)",
        lambda r, away, v: None,
        refusal=f"/{LIBDIR}/libnvidia-ml.so.{DRIVER_VERSION} does not exist and cannot be created: Read-only file system",
        ro_mount=True,
    ),
    Variant("busybox-applets", "started", lambda r, away, v: _applets_absolute(r), lambda away: "/usr/bin"),
)


HOOK = Path(sysconfig.get_path("scripts")) / "nvc-py-hook"


@contextmanager
def read_only_mount(path: Path) -> Iterator[None]:
    """``path`` bound read-only onto itself (in the caller's mount namespace) for the duration."""
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def start(
    runtime: Runc, tmp_path: Path, rootfs: Path, config: Path, variant: Variant, timeout: float = 60
) -> tuple[subprocess.CompletedProcess[str], str]:
    """Create and start ``rootfs`` (running :data:`SHOW`) with ``nvc-py-hook prestart`` as its
    prestart hook, configured by ``config`` whose log goes to ``tmp_path/hook.log``; return the
    result and the errors of the hook's log lines (crun, unlike runc, does not pass a failing
    hook's stderr on)."""
    hook = {
        "path": str(HOOK),
        "args": ["nvc-py-hook", "prestart"],
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", f"NVC_PY_CONFIG={config}"],
    }
    result = start_with(runtime, tmp_path, rootfs, hook, variant, timeout)
    log = tmp_path / "hook.log"
    errors = [json.loads(line).get("error") or "" for line in log.read_text().splitlines()] if log.exists() else []
    return result, "".join(errors)


def start_with(
    runtime: Runc, tmp_path: Path, rootfs: Path, hook: dict[str, object], variant: Variant, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Create and start ``rootfs`` (running :data:`SHOW`, GPU 0 requested) with ``hook`` as its
    prestart hook, the variant's read-only settings applied."""
    bundle = make_bundle(
        tmp_path / "bundle",
        rootfs,
        SHOW,
        env={"NVIDIA_VISIBLE_DEVICES": "0"},
        hooks={"prestart": [hook]},
        readonly=variant.readonly,
    )
    if variant.ro_mount:
        with read_only_mount(rootfs):
            return runtime.create_start(bundle, timeout=timeout)
    return runtime.create_start(bundle, timeout=timeout)


def gpu_listed(stdout: str, uuid: str = r"GPU-[0-9a-f-]+") -> bool:
    """``nvidia-smi -L`` in the container listed GPU 0 (with ``uuid``, a regular expression)."""
    return re.search(rf"^GPU 0: .*\(UUID: {uuid}\)$", stdout, re.MULTILINE) is not None


def mount_points(mountinfo: str) -> list[str]:
    """The mount points (field 5) of a mountinfo text."""
    return [line.split()[4] for line in mountinfo.splitlines() if len(line.split()) > 4]


def summary(
    variant: Variant, outcome: str, gpu_listed: bool | None, host_unchanged: bool, observed: str | None = None
) -> str:
    """The one line per case that the GPU run's closing note quotes (``observed``: what the
    reference did with the same image on that machine, where it is installed)."""
    listed = "n/a" if gpu_listed is None else "yes" if gpu_listed else "no"
    seen = "" if observed is None else f" reference-observed={observed!r}"
    return (
        f"SYMLINK {variant.name} reference-behaviour={variant.reference!r}{seen} nvc-py={outcome} "
        f"gpu-listed={listed} host-unchanged={'yes' if host_unchanged else 'no'}"
    )
