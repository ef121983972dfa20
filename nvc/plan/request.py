"""What one container asks for, parsed: the one record from the CLI's ``configure`` flags
(:func:`from_flags`) or an OCI spec's env (:func:`nvc.plan.fromenv.gpu_request`) to the plan.

Both producers hand over parsed values (selectors, requirements, channel numbers, MIG switches),
never strings for a later stage to split again, and :func:`check` holds what every request must
satisfy whoever made it. Pure; light to import (the hook reads this module at every container
start, GPU or not): the parsers it calls are imported when a request is made.
"""

from __future__ import annotations

import posixpath

from nvc.errors import InputError
from nvc.records import NamedTuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from nvc.plan.requirements import Requirement
    from nvc.plan.selection import Selector

DEFAULT_LDCONFIG = "@/sbin/ldconfig"
COMPAT_MODES = ("disabled", "mount", "ldconfig")


class HostMount(NamedTuple):
    """An extra host file or directory to show in the container (e.g. the sharing shim's files)."""

    source: str  # host path (absolute): a file or a directory the caller prepared
    target: str  # absolute path inside the container
    readonly: bool = True
    directory: bool = False  # target created as a dir (else as an empty file) safely in-root if missing


class ShareRequest(NamedTuple):
    """What a container asked of GPU sharing. Scope "" means every device, else an NVML index (as the
    container numbers its GPUs) or a GPU/MIG UUID. Sizes in bytes; percents 1..100 (100 = unthrottled, the cap);
    weights 1..1000 (its share of the GPU among busy weighted containers); a backend and a latency
    class by name (nvc.containerenv.sharing's BACKENDS and PRIORITY_CLASSES)."""

    memory: tuple[tuple[str, int], ...] = ()
    compute: tuple[tuple[str, int], ...] = ()
    weight: tuple[tuple[str, int], ...] = ()
    backend: tuple[tuple[str, str], ...] = ()
    priority: tuple[tuple[str, str], ...] = ()


class Request(NamedTuple):
    """What to give one container, parsed. ``rootfs`` is absolute and not "/" (with ``pid``, resolved
    under /proc/PID/root); ``pid`` None is standalone mode (no container process, no cgroup)."""

    rootfs: str = ""
    pid: int | None = None
    selectors: tuple[Selector, ...] = ()  # the --device grammar (nvc.plan.selection); () = no GPU
    capabilities: frozenset[str] = frozenset()  # names from nvc.model.capabilities
    requirements: tuple[Requirement, ...] = ()  # nvc.plan.requirements
    ldconfig: str = DEFAULT_LDCONFIG  # "@HOSTPATH" = host binary (run from a memfd copy), else in-image path
    no_cgroups: bool = False
    no_devbind: bool = False
    mig_config: bool = False
    mig_monitor: bool = False
    imex_channels: tuple[int, ...] = ()
    cuda_compat_mode: str = "ldconfig"  # one of COMPAT_MODES
    extra_mounts: tuple[HostMount, ...] = ()
    sharing: ShareRequest | None = None  # GPU sharing: the shim and its files (planned as host steps)
    container_id: str = ""  # names the sharing files (the OCI container id)
    bundle: str = ""  # the OCI bundle: with the container's process, whose sharing files they are
    pod: bool = False  # a Kubernetes pod's container: its sharing limits are its pod's grant
    uid: int | None = 0  # the container's process user (its user namespace's id): an MPS daemon serves one


def _check_target(rootfs: str, pid: int | None, ldconfig: str) -> None:
    if not rootfs or not posixpath.isabs(rootfs) or not posixpath.normpath(rootfs).strip("/") or "\0" in rootfs:
        raise InputError(f"{rootfs or '(empty)'}: invalid rootfs directory (must be absolute and not /)")
    if pid is not None and pid <= 0:
        raise InputError(f"{pid}: invalid pid")
    path = ldconfig[1:] if ldconfig.startswith("@") else ldconfig
    if not posixpath.isabs(path):
        raise InputError(f"{ldconfig}: invalid ldconfig path (absolute path, or @ and an absolute host path)")


def _check_mig(name: str, on: bool, selectors: tuple[Selector, ...]) -> None:
    if on and any(s.needs_mig for s in selectors):
        raise InputError(f"cannot enable {name} with specific MIG devices selected")


def _check_compat_mode(mode: str) -> None:
    if mode not in COMPAT_MODES:
        raise InputError(f"{mode}: invalid cuda compat mode (one of {', '.join(COMPAT_MODES)})")


def check(req: Request) -> Request:
    """``req`` once it holds what any request must (raises InputError), standalone without cgroups."""
    from nvc.model import capabilities

    _check_target(req.rootfs, req.pid, req.ldconfig)
    capabilities.check(req.capabilities)
    _check_mig("mig-config", req.mig_config, req.selectors)
    _check_mig("mig-monitor", req.mig_monitor, req.selectors)
    _check_compat_mode(req.cuda_compat_mode)
    return req if req.pid is not None or req.no_cgroups else req._replace(no_cgroups=True)


def from_flags(
    rootfs: str,
    pid: int | None,
    devices: tuple[str, ...] = (),
    capabilities: Iterable[str] = (),
    requirements: tuple[str, ...] = (),
    ldconfig: str = DEFAULT_LDCONFIG,
    no_cgroups: bool = False,
    no_devbind: bool = False,
    mig_config: str | None = None,
    mig_monitor: str | None = None,
    imex_channels: tuple[str, ...] = (),
    cuda_compat_mode: str = "ldconfig",
) -> Request:
    """``nvc-py configure``'s flags as given (``devices``: the ``-d`` values, ``none`` alone selecting
    no GPU), each checked before anything is looked at; errors name the flag or value."""
    from nvc.containerenv import MIG_FILE_VALUES, NONE, parse_imex_channels
    from nvc.model import capabilities as caps_mod
    from nvc.plan import requirements as reqs_mod
    from nvc.plan import selection

    _check_target(rootfs, pid, ldconfig)
    caps = caps_mod.check(capabilities)
    reqs = tuple(reqs_mod.parse_requirement(text) for text in requirements)
    none = len(devices) == 1 and devices[0].strip().lower() == NONE
    selectors = () if none else selection.parse(devices)
    for name, value in (("mig-config", mig_config), ("mig-monitor", mig_monitor)):
        if value is not None and value not in MIG_FILE_VALUES:
            raise InputError(f"{value}: invalid --{name} value (only 'all' is supported)")
        _check_mig(name, value is not None, selectors)
    _check_compat_mode(cuda_compat_mode)
    # the fields in Request's order, which is the flags'
    return check(
        Request(
            rootfs,
            pid,
            selectors,
            caps,
            reqs,
            ldconfig,
            no_cgroups,
            no_devbind,
            mig_config is not None,
            mig_monitor is not None,
            parse_imex_channels(imex_channels),
            cuda_compat_mode,
        )
    )
