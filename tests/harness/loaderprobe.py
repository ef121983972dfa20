"""What a graphics/video container sees of the driver's loader files, printed from inside it and read
back here: each json file at its loader's path, the library it names as the container's ld cache
resolves it, libvdpau_nvidia under vdpau/, the GBM backend, the DRM nodes (#54). Shared by the
fake-driver test and the GPU test."""

from __future__ import annotations

import json

from .configurehook import PROBE

MULTIARCH = "/usr/lib/x86_64-linux-gnu"
VULKAN_ICD = "/usr/share/vulkan/icd.d/nvidia_icd.json"
EGL_VENDOR = "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"
VDPAU = f"{MULTIARCH}/vdpau/libvdpau_nvidia.so.1"
GBM = f"{MULTIARCH}/gbm/nvidia-drm_gbm.so"


def script(manifests: tuple[str, ...], probes: tuple[str, ...] = ()) -> str:
    """A shell script printing each section after a ``== NAME`` line (:func:`sections` reads them)."""
    parts = [PROBE]
    parts += [f'echo "== {path}"; cat {path}; echo' for path in manifests]
    parts.append(
        "echo '== resolved'; for p in $(ldconfig -p | awk '/=>/ {print $1 \"=\" $NF}'); do"
        ' test -e "${p#*=}" && echo "$p"; done'
    )
    parts.append(f"echo '== vdpau'; readlink {VDPAU}; test -f {VDPAU} && echo regular")
    parts.append(f"echo '== gbm'; test -f {GBM} && echo regular")
    # a host without nvidia-drm (the H100 machine) has no /dev/dri: not the script's failure
    parts.append("echo '== dri'; ls /dev/dri 2>/dev/null" + "".join(f"; probe {p}" for p in probes) + "; true")
    return "; ".join(parts)


def sections(out: str) -> dict[str, str]:
    """The container's output by section."""
    found: dict[str, list[str]] = {}
    current = ""
    for line in out.splitlines():
        if line.startswith("== "):
            current = line[3:]
            found[current] = []
        else:
            found.setdefault(current, []).append(line)
    return {name: "\n".join(lines) for name, lines in found.items()}


def unresolved(out: dict[str, str], manifests: tuple[str, ...]) -> list[str]:
    """Each manifest whose library the container's ld cache does not resolve to an existing file."""
    resolved = dict(line.split("=", 1) for line in out["resolved"].splitlines() if "=" in line)
    bad = []
    for path in manifests:
        doc = json.loads(out[path])
        name = (doc.get("ICD") or doc["layer"])["library_path"]
        if name not in resolved:
            bad.append(f"{path}: {name}")
    return bad
