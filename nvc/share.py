"""GPU sharing requests: from a container's env to the files the sharing shim reads.

A container asks for a memory budget and a compute share through its env (``NVC_SHARE_*`` or
HAMi's ``CUDA_DEVICE_*`` names, for drop-in compatibility). The hook turns that into a
per-container host directory holding a read-only limits file (the only authority the shim
trusts in a container, so the workload cannot raise its own limits through its env) and the
shared region, plus a generated ``/etc/ld.so.preload``; ``share_mounts`` says where they go.
The grammar is the shim's (native/config.c), checked here first so junk stops the container
from starting instead of leaving it unlimited.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nvc.errors import ContainerError, InputError, shown

# Where the shim looks inside a container (native/nvc_share.h NVC_FIXED_DIR) and its files.
CONTAINER_DIR = "/var/run/nvc-share"
CONTAINER_LIBRARY = "/usr/lib/nvc-share/libnvc-share.so"
PRELOAD = "/etc/ld.so.preload"
# Host side: the installed shim and the per-container directories (`share status` reads them).
HOST_LIBRARY = "/usr/lib/nvc-py/libnvc-share.so"
STATE_DIR = "/run/nvc-py/share"

LIMITS_VERSION = 1
_MAX_PRELOAD = 64 * 1024

_SIZE = re.compile(r"([0-9]{1,20})(?:([kKmMgGtT])(i?))?")  # int() takes 4300 digits at most
_SHIFT = {"k": 10, "m": 20, "g": 30, "t": 40}
# (env prefix, limits-file key, HAMi semantics). HAMi's names come first so that NVC_SHARE_* win
# at the same scope, as in the shim; a per-device value beats a global one whatever its name.
_NAMES = (
    ("CUDA_DEVICE_MEMORY_LIMIT", "memory_limit", True),
    ("CUDA_DEVICE_SM_LIMIT", "compute_percent", True),
    ("NVC_SHARE_MEMORY_LIMIT", "memory_limit", False),
    ("NVC_SHARE_COMPUTE", "compute_percent", False),
)
_SCOPE = re.compile(r"_([0-9]{1,3})")


@dataclass(frozen=True)
class ShareRequest:
    """What a container asked for. Scope "" means every device, else an NVML index (as the
    container numbers its GPUs). Sizes in bytes; percents 1..100 (100 = unthrottled)."""

    memory: tuple[tuple[str, int], ...] = ()
    compute: tuple[tuple[str, int], ...] = ()


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
    """A compute share 1..100; HAMi's CUDA_DEVICE_SM_LIMIT=0 means unlimited (100)."""
    value = int(text) if text.isascii() and text.isdigit() else -1
    if value == 0 and hami:
        value = 100
    if not 1 <= value <= 100:
        raise InputError(f"{name}={shown(text)}: not a percentage (an integer from 1 to 100)")
    return value


def parse_share_env(env: Mapping[str, str]) -> ShareRequest | None:
    """The sharing request in a container's env; None when it asks for no sharing."""
    found: dict[str, dict[str, int]] = {"memory_limit": {}, "compute_percent": {}}
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
                raise InputError(f"{name}: unknown sharing variable (want {prefix} or {prefix}_<index>)")
            value = env[name]
            parsed = parse_size(name, value) if key == "memory_limit" else parse_percent(name, value, hami)
            found[key][str(int(scope.group(1))) if scope else ""] = parsed
            asked = True
    if not asked:
        return None
    return ShareRequest(memory=tuple(sorted(found["memory_limit"].items())),
                        compute=tuple(sorted(found["compute_percent"].items())))


def with_defaults(request: ShareRequest | None, memory: str | None, compute: int | None) -> ShareRequest:
    """With sharing enabled on the host (config file ``sharing``), every GPU container gets the shim:
    its own request, with the host's defaults where it set no value for every device."""
    request = request or ShareRequest()
    memory_rules, compute_rules = dict(request.memory), dict(request.compute)
    if memory is not None:
        memory_rules.setdefault("", parse_size("sharing.device-memory-limit", memory))
    if compute is not None:
        compute_rules.setdefault("", parse_percent("sharing.device-sm-limit", str(compute), False))
    return ShareRequest(memory=tuple(sorted(memory_rules.items())), compute=tuple(sorted(compute_rules.items())))


