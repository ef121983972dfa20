"""CDI generation, the one place a Container Device Interface spec for this host's GPUs is written
(``nvc-py cdi generate``, ``nvc-py doctor``'s check of the specs in place) and CDI devices are named
(:func:`qualified_name`: the device plugin's answer).

With CDI the engine itself (podman >= 4.1, containerd >= 1.7 with enable_cdi) applies the
edits: device nodes, driver file mounts, and ``createContainer`` hooks that run
``nvc-py-hook`` for what mounts cannot do (library symlinks, the ld cache). Kind
``nvidia.com/gpu``: one device per GPU and per MIG device (with its GPU's DRM nodes), plus ``all``;
the files loaders read from fixed places are mounted where the host has them. Every hook carries
an explicit environment: a hook without one inherits the container's (CVE-2025-23266).

Planning is pure over discovered facts (:func:`build`); :func:`generate` does the discovery
through the driver helper, so this package sits beside the commands, above nvc.rpc. The device
nodes' spec form, shared with the runtime wrapper, is :mod:`.devnodes`.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Sequence

from nvc import containerenv
from nvc.discover.driver import DriverFiles
from nvc.discover.nodes import DeviceNode
from nvc.model.capabilities import CAPABILITIES
from nvc.plan import mountplan
from nvc.plan.selection import Selection

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CDI_VERSION = "0.5.0"
KIND = "nvidia.com/gpu"
MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]
IPC_OPTIONS = ["nosuid", "nodev", "rbind", "rprivate", "noexec"]

# A device's selection -> its device nodes; given by the caller so that build() stays pure.
NodesOf = Callable[[Selection], Sequence[DeviceNode]]


def _mount(root: str, host: str, options: list[str]) -> dict[str, Any]:
    return {"hostPath": host, "containerPath": mountplan.inner_path(root, host), "options": list(options)}


def _hook(hook_path: str, env: list[str], *args: str) -> dict[str, Any]:
    return {"hookName": "createContainer", "path": hook_path, "args": ["nvc-py-hook", *args], "env": list(env)}


def _links(libraries: Sequence[str], files: DriverFiles) -> list[str]:
    """``target::link`` pairs for the links ldconfig does not make (libcuda.so -> libcuda.so.1...,
    vdpau/libvdpau_nvidia.so.1 -> the versioned file beside it)."""
    pairs = [
        f"{posixpath.basename(f.host_target)}::{posixpath.join(posixpath.dirname(f.host_target), f.link)}"
        for f in files.loader_files
        if f.link is not None
    ]
    for lib in libraries:
        name = posixpath.basename(lib)
        for prefix, (link, target) in mountplan.LIBRARY_LINKS.items():
            if name.startswith(prefix + "."):
                pairs.append(f"{target or name}::{posixpath.join(posixpath.dirname(lib), link)}")
    return pairs


def common_edits(
    root: str, files: DriverFiles, control: Sequence[DeviceNode], hook_path: str, hook_env: list[str]
) -> dict[str, Any]:
    """Edits every device brings: control nodes, driver files, the link and ld cache hooks."""
    from nvc.cdi.devnodes import spec_device

    libraries = [mountplan.inner_path(root, lib) for lib in files.libraries]
    mounts = [_mount(root, p, MOUNT_OPTIONS) for p in (*files.libraries, *files.binaries, *files.firmwares)]
    mounts += [
        _mount(root, p, IPC_OPTIONS) for p in (files.persistenced_socket, files.fabricmanager_socket) if p is not None
    ]
    mounts += [
        {"hostPath": f.source, "containerPath": f.host_target, "options": list(MOUNT_OPTIONS)}
        for f in files.loader_files
    ]
    hooks = []
    links = _links(libraries, files)
    if links:
        hooks.append(_hook(hook_path, hook_env, "create-symlinks", *(a for pair in links for a in ("--link", pair))))
    folders = list(dict.fromkeys(posixpath.dirname(lib) for lib in libraries))
    if folders:
        hooks.append(_hook(hook_path, hook_env, "update-ldcache", *(a for d in folders for a in ("--folder", d))))
    return {
        "env": [containerenv.assignment(containerenv.VISIBLE_DEVICES, containerenv.VOID)],
        "deviceNodes": [spec_device(root, n) for n in control],
        "mounts": mounts,
        "hooks": hooks,
    }


def device_names(gpus: Sequence[Any], strategy: str) -> list[tuple[str, Selection]]:
    """(CDI device name, what it selects) per GPU and per MIG device, in NVML order."""
    out: list[tuple[str, Selection]] = []
    for gpu in gpus:
        out.append((str(gpu.index) if strategy == "index" else gpu.uuid, Selection((gpu,), ())))
        for mig in gpu.mig_devices:
            name = f"{gpu.index}:{mig.index}" if strategy == "index" else mig.uuid
            out.append((name, Selection((gpu,), ((gpu, mig),))))
    return out


def build(
    root: str,
    files: DriverFiles,
    gpus: Sequence[Any],
    control: Sequence[DeviceNode],
    nodes_of: NodesOf,
    hook_path: str,
    hook_env: list[str],
    strategy: str = "index",
) -> dict[str, Any]:
    """The CDI spec document."""
    from nvc.cdi.devnodes import spec_device

    devices = []
    every: dict[str, dict[str, Any]] = {}
    for name, chosen in device_names(gpus, strategy):
        nodes = [spec_device(root, n) for n in nodes_of(chosen)]
        devices.append({"name": name, "containerEdits": {"deviceNodes": nodes}})
        every.update((n["path"], dict(n)) for n in nodes)  # copies: no YAML anchors in the output
    devices.append({"name": "all", "containerEdits": {"deviceNodes": list(every.values())}})
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": devices,
        "containerEdits": common_edits(root, files, control, hook_path, hook_env),
    }


def qualified_name(device: str) -> str:
    """The fully qualified CDI name of device ``device`` of the spec (``nvidia.com/gpu=<device>``),
    as an engine is asked for it."""
    return f"{KIND}={device}"


def render(spec: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(spec, indent=2) + "\n"
    import yaml

    return yaml.safe_dump(spec, sort_keys=False, default_flow_style=False)


def generate(
    root: str, ldcache: str, user: tuple[int, int] | None, strategy: str, hook: str, hook_env: list[str]
) -> dict[str, Any]:
    """Discover the driver under ``root`` and build its spec (NVML is asked: MIG devices need it);
    ``hook``: the installed program the spec's createContainer hooks run."""
    from nvc.cdi import devnodes
    from nvc.discover import driver, drm, nodes, procfs
    from nvc.plan.request import Request
    from nvc.rpc import driver_service

    inv = driver_service.inventory(root, user)
    files = driver.discover(root, inv.driver_version, ldcache)
    majors = nodes.read_majors()
    control = devnodes.find_all(root, mountplan.control_nodes(majors, frozenset(CAPABILITIES)))
    mig_minors = procfs.read_mig_minors()
    ctl_paths = {n.path for n in control}

    def nodes_of(chosen: Selection) -> list[DeviceNode]:
        specs = mountplan.needed_nodes(chosen, majors, mig_minors, Request())
        specs += tuple(s for gpu in chosen.gpus for s in drm.gpu_nodes(gpu.bus_id))
        return [n for n in devnodes.find_all(root, specs) if n.path not in ctl_paths]

    return build(root, files, inv.gpus, control, nodes_of, hook, hook_env, strategy)
