"""Mark a forking server's objects immortal, so that the workers it forks keep sharing their pages.

A worker forked from the hook server shares the server's memory until it writes to it, and CPython
writes an object's reference count whenever code takes or drops a reference to it: a call dirties
every page holding a function, a code object, a dict or a string it only reads, one copy-on-write
fault each (about 2,200 a served call in a 64-start storm on an H200 host with Python 3.12,
docs/performance.md). From Python 3.12 (PEP 683) an object whose count reads as immortal is never
counted again. :func:`make_immortal` marks what the server holds (the modules, their functions, code,
types and data) once it has imported, warmed up and had no call for a while (hook/server/loop.py's
MARK_QUIET): the workers it forks after that share those pages. What it costs: none of them is ever
freed, nor what they hold, which the server, keeping them for its life, would not do anyway.

Only objects whose end frees memory and does nothing else are marked (:func:`eligible`): an object
that holds a descriptor (a file, a socket), has a finaliser, is referred to weakly, or is an instance of
a C type not known here stays counted, so that dropping it later still closes what it holds and tells
whoever watches it (while a marked container, a list or a closure's cell, holds it, it lives as long as
that one). Applied only where the interpreter honours it (:func:`supported`): CPython 3.12 or later with
the GIL, 64-bit and little-endian, where a probe object, marked first, keeps its count while references
to it come and go.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import re
import sys
import types
import weakref
from _collections import _tuplegetter
from collections.abc import Callable

# The low 32 bits of an immortal object's count (3.12 and 3.13: exactly this; 3.14: any count whose
# low half is negative as a signed 32-bit value). Written alone, so a later version's flags in the
# high half stay as they are.
IMMORTAL = 0xFFFFFFFF
_BASE = 8  # the address the counts are indexed from: any but NULL, which ctypes refuses to index
# Types whose instances hold references and memory only: their deallocation frees, nothing else.
PLAIN: frozenset[type] = frozenset({
    object, type(None), bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset,
    range, slice, property, classmethod, staticmethod, functools.partial, re.Pattern, _tuplegetter,
    types.FunctionType, types.CodeType, types.CellType, types.ModuleType, types.MethodType,
    types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodWrapperType,
    types.MethodDescriptorType, types.ClassMethodDescriptorType, types.GetSetDescriptorType,
    types.MemberDescriptorType, types.MappingProxyType, types.SimpleNamespace, types.GenericAlias,
    types.UnionType,
})  # fmt: skip


def _dealloc(kind: type) -> int | None:
    """The address of ``kind``'s deallocator (PyTypeObject's tp_dealloc, after six words)."""
    return ctypes.c_void_p.from_address(id(kind) + 6 * ctypes.sizeof(ctypes.c_void_p)).value


class _Probe:
    pass


# What frees an instance of every class a class statement made (CPython's subtype_dealloc): a C type,
# even one made at run time from a spec (a heap type too: _thread.lock), has a deallocator of its own.
_SUBTYPE_DEALLOC = _dealloc(_Probe)


def _plain_kind(kind: type) -> bool:
    """Whether the instances of ``kind`` only free memory when they end: it and every base of it are
    :data:`PLAIN` or made by a class statement, with no ``__del__``."""
    return all(
        base in PLAIN or (_dealloc(base) == _SUBTYPE_DEALLOC and "__del__" not in vars(base)) for base in kind.__mro__
    )


def eligible(obj: object, plain: Callable[[type], bool] = _plain_kind) -> bool:
    """Whether the end of ``obj`` would only free memory: a class (its subclasses' weak references to
    it aside), or an instance of a :func:`_plain_kind` type that nothing refers to weakly."""
    return isinstance(obj, type) or (not weakref.getweakrefcount(obj) and plain(type(obj)))


def _mark(obj: object) -> None:
    ctypes.c_uint32.from_address(id(obj)).value = IMMORTAL


def supported() -> bool:
    """Whether this interpreter leaves a marked object's count alone (see the module's docstring)."""
    if sys.implementation.name != "cpython" or sys.version_info < (3, 12):
        return False
    if sys.maxsize < 1 << 32 or sys.byteorder != "little":
        return False
    import sysconfig

    if sysconfig.get_config_var("Py_GIL_DISABLED"):  # a free-threaded build counts elsewhere
        return False
    probe = object()
    _mark(probe)
    before = sys.getrefcount(probe)
    held = [probe, probe, probe]
    during = sys.getrefcount(probe)
    del held
    return before == during == sys.getrefcount(probe)


def reachable() -> list[object]:
    """Every object the collector tracks and every object they refer to, each once."""
    frontier = gc.get_objects()  # first: the walk's own containers are not among them
    seen: set[int] = set()
    see = seen.add
    found: list[object] = []
    while frontier:
        fresh = [obj for obj in frontier if (key := id(obj)) not in seen and not see(key)]
        found.extend(fresh)
        frontier = gc.get_referents(*fresh)
    return found


def make_immortal() -> int:
    """Mark every :func:`eligible` object :func:`reachable` now immortal; the number marked, 0 where
    the interpreter does not honour it (nothing is changed then)."""
    if not supported():
        return 0
    plain = functools.cache(_plain_kind)  # most objects share a few types
    found = reachable()  # held until every count is written: no address is freed and reused meanwhile
    marked = [id(obj) for obj in found if eligible(obj, plain)]
    counts = ctypes.cast(_BASE, ctypes.POINTER(ctypes.c_uint32))  # indexed by address: no object made a write
    for address in marked:
        counts[(address - _BASE) >> 2] = IMMORTAL
    return len(marked)