def limits_text(request: ShareRequest, origin: str = "") -> str:
    """The limits file (native/README.md, version 1), sizes in bytes."""
    lines = [f"# written by nvc-py{' for ' + origin if origin else ''}; read-only in the container",
             f"version={LIMITS_VERSION}"]
    for key, values in (("memory_limit", request.memory), ("compute_percent", request.compute)):
        lines += [f"{key}{'.' + scope if scope else ''}={value}" for scope, value in values]
    return "\n".join(lines) + "\n"


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """A new file with exactly this mode (umask ignored); an existing one is an error."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)


def write_share_dir(path: Path, request: ShareRequest, origin: str = "") -> Path:
    """Fill the per-container directory: shared/limits (0444) and an empty shared/region (0666, so a
    non-root workload can open it; the shim initialises it). Returns the shared/ directory."""
    shared = path / "shared"
    os.mkdir(shared, 0o755)
    os.chmod(shared, 0o755)
    _write_new(shared / "limits", limits_text(request, origin).encode(), 0o444)
    _write_new(shared / "region", b"", 0o666)
    return shared


def preload_text(image_preload: str, library: str = CONTAINER_LIBRARY) -> str:
    """The container's /etc/ld.so.preload: the shim first (its dlsym must come before any other
    preloaded library's), then the image's own entries, kept as they were."""
    rest = image_preload if not image_preload or image_preload.endswith("\n") else image_preload + "\n"
    return f"{library}\n{rest}"


def read_image_preload(rootfs: str) -> str:
    """The image's /etc/ld.so.preload ("" if none), resolved inside the rootfs: a symlink there
    must not make us read a host file."""
    from nvc import rootfs as inroot

    root_fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = inroot.open_in_root(root_fd, PRELOAD, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as err:
        if err.errno == errno.ENOENT:
            return ""
        raise ContainerError(f"cannot read {PRELOAD} in {rootfs}: {err.strerror}") from None
    finally:
        os.close(root_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_PRELOAD:
            raise ContainerError(f"{PRELOAD} in {rootfs} is not a regular file under {_MAX_PRELOAD} bytes")
        data = os.read(fd, _MAX_PRELOAD + 1)
    finally:
        os.close(fd)
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ContainerError(f"{PRELOAD} in {rootfs} is not text") from None


def container_dir(container_id: str, state_dir: str = STATE_DIR) -> Path:
    """The host directory of one container (its id must be a plain name)."""
    if not container_id or "/" in container_id or container_id in (".", ".."):
        raise InputError(f"container id {container_id!r} cannot name a directory")
    return Path(state_dir) / container_id


def prepare(request: ShareRequest, container_id: str, rootfs: str, *, library: str = HOST_LIBRARY,
            state_dir: str = STATE_DIR) -> tuple:
    """Host-side preparation for one container; returns the HostMounts the hook passes to configure
    as extra_mounts. On failure nothing is left on the host."""
    from nvc.mountplan import HostMount

    if not os.path.isfile(library):
        raise ContainerError(f"GPU sharing requested but the shim {library} is not installed")
    image_preload = read_image_preload(rootfs)
    path = container_dir(container_id, state_dir)
    os.makedirs(path.parent, 0o755, exist_ok=True)
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        raise ContainerError(f"sharing directory {path} already exists (stale container {container_id}?)") from None
    try:
        shared = write_share_dir(path, request, origin=f"container {container_id}")
        _write_new(path / "ld.so.preload", preload_text(image_preload).encode(), 0o444)
    except BaseException:
        remove(container_id, state_dir)
        raise
    return (
        HostMount(source=library, target=CONTAINER_LIBRARY, readonly=True),
        HostMount(source=str(shared), target=CONTAINER_DIR, readonly=False, directory=True),
        HostMount(source=str(shared / "limits"), target=f"{CONTAINER_DIR}/limits", readonly=True),
        HostMount(source=str(path / "ld.so.preload"), target=PRELOAD, readonly=True),
    )


def remove(container_id: str, state_dir: str = STATE_DIR) -> None:
    """Drop a container's directory (its region goes with it); a missing one is fine."""
    import shutil  # here: prestart imports this module at every container start, poststop removes

    shutil.rmtree(container_dir(container_id, state_dir), ignore_errors=True)
