"""What ``nvc-py info`` and ``nvc-py list`` compute and print, importable without click.

The CLI's commands (:mod:`nvc.commands.cli`) parse their options with click and call these; the
forms without any option call them without click (:mod:`nvc.commands.plain`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from nvc.errors import TRY_WITHOUT_GPU, InitializationError, InputError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

    from nvc.commands.listing import Listing, ListRequest
    from nvc.config.options import GlobalOptions

DRIVER_VERSION = "/proc/driver/nvidia/version"  # there while the NVIDIA kernel driver is loaded


@contextmanager
def driver_required() -> Iterator[None]:
    """A driver command's initialisation error, told as the missing driver where none is loaded."""
    try:
        yield
    except InitializationError as err:
        if os.path.exists(DRIVER_VERSION):
            raise
        raise InitializationError(
            f"no NVIDIA driver is loaded on this host ({err.args[0]}); {TRY_WITHOUT_GPU}"
        ) from None


def load_nodes(root: str) -> None:
    """``--load-kmods`` before a driver command: the driver's missing device nodes made under ``root``. A
    native driver helper the front started before them (nvc.rpc.native_snapshot) may have found none:
    where any node was made, that helper is ended, and the command's snapshot starts after them."""
    from nvc.apply import hostnodes

    if hostnodes.load(root):
        from nvc.rpc import native_snapshot

        native_snapshot.discard()


def info_text(opts: GlobalOptions, fmt: str | None) -> str:
    """``info``'s output (``fmt``: None, "csv" or "json"): the driver and every GPU and MIG device, from NVML.

    A driver helper loads NVML while this process imports what prints it: the native one
    (:mod:`nvc.rpc.native_snapshot`: the front's where it was started for these options, else one
    started now), else the Python one (kept warm by a hook server's worker, forked at start-up by a
    tree without the native helper, see nvc.__main__; else forked here)."""
    from nvc.rpc import native_snapshot

    snap = None
    if native_snapshot.start(opts.root, opts.user):
        infoformat, inventory = _info_modules()
        if native_snapshot.missed(opts.root, opts.user):  # the configuration's for the front's next guess
            from nvc.config import driverguess

            driverguess.remember()
        snap = native_snapshot.snapshot(opts.root, opts.user)
    if snap is None:
        from nvc.rpc.driver_service import open_driver

        with open_driver(root=opts.root, user=opts.user, wait=False) as drv:
            infoformat, inventory = _info_modules()
            snap = drv.snapshot()
    inv = inventory.from_snapshot(snap)
    render = {None: infoformat.text, "csv": infoformat.csv_text, "json": infoformat.json_text}[fmt]
    return render(inv, inv.cuda_version)


def _info_modules() -> tuple[ModuleType, ModuleType]:
    """``info``'s output modules (imported while a driver helper works)."""
    from nvc.commands import infoformat
    from nvc.discover import inventory

    return infoformat, inventory


def list_request(
    devices: tuple[str, ...] = (),
    libraries: bool = False,
    binaries: bool = False,
    ipcs: bool = False,
    firmwares: bool = False,
    compat32: bool = False,
    mig_config: str | None = None,
    mig_monitor: str | None = None,
    imex: tuple[str, ...] = (),
    no_persistenced: bool = False,
    no_fabricmanager: bool = False,
    no_gsp_firmware: bool = False,
) -> tuple[ListRequest, tuple[str, ...]]:
    """``list``'s request and the devices it selects, from its options; with no selection option,
    everything (``-d all --compat32 -l -b -i -f``)."""
    from nvc.commands.listing import ListRequest
    from nvc.containerenv import parse_imex_channels

    chosen = bool(devices) or libraries or binaries or ipcs or firmwares or compat32 or bool(mig_config or mig_monitor)
    if not chosen:
        devices, libraries, binaries, ipcs, firmwares, compat32 = ("all",), True, True, True, True, True
    request = ListRequest(
        devices=bool(devices),
        libraries=libraries,
        binaries=binaries,
        ipcs=ipcs,
        firmwares=firmwares,
        compat32=compat32,
        mig_config=mig_config is not None,
        mig_monitor=mig_monitor is not None,
        imex_channels=parse_imex_channels(imex),
        no_persistenced=no_persistenced,
        no_fabricmanager=no_fabricmanager,
        no_gsp_firmware=no_gsp_firmware,
    )
    return request, devices


def run_list(
    opts: GlobalOptions, request: ListRequest, devices: tuple[str, ...], use_nvml: bool | None = None
) -> Listing:
    """Discover what ``request`` needs and build the listing.

    ``use_nvml`` None picks the cheapest source that can answer (see
    :func:`nvc.plan.selection.needs_nvml`); True/False force one, which tests use to show
    that both sources give the same listing.
    """
    from nvc.commands import listing
    from nvc.discover import driver, inventory, nodes, procfs
    from nvc.plan import selection

    selectors = selection.parse(devices)
    mig_files = request.mig_config or request.mig_monitor
    if mig_files and any(s.needs_mig for s in selectors):
        raise InputError("cannot enable mig-config with specific MIG devices selected")
    if use_nvml is None:
        use_nvml = selection.needs_nvml(selectors, mig_files)
    if use_nvml:
        from nvc.rpc import driver_service  # its helper's client: not imported where /proc answers

        inv = driver_service.inventory(opts.root, opts.user)
    else:
        inv = inventory.from_procfs()
    chosen = selection.select(inv.gpus, selectors) if request.devices else None
    files = driver.discover(opts.root, inv.driver_version, opts.ldcache) if request.needs_driver_files else None
    majors = nodes.read_majors() if request.needs_nodes else {}
    mig_minors = procfs.read_mig_minors() if mig_files else {}
    return listing.build(request, opts.root, files, chosen, majors, mig_minors)
