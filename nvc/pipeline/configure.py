"""The pipeline's steps up to the plan, and the whole sequence (:func:`configure`).

check → container → discover → plan → (:mod:`nvc.pipeline.apply`) apply → ldcache. Nothing
changes before the plan is made: every input is checked first, the container's process is
resolved once into a handle that every later step uses, and the plan is pure data that
``--dry-run`` prints.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from nvc.config.options import GlobalOptions
from nvc.discover import procfs
from nvc.discover.container import ContainerFacts, Opener
from nvc.errors import ContainerError
from nvc.logger import Logger
from nvc.model import capabilities
from nvc.plan import selection
from nvc.plan import share as shareplan
from nvc.plan.mountplan import HostFacts
from nvc.plan.operations import Plan
from nvc.plan.request import Request, check
from nvc.records import NamedTuple
from nvc.system import loaderenv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from nvc.apply.container import ContainerHandle
    from nvc.discover.inventory import Inventory
    from nvc.discover.nodes import NodeSpec
    from nvc.plan.mps import MpsClient
    from nvc.plan.request import ShareRequest

log = Logger(__name__)

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Requirement properties only NVML knows (the driver version is in /proc).
_NVML_PROPERTIES = frozenset({"cuda", "arch", "brand"})


class Container(NamedTuple):
    """The container, resolved once (:func:`container`)."""

    handle: ContainerHandle | None  # its process (None standalone: a rootfs only)
    facts: ContainerFacts
    share: shareplan.ShareFiles | None  # its GPU sharing files, planned


class Discovered(NamedTuple):
    """What the host has for this request (:func:`discover`)."""

    host: HostFacts
    chosen: selection.Selection


# ---- check and container --------------------------------------------------------------------


def share_files(
    sharing: ShareRequest,
    container_id: str,
    root_fd: int,
    rootfs: str,
    *,
    bundle: str = "",
    pod: bool = False,
    library: str = shareplan.HOST_LIBRARY,
    state_dir: str = shareplan.STATE_DIR,
    sched_dir: str | None = None,
) -> shareplan.ShareFiles:
    """GPU sharing's host files (:func:`nvc.plan.share.files`), planned from what the host and the
    image have (the shim ``library``, the image's ld.so.preload), not made: a refused request (no
    shim installed, an id that cannot name a directory) changes nothing."""
    from nvc.containerenv.sharing import PRELOAD
    from nvc.discover.container import image_preload

    if not os.path.isfile(library):
        raise ContainerError(f"GPU sharing requested but the shim {library} is not installed")
    preload = image_preload(_opener(root_fd), PRELOAD, rootfs)
    return shareplan.files(
        sharing,
        container_id,
        preload,
        library=library,
        state_dir=state_dir,
        sched_dir=sched_dir,
        bundle=bundle,
        pod=pod,
    )


def _opener(root_fd: int) -> Opener:
    """Opens a path of the image whose root is ``root_fd``, resolved inside that root."""
    from nvc.apply.rootfs import open_in_root

    return functools.partial(open_in_root, root_fd)


def _owner(handle: ContainerHandle | None, root_fd: int) -> tuple[int, int]:
    """Who owns the container: its process (or, standalone, its rootfs); with a user namespace of its
    own, that namespace's root (the host ids of uid and gid 0 inside), whatever user the process is."""
    if handle is not None:
        maps = handle.id_maps()
        root = None if maps is None else maps.root()
        return handle.owner if root is None else root
    st = os.fstat(root_fd)
    return st.st_uid, st.st_gid


@contextmanager
def container(req: Request) -> Iterator[Container]:
    """Step: resolve the container of the checked request ``req`` once: its process (the request's
    pid) pinned in a handle, closed when the ``with`` ends, and what its image has, read inside its
    rootfs (resolved in the process's root)."""
    from nvc.apply.container import ContainerHandle, open_rootfs
    from nvc.discover.container import facts

    handle = None if req.pid is None else ContainerHandle.open(req.pid)
    try:
        root_fd = open_rootfs(req.rootfs, handle)
        try:
            found = facts(_opener(root_fd), _owner(handle, root_fd))
            share = (
                None
                if req.sharing is None
                else share_files(req.sharing, req.container_id, root_fd, req.rootfs, bundle=req.bundle, pod=req.pod)
            )
        finally:
            os.close(root_fd)
        if found.proc_mountpoint is None:
            log.debug(
                "%s has no /proc/driver (procfs not mounted yet?): the driver's /proc files stay unmasked", req.rootfs
            )
        yield Container(handle, found, share)
    finally:
        if handle is not None:
            handle.close()


