"""Every file a capability needs where its loader looks (#54), on the fake driver: NVIDIA's .run
layout and Debian's packaged one (nvidia/current behind /etc/alternatives, libvdpau_nvidia only
under vdpau/, loader json files under /usr/share and /etc, a persistenced and an alternative of
another driver version), the selected GPUs' DRM nodes found through a fake sysfs, and the bad
input around them. A test double throughout: no result here is a GPU result."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nvc.discover import driver, drm
from nvc.errors import DetectionError

DEBIAN = "535.261.03"
STRAY = "535.171.04"
MULTIARCH = "/usr/lib/x86_64-linux-gnu"
# Where each loader finds its file in the container, and the library it names.
MANIFESTS = {
    "/usr/share/vulkan/icd.d/nvidia_icd.json": "libGLX_nvidia.so.0",
    "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json": "libGLX_nvidia.so.0",
    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json": "libEGL_nvidia.so.0",
    "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json": "libnvidia-egl-wayland.so.1",
    "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json": "libnvidia-egl-gbm.so.1",
}


def nvc(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed CLI in a child (it inherits the active fake's mount namespace)."""
    return subprocess.run([sys.executable, "-m", "nvc", *args], capture_output=True, text=True, timeout=120)


def _discover(root: Path, version: str = DEBIAN) -> driver.DriverFiles:
    return driver.discover(str(root), version, machine="x86_64", kernel_release="6.1.0", firmware_class_path="")


def _copy(fake, tmp_path: Path) -> Path:
    """A copy of the fake's driver root (links kept) to break."""
    root = tmp_path / "root"
    shutil.copytree(fake.root, root, symlinks=True, ignore=shutil.ignore_patterns("dev"))
    return root


def _relink(link: Path, target: str) -> None:
    link.unlink()
    link.symlink_to(target)


# --- nvc-py list: Debian's layout beside the .run one ----------------------------------------------


def test_list_finds_debian_files_and_names_what_it_leaves_out(active_debian) -> None:
    root = str(active_debian.root)
    done = nvc("--root", root, "list", "--json")
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout.replace(root, ""))
    current = f"{MULTIARCH}/nvidia/current"
    assert f"{current}/libcuda.so.{DEBIAN}" in listing["libraries"]
    assert f"{MULTIARCH}/libnvidia-glcore.so.{DEBIAN}" in listing["libraries"]
    # libvdpau_nvidia is in no ld cache: found through vdpau/'s alternative, once
    assert [p for p in listing["libraries"] + listing["loader_files"] if "vdpau" in p] == [
        f"{current}/libvdpau_nvidia.so.{DEBIAN}"
    ]
    assert listing["loader_files"] == [
        "/usr/share/nvidia/current/nvidia_icd.json",  # /etc/vulkan/icd.d's, through its alternative
        "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
        "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
        f"{current}/libnvidia-allocator.so.{DEBIAN}",  # gbm/nvidia-drm_gbm.so
        "/usr/share/nvidia/nvoptix.bin",
        f"{current}/libvdpau_nvidia.so.{DEBIAN}",
        "/etc/OpenCL/vendors/nvidia.icd",
        "/usr/lib/nvidia/current/nvidia_drv.so",
        f"/usr/lib/nvidia/current/libglxserver_nvidia.so.{DEBIAN}",
        "/etc/nvidia/current/nvidia-drm-outputclass.conf",
    ]
    # Debian's persistenced of another version and libnvidia-cfg's stray alternative: left out, named
    assert not [p for p in listing["binaries"] + listing["libraries"] if "persistenced" in p or "nvidia-cfg" in p]
    assert f"left out {root}/usr/bin/nvidia-persistenced: of driver {STRAY}, not {DEBIAN}" in done.stderr
    assert f"legacy-{STRAY}/libnvidia-cfg.so.{STRAY}: not driver {DEBIAN}" in done.stderr


def test_run_layout_keeps_vdpau_under_vdpau(active_2gpu) -> None:
    root = str(active_2gpu.root)
    version = active_2gpu.driver_version
    listing = json.loads(nvc("--root", root, "list", "--json").stdout.replace(root, ""))
    assert not [p for p in listing["libraries"] if "vdpau" in p]
    assert f"{MULTIARCH}/vdpau/libvdpau_nvidia.so.{version}" in listing["loader_files"]
    assert "/usr/share/vulkan/icd.d/nvidia_icd.json" in listing["loader_files"]


