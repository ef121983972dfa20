"""Find the driver's user-space files inside the driver root.

Libraries come from the root's ld cache (§ ld.so.cache in the reference), binaries from
a fixed PATH, GSP firmware from the kernel's firmware search path, IPC endpoints from
their well-known locations, the files loaders read from fixed places (ICD json files, the VDPAU
and GBM backends, the X driver: ``capabilities.LOADER_FILES``) from theirs. Every file must be the
running driver's: one of another version is left out with a warning naming it, and a root whose
libraries are all of another version (Debian's alternatives pointing elsewhere) is an error. Every lookup is resolved inside the root (see
:mod:`nvc.discover.rootpath`) and reported as a host path of the resolved file.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import posixpath
import re
import stat
import time
from collections.abc import Callable

from nvc.discover import elf, ldcache, rootpath
from nvc.errors import DetectionError
from nvc.logger import Logger
from nvc.model import capabilities
from nvc.records import NamedTuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

log = Logger(__name__)

DEFAULT_LDCACHE = "/etc/ld.so.cache"

# Searched in this order, inside the root. The environment's PATH is not used: the
# result must not depend on who calls nvc-py (a hook runs with whatever PATH it got).
BINARY_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

FIRMWARE_CLASS_PATH = "/sys/module/firmware_class/parameters/path"

PERSISTENCED_SOCKET = "/var/run/nvidia-persistenced/socket"
FABRICMANAGER_SOCKET = "/var/run/nvidia-fabricmanager/socket"
MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"
ALTERNATIVES = "/etc/alternatives/"
MAX_MANIFEST = 64 * 1024  # bytes of a loader's json or icd file


class LoaderFound(NamedTuple):
    """A loader file found: its host path and where the container gets it (``{libdir}``: the
    image's library directory); ``host_target``: the same with the host's library directory (CDI
    keeps the host's layout); ``link``: a name in the target's directory to link to it."""

    source: str
    target: str
    host_target: str
    link: str | None = None


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
    loader_files: tuple[LoaderFound, ...] = ()


def _left_out(msg: str, *args: object) -> None:
    """A file left out, said at every call (a discovery that warns is never kept: nvc.discover.keptfiles)."""
    rootpath.warned()
    log.warning(msg, *args)


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


def _version_ok(prefix: str, inner: str, version: str) -> bool:
    return prefix in capabilities.UNVERSIONED_PREFIXES or os.path.basename(inner).endswith(version)


# A driver's version at the end of a file name (535.261.03, 470.256.02, 580.95): GLVND's and Mesa's
# libGL.so.1.7.0 are other libraries, no other driver's.
_DRIVER_VERSION_SUFFIX = re.compile(r"\.so\.[1-9][0-9]{2,}\.[0-9]+(\.[0-9]+)?$")


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
    A library found only as a dangling link or only in another version is left out with a
    warning naming it. A root whose alternatives all lead to another version (Debian's
    alternatives pointing at another driver), or whose libraries all do, is an error naming
    what was found: never a silent empty list.
    """
    prefixes = capabilities.all_library_prefixes() if prefixes is None else prefixes
    chosen: dict[str, str] = {}
    missed: dict[str, list[str]] = {}
    other_version: dict[bool, list[str]] = {False: [], True: []}  # by: through /etc/alternatives
    chosen_by_alternatives = False
    for entry in entries:
        if not entry.key.startswith(prefixes):
            continue
        for prefix in (p for p in prefixes if entry.key.startswith(p)):
            inner = rootpath.resolve(root, entry.value)
            if inner is None:
                missed.setdefault(prefix, []).append(f"{entry.value}: a dangling link")
                continue
            alternative = _through_alternatives(root, entry.value)
            if not _version_ok(prefix, inner, version):
                if _DRIVER_VERSION_SUFFIX.search(inner):
                    missed.setdefault(prefix, []).append(f"{entry.value} -> {inner}: not driver {version}")
                    other_version[alternative].append(f"{entry.value} -> {inner}")
                else:
                    log.debug("%s (%s): not a driver's library", entry.key, inner)
                continue
            if _passes(prefix, rootpath.host_path(root, inner), arch):
                chosen[prefix] = inner
                chosen_by_alternatives |= alternative and prefix not in capabilities.UNVERSIONED_PREFIXES
            else:
                log.debug("%s (%s): rejected by the ELF checks for %s", entry.key, inner, arch)
    wrong = other_version[True] if other_version[True] and not chosen_by_alternatives else []
    if not wrong and not chosen:
        wrong = other_version[True] + other_version[False]
    if wrong:
        found = sorted({posixpath.basename(w).partition(".so.")[2] for w in wrong})
        raise DetectionError(
            f"no library of driver {version} under {root} ({arch}): the ld cache's NVIDIA libraries"
            f"{' (through /etc/alternatives)' if other_version[True] else ''} lead to another version: "
            f"{len(wrong)} of version {', '.join(found)}, such as {wrong[0]}"
        )
    for prefix, why in missed.items():
        if prefix not in chosen:
            _left_out("left out %s (%s): %s", prefix, arch, "; ".join(dict.fromkeys(why)))
    return tuple(dict.fromkeys(chosen[p] for p in prefixes if p in chosen))


def _through_alternatives(root: str, path: str) -> bool:
    """Whether ``path`` (inside ``root``) is a link into /etc/alternatives, as Debian's packages make them."""
    try:
        return os.readlink(rootpath.host_path(root, path)).startswith(ALTERNATIVES)
    except OSError:
        return False


# A driver version as NVIDIA writes it into its binaries (535.171.04, 550.54.15, 580.159.04).
_DRIVER_VERSION = rb"(?<![0-9.])[1-9][0-9]{2}\.[0-9]{2,3}(?:\.[0-9]{2})?(?![0-9.])"


def other_version(path: str, version: str) -> str | None:
    """The other driver version the file at host path ``path`` was built for, None when it holds
    ``version`` or no driver version at all. NVIDIA's binaries and X modules carry their version
    string (their name does not say it); some (nvidia-debugdump, nvidia-cuda-mps-server) carry none
    and cannot be told apart, so they are taken as the running driver's."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data.find(version.encode()) >= 0:
                return None
            found = re.search(_DRIVER_VERSION, data)
            return found.group().decode() if found else None


def library_dirs(entries: tuple[ldcache.CacheEntry, ...], libraries: tuple[str, ...]) -> tuple[str, ...]:
    """Inner directories the driver's libraries are in: where the ld cache names them (Debian's
    /usr/lib/x86_64-linux-gnu, whose links lead on into nvidia/current) and where they are."""
    prefixes = capabilities.all_library_prefixes()
    named = (os.path.dirname(e.value) for e in entries if e.key.startswith(prefixes))
    return tuple(dict.fromkeys((*named, *(os.path.dirname(p) for p in libraries))))


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


def find_binaries(root: str, dirs: tuple[str, ...], version: str) -> tuple[str, ...]:
    """Inner paths of the driver binaries: for each name the first ELF executable of driver
    ``version`` found along ``dirs`` (one of another version is named in a warning)."""
    found, passed_over = [], set()
    for name in capabilities.all_binaries():
        for d in dirs:
            inner = rootpath.resolve(root, f"{d}/{name}")
            if inner is None or inner in passed_over or not _is_driver_binary(root, inner):
                continue
            other = other_version(rootpath.host_path(root, inner), version)
            if other is not None:
                _left_out("left out %s: of driver %s, not %s", rootpath.host_path(root, inner), other, version)
                passed_over.add(inner)
                continue
            found.append(inner)
            break
    return tuple(dict.fromkeys(found))


def _manifest_libraries(path: str, kind: str) -> list[str]:
    """The library names a loader manifest at host path ``path`` makes its loader open."""
    with open(path, "rb") as f:
        data = f.read(MAX_MANIFEST + 1)
    if len(data) > MAX_MANIFEST:
        raise ValueError(f"larger than {MAX_MANIFEST} bytes")
    if kind == "icd":
        return [data.decode().strip()]
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError("not a json object")
    layers = doc.get("layers")
    entries = [doc.get("ICD"), doc.get("layer"), *(layers if isinstance(layers, list) else [])]
    names = [e.get("library_path") for e in entries if isinstance(e, dict)]
    found = [n for n in names if isinstance(n, str)]
    if not found or len(found) != len(names):
        raise ValueError("no library_path")
    return found


def _manifest_problem(path: str, kind: str, libraries: tuple[str, ...]) -> str | None:
    """Why the manifest at ``path`` must be left out, None when each library it names is a bare
    name (the container's ld cache resolves it) of one of ``libraries`` (the driver's, found)."""
    try:
        names = _manifest_libraries(path, kind)
    except (OSError, ValueError) as err:  # json's errors are ValueErrors, undecodable text too
        return f"unreadable: {err}"
    have = [os.path.basename(lib) for lib in libraries]
    for name in names:
        if "/" in name:
            return f"library {name!r} is a path, not a library of the driver the container's ld cache finds"
        stem = name.split(".so", 1)[0] + ".so."
        if not name.startswith("lib") or not any(h.startswith(stem) for h in have):
            return f"library {name!r} is none of the driver's libraries found"
    return None


def _loader_file(
    root: str, spec: capabilities.LoaderFile, lib_dirs: tuple[str, ...], version: str, libraries: tuple[str, ...]
) -> LoaderFound | None:
    """Where ``spec`` is found under ``root``, checked to be the running driver's."""
    searched = [
        (p.replace(capabilities.LIBDIR, d), d)
        for p in spec.search
        for d in (lib_dirs if capabilities.LIBDIR in p else ("",))
    ]
    for path, lib_dir in dict.fromkeys(searched):
        inner = rootpath.resolve(root, path)
        if inner is None:
            continue
        host = rootpath.host_path(root, inner)
        if not stat.S_ISREG(os.stat(host).st_mode):
            _left_out("left out %s: not a regular file", host)
            return None
        problem = None
        if spec.kind in ("json", "icd"):
            problem = _manifest_problem(host, spec.kind, libraries)
        elif spec.kind == "library" and not os.path.basename(inner).endswith(version):
            problem = f"not driver {version}"
        elif spec.kind == "module" and (other := other_version(host, version)) is not None:
            problem = f"of driver {other}, not {version}"
        if problem is not None:
            _left_out("left out %s (%s): %s", rootpath.host_path(root, path), host, problem)
            return None
        name, searched_name = os.path.basename(inner), os.path.basename(path)
        target = spec.target + name if spec.target.endswith("/") else spec.target
        link = searched_name if spec.target.endswith("/") and searched_name != name else None
        return LoaderFound(host, target, target.replace(capabilities.LIBDIR, lib_dir), link)
    log.debug("no %s under %s", spec.target, root)
    return None


def find_loader_files(
    root: str,
    version: str,
    lib_dirs: tuple[str, ...],
    libraries: tuple[str, ...],
    specs: tuple[capabilities.LoaderFile, ...] = capabilities.LOADER_FILES,
) -> tuple[LoaderFound, ...]:
    """The loader files ``specs`` found under ``root`` (``lib_dirs``: inner library directories
    ``{libdir}`` stands for; ``libraries``: the driver libraries found, which json files must name)."""
    found = (_loader_file(root, spec, lib_dirs, version, libraries) for spec in specs)
    return tuple(f for f in found if f is not None)


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
        for name in sorted(rootpath.listdir(rootpath.host_path(root, fw_dir))):
            if name in found or not (name.startswith("gsp") and name.endswith(".bin")):  # gsp*.bin
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


def read_firmware_class_path(path: str | os.PathLike[str] = FIRMWARE_CLASS_PATH) -> str:
    """The kernel's extra firmware directory (empty when unset or not readable)."""
    try:
        with open(path) as file:
            return file.read().strip()
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
    loaders: tuple[capabilities.LoaderFile, ...] = capabilities.LOADER_FILES,
) -> DriverFiles:
    """All driver files of RM ``version`` under ``root``: as an earlier call found them while nothing
    they were found from has changed (:mod:`nvc.discover.keptfiles`), else found now.

    ``ldcache_path`` is resolved inside the root. Defaults: the running machine's
    architecture and kernel release, the live firmware_class.path and
    ``$CUDA_MPS_PIPE_DIRECTORY`` (else /tmp/nvidia-mps). ``prefixes`` limits the libraries
    looked at (configure asks only for its capabilities' ones: checking the graphics
    libraries' ELF notes costs more than everything else discovery does), ``loaders`` the loader
    files (configure: its capabilities' ones, whose json files name libraries of those prefixes).
    """
    from nvc.discover import keptfiles

    uname = os.uname()
    where = _Where(
        root,
        version,
        ldcache_path,
        machine or uname.machine,
        kernel_release or uname.release,
        read_firmware_class_path() if firmware_class_path is None else firmware_class_path,
        mps_pipe_dir or os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPE_DIRECTORY,
    )
    key = [*where, None if prefixes is None else list(prefixes), [list(spec) for spec in loaders]]
    slot = keptfiles.slot(key)
    files = _decoded(slot.load())
    if files is None:
        started = time.time_ns()
        with rootpath.recording() as lookups:
            files = _find(where, prefixes, loaders)
        slot.store(_encoded(files), lookups, started)
    log.debug(
        "driver %s under %s: %d libraries, %d 32-bit, %d binaries, %d firmwares, %d loader files",
        version,
        root,
        len(files.libraries),
        len(files.libraries32),
        len(files.binaries),
        len(files.firmwares),
        len(files.loader_files),
    )
    return files