# ---- discover -------------------------------------------------------------------------------


def _needs_nvml(req: Request, proc: procfs.StrPath) -> bool:
    props = {f.name for r in req.requirements for term in r.terms for f in term}
    return bool(props & _NVML_PROPERTIES) or selection.needs_nvml(
        req.selectors, req.mig_config or req.mig_monitor, proc
    )


def _inventory(glob: GlobalOptions, use_nvml: bool, proc: procfs.StrPath) -> Inventory:
    """The driver and its GPUs: from NVML (the driver helper) where /proc cannot tell, else /proc (and
    the helper's client is not imported)."""
    if use_nvml:
        from nvc.rpc import driver_service

        return driver_service.inventory(glob.root, glob.user, proc)
    from nvc.discover import inventory

    return inventory.from_procfs(proc)


def _mig_minors(req: Request, proc: procfs.StrPath) -> dict[str, int]:
    """The whole mig-minors table (thousands of lines): only --mig-config/--mig-monitor need it (a
    MIG device's own caps minors come with it from the inventory)."""
    return procfs.read_mig_minors(proc) if req.mig_config or req.mig_monitor else {}


def _check_requirements(req: Request, inv: Inventory, chosen: selection.Selection) -> None:
    """Each requirement, per selected GPU (a MIG device's parent is one), or once with no GPU."""
    if not req.requirements:
        return
    from nvc.plan import requirements  # its grammar's patterns are compiled only for a request that has some

    cuda = None if inv.cuda_version is None else f"{inv.cuda_version // 1000}.{(inv.cuda_version % 100) // 10}"
    base = {"cuda": cuda, "driver": inv.driver_version}
    per_gpu = [
        {**base, "arch": getattr(g, "architecture", None), "brand": getattr(g, "brand", None)} for g in chosen.gpus
    ]
    requirements.check(req.requirements, per_gpu or [base])


def _drm_nodes(req: Request, chosen: selection.Selection) -> dict[str, tuple[NodeSpec, ...]]:
    """graphics/display: each selected GPU's DRM nodes by normalised bus id (sysfs; none without)."""
    if not req.capabilities & capabilities.GRAPHICS_CAPABILITIES:
        return {}
    from nvc.discover import drm

    return {procfs.normalize_bus_id(g.bus_id) or g.bus_id: drm.gpu_nodes(g.bus_id) for g in chosen.gpus}


def discover(glob: GlobalOptions, req: Request, proc: procfs.StrPath = procfs.PROC) -> Discovered:
    """Step: what the host has for the checked request ``req``: its GPUs selected (their
    requirements checked), the driver's files, its device nodes (with --load-kmods, those to make
    first: Plan.host_nodes) and its /proc state."""
    from nvc.discover import driver, kmods, nodes, rootpath
    from nvc.plan import mountplan

    inv = _inventory(glob, _needs_nvml(req, proc), proc)
    chosen = selection.select(inv.gpus, req.selectors)
    _check_requirements(req, inv, chosen)
    files = driver.discover(
        glob.root,
        inv.driver_version,
        glob.ldcache,
        prefixes=capabilities.library_prefixes(req.capabilities),
        loaders=capabilities.loader_files(req.capabilities),
    )
    majors = nodes.read_majors()
    mig_minors = _mig_minors(req, proc)
    to_make = kmods.missing(glob.root, proc) if glob.load_kmods else ()
    found = {}
    for spec in mountplan.needed_nodes(chosen, majors, mig_minors, req):
        node = nodes.find(glob.root, spec)
        if node is not None:
            found[spec.path] = node.path
        elif any(made[:3] == spec[:3] for made in to_make):
            found[spec.path] = rootpath.host_path(glob.root, spec.path)
    drm_specs = _drm_nodes(req, chosen)
    for spec in (s for specs in drm_specs.values() for s in specs):
        node = nodes.find(glob.root, spec)
        if node is None:
            log.debug("%s: not under %s, left out", spec.path, glob.root)
        else:
            found[spec.path] = node.path
    host = HostFacts(
        root=glob.root,
        files=files,
        majors=majors,
        nodes=found,
        proc_files=procfs.read_driver_files(proc),
        proc_gpu_dirs=procfs.gpu_dirs(proc),
        mig_minors=mig_minors,
        caps_dir=procfs.caps_dir(proc),
        missing_nodes=to_make,
        drm=drm_specs,
    )
    return Discovered(host, chosen)