def test_a_self_contained_tree_keeps_vdpau_beside_the_libraries(active_local_nvidia) -> None:
    """/usr/local/nvidia/lib64 (the H100 machine's driver) has libvdpau_nvidia.so.1 beside the other
    libraries: it still goes where libvdpau looks, vdpau/."""
    root = str(active_local_nvidia.root)
    version = active_local_nvidia.driver_version
    assert (active_local_nvidia.root / f"usr/local/nvidia/lib64/libvdpau_nvidia.so.{version}").is_file()
    listing = json.loads(nvc("--root", root, "list", "--json").stdout.replace(root, ""))
    assert not [p for p in listing["libraries"] if "vdpau" in p]
    assert f"/usr/local/nvidia/lib64/libvdpau_nvidia.so.{version}" in listing["loader_files"]
    vdpau = [f for f in _discover(active_local_nvidia.root, version).loader_files if "vdpau" in f.source]
    assert [(f.target, f.link) for f in vdpau] == [
        ("{libdir}/vdpau/libvdpau_nvidia.so." + version, "libvdpau_nvidia.so.1")
    ]


# --- version checks and bad input -------------------------------------------------------------------


def test_alternatives_of_another_version_are_an_error_naming_them(fake_debian, tmp_path: Path) -> None:
    root = _copy(fake_debian, tmp_path)
    legacy = root / MULTIARCH.lstrip("/") / f"nvidia/legacy-{STRAY}"
    for alternative in (root / "etc/alternatives").glob("nvidia--*-x86_64-linux-gnu"):
        current = root / alternative.readlink().as_posix().lstrip("/")
        soname = current.name
        if not (legacy / soname).exists():
            real = current.resolve()
            shutil.copy2(real, legacy / real.name.replace(DEBIAN, STRAY))
            (legacy / soname).symlink_to(real.name.replace(DEBIAN, STRAY))
        _relink(alternative, f"{MULTIARCH}/nvidia/legacy-{STRAY}/{soname}")
    with pytest.raises(DetectionError) as err:
        _discover(root)
    message = str(err.value)
    assert message.startswith(
        f"detection error: no library of driver {DEBIAN} under {root} (x86_64): the ld cache's NVIDIA libraries (through "
        "/etc/alternatives) lead to another version: "
    )
    assert f" of version {STRAY}, such as {MULTIARCH}/" in message
    assert f" -> {MULTIARCH}/nvidia/legacy-{STRAY}/lib" in message


def test_broken_and_looping_alternatives(fake_debian, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = _copy(fake_debian, tmp_path)
    alternatives = root / "etc/alternatives"
    _relink(alternatives / "nvidia--libnvidia-encode.so.1-x86_64-linux-gnu", f"{MULTIARCH}/nvidia/gone/x.so.1")
    with caplog.at_level(logging.WARNING):
        files = _discover(root)
    assert not [p for p in files.libraries if "libnvidia-encode" in p]
    assert f"left out libnvidia-encode.so (x86_64): {MULTIARCH}/libnvidia-encode.so.1: a dangling link" in caplog.text
    _relink(alternatives / "nvidia--libnvidia-encode.so.1-x86_64-linux-gnu", "/etc/alternatives/loop")
    (alternatives / "loop").symlink_to("/etc/alternatives/nvidia--libnvidia-encode.so.1-x86_64-linux-gnu")
    with pytest.raises(DetectionError, match="libnvidia-encode.so.1: Too many levels of symbolic links"):
        _discover(root)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ('{"ICD": {"library_path": "/usr/lib/x86_64-linux-gnu/libEGL_nvidia.so.0"}}', "is a path, not a library"),
        ('{"ICD": {"library_path": "../../../../etc/shadow"}}', "is a path, not a library"),
        ('{"ICD": {"library_path": "libEGL_mesa.so.0"}}', "is none of the driver's libraries found"),
        ('{"ICD": {}}', "unreadable: no library_path"),
        ('[{"ICD": {"library_path": "libEGL_nvidia.so.0"}}]', "unreadable: not a json object"),
        ("{", "unreadable: "),
    ],
)
def test_a_manifest_naming_no_driver_library_is_left_out(
    fake_debian, tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str, why: str
) -> None:
    root = _copy(fake_debian, tmp_path)
    vendor = root / "usr/share/glvnd/egl_vendor.d/10_nvidia.json"
    vendor.write_text(content)
    with caplog.at_level(logging.WARNING):
        files = _discover(root)
    assert str(vendor) not in [f.source for f in files.loader_files]
    assert f"left out {vendor} ({vendor}): " in caplog.text and why in caplog.text
    assert f"{root}/usr/share/vulkan/implicit_layer.d/nvidia_layers.json" in [f.source for f in files.loader_files]


