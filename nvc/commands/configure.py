"""``configure``: make the selected GPUs usable inside one container.

The single entry point of the CLI's ``nvc-py configure`` and of the OCI hook (which calls
:func:`configure` in-process), both with a parsed :class:`~nvc.plan.request.Request`. The data
path: check the request (nothing changes before every input was checked) → select devices →
check requirements → discover the driver's files → read container facts safely inside its rootfs
→ plan (:mod:`nvc.plan.mountplan`, pure; with GPU sharing, its host files as steps of the plan:
:mod:`nvc.plan.share`)
→ apply (:func:`nvc.rpc.container_service.apply`: the host steps, then a forked helper running
:mod:`nvc.apply.applier` inside the container's mount namespace, then the sandboxed ldconfig and
the device cgroup).
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

from nvc.model import capabilities
from nvc.system import loaderenv
from nvc.discover import procfs
from nvc.plan import requirements, selection
from nvc.plan.request import Request, check
from nvc.errors import ContainerError
from nvc.logger import Logger
from nvc.plan.mountplan import COMPAT_DIR, PROC_NVIDIA, ContainerFacts, HostFacts
from nvc.plan.operations import Plan
from nvc.plan import share as shareplan
from nvc.config.options import GlobalOptions

if TYPE_CHECKING:
    from nvc.apply.container import ContainerHandle
    from nvc.discover.inventory import Inventory
    from nvc.plan.request import ShareRequest

log = Logger(__name__)

__all__ = ["GlobalOptions", "Plan", "Request", "configure"]

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEBIAN_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu")
# Requirement properties only NVML knows (the driver version is in /proc).
_NVML_PROPERTIES = frozenset({"cuda", "arch", "brand"})
_MAX_PRELOAD = 64 * 1024  # bytes of an image's /etc/ld.so.preload


# ---- container facts ------------------------------------------------------------------------


def _exists(root_fd: int, path: str, directory: bool = False) -> bool:
    from nvc.apply import rootfs as inroot

    try:
        fd = inroot.open_in_root(root_fd, path, os.O_PATH | (os.O_DIRECTORY if directory else 0))
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EXDEV):
            return False
        raise ContainerError(f"cannot inspect the rootfs: {path}: {err.strerror}") from None
    os.close(fd)
    return True


def _compat_libs(root_fd: int) -> tuple[str, ...]:
    """Regular files ``lib*.so.*`` in the image's CUDA compat dir (symlinks and dirs ignored)."""
    from nvc.apply import rootfs as inroot

    try:
        fd = inroot.open_in_root(root_fd, COMPAT_DIR, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return ()
    try:
        found = []
        for name in sorted(os.listdir(fd)):
            if not (name.startswith("lib") and ".so." in name):
                continue
            if stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                found.append(f"{COMPAT_DIR}/{name}")
        return tuple(found)
    finally:
        os.close(fd)


def container_facts(root_fd: int, owner: tuple[int, int]) -> ContainerFacts:
    """Library dirs, procfs state and compat libraries, read inside the rootfs at ``root_fd``."""
    if _exists(root_fd, "/etc/debian_version"):
        lib_dir, lib32_dir = DEBIAN_LIB_DIRS
    else:
        lib_dir = "/usr/lib64"
        lib32_dir = "/usr/lib32" if _exists(root_fd, "/usr/lib32", directory=True) else "/usr/lib"
    return ContainerFacts(
        owner=owner,
        lib_dir=lib_dir,
        lib32_dir=lib32_dir,
        proc_mountpoint=next((p for p in (PROC_NVIDIA, posixpath.dirname(PROC_NVIDIA))
                              if _exists(root_fd, p, directory=True)), None),
        compat_libs=_compat_libs(root_fd),
    )


def read_image_preload(root_fd: int, rootfs: str) -> str:
    """The image's /etc/ld.so.preload ("" if none), resolved inside the rootfs at ``root_fd`` (a
    symlink there must not make us read a host file) and opened O_PATH first: a FIFO or device node
    there is refused without ever being opened (no blocking, no driver open outside the container's
    device cgroup)."""
    from nvc.system import untrusted
    from nvc.apply import rootfs as inroot
    from nvc.containerenv.sharing import PRELOAD

    try:
        path_fd = inroot.open_in_root(root_fd, PRELOAD, os.O_PATH)
    except OSError as err:
        if err.errno == errno.ENOENT:
            return ""
        raise ContainerError(f"cannot read {PRELOAD} in {rootfs}: {err.strerror}") from None
    try:
        data = untrusted.read_checked(path_fd, max_size=_MAX_PRELOAD)
    except untrusted.UnexpectedFile as err:
        raise ContainerError(f"{PRELOAD} in {rootfs} {err}") from None
    finally:
        os.close(path_fd)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ContainerError(f"{PRELOAD} in {rootfs} is not text") from None


def share_files(sharing: ShareRequest, container_id: str, root_fd: int, rootfs: str, *, bundle: str = "",
                library: str = shareplan.HOST_LIBRARY, state_dir: str = shareplan.STATE_DIR,
                sched_dir: str | None = None) -> shareplan.ShareFiles:
    """GPU sharing's host files (:func:`nvc.plan.share.files`), planned from what the host and the
    image have (the shim ``library``, the image's ld.so.preload), not made: a refused request (no
    shim installed, an id that cannot name a directory) changes nothing."""
    if not os.path.isfile(library):
        raise ContainerError(f"GPU sharing requested but the shim {library} is not installed")
    return shareplan.files(sharing, container_id, read_image_preload(root_fd, rootfs), library=library,
                           state_dir=state_dir, sched_dir=sched_dir, bundle=bundle)


def container_owner(handle: ContainerHandle | None, root_fd: int) -> tuple[int, int]:
    """Who owns the container: its process (or, standalone, its rootfs); with a user namespace of its
    own, that namespace's root (the host ids of uid and gid 0 inside), whatever user the process is."""
    if handle is not None:
        maps = handle.id_maps()
        root = None if maps is None else maps.root()
        return handle.owner if root is None else root
    st = os.fstat(root_fd)
    return st.st_uid, st.st_gid


# ---- host facts ------------------------------------------------------------------------------


def _read_proc_files(proc: Path) -> dict[str, str]:
    files = {}
    for name in ("params", "version", "registry"):
        try:
            files[name] = (proc / "driver/nvidia" / name).read_text()
        except FileNotFoundError:
            continue
        except OSError as err:
            raise ContainerError(f"{proc / 'driver/nvidia' / name}: {err.strerror}") from None
    return files


def _proc_gpu_dirs(proc: Path) -> dict[str, str]:
    gpus = proc / "driver/nvidia/gpus"
    found = {}
    for name in sorted(procfs.subdirs(gpus)):
        bus_id = procfs.normalize_bus_id(name)
        if bus_id is not None:
            found[bus_id] = str(gpus / name)
    return found


def _needs_nvml(req: Request, proc: Path) -> bool:
    props = {f.name for r in req.requirements for term in r.terms for f in term}
    return bool(props & _NVML_PROPERTIES) or selection.needs_nvml(req.selectors, req.mig_config or req.mig_monitor,
                                                                  proc)


def _check_requirements(req: Request, inv: Inventory, chosen: selection.Selection) -> None:
    """Each requirement, per selected GPU (a MIG device's parent is one), or once with no GPU."""
    if not req.requirements:
        return
    cuda = None if inv.cuda_version is None else f"{inv.cuda_version // 1000}.{(inv.cuda_version % 100) // 10}"
    base = {"cuda": cuda, "driver": inv.driver_version}
    per_gpu = [
        {**base, "arch": getattr(g, "architecture", None), "brand": getattr(g, "brand", None)} for g in chosen.gpus
    ]
    requirements.check(req.requirements, per_gpu or [base])


def _read_container(req: Request, handle: ContainerHandle | None) -> tuple[ContainerFacts, shareplan.ShareFiles | None]:
    """The container's facts, and its sharing files planned, read inside its rootfs."""
    from nvc.apply import container

    root_fd = container.open_rootfs(req.rootfs, handle)
    try:
        cfacts = container_facts(root_fd, container_owner(handle, root_fd))
        share = None if req.sharing is None else share_files(req.sharing, req.container_id, root_fd, req.rootfs,
                                                              bundle=req.bundle)
    finally:
        os.close(root_fd)
    return cfacts, share


def plan(glob: GlobalOptions, req: Request, proc: Path = procfs.PROC, handle: ContainerHandle | None = None) -> Plan:
    """Everything ``configure`` would do, without changing anything. ``handle``: the container's
    process (:mod:`nvc.apply.container`), resolved here from the request's pid where not given."""
    from nvc.apply.container import ContainerHandle
    from nvc.discover import driver, inventory, kmods, nodes, rootpath
    from nvc.plan import mountplan
    from nvc.rpc import driver_service

    start = time.perf_counter()
    req = check(req)
    if handle is None and req.pid is not None:
        with ContainerHandle.open(req.pid) as handle:
            cfacts, share = _read_container(req, handle)
    else:
        cfacts, share = _read_container(req, handle)
    if cfacts.proc_mountpoint is None:
        log.debug("%s has no /proc/driver (procfs not mounted yet?): the driver's /proc files stay unmasked",
                  req.rootfs)
    inv = driver_service.inventory(glob.root, glob.user, proc) if _needs_nvml(req, proc) else inventory.from_procfs(proc)
    chosen = selection.select(inv.gpus, req.selectors)
    _check_requirements(req, inv, chosen)
    prefixes = capabilities.library_prefixes(req.capabilities)
    files = driver.discover(glob.root, inv.driver_version, glob.ldcache, prefixes=prefixes)
    majors = nodes.read_majors()
    # The whole mig-minors table (thousands of lines) serves only --mig-config/--mig-monitor: a MIG
    # device's own caps minors come with it from the inventory.
    whole_mig = req.mig_config or req.mig_monitor
    mig_minors = procfs.read_mig_minors(proc) if whole_mig else {}
    # --load-kmods: the nodes the driver provides but the root lacks are made first (Plan.host_nodes)
    to_make = kmods.missing(glob.root, proc) if glob.load_kmods else ()
    found = {}
    for spec in mountplan.needed_nodes(chosen, majors, mig_minors, req):
        node = nodes.find(glob.root, spec)
        if node is not None:
            found[spec.path] = node.path
        elif any(made[:3] == spec[:3] for made in to_make):
            found[spec.path] = rootpath.host_path(glob.root, spec.path)
    host = HostFacts(
        root=glob.root,
        files=files,
        majors=majors,
        nodes=found,
        proc_files=_read_proc_files(proc),
        proc_gpu_dirs=_proc_gpu_dirs(proc),
        mig_minors=mig_minors,
        caps_dir=str(procfs.caps_dir(proc)),
        missing_nodes=to_make,
    )
    result = mountplan.build(host, cfacts, chosen, req, share)
    log.debug("timing discovery+plan %.2f ms: %d operations", (time.perf_counter() - start) * 1e3, len(result.operations))
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
    """Plan, then (unless ``dry_run``) apply; return the plan. Raises NvcError subclasses.

    On failure nothing stays mounted or created in the container.
    """
    scrub_environment()
    if dry_run:
        return plan(glob, req)
    from nvc.apply.container import resolve
    from nvc.rpc import container_service

    req = check(req)
    # Forked before planning: the container helper's fork and confinement overlap the plan. The
    # container's process resolved once, for the plan and every step that applies it.
    with container_service.open_container(wait=False) as container, resolve(req.pid) as handle:
        the_plan = plan(glob, req, handle=handle)
        container_service.apply(the_plan, container, handle)
    return the_plan
