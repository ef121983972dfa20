"""The compiled code of the modules a start imports, kept in one file that the launchers map.

A direct hook call imports some 150 modules, and for each one Python searches sys.path (or its
package's directory), checks the source and opens a .pyc file of its own: several milliseconds of
every start without a server, before any module's code runs. The cache, written when nvc-py is
installed (``make install``, the package's postinst: ``python -I -m nvc.hook.setup.maintainer
code-cache``), holds each module's code object with the path, mtime and size of the source it was
compiled from. A launcher maps it (:func:`use`), and a module is taken from it only where that source
is unchanged (to the nanosecond, where a .pyc keeps whole seconds) and where the search would look
first; any other is imported as usual. The whole file is ignored where another Python wrote it, for
another sys.path, or where anyone but root (or the caller) could have written it: it is code that
every hook runs, as trusted as the .pyc files beside the sources. In a rootless engine's user
namespace root's files show an owner the namespace does not map, the sources' as the cache's.
"""

from __future__ import annotations

import marshal
import mmap
import os
import sys

# importlib.machinery's classes, from the modules the interpreter starts with: importing the importlib
# package would bring warnings too, in every launcher's start.
from _frozen_importlib import ModuleSpec
from _frozen_importlib_external import PathFinder, SourceFileLoader
from collections.abc import Iterable, Sequence

FORMAT = 1
# The header's length, then the header (marshal): the format, the interpreter, sys.path and the
# index; then the code objects (marshal), at the index's offsets from the header's end.
_LENGTH_BYTES = 8


def _interpreter() -> tuple[int, str | None]:
    """Which Python the cached code objects are for: bytecode differs across releases."""
    return sys.hexversion, sys.implementation.cache_tag


class _CachedLoader(SourceFileLoader):
    """A source module's loader whose code comes from the cache (validated by :class:`_Finder`):
    resources, source and file attributes as a plain source module's."""

    def __init__(self, fullname: str, path: str, code: memoryview) -> None:
        super().__init__(fullname, path)
        self._code = code

    def get_code(self, fullname: str) -> object:  # type: ignore[override]
        try:
            return marshal.loads(self._code)
        except (ValueError, EOFError, TypeError):  # a damaged entry: the source's own bytecode
            return super().get_code(fullname)


class _Finder:
    """Finds a module in the cache where its source is the one the cache compiled."""

    def __init__(
        self, search: list[str], index: dict[str, tuple[str, bool, int, int, int, int]], code: memoryview
    ) -> None:
        self._search = search
        self._index = index
        self._code = code

    def find_spec(self, name: str, path: Sequence[str] | None = None, target: object = None) -> ModuleSpec | None:
        entry = self._index.get(name)
        if entry is None:
            return None
        origin, package, mtime_ns, size, offset, length = entry
        # Where the search would look first: sys.path as when the cache was written, or the
        # parent package's own directory (a path that changed could find another module first).
        if path is None:
            if sys.path != self._search:
                return None
        elif not path or path[0] != os.path.dirname(os.path.dirname(origin) if package else origin):
            return None
        try:
            st = os.stat(origin)
        except OSError:
            return None
        if st.st_mtime_ns != mtime_ns or st.st_size != size:
            return None
        spec = ModuleSpec(name, _CachedLoader(name, origin, self._code[offset : offset + length]), origin=origin)
        spec.has_location = True
        if package:
            spec.submodule_search_locations = [os.path.dirname(origin)]
        return spec

    def invalidate_caches(self) -> None:
        """Nothing to forget: each find checks its source."""


def _unmapped_owner(proc: str = "/proc") -> int | None:
    """The uid a file shows where this user namespace does not map its owner (the kernel's overflow
    uid), or None where the namespace maps that uid too (the initial one maps every uid)."""
    try:
        with open(f"{proc}/sys/kernel/overflowuid") as file:
            overflow = int(file.read())
        with open(f"{proc}/self/uid_map") as file:
            ranges = [tuple(map(int, line.split())) for line in file]
    except (OSError, ValueError):
        return None
    mapped = any(len(r) == 3 and r[0] <= overflow < r[0] + r[2] for r in ranges)
    return None if mapped else overflow


def _trusted(path: str, st: os.stat_result) -> bool:
    """Whether the cache is as trusted as the sources it stands for: writable by no one but its owner,
    who is root or this user; or, in a user namespace (a rootless engine's hook), an owner it does not
    map, as the host's root shows there, in a directory no one else can write either."""
    if st.st_mode & 0o022:
        return False
    if st.st_uid in (0, os.geteuid()):
        return True
    if st.st_uid != _unmapped_owner():
        return False
    try:
        parent = os.stat(os.path.dirname(path) or ".")
    except OSError:
        return False
    return not parent.st_mode & 0o022 and parent.st_uid in (0, os.geteuid(), st.st_uid)


def use(path: str) -> bool:
    """Put the cache at ``path`` on sys.meta_path, before the path search, where it is trusted
    (:func:`_trusted`) and fits this interpreter and sys.path; return whether it was (no cache, or an
    unusable one: imports as usual)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if st.st_size < _LENGTH_BYTES or not _trusted(path, st):
            return False
        data = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return False
    finally:
        os.close(fd)
    try:
        length = int.from_bytes(data[:_LENGTH_BYTES], "little")
        form, interpreter, search, index = marshal.loads(data[_LENGTH_BYTES : _LENGTH_BYTES + length])
    except (ValueError, EOFError, TypeError):
        return False
    if form != FORMAT or tuple(interpreter) != _interpreter() or list(search) != sys.path:
        return False
    finder = _Finder(list(search), index, memoryview(data)[_LENGTH_BYTES + length :])
    # In place of the path search, after the built-in and frozen modules.
    where = sys.meta_path.index(PathFinder) if PathFinder in sys.meta_path else len(sys.meta_path)
    sys.meta_path.insert(where, finder)
    return True


def build(path: str, modules: Iterable[str]) -> int:
    """Import ``modules``, then write the cache of every source module then loaded (what they
    import too) to ``path``, replacing it whole; return how many it holds."""
    import importlib

    for name in modules:
        importlib.import_module(name)
    index: dict[str, tuple[str, bool, int, int, int, int]] = {}
    blobs: list[bytes] = []
    offset = 0
    for name, module in sorted(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        loader = getattr(spec, "loader", None)
        if spec is None or spec.name != name or type(loader) is not SourceFileLoader or not spec.has_location:
            continue  # not a source module, or one known by another name too (__main__, an alias)
        before = os.stat(spec.origin)
        code = marshal.dumps(loader.get_code(name))
        after = os.stat(spec.origin)
        if (before.st_mtime_ns, before.st_size) != (after.st_mtime_ns, after.st_size):
            continue  # changed while read: left to the usual import
        package = spec.submodule_search_locations is not None
        index[name] = (spec.origin, package, after.st_mtime_ns, after.st_size, offset, len(code))
        blobs.append(code)
        offset += len(code)
    header = marshal.dumps((FORMAT, _interpreter(), list(sys.path), index))
    return _write(path, header, blobs, len(index))


def _write(path: str, header: bytes, blobs: list[bytes], count: int) -> int:
    new = f"{path}.new"
    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(fd, 0o644)  # whatever the umask: every user's launcher maps it
        out.write(len(header).to_bytes(_LENGTH_BYTES, "little"))
        out.write(header)
        for blob in blobs:
            out.write(blob)
    os.replace(new, path)
    return count
