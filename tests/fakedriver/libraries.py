"""Compiling the fake driver's libraries and tools, and the ld.so.cache the real ``ldconfig`` makes.

Every library of NVIDIA's capability lists is laid out as a stub ELF file with its real SONAME (the
fake NVML and CUDA are built from their own sources, so the machine's answers travel with them into
chroots and containers). The library list is this package's own test data, deliberately not imported
from nvc: a test that checks nvc against nvc proves nothing. Test double only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .machine import Layout

SRC = Path(__file__).resolve().parent / "src"
# The CUDA and NVML C ABIs are declared once, in the sharing shim's headers (native/shim/base/cuda_abi.h,
# nvml_abi.h), named as the shim names them ("base/cuda_abi.h"): the fake implements the same
# declarations the shim passes through. -iquote: no shim header may stand in for a system one.
ABI_HEADERS = Path(__file__).resolve().parents[2] / "native" / "shim"
INCLUDES = [f"-I{SRC}", f"-iquote{ABI_HEADERS}"]

# Library groups of NVIDIA's capability lists. Value: the SONAME's version suffix
# (libcuda.so -> SONAME libcuda.so.1); None where the SONAME is the versioned file name itself,
# as for the driver's internal libraries (libnvidia-glcore.so.<driver version>).
LIBRARY_GROUPS: dict[str, dict[str, str | None]] = {
    "utility": {"libnvidia-ml.so": "1", "libnvidia-cfg.so": "1", "libnvidia-nscq.so": "2"},
    "compute": {
        "libcuda.so": "1",
        "libcudadebugger.so": "1",
        "libnvidia-opencl.so": "1",
        "libnvidia-gpucomp.so": None,
        "libnvidia-ptxjitcompiler.so": "1",
        "libnvidia-fatbinaryloader.so": None,
        "libnvidia-compiler.so": None,
        "libnvidia-pkcs11.so": None,
        "libnvidia-pkcs11-openssl3.so": None,
        "libnvidia-nvvm.so": "4",
        "libnvidia-tileiras.so": "1",
    },
    "allocator": {"libnvidia-allocator.so": "1"},
    "video": {
        "libvdpau_nvidia.so": "1",
        "libnvidia-encode.so": "1",
        "libnvidia-opticalflow.so": "1",
        "libnvcuvid.so": "1",
    },
    "graphics": {
        "libnvidia-eglcore.so": None,
        "libnvidia-glcore.so": None,
        "libnvidia-tls.so": None,
        "libnvidia-glsi.so": None,
        "libnvidia-fbc.so": "1",
        "libnvidia-ifr.so": "1",
        "libnvidia-rtcore.so": None,
        "libnvoptix.so": "1",
        "libnvidia-vulkan-producer.so": None,
    },
    "graphics_glvnd": {
        "libGLX_nvidia.so": "0",
        "libEGL_nvidia.so": "0",
        "libGLESv2_nvidia.so": "2",
        "libGLESv1_CM_nvidia.so": "1",
        "libnvidia-glvkspirv.so": None,
        "libnvidia-cbl.so": None,
    },
    "graphics_compat": {"libGL.so": "1", "libEGL.so": "1", "libGLESv1_CM.so": "1", "libGLESv2.so": "2"},
    "graphics_platform": {"libnvidia-egl-wayland.so": "1", "libnvidia-egl-gbm.so": "1"},
    "ngx": {"libnvidia-ngx.so": "1"},
}
# Libraries of their own version, not the driver's (the EGL platforms the driver bundles).
OWN_VERSIONS = {"libnvidia-egl-wayland.so": "1.1.13", "libnvidia-egl-gbm.so": "1.1.1"}
VDPAU = "libvdpau_nvidia.so"  # loaded by libvdpau from <libdir>/vdpau/, never through the ld cache
ALLOCATOR = "libnvidia-allocator.so"  # also GBM's backend: <libdir>/gbm/nvidia-drm_gbm.so
# Libraries built from their own sources instead of the stub: every C file of their folder in src/.
IMPLEMENTED = {"libnvidia-ml.so": "libnvidia-ml", "libcuda.so": "libcuda"}
ABI_NOTE_LIBRARIES = {"libnvidia-tls.so"}  # carry a GNU/Linux 2.3.99 ABI note
GLCORE_CLIENTS = set(LIBRARY_GROUPS["graphics_compat"])  # DT_NEEDED libnvidia-glcore.so.<ver>

BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nv-fabricmanager",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)


# The binaries with a program of their own (src/<program>.c); the others are src/tool.c
_BINARY_PROGRAMS = {"nvidia-smi": "nvidia-smi", "nvidia-cuda-mps-control": "mps_control"}


class BuildError(RuntimeError):
    """A compiler, linker or ldconfig step failed; the message carries its command and output."""


def library_sources(name: str) -> list[Path]:
    """The C files of an implemented library (``libcuda.so``), linked together into it."""
    return sorted((SRC / IMPLEMENTED[name]).glob("*.c"))


def _run_all(commands: list[list[str]]) -> None:
    """Run commands concurrently (a build is a few dozen short gcc/ld runs); fail on the first error."""
    procs = [
        (cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)) for cmd in commands
    ]
    failures = []
    for cmd, proc in procs:
        output, _ = proc.communicate()
        if proc.returncode != 0:
            failures.append(f"{' '.join(cmd)}\n{output}")
    if failures:
        raise BuildError("fake driver build step failed:\n" + "\n".join(failures))


def _libc(bits: int) -> str:
    """The libc.so.6 to link stubs against, so ldconfig tags them libc6 like real driver libraries."""
    flag = ["-m32"] if bits == 32 else []
    path = subprocess.run(
        ["gcc", *flag, "-print-file-name=libc.so.6"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not os.path.isabs(path):
        raise BuildError(f"gcc {' '.join(flag)} cannot find libc.so.6 (is gcc-multilib installed?)")
    return path


def _soname(name: str, suffix: str | None, version: str) -> str:
    return f"{name}.{suffix}" if suffix is not None else f"{name}.{version}"


def file_dir(libdir: Path, name: str, suffix: str | None, layout: Layout) -> Path:
    """Where library ``name``'s file goes: Debian's packages keep those with a SONAME link in
    nvidia/current (the links come from alternatives), the .run installer its VDPAU driver in vdpau/."""
    if layout.packaged and suffix is not None:
        return libdir / PACKAGED_DIR
    return libdir / "vdpau" if name == VDPAU and layout.vdpau_apart else libdir


PACKAGED_DIR = "nvidia/current"


def file_name(name: str, version: str) -> str:
    return f"{name}.{OWN_VERSIONS.get(name, version)}"


def build_libraries(machine: dict[str, Any], gen: Path, obj: Path, dirs: dict[int, Path], layout: Layout) -> None:
    version = machine["driver_version"]
    cflags = ["-O1", "-Wall", "-Werror", f"-I{gen}", *INCLUDES]
    libraries = {name: suffix for group in LIBRARY_GROUPS.values() for name, suffix in group.items()}
    compiles, stub_links, glcore_links = [], [], []
    for bits, libdir in dirs.items():
        arch = ["-m32"] if bits == 32 else ["-m64"]
        emulation = ["-m", "elf_i386"] if bits == 32 else ["-m", "elf_x86_64"]
        libc = _libc(bits)
        for variant, defines in (("stub", []), ("stub-abi", ["-DFAKE_ABI_NOTE"])):
            compiles.append(
                [
                    "gcc",
                    *arch,
                    *cflags,
                    "-fPIC",
                    *defines,
                    "-c",
                    str(SRC / "stub.c"),
                    "-o",
                    str(obj / f"{variant}{bits}.o"),
                ]
            )
        for name, suffix in libraries.items():
            where = file_dir(libdir, name, suffix, layout)
            where.mkdir(parents=True, exist_ok=True)
            target = where / file_name(name, version)
            soname = _soname(name, suffix, version)
            sources = library_sources(name) if name in IMPLEMENTED else []
            if sources:
                compiles.append(
                    [
                        "gcc",
                        *arch,
                        *cflags,
                        "-fPIC",
                        "-shared",
                        "-pthread",
                        f"-Wl,-soname,{soname}",
                        *map(str, sources),
                        "-o",
                        str(target),
                    ]
                )
                continue
            stub = obj / (f"stub-abi{bits}.o" if name in ABI_NOTE_LIBRARIES else f"stub{bits}.o")
            link = ["ld", *emulation, "-shared", "-soname", soname, "-o", str(target), str(stub), libc]
            if name in GLCORE_CLIENTS:
                glcore = file_dir(libdir, "libnvidia-glcore.so", None, layout) / f"libnvidia-glcore.so.{version}"
                glcore_links.append(link + [str(glcore)])
            else:
                stub_links.append(link)
    for tool in ("nvidia-smi", "tool", "mps_control"):
        compiles.append(["gcc", "-m64", *cflags, str(SRC / f"{tool}.c"), "-o", str(obj / tool)])
    _run_all(compiles)
    _run_all(stub_links)  # libnvidia-glcore first: the compat GL libraries link against it
    _run_all(glcore_links)


def install_binaries(bin_dir: Path, obj: Path, version: str, strays: str | None = None) -> None:
    """The binaries; with ``strays`` (a version) nvidia-persistenced is another driver's, as Debian
    ships it (its own package, its own version)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in BINARIES:
        shutil.copy2(obj / _BINARY_PROGRAMS.get(name, "tool"), bin_dir / name)
    if strays is not None:
        persistenced = bin_dir / "nvidia-persistenced"
        persistenced.write_bytes(persistenced.read_bytes().replace(version.encode(), strays.encode()))


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def _alternative(root: Path, link: Path, name: str, target: str) -> None:
    """``link`` -> /etc/alternatives/``name`` -> ``target``, as update-alternatives makes them."""
    _link(link, f"/etc/alternatives/{name}")
    _link(root / "etc/alternatives" / name, target)


