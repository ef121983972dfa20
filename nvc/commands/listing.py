"""What ``nvc-py list`` prints: every host path a container would get, in a fixed order.

Order (the reference tool's): control device nodes, then GPU nodes; per MIG device its
GPU-instance and compute-instance access files plus, where caps are device nodes, their
``nvidia-cap<N>`` nodes; IMEX channel nodes; MIG config/monitor files and nodes;
binaries; libraries; 32-bit libraries; IPC endpoints; firmware; the files loaders read from
fixed places (ICD json files, the VDPAU and GBM backends, the X driver). Building the listing is
pure over already discovered facts, apart from checking that device nodes exist.
"""

import os

from nvc.discover import nodes, procfs
from nvc.discover.driver import DriverFiles
from nvc.errors import DeviceError
from nvc.plan.selection import Selection
from nvc.records import NamedTuple


class ListRequest(NamedTuple):
    """The ``list`` flags, after defaults were applied."""

    devices: bool = False
    libraries: bool = False
    binaries: bool = False
    ipcs: bool = False
    firmwares: bool = False
    compat32: bool = False
    mig_config: bool = False
    mig_monitor: bool = False
    imex_channels: tuple[int, ...] = ()
    no_persistenced: bool = False
    no_fabricmanager: bool = False
    no_gsp_firmware: bool = False

    @property
    def needs_driver_files(self) -> bool:
        return self.libraries or self.binaries or self.ipcs or self.firmwares

    @property
    def needs_nodes(self) -> bool:
        return self.devices or self.mig_config or self.mig_monitor or bool(self.imex_channels)


class Listing(NamedTuple):
    """The paths, by section, in output order."""

    devices: tuple[str, ...] = ()
    mig_devices: tuple[str, ...] = ()
    imex_channels: tuple[str, ...] = ()
    mig_config: tuple[str, ...] = ()
    binaries: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()
    libraries32: tuple[str, ...] = ()
    ipcs: tuple[str, ...] = ()
    firmwares: tuple[str, ...] = ()
    loader_files: tuple[str, ...] = ()

    def text(self) -> str:
        """One path per line."""
        return "".join(f"{p}\n" for section in self for p in section)

    def json(self) -> str:
        """A JSON object with every section as a (possibly empty) list, keys in output order."""
        import json  # for --json only: with its patterns, more than the rest of a listing imports

        return json.dumps({k: list(v) for k, v in self._asdict().items()}, indent=2) + "\n"


def _node(root: str, spec: nodes.NodeSpec) -> str:
    found = nodes.find(root, spec)
    if found is None:
        raise DeviceError(f"{spec.path}: no such device node under {root} (see --load-kmods)")
    return found.path


def _caps_node(root: str, majors: dict[str, int], minor: int | None) -> list[str]:
    """The nvidia-cap node of ``minor`` where caps are device nodes (none where /proc gates them)."""
    spec = nodes.caps_spec(majors, minor) if minor is not None else None
    return [_node(root, spec)] if spec is not None else []


def device_paths(root: str, majors: dict[str, int], selection: Selection) -> tuple[list[str], list[str]]:
    """(control + GPU nodes, MIG access files and caps nodes) of ``selection``."""
    devices = [n.path for n in (nodes.find(root, s) for s in nodes.control_specs(majors)) if n is not None]
    devices += [_node(root, nodes.gpu_spec(majors, gpu.minor)) for gpu in selection.gpus]
    migs: list[str] = []
    for gpu, mig in selection.migs:
        if mig.gi_caps_path is None or mig.ci_caps_path is None:
            raise DeviceError(
                f"{mig.uuid}: no MIG access files for GPU instance {mig.gpu_instance_id}, "
                f"compute instance {mig.compute_instance_id} of GPU {gpu.index}"
            )
        migs += [mig.gi_caps_path, mig.ci_caps_path]
        migs += _caps_node(root, majors, mig.gi_caps_minor) + _caps_node(root, majors, mig.ci_caps_minor)
    return devices, migs


def mig_file_paths(
    root: str, majors: dict[str, int], mig_minors: dict[str, int], names: tuple[str, ...], proc: procfs.StrPath
) -> list[str]:
    """``/proc/driver/nvidia/capabilities/mig/<name>`` and its caps node, for config and/or monitor."""
    paths: list[str] = []
    for name in names:
        path = os.path.join(procfs.caps_dir(proc), "mig", name)
        if not os.path.isfile(path):
            raise DeviceError(f"{path}: not found: MIG {name} is not supported by this driver")
        paths.append(path)
        paths += _caps_node(root, majors, mig_minors.get(name))
    return paths


def build(
    request: ListRequest,
    root: str,
    files: DriverFiles | None,
    selection: Selection | None,
    majors: dict[str, int],
    mig_minors: dict[str, int],
    proc: procfs.StrPath = procfs.PROC,
) -> Listing:
    """The listing for ``request``: ``selection`` is None without ``--device``, ``files`` None without -l/-b/-i/-f."""
    devices, migs = device_paths(root, majors, selection) if selection is not None else ([], [])
    imex = [_node(root, nodes.imex_spec(majors, c)) for c in request.imex_channels]
    mig_names = tuple(n for n, on in (("config", request.mig_config), ("monitor", request.mig_monitor)) if on)
    mig_files = mig_file_paths(root, majors, mig_minors, mig_names, proc)
    listing = Listing(tuple(devices), tuple(migs), tuple(imex), tuple(mig_files))
    if files is None:
        return listing
    ipcs = [
        path
        for path, skip in (
            (files.persistenced_socket, request.no_persistenced),
            (files.fabricmanager_socket, request.no_fabricmanager),
            (files.mps_pipe_dir, False),
        )
        if path is not None and not skip
    ]
    return listing._replace(
        binaries=files.binaries if request.binaries else (),
        libraries=files.libraries if request.libraries else (),
        libraries32=files.libraries32 if request.libraries and request.compat32 else (),
        ipcs=tuple(ipcs) if request.ipcs else (),
        firmwares=files.firmwares if request.firmwares and not request.no_gsp_firmware else (),
        loader_files=tuple(f.source for f in files.loader_files) if request.libraries else (),
    )
