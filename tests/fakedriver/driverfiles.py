"""The fake driver's files besides its libraries: device nodes (DRM's too), firmware, the
persistenced IPC directory, the files loaders read from fixed places (ICD json files, the X
driver), a separate ``proc`` tree shaped like ``/proc/driver/nvidia`` and a ``sys`` one shaped
like ``/sys/bus/pci/devices``. Test double only.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

NVIDIA_MAJOR = 195
UVM_MAJOR = 238
CAPS_MAJOR = 241
IMEX_MAJOR = 242
MIG_MINORS_PER_GPU = 135  # 15 GPU instances x (1 access + 8 compute instances)
MIG_MINORS_PER_GI = 9
MIG_MINORS_GPUS = 32  # a real driver's mig-minors lists 32 GPUs, whatever the machine has
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
DRM_MAJOR = 226
BMC_BUS_ID = "0000:00:01.0"  # a server's BMC VGA: DRM's card0, no NVIDIA GPU


def _mig_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """Minor of a MIG access capability, as /proc/driver/nvidia-caps/mig-minors numbers them."""
    base = 3 + gpu_minor * MIG_MINORS_PER_GPU + gi * MIG_MINORS_PER_GI
    return base if ci is None else base + 1 + ci


def _mknod(path: Path, mode: int, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)  # mknod applies the umask


def make_devices(machine: dict[str, Any], dev: Path) -> None:
    _mknod(dev / "nvidiactl", 0o666, NVIDIA_MAJOR, 255)
    _mknod(dev / "nvidia-modeset", 0o666, NVIDIA_MAJOR, 254)
    _mknod(dev / "nvidia-uvm", 0o666, UVM_MAJOR, 0)
    _mknod(dev / "nvidia-uvm-tools", 0o666, UVM_MAJOR, 1)
    _mknod(dev / "nvidia-caps/nvidia-cap1", 0o400, CAPS_MAJOR, 1)  # mig config
    _mknod(dev / "nvidia-caps/nvidia-cap2", 0o444, CAPS_MAJOR, 2)  # mig monitor
    for gpu in machine["gpus"]:
        _mknod(dev / f"nvidia{gpu['minor']}", 0o666, NVIDIA_MAJOR, gpu["minor"])
        for mig in gpu["mig"]["devices"] if gpu["mig"] else []:
            gi, ci = mig["gpu_instance_id"], mig["compute_instance_id"]
            for minor in (_mig_minor(gpu["minor"], gi), _mig_minor(gpu["minor"], gi, ci)):
                node = dev / f"nvidia-caps/nvidia-cap{minor}"
                if not node.exists():  # MIG devices of one GPU instance share its access node
                    _mknod(node, 0o444, CAPS_MAJOR, minor)
    for nodes in drm_nodes(machine).values():
        for name, minor in nodes:
            _mknod(dev / "dri" / name, 0o666, DRM_MAJOR, minor)
    for channel in range(machine["imex_channels"]):
        _mknod(dev / f"nvidia-caps-imex-channels/channel{channel}", 0o666, IMEX_MAJOR, channel)


def drm_nodes(machine: dict[str, Any]) -> dict[str, list[tuple[str, int]]]:
    """sysfs PCI device name -> its DRM nodes (name, minor): the BMC's card0, then each GPU's
    card<index + 1> and renderD<128 + index>; none without ``drm``."""
    if not machine["drm"]:
        return {}
    nodes = {BMC_BUS_ID: [("card0", 0)]}
    for gpu in machine["gpus"]:
        i = gpu["index"]
        nodes[_proc_bus_id(gpu["pci_bus_id"])] = [(f"card{i + 1}", i + 1), (f"renderD{128 + i}", 128 + i)]
    return nodes


def make_sys(machine: dict[str, Any], devices: Path) -> None:
    """``/sys/bus/pci/devices/<busid>/drm/<node>/dev`` for every DRM node."""
    devices.mkdir(parents=True)
    for gpu in machine["gpus"]:
        (devices / _proc_bus_id(gpu["pci_bus_id"])).mkdir(exist_ok=True)
    for bus_id, nodes in drm_nodes(machine).items():
        for name, minor in nodes:
            node = devices / bus_id / "drm" / name
            node.mkdir(parents=True)
            (node / "dev").write_text(f"{DRM_MAJOR}:{minor}\n")


def _manifest(path: Path, library: str, key: str = "ICD", **extra: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"file_format_version": "1.0.0", key: {"library_path": library, **extra}}, indent=4))


def make_loader_files(root: Path, version: str, packaged: bool) -> None:
    """The files loaders read from fixed places, where the .run installer puts them or, ``packaged``,
    where Debian's packages do (some behind /etc/alternatives links, X's under /usr/lib/nvidia/current)."""
    share = root / "usr/share"
    icd = (share / "nvidia/current" if packaged else share / "vulkan/icd.d") / "nvidia_icd.json"
    _manifest(icd, "libGLX_nvidia.so.0", api_version="1.3.242")
    if packaged:
        (root / "etc/vulkan/icd.d").mkdir(parents=True)
        (root / "etc/vulkan/icd.d/nvidia_icd.json").symlink_to("/etc/alternatives/nvidia--nvidia_icd.json")
        (root / "etc/alternatives/nvidia--nvidia_icd.json").symlink_to("/usr/share/nvidia/current/nvidia_icd.json")
    _manifest(
        share / "vulkan/implicit_layer.d/nvidia_layers.json",
        "libGLX_nvidia.so.0",
        key="layer",
        name="VK_LAYER_NV_optimus",
        type="INSTANCE",
    )
    _manifest(share / "glvnd/egl_vendor.d/10_nvidia.json", "libEGL_nvidia.so.0")
    _manifest(share / "egl/egl_external_platform.d/10_nvidia_wayland.json", "libnvidia-egl-wayland.so.1")
    _manifest(share / "egl/egl_external_platform.d/15_nvidia_gbm.json", "libnvidia-egl-gbm.so.1")
    (root / "etc/OpenCL/vendors").mkdir(parents=True)
    (root / "etc/OpenCL/vendors/nvidia.icd").write_text("libnvidia-opencl.so.1\n")
    (share / "nvidia").mkdir(parents=True, exist_ok=True)
    (share / "nvidia/nvoptix.bin").write_bytes(b"fake OptiX denoiser weights\n")
    xorg = root / "usr/lib/xorg/modules"
    x_dir = root / "usr/lib/nvidia/current" if packaged else xorg
    drivers, extensions = (x_dir, x_dir) if packaged else (xorg / "drivers", xorg / "extensions")
    for d in (drivers, extensions, xorg / "drivers", xorg / "extensions"):
        d.mkdir(parents=True, exist_ok=True)
    (drivers / "nvidia_drv.so").write_bytes(f"fake X driver nvidia_drv.so {version}\n".encode())
    (extensions / f"libglxserver_nvidia.so.{version}").write_bytes(f"fake GLX module {version}\n".encode())
    (extensions / "libglxserver_nvidia.so").symlink_to(f"libglxserver_nvidia.so.{version}")
    outputclass = 'Section "OutputClass"\n    MatchDriver "nvidia-drm"\n    Driver "nvidia"\nEndSection\n'
    conf = root / ("etc/nvidia/current" if packaged else "usr/share/X11/xorg.conf.d")
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "nvidia-drm-outputclass.conf").write_text(outputclass)
    if packaged:
        for name in ("nvidia_drv.so", "libglxserver_nvidia.so"):
            where = "drivers" if name == "nvidia_drv.so" else "extensions"
            (xorg / where / name).symlink_to(f"/etc/alternatives/nvidia--{name}")
            (root / "etc/alternatives" / f"nvidia--{name}").symlink_to(f"/usr/lib/nvidia/current/{name}")


def make_files(root: Path, version: str) -> None:
    firmware = root / "lib/firmware/nvidia" / version
    firmware.mkdir(parents=True)
    for name in FIRMWARE:
        (firmware / name).write_bytes(f"fake GSP firmware {name} {version}\n".encode())
    (root / "var/run/nvidia-persistenced").mkdir(parents=True)


# --- the /proc stand-in -------------------------------------------------------------------------


def _proc_bus_id(pci_bus_id: str) -> str:
    """/proc/driver/nvidia/gpus/ names GPUs by a lowercase bus id with a 4-digit domain."""
    domain, bus, rest = pci_bus_id.split(":")
    return f"{int(domain, 16):04x}:{bus.lower()}:{rest.lower()}"


def _params() -> str:
    values = [
        ("ResmanDebugLevel", "4294967295"),
        ("RmLogonRC", "1"),
        ("ModifyDeviceFiles", "1"),
        ("DeviceFileUID", "0"),
        ("DeviceFileGID", "0"),
        ("DeviceFileMode", "438"),
        ("InitializeSystemMemoryAllocations", "1"),
        ("UsePageAttributeTable", "4294967295"),
        ("EnableMSI", "1"),
        ("EnablePCIeGen3", "0"),
        ("MemoryPoolSize", "0"),
        ("KMallocHeapMaxSize", "0"),
        ("VMallocHeapMaxSize", "0"),
        ("IgnoreMMIOCheck", "0"),
        ("EnableStreamMemOPs", "0"),
        ("EnableUserNUMAManagement", "1"),
        ("NvLinkDisable", "0"),
        ("RmProfilingAdminOnly", "1"),
        ("PreserveVideoMemoryAllocations", "0"),
        ("EnableS0ixPowerManagement", "0"),
        ("S0ixPowerManagementVideoMemoryThreshold", "256"),
        ("DynamicPowerManagement", "3"),
        ("DynamicPowerManagementVideoMemoryThreshold", "200"),
        ("RegisterPCIDriver", "1"),
        ("EnablePCIERelaxedOrderingMode", "0"),
        ("EnableResizableBar", "0"),
        ("EnableGpuFirmware", "18"),
        ("EnableGpuFirmwareLogs", "2"),
        ("RmNvlinkBandwidthLinkCount", "0"),
        ("EnableDbgBreakpoint", "0"),
        ("OpenRmEnableUnsupportedGpus", "1"),
        ("DmaRemapPeerMmio", "1"),
        ("ImexChannelCount", "2048"),
        ("CreateImexChannel0", "0"),
        ("GrdmaPciTopoCheckOverride", "0"),
        ("CoherentGPUMemoryMode", '""'),
        ("RegistryDwords", '""'),
        ("RegistryDwordsPerDevice", '""'),
        ("RmMsg", '""'),
        ("GpuBlacklist", '""'),
        ("TemporaryFilePath", '""'),
        ("ExcludedGpus", '""'),
    ]
    return "".join(f"{key}: {value}\n" for key, value in values)


def _gpu_information(gpu: dict[str, Any], version: str) -> str:
    return (
        f"Model: \t\t {gpu['name']}\n"
        f"IRQ:   \t\t {130 + gpu['minor']}\n"
        f"GPU UUID: \t {gpu['uuid']}\n"
        "Video BIOS: \t 96.00.99.00.01\n"
        "Bus Type: \t PCIe\n"
        "DMA Size: \t 52 bits\n"
        "DMA Mask: \t 0xfffffffffffff\n"
        f"Bus Location: \t {_proc_bus_id(gpu['pci_bus_id'])}\n"
        f"Device Minor: \t {gpu['minor']}\n"
        f"GPU Firmware: \t {version}\n"
        "GPU Excluded:\t No\n"
    )


def _access_file(minor: int, mode: int) -> str:
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


def _mig_minors() -> str:
    lines = ["config 1", "monitor 2"]
    for n in range(MIG_MINORS_GPUS):
        for gi in range(15):
            lines.append(f"gpu{n}/gi{gi}/access {_mig_minor(n, gi)}")
            lines.extend(f"gpu{n}/gi{gi}/ci{ci}/access {_mig_minor(n, gi, ci)}" for ci in range(8))
    return "\n".join(lines) + "\n"


def _proc_devices(host: str) -> str:
    """The host's /proc/devices with the NVIDIA character majors added (in major order)."""
    ours = [
        (NVIDIA_MAJOR, "nvidia"),
        (NVIDIA_MAJOR, "nvidiactl"),
        (UVM_MAJOR, "nvidia-uvm"),
        (CAPS_MAJOR, "nvidia-caps"),
        (IMEX_MAJOR, "nvidia-caps-imex-channels"),
    ]
    sections = host.split("\n\n")
    char_lines = sections[0].splitlines()
    entries = [(int(line.split()[0]), line.split(None, 1)[1]) for line in char_lines[1:] if line.strip()]
    names = {name for _, name in ours}
    entries = sorted([e for e in entries if e[1] not in names] + ours, key=lambda e: e[0])
    sections[0] = "\n".join([char_lines[0]] + [f"{major:3d} {name}" for major, name in entries])
    return "\n\n".join(sections)


