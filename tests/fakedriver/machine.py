"""The fake driver's machine description: a machine YAML (see ``machines/``) read and validated, and
written out as C (fake_machine.h) for the fake libraries to compile in.

The YAML names the driver version, the library layout and the GPUs with their MIG devices; a mistake
is reported with the file and the key. Test double only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MACHINES_DIR = Path(__file__).resolve().parent / "machines"
MAX_MIG_DEVICES = 7  # per GPU, as on A100/H100
MAX_IMEX_CHANNELS = 256  # the driver allows 2^20; a fake needs a few nodes, not a million

BRANDS = {
    "Unknown": 0,
    "Quadro": 1,
    "Tesla": 2,
    "NVS": 3,
    "GRID": 4,
    "GeForce": 5,
    "TITAN": 6,
    "VApps": 7,
    "VPC": 8,
    "VCS": 9,
    "VWS": 10,
    "CloudGaming": 11,
    "QuadroRTX": 12,
    "NvidiaRTX": 13,
    "Nvidia": 14,
    "GeForceRTX": 15,
    "TitanRTX": 16,
}


@dataclass(frozen=True)
class Layout:
    """Where a driver installation keeps its files, relative to the driver root."""

    lib: str
    lib32: str
    bin: str
    ld_conf: dict[str, tuple[str, ...]]  # ld.so.conf.d file name -> directories
    # Debian's packages: the files in <lib>/nvidia/current, reached through /etc/alternatives links
    packaged: bool = False
    # the VDPAU driver in <lib>/vdpau/ (the .run installer, Debian); a self-contained tree keeps it in <lib>
    vdpau_apart: bool = True


_MULTIARCH_CONF = {
    "x86_64-linux-gnu.conf": ("/usr/local/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"),
    "i386-linux-gnu.conf": ("/usr/local/lib/i386-linux-gnu", "/lib/i386-linux-gnu", "/usr/lib/i386-linux-gnu"),
}

LAYOUTS = {
    # NVIDIA's .run installer on a Debian/Ubuntu system: multiarch dirs, listed in ld.so.conf.d as
    # Debian's libc6 does.
    "distro": Layout("usr/lib/x86_64-linux-gnu", "usr/lib/i386-linux-gnu", "usr/bin", _MULTIARCH_CONF),
    # Debian's own packages (non-free): the same dirs, the files behind nvidia/current and alternatives.
    "debian": Layout("usr/lib/x86_64-linux-gnu", "usr/lib/i386-linux-gnu", "usr/bin", _MULTIARCH_CONF, True),
    # GPU cloud images: everything under /usr/local/nvidia, found only through nvidia.conf.
    "nvidia": Layout(
        "usr/local/nvidia/lib64",
        "usr/local/nvidia/lib",
        "usr/local/nvidia/bin",
        {"nvidia.conf": ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib")},
        vdpau_apart=False,  # as on the H100 machine
    ),
}


class MachineError(ValueError):
    """The machine YAML is not a valid description; the message names the file and the key."""


_SIZE = re.compile(r"(\d+)\s*(Ki|Mi|Gi|Ti)?")
_UNITS = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
_UUID_BODY = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_BUS_ID = re.compile(r"([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.0")
_PROFILE = re.compile(r"(?:([1-7])c\.)?([1-7])g\.(\d+)gb")
_CC = re.compile(r"(\d+)\.(\d)")
_DRIVER_VERSION = re.compile(r"\d+\.\d+(\.\d+)?")


class _Checker:
    """Reads one YAML file, raising MachineError with '<file>: <key path>: <problem>'."""

    def __init__(self, name: str) -> None:
        self.name = name

    def fail(self, where: str, problem: str) -> MachineError:
        return MachineError(f"{self.name}: {where}: {problem}")

    def mapping(self, value: Any, where: str, required: set[str], optional: set[str]) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a mapping, got {type(value).__name__}")
        missing = required - value.keys()
        if missing:
            raise self.fail(where, f"missing key(s) {', '.join(sorted(missing))}")
        unknown = value.keys() - required - optional
        if unknown:
            raise self.fail(where, f"unknown key(s) {', '.join(sorted(map(str, unknown)))}")
        return value

    def boolean(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, f"expected true or false, got {value!r}")
        return value

    def integer(self, value: Any, where: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(where, f"expected an integer in {low}..{high}, got {value!r}")
        return value

    def text(self, value: Any, where: str, pattern: re.Pattern[str] | None = None) -> str:
        if not isinstance(value, str) or not value or '"' in value or "\\" in value or not value.isprintable():
            raise self.fail(where, f"expected a printable string without quotes or backslashes, got {value!r}")
        if pattern is not None and not pattern.fullmatch(value):
            raise self.fail(where, f"{value!r} does not match {pattern.pattern}")
        return value

    def size(self, value: Any, where: str) -> int:
        """Bytes, from an integer or a string like '80Gi' or '512Mi'."""
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        match = _SIZE.fullmatch(value) if isinstance(value, str) else None
        if not match or int(match[1]) == 0:
            raise self.fail(where, f"expected a positive size (bytes, or a number with Ki/Mi/Gi/Ti), got {value!r}")
        return int(match[1]) * _UNITS[match[2]]


def load_machine(path: Path) -> dict[str, Any]:
    """Parse and validate a machine YAML; returns it normalised (sizes in bytes, bus ids canonical)."""
    import yaml

    check = _Checker(path.name)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise MachineError(f"{path.name}: not valid YAML: {err}") from err
    top = check.mapping(
        raw, "top level", {"driver_version", "cuda_version", "layout", "gpus"}, {"imex_channels", "drm", "strays"}
    )
    layout = top["layout"]
    if layout not in LAYOUTS:
        raise check.fail("layout", f"expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    gpus_raw = top["gpus"]
    if not isinstance(gpus_raw, list) or not gpus_raw:
        raise check.fail("gpus", "expected a non-empty list")
    machine = {
        "driver_version": check.text(str(top["driver_version"]), "driver_version", _DRIVER_VERSION),
        "cuda_version": check.integer(top["cuda_version"], "cuda_version", 1000, 99999),
        "layout": layout,
        "imex_channels": check.integer(top.get("imex_channels", 0), "imex_channels", 0, MAX_IMEX_CHANNELS),
        # nvidia-drm loaded: each GPU has DRM nodes in sysfs and /dev/dri, after a BMC's card0
        "drm": check.boolean(top.get("drm", True), "drm"),
        # files of another driver version beside this one's (Debian: a persistenced, an alternative)
        "strays": check.text(str(top["strays"]), "strays", _DRIVER_VERSION) if "strays" in top else None,
        "gpus": [_load_gpu(check, gpu, i) for i, gpu in enumerate(gpus_raw)],
    }
    _check_unique(check, machine["gpus"])
    return machine


def _load_gpu(check: _Checker, raw: Any, index: int) -> dict[str, Any]:
    where = f"gpus[{index}]"
    gpu = check.mapping(
        raw,
        where,
        {"minor", "name", "uuid", "pci_bus_id", "brand", "compute_capability", "memory", "sm_count"},
        {"pci_device_id", "mig"},
    )
    bus = _BUS_ID.fullmatch(str(gpu["pci_bus_id"]))
    if not bus:
        raise check.fail(f"{where}.pci_bus_id", f"expected DOMAIN:BUS:DEVICE.0 in hex, got {gpu['pci_bus_id']!r}")
    brand = gpu["brand"]
    if brand not in BRANDS:
        raise check.fail(f"{where}.brand", f"expected one of {', '.join(BRANDS)}, got {brand!r}")
    cc = _CC.fullmatch(str(gpu["compute_capability"]))
    if not cc:
        raise check.fail(f"{where}.compute_capability", f"expected MAJOR.MINOR, got {gpu['compute_capability']!r}")
    memory = check.size(gpu["memory"], f"{where}.memory")
    out = {
        "index": index,
        "minor": check.integer(gpu["minor"], f"{where}.minor", 0, 253),
        "name": check.text(gpu["name"], f"{where}.name"),
        "uuid": check.text(gpu["uuid"], f"{where}.uuid", re.compile("GPU-" + _UUID_BODY)),
        "pci_bus_id": f"{int(bus[1], 16):08X}:{int(bus[2], 16):02X}:{int(bus[3], 16):02X}.0",
        "pci_device_id": check.integer(gpu.get("pci_device_id", 0), f"{where}.pci_device_id", 0, 0xFFFFFFFF),
        "brand": brand,
        "compute_capability": f"{cc[1]}.{cc[2]}",
        "memory": memory,
        "sm_count": check.integer(gpu["sm_count"], f"{where}.sm_count", 1, 1024),
        "mig": None,
    }
    if gpu.get("mig") is not None:
        out["mig"] = _load_mig(check, gpu["mig"], f"{where}.mig", memory)
    return out


def _load_mig(check: _Checker, raw: Any, where: str, gpu_memory: int) -> dict[str, Any]:
    mig = check.mapping(raw, where, {"enabled"}, {"devices"})
    if not isinstance(mig["enabled"], bool):
        raise check.fail(f"{where}.enabled", f"expected true or false, got {mig['enabled']!r}")
    devices_raw = mig.get("devices") or []
    if not isinstance(devices_raw, list) or len(devices_raw) > MAX_MIG_DEVICES:
        raise check.fail(f"{where}.devices", f"expected a list of at most {MAX_MIG_DEVICES} MIG devices")
    if devices_raw and not mig["enabled"]:
        raise check.fail(f"{where}.devices", "MIG devices listed while MIG is disabled")
    devices = []
    for i, dev_raw in enumerate(devices_raw):
        at = f"{where}.devices[{i}]"
        dev = check.mapping(
            dev_raw, at, {"gpu_instance_id", "compute_instance_id", "profile", "uuid", "memory", "sm_count"}, set()
        )
        memory = check.size(dev["memory"], f"{at}.memory")
        profile = _PROFILE.fullmatch(check.text(dev["profile"], f"{at}.profile"))
        if not profile:
            raise check.fail(f"{at}.profile", f"expected [<c>c.]<g>g.<n>gb, got {dev['profile']!r}")
        gpu_slices = int(profile[2])
        compute_slices = int(profile[1] or gpu_slices)
        if compute_slices > gpu_slices:
            raise check.fail(f"{at}.profile", "more compute slices than GPU slices")
        if int(profile[3]) != round(memory / (1 << 30)):
            raise check.fail(f"{at}.profile", f"{profile[3]}gb does not match memory {memory} bytes")
        devices.append(
            {
                "gpu_instance_id": check.integer(dev["gpu_instance_id"], f"{at}.gpu_instance_id", 0, 14),
                "compute_instance_id": check.integer(dev["compute_instance_id"], f"{at}.compute_instance_id", 0, 7),
                "profile": dev["profile"],
                "gpu_slices": gpu_slices,
                "compute_slices": compute_slices,
                "uuid": check.text(dev["uuid"], f"{at}.uuid", re.compile("MIG-" + _UUID_BODY)),
                "memory": memory,
                "sm_count": check.integer(dev["sm_count"], f"{at}.sm_count", 1, 1024),
            }
        )
    ids = [(d["gpu_instance_id"], d["compute_instance_id"]) for d in devices]
    if len(set(ids)) != len(ids):
        raise check.fail(f"{where}.devices", "two MIG devices with the same GPU and compute instance ids")
    if sum(d["memory"] for d in devices) > gpu_memory:
        raise check.fail(f"{where}.devices", "MIG devices hold more memory than their GPU")
    return {"enabled": mig["enabled"], "devices": devices}


def _check_unique(check: _Checker, gpus: list[dict[str, Any]]) -> None:
    for key in ("minor", "pci_bus_id"):
        values = [gpu[key] for gpu in gpus]
        if len(set(values)) != len(values):
            raise check.fail("gpus", f"two GPUs with the same {key}")
    uuids = [gpu["uuid"] for gpu in gpus] + [d["uuid"] for gpu in gpus if gpu["mig"] for d in gpu["mig"]["devices"]]
    if len(set(uuids)) != len(uuids):
        raise check.fail("gpus", "a UUID is used twice")


# --- generated C header -----------------------------------------------------------------------


def machine_header(machine: dict[str, Any], source_name: str) -> str:
    """fake_machine.h: the machine as C initialisers of the types in fake_machine_types.h."""
    version = machine["driver_version"]
    lines = [
        f"/* Generated by tests/fakedriver/machine.py from {source_name}: do not edit. */",
        "#ifndef FAKE_MACHINE_H",
        "#define FAKE_MACHINE_H",
        "#include <stddef.h>",
        '#include "fake_machine_types.h"',
        f'#define FAKE_DRIVER_VERSION "{version}"',
        f"#define FAKE_CUDA_VERSION {machine['cuda_version']}",
        f'#define FAKE_NVML_VERSION "{machine["cuda_version"] // 1000}.{version}"',
        f"#define FAKE_GPU_COUNT {len(machine['gpus'])}",
    ]
    for gpu in machine["gpus"]:
        devices = gpu["mig"]["devices"] if gpu["mig"] else []
        if devices:
            entries = ",\n".join(
                f"    {{.gpu_instance_id = {d['gpu_instance_id']}, .compute_instance_id = {d['compute_instance_id']}, "
                f'.uuid = "{d["uuid"]}", .memory_total = {d["memory"]}ULL, .sm_count = {d["sm_count"]}, '
                f".gpu_slices = {d['gpu_slices']}, .compute_slices = {d['compute_slices']}}}"
                for d in devices
            )
            lines.append(
                f"static const struct fake_mig FAKE_MIGS_{gpu['index']}[] __attribute__((unused)) = {{\n{entries}\n}};"
            )
    gpu_entries = []
    for gpu in machine["gpus"]:
        cc_major, cc_minor = gpu["compute_capability"].split(".")
        mig = gpu["mig"]
        devices = mig["devices"] if mig else []
        migs = f"FAKE_MIGS_{gpu['index']}" if devices else "NULL"
        gpu_entries.append(
            f'    {{.index = {gpu["index"]}, .minor = {gpu["minor"]}, .uuid = "{gpu["uuid"]}", '
            f'.pci_bus_id = "{gpu["pci_bus_id"]}", .name = "{gpu["name"]}", .brand = {BRANDS[gpu["brand"]]}, '
            f".cc_major = {cc_major}, .cc_minor = {cc_minor}, .memory_total = {gpu['memory']}ULL, "
            f".sm_count = {gpu['sm_count']}, .mig_enabled = {int(bool(mig and mig['enabled']))}, "
            f".mig_count = {len(devices)}, .migs = {migs}, "
            f".mig_capable = {int(mig is not None)}, .pci_device_id = {gpu['pci_device_id']:#x}u}}"
        )
    lines.append(
        "static const struct fake_gpu FAKE_GPUS[FAKE_GPU_COUNT] __attribute__((unused)) = {\n"
        + ",\n".join(gpu_entries)
        + "\n};"
    )
    lines.append("#endif")
    return "\n".join(lines) + "\n"
