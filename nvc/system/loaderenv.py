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
is compiled with too. The runtime the wrapper executes is the exception (:func:`runtime_environment`).
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
RUNTIME_STASH = "NVC_PY_RUNTIME_CALLER_ENVIRONMENT"  # as native/client/environment.h's


def is_unsafe(name: str) -> bool:
    """Whether the environment variable ``name`` steers the loader, libc or Python to caller-chosen files."""
    return name in UNSAFE_NAMES or name.startswith(UNSAFE_PREFIXES)


def restart_without_unsafe_variables(*, stash: bool = False) -> None:
    """Execute this interpreter again, same command line, without the unsafe variables (if any).

    Returns only when there were none. File descriptors (the OCI state on a hook's stdin)
    and the working directory carry over unchanged. With ``stash`` (the runtime wrapper) the
    dropped entries travel as data in :data:`RUNTIME_STASH`, as the native front hands them; the
    LC_CTYPE stashed with them may be this interpreter's own (PEP 538), which only the front, started
    before any interpreter, can tell from the caller's.
    """
    dropped = [name for name in os.environb if is_unsafe(os.fsdecode(name))]
    if not dropped:
        return
    env = {name: value for name, value in os.environb.items() if name not in dropped}
    if stash:
        kept = [*dropped, *([b"LC_CTYPE"] if b"LC_CTYPE" in env else [])]
        env[os.fsencode(RUNTIME_STASH)] = b"\0".join(name + b"=" + os.environb[name] for name in kept).hex().encode()
    os.execve(sys.executable, sys.orig_argv, env)


def runtime_environment() -> dict[bytes, bytes]:
    """The caller's environment as it came, for the runtime nvc-py-runtime executes.

    The engine's environment is its own, not a container's: runc gets it whole where no wrapper
    stands in between, so the wrapper hands it on: the entries its interpreter ran without, and the
    caller's LC_CTYPE in place of the one the interpreter may have set (PEP 538), from :data:`RUNTIME_STASH`.
    """
    env = dict(os.environb)
    stashed = env.pop(os.fsencode(RUNTIME_STASH), None)
    if stashed is None:
        return env
    try:
        entries = bytes.fromhex(stashed.decode("ascii")).split(b"\0")
    except ValueError:  # not what the front writes: nothing to restore
        return env
    env.pop(b"LC_CTYPE", None)
    for entry in entries:
        name, sep, value = entry.partition(b"=")
        if sep:
            env[name] = value
    return env