class _Where(NamedTuple):
    """What discovery looks for and where, every default filled in."""

    root: str
    version: str
    ldcache_path: str
    machine: str
    kernel_release: str
    firmware_class_path: str
    mps_pipe_dir: str


def _find(where: _Where, prefixes: tuple[str, ...] | None, loaders: tuple[capabilities.LoaderFile, ...]) -> DriverFiles:
    root, version = where.root, where.version
    native, compat = ldcache.native_arches(where.machine)
    cache_inner = rootpath.resolve(root, where.ldcache_path)
    entries = ldcache.read(rootpath.host_path(root, cache_inner if cache_inner else where.ldcache_path))
    native_entries = ldcache.select(entries, native)
    libs = select_libraries(root, native_entries, native, version, prefixes)
    libs32 = select_libraries(root, ldcache.select(entries, compat), compat, version, prefixes) if compat else ()
    bins = find_binaries(root, binary_dirs(tuple(dict.fromkeys(os.path.dirname(p) for p in libs))), version)
    found_loaders = find_loader_files(root, version, library_dirs(native_entries, libs), libs, loaders)
    fws = find_firmwares(root, version, firmware_dirs(where.kernel_release, where.firmware_class_path))
    host = functools.partial(rootpath.host_path, root)
    return DriverFiles(
        version=version,
        libraries=tuple(map(host, libs)),
        libraries32=tuple(map(host, libs32)),
        binaries=tuple(map(host, bins)),
        firmwares=tuple(map(host, fws)),
        persistenced_socket=_find_of_type(root, PERSISTENCED_SOCKET, stat.S_ISSOCK),
        fabricmanager_socket=_find_of_type(root, FABRICMANAGER_SOCKET, stat.S_ISSOCK),
        mps_pipe_dir=_find_of_type(root, where.mps_pipe_dir, stat.S_ISDIR),
        loader_files=found_loaders,
    )


def _encoded(files: DriverFiles) -> list[Any]:
    return [*files[:-1], [list(found) for found in files.loader_files]]


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _decoded(value: Any) -> DriverFiles | None:
    """A kept result (:func:`_encoded`) as DriverFiles, None where it is not one."""
    if not isinstance(value, list) or len(value) != len(DriverFiles._fields):
        return None
    version, libs, libs32, bins, fws, persistenced, fabricmanager, mps, loaders = value
    optional = (persistenced, fabricmanager, mps)
    if not isinstance(version, str) or not all(_strings(v) for v in (libs, libs32, bins, fws)):
        return None
    if not all(v is None or isinstance(v, str) for v in optional) or not isinstance(loaders, list):
        return None
    found = []
    for entry in loaders:
        if not isinstance(entry, list) or len(entry) != 4 or not _strings(entry[:3]):
            return None
        if entry[3] is not None and not isinstance(entry[3], str):
            return None
        found.append(LoaderFound(*entry))
    return DriverFiles(version, tuple(libs), tuple(libs32), tuple(bins), tuple(fws), *optional, tuple(found))
