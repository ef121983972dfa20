"""Minimal container root filesystems built from host parts.

The containers that the integration tests start need a shell, a real glibc
(so dynamically linked driver binaries run inside) and a real ld.so.cache made
by a real ldconfig: nvc updates that cache, so a fake one would prove nothing.
Pulling images is not an option (no network), so the rootfs is assembled from
Debian's busybox-static and the host's glibc.

Two layouts cover the library-directory cases nvc must handle:
  * "debian": multiarch, libs in /usr/lib/x86_64-linux-gnu (plus an empty
    /usr/lib/i386-linux-gnu), /etc/debian_version present;
  * "lib64": Fedora/RHEL style, libs in /usr/lib64, no /etc/debian_version.
Both are merged-/usr (/bin, /sbin, /lib, /lib64 are symlinks into /usr), like
current Debian and Fedora.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HOST_LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
HOST_BUSYBOX_CANDIDATES = (Path("/usr/bin/busybox"), Path("/bin/busybox"))
HOST_LDCONFIG = Path("/sbin/ldconfig")
LOADER = "ld-linux-x86-64.so.2"
# The glibc pieces a dynamically linked driver binary (nvidia-smi, the
# fake driver's tools) may need; libgcc_s is optional on the host.
GLIBC_LIBS = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")
OPTIONAL_LIBS = ("libgcc_s.so.1",)
MERGED_USR_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
EMPTY_DIRS = ("proc", "dev", "sys", "tmp", "run", "root", "etc/ld.so.conf.d", "usr/local/bin")
PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = "root:x:0:\nvideo:x:44:\nnogroup:x:65534:\n"


@dataclass(frozen=True)
class Layout:
    """Where a distribution family keeps its libraries."""

    libdir: str  # relative to the rootfs, no leading slash
    extra_libdirs: tuple[str, ...]  # created empty (e.g. the 32-bit multiarch dir)
    ld_so_conf_dirs: tuple[str, ...]  # dirs the host (Debian) ldconfig does not scan by itself
    debian_version: bool


VARIANTS: dict[str, Layout] = {
    "debian": Layout(
        libdir="usr/lib/x86_64-linux-gnu",
        extra_libdirs=("usr/lib/i386-linux-gnu",),
        ld_so_conf_dirs=(),
        debian_version=True,
    ),
    # Fedora's own ldconfig scans /usr/lib64 implicitly; the copied Debian
    # ldconfig does not, so the lib64 rootfs names it in /etc/ld.so.conf.
    "lib64": Layout(libdir="usr/lib64", extra_libdirs=(), ld_so_conf_dirs=("/usr/lib64",), debian_version=False),
}


def _host_busybox() -> Path:
    for candidate in HOST_BUSYBOX_CANDIDATES:
        if candidate.is_file():
            return candidate
    # The GPU machine has busybox-static only unpacked from a carried .deb, on PATH (bench/gpu-env.sh).
    found = shutil.which("busybox")
    if found is not None:
        return Path(found)
    raise FileNotFoundError("busybox not found on the host (install busybox-static)")


def _busybox_applets(busybox: Path) -> list[str]:
    """Applet paths relative to / (e.g. "usr/bin/cat"), as busybox reports them."""
    out = subprocess.run([str(busybox), "--list-full"], check=True, capture_output=True, text=True).stdout
    return [line for line in out.split() if line.split("/")[0] in ("bin", "sbin", "usr")]


def _install_busybox(root: Path) -> None:
    busybox = _host_busybox()
    shutil.copy2(busybox, root / "usr/bin/busybox")
    for applet in _busybox_applets(busybox):
        # Applets in bin/ and sbin/ land in usr/ through the merged-/usr links.
        rel = applet if applet.startswith("usr/") else "usr/" + applet
        link = root / rel
        if link.exists() or link.is_symlink():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(root / "usr/bin/busybox", link.parent))


def _install_glibc(root: Path, layout: Layout) -> None:
    libdir = root / layout.libdir
    libdir.mkdir(parents=True, exist_ok=True)
    for extra in layout.extra_libdirs:
        (root / extra).mkdir(parents=True, exist_ok=True)
    for name in (LOADER, *GLIBC_LIBS):
        shutil.copy2((HOST_LIBDIR / name).resolve(), libdir / name)
    for name in OPTIONAL_LIBS:
        if (HOST_LIBDIR / name).exists():
            shutil.copy2((HOST_LIBDIR / name).resolve(), libdir / name)
    # Every x86_64 binary names /lib64/ld-linux-x86-64.so.2 as its interpreter.
    loader_link = root / "usr/lib64" / LOADER
    if layout.libdir != "usr/lib64":
        loader_link.parent.mkdir(parents=True, exist_ok=True)
        loader_link.symlink_to(os.path.relpath(libdir / LOADER, loader_link.parent))


def _install_ldconfig(root: Path, layout: Layout) -> None:
    ldconfig = root / "usr/sbin/ldconfig"
    # Ubuntu's /sbin/ldconfig is a shell script exec'ing /sbin/ldconfig.real: copy the binary.
    real = HOST_LDCONFIG.with_name("ldconfig.real")
    shutil.copy2((real if real.is_file() else HOST_LDCONFIG).resolve(), ldconfig)
    conf = "include /etc/ld.so.conf.d/*.conf\n" + "".join(d + "\n" for d in layout.ld_so_conf_dirs)
    (root / "etc/ld.so.conf").write_text(conf)
    # The copied ldconfig is static, so it runs on the host against the rootfs.
    subprocess.run([str(ldconfig), "-r", str(root)], check=True, capture_output=True)


def build_rootfs(dest: Path, variant: str) -> Path:
    """Build a fresh rootfs of `variant` ("debian" or "lib64") at `dest` (must not exist)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown rootfs variant {variant!r} (known: {', '.join(VARIANTS)})")
    layout = VARIANTS[variant]
    root = Path(dest)
    root.mkdir(parents=True)
    for sub in ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc", "var"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for name, target in MERGED_USR_LINKS.items():
        (root / name).symlink_to(target)
    for sub in EMPTY_DIRS:
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "var/run").symlink_to("../run")
    (root / "etc/passwd").write_text(PASSWD)
    (root / "etc/group").write_text(GROUP)
    (root / "etc/hostname").write_text("nvc-test\n")
    if layout.debian_version:
        (root / "etc/debian_version").write_text(Path("/etc/debian_version").read_text())
    else:
        (root / "etc/redhat-release").write_text("nvc-test lib64 rootfs (Fedora-like layout)\n")
    _install_busybox(root)
    _install_glibc(root, layout)
    _install_ldconfig(root, layout)
    return root


