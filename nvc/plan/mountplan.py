"""The mount plan of ``configure``: the rules that decide what a container gets.

Pure: host facts (driver files, device nodes, /proc/driver/nvidia contents), the selected
devices, facts read safely from the container's rootfs and the request (:mod:`nvc.plan.request`) go in;
an ordered :class:`~nvc.plan.operations.Plan` of operations (:mod:`nvc.plan.operations`) comes
out. Nothing here touches the system, so every rule (which capability brings which files, which
nodes, which cgroup rules) is testable without root, and ``configure --dry-run`` prints exactly
what the applier (:mod:`nvc.apply.applier`) would do.

Order matters and is the applier's order: the driver files ldconfig reads (libraries, loader files)
and their symlinks, the driver files it never reads (binaries, IPC sockets, firmware: no name of
theirs is a library's), device nodes, the tmpfs over /proc/driver/nvidia with its contents (then
sealed read-only), extra mounts. ldconfig starts once the first group is done (its sandbox hides
/dev and /proc), beside the rest: :attr:`Plan.before_ldconfig`. An extra mount may land in a library
directory, so a plan with one has ldconfig wait for all of them.
"""

import os
import posixpath
import re
from collections.abc import Mapping

from nvc.discover import nodes
from nvc.discover.container import COMPAT_DIR, PROC_NVIDIA, ContainerFacts
from nvc.discover.driver import DriverFiles
from nvc.discover.nodes import NodeSpec
from nvc.discover.procfs import normalize_bus_id
from nvc.errors import DeviceError, InputError
from nvc.model import capabilities as caps_mod
from nvc.plan.devfilter import DeviceRule
from nvc.plan.mps import CONTAINER_PIPE_DIR, MpsClient
from nvc.plan.operations import Bind, MakeDir, Operation, Plan, Seal, Symlink, Tmpfs, WriteFile
from nvc.plan.request import HostMount, Request
from nvc.plan.selection import Selection
from nvc.plan.share import ShareFiles
from nvc.plan.share import mounts as share_mounts
from nvc.records import NamedTuple
from nvc.system.syscalls import MountAttr

RO = MountAttr.RDONLY | MountAttr.NOSUID | MountAttr.NODEV
RO_NOEXEC = RO | MountAttr.NOEXEC
IPC = MountAttr.NOSUID | MountAttr.NODEV | MountAttr.NOEXEC
DEVICE = MountAttr.NOSUID | MountAttr.NOEXEC

CAPS_DIR = "/dev/nvidia-caps"
BIN_DIR = "/usr/bin"
# driver files whose names ldconfig never takes for a library (only lib*.so* and ld-*.so* are)
_UNREAD_BY_LDCONFIG = frozenset({"binary", "ipc", "firmware"})

# Links applications expect but ldconfig does not make (it only makes SONAME links):
# library prefix -> (link name, target; None = the mounted file itself).
LIBRARY_LINKS: dict[str, tuple[str, str | None]] = {
    "libcuda.so": ("libcuda.so", "libcuda.so.1"),
    "libnvidia-opticalflow.so": ("libnvidia-opticalflow.so", "libnvidia-opticalflow.so.1"),
    "libGLX_nvidia.so": ("libGLX_indirect.so.0", None),
}

_MODIFY_DEVICE_FILES = re.compile(r"^ModifyDeviceFiles:.*$", re.MULTILINE)
_COMPAT_LIB = re.compile(r"^lib.*\.so\.(\d+)(\.\d+)*$")


# ---- inputs ---------------------------------------------------------------------------------