def test_loader_files_of_another_version_are_left_out(fake_debian, tmp_path: Path, caplog) -> None:
    root = _copy(fake_debian, tmp_path)
    x_driver = root / "usr/lib/nvidia/current/nvidia_drv.so"
    x_driver.write_bytes(x_driver.read_bytes().replace(DEBIAN.encode(), STRAY.encode()))
    with caplog.at_level(logging.WARNING):
        files = _discover(root)
    assert not [f for f in files.loader_files if f.target.endswith("nvidia_drv.so")]
    assert (
        f"left out {root}/usr/lib/xorg/modules/drivers/nvidia_drv.so ({x_driver}): of driver {STRAY}, not {DEBIAN}"
        in (caplog.text)
    )


# --- DRM nodes through sysfs ----------------------------------------------------------------------


def test_drm_nodes_by_bus_id(fake_debian, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sysfs = fake_debian.sys
    assert drm.gpu_nodes("00000000:65:00.0", sysfs) == (
        ("/dev/dri/card2", 226, 2, 0o666),
        ("/dev/dri/renderD129", 226, 129, 0o666),
    )
    with caplog.at_level(logging.DEBUG):
        assert drm.gpu_nodes("00000000:99:00.0", sysfs) == ()
    assert "no DRM devices (nvidia-drm not loaded?)" in caplog.text
    broken = tmp_path / "devices"
    shutil.copytree(sysfs, broken)
    shutil.rmtree(broken / "0000:17:00.0/drm/renderD128")
    (broken / "0000:17:00.0/drm/renderD128/dev").mkdir(parents=True)  # unreadable as a file
    (broken / "0000:65:00.0/drm/card2/dev").write_text("garbage\n")
    with caplog.at_level(logging.WARNING):
        assert drm.gpu_nodes("00000000:17:00.0", broken) == (("/dev/dri/card1", 226, 1, 0o666),)
        assert drm.gpu_nodes("00000000:65:00.0", broken) == (("/dev/dri/renderD129", 226, 129, 0o666),)
    assert f"left out the DRM node of {broken}/0000:17:00.0/drm/renderD128/dev: Is a directory" in caplog.text
    assert f"left out the DRM node of {broken}/0000:65:00.0/drm/card2/dev: 'garbage' is no major:minor" in caplog.text


def _dry_run(fake, rootfs: Path, *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "nvc", "--root", str(fake.root), "configure", "--dry-run", *args, str(rootfs)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.replace(str(fake.root), "<root>").splitlines()


def test_graphics_plan_gets_only_the_selected_gpus_drm_nodes(active_debian, debian_rootfs: Path) -> None:
    lines = _dry_run(active_debian, debian_rootfs, "--device=1", "--graphics", "--video", "--utility")
    dri = [line for line in lines if "/dev/dri/" in line]
    assert dri == [
        "bind    device    <root>/dev/dri/card2 -> /dev/dri/card2 [c 226:2, nosuid,noexec]",
        "bind    device    <root>/dev/dri/renderD129 -> /dev/dri/renderD129 [c 226:129, nosuid,noexec]",
    ]
    loaders = [line.split(" -> ")[1].split(" [")[0] for line in lines if line.startswith("bind    loader")]
    assert loaders == [
        *MANIFESTS,
        f"{MULTIARCH}/gbm/nvidia-drm_gbm.so",
        "/usr/share/nvidia/nvoptix.bin",
        f"{MULTIARCH}/vdpau/libvdpau_nvidia.so.{DEBIAN}",
        "/etc/OpenCL/vendors/nvidia.icd",  # video brings compute's
    ]
    assert f"symlink library   {MULTIARCH}/vdpau/libvdpau_nvidia.so.1 -> libvdpau_nvidia.so.{DEBIAN}" in lines


def test_display_adds_the_x_driver_and_compute_only_opencl(active_debian, debian_rootfs: Path) -> None:
    display = _dry_run(active_debian, debian_rootfs, "--device=0", "--display")
    targets = [line.split(" -> ")[1].split(" [")[0] for line in display if line.startswith("bind    loader")]
    assert targets[-3:] == [
        "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
        f"/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{DEBIAN}",
        "/usr/share/X11/xorg.conf.d/nvidia-drm-outputclass.conf",  # Debian's, from /etc/nvidia/current
    ]
    assert "bind    device    <root>/dev/nvidia-modeset -> /dev/nvidia-modeset [c 195:254, nosuid,noexec]" in display
    compute = _dry_run(active_debian, debian_rootfs, "--device=0", "--compute")
    assert [line for line in compute if line.startswith("bind    loader")] == [
        "bind    loader    <root>/etc/OpenCL/vendors/nvidia.icd -> /etc/OpenCL/vendors/nvidia.icd [rdonly,nosuid,nodev]"
    ]
    assert not [line for line in compute if "/dev/dri" in line]


def test_all_on_a_host_without_drm_or_modeset(active_local_nvidia, lib64_rootfs: Path) -> None:
    """As the H100 machine: no nvidia-drm (no /dev/dri, no sysfs drm/), here also no nvidia-modeset."""
    modeset = active_local_nvidia.root / "dev/nvidia-modeset"
    aside = modeset.with_name(".nvidia-modeset.aside")
    modeset.rename(aside)
    try:
        lines = _dry_run(
            active_local_nvidia,
            lib64_rootfs,
            "--device=0",
            *(f"--{c}" for c in ("graphics", "display", "video", "compute", "utility", "ngx")),
        )
    finally:
        aside.rename(modeset)
    assert not [line for line in lines if "/dev/dri" in line or "nvidia-modeset" in line]
    icd = "/usr/share/vulkan/icd.d/nvidia_icd.json"
    assert f"bind    loader    <root>{icd} -> {icd} [rdonly,nosuid,nodev]" in lines


# --- CDI --------------------------------------------------------------------------------------------


def test_cdi_spec_lists_the_same_files_and_nodes(active_debian, tmp_path: Path) -> None:
    root = str(active_debian.root)
    out = tmp_path / "nvidia.json"
    done = nvc("--root", root, "cdi", "generate", "--format", "json", "--output", str(out))
    assert done.returncode == 0, done.stderr
    spec = json.loads(out.read_text())
    nodes = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]}
    assert nodes["0"] == ["/dev/nvidia0", "/dev/dri/card1", "/dev/dri/renderD128"]
    assert nodes["1"] == ["/dev/nvidia1", "/dev/dri/card2", "/dev/dri/renderD129"]
    assert "/dev/dri/card0" not in nodes["all"]  # the BMC's card
    mounts = {m["containerPath"]: m["hostPath"].replace(root, "") for m in spec["containerEdits"]["mounts"]}
    for path in MANIFESTS:
        assert path in mounts, path
    assert (
        mounts[f"{MULTIARCH}/vdpau/libvdpau_nvidia.so.{DEBIAN}"]
        == f"{MULTIARCH}/nvidia/current/libvdpau_nvidia.so.{DEBIAN}"
    )
    assert mounts["/etc/OpenCL/vendors/nvidia.icd"] == "/etc/OpenCL/vendors/nvidia.icd"
    links = [a for h in spec["containerEdits"]["hooks"] if "create-symlinks" in h["args"] for a in h["args"]]
    assert f"libvdpau_nvidia.so.{DEBIAN}::{MULTIARCH}/vdpau/libvdpau_nvidia.so.1" in links


def test_runtime_wrapper_nodes_add_the_drm_nodes(active_debian) -> None:
    """The runtime wrapper's device nodes (put in the OCI spec, so they outlive a systemd reload)."""
    from nvc.config.options import GlobalOptions
    from nvc.pipeline.configure import device_nodes
    from nvc.plan import selection
    from nvc.plan.request import Request

    glob = GlobalOptions(str(active_debian.root), "/etc/ld.so.cache", (0, 0), False)
    gpu1 = selection.parse("1")
    graphics = [s.path for s in device_nodes(glob, Request(selectors=gpu1, capabilities=frozenset({"graphics"})))]
    assert [p for p in graphics if p.startswith("/dev/dri/")] == ["/dev/dri/card2", "/dev/dri/renderD129"]
    compute = [s.path for s in device_nodes(glob, Request(selectors=gpu1, capabilities=frozenset({"compute"})))]
    assert not [p for p in compute if p.startswith("/dev/dri/")]
