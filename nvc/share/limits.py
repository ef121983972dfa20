"""GPU sharing requests: from a container's env to the files the sharing shim reads.

A container asks for a memory budget and a compute share through its env (``NVC_SHARE_*`` or
HAMi's ``CUDA_DEVICE_*`` names, for drop-in compatibility). The hook turns that into a
per-container host directory holding a read-only limits file (the only authority the shim
trusts in a container, so the workload cannot raise its own limits through its env) and the
shared region, plus a generated ``/etc/ld.so.preload``. ``plan`` decides them (a step of the
container's plan, which ``configure --dry-run`` prints), ``make`` makes them when the plan is
applied, ``mounts`` says where the container gets them.
The part the container can write is a small tmpfs of fixed size mounted for it alone, so a
workload cannot fill the host's /run; root's tools treat everything in it as hostile.
The grammar is the shim's (native/config.c), checked here first so junk stops the container
from starting instead of leaving it unlimited.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from nvc.errors import ContainerError, InputError, MountError, shown
from nvc.plan.request import HostMount, ShareRequest

if TYPE_CHECKING:
    from nvc.plan.mountplan import ShareFiles

# Where the shim looks inside a container (native/nvc_share.h NVC_FIXED_DIR) and its files.
CONTAINER_DIR = "/var/run/nvc-share"
CONTAINER_LIBRARY = "/usr/lib/nvc-share/libnvc-share.so"
PRELOAD = "/etc/ld.so.preload"
# Host side: the installed shim and the per-container directories (`share status` reads them).
HOST_LIBRARY = "/usr/lib/nvc-py/libnvc-share.so"
STATE_DIR = "/run/nvc-py/share"
# Weighted scheduling between containers (native/sched.c): every scheduled container's file lives in
# one small tmpfs, ``gpu-sched`` beside the state dir (/run/nvc-py/gpu-sched); a container sees its own file read-write, all of them
# read-only (so it writes its own entry only, and reads the others').
CONTAINER_SCHED = "/var/run/nvc-share-sched"
CONTAINER_PEERS = "/var/run/nvc-share-peers"
SCHED_FILE_SIZE = 4096
_SCHED_TENANTS = 1024
# Beside them, root's record of what each container was granted: ``.granted/<container-id>``, the compute
# lines of its limits file (0444; no container id starts with '.', so no name clash). Another container's
# shim takes its weight from there, never from the file the container writes itself.
GRANTED_DIR = ".granted"
_GRANTED_MAX = 8192       # native/sched.c GRANTED_MAX
_GRANTED_KEYS = ("version=", "compute_percent", "compute_weight")

LIMITS_VERSION = 1
_MAX_PRELOAD = 64 * 1024
_TMPFS_INODES = 3         # the shared tmpfs's root directory, limits and region
_MAX_STACKED = 8          # mounts on a container's shared directory that remove() detaches

_SIZE = re.compile(r"([0-9]{1,20})(?:([kKmMgGtT])(i?))?")  # int() takes 4300 digits at most
_SHIFT = {"k": 10, "m": 20, "g": 30, "t": 40}
# (env prefix, limits-file key, HAMi semantics). HAMi's names come first so that NVC_SHARE_* win
# at the same scope, as in the shim; a per-device value beats a global one whatever its name.
_NAMES = (
    ("CUDA_DEVICE_MEMORY_LIMIT", "memory_limit", True),
    ("CUDA_DEVICE_SM_LIMIT", "compute_percent", True),
    ("NVC_SHARE_MEMORY_LIMIT", "memory_limit", False),
    ("NVC_SHARE_COMPUTE", "compute_percent", False),
    ("NVC_SHARE_WEIGHT", "compute_weight", False),
)
_MAX_WEIGHT = 1000
# A variable's device: ``_<NVML index>`` as the container numbers its GPUs, or ``_<UUID>`` of a GPU or
# MIG device (what the device plugin writes: it holds whatever index the container gives the device).
_SCOPE = re.compile(r"_([0-9]{1,3}|(?:GPU|MIG)-[0-9A-Fa-f-]{1,36})")


def parse_size(name: str, text: str) -> int:
    """Bytes from decimal digits with an optional K/M/G/T or Ki/Mi/Gi/Ti (all powers of 1024)."""
    match = _SIZE.fullmatch(text)
    value = 0
    if match:
        unit = (match.group(2) or "").lower()
        value = int(match.group(1)) << _SHIFT.get(unit, 0)
    if not match or value == 0 or value >= 1 << 64:
        raise InputError(f"{name}={shown(text)}: not a size (positive decimal bytes, optionally with K, M, G, T, "
                         f"Ki, Mi, Gi or Ti)")
    return value


def parse_percent(name: str, text: str, hami: bool) -> int:
    """A compute share 1..100; HAMi's CUDA_DEVICE_SM_LIMIT=0 means unlimited (100). The digits are
    read through untrusted.decimal (int() takes no more than 4300)."""
    from nvc.untrusted import decimal

    value = decimal(text)
    if value == 0 and hami:
        value = 100
    if value is None or not 1 <= value <= 100:
        raise InputError(f"{name}={shown(text)}: not a percentage (an integer from 1 to 100)")
    return value


def parse_weight(name: str, text: str) -> int:
    """A scheduling weight, 1..1000 (its digits read as parse_percent reads them)."""
    from nvc.untrusted import decimal

    value = decimal(text)
    if value is None or not 1 <= value <= _MAX_WEIGHT:
        raise InputError(f"{name}={shown(text)}: not a weight (an integer from 1 to {_MAX_WEIGHT})")
    return value


def _parse_value(name: str, key: str, text: str, hami: bool) -> int:
    if key == "memory_limit":
        return parse_size(name, text)
    if key == "compute_weight":
        return parse_weight(name, text)
    return parse_percent(name, text, hami)


def _scope_key(text: str) -> str:
    """A scope as the limits file names it: an index without leading zeros, a UUID as given."""
    return str(int(text)) if text.isdigit() else text


def parse_share_env(env: Mapping[str, str]) -> ShareRequest | None:
    """The sharing request in a container's env; None when it asks for no sharing."""
    found: dict[str, dict[str, int]] = {"memory_limit": {}, "compute_percent": {}, "compute_weight": {}}
    asked = False
    for prefix, key, hami in _NAMES:
        for name in sorted(env):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix):]
            scope = _SCOPE.fullmatch(rest)
            if rest and not scope:
                if hami:
                    continue             # another HAMi variable sharing the prefix
                raise InputError(f"{name}: unknown sharing variable (want {prefix}, {prefix}_<index> or "
                                 f"{prefix}_<GPU- or MIG- UUID>)")
            parsed = _parse_value(name, key, env[name], hami)
            found[key][_scope_key(scope.group(1)) if scope else ""] = parsed
            asked = True
    if not asked:
        return None
    return ShareRequest(memory=tuple(sorted(found["memory_limit"].items())),
                        compute=tuple(sorted(found["compute_percent"].items())),
                        weight=tuple(sorted(found["compute_weight"].items())))


