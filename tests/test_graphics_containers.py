"""A graphics and video container on the fake driver (Debian's packaged layout), started by runc with
``nvc-py configure`` as its prestart hook (#54): each loader's json file at the path its loader
reads, naming a library the container's ld cache resolves to a file there; libvdpau_nvidia under
vdpau/ where libvdpau looks; the GBM backend; and only the selected GPU's DRM nodes, which its
device cgroup lets it open. A test double throughout: no result here is a GPU result."""

from __future__ import annotations

import json
from pathlib import Path

from harness.configurehook import PROBE
from harness.configurehook import hook as configure_hook
from harness.configurehook import run as run_container

MULTIARCH = "/usr/lib/x86_64-linux-gnu"
MANIFESTS = (
    "/usr/share/vulkan/icd.d/nvidia_icd.json",
    "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
    "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
)
VDPAU = f"{MULTIARCH}/vdpau/libvdpau_nvidia.so.1"
GBM = f"{MULTIARCH}/gbm/nvidia-drm_gbm.so"

# Sections the container prints, each after a "== NAME" line.
SCRIPT = (
    PROBE
    + "; "
    + "; ".join(f'echo "== {path}"; cat {path}; echo' for path in MANIFESTS)
    + "; echo '== resolved'; for p in $(ldconfig -p | awk '/=>/ {print $1 \"=\" $NF}'); do"
    + ' test -e "${p#*=}" && echo "$p"; done'
    + f"; echo '== vdpau'; readlink {VDPAU}; test -f {VDPAU} && echo regular"
    + f"; echo '== gbm'; test -f {GBM} && echo regular"
    + "; echo '== dri'; ls /dev/dri; probe /dev/dri/card2; probe /dev/dri/renderD129"
)


def _sections(out: str) -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    current = ""
    for line in out.splitlines():
        if line.startswith("== "):
            current = line[3:]
            sections[current] = []
        else:
            sections.setdefault(current, []).append(line)
    return {name: "\n".join(lines) for name, lines in sections.items()}


def test_graphics_container_sees_each_loader_file_and_its_gpus_drm_nodes(
    active_debian, debian_rootfs: Path, runc, tmp_path: Path
) -> None:
    fake = active_debian
    version = fake.driver_version
    hook = configure_hook(tmp_path, fake, debian_rootfs, "--device=1 --graphics --video --utility")

    result = run_container(runc, tmp_path, debian_rootfs, hook, SCRIPT)
    out = _sections(result.stdout)
    assert "dri" in out, result.stdout + result.stderr

    resolved = dict(line.split("=", 1) for line in out["resolved"].splitlines())
    for path in MANIFESTS:
        doc = json.loads(out[path])
        entry = doc.get("ICD") or doc["layer"]
        name = entry["library_path"]
        assert name in resolved, (path, name, sorted(resolved))  # the container's ld cache finds it
        assert resolved[name] == f"{MULTIARCH}/{name}"
    assert out["vdpau"].splitlines() == [f"libvdpau_nvidia.so.{version}", "regular"]
    assert out["gbm"] == "regular"
    # GPU 1's card and render node only: not GPU 0's (card1, renderD128), not the BMC's card0
    assert out["dri"].splitlines() == ["card2", "renderD129", "/dev/dri/card2 open", "/dev/dri/renderD129 open"]