def device_nodes(glob: GlobalOptions, req: Request) -> tuple[NodeSpec, ...]:
    """The device nodes a container asking for ``req`` gets (no selectors: driver only, control
    nodes; graphics/display: the GPUs' DRM nodes too), for a runtime to create itself (the runtime
    wrapper). NVML only for selectors /proc
    cannot answer: requirements are the hook's to check."""
    from nvc.discover import nodes
    from nvc.plan import mountplan

    use_nvml = bool(req.selectors) and selection.needs_nvml(req.selectors, req.mig_config or req.mig_monitor)
    chosen = selection.select(_inventory(glob, use_nvml, procfs.PROC).gpus, req.selectors)
    needed = mountplan.needed_nodes(chosen, nodes.read_majors(), _mig_minors(req, procfs.PROC), req)
    return needed + tuple(s for specs in _drm_nodes(req, chosen).values() for s in specs)


# ---- plan and the sequence ------------------------------------------------------------------


def plan(found: Discovered, ctr: Container, req: Request) -> Plan:
    """Step: everything the container gets, as pure data (:mod:`nvc.plan.mountplan`); a shared
    container of an MPS device with its daemon (:mod:`nvc.plan.mps`)."""
    from nvc.plan import mountplan

    share, mps = ctr.share, None
    if req.sharing is not None and share is not None:
        mps = _mps_client(found, req)
        if mps is not None:
            share = shareplan.without_time_slices(share, req.sharing)
    return mountplan.build(found.host, ctr.facts, found.chosen, req, share, mps)


def _mps_client(found: Discovered, req: Request) -> MpsClient | None:
    """The MPS client a shared container is, when its device's backend is mps (else None)."""
    from nvc.plan import mps

    assert req.sharing is not None
    devices = (*(gpu.uuid for gpu in found.chosen.gpus), *(mig.uuid for _, mig in found.chosen.migs))
    client = mps.client(req.sharing._asdict(), devices, found.host.files.binaries, req.container_id, req.uid or 0)
    if client is not None and req.uid is None:
        raise ContainerError(f"{client.device}: sharing backend mps needs the container's user id (process.user.uid)")
    return client


def dry_plan(glob: GlobalOptions, req: Request, proc: procfs.StrPath = procfs.PROC) -> Plan:
    """check → container → discover → plan: everything :func:`configure` would do, changing nothing
    (``--dry-run``, the hook server's warm-up)."""
    req = check(req)
    with container(req) as ctr:
        return _planned(glob, req, ctr, proc)


def _planned(glob: GlobalOptions, req: Request, ctr: Container, proc: procfs.StrPath = procfs.PROC) -> Plan:
    start = time.perf_counter()
    result = plan(discover(glob, req, proc), ctr, req)
    log.debug(
        "timing discovery+plan %.2f ms: %d operations", (time.perf_counter() - start) * 1e3, len(result.operations)
    )
    return result


def scrub_environment() -> None:
    """Drop loader variables and fix PATH, for this process and every helper it forks.

    A hook may inherit a container's environment (CVE-2025-23266: LD_PRELOAD into the
    privileged hook); whatever this process already loaded, its children must not follow.
    (Every program nvc-py runs is exec'd with an empty environment after a pivot into the
    rootfs anyway; this also covers what the caller runs after an in-process configure.)
    """
    for name in list(os.environ):
        if loaderenv.is_unsafe(name):
            del os.environ[name]
    os.environ["PATH"] = SAFE_PATH


def configure(glob: GlobalOptions, req: Request, *, dry_run: bool = False) -> Plan:
    """The whole pipeline (unless ``dry_run``: up to the plan); return the plan. Raises NvcError
    subclasses; on failure nothing stays mounted or created in the container."""
    scrub_environment()
    if dry_run:
        return dry_plan(glob, req)
    from nvc.pipeline.apply import apply, ldcache
    from nvc.rpc import container_service

    req = check(req)
    # The container helper is forked before planning: its fork and confinement overlap the plan.
    with container_service.open_container(wait=False) as helper, container(req) as ctr:
        the_plan = _planned(glob, req, ctr)
        with apply(the_plan, ctr.handle, helper) as applied:
            ldcache(applied)
    return the_plan