def copy_rootfs(src: Path, dest: Path) -> Path:
    """Copy a cached rootfs for one test; `cp -a` keeps links, modes and owners."""
    subprocess.run(["cp", "-a", str(src), str(dest)], check=True)
    return Path(dest)


@contextmanager
def overlay_rootfs(lower: Path, dest: Path) -> Iterator[Path]:
    """`lower` through an overlay at dest/rootfs whose writes land in dest/upper, as an engine's overlay
    snapshot gives a container its root: a start creates only what the runtime and its hooks add. The benches
    start hundreds of containers; a copy of the whole rootfs for each, deleted after it, leaves tens of
    thousands of inodes just freed, and on a file system without a journal (the H100 machine's) ext4 skips
    each of them while it looks for a free one, for every file a later start creates (docs/performance.md)."""
    for sub in ("upper", "work", "rootfs"):
        (dest / sub).mkdir(parents=True)
    rootfs = dest / "rootfs"
    layers = f"lowerdir={lower},upperdir={dest / 'upper'},workdir={dest / 'work'}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", layers, str(rootfs)], check=True)
    try:
        yield rootfs
    finally:
        subprocess.run(["umount", "--lazy", str(rootfs)], check=True)


def tar_rootfs(root: Path, tarball: Path) -> Path:
    """Pack a rootfs as an uncompressed tar with numeric owners (for image imports)."""
    subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tarball), "."], check=True)
    return tarball


def image_ref(variant: str) -> str:
    """The image name the engines' fixtures give the `variant` rootfs."""
    return f"localhost/nvc-test:{variant}"


class RootfsCache:
    """One build per variant per session; tests get copies, since they may modify them."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self._built: dict[str, Path] = {}
        self._tarballs: dict[str, Path] = {}

    def get(self, variant: str) -> Path:
        """The cached (read-only by convention) rootfs of `variant`, built on first use."""
        if variant not in self._built:
            self._built[variant] = build_rootfs(self.workdir / variant, variant)
        return self._built[variant]

    def copy(self, variant: str, dest: Path) -> Path:
        """A private copy of the `variant` rootfs at `dest`."""
        return copy_rootfs(self.get(variant), dest)

    def tarball(self, variant: str) -> Path:
        """The `variant` rootfs as a tar (for podman/containerd imports), made on first use."""
        if variant not in self._tarballs:
            self._tarballs[variant] = tar_rootfs(self.get(variant), self.workdir / f"{variant}.tar")
        return self._tarballs[variant]