def make_proc(machine: dict[str, Any], proc: Path) -> None:
    version = machine["driver_version"]
    nvidia = proc / "driver/nvidia"
    nvidia.mkdir(parents=True)
    (nvidia / "version").write_text(
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
        "(dvs-builder@U22-I3-AE18-09-3)  Wed Sep 24 23:42:50 UTC 2025\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n"
    )
    (nvidia / "params").write_text(_params())
    (nvidia / "registry").write_text('Binary: ""\n')
    caps = nvidia / "capabilities"
    (caps / "mig").mkdir(parents=True)
    (caps / "mig/config").write_text(_access_file(1, 256))
    (caps / "mig/monitor").write_text(_access_file(2, 292))
    for gpu in machine["gpus"]:
        gpu_dir = nvidia / "gpus" / _proc_bus_id(gpu["pci_bus_id"])
        gpu_dir.mkdir(parents=True)
        (gpu_dir / "information").write_text(_gpu_information(gpu, version))
        for mig in gpu["mig"]["devices"] if gpu["mig"] else []:
            gi, ci = mig["gpu_instance_id"], mig["compute_instance_id"]
            gi_dir = caps / f"gpu{gpu['minor']}/mig/gi{gi}"
            (gi_dir / f"ci{ci}").mkdir(parents=True, exist_ok=True)
            (gi_dir / "access").write_text(_access_file(_mig_minor(gpu["minor"], gi), 292))
            (gi_dir / f"ci{ci}/access").write_text(_access_file(_mig_minor(gpu["minor"], gi, ci), 292))
    (proc / "driver/nvidia-caps").mkdir(parents=True)
    (proc / "driver/nvidia-caps/mig-minors").write_text(_mig_minors())
    (proc / "devices").write_text(_proc_devices(Path("/proc/devices").read_text()))
