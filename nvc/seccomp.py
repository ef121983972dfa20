"""The few libseccomp calls the ldconfig sandbox needs: an allow-list filter, loaded.

Why not pyseccomp: on import it locates libc and libseccomp with ``ctypes.util.find_library``,
which imports subprocess, shutil and tempfile and runs ``ldconfig -p`` twice, in the child
forked at every container start. libseccomp's soname is fixed by its ABI, so ``dlopen`` finds it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable

LIBRARY = "libseccomp.so.2"
ALLOW = 0x7FFF0000  # SCMP_ACT_ALLOW
_ACT_ERRNO = 0x00050000  # SCMP_ACT_ERRNO(0): the errno goes in the low 16 bits


def errno_action(code: int) -> int:
    """SCMP_ACT_ERRNO(code): the syscall fails with ``code``."""
    return _ACT_ERRNO | (code & 0xFFFF)


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(LIBRARY)
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.restype = None
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    lib.seccomp_rule_add.restype = ctypes.c_int
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_load.restype = ctypes.c_int
    return lib


# Opened at import, which the ldconfig sandbox does before it pivots away from the host's files.
_lib = _load()


def _check(rc: int, what: str) -> None:
    if rc < 0:  # libseccomp returns -errno
        raise OSError(-rc, f"seccomp: {what}: {os.strerror(-rc)}")


def load_allow_list(default_action: int, names: Iterable[str]) -> None:
    """Load a filter into this thread: the syscalls ``names`` are allowed, every other one gets
    ``default_action``. Names this architecture lacks are skipped (the list covers several)."""
    lib = _lib
    ctx = lib.seccomp_init(default_action)
    if not ctx:
        raise OSError(0, "seccomp: seccomp_init failed")
    try:
        for name in names:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number >= 0:  # negative: unknown here, or a pseudo-number for another arch's call
                _check(lib.seccomp_rule_add(ctx, ALLOW, number, 0), f"rule for {name}")
        _check(lib.seccomp_load(ctx), "load")
    finally:
        lib.seccomp_release(ctx)