class HostFacts(NamedTuple):
    """What discovery found on the host."""

    root: str  # driver root (absolute); files below are host paths under it
    files: DriverFiles
    majors: Mapping[str, int]  # /proc/devices
    nodes: Mapping[str, str]  # node path as the container sees it -> host path, st_rdev checked
    proc_files: Mapping[str, str]  # params/version/registry of /proc/driver/nvidia -> content
    proc_gpu_dirs: Mapping[str, str]  # normalised bus id -> /proc/driver/nvidia/gpus/<dir> (host path)
    mig_minors: Mapping[str, int]  # /proc/driver/nvidia-caps/mig-minors
    caps_dir: str = f"{PROC_NVIDIA}/capabilities"  # host path of the MIG capability tree
    missing_nodes: tuple[NodeSpec, ...] = ()  # --load-kmods: to make under root first (found in ``nodes`` too)
    # graphics/display: normalised bus id -> the GPU's DRM nodes (sysfs; those in ``nodes`` exist)
    drm: Mapping[str, tuple[NodeSpec, ...]] = {}


# ---- planning -------------------------------------------------------------------------------


def inner_path(root: str, host: str) -> str:
    """The path of host file ``host`` inside driver root ``root`` (where the container gets it)."""
    if root == "/":
        return host
    return "/" + os.path.relpath(host, root)


def _has_prefix(path: str, prefixes: tuple[str, ...]) -> bool:
    return posixpath.basename(path).startswith(prefixes)


def control_nodes(majors: Mapping[str, int], capabilities: frozenset[str]) -> tuple[nodes.NodeSpec, ...]:
    """nvidiactl always; the uvm nodes only with compute; modeset only with display."""
    keep = []
    for spec in nodes.control_specs(dict(majors)):
        if "uvm" in spec.path and "compute" not in capabilities:
            continue
        if spec.path.endswith("modeset") and "display" not in capabilities:
            continue
        keep.append(spec)
    return tuple(keep)


def _mig_caps_minors(selection: Selection, mig_minors: Mapping[str, int], whole: bool) -> list[int]:
    """nvidia-caps minors the container may use: each MIG device's GI and CI, or with
    mig-config/monitor every minor of each selected MIG-capable GPU."""
    minors: list[int] = []
    if whole:
        for gpu in selection.gpus:
            if getattr(gpu, "mig_enabled", False) or gpu.mig_devices:
                minors += [m for name, m in mig_minors.items() if name.startswith(f"gpu{gpu.minor}/")]
    for _, mig in selection.migs:
        minors += [m for m in (mig.gi_caps_minor, mig.ci_caps_minor) if m is not None]
    return list(dict.fromkeys(minors))


def needed_nodes(
    selection: Selection, majors: Mapping[str, int], mig_minors: Mapping[str, int], request: Request
) -> tuple[nodes.NodeSpec, ...]:
    """Every device node the plan may use, for the caller to look up (and check) on the host."""
    specs = list(control_nodes(majors, request.capabilities))
    specs += [nodes.gpu_spec(dict(majors), gpu.minor) for gpu in selection.gpus]
    whole = request.mig_config or request.mig_monitor
    minors = _mig_caps_minors(selection, mig_minors, whole)
    if whole:
        minors += [
            mig_minors[n]
            for n, on in (("config", request.mig_config), ("monitor", request.mig_monitor))
            if on and n in mig_minors
        ]
    specs += [s for s in (nodes.caps_spec(dict(majors), m) for m in dict.fromkeys(minors)) if s is not None]
    specs += [nodes.imex_spec(dict(majors), c) for c in request.imex_channels]
    return tuple(specs)


def params_without_device_files(text: str) -> str:
    """The driver's params with ``ModifyDeviceFiles: 0``: the container's driver must not mknod nodes."""
    if _MODIFY_DEVICE_FILES.search(text):
        return _MODIFY_DEVICE_FILES.sub("ModifyDeviceFiles: 0", text)
    return text + ("" if text.endswith("\n") or not text else "\n") + "ModifyDeviceFiles: 0\n"


def compat_libraries(libs: tuple[str, ...], driver_version: str, mode: str) -> tuple[str, ...]:
    """The forward-compat libraries that apply (the reference's filter, by leading major).

    ldconfig mode keeps libraries whose major is above the driver's; mount mode drops only
    those whose major equals it.
    """
    driver_major = int(driver_version.split(".")[0])
    keep = []
    for lib in libs:
        m = _COMPAT_LIB.match(posixpath.basename(lib))
        if m is None:
            continue
        major = int(m.group(1))
        if (mode == "ldconfig" and major > driver_major) or (mode == "mount" and major != driver_major):
            keep.append(lib)
    return tuple(keep)


