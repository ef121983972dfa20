"""A graphics,video container on the real driver (``make test-gpu``, #54): it sees the Vulkan ICD
and the EGL vendor file where their loaders look, each naming a library its ld cache resolves, and
libvdpau_nvidia under vdpau/; its DRM nodes where the host has nvidia-drm (the H100 machine has
none). The container output is printed (``pytest -rP`` shows it) so it can be quoted."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import loaderprobe
from harness.bundle import make_bundle
from harness.gpufixtures import gpu0_uuid, hook_with_log, runtime  # noqa: F401  (fixtures)
from harness.runtime import Runc

pytestmark = pytest.mark.gpu

MANIFESTS = (loaderprobe.VULKAN_ICD, loaderprobe.EGL_VENDOR)


def test_graphics_video_container_sees_the_loader_files(
    runtime: Runc,
    make_rootfs,
    gpu0_uuid: str,
    tmp_path: Path,  # noqa: F811
) -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "graphics,video"}
    script = loaderprobe.script(MANIFESTS)
    bundle = make_bundle(
        tmp_path / "bundle", make_rootfs(), ["sh", "-c", script], env=env, hooks=hook_with_log(tmp_path)
    )

    result = runtime.create_start(bundle)

    print(f"--- {Path(runtime.binary).name}, NVIDIA_DRIVER_CAPABILITIES=graphics,video:")
    print(result.stdout + result.stderr)
    assert result.returncode == 0, result.stderr
    out = loaderprobe.sections(result.stdout)
    assert loaderprobe.unresolved(out, MANIFESTS) == []
    assert out["vdpau"].splitlines()[1:] == ["regular"]
    assert out["vdpau"].startswith("libvdpau_nvidia.so.")
