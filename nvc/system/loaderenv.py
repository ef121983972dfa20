"""Variables that make the dynamic loader, libc or Python read files the caller chose, and a restart
without them.

glibc reads LD_LIBRARY_PATH (and its other LD_* settings) once, when a process starts.
Deleting them from ``os.environ`` later protects the programs nvc-py starts, not nvc-py
itself: every library it loads afterwards (libffi behind ctypes, libseccomp for the
ldconfig sandbox, NVML in the driver helper) would still be looked for in the caller's
LD_LIBRARY_PATH first, in a root process in the host's namespaces. A hook may be handed a
container's environment (CVE-2025-23266), so an entry point that finds such variables
executes itself again without them, before importing anything else. What an LD_PRELOAD
library did at that first exec cannot be undone: the installed programs are reached through
the native front (native/client), which drops them before it executes anything, and their
interpreters run isolated (``-I``: no PYTHON* variable, user site or working directory).

The names are those of ``unsafe-environment.list`` beside this module, the one list the front
is compiled with too.
"""

from __future__ import annotations

import os
import sys

LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unsafe-environment.list")


def read_list(path: str = LIST) -> tuple[frozenset[str], tuple[str, ...]]:
    """The list's exact names, and the prefixes its ``NAME*`` entries stand for."""
    names: set[str] = set()
    prefixes: list[str] = []
    with open(path, encoding="ascii") as listed:
        for line in listed:
            entry = line.strip()
            if not entry or entry.startswith("#"):
                continue
            if entry.endswith("*"):
                prefixes.append(entry[:-1])
            else:
                names.add(entry)
    return frozenset(names), tuple(prefixes)


UNSAFE_NAMES, UNSAFE_PREFIXES = read_list()


def is_unsafe(name: str) -> bool:
    """Whether the environment variable ``name`` steers the loader, libc or Python to caller-chosen files."""
    return name in UNSAFE_NAMES or name.startswith(UNSAFE_PREFIXES)


def restart_without_unsafe_variables() -> None:
    """Execute this interpreter again, same command line, without the unsafe variables (if any).

    Returns only when there were none. File descriptors (the OCI state on a hook's stdin)
    and the working directory carry over unchanged.
    """
    if not any(is_unsafe(name) for name in os.environ):
        return
    env = {name: value for name, value in os.environ.items() if not is_unsafe(name)}
    os.execve(sys.executable, sys.orig_argv, env)
