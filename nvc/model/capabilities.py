"""Driver capabilities and the driver files each one needs.

Libraries and binaries are matched by basename prefix (``libcuda.so`` matches
``libcuda.so.1`` and ``libcuda.so.580.95.05``). Every prefix appears in exactly one
group: a prefix listed twice once made the reference tool report a library missing.
Discovery looks for every group; a container gets only the groups of its capabilities.
Besides the libraries the ld cache knows, a capability needs files its loaders read from fixed
places (:data:`LOADER_FILES`: ICD and vendor json files, the VDPAU and GBM backends, the X
driver); docs/capabilities.md tables them all.
"""

from collections.abc import Iterable

from nvc.errors import InputError
from nvc.records import NamedTuple

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
        "libnvidia-compiler.so",
        "libnvidia-pkcs11.so",
        "libnvidia-pkcs11-openssl3.so",
        "libnvidia-nvvm.so",
        "libnvidia-tileiras.so",
    ),
    # The GBM backend (gbm/nvidia-drm_gbm.so is this library) and CUDA's IPC allocator.
    "allocator": ("libnvidia-allocator.so",),
    # libvdpau_nvidia is no ld cache library: libvdpau loads it from <libdir>/vdpau/ (LOADER_FILES).
    "video": ("libnvidia-encode.so", "libnvidia-opticalflow.so", "libnvcuvid.so"),
    "graphics": (
        "libnvidia-eglcore.so",
        "libnvidia-glcore.so",
        "libnvidia-tls.so",
        "libnvidia-glsi.so",
        "libnvidia-fbc.so",
        "libnvidia-ifr.so",
        "libnvidia-rtcore.so",
        "libnvoptix.so",
        "libnvidia-vulkan-producer.so",
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
    # EGL external platforms the driver bundles: versioned on their own (libnvidia-egl-wayland.so.1.1.13).
    "graphics-platform": (
        "libnvidia-egl-wayland.so",
        "libnvidia-egl-gbm.so",
        "libnvidia-egl-xcb.so",
        "libnvidia-egl-xlib.so",
    ),
    "ngx": ("libnvidia-ngx.so",),
}

# Libraries whose file name carries their own version, not the driver's.
UNVERSIONED_PREFIXES = LIBRARY_GROUPS["graphics-platform"]

BINARY_GROUPS: dict[str, tuple[str, ...]] = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}

_GRAPHICS = ("graphics", "graphics-glvnd", "graphics-compat", "graphics-platform", "allocator")

# Capability → library groups it brings. Video also needs the compute libraries.
CAPABILITY_LIBRARIES: dict[str, tuple[str, ...]] = {
    "utility": ("utility",),
    "compute": ("compute", "allocator"),
    "video": ("video", "compute", "allocator"),
    "graphics": _GRAPHICS,
    "display": _GRAPHICS,
    "ngx": ("ngx",),
    "compat32": (),
}

CAPABILITIES: tuple[str, ...] = tuple(CAPABILITY_LIBRARIES)

GRAPHICS_CAPABILITIES = frozenset({"graphics", "display"})  # those that get the GPUs' DRM nodes

LIBDIR = "{libdir}"  # in a LoaderFile's paths: the driver's library directory (host), the image's (container)


class LoaderFile(NamedTuple):
    """A driver file a loader reads from a fixed place rather than through the ld cache.

    ``search``: inner paths of the driver root, first found wins (the .run installer and Debian's
    packages put some in different places; Debian's through /etc/alternatives links). ``target``:
    where the container gets it, where its loader looks; a target ending in ``/`` is a directory
    that gets the found file under its own (versioned) name plus a link from the searched name.
    ``kind`` decides the check that the file is the running driver's: ``json`` (a loader
    manifest: each ``library_path`` must be a bare name of a driver library, which the container's
    ld cache resolves), ``icd`` (OpenCL's: the library name is the whole text), ``library`` (its
    resolved name ends with the driver version), ``module`` (its contents carry the version),
    ``data`` (none: nvoptix.bin).
    """

    group: str
    search: tuple[str, ...]
    target: str
    kind: str
    why: str


def _both(*paths: str) -> tuple[str, ...]:
    """Each path under /usr/share then /etc: loaders read both, installers write either."""
    return tuple(f"{top}{p}" for p in paths for top in ("/usr/share", "/etc"))


_EGL_PLATFORMS = ("09_nvidia_wayland2", "10_nvidia_wayland", "15_nvidia_gbm", "20_nvidia_xcb", "20_nvidia_xlib")

