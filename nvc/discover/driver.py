"""Find the driver's user-space files inside the driver root.

Libraries come from the root's ld cache (§ ld.so.cache in the reference), binaries from
a fixed PATH, GSP firmware from the kernel's firmware search path, IPC endpoints from
their well-known locations. Every lookup is resolved inside the root (see
:mod:`nvc.discover.rootpath`) and reported as a host path of the resolved file.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from nvc.discover import elf, ldcache, rootpath
from nvc.logger import Logger
from nvc.model import capabilities

log = Logger(__name__)

DEFAULT_LDCACHE = "/etc/ld.so.cache"

# Searched in this order, inside the root. The environment's PATH is not used: the
# result must not depend on who calls nvc-py (a hook runs with whatever PATH it got).
BINARY_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

FIRMWARE_CLASS_PATH = Path("/sys/module/firmware_class/parameters/path")

PERSISTENCED_SOCKET = "/var/run/nvidia-persistenced/socket"
FABRICMANAGER_SOCKET = "/var/run/nvidia-fabricmanager/socket"
MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"


class DriverFiles(NamedTuple):
    """The driver's files, as host paths, each list in listing order."""

    version: str
    libraries: tuple[str, ...]
    libraries32: tuple[str, ...]
    binaries: tuple[str, ...]
    firmwares: tuple[str, ...]
    persistenced_socket: str | None
    fabricmanager_socket: str | None
    mps_pipe_dir: str | None


def _passes(prefix: str, path: str, arch: str) -> bool:
    """The ELF checks the library at host path ``path`` must pass to be the driver's."""
    if not elf.matches(path, arch):
        return False
    if prefix == capabilities.TLS_PREFIX:
        links = elf.read_links(path)
        return links is not None and links.abi_tag == capabilities.TLS_ABI
    if capabilities.is_compat_gl(prefix):
        links = elf.read_links(path)
        return links is not None and links.needs_any(capabilities.GL_CORE_PREFIXES)
    return True


def select_libraries(
    root: str,
    entries: tuple[ldcache.CacheEntry, ...],
    arch: str,
    version: str,
    prefixes: tuple[str, ...] | None = None,
) -> tuple[str, ...]:
    """Inner paths of the driver libraries ``entries`` (one architecture) lead to.

    Per prefix the last passing cache entry wins; the result follows the prefix lists'
    order and holds each file once. ``prefixes``: only these (default: every driver library).
    """
    prefixes = capabilities.all_library_prefixes() if prefixes is None else prefixes
    chosen: dict[str, str] = {}
    for entry in entries:
        if not entry.key.startswith(prefixes):
            continue
        for prefix in (p for p in prefixes if entry.key.startswith(p)):
            inner = rootpath.resolve(root, entry.value)
            if inner is None or not os.path.basename(inner).endswith(version):
                continue
            if _passes(prefix, rootpath.host_path(root, inner), arch):
                chosen[prefix] = inner
            else:
                log.debug("%s (%s): rejected by the ELF checks for %s", entry.key, inner, arch)
    return tuple(dict.fromkeys(chosen[p] for p in prefixes if p in chosen))


def binary_dirs(library_dirs: tuple[str, ...]) -> tuple[str, ...]:
    """Directories searched for binaries: :data:`BINARY_PATH`, then ``bin`` next to each library dir.

    The second part finds self-contained driver trees such as ``/usr/local/nvidia/{lib64,bin}``,
    whose libraries the ld cache knows through ld.so.conf.d but whose binaries are on no
    standard PATH.
    """
    siblings = (os.path.join(os.path.dirname(d), "bin") for d in library_dirs)
    return tuple(dict.fromkeys((*BINARY_PATH, *siblings)))


def _is_driver_binary(root: str, inner: str) -> bool:
    """An executable ELF file. Hosts often put wrapper scripts on PATH that exec the real binary
    by a host path (e.g. ``/usr/bin/nvidia-smi`` → ``/usr/local/nvidia/bin/nvidia-smi``): such a
    script mounted alone fails in the container, so the search goes on to the binary itself."""
    path = rootpath.host_path(root, inner)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
        return False
    if elf.identity(path) is None:
        log.debug("%s: not an ELF executable (a wrapper script?), skipped", inner)
        return False
    return True


def find_binaries(root: str, dirs: tuple[str, ...]) -> tuple[str, ...]:
    """Inner paths of the driver binaries: for each name the first ELF executable found along ``dirs``."""
    found = []
    for name in capabilities.all_binaries():
        for d in dirs:
            inner = rootpath.resolve(root, f"{d}/{name}")
            if inner is not None and _is_driver_binary(root, inner):
                found.append(inner)
                break
    return tuple(dict.fromkeys(found))


