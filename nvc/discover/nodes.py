"""NVIDIA device nodes: their numbers, finding them under the driver root (made by
:mod:`nvc.apply.hostnodes`).

Majors other than the historical 195 are assigned dynamically at module load, so they
are read from ``/proc/devices`` (always the real one: the kernel's view). A node is only
used when its device number is the one the driver registered: a stale or planted node
with another number must not be handed to a container.
"""

import os
import stat

from nvc.discover import rootpath
from nvc.errors import DetectionError, DeviceError
from nvc.records import NamedTuple

PROC_DEVICES = "/proc/devices"

NVIDIA = "nvidia"  # major of nvidiactl, nvidia-modeset and nvidia<minor>
NVIDIA_UVM = "nvidia-uvm"
NVIDIA_CAPS = "nvidia-caps"
NVIDIA_IMEX = "nvidia-caps-imex-channels"

CTL_MINOR = 255
MODESET_MINOR = 254
MODESET_PATH = "/dev/nvidia-modeset"
IMEX_CHANNEL_LIMIT = 1 << 20


class NodeSpec(NamedTuple):
    """A device node nvc-py expects: its path inside the root and its device number."""

    path: str  # "/dev/nvidiactl"
    major: int
    minor: int
    mode: int = 0o666  # used only when the node is created


class DeviceNode(NamedTuple):
    """A device node found on the host: host path plus device number."""

    path: str
    major: int
    minor: int


def parse_proc_devices(text: str) -> dict[str, int]:
    """Character device majors by driver name (the ``Character devices:`` section only)."""
    majors: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        if line.strip().endswith("devices:"):
            in_char = line.startswith("Character")
            continue
        fields = line.split()
        if in_char and len(fields) == 2 and fields[0].isdigit():
            majors.setdefault(fields[1], int(fields[0]))
    return majors


def read_majors(path: str | os.PathLike[str] = PROC_DEVICES) -> dict[str, int]:
    try:
        with open(path) as file:
            return parse_proc_devices(file.read())
    except OSError as err:
        raise DetectionError(f"{path}: {err.strerror}") from None


def control_specs(majors: dict[str, int]) -> tuple[NodeSpec, ...]:
    """Control nodes, in listing order; those whose driver is not loaded are left out."""
    specs = []
    if NVIDIA in majors:
        specs.append(NodeSpec("/dev/nvidiactl", majors[NVIDIA], CTL_MINOR))
    if NVIDIA_UVM in majors:
        specs.append(NodeSpec("/dev/nvidia-uvm", majors[NVIDIA_UVM], 0))
        specs.append(NodeSpec("/dev/nvidia-uvm-tools", majors[NVIDIA_UVM], 1))
    if NVIDIA in majors:
        specs.append(NodeSpec(MODESET_PATH, majors[NVIDIA], MODESET_MINOR))
    return tuple(specs)


def gpu_spec(majors: dict[str, int], minor: int) -> NodeSpec:
    if NVIDIA not in majors:
        raise DeviceError(f"/dev/nvidia{minor}: no '{NVIDIA}' major in {PROC_DEVICES}")
    return NodeSpec(f"/dev/nvidia{minor}", majors[NVIDIA], minor)


def caps_spec(majors: dict[str, int], minor: int, mode: int = 0o444) -> NodeSpec | None:
    """The ``nvidia-cap<minor>`` node, or None where caps are gated through /proc (no caps major)."""
    if NVIDIA_CAPS not in majors:
        return None
    return NodeSpec(f"/dev/nvidia-caps/nvidia-cap{minor}", majors[NVIDIA_CAPS], minor, mode)


def imex_spec(majors: dict[str, int], channel: int) -> NodeSpec:
    if not 0 <= channel < IMEX_CHANNEL_LIMIT:
        raise DeviceError(f"{channel}: unsupported IMEX channel value")
    if NVIDIA_IMEX not in majors:
        raise DeviceError(f"IMEX channel {channel}: no '{NVIDIA_IMEX}' major in {PROC_DEVICES}")
    return NodeSpec(f"/dev/nvidia-caps-imex-channels/channel{channel}", majors[NVIDIA_IMEX], channel)


def find(root: str, spec: NodeSpec) -> DeviceNode | None:
    """The node for ``spec`` under ``root``, None if absent; a node with the wrong number is an error."""
    inner = rootpath.resolve(root, spec.path)
    if inner is None:
        return None
    path = rootpath.host_path(root, inner)
    st = os.stat(path)
    if not stat.S_ISCHR(st.st_mode):
        raise DeviceError(f"{path}: not a character device")
    found = (os.major(st.st_rdev), os.minor(st.st_rdev))
    if found != (spec.major, spec.minor):
        raise DeviceError(f"{path}: device number {found[0]}:{found[1]}, expected {spec.major}:{spec.minor}")
    return DeviceNode(path, spec.major, spec.minor)
