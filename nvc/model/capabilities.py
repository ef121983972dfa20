"""Driver capabilities and the driver files each one needs.

Libraries and binaries are matched by basename prefix (``libcuda.so`` matches
``libcuda.so.1`` and ``libcuda.so.580.95.05``). Every prefix appears in exactly one
group: a prefix listed twice once made the reference tool report a library missing.
Discovery looks for every group; a container gets only the groups of its capabilities.
"""

from __future__ import annotations

from collections.abc import Iterable

from nvc.errors import InputError

# Library groups, in the order their files are listed.
LIBRARY_GROUPS: dict[str, tuple[str, ...]] = {
    "utility": ("libnvidia-ml.so", "libnvidia-cfg.so", "libnvidia-nscq.so"),
    "compute": (
        "libcuda.so",
        "libcudadebugger.so",
        "libnvidia-opencl.so",
        "libnvidia-gpucomp.so",
        "libnvidia-ptxjitcompiler.so",
        "libnvidia-fatbinaryloader.so",
        "libnvidia-allocator.so",
        "libnvidia-compiler.so",
        "libnvidia-pkcs11.so",
        "libnvidia-pkcs11-openssl3.so",
        "libnvidia-nvvm.so",
        "libnvidia-tileiras.so",
    ),
    "video": ("libvdpau_nvidia.so", "libnvidia-encode.so", "libnvidia-opticalflow.so", "libnvcuvid.so"),
    "graphics": (
        "libnvidia-eglcore.so",
        "libnvidia-glcore.so",
        "libnvidia-tls.so",
        "libnvidia-glsi.so",
        "libnvidia-fbc.so",
        "libnvidia-ifr.so",
        "libnvidia-rtcore.so",
        "libnvoptix.so",
    ),
    "graphics-glvnd": (
        "libGLX_nvidia.so",
        "libEGL_nvidia.so",
        "libGLESv2_nvidia.so",
        "libGLESv1_CM_nvidia.so",
        "libnvidia-glvkspirv.so",
        "libnvidia-cbl.so",
    ),
    # The driver's own non-GLVND GL libraries; only files linked against its GL core count.
    "graphics-compat": ("libGL.so", "libEGL.so", "libGLESv1_CM.so", "libGLESv2.so"),
    "ngx": ("libnvidia-ngx.so",),
}

BINARY_GROUPS: dict[str, tuple[str, ...]] = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}

_GRAPHICS = ("graphics", "graphics-glvnd", "graphics-compat")

# Capability → library groups it brings. Video also needs the compute libraries.
CAPABILITY_LIBRARIES: dict[str, tuple[str, ...]] = {
    "utility": ("utility",),
    "compute": ("compute",),
    "video": ("video", "compute"),
    "graphics": _GRAPHICS,
    "display": _GRAPHICS,
    "ngx": ("ngx",),
    "compat32": (),
}

CAPABILITIES: tuple[str, ...] = tuple(CAPABILITY_LIBRARIES)

TLS_PREFIX = "libnvidia-tls.so"
TLS_ABI = (2, 3, 99)  # the GNU ABI note of the TLS build that matches current glibc
GL_CORE_PREFIXES = ("libnvidia-glcore.so", "libnvidia-eglcore.so")


def all_library_prefixes() -> tuple[str, ...]:
    """Every library prefix, in listing order."""
    return tuple(p for group in LIBRARY_GROUPS.values() for p in group)


def all_binaries() -> tuple[str, ...]:
    """Every binary name, in listing order."""
    return tuple(b for group in BINARY_GROUPS.values() for b in group)


def check(capabilities: Iterable[str]) -> frozenset[str]:
    """The capability set, refusing names nvc-py does not know."""
    caps = frozenset(capabilities)
    unknown = sorted(caps - set(CAPABILITIES))
    if unknown:
        raise InputError(f"unknown driver capability: {unknown[0]}")
    return caps


def library_prefixes(capabilities: Iterable[str]) -> tuple[str, ...]:
    """Library prefixes a container with ``capabilities`` gets, in listing order."""
    groups = {g for c in check(capabilities) for g in CAPABILITY_LIBRARIES[c]}
    return tuple(p for name, prefixes in LIBRARY_GROUPS.items() if name in groups for p in prefixes)


def binary_names(capabilities: Iterable[str]) -> tuple[str, ...]:
    """Binary names a container with ``capabilities`` gets, in listing order."""
    caps = check(capabilities)
    return tuple(b for name, names in BINARY_GROUPS.items() if name in caps for b in names)


def is_compat_gl(prefix: str) -> bool:
    """Whether ``prefix`` names a non-GLVND GL library (which must link the driver's GL core)."""
    return prefix in LIBRARY_GROUPS["graphics-compat"]