LOADER_FILES: tuple[LoaderFile, ...] = (
    LoaderFile(
        "graphics",
        _both("/vulkan/icd.d/nvidia_icd.json", "/vulkan/icd.d/nvidia_icd.x86_64.json"),
        "/usr/share/vulkan/icd.d/nvidia_icd.json",
        "json",
        "the Vulkan loader's ICD manifest: without it Vulkan finds no NVIDIA device",
    ),
    LoaderFile(
        "graphics",
        _both("/vulkan/implicit_layer.d/nvidia_layers.json", "/vulkan/icd.d/nvidia_layers.json"),
        "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
        "json",
        "the driver's implicit Vulkan layer (Optimus, present from X/Wayland)",
    ),
    LoaderFile(
        "graphics",
        _both("/glvnd/egl_vendor.d/10_nvidia.json"),
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        "json",
        "GLVND's EGL vendor file: without it libEGL never loads libEGL_nvidia",
    ),
    *(
        LoaderFile(
            "graphics",
            _both(f"/egl/egl_external_platform.d/{name}.json"),
            f"/usr/share/egl/egl_external_platform.d/{name}.json",
            "json",
            "an EGL external platform (Wayland, GBM, XCB, Xlib) for libEGL_nvidia",
        )
        for name in _EGL_PLATFORMS
    ),
    LoaderFile(
        "graphics",
        (f"{LIBDIR}/gbm/nvidia-drm_gbm.so",),
        f"{LIBDIR}/gbm/nvidia-drm_gbm.so",
        "library",
        "Mesa's GBM loads the backend of the DRM driver's name from <libdir>/gbm/ (libnvidia-allocator)",
    ),
    LoaderFile(
        "graphics",
        ("/usr/share/nvidia/nvoptix.bin", "/usr/share/nvidia/current/nvoptix.bin"),
        "/usr/share/nvidia/nvoptix.bin",
        "data",
        "OptiX's denoiser weights, read by libnvoptix",
    ),
    LoaderFile(
        "video",
        # a self-contained driver tree (/usr/local/nvidia/lib64) keeps it beside the other libraries
        (f"{LIBDIR}/vdpau/libvdpau_nvidia.so.1", f"{LIBDIR}/libvdpau_nvidia.so.1"),
        f"{LIBDIR}/vdpau/",
        "library",
        "libvdpau loads <libdir>/vdpau/libvdpau_<driver>.so.1, outside the ld cache",
    ),
    LoaderFile(
        "compute",
        ("/etc/OpenCL/vendors/nvidia.icd",),
        "/etc/OpenCL/vendors/nvidia.icd",
        "icd",
        "the OpenCL ICD loader's vendor file: without it OpenCL finds no platform",
    ),
    LoaderFile(
        "display",
        ("/usr/lib/xorg/modules/drivers/nvidia_drv.so", "/usr/lib/nvidia/current/nvidia_drv.so"),
        "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
        "module",
        "the X server's NVIDIA driver",
    ),
    LoaderFile(
        "display",
        ("/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so", "/usr/lib/nvidia/current/libglxserver_nvidia.so"),
        "/usr/lib/xorg/modules/extensions/",
        "library",
        "the X server's GLX module for the NVIDIA driver",
    ),
    LoaderFile(
        "display",
        (
            "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf",
            "/etc/X11/xorg.conf.d/nvidia-drm-outputclass.conf",
            "/etc/nvidia/current/nvidia-drm-outputclass.conf",
        ),
        "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf",
        "data",
        "makes the X server load the NVIDIA driver for a device nvidia-drm drives",
    ),
)

# Capability → loader file groups it brings (as CAPABILITY_LIBRARIES: video brings compute's).
CAPABILITY_LOADER_FILES: dict[str, tuple[str, ...]] = {
    "compute": ("compute",),
    "video": ("video", "compute"),
    "graphics": ("graphics",),
    "display": ("graphics", "display"),
}

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


def loader_files(capabilities: Iterable[str]) -> tuple[LoaderFile, ...]:
    """The loader files a container with ``capabilities`` gets, in :data:`LOADER_FILES` order."""
    groups = {g for c in check(capabilities) for g in CAPABILITY_LOADER_FILES.get(c, ())}
    return tuple(f for f in LOADER_FILES if f.group in groups)


def is_compat_gl(prefix: str) -> bool:
    """Whether ``prefix`` names a non-GLVND GL library (which must link the driver's GL core)."""
    return prefix in LIBRARY_GROUPS["graphics-compat"]