def _node_bind(spec: nodes.NodeSpec, host: HostFacts, what: str) -> Bind:
    return Bind(host.nodes[spec.path], spec.path, int(DEVICE), "device", what, os.makedev(spec.major, spec.minor))


def _loader_targets(files: DriverFiles, caps: frozenset[str]) -> set[str]:
    """Targets of the found loader files ``caps`` bring (a LoaderFile's target, or its dir + name)."""
    wanted = caps_mod.loader_files(caps)
    return {
        f.target
        for f in files.loader_files
        if any(f.target == w.target or (w.target.endswith("/") and f.target.startswith(w.target)) for w in wanted)
    }


def _driver_files(host: HostFacts, container: ContainerFacts, request: Request) -> list[Operation]:
    caps = request.capabilities
    prefixes = caps_mod.library_prefixes(caps)  # video brings compute's, see nvc.model.capabilities
    files = host.files
    ops: list[Operation] = []
    bins = caps_mod.binary_names(caps)
    ops += [
        Bind(b, f"{BIN_DIR}/{posixpath.basename(b)}", int(RO), what="binary")
        for b in files.binaries
        if posixpath.basename(b) in bins
    ]
    ops += [
        Bind(lib, f"{container.lib_dir}/{posixpath.basename(lib)}", int(RO), what="library")
        for lib in files.libraries
        if _has_prefix(lib, prefixes)
    ]
    if "compat32" in caps:
        ops += [
            Bind(lib, f"{container.lib32_dir}/{posixpath.basename(lib)}", int(RO), what="library32")
            for lib in files.libraries32
            if _has_prefix(lib, prefixes)
        ]
    if request.cuda_compat_mode == "mount" and "compute" in caps:
        ops += [
            Bind(lib, f"{container.lib_dir}/{posixpath.basename(lib)}", int(RO), what="compat", in_rootfs=True)
            for lib in compat_libraries(container.compat_libs, files.version, "mount")
        ]
    ipcs = [
        (files.persistenced_socket, bool(caps & {"utility", "compute"}), "file"),
        (files.fabricmanager_socket, "compute" in caps, "file"),
        (files.mps_pipe_dir, "compute" in caps, "dir"),
    ]
    ops += [Bind(path, inner_path(host.root, path), int(IPC), kind, "ipc") for path, on, kind in ipcs if path and on]
    loader_targets = _loader_targets(files, caps)
    ops += [Bind(fw, inner_path(host.root, fw), int(RO_NOEXEC), what="firmware") for fw in files.firmwares]
    ops += [
        Bind(f.source, f.target.replace(caps_mod.LIBDIR, container.lib_dir), int(RO), what="loader")
        for f in files.loader_files
        if f.target in loader_targets
    ]
    return ops


