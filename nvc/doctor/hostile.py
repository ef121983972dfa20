"""The hostile-image cases of ``nvc-py doctor --security``, as data (nvc/doctor/security.py runs them).

Each :class:`Case` bends doctor's small image (busybox and the host's C library, nvc/doctor/run.py)
the way a public CVE of NVIDIA's container stack, or a case of tests/, did: directories and files
of the image replaced by links to host paths, ldconfig's files made links, FIFOs or devices, an
image environment naming the image's own libraries for the loader, a directory swapped for a link
while the container starts. Links aim at a *canary*, a host directory made for the run (or at the
real host place a CVE aimed at, where looking at it changes nothing), so that following one on the
host shows as a change there.

A case passes when nothing reached the host, whether the container started or the hook refused it:
the canary is the same to the byte and the nanosecond, no marker was written (what an image's
library or Python file leaves when it runs in a process of the host), the host's ld cache, its
``core_pattern`` and the driver-named files of its library and binary directories are unchanged, no
mount under the run's directory is left on the host, and the container's own mount table shows
neither the canary nor the host's ``/``. A case may ask for more of the container (``judge``).
Templates in paths, targets and values: ``{canary}`` (the canary's absolute path), ``{climb}``
(enough ``../`` to climb above any image directory), ``{marker}`` (the marker file's host path),
``{libdir}`` (the image's C library directory, e.g. ``lib/x86_64-linux-gnu``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

LIB = "usr/lib/x86_64-linux-gnu"  # where the hook mounts the driver's libraries in a Debian-shaped image
SEPARATOR = "--- nvc-py doctor ---"
# What every container runs: the GPUs it sees, its device nodes, its mount table.
COMMAND = [
    "/bin/sh",
    "-c",
    f"nvidia-smi -L 2>&1; echo '{SEPARATOR}'; ls /dev; echo '{SEPARATOR}'; cat /proc/self/mountinfo",
]
CLIMB = "../" * 16


@dataclass(frozen=True)
class Plant:
    """One change to the image: ``kind`` "link" (``value``: its target), "file" (``value``: its text),
    "dir", "fifo", "zero" (the character device 1:5), "copy" (``value``: an image file to copy),
    "marker-lib" (a shared object whose constructor appends to ``{marker}``; needs a C compiler)."""

    kind: str
    path: str
    value: str = ""


@dataclass(frozen=True)
class Case:
    """One hostile image: ``plants`` on doctor's image, ``env`` its environment (as an image's ``ENV``),
    ``race`` a directory of the image swapped with a link to the canary (``{canary}/lib``) as fast as
    can be while the container starts (engines whose container runs on the image in place only),
    ``needs`` "cc" (a C compiler) or "gpus" (two GPUs or more), ``judge`` a further condition on the
    container's output (:data:`JUDGES`)."""

    name: str
    cves: tuple[str, ...]
    attack: str
    plants: tuple[Plant, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    race: str | None = None
    needs: frozenset[str] = frozenset()
    judge: str | None = None


def link(path: str, target: str) -> Plant:
    return Plant("link", path, target)


def text(path: str, content: str) -> Plant:
    return Plant("file", path, content)


# The canary, made on the host for each case: a fake ld cache and conf dir, a passwd, a library
# directory holding a copy of the C library's libm under another name (ldconfig run on it on the
# host would add a ``libm.so.6`` link there), and an empty bin.
CANARY = (
    text("ld.so.cache", "the host's ld cache, not the container's\n"),
    text("ld.so.conf.d/host.conf", "/host/lib\n"),
    text("passwd", "root:x:0:0:root:/root:/bin/sh\n"),
    Plant("copy", "lib/libnvcdoctor.so.6.0", "{libdir}/libm.so.6"),
    Plant("dir", "bin"),
)

PYTHON_MARK = "import os\nwith open({marker!r}, 'a') as f:\n    f.write(f'python {{os.getpid()}}\\n')\n"

CASES: tuple[Case, ...] = (
    Case(
        "libdir-link-to-host-dir",
        ("CVE-2024-0133", "CVE-2024-0134"),
        "the library directory is an absolute link to a host directory",
        (link(LIB, "{canary}/lib"),),
    ),
    Case(
        "libdir-link-climbing",
        ("CVE-2024-0133", "CVE-2024-0134"),
        "the library directory is a relative link climbing above / to a host directory",
        (link(LIB, "{climb}{canary}/lib"),),
    ),
    Case(
        "libdir-link-to-host-etc",
        ("CVE-2024-0133",),
        "the library directory links to /etc (the published layout)",
        (link(LIB, "/etc"),),
    ),
    Case(
        "usr-bin-link-to-host-dir",
        ("CVE-2024-0133",),
        "/usr/bin is an absolute link to a host directory",
        (link("usr/bin", "{canary}/bin"),),
    ),
    Case(
        "mount-target-link-to-host-file",
        ("CVE-2024-0133",),
        "nvidia-smi's mount point is a link to a host file",
        (link("usr/bin/nvidia-smi", "{canary}/passwd"),),
    ),
    Case(
        "mount-target-link-into-proc",
        ("CVE-2024-0133",),
        "nvidia-smi's mount point links to /proc/sys/kernel/core_pattern",
        (link("usr/bin/nvidia-smi", "/proc/sys/kernel/core_pattern"),),
    ),
    Case(
        "compat-lib-link-to-root",
        ("CVE-2024-0132", "CVE-2025-23359"),
        "a CUDA compat library is a link to /",
        (link("usr/local/cuda/compat/libcuda.so.999.1.1", "/"),),
    ),
    Case(
        "compat-lib-link-climbing",
        ("CVE-2024-0132", "CVE-2025-23359"),
        "a CUDA compat library is a relative link climbing to a host directory",
        (link("usr/local/cuda/compat/libcuda.so.999.1.1", "{climb}{canary}"),),
    ),
    Case(
        "compat-lib-directory",
        ("CVE-2024-0132",),
        "a CUDA compat library is a directory",
        (Plant("dir", "usr/local/cuda/compat/libcuda.so.999.1.1"),),
    ),
    Case(
        "libdir-swapped-during-start",
        ("CVE-2024-0132", "CVE-2025-23359", "CVE-2026-24260"),
        "the library directory is swapped with a link to a host directory while the container starts",
        (Plant("dir", LIB),),
        race=LIB,
    ),
    Case(
        "ld-so-cache-link-to-host-file",
        ("CVE-2025-23267",),
        "/etc/ld.so.cache is an absolute link to a host file",
        (link("etc/ld.so.cache", "{canary}/ld.so.cache"),),
    ),
    Case(
        "ld-so-cache-link-climbing",
        ("CVE-2025-23267",),
        "/etc/ld.so.cache is a relative link climbing to a host file",
        (link("etc/ld.so.cache", "{climb}{canary}/ld.so.cache"),),
    ),
    Case(
        "ld-so-conf-d-link-to-host-dir",
        ("CVE-2025-23267",),
        "/etc/ld.so.conf.d is a link to a host directory",
        (
            text("etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n"),
            link("etc/ld.so.conf.d", "{canary}/ld.so.conf.d"),
        ),
    ),
    Case(
        "ld-so-conf-names-host-dir",
        ("CVE-2025-23267",),
        "ld.so.conf.d names a host library directory",
        (
            text("etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n"),
            text("etc/ld.so.conf.d/outside.conf", "{canary}/lib\n{climb}{canary}/lib\n"),
        ),
    ),
    Case(
        "ldconfig-of-the-image",
        ("CVE-2024-0135", "CVE-2024-0136", "CVE-2024-0137"),
        "the image ships its own ldconfig, which marks the host if run there",
        tuple(
            text(path, "#!/bin/sh\necho ldconfig $$ >> {marker}\n")
            for path in ("sbin/ldconfig", "sbin/ldconfig.real", "usr/sbin/ldconfig")
        ),
    ),
    Case("ld-so-conf-fifo", (), "/etc/ld.so.conf is a FIFO (a start that hangs)", (Plant("fifo", "etc/ld.so.conf"),)),
    Case(
        "ld-so-cache-tmp-device",
        (),
        "/etc/ld.so.cache~ is the character device 1:5 (/dev/zero)",
        (Plant("zero", "etc/ld.so.cache~"),),
    ),
    Case(
        "ld-preload-in-image-env",
        ("CVE-2025-23266",),
        "the image's ENV sets LD_PRELOAD to its own library (/proc/self/cwd/p.so, NVIDIAScape)",
        (Plant("marker-lib", "p.so"),),
        env={"LD_PRELOAD": "/proc/self/cwd/p.so:/p.so"},
        needs=frozenset({"cc"}),
    ),
    Case(
        "ld-library-path-in-image-env",
        ("CVE-2025-23266",),
        "the image's ENV sets LD_LIBRARY_PATH to its own copies of libraries the hook loads",
        tuple(Plant("marker-lib", f"evil/{name}") for name in ("libnvidia-ml.so.1", "libseccomp.so.2", "libffi.so.8")),
        env={"LD_LIBRARY_PATH": "/proc/self/cwd/evil:/evil"},
        needs=frozenset({"cc"}),
    ),
    Case(
        "python-path-in-image-env",
        ("CVE-2025-23266",),
        "the image's ENV sets PYTHONPATH and PYTHONSTARTUP to its own sitecustomize.py",
        (
            text("py/sitecustomize.py", PYTHON_MARK),
            text("py/usercustomize.py", PYTHON_MARK),
            text("py/startup.py", PYTHON_MARK),
        ),
        env={
            "PYTHONPATH": "/proc/self/cwd/py:/py",
            "PYTHONSTARTUP": "/proc/self/cwd/py/startup.py",
            "PYTHONUSERBASE": "/proc/self/cwd/py",
        },
    ),
    Case(
        "other-gpus-device-nodes",
        ("CVE-2021-1056",),
        "a container asking for GPU 0 is given no other GPU's device node",
        judge="only-gpu0",
        needs=frozenset({"gpus"}),
    ),
)


def fill(template: str, canary: str, marker: str, libdir: str) -> str:
    return template.format(canary=canary, climb=CLIMB, marker=marker, libdir=libdir.strip("/"))


def parts(output: str) -> tuple[str, str, str]:
    """A container's output: what nvidia-smi said, its /dev listing, its mount table."""
    smi, _, rest = output.partition(SEPARATOR + "\n")
    dev, _, mountinfo = rest.partition(SEPARATOR + "\n")
    return smi, dev, mountinfo


def sees_gpu0(output: str) -> str | None:
    """nvidia-smi's line for GPU 0 in a container's output (None: it did not list it)."""
    return next((line for line in parts(output)[0].splitlines() if line.startswith("GPU 0:")), None)


def _only_gpu0(output: str) -> str | None:
    nodes = sorted(name for name in parts(output)[1].split() if re.fullmatch(r"nvidia\d+", name))
    return None if nodes in ([], ["nvidia0"]) else f"the container has {', '.join('/dev/' + n for n in nodes)}"


# A case's further condition on a container that started: None where it holds, else why not.
JUDGES = {"only-gpu0": _only_gpu0}


def mounts_of(mountinfo: str, places: Mapping[str, tuple[str, str, bool]]) -> list[str]:
    """The mount points of a mount table that show one of ``places`` (a name -> the device and path
    inside its filesystem, as mountinfo's fields 3 and 4 give them, and whether what lies below that
    path counts too), each with the place's name."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        for name, (dev, root, below) in places.items():
            under = below and fields[3].startswith(root.rstrip("/") + "/")
            if fields[2] == dev and (fields[3] == root or under):
                found.append(f"{fields[4]} ({name})")
    return found
