"""The suite leaves the host as it found it: what it watches, and how it tells.

The session runs in a mount namespace of its own with an empty tmpfs on each of
:data:`PRIVATE_RUN_DIRS` (runtimes and the hook write there at fixed paths: the config cache,
sharing directories, containerd's shim sockets, runc's state, dockerd's plugin directory), so
nothing written there reaches the host's. A directory that was missing is created for the mount and
removed at the end. At the end the mounts are detached, so the host's own directories show again,
and compared with what was there at the start, together with the directories ``nvc-py setup`` and
``cdi generate`` write to on a host (:data:`SETUP_DIRS`: tests name their own) and /tmp's entries
named as nvc-py, its tests and the tools they run name theirs (:data:`TMP_PREFIXES`: on a shared
machine others write to /tmp meanwhile), the session's pytest directory aside (pytest removes it
after a passing run and keeps the last failing run's; pytest_sessionfinish checks that).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from fakedriver.activate import MNT_DETACH, enter_private_tmpfs, umount

PRIVATE_RUN_DIRS = ("/run/nvc-py", "/run/containerd", "/run/runc", "/run/docker")
# Where `nvc-py setup`, `cdi generate` and the configuration live on a host: tests write their own
# (--hooks-dir, --unit-dir, --drop-in, $NVC_PY_CONFIG...), never these; compared, not mounted over.
SETUP_DIRS = ("/etc/nvc-py", "/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d", "/etc/crio",
              "/etc/containerd", "/etc/docker", "/var/lib/docker", "/etc/cdi", "/var/run/cdi")
TMP = "/tmp"
DEPTH = 4  # levels under each run directory compared: enough for /run/nvc-py/share/<id>/shared
PYTEST_TMP = f"pytest-of-{os.environ.get('USER') or 'root'}"
# nvc-py's and its tests' own (nvc-*, the MPS pipe directory), tempfile's default, pytest's, and
# the container tools'.
TMP_PREFIXES = ("nvc", "nvidia", "tmp", "pytest-", "podman", "containers", "containerd", "runc", "crun",
                "libpod", "storage-run", "buildah", "ctr", "docker")


def entries(path: str, depth: int) -> frozenset[str] | None:
    """Every entry under ``path`` down to ``depth`` levels, as relative paths (None: no ``path``).
    A symlink is an entry, never followed."""
    if not os.path.isdir(path):
        return None
    found: set[str] = set()
    stack = [("", depth)]
    while stack:
        relative, left = stack.pop()
        try:
            names = os.listdir(os.path.join(path, relative) if relative else path)
        except OSError:
            continue
        for name in names:
            child = os.path.join(relative, name) if relative else name
            found.add(child)
            full = os.path.join(path, child)
            if left > 1 and os.path.isdir(full) and not os.path.islink(full):
                stack.append((child, left - 1))
    return frozenset(found)


@dataclass
class HostState:
    """What the watched places held; :func:`changes` compares two of them."""

    run: dict[str, frozenset[str] | None] = field(default_factory=dict)
    tmp: frozenset[str] = frozenset()
    tmp_dir: str = TMP


def snapshot(run_dirs: tuple[str, ...] = PRIVATE_RUN_DIRS + SETUP_DIRS, tmp: str = TMP) -> HostState:
    return HostState({path: entries(path, DEPTH) for path in run_dirs},
                     frozenset(name for name in entries(tmp, 1) or () if name.startswith(TMP_PREFIXES)) - {PYTEST_TMP},
                     tmp)


def changes(before: HostState, after: HostState) -> list[str]:
    """One line per difference: an entry that appeared or vanished, a directory made or removed."""
    lines = []
    for path, was in before.run.items():
        now = after.run.get(path)
        if (was is None) != (now is None):
            lines.append(f"{path}: {'created' if was is None else 'removed'}")
            continue
        lines += [f"{path}/{name}: left behind" for name in sorted((now or frozenset()) - (was or frozenset()))]
        lines += [f"{path}/{name}: removed" for name in sorted((was or frozenset()) - (now or frozenset()))]
    lines += [f"{after.tmp_dir}/{name}: left behind" for name in sorted(after.tmp - before.tmp)]
    return lines


class PrivateRun:
    """The session's tmpfs mounts over :data:`PRIVATE_RUN_DIRS`, and their removal at the end."""

    def __init__(self, paths: tuple[str, ...] = PRIVATE_RUN_DIRS) -> None:
        self.paths = paths
        self.created = [path for path in paths if not os.path.isdir(path)]
        enter_private_tmpfs(*paths)

    def leave(self) -> None:
        """Detach the mounts (the host's directories show again); remove the directories made for them."""
        for path in self.paths:
            umount(path, MNT_DETACH)
        for path in self.created:
            try:
                os.rmdir(path)
            except OSError:
                pass  # not empty: something wrote there past the mount, which changes() reports