def _proc_ops(host: HostFacts, container: ContainerFacts, selection: Selection, request: Request) -> list[Operation]:
    """The tmpfs over /proc/driver/nvidia: params (ModifyDeviceFiles: 0), version, registry, the
    selected GPUs' directories and MIG access files (see ContainerFacts.proc_mountpoint)."""
    mountpoint = container.proc_mountpoint
    if mountpoint is None:
        return []
    ops: list[Operation] = [Tmpfs(mountpoint)]
    if mountpoint != PROC_NVIDIA:
        ops.append(MakeDir(PROC_NVIDIA))
    for name in ("params", "version", "registry"):
        if name in host.proc_files:
            content = host.proc_files[name]
            ops.append(
                WriteFile(
                    f"{PROC_NVIDIA}/{name}", params_without_device_files(content) if name == "params" else content
                )
            )
    if selection.gpus:
        ops.append(MakeDir(f"{PROC_NVIDIA}/gpus"))
    for gpu in selection.gpus:
        src = host.proc_gpu_dirs.get(normalize_bus_id(gpu.bus_id) or gpu.bus_id)
        if src is None:
            raise DeviceError(f"{gpu.uuid}: no {PROC_NVIDIA}/gpus entry for bus id {gpu.bus_id}")
        ops.append(Bind(src, f"{PROC_NVIDIA}/gpus/{posixpath.basename(src)}", int(RO_NOEXEC), "dir", "proc"))
    caps_target = f"{PROC_NVIDIA}/capabilities"
    if request.mig_config or request.mig_monitor:
        ops.append(Bind(host.caps_dir, caps_target, int(RO_NOEXEC), "dir", "mig"))
    else:
        for _, mig in selection.migs:
            for src in (mig.gi_caps_path, mig.ci_caps_path):
                if src is None:
                    raise DeviceError(f"{mig.uuid}: no MIG access files in {host.caps_dir}")
                rel = posixpath.relpath(src, host.caps_dir)
                ops.append(Bind(src, f"{caps_target}/{rel}", int(RO_NOEXEC), "file", "mig"))
    ops.append(Seal(mountpoint))
    return ops


def drm_nodes(host: HostFacts, bus_id: str) -> tuple[NodeSpec, ...]:
    """The DRM card and render nodes discovery found for the GPU at ``bus_id``."""
    return host.drm.get(normalize_bus_id(bus_id) or bus_id, ())


def _require(spec: nodes.NodeSpec, host: HostFacts) -> nodes.NodeSpec:
    if spec.path not in host.nodes:
        raise DeviceError(f"{spec.path}: no such device node under {host.root} (see --load-kmods)")
    return spec


def _device_ops(host: HostFacts, selection: Selection, request: Request) -> tuple[list[Operation], list[DeviceRule]]:
    """Device node binds and their cgroup rules.

    With mig-config/monitor the host's whole /dev/nvidia-caps is bound (caps of MIG devices
    created later included) and every caps minor of the selected MIG-capable GPUs allowed;
    otherwise each selected MIG device's GI and CI caps nodes are bound one by one.
    """
    majors = dict(host.majors)
    specs = [s for s in control_nodes(majors, request.capabilities) if s.path in host.nodes]
    specs += [_require(nodes.gpu_spec(majors, gpu.minor), host) for gpu in selection.gpus]
    if request.capabilities & caps_mod.GRAPHICS_CAPABILITIES:
        specs += [s for gpu in selection.gpus for s in drm_nodes(host, gpu.bus_id) if s.path in host.nodes]
    whole = request.mig_config or request.mig_monitor
    caps_specs = [
        s
        for s in (nodes.caps_spec(majors, m) for m in _mig_caps_minors(selection, host.mig_minors, whole))
        if s is not None
    ]
    mig_file_specs = []
    for name, on in (("config", request.mig_config), ("monitor", request.mig_monitor)):
        if not on:
            continue
        if name not in host.mig_minors:
            raise DeviceError(f"MIG {name} is not supported by this driver (no mig-minors entry)")
        spec = nodes.caps_spec(majors, host.mig_minors[name])
        if spec is not None:
            mig_file_specs.append(_require(spec, host))
    imex = [_require(nodes.imex_spec(majors, c), host) for c in request.imex_channels]
    ops: list[Operation] = []
    if not request.no_devbind:
        ops += [_node_bind(s, host, "device") for s in specs]
        if mig_file_specs:
            caps_host = posixpath.dirname(host.nodes[mig_file_specs[0].path])
            ops.append(Bind(caps_host, CAPS_DIR, int(MountAttr.NOSUID | MountAttr.NOEXEC), "dir", "mig"))
        else:
            ops += [_node_bind(_require(s, host), host, "mig") for s in caps_specs]
        ops += [_node_bind(s, host, "imex") for s in imex]
    allowed = dict.fromkeys([*specs, *caps_specs, *mig_file_specs, *imex])
    rules = [] if request.no_cgroups else [DeviceRule("c", s.major, s.minor, "rw") for s in allowed]
    return ops, rules