def with_defaults(request: ShareRequest | None, memory: str | None, compute: int | None) -> ShareRequest:
    """With sharing enabled on the host (config file ``sharing``), every GPU container gets the shim:
    its own request, with the host's defaults where it set no value for every device."""
    request = request or ShareRequest()
    memory_rules, compute_rules = dict(request.memory), dict(request.compute)
    if memory is not None:
        memory_rules.setdefault("", parse_size("sharing.device-memory-limit", memory))
    if compute is not None:
        compute_rules.setdefault("", parse_percent("sharing.device-sm-limit", str(compute), False))
    return ShareRequest(memory=tuple(sorted(memory_rules.items())), compute=tuple(sorted(compute_rules.items())),
                        weight=request.weight)


def limits_text(request: ShareRequest, origin: str = "") -> str:
    """The limits file (native/README.md, version 1), sizes in bytes."""
    lines = [f"# written by nvc-py{' for ' + origin if origin else ''}; read-only in the container",
             f"version={LIMITS_VERSION}"]
    for key, values in (("memory_limit", request.memory), ("compute_percent", request.compute),
                        ("compute_weight", request.weight)):
        lines += [f"{key}{'.' + scope if scope else ''}={value}" for scope, value in values]
    return "\n".join(lines) + "\n"


def _write_new(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """A new file with exactly this mode (umask ignored); an existing one is an error."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)


def tmpfs_options(limits_size: int, page_size: int) -> tuple[tuple[str, str], ...]:
    """The shared tmpfs's size and inode count: exactly the limits file and the region (preallocated),
    so once filled it has no room left for anything a container process would write."""
    from nvc.share.region import SIZE

    pages = -(-SIZE // page_size) + max(1, -(-limits_size // page_size))
    return (("size", str(pages * page_size)), ("nr_inodes", str(_TMPFS_INODES)), ("huge", "never"))


def write_share_files(dir_fd: int, limits: bytes) -> None:
    """The shim's two files in the directory open on ``dir_fd``: limits (0444) and the region (0666,
    so a non-root workload can open it) at its final size, its blocks allocated now: the shim never
    grows it (native/README.md), and a full tmpfs cannot fail its first writes."""
    from nvc.share.region import SIZE

    _write_new(dir_fd, "limits", limits, 0o444)
    fd = os.open("region", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o666)
        os.posix_fallocate(fd, 0, SIZE)
    finally:
        os.close(fd)


def write_share_dir(path: Path, request: ShareRequest, origin: str = "") -> Path:
    """A plain ``path/shared`` directory with the shim's files, for plain LD_PRELOAD use through
    NVC_SHARE_DIR (bench/share, the GPU tests); containers get ``prepare``'s tmpfs. Returns it."""
    shared = path / "shared"
    os.mkdir(shared, 0o755)
    os.chmod(shared, 0o755)
    fd = os.open(shared, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        write_share_files(fd, limits_text(request, origin).encode())
    finally:
        os.close(fd)
    return shared


def scheduled(request: ShareRequest) -> bool:
    """Whether the container takes part in the GPU-time scheduler: a weight or a cap below 100 %."""
    return bool(request.weight) or any(value < 100 for _, value in request.compute)


def sched_dir_for(state_dir: str) -> str:
    return os.path.join(os.path.dirname(state_dir.rstrip("/")), "gpu-sched")


def _open_sched_dir(sched_dir: str) -> int:
    """An O_PATH fd of the scheduler tmpfs, mounted (once, under a lock: hooks run concurrently) on
    first use: ``_SCHED_TENANTS`` files of ``SCHED_FILE_SIZE`` and their granted limits, and no more,
    so a container growing its own file fills that tmpfs, never the host's /run."""
    import fcntl

    from nvc.apply import fdmount
    from nvc.syscalls import MountAttr

    parent, name = os.path.split(sched_dir.rstrip("/"))
    lock_fd = _make_dir(sched_dir, 0o755, os.O_RDONLY, "scheduler directory")
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        parent_fd = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_dev == os.fstat(parent_fd).st_dev:
                size = _SCHED_TENANTS * (SCHED_FILE_SIZE + _GRANTED_MAX)
                inodes = 2 * _SCHED_TENANTS + 2            # the files, the root and GRANTED_DIR
                fdmount.mount_tmpfs(parent_fd, name, MountAttr.NOSUID | MountAttr.NODEV | MountAttr.NOEXEC,
                                    dest_path=sched_dir, mode=0o755,
                                    options=(("size", str(size)), ("nr_inodes", str(inodes)),
                                             ("huge", "never"))).close()
            fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        finally:
            os.close(parent_fd)
    finally:
        os.close(lock_fd)
    return _ours(fd, "scheduler directory", sched_dir)


def _ours(fd: int, what: str, path: str) -> int:
    """fd, once the directory it names is root's and not writable by others (else closed, refused)."""
    from nvc.untrusted import directory_problem

    problem = directory_problem(fd, 0o022)
    if problem:
        os.close(fd)
        raise ContainerError(f"{what} {path} must be ours and not writable by others ({problem})")
    return fd


def granted_text(limits: str) -> str:
    """What other containers' shims trust about a container: its limits file's compute lines (the
    shim parses them with the limits grammar; the rest is none of their business)."""
    return "".join(f"{line}\n" for line in limits.splitlines() if line.startswith(_GRANTED_KEYS))


def _write_sched_file(sched_dir: str, container_id: str, limits: str) -> None:
    """The container's scheduler file (0666: the workload may be any uid; only its own bind mount of
    it is writable), allocated now so the shim's writes never need a block; before it, its granted
    limits (``GRANTED_DIR``, root's, 0444), so that a shim that finds the file finds them too."""
    granted = granted_text(limits).encode()
    if len(granted) > _GRANTED_MAX:
        raise ContainerError(f"the compute limits of container {container_id} exceed {_GRANTED_MAX} bytes")
    fd = _open_sched_dir(sched_dir)
    try:
        try:
            os.mkdir(GRANTED_DIR, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
        try:
            granted_fd = os.open(GRANTED_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except OSError as err:
            raise ContainerError(f"cannot use {sched_dir}/{GRANTED_DIR}: {err.strerror}") from None
        try:
            os.fchmod(granted_fd, 0o755)
            _write_new(granted_fd, container_id, granted, 0o444)
        except FileExistsError:
            raise ContainerError(f"{sched_dir}/{GRANTED_DIR}/{container_id} already exists") from None
        except OSError as err:
            raise ContainerError(f"cannot write {sched_dir}/{GRANTED_DIR}/{container_id}: {err.strerror}") from None
        finally:
            os.close(granted_fd)
        try:
            file_fd = os.open(container_id, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                              0o666, dir_fd=fd)
        except FileExistsError:
            raise ContainerError(f"scheduler file {sched_dir}/{container_id} already exists") from None
        try:
            os.fchmod(file_fd, 0o666)
            os.posix_fallocate(file_fd, 0, SCHED_FILE_SIZE)
        except OSError as err:
            raise ContainerError(f"cannot make scheduler file {sched_dir}/{container_id}: {err.strerror}") from None
        finally:
            os.close(file_fd)
    finally:
        os.close(fd)


def preload_text(image_preload: str, library: str = CONTAINER_LIBRARY) -> str:
    """The container's /etc/ld.so.preload: the shim first (its dlsym must come before any other
    preloaded library's), then the image's own entries, kept as they were."""
    rest = image_preload if not image_preload or image_preload.endswith("\n") else image_preload + "\n"
    return f"{library}\n{rest}"


def read_image_preload(rootfs: str) -> str:
    """The image's /etc/ld.so.preload ("" if none), resolved inside the rootfs (a symlink there must
    not make us read a host file) and opened O_PATH first: a FIFO or device node there is refused
    without ever being opened (no blocking, no driver open outside the container's device cgroup)."""
    from nvc.apply import rootfs as inroot
    from nvc import untrusted

    root_fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        path_fd = inroot.open_in_root(root_fd, PRELOAD, os.O_PATH)
    except OSError as err:
        if err.errno == errno.ENOENT:
            return ""
        raise ContainerError(f"cannot read {PRELOAD} in {rootfs}: {err.strerror}") from None
    finally:
        os.close(root_fd)
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


def container_dir(container_id: str, state_dir: str = STATE_DIR) -> Path:
    """The host directory of one container (its id must be a plain name)."""
    if not container_id or "/" in container_id or container_id in (".", ".."):
        raise InputError(f"container id {container_id!r} cannot name a directory")
    return Path(state_dir) / container_id


def _open_state_dir(state_dir: str) -> int:
    """An O_PATH fd of the state directory, made (0700, parents too) if missing. Every container's
    limits live below it, so it must be a directory of ours that no one else can write, and not a
    symlink to someone else's."""
    old = os.umask(0o077)
    try:
        fd = _make_dir(state_dir, 0o700, os.O_PATH, "sharing directory")
    finally:
        os.umask(old)
    return _ours(fd, "sharing directory", state_dir)


def _make_dir(path: str, mode: int, flags: int, what: str) -> int:
    """An fd (``flags``) of directory ``path``, made with ``mode`` (parents too) if missing; no symlink."""
    try:
        os.makedirs(path, mode, exist_ok=True)
        return os.open(path, flags | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise ContainerError(f"cannot use {what} {path}: {err.strerror}") from None


def plan(request: ShareRequest, container_id: str, rootfs: str, *, library: str = HOST_LIBRARY,
         state_dir: str = STATE_DIR, sched_dir: str | None = None, bundle: str = "") -> ShareFiles:
    """The host files of one container, decided (the image's ld.so.preload read inside its rootfs),
    not made: a refused request (no shim installed, an id that cannot name a directory) changes nothing."""
    from nvc.plan.mountplan import ShareFiles

    if not os.path.isfile(library):
        raise ContainerError(f"GPU sharing requested but the shim {library} is not installed")
    image_preload = read_image_preload(rootfs)
    container_dir(container_id, state_dir)
    return ShareFiles(container_id=container_id, state_dir=state_dir, sched_dir=sched_dir or sched_dir_for(state_dir),
                      library=library, limits=limits_text(request, origin=f"container {container_id}"),
                      preload=preload_text(image_preload), scheduled=scheduled(request), bundle=bundle)


def make(files: ShareFiles, pid: int | None = None) -> None:
    """Make what :func:`plan` decided, in the mount namespace the hook runs in (the host's, where the
    runtime runs hooks): the record of the container they belong to (its bundle and init process
    ``pid``: :mod:`nvc.share.owner`), a tmpfs of fixed size (``tmpfs_options``: the limits file and the
    preallocated region, nothing more) on ``<state_dir>/<id>/shared``, filled, so what the container
    may write is that tmpfs, never the host's /run; a scheduled container's file in ``sched_dir``
    (``_open_sched_dir``). On failure at any step, what was made is unmounted and removed again
    (``remove``): nothing is left on the host. A directory that exists already (a stale container's)
    is refused and left alone; a host file that cannot be made (/run full) is one ContainerError."""
    from nvc.share import owner

    record = owner.encode(owner.of_container(pid, files.bundle))
    path = container_dir(files.container_id, files.state_dir)
    state_fd = _open_state_dir(files.state_dir)
    try:
        try:
            os.mkdir(files.container_id, 0o755, dir_fd=state_fd)
        except FileExistsError:
            raise ContainerError(f"sharing directory {path} already exists (stale container {files.container_id}?)") \
                from None
        except OSError as err:
            raise _cannot_make(files, err) from None
        try:
            _fill(state_fd, path, record, files.limits.encode(), files.preload.encode())
            if files.scheduled:
                _write_sched_file(files.sched_dir, files.container_id, files.limits)
        except BaseException as err:
            remove(files.container_id, files.state_dir, files.sched_dir)
            if isinstance(err, OSError):
                raise _cannot_make(files, err) from None
            raise
    finally:
        os.close(state_fd)


def _cannot_make(files: ShareFiles, err: OSError) -> ContainerError:
    return ContainerError(f"cannot make the sharing files of container {files.container_id} in {files.state_dir}: "
                          f"{err.strerror}")


def mounts(files: ShareFiles) -> tuple[HostMount, ...]:
    """Where the container gets the files :func:`make` makes (its extra mounts)."""
    path = container_dir(files.container_id, files.state_dir)
    shared = path / "shared"
    found = (
        HostMount(source=files.library, target=CONTAINER_LIBRARY, readonly=True),
        HostMount(source=str(shared), target=CONTAINER_DIR, readonly=False, directory=True),
        HostMount(source=str(shared / "limits"), target=f"{CONTAINER_DIR}/limits", readonly=True),
        HostMount(source=str(path / "ld.so.preload"), target=PRELOAD, readonly=True),
    )
    if not files.scheduled:
        return found
    return (*found, HostMount(source=files.sched_dir, target=CONTAINER_PEERS, readonly=True, directory=True),
            HostMount(source=f"{files.sched_dir}/{files.container_id}", target=CONTAINER_SCHED, readonly=False))


def _fill(state_fd: int, path: Path, owner: bytes, limits: bytes, preload: bytes) -> None:
    """The new container directory: its owner record first (never mounted into the container), the
    shared tmpfs with its files, and ld.so.preload beside it (outside the tmpfs: the container sees
    it only as a read-only bind)."""
    from nvc.apply import fdmount
    from nvc.share.owner import FILE as OWNER_FILE
    from nvc.syscalls import MountAttr

    dir_fd = os.open(path.name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=state_fd)
    try:
        _write_new(dir_fd, OWNER_FILE, owner, 0o444)
        os.mkdir("shared", 0o755, dir_fd=dir_fd)
        mount = fdmount.mount_tmpfs(dir_fd, "shared", MountAttr.NOSUID | MountAttr.NODEV | MountAttr.NOEXEC,
                                    dest_path=str(path / "shared"), mode=0o755,
                                    options=tmpfs_options(len(limits), os.sysconf("SC_PAGE_SIZE")))
        try:
            write_share_files(mount.fd, limits)
        finally:
            mount.close()
        _write_new(dir_fd, "ld.so.preload", preload, 0o444)
    finally:
        os.close(dir_fd)


def remove(container_id: str, state_dir: str = STATE_DIR, sched_dir: str | None = None) -> None:
    """Unmount a container's shared tmpfs and drop its directory and scheduler file; missing ones are fine.

    Nothing the container planted is followed or even walked: the tmpfs is detached (MNT_DETACH)
    before anything is removed, and the rest of the directory, the hook's own, is removed relative
    to directory fds without following symlinks. Best effort (the teardown must not fail): a tmpfs
    that cannot be unmounted is left in place, directory and all, rather than walked.
    """
    import shutil  # here: prestart imports this module at every container start, poststop removes

    container_dir(container_id, state_dir)
    try:
        sched_fd = os.open(sched_dir or sched_dir_for(state_dir), os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW |
                           os.O_CLOEXEC)
    except OSError:
        pass
    else:
        try:
            for name in (container_id, f"{GRANTED_DIR}/{container_id}"):
                try:
                    os.unlink(name, dir_fd=sched_fd)
                except OSError:
                    pass              # none (not scheduled) or gone already
        finally:
            os.close(sched_fd)
    try:
        state_fd = os.open(state_dir, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if _unmount_shared(state_fd, container_id, str(Path(state_dir) / container_id / "shared")):
            shutil.rmtree(container_id, ignore_errors=True, dir_fd=state_fd)
    finally:
        os.close(state_fd)


def remove_stopped(container_id: str, bundle: str, state_dir: str = STATE_DIR) -> None:
    """poststop: :func:`remove` the directory of ``container_id`` only when it is the stopped
    container's (``bundle``: its state's, "" when none): by the owner record prestart wrote, its
    process gone and its bundle the same. A directory without a record (made before records were)
    is removed by id, as it was then."""
    from nvc.share import owner

    container_dir(container_id, state_dir)
    try:
        dir_fd = os.open(os.path.join(state_dir, container_id), os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW |
                         os.O_CLOEXEC)
    except OSError:
        record = None
    else:
        try:
            record = owner.read(dir_fd)
        finally:
            os.close(dir_fd)
    if record is None or owner.stopped(record, bundle):
        remove(container_id, state_dir)


def _unmount_shared(state_fd: int, name: str, path: str) -> bool:
    """Detach whatever is mounted on ``<name>/shared`` (the tmpfs; mounts stacked there too); True
    when the container directory exists and nothing is mounted in it any more."""
    from nvc.apply import fdmount

    try:
        dir_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=state_fd)
    except OSError:
        return False
    try:
        own_dev = os.fstat(dir_fd).st_dev
        for _ in range(_MAX_STACKED):
            try:
                if os.stat("shared", dir_fd=dir_fd, follow_symlinks=False).st_dev == own_dev:
                    return True
                fd = os.open("shared", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except FileNotFoundError:
                return True
            fdmount.unmount(fdmount.Mount(fd, path))
    except (OSError, MountError):
        return False
    finally:
        os.close(dir_fd)
    return False
