"""The fake driver's files besides its libraries: device nodes, firmware, the persistenced IPC
directory, and a separate ``proc`` tree shaped like ``/proc/driver/nvidia``. Test double only.
"""

from __future__ import annotations

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
    for channel in range(machine["imex_channels"]):
        _mknod(dev / f"nvidia-caps-imex-channels/channel{channel}", 0o666, IMEX_MAJOR, channel)


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
