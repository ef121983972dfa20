"""Build a fake NVIDIA driver from a machine description, for tests on machines without a GPU.

A machine YAML (see ``machines/``) names the driver version, the library layout and the GPUs with
their MIG devices. ``build()`` compiles that description into a fake libnvidia-ml (and libcuda,
when its source is present) so the answers travel with the library into chroots and containers;
it lays out every library of NVIDIA's capability lists as stub ELF files with real SONAMEs,
binaries, firmware, device nodes, an ld.so.cache made by the real ``ldconfig``, and a separate
``proc`` tree shaped like ``/proc/driver/nvidia``. The library list is this package's own test
data, deliberately not imported from nvc: a test that checks nvc against nvc proves nothing.
Test double only.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parent / "src"
# The CUDA and NVML C ABIs are declared once, in the sharing shim's headers (cuda_abi.h, nvml_abi.h):
# the fake implements the same declarations the shim passes through. -iquote: native/sched.h must not
# stand in for the system's <sched.h>.
ABI_HEADERS = Path(__file__).resolve().parents[2] / "native"
INCLUDES = [f"-I{SRC}", f"-iquote{ABI_HEADERS}"]
MACHINES_DIR = Path(__file__).resolve().parent / "machines"

NVIDIA_MAJOR = 195
UVM_MAJOR = 238
CAPS_MAJOR = 241
IMEX_MAJOR = 242
MAX_MIG_DEVICES = 7          # per GPU, as on A100/H100
MIG_MINORS_PER_GPU = 135     # 15 GPU instances x (1 access + 8 compute instances)
MIG_MINORS_PER_GI = 9
MIG_MINORS_GPUS = 32          # a real driver's mig-minors lists 32 GPUs, whatever the machine has
MAX_IMEX_CHANNELS = 256      # the driver allows 2^20; a fake needs a few nodes, not a million

# Library groups of NVIDIA's capability lists. Value: the SONAME's version suffix
# (libcuda.so -> SONAME libcuda.so.1); None where the SONAME is the versioned file name itself,
# as for the driver's internal libraries (libnvidia-glcore.so.<driver version>).
LIBRARY_GROUPS: dict[str, dict[str, str | None]] = {
    "utility": {"libnvidia-ml.so": "1", "libnvidia-cfg.so": "1", "libnvidia-nscq.so": "2"},
    "compute": {
        "libcuda.so": "1", "libcudadebugger.so": "1", "libnvidia-opencl.so": "1",
        "libnvidia-gpucomp.so": None, "libnvidia-ptxjitcompiler.so": "1",
        "libnvidia-fatbinaryloader.so": None, "libnvidia-allocator.so": "1",
        "libnvidia-compiler.so": None, "libnvidia-pkcs11.so": None,
        "libnvidia-pkcs11-openssl3.so": None, "libnvidia-nvvm.so": "4", "libnvidia-tileiras.so": "1",
    },
    "video": {
        "libvdpau_nvidia.so": "1", "libnvidia-encode.so": "1", "libnvidia-opticalflow.so": "1",
        "libnvcuvid.so": "1",
    },
    "graphics": {
        "libnvidia-eglcore.so": None, "libnvidia-glcore.so": None, "libnvidia-tls.so": None,
        "libnvidia-glsi.so": None, "libnvidia-fbc.so": "1", "libnvidia-ifr.so": "1",
        "libnvidia-rtcore.so": None, "libnvoptix.so": "1",
    },
    "graphics_glvnd": {
        "libGLX_nvidia.so": "0", "libEGL_nvidia.so": "0", "libGLESv2_nvidia.so": "2",
        "libGLESv1_CM_nvidia.so": "1", "libnvidia-glvkspirv.so": None, "libnvidia-cbl.so": None,
    },
    "graphics_compat": {"libGL.so": "1", "libEGL.so": "1", "libGLESv1_CM.so": "1", "libGLESv2.so": "2"},
    "ngx": {"libnvidia-ngx.so": "1"},
}
# Libraries built from their own source instead of the stub (source file in src/).
IMPLEMENTED = {"libnvidia-ml.so": "libnvidia-ml.c", "libcuda.so": "libcuda.c"}
ABI_NOTE_LIBRARIES = {"libnvidia-tls.so"}           # carry a GNU/Linux 2.3.99 ABI note
GLCORE_CLIENTS = set(LIBRARY_GROUPS["graphics_compat"])  # DT_NEEDED libnvidia-glcore.so.<ver>

BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager",
            "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")

BRANDS = {
    "Unknown": 0, "Quadro": 1, "Tesla": 2, "NVS": 3, "GRID": 4, "GeForce": 5, "TITAN": 6,
    "VApps": 7, "VPC": 8, "VCS": 9, "VWS": 10, "CloudGaming": 11, "QuadroRTX": 12,
    "NvidiaRTX": 13, "Nvidia": 14, "GeForceRTX": 15, "TitanRTX": 16,
}


@dataclass(frozen=True)
class Layout:
    """Where a driver installation keeps its files, relative to the driver root."""

    lib: str
    lib32: str
    bin: str
    ld_conf: dict[str, tuple[str, ...]]  # ld.so.conf.d file name -> directories


LAYOUTS = {
    # Debian/Ubuntu packages: multiarch dirs, listed in ld.so.conf.d as Debian's libc6 does.
    "distro": Layout(
        "usr/lib/x86_64-linux-gnu", "usr/lib/i386-linux-gnu", "usr/bin",
        {"x86_64-linux-gnu.conf": ("/usr/local/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu",
                                   "/usr/lib/x86_64-linux-gnu"),
         "i386-linux-gnu.conf": ("/usr/local/lib/i386-linux-gnu", "/lib/i386-linux-gnu",
                                 "/usr/lib/i386-linux-gnu")}),
    # GPU cloud images: everything under /usr/local/nvidia, found only through nvidia.conf.
    "nvidia": Layout(
        "usr/local/nvidia/lib64", "usr/local/nvidia/lib", "usr/local/nvidia/bin",
        {"nvidia.conf": ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib")}),
}


class MachineError(ValueError):
    """The machine YAML is not a valid description; the message names the file and the key."""


class BuildError(RuntimeError):
    """A compiler, linker or ldconfig step failed; the message carries its command and output."""


@dataclass(frozen=True)
class FakeDriver:
    """A built fake driver: ``root`` is the driver root, ``proc`` stands in for /proc."""

    root: Path
    proc: Path
    machine: dict[str, Any]
    driver_version: str

    @property
    def layout(self) -> Layout:
        return LAYOUTS[self.machine["layout"]]

    @property
    def lib_dir(self) -> Path:
        return self.root / self.layout.lib

    @property
    def lib32_dir(self) -> Path:
        return self.root / self.layout.lib32

    @property
    def bin_dir(self) -> Path:
        return self.root / self.layout.bin


# --- machine description ------------------------------------------------------------------------

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
    top = check.mapping(raw, "top level", {"driver_version", "cuda_version", "layout", "gpus"}, {"imex_channels"})
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
        "gpus": [_load_gpu(check, gpu, i) for i, gpu in enumerate(gpus_raw)],
    }
    _check_unique(check, machine["gpus"])
    return machine


def _load_gpu(check: _Checker, raw: Any, index: int) -> dict[str, Any]:
    where = f"gpus[{index}]"
    gpu = check.mapping(raw, where, {"minor", "name", "uuid", "pci_bus_id", "brand", "compute_capability",
                                     "memory", "sm_count"}, {"pci_device_id", "mig"})
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
        dev = check.mapping(dev_raw, at, {"gpu_instance_id", "compute_instance_id", "profile", "uuid", "memory",
                                          "sm_count"}, set())
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
        devices.append({
            "gpu_instance_id": check.integer(dev["gpu_instance_id"], f"{at}.gpu_instance_id", 0, 14),
            "compute_instance_id": check.integer(dev["compute_instance_id"], f"{at}.compute_instance_id", 0, 7),
            "profile": dev["profile"],
            "gpu_slices": gpu_slices,
            "compute_slices": compute_slices,
            "uuid": check.text(dev["uuid"], f"{at}.uuid", re.compile("MIG-" + _UUID_BODY)),
            "memory": memory,
            "sm_count": check.integer(dev["sm_count"], f"{at}.sm_count", 1, 1024),
        })
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
        f"/* Generated by tests/fakedriver/build.py from {source_name}: do not edit. */",
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
                f'    {{.gpu_instance_id = {d["gpu_instance_id"]}, .compute_instance_id = {d["compute_instance_id"]}, '
                f'.uuid = "{d["uuid"]}", .memory_total = {d["memory"]}ULL, .sm_count = {d["sm_count"]}, '
                f'.gpu_slices = {d["gpu_slices"]}, .compute_slices = {d["compute_slices"]}}}'
                for d in devices)
            lines.append(f"static const struct fake_mig FAKE_MIGS_{gpu['index']}[] __attribute__((unused)) = {{\n"
                         f"{entries}\n}};")
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
            f".mig_capable = {int(mig is not None)}, .pci_device_id = {gpu['pci_device_id']:#x}u}}")
    lines.append("static const struct fake_gpu FAKE_GPUS[FAKE_GPU_COUNT] __attribute__((unused)) = {\n"
                 + ",\n".join(gpu_entries) + "\n};")
    lines.append("#endif")
    return "\n".join(lines) + "\n"


# --- compiling and linking ----------------------------------------------------------------------

def _run_all(commands: list[list[str]]) -> None:
    """Run commands concurrently (a build is a few dozen short gcc/ld runs); fail on the first error."""
    procs = [(cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
             for cmd in commands]
    failures = []
    for cmd, proc in procs:
        output, _ = proc.communicate()
        if proc.returncode != 0:
            failures.append(f"{' '.join(cmd)}\n{output}")
    if failures:
        raise BuildError("fake driver build step failed:\n" + "\n".join(failures))


def _libc(bits: int) -> str:
    """The libc.so.6 to link stubs against, so ldconfig tags them libc6 like real driver libraries."""
    flag = ["-m32"] if bits == 32 else []
    path = subprocess.run(["gcc", *flag, "-print-file-name=libc.so.6"], capture_output=True, text=True,
                          check=True).stdout.strip()
    if not os.path.isabs(path):
        raise BuildError(f"gcc {' '.join(flag)} cannot find libc.so.6 (is gcc-multilib installed?)")
    return path


def _soname(name: str, suffix: str | None, version: str) -> str:
    return f"{name}.{suffix}" if suffix is not None else f"{name}.{version}"


def _build_libraries(machine: dict[str, Any], gen: Path, obj: Path, dirs: dict[int, Path]) -> None:
    version = machine["driver_version"]
    cflags = ["-O1", "-Wall", "-Werror", f"-I{gen}", *INCLUDES]
    libraries = {name: suffix for group in LIBRARY_GROUPS.values() for name, suffix in group.items()}
    compiles, stub_links, glcore_links = [], [], []
    for bits, libdir in dirs.items():
        libdir.mkdir(parents=True, exist_ok=True)
        arch = ["-m32"] if bits == 32 else ["-m64"]
        emulation = ["-m", "elf_i386"] if bits == 32 else ["-m", "elf_x86_64"]
        libc = _libc(bits)
        for variant, defines in (("stub", []), ("stub-abi", ["-DFAKE_ABI_NOTE"])):
            compiles.append(["gcc", *arch, *cflags, "-fPIC", *defines, "-c", str(SRC / "stub.c"),
                             "-o", str(obj / f"{variant}{bits}.o")])
        for name, suffix in libraries.items():
            target = libdir / f"{name}.{version}"
            soname = _soname(name, suffix, version)
            source = SRC / IMPLEMENTED[name] if name in IMPLEMENTED else None
            if source is not None and source.exists():
                compiles.append(["gcc", *arch, *cflags, "-fPIC", "-shared", "-pthread",
                                 f"-Wl,-soname,{soname}", str(source), "-o", str(target)])
                continue
            stub = obj / (f"stub-abi{bits}.o" if name in ABI_NOTE_LIBRARIES else f"stub{bits}.o")
            link = ["ld", *emulation, "-shared", "-soname", soname, "-o", str(target), str(stub), libc]
            if name in GLCORE_CLIENTS:
                glcore_links.append(link + [str(libdir / f"libnvidia-glcore.so.{version}")])
            else:
                stub_links.append(link)
    for tool in ("nvidia-smi", "tool"):
        compiles.append(["gcc", "-m64", *cflags, str(SRC / f"{tool}.c"), "-o", str(obj / tool)])
    _run_all(compiles)
    _run_all(stub_links)     # libnvidia-glcore first: the compat GL libraries link against it
    _run_all(glcore_links)


def _install_binaries(bin_dir: Path, obj: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in BINARIES:
        shutil.copy2(obj / ("nvidia-smi" if name == "nvidia-smi" else "tool"), bin_dir / name)


def _make_ldcache(root: Path, layout: Layout) -> None:
    """ld.so.conf as a distribution writes it, then the real ldconfig: soname links and the cache."""
    conf_d = root / "etc/ld.so.conf.d"
    conf_d.mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    for name, directories in layout.ld_conf.items():
        (conf_d / name).write_text("".join(f"{d}\n" for d in directories))
    result = subprocess.run(["ldconfig", "-r", str(root)], capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"ldconfig -r {root} failed ({result.returncode}): {result.stderr}")


# --- the rest of the driver root: firmware, IPC, device nodes ----------------------------------

def _mig_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """Minor of a MIG access capability, as /proc/driver/nvidia-caps/mig-minors numbers them."""
    base = 3 + gpu_minor * MIG_MINORS_PER_GPU + gi * MIG_MINORS_PER_GI
    return base if ci is None else base + 1 + ci


def _mknod(path: Path, mode: int, major: int, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)  # mknod applies the umask


def _make_devices(machine: dict[str, Any], dev: Path) -> None:
    _mknod(dev / "nvidiactl", 0o666, NVIDIA_MAJOR, 255)
    _mknod(dev / "nvidia-modeset", 0o666, NVIDIA_MAJOR, 254)
    _mknod(dev / "nvidia-uvm", 0o666, UVM_MAJOR, 0)
    _mknod(dev / "nvidia-uvm-tools", 0o666, UVM_MAJOR, 1)
    _mknod(dev / "nvidia-caps/nvidia-cap1", 0o400, CAPS_MAJOR, 1)   # mig config
    _mknod(dev / "nvidia-caps/nvidia-cap2", 0o444, CAPS_MAJOR, 2)   # mig monitor
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


def _make_files(root: Path, version: str) -> None:
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
        ("ResmanDebugLevel", "4294967295"), ("RmLogonRC", "1"), ("ModifyDeviceFiles", "1"),
        ("DeviceFileUID", "0"), ("DeviceFileGID", "0"), ("DeviceFileMode", "438"),
        ("InitializeSystemMemoryAllocations", "1"), ("UsePageAttributeTable", "4294967295"),
        ("EnableMSI", "1"), ("EnablePCIeGen3", "0"), ("MemoryPoolSize", "0"), ("KMallocHeapMaxSize", "0"),
        ("VMallocHeapMaxSize", "0"), ("IgnoreMMIOCheck", "0"), ("EnableStreamMemOPs", "0"),
        ("EnableUserNUMAManagement", "1"), ("NvLinkDisable", "0"), ("RmProfilingAdminOnly", "1"),
        ("PreserveVideoMemoryAllocations", "0"), ("EnableS0ixPowerManagement", "0"),
        ("S0ixPowerManagementVideoMemoryThreshold", "256"), ("DynamicPowerManagement", "3"),
        ("DynamicPowerManagementVideoMemoryThreshold", "200"), ("RegisterPCIDriver", "1"),
        ("EnablePCIERelaxedOrderingMode", "0"), ("EnableResizableBar", "0"), ("EnableGpuFirmware", "18"),
        ("EnableGpuFirmwareLogs", "2"), ("RmNvlinkBandwidthLinkCount", "0"), ("EnableDbgBreakpoint", "0"),
        ("OpenRmEnableUnsupportedGpus", "1"), ("DmaRemapPeerMmio", "1"), ("ImexChannelCount", "2048"),
        ("CreateImexChannel0", "0"), ("GrdmaPciTopoCheckOverride", "0"), ("CoherentGPUMemoryMode", '""'),
        ("RegistryDwords", '""'), ("RegistryDwordsPerDevice", '""'), ("RmMsg", '""'), ("GpuBlacklist", '""'),
        ("TemporaryFilePath", '""'), ("ExcludedGpus", '""'),
    ]
    return "".join(f"{key}: {value}\n" for key, value in values)


def _gpu_information(gpu: dict[str, Any], version: str) -> str:
    return (f"Model: \t\t {gpu['name']}\n"
            f"IRQ:   \t\t {130 + gpu['minor']}\n"
            f"GPU UUID: \t {gpu['uuid']}\n"
            "Video BIOS: \t 96.00.99.00.01\n"
            "Bus Type: \t PCIe\n"
            "DMA Size: \t 52 bits\n"
            "DMA Mask: \t 0xfffffffffffff\n"
            f"Bus Location: \t {_proc_bus_id(gpu['pci_bus_id'])}\n"
            f"Device Minor: \t {gpu['minor']}\n"
            f"GPU Firmware: \t {version}\n"
            "GPU Excluded:\t No\n")


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
    ours = [(NVIDIA_MAJOR, "nvidia"), (NVIDIA_MAJOR, "nvidiactl"), (UVM_MAJOR, "nvidia-uvm"),
            (CAPS_MAJOR, "nvidia-caps"), (IMEX_MAJOR, "nvidia-caps-imex-channels")]
    sections = host.split("\n\n")
    char_lines = sections[0].splitlines()
    entries = [(int(line.split()[0]), line.split(None, 1)[1]) for line in char_lines[1:] if line.strip()]
    names = {name for _, name in ours}
    entries = sorted([e for e in entries if e[1] not in names] + ours, key=lambda e: e[0])
    sections[0] = "\n".join([char_lines[0]] + [f"{major:3d} {name}" for major, name in entries])
    return "\n\n".join(sections)


def _make_proc(machine: dict[str, Any], proc: Path) -> None:
    version = machine["driver_version"]
    nvidia = proc / "driver/nvidia"
    nvidia.mkdir(parents=True)
    (nvidia / "version").write_text(
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
        "(dvs-builder@U22-I3-AE18-09-3)  Wed Sep 24 23:42:50 UTC 2025\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n")
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


# --- entry point --------------------------------------------------------------------------------

def build(machine_yaml: Path, out: Path) -> FakeDriver:
    """Build the fake driver described by ``machine_yaml`` into ``out`` (root/, proc/, and scratch).

    Needs root (mknod) and gcc with -m32 support. A previous build in ``out`` is replaced.
    """
    machine = load_machine(machine_yaml)
    layout = LAYOUTS[machine["layout"]]
    out = out.resolve()
    root, proc, gen, obj = out / "root", out / "proc", out / "gen", out / "obj"
    for path in (root, proc, gen, obj):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    (gen / "fake_machine.h").write_text(machine_header(machine, machine_yaml.name))
    _build_libraries(machine, gen, obj, {64: root / layout.lib, 32: root / layout.lib32})
    _install_binaries(root / layout.bin, obj)
    _make_ldcache(root, layout)
    _make_files(root, machine["driver_version"])
    _make_devices(machine, root / "dev")
    _make_proc(machine, proc)
    return FakeDriver(root=root, proc=proc, machine=machine, driver_version=machine["driver_version"])