def link_libraries(root: Path, layout: Layout, version: str, strays: str | None) -> None:
    """The links the installer makes beside the files: the .run installer's in vdpau/ and gbm/,
    Debian's SONAME links in nvidia/current and their alternatives in the multiarch dirs (with
    ``strays``, libnvidia-cfg's alternative left pointing at another driver's file)."""
    libraries = {name: suffix for group in LIBRARY_GROUPS.values() for name, suffix in group.items()}
    for rel in (layout.lib, layout.lib32):
        libdir = root / rel
        inner = f"/{rel}"
        triplet = Path(rel).name
        allocator = f"{ALLOCATOR}.1"
        if not layout.packaged:
            _link(libdir / ("vdpau" if layout.vdpau_apart else "") / f"{VDPAU}.1", f"{VDPAU}.{version}")
            _link(libdir / "gbm/nvidia-drm_gbm.so", f"../{allocator}")
            continue
        for name, suffix in libraries.items():
            if suffix is None:
                continue
            soname = f"{name}.{suffix}"
            _link(libdir / PACKAGED_DIR / soname, file_name(name, version))
            if name != VDPAU:
                _alternative(root, libdir / soname, f"nvidia--{soname}-{triplet}", f"{inner}/{PACKAGED_DIR}/{soname}")
        _alternative(
            root, libdir / "vdpau" / f"{VDPAU}.1", f"nvidia--{VDPAU}.1-{triplet}", f"{inner}/{PACKAGED_DIR}/{VDPAU}.1"
        )
        _alternative(
            root,
            libdir / "gbm/nvidia-drm_gbm.so",
            f"nvidia--nvidia-drm_gbm.so-{triplet}",
            f"{inner}/{PACKAGED_DIR}/{allocator}",
        )
    if layout.packaged and strays is not None:
        legacy = root / layout.lib / f"nvidia/legacy-{strays}"
        legacy.mkdir(parents=True)
        shutil.copy2(
            root / layout.lib / PACKAGED_DIR / f"libnvidia-cfg.so.{version}", legacy / f"libnvidia-cfg.so.{strays}"
        )
        _link(legacy / "libnvidia-cfg.so.1", f"libnvidia-cfg.so.{strays}")
        alternative = root / "etc/alternatives" / f"nvidia--libnvidia-cfg.so.1-{Path(layout.lib).name}"
        alternative.unlink()
        alternative.symlink_to(f"/{layout.lib}/nvidia/legacy-{strays}/libnvidia-cfg.so.1")


def make_ldcache(root: Path, layout: Layout) -> None:
    """ld.so.conf as a distribution writes it, then the real ldconfig: soname links and the cache."""
    conf_d = root / "etc/ld.so.conf.d"
    conf_d.mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    for name, directories in layout.ld_conf.items():
        (conf_d / name).write_text("".join(f"{d}\n" for d in directories))
    result = subprocess.run(["ldconfig", "-r", str(root)], capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"ldconfig -r {root} failed ({result.returncode}): {result.stderr}")