def firmware_dirs(kernel_release: str, class_path: str) -> tuple[str, ...]:
    """The kernel's firmware search order (``class_path``: firmware_class.path, may be empty)."""
    dirs = [class_path] if class_path else []
    dirs += [
        f"/lib/firmware/updates/{kernel_release}",
        "/lib/firmware/updates",
        f"/lib/firmware/{kernel_release}",
        "/lib/firmware",
    ]
    return tuple(dirs)


def find_firmwares(root: str, version: str, dirs: tuple[str, ...]) -> tuple[str, ...]:
    """Inner paths of ``nvidia/<version>/gsp*.bin``; per file name the first directory wins, as for the kernel."""
    found: dict[str, str] = {}
    for d in dirs:
        fw_dir = rootpath.resolve(root, f"{d}/nvidia/{version}")
        if fw_dir is None or not os.path.isdir(rootpath.host_path(root, fw_dir)):
            continue
        for name in sorted(os.listdir(rootpath.host_path(root, fw_dir))):
            if name in found or not fnmatch.fnmatchcase(name, "gsp*.bin"):
                continue
            inner = rootpath.resolve(root, f"{fw_dir}/{name}")
            if inner is not None and stat.S_ISREG(os.stat(rootpath.host_path(root, inner)).st_mode):
                found[name] = inner
    return tuple(found.values())


def _find_of_type(root: str, path: str, is_type: Callable[[int], bool]) -> str | None:
    inner = rootpath.resolve(root, path)
    if inner is None or not is_type(os.stat(rootpath.host_path(root, inner)).st_mode):
        return None
    return rootpath.host_path(root, inner)


def read_firmware_class_path(path: Path = FIRMWARE_CLASS_PATH) -> str:
    """The kernel's extra firmware directory (empty when unset or not readable)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def discover(
    root: str,
    version: str,
    ldcache_path: str = DEFAULT_LDCACHE,
    machine: str | None = None,
    kernel_release: str | None = None,
    firmware_class_path: str | None = None,
    mps_pipe_dir: str | None = None,
    prefixes: tuple[str, ...] | None = None,
) -> DriverFiles:
    """All driver files of RM ``version`` under ``root``.

    ``ldcache_path`` is resolved inside the root. Defaults: the running machine's
    architecture and kernel release, the live firmware_class.path and
    ``$CUDA_MPS_PIPE_DIRECTORY`` (else /tmp/nvidia-mps). ``prefixes`` limits the libraries
    looked at (configure asks only for its capabilities' ones: checking the graphics
    libraries' ELF notes costs more than everything else discovery does).
    """
    uname = os.uname()
    native, compat = ldcache.native_arches(machine or uname.machine)
    cache_inner = rootpath.resolve(root, ldcache_path)
    cache_path = Path(rootpath.host_path(root, cache_inner if cache_inner else ldcache_path))
    entries = ldcache.read(cache_path)
    libs = select_libraries(root, ldcache.select(entries, native), native, version, prefixes)
    libs32 = select_libraries(root, ldcache.select(entries, compat), compat, version, prefixes) if compat else ()
    bins = find_binaries(root, binary_dirs(tuple(dict.fromkeys(os.path.dirname(p) for p in libs))))
    fw_class = read_firmware_class_path() if firmware_class_path is None else firmware_class_path
    fws = find_firmwares(root, version, firmware_dirs(kernel_release or uname.release, fw_class))
    mps = mps_pipe_dir or os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPE_DIRECTORY
    host = functools.partial(rootpath.host_path, root)
    files = DriverFiles(
        version=version,
        libraries=tuple(map(host, libs)),
        libraries32=tuple(map(host, libs32)),
        binaries=tuple(map(host, bins)),
        firmwares=tuple(map(host, fws)),
        persistenced_socket=_find_of_type(root, PERSISTENCED_SOCKET, stat.S_ISSOCK),
        fabricmanager_socket=_find_of_type(root, FABRICMANAGER_SOCKET, stat.S_ISSOCK),
        mps_pipe_dir=_find_of_type(root, mps, stat.S_ISDIR),
    )
    log.debug(
        "driver %s under %s: %d libraries, %d 32-bit, %d binaries, %d firmwares",
        version,
        root,
        len(files.libraries),
        len(files.libraries32),
        len(files.binaries),
        len(files.firmwares),
    )
    return files
