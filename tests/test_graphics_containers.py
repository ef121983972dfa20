"""A graphics and video container on the fake driver (Debian's packaged layout), started by runc with
``nvc-py configure`` as its prestart hook (#54): each loader's json file at the path its loader
reads, naming a library the container's ld cache resolves to a file there; libvdpau_nvidia under
vdpau/ where libvdpau looks; the GBM backend; and only the selected GPU's DRM nodes, which its
device cgroup lets it open. A test double throughout: no result here is a GPU result."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import loaderprobe
from harness.configurehook import hook as configure_hook
from harness.configurehook import run as run_container

MANIFESTS = (
    loaderprobe.VULKAN_ICD,
    "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
    loaderprobe.EGL_VENDOR,
    "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
    "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
)


@pytest.mark.parametrize("readonly", [False, True], ids=["rw-root", "readonly-root"])
def test_graphics_container_sees_each_loader_file_and_its_gpus_drm_nodes(
    active_debian, debian_rootfs: Path, runc, tmp_path: Path, readonly: bool
) -> None:
    """runc (crun refuses this host's hybrid cgroups), with a writable and a read-only root."""
    fake = active_debian
    hook = configure_hook(tmp_path, fake, debian_rootfs, "--device=1 --graphics --video --utility")
    script = loaderprobe.script(MANIFESTS, ("/dev/dri/card2", "/dev/dri/renderD129"))

    result = run_container(runc, tmp_path, debian_rootfs, hook, script, readonly=readonly)

    out = loaderprobe.sections(result.stdout)
    assert "dri" in out, result.stdout + result.stderr
    assert loaderprobe.unresolved(out, MANIFESTS) == []  # each one's library: in the container's ld cache
    assert out["vdpau"].splitlines() == [f"libvdpau_nvidia.so.{fake.driver_version}", "regular"]
    assert out["gbm"] == "regular"
    # GPU 1's card and render node only: not GPU 0's (card1, renderD128), not the BMC's card0
    assert out["dri"].splitlines() == ["card2", "renderD129", "/dev/dri/card2 open", "/dev/dri/renderD129 open"]
