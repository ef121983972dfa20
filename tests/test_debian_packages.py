"""`nvc-py list` on a throwaway root with Debian 12's own NVIDIA driver packages (non-free, #54),
against the packages' own file lists: every regular file they install is listed, or named in
golden/debian-nvidia-left-out.txt with its reason.

The root is a cached debootstrap root (harness.debroot); apt inside it, with a sources list of its
own (the host's is not touched), installs the packages with their maintainer scripts, so the
alternatives links and the ld cache are Debian's. The downloads and apt's lists, and the root with the
packages installed (for a week: the test reads an overlay over it), are cached in the suite's cache
directory between runs. Only /proc/driver/nvidia is faked (no kernel driver here):
its version is the packages'.
"""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakedriver.activate import bind, private_mounts
from hostcheck import CACHE_DIR

from harness import debroot
from harness.progress import phase

INCLUDE = "python3"  # test_deb.py's root: cached already where the suite ran
PACKAGES = (
    "nvidia-smi",
    "libnvidia-ml1",
    "libnvidia-cfg1",
    "libcuda1",
    "libcudadebugger1",
    "libnvidia-nvvm4",
    "libnvidia-allocator1",
    "nvidia-opencl-icd",
    "libnvidia-encode1",
    "libnvcuvid1",
    "nvidia-vdpau-driver",
    "libglx-nvidia0",
    "libegl-nvidia0",
    "libgles-nvidia1",
    "libgles-nvidia2",
    "nvidia-egl-icd",
    "nvidia-vulkan-icd",
    "libnvidia-rtcore",
    "libnvoptix1",
    "nvidia-persistenced",
    "xserver-xorg-video-nvidia",
)
SOURCES = "".join(
    f"deb {mirror} {suite} main contrib non-free non-free-firmware\n"
    for mirror, suite in (
        (debroot.MIRROR, "bookworm"),
        (debroot.MIRROR, "bookworm-updates"),
        ("http://security.debian.org/debian-security", "bookworm-security"),
    )
)
LEFT_OUT = Path(__file__).resolve().parent / "golden" / "debian-nvidia-left-out.txt"
# Where the packages' files come from: the driver's source package, and two packaged on their own.
OWN_SOURCES = ("nvidia-graphics-drivers",)
OWN_PACKAGES = ("nvidia-persistenced", "libnvidia-egl-wayland1")


@pytest.fixture(scope="module")
def nvidia_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    install = f"apt-get update -q && apt-get install -q -y --no-install-recommends {' '.join(PACKAGES)}"

    def packages(root: Path) -> None:
        (root / "etc/apt/sources.list").write_text(SOURCES)
        cache = Path(CACHE_DIR) / "debian-nvidia"
        for sub in ("archives/partial", "lists/partial"):
            (cache / sub).mkdir(parents=True, exist_ok=True)
        binds = [(cache / "lists", "/var/lib/apt/lists"), (cache / "archives", "/var/cache/apt/archives")]
        with phase("Debian's NVIDIA driver packages into a throwaway root (downloads cached)"):
            debroot.chroot(root, install, 1200, binds=binds)

    where = tmp_path_factory.mktemp("debian-nvidia")
    what = "Debian's NVIDIA driver packages"
    with debroot.prepared_root(where, INCLUDE, what, SOURCES + install, packages) as (root, _):
        yield root


def _query(root: Path, script: str) -> str:
    return debroot.chroot(root, script, 120).stdout


def _fake_proc(tmp_path: Path, version: str) -> Path:
    """A /proc/driver with the driver's version file and no GPU (the fast inventory's source)."""
    nvidia = tmp_path / "proc-driver" / "nvidia"
    (nvidia / "gpus").mkdir(parents=True)
    (nvidia / "version").write_text(
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
        "(pbuilder@debian)  Thu Jan  1 00:00:00 UTC 2026\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n"
    )
    return nvidia.parent


def _left_out() -> list[tuple[str, str]]:
    lines = [line for line in LEFT_OUT.read_text().splitlines() if line and not line.startswith("#")]
    return [tuple(line.split("  ", 1)) for line in lines]  # type: ignore[misc]


def test_list_against_the_packages_file_lists(nvidia_root: Path, tmp_path: Path) -> None:
    root = nvidia_root
    versions = dict(line.split() for line in _query(root, "dpkg-query -W -f '${Package} ${Version}\\n'").splitlines())
    version = versions["libcuda1"].split("-")[0]
    with private_mounts():
        bind(_fake_proc(tmp_path, version), "/proc/driver")
        done = subprocess.run(
            [sys.executable, "-m", "nvc", "--root", str(root), "list", "-l", "-b", "-f", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    listed = {p.removeprefix(str(root)) for section in listing.values() for p in section}

    ours = _query(root, "dpkg-query -W -f '${Package} ${Source}\\n'").splitlines()
    packages = [p for p, *src in map(str.split, ours) if p in OWN_PACKAGES or src[:1] == list(OWN_SOURCES)]
    installed = _query(root, f"dpkg -L {' '.join(packages)}").splitlines()
    files = {p for p in installed if (root / p.lstrip("/")).is_file() and not (root / p.lstrip("/")).is_symlink()}

    assert listed - files == set()  # nvc-py lists nothing the packages did not install
    patterns = _left_out()
    assert all(reason.strip() for _, reason in patterns), "a left-out line without its reason"
    unexplained = sorted(p for p in files - listed if not any(fnmatch.fnmatchcase(p, pat) for pat, _ in patterns))
    assert unexplained == []
    stale = [pat for pat, _ in patterns if not any(fnmatch.fnmatchcase(p, pat) for p in files - listed)]
    assert stale == []
    # Debian's nvidia-persistenced is of another version than the driver: named, not mounted
    persistenced = versions["nvidia-persistenced"].split("-")[0]
    assert persistenced != version
    # the only warning: GLVND's libGL.so.1.7.0 and friends in the ld cache are no driver's libraries
    assert done.stderr.splitlines() == [
        f"left out {root}/usr/bin/nvidia-persistenced: of driver {persistenced}, not {version}"
    ]
    assert f"/usr/lib/x86_64-linux-gnu/nvidia/current/libvdpau_nvidia.so.{version}" in listed
    assert "/usr/share/vulkan/icd.d/nvidia_icd.json" in listed
