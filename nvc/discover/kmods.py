"""``--load-kmods``: the device nodes the loaded driver provides but ``<root>/dev`` lacks.

Without udev rules (containers, minimal hosts) the driver's nodes may not exist even
though the kernel module is loaded. Which nodes should exist is read from what the
kernel reports, and a node is made only for a module that is loaded (the reference's
rule): nvidiactl and GPU nodes when /proc/devices has the ``nvidia`` major (minors from
/proc/driver/nvidia/gpus), the uvm nodes with the ``nvidia-uvm`` major, nvidia-modeset
only while the nvidia_modeset module is loaded (its node uses the ``nvidia`` major, so
/proc/devices cannot tell), MIG capability nodes with the ``nvidia-caps`` major, for the
capabilities whose /proc access file exists (minors from
/proc/driver/nvidia-caps/mig-minors). Modules are not loaded here: nvc-py does not run
modprobe.

This runs at every container start (``load-kmods: true`` is the default), almost always on
a host whose nodes already exist, so that case is the fast path: the capability tree is
walked (a few entries with MIG off) instead of testing each of mig-minors' thousands of
names, only the wanted minors are looked up in that file, and each wanted node is checked
with one lstat. Only a node missing from that check goes through the root-confined lookup
of :mod:`nvc.discover.nodes`, and its creation
(:mod:`nvc.apply.hostnodes`).
"""

from __future__ import annotations

import os
import stat

from nvc.discover import nodes, procfs, rootpath
from nvc.discover.nodes import NodeSpec
from nvc.logger import Logger

log = Logger(__name__)

SYS_MODULE = "/sys/module"
MODESET_MODULE = "nvidia_modeset"


def caps_access_path(name: str, proc: procfs.StrPath = procfs.PROC) -> str:
    """The /proc access file of a mig-minors entry (``config``, ``gpu0/gi1/ci0/access`` …)."""
    if "/" not in name:
        return os.path.join(procfs.caps_dir(proc), "mig", name)
    gpu, rest = name.split("/", 1)
    return os.path.join(procfs.caps_dir(proc), gpu, "mig", rest)


def read_file_mode(path: procfs.StrPath) -> int | None:
    """``DeviceFileMode`` of a capability access file (decimal, as the driver writes it)."""
    with open(path) as file:
        text = file.read()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMode" and value.strip().isascii() and value.strip().isdigit():
            return int(value.strip()) & 0o777
    return None


def present_capabilities(proc: procfs.StrPath = procfs.PROC) -> tuple[str, ...]:
    """The mig-minors names whose /proc access file exists, found by walking the capability tree.

    Equivalent to testing every mig-minors entry (the reference's rule), but the tree holds
    only what exists: two files with MIG off, against 4,322 names in a 32-GPU driver's file.
    """
    caps = procfs.caps_dir(proc)
    found = [name for name in ("config", "monitor") if os.path.isfile(f"{caps}/mig/{name}")]
    for gpu in procfs.subdirs(caps, "gpu"):
        for gi in procfs.subdirs(f"{caps}/{gpu}/mig", "gi"):
            base = f"{caps}/{gpu}/mig/{gi}"
            if os.path.isfile(f"{base}/access"):
                found.append(f"{gpu}/{gi}/access")
            found += [
                f"{gpu}/{gi}/{ci}/access" for ci in procfs.subdirs(base, "ci") if os.path.isfile(f"{base}/{ci}/access")
            ]
    return tuple(found)


def module_loaded(name: str, sys_module: procfs.StrPath = SYS_MODULE) -> bool:
    return os.path.isdir(os.path.join(sys_module, name))


def node_specs(majors: dict[str, int], gpu_minors: tuple[int, ...], modeset: bool) -> tuple[NodeSpec, ...]:
    """The control and GPU nodes the loaded driver provides (nvidia-modeset only if ``modeset``)."""
    specs = [s for s in nodes.control_specs(majors) if modeset or s.path != nodes.MODESET_PATH]
    return (*specs, *(nodes.gpu_spec(majors, minor) for minor in gpu_minors))


def caps_specs(majors: dict[str, int], caps_minors: dict[str, int]) -> dict[NodeSpec, str]:
    """The capability nodes (mode 0444 until read) with the mig-minors name each comes from."""
    found = {}
    for name, minor in caps_minors.items():
        spec = nodes.caps_spec(majors, minor)
        if spec is not None:
            found[spec] = name
    return found


def _present(root: str, spec: NodeSpec) -> bool:
    """Whether the node is at its plain path under ``root`` with the right number (one lstat)."""
    try:
        st = os.lstat(rootpath.host_path(root, spec.path))
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(spec.major, spec.minor)


def missing(
    root: str,
    proc: procfs.StrPath = procfs.PROC,
    proc_devices: procfs.StrPath = nodes.PROC_DEVICES,
    sys_module: procfs.StrPath = SYS_MODULE,
) -> tuple[NodeSpec, ...]:
    """The nodes the loaded driver provides but ``root`` lacks (changes nothing): ``configure``
    plans their creation (:attr:`nvc.plan.operations.Plan.host_nodes`), so ``--dry-run`` shows it."""
    majors = nodes.read_majors(proc_devices)
    if nodes.NVIDIA not in majors:
        log.debug("no '%s' major in %s: driver not loaded, no nodes to create", nodes.NVIDIA, proc_devices)
        return ()
    gpus = tuple(g.minor for g in procfs.read_gpus(proc))
    caps_minors = procfs.lookup_mig_minors(present_capabilities(proc), proc) if nodes.NVIDIA_CAPS in majors else {}
    caps = caps_specs(majors, caps_minors)
    absent = [
        s
        for s in (*node_specs(majors, gpus, module_loaded(MODESET_MODULE, sys_module)), *caps)
        if not _present(root, s)
    ]
    # A capability node takes the mode its access file asks for; read only for nodes to create.
    return tuple(
        NodeSpec(s.path, s.major, s.minor, read_file_mode(caps_access_path(caps[s], proc)) or 0o444) if s in caps else s
        for s in absent
    )
