"""A command run under Landlock with no write access anywhere: a confined root process, as a
sandboxing runtime or service manager would leave one (every capability kept, same namespaces)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

# Restricts itself (landlock_create_ruleset 444, landlock_restrict_self 446) with a ruleset that
# handles writing, making and removing files and no rule allowing any (so none anywhere), then
# executes its arguments. Root with CAP_SYS_ADMIN needs no no_new_privs for it, and sets none.
RESTRICT = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
write_file, remove_dir, remove_file, truncate = 1 << 1, 1 << 4, 1 << 5, 1 << 14
make = sum(1 << bit for bit in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
handled = ctypes.c_uint64(write_file | remove_dir | remove_file | make | truncate)
ruleset = libc.syscall(444, ctypes.byref(handled), ctypes.sizeof(handled), 0)
if ruleset < 0 or libc.syscall(446, ruleset, 0) != 0:
    sys.exit(f"landlock: {os.strerror(ctypes.get_errno())}")
os.close(ruleset)
os.execv(sys.argv[1], sys.argv[1:])
"""


def landlocked(argv: Sequence[str]) -> list[str]:
    """``argv`` run under the Landlock ruleset above (argv[0]: a path)."""
    return [sys.executable, "-c", RESTRICT, *argv]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return max(0, libc.syscall(444, None, 0, 1))  # LANDLOCK_CREATE_RULESET_VERSION