def _links(binds: list[Operation], files: DriverFiles, container: ContainerFacts) -> list[Operation]:
    """The links ldconfig does not make: LIBRARY_LINKS beside the libraries, and a loader file's
    link in its directory (vdpau/libvdpau_nvidia.so.1 -> libvdpau_nvidia.so.<version>)."""
    links: list[Operation] = []
    targets = {op.target for op in binds if isinstance(op, Bind) and op.what == "loader"}
    for f in files.loader_files:
        where = f.target.replace(caps_mod.LIBDIR, container.lib_dir)
        if f.link is not None and where in targets:
            links.append(Symlink(f"{posixpath.dirname(where)}/{f.link}", posixpath.basename(where)))
    for op in binds:
        if not isinstance(op, Bind) or op.what != "library":
            continue
        name = posixpath.basename(op.target)
        for prefix, (link, target) in LIBRARY_LINKS.items():
            if name.startswith(prefix + "."):
                links.append(Symlink(f"{posixpath.dirname(op.target)}/{link}", target or name))
    return links


def _extra(mounts: tuple[HostMount, ...]) -> list[Operation]:
    ops: list[Operation] = []
    for m in mounts:
        if not posixpath.isabs(m.source) or not posixpath.isabs(m.target) or posixpath.normpath(m.target) == "/":
            raise InputError(f"invalid extra mount {m.source} -> {m.target}: paths must be absolute")
        attrs = (MountAttr.RDONLY if m.readonly else 0) | MountAttr.NOSUID | MountAttr.NODEV
        ops.append(Bind(m.source, posixpath.normpath(m.target), int(attrs), "dir" if m.directory else "file", "extra"))
    return ops


def build(
    host: HostFacts,
    container: ContainerFacts,
    selection: Selection,
    request: Request,
    share: ShareFiles | None = None,
    mps: MpsClient | None = None,
) -> Plan:
    """The plan for one container (``share``: its sharing files, their mounts after the request's
    extra mounts; ``mps``: its device's MPS daemon, whose pipe directory it gets at CUDA's default).
    Raises DeviceError for a selected device the host lacks."""
    files_ops = _driver_files(host, container, request)
    device_ops, rules = _device_ops(host, selection, request)
    extra = (*request.extra_mounts, *(share_mounts(share) if share is not None else ()))
    if mps is not None:
        extra = (*extra, HostMount(source=mps.pipe_dir, target=CONTAINER_PIPE_DIR, readonly=False, directory=True))
    read = [
        *(op for op in files_ops if isinstance(op, Bind) and op.what not in _UNREAD_BY_LDCONFIG),
        *_links(files_ops, host.files, container),
    ]
    extra_ops = _extra(extra)
    ops = [
        *read,
        *(op for op in files_ops if isinstance(op, Bind) and op.what in _UNREAD_BY_LDCONFIG),
        *device_ops,
        *_proc_ops(host, container, selection, request),
        *extra_ops,
    ]
    lib_dirs = [
        d
        for d, what in ((container.lib_dir, "library"), (container.lib32_dir, "library32"))
        if any(isinstance(o, Bind) and o.what == what for o in ops)
    ]
    if request.cuda_compat_mode == "ldconfig" and "compute" in request.capabilities and lib_dirs:
        if compat_libraries(container.compat_libs, host.files.version, "ldconfig"):
            lib_dirs.insert(0, COMPAT_DIR)
    return Plan(
        rootfs=request.rootfs,
        pid=request.pid,
        owner=container.owner,
        operations=tuple(ops),
        cgroup_rules=tuple(rules),
        ldconfig=request.ldconfig if lib_dirs else None,
        ldconfig_dirs=tuple(lib_dirs),
        host_nodes=host.missing_nodes,
        host_root=host.root,
        share=share,
        mps=mps,
        before_ldconfig=len(read) if lib_dirs and request.ldconfig is not None and not extra_ops else None,
    )
