"""Variables that make the dynamic loader or libc read files the caller chose, and a restart without them.

glibc reads LD_LIBRARY_PATH (and its other LD_* settings) once, when a process starts.
Deleting them from ``os.environ`` later protects the programs nvc-py starts, not nvc-py
itself: every library it loads afterwards (libffi behind ctypes, libseccomp for the
ldconfig sandbox, NVML in the driver helper) would still be looked for in the caller's
LD_LIBRARY_PATH first, in a root process in the host's namespaces. A hook may be handed a
container's environment (CVE-2025-23266), so an entry point that finds such variables
executes itself again without them, before importing anything else. What an LD_PRELOAD
library did at the first exec cannot be undone; an explicit environment in the hook's
configuration is the defence there.
"""

from __future__ import annotations

import os
import sys

# Besides LD_*: variables that make glibc load or read files named by the caller.
UNSAFE_VARIABLES = ("GCONV_PATH", "GETCONF_DIR", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH", "MALLOC_TRACE",
                    "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR")


def is_unsafe(name: str) -> bool:
    """Whether the environment variable ``name`` steers the loader or libc to caller-chosen files."""
    return name.startswith("LD_") or name in UNSAFE_VARIABLES


def restart_without_loader_variables() -> None:
    """Execute this interpreter again, same command line, without the unsafe variables (if any).

    Returns only when there were none. File descriptors (the OCI state on a hook's stdin)
    and the working directory carry over unchanged.
    """
    if not any(is_unsafe(name) for name in os.environ):
        return
    env = {name: value for name, value in os.environ.items() if not is_unsafe(name)}
    os.execve(sys.executable, sys.orig_argv, env)
